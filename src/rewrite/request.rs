//! ④ A request: which parts of it change, under which rules, and what its
//! replies will need.

use super::catalogue::{self, Replies, Slot};
use super::mapper::splice::{GiveUp, Owned};
use super::names::{Misses, Noting};
use super::shard_key::ReplyNeeds;
use super::walker::{self, Fields, Malformed};
use super::{
    expand, guard, hello, mapper, Command, CursorKind, CursorKinds, Expansion, LegState, ReplyPlan,
    ReplyRules, Rewritten, Settings,
};
use crate::error::ProxyError;
use crate::token::Migration;
use crate::wire::{Frame, Message, OpMsg};

/// Refuses a request no client may make through the proxy (writing a
/// dictionary's collections, moving stored documents where they are
/// stored otherwise: [`guard`]); checked before anything is allocated.
pub fn admit(frame: &Frame, settings: &Settings) -> Result<(), ProxyError> {
    match (&settings.tokens, frame.message()) {
        (Some(t), Message::Msg(m)) => guard::check(m, &t.policies),
        _ => Ok(()),
    }
}

/// The tokenized databases a request reads or moves stored documents
/// from and into besides its names' own ([`guard::reached`]).
pub fn reached(m: &OpMsg, settings: &Settings) -> guard::Reached {
    match &settings.tokens {
        Some(t) => guard::reached(m, &t.policies),
        None => guard::Reached::default(),
    }
}

/// Rewrites one decompressed request; `dbs` are the tokenized databases its
/// names belong to ([`token_databases`]). A part of it the owned mapper
/// would rewrite holding more than `may_hold` bytes ([`mapper::holds`]) is
/// not parsed: the request is refused with [`ProxyError::WorkBudget`].
pub fn request(
    frame: &Frame,
    settings: &Settings,
    legs: &LegState,
    kinds: CursorKinds<'_>,
    dbs: &[String],
    may_hold: usize,
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
            rewrite_command(m, frame, settings, kinds, dbs, may_hold)
        }
        _ => Ok(Rewritten::unchanged(ReplyPlan::Forward)),
    }
}

/// The tokenized databases whose dictionaries a command's names belong
/// to: its `$db`, or for `bulkWrite` (sent to admin) the databases of its
/// namespaces, each op with its own.
pub fn token_databases(m: &OpMsg, settings: &Settings) -> Vec<String> {
    let Some(t) = settings.tokens.as_ref() else {
        return Vec::new();
    };
    let body = m.body();
    if !is_bulk_write(body) {
        return body
            .str_field("$db")
            .filter(|db| t.policies.applies_to(db))
            .map(str::to_owned)
            .into_iter()
            .collect();
    }
    let mut dbs: Vec<String> = bulk_namespaces(m)
        .into_iter()
        .filter_map(|ns| ns.split_once('.').map(|(db, _)| db.to_owned()))
        .filter(|db| t.policies.applies_to(db))
        .collect();
    dbs.sort();
    dbs.dedup();
    dbs
}

/// The namespaces (`db.coll`) a write command writes.
pub fn written_namespaces(m: &OpMsg) -> Vec<String> {
    let body = m.body();
    if is_bulk_write(body) {
        return bulk_namespaces(m);
    }
    let db = body.str_field("$db").unwrap_or_default();
    vec![format!("{db}.{}", mapper::collection_of_raw(body))]
}

fn is_bulk_write(body: &bson::RawDocument) -> bool {
    body.first().is_some_and(|e| e.key == b"bulkWrite")
}

fn bulk_namespaces(m: &OpMsg) -> Vec<String> {
    super::command::documents(m, "nsInfo")
        .into_iter()
        .filter_map(|d| d.get_str("ns").ok().map(str::to_owned))
        .collect()
}

/// What the rewrite of one command turns on.
struct Shape<'m> {
    name: &'m str,
    /// The collection it addresses (the string value of its first field).
    collection: Option<&'m str>,
    /// Whether shard-key rules apply to it.
    concerns: bool,
    /// Whether it opens a stream over a whole database or the cluster,
    /// which would show the changes of the dictionaries (`__laconic`): the
    /// proxy's own bookkeeping.
    hide: bool,
    /// Whether it opens a change stream: its filters match documents not
    /// written yet, so the names they read are given tokens now.
    streams: bool,
}

