//! ④ Logical names → tokens in whole commands: the [`Mapper`] walks each
//! command's slots as the [catalogue](super::catalogue) lists them, and
//! maps every name it finds through the dictionary of the collection's
//! database, under the collection's policy. Commands whose names cannot be
//! seen on the wire (JavaScript, computed names), and commands the catalogue
//! does not list, are refused with an error naming the construct.
//!
//! - [`paths`]: names, paths, documents, filters and values (the parts);
//! - [`query`]: checked filters, `$jsonSchema`, sorts, projections;
//! - [`write`]: updates, replacements, pipeline updates, `arrayFilters`;
//! - [`stages`] and [`expr`]: aggregation.
//!
//! A name a dictionary lacks keeps its logical form, and the lookup is noted
//! ([`super::names::Noting`]): stored names are then given tokens, and read
//! names looked up again, before the command is rewritten once more.

mod expr;
mod flow;
pub mod paths;
mod query;
pub mod raw;
pub mod splice;
mod stages;
mod write;

use bson::{Bson, Document};

use super::catalogue::{self, Slot, Stores};
use super::command::Command;
use crate::error::ProxyError;
use crate::token::{Migration, Names, Policies, Policy};
use paths::{document, path, paths_document};

pub(super) use write::is_partial;

/// The dictionaries a rewrite reads through: one for the names it only
/// reads (filters, sorts…), one for the names it stores (documents,
/// changes), so that their misses are told apart.
#[derive(Clone, Copy)]
pub struct Lookup<'a> {
    pub read: &'a dyn Names,
    pub store: &'a dyn Names,
}

impl<'a> Lookup<'a> {
    /// One dictionary for both (tools and tests).
    pub fn of(names: &'a dyn Names) -> Lookup<'a> {
        Lookup {
            read: names,
            store: names,
        }
    }
}

/// Tokenizes `cmd` in place with the dictionary of the database `scope`,
/// under the policy of each collection it addresses.
pub fn command(
    cmd: &mut Command,
    scope: &str,
    policies: &Policies,
    names: Lookup<'_>,
) -> Result<(), ProxyError> {
    let name = cmd.name().to_owned();
    let coll = collection_of(&cmd.body).to_owned();
    Mapper::new(policies, scope, &coll, names).command(&name, &mut cmd.body)
}

/// One statement of a command (an update's or a delete's, a bulkWrite's
/// op: a document under a [`Slot::Each`] or the ops), given as bytes and
/// appended to `out` with its `slots` rewritten, as [`command`] rewrites
/// each of them: for the statements the raw splice does not take.
pub fn statement(
    raw: &[u8],
    slots: &[Slot],
    policies: &Policies,
    db: &str,
    coll: &str,
    names: Lookup<'_>,
    out: &mut Vec<u8>,
) -> Result<(), ProxyError> {
    let mut d =
        crate::rewrite::command::to_document(bson::RawDocument::from_bytes(raw).map_err(|e| {
            ProxyError::Unsupported(format!("a statement that is not a document: {e}"))
        })?)?;
    Mapper::new(policies, db, coll, names).slots(slots, &mut d)?;
    d.to_writer(out)
        .map_err(|e| ProxyError::Internal(format!("a rewritten statement: {e}")))
}

/// About the most memory the owned mapper holds to rewrite `raw` (a
/// command's body or one of its sequences' documents, or a statement): it
/// parses it into documents and builds the rewritten ones beside them,
/// many times its size where its elements are small. Measured on an
/// aggregate's `$match` (release build, peak RSS, one run each): a `$in`
/// of 1,000,000 int32 (11.9 MB) held 549 MB; of 600,000 short strings,
/// 299 MB; of 1,000,000 nulls, 395 MB; of 200,000 one-field documents,
/// 376 MB. This estimate, 600 bytes per element, 1,000 more per document
/// or array and 4 per byte, is 1.2 to 1.6 times each of those.
pub fn holds(raw: &[u8]) -> usize {
    /// A document or array of `depth`: its elements and containers.
    fn census(doc: &[u8], depth: usize) -> (usize, usize) {
        let (mut elements, mut containers) = (0, 1);
        let Ok(depth) = crate::rewrite::walker::descend(depth) else {
            return (elements, containers);
        };
        for e in crate::rewrite::walker::elements(doc).map_while(Result::ok) {
            elements += 1;
            if matches!(e.kind, 0x03 | 0x04) {
                let (e, c) = census(e.value, depth);
                elements += e;
                containers += c;
            }
        }
        (elements, containers)
    }
    let (elements, containers) = census(raw, 0);
    (elements * 600)
        .saturating_add(containers * 1000)
        .saturating_add(raw.len() * 4)
}

/// The most [`holds`] says per byte: of a document of empty-keyed nulls,
/// an element every 2 bytes (an empty document is 7, with its element).
pub const MOST_HELD_PER_BYTE: usize = 600 / 2 + 4;

/// The collection a command addresses: the string value of its first field.
pub(super) fn collection_of(body: &Document) -> &str {
    match body.iter().next() {
        Some((_, Bson::String(c))) => c,
        _ => "",
    }
}

/// The collection a raw command addresses.
pub fn collection_of_raw(body: &bson::RawDocument) -> &str {
    use crate::rewrite::walker::Fields;
    body.first().and_then(|e| e.str()).unwrap_or_default()
}

pub(super) fn refuse(what: &str) -> ProxyError {
    ProxyError::Unsupported(format!("{what} cannot be rewritten to tokenized names"))
}

/// A document with each field's value rewritten by `f`, key order kept.
pub(super) fn each_field(
    d: &Document,
    mut f: impl FnMut(&str, &Bson) -> Result<Bson, ProxyError>,
) -> Result<Document, ProxyError> {
    d.iter().map(|(k, v)| Ok((k.clone(), f(k, v)?))).collect()
}

/// The rewriting context of one collection: its policy, its database's
/// dictionary, and the policies of the other collections it may name.
#[derive(Clone, Copy)]
pub(super) struct Mapper<'a> {
    policies: &'a Policies,
    db: &'a str,
    policy: &'a Policy,
    names: &'a dyn Names,
    lookup: Lookup<'a>,
    /// The collection is being migrated (its documents are in both forms),
    /// and which way.
    migrating: Option<Migration>,
    /// What an expression computes is stored as documents: a pipeline
    /// update, a pipeline ending in `$out` or `$merge`.
    stores_documents: bool,
}

