//! `laconic migrate` on a collection while an application keeps working
//! through the proxy (inserts, operator updates, reads): killed partway,
//! resumed, then reversed while the application still writes.
//!
//! 50,000 documents, as the issue asks; `LACONIC_MIGRATE_DOCS` sets another
//! size.

use std::process::{Command, Stdio};
use std::time::Duration;

use bson::{doc, Bson, Document, RawDocumentBuf};
use mongodb::options::{UpdateOneModel, WriteModel};
use mongodb::Collection;

use crate::common::{self, db_name};

fn docs() -> i32 {
    std::env::var("LACONIC_MIGRATE_DOCS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(50_000)
}

/// The pause between two reads of the application's reader.
const READ_PACE_MS: u64 = 5;

fn original(i: i32) -> Document {
    doc! {
        "_id": i,
        "customer_name": format!("customer {i}"),
        "event_type": if i % 3 == 0 { "purchase" } else { "visit" },
        "amount": i % 97,
        "custom": {"Favorite Player": format!("player {}", i % 11), "Loyalty Tier": i % 4},
    }
}

fn migrate_command(args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_laconic"));
    c.arg("migrate")
        .args(["--uri", &common::upstream().uri])
        .args(["--db", &db_name("mig", "app"), "--collection", "events"])
        .args(["--tokenize-min-len", "6", "--custom-path", "custom"])
        .args(["--store-db", &db_name("mig", "store"), "--batch", "500"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

async fn raw_all(c: &Collection<RawDocumentBuf>) -> Vec<RawDocumentBuf> {
    common::by_id(c, doc! {}).await
}

/// The key pattern of the index `name` on the collection.
async fn index_key(db: &mongodb::Database, name: &str) -> Document {
    common::index_specs(db, "events")
        .await
        .into_iter()
        .find(|s| s.get_str("name") == Ok(name))
        .and_then(|s| s.get_document("key").ok().cloned())
        .unwrap_or_else(|| panic!("no index {name}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_migrates_under_load_resumes_after_a_kill_and_reverses_byte_for_byte() {
    let docs_total = docs();
    let direct = common::direct().await;
    let app = db_name("mig", "app");
    direct.database(&app).drop().await.unwrap();
    direct
        .database(&db_name("mig", "store"))
        .drop()
        .await
        .unwrap();
    let stored: Collection<Document> = direct.database(&app).collection("events");
    for chunk in (0..docs_total).collect::<Vec<_>>().chunks(5000) {
        stored
            .insert_many(chunk.iter().map(|&i| original(i)))
            .await
            .unwrap();
    }
    stored
        .create_index(
            mongodb::IndexModel::builder()
                .keys(doc! {"customer_name": 1})
                .build(),
        )
        .await
        .unwrap();
    let before: Vec<RawDocumentBuf> = raw_all(&direct.database(&app).collection("events")).await;

    // The dry run changes nothing and says what it would do.
    let said = common::run_ok(migrate_command(&["--dry-run"])).await;
    assert!(
        said.contains("would migrate") && said.contains("would rebuild index customer_name_1"),
        "{said}"
    );
    assert_eq!(
        raw_all(&direct.database(&app).collection("events")).await,
        before
    );

    // Documents that predate Laconic: the database is adopted (given a
    // dictionary) before the application writes through a proxy.
    let mut init = std::process::Command::new(env!("CARGO_BIN_EXE_laconic"));
    init.args(["store", "init", "--uri", &common::upstream().uri, &app]);
    common::run_ok(init).await;

    // The application, through the proxy: a writer of new documents and a
    // reader of old ones, all through the migration.
    let (_proxy, via) =
        events_through(&app, |c| c.tokenize.store_db = db_name("mig", "store")).await;
    // The writer inserts new documents and, once the migration has
    // announced itself, increments a field (a custom attribute, so
    // tokenized) of old ones, migrated or not yet: each increment must land
    // on the one field, whatever form it is stored in. (Before the
    // announcement a proxy cannot know the collection holds documents with
    // full names.)
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let announced = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (via, stop, announced) = (via.clone(), stop.clone(), announced.clone());
        tokio::spawn(async move {
            let mut inserted = 0;
            let mut bumped = std::collections::BTreeMap::<i32, i32>::new();
            let mut k: i32 = 3;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                via.insert_one(original(docs_total + 1000 + inserted))
                    .await
                    .unwrap();
                inserted += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
                if !announced.load(std::sync::atomic::Ordering::Relaxed) {
                    continue;
                }
                // Never the last document: it is checked unmigrated below.
                k = ((i64::from(k) * 48271 + 11) % i64::from(docs_total - 1)) as i32;
                let r = via
                    .update_one(doc! {"_id": k}, doc! {"$inc": {"custom.Loyalty Tier": 10}})
                    .await
                    .unwrap();
                assert_eq!(r.matched_count, 1, "document {k}");
                *bumped.entry(k).or_default() += 10;
            }
            (inserted, bumped)
        })
    };
    // The reader reads at an application's pace, a pause between reads,
    // rather than as fast as the test server answers: that server serves
    // one request at a time, and what an unpaced reader takes from it the
    // migration waits for. It reads in every phase of the migration.
    let reads = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let reader = {
        let (via, stop, reads) = (via.clone(), stop.clone(), reads.clone());
        tokio::spawn(async move {
            let mut i = 7;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i = (i * 7919 + 13) % docs_total;
                let mut got = via.find_one(doc! {"_id": i}).await.unwrap().unwrap();
                let tier = got
                    .get_document_mut("custom")
                    .unwrap()
                    .remove("Loyalty Tier");
                let mut want = original(i);
                let base = want
                    .get_document_mut("custom")
                    .unwrap()
                    .remove("Loyalty Tier");
                assert_eq!(
                    got, want,
                    "document {i} read through the proxy mid-migration"
                );
                let (Some(Bson::Int32(tier)), Some(Bson::Int32(base))) = (tier, base) else {
                    panic!("document {i}: no tier")
                };
                assert_eq!((tier - base) % 10, 0, "document {i}: tier {tier}");
                reads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(READ_PACE_MS)).await;
            }
        })
    };
    let read_while = |phase: &'static str, before: usize| {
        let now = reads.load(std::sync::atomic::Ordering::Relaxed);
        assert!(now > before, "no document was read while {phase}");
        now
    };

    // Start, kill it halfway, resume.
    let state: Collection<Document> = direct.database(&app).collection("__laconic");
    let mut child = migrate_command(&[]).spawn().unwrap();
    let id = "migration/events";
    while state.find_one(doc! {"_id": id}).await.unwrap().is_none() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    announced.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut progressed = false;
    for _ in 0..3000 {
        let s = state.find_one(doc! {"_id": id}).await.unwrap();
        if s.as_ref()
            .and_then(|s| s.get_i64("rewritten").ok())
            .unwrap_or(0)
            >= i64::from(docs_total / 4)
        {
            progressed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !progressed {
        child.kill().unwrap();
        let out = child.wait_with_output().unwrap();
        panic!(
            "the migration made no progress: {:?} {}",
            state.find_one(doc! {"_id": id}).await.unwrap(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    child.kill().unwrap();
    let _ = child.wait();
    read_while("the migration ran, before it was killed", 0);
    let halfway = state.find_one(doc! {"_id": id}).await.unwrap().unwrap();
    assert!(!halfway.get_bool("done").unwrap());
    // Partly migrated: queries on tokenized names match both forms, and
    // updates work on either form (the documents they match are brought to
    // the tokenized form first).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (first, last) = (0, docs_total - 1);
    let events: Collection<Document> = direct.database(&app).collection("events");
    let raw = |i: i32| {
        let events = events.clone();
        async move { common::by_id(&events, doc! {"_id": i}).await.remove(0) }
    };
    assert!(
        raw(last).await.contains_key("customer_name"),
        "the last document should not be migrated yet"
    );
    for i in [first, last] {
        let filter = doc! {"customer_name": format!("customer {i}"), "event_type": original(i).get_str("event_type").unwrap()};
        assert_eq!(
            via.count_documents(filter.clone()).await.unwrap(),
            1,
            "document {i}"
        );
        let found = via.find_one(filter.clone()).await.unwrap().unwrap();
        assert_eq!(found.get("amount"), original(i).get("amount"));
        // An operator update by a tokenized name, and a findAndModify.
        let r = via
            .update_one(filter.clone(), doc! {"$set": {"event_type": "changed"}})
            .await
            .unwrap();
        assert_eq!((r.matched_count, r.modified_count), (1, 1), "document {i}");
        let before_inc = via
            .find_one_and_update(
                doc! {"customer_name": format!("customer {i}")},
                doc! {"$inc": {"amount": 1000}},
            )
            .await
            .unwrap()
            .unwrap();
        assert_eq!(before_inc.get_str("event_type"), Ok("changed"));
        let now = via.find_one(doc! {"_id": i}).await.unwrap().unwrap();
        let mut want = original(i);
        want.insert("event_type", "changed");
        want.insert("amount", i % 97 + 1000);
        let tier = now
            .get_document("custom")
            .unwrap()
            .get("Loyalty Tier")
            .cloned();
        want.get_document_mut("custom")
            .unwrap()
            .insert("Loyalty Tier", tier.unwrap());
        assert_eq!(now, want, "document {i} after its updates");
        let stored = raw(i).await;
        assert!(
            !stored.contains_key("customer_name") && !stored.contains_key("amount"),
            "document {i} is stored in one form, tokenized: {stored}"
        );
        // Back as it was, for the comparisons at the end.
        via.update_one(
            doc! {"_id": i},
            doc! {"$set": {"event_type": original(i).get_str("event_type").unwrap()}, "$inc": {"amount": -1000}},
        )
        .await
        .unwrap();
    }
    // An update whose owned parse would hold more than a runtime thread
    // may (an array of 40,000 values): it is rewritten, and its conversion
    // ahead read, as heavy work, and the document it matches, stored with
    // full names, is brought to one form first.
    events
        .insert_one(doc! {"_id": -1, "customer_name": "customer -1", "amount": 5, "custom": {"Loyalty Tier": 1}})
        .await
        .unwrap();
    let notes: Vec<i32> = (0..40_000).collect();
    let r = via
        .update_one(
            doc! {"customer_name": "customer -1"},
            doc! {"$set": {"custom.Notes": notes.clone()}, "$inc": {"amount": 1}},
        )
        .await
        .unwrap();
    assert_eq!((r.matched_count, r.modified_count), (1, 1));
    assert_eq!(
        via.find_one(doc! {"_id": -1}).await.unwrap().unwrap(),
        doc! {"_id": -1, "customer_name": "customer -1", "amount": 6, "custom": {"Loyalty Tier": 1, "Notes": notes}}
    );
    let stored = raw(-1).await;
    assert!(
        !stored.contains_key("customer_name") && !stored.contains_key("amount"),
        "stored in one form, tokenized: {:?}",
        stored.keys().collect::<Vec<_>>()
    );
    via.delete_one(doc! {"_id": -1}).await.unwrap();

    // A client bulkWrite's operator updates, the same: the document one
    // matches (stored with full names) is brought to one form first, and
    // an upsert seeds its new document from its filter.
    events
        .insert_one(doc! {"_id": -2, "customer_name": "customer -2", "amount": 5, "custom": {"Loyalty Tier": 1}})
        .await
        .unwrap();
    let update = |filter: Document, update: Document, upsert: bool| {
        WriteModel::UpdateOne(
            UpdateOneModel::builder()
                .namespace(via.namespace())
                .filter(filter)
                .update(update)
                .upsert(upsert)
                .build(),
        )
    };
    let r = via
        .client()
        .bulk_write(vec![
            update(
                doc! {"customer_name": "customer -2"},
                doc! {"$inc": {"amount": 1, "custom.Loyalty Tier": 10}},
                false,
            ),
            update(
                doc! {"customer_name": "customer -3"},
                doc! {"$set": {"amount": 7}},
                true,
            ),
        ])
        .await
        .unwrap();
    assert_eq!(
        (r.matched_count, r.modified_count, r.upserted_count),
        (1, 1, 1)
    );
    assert_eq!(
        via.find_one(doc! {"_id": -2}).await.unwrap().unwrap(),
        doc! {"_id": -2, "customer_name": "customer -2", "amount": 6, "custom": {"Loyalty Tier": 11}}
    );
    let stored = raw(-2).await;
    assert!(
        !stored.contains_key("customer_name") && !stored.contains_key("custom"),
        "stored in one form, tokenized: {stored}"
    );
    let mut upserted = via
        .find_one(doc! {"customer_name": "customer -3"})
        .await
        .unwrap()
        .unwrap();
    upserted.remove("_id");
    assert_eq!(upserted, doc! {"customer_name": "customer -3", "amount": 7});
    via.delete_many(doc! {"customer_name": {"$in": ["customer -2", "customer -3"]}})
        .await
        .unwrap();

    // An upsert seeds its new document from the filter, as without the proxy.
    let r = via
        .update_one(
            doc! {"customer_name": "someone new"},
            doc! {"$set": {"custom.Favorite Player": "nobody"}},
        )
        .upsert(true)
        .await
        .unwrap();
    let new_id = r.upserted_id.expect("upserted");
    let mut got = via.find_one(doc! {"_id": &new_id}).await.unwrap().unwrap();
    got.remove("_id");
    assert_eq!(
        got,
        doc! {"customer_name": "someone new", "custom": {"Favorite Player": "nobody"}}
    );
    via.delete_one(doc! {"_id": new_id}).await.unwrap();

    let read = reads.load(std::sync::atomic::Ordering::Relaxed);
    let said = common::run_ok(migrate_command(&[])).await;
    assert!(said.contains("indexes rebuilt: customer_name_1"), "{said}");
    let read = read_while("the migration resumed", read);

    // Every document stored with tokens; queries on tokenized names find
    // them, with the rebuilt index.
    let raw_now = common::stored(&app, "events").await;
    assert!(raw_now
        .iter()
        .all(|d| !d.contains_key("customer_name") && !d.contains_key("custom")));
    assert_eq!(
        via.count_documents(doc! {"customer_name": "customer 123"})
            .await
            .unwrap(),
        1
    );
    let rebuilt = index_key(&direct.database(&app), "customer_name_1").await;
    assert!(!rebuilt.contains_key("customer_name"), "{rebuilt}");

    // And back out, while the application still inserts and updates
    // through the proxy: during and after `--reverse`, proxies store the
    // collection's writes with full names.
    common::run_ok(migrate_command(&["--reverse"])).await;
    read_while("the migration reversed", read);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (inserted, bumped) = writer.await.unwrap();
    reader.await.unwrap();
    assert!(inserted > 0 && !bumped.is_empty());

    // Every document exactly once, reading back as written through the
    // proxy, and stored as the original bytes: the documents inserted
    // first byte for byte as they were, the others as the application
    // wrote them.
    let expected: Vec<Document> = (0..docs_total)
        .chain(docs_total + 1000..docs_total + 1000 + inserted)
        .map(|i| {
            let mut d = original(i);
            if let Some(b) = bumped.get(&i) {
                let custom = d.get_document_mut("custom").unwrap();
                let tier = custom.get_i32("Loyalty Tier").unwrap();
                custom.insert("Loyalty Tier", tier + b);
            }
            d
        })
        .collect();
    let got: Vec<Document> = common::by_id(&via, doc! {}).await;
    assert_eq!(got.len(), expected.len());
    if let Some((g, w)) = got.iter().zip(&expected).find(|(g, w)| g != w) {
        panic!("documents differ after the migrations: read {g}, expected {w}");
    }
    let after = raw_all(&direct.database(&app).collection("events")).await;
    assert_eq!(after.len(), expected.len());
    let untouched: Vec<usize> = (0..before.len())
        .filter(|&i| !bumped.contains_key(&(i as i32)))
        .collect();
    assert!(untouched.len() > docs_total as usize / 2);
    assert!(
        untouched.iter().all(|&i| after[i] == before[i]),
        "the reversed documents differ from the originals"
    );
    for (stored, want) in after.iter().zip(&expected) {
        assert_eq!(
            stored.as_bytes(),
            RawDocumentBuf::from_document(want).unwrap().as_bytes(),
            "stored after --reverse"
        );
    }
    assert_eq!(
        index_key(&direct.database(&app), "customer_name_1").await,
        doc! {"customer_name": 1}
    );
}

/// The migration's read, step by step. Past the collection's end as it
/// stood, it reads the documents inserted meanwhile while they need
/// converting (written straight to the deployment) and ends at a batch of
/// them that needs nothing (written through proxies, which know of the
/// migration): however many more are inserted after, it reads no further.
/// Before the end, a batch that needed nothing ends nothing.
#[tokio::test]
async fn the_read_past_the_collections_end_goes_on_only_while_it_converts() {
    use laconic::tools::migrate::Batches;
    let db = db_name("mig_end", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let coll: Collection<RawDocumentBuf> = direct.database(&db).collection("c");
    let insert = |ids: std::ops::Range<i32>| {
        let c: Collection<Document> = direct.database(&db).collection("c");
        async move { c.insert_many(ids.map(|i| doc! {"_id": i})).await.unwrap() }
    };
    let ids = |batch: Option<Vec<RawDocumentBuf>>| -> Option<Vec<i32>> {
        batch.map(|b| b.iter().map(|d| d.get_i32("_id").unwrap()).collect())
    };
    insert(0..3).await;
    let mut read = Batches::new(&coll, Bson::MinKey, 2);
    assert_eq!(ids(read.next().await.unwrap()), Some(vec![0, 1]));
    read.converted(0);
    // The cursor ends with this batch: the collection's end as it stood.
    assert_eq!(ids(read.next().await.unwrap()), Some(vec![2]));
    read.converted(1);
    insert(3..5).await;
    assert_eq!(ids(read.next().await.unwrap()), Some(vec![3, 4]));
    read.converted(2);
    insert(5..6).await;
    assert_eq!(ids(read.next().await.unwrap()), Some(vec![5]));
    read.converted(0);
    insert(6..9).await;
    assert_eq!(ids(read.next().await.unwrap()), None, "the read is over");
}

/// A proxy tokenizing as the migrations here do, with `configure`'s
/// changes, and the collection `events` of `app` through it.
async fn events_through(
    app: &str,
    configure: impl FnOnce(&mut laconic::config::ProxyConfig),
) -> (laconic::downstream::ProxyHandle, Collection<Document>) {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 6;
    config.tokenize.custom_paths = vec!["custom".into()];
    configure(&mut config);
    let proxy = common::start(config).await;
    let via = common::via_proxy(&proxy)
        .await
        .database(app)
        .collection("events");
    (proxy, via)
}

/// A proxy relies on what it read of the store for `VIEW_LEASE` at most.
/// Its watcher stalled here, a reverse migration is announced after its
/// last read; the first command past the lease reads the markers again
/// before it is rewritten, so the proxy writes full names and brings the
/// document an update meets to them first. (`laconic migrate` waits
/// `MIGRATION_NOTICE`, longer than the lease, before it rewrites anything.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_whose_watcher_stalls_reads_the_markers_again_past_its_lease() {
    use laconic::token::store::{MIGRATION_NOTICE, VIEW_LEASE};
    assert!(MIGRATION_NOTICE > VIEW_LEASE + Duration::from_secs(2));
    let app = db_name("lease", "app");
    let direct = common::direct().await;
    direct.database(&app).drop().await.unwrap();
    let (_proxy, via) = events_through(&app, |c| {
        c.tokenize.revalidate_ms = 3_600_000; // not within this test
    })
    .await;
    via.insert_one(original(1)).await.unwrap();
    let stored = common::stored(&app, "events").await;
    assert!(!stored[0].contains_key("customer_name"), "{stored:?}");

    // What `laconic migrate --reverse` writes when it announces itself.
    direct
        .database(&app)
        .collection::<Document>("__laconic")
        .insert_one(doc! {"_id": "migration/events", "direction": "reverse", "done": false, "last_id": Bson::MinKey, "rewritten": 0i64})
        .await
        .unwrap();
    tokio::time::sleep(VIEW_LEASE + Duration::from_millis(500)).await;
    via.insert_one(original(2)).await.unwrap();
    via.update_one(doc! {"_id": 1}, doc! {"$inc": {"custom.Loyalty Tier": 10}})
        .await
        .unwrap();
    let mut bumped = original(1);
    bumped
        .get_document_mut("custom")
        .unwrap()
        .insert("Loyalty Tier", 11);
    assert_eq!(
        common::stored(&app, "events").await,
        vec![bumped.clone(), original(2)],
        "stored with full names only"
    );
    assert_eq!(
        common::by_id(&via, doc! {}).await,
        vec![bumped, original(2)]
    );
}

/// A relay to the upstream that stops passing bytes while `held` is true
/// (the connections stay open: a store that hangs rather than fails).
async fn holding_relay(target: String, held: tokio::sync::watch::Receiver<bool>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let Ok(server) = tokio::net::TcpStream::connect(&target).await else {
                continue;
            };
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            for (mut from, mut to) in [
                (
                    Box::new(cr) as Box<dyn tokio::io::AsyncRead + Send + Unpin>,
                    Box::new(sw) as Box<dyn tokio::io::AsyncWrite + Send + Unpin>,
                ),
                (Box::new(sr), Box::new(cw)),
            ] {
                let mut held = held.clone();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 64 * 1024];
                    loop {
                        if held.wait_for(|h| !*h).await.is_err() {
                            return;
                        }
                        let n = match from.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        if held.wait_for(|h| !*h).await.is_err()
                            || to.write_all(&buf[..n]).await.is_err()
                        {
                            return;
                        }
                    }
                });
            }
        }
    });
    addr
}

