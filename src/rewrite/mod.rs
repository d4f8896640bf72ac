//! ④ rewrite request, ⑦ rewrite reply: pure functions over decoded frames.
//!
//! [`request`] looks at a request and either leaves it as it is (`None`: the
//! original bytes are forwarded) or returns the frame to forward instead,
//! together with a [`ReplyPlan`] saying what the replies to it need. [`reply`]
//! applies that plan to each reply. Neither does any I/O.

pub mod catalogue;
mod command;
pub mod cursor;
pub mod expand;
mod guard;
mod hello;
pub mod mapper;
pub mod names;
pub mod raw;
pub mod shard_key;

use bson::RawBsonRef;

use crate::error::ProxyError;
use crate::token::{Integrity, Migration, Tokens};
use crate::wire::{Compressor, Frame, Message, OpMsg};
use catalogue::Replies;
pub use command::Command;
use names::{Misses, Noting};
use shard_key::{ReplyNeeds, ShardKeys};

pub use hello::{is_hello, MAX_WIRE_VERSION};

/// How deeply documents may nest: MongoDB's own limit for any BSON object
/// (`maxBSONDepth`); anything deeper is refused as the server refuses it.
pub const MAX_DEPTH: usize = 200;

/// What the rewriters need to know about the deployment.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Compressors the proxy offers to drivers, in order of preference.
    pub client_compressors: Vec<Compressor>,
    /// Compressors the proxy offers to the upstream.
    pub upstream_compressors: Vec<Compressor>,
    /// Shard-key rewriting rules.
    pub shard_keys: ShardKeys,
    /// Name tokenization, when on.
    pub tokens: Option<Tokens>,
}

/// How the batches of a cursor the proxy saw opened are read (plain
/// documents when it does not know the cursor).
pub type CursorKinds<'a> = &'a dyn Fn(i64) -> Option<expand::Strings>;

/// What a reply said of its cursor, for the cursor table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CursorFact {
    /// A cursor that stays open, and how its batches are read.
    pub open: Option<(i64, expand::Strings)>,
    /// A cursor the reply closed.
    pub closed: Option<i64>,
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

/// How the replies to a request are to be rewritten.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplyPlan {
    /// Replies go back unchanged.
    Forward,
    /// A `hello`/`isMaster` reply: present the proxy as a mongos and settle
    /// compression on both legs.
    Hello(hello::HelloPlan),
    /// Restore shard-key values, hide derived fields, expand tokens.
    Rewrite(ReplyRules),
}

/// What the replies of a rewritten command need.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplyRules {
    pub shard: ReplyNeeds,
    /// The name-store scope whose tokens are expanded.
    pub expand: Option<String>,
    /// Which string values of the reply are paths.
    pub strings: expand::Strings,
    /// The cursor a `getMore` continues, forgotten once it is exhausted.
    pub get_more: Option<i64>,
}

/// Per-session state that replies settle and later requests use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LegState {
    /// Whether the connection's handshake hello has been answered.
    pub handshaken: bool,
    /// The compressor the upstream accepted, if any.
    pub upstream_compressor: Option<Compressor>,
}

/// The request after rewriting: `None` means "forward the original bytes".
pub struct Rewritten {
    pub frame: Option<Frame>,
    pub plan: ReplyPlan,
    /// What the rewrite asked of the dictionaries and did not find.
    pub misses: Misses,
}