impl<'a> Mapper<'a> {
    pub(super) fn new(
        policies: &'a Policies,
        db: &'a str,
        coll: &str,
        lookup: Lookup<'a>,
    ) -> Mapper<'a> {
        Mapper {
            policies,
            db,
            policy: policies.get(db, coll),
            names: lookup.read,
            lookup,
            migrating: policies.migration(db, coll),
            stores_documents: false,
        }
    }

    /// The same database's collection `coll` (same dictionary, its own policy).
    pub(super) fn for_collection(&self, coll: &str) -> Mapper<'a> {
        Mapper {
            policy: self.policies.get(self.db, coll),
            migrating: self.policies.migration(self.db, coll),
            ..*self
        }
    }

    /// Another database's collection (a database sharing this dictionary).
    pub(super) fn for_namespace<'s>(&'s self, db: &'s str, coll: &str) -> Mapper<'s> {
        Mapper {
            db,
            policy: self.policies.get(db, coll),
            migrating: self.policies.migration(db, coll),
            ..*self
        }
    }

    /// This mapper for documents stored as `layout` says (a pipeline's,
    /// between two stages).
    pub(super) fn with_layout<'s>(&'s self, layout: &'s Policy) -> Mapper<'s> {
        Mapper {
            policy: layout,
            ..*self
        }
    }

    /// This mapper for names that are stored (their misses get tokens).
    pub(super) fn storing(&self) -> Mapper<'a> {
        Mapper {
            names: self.lookup.store,
            ..*self
        }
    }

    /// [`Mapper::storing`], where expressions compute stored documents.
    pub(super) fn storing_documents(&self) -> Mapper<'a> {
        Mapper {
            stores_documents: true,
            ..self.storing()
        }
    }

    /// A command, by its catalogue entry.
    fn command(&self, name: &str, body: &mut Document) -> Result<(), ProxyError> {
        let Some(entry) = catalogue::lookup(name) else {
            if self.policies.pass_through.iter().any(|p| p == name) {
                return Ok(());
            }
            return Err(ProxyError::Unsupported(format!(
                "the command {name} is unknown to Laconic, so the field names it may carry cannot be rewritten (list it in proxy.tokenize.pass_through if it carries none)"
            )));
        };
        if let Some(why) = entry.refused {
            return Err(refuse(why));
        }
        let m = match entry.stores {
            Stores::Everything => self.storing(),
            Stores::Output if writes_output(body) => self.storing_documents(),
            Stores::Output | Stores::Data | Stores::Nothing => *self,
        };
        m.slots(entry.slots, body)
    }

    /// Rewrites the slots of one (sub-)document.
    fn slots(&self, slots: &[Slot], body: &mut Document) -> Result<(), ProxyError> {
        for slot in slots {
            match *slot {
                Slot::Filter(k) => self.filter_at(body, k)?,
                Slot::Documents(k) => {
                    let m = self.storing();
                    m.each(body, k, |m, d| {
                        *d = m.stored(d);
                        Ok(())
                    })?;
                }
                Slot::Document(k) => {
                    if let Ok(d) = body.get_document(k) {
                        let d = self.storing().stored(d);
                        body.insert(k, d);
                    }
                }
                Slot::Update {
                    filter,
                    update,
                    array_filters,
                } => self.write_op(body, filter, update, array_filters)?,
                Slot::Projection(k) => self.projection_at(body, k)?,
                Slot::Sort(k) => self.sort_at(body, k)?,
                Slot::Hint(k) | Slot::Keys(k) => self.paths_at(body, k),
                Slot::Path(k) => self.path_string_at(body, k),
                Slot::Pipeline(k) => {
                    if let Ok(stages) = body.get_array_mut(k) {
                        self.pipeline(stages)?;
                    }
                }
                Slot::Let(k) => {
                    if let Ok(v) = body.get_document(k) {
                        let v = self.let_vars(v)?;
                        body.insert(k, v);
                    }
                }
                Slot::Each(k, inner) => self.each(body, k, |m, d| m.slots(inner, d))?,
                Slot::Within(k, inner) => {
                    if let Ok(d) = body.get_document_mut(k) {
                        self.slots(inner, d)?;
                    }
                }
                Slot::View { on, pipeline } => {
                    // A view's pipeline runs on the collection it is defined on.
                    // Queries on the view are rewritten under the view's own
                    // policy: its documents must store names that way.
                    let view = self.policies.get(self.db, collection_of(body));
                    let source = body.get_str(on).map(|v| self.for_collection(v));
                    if let (Ok(source), Ok(stages)) = (source, body.get_array_mut(pipeline)) {
                        let layouts = source.pipeline(stages)?;
                        let place = match &layouts[..] {
                            [] => source.policy.differs_from(view),
                            ls => ls.iter().find_map(|l| l.differs_from(view)),
                        };
                        if let Some(place) = place {
                            return Err(ProxyError::Unsupported(format!(
                                "a view whose documents store names at {} otherwise than its own tokenize settings say (its pipeline moved them there, or it reads a collection tokenized otherwise) cannot be queried correctly: give the view settings of its own in [[proxy.tokenize.namespaces]] that say how its documents store them",
                                stages::place_name(&place)
                            )));
                        }
                    }
                }
                Slot::Explain(k) => {
                    if let Some(Bson::Document(inner)) = body.get_mut(k) {
                        let name = inner.keys().next().cloned().unwrap_or_default();
                        let coll = collection_of(inner).to_owned();
                        self.for_collection(&coll).command(&name, inner)?;
                    }
                }
                Slot::BulkOps => self.bulk_write(body)?,
            }
        }
        Ok(())
    }

    /// A bulkWrite's ops in the databases that share this dictionary.
    fn bulk_write(&self, body: &mut Document) -> Result<(), ProxyError> {
        let lookup = |db: &str| {
            self.policies
                .same_dictionary(db, self.db)
                .then_some(self.lookup)
        };
        bulk_ops(body, self.policies, &lookup)
    }

    pub(super) fn doc(&self, d: &Document) -> Document {
        document(d, &mut Vec::new(), self.policy, self.names)
    }

    /// A document as it is stored: tokenized, or as written while
    /// `laconic migrate --reverse` writes the collection back to full names.
    pub(super) fn stored(&self, d: &Document) -> Document {
        if self.migrating == Some(Migration::Reverse) {
            d.clone()
        } else {
            self.doc(d)
        }
    }

    pub(super) fn each(
        &self,
        body: &mut Document,
        key: &str,
        mut f: impl FnMut(&Self, &mut Document) -> Result<(), ProxyError>,
    ) -> Result<(), ProxyError> {
        if let Ok(items) = body.get_array_mut(key) {
            for item in items.iter_mut() {
                if let Bson::Document(d) = item {
                    f(self, d)?;
                }
            }
        }
        Ok(())
    }

    pub(super) fn filter_at(&self, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
        if let Ok(f) = parent.get_document(key) {
            let f = self.checked_filter(f, &[])?;
            parent.insert(key.to_owned(), f);
        }
        Ok(())
    }

    pub(super) fn paths_at(&self, parent: &mut Document, key: &str) {
        if let Ok(p) = parent.get_document(key) {
            let p = paths_document(p, &[], self.policy, self.names);
            parent.insert(key.to_owned(), p);
        }
    }

    /// A string holding one path (`timeField`, `language_override`).
    pub(super) fn path_string_at(&self, parent: &mut Document, key: &str) {
        if let Ok(p) = parent.get_str(key) {
            let p = path(p, &[], self.policy, self.names);
            parent.insert(key.to_owned(), p);
        }
    }

    pub(super) fn sort_at(&self, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
        if let Ok(s) = parent.get_document(key) {
            let s = self.sort(s, &[])?;
            parent.insert(key.to_owned(), s);
        }
        Ok(())
    }

    pub(super) fn projection_at(&self, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
        if let Ok(p) = parent.get_document(key) {
            let p = self.projection(p, &[])?;
            parent.insert(key.to_owned(), p);
        }
        Ok(())
    }
}

