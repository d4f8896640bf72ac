//! What no client may do through the proxy, checked before anything is
//! allocated:
//!
//! - Write the dictionaries' collections: every command that would write,
//!   drop, rename, re-index or `$out`/`$merge` into `__laconic` or
//!   `__laconic_mark`, in any database, is refused with `Unauthorized`.
//!   Reading them stays allowed.
//! - Move stored documents, as they are, where they would be read
//!   otherwise: a `renameCollection` (across databases too) or a
//!   `cloneCollectionAsCapped` between collections whose documents are not
//!   stored alike (another dictionary, other tokenize settings, one of them
//!   being migrated), an `$out`/`$merge` or `mapReduce` output from a
//!   database nothing tokenizes into one that is tokenized, an `applyOps`
//!   into a tokenized database. Each is refused with error 115, naming it:
//!   the documents would be read back under other names, or found by no
//!   query. (An `$out`/`$merge` from a tokenized database is checked by the
//!   mapper, which knows the pipeline's layout.)

use bson::{RawBsonRef, RawDocument};

use crate::error::ProxyError;
use crate::rewrite::catalogue::{self, Stores};
use crate::rewrite::command;
use crate::rewrite::walker::Fields;
use crate::token::dictionary::COLLECTION;
use crate::token::store::MARK_COLLECTION;
use crate::token::Policies;
use crate::wire::OpMsg;

/// Commands whose first value names the collection they write.
const WRITES: &[&str] = &[
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "drop",
    "create",
    "collMod",
    "createIndexes",
    "dropIndexes",
    "deleteIndexes",
    "convertToCapped",
    "cloneCollectionAsCapped",
    "compact",
    "reIndex",
    "emptycapped",
];

fn target(collection: Option<&str>) -> Option<&str> {
    collection.filter(|c| internal(c))
}

fn internal(coll: &str) -> bool {
    coll == COLLECTION || coll == MARK_COLLECTION
}

/// The collection part of `db.coll`, if it is an internal one.
fn internal_ns(ns: &str) -> Option<&str> {
    ns.split_once('.').map(|(_, c)| c).filter(|c| internal(c))
}

fn refuse(db: &str, command: &str, coll: &str) -> ProxyError {
    ProxyError::Unauthorized(format!(
        "not authorized on {db} to {command} {db}.{coll}: the dictionary's collections are written only by Laconic (reading them stays allowed)"
    ))
}

/// Refuses a command that would write a dictionary's collections, or
/// move stored documents where they are stored otherwise.
pub fn check(m: &OpMsg, policies: &Policies) -> Result<(), ProxyError> {
    internal_writes(m)?;
    for mv in moves(m) {
        if let Some(why) = mv.refused(policies) {
            return Err(ProxyError::Unsupported(format!(
                "{} cannot be rewritten: {why}",
                mv.describe()
            )));
        }
    }
    Ok(())
}

/// The tokenized databases a command reaches besides its `$db`: whose
/// documents it reads or moves as they are (their dictionary must be
/// sound: a member refused for its mark is refused here too), and those it
/// moves documents into (which then hold them: a group's member is marked
/// before they are sent).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Reached {
    pub read: Vec<String>,
    pub into: Vec<String>,
}

impl Reached {
    fn add(list: &mut Vec<String>, db: &str, policies: &Policies) {
        if policies.applies_to(db) && !list.iter().any(|d| d == db) {
            list.push(db.to_owned());
        }
    }
}

/// [`Reached`] for a command admitted by [`check`]: the namespaces a
/// pipeline's `$lookup`, `$graphLookup` and `$unionWith` read from another
/// database (at any depth), the sources and targets of [`Move`]s, and an
/// aggregation's `$out`/`$merge` target.
pub fn reached(m: &OpMsg, policies: &Policies) -> Reached {
    let mut reached = Reached::default();
    for mv in moves(m) {
        if let Source::Namespace(db, _) = mv.from {
            Reached::add(&mut reached.read, db, policies);
        }
        Reached::add(&mut reached.into, mv.into.0, policies);
    }
    if let Some(pipeline) = aggregated(m.body()) {
        pipeline_reads(
            pipeline,
            &mut |db, _| {
                if let Some(db) = db {
                    Reached::add(&mut reached.read, db, policies)
                }
            },
            0,
        );
    }
    reached
}

