//! Through the proxy, every operation gives what it gives directly.

use std::time::Duration;

use bson::{doc, Bson, Document};
use futures::{StreamExt, TryStreamExt};
use mongodb::options::{FindOptions, ReturnDocument};
use mongodb::{Client, Collection};

use crate::common::{self, db_name};

/// Runs a script of operations and returns a transcript of their results.
pub(crate) async fn crud_script(client: &Client, db: &str) -> Vec<(String, Bson)> {
    let d = client.database(db);
    d.drop().await.unwrap();
    let c: Collection<Document> = d.collection("people");
    let mut t: Vec<(String, Bson)> = Vec::new();
    let mut log = |name: &str, v: Bson| t.push((name.to_owned(), v));

    let r = c.insert_one(doc! {"_id": 1, "first_name": "Jon", "last_name": "Hyman", "custom": {"Favorite Player": "LeBron James", "a.b$": 1}}).await.unwrap();
    log("insert_one", r.inserted_id);
    let docs: Vec<Document> = (2..=20)
        .map(|i| doc! {"_id": i, "first_name": format!("n{i}"), "score": i * 3 % 7, "tags": ["x", format!("t{}", i % 3)], "nested": {"deep": {"v": i}}})
        .collect();
    let r = c.insert_many(docs).await.unwrap();
    log("insert_many", Bson::Int64(r.inserted_ids.len() as i64));

    let found: Vec<Document> = c
        .find(doc! {"score": {"$gte": 2}, "tags": "x"})
        .sort(doc! {"score": -1, "_id": 1})
        .projection(doc! {"first_name": 1, "score": 1, "nested.deep.v": 1})
        .limit(12)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    log(
        "find",
        Bson::Array(found.into_iter().map(Bson::Document).collect()),
    );

    let r = c
        .update_one(
            doc! {"_id": 1},
            doc! {"$set": {"custom.Season Ticket Holder": true}, "$inc": {"visits": 1}},
        )
        .await
        .unwrap();
    log(
        "update_one",
        Bson::Int64((r.matched_count * 10 + r.modified_count) as i64),
    );
    let r = c
        .update_many(doc! {"score": {"$lt": 3}}, doc! {"$push": {"tags": "low"}})
        .await
        .unwrap();
    log(
        "update_many",
        Bson::Int64((r.matched_count * 10 + r.modified_count) as i64),
    );
    let r = c
        .update_one(
            doc! {"_id": 99},
            doc! {"$setOnInsert": {"first_name": "upserted"}},
        )
        .upsert(true)
        .await
        .unwrap();
    log("upsert", r.upserted_id.unwrap_or(Bson::Null));
    let r = c
        .replace_one(
            doc! {"_id": 2},
            doc! {"first_name": "replaced", "z": [1, 2, {"q": null}]},
        )
        .await
        .unwrap();
    log("replace_one", Bson::Int64(r.modified_count as i64));
    let v = c
        .find_one_and_update(doc! {"_id": 3}, doc! {"$set": {"score": 100}})
        .return_document(ReturnDocument::After)
        .await
        .unwrap();
    log("find_one_and_update", v.map_or(Bson::Null, Bson::Document));
    let v = c.find_one_and_delete(doc! {"_id": 4}).await.unwrap();
    log("find_one_and_delete", v.map_or(Bson::Null, Bson::Document));
    let r = c
        .delete_many(doc! {"score": {"$in": [0, 1]}})
        .await
        .unwrap();
    log("delete_many", Bson::Int64(r.deleted_count as i64));
    let n = c.count_documents(doc! {}).await.unwrap();
    log("count_documents", Bson::Int64(n as i64));
    let n = c.estimated_document_count().await.unwrap();
    log("estimated_document_count", Bson::Int64(n as i64));
    let mut v = c.distinct("tags", doc! {}).await.unwrap();
    v.sort_by_key(|b| b.to_string());
    log("distinct", Bson::Array(v));
    let agg: Vec<Document> = c
        .aggregate(vec![
            doc! {"$match": {"score": {"$exists": true}}},
            doc! {"$group": {"_id": "$score", "n": {"$sum": 1}, "names": {"$push": "$first_name"}}},
            doc! {"$sort": {"_id": 1}},
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    log(
        "aggregate",
        Bson::Array(agg.into_iter().map(Bson::Document).collect()),
    );
    let dup = c.insert_one(doc! {"_id": 1}).await.unwrap_err();
    let code = match *dup.kind {
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(e)) => e.code,
        other => panic!("{other:?}"),
    };
    log("duplicate key code", Bson::Int32(code));
    let all: Vec<Document> = common::by_id(&c, doc! {}).await;
    log(
        "final",
        Bson::Array(all.into_iter().map(Bson::Document).collect()),
    );
    t
}

#[tokio::test]
async fn crud_through_the_proxy_equals_direct() {
    let proxy = common::proxy().await;
    let via = crud_script(&common::via_proxy(&proxy).await, &db_name("crud", "proxy")).await;
    let direct = crud_script(&common::direct().await, &db_name("crud", "direct")).await;
    assert_eq!(via.len(), direct.len());
    for (a, b) in via.iter().zip(&direct) {
        assert_eq!(a, b, "operation {} differs", a.0);
    }
}

#[tokio::test]
async fn ten_thousand_documents_in_one_insert_many_and_small_getmore_batches() {
    let proxy = common::proxy().await;
    let client = common::via_proxy(&proxy).await;
    let c: Collection<Document> = client.database(&db_name("bulk", "proxy")).collection("c");
    c.drop().await.unwrap();
    let docs: Vec<Document> = (0..10_000)
        .map(|i| doc! {"_id": i, "payload": format!("document number {i}")})
        .collect();
    let r = c.insert_many(docs.clone()).await.unwrap();
    assert_eq!(r.inserted_ids.len(), 10_000);

    let read: Vec<Document> = c
        .find(doc! {})
        .with_options(
            FindOptions::builder()
                .batch_size(7)
                .sort(doc! {"_id": 1})
                .build(),
        )
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(read, docs);

    // The same read directly gives the same documents.
    let direct: Vec<Document> = common::direct()
        .await
        .database(&db_name("bulk", "proxy"))
        .collection::<Document>("c")
        .find(doc! {})
        .sort(doc! {"_id": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(read, direct);
}

#[tokio::test]
async fn bulk_write_command_through_the_proxy() {
    use mongodb::options::{DeleteOneModel, InsertOneModel, UpdateOneModel, WriteModel};
    let proxy = common::proxy().await;
    let run = |client: Client, db: String| async move {
        let d = client.database(&db);
        d.drop().await.unwrap();
        let ns = d.collection::<Document>("c").namespace();
        let models = vec![
            WriteModel::InsertOne(
                InsertOneModel::builder()
                    .namespace(ns.clone())
                    .document(doc! {"_id": 1, "a": 1})
                    .build(),
            ),
            WriteModel::InsertOne(
                InsertOneModel::builder()
                    .namespace(ns.clone())
                    .document(doc! {"_id": 2, "a": 2})
                    .build(),
            ),
            WriteModel::UpdateOne(
                UpdateOneModel::builder()
                    .namespace(ns.clone())
                    .filter(doc! {"_id": 1})
                    .update(doc! {"$set": {"b": "x"}})
                    .build(),
            ),
            WriteModel::DeleteOne(
                DeleteOneModel::builder()
                    .namespace(ns.clone())
                    .filter(doc! {"_id": 2})
                    .build(),
            ),
        ];
        let r = client.bulk_write(models).verbose_results().await.unwrap();
        let docs: Vec<Document> = d
            .collection::<Document>("c")
            .find(doc! {})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let s = r.summary;
        (
            s.inserted_count,
            s.matched_count,
            s.modified_count,
            s.deleted_count,
            docs,
        )
    };
    let via = run(common::via_proxy(&proxy).await, db_name("bw", "proxy")).await;
    let direct = run(common::direct().await, db_name("bw", "direct")).await;
    assert_eq!(via, direct);
    assert_eq!(via.0, 2);
    assert_eq!(via.4, vec![doc! {"_id": 1, "a": 1, "b": "x"}]);
}

#[tokio::test]
async fn transactions_commit_and_abort_through_the_proxy() {
    let proxy = common::proxy().await;
    let client = common::via_proxy(&proxy).await;
    let c = common::fresh(&client, "txn", "proxy").await;
    c.insert_one(doc! {"_id": 0}).await.unwrap();

    let mut s = client.start_session().await.unwrap();
    s.start_transaction().await.unwrap();
    c.insert_one(doc! {"_id": 1}).session(&mut s).await.unwrap();
    c.update_one(doc! {"_id": 0}, doc! {"$set": {"t": 1}})
        .session(&mut s)
        .await
        .unwrap();
    s.commit_transaction().await.unwrap();

    s.start_transaction().await.unwrap();
    c.insert_one(doc! {"_id": 2}).session(&mut s).await.unwrap();
    s.abort_transaction().await.unwrap();

    let docs: Vec<Document> = common::by_id(&c, doc! {}).await;
    assert_eq!(docs, vec![doc! {"_id": 0, "t": 1}, doc! {"_id": 1}]);
}

#[tokio::test]
async fn change_streams_through_the_proxy() {
    let proxy = common::proxy().await;
    let client = common::via_proxy(&proxy).await;
    let c = common::fresh(&client, "cs", "proxy").await;
    let mut s = client.start_session().await.unwrap();
    c.insert_one(doc! {"_id": 0}).session(&mut s).await.unwrap();
    let mut stream = c
        .watch()
        .start_at_operation_time(common::just_after(&s))
        .await
        .unwrap();

    c.insert_one(doc! {"_id": 1, "custom": {"Favorite Player": "x"}})
        .await
        .unwrap();
    c.update_one(
        doc! {"_id": 1},
        doc! {"$set": {"custom.Favorite Player": "y"}},
    )
    .await
    .unwrap();
    c.delete_one(doc! {"_id": 1}).await.unwrap();

    let mut events = Vec::new();
    while events.len() < 3 {
        let e = tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("change event in time")
            .expect("stream open")
            .unwrap();
        events.push(e);
    }
    use mongodb::change_stream::event::OperationType;
    assert_eq!(events[0].operation_type, OperationType::Insert);
    assert_eq!(
        events[0].full_document,
        Some(doc! {"_id": 1, "custom": {"Favorite Player": "x"}})
    );
    assert_eq!(events[1].operation_type, OperationType::Update);
    let upd = events[1].update_description.as_ref().unwrap();
    assert_eq!(upd.updated_fields, doc! {"custom.Favorite Player": "y"});
    assert_eq!(events[2].operation_type, OperationType::Delete);
    assert_eq!(events[2].document_key, Some(doc! {"_id": 1}));

    // Resuming after the first event replays the later ones.
    let token = events[0].id.clone();
    let mut resumed = c.watch().resume_after(token).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(20), resumed.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(e.operation_type, OperationType::Update);
}

#[tokio::test]
async fn scram_sha_256_login_through_the_proxy() {
    let (uri, user, password) = match common::auth_upstream() {
        Some(up) => (up.uri.clone(), "laconic".to_owned(), "s3cret-pw".to_owned()),
        None => {
            // An external upstream: create a user there, then log in with it.
            let direct = common::direct().await;
            let _ = direct
                .database("admin")
                .run_command(doc! {"dropUser": "laconic_test"})
                .await;
            direct
                .database("admin")
                .run_command(doc! {"createUser": "laconic_test", "pwd": "s3cret-pw", "roles": ["root"], "mechanisms": ["SCRAM-SHA-256"]})
                .await
                .unwrap();
            (
                common::upstream().uri.clone(),
                "laconic_test".to_owned(),
                "s3cret-pw".to_owned(),
            )
        }
    };
    let proxy = common::start(common::proxy_config(&uri)).await;
    let ok = Client::with_uri_str(format!(
        "mongodb://{user}:{password}@{}/?authMechanism=SCRAM-SHA-256&retryWrites=false",
        proxy.addr
    ))
    .await
    .unwrap();
    let c = ok
        .database(&db_name("auth", "proxy"))
        .collection::<Document>("c");
    c.drop().await.unwrap();
    c.insert_one(doc! {"_id": 1}).await.unwrap();
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 1);

    let bad = Client::with_uri_str(format!(
        "mongodb://{user}:wrong@{}/?authMechanism=SCRAM-SHA-256&retryWrites=false&serverSelectionTimeoutMS=3000",
        proxy.addr
    ))
    .await
    .unwrap();
    let err = bad
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap_err();
    assert!(
        matches!(*err.kind, mongodb::error::ErrorKind::Authentication { .. }),
        "{err}"
    );
}

#[tokio::test]
async fn a_request_with_more_to_come_gets_no_reply_and_lands() {
    use laconic::wire::MsgFlags;

    use crate::common::{body, op_msg, raw_session, read_frame, write_frame};

    let proxy = common::proxy().await;
    let db = db_name("w0", "proxy");
    common::direct().await.database(&db).drop().await.unwrap();
    let mut s = raw_session(&proxy).await;
    for i in 0..50 {
        let insert = op_msg(
            10 + i,
            MsgFlags::MORE_TO_COME,
            doc! {"insert": "c", "documents": [{"_id": i}], "writeConcern": {"w": 0}, "$db": &db},
        );
        write_frame(&mut s, &insert).await;
    }
    // The next reply on the connection answers the next acknowledged request:
    // the unacknowledged ones got none.
    write_frame(&mut s, &op_msg(99, 0, doc! {"count": "c", "$db": &db})).await;
    let reply = tokio::time::timeout(Duration::from_secs(10), read_frame(&mut s))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.header.response_to, 99);
    let mut n = body(&reply).get_i32("n").unwrap();
    for _ in 0..100 {
        if n == 50 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        n = common::direct()
            .await
            .database(&db)
            .collection::<Document>("c")
            .count_documents(doc! {})
            .await
            .unwrap() as i32;
    }
    assert_eq!(n, 50);
}
