//! Shard-key rewriting with Locality UUIDs.
//!
//! Applications keep sending the ObjectIds their drivers generate; the proxy
//! makes the stored shard key spread writes across a range-sharded cluster.
//!
//! - **`replace`**: the key's ObjectId values are stored as the Locality UUID
//!   derived from them ([`crate::locality::from_object_id`]), as binary
//!   subtype [`SUBTYPE`]. Equality, `$in`, `$nin` and `$ne` on the key are
//!   rewritten in every command; every such value in any reply becomes its
//!   ObjectId again, whatever the reply's shape. Sort and range on the key
//!   cannot keep ObjectId order and are refused.
//! - **`derive`**: the key stays as it is and a separate field holds the
//!   Locality UUID (binary subtype 4) derived from it. Queries that pin the key
//!   (equality, `$in`) also pin that field, so a cluster sharded on it routes
//!   them to one shard. Replies hide the field unless a projection names it.

use bson::spec::BinarySubtype;
use bson::{doc, oid::ObjectId, Binary, Bson, Document};

use super::catalogue::{self, Slot};
use super::command::Command;
use crate::config::shard_key::{Rule, Strategy};
use crate::error::ProxyError;
use crate::locality;
use crate::rewrite::walker::{self, Malformed};
use crate::wire::MsgBody;

/// The binary subtype of a `replace`-strategy value (user-defined range).
pub const SUBTYPE: u8 = 0x8B;

impl Rule {
    fn refuse(&self, what: &str) -> ProxyError {
        ProxyError::Unsupported(format!(
            "{what} on {}.{} cannot be rewritten: the shard key is stored as Locality UUIDs \
             (strategy replace), which do not keep ObjectId order",
            self.namespace, self.field
        ))
    }

    fn uuid(&self, oid: &ObjectId, subtype: BinarySubtype) -> Bson {
        Bson::Binary(Binary {
            subtype,
            bytes: locality::from_object_id(&oid.bytes(), self.mode).to_vec(),
        })
    }

    fn stored(&self, oid: &ObjectId) -> Bson {
        self.uuid(oid, BinarySubtype::UserDefined(SUBTYPE))
    }

    fn derived(&self, oid: &ObjectId) -> Bson {
        self.uuid(oid, BinarySubtype::Uuid)
    }
}

/// What the replies to a rewritten request need.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplyNeeds {
    /// Turn `replace`-strategy values back into ObjectIds.
    pub restore: bool,
    /// Hide this added field from returned documents.
    pub hide: Option<String>,
}

/// The rules, looked up by namespace.
#[derive(Clone, Debug, Default)]
pub struct ShardKeys {
    rules: Vec<Rule>,
}