fn rewrite_command(
    m: &OpMsg,
    frame: &Frame,
    settings: &Settings,
    kinds: CursorKinds<'_>,
    dbs: &[String],
    may_hold: usize,
) -> Result<Rewritten, ProxyError> {
    let keys = &settings.shard_keys;
    let body = m.body();
    let first = body.first();
    let name = first.and_then(|e| e.name()).unwrap_or_default();
    let collection = first.and_then(|e| e.str());
    let streams = name == "aggregate" && opens_change_stream(body);
    let shape = Shape {
        name,
        collection,
        concerns: !keys.is_empty() && keys.concerns(name, collection, body.str_field("$db")),
        hide: settings.tokens.is_some() && streams && collection.is_none(),
        streams,
    };
    let (kind, scope, unknown_cursor) = reply_kind(m, name, dbs, settings, kinds)?;
    let rules = ReplyRules {
        shard: ReplyNeeds {
            restore: keys.restores(),
            hide: None,
        },
        kind,
        get_more: (name == "getMore")
            .then(|| body.field("getMore")?.i64())
            .flatten(),
        unknown_cursor,
        aliases: Vec::new(),
    };
    // A bulkWrite's ops each with their database's dictionary; any other
    // command with its scope's.
    let dbs: Vec<&str> = match &scope {
        Some(s) => vec![s.as_str()],
        None if name == "bulkWrite" => dbs.iter().map(String::as_str).collect(),
        None => Vec::new(),
    };
    if !shape.concerns && dbs.is_empty() && !shape.hide {
        let plan = if rules == ReplyRules::default() {
            ReplyPlan::Forward
        } else {
            ReplyPlan::Rewrite(rules)
        };
        return Ok(Rewritten::unchanged(plan));
    }
    rewrite_tokens(m, frame, settings, rules, &shape, &dbs, may_hold)
}

/// Tokenizes a command with the dictionaries of `dbs` (and applies
/// shard-key rules).
fn rewrite_tokens(
    m: &OpMsg,
    frame: &Frame,
    settings: &Settings,
    mut rules: ReplyRules,
    shape: &Shape<'_>,
    dbs: &[&str],
    may_hold: usize,
) -> Result<Rewritten, ProxyError> {
    let tokens = settings.tokens.as_ref();
    let misses = std::cell::RefCell::new(Misses::default());
    let one = (dbs.len() == 1 && shape.name != "bulkWrite").then(|| dbs[0]);
    let raw_insert = shape.name == "insert" && !shape.concerns && tokens.is_some() && one.is_some();
    if !raw_insert {
        // Checked before anything parses it: an owned parse recurses.
        if let Err(e) = validate(m) {
            return malformed(e);
        }
    }
    // Raw to raw where a raw rewrite takes the command; else owned.
    let spliced = match (tokens, one) {
        // The hot write path: inserted documents go raw to raw, against one
        // snapshot of the dictionary.
        (Some(t), Some(db)) if raw_insert => {
            let coll = shape.collection.unwrap_or_default();
            if t.policies.migration(db, coll) == Some(Migration::Reverse) {
                // `laconic migrate --reverse` is writing it back to full names.
                return Ok(Rewritten::unchanged(ReplyPlan::Rewrite(rules)));
            }
            let names = Noting {
                inner: t.store.dictionary(db)?,
                db,
                misses: &misses,
                storing: true,
            };
            Some(mapper::raw::insert(m, t.policies.get(db, coll), &names).map_err(GiveUp::from))
        }
        (Some(t), Some(db)) if !shape.concerns && !shape.hide && spliceable(t, db, shape) => {
            let dict = t.store.dictionary(db)?;
            let noting = |storing| Noting {
                inner: dict.clone(),
                db,
                misses: &misses,
                storing,
            };
            let (read, store) = (noting(shape.streams), noting(true));
            let coll = shape.collection.unwrap_or_default();
            let statement = |slots: &[Slot], raw: &[u8], out: &mut Vec<u8>| {
                affordable(
                    || format!("a statement of this {}", shape.name),
                    [raw],
                    may_hold,
                )?;
                let names = mapper::Lookup {
                    read: &read,
                    store: &store,
                };
                mapper::statement(raw, slots, &t.policies, db, coll, names, out)
            };
            let owned = Owned {
                statement: &statement,
                misses: &misses,
            };
            let policy = t.policies.get(db, coll);
            Some(mapper::splice::command(
                m,
                shape.name,
                policy,
                &read,
                &store,
                Some(&owned),
            ))
        }
        (Some(t), None) if shape.name == "bulkWrite" && !shape.concerns && !shape.hide => {
            Some(spliced_bulk_write(m, t, dbs, &misses, may_hold)?)
        }
        _ => None,
    };
    let msg = match spliced {
        Some(Ok(msg)) => msg,
        Some(Err(GiveUp::Malformed(e))) => return malformed(e),
        Some(Err(GiveUp::Refused(e))) => return Err(e),
        Some(Err(GiveUp::Uncommon)) | None => {
            *misses.borrow_mut() = Misses::default();
            whole_affordable(m, || format!("this {}", shape.name), may_hold)?;
            owned(m, settings, &mut rules, shape, dbs, &misses, one)?
        }
    };
    Ok(Rewritten {
        frame: Some(frame.with_message(Message::Msg(msg))),
        plan: ReplyPlan::Rewrite(rules),
        misses: misses.into_inner(),
    })
}

