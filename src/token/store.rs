//! The name store (seed 000): each tokenized database keeps its dictionary
//! in its own `__laconic` collection, beside the documents it encodes, so a
//! backup, a restore or a `dropDatabase` of the database takes both along.
//! It grows only by atomic operations, so any number of proxies allocate
//! concurrently, without coordinating, and always agree.
//!
//! - **Names** go into the newest chain document with one `findAndModify`
//!   that `$push`es them with their tokens, guarded so that no other name
//!   lies between each new name's neighbours (`$nor` of `$elemMatch`
//!   ranges) and that the document has room. Two proxies adding names in
//!   different places both succeed; in the same place, one retries with the
//!   other's name as a neighbour. Full documents never change again, so
//!   only the newest needs guarding.
//! - **Values** keep seed 000's numbering: a value's number is its place in
//!   the chain, and a push is guarded by the document's current length.
//! - **Identity.** The head document holds the dictionary's epoch, format
//!   and cap; every proxy uses the store's cap whatever its own setting, and
//!   the epoch is part of every chain document's `_id`.
//! - **Integrity.** Every read is checked ([`super::dictionary::build`]); a
//!   proxy also checks that what it read before is still there. A dictionary
//!   that is lost while documents remain, rewound, or edited by hand puts its
//!   database in a failed state: reads and writes of it are refused with an
//!   error that says why, until a correct dictionary is back (checked every
//!   second). One whose documents went with it (the database was dropped,
//!   the server wiped) is simply forgotten.
//! - **Durability.** The store reads and writes on the primary, reads only
//!   what a majority of the replica set holds, and is answered only once a
//!   majority has journaled its writes ([`concerns`]), whatever the URI
//!   sets for the client. A failover therefore cannot take back a token
//!   that documents already hold: the proxy that allocated it writes them
//!   only after the allocation is acknowledged, and another proxy sees it
//!   only once it can no longer be rolled back. Were it rolled back, a
//!   later allocation could hand the same token to another name, and those
//!   documents (on another shard, say) would read back under it.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use bson::{doc, Document};
use dashmap::DashMap;
use futures::TryStreamExt;
use mongodb::options::{
    Acknowledgment, DatabaseOptions, ReadConcern, ReadPreference, ReturnDocument,
    SelectionCriteria, WriteConcern,
};
use mongodb::{Client, Collection, Database};
use tracing::{error, info, warn};

use super::dictionary::{
    build, chain_id, check, empty_chain_document, head_document, parse_head, Dictionary, Epoch,
    COLLECTION, HEAD_ID, SETTLING, SINCE, SPOILED,
};
use super::form::{self, Form};
use super::namespace::Token;
use super::policy::{Migration, Policies, State as MigrationState};
use super::{Integrity, Names};

/// Name-store failures: the command that needed the store is not forwarded.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The store could not be reached (a network failure).
    #[error("the name store is unreachable: {0}")]
    Unreachable(mongodb::error::Error),
    /// The upstream answered the store's command with an error.
    #[error("the name store's {operation} failed: {message}")]
    Refused {
        operation: &'static str,
        code: i32,
        code_name: String,
        message: String,
    },
    /// The dictionary cannot be trusted.
    #[error(transparent)]
    Integrity(#[from] Integrity),
    /// No short token remains, or the store would not take an append.
    #[error("{0}")]
    Exhausted(String),
    /// A read of the store did not finish within [`VIEW_LEASE`].
    #[error("the name store did not answer its {0} within {VIEW_LEASE:?}")]
    TimedOut(&'static str),
    /// The proxy's view of the store kept changing while a command got
    /// ready, or could not be read again within [`VIEW_LEASE`]: the
    /// command is not sent.
    #[error("the proxy's view of the name store of {0} changed while this command got ready (a migration began or ended), or could not be read again within {VIEW_LEASE:?}: it was not sent; send it again")]
    Stale(String),
}

/// Whether a driver error is a network failure (the upstream could not be
/// reached, or a connection to it failed), not an answer.
pub fn is_network_failure(e: &mongodb::error::Error) -> bool {
    use mongodb::error::ErrorKind;
    matches!(
        *e.kind,
        ErrorKind::Io(_)
            | ErrorKind::ServerSelection { .. }
            | ErrorKind::ConnectionPoolCleared { .. }
            | ErrorKind::DnsResolve { .. }
    )
}

impl StoreError {
    fn from_driver(operation: &'static str, e: mongodb::error::Error) -> StoreError {
        use mongodb::error::{ErrorKind, WriteFailure};
        match *e.kind {
            ErrorKind::Command(ref c) => StoreError::Refused {
                operation,
                code: c.code,
                code_name: c.code_name.clone(),
                message: c.message.clone(),
            },
            ErrorKind::Write(WriteFailure::WriteError(ref w)) => StoreError::Refused {
                operation,
                code: w.code,
                code_name: w.code_name.clone().unwrap_or_default(),
                message: w.message.clone(),
            },
            // No majority within MAJORITY_WAIT, say: the server's own code.
            ErrorKind::Write(WriteFailure::WriteConcernError(ref w)) => StoreError::Refused {
                operation,
                code: w.code,
                code_name: w.code_name.clone(),
                message: w.message.clone(),
            },
            _ if is_network_failure(&e) => StoreError::Unreachable(e),
            _ => StoreError::Refused {
                operation,
                code: 1,
                code_name: "InternalError".into(),
                message: e.to_string(),
            },
        }
    }

    /// Whether the store could not be reached, or answered too late: a
    /// network failure, which the command it held back may be sent again
    /// after.
    pub fn is_network_failure(&self) -> bool {
        matches!(self, StoreError::Unreachable(_) | StoreError::TimedOut(_))
    }

    fn is_duplicate_key(&self) -> bool {
        matches!(self, StoreError::Refused { code: 11000, .. })
    }
}

/// How long a proxy relies on what it last read of a database's store (its
/// dictionary and its migration markers) without reading it again: once
/// this has passed since the last successful read began, the next command
/// for the database reads it first. The watcher reads every store every
/// second, so a request pays for it only when the watcher could not. (Under
/// the full test suite on two cores, reads of a store took up to 3 s.)
///
/// A migration depends on it: `laconic migrate` announces itself, then
/// waits [`MIGRATION_NOTICE`] before it rewrites the first document, so
/// that no proxy still writes the collection in the form it is leaving.
pub const VIEW_LEASE: Duration = Duration::from_secs(10);

/// How long `laconic migrate` waits between announcing itself and
/// rewriting the first document: [`VIEW_LEASE`], plus [`READY_WITHIN`], plus
/// time for a command to reach the upstream once it is sent (a proxy sends
/// a command only as a view read within the lease would rewrite it).
pub const MIGRATION_NOTICE: Duration = Duration::from_secs(15);

/// A command that was ready this soon after its view of the store was found
/// within the lease is sent on that finding; one that took longer (names
/// allocated, documents converted ahead of an update) has it checked again.
pub const READY_WITHIN: Duration = Duration::from_secs(1);

/// How long a dictionary made for a database that had one before (it was
/// dropped, and is written again) is held back, from when a proxy first
/// saw it: as long as a migration's notice, and for the same reason. A
/// proxy that has not yet learned of the drop reads and writes with the
/// dropped dictionary, whose tokens the new one gives to other names; it
/// relies on that view for [`VIEW_LEASE`] at most. So no document is
/// written with the new dictionary until every proxy has read the store
/// since the drop, and the database is then checked to hold no document
/// written meanwhile (with the dropped dictionary, or straight to the
/// server): if one does, the database is refused
/// ([`Integrity::Refilled`]) instead of being read under other names.
pub const REFILL_NOTICE: Duration = MIGRATION_NOTICE;

/// How long a proxy relies on what it read of a database it tokenizes
/// nothing in: whether other proxies tokenize it
/// ([`NameStore::tokenized_elsewhere`]).
pub const ELSEWHERE_EVERY: Duration = Duration::from_secs(1);

/// How many databases a proxy keeps what it read of them by
/// [`NameStore::tokenized_elsewhere`].
const MAX_ELSEWHERE: usize = 10_000;

/// How long a proxy waits, from when it first finds a group's member
/// holding documents and no mark, for the mark to come back before it
/// refuses the member ([`Integrity::Unmarked`]). A proxy that had not yet
/// learned that the member was dropped (through another proxy) writes it
/// with the group's dictionary and no mark; it marks it again at its next
/// read of the member, within a second with the default revalidation.
pub const MARK_NOTICE: Duration = Duration::from_secs(3);

/// The collection of `store_db` that records which databases have had a
/// dictionary.
pub const RECORDS: &str = "dictionaries";

/// When a successful read of the store began, in milliseconds since the
/// process first used this clock (0: never).
#[derive(Debug, Default)]
struct ReadBegan(std::sync::atomic::AtomicU64);

impl ReadBegan {
    fn at(began: Instant) -> ReadBegan {
        ReadBegan(clock_ms(began).into())
    }

    fn set(&self, began: Instant) {
        self.0
            .store(clock_ms(began), std::sync::atomic::Ordering::Release);
    }

    /// The moment, in ms of the process clock (0: never).
    fn ms(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Whether it began less than [`VIEW_LEASE`] ago.
    fn within_lease(&self) -> bool {
        let began = self.0.load(std::sync::atomic::Ordering::Acquire);
        began != 0 && clock_ms(Instant::now()).saturating_sub(began) < VIEW_LEASE.as_millis() as u64
    }
}

fn clock_ms(at: Instant) -> u64 {
    static BASE: LazyLock<Instant> = LazyLock::new(Instant::now);
    at.saturating_duration_since(*BASE).as_millis() as u64 + 1
}

/// What a proxy read of a group member: its mark's verdict (why the
/// member is refused, if it is) and when the read began.
#[derive(Debug)]
struct Member {
    refused: Option<Integrity>,
    read: ReadBegan,
    /// Its mark as last read or raised by this proxy.
    mark: Option<Mark>,
    /// When this proxy last sent a write to it ([`NameStore::wrote`]).
    wrote: ReadBegan,
    /// Since when it has been found holding documents and no mark.
    unmarked_since: Option<Instant>,
}

type Hasher = foldhash::quality::RandomState;

/// Round trips made, for metrics and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTrips(pub usize);

/// What a proxy knows of one database's dictionary.
#[derive(Clone, Debug, Default)]
enum State {
    /// Not read yet.
    #[default]
    Unloaded,
    /// There is none (one is made on the first write that needs a token,
    /// if the database holds no documents then).
    Absent,
    Ready(Arc<Dictionary>),
    /// Not to be trusted: `reference` is the last good dictionary read, which
    /// a dictionary put back must contain.
    Failed {
        error: Integrity,
        reference: Option<Arc<Dictionary>>,
    },
}

impl State {
    fn reference(&self) -> Option<&Arc<Dictionary>> {
        match self {
            State::Ready(d) => Some(d),
            State::Failed { reference, .. } => reference.as_ref(),
            _ => None,
        }
    }

    fn label(&self) -> &'static str {
        match self {
            State::Unloaded => "unloaded",
            State::Absent => "absent",
            State::Ready(_) => "ready",
            State::Failed { error, .. } => error.kind(),
        }
    }
}

#[derive(Debug, Default)]
struct Scope {
    state: parking_lot::RwLock<State>,
    /// One allocation at a time per database in this proxy (proxies still
    /// race each other, through the store's guards).
    alloc: tokio::sync::Mutex<()>,
    /// One reload at a time.
    reload: tokio::sync::Mutex<()>,
    /// Reloads finished: a caller that waited while one ran finds the
    /// state fresh.
    reloads: std::sync::atomic::AtomicU64,
    /// Reasons to read it again before its next use, counted (a
    /// `dropDatabase` went through, the upstream failed, a read failed)...
    suspected: std::sync::atomic::AtomicU64,
    /// ...and how many of them the last settled read began after. Fresh
    /// when the two are equal: a read in flight clears nothing until its
    /// result is in place, so no request takes the state it is replacing
    /// for a fresh one.
    cleared: std::sync::atomic::AtomicU64,
    /// Why the last read failed, until one succeeds (for `/readyz`).
    unreadable: parking_lot::Mutex<Option<String>>,
    /// The dictionary the last read built, and the digest of the bytes it
    /// was built from.
    last_read: parking_lot::Mutex<Option<(Arc<Dictionary>, Digest)>>,
    /// When the last successful read began.
    read: ReadBegan,
    /// The dictionary read is held back until it settles: its identity,
    /// and when this proxy first saw it ([`REFILL_NOTICE`])...
    settling: parking_lot::Mutex<Option<(Epoch, Instant)>>,
    /// ...and whether it is, read without a lock on every command.
    held: std::sync::atomic::AtomicBool,
    /// One check of a settling dictionary at a time (requests held back
    /// share it).
    settle: tokio::sync::Mutex<()>,
    /// Whether this proxy has recorded that the database has a dictionary.
    recorded: std::sync::atomic::AtomicBool,
}

impl Scope {
    fn suspect(&self) {
        self.suspected
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }

    /// Whether every suspicion raised has been answered by a settled read,
    /// and the last one began within [`VIEW_LEASE`].
    fn is_fresh(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.cleared.load(Ordering::Acquire) == self.suspected.load(Ordering::Acquire)
            && self.read.within_lease()
    }
}

/// SHA-256 of the documents a read of the store returned, in their order.
type Digest = [u8; 32];

/// A read of the store, given up as a network timeout when it takes longer
/// than [`VIEW_LEASE`]: a read that hangs must not keep the watcher, and the
/// requests waiting for it, from reading again.
async fn within_lease<T>(
    operation: &'static str,
    read: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(VIEW_LEASE, read)
        .await
        .unwrap_or(Err(StoreError::TimedOut(operation)))
}

fn digest_of(docs: &[bson::RawDocumentBuf]) -> Digest {
    use sha2::Digest as _;
    let mut h = sha2::Sha256::new();
    for d in docs {
        // Each document starts with its length: the concatenation is
        // unambiguous.
        h.update(d.as_bytes());
    }
    h.finalize().into()
}

/// A database's dictionary status, for `/readyz` and `/metrics`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub scope: String,
    /// `ready`, `settling` (made after a drop, held back), `absent`,
    /// `unloaded`, or the kind of failure.
    pub state: &'static str,
    pub names: usize,
    pub values: usize,
    /// Why the database is refused, when it is: its dictionary failed a
    /// check, or the last read of it failed.
    pub error: Option<String>,
}