impl ShardKeys {
    pub fn new(rules: Vec<Rule>) -> ShardKeys {
        ShardKeys { rules }
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    fn rule(&self, db: &str, coll: &str) -> Option<&Rule> {
        self.rules.iter().find(|r| {
            r.namespace
                .split_once('.')
                .is_some_and(|(d, c)| d == db && c == coll)
        })
    }

    /// Whether a command (by name, first value and `$db`) may concern a rule:
    /// a cheap check made on the raw body before anything is parsed.
    pub fn concerns(&self, name: &str, collection: Option<&str>, db: Option<&str>) -> bool {
        match name {
            "bulkWrite" | "explain" | "getMore" => !self.rules.is_empty(),
            _ => matches!((db, collection), (Some(d), Some(c)) if self.rule(d, c).is_some()),
        }
    }

    /// Whether any rule stores `replace` values, which replies must restore.
    pub fn restores(&self) -> bool {
        self.rules.iter().any(|r| r.strategy == Strategy::Replace)
    }

    /// Rewrites a command in place; returns what its replies need.
    pub fn request(&self, cmd: &mut Command) -> Result<ReplyNeeds, ProxyError> {
        let mut needs = ReplyNeeds {
            restore: self.restores(),
            hide: None,
        };
        let Some(db) = cmd.db().map(str::to_owned) else {
            return Ok(needs);
        };
        let name = cmd.name().to_owned();
        if name == "bulkWrite" {
            self.bulk_write(&mut cmd.body)?;
            return Ok(needs);
        }
        if name == "explain" {
            if let Some(Bson::Document(inner)) = cmd.body.get_mut("explain") {
                let (n, c) = match inner.iter().next() {
                    Some((n, Bson::String(c))) => (n.clone(), c.clone()),
                    _ => return Ok(needs),
                };
                if let Some(rule) = self.rule(&db, &c) {
                    command(rule, &n, inner)?;
                }
            }
            return Ok(needs);
        }
        let coll = match (name.as_str(), cmd.collection()) {
            ("getMore", _) => cmd.body.get_str("collection").ok().map(str::to_owned),
            (_, c) => c.map(str::to_owned),
        };
        let Some(rule) = coll.and_then(|c| self.rule(&db, &c)) else {
            return Ok(needs);
        };
        if let Strategy::Derive { field } = &rule.strategy {
            let asked = projection_names(&cmd.body, field);
            if !asked {
                needs.hide = Some(field.clone());
            }
        }
        command(rule, &name, &mut cmd.body)?;
        Ok(needs)
    }

    fn bulk_write(&self, body: &mut Document) -> Result<(), ProxyError> {
        let namespaces: Vec<Option<Rule>> = match body.get_array("nsInfo") {
            Ok(a) => a
                .iter()
                .map(|ns| {
                    let ns = ns
                        .as_document()
                        .and_then(|d| d.get_str("ns").ok())
                        .unwrap_or_default();
                    ns.split_once('.')
                        .and_then(|(db, c)| self.rule(db, c).cloned())
                })
                .collect(),
            Err(_) => return Ok(()),
        };
        if let Ok(ops) = body.get_array_mut("ops") {
            for op in ops.iter_mut() {
                let Bson::Document(op) = op else { continue };
                let (kind, idx) = match op.iter().next() {
                    Some((k, v)) => (
                        k.clone(),
                        v.as_i32()
                            .map(|i| i as usize)
                            .or(v.as_i64().map(|i| i as usize)),
                    ),
                    None => continue,
                };
                let Some(Some(rule)) = idx.and_then(|i| namespaces.get(i)) else {
                    continue;
                };
                slots(rule, catalogue::bulk_op_slots(&kind), op)?;
            }
        }
        Ok(())
    }
}

/// Rewrites one command addressed to `rule`'s collection, slot by slot as
/// the catalogue lists them.
fn command(rule: &Rule, name: &str, body: &mut Document) -> Result<(), ProxyError> {
    match catalogue::lookup(name) {
        Some(entry) => slots(rule, entry.slots, body),
        None => Ok(()),
    }
}

fn slots(rule: &Rule, list: &[Slot], body: &mut Document) -> Result<(), ProxyError> {
    for slot in list {
        match *slot {
            Slot::Filter(k) => filter_at(rule, body, k)?,
            Slot::Documents(k) => {
                for d in body.get_array_mut(k).into_iter().flatten() {
                    if let Bson::Document(d) = d {
                        document(rule, d);
                    }
                }
            }
            Slot::Document(k) => {
                if let Ok(d) = body.get_document_mut(k) {
                    document(rule, d);
                }
            }
            Slot::Update { filter, update, .. } => {
                let upsert = body.get_bool("upsert").unwrap_or(false);
                write_op(rule, body, filter, update, upsert)?;
            }
            Slot::Sort(k) => sort_at(rule, body, k)?,
            Slot::Keys(k @ ("min" | "max")) => bounds(rule, body, k)?,
            Slot::Pipeline(k) => {
                for stage in body.get_array_mut(k).into_iter().flatten() {
                    if let Bson::Document(stage) = stage {
                        filter_at(rule, stage, "$match")?;
                        sort_at(rule, stage, "$sort")?;
                    }
                }
            }
            Slot::Each(k, inner) => {
                for d in body.get_array_mut(k).into_iter().flatten() {
                    if let Bson::Document(d) = d {
                        slots(rule, inner, d)?;
                    }
                }
            }
            Slot::Within(k, inner) => {
                if let Ok(d) = body.get_document_mut(k) {
                    slots(rule, inner, d)?;
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// An inserted (or replacement) document.
fn document(rule: &Rule, d: &mut Document) {
    match &rule.strategy {
        Strategy::Replace => {
            if let Some(Bson::ObjectId(oid)) = d.get(&rule.field) {
                let stored = rule.stored(oid);
                d.insert(rule.field.clone(), stored);
            }
        }
        Strategy::Derive { field } => {
            if let Some(Bson::ObjectId(oid)) = d.get(&rule.field) {
                let derived = rule.derived(oid);
                d.insert(field.clone(), derived);
            }
        }
    }
}

/// An update, delete or findAndModify: its filter, and its update for upserts.
fn write_op(
    rule: &Rule,
    op: &mut Document,
    filter_key: &str,
    update_key: &str,
    upsert: bool,
) -> Result<(), ProxyError> {
    let pinned = op
        .get_document(filter_key)
        .ok()
        .and_then(|f| pinned_equality(rule, f));
    filter_at(rule, op, filter_key)?;
    if update_key.is_empty() {
        return Ok(());
    }
    match op.get_mut(update_key) {
        Some(Bson::Document(u)) if u.keys().next().is_some_and(|k| !k.starts_with('$')) => {
            // A replacement document.
            document(rule, u);
            if let Strategy::Derive { field } = &rule.strategy {
                if !u.contains_key(field) {
                    match pinned {
                        Some(oid) => {
                            u.insert(field.clone(), rule.derived(&oid));
                        }
                        None => {
                            return Err(ProxyError::Unsupported(format!(
                                "a replacement on {} (shard key derived from {}) must pin {} by equality or contain it",
                                rule.namespace, rule.field, rule.field
                            )))
                        }
                    }
                }
            }
        }
        Some(Bson::Document(u)) => {
            if let (Strategy::Derive { field }, true) = (&rule.strategy, upsert) {
                let Some(oid) = pinned else {
                    return Err(ProxyError::Unsupported(format!(
                        "an upsert on {} (shard key derived from {}) must pin {} by equality",
                        rule.namespace, rule.field, rule.field
                    )));
                };
                let derived = rule.derived(&oid);
                match u.get_mut("$setOnInsert") {
                    Some(Bson::Document(s)) => {
                        s.insert(field.clone(), derived);
                    }
                    _ => {
                        u.insert("$setOnInsert", doc! { field.clone(): derived });
                    }
                }
            }
            if rule.strategy == Strategy::Replace {
                for op_name in ["$set", "$setOnInsert"] {
                    if let Ok(s) = u.get_document_mut(op_name) {
                        document(rule, s);
                    }
                }
            }
        }
        Some(Bson::Array(_)) if upsert && matches!(rule.strategy, Strategy::Derive { .. }) => {
            return Err(ProxyError::Unsupported(format!(
                "a pipeline upsert on {} cannot add the derived shard key",
                rule.namespace
            )));
        }
        _ => {}
    }
    Ok(())
}

/// The single ObjectId a filter pins the key to, if it does.
fn pinned_equality(rule: &Rule, f: &Document) -> Option<ObjectId> {
    match f.get(&rule.field)? {
        Bson::ObjectId(oid) => Some(*oid),
        Bson::Document(d) => match d.get("$eq") {
            Some(Bson::ObjectId(oid)) if d.len() == 1 => Some(*oid),
            _ => None,
        },
        _ => None,
    }
}

fn filter_at(rule: &Rule, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
    if let Ok(f) = parent.get_document_mut(key) {
        filter(rule, f)?;
    }
    Ok(())
}

/// A query filter.
fn filter(rule: &Rule, f: &mut Document) -> Result<(), ProxyError> {
    match &rule.strategy {
        Strategy::Replace => replace_filter(rule, f),
        Strategy::Derive { field } => {
            let values: Option<Vec<Bson>> = match f.get(&rule.field) {
                Some(Bson::ObjectId(oid)) => Some(vec![rule.derived(oid)]),
                Some(Bson::Document(d)) => match (d.get("$eq"), d.get("$in")) {
                    (Some(Bson::ObjectId(oid)), None) => Some(vec![rule.derived(oid)]),
                    (None, Some(Bson::Array(a)))
                        if a.iter().all(|v| matches!(v, Bson::ObjectId(_))) =>
                    {
                        Some(
                            a.iter()
                                .filter_map(|v| v.as_object_id())
                                .map(|o| rule.derived(&o))
                                .collect(),
                        )
                    }
                    _ => None,
                },
                _ => None,
            };
            if let (Some(mut values), false) = (values, f.contains_key(field)) {
                let pin = if values.len() == 1 {
                    values.remove(0)
                } else {
                    Bson::Document(doc! {"$in": values})
                };
                f.insert(field.clone(), pin);
            }
            Ok(())
        }
    }
}

fn replace_filter(rule: &Rule, f: &mut Document) -> Result<(), ProxyError> {
    for (k, v) in f.iter_mut() {
        match k.as_str() {
            "$and" | "$or" | "$nor" => {
                if let Bson::Array(a) = v {
                    for sub in a.iter_mut() {
                        if let Bson::Document(sub) = sub {
                            replace_filter(rule, sub)?;
                        }
                    }
                }
            }
            k if k == rule.field => match v {
                Bson::ObjectId(oid) => *v = rule.stored(oid),
                Bson::Document(ops) if ops.keys().next().is_some_and(|k| k.starts_with('$')) => {
                    for (op, operand) in ops.iter_mut() {
                        match op.as_str() {
                            "$eq" | "$ne" => map_value(rule, operand),
                            "$in" | "$nin" => {
                                if let Bson::Array(a) = operand {
                                    a.iter_mut().for_each(|x| map_value(rule, x));
                                }
                            }
                            "$exists" => {}
                            "$gt" | "$gte" | "$lt" | "$lte" => {
                                return Err(rule.refuse(&format!("a range query ({op})")))
                            }
                            other => return Err(rule.refuse(&format!("the operator {other}"))),
                        }
                    }
                }
                _ => {}
            },
            _ => {}
        }
    }
    Ok(())
}

fn map_value(rule: &Rule, v: &mut Bson) {
    if let Bson::ObjectId(oid) = v {
        *v = rule.stored(oid);
    }
}

fn sort_at(rule: &Rule, parent: &Document, key: &str) -> Result<(), ProxyError> {
    if rule.strategy == Strategy::Replace {
        if let Ok(s) = parent.get_document(key) {
            if s.contains_key(&rule.field) {
                return Err(rule.refuse("a sort"));
            }
        }
    }
    Ok(())
}

fn bounds(rule: &Rule, body: &Document, key: &str) -> Result<(), ProxyError> {
    if rule.strategy == Strategy::Replace
        && body
            .get_document(key)
            .is_ok_and(|b| b.contains_key(&rule.field))
    {
        return Err(rule.refuse(&format!("an index bound ({key})")));
    }
    Ok(())
}

/// Whether the command's projection names `field`, asking to see it.
fn projection_names(body: &Document, field: &str) -> bool {
    ["projection", "fields"]
        .iter()
        .filter_map(|k| body.get_document(k).ok())
        .any(|p| {
            p.get(field).is_some_and(|v| {
                !matches!(v, Bson::Int32(0) | Bson::Int64(0) | Bson::Boolean(false))
            })
        })
}

/// A reply with `replace`-strategy values turned back into their
/// ObjectIds (`restore`) and the added field `hide` taken out of the
/// documents it returns (a cursor's batch, `findAndModify`'s `value`),
/// raw bytes to raw bytes, in one pass into the buffer of the message that
/// will carry it. `None`: nothing changed.
pub fn reply(restore: bool, hide: Option<&str>, body: &[u8]) -> Result<Option<MsgBody>, Malformed> {
    let mut out = MsgBody::buffer(body.len());
    let wanted = Wanted {
        restore,
        hide: hide.map(str::as_bytes),
    };
    if !wanted.write(body, Place::Body, 0, &mut out)? {
        return Ok(None);
    }
    MsgBody::new(out)
        .map(Some)
        .map_err(|_| Malformed::Invalid("a reply rewritten to a bad length"))
}

/// What [`reply`] changes.
struct Wanted<'a> {
    restore: bool,
    hide: Option<&'a [u8]>,
}

/// Where a document is in a reply.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Body,
    /// The body's `cursor`.
    Cursor,
    /// Its `firstBatch` or `nextBatch`.
    Batch,
    /// A document returned: one of a batch, or `findAndModify`'s `value`.
    Returned,
    Inside,
}

impl Wanted<'_> {
    /// Writes `doc` (at `place`, `depth` levels down) to `out`: whether
    /// anything changed.
    fn write(
        &self,
        doc: &[u8],
        place: Place,
        depth: usize,
        out: &mut Vec<u8>,
    ) -> Result<bool, Malformed> {
        let start = walker::begin(out);
        let mut changed = false;
        for e in walker::elements(doc) {
            let e = e?;
            if place == Place::Returned && self.hide == Some(e.key) {
                changed = true;
                continue;
            }
            match e.kind {
                DOCUMENT | ARRAY => {
                    let inner = match (place, e.key, e.kind) {
                        (Place::Body, b"cursor", DOCUMENT) => Place::Cursor,
                        (Place::Body, b"value", DOCUMENT) => Place::Returned,
                        (Place::Cursor, b"firstBatch" | b"nextBatch", ARRAY) => Place::Batch,
                        (Place::Batch, _, DOCUMENT) => Place::Returned,
                        _ => Place::Inside,
                    };
                    walker::header(out, e.kind, e.key);
                    changed |= self.write(e.value, inner, walker::descend(depth)?, out)?;
                }
                BINARY if self.restore => match stored_object_id(e.value) {
                    Some(oid) => {
                        walker::header(out, OBJECT_ID, e.key);
                        out.extend_from_slice(&oid);
                        changed = true;
                    }
                    None => out.extend_from_slice(e.raw),
                },
                _ => out.extend_from_slice(e.raw),
            }
        }
        walker::finish(out, start);
        Ok(changed)
    }
}

const DOCUMENT: u8 = 0x03;
const ARRAY: u8 = 0x04;
const BINARY: u8 = 0x05;
const OBJECT_ID: u8 = 0x07;

/// The ObjectId a binary value (its length, subtype and bytes) stores
/// with the `replace` strategy, if it is one.
fn stored_object_id(value: &[u8]) -> Option<[u8; 12]> {
    match value {
        [16, 0, 0, 0, SUBTYPE, uuid @ ..] => locality::to_object_id(uuid.try_into().ok()?),
        _ => None,
    }
}

/// A cheap pre-check on raw bytes: can this reply hold a `replace` value?
/// (binary element, length 16, subtype [`SUBTYPE`]); false positives only cost a parse.
pub fn may_hold_stored_values(bytes: &[u8]) -> bool {
    bytes.windows(5).any(|w| w == [16, 0, 0, 0, SUBTYPE])
}

#[cfg(test)]
mod tests;
