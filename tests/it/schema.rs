//! Indexes, validators, views and change streams through the token mapping,
//! compared with the same commands sent directly on an untokenized twin.

use bson::{doc, Bson, Document};
use futures::{StreamExt, TryStreamExt};
use mongodb::{Database, IndexModel};

use crate::common::{self, db_name};

async fn twins(test: &str) -> (laconic::downstream::ProxyHandle, Database, Database) {
    twins_with(test, Vec::new()).await
}

/// [`twins`], with settings of their own for some namespaces.
async fn twins_with(
    test: &str,
    namespaces: Vec<laconic::config::NamespaceTokenize>,
) -> (laconic::downstream::ProxyHandle, Database, Database) {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 5;
    config.tokenize.custom_paths = vec!["custom".into()];
    config.tokenize.store_db = db_name(test, "store");
    config.tokenize.namespaces = namespaces;
    let proxy = common::start(config).await;
    let via = common::via_proxy(&proxy)
        .await
        .database(&db_name(test, "proxy"));
    let direct = common::direct().await.database(&db_name(test, "direct"));
    for db in [&via, &direct] {
        db.drop().await.unwrap();
    }
    (proxy, via, direct)
}

#[tokio::test]
async fn index_lifecycle_matches_the_twin() {
    let (_proxy, via, direct) = twins("idx").await;
    let mut seen = Vec::new();
    for db in [&via, &direct] {
        let c = db.collection::<Document>("people");
        c.insert_many(vec![
            doc! {"_id": 1, "email_address": "a@x", "custom": {"Loyalty Tier": 1}, "about_text": "hello world", "score": 3},
            doc! {"_id": 2, "email_address": "b@x", "custom": {"Loyalty Tier": 2}, "about_text": "bonjour", "score": 8},
        ])
        .await
        .unwrap();
        c.create_indexes(vec![
            IndexModel::builder()
                .keys(doc! {"email_address": 1})
                .options(
                    mongodb::options::IndexOptions::builder()
                        .unique(true)
                        .build(),
                )
                .build(),
            IndexModel::builder()
                .keys(doc! {"custom.Loyalty Tier": -1, "score": 1})
                .options(
                    mongodb::options::IndexOptions::builder()
                        .partial_filter_expression(doc! {"score": {"$gt": 1}})
                        .build(),
                )
                .build(),
            IndexModel::builder().keys(doc! {"custom.$**": 1}).build(),
        ])
        .await
        .unwrap();
        let specs = common::index_specs(db, "people").await;
        // A hint by key pattern, in find and in count.
        let hinted = common::by_id(&c, doc! {"score": {"$gt": 0}}).await;
        let with_hint: Vec<Document> = c
            .find(doc! {"email_address": {"$exists": true}})
            .hint(mongodb::options::Hint::Keys(doc! {"email_address": 1}))
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        // Duplicate keys report logical names.
        let dup = c
            .insert_one(doc! {"_id": 3, "email_address": "a@x"})
            .await
            .unwrap_err();
        let dup = match *dup.kind {
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(e)) => {
                (e.code, e.message.contains("email_address"))
            }
            other => panic!("{other:?}"),
        };
        c.drop_index("email_address_1").await.unwrap();
        db.run_command(
            doc! {"dropIndexes": "people", "index": {"custom.Loyalty Tier": -1, "score": 1}},
        )
        .await
        .unwrap();
        let after = common::index_specs(db, "people").await;
        seen.push((specs, hinted, with_hint, dup, after));
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].0.len(), 4, "{:?}", seen[0].0);
    assert_eq!(seen[0].4.len(), 2, "{:?}", seen[0].4);
    // Upstream, the key patterns are on tokens.
    let raw = common::index_specs(
        &common::direct().await.database(&db_name("idx", "proxy")),
        "people",
    )
    .await;
    assert!(raw
        .iter()
        .all(|s| !s.get_document("key").unwrap().contains_key("email_address")));
}

