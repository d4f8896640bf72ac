//! The common query and update shapes, raw to raw: a command's slots (as
//! the catalogue lists them) are rewritten straight from its bytes, and
//! every other field (`lsid`, `$clusterTime`, `$db`, read concerns…) is
//! copied as it came, with no owned document built.
//!
//! Only what is common and simple is taken: filters of paths with literal
//! scalars, comparison, `$in`/`$nin`, `$exists`, `$type`, `$regex` and
//! `$and`/`$or`/`$nor`; projections of flags; sorts; hints; `distinct`
//! keys; updates with `$set`, `$inc`, `$unset` and the other field
//! operators on dotted paths, or a replacement document; a `bulkWrite`'s
//! ops, each with its namespace's names. Anything else (`$expr`,
//! `$elemMatch`, a sub-document literal in a filter, pipelines, value
//! paths, a migrating collection…) makes the splice give up: in one
//! statement of many (an update's, a delete's, a `bulkWrite`'s op), the
//! owned [`super::Mapper`] rewrites that statement alone ([`Owned`]);
//! anywhere else, the whole command. The two agree byte for byte where
//! both apply (property-tested below).

use super::paths::{logical_parts, path};
use super::raw::tokenize_under;
use crate::error::ProxyError;
use crate::rewrite::catalogue::{self, Slot, Stores};
use crate::rewrite::walker::{
    as_str, begin, descend, elements, finish, header, string_of, string_value, Element, Malformed,
};
use crate::token::{Names, Policy};
use crate::wire::{DocumentSequence, OpMsg, Section};

/// Why a splice gave up.
#[derive(Debug)]
pub enum GiveUp {
    /// A shape the splice does not take: the owned mapper does it.
    Uncommon,
    Malformed(Malformed),
    /// The owned mapper refused a statement the splice handed it: the
    /// command is refused, as the owned mapper would refuse it whole.
    Refused(ProxyError),
}

/// The owned mapper, for the statements of a command the splice does not
/// take (one an update's, a delete's or a bulkWrite's op, of `slots`):
/// each is rewritten alone ([`super::statement`]) and appended, and the
/// rest of the command stays raw. What the splice noted of a statement
/// before it gave up is forgotten first: the owned rewrite notes it anew.
pub struct Owned<'a> {
    pub statement: &'a Statement<'a>,
    pub misses: &'a std::cell::RefCell<crate::rewrite::names::Misses>,
}

/// The owned rewrite of one statement: its slots, its bytes, and where it
/// is appended.
pub type Statement<'a> =
    dyn Fn(&[Slot], &[u8], &mut Vec<u8>) -> std::result::Result<(), ProxyError> + 'a;

impl From<Malformed> for GiveUp {
    fn from(m: Malformed) -> GiveUp {
        GiveUp::Malformed(m)
    }
}

type Result<T> = std::result::Result<T, GiveUp>;

/// The command `m` (named `name`) rewritten raw to raw under `policy`:
/// read names through `read`, stored ones (changes, an upsert's filter)
/// through `store`.
pub fn command(
    m: &OpMsg,
    name: &str,
    policy: &Policy,
    read: &dyn Names,
    store: &dyn Names,
    owned: Option<&Owned<'_>>,
) -> Result<OpMsg> {
    let entry = catalogue::lookup(name).ok_or(GiveUp::Uncommon)?;
    if entry.refused.is_some()
        || !matches!(entry.stores, Stores::Nothing | Stores::Data)
        || !policy.value_paths.is_empty()
    {
        return Err(GiveUp::Uncommon);
    }
    let s = Splice {
        policy,
        read,
        store,
        owned,
    };
    let mut out = m.clone();
    out.flags = m.flags.without_checksum();
    for section in &mut out.sections {
        match section {
            Section::Body(b) => {
                let mut body = Vec::with_capacity(b.len() + 16);
                s.slots(entry.slots, b, &mut body, 0)?;
                *b = bytes::Bytes::from(body);
            }
            Section::Sequence(seq) => {
                let inner = match slot_for(entry.slots, seq.identifier.as_bytes()) {
                    Some(Slot::Each(_, inner)) => inner,
                    Some(_) => return Err(GiveUp::Uncommon),
                    None => continue,
                };
                let mut rewritten = Vec::with_capacity(seq.bytes().len() + 64);
                for d in seq.documents() {
                    s.statement(inner, d, &mut rewritten, 1)?;
                }
                *seq = DocumentSequence::new(
                    std::mem::take(&mut seq.identifier),
                    bytes::Bytes::from(rewritten),
                )
                .map_err(|_| Malformed::Invalid("a rewritten document"))?;
            }
        }
    }
    Ok(out)
}

/// What a `bulkWrite`'s ops addressing one of its `nsInfo` namespaces are
/// rewritten with: the collection's policy and its database's names.
pub struct OpNames<'a> {
    pub policy: &'a Policy,
    pub read: &'a dyn Names,
    pub store: &'a dyn Names,
    /// The owned mapper for this namespace's ops of an uncommon shape.
    pub owned: Option<Owned<'a>>,
}