/// A store that stops answering (its connections open, nothing coming
/// back) does not leave the proxy writing on what it read before: past the
/// lease, a command for the database is refused with a network timeout,
/// and nothing is written. Once the store answers again, so does the proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_hangs_is_not_relied_on_past_the_lease() {
    use laconic::token::store::VIEW_LEASE;
    let app = db_name("lease", "hung");
    let direct = common::direct().await;
    direct.database(&app).drop().await.unwrap();
    let (hold, held) = tokio::sync::watch::channel(false);
    let upstream = common::upstream();
    let relay = holding_relay(upstream.host.clone(), held).await;
    let sep = if upstream.uri.contains('?') { "&" } else { "?" };
    let store_uri = format!(
        "{}{sep}directConnection=true",
        upstream.uri.replacen(&upstream.host, &relay, 1)
    );
    let (_proxy, via) = events_through(&app, |c| c.tokenize.store_uri = Some(store_uri)).await;
    via.insert_one(original(1)).await.unwrap();

    hold.send(true).unwrap();
    tokio::time::sleep(VIEW_LEASE + Duration::from_millis(500)).await;
    let started = std::time::Instant::now();
    let err = common::command_error(via.insert_one(original(2)).await.unwrap_err());
    assert!(
        matches!(err.code, 89 | 6),
        "a network code for a store that does not answer: {err:?}"
    );
    assert!(
        err.message.starts_with("laconic: the name store"),
        "{err:?}"
    );
    assert!(
        started.elapsed() < 3 * VIEW_LEASE,
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        common::stored(&app, "events").await.len(),
        1,
        "the refused insert was not sent"
    );

    hold.send(false).unwrap();
    let mut tries = 0;
    while let Err(e) = via.insert_one(original(2)).await {
        tries += 1;
        assert!(tries < 60, "the proxy never recovered: {e}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(
        common::by_id(&via, doc! {}).await,
        vec![original(1), original(2)]
    );
}