#[tokio::test]
async fn validators_and_views_match_the_twin() {
    // The view below puts a custom attribute's value at `tier_level`: its
    // settings say that what is below it is a custom attribute's.
    let view = laconic::config::NamespaceTokenize {
        namespace: format!("{}.member_emails", db_name("val", "proxy")),
        custom_paths: Some(vec!["custom".into(), "tier_level".into()]),
        ..Default::default()
    };
    let (_proxy, via, direct) = twins_with("val", vec![view]).await;
    let mut seen = Vec::new();
    for db in [&via, &direct] {
        db.run_command(doc! {
            "create": "members",
            "validator": {"$jsonSchema": {
                "bsonType": "object",
                "required": ["email_address", "custom"],
                "properties": {
                    "email_address": {"bsonType": "string"},
                    "custom": {"bsonType": "object", "properties": {"Loyalty Tier": {"bsonType": "int", "minimum": 0}}},
                },
            }},
        })
        .await
        .unwrap();
        let c = db.collection::<Document>("members");
        c.insert_one(doc! {"_id": 1, "email_address": "a@x", "custom": {"Loyalty Tier": 2}})
            .await
            .unwrap();
        let invalid = c
            .insert_one(doc! {"_id": 2, "custom": {"Loyalty Tier": -1}})
            .await
            .unwrap_err();
        // The server's account of the failure (errInfo) names logical fields.
        let code = match *invalid.kind {
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(e)) => {
                (e.code, e.details)
            }
            other => panic!("{other:?}"),
        };
        db.run_command(doc! {"collMod": "members", "validator": {"$expr": {"$gte": ["$custom.Loyalty Tier", 1]}}})
            .await
            .unwrap();
        let after_collmod = c
            .insert_one(doc! {"_id": 3, "email_address": "c@x", "custom": {"Loyalty Tier": 0}})
            .await
            .is_err();
        db.run_command(doc! {
            "create": "member_emails",
            "viewOn": "members",
            "pipeline": [{"$project": {"contact_email": "$email_address", "tier_level": "$custom.Loyalty Tier"}}],
        })
        .await
        .unwrap();
        let view: Vec<Document> = common::by_id(
            &db.collection("member_emails"),
            doc! {"tier_level": {"$gte": 1}},
        )
        .await;
        let mut listed: Vec<Document> = db
            .run_cursor_command(doc! {"listCollections": 1, "filter": {"name": {"$in": ["members", "member_emails"]}}})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        for l in &mut listed {
            l.remove("info");
            if let Ok(id_index) = l.get_document_mut("idIndex") {
                id_index.remove("ns");
            }
        }
        listed.sort_by_key(|l| l.get_str("name").unwrap_or_default().to_owned());
        seen.push((code, after_collmod, view, listed));
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].0 .0, 121);
    let err_info = format!("{:?}", seen[0].0 .1);
    assert!(
        err_info.contains("Loyalty Tier") && err_info.contains("email_address"),
        "{err_info}"
    );
    assert!(seen[0].1, "the collMod validator rejects tier 0");
    assert_eq!(seen[0].2.len(), 1);
    // Without those settings, queries below `tier_level` would name its
    // fields in the wrong form: such a view is refused.
    let err = via
        .run_command(doc! {
            "create": "member_tiers",
            "viewOn": "members",
            "pipeline": [{"$project": {"tier_level": "$custom.Loyalty Tier"}}],
        })
        .await
        .unwrap_err();
    let e = common::command_error(err);
    assert_eq!((e.code, e.code_name.as_str()), (115, "CommandNotSupported"));
    assert!(
        e.message.starts_with("laconic: a view whose documents store names at tier_level otherwise than its own tokenize settings say"),
        "{}",
        e.message
    );
}

