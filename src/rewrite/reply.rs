//! ⑦ A reply: tokens expanded (raw bytes to raw bytes), shard-key values
//! restored, and a cursor batch that expansion made too large cut, the
//! rest held for the cursor's next `getMore`.

use super::{
    cursor, expand, hello, shard_key, CursorFact, CursorKind, Expansion, LegState, ReplyPlan,
    ReplyRules, Settings,
};
use crate::budget::{Budget, Share};
use crate::error::ProxyError;
use crate::rewrite::walker::{self, Fields};
use crate::token::{Dictionary, Integrity, Policies, Tokens};
use crate::wire::{Frame, Message, MsgBody};

/// A rewritten reply, the cursor documents it could not carry, and what it
/// said of its cursor.
#[derive(Debug)]
pub struct Replied {
    pub frame: Frame,
    /// Held back for the cursor's next `getMore`, under the id the driver
    /// now knows the cursor by.
    pub held: Option<(i64, cursor::Held)>,
    pub cursor: CursorFact,
    /// A cursor the reply opened that the driver knows by a proxy id from
    /// now on: `(proxy id, upstream id)`.
    pub alias: Option<(i64, i64)>,
    /// What the expansion took from the budget for replies beyond the
    /// reply's own share.
    pub share: Option<Share>,
}

impl From<Frame> for Replied {
    fn from(frame: Frame) -> Replied {
        Replied {
            frame,
            held: None,
            cursor: CursorFact::default(),
            alias: None,
            share: None,
        }
    }
}

/// The memory a reply's expansion may write its documents in. Names can
/// make a reply many times its stored size (a name of 10 KB is stored in
/// two bytes), so the room is not assumed: up to `free` bytes are covered
/// by what the reply already holds; every byte past that is taken from
/// the budget for replies (`proxy.max_reply_bytes`) before it is written,
/// and never more than `most`, what the proxy could send in one reply and
/// hold for the cursor's next `getMore`. A reply that needs more is
/// refused before the memory is spent.
#[derive(Debug)]
pub struct Room {
    budget: Budget,
    free: usize,
    most: usize,
    taken: Option<Share>,
    taken_bytes: usize,
    /// Bytes already written by earlier documents (a batch expanded one
    /// document at a time).
    spent: usize,
    /// Why the last grant fell short: `Some(true)` the limit, `Some(false)`
    /// the budget.
    short: Option<bool>,
    /// The limit is the message's: the reply is no cursor batch.
    whole: bool,
}

/// Output an expansion writes without asking, per stored byte of the reply
/// (half of what [`crate::upstream`] takes for it), and at least.
const FREE_PER_BYTE: usize = 4;
const FREE_AT_LEAST: usize = 1 << 20;

impl Room {
    /// Room for the expansion of a reply of `stored` bytes, taken from
    /// `budget` past what it covers, and at most `most` bytes.
    pub fn new(budget: Budget, stored: usize, most: usize) -> Room {
        Room {
            budget,
            free: (stored * FREE_PER_BYTE).max(FREE_AT_LEAST),
            most,
            taken: None,
            taken_bytes: 0,
            spent: 0,
            short: None,
            whole: false,
        }
    }

    /// No more than `most` bytes, for a reply that is sent whole.
    fn at_most(&mut self, most: usize) {
        if most < self.most {
            self.most = most;
            self.whole = true;
        }
    }

    /// How many of the `wanted` bytes the expansion may have.
    fn grant(&mut self, wanted: usize) -> usize {
        let have = (self.free.saturating_add(self.taken_bytes)).saturating_sub(self.spent);
        let want = wanted.min(self.most.saturating_sub(self.spent));
        if want <= have {
            if want < wanted {
                self.short = Some(true);
            }
            return want;
        }
        match self.budget.try_share(want - have) {
            Some(share) => {
                match &mut self.taken {
                    Some(taken) => taken.merge(share),
                    None => self.taken = Some(share),
                }
                self.taken_bytes += want - have;
                if want < wanted {
                    self.short = Some(true);
                }
                want
            }
            None => {
                self.short = Some(false);
                have
            }
        }
    }

