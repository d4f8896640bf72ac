//! Work that spans databases: a client bulkWrite across tokenized databases
//! (each with its own dictionary), and stages that read or write another
//! database when the two share a dictionary
//! (`[[proxy.tokenize.dictionaries]]`), compared with an untokenized twin.

use bson::{doc, Document};
use futures::{StreamExt, TryStreamExt};
use laconic::config::DictionaryGroup;
use mongodb::options::{
    DeleteOneModel, InsertOneModel, UpdateManyModel, UpdateOneModel, WriteModel,
};
use mongodb::Namespace;

use crate::common::{self, db_name};

async fn proxy_with(groups: Vec<DictionaryGroup>) -> laconic::downstream::ProxyHandle {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.tokenize.custom_paths = vec!["custom".into()];
    config.tokenize.dictionaries = groups;
    common::start(config).await
}

/// A group of two databases (`<test>_a`, `<test>_b`) kept in `<test>`'s
/// home, the three dropped.
struct Group {
    home: String,
    a: String,
    b: String,
    groups: Vec<DictionaryGroup>,
}

async fn fresh_group(test: &str) -> Group {
    let (home, a, b) = (
        db_name(test, "home"),
        db_name(&format!("{test}_a"), "proxy"),
        db_name(&format!("{test}_b"), "proxy"),
    );
    let direct = common::direct().await;
    for db in [&home, &a, &b] {
        direct.database(db).drop().await.unwrap();
    }
    let groups = vec![DictionaryGroup {
        home: Some(home.clone()),
        databases: vec![a.clone(), b.clone()],
    }];
    Group { home, a, b, groups }
}

impl Group {
    /// The proxies' configuration file for the group and `proxy_with`'s
    /// policy, as the tools read it.
    fn config_file(&self) -> String {
        let (home, a, b) = (&self.home, &self.a, &self.b);
        let path = common::temp_dir(home).join("laconic.toml");
        std::fs::write(
            &path,
            format!(
                "[proxy.tokenize]\nmin_len = 4\ncustom_paths = [\"custom\"]\n\n\
                 [[proxy.tokenize.dictionaries]]\ndatabases = [\"{a}\", \"{b}\"]\nhome = \"{home}\"\n"
            ),
        )
        .unwrap();
        path.to_str().unwrap().to_owned()
    }
}

/// The error a read of `db.c` gets, refused for its dictionary (301).
async fn read_refused(client: &mongodb::Client, db: &str) -> mongodb::error::CommandError {
    let err = client
        .database(db)
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap_err();
    let e = common::command_error(err);
    assert_eq!(e.code, 301, "{}", e.message);
    e
}

/// Inserts `d` into `db.c` through `proxy`.
async fn insert_via(proxy: &laconic::downstream::ProxyHandle, db: &str, d: Document) {
    common::via_proxy(proxy)
        .await
        .database(db)
        .collection::<Document>("c")
        .insert_one(d)
        .await
        .unwrap();
}

/// `laconic store ARGS --uri <the upstream>`.
fn tool(args: &[&str]) -> std::process::Command {
    let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_laconic"));
    c.args(["store"])
        .args(args)
        .args(["--uri", &common::upstream().uri])
        .env("RUST_BACKTRACE", "0");
    c
}

/// The operations of the cross-database bulkWrite, for the databases `a`
/// and `b`: inserts, an upsert, an update, a delete, and a duplicate key
/// in `a` at index 5.
fn models(a: &Namespace, b: &Namespace) -> Vec<WriteModel> {
    let insert = |ns: &Namespace, d: Document| {
        WriteModel::InsertOne(
            InsertOneModel::builder()
                .namespace(ns.clone())
                .document(d)
                .build(),
        )
    };
    vec![
        insert(a, doc! {"_id": 1, "playerDisplayName": "Ann", "custom": {"Favorite Team": "x"}}),
        insert(b, doc! {"_id": 1, "matchReference": 7, "minuteOfTheMatch": 12}),
        WriteModel::UpdateOne(
            UpdateOneModel::builder()
                .namespace(b.clone())
                .filter(doc! {"_id": 2})
                .update(doc! {"$set": {"preferredPlayingPositions": ["GK"], "custom.Referee Full Name": "R"}, "$setOnInsert": {"contractInformation": {"clubName": "c"}}})
                .upsert(true)
                .build(),
        ),
        WriteModel::UpdateMany(
            UpdateManyModel::builder()
                .namespace(a.clone())
                .filter(doc! {"playerDisplayName": "Ann"})
                .update(doc! {"$set": {"contractInformation.clubName": "d"}})
                .build(),
        ),
        WriteModel::DeleteOne(
            DeleteOneModel::builder()
                .namespace(b.clone())
                .filter(doc! {"minuteOfTheMatch": 12})
                .build(),
        ),
        insert(a, doc! {"_id": 1, "playerDisplayName": "dup"}),
        insert(a, doc! {"_id": 2, "matchReference": 8}),
    ]
}