/// A `bulkWrite` spliced raw to raw, each op with its namespace's policy
/// and its database's dictionary (of `dbs`, the tokenized databases its
/// ops address). The splice gives up where the owned mapper is needed:
/// an op of an uncommon shape, or a tokenized collection being migrated
/// or with value paths.
fn spliced_bulk_write(
    m: &OpMsg,
    t: &crate::token::Tokens,
    dbs: &[&str],
    misses: &std::cell::RefCell<Misses>,
    may_hold: usize,
) -> Result<Result<OpMsg, GiveUp>, ProxyError> {
    let noted = noted(t, dbs, misses, false)?;
    // Each namespace's collection and names, if its database is tokenized.
    let namespaces = bulk_namespaces(m);
    let mut known = Vec::with_capacity(namespaces.len());
    for ns in &namespaces {
        let found = ns.split_once('.').and_then(|(db, coll)| {
            let (_, read, store) = noted.iter().find(|(d, _, _)| *d == db)?;
            Some((db, coll, read, store))
        });
        if let Some((db, coll, _, _)) = found {
            if t.policies.migration(db, coll).is_some()
                || !t.policies.get(db, coll).value_paths.is_empty()
            {
                return Ok(Err(GiveUp::Uncommon));
            }
        }
        known.push(found);
    }
    // The owned mapper of each, for its ops of an uncommon shape.
    let statements: Vec<_> = known
        .iter()
        .map(|found| {
            let (db, coll, read, store) = (*found)?;
            Some(move |slots: &[Slot], raw: &[u8], out: &mut Vec<u8>| {
                affordable(|| "an op of this bulkWrite".to_owned(), [raw], may_hold)?;
                let names = mapper::Lookup { read, store };
                mapper::statement(raw, slots, &t.policies, db, coll, names, out)
            })
        })
        .collect();
    let per_ns: Vec<_> = known
        .iter()
        .zip(&statements)
        .map(|(found, statement)| {
            let ((db, coll, read, store), statement) = ((*found)?, statement.as_ref()?);
            Some(mapper::splice::OpNames {
                policy: t.policies.get(db, coll),
                read,
                store,
                owned: Some(Owned { statement, misses }),
            })
        })
        .collect();
    Ok(mapper::splice::bulk_write(m, &per_ns))
}

/// Each database's names through its dictionary, noting misses: those it
/// reads (noted as stored if `streams`: a change stream's filters match
/// documents not written yet) and those it stores.
fn noted<'a>(
    t: &crate::token::Tokens,
    dbs: &[&'a str],
    misses: &'a std::cell::RefCell<Misses>,
    streams: bool,
) -> Result<Vec<(&'a str, Noting<'a>, Noting<'a>)>, ProxyError> {
    dbs.iter()
        .map(|&db| {
            let dict = t.store.dictionary(db)?;
            let noting = |storing| Noting {
                inner: dict.clone(),
                db,
                misses,
                storing,
            };
            Ok((db, noting(streams), noting(true)))
        })
        .collect()
}

/// Refuses the owned rewrite of `parts` if it would hold more than
/// `may_hold` bytes ([`mapper::holds`]): `what` names it in the refusal.
/// Parts too small to hold that much whatever their shape are not walked.
fn affordable<'p, P>(
    what: impl FnOnce() -> String,
    parts: P,
    may_hold: usize,
) -> Result<(), ProxyError>
where
    P: IntoIterator<Item = &'p [u8]> + Clone,
{
    let bytes: usize = parts.clone().into_iter().map(<[u8]>::len).sum();
    if bytes.saturating_mul(mapper::MOST_HELD_PER_BYTE) <= may_hold {
        return Ok(());
    }
    let needs = parts
        .into_iter()
        .map(mapper::holds)
        .fold(0, usize::saturating_add);
    if needs <= may_hold {
        return Ok(());
    }
    Err(ProxyError::WorkBudget {
        what: what(),
        needs,
        allowed: may_hold,
    })
}

