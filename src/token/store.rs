//! The name store (seed 000), kept in the upstream itself and grown only with
//! atomic operations, so any number of proxies allocate tokens concurrently
//! without coordinating, and always agree.
//!
//! One chain of documents per scope (by default, the database written):
//!
//! ```text
//! {_id: "<scope>/<seq>", scope, seq, leastvalue, list: [name, name, …]}
//! ```
//!
//! A name's token number is the `leastvalue` of its document plus its index in
//! `list`; `leastvalue` counts the names in the earlier documents. A document
//! holds at most `cap` names, and only the newest one grows:
//!
//! - **add**: `findAndModify` on the newest document, matching
//!   `{list: {$nin: names}, "list.<cap - k>": {$exists: false}}` (none of the
//!   `k` names there yet, and room for all of them), `$push` them with
//!   `$each`, returning the new document: one round trip.
//! - **full, or a name already there**: the match fails; reload the chain from
//!   the newest document on; names now present are done; a full document
//!   makes the proxy open the next one with an upserting `findAndModify`
//!   whose `leastvalue` is the total so far.
//!
//! Full documents never change again, so a cache that holds them is exact;
//! only the newest document needs reloading.

use std::collections::HashMap;

use rustc_hash::FxHashMap;
use std::sync::{Arc, RwLock};

use bson::{doc, Bson, Document};
use dashmap::DashMap;
use mongodb::options::ReturnDocument;
use mongodb::Collection;

/// Name-store failures: the client's write is not forwarded.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("the name store is unreachable: {0}")]
    Upstream(#[from] mongodb::error::Error),
    #[error("the name store document {id} is malformed: {why}")]
    Malformed { id: String, why: String },
    #[error("the name store for {scope} did not settle after {attempts} attempts")]
    Contention { scope: String, attempts: usize },
}

/// One scope's names, as far as this proxy has read them.
#[derive(Debug, Default)]
struct Scope {
    /// token number → name
    names: Vec<Arc<str>>,
    /// name → token number
    tokens: FxHashMap<Arc<str>, u32>,
    /// The newest chain document read so far: (seq, leastvalue, len).
    newest: Option<(i64, u32, usize)>,
    /// Read from the store at least once (an empty scope included).
    read: bool,
}

impl Scope {
    /// Folds in one chain document (newer documents are applied in order).
    fn apply(&mut self, seq: i64, leastvalue: u32, list: &[String]) {
        for (i, name) in list.iter().enumerate() {
            let n = leastvalue + i as u32;
            if (n as usize) < self.names.len() {
                continue; // already known
            }
            if n as usize != self.names.len() {
                // A gap: an earlier document was not read. Cannot happen when
                // documents are applied in chain order; be safe and skip.
                break;
            }
            let name: Arc<str> = Arc::from(name.as_str());
            self.names.push(name.clone());
            self.tokens.entry(name).or_insert(n);
        }
        self.newest = Some((seq, leastvalue, list.len()));
    }
}

/// The store and its in-process cache. Clone it freely: clones share both.
#[derive(Clone, Debug)]
pub struct NameStore {
    coll: Collection<Document>,
    cap: usize,
    cache: Arc<DashMap<String, Arc<RwLock<Scope>>>>,
}

/// Round trips made, for metrics and benchmarks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RoundTrips(pub usize);

const MAX_ATTEMPTS: usize = 64;

impl NameStore {
    pub fn new(coll: Collection<Document>, cap: usize) -> NameStore {
        NameStore {
            coll,
            cap: cap.max(1),
            cache: Arc::new(DashMap::new()),
        }
    }

    /// The names each scope's cache holds, for metrics.
    pub fn cached_sizes(&self) -> Vec<(String, usize)> {
        let mut sizes: Vec<(String, usize)> = self
            .cache
            .iter()
            .map(|e| {
                let n = e
                    .value()
                    .read()
                    .unwrap_or_else(|p| p.into_inner())
                    .names
                    .len();
                (e.key().clone(), n)
            })
            .collect();
        sizes.sort();
        sizes
    }

    /// Reads one document of the store: whether it can be read at all.
    pub async fn probe(&self) -> Result<(), StoreError> {
        self.coll.find_one(doc! {}).await?;
        Ok(())
    }