/// Keys of digits alone were tokenized by earlier builds, and paths missed
/// them: a filter or a projection by path found nothing, and an update by
/// path wrote the key a second time, as it is, beside its token. Running
/// `laconic migrate` again brings such a document to the form this build
/// writes: the digits as they are, each with the value written last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_migration_stores_keys_of_digits_as_they_are() {
    let (db, store_db) = (db_name("mig_digits", "app"), db_name("mig_digits", "store"));
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 6;
    config.tokenize.store_db = store_db.clone();
    let proxy = common::start(config).await;
    let via = common::via_proxy(&proxy)
        .await
        .database(&db)
        .collection::<Document>("events");
    via.insert_one(doc! {"_id": 1, "revenue": {"20240101": 150, "20231231": 100}})
        .await
        .unwrap();

    // The document as an earlier build stored it: its keys of digits as
    // tokens of the database's dictionary.
    let store = laconic::token::NameStore::new(direct.clone(), 1000, Default::default());
    store
        .allocate(&db, &["20240101", "20231231"], &[])
        .await
        .unwrap();
    let dict = store.dictionary(&db).unwrap();
    let token = |n: &str| {
        laconic::token::Names::token(&*dict, n)
            .unwrap()
            .as_str()
            .to_owned()
    };
    let revenue = token("revenue");
    let rename: Document = ["20240101", "20231231"]
        .iter()
        .map(|k| {
            (
                format!("{revenue}.{k}"),
                Bson::String(format!("{revenue}.{}", token(k))),
            )
        })
        .collect();
    direct
        .database(&db)
        .collection::<Document>("events")
        .update_one(doc! {"_id": 1}, doc! {"$rename": rename})
        .await
        .unwrap();
    // Read back whole once the proxy knows the names; missed by its path.
    let mut whole = None;
    for _ in 0..50 {
        whole = via.find_one(doc! {}).await.ok().flatten();
        if whole.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        whole,
        Some(doc! {"_id": 1, "revenue": {"20240101": 150, "20231231": 100}})
    );
    assert_eq!(
        via.find_one(doc! {"revenue.20240101": 150}).await.unwrap(),
        None
    );
    // An update by path writes the key beside its token, as it did then.
    via.update_one(doc! {"_id": 1}, doc! {"$set": {"revenue.20240101": 151}})
        .await
        .unwrap();

    let mut migrate = Command::new(env!("CARGO_BIN_EXE_laconic"));
    migrate
        .arg("migrate")
        .args(["--uri", &common::upstream().uri])
        .args(["--db", &db, "--collection", "events"])
        .args(["--tokenize-min-len", "6", "--store-db", &store_db])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    common::run_ok(migrate).await;

    let expected = doc! {"_id": 1, "revenue": {"20240101": 151, "20231231": 100}};
    assert_eq!(
        via.find_one(doc! {"revenue.20240101": 151}).await.unwrap(),
        Some(expected)
    );
    let stored = common::stored(&db, "events").await.remove(0);
    assert_eq!(
        stored
            .get_document(&revenue)
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["20240101", "20231231"],
        "{stored}"
    );
}