    /// Why the expansion of a reply was refused.
    fn refusal(&self) -> ProxyError {
        if self.whole && self.short == Some(true) {
            return ProxyError::ReplyTooLarge(self.most, true);
        }
        ProxyError::MemoryLimit(match self.short {
            Some(false) => format!(
                "the names of this reply's documents need more memory than the proxy's budget for replies has free now (proxy.max_reply_bytes; {} MiB in use): try again, or ask for smaller batches (batchSize)",
                self.budget.held() >> 20
            ),
            _ => format!(
                "the documents of this reply would be more than {} MiB with their names, more than the proxy can send in one reply and hold for the cursor's next getMore (proxy.max_held_bytes): ask for smaller batches (batchSize)",
                self.most >> 20
            ),
        })
    }
}

/// Rewrites one decompressed reply according to its request's plan, its
/// expansion within `room`.
pub fn reply(
    frame: Frame,
    plan: &ReplyPlan,
    legs: &mut LegState,
    settings: &Settings,
    room: Room,
) -> Result<Replied, ProxyError> {
    match plan {
        ReplyPlan::Forward => Ok(frame.into()),
        ReplyPlan::Hello(h) => hello::reply(frame, h, legs).map(Replied::from),
        ReplyPlan::Rewrite(rules) => by_rules(frame, rules, settings, room),
    }
}

/// Rewrites one decompressed reply to a rewritten command, its expansion
/// within `room`.
pub fn by_rules(
    frame: Frame,
    rules: &ReplyRules,
    settings: &Settings,
    mut room: Room,
) -> Result<Replied, ProxyError> {
    let mut fact = CursorFact::default();
    let Message::Msg(m) = frame.message() else {
        return Ok(frame.into());
    };
    let stored = m.body();
    let kind = &*kind_of(stored, rules)?;
    // The cursor the reply opens or continues, and its id, read once.
    let cursor = stored.doc_field("cursor");
    let cursor_id = cursor.and_then(|c| c.field("id")?.i64());
    // Tokens first, raw bytes to raw bytes, so that shard-key rules
    // see logical names.
    if kind.strings != expand::Strings::Data {
        fact = cursor_fact(cursor_id, kind, rules.get_more);
    }
    // A reply that is no cursor batch cannot be cut and held: it is sent
    // whole, or refused past the message limit.
    if cursor.is_none() {
        room.at_most(crate::wire::MAX_MESSAGE_SIZE);
    }
    let mut body = match (&kind.expand, &settings.tokens) {
        (Some(e), Some(t)) => expand_tokens(stored, e, kind.strings, t, &mut room)?,
        _ => None,
    };
    let current = body.as_ref().map_or(stored, MsgBody::document);
    let restore = rules.shard.restore && shard_key::may_hold_stored_values(current.as_bytes());
    let hide = rules.shard.hide.as_deref();
    if restore || hide.is_some() {
        let restored = shard_key::reply(restore, hide, current.as_bytes()).map_err(|e| {
            ProxyError::Internal(format!("the upstream's reply cannot be read: {e}"))
        })?;
        if restored.is_some() {
            body = restored;
        }
    }
    // A cursor another proxy would read otherwise (its batches look like
    // documents) is known to the driver by a proxy id: a getMore that
    // reaches another proxy is refused upstream, not misread.
    let alias = match rules.unknown_cursor || rules.get_more.is_some() {
        true => None,
        false => misread_elsewhere(stored, cursor_id, kind),
    };
    let aliases = match alias {
        Some(a) => std::borrow::Cow::Owned(vec![a]),
        None => std::borrow::Cow::Borrowed(rules.aliases.as_slice()),
    };
    // Expansion makes replies larger. A cursor batch is cut to the
    // server's own limit and the rest held back (`cursor`), unless
    // the reply is part of an exhaust stream, which has no getMore
    // to serve the rest from.
    let mut held = None;
    if let (Some(expanded), false) = (&body, m.flags.more_to_come()) {
        let known = aliases.first().map(|&(proxy, _)| proxy);
        let cut = cursor::split(expanded.document(), cursor::MAX_REPLY_BODY, known)?;
        if let Some((cut, id, rest)) = cut {
            body = Some(cut);
            held = Some((id, rest));
        }
    }
    // Cursor ids the driver knows by the proxy's own are given back so.
    if held.is_none() && !aliases.is_empty() {
        let current = body.as_ref().map_or(stored, MsgBody::document);
        let to_proxy: Vec<(i64, i64)> = aliases.iter().map(|&(proxy, up)| (up, proxy)).collect();
        if let Some(renamed) = cursor::rename_ids(current, &to_proxy).map_err(|e| {
            ProxyError::Internal(format!("the upstream's reply cannot be read: {e}"))
        })? {
            body = Some(renamed);
        }
    }
    let Some(body) = body else {
        return Ok(Replied {
            cursor: fact,
            share: room.taken,
            ..frame.into()
        });
    };
    // A driver closes the connection on a message over
    // maxMessageSizeBytes. Never send one.
    let grown = m.encoded_len() - stored.as_bytes().len() + body.document().as_bytes().len();
    if grown > crate::wire::MAX_MESSAGE_SIZE {
        return Err(ProxyError::ReplyTooLarge(grown, false));
    }
    // The usual reply, one body and no checksum, is sent from the
    // buffer the body was written in.
    let frame = if m.sequences().next().is_none() && !m.flags.checksum_present() {
        frame.with_body(m.flags, body)
    } else {
        let mut m = m.clone();
        m.set_body(body.document().to_owned());
        frame.with_message(Message::Msg(m))
    };
    Ok(Replied {
        frame,
        held,
        cursor: fact,
        alias,
        share: room.taken,
    })
}

