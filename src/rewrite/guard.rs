//! The dictionaries' collections are written by Laconic alone: every
//! command a client sends that would write, drop, rename, re-index or
//! `$out`/`$merge` into `__laconic` or `__laconic_mark`, in any database,
//! is refused with `Unauthorized`. Reading them stays allowed.

use bson::{RawBsonRef, RawDocument};

use crate::error::ProxyError;
use crate::rewrite::walker::Fields;
use crate::token::dictionary::COLLECTION;
use crate::token::store::MARK_COLLECTION;
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

/// Refuses a command that would write a dictionary's collections.
pub fn check(m: &OpMsg) -> Result<(), ProxyError> {
    let body = m.body();
    let Some((name, first)) = body.first().and_then(|e| Some((e.name()?, e.str()))) else {
        return Ok(());
    };
    let db = body.str_field("$db").unwrap_or_default();
    if WRITES.contains(&name) {
        if let Some(c) = target(first) {
            return Err(refuse(db, name, c));
        }
        if name == "cloneCollectionAsCapped" {
            if let Some(c) = target(body.str_field("toCollection")) {
                return Err(refuse(db, name, c));
            }
        }
    }
    match name {
        "renameCollection" => {
            for ns in [first, body.str_field("to")].into_iter().flatten() {
                if let Some(c) = internal_ns(ns) {
                    return Err(refuse(db, name, c));
                }
            }
        }
        "aggregate" => {
            if let Some((stage, out_db, coll)) = output(body, db) {
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
                    return Err(refuse(db, name, c));
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
                    return Err(refuse(db, name, c));
                }
            }
        }
        "mapReduce" | "mapreduce" => {
            let out = body.get("out").ok().flatten();
            let coll = match out {
                Some(RawBsonRef::String(c)) => Some(c),
                Some(RawBsonRef::Document(d)) => d
                    .into_iter()
                    .flatten()
                    .find(|(k, _)| matches!(*k, "replace" | "merge" | "reduce"))
                    .and_then(|(_, v)| v.as_str()),
                _ => None,
            };
            if let Some(c) = coll.filter(|c| internal(c)) {
                return Err(refuse(db, name, c));
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