    /// The database the store lives in.
    pub fn database_name(&self) -> String {
        self.coll.namespace().db
    }

    fn scope(&self, scope: &str) -> Arc<RwLock<Scope>> {
        self.cache
            .entry(scope.to_owned())
            .or_insert_with(|| Arc::new(RwLock::new(Scope::default())))
            .clone()
    }

    /// Whether this proxy has read the scope's chain at least once.
    pub fn loaded(&self, scope: &str) -> bool {
        let s = self.scope(scope);
        let s = s.read().unwrap_or_else(|p| p.into_inner());
        s.read || s.newest.is_some()
    }

    /// The token of `name`, from the cache only (never a round trip).
    pub fn cached_token(&self, scope: &str, name: &str) -> Option<u32> {
        let s = self.scope(scope);
        let s = s.read().unwrap_or_else(|p| p.into_inner());
        s.tokens.get(name).copied()
    }

    /// The name of token `n`, from the cache only.
    pub fn cached_name(&self, scope: &str, n: u32) -> Option<Arc<str>> {
        let s = self.scope(scope);
        let s = s.read().unwrap_or_else(|p| p.into_inner());
        s.names.get(n as usize).cloned()
    }

    /// Reads the chain from the newest document this proxy knows on.
    pub async fn refresh(&self, scope: &str) -> Result<RoundTrips, StoreError> {
        let cell = self.scope(scope);
        let from = cell
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .newest
            .map_or(0, |n| n.0);
        let mut cursor = self
            .coll
            .find(doc! {"scope": scope, "seq": {"$gte": from}})
            .sort(doc! {"seq": 1})
            .await?;
        let mut docs = Vec::new();
        while cursor.advance().await? {
            docs.push(cursor.deserialize_current()?);
        }
        let mut s = cell.write().unwrap_or_else(|p| p.into_inner());
        for d in &docs {
            let (seq, least, list) = parse(d)?;
            s.apply(seq, least, &list);
        }
        s.read = true;
        Ok(RoundTrips(1))
    }

    /// The tokens of `names`, allocating the missing ones. Returns them in
    /// the order given, and the round trips it took.
    pub async fn tokens(
        &self,
        scope: &str,
        names: &[&str],
    ) -> Result<(Vec<u32>, RoundTrips), StoreError> {
        let mut trips = 0;
        let cell = self.scope(scope);
        let missing = |s: &Scope| -> Vec<String> {
            let mut m: Vec<String> = Vec::new();
            for n in names {
                if !s.tokens.contains_key(*n) && !m.iter().any(|x| x == n) {
                    m.push((*n).to_owned());
                }
            }
            m
        };
        if cell
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .newest
            .is_none()
        {
            trips += self.refresh(scope).await?.0;
        }
        for _ in 0..MAX_ATTEMPTS {
            let (todo, newest) = {
                let s = cell.read().unwrap_or_else(|p| p.into_inner());
                (missing(&s), s.newest)
            };
            if todo.is_empty() {
                let s = cell.read().unwrap_or_else(|p| p.into_inner());
                let out = names.iter().map(|n| s.tokens[*n]).collect();
                return Ok((out, RoundTrips(trips)));
            }
            let (seq, least, len) = match newest {
                Some(n) => n,
                None => {
                    trips += 1;
                    self.open(scope, 0, 0).await?;
                    trips += self.refresh(scope).await?.0;
                    continue;
                }
            };
            if len >= self.cap {
                trips += 1;
                self.open(scope, seq + 1, least + len as u32).await?;
                trips += self.refresh(scope).await?.0;
                continue;
            }
            // Push as many as fit into the newest document, in one round trip.
            let room = self.cap - len;
            let batch: Vec<String> = todo.into_iter().take(room).collect();
            let guard = format!("list.{}", self.cap - batch.len());
            trips += 1;
            let updated = self
                .coll
                .find_one_and_update(
                    doc! {"_id": id(scope, seq), "list": {"$nin": &batch}, &guard: {"$exists": false}},
                    doc! {"$push": {"list": {"$each": &batch}}},
                )
                .return_document(ReturnDocument::After)
                .await?;
            match updated {
                Some(d) => {
                    let (seq, least, list) = parse(&d)?;
                    cell.write()
                        .unwrap_or_else(|p| p.into_inner())
                        .apply(seq, least, &list);
                }
                // Another proxy got there first (a name is present, or the
                // document filled up): read what it wrote and go again.
                None => trips += self.refresh(scope).await?.0,
            }
        }
        Err(StoreError::Contention {
            scope: scope.to_owned(),
            attempts: MAX_ATTEMPTS,
        })
    }