/// How a reply's batch is read: as the request's rules say, or, for a
/// cursor this proxy did not see opened, as the reply says.
fn kind_of<'r>(
    body: &bson::RawDocument,
    rules: &'r ReplyRules,
) -> Result<std::borrow::Cow<'r, CursorKind>, ProxyError> {
    Ok(match rules.unknown_cursor {
        true => std::borrow::Cow::Owned(cursor::kind_of_unknown(body, &rules.kind)?),
        false => std::borrow::Cow::Borrowed(&rules.kind),
    })
}

/// The database whose dictionary a cluster-wide change stream's event is
/// expanded with: its `ns.db`, if the policies tokenize it.
fn event_database<'e>(event: &'e bson::RawDocument, policies: &Policies) -> Option<&'e str> {
    event
        .doc_field("ns")?
        .str_field("db")
        .filter(|db| policies.applies_to(db))
}

/// The databases a reply is expanded with besides those its command named
/// (which were admitted with the command): each event's, in the batch of
/// a cluster-wide change stream. Their dictionaries must pass the checks a
/// read of each database does before they are used: a member of a group
/// that holds documents without its mark, say, is refused there, and its
/// events must not be read with the group's dictionary either.
pub fn event_databases(
    frame: &Frame,
    plan: &ReplyPlan,
    policies: &Policies,
) -> Result<Vec<String>, ProxyError> {
    let (ReplyPlan::Rewrite(rules), Some(m)) = (plan, frame.op_msg()) else {
        return Ok(Vec::new());
    };
    if kind_of(m.body(), rules)?.expand != Some(Expansion::PerEvent) {
        return Ok(Vec::new());
    }
    let mut dbs: Vec<String> = Vec::new();
    for event in batch(m.body()) {
        let db = event_database(event, policies);
        if let Some(db) = db.filter(|db| !dbs.iter().any(|d| d == db)) {
            dbs.push(db.to_owned());
        }
    }
    Ok(dbs)
}

/// The documents of a cursor reply's batch.
fn batch(body: &bson::RawDocument) -> impl Iterator<Item = &bson::RawDocument> {
    let batch = body.doc_field("cursor").and_then(|c| {
        ["firstBatch", "nextBatch"]
            .into_iter()
            .find_map(|f| c.field(f).filter(|b| b.kind == ARRAY))
    });
    batch
        .into_iter()
        .flat_map(|b| walker::elements(b.value).map_while(Result::ok))
        .filter_map(|item| item.document())
}