impl Rewritten {
    fn unchanged(plan: ReplyPlan) -> Rewritten {
        Rewritten {
            frame: None,
            plan,
            misses: Misses::default(),
        }
    }
}

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
    let cmd = Command::from_msg(m)?;
    let mut dbs: Vec<String> = mapper::bulk_write_namespaces(&cmd)
        .into_iter()
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
    let hide_store = tokens.is_some()
        && name == "aggregate"
        && collection.is_none()
        && opens_change_stream(body);
    if !concerns && scope.is_none() && !hide_store {
        let plan = if rules == ReplyRules::default() {
            ReplyPlan::Forward
        } else {
            ReplyPlan::Rewrite(rules)
        };
        return Ok(Rewritten::unchanged(plan));
    }
    let misses = std::cell::RefCell::new(Misses::default());
    // The hot write path: inserted documents go raw to raw, against one
    // snapshot of the dictionary.
    if let (false, "insert", Some(t), Some(scope)) = (concerns, name, tokens, scope) {
        let coll = collection.unwrap_or_default();
        if t.policies.migration(scope, coll) == Some(Migration::Reverse) {
            // `laconic migrate --reverse` is writing it back to full names.
            return Ok(Rewritten::unchanged(ReplyPlan::Rewrite(rules)));
        }
        let policy = t.policies.get(scope, coll);
        let names = Noting {
            inner: t.store.dictionary(scope)?,
            db: scope,
            misses: &misses,
            storing: true,
        };
        let msg = raw::insert(m, policy, &names).map_err(|e| {
            ProxyError::Unsupported(format!("an insert that is not valid BSON: {e}"))
        })?;
        return Ok(Rewritten {
            frame: Some(frame.clone().with_message(Message::Msg(msg))),
            plan: ReplyPlan::Rewrite(rules),
            misses: misses.into_inner(),
        });
    }
    let mut cmd = Command::from_msg(m)?;
    if concerns {
        rules.shard = keys.request(&mut cmd)?;
    }
    if hide_store {
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
    if let (Some(t), Some(scope)) = (tokens, scope) {
        let dict = t.store.dictionary(scope)?;
        let noting = |storing| Noting {
            inner: dict.clone(),
            db: scope,
            misses: &misses,
            storing,
        };
        let (read, store) = (noting(false), noting(true));
        mapper::command(
            &mut cmd,
            scope,
            &t.policies,
            mapper::Lookup {
                read: &read,
                store: &store,
            },
        )?;
    }
    let msg = cmd.into_msg(m)?;
    Ok(Rewritten {
        frame: Some(frame.clone().with_message(Message::Msg(msg))),
        plan: ReplyPlan::Rewrite(rules),
        misses: misses.into_inner(),
    })
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

/// Expands each event of a cluster-wide change stream's batch with the
/// dictionary of the database it comes from.
fn expand_cluster_events(
    body: &bson::RawDocument,
    t: &Tokens,
) -> Result<Option<bson::RawDocumentBuf>, ProxyError> {
    let mut doc = command::to_document(body)?;
    let Ok(cursor) = doc.get_document_mut("cursor") else {
        return Ok(None);
    };
    let field = if cursor.contains_key("firstBatch") {
        "firstBatch"
    } else {
        "nextBatch"
    };
    let Ok(batch) = cursor.get_array_mut(field) else {
        return Ok(None);
    };
    let mut changed = false;
    for event in batch.iter_mut() {
        let bson::Bson::Document(e) = event else {
            continue;
        };
        let Some(db) = e
            .get_document("ns")
            .ok()
            .and_then(|ns| ns.get_str("db").ok())
            .filter(|db| t.policies.applies_to(db))
            .map(str::to_owned)
        else {
            continue;
        };
        let raw = command::to_raw(e)?;
        let names = t.store.dictionary(&db)?;
        let expanded =
            expand::raw_document_with(&raw, &*names, expand::Strings::Events).map_err(|u| {
                Integrity::UnknownTokens {
                    scope: db.clone(),
                    count: u.count(),
                }
            })?;
        *e = command::to_document(&expanded)?;
        changed = true;
    }
    if !changed {
        return Ok(None);
    }
    command::to_raw(&doc).map(Some)
}

/// What a reply says of its cursor: the kind of one that stays open, or
/// the end of the one a `getMore` continued.
fn cursor_fact(body: &bson::RawDocument, rules: &ReplyRules) -> CursorFact {
    let Some(id) = body
        .get_document("cursor")
        .ok()
        .and_then(|c| c.get_i64("id").ok())
    else {
        return CursorFact::default();
    };
    match (id, rules.get_more) {
        (0, done) => CursorFact {
            open: None,
            closed: done,
        },
        (id, _) => CursorFact {
            open: Some((id, rules.strings)),
            closed: None,
        },
    }
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

/// A rewritten reply, the cursor documents it could not carry, and what it
/// said of its cursor.
#[derive(Debug)]
pub struct Replied {
    pub frame: Frame,
    /// Held back for the cursor's next `getMore`, under the id the driver
    /// now knows the cursor by.
    pub held: Option<(i64, cursor::Held)>,
    pub cursor: CursorFact,
}

impl From<Frame> for Replied {
    fn from(frame: Frame) -> Replied {
        Replied {
            frame,
            held: None,
            cursor: CursorFact::default(),
        }
    }
}

/// Rewrites one decompressed reply according to its request's plan.
pub fn reply(
    frame: Frame,
    plan: &ReplyPlan,
    legs: &mut LegState,
    settings: &Settings,
) -> Result<Replied, ProxyError> {
    let mut fact = CursorFact::default();
    match plan {
        ReplyPlan::Forward => Ok(frame.into()),
        ReplyPlan::Hello(h) => hello::reply(frame, h, legs).map(Replied::from),
        ReplyPlan::Rewrite(rules) => {
            let Message::Msg(m) = frame.message() else {
                return Ok(frame.into());
            };
            // Tokens first, raw bytes to raw bytes, so that shard-key rules
            // see logical names.
            let mut body: Option<bson::RawDocumentBuf> = None;
            if rules.strings != expand::Strings::Data {
                fact = cursor_fact(m.body(), rules);
            }
            if let (expand::Strings::ClusterEvents, Some(t)) = (rules.strings, &settings.tokens) {
                body = expand_cluster_events(m.body(), t)?;
            }
            if let (Some(scope), Some(t)) = (&rules.expand, &settings.tokens) {
                if rules.strings != expand::Strings::Data || raw::needed(m.body().as_bytes()) {
                    let names = t.store.dictionary(scope)?;
                    let expanded = expand::raw_document_with(m.body(), &*names, rules.strings)
                        .map_err(|u| Integrity::UnknownTokens {
                            scope: scope.clone(),
                            count: u.count(),
                        })?;
                    body = Some(expanded);
                }
            }
            let current = body.as_deref().unwrap_or(m.body());
            let restore =
                rules.shard.restore && shard_key::may_hold_stored_values(current.as_bytes());
            if restore || rules.shard.hide.is_some() {
                let mut doc = command::to_document(current)?;
                if shard_key::reply(&rules.shard, &mut doc) {
                    body = Some(command::to_raw(&doc)?);
                }
            }
            let Some(mut body) = body else {
                return Ok(Replied {
                    cursor: fact,
                    ..frame.into()
                });
            };
            // Expansion makes replies larger. A cursor batch is cut to the
            // server's own limit and the rest held back (`cursor`), unless
            // the reply is part of an exhaust stream, which has no getMore
            // to serve the rest from.
            let mut held = None;
            if !m.flags.more_to_come() {
                if let Some((cut, id, rest)) = cursor::split(&body, cursor::MAX_REPLY_BODY)? {
                    body = cut;
                    held = Some((id, rest));
                }
            }
            // A driver closes the connection on a message over
            // maxMessageSizeBytes. Never send one.
            let grown = m.encoded_len() - m.body().as_bytes().len() + body.as_bytes().len();
            if grown > crate::wire::MAX_MESSAGE_SIZE {
                return Err(ProxyError::ReplyTooLarge(grown));
            }
            let mut m = m.clone();
            m.set_body(body);
            Ok(Replied {
                frame: frame.with_message(Message::Msg(m)),
                held,
                cursor: fact,
            })
        }
    }
}
