//! The same workload through a tokenizing proxy (`min_len` 4, custom
//! attributes under `custom`) and straight to the upstream on an
//! untokenized twin: documents with their key order, change events and the
//! server's error texts must be the same. Update operators order the fields
//! they create by name, so tokens keep the names' order.

use std::process::Command;

use bson::{doc, Document};

use crate::common::{self, db_name};

async fn proxy() -> laconic::downstream::ProxyHandle {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.tokenize.custom_paths = vec!["custom".into()];
    common::start(config).await
}

#[tokio::test]
async fn upserts_and_updates_keep_the_key_order_and_error_texts_of_the_twin() {
    let proxy = proxy().await;
    let run = |client: mongodb::Client, side: &'static str| async move {
        let c = common::fresh(&client, "diff", side).await;
        let mut out = Vec::new();
        c.update_one(
            doc! {"_id": 1},
            doc! {
                "$set": {"playerDisplayName": "Ann", "preferredPlayingPositions": ["GK"]},
                "$setOnInsert": {"contractInformation": {"clubName": "c"}, "custom": {"Referee Full Name": "R", "Favorite Team": "x"}},
            },
        )
        .upsert(true)
        .await
        .unwrap();
        c.update_one(
            doc! {"_id": 1},
            doc! {"$set": {"minuteOfTheMatch": 3, "custom.Zulu Name": 1, "custom.Alpha Name": 2, "contractInformation.annualSalary": 5}},
        )
        .await
        .unwrap();
        let updated = c
            .find_one_and_update(
                doc! {"_id": 2},
                doc! {"$set": {"zetaLongName": 1, "alphaLongName": 2}},
            )
            .upsert(true)
            .return_document(mongodb::options::ReturnDocument::After)
            .await
            .unwrap()
            .unwrap();
        out.push(updated.to_string());
        for d in common::by_id(&c, doc! {}).await {
            out.push(d.to_string());
        }
        let err = c
            .update_one(doc! {"_id": 1}, doc! {"$inc": {"playerDisplayName": 1}})
            .await
            .unwrap_err();
        let mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) =
            *err.kind
        else {
            panic!("{err}")
        };
        out.push(format!("{} {}", w.code, w.message));
        out
    };
    let via = run(common::via_proxy(&proxy).await, "proxy").await;
    let direct = run(common::direct().await, "direct").await;
    assert_eq!(via, direct);
    // The upsert's fields in name order, as the server creates them; the
    // field added later after them.
    let first: Document = common::by_id(
        &common::direct()
            .await
            .database(&db_name("diff", "direct"))
            .collection("c"),
        doc! {"_id": 1},
    )
    .await
    .remove(0);
    let keys: Vec<&str> = first.keys().map(String::as_str).collect();
    assert_eq!(
        keys,
        [
            "_id",
            "contractInformation",
            "custom",
            "playerDisplayName",
            "preferredPlayingPositions",
            "minuteOfTheMatch"
        ]
    );
    let stored: Document = common::stored(&db_name("diff", "proxy"), "c")
        .await
        .remove(0);
    assert!(!stored.contains_key("playerDisplayName"), "{stored}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_sees_the_same_documents_events_and_errors_as_on_the_twin() {
    let proxy = proxy().await;
    let python = common::venv_python();
    let script = common::root().join("tests/py/differential.py");
    let via = format!("mongodb://{}/?retryWrites=false", proxy.addr);
    let direct = format!(
        "mongodb://{}/?directConnection=true&retryWrites=false",
        common::upstream().host
    );
    let mut command = Command::new(python);
    command.arg(script).arg(via).arg(direct).arg("lt_pydiff");
    let out = common::run_ok(command).await;
    assert!(out.contains("steps identical"), "{out}");
}