/// A change event older than the dictionary it would be read with
/// ([`crate::token::Dictionary::began_after`]) is refused if it holds
/// anything to expand: a stream started before its database was dropped
/// and written again replays events whose tokens the dictionary made since
/// gives to other names. So is one that holds tokens of a database that
/// has no dictionary now (dropped, and not written since). One that holds
/// nothing to expand reads the same under any dictionary.
fn not_older(
    event: &bson::RawDocument,
    names: &Dictionary,
    db: &str,
    t: &Tokens,
) -> Result<(), Integrity> {
    let Ok(at) = event.get_timestamp("clusterTime") else {
        return Ok(());
    };
    let gone = t.store.loaded(db) && !t.store.exists(db);
    if (gone || names.began_after(at))
        && expand::raw::needed_as(event.as_bytes(), expand::Strings::Events)
    {
        return Err(Integrity::Older {
            db: db.to_owned(),
            scope: t.policies.scope_of(db).to_owned(),
            at,
            since: names.since.filter(|_| !gone),
        });
    }
    Ok(())
}

/// The cursor a reply opens (`id`, its cursor's id), with a fresh proxy
/// id for it, if another proxy would read its batches otherwise than
/// `kind` says ([`cursor::kind_of_unknown`]: statistics and index specs,
/// whose path strings it would leave as stored).
fn misread_elsewhere(
    body: &bson::RawDocument,
    id: Option<i64>,
    kind: &CursorKind,
) -> Option<(i64, i64)> {
    kind.expand.as_ref()?;
    let id = id.filter(|&id| id != 0)?;
    let documents = CursorKind {
        strings: expand::Strings::Data,
        expand: kind.expand.clone(),
    };
    match cursor::kind_of_unknown(body, &documents) {
        Ok(elsewhere) if elsewhere != *kind => Some((cursor::proxy_cursor_id(), id)),
        _ => None,
    }
}

/// A reply's tokens expanded (`None`: it holds none).
fn expand_tokens(
    body: &bson::RawDocument,
    expansion: &Expansion,
    strings: expand::Strings,
    t: &Tokens,
    room: &mut Room,
) -> Result<Option<MsgBody>, ProxyError> {
    let dictionary_of = |item: &bson::RawDocument| -> Option<String> {
        match expansion {
            Expansion::One(db) => Some(db.clone()),
            Expansion::PerOp(dbs) => {
                let idx = item.field("idx")?.number()?;
                let idx = (idx >= 0.0 && idx.fract() == 0.0).then_some(idx as usize)?;
                dbs.get(idx).cloned().flatten()
            }
            Expansion::PerEvent => event_database(item, &t.policies).map(str::to_owned),
        }
    };
    match expansion {
        Expansion::One(db) => {
            if !expand::raw::needed_as(body.as_bytes(), strings) {
                return Ok(None);
            }
            let names = t.store.dictionary(db)?;
            if strings == expand::Strings::Events {
                for event in batch(body) {
                    not_older(event, &names, db, t)?;
                }
            }
            let expanded = expand::raw_body_within(body, &*names, strings, &mut |n| room.grant(n));
            expanded.map(Some).map_err(|e| unreadable(e, db, room))
        }
        Expansion::PerOp(_) | Expansion::PerEvent => {
            expand_batch(body, strings, t, &dictionary_of, room)
        }
    }
}