/// A `bulkWrite` (`m`) rewritten raw to raw: each op, in the body's `ops`
/// or in a sequence of that name, with the names of the namespace its
/// first field's `nsInfo` index gives (`namespaces[i]`; `None`, or an
/// index out of range: the op is copied, as the owned mapper leaves it).
pub fn bulk_write(m: &OpMsg, namespaces: &[Option<OpNames<'_>>]) -> Result<OpMsg> {
    let mut out = m.clone();
    out.flags = m.flags.without_checksum();
    for section in &mut out.sections {
        match section {
            Section::Body(b) => {
                let mut body = Vec::with_capacity(b.len() + b.len() / 4);
                let start = begin(&mut body);
                for e in elements(b) {
                    let e = e?;
                    if e.key != b"ops" || e.kind != 0x04 {
                        copy(&mut body, e);
                        continue;
                    }
                    header(&mut body, e.kind, e.key);
                    let array = begin(&mut body);
                    for op in elements(e.value) {
                        let op = op?;
                        header(&mut body, op.kind, op.key);
                        match op.kind {
                            0x03 => bulk_op(op.value, namespaces, &mut body, 2)?,
                            _ => body.extend_from_slice(op.value),
                        }
                    }
                    finish(&mut body, array);
                }
                finish(&mut body, start);
                *b = bytes::Bytes::from(body);
            }
            Section::Sequence(seq) if seq.identifier == "ops" => {
                // One buffer for the whole batch, as it came.
                let size = seq.bytes().len();
                let mut rewritten = Vec::with_capacity(size + size / 4);
                for op in seq.documents() {
                    bulk_op(op, namespaces, &mut rewritten, 1)?;
                }
                *seq = DocumentSequence::new(
                    std::mem::take(&mut seq.identifier),
                    bytes::Bytes::from(rewritten),
                )
                .map_err(|_| Malformed::Invalid("a rewritten document"))?;
            }
            Section::Sequence(_) => {}
        }
    }
    Ok(out)
}

/// One op of a `bulkWrite`: its slots, by its kind (its first key).
fn bulk_op(
    op: &[u8],
    namespaces: &[Option<OpNames<'_>>],
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<()> {
    let first = elements(op).next().transpose()?;
    let index = first.and_then(|e| match e.kind {
        0x10 => e.number().map(|n| n as i64),
        _ => e.i64(),
    });
    let names = index
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| namespaces.get(i)?.as_ref());
    match (first, names) {
        (Some(kind), Some(n)) => {
            let s = Splice {
                policy: n.policy,
                read: n.read,
                store: n.store,
                owned: n.owned.as_ref(),
            };
            s.statement(catalogue::bulk_op_slots(as_str(kind.key)?), op, out, depth)
        }
        _ => {
            out.extend_from_slice(op);
            Ok(())
        }
    }
}

struct Splice<'a> {
    policy: &'a Policy,
    read: &'a dyn Names,
    store: &'a dyn Names,
    owned: Option<&'a Owned<'a>>,
}

impl Splice<'_> {
    /// One statement (`slots` of a document), spliced; in a shape the
    /// splice does not take, rewritten by the owned mapper if there is one.
    fn statement(&self, slots: &[Slot], doc: &[u8], out: &mut Vec<u8>, depth: usize) -> Result<()> {
        let Some(owned) = self.owned else {
            return self.slots(slots, doc, out, depth);
        };
        let (written, noted) = (out.len(), owned.misses.borrow().mark());
        match self.slots(slots, doc, out, depth) {
            Err(GiveUp::Uncommon) => {
                out.truncate(written);
                owned.misses.borrow_mut().truncate(noted);
                (owned.statement)(slots, doc, out).map_err(GiveUp::Refused)
            }
            done => done,
        }
    }

    /// A (sub-)document with `slots`: each slot's field rewritten, the rest
    /// copied.
    fn slots(&self, slots: &[Slot], doc: &[u8], out: &mut Vec<u8>, depth: usize) -> Result<()> {
        let depth = descend(depth)?;
        let upsert = slots.iter().any(|s| matches!(s, Slot::Update { .. })) && is_upsert(doc)?;
        let start = begin(out);
        for e in elements(doc) {
            let e = e?;
            let slot = slot_for(slots, e.key);
            match (slot, e.kind) {
                (None, _) => copy(out, e),
                (Some(Slot::Filter(_)), 0x03) => {
                    header(out, e.kind, e.key);
                    self.filter(e.value, self.read, out, depth)?;
                }
                (Some(Slot::Update { filter, .. }), 0x03) if e.key == filter.as_bytes() => {
                    header(out, e.kind, e.key);
                    let names = if upsert { self.store } else { self.read };
                    self.filter(e.value, names, out, depth)?;
                }
                (Some(Slot::Update { update, .. }), 0x03) if e.key == update.as_bytes() => {
                    header(out, e.kind, e.key);
                    self.update(e.value, out, depth)?;
                }
                (Some(Slot::Projection(_)), 0x03) => {
                    header(out, e.kind, e.key);
                    self.paths(e.value, true, out, depth)?;
                }
                (Some(Slot::Sort(_) | Slot::Hint(_)), 0x03) => {
                    header(out, e.kind, e.key);
                    self.paths(e.value, false, out, depth)?;
                }
                (Some(Slot::Document(_)), 0x03) => {
                    header(out, e.kind, e.key);
                    tokenize_under(e.value, false, &[], self.policy, self.store, out, depth)?;
                }
                (Some(Slot::Path(_)), 0x02) => {
                    header(out, e.kind, e.key);
                    let p = string_of(e.value)?;
                    string_value(out, &path(p, &[], self.policy, self.read));
                }
                (Some(Slot::Each(_, inner)), 0x04) => {
                    header(out, e.kind, e.key);
                    let array = begin(out);
                    for item in elements(e.value) {
                        let item = item?;
                        if item.kind != 0x03 {
                            copy(out, item);
                            continue;
                        }
                        header(out, item.kind, item.key);
                        self.statement(inner, item.value, out, depth)?;
                    }
                    finish(out, array);
                }
                // A hint by index name, a sort given as something else: as
                // the owned mapper, left alone.
                (Some(Slot::Hint(_) | Slot::Sort(_) | Slot::Projection(_)), _) => copy(out, e),
                _ => return Err(GiveUp::Uncommon),
            }
        }
        finish(out, start);
        Ok(())
    }

    /// A query filter (at the top of a command's filter slot).
    fn filter(&self, f: &[u8], names: &dyn Names, out: &mut Vec<u8>, depth: usize) -> Result<()> {
        let depth = descend(depth)?;
        let start = begin(out);
        for e in elements(f) {
            let e = e?;
            let k = as_str(e.key)?;
            match k {
                "$and" | "$or" | "$nor" if e.kind == 0x04 => {
                    header(out, e.kind, e.key);
                    let array = begin(out);
                    let inner = descend(depth)?;
                    for sub in elements(e.value) {
                        let sub = sub?;
                        header(out, sub.kind, sub.key);
                        match sub.kind {
                            0x03 => self.filter(sub.value, names, out, inner)?,
                            _ => out.extend_from_slice(sub.value),
                        }
                    }
                    finish(out, array);
                }
                "$comment" => copy(out, e),
                _ if k.starts_with('$') => return Err(GiveUp::Uncommon),
                p => {
                    header(out, e.kind, path(p, &[], self.policy, names).as_bytes());
                    match e.kind {
                        0x03 => self.condition(e.value, out, depth)?,
                        _ => {
                            scalar_value(e)?;
                            out.extend_from_slice(e.value);
                        }
                    }
                }
            }
        }
        finish(out, start);
        Ok(())
    }

    /// The operator document under a path in a filter, when its operands
    /// hold no names.
    fn condition(&self, c: &[u8], out: &mut Vec<u8>, depth: usize) -> Result<()> {
        descend(depth)?;
        let start = begin(out);
        let mut first = true;
        for e in elements(c) {
            let e = e?;
            // A document whose first key is not an operator is a literal
            // sub-document: its keys are stored names.
            if first && e.key.first() != Some(&b'$') {
                return Err(GiveUp::Uncommon);
            }
            first = false;
            match e.key {
                b"$eq" | b"$ne" | b"$gt" | b"$gte" | b"$lt" | b"$lte" | b"$in" | b"$nin"
                | b"$all" => {
                    header(out, e.kind, e.key);
                    scalar_value(e)?;
                    out.extend_from_slice(e.value);
                }
                b"$exists" | b"$type" | b"$size" | b"$mod" | b"$regex" | b"$options" => {
                    copy(out, e)
                }
                _ => return Err(GiveUp::Uncommon),
            }
        }
        finish(out, start);
        Ok(())
    }

    /// A document whose keys are paths and whose values stay: a sort, a
    /// hint's key pattern, or (`flags`) a find projection of flags only
    /// (`{a: 1, "b.c": 0}`).
    fn paths(&self, d: &[u8], flags: bool, out: &mut Vec<u8>, depth: usize) -> Result<()> {
        descend(depth)?;
        let start = begin(out);
        for e in elements(d) {
            let e = e?;
            let k = as_str(e.key)?;
            if k.starts_with('$') {
                copy(out, e);
                continue;
            }
            if flags && !is_flag(e) {
                return Err(GiveUp::Uncommon);
            }
            header(out, e.kind, path(k, &[], self.policy, self.read).as_bytes());
            out.extend_from_slice(e.value);
        }
        finish(out, start);
        Ok(())
    }

    /// An update: operators on paths, or a replacement document. Its names
    /// are stored.
    fn update(&self, u: &[u8], out: &mut Vec<u8>, depth: usize) -> Result<()> {
        let depth = descend(depth)?;
        let operators = match elements(u).next() {
            Some(first) => first?.key.first() == Some(&b'$'),
            None => false,
        };
        if !operators {
            tokenize_under(u, false, &[], self.policy, self.store, out, depth)?;
            return Ok(());
        }
        let start = begin(out);
        for op in elements(u) {
            let op = op?;
            if op.kind != 0x03 {
                copy(out, op);
                continue;
            }
            let verbatim = match op.key {
                b"$unset" | b"$inc" | b"$mul" | b"$currentDate" | b"$pop" | b"$bit" => true,
                b"$set" | b"$setOnInsert" | b"$min" | b"$max" | b"$push" | b"$addToSet"
                | b"$pullAll" => false,
                _ => return Err(GiveUp::Uncommon),
            };
            header(out, op.kind, op.key);
            let fields = begin(out);
            let inner = descend(depth)?;
            for f in elements(op.value) {
                let f = f?;
                let p = as_str(f.key)?;
                header(
                    out,
                    f.kind,
                    path(p, &[], self.policy, self.store).as_bytes(),
                );
                match f.kind {
                    0x03 | 0x04 if !verbatim => {
                        let scope: Vec<&str> = logical_parts(p).collect();
                        let is_array = f.kind == 0x04;
                        tokenize_under(
                            f.value,
                            is_array,
                            &scope,
                            self.policy,
                            self.store,
                            out,
                            inner,
                        )?;
                    }
                    _ => out.extend_from_slice(f.value),
                }
            }
            finish(out, fields);
        }
        finish(out, start);
        Ok(())
    }
}

