//! `laconic migrate`: an existing collection's documents rewritten into
//! tokenized form (or, with `--reverse`, back to full names), in place.
//!
//! - **Batches in `_id` order.** The documents are read with one cursor in
//!   `_id` order, a batch at a time; every document of a batch is brought
//!   to its target form, and the batch written back with one `update`
//!   command. Proxies use the same rewrite (`Target`) on the documents an
//!   update will meet while the collection migrates.
//! - **Idempotent.** A document is first expanded to its logical form (so a
//!   document already tokenized, or partly tokenized by writes made through
//!   the proxy meanwhile, is read correctly; a field present in both forms
//!   keeps the tokenized one, the later write), then tokenized (or left
//!   logical). A document already in its target form is not written.
//! - **No lost writes.** A rewrite applies only while every field the
//!   document had when read still holds the same value (an equality filter
//!   on all of them); fields a writer added in between are kept, after the
//!   rewritten ones (a pipeline update: the new form merged with whatever
//!   is not among the fields read). If a writer changed a field, the
//!   document is read again and redone.
//! - **Resumable.** After every batch the last `_id` done is stored upstream
//!   in the database's `__laconic` collection; a restart (after a crash, a kill or Ctrl-C)
//!   goes on from there.
//! - **Indexes** whose key patterns name tokenized fields are rebuilt on the
//!   new form at the end, with their names kept (drop, then create).
//!   `--dry-run` prints all of this and changes nothing.

use std::time::{Duration, Instant};

use bson::{doc, Bson, Document, RawDocumentBuf};
use futures::TryStreamExt;
use mongodb::{Client, Collection, Database};

use crate::config::TokenizeConfig;
use crate::rewrite::{expand, raw, tokenize};
use crate::token::{NameStore, Names, Policy};

/// What to migrate, and how.
#[derive(Clone, Debug)]
pub struct Options {
    pub uri: String,
    pub db: String,
    pub collection: String,
    pub reverse: bool,
    pub batch: usize,
    pub dry_run: bool,
    pub tokenize: TokenizeConfig,
    /// Show a progress bar (off in tests and when not on a terminal).
    pub progress: bool,
}

/// What a run did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    pub examined: u64,
    pub rewritten: u64,
    pub retried: u64,
    pub indexes_rebuilt: Vec<String>,
    pub size_before: i64,
    pub size_after: i64,
    pub storage_before: i64,
    pub storage_after: i64,
}

fn direction(reverse: bool) -> &'static str {
    if reverse {
        "reverse"
    } else {
        "forward"
    }
}