#[tokio::test]
async fn a_bulk_write_across_tokenized_databases_equals_the_twin() {
    let proxy = proxy_with(Vec::new()).await;
    let run = |client: mongodb::Client, side: &'static str| async move {
        let (a, b) = (db_name("xbw_a", side), db_name("xbw_b", side));
        let ca = client.database(&a).collection::<Document>("c");
        let cb = client.database(&b).collection::<Document>("d");
        ca.drop().await.unwrap();
        cb.drop().await.unwrap();
        let err = client
            .bulk_write(models(&ca.namespace(), &cb.namespace()))
            .ordered(false)
            .verbose_results()
            .await
            .unwrap_err();
        let mongodb::error::ErrorKind::BulkWrite(e) = *err.kind else {
            panic!("{err}")
        };
        let mut errors: Vec<(usize, i32, String)> = e
            .write_errors
            .iter()
            .map(|(i, w)| (*i, w.code, w.message.replace(side, "SIDE")))
            .collect();
        errors.sort();
        let Some(mongodb::error::PartialBulkWriteResult::Verbose(r)) = e.partial_result else {
            panic!("verbose partial results")
        };
        let sorted = |m: Vec<(usize, String)>| {
            let mut m = m;
            m.sort();
            m
        };
        let result = (
            format!("{:?}", r.summary),
            sorted(
                r.insert_results
                    .iter()
                    .map(|(i, x)| (*i, format!("{x:?}")))
                    .collect(),
            ),
            sorted(
                r.update_results
                    .iter()
                    .map(|(i, x)| (*i, format!("{x:?}")))
                    .collect(),
            ),
            sorted(
                r.delete_results
                    .iter()
                    .map(|(i, x)| (*i, format!("{x:?}")))
                    .collect(),
            ),
        );
        (
            errors,
            result,
            common::by_id(&ca, doc! {}).await,
            common::by_id(&cb, doc! {}).await,
        )
    };
    let via = run(common::via_proxy(&proxy).await, "proxy").await;
    let direct = run(common::direct().await, "direct").await;
    assert_eq!(via, direct);
    assert_eq!(via.0.len(), 1, "{:?}", via.0);
    assert_eq!((via.0[0].0, via.0[0].1), (5, 11000));
    assert_eq!(via.3.len(), 1, "{:?}", via.3);
    // Each database's documents hold its own dictionary's tokens.
    for (db, coll) in [("xbw_a", "c"), ("xbw_b", "d")] {
        let stored = common::stored(&db_name(db, "proxy"), coll).await;
        assert!(!stored.is_empty());
        for d in &stored {
            assert!(d.keys().all(|k| k == "_id" || k.len() < 4), "{db}: {d}");
        }
    }
}