/// The store and its in-process cache. Clone it freely: clones share both.
#[derive(Clone, Debug)]
pub struct NameStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: Client,
    /// Names per chain document in dictionaries this proxy creates.
    cap: usize,
    /// Looked up several times per command: hashed with foldhash (seeded
    /// per process) rather than SipHash, a fifth of the cost.
    scopes: DashMap<String, Arc<Scope>, Hasher>,
    /// The group members this proxy has met.
    members: DashMap<String, Member, Hasher>,
    /// Databases this proxy tokenizes nothing in, and whether each holds
    /// a dictionary or a group's mark, as read when
    /// ([`NameStore::tokenized_elsewhere`]).
    elsewhere: DashMap<String, (bool, Instant), Hasher>,
    /// Which collections are tokenized (and, shared with them, what the
    /// migration markers of each database say).
    policies: Policies,
    /// Where a format-1 store kept its chains, to name it in errors.
    legacy: Option<Collection<Document>>,
    /// Which databases have had a dictionary (`<store_db>.dictionaries`,
    /// which a `dropDatabase` of theirs leaves): a new one made for such a
    /// database settles before it is used ([`REFILL_NOTICE`]). `None` for
    /// the tools, which make no dictionary a proxy may be holding an
    /// older one of.
    records: Option<Collection<Document>>,
}

static EMPTY: LazyLock<Arc<Dictionary>> =
    LazyLock::new(|| Arc::new(Dictionary::empty(Epoch([0; 16]), 1)));

/// How many times an allocation goes round while other proxies keep
/// changing the store under it (each round means one of them succeeded).
const MAX_ROUNDS: usize = 10_000;

/// How long a write of the store waits for a majority to acknowledge it
/// before it fails (and the command that needed it is refused): a replica
/// set that has lost its majority allocates no new names, and every name
/// it already has keeps working.
pub const MAJORITY_WAIT: Duration = Duration::from_secs(10);

/// `name` as the store reads and writes it, with `client` ([`concerns`]):
/// for every command of a dictionary, its mark or a migration's state.
pub fn database(client: &Client, name: &str) -> Database {
    client.database_with_options(name, concerns())
}

/// How the store reads and writes, whatever the URI asks of the client's
/// other traffic: on the primary, reading majority-committed data, writes
/// acknowledged once a majority has journaled them (on a standalone
/// server, once it has).
pub fn concerns() -> DatabaseOptions {
    DatabaseOptions::builder()
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        .read_concern(ReadConcern::majority())
        .write_concern(
            WriteConcern::builder()
                .w(Acknowledgment::Majority)
                .journal(true)
                .w_timeout(MAJORITY_WAIT)
                .build(),
        )
        .build()
}

/// The outcome of an upsert that several proxies may race to: a duplicate
/// key means another one's landed first, which does as well.
fn raced(
    r: mongodb::error::Result<mongodb::results::UpdateResult>,
    operation: &'static str,
) -> Result<(), StoreError> {
    match r.map_err(|e| StoreError::from_driver(operation, e)) {
        Err(e) if !e.is_duplicate_key() => Err(e),
        _ => Ok(()),
    }
}

/// The later of two cluster times, either unknown.
fn later(a: Option<bson::Timestamp>, b: Option<bson::Timestamp>) -> Option<bson::Timestamp> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if (a.time, a.increment) >= (b.time, b.increment) {
            a
        } else {
            b
        }),
        (a, b) => a.or(b),
    }
}

/// The round trips [`NameStore::init`] makes past the record of the
/// scope: the cluster time, the head written and read back, the mark.
const INIT_TRIPS: usize = 4;