/// Runs (or resumes) a migration; returns what it did.
pub async fn run(opts: &Options) -> anyhow::Result<Summary> {
    let client = Client::with_uri_str(&opts.uri).await?;
    let db = client.database(&opts.db);
    let coll: Collection<RawDocumentBuf> = db.collection(&opts.collection);
    let t = &opts.tokenize;
    let policies = t.policies();
    let store = NameStore::new(client.clone(), t.cap, policies.clone());
    let policy = policies.get(&opts.db, &opts.collection).clone();
    if !opts.reverse && !policy.is_active() {
        anyhow::bail!(
            "{}.{} has no tokenization configured: give --tokenize-min-len, --custom-path or --config",
            opts.db,
            opts.collection
        );
    }
    let state_coll: Collection<Document> = client
        .database(&opts.db)
        .collection(crate::token::dictionary::COLLECTION);
    let state_id = format!("migration/{}", opts.collection);
    let label = format!("{}.{}", opts.db, opts.collection);
    let state = state_coll.find_one(doc! {"_id": &state_id}).await?;
    let mut last: Bson = Bson::MinKey;
    if let Some(s) = &state {
        let dir = s.get_str("direction").unwrap_or_default();
        let done = s.get_bool("done").unwrap_or(false);
        if !done && dir != direction(opts.reverse) {
            anyhow::bail!(
                "a {dir} migration of {label} is unfinished: run it to the end before going the other way"
            );
        }
        if !done {
            last = s.get("last_id").cloned().unwrap_or(Bson::MinKey);
        }
    }
    let (size_before, storage_before) = coll_stats(&db, &opts.collection).await;
    let total = coll.estimated_document_count().await.unwrap_or(0);
    store.refresh(&opts.db).await?;
    if !store.exists(&opts.db) && !opts.reverse && !opts.dry_run {
        // Migrating adopts the collection's documents: the database gets
        // its dictionary now, whatever it holds.
        store.init(&opts.db, "adopted").await?;
    }
    store.dictionary(&opts.db)?;
    let index_plan = index_plan(
        &db,
        &opts.collection,
        &store,
        &opts.db,
        &policy,
        opts.reverse,
        opts.dry_run,
    )
    .await?;

    if opts.dry_run {
        println!(
            "would migrate {label} {} ({total} documents, {size_before} B of data){}",
            if opts.reverse {
                "back to full names"
            } else {
                "to tokens"
            },
            if matches!(last, Bson::MinKey) {
                String::new()
            } else {
                format!(", resuming after _id {last}")
            }
        );
        for (name, key) in &index_plan {
            println!("would rebuild index {name} on {key}");
        }
        return Ok(Summary {
            size_before,
            storage_before,
            ..Summary::default()
        });
    }

    state_coll
        .update_one(
            doc! {"_id": &state_id},
            doc! {"$set": {"direction": direction(opts.reverse), "done": false, "updated": bson::DateTime::now()},
                  "$setOnInsert": {"started": bson::DateTime::now(), "last_id": Bson::MinKey, "rewritten": 0i64}},
        )
        .upsert(true)
        .await?;
    // Proxies look for migrations once a second: give them time to see this
    // one (and to pause updates, match both forms) before anything changes.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let bar = opts.progress.then(|| {
        let bar = indicatif::ProgressBar::new(total);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{bar:40} {pos}/{len} docs  {per_sec}  ETA {eta}  {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar
    });
    let mut summary = Summary {
        size_before,
        storage_before,
        ..Summary::default()
    };
    let started = Instant::now();
    // One cursor in `_id` order (an index scan), read a batch at a time. A
    // cursor lost on the way (a server restart, an idle timeout) is opened
    // again after the last `_id` done.
    // Once it ends, one more is opened after the last `_id` done, for the
    // documents inserted meanwhile, until one finds nothing.
    let mut cursor = None;
    let mut reopened = 0;
    let mut read_since_open = 0;
    loop {
        let mut batch: Vec<RawDocumentBuf> = Vec::with_capacity(opts.batch);
        while batch.len() < opts.batch {
            let c = match &mut cursor {
                Some(c) => c,
                None => cursor.insert(
                    coll.find(doc! {"_id": {"$gt": last.clone()}})
                        .sort(doc! {"_id": 1})
                        .hint(mongodb::options::Hint::Keys(doc! {"_id": 1}))
                        .batch_size(opts.batch as u32)
                        .await?,
                ),
            };
            match c.try_next().await {
                Ok(Some(d)) => {
                    read_since_open += 1;
                    batch.push(d);
                }
                Ok(None) if read_since_open == 0 => break,
                Ok(None) => {
                    cursor = None;
                    read_since_open = 0;
                    if !batch.is_empty() {
                        break; // done first, so that `last` moves past it
                    }
                }
                Err(e) if reopened < 3 => {
                    tracing::warn!(error = %e, "migration cursor lost; reading again after the last _id done");
                    reopened += 1;
                    cursor = None;
                    read_since_open = 0;
                    if !batch.is_empty() {
                        break; // done first, so that `last` moves past it
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        let Some(tail) = batch.last() else { break };
        let tail_id = tail
            .get("_id")?
            .map(|v| v.to_raw_bson())
            .and_then(|v| Bson::try_from(v).ok())
            .unwrap_or(Bson::MaxKey);
        summary.examined += batch.len() as u64;
        let target = Target {
            coll: &coll,
            store: &store,
            db: &opts.db,
            policy: &policy,
            reverse: opts.reverse,
        };
        let (rewritten, retried) = target.convert(batch).await?;
        summary.rewritten += rewritten;
        summary.retried += retried;
        last = tail_id;
        state_coll
            .update_one(
                doc! {"_id": &state_id},
                doc! {"$set": {"last_id": last.clone(), "updated": bson::DateTime::now()},
                "$inc": {"rewritten": rewritten as i64}},
            )
            .await?;
        if let Some(bar) = &bar {
            bar.set_position(summary.examined);
        }
    }
    for (name, key) in &index_plan {
        rebuild_index(&db, &opts.collection, name, key).await?;
        summary.indexes_rebuilt.push(name.clone());
    }
    state_coll
        .update_one(
            doc! {"_id": &state_id},
            doc! {"$set": {"done": true, "updated": bson::DateTime::now()}},
        )
        .await?;
    if let Some(bar) = bar {
        bar.finish_with_message(format!("done in {:.1?}", started.elapsed()));
    }
    let (size_after, storage_after) = coll_stats(&db, &opts.collection).await;
    summary.size_after = size_after;
    summary.storage_after = storage_after;
    Ok(summary)
}

/// A collection and the form its documents are brought to.
pub struct Target<'a> {
    pub coll: &'a Collection<RawDocumentBuf>,
    pub store: &'a NameStore,
    pub db: &'a str,
    pub policy: &'a Policy,
    /// Full names (`--reverse`) rather than tokens.
    pub reverse: bool,
}

impl Target<'_> {
    /// Brings `docs` to the target form, each with one conditional update;
    /// a document a writer changed in between is read again and redone.
    /// Returns (documents rewritten, documents redone).
    pub async fn convert(&self, docs: Vec<RawDocumentBuf>) -> anyhow::Result<(u64, u64)> {
        let (mut rewritten, mut retried) = (0, 0);
        let mut pending = docs;
        let mut attempts = 0;
        while !pending.is_empty() {
            attempts += 1;
            if attempts > 10 {
                anyhow::bail!(
                    "documents of {}.{} keep changing under the migration; try again",
                    self.db,
                    self.coll.name()
                );
            }
            let (updates, ids) =
                rewrite_batch(&pending, self.store, self.db, self.policy, self.reverse).await?;
            if updates.is_empty() {
                break;
            }
            let count = updates.len();
            let reply = self
                .coll
                .client()
                .database(self.db)
                .run_command(
                    doc! {"update": self.coll.name(), "updates": updates, "ordered": false},
                )
                .await?;
            let matched = match reply.get("n") {
                Some(Bson::Int32(n)) => *n as usize,
                Some(Bson::Int64(n)) => *n as usize,
                _ => 0,
            };
            if matched == count {
                rewritten += count as u64;
                break;
            }
            // The ones a writer changed in between are not in their target
            // form: read them again and redo them.
            let again: Vec<RawDocumentBuf> = self
                .coll
                .find(doc! {"_id": {"$in": ids.clone()}})
                .await?
                .try_collect()
                .await?;
            let (still, _) =
                rewrite_batch(&again, self.store, self.db, self.policy, self.reverse).await?;
            let redo: Vec<Bson> = still
                .iter()
                .filter_map(|u| u.as_document()?.get_document("q").ok()?.get("_id").cloned())
                .collect();
            rewritten += (ids.len() - redo.len()) as u64;
            retried += redo.len() as u64;
            pending = again
                .into_iter()
                .filter(|d| {
                    d.get("_id")
                        .ok()
                        .flatten()
                        .and_then(|v| Bson::try_from(v.to_raw_bson()).ok())
                        .is_some_and(|id| redo.contains(&id))
                })
                .collect();
        }
        Ok((rewritten, retried))
    }

    /// Brings every document `filter` (in stored form) matches to the
    /// target form, a batch at a time: what a proxy does before an update
    /// of a collection being migrated. Returns the documents rewritten.
    pub async fn convert_matching(&self, filter: Document) -> anyhow::Result<u64> {
        let mut cursor = self.coll.find(filter).batch_size(500).await?;
        let mut total = 0;
        loop {
            let mut batch = Vec::new();
            while batch.len() < 500 {
                match cursor.try_next().await? {
                    Some(d) => batch.push(d),
                    None => break,
                }
            }
            if batch.is_empty() {
                return Ok(total);
            }
            total += self.convert(batch).await?.0;
        }
    }
}

/// The replacements a batch needs (`update` statements) and their `_id`s.
async fn rewrite_batch(
    docs: &[RawDocumentBuf],
    store: &NameStore,
    db: &str,
    policy: &Policy,
    reverse: bool,
) -> anyhow::Result<(Vec<Bson>, Vec<Bson>)> {
    // Logical forms first (with the cache as it is, refreshed if it lacks a token).
    let mut logical = Vec::with_capacity(docs.len());
    for d in docs {
        let l = match normalize(d, &*store.dictionary(db)?) {
            Ok(l) => l,
            Err(_) => {
                store.refresh(db).await?;
                normalize(d, &*store.dictionary(db)?).map_err(|u| {
                    anyhow::anyhow!(
                        "document {:?} holds {} keys that read as tokens its dictionary does not know (keys of documents stored before Laconic that begin with a control byte: rename them first, see the README)",
                        d.get("_id").ok().flatten(),
                        u.count()
                    )
                })?
            }
        };
        logical.push(l);
    }
    if !reverse {
        let mut names = Vec::new();
        let mut values = Vec::new();
        for l in &logical {
            tokenize::collect_names(l, policy, &mut names);
            tokenize::collect_values(l, policy, &mut values);
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        store.allocate(db, &names, &values).await?;
    }
    let mut updates = Vec::new();
    let mut ids = Vec::new();
    for (d, l) in docs.iter().zip(&logical) {
        let target = if reverse {
            bson::to_vec(l)?
        } else {
            let raw_logical = RawDocumentBuf::from_document(l)?;
            let mut out = Vec::with_capacity(raw_logical.as_bytes().len());
            raw::tokenize(
                raw_logical.as_bytes(),
                policy,
                &*store.dictionary(db)?,
                &mut out,
            )?;
            out
        };
        if target == d.as_bytes() {
            continue;
        }
        let original = Document::try_from(d.as_ref())?;
        let target = Document::from_reader(&target[..])?;
        let id = original.get("_id").cloned().unwrap_or(Bson::Null);
        updates.push(Bson::Document(doc! {
            "q": unchanged(&original),
            "u": [{"$replaceWith": {"$mergeObjects": [{"$literal": target}, added_since(&original)]}}],
        }));
        ids.push(id);
    }
    Ok((updates, ids))
}

/// A filter matching the document only while every field it had when read
/// still holds the same value (equality on sub-documents is exact). Keys
/// that a filter would read as operators or paths are left out.
fn unchanged(original: &Document) -> Document {
    original
        .iter()
        .filter(|(k, _)| !k.starts_with('$') && !k.contains('.'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The fields a writer added after the document was read: everything but
/// the fields it had. Kept by the replacement, after the rewritten ones.
fn added_since(original: &Document) -> Bson {
    let keys: Vec<Bson> = original.keys().map(|k| Bson::String(k.clone())).collect();
    Bson::Document(doc! {
        "$arrayToObject": {"$filter": {
            "input": {"$objectToArray": "$$ROOT"},
            "cond": {"$not": [{"$in": ["$$this.k", {"$literal": keys}]}]},
        }},
    })
}

/// A stored document in its logical form. A field present both as a token
/// and under its full name (a proxy write to a document not yet migrated)
/// keeps the tokenized value, the later one.
fn normalize(d: &RawDocumentBuf, names: &dyn Names) -> Result<Document, expand::Unknown> {
    let stored = Document::try_from(d.as_ref()).unwrap_or_default();
    merge(&stored, names, &mut expand::Unknown::default())
}

fn merge(
    stored: &Document,
    names: &dyn Names,
    unknown: &mut expand::Unknown,
) -> Result<Document, expand::Unknown> {
    let mut out = Document::new();
    let mut from_token: Vec<String> = Vec::new();
    for (k, v) in stored {
        let is_token = crate::token::namespace::is_reserved(k) && !k.starts_with('\u{1f}');
        let key = expand::key(k, names, &mut unknown.names).into_owned();
        let value = match v {
            Bson::Document(sub) => Bson::Document(merge(sub, names, unknown)?),
            other => {
                let one = doc! {"v": other.clone()};
                expand::document(&one, names)?
                    .remove("v")
                    .unwrap_or(Bson::Null)
            }
        };
        if out.contains_key(&key) && !is_token && from_token.contains(&key) {
            continue; // the tokenized value is the later write
        }
        if is_token {
            from_token.push(key.clone());
        }
        out.insert(key, value);
    }
    if unknown.names.is_empty() && unknown.values.is_empty() {
        Ok(out)
    } else {
        Err(unknown.clone())
    }
}

/// Indexes whose key pattern changes form: (name, new key pattern).
async fn index_plan(
    db: &Database,
    coll: &str,
    store: &NameStore,
    scope: &str,
    policy: &Policy,
    reverse: bool,
    dry_run: bool,
) -> anyhow::Result<Vec<(String, Document)>> {
    let specs: Vec<Document> = match db.run_cursor_command(doc! {"listIndexes": coll}).await {
        Ok(c) => c.try_collect().await?,
        Err(_) => return Ok(Vec::new()),
    };
    let mut plan = Vec::new();
    for spec in specs {
        let (Ok(name), Ok(key)) = (spec.get_str("name"), spec.get_document("key")) else {
            continue;
        };
        if name == "_id_" {
            continue;
        }
        let logical =
            expand::document(key, &*store.dictionary(scope)?).unwrap_or_else(|_| key.clone());
        let new = if reverse {
            logical
        } else {
            let mut wanted = Vec::new();
            for p in logical.keys() {
                for c in tokenize::logical_parts(p) {
                    wanted.push(c.to_owned());
                }
            }
            if dry_run {
                // What the tokens would be, without giving any out.
                let mut d = (*store.dictionary(scope)?).clone();
                d.add_names(&wanted);
                tokenize::paths_document(&logical, &[], policy, &d)
            } else {
                let refs: Vec<&str> = wanted.iter().map(String::as_str).collect();
                store.allocate(scope, &refs, &[]).await?;
                tokenize::paths_document(&logical, &[], policy, &*store.dictionary(scope)?)
            }
        };
        if &new != key {
            plan.push((name.to_owned(), new));
        }
    }
    Ok(plan)
}

async fn rebuild_index(
    db: &Database,
    coll: &str,
    name: &str,
    key: &Document,
) -> anyhow::Result<()> {
    let specs: Vec<Document> = db
        .run_cursor_command(doc! {"listIndexes": coll})
        .await?
        .try_collect()
        .await?;
    let Some(mut spec) = specs.into_iter().find(|s| s.get_str("name") == Ok(name)) else {
        return Ok(());
    };
    for k in ["v", "ns", "key"] {
        spec.remove(k);
    }
    spec.insert("key", key.clone());
    db.run_command(doc! {"dropIndexes": coll, "index": name})
        .await?;
    db.run_command(doc! {"createIndexes": coll, "indexes": [spec]})
        .await?;
    Ok(())
}

/// `(size, storageSize)` from collStats, 0 when the server does not say.
async fn coll_stats(db: &Database, coll: &str) -> (i64, i64) {
    let stats = tokio::time::timeout(
        Duration::from_secs(30),
        db.run_command(doc! {"collStats": coll}),
    )
    .await;
    let num = |d: &Document, k: &str| -> i64 {
        match d.get(k) {
            Some(Bson::Int32(n)) => i64::from(*n),
            Some(Bson::Int64(n)) => *n,
            Some(Bson::Double(f)) => *f as i64,
            _ => 0,
        }
    };
    match stats {
        Ok(Ok(d)) => (num(&d, "size"), num(&d, "storageSize")),
        _ => (0, 0),
    }
}