/// While a collection migrates, the filters (matching both stored forms) of
/// the operator and pipeline updates of a command (as the driver sent it),
/// each with the namespace it addresses: the exchange brings the documents
/// they match to the stored form before the command runs, so that each
/// update meets one form only. `names` gives the dictionary of a database
/// with a collection being migrated.
pub fn migration_filters<'n>(
    cmd: &Command,
    policies: &Policies,
    names: &dyn Fn(&str) -> Option<&'n dyn Names>,
) -> Result<Vec<Converting>, ProxyError> {
    let mut out = Vec::new();
    let mut filters = Vec::new();
    let mut of = |db: &str, coll: &str, slots: &[Slot], body: &Document| {
        let Some(names) = names(db) else {
            return Ok(());
        };
        let m = Mapper::new(policies, db, coll, Lookup::of(names));
        if m.migrating.is_none() {
            return Ok(());
        }
        m.partial_update_filters(slots, body, &mut filters)?;
        out.extend(filters.drain(..).map(|filter| Converting {
            db: db.to_owned(),
            coll: coll.to_owned(),
            filter,
        }));
        Ok::<_, ProxyError>(())
    };
    if cmd.name() == "bulkWrite" {
        let namespaces = namespaces_of(&cmd.body);
        for op in cmd.body.get_array("ops").into_iter().flatten() {
            let Bson::Document(op) = op else { continue };
            let ns = op_namespace(op, &namespaces).and_then(|ns| ns.split_once('.'));
            let kind = op.keys().next().map(String::as_str).unwrap_or_default();
            if let Some((db, coll)) = ns {
                of(db, coll, catalogue::bulk_op_slots(kind), op)?;
            }
        }
    } else if let Some(entry) = catalogue::lookup(cmd.name()) {
        let db = cmd.body.get_str("$db").unwrap_or_default();
        of(db, collection_of(&cmd.body), entry.slots, &cmd.body)?;
    }
    Ok(out)
}