impl NameStore {
    pub fn new(client: Client, cap: usize, policies: Policies) -> NameStore {
        NameStore {
            inner: Arc::new(Inner {
                client,
                cap: cap.max(1),
                scopes: DashMap::default(),
                members: DashMap::default(),
                elsewhere: DashMap::default(),
                policies,
                legacy: None,
                records: None,
            }),
        }
    }

    /// Records in `store_db` which databases have had a dictionary, so that
    /// one dropped and written again gets a dictionary that settles first.
    pub fn with_records(mut self, store_db: &str) -> NameStore {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.records = Some(database(&inner.client, store_db).collection(RECORDS));
        }
        self
    }

    /// Names the collection where a format-1 store kept its chains.
    pub fn with_legacy(mut self, db: &str, coll: &str) -> NameStore {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.legacy = Some(database(&inner.client, db).collection(coll));
        }
        self
    }

    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    fn scope(&self, scope: &str) -> Arc<Scope> {
        if let Some(s) = self.inner.scopes.get(scope) {
            return s.clone();
        }
        self.inner
            .scopes
            .entry(scope.to_owned())
            .or_default()
            .clone()
    }

    /// A database as the store reads and writes it ([`concerns`]).
    fn db(&self, name: &str) -> Database {
        database(&self.inner.client, name)
    }

    fn coll(&self, db: &str) -> Collection<Document> {
        self.db(db).collection(COLLECTION)
    }

    /// The dictionary to rewrite with: the one read, or an empty one where
    /// the database has none (yet). Never a round trip.
    pub fn dictionary(&self, db: &str) -> Result<Arc<Dictionary>, Integrity> {
        let scope = self.inner.policies.scope_of(db);
        if scope != db {
            if let Some(e) = self.inner.members.get(db).and_then(|m| m.refused.clone()) {
                return Err(e);
            }
        }
        match &*self.scope(scope).state.read() {
            State::Ready(d) => Ok(d.clone()),
            State::Failed { error, .. } => Err(error.clone()),
            State::Unloaded | State::Absent => Ok(EMPTY.clone()),
        }
    }

    /// Whether the database's dictionary has been read, and may be used
    /// as read.
    pub fn loaded(&self, db: &str) -> bool {
        let scope = self.inner.policies.scope_of(db);
        self.loaded_in(db, scope, &self.scope(scope))
    }

    /// [`NameStore::loaded`], given `db`'s scope and its cell.
    fn loaded_in(&self, db: &str, scope: &str, cell: &Scope) -> bool {
        cell.is_fresh()
            && !matches!(*cell.state.read(), State::Unloaded)
            && (scope == db
                || self
                    .inner
                    .members
                    .get(db)
                    .is_some_and(|m| m.read.within_lease()))
    }

    /// Marks a database's dictionary to be read again before its next use:
    /// called when a `dropDatabase` went through, which takes the dictionary
    /// along with the documents (the next read finds both gone and starts
    /// afresh instead of writing tokens nothing records).
    pub fn suspect(&self, db: &str) {
        let scope = self.inner.policies.scope_of(db);
        self.inner.members.remove(db);
        self.scope(scope).suspect();
    }

    /// Marks every dictionary to be read again before its next use: called
    /// when the upstream fails, since a server that comes back may be
    /// another (restored, or wiped) one.
    pub fn suspect_all(&self) {
        for e in self.inner.scopes.iter() {
            e.value().suspect();
        }
    }

    /// Whether the database has a dictionary (as last read).
    pub fn exists(&self, db: &str) -> bool {
        let scope = self.inner.policies.scope_of(db);
        matches!(*self.scope(scope).state.read(), State::Ready(_))
    }

    /// Reads the dictionary if this proxy never has (or not within the
    /// lease), and waits for one that is settling ([`REFILL_NOTICE`]).
    pub async fn ensure_loaded(&self, db: &str) -> Result<RoundTrips, StoreError> {
        let scope = self.inner.policies.scope_of(db);
        let cell = self.scope(scope);
        // The reads are boxed: most calls make none, and every command
        // would otherwise carry their futures (the driver's, large) in its
        // own.
        let mut trips = if self.loaded_in(db, scope, &cell) {
            RoundTrips(0)
        } else {
            Box::pin(self.refresh(db)).await?
        };
        if cell.held.load(std::sync::atomic::Ordering::Acquire) {
            trips.0 += Box::pin(self.until_settled(scope)).await?.0;
        }
        Ok(trips)
    }

    /// Waits until the dictionary of `scope` has settled: once
    /// [`REFILL_NOTICE`] has passed since this proxy first saw it, checks
    /// that the database holds no document written meanwhile and lets it
    /// be used (or, if one does, refuses the database), unless another
    /// proxy did first. Each proxy counts the notice from its own first
    /// sight of the dictionary, which was made after the drop: no clocks
    /// are compared.
    async fn until_settled(&self, scope: &str) -> Result<RoundTrips, StoreError> {
        let cell = self.scope(scope);
        let mut trips = 0;
        loop {
            let Some((epoch, seen)) = *cell.settling.lock() else {
                return Ok(RoundTrips(trips));
            };
            tokio::time::sleep(REFILL_NOTICE.saturating_sub(seen.elapsed())).await;
            let _one = cell.settle.lock().await;
            if cell.settling.lock().is_none() {
                // Another request of this proxy settled it meanwhile.
                continue;
            }
            // The dictionary begins again from here: a document written
            // and removed while it settled (by a proxy that still used the
            // dropped one) left change events older than this.
            let since = self.cluster_time(scope).await?;
            let spoiled = self.holding_documents(scope).await?.is_some();
            let (update, verdict) = match (spoiled, since) {
                (true, _) => (doc! {"$set": {SETTLING: SPOILED}}, "refused"),
                (false, Some(since)) => (
                    doc! {"$unset": {SETTLING: ""}, "$set": {SINCE: since}},
                    "settled",
                ),
                (false, None) => (doc! {"$unset": {SETTLING: ""}}, "settled"),
            };
            // Whichever proxy decides first decides for all.
            let r = self
                .coll(scope)
                .update_one(
                    doc! {"_id": HEAD_ID, "epoch": epoch.to_bson(), SETTLING: true},
                    update,
                )
                .await
                .map_err(|e| StoreError::from_driver("update", e))?;
            if r.modified_count == 1 {
                info!(scope = ?scope, epoch = %epoch, "the dictionary made after a drop has {verdict}");
            }
            trips += 2 + self.reload_now(scope).await?.0;
        }
    }

    /// The upstream's cluster time, as a command on `scope` reports it
    /// (`None` from a server that keeps none: a standalone one).
    async fn cluster_time(&self, scope: &str) -> Result<Option<bson::Timestamp>, StoreError> {
        let reply = self
            .db(scope)
            .run_command(doc! {"ping": 1})
            .await
            .map_err(|e| StoreError::from_driver("ping", e))?;
        let clock = reply
            .get_document("$clusterTime")
            .and_then(|c| c.get_timestamp("clusterTime"));
        Ok(clock.or_else(|_| reply.get_timestamp("operationTime")).ok())
    }

    /// Records that `scope` has a dictionary, before it is used: `made`,
    /// one this proxy is making (counted), or else one it read. Returns
    /// whether a record was there already: for a dictionary being made,
    /// whether it replaces a dropped one.
    async fn record(&self, scope: &str, made: bool) -> Result<bool, StoreError> {
        let Some(records) = &self.inner.records else {
            return Ok(false);
        };
        let update = if made {
            doc! {"$inc": {"made": 1i64}}
        } else {
            doc! {"$setOnInsert": {"made": 1i64}}
        };
        let before = records
            .find_one_and_update(doc! {"_id": scope}, update)
            .upsert(true)
            .return_document(ReturnDocument::Before)
            .await
            .map_err(|e| StoreError::from_driver("findAndModify", e))?;
        self.scope(scope)
            .recorded
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(before.is_some())
    }

    /// Reads the whole dictionary again and checks it against what this
    /// proxy read before. Callers that arrive while a read runs share it.
    /// For a database that shares a group's dictionary, its own mark and
    /// migration markers are read too.
    pub async fn refresh(&self, db: &str) -> Result<RoundTrips, StoreError> {
        let scope = self.inner.policies.scope_of(db);
        let mut trips = self.reload(scope, true).await?;
        if scope != db {
            trips.0 += self.read_member(db, scope).await?;
        }
        Ok(trips)
    }

    /// Reads a group member's mark and migration markers: its documents
    /// must have been written with the group's dictionary. A member that
    /// holds documents and no mark beside the group's dictionary is refused
    /// ([`Integrity::Unmarked`]); its mark is read once more before, since
    /// a proxy's first write marks a member just before its documents go.
    async fn read_member(&self, db: &str, scope: &str) -> Result<usize, StoreError> {
        let began = Instant::now();
        // Whether this proxy wrote the member since it last read its mark,
        // and since when it has found it unmarked.
        let (wrote_since_read, wrote, since) =
            self.inner.members.get(db).map_or((false, 0, None), |m| {
                let wrote = m.wrote.ms();
                (wrote != 0 && wrote >= m.read.ms(), wrote, m.unmarked_since)
            });
        let marked = |docs: &[Document]| docs.iter().any(|d| d.get_str("_id") == Ok("__mark"));
        let mut docs = self.member_records(db).await?;
        let mut trips = 1;
        let mut unmarked = false;
        let ready = match &*self.scope(scope).state.read() {
            State::Ready(d) => Some(d.clone()),
            _ => None,
        };
        if let Some(d) = ready.as_ref().filter(|_| !marked(&docs)) {
            trips += 1;
            if self.db_has_documents(db).await? {
                if wrote_since_read {
                    // This proxy wrote it, with the group's dictionary, while
                    // it took the member for marked: it was dropped through
                    // another proxy, and written again before this one
                    // learned of it. Marked again, as that write would have.
                    trips += 1;
                    // (A mark of another identity, found meanwhile, is read
                    // below and refuses the member.)
                    let r = self
                        .coll_of_marks(db)
                        .update_one(mark_filter(d), mark_raise(d))
                        .upsert(true)
                        .await;
                    raced(r, "update")?;
                }
                docs = self.member_records(db).await?;
                trips += 1;
                unmarked = !marked(&docs);
            }
        }
        self.note_markers(db, &docs);
        let mark = docs
            .iter()
            .find(|d| d.get_str("_id") == Ok("__mark"))
            .and_then(parse_mark);
        let recorded = mark.map(|m| m.epoch);
        let verdict = match (recorded, &*self.scope(scope).state.read()) {
            _ if unmarked => Some(Integrity::Unmarked {
                db: db.to_owned(),
                scope: scope.to_owned(),
            }),
            (Some(expected), State::Ready(d)) if d.epoch != expected => Some(Integrity::Mismatch {
                db: db.to_owned(),
                scope: scope.to_owned(),
                expected,
                found: d.epoch,
            }),
            (Some(epoch), State::Absent) => Some(Integrity::Lost {
                scope: scope.to_owned(),
                epoch,
                found: db.to_owned(),
            }),
            _ => None,
        };
        let member = Member {
            refused: verdict,
            read: ReadBegan::at(began),
            mark,
            wrote: ReadBegan(wrote.into()),
            unmarked_since: unmarked.then(|| since.unwrap_or(began)),
        };
        // A write noted while this read ran is kept.
        let wrote_meanwhile = self.inner.members.get(db).map_or(0, |m| m.wrote.ms());
        member
            .wrote
            .0
            .fetch_max(wrote_meanwhile, std::sync::atomic::Ordering::AcqRel);
        self.inner.members.insert(db.to_owned(), member);
        Ok(trips)
    }

    /// Notes that a write to `db` is about to be sent: if `db` is a group's
    /// member whose mark goes missing (dropped through another proxy before
    /// this one learned of it), this proxy marks it again at its next read
    /// of it, since it wrote it with the group's dictionary.
    pub fn wrote(&self, db: &str) {
        if let Some(m) = self.inner.members.get(db) {
            m.wrote.set(Instant::now());
        }
    }

    /// Waits, for [`MARK_NOTICE`] at most since this proxy first found
    /// it so, while the member `db` holds documents and no mark: the proxy
    /// that wrote them may not have learned yet that the member was
    /// dropped, and marks it again at its next read. (Requests wait; the
    /// tools, which adopt such a member, do not.)
    pub async fn until_marked(&self, db: &str) -> Result<RoundTrips, StoreError> {
        let scope = self.inner.policies.scope_of(db);
        let mut trips = 0;
        loop {
            let since = self.inner.members.get(db).and_then(|m| m.unmarked_since);
            match since {
                Some(since) if since.elapsed() < MARK_NOTICE => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    trips += self.read_member(db, scope).await?;
                }
                _ => return Ok(RoundTrips(trips)),
            }
        }
    }

    /// A member's mark (as `_id: "__mark"`) and migration markers.
    async fn member_records(&self, db: &str) -> Result<Vec<Document>, StoreError> {
        within_lease("aggregate", async {
            self.db(db)
                .collection::<Document>(MARK_COLLECTION)
                .aggregate(vec![
                    doc! {"$match": {"_id": "mark"}},
                    doc! {"$set": {"_id": "__mark"}},
                    doc! {"$unionWith": {"coll": COLLECTION, "pipeline": [{"$match": {"_id": {"$regex": "^(migration|settings)/"}}}]}},
                ])
                .await
                .map_err(|e| StoreError::from_driver("aggregate", e))?
                .try_collect()
                .await
                .map_err(|e| StoreError::from_driver("aggregate", e))
        })
        .await
    }

    async fn reload(&self, scope: &str, share: bool) -> Result<RoundTrips, StoreError> {
        use std::sync::atomic::Ordering;
        let cell = self.scope(scope);
        let seen = cell.reloads.load(Ordering::Acquire);
        let _one = cell.reload.lock().await;
        // A read that finished while this one waited answers for it, unless
        // the dictionary was suspected after that read began: it may have
        // read what a `dropDatabase` took.
        if share && cell.reloads.load(Ordering::Acquire) != seen && cell.is_fresh() {
            return Ok(RoundTrips(0));
        }
        let previous = cell.state.read().clone();
        // The digest of the bytes the current dictionary was built from, if
        // nothing has replaced it since.
        let built_from = match (&previous, &*cell.last_read.lock()) {
            (State::Ready(now), Some((read, digest))) if Arc::ptr_eq(now, read) => Some(*digest),
            _ => None,
        };
        // The suspicions this read answers: those raised before it began.
        let covers = cell.suspected.load(Ordering::Acquire);
        let began = Instant::now();
        let read = within_lease("read", self.read(scope, &previous, built_from));
        let (state, trips, digest) = match read.await {
            Ok(r) => r,
            Err(e) => {
                cell.suspect();
                *cell.unreadable.lock() = Some(format!("its dictionary cannot be read: {e}"));
                return Err(e);
            }
        };
        if let State::Ready(d) = &state {
            // A dictionary made by another release, or by a tool, is
            // recorded before it is used: were its database dropped and
            // written again, the next one would settle first.
            if self.inner.records.is_some() && !cell.recorded.load(Ordering::Acquire) {
                if let Err(e) = self.record(scope, false).await {
                    cell.suspect();
                    return Err(e);
                }
            }
            let mut settling = cell.settling.lock();
            *settling = match *settling {
                _ if !d.settling => None,
                Some((epoch, seen)) if epoch == d.epoch => Some((epoch, seen)),
                // First seen now, after the read that found it (which
                // may have begun before it was made).
                _ => Some((d.epoch, Instant::now())),
            };
            cell.held.store(settling.is_some(), Ordering::Release);
        } else {
            *cell.settling.lock() = None;
            cell.held.store(false, Ordering::Release);
        }
        *cell.unreadable.lock() = None;
        *cell.last_read.lock() = match &state {
            State::Ready(d) => Some((d.clone(), digest)),
            _ => None,
        };
        self.settle(scope, &cell, state);
        // Fresh from here on (unless suspected again since it began).
        cell.read.set(began);
        cell.cleared.fetch_max(covers, Ordering::AcqRel);
        cell.reloads.fetch_add(1, Ordering::Release);
        Ok(trips)
    }

    /// A read that starts after the caller's own last write (allocations
    /// judge from it whether another proxy changed the store).
    async fn reload_now(&self, scope: &str) -> Result<RoundTrips, StoreError> {
        self.reload(scope, false).await
    }

    /// Re-reads every dictionary this proxy holds (and the marks of the
    /// group members it has met): what a dropped, replaced,
    /// rewound or edited dictionary is noticed by within a second, and what
    /// a failed one recovers by once it is put back.
    pub async fn revalidate(&self) {
        let scopes: Vec<String> = self
            .inner
            .scopes
            .iter()
            .filter(|e| !matches!(*e.value().state.read(), State::Unloaded))
            .map(|e| e.key().clone())
            .collect();
        let members: Vec<String> = self.inner.members.iter().map(|e| e.key().clone()).collect();
        for db in scopes.iter().chain(&members) {
            if let Err(e) = self.refresh(db).await {
                tracing::debug!(db = ?db, error = %e, "the dictionary could not be read again");
            }
        }
    }

    /// Revalidates every `every` until `shutdown` fires.
    pub async fn watch(self, every: Duration, shutdown: crate::shutdown::Shutdown) {
        loop {
            tokio::select! {
                biased;
                _ = shutdown.triggered() => return,
                _ = tokio::time::sleep(every) => {}
            }
            self.revalidate().await;
        }
    }

    /// The state of every database this proxy has read.
    pub fn statuses(&self) -> Vec<Status> {
        let mut out: Vec<Status> = self
            .inner
            .scopes
            .iter()
            .map(|e| {
                let state = e.value().state.read().clone();
                let (names, values) = match &state {
                    State::Ready(d) => (d.len(), d.value_count()),
                    _ => (0, 0),
                };
                let held = e.value().held.load(std::sync::atomic::Ordering::Acquire);
                Status {
                    scope: e.key().clone(),
                    state: if held { "settling" } else { state.label() },
                    names,
                    values,
                    error: match &state {
                        State::Failed { error, .. } => Some(error.to_string()),
                        _ => e.value().unreadable.lock().clone(),
                    },
                }
            })
            .collect();
        out.sort_by(|a, b| a.scope.cmp(&b.scope));
        out
    }

    /// Whether the store's upstream answers.
    pub async fn probe(&self) -> Result<(), StoreError> {
        self.db("admin")
            .run_command(doc! {"ping": 1})
            .await
            .map(|_| ())
            .map_err(|e| StoreError::from_driver("ping", e))
    }

    /// The first database read with `db`'s dictionary (`db`, or a member of
    /// its group) in which a tokenized collection holds a document: one a
    /// new dictionary could mislabel.
    pub async fn holding_documents(&self, db: &str) -> Result<Option<String>, StoreError> {
        let scope = self.inner.policies.scope_of(db);
        let members: Vec<String> = match self.inner.policies.group(scope) {
            // Every tokenized database: one the policies leave as it is
            // (the name store's, `admin`, a database whose setting turns
            // tokenization off) is never read with the dictionary.
            Some(g) if g.is_everything() => self
                .inner
                .client
                .list_database_names()
                .await
                .map_err(|e| StoreError::from_driver("listDatabases", e))?
                .into_iter()
                .filter(|d| *d == g.home || self.inner.policies.applies_to(d))
                .collect(),
            Some(g) => g.databases.iter().chain([&g.home]).cloned().collect(),
            None => vec![db.to_owned()],
        };
        for member in members {
            if self.db_has_documents(&member).await? {
                return Ok(Some(member));
            }
        }
        Ok(None)
    }

    async fn db_has_documents(&self, db: &str) -> Result<bool, StoreError> {
        // The user's documents are looked for on the primary with `local`
        // reads, not as the store reads its own: a document a majority does
        // not hold yet is seen too, and any document seen refuses a new
        // dictionary, which is the side to err on.
        let database = self.inner.client.database_with_options(
            db,
            DatabaseOptions::builder()
                .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
                .read_concern(ReadConcern::local())
                .build(),
        );
        let names = database
            .list_collection_names()
            .filter(doc! {"type": "collection"})
            .await
            .map_err(|e| StoreError::from_driver("listCollections", e))?;
        // The record of dictionaries, where the name store's database is a
        // group's home, is the proxy's own.
        let records = self.inner.records.as_ref().map(Collection::namespace);
        for name in names {
            let tokenized =
                self.inner.policies.get(db, &name).is_active() || !self.inner.policies.is_active();
            let own = records
                .as_ref()
                .is_some_and(|r| r.db == db && r.coll == name);
            if name.starts_with(COLLECTION) || name.starts_with("system.") || !tokenized || own {
                continue;
            }
            let one = database
                .collection::<Document>(&name)
                .find_one(doc! {})
                .projection(doc! {"_id": 1})
                .await
                .map_err(|e| StoreError::from_driver("find", e))?;
            if one.is_some() {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Reads `scope`'s collection and judges what it holds against
    /// `previous`, what this proxy knew; returns the digest of what it read.
    ///
    /// `built_from`: the digest of the bytes `previous` was built from,
    /// when it is the dictionary the last read built. Bytes with the same
    /// digest would build it again and pass every check it passed, so the
    /// once-a-second revalidation of an unchanged store costs a read and a
    /// digest, not a rebuild of every name and its check. Any change to
    /// the store (an added, edited or removed entry, another identity, the
    /// mark) changes the bytes, and any other change to `previous` (names
    /// this proxy added) makes it another dictionary: both take the full
    /// path.
    async fn read(
        &self,
        scope: &str,
        previous: &State,
        built_from: Option<Digest>,
    ) -> Result<(State, RoundTrips, Digest), StoreError> {
        // One round trip: the mark first, then the dictionary. The mark is
        // raised after names are added, so whatever it counts is already in
        // the dictionary read after it.
        let raw: Vec<bson::RawDocumentBuf> = self
            .db(scope)
            .collection::<Document>(MARK_COLLECTION)
            .aggregate(vec![
                doc! {"$match": {"_id": "mark"}},
                doc! {"$set": {"_id": "__mark"}},
                doc! {"$unionWith": {"coll": COLLECTION}},
            ])
            .with_type::<bson::RawDocumentBuf>()
            .await
            .map_err(|e| StoreError::from_driver("aggregate", e))?
            .try_collect()
            .await
            .map_err(|e| StoreError::from_driver("aggregate", e))?;
        let digest = digest_of(&raw);
        // A document the server sent that does not parse: not to be trusted.
        let decode = |d: &bson::RawDocumentBuf| {
            d.to_document().map_err(|e| {
                StoreError::from(Integrity::Edited {
                    scope: scope.to_owned(),
                    what: format!("a document of its store cannot be read: {e}"),
                })
            })
        };
        if built_from == Some(digest) {
            // Migration markers and settings records are read again all
            // the same: they are few.
            let markers = raw
                .iter()
                .filter(|d| {
                    d.get_str("_id").is_ok_and(|id| {
                        id.starts_with("migration/") || form::record_of(id).is_some()
                    })
                })
                .map(decode)
                .collect::<Result<Vec<_>, _>>()?;
            self.note_markers(scope, &markers);
            return Ok((previous.clone(), RoundTrips(1), digest));
        }
        let mut docs = raw.iter().map(decode).collect::<Result<Vec<_>, _>>()?;
        let mark = match docs.first() {
            Some(d) if d.get_str("_id") == Ok("__mark") => parse_mark(&docs.remove(0)),
            _ => None,
        };
        let mut trips = 1;
        self.note_markers(scope, &docs);
        let head = docs.iter().find(|d| d.get_str("_id") == Ok(HEAD_ID));
        let chain: Vec<Document> = docs
            .iter()
            .filter(|d| d.contains_key("chain"))
            .cloned()
            .collect();
        let reference = previous.reference().cloned();
        let failed = |error: Integrity| State::Failed {
            error,
            reference: reference.clone(),
        };
        // The identity recorded beside the data, or else the one this proxy read.
        let known = mark
            .map(|m| m.epoch)
            .or(reference.as_ref().map(|d| d.epoch));
        let state = match head {
            None if chain.is_empty() => match known {
                Some(epoch) => {
                    trips += 1;
                    if let Some(found) = self.holding_documents(scope).await? {
                        failed(Integrity::Lost {
                            scope: scope.to_owned(),
                            epoch,
                            found,
                        })
                    } else {
                        // The documents went with it: nothing can be
                        // mislabelled, so start afresh.
                        info!(scope = ?scope, epoch = %epoch, "the dictionary is gone with the documents it encoded; forgetting it");
                        State::Absent
                    }
                }
                None => State::Absent,
            },
            None => failed(Integrity::Edited {
                scope: scope.to_owned(),
                what: "its head document is missing".into(),
            }),
            Some(h) => match parse_head(scope, h)
                .and_then(|head| build(scope, head, &chain))
                .and_then(|dict| check_mark(scope, dict, mark))
            {
                Err(e) => failed(e),
                Ok(mut dict) => match &reference {
                    // Dated when this proxy first read it.
                    Some(r) if r.epoch == dict.epoch => {
                        dict.since = later(dict.since, r.since);
                        match r.is_contained_in(&dict) {
                            Ok(()) => State::Ready(Arc::new(dict)),
                            Err(what) => failed(Integrity::Rewound {
                                scope: scope.to_owned(),
                                what,
                            }),
                        }
                    }
                    _ => {
                        trips += self.date(scope, &mut dict).await?;
                        if let Some(r) = &reference {
                            warn!(scope = ?scope, old = %r.epoch, new = %dict.epoch, "the dictionary was replaced; using the new one");
                        }
                        State::Ready(Arc::new(dict))
                    }
                },
            },
        };
        Ok((state, RoundTrips(trips), digest))
    }

    /// Dates a dictionary this proxy reads for the first time (since it
    /// started, or since another one replaced it) by the name store's
    /// record of `scope`, which outlives the database's drops: the record
    /// names the dictionary the database has now, and since when
    /// ([`SINCE`]). A dictionary the record names already keeps its date.
    /// One that replaces another there (a new one made after a drop, or an
    /// older one restored from a backup, whose head says it began before
    /// the other's documents) is dated now, by the upstream's clock: the
    /// change events of the other's time hold its tokens. The first
    /// dictionary a record names (one made by this build, or any before
    /// records named one) is dated by its head. Returns the round trips.
    async fn date(&self, scope: &str, dict: &mut Dictionary) -> Result<usize, StoreError> {
        let Some(records) = &self.inner.records else {
            return Ok(0);
        };
        let mut trips = 0;
        // Each round lost means another proxy dated it meanwhile.
        for _ in 0..10 {
            trips += 1;
            let record = records
                .find_one(doc! {"_id": scope})
                .await
                .map_err(|e| StoreError::from_driver("find", e))?;
            let named = record.as_ref().and_then(|r| r.get("epoch"));
            if Epoch::from_bson(named) == Some(dict.epoch) {
                let dated = record.as_ref().and_then(|r| r.get_timestamp(SINCE).ok());
                dict.since = later(dict.since, dated);
                return Ok(trips);
            }
            let since = match named {
                None => dict.since,
                Some(_) => {
                    trips += 1;
                    later(dict.since, self.cluster_time(scope).await?)
                }
            };
            let mut set = doc! {"epoch": dict.epoch.to_bson()};
            let mut update = doc! {"$setOnInsert": {"made": 1i64}};
            match since {
                Some(since) => {
                    set.insert(SINCE, since);
                }
                None => {
                    update.insert("$unset", doc! {SINCE: ""});
                }
            }
            update.insert("$set", set);
            let filter = match named {
                Some(e) => doc! {"_id": scope, "epoch": e.clone()},
                None => doc! {"_id": scope, "epoch": {"$exists": false}},
            };
            trips += 1;
            match records.update_one(filter, update).upsert(true).await {
                Ok(r) if r.matched_count == 1 || r.upserted_id.is_some() => {
                    dict.since = since;
                    return Ok(trips);
                }
                // Another proxy dated it first: read its date.
                Ok(_) => {}
                Err(e) => {
                    let e = StoreError::from_driver("update", e);
                    if !e.is_duplicate_key() {
                        return Err(e);
                    }
                }
            }
        }
        Err(StoreError::Stale(scope.to_owned()))
    }

    /// Raises the mark to what the dictionary now holds, after names or
    /// values were added.
    fn raise_mark(&self, scope: &str) {
        if let Ok(d) = self.ready(scope) {
            self.raise_in_background(scope, &d);
        }
    }

    /// Raises the mark kept in `db` to what `d` holds, in the background,
    /// off the request's path (a mark that lags only ever finds less; it
    /// only rises, so raises may land in any order).
    fn raise_in_background(&self, db: &str, d: &Dictionary) {
        let marks = self.coll_of_marks(db);
        let (filter, raise) = (mark_filter(d), mark_raise(d));
        let db = db.to_owned();
        tokio::spawn(async move {
            let r = marks.update_one(filter, raise).upsert(true).await;
            if let Err(e) = r.map_err(|e| StoreError::from_driver("update", e)) {
                // A mark of another identity: the next read says so.
                if !e.is_duplicate_key() {
                    warn!(db = ?db, error = %e, "the dictionary's mark could not be raised");
                }
            }
        });
    }

    fn coll_of_marks(&self, db: &str) -> Collection<Document> {
        self.db(db).collection(MARK_COLLECTION)
    }

    /// Marks `db`, a member of `scope`'s group, with the group's
    /// dictionary before documents written with it are sent: restored
    /// beside another dictionary, the member is then refused, not misread.
    /// A member without a mark of this identity (as this proxy last read
    /// or raised it) waits for it; one whose mark is only behind the
    /// dictionary's names has it raised in the background, as the home's
    /// is. Nothing to do for a database with a dictionary of its own (its
    /// mark is raised with it). A mark of another identity refuses the
    /// write (`mismatch`).
    async fn mark_member(&self, db: &str, scope: &str) -> Result<RoundTrips, StoreError> {
        if scope == db {
            return Ok(RoundTrips(0));
        }
        // No dictionary yet: nothing is written with one.
        let Ok(d) = self.ready(scope) else {
            return Ok(RoundTrips(0));
        };
        let now = Mark {
            epoch: d.epoch,
            names: d.len(),
            values: d.value_count(),
        };
        let note = |mark: Mark| {
            if let Some(mut m) = self.inner.members.get_mut(db) {
                m.mark = Some(mark);
            }
        };
        match self.inner.members.get(db).and_then(|m| m.mark) {
            Some(m) if m.epoch == d.epoch => {
                if m.names < now.names || m.values < now.values {
                    note(now);
                    self.raise_in_background(db, &d);
                }
                return Ok(RoundTrips(0));
            }
            _ => {}
        }
        let raised = self
            .coll_of_marks(db)
            .update_one(mark_filter(&d), mark_raise(&d))
            .upsert(true)
            .await
            .map_err(|e| StoreError::from_driver("update", e));
        match raised {
            Ok(_) => {
                note(now);
                Ok(RoundTrips(1))
            }
            Err(e) if e.is_duplicate_key() => {
                // Its mark names another dictionary: read it, and refuse.
                self.read_member(db, scope).await?;
                self.dictionary(db)?;
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Applies a state read, logging each change of kind once.
    fn settle(&self, scope: &str, cell: &Scope, new: State) {
        let mut state = cell.state.write();
        let (before, after) = (state.label(), new.label());
        if before != after {
            match &new {
                State::Failed { error, .. } => {
                    error!(scope = ?scope, state = after, "refusing reads and writes: {error}")
                }
                _ if matches!(*state, State::Failed { .. }) => {
                    info!(scope = ?scope, state = after, "the dictionary is sound again; serving")
                }
                _ => {}
            }
        }
        *state = new;
    }

    /// Notes the migration markers and settings records of `db` among the
    /// documents of its `__laconic`.
    fn note_markers(&self, db: &str, docs: &[Document]) {
        self.inner.policies.forms.set_db(db, form::records(docs));
        let states = docs.iter().filter_map(|d| {
            let coll = d.get_str("_id").ok()?.strip_prefix("migration/")?;
            let reverse = match d.get_str("direction") {
                Ok("reverse") => true,
                Ok("forward") => false,
                _ => {
                    warn!(db = ?db, collection = ?coll, "ignoring a migration marker with no valid direction");
                    return None;
                }
            };
            let state = match (d.get_bool("done").ok()?, reverse) {
                (true, true) => MigrationState::Reversed,
                (true, false) => return None,
                (false, true) => MigrationState::Migrating(Migration::Reverse),
                (false, false) => MigrationState::Migrating(Migration::Forward),
            };
            Some((coll.to_owned(), state))
        });
        self.inner.policies.migrating.set_db(db, states);
    }

    /// The tokens and value numbers of `names` and `values`, allocating the
    /// missing ones, in `scope`'s dictionary (made now if it has none and
    /// its database holds no documents).
    pub async fn allocate(
        &self,
        db: &str,
        names: &[&str],
        values: &[&str],
    ) -> Result<RoundTrips, StoreError> {
        let scope = self.inner.policies.scope_of(db);
        let cell = self.scope(scope);
        let _one = cell.alloc.lock().await;
        let mut trips = self.ensure_loaded(db).await?.0;
        let dict = self.dictionary(db)?;
        let missing_names = missing(names, |n| dict.token(n).is_some());
        let missing_values = missing(values, |v| dict.value_token(v).is_some());
        if missing_names.is_empty() && missing_values.is_empty() {
            // Written with known names alone, a member is marked all the
            // same (`laconic migrate` converts documents so).
            return Ok(RoundTrips(trips + self.mark_member(db, scope).await?.0));
        }
        if !self.exists(scope) {
            trips += self.create(scope).await?.0;
        }
        trips += self.add_names(scope, names).await?.0;
        trips += self.add_values(scope, values).await?.0;
        trips += self.mark_member(db, scope).await?.0;
        Ok(RoundTrips(trips))
    }

    /// Makes the dictionary of a database the proxy is about to write for
    /// the first time, whether or not the documents need tokens: documents
    /// written without one would later read as predating Laconic, and the
    /// first name that needs a token would be refused. A database that
    /// already holds documents is left as it is (allocation refuses it).
    /// A member of a group is marked with the group's dictionary first
    /// ([`NameStore::unmarked`]).
    pub async fn claim(&self, db: &str) -> Result<RoundTrips, StoreError> {
        let scope = self.inner.policies.scope_of(db);
        let cell = self.scope(scope);
        let _one = cell.alloc.lock().await;
        let mut trips = self.ensure_loaded(db).await?.0;
        if !self.exists(scope) {
            trips += 1;
            if self.holding_documents(scope).await?.is_some() {
                return Ok(RoundTrips(trips));
            }
            self.init(scope, "created").await?;
            trips += INIT_TRIPS;
        }
        Ok(RoundTrips(trips + self.mark_member(db, scope).await?.0))
    }

    /// The settings `db.coll`'s documents are stored with, recorded before
    /// its first write through a proxy ([`form`]): `own`, this proxy's,
    /// unless another proxy or `laconic migrate` recorded others first.
    /// What is recorded is noted in the policies' [`form::Forms`], which
    /// say whether this proxy may rewrite the collection. Sessions of this
    /// proxy record one collection at a time (the scope's allocation lock),
    /// and a session that waited finds it noted.
    pub async fn record_form(
        &self,
        db: &str,
        coll: &str,
        own: &Form,
    ) -> Result<RoundTrips, StoreError> {
        let forms = &self.inner.policies.forms;
        let cell = self.scope(self.inner.policies.scope_of(db));
        let _one = cell.alloc.lock().await;
        if forms.has(db, coll) {
            return Ok(RoundTrips(0));
        }
        let id = format!("{}{coll}", form::RECORD_PREFIX);
        let mut set = own.to_document();
        set.insert("recorded", bson::DateTime::now());
        let mut trips = 0;
        // Proxies racing to insert it: a loser reads the winner's (a server
        // may answer a lost upsert with a duplicate key, or with nothing).
        let record = loop {
            trips += 1;
            let r = within_lease("findAndModify", async {
                self.coll(db)
                    .find_one_and_update(doc! {"_id": &id}, doc! {"$setOnInsert": &set})
                    .upsert(true)
                    .return_document(ReturnDocument::After)
                    .await
                    .map_err(|e| StoreError::from_driver("findAndModify", e))
            })
            .await;
            let lost = match r {
                Ok(Some(record)) => break record,
                Err(e) if !e.is_duplicate_key() => return Err(e),
                lost => lost.err(),
            };
            trips += 1;
            let read = within_lease("find", async {
                self.coll(db)
                    .find_one(doc! {"_id": &id})
                    .await
                    .map_err(|e| StoreError::from_driver("find", e))
            })
            .await?;
            match (read, lost) {
                (Some(record), _) => break record,
                (None, _) if trips < 10 => {}
                (None, Some(e)) => return Err(e),
                (None, None) => {
                    return Err(StoreError::Exhausted(format!(
                        "the settings record of {db}.{coll} was not written"
                    )))
                }
            }
        };
        forms.note(db, coll, Form::from_document(&record));
        Ok(RoundTrips(trips))
    }

    /// Whether `db`, a database this proxy tokenizes nothing in, holds a
    /// dictionary or a group's mark: other proxies tokenize it (or did),
    /// and its documents would be read here with tokens for names. Read
    /// once per [`ELSEWHERE_EVERY`] at most (a request that finds it older
    /// reads it again): one round trip. A database the proxy's own user may
    /// not read is taken as tokenized nowhere (no proxy given the same
    /// credentials could tokenize it). Returns the round trips.
    pub async fn tokenized_elsewhere(&self, db: &str) -> Result<(bool, RoundTrips), StoreError> {
        if let Some(e) = self.inner.elsewhere.get(db) {
            if e.1.elapsed() < ELSEWHERE_EVERY {
                return Ok((e.0, RoundTrips(0)));
            }
        }
        let found: Result<Vec<Document>, StoreError> = within_lease("aggregate", async {
            self.db(db)
                .collection::<Document>(MARK_COLLECTION)
                .aggregate(vec![
                    doc! {"$match": {"_id": "mark"}},
                    doc! {"$unionWith": {"coll": COLLECTION, "pipeline": [{"$match": {"_id": HEAD_ID}}]}},
                    doc! {"$limit": 1},
                    doc! {"$project": {"_id": 1}},
                ])
                .await
                .map_err(|e| StoreError::from_driver("aggregate", e))?
                .try_collect()
                .await
                .map_err(|e| StoreError::from_driver("aggregate", e))
        })
        .await;
        let tokenized = match found {
            Ok(found) => !found.is_empty(),
            // The proxy's own user may not read it (no proxy given the same
            // credentials tokenizes it), or it is no database's name (the
            // server answers the command with its own error).
            Err(StoreError::Refused { code: 13 | 73, .. }) => false,
            Err(e) => return Err(e),
        };
        // Clients name the databases: what is kept of them stays bounded
        // (past the bound, what has aged goes first; a database not kept
        // is read again at its next command).
        let known = &self.inner.elsewhere;
        if known.len() >= MAX_ELSEWHERE {
            known.retain(|_, (_, read)| read.elapsed() < ELSEWHERE_EVERY);
        }
        if known.len() < MAX_ELSEWHERE {
            known.insert(db.to_owned(), (tokenized, Instant::now()));
        }
        Ok((tokenized, RoundTrips(1)))
    }

    /// Removes the settings record of `db.coll`, dropped through this proxy:
    /// the collection may be made again with other settings.
    pub async fn remove_form(&self, db: &str, coll: &str) -> Result<RoundTrips, StoreError> {
        let id = format!("{}{coll}", form::RECORD_PREFIX);
        within_lease("delete", async {
            self.coll(db)
                .delete_one(doc! {"_id": id})
                .await
                .map_err(|e| StoreError::from_driver("delete", e))
        })
        .await?;
        self.inner.policies.forms.forget(db, coll);
        Ok(RoundTrips(1))
    }

    /// Whether `db` shares a group's dictionary that its mark, as this
    /// proxy last read or raised it, does not cover (another identity, or
    /// fewer names or values than the dictionary holds now): its next write
    /// raises the mark first ([`NameStore::claim`]), so that its documents
    /// never hold tokens its mark does not account for.
    pub fn unmarked(&self, db: &str) -> bool {
        let scope = self.inner.policies.scope_of(db);
        if scope == db {
            return false;
        }
        let Ok(d) = self.ready(scope) else {
            return false;
        };
        !self.member_marked(db, &d)
    }

    fn member_marked(&self, db: &str, d: &Dictionary) -> bool {
        self.inner
            .members
            .get(db)
            .and_then(|m| m.mark)
            .is_some_and(|m| {
                m.epoch == d.epoch && m.names >= d.len() && m.values >= d.value_count()
            })
    }

    /// Makes `scope`'s dictionary, unless the database already holds
    /// documents (which a new dictionary could mislabel).
    async fn create(&self, scope: &str) -> Result<RoundTrips, StoreError> {
        if let Some(found) = self.holding_documents(scope).await? {
            if let Some(legacy) = &self.inner.legacy {
                if let Ok(Some(_)) = legacy.find_one(doc! {"scope": scope}).await {
                    return Err(Integrity::Format {
                        scope: scope.to_owned(),
                        found: 1,
                    }
                    .into());
                }
            }
            let e = Integrity::Missing {
                scope: scope.to_owned(),
                found,
            };
            self.settle(
                scope,
                &self.scope(scope),
                State::Failed {
                    error: e.clone(),
                    reference: None,
                },
            );
            return Err(e.into());
        }
        self.init(scope, "created").await?;
        Ok(RoundTrips(INIT_TRIPS))
    }

    /// Writes a head for `scope` if it has none (and a mark for it), then
    /// reads the dictionary ([`INIT_TRIPS`] round trips, counted by the
    /// callers that make a dictionary before a write). `laconic store init` calls it for a database
    /// whose documents predate Laconic.
    pub async fn init(&self, db: &str, origin: &str) -> Result<(), StoreError> {
        let scope = self.inner.policies.scope_of(db);
        let epoch = Epoch::random();
        let settling = origin == "created" && self.record(scope, true).await?;
        let since = self.cluster_time(scope).await?;
        let r = self
            .coll(scope)
            .update_one(
                doc! {"_id": HEAD_ID},
                doc! {"$setOnInsert": head_document(epoch, self.inner.cap, origin, settling, since)},
            )
            .upsert(true)
            .await;
        raced(r, "upsert")?;
        let head = self
            .coll(scope)
            .find_one(doc! {"_id": HEAD_ID})
            .await
            .map_err(|e| StoreError::from_driver("find", e))?;
        if Epoch::from_bson(head.as_ref().and_then(|h| h.get("epoch"))) == Some(epoch) {
            // This proxy made the dictionary: the mark starts from it.
            self.db(scope)
                .collection::<Document>(MARK_COLLECTION)
                .replace_one(
                    doc! {"_id": "mark"},
                    doc! {"epoch": epoch.to_bson(), "names": 0i64, "values": 0i64},
                )
                .upsert(true)
                .await
                .map_err(|e| StoreError::from_driver("replace", e))?;
        }
        self.reload_now(scope).await?;
        self.until_settled(scope).await.map(|_| ())
    }

    /// Opens chain document `seq` (an upsert; several proxies may race).
    async fn open(
        &self,
        scope: &str,
        epoch: Epoch,
        chain: &str,
        seq: i64,
        base: i64,
    ) -> Result<(), StoreError> {
        let r = self
            .coll(scope)
            .update_one(
                doc! {"_id": chain_id(epoch, chain, seq)},
                doc! {"$setOnInsert": empty_chain_document(epoch, chain, seq, base)},
            )
            .upsert(true)
            .await;
        raced(r, "upsert")
    }

    fn ready(&self, scope: &str) -> Result<Arc<Dictionary>, StoreError> {
        match &*self.scope(scope).state.read() {
            State::Ready(d) => Ok(d.clone()),
            State::Failed { error, .. } => Err(error.clone().into()),
            _ => Err(StoreError::Exhausted(format!(
                "the dictionary of {scope} vanished during an allocation"
            ))),
        }
    }

    async fn add_names(&self, scope: &str, names: &[&str]) -> Result<RoundTrips, StoreError> {
        let mut trips = 0;
        for _ in 0..MAX_ROUNDS {
            let d = self.ready(scope)?;
            let todo = missing(names, |n| d.token(n).is_some());
            if todo.is_empty() {
                return Ok(RoundTrips(trips));
            }
            let open = d.name_chain.open();
            if d.name_chain.lengths.is_empty() || open.1 >= d.cap {
                let seq = if d.name_chain.lengths.is_empty() {
                    0
                } else {
                    open.0 + 1
                };
                self.open(scope, d.epoch, "names", seq, 0).await?;
                trips += 1 + self.reload_now(scope).await?.0;
                continue;
            }
            let (seq, n) = open;
            let batch: Vec<&str> = todo.iter().take(d.cap - n).map(String::as_str).collect();
            let plan = plan_names(&d, &batch)?;
            let k = batch.len();
            let filter = doc! {
                "_id": chain_id(d.epoch, "names", seq),
                "epoch": d.epoch.to_bson(),
                format!("names.{}", d.cap - k): {"$exists": false},
                "$nor": plan.guards,
            };
            let update = doc! {
                "$push": {
                    "names": {"$each": batch.clone()},
                    "tokens": {"$each": plan.tokens.iter().map(Token::as_str).collect::<Vec<_>>()},
                    "checks": {"$each": batch.iter().zip(&plan.tokens).map(|(n, t)| check(d.epoch, "names", n, t.as_str())).collect::<Vec<_>>()},
                },
                "$inc": {"n": k as i64},
            };
            trips += 1;
            let pushed = self
                .coll(scope)
                .find_one_and_update(filter, update)
                .return_document(ReturnDocument::After)
                .await
                .map_err(|e| StoreError::from_driver("findAndModify", e))?;
            match pushed {
                Some(doc) => {
                    self.merge_names(scope, &d, seq, &doc)?;
                    self.raise_mark(scope);
                }
                None => {
                    trips += self.reload_now(scope).await?.0;
                    let now = self.ready(scope)?;
                    if now.epoch == d.epoch && now.name_chain == d.name_chain {
                        return Err(StoreError::Exhausted(format!(
                            "the dictionary of {scope} refused an append while nothing in it changed: is its newest document writable by this proxy?"
                        )));
                    }
                    // Another proxy added names (or filled the document):
                    // go again with what it wrote.
                }
            }
        }
        Err(StoreError::Exhausted(format!(
            "the dictionary of {scope} kept changing under {MAX_ROUNDS} attempts to add names"
        )))
    }

    /// Folds the chain document a push returned into the dictionary.
    fn merge_names(
        &self,
        scope: &str,
        d: &Dictionary,
        seq: i64,
        doc: &Document,
    ) -> Result<(), StoreError> {
        let names = string_list(doc, "names");
        let tokens = string_list(doc, "tokens");
        let checks = doc.get_array("checks").map(|a| a.len()).unwrap_or(0);
        let edited = |what: &str| Integrity::Edited {
            scope: scope.to_owned(),
            what: what.to_owned(),
        };
        if names.len() != tokens.len() || names.len() != checks {
            return Err(edited("its newest document holds lists of different lengths").into());
        }
        let mut next = d.clone();
        let mut entries = Vec::new();
        for (name, token) in names.iter().zip(&tokens) {
            let t = Token::from_bytes(token.as_bytes())
                .ok_or_else(|| edited("its newest document holds a malformed token"))?;
            entries.push((name.clone(), t));
        }
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        next.insert_names(&entries, scope)?;
        if let Some(l) = next.name_chain.lengths.get_mut(seq as usize) {
            *l = names.len();
        }
        *self.scope(scope).state.write() = State::Ready(Arc::new(next));
        Ok(())
    }

    async fn add_values(&self, scope: &str, values: &[&str]) -> Result<RoundTrips, StoreError> {
        let mut trips = 0;
        for _ in 0..MAX_ROUNDS {
            let d = self.ready(scope)?;
            let todo = missing(values, |v| d.value_token(v).is_some());
            if todo.is_empty() {
                return Ok(RoundTrips(trips));
            }
            let open = d.value_chain.open();
            if d.value_chain.lengths.is_empty() || open.1 >= d.cap {
                let seq = if d.value_chain.lengths.is_empty() {
                    0
                } else {
                    open.0 + 1
                };
                let base = d.value_count() as i64;
                self.open(scope, d.epoch, "values", seq, base).await?;
                trips += 1 + self.reload_now(scope).await?.0;
                continue;
            }
            let (seq, n) = open;
            let batch: Vec<&str> = todo.iter().take(d.cap - n).map(String::as_str).collect();
            let first = d.value_count();
            let checks: Vec<i32> = batch
                .iter()
                .enumerate()
                .map(|(i, v)| check(d.epoch, "values", v, &(first + i).to_string()))
                .collect();
            trips += 1;
            let pushed = self
                .coll(scope)
                .update_one(
                    doc! {"_id": chain_id(d.epoch, "values", seq), "epoch": d.epoch.to_bson(), "n": n as i64},
                    doc! {"$push": {"values": {"$each": batch.clone()}, "checks": {"$each": checks}}, "$inc": {"n": batch.len() as i64}},
                )
                .await
                .map_err(|e| StoreError::from_driver("update", e))?;
            let before = (d.epoch, d.value_chain.clone());
            trips += self.reload_now(scope).await?.0;
            if pushed.modified_count == 1 {
                self.raise_mark(scope);
            } else {
                let now = self.ready(scope)?;
                if (now.epoch, now.value_chain.clone()) == before {
                    return Err(StoreError::Exhausted(format!(
                        "the dictionary of {scope} refused a value while nothing in it changed"
                    )));
                }
            }
        }
        Err(StoreError::Exhausted(format!(
            "the dictionary of {scope} kept changing under {MAX_ROUNDS} attempts to add values"
        )))
    }
}

/// The collection, beside the data, that keeps each dictionary's mark.
pub const MARK_COLLECTION: &str = "__laconic_mark";

/// What the mark kept beside the data (`__laconic_mark`) says: the
/// dictionary's identity and how many names and values it has given out. A
/// dictionary restored alone from an older copy holds fewer.
#[derive(Clone, Copy, Debug)]
struct Mark {
    epoch: Epoch,
    names: usize,
    values: usize,
}

/// The mark of dictionary `d`'s identity (an upsert of it fails as a
/// duplicate where the mark names another).
fn mark_filter(d: &Dictionary) -> Document {
    doc! {"_id": "mark", "epoch": d.epoch.to_bson()}
}

/// The mark raised to what `d` holds: it only rises, so raises may land in
/// any order.
fn mark_raise(d: &Dictionary) -> Document {
    doc! {"$max": {"names": d.len() as i64, "values": d.value_count() as i64}}
}

fn parse_mark(d: &Document) -> Option<Mark> {
    Some(Mark {
        epoch: Epoch::from_bson(d.get("epoch"))?,
        names: d.get_i64("names").unwrap_or(0).max(0) as usize,
        values: d.get_i64("values").unwrap_or(0).max(0) as usize,
    })
}

/// A dictionary read against the mark kept beside the data: of the same
/// identity, and holding at least what was given out.
fn check_mark(scope: &str, dict: Dictionary, mark: Option<Mark>) -> Result<Dictionary, Integrity> {
    let Some(m) = mark else {
        return Ok(dict);
    };
    if m.epoch != dict.epoch {
        return Err(Integrity::Mismatch {
            db: scope.to_owned(),
            scope: scope.to_owned(),
            expected: m.epoch,
            found: dict.epoch,
        });
    }
    if dict.len() < m.names || dict.value_count() < m.values {
        return Err(Integrity::Rewound {
            scope: scope.to_owned(),
            what: format!(
                "it holds {} names and {} values, but {} and {} were given out",
                dict.len(),
                dict.value_count(),
                m.names,
                m.values
            ),
        });
    }
    Ok(dict)
}

/// The entries of `items` not yet known, each once, in byte order.
fn missing(items: &[&str], known: impl Fn(&str) -> bool) -> Vec<String> {
    let mut out: Vec<String> = items
        .iter()
        .filter(|i| !known(i))
        .map(|i| (*i).to_owned())
        .collect();
    out.sort();
    out.dedup();
    out
}

fn string_list(d: &Document, key: &str) -> Vec<String> {
    d.get_array(key)
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Tokens for new names (`batch`, in byte order), and the guards that
/// keep every other name out of their gaps while they are pushed.
struct NamesPlan {
    tokens: Vec<Token>,
    guards: Vec<Document>,
}

fn plan_names(d: &Dictionary, batch: &[&str]) -> Result<NamesPlan, StoreError> {
    let tokens = d
        .plan(batch)
        .map_err(|e| StoreError::Exhausted(e.to_string()))?;
    let mut guards = Vec::new();
    let mut last = None;
    for name in batch {
        let gap = d.neighbour_names(name);
        if last == Some(gap) {
            continue;
        }
        last = Some(gap);
        let mut range = Document::new();
        if let Some(b) = gap.0 {
            range.insert("$gt", b);
        }
        if let Some(a) = gap.1 {
            range.insert("$lt", a);
        }
        guards.push(if range.is_empty() {
            doc! {"names.0": {"$exists": true}}
        } else {
            doc! {"names": {"$elemMatch": range}}
        });
    }
    Ok(NamesPlan { tokens, guards })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A write the store could not get a majority to acknowledge in time
    /// is refused with the server's code, which is not a retryable one.
    #[test]
    fn a_write_concern_error_keeps_the_servers_code() {
        let wc: mongodb::error::WriteConcernError = bson::from_document(doc! {
            "code": 64, "codeName": "WriteConcernFailed", "errmsg": "waiting for replication timed out",
        })
        .unwrap();
        let e = mongodb::error::Error::from(mongodb::error::ErrorKind::Write(
            mongodb::error::WriteFailure::WriteConcernError(wc),
        ));
        match StoreError::from_driver("findAndModify", e) {
            StoreError::Refused {
                code, code_name, ..
            } => assert_eq!((code, code_name.as_str()), (64, "WriteConcernFailed")),
            other => panic!("{other:?}"),
        }
    }
}