    /// Opens chain document `seq` if nobody has yet (an upserting findAndModify).
    async fn open(&self, scope: &str, seq: i64, leastvalue: u32) -> Result<(), StoreError> {
        self.coll
            .find_one_and_update(
                doc! {"_id": id(scope, seq)},
                doc! {"$setOnInsert": {"scope": scope, "seq": seq, "leastvalue": i64::from(leastvalue), "list": []}},
            )
            .upsert(true)
            .return_document(ReturnDocument::After)
            .await?;
        Ok(())
    }
}

fn id(scope: &str, seq: i64) -> String {
    format!("{scope}/{seq}")
}

fn parse(d: &Document) -> Result<(i64, u32, Vec<String>), StoreError> {
    let id = d.get("_id").map(ToString::to_string).unwrap_or_default();
    let bad = |why: &str| StoreError::Malformed {
        id: id.clone(),
        why: why.to_owned(),
    };
    let seq = match d.get("seq") {
        Some(Bson::Int64(v)) => *v,
        Some(Bson::Int32(v)) => i64::from(*v),
        _ => return Err(bad("no seq")),
    };
    let least = match d.get("leastvalue") {
        Some(Bson::Int64(v)) => u32::try_from(*v).map_err(|_| bad("leastvalue out of range"))?,
        Some(Bson::Int32(v)) => u32::try_from(*v).map_err(|_| bad("leastvalue out of range"))?,
        _ => return Err(bad("no leastvalue")),
    };
    let list = d
        .get_array("list")
        .map_err(|_| bad("no list"))?
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_owned)
                .ok_or_else(|| bad("a non-string name"))
        })
        .collect::<Result<_, _>>()?;
    Ok((seq, least, list))
}

/// Token lookups for one scope, from the cache only: what the pure rewriters use.
pub trait Names {
    fn token(&self, name: &str) -> Option<u32>;
    fn name(&self, token: u32) -> Option<&str>;
    /// The token of a tokenized value (a separate dictionary).
    fn value_token(&self, value: &str) -> Option<u32>;
    fn value(&self, token: u32) -> Option<&str>;
    /// Every known value, for matching a regular expression against them.
    fn values(&self) -> Vec<(u32, Arc<str>)>;
}

/// One command's view of a dictionary: each name is looked up once, so a
/// token another session allocates while a command is being rewritten
/// cannot make that command map one name two ways (an output name defined
/// in one stage and referred to in the next, say).
pub struct Consistent<'a> {
    inner: &'a dyn Names,
    seen: std::cell::RefCell<HashMap<(bool, String), Option<u32>>>,
}

impl<'a> Consistent<'a> {
    pub fn new(inner: &'a dyn Names) -> Consistent<'a> {
        Consistent {
            inner,
            seen: Default::default(),
        }
    }

    fn memo(&self, value: bool, name: &str, look: impl FnOnce() -> Option<u32>) -> Option<u32> {
        let key = (value, name.to_owned());
        if let Some(t) = self.seen.borrow().get(&key) {
            return *t;
        }
        let t = look();
        self.seen.borrow_mut().insert(key, t);
        t
    }
}

impl Names for Consistent<'_> {
    fn token(&self, name: &str) -> Option<u32> {
        self.memo(false, name, || self.inner.token(name))
    }
    fn name(&self, token: u32) -> Option<&str> {
        self.inner.name(token)
    }
    fn value_token(&self, value: &str) -> Option<u32> {
        self.memo(true, value, || self.inner.value_token(value))
    }
    fn value(&self, token: u32) -> Option<&str> {
        self.inner.value(token)
    }
    fn values(&self) -> Vec<(u32, Arc<str>)> {
        self.inner.values()
    }
}