/// An `aggregate`'s pipeline.
fn aggregated(body: &RawDocument) -> Option<&bson::RawArray> {
    if body.first().and_then(|e| e.name()) != Some("aggregate") {
        return None;
    }
    body.get_array("pipeline").ok()
}

/// The collections a command names, as `(db, coll)`, read once per
/// request ([`named`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Named<'m> {
    /// Those whose stored form its rewrite turns on: its own (for a
    /// command the catalogue rewrites, or an `explain` of one), a
    /// `bulkWrite`'s namespaces, those its pipeline reads (`$lookup`,
    /// `$graphLookup`, `$unionWith`, at any depth) and both sides of every
    /// [`Move`]. A proxy whose settings for one of them are not those
    /// recorded for it refuses the command ([`crate::token::form`]).
    pub all: Vec<(&'m str, &'m str)>,
    /// Those it stores documents or names into: its own, for a command the
    /// catalogue says stores them (`Data` or `Everything`; a `bulkWrite`'s
    /// namespaces), and the target of every [`Move`] (an aggregation's
    /// `$out`/`$merge` among them). Their settings are recorded before it
    /// is sent. The dictionary's own collections and `system.` ones aside.
    pub stored: Vec<(&'m str, &'m str)>,
}

/// [`Named`] for a command: its body read once (its first element, its
/// `$db`, its catalogue entry).
pub fn named(m: &OpMsg) -> Named<'_> {
    let body = m.body();
    let mut named = Named::default();
    let Some((first, name)) = body.first().and_then(|e| Some((e, e.name()?))) else {
        return named;
    };
    let db = body.str_field("$db").unwrap_or_default();
    if let Some(entry) = catalogue::lookup(name) {
        let stores = matches!(entry.stores, Stores::Data | Stores::Everything);
        if !entry.slots.is_empty() || stores {
            let start = named.all.len();
            if entry.name == "bulkWrite" {
                named.all.extend(
                    command::documents(m, "nsInfo")
                        .into_iter()
                        .filter_map(|d| d.get_str("ns").ok()?.split_once('.')),
                );
            } else if let Some(coll) = first.str() {
                named.all.push((db, coll));
            }
            if stores {
                named.stored.extend_from_slice(&named.all[start..]);
            }
        }
        match entry.name {
            "explain" => {
                if let Some(coll) = first
                    .document()
                    .and_then(|inner| inner.first())
                    .and_then(|e| e.str())
                {
                    named.all.push((db, coll));
                }
            }
            "aggregate" => {
                if let Ok(pipeline) = body.get_array("pipeline") {
                    pipeline_reads(
                        pipeline,
                        &mut |d, coll| named.all.push((d.unwrap_or(db), coll)),
                        0,
                    );
                }
            }
            _ => {}
        }
    }
    for mv in moves_of(m, name, first.str()) {
        if let Source::Namespace(d, c) = mv.from {
            named.all.push((d, c));
        }
        named.all.push(mv.into);
        named.stored.push(mv.into);
    }
    named.all.retain(|(_, c)| !c.is_empty());
    named
        .stored
        .retain(|(_, c)| !c.is_empty() && !internal(c) && !c.starts_with("system."));
    named
}

/// Calls `read` with every collection a pipeline's stages read
/// (sub-pipelines and `$facet`s included): its database if the stage
/// names one, and its name (empty if it names none).
fn pipeline_reads<'a>(
    pipeline: &'a bson::RawArray,
    read: &mut dyn FnMut(Option<&'a str>, &'a str),
    depth: usize,
) {
    if depth > crate::rewrite::MAX_DEPTH {
        return;
    }
    for stage in pipeline.into_iter().flatten() {
        let Some((name, arg)) = stage.as_document().and_then(|d| d.into_iter().next()?.ok()) else {
            continue;
        };
        let spec = match (name, arg) {
            // `{$unionWith: "coll"}`.
            ("$unionWith", RawBsonRef::String(coll)) => {
                read(None, coll);
                continue;
            }
            (_, RawBsonRef::Document(spec)) => spec,
            _ => continue,
        };
        let source = match name {
            "$lookup" | "$graphLookup" => spec.get("from").ok().flatten(),
            "$unionWith" => Some(RawBsonRef::Document(spec)),
            "$facet" => {
                for (_, v) in spec.into_iter().flatten() {
                    if let RawBsonRef::Array(sub) = v {
                        pipeline_reads(sub, read, depth + 1);
                    }
                }
                None
            }
            _ => None,
        };
        match source {
            Some(RawBsonRef::String(coll)) => read(None, coll),
            Some(RawBsonRef::Document(ns)) => read(
                ns.get_str("db").ok(),
                ns.get_str("coll").unwrap_or_default(),
            ),
            _ => {}
        }
        if let Ok(sub) = spec.get_array("pipeline") {
            pipeline_reads(sub, read, depth + 1);
        }
    }
}