/// The next change event, as the driver gives it, without what differs
/// between the twins by nature (resume token, times, namespaces, UUIDs).
async fn next_event(
    stream: &mut mongodb::change_stream::ChangeStream<
        mongodb::change_stream::event::ChangeStreamEvent<Document>,
    >,
) -> Document {
    let event = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next())
        .await
        .expect("an event within 10 s")
        .unwrap()
        .unwrap();
    let mut d = bson::to_document(&event).unwrap();
    for k in [
        "_id",
        "clusterTime",
        "wallTime",
        "ns",
        "collectionUUID",
        "lsid",
        "txnNumber",
    ] {
        d.remove(k);
    }
    d
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_events_match_the_twin_and_resume() {
    let (proxy, via, direct) = twins("cs").await;
    let mut events = Vec::new();
    for (side, db) in [("proxy", &via), ("direct", &direct)] {
        let c = db.collection::<Document>("people");
        let mut session = db.client().start_session().await.unwrap();
        c.insert_one(doc! {"_id": 0, "seed_value": 1})
            .session(&mut session)
            .await
            .unwrap();
        let mut coll_stream = c
            .watch()
            .pipeline(vec![doc! {"$match": {"operationType": {"$in": ["insert", "update", "replace", "delete"]}, "fullDocument.ignored_field": {"$exists": false}}}])
            .full_document(mongodb::options::FullDocumentType::UpdateLookup)
            .start_at_operation_time(common::just_after(&session))
            .await
            .unwrap();
        let mut db_stream = db
            .watch()
            .start_at_operation_time(common::just_after(&session))
            .await
            .unwrap();
        c.insert_one(doc! {"_id": 1, "first_name": "Ada", "custom": {"Favorite Player": "x"}, "long_array": [1, 2, 3]})
            .await
            .unwrap();
        c.update_one(
            doc! {"_id": 1},
            doc! {"$set": {"custom.Favorite Player": "y", "middle_name": "B"}, "$unset": {"first_name": ""}, "$pop": {"long_array": 1}},
        )
        .await
        .unwrap();
        c.replace_one(doc! {"_id": 1}, doc! {"replaced_field": true})
            .await
            .unwrap();
        c.delete_one(doc! {"_id": 1})
            .session(&mut session)
            .await
            .unwrap();
        let mut got = Vec::new();
        for _ in 0..4 {
            got.push(next_event(&mut coll_stream).await);
        }
        let db_event = next_event(&mut db_stream).await;
        // Resume after the first event: the rest come again.
        let token = {
            let mut s = c
                .watch()
                .start_at_operation_time(common::just_after(&session))
                .await
                .unwrap();
            c.insert_one(doc! {"_id": 2, "resumed_field": 1})
                .await
                .unwrap();
            s.next().await.unwrap().unwrap();
            s.resume_token().unwrap()
        };
        c.insert_one(doc! {"_id": 3, "resumed_field": 2})
            .await
            .unwrap();
        let mut resumed = c.watch().resume_after(token).await.unwrap();
        let after_resume = next_event(&mut resumed).await;
        let _ = side;
        events.push((got, db_event, after_resume));
    }
    assert_eq!(events[0], events[1]);
    let update = &events[0].0[1];
    let desc = update.get_document("updateDescription").unwrap();
    assert!(
        desc.get_document("updatedFields")
            .unwrap()
            .contains_key("custom.Favorite Player"),
        "{desc}"
    );
    assert_eq!(
        desc.get_array("removedFields").unwrap(),
        &vec![Bson::from("first_name")]
    );

    // A cluster-wide stream names each event's fields with its database's dictionary.
    // Other tests write to other databases meanwhile, each with a name store
    // of its own: the stream keeps to this test's database.
    let ours = db_name("cs", "proxy");
    let admin = common::via_proxy(&proxy).await;
    let mut cluster = admin
        .watch()
        .pipeline(vec![doc! {"$match": {"ns.db": &ours}}])
        .await
        .unwrap();
    via.collection::<Document>("people")
        .insert_one(doc! {"_id": 9, "cluster_field": "z"})
        .await
        .unwrap();
    let event = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        loop {
            let e = cluster.next().await.unwrap().unwrap();
            let ns = e.ns.as_ref().map(|n| n.db.clone()).unwrap_or_default();
            // Events of this test's earlier writes may come first.
            if ns == ours && e.document_key == Some(doc! {"_id": 9}) {
                return e;
            }
        }
    })
    .await
    .expect("the event within 20 s");
    assert_eq!(
        event.full_document,
        Some(doc! {"_id": 9, "cluster_field": "z"})
    );
}