#[tokio::test]
async fn out_and_merge_into_a_database_that_shares_the_dictionary() {
    let side_dbs = |side: &str| (db_name("xgrp_a", side), db_name("xgrp_b", side));
    let (pa, pb) = side_dbs("proxy");
    let proxy = proxy_with(vec![DictionaryGroup {
        home: None,
        databases: vec![pa.clone(), pb.clone()],
    }])
    .await;
    let run = |client: mongodb::Client, side: &'static str| async move {
        let (a, b) = side_dbs(side);
        client.database(&a).drop().await.unwrap();
        client.database(&b).drop().await.unwrap();
        let c = client.database(&a).collection::<Document>("c");
        c.insert_many(vec![
            doc! {"_id": 1, "playerDisplayName": "Ann", "custom": {"Favorite Team": "x"}},
            doc! {"_id": 2, "playerDisplayName": "Bob", "matchReference": 3},
        ])
        .await
        .unwrap();
        c.aggregate(vec![
            doc! {"$match": {"playerDisplayName": {"$exists": true}}},
            doc! {"$set": {"copiedDisplayName": "$playerDisplayName"}},
            doc! {"$out": {"db": &b, "coll": "out"}},
        ])
        .await
        .unwrap();
        c.aggregate(vec![
            doc! {"$project": {"matchReference": 1, "custom": 1}},
            doc! {"$merge": {"into": {"db": &b, "coll": "merged"}}},
        ])
        .await
        .unwrap();
        let out = client.database(&b).collection::<Document>("out");
        let merged = client.database(&b).collection::<Document>("merged");
        (
            common::by_id(&out, doc! {"copiedDisplayName": "Ann"}).await,
            common::by_id(&out, doc! {}).await,
            common::by_id(&merged, doc! {}).await,
        )
    };
    let via = run(common::via_proxy(&proxy).await, "proxy").await;
    let direct = run(common::direct().await, "direct").await;
    assert_eq!(via, direct);
    assert_eq!(via.0.len(), 1);
    // The copies hold the shared dictionary's tokens.
    let stored = common::stored(&pb, "out").await;
    assert!(
        stored.iter().all(|d| !d.contains_key("copiedDisplayName")),
        "{stored:?}"
    );

    // A database outside the group has a dictionary of its own: refused.
    let outside = db_name("xgrp_c", "proxy");
    let err = common::via_proxy(&proxy)
        .await
        .database(&pa)
        .collection::<Document>("c")
        .aggregate(vec![doc! {"$out": {"db": &outside, "coll": "out"}}])
        .await
        .map(|_| ())
        .unwrap_err();
    let e = common::command_error(err);
    assert_eq!(e.code, 115);
    assert!(
        e.message.starts_with("laconic: $out into ") && e.message.contains("another dictionary"),
        "{}",
        e.message
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_wide_stream_matches_fields_when_every_database_shares_one_dictionary() {
    // The shared upstream holds other tests' documents, so a new shared
    // dictionary would be refused (they could be tokenized otherwise): it is
    // made first, as an operator adopting the deployment would.
    let home = db_name("xall", "home");
    let direct = common::direct().await;
    direct.database(&home).drop().await.unwrap();
    let mut init = std::process::Command::new(env!("CARGO_BIN_EXE_laconic"));
    init.args(["store", "init", "--uri", &common::upstream().uri, &home]);
    common::run_ok(init).await;
    let (a, b) = (db_name("xall_a", "proxy"), db_name("xall_b", "proxy"));
    let proxy = proxy_with(vec![DictionaryGroup {
        home: Some(home.clone()),
        databases: vec!["*".into()],
    }])
    .await;
    let client = common::via_proxy(&proxy).await;
    for db in [&a, &b] {
        client.database(db).drop().await.unwrap();
    }
    let mut stream = client
        .watch()
        .pipeline(vec![doc! {"$match": {
            "ns.db": {"$in": [&a, &b]},
            "fullDocument.playerDisplayName": "Ann",
        }}])
        .await
        .unwrap();
    client
        .database(&a)
        .collection::<Document>("c")
        .insert_many(vec![
            doc! {"_id": 1, "playerDisplayName": "Bob"},
            doc! {"_id": 2, "playerDisplayName": "Ann", "custom": {"Favorite Team": "x"}},
        ])
        .await
        .unwrap();
    client
        .database(&b)
        .collection::<Document>("d")
        .insert_one(doc! {"_id": 3, "playerDisplayName": "Ann", "minuteOfTheMatch": 4})
        .await
        .unwrap();
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let e = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next())
            .await
            .expect("an event within 20 s")
            .unwrap()
            .unwrap();
        seen.push((e.ns.unwrap().db, e.full_document.unwrap()));
    }
    assert_eq!(
        seen,
        vec![
            (
                a.clone(),
                doc! {"_id": 2, "playerDisplayName": "Ann", "custom": {"Favorite Team": "x"}}
            ),
            (
                b.clone(),
                doc! {"_id": 3, "playerDisplayName": "Ann", "minuteOfTheMatch": 4}
            ),
        ]
    );
    // Both databases' documents hold tokens of the one dictionary.
    for (db, coll) in [(&a, "c"), (&b, "d")] {
        let stored = common::stored(db, coll).await;
        assert!(stored.iter().all(|d| !d.contains_key("playerDisplayName")));
    }
}