/// Documents of a collection being migrated to bring to the stored form
/// before a command runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Converting {
    pub db: String,
    pub coll: String,
    /// Matches them in either form.
    pub filter: Document,
}

impl Mapper<'_> {
    fn partial_update_filters(
        &self,
        slots: &[Slot],
        body: &Document,
        out: &mut Vec<Document>,
    ) -> Result<(), ProxyError> {
        for slot in slots {
            match *slot {
                Slot::Update { filter, update, .. } if is_partial(body.get(update)) => {
                    let f = body.get_document(filter).cloned().unwrap_or_default();
                    out.push(self.checked_filter(&f, &[])?);
                }
                Slot::Each(k, inner) => {
                    for d in body.get_array(k).into_iter().flatten() {
                        if let Bson::Document(d) = d {
                            self.partial_update_filters(inner, d, out)?;
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(())
    }
}

/// Whether a pipeline ends by storing its output ($out, $merge).
fn writes_output(body: &Document) -> bool {
    body.get_array("pipeline").is_ok_and(|p| {
        p.iter().any(|s| {
            s.as_document()
                .and_then(|s| s.keys().next())
                .is_some_and(|k| k == "$out" || k == "$merge")
        })
    })
}

/// Tokenizes a bulkWrite in place: each op under its namespace's policy,
/// with the dictionary `lookup` gives for its database (the ops of a
/// database it gives none for are left as they are). A bulkWrite may span
/// databases of different dictionaries.
pub fn bulk_write<'a>(
    cmd: &mut Command,
    policies: &'a Policies,
    lookup: &dyn Fn(&str) -> Option<Lookup<'a>>,
) -> Result<(), ProxyError> {
    bulk_ops(&mut cmd.body, policies, lookup)
}

fn bulk_ops<'a>(
    body: &mut Document,
    policies: &'a Policies,
    lookup: &dyn Fn(&str) -> Option<Lookup<'a>>,
) -> Result<(), ProxyError> {
    let namespaces = namespaces_of(body);
    let Ok(ops) = body.get_array_mut("ops") else {
        return Ok(());
    };
    for op in ops.iter_mut() {
        let Bson::Document(op) = op else { continue };
        let Some((db, coll)) = op_namespace(op, &namespaces).and_then(|ns| ns.split_once('.'))
        else {
            continue;
        };
        let Some(names) = lookup(db) else { continue };
        let kind = op.keys().next().cloned().unwrap_or_default();
        Mapper::new(policies, db, coll, names).slots(catalogue::bulk_op_slots(&kind), op)?;
    }
    Ok(())
}

/// The database of each op of a bulkWrite, by op index.
pub fn bulk_op_databases(body: &bson::RawDocument, ns_info: &[String]) -> Vec<Option<String>> {
    body.get_array("ops")
        .into_iter()
        .flatten()
        .flatten()
        .map(|op| {
            let i = op.as_document()?.into_iter().next()?.ok()?.1;
            let i = i.as_i32().map(i64::from).or_else(|| i.as_i64())?;
            let ns = ns_info.get(usize::try_from(i).ok()?)?;
            ns.split_once('.').map(|(db, _)| db.to_owned())
        })
        .collect()
}

/// The namespace of each `nsInfo` entry of a bulkWrite, by index.
pub fn bulk_write_namespaces(cmd: &Command) -> Vec<String> {
    namespaces_of(&cmd.body)
}

fn namespaces_of(body: &Document) -> Vec<String> {
    body.get_array("nsInfo")
        .map(|a| {
            a.iter()
                .map(|ns| {
                    ns.as_document()
                        .and_then(|d| d.get_str("ns").ok())
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The namespace a bulkWrite op (`{insert|update|delete: <nsInfo index>, …}`)
/// addresses.
fn op_namespace<'a>(op: &Document, namespaces: &'a [String]) -> Option<&'a str> {
    op.values()
        .next()
        .and_then(|v| v.as_i32().map(i64::from).or(v.as_i64()))
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| namespaces.get(i))
        .map(String::as_str)
}

#[cfg(test)]
mod tests;
