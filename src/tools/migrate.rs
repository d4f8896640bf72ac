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
use crate::convert::Target;
use crate::rewrite::expand;
use crate::rewrite::mapper::paths as tokenize;
use crate::token::form::{self, Form};
use crate::token::store::MIGRATION_NOTICE;
use crate::token::{NameStore, Policy};

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
pub async fn run(opts: &Options) -> crate::tools::Result<Summary> {
    let client = Client::with_uri_str(&opts.uri).await?;
    let db = client.database(&opts.db);
    let coll: Collection<RawDocumentBuf> = db.collection(&opts.collection);
    let t = &opts.tokenize;
    let policies = t.policies();
    let store = NameStore::new(client.clone(), t.cap, policies.clone()).with_records(&t.store_db);
    let policy = policies.get(&opts.db, &opts.collection).clone();
    if !opts.reverse && !policy.is_active() {
        crate::tools::bail!(
            "{}.{} has no tokenization configured: give --tokenize-min-len, --custom-path or --config",
            opts.db,
            opts.collection
        );
    }
    let state_coll: Collection<Document> = crate::token::store::database(&client, &opts.db)
        .collection(crate::token::dictionary::COLLECTION);
    let state_id = format!("migration/{}", opts.collection);
    let label = format!("{}.{}", opts.db, opts.collection);
    let last = resume_point(&state_coll, &state_id, &label, opts.reverse).await?;
    let form = Form::of(Some(&policy));
    if !opts.reverse {
        settings_alike(&state_coll, &opts.collection, &label, &form).await?;
    }
    let (size_before, storage_before) = coll_stats(&db, &opts.collection).await;
    let total = coll.estimated_document_count().await.unwrap_or(0);
    store.refresh(&opts.db).await?;
    if !store.exists(&opts.db) && !opts.reverse && !opts.dry_run {
        // Migrating adopts the collection's documents: the database gets
        // its dictionary now, whatever it holds.
        store.init(&opts.db, "adopted").await?;
    }
    if !opts.reverse && !opts.dry_run && store.unmarked(&opts.db) {
        // So does a group's member: it is marked with the group's
        // dictionary, which its documents hold from now on.
        store.claim(&opts.db).await?;
        store.refresh(&opts.db).await?;
    }
    match store.dictionary(&opts.db) {
        // A member that migrating would adopt.
        Err(crate::token::Integrity::Unmarked { .. }) if opts.dry_run => {}
        other => {
            other?;
        }
    }
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
        print_dry_run(&label, opts, &last, total, size_before, &index_plan);
        return Ok(Summary {
            size_before,
            storage_before,
            ..Summary::default()
        });
    }

    announce(
        &state_coll,
        &state_id,
        opts.reverse,
        &opts.collection,
        &form,
    )
    .await?;

    let bar = opts.progress.then(|| progress_bar(total));
    let mut summary = Summary {
        size_before,
        storage_before,
        ..Summary::default()
    };
    let started = Instant::now();
    let target = Target {
        coll: &coll,
        store: &store,
        db: &opts.db,
        policy: &policy,
        reverse: opts.reverse,
    };
    let mut reader = Batches::new(&coll, last, opts.batch);
    while let Some(batch) = reader.next().await? {
        summary.examined += batch.len() as u64;
        let (rewritten, retried) = target.convert(batch).await?;
        summary.rewritten += rewritten;
        summary.retried += retried;
        state_coll
            .update_one(
                doc! {"_id": &state_id},
                doc! {"$set": {"last_id": reader.last.clone(), "updated": bson::DateTime::now()},
                "$inc": {"rewritten": rewritten as i64}},
            )
            .await?;
        reader.converted(rewritten);
        if let Some(bar) = &bar {
            bar.set_position(summary.examined);
        }
    }
    for (name, key) in &index_plan {
        rebuild_index(&db, &opts.collection, name, key).await?;
        summary.indexes_rebuilt.push(name.clone());
    }
    if opts.reverse {
        // Written back to full names, it is stored with no settings: a
        // later migration into tokens records its own.
        state_coll
            .delete_one(doc! {"_id": settings_id(&opts.collection)})
            .await?;
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

/// Marks the collection as migrating, then waits: proxies read the markers
/// with their dictionaries once a second, and rely on what they read for
/// [`VIEW_LEASE`](crate::token::store::VIEW_LEASE) at most (a command past
/// it reads them again first), so after [`MIGRATION_NOTICE`] every proxy
/// writes the collection knowing of this one (and matches both forms)
/// before anything changes.
///
/// A migration into tokens records the settings it migrates with
/// ([`crate::token::form`]), after the marker: from then on, proxies given
/// other settings refuse the collection.
async fn announce(
    state_coll: &Collection<Document>,
    state_id: &str,
    reverse: bool,
    coll: &str,
    form: &Form,
) -> crate::tools::Result<()> {
    state_coll
        .update_one(
            doc! {"_id": state_id},
            doc! {"$set": {"direction": direction(reverse), "done": false, "updated": bson::DateTime::now()},
                  "$setOnInsert": {"started": bson::DateTime::now(), "last_id": Bson::MinKey, "rewritten": 0i64}},
        )
        .upsert(true)
        .await?;
    if !reverse {
        let mut record = form.to_document();
        record.insert("recorded", bson::DateTime::now());
        state_coll
            .update_one(doc! {"_id": settings_id(coll)}, doc! {"$set": record})
            .upsert(true)
            .await?;
    }
    tracing::info!(
        wait = ?MIGRATION_NOTICE,
        "migration announced; waiting for every proxy to know of it before the first change"
    );
    tokio::time::sleep(MIGRATION_NOTICE).await;
    Ok(())
}

fn settings_id(coll: &str) -> String {
    format!("{}{coll}", form::RECORD_PREFIX)
}

/// Refuses a migration into tokens given other settings than those
/// recorded for the collection ([`crate::token::form`]), unless it was
/// written back to full names since: while a collection migrates, proxies
/// match two forms, the one it goes to and full names, and its documents
/// still stored with the recorded settings would be in a third. To change
/// a collection's settings, it is migrated back first (`--reverse` needs
/// no settings: it reads tokens whatever wrote them), then into tokens
/// with the new ones. A record that does not read as settings is replaced.
async fn settings_alike(
    state_coll: &Collection<Document>,
    coll: &str,
    label: &str,
    form: &Form,
) -> crate::tools::Result<()> {
    let Some(record) = state_coll.find_one(doc! {"_id": settings_id(coll)}).await? else {
        return Ok(());
    };
    let Some(recorded) = Form::from_document(&record) else {
        return Ok(());
    };
    if recorded == *form {
        return Ok(());
    }
    let marker = state_coll
        .find_one(doc! {"_id": format!("migration/{coll}")})
        .await?;
    let reversed = marker.is_some_and(|m| {
        m.get_bool("done").unwrap_or(false) && m.get_str("direction") == Ok("reverse")
    });
    if reversed {
        return Ok(());
    }
    crate::tools::bail!(
        "{label} is stored with other tokenize settings ({recorded}) than these ({form}): run `laconic migrate --reverse` first, then migrate with the new settings"
    )
}

/// Where an unfinished migration of the same direction stopped (the start
/// otherwise); an unfinished one of the other direction is refused.
async fn resume_point(
    state_coll: &Collection<Document>,
    state_id: &str,
    label: &str,
    reverse: bool,
) -> crate::tools::Result<Bson> {
    let state = state_coll.find_one(doc! {"_id": state_id}).await?;
    let Some(s) = state else {
        return Ok(Bson::MinKey);
    };
    let dir = s.get_str("direction").unwrap_or_default();
    if s.get_bool("done").unwrap_or(false) {
        return Ok(Bson::MinKey);
    }
    if dir != direction(reverse) {
        crate::tools::bail!(
            "a {dir} migration of {label} is unfinished: run it to the end before going the other way"
        );
    }
    Ok(s.get("last_id").cloned().unwrap_or(Bson::MinKey))
}

fn print_dry_run(
    label: &str,
    opts: &Options,
    last: &Bson,
    total: u64,
    size_before: i64,
    index_plan: &[(String, Document)],
) {
    let way = if opts.reverse {
        "back to full names"
    } else {
        "to tokens"
    };
    let resume = if matches!(last, Bson::MinKey) {
        String::new()
    } else {
        format!(", resuming after _id {last}")
    };
    println!("would migrate {label} {way} ({total} documents, {size_before} B of data){resume}");
    for (name, key) in index_plan {
        println!("would rebuild index {name} on {key}");
    }
}

fn progress_bar(total: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} docs  {per_sec}  ETA {eta}  {msg}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

/// A collection's documents in `_id` order, a batch at a time, after the
/// last `_id` done: one cursor (an index scan); one lost on the way (a
/// server restart, an idle timeout) is opened again after the last `_id`
/// done. Once it ends, one more is opened, for documents inserted
/// meanwhile, until one finds nothing or a batch of them needed no
/// conversion ([`Batches::converted`]).
pub struct Batches<'a> {
    coll: &'a Collection<RawDocumentBuf>,
    /// The `_id` of the last document handed out.
    last: Bson,
    size: usize,
    cursor: Option<mongodb::Cursor<RawDocumentBuf>>,
    reopened: usize,
    read_since_open: usize,
    /// Whether a cursor has ended: the one open now reads what was
    /// inserted after the collection's end as it stood.
    ended: bool,
    /// Whether the last batch handed out was read so.
    past_the_end: bool,
    /// Whether the read is over: a batch past the end needed nothing.
    done: bool,
}

