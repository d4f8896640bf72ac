//! Proxies given other tokenize settings than those a collection's
//! documents are stored with refuse it: the first write through a proxy
//! records the collection's settings beside its documents, and a query
//! rewritten with other settings would miss them.

use std::process::{Command, Stdio};
use std::time::Duration;

use bson::{doc, Document};
use laconic::downstream::ProxyHandle;
use mongodb::Client;

use crate::common::{self, db_name};

/// A proxy that tokenizes names of `min_len` bytes or more.
async fn proxy_with(min_len: usize, store_db: &str) -> (ProxyHandle, Client) {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = min_len;
    config.tokenize.store_db = store_db.to_owned();
    let proxy = common::start(config).await;
    let client = common::via_proxy(&proxy).await;
    (proxy, client)
}

/// A test's database, dropped, and its name store's.
async fn fresh(test: &str) -> (String, String) {
    let (db, store_db) = (db_name(test, "app"), db_name(test, "store"));
    common::direct().await.database(&db).drop().await.unwrap();
    (db, store_db)
}

/// The error a command met: its code and message.
fn refusal<T: std::fmt::Debug>(r: mongodb::error::Result<T>) -> (i32, String) {
    let e = common::command_error(r.expect_err("refused"));
    (e.code, e.message)
}

/// The error a command meets once the proxy has read the store again
/// (its revalidation, once a second), retried for five seconds at most.
async fn until_refused<T, F>(command: impl Fn() -> F) -> (i32, String)
where
    F: std::future::IntoFuture<Output = mongodb::error::Result<T>>,
{
    for _ in 0..50 {
        if let Err(e) = command().await {
            let e = common::command_error(e);
            return (e.code, e.message);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("not refused within five seconds")
}

/// The collection's settings record, as stored.
async fn record(db: &str, coll: &str) -> Option<Document> {
    common::direct()
        .await
        .database(db)
        .collection::<Document>("__laconic")
        .find_one(doc! {"_id": format!("settings/{coll}")})
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxies_given_other_settings_refuse_the_collections_recorded_otherwise() {
    let (db, store_db) = fresh("settings").await;
    let direct = common::direct().await;
    // `region` is six bytes: the first proxy stores it as a token, the
    // second would store it (and ask for it) as it is.
    let (_p6, six) = proxy_with(6, &store_db).await;
    let (_p8, eight) = proxy_with(8, &store_db).await;
    let (_q6, also_six) = proxy_with(6, &store_db).await;
    let orders = |c: &Client| c.database(&db).collection::<Document>("orders");
    orders(&six)
        .insert_one(doc! {"_id": 1, "region": "EU", "customerName": "Ann"})
        .await
        .unwrap();
    let recorded = record(&db, "orders").await.expect("a settings record");
    assert_eq!(recorded.get_i64("min_len"), Ok(6), "{recorded}");

    // Without the record, the query through the other proxy found
    // nothing: it asked for `region` as it is. Now it is refused, naming
    // both settings, and so is a write, which would store `region` so.
    let (code, message) = refusal(orders(&eight).find_one(doc! {"region": "EU"}).await);
    assert_eq!(code, 72, "{message}");
    assert!(
        message.starts_with("laconic:")
            && message.contains(&format!("{db}.orders"))
            && message.contains("min_len = 6")
            && message.contains("min_len = 8"),
        "{message}"
    );
    let (code, message) = refusal(
        orders(&eight)
            .insert_one(doc! {"_id": 2, "region": "US"})
            .await,
    );
    assert_eq!(code, 72, "{message}");
    let (code, _) = refusal(
        orders(&eight)
            .update_one(doc! {"_id": 1}, doc! {"$set": {"region": "US"}})
            .await,
    );
    assert_eq!(code, 72);
    assert_eq!(
        direct
            .database(&db)
            .collection::<Document>("orders")
            .count_documents(doc! {})
            .await
            .unwrap(),
        1,
        "the refused write was sent"
    );
    // An aggregation of another collection that reads this one too.
    let (code, message) = refusal(
        eight
            .database(&db)
            .collection::<Document>("unrecorded")
            .aggregate(vec![doc! {"$lookup": {"from": "orders", "localField": "_id", "foreignField": "_id", "as": "o"}}])
            .await,
    );
    assert_eq!(code, 72, "{message}");
    assert!(message.contains(&format!("{db}.orders")), "{message}");

    // A proxy with the same settings reads and writes it.
    assert_eq!(
        orders(&also_six)
            .find_one(doc! {"region": "EU"})
            .await
            .unwrap(),
        Some(doc! {"_id": 1, "region": "EU", "customerName": "Ann"})
    );
    orders(&also_six)
        .insert_one(doc! {"_id": 3, "region": "APAC"})
        .await
        .unwrap();

    // A collection the other proxy writes first has its settings: the
    // first proxy is refused there.
    let returns = |c: &Client| c.database(&db).collection::<Document>("returns");
    returns(&eight)
        .insert_one(doc! {"_id": 1, "region": "EU"})
        .await
        .unwrap();
    // (once it has read the store again: within a second.)
    let returns_six = returns(&six);
    let (code, message) = until_refused(|| returns_six.find_one(doc! {"region": "EU"})).await;
    assert_eq!(code, 72, "{message}");
    assert_eq!(
        returns(&eight)
            .find_one(doc! {"region": "EU"})
            .await
            .unwrap(),
        Some(doc! {"_id": 1, "region": "EU"})
    );

    // `laconic store stats` shows each record against the settings given.
    let mut given = common::proxy_config(&common::upstream().uri).tokenize;
    given.min_len = 8;
    given.store_db = store_db.clone();
    let stats = laconic::tools::store::stats(&direct, &given.policies(), &db)
        .await
        .unwrap();
    assert!(
        stats.contains(&format!(
            "settings {db}.orders: min_len = 6, custom_paths = [], value_paths = [] (given: min_len = 8"
        )) && stats.contains(&format!("settings {db}.returns: min_len = 8, custom_paths = [], value_paths = [] (as given)")),
        "{stats}"
    );

    // A rename takes the record along: the target is the first proxy's.
    six.database("admin")
        .run_command(
            doc! {"renameCollection": format!("{db}.orders"), "to": format!("{db}.orders_2025")},
        )
        .await
        .unwrap();
    assert_eq!(record(&db, "orders").await, None);
    assert_eq!(
        record(&db, "orders_2025")
            .await
            .and_then(|r| r.get_i64("min_len").ok()),
        Some(6)
    );
    let renamed = |c: &Client| c.database(&db).collection::<Document>("orders_2025");
    let renamed_eight = renamed(&eight);
    let (code, _) = until_refused(|| renamed_eight.find_one(doc! {})).await;
    assert_eq!(code, 72);

    // A drop through a proxy removes the record: the collection may be made
    // again with other settings, once every proxy has read the store again.
    renamed(&six).drop().await.unwrap();
    assert_eq!(record(&db, "orders_2025").await, None);
    let mut written = Err(String::new());
    for _ in 0..50 {
        written = renamed(&eight)
            .insert_one(doc! {"_id": 1, "region": "EU"})
            .await
            .map_err(|e| e.to_string());
        if written.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    written.unwrap();
    assert_eq!(
        record(&db, "orders_2025")
            .await
            .and_then(|r| r.get_i64("min_len").ok()),
        Some(8)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_that_tokenizes_nothing_in_a_tokenized_database_refuses_it() {
    let (db, store_db) = fresh("settings_none").await;
    let direct = common::direct().await;
    let (_p6, six) = proxy_with(6, &store_db).await;
    six.database(&db)
        .collection::<Document>("orders")
        .insert_one(doc! {"_id": 1, "region": "EU"})
        .await
        .unwrap();
    // A proxy that tokenizes another database only (its rule for this one
    // is missing).
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.store_db = store_db.clone();
    config.tokenize.namespaces = vec![laconic::config::NamespaceTokenize {
        namespace: db_name("settings_none", "other"),
        min_len: Some(6),
        ..Default::default()
    }];
    let partial = common::start(config).await;
    let partial = common::via_proxy(&partial).await;
    // Without the check, it read the document with a token for `region`.
    let (code, message) = refusal(
        partial
            .database(&db)
            .collection::<Document>("orders")
            .find_one(doc! {})
            .await,
    );
    assert_eq!(code, 72, "{message}");
    assert!(
        message.contains(&format!("the database {db} holds a dictionary")),
        "{message}"
    );
    // A database nobody tokenizes is served.
    let plain = db_name("settings_none", "plain");
    direct.database(&plain).drop().await.unwrap();
    let c = partial.database(&plain).collection::<Document>("c");
    c.insert_one(doc! {"_id": 1, "region": "EU"}).await.unwrap();
    assert_eq!(
        c.find_one(doc! {}).await.unwrap(),
        Some(doc! {"_id": 1, "region": "EU"})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_settings_record_refuses_its_collection() {
    let (db, store_db) = fresh("settings_edit").await;
    let direct = common::direct().await;
    let (_p, six) = proxy_with(6, &store_db).await;
    let orders = six.database(&db).collection::<Document>("orders");
    orders
        .insert_one(doc! {"_id": 1, "region": "EU"})
        .await
        .unwrap();
    direct
        .database(&db)
        .collection::<Document>("__laconic")
        .update_one(
            doc! {"_id": "settings/orders"},
            doc! {"$set": {"min_len": "six"}},
        )
        .await
        .unwrap();
    let (code, message) = until_refused(|| orders.find_one(doc! {"region": "EU"})).await;
    assert_eq!(code, 72, "{message}");
    assert!(message.contains("changed outside Laconic"), "{message}");
}

fn migrate(db: &str, store_db: &str, min_len: &str, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_laconic"));
    c.arg("migrate")
        .args(["--uri", &common::upstream().uri])
        .args(["--db", db, "--collection", "orders"])
        .args(["--tokenize-min-len", min_len, "--store-db", store_db])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_change_by_a_migration_back_and_forth() {
    let (db, store_db) = fresh("settings_mig").await;
    let (_p6, six) = proxy_with(6, &store_db).await;
    let (_p8, eight) = proxy_with(8, &store_db).await;
    let orders = |c: &Client| c.database(&db).collection::<Document>("orders");
    orders(&six)
        .insert_many(vec![
            doc! {"_id": 1, "region": "EU", "customerName": "Ann"},
            doc! {"_id": 2, "region": "US", "customerName": "Bob"},
        ])
        .await
        .unwrap();

    // A migration into tokens with other settings is refused before it
    // changes anything: documents stored with the recorded ones would be
    // in a form no proxy matches while it runs.
    let out = migrate(&db, &store_db, "8", &[]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("other tokenize settings") && stderr.contains("--reverse"),
        "{stderr}"
    );
    assert_eq!(
        record(&db, "orders")
            .await
            .and_then(|r| r.get_i64("min_len").ok()),
        Some(6)
    );

    // Back to full names (no settings needed), then into tokens with the
    // new ones: the record follows, and so do the proxies.
    common::run_ok(migrate(&db, &store_db, "0", &["--reverse"])).await;
    assert_eq!(record(&db, "orders").await, None);
    common::run_ok(migrate(&db, &store_db, "8", &[])).await;
    assert_eq!(
        record(&db, "orders")
            .await
            .and_then(|r| r.get_i64("min_len").ok()),
        Some(8)
    );
    let mut served = None;
    for _ in 0..50 {
        if let Ok(found) = orders(&eight).find_one(doc! {"region": "EU"}).await {
            served = Some(found);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        served,
        Some(Some(doc! {"_id": 1, "region": "EU", "customerName": "Ann"}))
    );
    let (code, message) = refusal(orders(&six).find_one(doc! {"region": "EU"}).await);
    assert_eq!(code, 72, "{message}");
}
