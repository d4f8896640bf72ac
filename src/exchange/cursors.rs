//! The cursors the proxy knows of, in one table: what each one's batches
//! hold (documents, index specs, collection options, change events), so its
//! `getMore` replies are read as its first batch was, and the documents held
//! back from batches that expansion made too large, served by its next
//! `getMore`s. Any connection of a driver may continue a cursor, so the
//! table is the proxy's, not a session's.

use std::time::{Duration, Instant};

use bson::{RawDocument, RawDocumentBuf};
use dashmap::DashMap;

use crate::rewrite::cursor::{self, Held};
use crate::rewrite::expand::Strings;
use crate::rewrite::CursorFact;

/// Held documents of a cursor nobody asks for go when a server would time
/// the cursor out.
const IDLE: Duration = Duration::from_secs(600);

#[derive(Debug, Default)]
pub struct CursorTable {
    kinds: DashMap<i64, Strings>,
    held: DashMap<i64, (Instant, Held)>,
}

impl CursorTable {
    /// How the batches of cursor `id` are read (plain documents if unknown).
    pub fn kind(&self, id: i64) -> Option<Strings> {
        self.kinds.get(&id).map(|k| *k)
    }

    /// What a reply said of its cursor.
    pub fn learn(&self, fact: &CursorFact) {
        if let Some((id, kind)) = fact.open {
            self.kinds.insert(id, kind);
        }
        if let Some(id) = fact.closed {
            self.kinds.remove(&id);
        }
    }

    /// Keeps documents held back for a cursor.
    pub fn hold(&self, id: i64, held: Held) {
        self.held.retain(|_, (since, _)| since.elapsed() < IDLE);
        self.held.insert(id, (Instant::now(), held));
    }

    /// The proxy's own answer to a `getMore` or `killCursors` of documents
    /// held back, if the request is one. A `killCursors` also forgets the
    /// kinds of the cursors it names.
    pub fn answer(&self, command: &str, body: &RawDocument) -> Option<RawDocumentBuf> {
        if command == "killCursors" {
            for id in cursor::kill_cursors_targets(body) {
                self.kinds.remove(&id);
            }
        }
        if self.held.is_empty() {
            return None;
        }
        match command {
            "getMore" => {
                let (id, batch_size) = cursor::get_more_target(body)?;
                let mut entry = self.held.get_mut(&id)?;
                let (since, held) = entry.value_mut();
                *since = Instant::now();
                let reply = cursor::get_more_reply(held, id, batch_size, cursor::MAX_REPLY_BODY);
                let drained = held.docs.is_empty();
                drop(entry);
                if drained {
                    self.held.remove(&id);
                }
                Some(reply)
            }
            "killCursors" => {
                let ids = cursor::kill_cursors_targets(body);
                let mut proxy_only = !ids.is_empty();
                for id in &ids {
                    match self.held.remove(id) {
                        Some((_, (_, h))) if h.upstream_id == 0 => {}
                        _ => proxy_only = false,
                    }
                }
                proxy_only.then(|| cursor::kill_cursors_reply(&ids))
            }
            _ => None,
        }
    }
}
