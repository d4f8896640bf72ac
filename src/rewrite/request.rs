//! ④ A request: which parts of it change, under which rules, and what its
//! replies will need.

use bson::RawBsonRef;

use super::catalogue::{self, Replies};
use super::names::{Misses, Noting};
use super::shard_key::ReplyNeeds;
use super::walker::{self, Malformed};
use super::{
    expand, guard, hello, mapper, Command, CursorKinds, LegState, ReplyPlan, ReplyRules, Rewritten,
    Settings,
};
use crate::error::ProxyError;
use crate::token::Migration;
use crate::wire::{Frame, Message, OpMsg};

/// Refuses a request no client may make through the proxy (writing a
/// dictionary's collections); checked before anything is allocated.
pub fn admit(frame: &Frame, settings: &Settings) -> Result<(), ProxyError> {
    match (&settings.tokens, frame.message()) {
        (Some(_), Message::Msg(m)) => guard::check(m),
        _ => Ok(()),
    }
}

/// Rewrites one decompressed request.
pub fn request(
    frame: &Frame,
    settings: &Settings,
    legs: &LegState,
    kinds: CursorKinds<'_>,
) -> Result<Rewritten, ProxyError> {
    let name = frame.command_name();
    if let Message::Query(q) = frame.message() {
        // Since 5.1 a server answers only the `isMaster` handshake over
        // OP_QUERY; the proxy holds every other OP_QUERY to that rule itself.
        return match name {
            Some(n) if hello::is_hello(n) => hello::request(frame, settings, legs),
            Some(n) => Err(ProxyError::UnsupportedOpQuery(n.to_owned())),
            None => Err(ProxyError::UnsupportedOpQuery(
                q.full_collection_name.clone(),
            )),
        };
    }
    match (name, frame.message()) {
        (Some(n), _) if hello::is_hello(n) => hello::request(frame, settings, legs),
        (Some(_), Message::Msg(m))
            if !settings.shard_keys.is_empty() || settings.tokens.is_some() =>
        {
            rewrite_command(m, frame, settings, kinds)
        }
        _ => Ok(Rewritten::unchanged(ReplyPlan::Forward)),
    }
}

/// The tokenized database whose dictionary a command's names belong to:
/// its `$db`, or for `bulkWrite` (sent to admin) the database of its
/// namespaces. A bulkWrite spanning two tokenized databases is refused.
pub fn token_scope(m: &OpMsg, settings: &Settings) -> Result<Option<String>, ProxyError> {
    let Some(t) = settings.tokens.as_ref() else {
        return Ok(None);
    };
    let body = m.body();
    let is_bulk = body
        .iter()
        .next()
        .is_some_and(|e| e.is_ok_and(|(k, _)| k == "bulkWrite"));
    if !is_bulk {
        return Ok(body
            .get_str("$db")
            .ok()
            .filter(|db| t.policies.applies_to(db))
            .map(str::to_owned));
    }
    let mut dbs: Vec<String> = super::command::documents(m, "nsInfo")
        .into_iter()
        .filter_map(|d| d.get_str("ns").ok())
        .filter_map(|ns| ns.split_once('.').map(|(db, _)| db.to_owned()))
        .filter(|db| t.policies.applies_to(db))
        .collect();
    dbs.sort();
    dbs.dedup();
    match dbs.len() {
        0 | 1 => Ok(dbs.pop()),
        _ => Err(ProxyError::Unsupported(format!(
            "a bulkWrite across the tokenized databases {} cannot be rewritten: send one per database",
            dbs.join(", ")
        ))),
    }
}