/// The slot a field fills, by its key (an update's two keys included).
fn slot_for<'s>(slots: &'s [Slot], key: &[u8]) -> Option<&'s Slot> {
    slots.iter().find(|slot| match slot {
        Slot::Update {
            filter,
            update,
            array_filters,
        } => [filter, update, array_filters]
            .iter()
            .any(|k| k.as_bytes() == key),
        Slot::Filter(k)
        | Slot::Documents(k)
        | Slot::Document(k)
        | Slot::Projection(k)
        | Slot::Sort(k)
        | Slot::Hint(k)
        | Slot::Keys(k)
        | Slot::Path(k)
        | Slot::Pipeline(k)
        | Slot::Let(k)
        | Slot::Each(k, _)
        | Slot::Within(k, _)
        | Slot::Explain(k) => k.as_bytes() == key,
        Slot::View { on, pipeline } => on.as_bytes() == key || pipeline.as_bytes() == key,
        Slot::BulkOps => key == b"ops" || key == b"nsInfo",
    })
}

/// Whether an update statement asks for an upsert.
fn is_upsert(doc: &[u8]) -> Result<bool> {
    for e in elements(doc) {
        let e = e?;
        if e.key == b"upsert" {
            return Ok(e.kind == 0x08 && e.value == [1]);
        }
    }
    Ok(false)
}

