//! The cursors the proxy knows of, in one table: who opened each one, what
//! its batches hold (documents, index specs, collection options, change
//! events), so its `getMore` replies are read as its first batch was, and
//! the documents held back from batches that expansion made too large,
//! served by its next `getMore`s.
//!
//! A cursor belongs to whoever opened it, as on the server: its `getMore`
//! and `killCursors` are served (or forwarded) only for the same
//! authenticated users, in the same logical session if it was opened in
//! one, and without either only on the same connection. Held documents
//! have a byte budget for the whole proxy.
//!
//! A cursor whose documents were held is known to the driver by a proxy
//! id from then on ([`cursor::split`]). Once they are served, its
//! `getMore`s and `killCursors` go upstream under the upstream's id
//! ([`CursorTable::aliased`]); a proxy without the table's entry (another
//! one, or this one restarted, or the entry dropped when the held
//! documents expired) forwards the proxy id as it came, and the server
//! answers `CursorNotFound` rather than the batch after the held ones.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::RawDocument;
use dashmap::DashMap;
use parking_lot::Mutex;

use crate::error::ProxyError;
use crate::rewrite::cursor::{self, Aliases, Held};
use crate::rewrite::walker::Fields;
use crate::rewrite::{CursorFact, CursorKind};
use crate::wire::MsgBody;

/// Held documents of a cursor nobody asks for go when a server would time
/// the cursor out.
const IDLE: Duration = Duration::from_secs(600);

/// How often the table looks for idle entries, at most.
const SWEEP: Duration = Duration::from_secs(1);

/// Who opened a cursor, or who asks to continue one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// The authenticated users (`user@db`, sorted); `None` without
    /// authentication.
    pub users: Option<Arc<[String]>>,
    /// The logical session's id (`lsid.id`), if the command had one.
    pub lsid: Option<Vec<u8>>,
    /// The downstream connection.
    pub connection: u64,
}

impl Owner {
    /// The `lsid.id` bytes of a command body.
    pub fn lsid_of(body: &RawDocument) -> Option<Vec<u8>> {
        let (_, id) = body.doc_field("lsid")?.field("id")?.binary()?;
        Some(id.to_vec())
    }

    /// Whether `who` may continue (or kill) cursor `id` opened by `self`:
    /// the server's errors for the same request otherwise.
    fn permits(&self, id: i64, command: &str, who: &Owner) -> Result<(), ProxyError> {
        if self.users.is_some() && who.users != self.users {
            return Err(ProxyError::Unauthorized(format!(
                "cursor id {id} was not created by the authenticated user"
            )));
        }
        let hex = |b: &[u8]| b.iter().map(|x| format!("{x:02x}")).collect::<String>();
        match (&self.lsid, &who.lsid) {
            (Some(mine), Some(theirs)) if mine == theirs => Ok(()),
            (Some(mine), Some(theirs)) => Err(ProxyError::OtherSession(format!(
                "Cannot run {command} on cursor {id}, which was created in session {}, in session {}",
                hex(mine),
                hex(theirs)
            ))),
            (Some(mine), None) => Err(ProxyError::OtherSession(format!(
                "Cannot run {command} on cursor {id}, which was created in session {}, without an lsid",
                hex(mine)
            ))),
            (None, _) if self.users.is_none() && who.connection != self.connection => {
                Err(ProxyError::OtherSession(format!(
                    "Cannot run {command} on cursor {id}, which was created on another connection without a session"
                )))
            }
            (None, _) => Ok(()),
        }
    }
}

/// Documents held back for one cursor, with their size and owner.
#[derive(Debug)]
struct Holding {
    since: Instant,
    bytes: usize,
    held: Held,
}

/// The upstream's id of a cursor the driver knows by a proxy id, and when
/// it was last used.
#[derive(Debug)]
struct Alias {
    upstream: i64,
    since: Instant,
    /// The most documents its `getMore`s ask the upstream for: as many as
    /// fitted in the reply when its last batch was cut.
    most: Option<usize>,
}

#[derive(Debug)]
pub struct CursorTable {
    kinds: DashMap<i64, CursorKind>,
    owners: DashMap<i64, Owner>,
    held: DashMap<i64, Holding>,
    /// Proxy ids of cursors whose upstream cursor lives.
    aliases: DashMap<i64, Alias>,
    held_bytes: AtomicUsize,
    max_held_bytes: usize,
    /// When idle entries were last looked for.
    swept: Mutex<Instant>,
}

impl Default for CursorTable {
    fn default() -> Self {
        CursorTable::new(256 << 20)
    }
}