/// A cluster-wide stream over databases with dictionaries of their own:
/// each event is expanded with its database's (its documents, and the
/// paths of an update's description), and reads as the twin's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_wide_stream_expands_each_event_with_its_database_dictionary() {
    let proxy = proxy_with(Vec::new()).await;
    let run = |client: mongodb::Client, side: &'static str| async move {
        let (a, b) = (db_name("xev_a", side), db_name("xev_b", side));
        for db in [&a, &b] {
            client.database(db).drop().await.unwrap();
        }
        // Only these databases' writes: other tests' databases have
        // dictionaries this proxy cannot read (it would refuse their
        // events, 301), and a stream opened without a start point may
        // begin before the drops above (see `common::just_after`).
        let mut stream = client
            .watch()
            .pipeline(vec![doc! {"$match": {
                "ns.db": {"$in": [&a, &b]},
                "operationType": {"$in": ["insert", "update"]},
            }}])
            .await
            .unwrap();
        let (ca, cb) = (
            client.database(&a).collection::<Document>("c"),
            client.database(&b).collection::<Document>("d"),
        );
        ca.insert_one(
            doc! {"_id": 1, "playerDisplayName": "Ann", "custom": {"Favorite Team": "x"}},
        )
        .await
        .unwrap();
        cb.insert_one(doc! {"_id": 2, "minuteOfTheMatch": 4, "playerDisplayName": "Bob"})
            .await
            .unwrap();
        ca.update_one(
            doc! {"_id": 1},
            doc! {"$set": {"custom.Favorite Team": "y", "scoreAtHalfTime": 1}},
        )
        .await
        .unwrap();
        let mut seen = Vec::new();
        while seen.len() < 3 {
            let e = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next())
                .await
                .expect("an event within 20 s")
                .unwrap()
                .unwrap();
            let ns = e.ns.unwrap();
            let updated = e.update_description.map(|u| u.updated_fields);
            let db = if ns.db == a { "a" } else { "b" };
            seen.push((db, e.full_document, updated));
        }
        seen
    };
    let via = run(common::via_proxy(&proxy).await, "proxy").await;
    let direct = run(common::direct().await, "direct").await;
    assert_eq!(via, direct);
    assert_eq!(
        via[2].2,
        Some(doc! {"custom.Favorite Team": "y", "scoreAtHalfTime": 1})
    );
    // Each database's documents hold tokens of its own dictionary.
    let (a, b) = (db_name("xev_a", "proxy"), db_name("xev_b", "proxy"));
    for (db, coll) in [(&a, "c"), (&b, "d")] {
        let stored = common::stored(db, coll).await;
        assert!(stored.iter().all(|d| !d.contains_key("playerDisplayName")));
    }
}

/// A group whose dictionary does not exist yet, while one of its members
/// already holds documents (written straight to the server): a write to
/// another member is refused, and the error names the member that holds
/// them and where the group's dictionary is kept, not a home that holds
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_refused_a_dictionary_names_the_member_that_holds_documents() {
    let Group { home, a, b, groups } = fresh_group("xmiss").await;
    let direct = common::direct().await;
    direct
        .database(&b)
        .collection::<Document>("legacy")
        .insert_one(doc! {"customerName": "Ann"})
        .await
        .unwrap();
    let proxy = proxy_with(groups).await;
    let client = common::via_proxy(&proxy).await;
    let err = client
        .database(&a)
        .collection::<Document>("c")
        .insert_one(doc! {"customerName": "Bob"})
        .await
        .unwrap_err();
    let e = common::command_error(err);
    assert_eq!(
        (e.code, e.code_name.as_str()),
        (301, "DataCorruptionDetected")
    );
    assert!(
        e.message.starts_with(&format!(
            "laconic: the database {b} holds documents but the dictionary it shares with the databases of its group, kept in {home}, does not exist: "
        )) && e.message.contains(&format!("`laconic store init {home}`")),
        "{}",
        e.message
    );
    // Nothing was written, and no dictionary made.
    for db in [&home, &a] {
        let names = direct.database(db).list_collection_names().await.unwrap();
        assert!(names.is_empty(), "{db}: {names:?}");
    }
}

/// The name store's database can be a group's home (as it is by default
/// for `databases = ["*"]`): its record of the dictionaries other
/// databases have had is the proxy's own, not documents a new dictionary
/// could mislabel, and does not stop the group's dictionary being made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_records_do_not_count_as_documents_of_a_home() {
    let (store, own, a) = (
        db_name("xrec", "store"),
        db_name("xrec_own", "proxy"),
        db_name("xrec_a", "proxy"),
    );
    let direct = common::direct().await;
    for db in [&store, &own, &a] {
        direct.database(db).drop().await.unwrap();
    }
    // A database with a dictionary of its own: the store records it.
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.tokenize.store_db = store.clone();
    let alone = common::start(config.clone()).await;
    insert_via(&alone, &own, doc! {"customerName": "Ann"}).await;
    let records = direct
        .database(&store)
        .collection::<Document>("dictionaries")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert!(records >= 1, "no record of {own}'s dictionary in {store}");
    // A group kept in the store's database.
    config.tokenize.dictionaries = vec![DictionaryGroup {
        home: Some(store.clone()),
        databases: vec![a.clone()],
    }];
    let grouped = common::start(config).await;
    let c = common::via_proxy(&grouped)
        .await
        .database(&a)
        .collection::<Document>("c");
    c.insert_one(doc! {"_id": 1, "customerName": "Bob"})
        .await
        .unwrap();
    assert_eq!(
        c.find_one(doc! {}).await.unwrap(),
        Some(doc! {"_id": 1, "customerName": "Bob"})
    );
    let stored = common::stored(&a, "c").await;
    assert!(!stored[0].contains_key("customerName"), "{:?}", stored[0]);
}