fn rewrite_command(
    m: &OpMsg,
    frame: &Frame,
    settings: &Settings,
    kinds: CursorKinds<'_>,
) -> Result<Rewritten, ProxyError> {
    let keys = &settings.shard_keys;
    let body = m.body();
    let (name, collection) = match body.iter().next() {
        Some(Ok((n, RawBsonRef::String(c)))) => (n, Some(c)),
        Some(Ok((n, _))) => (n, None),
        _ => ("", None),
    };
    let db = body.get_str("$db").ok();
    let tokens = settings.tokens.as_ref();
    let scope = token_scope(m, settings)?;
    let scope = scope.as_deref();
    let concerns = !keys.is_empty() && keys.concerns(name, collection, db);
    let mut rules = ReplyRules {
        shard: ReplyNeeds {
            restore: keys.restores(),
            hide: None,
        },
        expand: scope.map(str::to_owned),
        strings: match scope {
            Some(_) => strings_of(name, body, kinds),
            None => expand::Strings::Data,
        },
        get_more: (name == "getMore")
            .then(|| body.get_i64("getMore").ok())
            .flatten(),
    };
    if scope.is_none() && tokens.is_some() && db == Some("admin") {
        rules.strings = cluster_stream(name, body, kinds)?;
    }
    // A stream over a whole database or the cluster would show the changes
    // of the dictionaries (`__laconic`): the proxy's own bookkeeping.
    let hide = tokens.is_some()
        && name == "aggregate"
        && collection.is_none()
        && opens_change_stream(body);
    if !concerns && scope.is_none() && !hide {
        let plan = if rules == ReplyRules::default() {
            ReplyPlan::Forward
        } else {
            ReplyPlan::Rewrite(rules)
        };
        return Ok(Rewritten::unchanged(plan));
    }
    let misses = std::cell::RefCell::new(Misses::default());
    let raw_insert = name == "insert" && !concerns && tokens.is_some() && scope.is_some();
    if !raw_insert {
        // Checked before anything parses it: an owned parse recurses.
        if let Err(e) = validate(m) {
            return malformed(e);
        }
    }
    let msg = match (tokens, scope) {
        // The hot write path: inserted documents go raw to raw, against one
        // snapshot of the dictionary.
        (Some(t), Some(scope)) if name == "insert" && !concerns => {
            let coll = collection.unwrap_or_default();
            if t.policies.migration(scope, coll) == Some(Migration::Reverse) {
                // `laconic migrate --reverse` is writing it back to full names.
                return Ok(Rewritten::unchanged(ReplyPlan::Rewrite(rules)));
            }
            let names = Noting {
                inner: t.store.dictionary(scope)?,
                db: scope,
                misses: &misses,
                storing: true,
            };
            match mapper::raw::insert(m, t.policies.get(scope, coll), &names) {
                Ok(msg) => msg,
                Err(e) => return malformed(e),
            }
        }
        _ => {
            let mut cmd = Command::from_msg(m)?;
            if concerns {
                rules.shard = keys.request(&mut cmd)?;
            }
            if hide {
                hide_dictionaries(&mut cmd);
            }
            if let (Some(t), Some(scope)) = (tokens, scope) {
                let dict = t.store.dictionary(scope)?;
                let noting = |storing| Noting {
                    inner: dict.clone(),
                    db: scope,
                    misses: &misses,
                    storing,
                };
                let (read, store) = (noting(false), noting(true));
                let lookup = mapper::Lookup {
                    read: &read,
                    store: &store,
                };
                mapper::command(&mut cmd, scope, &t.policies, lookup)?;
            }
            cmd.into_msg(m)?
        }
    };
    Ok(Rewritten {
        frame: Some(frame.clone().with_message(Message::Msg(msg))),
        plan: ReplyPlan::Rewrite(rules),
        misses: misses.into_inner(),
    })
}

/// Checks a request's body and document sequences before anything parses
/// them.
fn validate(m: &OpMsg) -> Result<(), Malformed> {
    walker::validate(m.body().as_bytes())?;
    for seq in m.sequences() {
        for d in &seq.documents {
            walker::validate(d)?;
        }
    }
    Ok(())
}

/// What becomes of a request the walker cannot go through: one nested
/// deeper than MongoDB accepts gets the server's own error for it; one that
/// is not valid BSON goes upstream as it is, to be refused there exactly as
/// without the proxy (it cannot be a write the server would take).
fn malformed(e: Malformed) -> Result<Rewritten, ProxyError> {
    match e {
        Malformed::TooDeep => Err(ProxyError::Overflow),
        Malformed::Invalid(_) => Ok(Rewritten::unchanged(ReplyPlan::Forward)),
    }
}