/// A field whose name begins with a control character is stored escaped,
/// and a path through it is escaped in its first part only: an index's
/// key, a duplicate key's `keyPattern`, `keyValue` and message, and an
/// update event's fields name it as on the twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_through_a_field_named_with_a_control_character_reads_as_on_the_twin() {
    use futures::{StreamExt, TryStreamExt};
    use mongodb::{options::IndexOptions, IndexModel};
    let proxy = proxy().await;
    let run = |client: mongodb::Client, side: &'static str| async move {
        let c = common::fresh(&client, "ctrlpath", side).await;
        let mut out = Vec::new();
        let mut s = client.start_session().await.unwrap();
        c.insert_one(doc! {"_id": 1, "\u{2}": {"location": 5, "longerName": 1}})
            .session(&mut s)
            .await
            .unwrap();
        let mut stream = c
            .watch()
            .start_at_operation_time(common::just_after(&s))
            .await
            .unwrap();
        let unique = IndexOptions::builder()
            .unique(true)
            .name("ix".to_owned())
            .build();
        c.create_index(
            IndexModel::builder()
                .keys(doc! {"\u{2}.location": 1})
                .options(unique)
                .build(),
        )
        .await
        .unwrap();
        let indexes: Vec<IndexModel> = c.list_indexes().await.unwrap().try_collect().await.unwrap();
        out.push(format!(
            "{:?}",
            indexes.iter().map(|i| &i.keys).collect::<Vec<_>>()
        ));
        let reply = c
            .client()
            .database(c.namespace().db.as_str())
            .run_command(doc! {"insert": "c", "documents": [{"_id": 2, "\u{2}": {"location": 5}}]})
            .await
            .unwrap();
        let mut error = reply.get_array("writeErrors").unwrap()[0]
            .as_document()
            .unwrap()
            .clone();
        let message = error.get_str("errmsg").unwrap().replace(side, "SIDE");
        error.insert("errmsg", message);
        out.push(error.to_string());
        c.update_one(
            doc! {"_id": 1},
            doc! {"$set": {"\u{2}.longerName": 2}, "$unset": {"\u{2}.location": ""}},
        )
        .await
        .unwrap();
        let event = tokio::time::timeout(std::time::Duration::from_secs(20), stream.next())
            .await
            .expect("change event in time")
            .expect("stream open")
            .unwrap();
        let update = event.update_description.expect("an update event");
        out.push(format!(
            "{} {:?}",
            update.updated_fields, update.removed_fields
        ));
        out
    };
    let via = run(common::via_proxy(&proxy).await, "proxy").await;
    let direct = run(common::direct().await, "direct").await;
    assert_eq!(via, direct);
    assert!(via[0].contains("\"\\u{2}.location\""), "{}", via[0]);
    // Stored escaped, with the field inside it tokenized.
    let stored = &common::stored(&db_name("ctrlpath", "proxy"), "c").await[0];
    assert!(stored.contains_key("\u{1f}\u{2}"), "{stored}");
    assert!(
        !stored
            .get_document("\u{1f}\u{2}")
            .unwrap()
            .contains_key("longerName"),
        "{stored}"
    );
}

/// Runs `tests/py/random_differential.py` through `proxies` (one, or two
/// of one policy and name store, which take the operations in turns drawn
/// apart) for `seeds`, and checks that every run ended with no mismatch and
/// the same documents on both sides.
async fn random_operations(
    proxies: &[&laconic::downstream::ProxyHandle],
    prefix: &str,
    seeds: &[u32],
) {
    let via: Vec<String> = proxies
        .iter()
        .map(|p| format!("mongodb://{}/?retryWrites=false", p.addr))
        .collect();
    let direct = format!(
        "mongodb://{}/?directConnection=true&retryWrites=false",
        common::upstream().host
    );
    for &seed in seeds {
        let mut command = Command::new(common::venv_python());
        command
            .arg(common::root().join("tests/py/random_differential.py"))
            .args([&via[0], &direct, &format!("{prefix}{seed}")])
            .args([seed.to_string(), "300".to_owned(), "wide".to_owned()])
            .args(&via[1..]);
        let out = common::run_ok(command).await;
        assert!(
            out.contains(&format!("seed {seed}: 300 ops, 0 mismatches"))
                && out.lines().any(|l| l.ends_with("final state same")),
            "{out}"
        );
    }
}

/// 900 random operations (nested documents, names long, short, non-ASCII
/// and beginning with control characters; filters, projections, sorts,
/// updates with array filters, pipelines with variables, `$graphLookup`,
/// `$redact`, `$out` and `$merge`, indexes, bulk writes) through a proxy
/// tokenizing every name: replies, errors and documents as on the twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operations_on_every_name_read_as_on_the_twin() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 1;
    let proxy = common::start(config).await;
    random_operations(&[&proxy], "lt_rnd_all", &[1, 2, 3]).await;
}

/// The same with names of 4 bytes and more, custom attributes, and value
/// tokens at three paths: what the proxy refuses for those is refused by
/// design, the rest reads as on the twin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operations_with_value_paths_read_as_on_the_twin() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.tokenize.custom_paths = vec!["custom".into()];
    config.tokenize.value_paths = vec![
        "tags".into(),
        "productCategory".into(),
        "location.city".into(),
    ];
    let proxy = common::start(config).await;
    random_operations(&[&proxy], "lt_rnd_val", &[4, 5, 6]).await;
}

/// Two proxies of one policy and name store, each operation through one of
/// them: names one adds reach the other in its queries, updates and
/// replies, short names left as they are meet tokens in the same
/// documents, and the state after each write is read through the proxy
/// that did not write it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_operations_through_two_proxies_read_as_on_the_twin() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 6;
    config.tokenize.custom_paths = vec!["items".into(), "nested.meta".into()];
    config.tokenize.value_paths = vec!["city".into(), "level".into()];
    config.tokenize.store_db = db_name("rnd_two", "store");
    let first = common::start(config.clone()).await;
    let second = common::start(config).await;
    random_operations(&[&first, &second], "lt_rnd_two", &[7]).await;
}