fn copy(out: &mut Vec<u8>, e: Element<'_>) {
    out.extend_from_slice(e.raw);
}

/// A literal compared with stored data: taken only if it holds no
/// documents (whose keys would be stored names).
fn scalar_value(e: Element<'_>) -> Result<()> {
    match e.kind {
        0x03 => Err(GiveUp::Uncommon),
        0x04 => {
            for x in elements(e.value) {
                if matches!(x?.kind, 0x03 | 0x04) {
                    return Err(GiveUp::Uncommon);
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// A projection flag: 0, 1, true or false.
fn is_flag(e: Element<'_>) -> bool {
    match e.kind {
        0x08 => true,
        0x10 => matches!(e.value, [0 | 1, 0, 0, 0]),
        0x12 => matches!(e.value, [0 | 1, 0, 0, 0, 0, 0, 0, 0]),
        0x01 => {
            let x = f64::from_le_bytes(e.value.try_into().unwrap_or_default());
            x == 0.0 || x == 1.0
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::sync::Arc;

    use bson::{doc, Bson, Document, RawDocumentBuf};
    use proptest::prelude::*;

    use super::*;
    use crate::rewrite::command::Command;
    use crate::rewrite::mapper::{self, Lookup};
    use crate::rewrite::names::{Misses, Noting};
    use crate::token::{Dictionary, Policies};
    use crate::wire::{DocumentSequence, MsgFlags};

    fn policy() -> Policy {
        Policy::new(3, &["custom".into()], "laconic")
    }

    /// A dictionary knowing some of the names the generators use (the
    /// others are misses, noted alike by both rewrites).
    fn dictionary() -> Arc<Dictionary> {
        let mut d = Dictionary::default();
        d.add_names(
            &[
                "name",
                "email",
                "score",
                "custom",
                "address",
                "city",
                "Favourite Colour",
                "tags",
            ]
            .map(str::to_owned),
        );
        Arc::new(d)
    }

    /// How a test rewrites a command.
    #[derive(Clone, Copy, PartialEq)]
    enum How {
        /// The splice alone: it gives up on any uncommon shape.
        Splice,
        /// The splice, with the owned mapper for the statements it does
        /// not take.
        Fallback,
        Owned,
    }

    /// One message rewritten as `how` says (`None` if the splice gave
    /// up), with the misses noted.
    fn rewrite(m: &OpMsg, how: How) -> Rewrite {
        let policy = policy();
        let policies = Policies::new(policy.clone());
        let dict = dictionary();
        let misses = RefCell::new(Misses::default());
        let noting = |storing| Noting {
            inner: dict.clone(),
            db: "d",
            misses: &misses,
            storing,
        };
        let (read, store) = (noting(false), noting(true));
        let statement = |slots: &[Slot], raw: &[u8], out: &mut Vec<u8>| {
            let names = Lookup {
                read: &read,
                store: &store,
            };
            mapper::statement(raw, slots, &policies, "d", "c", names, out)
        };
        let owned = Owned {
            statement: &statement,
            misses: &misses,
        };
        let out = if how != How::Owned {
            let name = m.body().iter().next().unwrap().unwrap().0.to_owned();
            let owned = (how == How::Fallback).then_some(&owned);
            outcome(command(m, &name, &policy, &read, &store, owned))
        } else {
            let mut cmd = Command::from_msg(m).unwrap();
            let lookup = Lookup {
                read: &read,
                store: &store,
            };
            Some(
                mapper::command(&mut cmd, "d", &policies, lookup)
                    .and_then(|()| cmd.into_msg(m))
                    .map_err(|e| e.to_string()),
            )
        };
        drop((read, store));
        (out, misses.into_inner())
    }

    fn sorted(mut m: Misses) -> Misses {
        m.stored_names.sort();
        m.read_names.sort();
        m
    }

    fn msg(body: &Document, sequence: Option<(&str, Vec<Document>)>) -> OpMsg {
        let raw = |d: &Document| {
            bytes::Bytes::from(RawDocumentBuf::from_document(d).unwrap().into_bytes())
        };
        let mut sections = vec![Section::Body(raw(body))];
        if let Some((id, docs)) = sequence {
            sections.push(Section::Sequence(
                DocumentSequence::of(id.into(), docs.iter().map(raw)).unwrap(),
            ));
        }
        OpMsg {
            flags: MsgFlags::default(),
            sections,
            checksum: None,
        }
    }

    /// Whether the splice took the command; where it did, it gave what
    /// the owned mapper gives, and noted the same misses.
    fn check(m: &OpMsg) -> bool {
        check_as(m, How::Splice)
    }

    /// [`check`] for the splice as `how` says. With the owned mapper for
    /// uncommon statements, a command the owned mapper refuses whole is
    /// refused alike.
    fn check_as(m: &OpMsg, how: How) -> bool {
        check_with(m, how, rewrite)
    }

    /// The check, of a command rewritten by `rewrite` (a command's or a
    /// `bulkWrite`'s helper).
    fn check_with(m: &OpMsg, how: How, rewrite: fn(&OpMsg, How) -> Rewrite) -> bool {
        let (spliced, spliced_misses) = rewrite(m, how);
        let Some(spliced) = spliced else {
            return false;
        };
        let (owned, owned_misses) = rewrite(m, How::Owned);
        agree(spliced, spliced_misses, owned.unwrap(), owned_misses);
        true
    }

    /// A splice's result as a test rewrite gives it.
    fn outcome(r: Result<OpMsg>) -> Option<std::result::Result<OpMsg, String>> {
        match r {
            Ok(msg) => Some(Ok(msg)),
            Err(GiveUp::Uncommon) => None,
            Err(GiveUp::Refused(e)) => Some(Err(e.to_string())),
            Err(e) => Some(Err(format!("{e:?}"))),
        }
    }

    /// What a test rewrite gave: `None` if the splice gave up, an error's
    /// text if the command was refused; and the misses it noted.
    type Rewrite = (Option<std::result::Result<OpMsg, String>>, Misses);

    /// What a splice gave (`Err`: a statement refused) against what the
    /// owned mapper gave for the whole command.
    fn agree(
        spliced: std::result::Result<OpMsg, String>,
        spliced_misses: Misses,
        owned: std::result::Result<OpMsg, String>,
        owned_misses: Misses,
    ) {
        match spliced {
            Ok(spliced) => {
                let owned = owned.expect("the splice takes nothing the owned mapper refuses");
                assert_eq!(
                    spliced.sections, owned.sections,
                    "the splice and the owned rewrite differ"
                );
                assert_eq!(sorted(spliced_misses), sorted(owned_misses));
            }
            Err(refused) => {
                let whole = owned.expect_err("what the splice refused, the owned mapper refuses");
                assert_eq!(refused, whole);
            }
        }
    }

    #[test]
    fn the_common_shapes_are_spliced_as_the_owned_mapper_rewrites_them() {
        let lsid = doc! {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] }};
        let find = doc! {
            "find": "people", "filter": {"name": "x", "score": {"$gte": 3, "$lt": 9}, "$or": [{"address.city": "Oslo"}, {"tags": {"$in": ["a", "b"]}}]},
            "projection": {"name": 1, "custom.Favourite Colour": 1, "_id": 0}, "sort": {"score": -1},
            "hint": "score_1", "lsid": lsid.clone(), "$db": "d",
        };
        assert!(check(&msg(&find, None)));
        let update = doc! {"update": "people", "ordered": true, "lsid": lsid, "$db": "d"};
        let statements = vec![
            doc! {"q": {"_id": 1}, "u": {"$set": {"address": {"city": "Oslo", "postcode": "0150"}, "custom.New Attribute": [1, {"nested": 2}]}, "$inc": {"score": 1}}, "upsert": true},
            doc! {"q": {"email": {"$exists": true}}, "u": {"name": "replaced", "custom": {"Favourite Colour": "red"}}, "multi": false},
            doc! {"q": {}, "u": {"$unset": {"tags.0": ""}, "$push": {"tags": {"$each": ["x"]}}}},
        ];
        assert!(check(&msg(&update, Some(("updates", statements.clone())))));
        let mut inline = update.clone();
        inline.insert("updates", statements);
        assert!(check(&msg(&inline, None)));
        assert!(check(&msg(
            &doc! {"distinct": "people", "key": "address.city", "query": {"score": 1}, "$db": "d"},
            None
        )));
    }

    #[test]
    fn uncommon_shapes_are_left_to_the_owned_mapper() {
        for body in [
            doc! {"find": "c", "filter": {"$expr": {"$eq": ["$name", 1]}}, "$db": "d"},
            doc! {"find": "c", "filter": {"address": {"city": "Oslo"}}, "$db": "d"},
            doc! {"find": "c", "filter": {"tags": {"$elemMatch": {"name": 1}}}, "$db": "d"},
            doc! {"find": "c", "projection": {"name": {"$slice": 1}}, "$db": "d"},
            doc! {"update": "c", "updates": [{"q": {}, "u": [{"$set": {"name": 1}}]}], "$db": "d"},
            doc! {"aggregate": "c", "pipeline": [], "cursor": {}, "$db": "d"},
        ] {
            assert!(!check(&msg(&body, None)), "{body}");
        }
    }

    fn arb_key() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_]{1,8}",
            Just("name".to_owned()),
            Just("score".to_owned()),
            Just("custom".to_owned()),
            "custom\\.[A-Z][a-z ]{1,8}",
            "[a-z]{1,6}\\.[a-z]{1,6}",
            "address\\.(\\$|0|\\$\\[\\]|\\$\\[x\\])\\.city",
            "[\u{1}-\u{1f}][a-z]{0,3}",
            Just("$comment".to_owned()),
        ]
    }

    fn arb_scalar() -> impl Strategy<Value = Bson> {
        prop_oneof![
            any::<i32>().prop_map(Bson::Int32),
            any::<i64>().prop_map(Bson::Int64),
            "[a-z ]{0,6}".prop_map(Bson::String),
            any::<bool>().prop_map(Bson::Boolean),
            Just(Bson::Null),
            Just(Bson::Double(1.0)),
        ]
    }

    fn arb_value() -> impl Strategy<Value = Bson> {
        arb_scalar().prop_recursive(2, 12, 3, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..3).prop_map(Bson::Array),
                prop::collection::vec((arb_key(), inner), 0..3)
                    .prop_map(|kv| Bson::Document(kv.into_iter().collect())),
            ]
        })
    }

    fn arb_condition() -> impl Strategy<Value = Bson> {
        let op = prop_oneof![
            Just("$eq"),
            Just("$ne"),
            Just("$gt"),
            Just("$lte"),
            Just("$in"),
            Just("$nin"),
            Just("$exists"),
            Just("$type"),
            Just("$regex"),
            Just("$not"),
            Just("$elemMatch"),
            Just("$size"),
            Just("$near"),
        ];
        prop_oneof![
            arb_value(),
            prop::collection::vec((op, arb_value()), 0..3).prop_map(|ops| {
                Bson::Document(ops.into_iter().map(|(o, v)| (o.to_owned(), v)).collect())
            }),
        ]
    }

    fn arb_filter() -> impl Strategy<Value = Document> {
        let flat = || {
            prop::collection::vec((arb_key(), arb_condition()), 0..4)
                .prop_map(|kv| kv.into_iter().collect::<Document>())
        };
        (
            flat(),
            prop::option::of(prop::collection::vec(flat(), 0..3)),
        )
            .prop_map(|(mut f, or)| {
                if let Some(or) = or {
                    f.insert("$or", or);
                }
                f
            })
    }

    fn arb_update() -> impl Strategy<Value = Bson> {
        let op = prop_oneof![
            Just("$set"),
            Just("$inc"),
            Just("$unset"),
            Just("$push"),
            Just("$setOnInsert"),
            Just("$addToSet"),
            Just("$rename"),
            Just("$min"),
            Just("$currentDate"),
        ];
        let fields = prop::collection::vec((arb_key(), arb_value()), 0..3)
            .prop_map(|kv| Bson::Document(kv.into_iter().collect()));
        prop_oneof![
            prop::collection::vec((op, fields), 1..3).prop_map(|ops| {
                Bson::Document(ops.into_iter().map(|(o, v)| (o.to_owned(), v)).collect())
            }),
            prop::collection::vec((arb_key(), arb_value()), 0..3).prop_map(|kv| Bson::Document(
                kv.into_iter()
                    .filter(|(k, _)| !k.starts_with('$'))
                    .collect()
            )),
        ]
    }

    fn arb_command() -> impl Strategy<Value = OpMsg> {
        let flags = || {
            prop::collection::vec((arb_key(), arb_value()), 0..3)
                .prop_map(|kv| Bson::Document(kv.into_iter().collect()))
        };
        prop_oneof![
            (arb_filter(), prop::option::of(flags()), prop::option::of(flags())).prop_map(
                |(filter, projection, sort)| {
                    let mut b = doc! {"find": "c", "filter": filter};
                    if let Some(p) = projection {
                        b.insert("projection", p);
                    }
                    if let Some(s) = sort {
                        b.insert("sort", s);
                    }
                    b.insert("$db", "d");
                    msg(&b, None)
                }
            ),
            (prop::collection::vec((arb_filter(), arb_update(), any::<bool>()), 1..3), any::<bool>())
                .prop_map(|(ops, sequence)| update_command(ops, sequence)),
            arb_filter().prop_map(|q| msg(&doc! {"delete": "c", "deletes": [{"q": q, "limit": 1}], "$db": "d"}, None)),
            (arb_filter(), arb_update(), any::<bool>()).prop_map(|(q, u, upsert)| {
                msg(&doc! {"findAndModify": "c", "query": q, "update": u, "upsert": upsert, "$db": "d"}, None)
            }),
            (arb_key(), arb_filter()).prop_map(|(k, q)| {
                msg(&doc! {"distinct": "c", "key": k, "query": q, "$db": "d"}, None)
            }),
        ]
    }

    #[test]
    fn the_generated_commands_are_often_spliced() {
        // The property below says nothing if the splice gives up on
        // everything the generator makes.
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = arb_command();
        let taken = (0..500)
            .filter(|_| check(&strategy.new_tree(&mut runner).unwrap().current()))
            .count();
        assert!(taken >= 100, "only {taken} of 500 spliced");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        #[test]
        fn where_the_splice_takes_a_command_it_agrees_with_the_owned_mapper(m in arb_command()) {
            check(&m);
        }
    }

    /// An `update` of `(q, u, upsert)` statements, in a sequence or in the
    /// body.
    fn update_command(ops: Vec<(Document, Bson, bool)>, sequence: bool) -> OpMsg {
        let statements: Vec<Document> = ops
            .into_iter()
            .map(|(q, u, upsert)| doc! {"q": q, "u": u, "upsert": upsert})
            .collect();
        if sequence {
            msg(
                &doc! {"update": "c", "$db": "d"},
                Some(("updates", statements)),
            )
        } else {
            msg(
                &doc! {"update": "c", "updates": statements, "$db": "d"},
                None,
            )
        }
    }

    /// An update's or a delete's statements, some of shapes the splice
    /// does not take (a pipeline update, `$rename`, `$elemMatch`…) and
    /// some the owned mapper refuses (`$where`).
    fn arb_statements() -> impl Strategy<Value = OpMsg> {
        let filter = || {
            (arb_filter(), 0..8u8).prop_map(|(mut q, odd)| {
                if odd == 0 {
                    q.insert("$where", "true");
                }
                q
            })
        };
        let update = prop_oneof![
            3 => arb_update(),
            1 => prop::collection::vec((arb_key(), arb_value()), 1..3).prop_map(|kv| {
                let set: Document = kv.into_iter().filter(|(k, _)| !k.starts_with('$')).collect();
                Bson::Array(vec![Bson::Document(doc! {"$set": set})])
            }),
        ];
        prop_oneof![
            (
                prop::collection::vec((filter(), update, any::<bool>()), 1..5),
                any::<bool>()
            )
                .prop_map(|(ops, sequence)| update_command(ops, sequence)),
            prop::collection::vec(filter(), 1..5).prop_map(|qs| {
                let statements: Vec<Document> =
                    qs.into_iter().map(|q| doc! {"q": q, "limit": 0}).collect();
                msg(
                    &doc! {"delete": "c", "$db": "d"},
                    Some(("deletes", statements)),
                )
            }),
        ]
    }

    /// The statements the splice does not take go to the owned mapper one
    /// by one, the others stay raw, and the command is what the owned
    /// mapper makes of it whole (or refused as it refuses it).
    #[test]
    fn uncommon_statements_are_rewritten_alone_by_the_owned_mapper() {
        let statements = vec![
            doc! {"q": {"name": "a"}, "u": {"$set": {"score": 1}}},
            doc! {"q": {"address.city": "Oslo"}, "u": [{"$set": {"name": "$email", "custom.Favourite Colour": 1}}]},
            doc! {"q": {"tags": {"$elemMatch": {"name": 1}}}, "u": {"$rename": {"name": "email"}}},
            doc! {"q": {}, "u": {"$inc": {"score": 1}}, "upsert": true},
        ];
        for sequence in [false, true] {
            let m = if sequence {
                msg(
                    &doc! {"update": "c", "$db": "d"},
                    Some(("updates", statements.clone())),
                )
            } else {
                msg(
                    &doc! {"update": "c", "updates": statements.clone(), "$db": "d"},
                    None,
                )
            };
            assert!(!check(&m), "the splice alone gives up");
            assert!(check_as(&m, How::Fallback));
            let mut refused = statements.clone();
            refused.push(doc! {"q": {"$where": "true"}, "u": {"$set": {"score": 2}}});
            let m = msg(
                &doc! {"update": "c", "$db": "d"},
                Some(("updates", refused)),
            );
            assert!(check_as(&m, How::Fallback));
            assert!(matches!(rewrite(&m, How::Fallback).0, Some(Err(e)) if e.contains("$where")));
        }
        // A bulkWrite's op, alike.
        let ops = vec![
            doc! {"insert": 0, "document": {"name": "a"}},
            doc! {"update": 1, "filter": {"name": "a"}, "updateMods": [{"$set": {"score": 1}}]},
            doc! {"delete": 0, "filter": {"$where": "true"}},
        ];
        let m = bulk(ops[..2].to_vec(), true);
        assert!(!check_bulk(&m));
        assert!(check_bulk_as(&m, How::Fallback));
        let m = bulk(ops, false);
        assert!(check_bulk_as(&m, How::Fallback));
        assert!(matches!(rewrite_bulk(&m, How::Fallback).0, Some(Err(e)) if e.contains("$where")));
    }

    #[test]
    fn the_generated_statements_often_need_the_owned_mapper() {
        // The property below says little unless many generated commands
        // have statements the splice hands over, and some are refused.
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = arb_statements();
        let (mut handed, mut refused) = (0, 0);
        for _ in 0..300 {
            let m = strategy.new_tree(&mut runner).unwrap().current();
            match rewrite(&m, How::Fallback).0 {
                Some(Ok(_)) if rewrite(&m, How::Splice).0.is_none() => handed += 1,
                Some(Err(_)) => refused += 1,
                _ => {}
            }
        }
        assert!(
            handed >= 60 && refused >= 20,
            "{handed} handed over, {refused} refused"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn with_the_owned_mapper_for_uncommon_statements_the_splice_agrees_with_it(
            m in prop_oneof![arb_command(), arb_statements()],
            ops in prop::collection::vec(prop_oneof![
                3 => arb_bulk_op(),
                1 => (0..3i32, arb_filter()).prop_map(|(ns, q)| {
                    doc! {"update": ns, "filter": q, "updateMods": [{"$set": {"name": 1}}]}
                }),
            ], 1..5),
            sequences in any::<bool>(),
        ) {
            check_as(&m, How::Fallback);
            prop_assert!(check_bulk_as(&bulk(ops, sequences), How::Fallback));
        }
    }

    /// A `bulkWrite` over three namespaces: two tokenized databases (each
    /// with its own dictionary) and one that is not. Its ops and `nsInfo`
    /// in the body or, as drivers send them, in sequences.
    fn bulk(ops: Vec<Document>, sequences: bool) -> OpMsg {
        let ns_info = vec![
            doc! {"ns": "d.c"},
            doc! {"ns": "e.people"},
            doc! {"ns": "x.c"},
        ];
        if !sequences {
            let body = doc! {"bulkWrite": 1, "ops": ops, "nsInfo": ns_info, "$db": "admin"};
            return msg(&body, None);
        }
        let mut m = msg(&doc! {"bulkWrite": 1, "$db": "admin"}, Some(("ops", ops)));
        let raw = |d: &Document| {
            bytes::Bytes::from(RawDocumentBuf::from_document(d).unwrap().into_bytes())
        };
        m.sections.push(Section::Sequence(
            DocumentSequence::of("nsInfo".into(), ns_info.iter().map(raw)).unwrap(),
        ));
        m
    }

    /// A `bulkWrite` rewritten by the splice (`None` if it gave up) or by
    /// the owned mapper, with the misses noted.
    fn rewrite_bulk(m: &OpMsg, how: How) -> Rewrite {
        let policy = policy();
        let policies = Policies::new(policy.clone());
        let (d, mut e) = (dictionary(), (*dictionary()).clone());
        e.add_names(&["zebra".to_owned(), "other".to_owned()]);
        let e = Arc::new(e);
        let misses = RefCell::new(Misses::default());
        let noting = |dict: &Arc<Dictionary>, db, storing| Noting {
            inner: dict.clone(),
            db,
            misses: &misses,
            storing,
        };
        let (d_read, d_store) = (noting(&d, "d", false), noting(&d, "d", true));
        let (e_read, e_store) = (noting(&e, "e", false), noting(&e, "e", true));
        let statement = |db: &'static str, coll: &'static str, read, store| {
            let policies = &policies;
            move |slots: &[Slot], raw: &[u8], out: &mut Vec<u8>| {
                let names = Lookup { read, store };
                mapper::statement(raw, slots, policies, db, coll, names, out)
            }
        };
        let (d_statement, e_statement) = (
            statement("d", "c", &d_read as &dyn Names, &d_store as &dyn Names),
            statement("e", "people", &e_read, &e_store),
        );
        let out = if how != How::Owned {
            let names = |read, store, statement| {
                Some(OpNames {
                    policy: &policy,
                    read,
                    store,
                    owned: (how == How::Fallback).then_some(Owned {
                        statement,
                        misses: &misses,
                    }),
                })
            };
            let per_ns = [
                names(&d_read as &dyn Names, &d_store as &dyn Names, &d_statement),
                names(&e_read, &e_store, &e_statement),
                None,
            ];
            outcome(bulk_write(m, &per_ns))
        } else {
            let mut cmd = Command::from_msg(m).unwrap();
            let lookup = |db: &str| match db {
                "d" => Some(Lookup {
                    read: &d_read,
                    store: &d_store,
                }),
                "e" => Some(Lookup {
                    read: &e_read,
                    store: &e_store,
                }),
                _ => None,
            };
            Some(
                mapper::bulk_write(&mut cmd, &policies, &lookup)
                    .and_then(|()| cmd.into_msg(m))
                    .map_err(|e| e.to_string()),
            )
        };
        drop((d_read, d_store, e_read, e_store));
        (out, misses.into_inner())
    }

    /// Whether the splice took the `bulkWrite`; where it did, it gave what
    /// the owned mapper gives, and noted the same misses.
    fn check_bulk(m: &OpMsg) -> bool {
        check_bulk_as(m, How::Splice)
    }

    fn check_bulk_as(m: &OpMsg, how: How) -> bool {
        check_with(m, how, rewrite_bulk)
    }

    fn arb_document() -> impl Strategy<Value = Document> {
        prop::collection::vec((arb_key(), arb_value()), 0..4).prop_map(|kv| {
            kv.into_iter()
                .filter(|(k, _)| !k.starts_with('$'))
                .collect()
        })
    }

    fn arb_bulk_op() -> impl Strategy<Value = Document> {
        // Index 3 is past `nsInfo`; an index may come as an int64.
        let ns = || {
            prop_oneof![
                (0..4i32).prop_map(Bson::Int32),
                (0..4i64).prop_map(Bson::Int64)
            ]
        };
        prop_oneof![
            (ns(), arb_document()).prop_map(|(ns, d)| doc! {"insert": ns, "document": d}),
            (ns(), arb_filter(), arb_update(), any::<bool>(), any::<bool>()).prop_map(
                |(ns, q, u, upsert, multi)| {
                    doc! {"update": ns, "filter": q, "updateMods": u, "upsert": upsert, "multi": multi}
                }
            ),
            (ns(), arb_filter(), any::<bool>())
                .prop_map(|(ns, q, multi)| doc! {"delete": ns, "filter": q, "multi": multi}),
        ]
    }

    #[test]
    fn a_bulk_write_is_spliced_as_the_owned_mapper_rewrites_it() {
        let ops = vec![
            doc! {"insert": 0, "document": {"_id": 1, "name": "a", "custom": {"Favourite Colour": "red"}, "address": {"city": "Oslo"}}},
            doc! {"insert": 1i64, "document": {"_id": 2, "name": "b", "other": [{"city": 1}]}},
            doc! {"insert": 2, "document": {"_id": 3, "name": "c"}},
            doc! {"update": 0, "filter": {"name": "a"}, "updateMods": {"$set": {"address.city": "Bergen"}}, "upsert": true},
            doc! {"update": 1, "filter": {"score": {"$gt": 1}}, "updateMods": {"name": "whole", "score": 2}, "multi": false},
            doc! {"delete": 1, "filter": {"address.city": "Oslo"}, "multi": true},
            doc! {"delete": 7, "filter": {"name": "x"}},
        ];
        for sequences in [false, true] {
            let m = bulk(ops.clone(), sequences);
            assert!(check_bulk(&m), "sequences: {sequences}");
            // The rewrite did something: the first document's names are tokens.
            let (out, _) = rewrite_bulk(&m, How::Splice);
            let out = out.unwrap().unwrap();
            let first = Document::try_from(crate::rewrite::command::documents(&out, "ops")[0]);
            let stored = first.unwrap().get_document("document").unwrap().clone();
            assert!(!stored.contains_key("name"), "{stored}");
            assert!(stored.contains_key("_id"));
        }
        // Each database's own dictionary: `zebra` is a token in e only,
        // and a name d's dictionary lacks.
        let m = bulk(
            vec![
                doc! {"insert": 0, "document": {"zebra": 1}},
                doc! {"insert": 1, "document": {"zebra": 1}},
            ],
            true,
        );
        let (out, misses) = rewrite_bulk(&m, How::Splice);
        let out = out.unwrap().unwrap();
        let ops = crate::rewrite::command::documents(&out, "ops");
        let key = |i: usize| {
            let op = Document::try_from(ops[i]).unwrap();
            op.get_document("document").unwrap().keys().next().cloned()
        };
        assert_eq!(key(0).as_deref(), Some("zebra"));
        assert_ne!(key(1).as_deref(), Some("zebra"));
        assert_eq!(misses.stored_names.len(), 1, "{misses:?}");
        // An update by pipeline is left to the owned mapper.
        let pipeline = doc! {"update": 0, "filter": {}, "updateMods": [{"$set": {"name": 1}}]};
        assert!(!check_bulk(&bulk(vec![pipeline], true)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]
        #[test]
        fn where_the_splice_takes_a_bulk_write_it_agrees_with_the_owned_mapper(
            ops in prop::collection::vec(arb_bulk_op(), 1..5),
            sequences in any::<bool>(),
        ) {
            check_bulk(&bulk(ops, sequences));
        }
    }

    #[test]
    fn the_generated_bulk_writes_are_often_spliced() {
        use proptest::strategy::ValueTree;
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = (prop::collection::vec(arb_bulk_op(), 1..5), any::<bool>());
        let taken = (0..300)
            .filter(|_| {
                let (ops, sequences) = strategy.new_tree(&mut runner).unwrap().current();
                check_bulk(&bulk(ops, sequences))
            })
            .count();
        assert!(taken >= 60, "only {taken} of 300 spliced");
    }
}