/// [`affordable`] for the whole of `m`: its body and its sequences'
/// documents.
pub fn whole_affordable(
    m: &OpMsg,
    what: impl FnOnce() -> String,
    may_hold: usize,
) -> Result<(), ProxyError> {
    let parts: Vec<&[u8]> = std::iter::once(m.body().as_bytes())
        .chain(m.sequences().flat_map(|s| s.documents()))
        .collect();
    affordable(what, parts.iter().copied(), may_hold)
}

/// Whether a command may take the raw splice: one tokenized collection not
/// being migrated (its filters then match both forms).
fn spliceable(t: &crate::token::Tokens, db: &str, shape: &Shape<'_>) -> bool {
    let coll = shape.collection.unwrap_or_default();
    t.policies.migration(db, coll).is_none()
}

/// The owned rewrite: the command parsed into documents, each slot
/// rewritten by the mapper, and serialized again.
fn owned(
    m: &OpMsg,
    settings: &Settings,
    rules: &mut ReplyRules,
    shape: &Shape<'_>,
    dbs: &[&str],
    misses: &std::cell::RefCell<Misses>,
    one: Option<&str>,
) -> Result<OpMsg, ProxyError> {
    let tokens = settings.tokens.as_ref();
    let mut cmd = Command::from_msg(m)?;
    if shape.concerns {
        rules.shard = settings.shard_keys.request(&mut cmd)?;
    }
    if shape.hide {
        hide_dictionaries(&mut cmd);
    }
    if let Some(t) = tokens {
        let noted = noted(t, dbs, misses, shape.streams)?;
        let lookup = |db: &str| {
            noted
                .iter()
                .find(|(d, _, _)| *d == db)
                .map(|(_, read, store)| mapper::Lookup { read, store })
        };
        if shape.name == "bulkWrite" {
            mapper::bulk_write(&mut cmd, &t.policies, &lookup)?;
        } else if let Some((db, l)) = one.and_then(|db| Some((db, lookup(db)?))) {
            mapper::command(&mut cmd, db, &t.policies, l)?;
        }
    }
    cmd.into_msg(m)
}

/// How a command's replies are read, the database whose dictionary its
/// names are rewritten with (none for a `bulkWrite`, whose ops each have
/// their own, or a command of no tokenized database), and whether it is a
/// `getMore` of a cursor the proxy did not see opened.
fn reply_kind(
    m: &OpMsg,
    name: &str,
    dbs: &[String],
    settings: &Settings,
    kinds: CursorKinds<'_>,
) -> Result<(CursorKind, Option<String>, bool), ProxyError> {
    let body = m.body();
    let Some(t) = settings.tokens.as_ref() else {
        return Ok((CursorKind::default(), None, false));
    };
    if name == "getMore" {
        // A cursor is read as its first batch was. One the proxy does not
        // know (opened before a restart, or through another proxy) is read
        // as its reply says: a cursor of the getMore's database's documents
        // unless it says otherwise. Of the untokenized databases, only
        // `admin`'s may hold tokens: a cluster-wide change stream's. A
        // getMore names nothing.
        let known = body.field("getMore").and_then(|e| e.i64()).and_then(kinds);
        let unknown =
            known.is_none() && (!dbs.is_empty() || body.str_field("$db") == Some("admin"));
        let kind = known.unwrap_or_else(|| CursorKind {
            strings: expand::Strings::Data,
            expand: dbs.first().map(|db| Expansion::One(db.clone())),
        });
        return Ok((kind, None, unknown));
    }
    if name == "bulkWrite" {
        let per_op = mapper::bulk_op_databases(body, &bulk_namespaces(m))
            .into_iter()
            .map(|db| db.filter(|db| t.policies.applies_to(db)))
            .collect();
        let kind = CursorKind {
            strings: expand::Strings::Writes,
            expand: (!dbs.is_empty()).then_some(Expansion::PerOp(per_op)),
        };
        return Ok((kind, None, false));
    }
    if let Some(db) = dbs.first() {
        let kind = CursorKind {
            strings: strings_of(name, body),
            expand: Some(Expansion::One(db.clone())),
        };
        return Ok((kind, Some(db.clone()), false));
    }
    if body.str_field("$db") == Some("admin") && name == "aggregate" && opens_change_stream(body) {
        return cluster_stream(body, t).map(|(kind, scope)| (kind, scope, false));
    }
    Ok((CursorKind::default(), None, false))
}