/// Expands each document of a cursor batch with the dictionary
/// `dictionary_of` names for it (a bulkWrite's results, a cluster-wide
/// stream's events); one it names none for stays as it is. Raw bytes to
/// raw bytes, in one pass, into the buffer of the message that will carry
/// the reply: each document's expansion within the reply's room.
fn expand_batch(
    body: &bson::RawDocument,
    strings: expand::Strings,
    t: &Tokens,
    dictionary_of: &dyn Fn(&bson::RawDocument) -> Option<String>,
    room: &mut Room,
) -> Result<Option<MsgBody>, ProxyError> {
    let needed = |raw: &[u8]| strings != expand::Strings::Data || expand::raw::needed(raw);
    if !needed(body.as_bytes()) {
        return Ok(None);
    }
    let cannot_read = |e: walker::Malformed| {
        ProxyError::Internal(format!("the upstream's reply cannot be read: {e}"))
    };
    let mut out = MsgBody::buffer(body.as_bytes().len());
    let mut changed = false;
    let top = walker::begin(&mut out);
    for e in walker::elements(body.as_bytes()) {
        let e = e.map_err(cannot_read)?;
        if e.key != b"cursor" || e.kind != DOCUMENT {
            out.extend_from_slice(e.raw);
            continue;
        }
        walker::header(&mut out, DOCUMENT, e.key);
        let cursor = walker::begin(&mut out);
        for c in walker::elements(e.value) {
            let c = c.map_err(cannot_read)?;
            let batch = matches!(c.key, b"firstBatch" | b"nextBatch") && c.kind == ARRAY;
            if !batch {
                out.extend_from_slice(c.raw);
                continue;
            }
            walker::header(&mut out, ARRAY, c.key);
            let array = walker::begin(&mut out);
            for item in walker::elements(c.value) {
                let item = item.map_err(cannot_read)?;
                let doc = match item.document() {
                    Some(doc) if needed(doc.as_bytes()) => doc,
                    _ => {
                        out.extend_from_slice(item.raw);
                        continue;
                    }
                };
                let Some(db) = dictionary_of(doc) else {
                    out.extend_from_slice(item.raw);
                    continue;
                };
                let names = t.store.dictionary(&db)?;
                if strings == expand::Strings::Events {
                    not_older(doc, &names, &db, t)?;
                }
                let grow = &mut |n| room.grant(n);
                let expanded = expand::raw_document_within(doc, &*names, strings, grow)
                    .map_err(|e| unreadable(e, &db, room))?;
                room.spent += expanded.as_bytes().len();
                walker::header(&mut out, DOCUMENT, item.key);
                out.extend_from_slice(expanded.as_bytes());
                changed = true;
            }
            walker::finish(&mut out, array);
        }
        walker::finish(&mut out, cursor);
    }
    walker::finish(&mut out, top);
    if !changed {
        return Ok(None);
    }
    MsgBody::new(out)
        .map(Some)
        .map_err(|e| ProxyError::Internal(format!("an expanded reply: {e}")))
}

const DOCUMENT: u8 = 0x03;
const ARRAY: u8 = 0x04;

/// What a reply says of its cursor (`id`, its cursor's id): the kind of
/// one that stays open, or the end of the one a `getMore` continued.
fn cursor_fact(id: Option<i64>, kind: &CursorKind, get_more: Option<i64>) -> CursorFact {
    let Some(id) = id else {
        return CursorFact::default();
    };
    match (id, get_more) {
        (0, done) => CursorFact {
            open: None,
            closed: done,
        },
        (id, _) => CursorFact {
            open: Some((id, kind.clone())),
            closed: None,
        },
    }
}