impl<'a> Batches<'a> {
    /// The documents after `_id` `after`, `size` at a time.
    pub fn new(coll: &'a Collection<RawDocumentBuf>, after: Bson, size: usize) -> Batches<'a> {
        Batches {
            coll,
            last: after,
            size,
            cursor: None,
            reopened: 0,
            read_since_open: 0,
            ended: false,
            past_the_end: false,
            done: false,
        }
    }

    /// How many documents of the last batch were converted. Past the
    /// collection's end as it stood (documents inserted after the
    /// migration's notice), those written through proxies are in the
    /// target form already: a batch of them that needed nothing ends the
    /// read. Chasing them would never end under a steady stream of inserts
    /// (on a server whose `_id`-ordered read reads the whole collection, it
    /// fell one insert behind per read). Documents written straight to the
    /// deployment keep it reading.
    pub fn converted(&mut self, rewritten: u64) {
        self.done |= self.past_the_end && rewritten == 0;
    }

    /// The next batch; `None` when the read is over.
    pub async fn next(&mut self) -> crate::tools::Result<Option<Vec<RawDocumentBuf>>> {
        if self.done {
            return Ok(None);
        }
        let mut batch: Vec<RawDocumentBuf> = Vec::with_capacity(self.size);
        // A batch is read from one cursor: the one open when it began, or,
        // if that one ended before the batch held anything, the next.
        self.past_the_end = self.ended;
        while batch.len() < self.size {
            let c = match &mut self.cursor {
                Some(c) => c,
                None => self.cursor.insert(
                    self.coll
                        .find(doc! {"_id": {"$gt": self.last.clone()}})
                        .sort(doc! {"_id": 1})
                        .hint(mongodb::options::Hint::Keys(doc! {"_id": 1}))
                        .batch_size(self.size as u32)
                        .await?,
                ),
            };
            match c.try_next().await {
                Ok(Some(d)) => {
                    self.read_since_open += 1;
                    batch.push(d);
                }
                Ok(None) if self.read_since_open == 0 => break,
                Ok(None) => {
                    self.cursor = None;
                    self.read_since_open = 0;
                    self.ended = true;
                    if !batch.is_empty() {
                        break; // done first, so that `last` moves past it
                    }
                    self.past_the_end = true;
                }
                Err(e) if self.reopened < 3 => {
                    tracing::warn!(error = %e, "migration cursor lost; reading again after the last _id done");
                    self.reopened += 1;
                    self.cursor = None;
                    self.read_since_open = 0;
                    if !batch.is_empty() {
                        break; // done first, so that `last` moves past it
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        let Some(tail) = batch.last() else {
            return Ok(None);
        };
        self.last = tail
            .get("_id")?
            .map(|v| v.to_raw_bson())
            .and_then(|v| Bson::try_from(v).ok())
            .unwrap_or(Bson::MaxKey);
        Ok(Some(batch))
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
) -> crate::tools::Result<Vec<(String, Document)>> {
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
            expand::key_pattern(key, &*store.dictionary(scope)?).unwrap_or_else(|_| key.clone());
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
) -> crate::tools::Result<()> {
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