impl CursorTable {
    pub fn new(max_held_bytes: usize) -> CursorTable {
        CursorTable {
            kinds: DashMap::new(),
            owners: DashMap::new(),
            held: DashMap::new(),
            aliases: DashMap::new(),
            held_bytes: AtomicUsize::new(0),
            max_held_bytes,
            swept: Mutex::new(Instant::now()),
        }
    }

    /// How the batches of cursor `id` are read (plain documents if unknown).
    pub fn kind(&self, id: i64) -> Option<CursorKind> {
        self.kinds.get(&id).map(|k| k.clone())
    }

    /// Bytes of documents held back now.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes.load(Ordering::Relaxed)
    }

    /// Cursors known to their drivers by a proxy id now.
    pub fn proxy_ids(&self) -> usize {
        self.aliases.len()
    }

    /// What a reply said of its cursor, opened by `owner`.
    pub fn learn(&self, fact: &CursorFact, owner: &Owner) {
        if let Some((id, kind)) = &fact.open {
            self.kinds.insert(*id, kind.clone());
            self.owners.entry(*id).or_insert_with(|| owner.clone());
        }
        if let Some(id) = fact.closed {
            self.kinds.remove(&id);
            if !self.held.contains_key(&id) {
                self.owners.remove(&id);
            }
        }
    }

    /// Keeps documents held back for a cursor opened by `owner`, within the
    /// proxy's budget, under the proxy id `id` the driver now knows the
    /// cursor by.
    pub fn hold(&self, id: i64, held: Held, owner: &Owner) -> Result<(), ProxyError> {
        self.expire();
        let bytes: usize = held.docs.iter().map(|d| d.as_bytes().len()).sum();
        let before = self.held_bytes.fetch_add(bytes, Ordering::AcqRel);
        if before + bytes > self.max_held_bytes {
            self.held_bytes.fetch_sub(bytes, Ordering::AcqRel);
            return Err(ProxyError::MemoryLimit(format!(
                "the proxy already holds {before} bytes of expanded documents for open cursors (proxy.max_held_bytes = {}), and this batch would hold {bytes} more: ask for smaller batches (batchSize), or finish or close other cursors",
                self.max_held_bytes
            )));
        }
        self.owners.insert(id, owner.clone());
        if held.upstream_id == 0 {
            self.aliases.remove(&id);
        } else {
            let since = Instant::now();
            let (upstream, most) = (held.upstream_id, Some(held.fits));
            self.aliases.insert(
                id,
                Alias {
                    upstream,
                    since,
                    most,
                },
            );
        }
        let holding = Holding {
            since: Instant::now(),
            bytes,
            held,
        };
        if let Some(old) = self.held.insert(id, holding) {
            self.held_bytes.fetch_sub(old.bytes, Ordering::AcqRel);
        }
        Ok(())
    }

    /// Drops held documents nobody asked for within [`IDLE`], and the
    /// proxy ids of their cursors: a `getMore` of one is then sent upstream
    /// as it came, and refused there, never continued past the documents
    /// dropped. Proxy ids unused for as long go too. Looked for once a
    /// second at most, by one thread at a time: each look goes through the
    /// whole table, and a client opening cursors in a loop must not make
    /// every opening cost that.
    fn expire(&self) {
        let now = Instant::now();
        let Some(mut swept) = self.swept.try_lock() else {
            return;
        };
        if now.saturating_duration_since(*swept) >= SWEEP {
            *swept = now;
            self.expire_at(now);
        }
    }

    fn expire_at(&self, now: Instant) {
        let idle = |since: Instant| now.saturating_duration_since(since) >= IDLE;
        let mut freed = 0;
        self.held.retain(|id, h| {
            let keep = !idle(h.since);
            if !keep {
                freed += h.bytes;
                self.owners.remove(id);
                self.aliases.remove(id);
            }
            keep
        });
        self.held_bytes.fetch_sub(freed, Ordering::AcqRel);
        self.aliases.retain(|id, a| {
            let keep = !idle(a.since) || self.held.contains_key(id);
            if !keep {
                self.owners.remove(id);
            }
            keep
        });
    }

    /// Cursor `upstream`, opened by `owner`, is known to the driver by the
    /// proxy id `proxy`.
    pub fn alias(&self, proxy: i64, upstream: i64, owner: &Owner) {
        self.expire();
        self.owners.insert(proxy, owner.clone());
        let since = Instant::now();
        let most = None;
        self.aliases.insert(
            proxy,
            Alias {
                upstream,
                since,
                most,
            },
        );
    }

    /// The cursors a `getMore` or `killCursors` names by proxy ids whose
    /// upstream cursor lives, with their upstream ids: what the request
    /// names upstream, unless the proxy answers it from held documents
    /// ([`CursorTable::answer`], which must come after).
    pub fn aliased(&self, command: &str, body: &RawDocument) -> Aliases {
        if self.aliases.is_empty() {
            return Aliases::new();
        }
        let ids = match command {
            "getMore" => cursor::get_more_target(body).map(|(id, _)| vec![id]),
            "killCursors" => Some(cursor::kill_cursors_targets(body)),
            _ => None,
        };
        let now = Instant::now();
        ids.into_iter()
            .flatten()
            .filter_map(|id| {
                let mut alias = self.aliases.get_mut(&id)?;
                alias.since = now;
                Some((id, alias.upstream))
            })
            .collect()
    }

    /// The most documents a `getMore` of a cursor known by a proxy id asks
    /// the upstream for, if its batches were cut ([`cursor::cap_batch`]).
    pub fn most(&self, body: &RawDocument) -> Option<usize> {
        let (id, _) = cursor::get_more_target(body)?;
        self.aliases.get(&id)?.most
    }

    /// A batch of cursor `id`'s came back under half the reply limit: its
    /// `getMore`s may ask for twice as many documents. The most it asks for
    /// was set by the documents of the batch that was cut, which may have
    /// been a few large ones among small.
    pub fn widen(&self, id: i64) {
        if let Some(mut alias) = self.aliases.get_mut(&id) {
            alias.most = alias.most.map(|n| n.saturating_mul(2));
        }
    }

    /// The upstream cursor behind proxy id `id` is exhausted: the id is
    /// forgotten once no documents are held under it.
    pub fn exhausted(&self, id: i64) {
        if !self.held.contains_key(&id) {
            self.aliases.remove(&id);
            self.owners.remove(&id);
        }
    }

    /// Forgets held documents, proxy ids and owners of `ids`.
    fn release(&self, ids: impl IntoIterator<Item = i64>) {
        for id in ids {
            if let Some((_, h)) = self.held.remove(&id) {
                self.held_bytes.fetch_sub(h.bytes, Ordering::AcqRel);
            }
            self.aliases.remove(&id);
            self.owners.remove(&id);
        }
    }

    /// A connection closed: cursors only it could continue (opened without
    /// authentication or a session) are gone.
    pub fn connection_closed(&self, connection: u64) {
        let orphans: Vec<i64> = self
            .owners
            .iter()
            .filter(|e| {
                let o = e.value();
                o.connection == connection && o.users.is_none() && o.lsid.is_none()
            })
            .map(|e| *e.key())
            .collect();
        for id in &orphans {
            self.kinds.remove(id);
        }
        self.release(orphans);
    }

    /// Sessions ended (`endSessions`): their cursors are gone.
    pub fn sessions_ended(&self, body: &RawDocument) {
        let ended: Vec<Vec<u8>> = body
            .get_array("endSessions")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|s| Some(s.as_document()?.get_binary("id").ok()?.bytes.to_vec()))
            .collect();
        if ended.is_empty() {
            return;
        }
        let gone: Vec<i64> = self
            .owners
            .iter()
            .filter(|e| e.value().lsid.as_ref().is_some_and(|l| ended.contains(l)))
            .map(|e| *e.key())
            .collect();
        for id in &gone {
            self.kinds.remove(id);
        }
        self.release(gone);
    }

    /// Refuses a `getMore` or `killCursors` of a cursor `who` did not open.
    pub fn check(&self, command: &str, body: &RawDocument, who: &Owner) -> Result<(), ProxyError> {
        let ids = match command {
            "getMore" => cursor::get_more_target(body).map(|(id, _)| vec![id]),
            "killCursors" => Some(cursor::kill_cursors_targets(body)),
            _ => None,
        };
        for id in ids.into_iter().flatten() {
            if let Some(owner) = self.owners.get(&id) {
                owner.permits(id, command, who)?;
            }
        }
        Ok(())
    }

    /// At most how large the proxy's answer to this `getMore` would be, if
    /// it answers it from documents it holds: what a reply's share is taken
    /// for before they leave the held count (so that, while the answer
    /// waits for room in the budget for replies, they stay counted).
    pub fn answer_len(&self, command: &str, body: &RawDocument) -> Option<usize> {
        if command != "getMore" || self.held.is_empty() {
            return None;
        }
        let (id, _) = cursor::get_more_target(body)?;
        let held = self.held.get(&id)?.bytes;
        // The documents, and the reply around them (ids, namespace).
        Some(held.min(cursor::MAX_REPLY_BODY) + 1024)
    }

    /// The proxy's own answer to a `getMore` or `killCursors` of documents
    /// held back, if the request is one. A `killCursors` also forgets the
    /// kinds of the cursors it names. Ownership is checked before.
    pub fn answer(&self, command: &str, body: &RawDocument) -> Option<Result<MsgBody, ProxyError>> {
        if command == "killCursors" {
            for id in cursor::kill_cursors_targets(body) {
                self.kinds.remove(&id);
                if let Some(alias) = self.aliases.get(&id) {
                    self.kinds.remove(&alias.upstream);
                    self.owners.remove(&alias.upstream);
                }
            }
        }
        if self.held.is_empty() && self.aliases.is_empty() {
            return None;
        }
        match command {
            "getMore" => {
                let (id, batch_size) = cursor::get_more_target(body)?;
                let mut entry = self.held.get_mut(&id)?;
                let h = entry.value_mut();
                h.since = Instant::now();
                let reply =
                    cursor::get_more_reply(&mut h.held, id, batch_size, cursor::MAX_REPLY_BODY);
                let left: usize = h.held.docs.iter().map(|d| d.as_bytes().len()).sum();
                self.held_bytes.fetch_sub(h.bytes - left, Ordering::AcqRel);
                h.bytes = left;
                let (drained, proxy_only) = (h.held.docs.is_empty(), h.held.upstream_id == 0);
                drop(entry);
                if drained {
                    if let Some((_, h)) = self.held.remove(&id) {
                        self.held_bytes.fetch_sub(h.bytes, Ordering::AcqRel);
                    }
                    if proxy_only {
                        self.owners.remove(&id);
                    }
                }
                Some(reply)
            }
            "killCursors" => {
                let ids = cursor::kill_cursors_targets(body);
                let proxy_only = !ids.is_empty()
                    && ids
                        .iter()
                        .all(|id| self.held.get(id).is_some_and(|h| h.held.upstream_id == 0));
                self.release(ids.iter().copied());
                proxy_only.then(|| Ok(MsgBody::copy_of(&cursor::kill_cursors_reply(&ids))))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use bson::{doc, rawdoc, RawDocumentBuf};

    use super::*;

    fn owner(users: Option<&[&str]>, lsid: Option<u8>, connection: u64) -> Owner {
        Owner {
            users: users.map(|u| u.iter().map(|s| s.to_string()).collect()),
            lsid: lsid.map(|b| vec![b; 16]),
            connection,
        }
    }

    fn held(docs: usize, upstream_id: i64) -> Held {
        Held {
            ns: "db.c".into(),
            docs: (0..docs)
                .map(|i| RawDocumentBuf::from_document(&doc! {"_id": i as i32}).unwrap())
                .collect::<VecDeque<_>>(),
            upstream_id,
            resume: None,
            fits: 3,
        }
    }

    #[test]
    fn cursors_belong_to_their_users_session_or_connection() {
        let app = owner(Some(&["app@admin"]), Some(1), 1);
        assert!(app
            .permits(7, "getMore", &owner(Some(&["app@admin"]), Some(1), 2))
            .is_ok());
        let other_user = app.permits(7, "getMore", &owner(Some(&["eve@admin"]), Some(1), 2));
        assert_eq!(other_user.unwrap_err().code().0, 13);
        let anonymous = app.permits(7, "getMore", &owner(None, Some(1), 1));
        assert_eq!(anonymous.unwrap_err().code().0, 13);
        let other_session = app.permits(7, "getMore", &owner(Some(&["app@admin"]), Some(2), 1));
        assert_eq!(other_session.unwrap_err().code().0, 50738);
        let no_session = app.permits(7, "killCursors", &owner(Some(&["app@admin"]), None, 1));
        assert!(no_session
            .unwrap_err()
            .to_string()
            .contains("without an lsid"));
        // Without authentication or a session: its connection only.
        let bare = owner(None, None, 5);
        assert!(bare.permits(7, "getMore", &owner(None, None, 5)).is_ok());
        assert!(bare.permits(7, "getMore", &owner(None, None, 6)).is_err());
        // Authenticated without a session: any connection of the same users.
        let user = owner(Some(&["app@admin"]), None, 5);
        assert!(user
            .permits(7, "getMore", &owner(Some(&["app@admin"]), None, 6))
            .is_ok());
    }

    #[test]
    fn held_documents_are_owned_budgeted_and_released() {
        let table = CursorTable::new(200);
        let app = owner(None, Some(1), 1);
        table.hold(10, held(5, 0), &app).unwrap();
        let used = table.held_bytes();
        assert!(used > 0 && used <= 200);
        // Past the budget: refused, nothing more held.
        let err = table.hold(11, held(50, 0), &app).unwrap_err();
        assert_eq!(err.code().0, 146);
        assert_eq!(table.held_bytes(), used);
        // Another session may neither read nor kill it.
        let get_more = rawdoc! {"getMore": 10_i64, "collection": "c", "batchSize": 2};
        let eve = owner(None, Some(2), 2);
        assert!(table.check("getMore", &get_more, &eve).is_err());
        assert!(table.check("getMore", &get_more, &app).is_ok());
        // The answer's share is sized while its documents are still held:
        // at most all of them, and the reply around them.
        let bound = table.answer_len("getMore", &get_more).unwrap();
        assert_eq!(bound, used + 1024);
        assert_eq!(table.held_bytes(), used);
        let body = table.answer("getMore", &get_more).unwrap().unwrap();
        assert!(body.document().as_bytes().len() <= bound);
        assert!(table.held_bytes() < used);
        // Nothing to size for a cursor it does not hold, or another command.
        let other = rawdoc! {"getMore": 99_i64, "collection": "c"};
        assert_eq!(table.answer_len("getMore", &other), None);
        assert_eq!(table.answer_len("killCursors", &get_more), None);
        // Its session ends: everything is released.
        table.sessions_ended(&rawdoc! {"endSessions": [{"id": bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![1; 16] }}]});
        assert_eq!(table.held_bytes(), 0);
        assert!(table.check("getMore", &get_more, &eve).is_ok());
    }

    #[test]
    fn a_closed_connection_drops_the_cursors_only_it_could_continue() {
        let table = CursorTable::new(1 << 20);
        table.hold(1, held(3, 0), &owner(None, None, 9)).unwrap();
        table.hold(2, held(3, 0), &owner(None, Some(1), 9)).unwrap();
        table.connection_closed(9);
        let left = table.held_bytes();
        assert!(left > 0);
        assert!(table
            .answer("getMore", &rawdoc! {"getMore": 1_i64, "collection": "c"})
            .is_none());
        assert!(table
            .answer("getMore", &rawdoc! {"getMore": 2_i64, "collection": "c"})
            .is_some());
    }

    /// A cursor held under a proxy id goes upstream under the upstream's
    /// id once its documents are served, until the upstream exhausts it or
    /// it is killed; when its documents expire, so does the id.
    #[test]
    fn a_proxy_id_names_the_upstream_cursor_once_its_documents_are_served() {
        let table = CursorTable::new(1 << 20);
        let app = owner(None, Some(1), 1);
        let get_more = rawdoc! {"getMore": 70_i64, "collection": "c"};
        assert!(table.aliased("getMore", &get_more).is_empty());
        table.hold(70, held(2, 7), &app).unwrap();
        assert_eq!(table.aliased("getMore", &get_more), vec![(70, 7)]);
        // Served from what is held, then upstream.
        assert!(table.answer("getMore", &get_more).is_some());
        assert!(table.answer("getMore", &get_more).is_none());
        assert_eq!(table.aliased("getMore", &get_more), vec![(70, 7)]);
        // Asking the upstream for no more than fitted in the cut reply.
        assert_eq!(table.most(&get_more), Some(3));
        // A batch well within the limit: twice as many.
        table.widen(70);
        assert_eq!(table.most(&get_more), Some(6));
        assert!(table
            .check("getMore", &get_more, &owner(None, Some(2), 2))
            .is_err());
        // The upstream exhausted it.
        table.exhausted(70);
        assert!(table.aliased("getMore", &get_more).is_empty());
        // Killed: forwarded under the upstream's id, and forgotten.
        table.hold(71, held(1, 8), &app).unwrap();
        let kill = rawdoc! {"killCursors": "c", "cursors": [71_i64, 5_i64]};
        assert_eq!(table.aliased("killCursors", &kill), vec![(71, 8)]);
        assert!(table.answer("killCursors", &kill).is_none());
        assert!(table.aliased("killCursors", &kill).is_empty());
        assert_eq!(table.held_bytes(), 0);
        // Its documents expired: the id goes with them.
        // An index cursor's proxy id: nothing was cut, nothing capped.
        table.alias(73, 10, &app);
        assert_eq!(
            table.most(&rawdoc! {"getMore": 73_i64, "collection": "c"}),
            None
        );
        table.hold(72, held(1, 9), &app).unwrap();
        table.expire_at(Instant::now() + IDLE);
        let get_more = rawdoc! {"getMore": 72_i64, "collection": "c"};
        assert!(table.aliased("getMore", &get_more).is_empty());
        assert!(table.answer("getMore", &get_more).is_none());
    }
}