#[tokio::test]
async fn explain_echoes_logical_names() {
    let (_proxy, via, direct) = twins("expl").await;
    let mut seen = Vec::new();
    for db in [&via, &direct] {
        let c = db.collection::<Document>("people");
        c.insert_one(doc! {"_id": 1, "first_name": "Ada", "custom": {"Loyalty Tier": 2}})
            .await
            .unwrap();
        c.create_index(IndexModel::builder().keys(doc! {"first_name": 1}).build())
            .await
            .unwrap();
        let mut parts = Vec::new();
        for inner in [
            doc! {"find": "people", "filter": {"first_name": "Ada", "custom.Loyalty Tier": {"$gt": 1}}, "projection": {"first_name": 1}},
            doc! {"aggregate": "people", "pipeline": [{"$match": {"first_name": "Ada"}}, {"$group": {"_id": "$custom.Loyalty Tier", "people_count": {"$sum": 1}}}], "cursor": {}},
            doc! {"count": "people", "query": {"first_name": "Ada"}},
            doc! {"distinct": "people", "key": "first_name", "query": {"custom.Loyalty Tier": 2}},
            doc! {"update": "people", "updates": [{"q": {"first_name": "Ada"}, "u": {"$set": {"middle_name": "B"}}}]},
            doc! {"delete": "people", "deletes": [{"q": {"first_name": "Nobody"}, "limit": 1}]},
            doc! {"findAndModify": "people", "query": {"first_name": "Ada"}, "update": {"$inc": {"custom.Loyalty Tier": 1}}},
        ] {
            let reply = db
                .run_command(doc! {"explain": inner.clone(), "verbosity": "queryPlanner"})
                .await
                .unwrap();
            let planner = reply.get_document("queryPlanner").ok();
            let parsed = planner.and_then(|p| p.get("parsedQuery").cloned());
            let mut echoed = reply
                .get_document("command")
                .ok()
                .cloned()
                .unwrap_or_default();
            echoed.remove("$db");
            parts.push((parsed, echoed));
        }
        seen.push(parts);
    }
    assert_eq!(seen[0], seen[1]);
    let text = format!("{:?}", seen[0]);
    assert!(text.contains("first_name"), "{text}");
}

/// One command on a raw connection (no session), and its reply's body.
async fn run(s: &mut tokio::net::TcpStream, id: i32, body: Document) -> Document {
    common::write_frame(s, &common::op_msg(id, 0, body)).await;
    common::body(&common::read_frame(s).await.expect("a reply"))
}

/// The id of the cursor a command run on `s` opens.
async fn open_cursor(s: &mut tokio::net::TcpStream, id: i32, body: Document) -> i64 {
    let reply = run(s, id, body).await;
    match reply.get_document("cursor").and_then(|c| c.get_i64("id")) {
        Ok(cursor) => cursor,
        Err(_) => panic!("no cursor: {reply}"),
    }
}

/// The next update event of change stream `id`, read on `s`. A stream
/// opened without a start point may begin before the insert that came
/// just before it (see `common::just_after`): once, in a CI run under
/// load, its first event was another, with no `updateDescription`.
async fn next_update(s: &mut tokio::net::TcpStream, db: &str, coll: Bson, id: i64) -> Document {
    for _ in 0..5 {
        for event in next_batch(s, db, coll.clone(), id).await {
            let event = event.as_document().unwrap().clone();
            if event.get_str("operationType") == Ok("update") {
                return event;
            }
        }
    }
    panic!("no update event in cursor {id}");
}

/// The next batch of cursor `id`, asked for on `s` until it holds something
/// (a change stream's waiting up to 0.5 s each time).
async fn next_batch(s: &mut tokio::net::TcpStream, db: &str, coll: Bson, id: i64) -> Vec<Bson> {
    for i in 0..20 {
        let mut get_more = doc! {"getMore": id, "collection": coll.clone(), "$db": db};
        if coll.as_str() != Some("$cmd.listCollections") {
            get_more.insert("maxTimeMS", 500);
        }
        let reply = run(s, 100 + i, get_more).await;
        let batch = reply
            .get_document("cursor")
            .and_then(|c| c.get_array("nextBatch"))
            .unwrap_or_else(|_| panic!("{reply}"));
        if !batch.is_empty() {
            return batch.clone();
        }
    }
    panic!("nothing in cursor {id} after 20 getMores");
}