/// A group's dictionary dropped with its home while a member holds
/// documents written with it: reads of the member are refused, and the
/// error names the member that holds them and the home to restore.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_whose_home_was_dropped_names_the_member_left_unreadable() {
    let Group {
        home, a, groups, ..
    } = fresh_group("xlost").await;
    let direct = common::direct().await;
    let writer = proxy_with(groups.clone()).await;
    insert_via(&writer, &a, doc! {"_id": 1, "customerName": "Ann"}).await;
    direct.database(&home).drop().await.unwrap();
    let fresh = proxy_with(groups).await;
    let e = read_refused(&common::via_proxy(&fresh).await, &a).await;
    assert!(
        e.message.starts_with(&format!("laconic: the dictionary of {home} (identity "))
            && e.message.contains(&format!(
                "which {a} shares with the databases of its group, is gone while {a} still holds documents written with it"
            ))
            && e.message.contains(&format!("or restore {home} with its __laconic collection")),
        "{}",
        e.message
    );
}

/// Every member a proxy writes to carries a mark naming the group's
/// dictionary, even one whose documents need no new name: restored beside
/// another dictionary, it is refused, not read with the wrong names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_written_with_known_names_alone_is_marked_and_refused_beside_another_dictionary() {
    let Group { home, a, b, groups } = fresh_group("xmark").await;
    let direct = common::direct().await;
    let proxy = proxy_with(groups.clone()).await;
    let client = common::via_proxy(&proxy).await;
    // `a` brings the name; `b`'s document needs none.
    for db in [&a, &b] {
        client
            .database(db)
            .collection::<Document>("c")
            .insert_one(doc! {"_id": 1, "customerName": "Ann"})
            .await
            .unwrap();
    }
    let names_in_mark = |db: String| {
        let direct = direct.clone();
        async move {
            direct
                .database(&db)
                .collection::<Document>("__laconic_mark")
                .find_one(doc! {})
                .await
                .unwrap()
                .and_then(|m| m.get_i64("names").ok())
        }
    };
    // Each was marked before its write was sent.
    for db in [&a, &b] {
        assert_eq!(names_in_mark(db.clone()).await, Some(1), "{db}'s mark");
    }
    // A name `a` brings later reaches `b`'s documents: `b`'s mark is raised
    // to count it (in the background).
    for db in [&a, &b] {
        client
            .database(db)
            .collection::<Document>("c")
            .insert_one(doc! {"_id": 3, "laterName": 1})
            .await
            .unwrap();
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while names_in_mark(b.clone()).await != Some(2) {
        assert!(
            std::time::Instant::now() < deadline,
            "{b}'s mark counts {:?} names, the dictionary 2",
            names_in_mark(b.clone()).await
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The group's dictionary is dropped and made anew, with another name
    // first, while `b`'s documents are kept aside (as a restore would).
    let kept = common::stored(&b, "c").await;
    let marks: Vec<Document> = direct
        .database(&b)
        .collection::<Document>("__laconic_mark")
        .find(doc! {})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    for db in [&home, &a, &b] {
        direct.database(db).drop().await.unwrap();
    }
    let fresh = proxy_with(groups).await;
    let client = common::via_proxy(&fresh).await;
    client
        .database(&a)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 2, "anotherName": "Bob"})
        .await
        .unwrap();
    let restored = direct.database(&b);
    restored
        .collection::<Document>("c")
        .insert_many(kept)
        .await
        .unwrap();
    restored
        .collection::<Document>("__laconic_mark")
        .insert_many(marks)
        .await
        .unwrap();
    let e = read_refused(&client, &b).await;
    // Refused for its mark, not read with the new dictionary (where its
    // token now spells `anotherName`).
    assert!(
        e.message.starts_with(&format!(
            "laconic: the database {b} was written with dictionary "
        )) && e
            .message
            .contains("restore the databases of the group together"),
        "{}",
        e.message
    );
}

