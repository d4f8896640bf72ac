//! `laconic migrate` on a collection while an application keeps working
//! through the proxy: killed partway, resumed, then reversed.
//!
//! 2,000 documents by default: SecantusDB's Python server rewrites a few
//! hundred documents a second, and about 100 once a collection holds tens
//! of thousands, so 50,000 would take the suite past its time budget. Against a real mongod
//! (`LACONIC_TEST_UPSTREAM`) set `LACONIC_MIGRATE_DOCS=50000`.

use std::process::{Command, Stdio};
use std::time::Duration;

use bson::{doc, Document, RawDocumentBuf};
use futures::TryStreamExt;
use mongodb::Collection;

use crate::common::{self, db_name};

fn docs() -> i32 {
    std::env::var("LACONIC_MIGRATE_DOCS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000)
}

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
    let out = migrate_command(&["--dry-run"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("would migrate") && said.contains("would rebuild index customer_name_1"),
        "{said}"
    );
    assert_eq!(
        raw_all(&direct.database(&app).collection("events")).await,
        before
    );

    // The application, through the proxy: a writer of new documents and a
    // reader of old ones, all through the migration.
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 6;
    config.tokenize.custom_paths = vec!["custom".into()];
    config.tokenize.store_db = db_name("mig", "store");
    let proxy = common::start(config).await;
    let via: Collection<Document> = common::via_proxy(&proxy)
        .await
        .database(&app)
        .collection("events");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (via, stop) = (via.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                via.insert_one(original(docs_total + 1000 + n))
                    .await
                    .unwrap();
                n += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            n
        })
    };
    let reader = {
        let (via, stop) = (via.clone(), stop.clone());
        tokio::spawn(async move {
            let mut reads = 0;
            let mut i = 7;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                i = (i * 7919 + 13) % docs_total;
                let got = via.find_one(doc! {"_id": i}).await.unwrap();
                assert_eq!(
                    got,
                    Some(original(i)),
                    "document {i} read through the proxy mid-migration"
                );
                reads += 1;
            }
            reads
        })
    };

    // Start, kill it halfway, resume.
    let state: Collection<Document> = direct
        .database(&db_name("mig", "store"))
        .collection("migrations");
    let mut child = migrate_command(&[]).spawn().unwrap();
    let id = format!("{app}.events");
    let mut progressed = false;
    for _ in 0..3000 {
        let s = state.find_one(doc! {"_id": &id}).await.unwrap();
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
            state.find_one(doc! {"_id": &id}).await.unwrap(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    child.kill().unwrap();
    let _ = child.wait();
    let halfway = state.find_one(doc! {"_id": &id}).await.unwrap().unwrap();
    assert!(!halfway.get_bool("done").unwrap());
    // Partly migrated: queries on tokenized names match both forms, and
    // operator updates are paused with a clear error.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for i in [0, docs_total - 1] {
        let filter = doc! {"customer_name": format!("customer {i}"), "custom.Loyalty Tier": i % 4};
        assert_eq!(
            via.count_documents(filter.clone()).await.unwrap(),
            1,
            "document {i}"
        );
        assert_eq!(via.find_one(filter).await.unwrap(), Some(original(i)));
    }
    let err = via
        .update_one(doc! {"_id": 1}, doc! {"$set": {"event_type": "changed"}})
        .await
        .unwrap_err();
    let mongodb::error::ErrorKind::Command(e) = *err.kind else {
        panic!("{err}")
    };
    assert_eq!(e.code, 115);
    assert!(
        e.message.contains("paused until it finishes"),
        "{}",
        e.message
    );
    let out = tokio::task::spawn_blocking(|| migrate_command(&[]).output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("indexes rebuilt: customer_name_1"), "{said}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let written = writer.await.unwrap();
    let reads = reader.await.unwrap();
    assert!(written > 0 && reads > 0);

    // Every document exactly once, reading back as written, stored with tokens.
    let expected: Vec<Document> = (0..docs_total)
        .chain(docs_total + 1000..docs_total + 1000 + written)
        .map(original)
        .collect();
    let got: Vec<Document> = via
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "documents differ after the migration");
    let raw = common::stored(&app, "events").await;
    assert!(raw
        .iter()
        .all(|d| !d.contains_key("customer_name") && !d.contains_key("custom")));
    // Queries on tokenized names find the migrated documents, using the rebuilt index.
    assert_eq!(
        via.count_documents(doc! {"customer_name": "customer 123"})
            .await
            .unwrap(),
        1
    );
    let rebuilt = index_key(&direct.database(&app), "customer_name_1").await;
    assert!(!rebuilt.contains_key("customer_name"), "{rebuilt}");

    // And back out: the original bytes, exactly.
    let out = tokio::task::spawn_blocking(|| migrate_command(&["--reverse"]).output().unwrap())
        .await
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let after = raw_all(&direct.database(&app).collection("events")).await;
    assert_eq!(after.len(), before.len() + written as usize);
    assert!(
        after[..before.len()] == before[..],
        "the reversed documents differ from the originals"
    );
    assert_eq!(
        index_key(&direct.database(&app), "customer_name_1").await,
        doc! {"customer_name": 1}
    );
}