/// Keeps the dictionaries' own changes (`__laconic`, `__laconic_mark`) out
/// of a stream over a whole database or the cluster.
fn hide_dictionaries(cmd: &mut Command) {
    if let Ok(stages) = cmd.body.get_array_mut("pipeline") {
        let at = stages.len().min(1);
        let hidden = [
            crate::token::dictionary::COLLECTION,
            crate::token::store::MARK_COLLECTION,
        ];
        stages.insert(
            at,
            bson::Bson::Document(bson::doc! {"$match": {"ns.coll": {"$nin": hidden.to_vec()}}}),
        );
    }
}

/// How the string values of a command's replies are to be read.
fn strings_of(name: &str, body: &bson::RawDocument, kinds: CursorKinds<'_>) -> expand::Strings {
    use expand::Strings;
    let first_stage = || {
        body.get_array("pipeline")
            .ok()
            .and_then(|p| {
                p.into_iter()
                    .next()?
                    .ok()?
                    .as_document()?
                    .into_iter()
                    .next()?
                    .ok()
            })
            .map(|(k, _)| k.to_owned())
    };
    if body.get_bool("explain").unwrap_or(false) {
        return Strings::Paths;
    }
    match catalogue::lookup(name).map(|e| e.replies) {
        Some(Replies::Paths) => Strings::Paths,
        Some(Replies::Writes) => Strings::Writes,
        Some(Replies::Pipeline) => match first_stage().as_deref() {
            Some("$changeStream") => Strings::Events,
            Some("$indexStats" | "$collStats" | "$listSearchIndexes" | "$planCacheStats") => {
                Strings::Paths
            }
            _ => Strings::Data,
        },
        Some(Replies::Cursor) => body
            .get_i64("getMore")
            .ok()
            .and_then(kinds)
            .unwrap_or_default(),
        Some(Replies::Data) | None => Strings::Data,
    }
}

/// Whether an aggregate's first stage is `$changeStream`.
fn opens_change_stream(body: &bson::RawDocument) -> bool {
    body.get_array("pipeline")
        .ok()
        .and_then(|p| {
            p.into_iter()
                .next()?
                .ok()?
                .as_document()?
                .into_iter()
                .next()?
                .ok()
        })
        .is_some_and(|(k, _)| k == "$changeStream")
}

/// A cluster-wide change stream (or its `getMore`): its events come from
/// every database, each with its own dictionary. User stages after
/// `$changeStream` cannot name a collection's fields there, since no one
/// dictionary applies: refused.
fn cluster_stream(
    name: &str,
    body: &bson::RawDocument,
    kinds: CursorKinds<'_>,
) -> Result<expand::Strings, ProxyError> {
    use expand::Strings;
    if name == "getMore" {
        return Ok(body
            .get_i64("getMore")
            .ok()
            .and_then(kinds)
            .unwrap_or_default());
    }
    if name != "aggregate" {
        return Ok(Strings::Data);
    }
    let Ok(pipeline) = body.get_array("pipeline") else {
        return Ok(Strings::Data);
    };
    let stages: Vec<bson::Document> = pipeline
        .into_iter()
        .filter_map(|s| {
            s.ok()?
                .as_document()
                .and_then(|d| bson::Document::try_from(d).ok())
        })
        .collect();
    if !stages
        .first()
        .is_some_and(|s| s.contains_key("$changeStream"))
    {
        return Ok(Strings::Data);
    }
    for stage in &stages[1..] {
        let text = stage.to_string();
        if ["fullDocument", "documentKey", "updateDescription"]
            .iter()
            .any(|f| text.contains(f))
        {
            return Err(ProxyError::Unsupported(format!(
                "a stage naming document fields ({}) in a cluster-wide change stream cannot be rewritten: each database has its own dictionary; watch the database or the collection instead",
                stage.keys().next().map_or("", String::as_str)
            )));
        }
    }
    Ok(Strings::ClusterEvents)
}

/// The bytes of the documents an `insert` carries, in its body or in its
/// `documents` sequence.
pub fn inserted_bytes(m: &OpMsg) -> usize {
    let in_body = m
        .body()
        .get_array("documents")
        .map(|a| {
            a.into_iter()
                .flatten()
                .filter_map(|d| d.as_document())
                .map(|d| d.as_bytes().len())
                .sum()
        })
        .unwrap_or(0);
    let in_sequences: usize = m
        .sequences()
        .filter(|s| s.identifier == "documents")
        .flat_map(|s| s.documents.iter().map(|d| d.len()))
        .sum();
    in_body + in_sequences
}