/// `laconic store verify` and `stats` on a group's member: with the
/// proxies' configuration, its documents are checked against the group's
/// dictionary; without it, the member (a mark, no dictionary of its own) is
/// refused, not reported as holding tokens no dictionary knows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_tools_read_a_member_with_its_group_dictionary() {
    let group = fresh_group("xtool").await;
    let proxy = proxy_with(group.groups.clone()).await;
    insert_via(&proxy, &group.a, doc! {"_id": 1, "customerName": "Ann"}).await;
    let config = group.config_file();
    let (home, a) = (&group.home, &group.a);
    let config = config.as_str();
    let out = common::run_ok(tool(&["verify", "--config", config, a])).await;
    assert!(
        out.contains(&format!("{a}: 1 documents in 1 collections"))
            && out.contains("; 0 hold tokens the dictionary does not know"),
        "{out}"
    );
    let out = common::run_ok(tool(&["stats", "--config", config, a])).await;
    assert!(
        out.starts_with(&format!(
            "{a}: shares the dictionary of {home}; its mark: 1 names and 0 values given out\n{home}: dictionary "
        )),
        "{out}"
    );
    for (command, refused) in [
        (
            "export",
            format!("{a} shares the dictionary of its group, kept in {home}: name {home}"),
        ),
        ("init", format!("{a} is marked already, with dictionary ")),
    ] {
        let out = tool(&[command, "--config", config, a]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command}: {stderr}");
        assert!(stderr.contains(&refused), "{command}: {stderr}");
    }
    for command in ["verify", "stats"] {
        let out = tool(&[command, a]).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{command}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "{a} has no dictionary of its own, and its mark names dictionary "
            )) && stderr.contains("give the proxies' configuration (--config)"),
            "{command}: {stderr}"
        );
    }
}

/// `laconic migrate` of a member whose names the group's dictionary holds
/// already: its converted documents hold the group's tokens, so it is
/// marked too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_migrated_with_known_names_alone_is_marked() {
    let group = fresh_group("xmig").await;
    let (a, b) = (&group.a, &group.b);
    let direct = common::direct().await;
    let proxy = proxy_with(group.groups.clone()).await;
    insert_via(&proxy, a, doc! {"_id": 1, "customerName": "Ann"}).await;
    // `b`'s documents predate Laconic, with a name the group knows.
    direct
        .database(b)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 2, "customerName": "Bob"})
        .await
        .unwrap();
    let mut migrate = std::process::Command::new(env!("CARGO_BIN_EXE_laconic"));
    migrate
        .arg("migrate")
        .args([
            "--uri",
            &common::upstream().uri,
            "--db",
            b,
            "--collection",
            "c",
        ])
        .args(["--config", &group.config_file()]);
    common::run_ok(migrate).await;
    let stored = common::stored(b, "c").await;
    assert!(!stored[0].contains_key("customerName"), "{:?}", stored[0]);
    let marks = direct
        .database(b)
        .collection::<Document>("__laconic_mark")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(marks, 1, "{b} holds the group's tokens without a mark");
}

/// Asserts that `what` was refused (115) for its target's dictionary.
fn refused_for_another_dictionary(result: mongodb::error::Result<Document>, what: &str) {
    let e = common::command_error(result.unwrap_err());
    assert_eq!(e.code, 115, "{}", e.message);
    assert_eq!(
        e.message,
        format!("laconic: {what} cannot be rewritten: its database has another dictionary (databases that share one are configured in [[proxy.tokenize.dictionaries]])")
    );
}

/// A `renameCollection` into another database moves stored documents as
/// they are: into a database with a dictionary of its own it is refused
/// (the documents would read back under its names), and into another
/// member of the group it goes through and marks that member first, as a
/// write would. So does an `$out` into the other member. Before, the first
/// rename went through, and `{customerName: "Ann"}` read back
/// `{otherName: "Ann"}`; the member that took the documents had no mark.
#[tokio::test]
async fn a_collection_renamed_into_another_database_keeps_its_names() {
    let Group { home, a, b, groups } = fresh_group("xren").await;
    let single = db_name("xren_s", "proxy");
    let direct = common::direct().await;
    direct.database(&single).drop().await.unwrap();
    let proxy = proxy_with(groups).await;
    let client = common::via_proxy(&proxy).await;
    insert_via(&proxy, &a, doc! {"_id": 1, "customerName": "Ann"}).await;
    insert_via(&proxy, &single, doc! {"_id": 1, "otherName": "Bob"}).await;
    let rename = |from: String, to: String| {
        let admin = client.database("admin");
        async move {
            admin
                .run_command(doc! {"renameCollection": from, "to": to})
                .await
        }
    };

    let err = rename(format!("{a}.c"), format!("{single}.moved")).await;
    refused_for_another_dictionary(
        err,
        &format!("renameCollection from {a}.c to {single}.moved"),
    );
    let in_single = direct
        .database(&single)
        .list_collection_names()
        .await
        .unwrap();
    assert!(!in_single.contains(&"moved".to_owned()), "{in_single:?}");

    rename(format!("{a}.c"), format!("{b}.c")).await.unwrap();
    let read = client
        .database(&b)
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap();
    assert_eq!(read, Some(doc! {"_id": 1, "customerName": "Ann"}));
    let epoch_of = |db: String, coll: &'static str, id: &'static str| {
        let direct = direct.clone();
        async move {
            direct
                .database(&db)
                .collection::<Document>(coll)
                .find_one(doc! {"_id": id})
                .await
                .unwrap()
                .and_then(|d| d.get("epoch").cloned())
        }
    };
    let group_epoch = epoch_of(home.clone(), "__laconic", "dictionary").await;
    assert!(group_epoch.is_some());
    assert_eq!(
        epoch_of(b.clone(), "__laconic_mark", "mark").await,
        group_epoch,
        "{b} took documents of the group's dictionary"
    );

    // An `$out` into the other member marks it too.
    direct.database(&b).drop().await.unwrap();
    insert_via(&proxy, &a, doc! {"_id": 2, "customerName": "Cy"}).await;
    let fresh = proxy_with(vec![DictionaryGroup {
        home: Some(home.clone()),
        databases: vec![a.clone(), b.clone()],
    }])
    .await;
    common::via_proxy(&fresh)
        .await
        .database(&a)
        .collection::<Document>("c")
        .aggregate(vec![doc! {"$out": {"db": &b, "coll": "out"}}])
        .await
        .unwrap();
    assert_eq!(
        epoch_of(b.clone(), "__laconic_mark", "mark").await,
        group_epoch,
        "{b} took documents of the group's dictionary by $out"
    );
}

