//! The dictionary is the data: whatever happens to a database's dictionary
//! (dropped, restored from an older copy, edited by hand, replaced, lost
//! with the data), no document is ever read back under a name other than the
//! one it was written with. Each scenario runs with a warm proxy (it read the
//! dictionary before) and a fresh one (it never did).

use std::time::{Duration, Instant};

use bson::{doc, Document};
use laconic::downstream::ProxyHandle;
use laconic::tools::store as tool;
use mongodb::Collection;

use crate::common::{self, db_name};

async fn tokenizing(upstream: &str) -> ProxyHandle {
    let mut config = common::proxy_config(upstream);
    config.tokenize.min_len = 4;
    common::start(config).await
}

async fn coll(proxy: &ProxyHandle, db: &str) -> Collection<Document> {
    common::via_proxy(proxy).await.database(db).collection("c")
}

/// The error code and message of a command error.
fn code_of(e: &mongodb::error::Error) -> (i32, String) {
    match &*e.kind {
        mongodb::error::ErrorKind::Command(c) => (c.code, c.message.clone()),
        other => panic!("not a command error: {other:?}"),
    }
}

/// Retries `f` for up to five seconds (a proxy re-reads its dictionaries
/// every second) until it returns `Some`.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        if let Some(t) = f().await {
            return t;
        }
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until a read through `c` is refused as `kind` says, and checks
/// that writes are refused too.
async fn refused(c: &Collection<Document>, text: &str) {
    let msg = eventually(text, || async {
        match c.find_one(doc! {}).await {
            Err(e) => {
                let (code, msg) = code_of(&e);
                assert_eq!(code, 301, "{msg}");
                msg.contains(text).then_some(msg)
            }
            Ok(_) => None,
        }
    })
    .await;
    assert!(msg.starts_with("laconic: "), "{msg}");
    let (code, msg) = code_of(&c.insert_one(doc! {"brand_new_field": 1}).await.unwrap_err());
    assert_eq!(code, 301, "{msg}");
}

/// Waits until `c` reads `expected` (documents in `_id` order).
async fn reads(c: &Collection<Document>, expected: &[Document]) {
    eventually("reads to come back right", || async {
        match common::by_id_checked(c, doc! {}).await {
            Ok(docs) if docs == expected => Some(()),
            _ => None,
        }
    })
    .await;
}

async fn stored_count(db: &str) -> u64 {
    common::direct()
        .await
        .database(db)
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .unwrap()
}