/// Checks a request's body and document sequences before anything parses
/// them.
fn validate(m: &OpMsg) -> Result<(), Malformed> {
    let reserved = crate::token::namespace::VALUE_SUBTYPE;
    walker::validate_without(m.body().as_bytes(), reserved)?;
    for seq in m.sequences() {
        for d in seq.documents() {
            walker::validate_without(d, reserved)?;
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
        Malformed::Reserved => Err(ProxyError::Unsupported(format!(
            "{e} in a tokenized database: a value stored as one would read back as another; store it with another subtype"
        ))),
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
fn strings_of(name: &str, body: &bson::RawDocument) -> expand::Strings {
    use expand::Strings;
    if body.field("explain").and_then(|e| e.bool()) == Some(true) {
        return Strings::Paths;
    }
    match catalogue::lookup(name).map(|e| e.replies) {
        Some(Replies::Paths) => Strings::Paths,
        Some(Replies::Writes) => Strings::Writes,
        Some(Replies::Pipeline) => match first_stage(body).as_deref() {
            Some("$changeStream") => Strings::Events,
            Some("$indexStats" | "$collStats" | "$listSearchIndexes" | "$planCacheStats") => {
                Strings::Paths
            }
            _ => Strings::Data,
        },
        Some(Replies::Cursor | Replies::Data) | None => Strings::Data,
    }
}

/// The name of an aggregate's first stage.
fn first_stage(body: &bson::RawDocument) -> Option<String> {
    body.get_array("pipeline")
        .ok()?
        .into_iter()
        .next()?
        .ok()?
        .as_document()?
        .into_iter()
        .next()?
        .ok()
        .map(|(k, _)| k.to_owned())
}

/// Whether an aggregate's first stage is `$changeStream`.
fn opens_change_stream(body: &bson::RawDocument) -> bool {
    first_stage(body).as_deref() == Some("$changeStream")
}

/// A cluster-wide change stream: its events come from every database, each
/// expanded with its own database's dictionary. Stages after
/// `$changeStream` that name a collection's fields are rewritten with the
/// dictionary every tokenized database shares, and refused where there is
/// none.
fn cluster_stream(
    body: &bson::RawDocument,
    t: &crate::token::Tokens,
) -> Result<(CursorKind, Option<String>), ProxyError> {
    let kind = CursorKind {
        strings: expand::Strings::Events,
        expand: Some(Expansion::PerEvent),
    };
    // With one dictionary and one set of settings everywhere, the stages are
    // rewritten as for any database.
    let shared = t.policies.shared_scope().filter(|_| t.policies.uniform());
    if let Some(shared) = shared {
        return Ok((kind, Some(shared.to_owned())));
    }
    let why = if t.policies.shared_scope().is_some() {
        "the databases have different tokenize settings ([[proxy.tokenize.namespaces]])"
    } else {
        "the databases have different dictionaries (one shared by every database is configured with databases = [\"*\"] in [[proxy.tokenize.dictionaries]])"
    };
    let stages = body.get_array("pipeline").into_iter().flatten().skip(1);
    for stage in stages.flatten().filter_map(|s| s.as_document()) {
        let named = stage.iter().flatten().map(|(k, _)| k).next().unwrap_or("");
        let Ok(text) = bson::Document::try_from(stage).map(|d| d.to_string()) else {
            continue;
        };
        if ["fullDocument", "documentKey", "updateDescription"]
            .iter()
            .any(|f| text.contains(f))
        {
            return Err(ProxyError::Unsupported(format!(
                "a stage naming document fields ({named}) in a cluster-wide change stream cannot be rewritten: {why}; watch the database or the collection instead"
            )));
        }
    }
    Ok((kind, None))
}

/// The bytes of the documents an `insert` carries, in its body or in its
/// `documents` sequence.
pub fn inserted_bytes(m: &OpMsg) -> usize {
    let in_body = m
        .body()
        .field("documents")
        .filter(|a| a.kind == 0x04)
        .map(|a| {
            walker::elements(a.value)
                .map_while(Result::ok)
                .filter(|d| d.kind == 0x03)
                .map(|d| d.value.len())
                .sum()
        })
        .unwrap_or(0);
    let in_sequences: usize = m
        .sequences()
        .filter(|s| s.identifier == "documents")
        .map(|s| s.bytes().len())
        .sum();
    in_body + in_sequences
}