/// Documents a command puts into a collection as they are.
struct Move<'a> {
    command: &'a str,
    from: Source<'a>,
    /// The database and collection they go into.
    into: (&'a str, &'a str),
}

/// Where the documents of a [`Move`] come from.
enum Source<'a> {
    /// A collection's stored documents.
    Namespace(&'a str, &'a str),
    /// What a pipeline (or `mapReduce`) run on this database makes.
    Made(&'a str),
    /// The command's own (`applyOps`): as the client wrote them.
    Given,
}

impl Move<'_> {
    fn describe(&self) -> String {
        let (db, coll) = self.into;
        match self.from {
            Source::Namespace(d, c) => format!("{} from {d}.{c} to {db}.{coll}", self.command),
            Source::Made(_) | Source::Given => format!("{} into {db}.{coll}", self.command),
        }
    }

    /// Why the documents would not be stored alike where they go.
    fn refused(&self, policies: &Policies) -> Option<&'static str> {
        let (db, coll) = self.into;
        match self.from {
            Source::Namespace(d, c) => {
                if policies.migration(d, c).is_some() || policies.migration(db, coll).is_some() {
                    return Some("a collection being migrated (`laconic migrate`) keeps its documents until the migration is done");
                }
                policies.unlike((d, policies.stored_form(d, c)), db, coll)
            }
            // A pipeline on a tokenized database is the mapper's to check.
            Source::Made(d) if policies.applies_to(d) => None,
            Source::Made(d) => policies.unlike((d, None), db, coll),
            Source::Given => policies.stored_form(db, coll).map(|_| {
                "its documents and names go into a tokenized collection as the client wrote them"
            }),
        }
    }
}

/// Every [`Move`] a command makes.
fn moves(m: &OpMsg) -> Vec<Move<'_>> {
    match m.body().first().and_then(|e| Some((e.name()?, e.str()))) {
        Some((name, first)) => moves_of(m, name, first),
        None => Vec::new(),
    }
}