/// A reply that cannot be expanded: tokens the dictionary lacks (read it
/// again, or refuse), names that need more memory than `room` has, or
/// bytes the walker cannot go through.
fn unreadable(e: expand::Unreadable, scope: &str, room: &Room) -> ProxyError {
    match e {
        expand::Unreadable::Room => room.refusal(),
        expand::Unreadable::Unknown(u) => Integrity::UnknownTokens {
            scope: scope.to_owned(),
            count: u.count(),
        }
        .into(),
        expand::Unreadable::Malformed(m) => {
            ProxyError::Internal(format!("the upstream's reply cannot be read: {m}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::Policy;
    use crate::wire::{MsgFlags, OpMsg};
    use bson::{doc, RawDocumentBuf};

    fn reply(body: bson::Document) -> Frame {
        let raw = RawDocumentBuf::from_document(&body).unwrap();
        Frame::new(
            1,
            0,
            Message::Msg(OpMsg::from_body(MsgFlags::default(), &raw)),
        )
    }

    /// A cluster-wide stream's batch names the databases its events are
    /// read with (those the policies tokenize, each once); any other
    /// reply names none. A `getMore` of a cursor this proxy did not see
    /// opened is read as its reply says.
    #[test]
    fn a_cluster_wide_batch_names_its_events_databases() {
        let policies = Policies::new(Policy::new(4, &[], "laconic"));
        let event = |db: &str| doc! {"_id": {"_data": "00"}, "operationType": "insert", "ns": {"db": db, "coll": "c"}, "fullDocument": {"_id": 1}};
        let batch = |field: &str| {
            reply(doc! {"cursor": {
                field: [event("a"), event("admin"), event("b"), event("a")],
                "postBatchResumeToken": {"_data": "00"},
                "id": 7i64, "ns": "admin.$cmd.aggregate",
            }, "ok": 1})
        };
        let rules = |expand, unknown_cursor| {
            ReplyPlan::Rewrite(ReplyRules {
                kind: CursorKind {
                    strings: expand::Strings::Events,
                    expand: Some(expand),
                },
                unknown_cursor,
                ..Default::default()
            })
        };
        let dbs = |f: &Frame, plan: &ReplyPlan| event_databases(f, plan, &policies).unwrap();
        let cluster = rules(Expansion::PerEvent, false);
        assert_eq!(dbs(&batch("firstBatch"), &cluster), ["a", "b"]);
        assert_eq!(dbs(&batch("nextBatch"), &cluster), ["a", "b"]);
        // A database's own stream was admitted with its command.
        let own = rules(Expansion::One("a".into()), false);
        assert!(dbs(&batch("nextBatch"), &own).is_empty());
        // Unknown to this proxy: the reply says it is cluster-wide.
        let unknown = rules(Expansion::One("admin".into()), true);
        assert_eq!(dbs(&batch("nextBatch"), &unknown), ["a", "b"]);
        assert!(dbs(&batch("nextBatch"), &ReplyPlan::Forward).is_empty());
    }

    /// What a reply's own share covers is granted as it is; past that, each
    /// byte is taken from the budget, and kept until the reply is written;
    /// past `most`, or past what the budget has free, no more is granted,
    /// and the refusal says which.
    #[test]
    fn the_room_grows_from_the_budget_up_to_its_limit() {
        const MIB: usize = 1 << 20;
        let budget = Budget::new(8 * MIB);
        let mut room = Room::new(budget.clone(), MIB, 20 * MIB);
        assert_eq!(room.grant(4 * MIB), 4 * MIB);
        assert_eq!(budget.held(), 0, "within the reply's own share");
        assert_eq!(room.grant(10 * MIB), 10 * MIB);
        assert_eq!(budget.held(), 6 * MIB);
        // The budget has 2 MiB left: 14 MiB would need 4 more.
        assert_eq!(room.grant(14 * MIB), 10 * MIB);
        assert!(room.refusal().to_string().contains("max_reply_bytes"));
        assert_eq!(room.refusal().code(), (146, "ExceededMemoryLimit"));
        // What it took is handed on with the reply, and given back with it.
        let taken = room.taken.take().unwrap();
        drop(room);
        assert_eq!(budget.held(), 6 * MIB);
        drop(taken);
        assert_eq!(budget.held(), 0);

        // The limit: no more than `most`, whatever the budget has.
        let mut room = Room::new(Budget::new(1 << 40), MIB, 20 * MIB);
        assert_eq!(room.grant(32 * MIB), 20 * MIB);
        assert!(room.refusal().to_string().contains("max_held_bytes"));
        // A batch expanded a document at a time: what earlier ones wrote
        // counts.
        room.spent = 18 * MIB;
        assert_eq!(room.grant(4 * MIB), 2 * MIB);

        // A reply sent whole: no more than a message may be.
        let mut room = Room::new(Budget::new(1 << 40), MIB, 20 * MIB);
        room.at_most(8 * MIB);
        assert_eq!(room.grant(10 * MIB), 8 * MIB);
        assert_eq!(room.refusal().code(), (10334, "BSONObjectTooLarge"));
        assert!(room
            .refusal()
            .to_string()
            .contains("more than 8388608 bytes"));
    }
}