/// What a pipeline makes on a database nothing tokenizes (`admin`) is
/// stored as it is: an `$out` of it into a tokenized collection is
/// refused, naming the stage, where before it stored full names a query
/// through the proxy would not find.
#[tokio::test]
async fn output_from_an_untokenized_database_into_a_tokenized_one_is_refused() {
    let Group { a, groups, .. } = fresh_group("xadm").await;
    let proxy = proxy_with(groups).await;
    let err = common::via_proxy(&proxy)
        .await
        .database("admin")
        .run_command(doc! {
            "aggregate": 1,
            "pipeline": [{"$documents": [{"_id": 1, "customerName": "Ann"}]}, {"$out": {"db": &a, "coll": "c"}}],
            "cursor": {},
        })
        .await;
    refused_for_another_dictionary(err, &format!("$out into {a}.c"));
    assert!(common::stored(&a, "c").await.is_empty());
}

/// `{_id: 1, customerName: "Ann"}` written into `b` through a proxy, as it
/// is stored (kept, as a backup would), then the group's databases
/// dropped and its dictionary made anew by another proxy with another name
/// first (`{_id: 2, anotherName: "Bob"}` into `a`): the same token stands
/// for another name now. Returns that proxy and `b`'s kept documents.
async fn replaced_with_another_name_first(
    group: &Group,
) -> (laconic::downstream::ProxyHandle, Vec<Document>) {
    let (home, a, b) = (&group.home, &group.a, &group.b);
    let proxy = proxy_with(group.groups.clone()).await;
    insert_via(&proxy, b, doc! {"_id": 1, "customerName": "Ann"}).await;
    let kept = common::stored(b, "c").await;
    let direct = common::direct().await;
    for db in [home, a, b] {
        direct.database(db).drop().await.unwrap();
    }
    let fresh = proxy_with(group.groups.clone()).await;
    insert_via(&fresh, a, doc! {"_id": 2, "anotherName": "Bob"}).await;
    (fresh, kept)
}

/// A member that holds documents and no mark, beside its group's
/// dictionary, was not written through Laconic with it: it is refused
/// (reads and writes) until `laconic store init MEMBER --config` adopts it.
/// Before, restored without its mark beside a dictionary made anew, it was
/// read with that one: `{customerName: "Ann"}` came back
/// `{anotherName: "Ann"}`.
#[tokio::test]
async fn a_member_holding_documents_without_a_mark_is_refused_until_adopted() {
    let group = fresh_group("xunm").await;
    let (home, a, b) = (&group.home, &group.a, &group.b);
    let direct = common::direct().await;
    // `b`'s documents come back without their mark.
    let (_, kept) = replaced_with_another_name_first(&group).await;
    direct
        .database(b)
        .collection::<Document>("c")
        .insert_many(kept)
        .await
        .unwrap();
    let refused = |e: mongodb::error::CommandError| {
        assert!(
            e.message.starts_with(&format!(
                "laconic: the database {b} holds documents but no mark of the dictionary it shares with the databases of its group, kept in {home}"
            )) && e.message.contains(&format!("`laconic store init {b} --config")),
            "{}",
            e.message
        );
    };
    let client = common::via_proxy(&proxy_with(group.groups.clone()).await).await;
    refused(read_refused(&client, b).await);
    let write = client
        .database(b)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 3, "customerName": "Cy"})
        .await
        .unwrap_err();
    let e = common::command_error(write);
    assert_eq!(e.code, 301);
    refused(e);
    // So is a pipeline of another member that reads it.
    let joined = client
        .database(a)
        .collection::<Document>("c")
        .aggregate(vec![
            doc! {"$lookup": {"from": {"db": b, "coll": "c"}, "pipeline": [], "as": "joined"}},
        ])
        .await
        .map(|_| ())
        .unwrap_err();
    let e = common::command_error(joined);
    assert_eq!(e.code, 301);
    refused(e);
    // Its keys read as tokens: adopting it needs --force.
    let config = group.config_file();
    let out = tool(&["init", "--config", &config, b]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("1 documents of {b} hold keys that read as tokens")),
        "{stderr}"
    );

    // Documents that predate Laconic are adopted, and then read.
    direct.database(b).drop().await.unwrap();
    direct
        .database(b)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 4, "plainName": "Di"})
        .await
        .unwrap();
    let client = common::via_proxy(&proxy_with(group.groups.clone()).await).await;
    refused(read_refused(&client, b).await);
    let out = common::run_ok(tool(&["init", "--config", &config, b])).await;
    assert_eq!(
        out,
        format!("{b} is marked with the dictionary of {home} now\n")
    );
    let client = common::via_proxy(&proxy_with(group.groups.clone()).await).await;
    let read = client
        .database(b)
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap();
    assert_eq!(read, Some(doc! {"_id": 4, "plainName": "Di"}));
}