/// A dictionary that knows nothing and writes down every name and value a
/// rewrite asks it for: a dry run of a command through it lists exactly the
/// names the command would store under the policy, whatever the command.
#[derive(Default)]
pub struct Recorder {
    pub names: std::cell::RefCell<Vec<String>>,
    pub values: std::cell::RefCell<Vec<String>>,
}

impl Names for Recorder {
    fn token(&self, name: &str) -> Option<u32> {
        let mut names = self.names.borrow_mut();
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
        None
    }
    fn name(&self, _: u32) -> Option<&str> {
        None
    }
    fn value_token(&self, value: &str) -> Option<u32> {
        let mut values = self.values.borrow_mut();
        if !values.iter().any(|v| v == value) {
            values.push(value.to_owned());
        }
        None
    }
    fn value(&self, _: u32) -> Option<&str> {
        None
    }
    fn values(&self) -> Vec<(u32, Arc<str>)> {
        Vec::new()
    }
}

/// The scope of a database's value dictionary.
pub fn value_scope(scope: &str) -> String {
    format!("{scope}#values")
}

/// A database's names and values as this proxy's cache holds them, read
/// under one lock for the length of a rewrite: lookups borrow the names,
/// so expanding a reply allocates nothing per key.
pub struct Snapshot<'g> {
    names: &'g Scope,
    values: &'g Scope,
}

impl Names for Snapshot<'_> {
    fn token(&self, name: &str) -> Option<u32> {
        self.names.tokens.get(name).copied()
    }
    fn name(&self, token: u32) -> Option<&str> {
        self.names.names.get(token as usize).map(|n| &**n)
    }
    fn value_token(&self, value: &str) -> Option<u32> {
        self.values.tokens.get(value).copied()
    }
    fn value(&self, token: u32) -> Option<&str> {
        self.values.names.get(token as usize).map(|n| &**n)
    }
    fn values(&self) -> Vec<(u32, Arc<str>)> {
        self.values
            .names
            .iter()
            .enumerate()
            .map(|(i, n)| (i as u32, n.clone()))
            .collect()
    }
}

impl NameStore {
    /// Runs `f` with the cached names and values of the database `scope`.
    /// `f` must not call back into the store.
    pub fn read<R>(&self, scope: &str, f: impl FnOnce(&Snapshot<'_>) -> R) -> R {
        let names = self.scope(scope);
        let values = self.scope(&value_scope(scope));
        let names = names.read().unwrap_or_else(|p| p.into_inner());
        let values = values.read().unwrap_or_else(|p| p.into_inner());
        f(&Snapshot {
            names: &names,
            values: &values,
        })
    }
}

/// An in-memory dictionary with the same lookups as a store's cache: for
/// benchmarks, the analyser's projections and tests.
#[derive(Debug, Default)]
pub struct Dictionary {
    names: Vec<Arc<str>>,
    tokens: FxHashMap<String, u32>,
    values: Vec<Arc<str>>,
    value_tokens: FxHashMap<String, u32>,
}

impl Dictionary {
    /// Gives each new name the next token number.
    pub fn add_names(&mut self, names: &[String]) {
        for n in names {
            if !self.tokens.contains_key(n) {
                self.tokens.insert(n.clone(), self.names.len() as u32);
                self.names.push(Arc::from(n.as_str()));
            }
        }
    }

    /// Gives each new value the next value-token number.
    pub fn add_values(&mut self, values: &[String]) {
        for v in values {
            if !self.value_tokens.contains_key(v) {
                self.value_tokens
                    .insert(v.clone(), self.values.len() as u32);
                self.values.push(Arc::from(v.as_str()));
            }
        }
    }
}

impl Names for Dictionary {
    fn token(&self, name: &str) -> Option<u32> {
        self.tokens.get(name).copied()
    }
    fn name(&self, token: u32) -> Option<&str> {
        self.names.get(token as usize).map(|n| &**n)
    }
    fn value_token(&self, value: &str) -> Option<u32> {
        self.value_tokens.get(value).copied()
    }
    fn value(&self, token: u32) -> Option<&str> {
        self.values.get(token as usize).map(|v| &**v)
    }
    fn values(&self) -> Vec<(u32, Arc<str>)> {
        self.values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as u32, v.clone()))
            .collect()
    }
}