/// [`moves`] for a command whose name and first value (`first`, if a
/// string) are read already.
fn moves_of<'m>(m: &'m OpMsg, name: &'m str, first: Option<&'m str>) -> Vec<Move<'m>> {
    let body = m.body();
    // Read only by the commands that need it: most commands move nothing.
    let db = || body.str_field("$db").unwrap_or_default();
    match name {
        "renameCollection" => match (
            first.and_then(|n| n.split_once('.')),
            body.str_field("to").and_then(|n| n.split_once('.')),
        ) {
            (Some((d, c)), Some(into)) => vec![Move {
                command: name,
                from: Source::Namespace(d, c),
                into,
            }],
            _ => Vec::new(),
        },
        "cloneCollectionAsCapped" => match (first, body.str_field("toCollection")) {
            (Some(c), Some(to)) => vec![Move {
                command: name,
                from: Source::Namespace(db(), c),
                into: (db(), to),
            }],
            _ => Vec::new(),
        },
        "aggregate" => output(body, db())
            .map(|(stage, d, c)| Move {
                command: stage,
                from: Source::Made(db()),
                into: (d, c),
            })
            .into_iter()
            .collect(),
        "mapReduce" | "mapreduce" => map_reduce_output(body, db())
            .map(|into| Move {
                command: "mapReduce",
                from: Source::Made(db()),
                into,
            })
            .into_iter()
            .collect(),
        "applyOps" => body
            .get_array("applyOps")
            .ok()
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|op| op.as_document()?.get_str("ns").ok()?.split_once('.'))
            .map(|into| Move {
                command: name,
                from: Source::Given,
                into,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// The collection a `mapReduce` writes its output into, if any (not
/// `{inline: 1}`): `(db, coll)`.
fn map_reduce_output<'a>(body: &'a RawDocument, db: &'a str) -> Option<(&'a str, &'a str)> {
    match body.get("out").ok().flatten()? {
        RawBsonRef::String(c) => Some((db, c)),
        RawBsonRef::Document(d) => {
            let coll = d
                .into_iter()
                .flatten()
                .find(|(k, _)| matches!(*k, "replace" | "merge" | "reduce"))
                .and_then(|(_, v)| v.as_str())?;
            Some((d.get_str("db").unwrap_or(db), coll))
        }
        _ => None,
    }
}

/// Refuses a command that would write a dictionary's collections.
fn internal_writes(m: &OpMsg) -> Result<(), ProxyError> {
    let body = m.body();
    let Some((name, first)) = body.first().and_then(|e| Some((e.name()?, e.str()))) else {
        return Ok(());
    };
    // Read only where it is needed: most commands write no internal
    // collection and have no output.
    let db = || body.str_field("$db").unwrap_or_default();
    if WRITES.contains(&name) {
        if let Some(c) = target(first) {
            return Err(refuse(db(), name, c));
        }
        if name == "cloneCollectionAsCapped" {
            if let Some(c) = target(body.str_field("toCollection")) {
                return Err(refuse(db(), name, c));
            }
        }
    }
    match name {
        "renameCollection" => {
            for ns in [first, body.str_field("to")].into_iter().flatten() {
                if let Some(c) = internal_ns(ns) {
                    return Err(refuse(db(), name, c));
                }
            }
        }
        "aggregate" => {
            if let Some((stage, out_db, coll)) = output(body, db()) {
                if internal(coll) {
                    return Err(refuse(out_db, stage, coll));
                }
            }
        }
        "bulkWrite" => {
            let listed = body.get_array("nsInfo").ok().into_iter().flatten();
            let sequenced = m
                .sequences()
                .filter(|s| s.identifier == "nsInfo")
                .flat_map(|s| s.documents())
                .filter_map(|d| RawDocument::from_bytes(d).ok().map(RawBsonRef::Document));
            for entry in listed.flatten().chain(sequenced) {
                let ns = entry.as_document().and_then(|d| d.get_str("ns").ok());
                if let Some(c) = ns.and_then(internal_ns) {
                    return Err(refuse(db(), name, c));
                }
            }
        }
        "applyOps" => {
            for op in body
                .get_array("applyOps")
                .ok()
                .into_iter()
                .flatten()
                .flatten()
            {
                let ns = op.as_document().and_then(|d| d.get_str("ns").ok());
                if let Some(c) = ns.and_then(internal_ns) {
                    return Err(refuse(db(), name, c));
                }
            }
        }
        "mapReduce" | "mapreduce" => {
            if let Some((out_db, c)) = map_reduce_output(body, db()).filter(|(_, c)| internal(c)) {
                return Err(refuse(out_db, name, c));
            }
        }
        _ => {}
    }
    Ok(())
}

/// The `$out` or `$merge` target of a pipeline: (stage, db, collection).
fn output<'a>(body: &'a RawDocument, db: &'a str) -> Option<(&'static str, &'a str, &'a str)> {
    let last = body
        .get_array("pipeline")
        .ok()?
        .into_iter()
        .flatten()
        .last()?;
    let (stage, arg) = last.as_document()?.into_iter().next()?.ok()?;
    let stage = match stage {
        "$out" => "$out",
        "$merge" => "$merge",
        _ => return None,
    };
    let target = match arg {
        RawBsonRef::Document(d) if stage == "$merge" => d.get("into").ok().flatten()?,
        other => other,
    };
    match target {
        RawBsonRef::String(c) => Some((stage, db, c)),
        RawBsonRef::Document(d) => Some((
            stage,
            d.get_str("db").unwrap_or(db),
            d.get_str("coll").ok()?,
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use bson::{doc, Document, RawDocumentBuf};

    use super::*;
    use crate::token::policy::Group;
    use crate::token::{Migration, MigrationState, Policy};
    use crate::wire::{MsgFlags, Section};

    fn msg(body: Document) -> OpMsg {
        let raw = RawDocumentBuf::from_document(&body).unwrap().into_bytes();
        OpMsg {
            flags: MsgFlags::default(),
            sections: vec![Section::Body(raw.into())],
            checksum: None,
        }
    }

    /// Every name of 4 bytes or more tokenized; `a` and `b` share one
    /// dictionary, `s` has its own; `a.plain` is stored as it is.
    fn policies() -> Policies {
        let mut p = Policies::new(Policy::new(4, &[], "laconic"))
            .with_rule("a.plain", Policy::new(0, &[], "laconic"));
        p.groups = vec![Group {
            home: "a".into(),
            databases: vec!["a".into(), "b".into()],
        }];
        p
    }

    fn refusal(body: Document) -> Option<String> {
        match check(&msg(body), &policies()) {
            Ok(()) => None,
            Err(ProxyError::Unsupported(m)) => Some(m),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn every_collection_a_command_names_and_those_it_stores_into() {
        let of = |body: Document| {
            let m = msg(body);
            let list = |v: Vec<(&str, &str)>| -> Vec<String> {
                v.into_iter().map(|(d, c)| format!("{d}.{c}")).collect()
            };
            let named = named(&m);
            (list(named.all), list(named.stored))
        };
        assert_eq!(
            of(doc! {"find": "users", "filter": {}, "$db": "app"}),
            (vec!["app.users".to_owned()], vec![])
        );
        assert_eq!(
            of(doc! {"insert": "users", "documents": [], "$db": "app"}),
            (vec!["app.users".to_owned()], vec!["app.users".to_owned()])
        );
        // Names no field: nothing to rewrite, nothing recorded.
        assert_eq!(of(doc! {"drop": "users", "$db": "app"}), (vec![], vec![]));
        assert_eq!(
            of(doc! {"explain": {"count": "users"}, "$db": "app"}),
            (vec!["app.users".to_owned()], vec![])
        );
        let (reads, into) = of(doc! {
            "aggregate": "users",
            "pipeline": [
                {"$lookup": {"from": "orders", "as": "o", "pipeline": [
                    {"$unionWith": "returns"},
                ]}},
                {"$facet": {"f": [{"$graphLookup": {"from": {"db": "other", "coll": "tree"}}}]}},
                {"$unionWith": {"coll": "archive", "db": "old"}},
                {"$merge": {"into": {"db": "out", "coll": "report"}}},
            ],
            "$db": "app",
        });
        assert_eq!(
            reads,
            [
                "app.users",
                "app.orders",
                "app.returns",
                "other.tree",
                "old.archive",
                "out.report"
            ]
        );
        assert_eq!(into, ["out.report"]);
        let (reads, into) = of(doc! {
            "renameCollection": "app.users", "to": "app.people", "$db": "admin",
        });
        assert_eq!(
            (reads, into),
            (
                vec!["app.users".to_owned(), "app.people".to_owned()],
                vec!["app.people".to_owned()]
            )
        );
        // The dictionary's own collections are never recorded.
        assert_eq!(
            of(doc! {"createIndexes": "__laconic", "indexes": [], "$db": "app"}).1,
            Vec::<String>::new()
        );
    }

    const OTHER: &str = "its database has another dictionary (databases that share one are configured in [[proxy.tokenize.dictionaries]])";
    const SETTINGS: &str = "its collection's tokenize settings differ from the source's";

    #[test]
    fn a_rename_goes_through_only_where_documents_are_stored_alike() {
        let rename = |from: &str, to: &str| {
            refusal(doc! {"renameCollection": from, "to": to, "$db": "admin"})
        };
        assert_eq!(rename("a.c", "a.d"), None);
        assert_eq!(rename("a.c", "b.c"), None, "one group, one dictionary");
        assert_eq!(rename("admin.x", "local.y"), None, "nothing tokenized");
        assert_eq!(
            rename("a.c", "s.c"),
            Some(format!(
                "renameCollection from a.c to s.c cannot be rewritten: {OTHER}"
            ))
        );
        assert_eq!(
            rename("s.c", "admin.c"),
            Some(format!(
                "renameCollection from s.c to admin.c cannot be rewritten: {OTHER}"
            ))
        );
        assert_eq!(
            rename("a.c", "a.plain"),
            Some(format!(
                "renameCollection from a.c to a.plain cannot be rewritten: {SETTINGS}"
            ))
        );
        assert_eq!(
            rename("b.plain", "a.plain"),
            Some(format!(
                "renameCollection from b.plain to a.plain cannot be rewritten: {SETTINGS}"
            ))
        );
        assert_eq!(
            refusal(
                doc! {"cloneCollectionAsCapped": "c", "toCollection": "plain", "size": 1, "$db": "a"}
            ),
            Some(format!(
                "cloneCollectionAsCapped from a.c to a.plain cannot be rewritten: {SETTINGS}"
            ))
        );
    }

    #[test]
    fn a_collection_being_migrated_is_not_renamed() {
        let p = policies();
        p.migrating.set_db(
            "a",
            [(
                "c".to_owned(),
                MigrationState::Migrating(Migration::Forward),
            )],
        );
        for (from, to) in [("a.c", "a.d"), ("a.d", "a.c")] {
            let e = check(
                &msg(doc! {"renameCollection": from, "to": to, "$db": "admin"}),
                &p,
            );
            assert!(
                matches!(&e, Err(ProxyError::Unsupported(m)) if m.contains("being migrated")),
                "{e:?}"
            );
        }
    }

    #[test]
    fn output_made_where_nothing_is_tokenized_goes_only_where_nothing_is() {
        let out = |db: &str, target: Document| {
            refusal(
                doc! {"aggregate": 1, "pipeline": [{"$documents": [{"longName": 1}]}, {"$out": target}], "cursor": {}, "$db": db},
            )
        };
        assert_eq!(
            out("admin", doc! {"db": "a", "coll": "c"}),
            Some(format!("$out into a.c cannot be rewritten: {OTHER}"))
        );
        assert_eq!(out("admin", doc! {"db": "a", "coll": "plain"}), None);
        assert_eq!(out("admin", doc! {"db": "local", "coll": "c"}), None);
        // From a tokenized database, the mapper checks it.
        assert_eq!(out("a", doc! {"db": "s", "coll": "c"}), None);
        assert_eq!(
            refusal(
                doc! {"aggregate": 1, "pipeline": [{"$merge": {"into": {"db": "b", "coll": "m"}}}], "cursor": {}, "$db": "config"}
            ),
            Some(format!("$merge into b.m cannot be rewritten: {OTHER}"))
        );
        assert_eq!(
            refusal(
                doc! {"mapReduce": "c", "map": "", "reduce": "", "out": {"replace": "r", "db": "s"}, "$db": "local"}
            ),
            Some(format!("mapReduce into s.r cannot be rewritten: {OTHER}"))
        );
        assert_eq!(
            refusal(
                doc! {"mapReduce": "c", "map": "", "reduce": "", "out": {"inline": 1}, "$db": "local"}
            ),
            None
        );
        assert_eq!(
            refusal(doc! {"applyOps": [{"op": "i", "ns": "local.x", "o": {"_id": 1}}, {"op": "i", "ns": "s.c", "o": {"_id": 1, "longName": 1}}], "$db": "admin"}),
            Some("applyOps into s.c cannot be rewritten: its documents and names go into a tokenized collection as the client wrote them".to_owned())
        );
    }

    #[test]
    fn the_databases_reached_are_the_tokenized_ones() {
        let reached = |body| super::reached(&msg(body), &policies());
        let of = |read: &[&str], into: &[&str]| Reached {
            read: read.iter().map(|d| (*d).to_owned()).collect(),
            into: into.iter().map(|d| (*d).to_owned()).collect(),
        };
        assert_eq!(
            reached(doc! {"renameCollection": "a.c", "to": "b.c", "$db": "admin"}),
            of(&["a"], &["b"])
        );
        assert_eq!(
            reached(
                doc! {"aggregate": "c", "pipeline": [{"$out": {"db": "b", "coll": "o"}}], "cursor": {}, "$db": "a"}
            ),
            of(&[], &["b"])
        );
        assert_eq!(
            reached(doc! {"aggregate": "c", "pipeline": [
                {"$lookup": {"from": {"db": "b", "coll": "x"}, "as": "j", "pipeline": [
                    {"$unionWith": {"db": "s", "coll": "y"}},
                    {"$unionWith": {"db": "local", "coll": "y"}},
                ]}},
                {"$facet": {"f": [{"$graphLookup": {"from": {"db": "t", "coll": "z"}}}]}},
                {"$lookup": {"from": "same", "as": "k"}},
            ], "cursor": {}, "$db": "a"}),
            of(&["b", "s", "t"], &[])
        );
        assert_eq!(
            reached(doc! {"renameCollection": "admin.x", "to": "local.y", "$db": "admin"}),
            Reached::default()
        );
        assert_eq!(
            reached(doc! {"insert": "c", "documents": [{"longName": 1}], "$db": "a"}),
            Reached::default()
        );
    }
}