/// A cluster-wide stream reads each event with its database's dictionary,
/// so a member's events must pass the checks a read of the member does:
/// the events of a member restored without its mark, beside a group
/// dictionary made anew, are refused as the member is (301, `unmarked`).
/// Before, the proxy that had never read that member expanded them with
/// the group's dictionary: `{customerName: "Ann"}` came back
/// `{anotherName: "Ann"}`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_wide_stream_refuses_the_events_of_an_unmarked_member() {
    let group = fresh_group("xcwu").await;
    let (a, b) = (&group.a, &group.b);
    let direct = common::direct().await;
    let (fresh, kept) = replaced_with_another_name_first(&group).await;
    let client = common::via_proxy(&fresh).await;
    let mut stream = client
        .watch()
        .pipeline(vec![
            doc! {"$match": {"ns.db": {"$in": [a, b]}, "operationType": "insert"}},
        ])
        .await
        .unwrap();
    // `b`'s documents come back without their mark, straight to the server.
    direct
        .database(b)
        .collection::<Document>("c")
        .insert_many(kept)
        .await
        .unwrap();
    let next = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next())
        .await
        .expect("an answer within 20 s")
        .expect("the stream goes on");
    let e = match next {
        Ok(event) => panic!(
            "the event of an unmarked member was read: {:?}",
            event.full_document
        ),
        Err(e) => common::command_error(e),
    };
    assert_eq!(e.code, 301, "{}", e.message);
    assert!(
        e.message.starts_with(&format!(
            "laconic: the database {b} holds documents but no mark of the dictionary it shares"
        )),
        "{}",
        e.message
    );
}

/// A member dropped through one proxy and written at once through another,
/// which has not yet read the store since (its view holds the member's
/// mark): that write carries the group's tokens and no mark. The proxy
/// that wrote it marks it again at its next read of the member (within a
/// second), and the other waits for that before refusing: neither refuses
/// it, and both read the document. (In a campaign of two proxies over a
/// group, which drops the members at every seed, such a member was
/// refused as unmarked.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_dropped_through_one_proxy_and_written_through_another_stays_marked() {
    let group = fresh_group("xdrop").await;
    let b = &group.b;
    let (pa, pb) = (
        proxy_with(group.groups.clone()).await,
        proxy_with(group.groups.clone()).await,
    );
    let (a_client, b_client) = (common::via_proxy(&pa).await, common::via_proxy(&pb).await);
    insert_via(&pb, b, doc! {"_id": 1, "customerName": "Ann"}).await;
    let read = |client: &mongodb::Client| {
        let c = client.database(b).collection::<Document>("c");
        async move { c.find_one(doc! {}).await }
    };
    assert!(read(&a_client).await.unwrap().is_some());
    a_client.database(b).drop().await.unwrap();
    insert_via(&pb, b, doc! {"_id": 2, "customerName": "Bob"}).await;
    let bob = Some(doc! {"_id": 2, "customerName": "Bob"});
    assert_eq!(read(&a_client).await.unwrap(), bob);
    assert_eq!(read(&b_client).await.unwrap(), bob);
    let mark = common::direct()
        .await
        .database(b)
        .collection::<Document>("__laconic_mark")
        .find_one(doc! {"_id": "mark"})
        .await
        .unwrap();
    assert!(mark.is_some(), "{b} is marked again");
}