/// Behind a load balancer, or after a restart, a driver's `getMore` may
/// reach a proxy that did not see its cursor opened. That proxy reads the
/// cursor as its reply says: a change stream's events with their paths
/// (`removedFields`, the keys of `updatedFields`), a cluster-wide stream's
/// events each with its database's dictionary, `listCollections`'s
/// validators with the names in their strings. Before, it read every such
/// cursor as one of documents: those paths came back as tokens, and a
/// cluster-wide stream's events were not expanded at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_opened_through_another_proxy_is_read_as_it_was_opened() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 5;
    config.tokenize.custom_paths = vec!["custom".into()];
    config.tokenize.store_db = db_name("elsewhere", "store");
    let (a, b) = (
        common::start(config.clone()).await,
        common::start(config).await,
    );
    let db = db_name("elsewhere", "app");
    let via_a = common::via_proxy(&a).await.database(&db);
    via_a.drop().await.unwrap();
    via_a
        .create_collection("people")
        .validator(doc! {"$jsonSchema": {"required": ["first_name", "custom"]}})
        .await
        .unwrap();
    let people = via_a.collection::<Document>("people");
    people
        .insert_one(doc! {"_id": 1, "first_name": "Ada", "middle_name": "B", "custom": {"Favorite Player": "x"}})
        .await
        .unwrap();
    let (mut on_a, mut on_b) = (common::raw_session(&a).await, common::raw_session(&b).await);

    // Streams opened through A, then read through B.
    let stream = open_cursor(
        &mut on_a,
        2,
        doc! {"aggregate": "people", "pipeline": [{"$changeStream": {}}], "cursor": {}, "$db": &db},
    )
    .await;
    let cluster = open_cursor(
        &mut on_a,
        3,
        doc! {"aggregate": 1, "pipeline": [{"$changeStream": {"allChangesForCluster": true}}, {"$match": {"ns.db": &db}}], "cursor": {}, "$db": "admin"},
    )
    .await;
    people
        .update_one(
            doc! {"_id": 1},
            doc! {"$set": {"custom.Favorite Player": "y", "first_name": "Bo"}},
        )
        .await
        .unwrap();
    for (id, stream_db, coll) in [
        (stream, db.as_str(), Bson::from("people")),
        (cluster, "admin", Bson::from("$cmd.aggregate")),
    ] {
        let event = next_update(&mut on_b, stream_db, coll, id).await;
        let desc = event.get_document("updateDescription").unwrap();
        assert_eq!(
            desc.get_document("updatedFields").unwrap(),
            &doc! {"custom.Favorite Player": "y", "first_name": "Bo"},
            "{stream_db}: {event}"
        );
    }
    // A field removed: its path in removedFields.
    people
        .update_one(doc! {"_id": 1}, doc! {"$unset": {"middle_name": ""}})
        .await
        .unwrap();
    let event = next_update(&mut on_b, &db, Bson::from("people"), stream).await;
    let desc = event.get_document("updateDescription").unwrap();
    assert_eq!(
        desc.get_array("removedFields").unwrap(),
        &vec![Bson::from("middle_name")],
        "{desc}"
    );

    // listCollections through A, its getMore through B.
    let id = open_cursor(
        &mut on_a,
        4,
        doc! {"listCollections": 1, "filter": {"name": "people"}, "cursor": {"batchSize": 0}, "$db": &db},
    )
    .await;
    let batch = next_batch(&mut on_b, &db, Bson::from("$cmd.listCollections"), id).await;
    let options = batch[0]
        .as_document()
        .unwrap()
        .get_document("options")
        .unwrap();
    assert_eq!(
        options.get_document("validator").unwrap(),
        &doc! {"$jsonSchema": {"required": ["first_name", "custom"]}},
    );
}