#[tokio::test]
async fn a_dropped_dictionary_is_refused_by_warm_and_fresh_proxies_until_it_is_imported() {
    let db = db_name("dict_drop", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let warm = tokenizing(&common::upstream().uri).await;
    let a = coll(&warm, &db).await;
    let first = doc! {"_id": 1, "alpha_field": 1};
    a.insert_one(first.clone()).await.unwrap();
    let export = tool::export(&direct, &db).await.unwrap();

    direct
        .database(&db)
        .collection::<Document>("__laconic")
        .drop()
        .await
        .unwrap();

    let fresh = tokenizing(&common::upstream().uri).await;
    let b = coll(&fresh, &db).await;
    refused(&b, "is gone while the database still holds documents").await;
    refused(&a, "is gone while the database still holds documents").await;
    assert_eq!(stored_count(&db).await, 1, "nothing was written meanwhile");

    // The operator puts it back: both proxies read right, without a restart.
    tool::import(&direct, &db, &export).await.unwrap();
    reads(&a, std::slice::from_ref(&first)).await;
    reads(&b, std::slice::from_ref(&first)).await;
    b.insert_one(doc! {"_id": 2, "beta_field": 2})
        .await
        .unwrap();
    reads(&a, &[first, doc! {"_id": 2, "beta_field": 2}]).await;
}

#[tokio::test]
async fn a_dictionary_restored_from_an_older_copy_is_refused_until_the_newer_one_is_back() {
    let db = db_name("dict_rewind", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let warm = tokenizing(&common::upstream().uri).await;
    let a = coll(&warm, &db).await;
    let docs = [
        doc! {"_id": 1, "alpha_field": 1},
        doc! {"_id": 2, "beta_field": 2},
    ];
    a.insert_one(docs[0].clone()).await.unwrap();
    let older = tool::export(&direct, &db).await.unwrap();
    a.insert_one(docs[1].clone()).await.unwrap();
    let newer = tool::export(&direct, &db).await.unwrap();

    // An older copy of the dictionary alone (what a restore of an old
    // backup of it, or a dump taken before the data, gives).
    let dict = direct.database(&db).collection::<Document>("__laconic");
    dict.drop().await.unwrap();
    tool::import(&direct, &db, &older).await.unwrap();

    let fresh = tokenizing(&common::upstream().uri).await;
    let b = coll(&fresh, &db).await;
    refused(&a, "went back in time").await;
    refused(&b, "went back in time").await;

    // Importing the older copy again over the newer is refused; the newer
    // one brings both back.
    tool::import(&direct, &db, &newer).await.unwrap();
    assert!(tool::import(&direct, &db, &older).await.is_err());
    reads(&a, &docs).await;
    reads(&b, &docs).await;
}

#[tokio::test]
async fn a_dictionary_edited_by_hand_is_refused() {
    let db = db_name("dict_edit", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let warm = tokenizing(&common::upstream().uri).await;
    let a = coll(&warm, &db).await;
    let first = doc! {"_id": 1, "first_name": "Ann", "last_name": "Lee"};
    a.insert_one(first.clone()).await.unwrap();
    let export = tool::export(&direct, &db).await.unwrap();
    let dict = direct.database(&db).collection::<Document>("__laconic");

    dict.update_one(
        doc! {"chain": "names"},
        doc! {"$set": {"names.0": "hijacked"}},
    )
    .await
    .unwrap();
    let fresh = tokenizing(&common::upstream().uri).await;
    let b = coll(&fresh, &db).await;
    refused(&a, "was changed outside Laconic").await;
    refused(&b, "was changed outside Laconic").await;

    // Emptied by hand: the mark beside the data still says it existed.
    dict.delete_many(doc! {}).await.unwrap();
    refused(&a, "is gone while the database still holds documents").await;
    refused(&b, "is gone while the database still holds documents").await;

    dict.drop().await.unwrap();
    tool::import(&direct, &db, &export).await.unwrap();
    reads(&a, std::slice::from_ref(&first)).await;
    reads(&b, std::slice::from_ref(&first)).await;
}

#[tokio::test]
async fn data_restored_without_its_dictionary_is_never_read_under_other_names() {
    let (src, dst) = (
        db_name("dict_nostore", "src"),
        db_name("dict_nostore", "dst"),
    );
    let direct = common::direct().await;
    for d in [&src, &dst] {
        direct.database(d).drop().await.unwrap();
    }
    let proxy = tokenizing(&common::upstream().uri).await;
    coll(&proxy, &src)
        .await
        .insert_one(doc! {"_id": 1, "alpha_field": 1})
        .await
        .unwrap();
    // The data collection alone, restored into another database.
    let stored = common::stored(&src, "c").await;
    direct
        .database(&dst)
        .collection::<Document>("c")
        .insert_many(stored)
        .await
        .unwrap();
    let fresh = tokenizing(&common::upstream().uri).await;
    for p in [&proxy, &fresh] {
        let c = coll(p, &dst).await;
        refused(&c, "holds documents but no dictionary").await;
    }
    // A new name is not given the token the stored documents already use.
    assert_eq!(stored_count(&dst).await, 1);
    // Adopting it is refused while its documents hold tokens.
    let err = tool::init(&direct, &dst, 1000, false).await.unwrap_err();
    assert!(err.to_string().contains("read as tokens"), "{err}");
}

#[tokio::test]
async fn a_database_dropped_with_its_dictionary_is_forgotten_and_served_afresh() {
    let db = db_name("dict_dropdb", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let warm = tokenizing(&common::upstream().uri).await;
    let a = coll(&warm, &db).await;
    a.insert_one(doc! {"_id": 1, "alpha_field": 1})
        .await
        .unwrap();
    direct.database(&db).drop().await.unwrap();

    // Another proxy writes first into the new, empty database...
    let fresh = tokenizing(&common::upstream().uri).await;
    let b = coll(&fresh, &db).await;
    b.insert_one(doc! {"_id": 2, "gamma_field": 2})
        .await
        .unwrap();
    // ...and the warm proxy drops what it knew and reads the new dictionary.
    reads(&a, &[doc! {"_id": 2, "gamma_field": 2}]).await;
    a.insert_one(doc! {"_id": 3, "alpha_field": 3, "delta_field": 3})
        .await
        .unwrap();
    let expected = [
        doc! {"_id": 2, "gamma_field": 2},
        doc! {"_id": 3, "alpha_field": 3, "delta_field": 3},
    ];
    reads(&a, &expected).await;
    reads(&b, &expected).await;
}

/// Drops `db` through `proxy`.
async fn drop_through(proxy: &ProxyHandle, db: &str) {
    let client = common::via_proxy(proxy).await;
    client.database(db).drop().await.unwrap();
}

/// Every document `c` reads is one of `written`, under the names it was
/// written with; a refused read is allowed (it is not a wrong name).
async fn never_misread(c: &Collection<Document>, written: &[Document], who: &str) {
    if let Ok(docs) = common::by_id_checked(c, doc! {}).await {
        for d in docs {
            assert!(written.contains(&d), "{who} read {d:?}, never written");
        }
    }
}

/// A database dropped through one proxy is written again at once, while
/// another proxy that has not read the store since the drop (its watcher
/// is stalled) reads and writes it with the dropped dictionary, whose
/// tokens the new one gives to other names. No document is ever read back
/// under other names: the new dictionary settles before it is used (the
/// first proxy's write waits), the stale proxy's document is found then,
/// and the database is refused until it is dropped again; after that it
/// is written afresh. Before the settling, the stale proxy read the new
/// document as `alpha_field` and the new dictionary read the stale
/// proxy's as `zeta_field`, for good.
#[tokio::test]
async fn a_proxy_that_missed_a_drop_neither_misreads_nor_mislabels() {
    let db = db_name("missed_drop", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let uri = &common::upstream().uri;
    let pa = tokenizing(uri).await;
    let mut stalled = common::proxy_config(uri);
    stalled.tokenize.min_len = 4;
    stalled.tokenize.revalidate_ms = 3_600_000; // not within this test
    let pb = common::start(stalled).await;
    let (a, b) = (coll(&pa, &db).await, coll(&pb, &db).await);
    let first = doc! {"_id": "first", "alpha_field": 1};
    b.insert_one(first.clone()).await.unwrap();
    reads(&a, std::slice::from_ref(&first)).await;
    drop_through(&pa, &db).await;

    let written = [
        doc! {"_id": "a", "zeta_field": 1},
        doc! {"_id": "b", "alpha_field": 2},
    ];
    let began = Instant::now();
    let a_writes = tokio::spawn({
        let (a, d) = (a.clone(), written[0].clone());
        async move { a.insert_one(d).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The stale proxy still holds the dropped dictionary, within its lease.
    b.insert_one(written[1].clone()).await.unwrap();
    never_misread(&b, &written, "the stale proxy").await;
    let a_wrote = a_writes.await.unwrap().unwrap_err();
    assert!(
        began.elapsed() >= Duration::from_secs(14),
        "the new dictionary was used before it settled: {:?}",
        began.elapsed()
    );
    let (code, msg) = code_of(&a_wrote);
    assert_eq!(code, 301, "{msg}");
    assert!(msg.contains("before its new dictionary settled"), "{msg}");
    for (c, who) in [(&a, "the first proxy"), (&b, "the stale proxy")] {
        never_misread(c, &written, who).await;
    }
    refused(&a, "before its new dictionary settled").await;
    refused(&b, "before its new dictionary settled").await;
    assert_eq!(
        stored_count(&db).await,
        1,
        "the stale proxy's document alone"
    );

    // Dropped again, it is written afresh once its next dictionary settles.
    direct.database(&db).drop().await.unwrap();
    reads(&a, &[]).await;
    a.insert_one(written[0].clone()).await.unwrap();
    reads(&a, &written[..1]).await;
    let fresh = tokenizing(uri).await;
    reads(&coll(&fresh, &db).await, &written[..1]).await;
}

#[tokio::test]
async fn a_database_dropped_through_the_proxy_is_written_afresh_once_its_dictionary_settles() {
    let db = db_name("dict_dropvia", "app");
    common::direct().await.database(&db).drop().await.unwrap();
    let proxy = tokenizing(&common::upstream().uri).await;
    let c = coll(&proxy, &db).await;
    c.insert_one(doc! {"_id": 1, "alpha_field": 1})
        .await
        .unwrap();
    // Dropped, then written at once with a name the old dictionary had:
    // the write waits until the new dictionary settles (the database had
    // one before), and the new document gets a token of the new one.
    drop_through(&proxy, &db).await;
    let began = Instant::now();
    c.insert_one(doc! {"_id": 2, "alpha_field": 2, "beta_field": 2})
        .await
        .unwrap();
    assert!(
        began.elapsed() >= Duration::from_secs(14),
        "{:?}",
        began.elapsed()
    );
    let expected = [doc! {"_id": 2, "alpha_field": 2, "beta_field": 2}];
    reads(&c, &expected).await;
    // Still readable after the proxies' next revalidation.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    reads(&c, &expected).await;
    let fresh = tokenizing(&common::upstream().uri).await;
    reads(&coll(&fresh, &db).await, &expected).await;
}

#[tokio::test]
async fn a_server_wiped_under_a_running_proxy_is_served_on_with_a_new_dictionary() {
    // A server of this test's own, in memory, restarted on the same port.
    let first = common::launch(&["--storage", ":memory:"]);
    let port = first.port();
    let uri = first.uri.clone();
    let proxy = tokenizing(&uri).await;
    let c = coll(&proxy, "wiped").await;
    c.insert_one(doc! {"_id": 1, "alpha_field": 1})
        .await
        .unwrap();
    first.stop();
    drop(first);
    let _second = common::launch(&["--storage", ":memory:", "--port", &port.to_string()]);

    // The proxy notices the empty server and starts afresh: no error to
    // the client once its driver has reconnected.
    let second_doc = doc! {"_id": 2, "beta_field": 2, "alpha_field": 2};
    eventually("a write after the restart", || async {
        c.insert_one(second_doc.clone()).await.ok()
    })
    .await;
    reads(&c, std::slice::from_ref(&second_doc)).await;
    let fresh = tokenizing(&uri).await;
    reads(&coll(&fresh, "wiped").await, &[second_doc]).await;
}

#[tokio::test]
async fn clients_cannot_write_the_dictionary_through_the_proxy() {
    let db = db_name("dict_guard", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let proxy = tokenizing(&common::upstream().uri).await;
    let client = common::via_proxy(&proxy).await;
    client
        .database(&db)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1, "first_name": "Ann"})
        .await
        .unwrap();
    let dict = client.database(&db).collection::<Document>("__laconic");
    // Reading it stays allowed, for diagnosis.
    assert!(dict
        .find_one(doc! {"_id": "dictionary"})
        .await
        .unwrap()
        .is_some());

    let attempts: Vec<(&str, Document)> = vec![
        (
            "insert",
            doc! {"insert": "__laconic", "documents": [{"x": 1}]},
        ),
        (
            "update",
            doc! {"update": "__laconic", "updates": [{"q": {}, "u": {"$set": {"names.0": "hijacked"}}}]},
        ),
        (
            "delete",
            doc! {"delete": "__laconic", "deletes": [{"q": {}, "limit": 0}]},
        ),
        (
            "findAndModify",
            doc! {"findAndModify": "__laconic_mark", "query": {}, "remove": true},
        ),
        ("drop", doc! {"drop": "__laconic"}),
        (
            "createIndexes",
            doc! {"createIndexes": "__laconic", "indexes": [{"key": {"x": 1}, "name": "x_1"}]},
        ),
        (
            "insert",
            doc! {"insert": "__laconic", "documents": [{"_id": "migration/c", "direction": "reverse", "done": true}]},
        ),
        (
            "aggregate",
            doc! {"aggregate": "c", "pipeline": [{"$out": "__laconic"}], "cursor": {}},
        ),
        (
            "aggregate",
            doc! {"aggregate": "c", "pipeline": [{"$merge": {"into": "__laconic_mark"}}], "cursor": {}},
        ),
    ];
    for (name, cmd) in attempts {
        let e = client
            .database(&db)
            .run_command(cmd.clone())
            .await
            .unwrap_err();
        let (code, msg) = code_of(&e);
        assert_eq!(code, 13, "{name}: {msg}");
        assert!(
            msg.contains("__laconic") && msg.contains("written only by"),
            "{msg}"
        );
    }
    let admin = client.database("admin");
    for cmd in [
        doc! {"renameCollection": format!("{db}.__laconic"), "to": format!("{db}.x")},
        doc! {"renameCollection": format!("{db}.c"), "to": format!("{db}.__laconic_mark"), "dropTarget": true},
        doc! {"bulkWrite": 1, "ops": [{"delete": 0, "filter": {}, "multi": true}], "nsInfo": [{"ns": format!("{db}.__laconic")}]},
    ] {
        let (code, msg) = code_of(&admin.run_command(cmd).await.unwrap_err());
        assert_eq!(code, 13, "{msg}");
    }
    // Untouched.
    assert_eq!(
        common::stored(&db, "c").await.len(),
        1,
        "the data is as it was"
    );
    let names = direct
        .database(&db)
        .collection::<Document>("__laconic")
        .find_one(doc! {"chain": "names"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        names.get_array("names").unwrap(),
        &vec![bson::Bson::from("first_name")]
    );
}

#[tokio::test]
async fn keys_that_predate_laconic_and_look_like_tokens_are_never_read_as_tokens() {
    let db = db_name("dict_ctrl", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let odd = "\u{2}odd key";
    direct
        .database(&db)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1, odd: 1, "plain_name": 2})
        .await
        .unwrap();
    // Through a proxy: refused, not read as a token of a new dictionary.
    let proxy = tokenizing(&common::upstream().uri).await;
    let c = coll(&proxy, &db).await;
    refused(&c, "holds documents but no dictionary").await;
    // Adopting the database as it is would read the key as a token: refused.
    let mut init = std::process::Command::new(env!("CARGO_BIN_EXE_laconic"));
    init.args(["store", "init", "--uri", &common::upstream().uri, &db]);
    let out = init.output().unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("hold keys that read as tokens"), "{said}");
    // So would a migration: it names the document and refuses.
    let migrate = || {
        let mut m = std::process::Command::new(env!("CARGO_BIN_EXE_laconic"));
        m.args(["migrate", "--uri", &common::upstream().uri]).args([
            "--db",
            &db,
            "--collection",
            "c",
            "--tokenize-min-len",
            "4",
        ]);
        m
    };
    let out = migrate().output().unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("begin with a control byte: rename them first"),
        "{said}"
    );
    // Renamed, the collection migrates and reads back under its names.
    direct
        .database(&db)
        .collection::<Document>("c")
        .update_one(doc! {"_id": 1}, doc! {"$rename": {odd: "odd key"}})
        .await
        .unwrap();
    common::run_ok(migrate()).await;
    reads(&c, &[doc! {"_id": 1, "plain_name": 2, "odd key": 1}]).await;
}

/// A database whose first documents, written through the proxy, hold only
/// names too short to tokenize gets its dictionary with them: a later
/// document with a long name is stored, not refused as data that predates
/// Laconic. A database written around the proxy first is still refused.
#[tokio::test]
async fn a_database_first_written_without_tokens_takes_long_names_later() {
    let db = db_name("dict_short", "app");
    common::direct().await.database(&db).drop().await.unwrap();
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 8;
    let proxy = common::start(config).await;
    let c = coll(&proxy, &db).await;
    c.insert_one(doc! {"_id": 1, "a": 1}).await.unwrap();
    c.insert_one(doc! {"_id": 2, "a_much_longer_name": 2})
        .await
        .unwrap();
    reads(
        &c,
        &[
            doc! {"_id": 1, "a": 1},
            doc! {"_id": 2, "a_much_longer_name": 2},
        ],
    )
    .await;
    let stored = &common::stored(&db, "c").await[1];
    assert!(!stored.contains_key("a_much_longer_name"), "{stored}");
    // Written around the proxy first: refused until adopted, as before.
    let other = db_name("dict_short", "around");
    let direct = common::direct().await;
    direct.database(&other).drop().await.unwrap();
    direct
        .database(&other)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1, "a": 1})
        .await
        .unwrap();
    let c = coll(&proxy, &other).await;
    let (code, msg) = code_of(
        &c.insert_one(doc! {"_id": 2, "a_much_longer_name": 2})
            .await
            .unwrap_err(),
    );
    assert_eq!(code, 301, "{msg}");
    assert!(msg.contains("holds documents but no dictionary"), "{msg}");
    // Dropped through the proxy (allowed while refused), it starts afresh.
    common::via_proxy(&proxy)
        .await
        .database(&other)
        .drop()
        .await
        .unwrap();
    c.insert_one(doc! {"_id": 3, "a_much_longer_name": 3})
        .await
        .unwrap();
    reads(&c, &[doc! {"_id": 3, "a_much_longer_name": 3}]).await;
}

/// The upstream's cluster time now, as a command on `db` reports it
/// (`None` from a standalone server, which has no change streams).
async fn cluster_time(db: &str) -> Option<bson::Timestamp> {
    let reply = common::direct()
        .await
        .database(db)
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    reply.get_timestamp("operationTime").ok()
}

/// The full document of the first event of a stream opened so, or the
/// error it gave (on opening, or for its first batch).
async fn first_event(
    opened: mongodb::error::Result<
        mongodb::change_stream::ChangeStream<
            mongodb::change_stream::event::ChangeStreamEvent<Document>,
        >,
    >,
) -> mongodb::error::Result<Option<Document>> {
    use futures::StreamExt;
    let next = match opened {
        Ok(mut stream) => tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("an answer within 20 s")
            .expect("the stream goes on"),
        Err(e) => Err(e),
    };
    next.map(|event| event.full_document)
}

/// Asserts that a stream's event of `db` was refused as older than the
/// dictionary `db` is read with (301).
fn refused_as_older(read: mongodb::error::Result<Option<Document>>, db: &str) {
    let e = match read {
        Ok(d) => panic!("an event older than the dictionary was read: {d:?}"),
        Err(e) => e,
    };
    let (code, msg) = code_of(&e);
    assert_eq!(code, 301, "{msg}");
    assert!(
        msg.starts_with(&format!("laconic: a change event of {db} is older than")),
        "{msg}"
    );
}

/// `db` written through a fresh proxy (`{_id: 1, customerName: "Ann"}`),
/// then dropped through it: the proxy, its collection, and the upstream's
/// cluster time before the write (`None` from a standalone server, which
/// has no change streams).
async fn written_then_dropped(
    db: &str,
) -> Option<(ProxyHandle, Collection<Document>, bson::Timestamp)> {
    common::direct().await.database(db).drop().await.unwrap();
    let proxy = tokenizing(&common::upstream().uri).await;
    let c = coll(&proxy, db).await;
    let start = cluster_time(db).await?;
    c.insert_one(doc! {"_id": 1, "customerName": "Ann"})
        .await
        .unwrap();
    drop_through(&proxy, db).await;
    Some((proxy, c, start))
}

/// A change stream started from before a database was dropped replays
/// the events of the dropped dictionary's documents, whose tokens the
/// new dictionary gives to other names: such an event is refused (301,
/// naming the database and when its dictionary began), never read with
/// the new dictionary, by a collection's stream and a cluster-wide one
/// alike. A stream started after the new dictionary began reads its
/// events as written. (Before, `{customerName: "Ann"}` came back
/// `{anotherName: "Ann"}`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_events_older_than_the_dictionary_are_never_read_with_it() {
    let db = db_name("dict_oldevents", "app");
    let direct = common::direct().await;
    let Some((proxy, c, start)) = written_then_dropped(&db).await else {
        return;
    };
    // The new dictionary (once it settles) gives its first token to
    // another name.
    c.insert_one(doc! {"_id": 2, "anotherName": "Bob"})
        .await
        .unwrap();
    let client = common::via_proxy(&proxy).await;
    let cluster = || {
        client
            .watch()
            .pipeline(vec![doc! {"$match": {"ns.db": &db}}])
    };
    refused_as_older(
        first_event(c.watch().start_at_operation_time(start).await).await,
        &db,
    );
    refused_as_older(
        first_event(cluster().start_at_operation_time(start).await).await,
        &db,
    );
    // From when the new dictionary began: its document, as written.
    let head = direct
        .database(&db)
        .collection::<Document>("__laconic")
        .find_one(doc! {"_id": "dictionary"})
        .await
        .unwrap()
        .expect("the new dictionary's head");
    let since = head.get_timestamp("since").expect("when it began");
    let after = bson::Timestamp {
        time: since.time,
        increment: since.increment + 1,
    };
    let bob = Some(doc! {"_id": 2, "anotherName": "Bob"});
    let read = first_event(c.watch().start_at_operation_time(after).await).await;
    assert_eq!(read.unwrap(), bob);
    let read = first_event(cluster().start_at_operation_time(after).await).await;
    assert_eq!(read.unwrap(), bob);
}

/// The same, where the dictionary a database is read with now is an older
/// one restored from a backup, after the database had another dictionary
/// for a while: the events of that while hold the other dictionary's
/// tokens, and the restored head says it began long before them. A
/// dictionary is dated by the name store's record of the database, which
/// outlives its drops: one that replaces another there began, for change
/// events, when a proxy first read it. (Before, a stream started before
/// the other dictionary's documents read `{anotherName: "Bob"}` as
/// `{customerName: "Bob"}`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_events_of_a_dictionary_replaced_by_a_restored_one_are_refused() {
    let db = db_name("dict_restoredev", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let proxy = tokenizing(&common::upstream().uri).await;
    let c = coll(&proxy, &db).await;
    c.insert_one(doc! {"_id": 1, "customerName": "Ann"})
        .await
        .unwrap();
    // A backup of the database: its documents, dictionary and mark.
    let mut backup = Vec::new();
    for name in ["c", "__laconic", "__laconic_mark"] {
        let docs = common::stored(&db, name).await;
        backup.push((name, docs));
    }
    drop_through(&proxy, &db).await;
    let Some(start) = cluster_time(&db).await else {
        return;
    };
    // Another dictionary for a while, whose first token is another name's.
    c.insert_one(doc! {"_id": 2, "anotherName": "Bob"})
        .await
        .unwrap();
    // Then the backup comes back, straight to the server.
    direct.database(&db).drop().await.unwrap();
    for (name, docs) in backup {
        direct
            .database(&db)
            .collection::<Document>(name)
            .insert_many(docs)
            .await
            .unwrap();
    }
    reads(&c, &[doc! {"_id": 1, "customerName": "Ann"}]).await;
    let read = first_event(c.watch().start_at_operation_time(start).await).await;
    refused_as_older(read, &db);
}

/// An aggregation without an output writes nothing: on a tokenized
/// database that has no dictionary it makes none (on a database dropped
/// before, that one would settle for 15 s first, and the read wait for
/// it). One that ends in `$out` stores documents, and makes it.
#[tokio::test]
async fn only_an_aggregation_with_an_output_makes_a_dictionary() {
    use futures::TryStreamExt;
    let db = db_name("dict_aggread", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let proxy = tokenizing(&common::upstream().uri).await;
    let c = coll(&proxy, &db).await;
    let head = || async {
        direct
            .database(&db)
            .collection::<Document>("__laconic")
            .find_one(doc! {"_id": "dictionary"})
            .await
            .unwrap()
    };
    let read: Vec<Document> = c
        .aggregate(vec![doc! {"$match": {"customerName": "Ann"}}])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(read.is_empty());
    assert_eq!(head().await, None, "a read made a dictionary");
    c.aggregate(vec![doc! {"$match": {}}, doc! {"$out": "o"}])
        .await
        .unwrap()
        .try_collect::<Vec<Document>>()
        .await
        .unwrap();
    assert!(head().await.is_some(), "an $out made no dictionary");
}

/// A stream started before a database was dropped, read while the
/// database has no dictionary at all (nothing was written since, and a
/// read makes none): its events hold the dropped dictionary's tokens,
/// which nothing can read now. Refused (301), saying so, not as tokens a
/// dictionary lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_events_of_a_dropped_database_without_a_dictionary_are_refused() {
    let db = db_name("dict_goneevents", "app");
    let Some((_proxy, c, start)) = written_then_dropped(&db).await else {
        return;
    };
    let e = match first_event(c.watch().start_at_operation_time(start).await).await {
        Ok(d) => panic!("an event of a dropped dictionary was read: {d:?}"),
        Err(e) => e,
    };
    let (code, msg) = code_of(&e);
    assert_eq!(code, 301, "{msg}");
    assert!(
        msg.starts_with(&format!(
            "laconic: a change event of {db} holds names of a dictionary that is gone"
        )),
        "{msg}"
    );
}
