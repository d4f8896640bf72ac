//! Tokenized collections: documents are stored with short tokens and read
//! back exactly as written; every CRUD command gives what it gives directly.

use bson::{doc, Bson, Document};
use futures::TryStreamExt;
use laconic::token::namespace::{decode, Stored};
use mongodb::Collection;

use crate::common::{self, db_name};
use crate::passthrough::crud_script;

async fn tokenizing_proxy() -> laconic::downstream::ProxyHandle {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 6;
    config.tokenize.custom_paths = vec!["custom".into()];
    config.tokenize.store_db = db_name("tok", "store");
    common::start(config).await
}

/// The collection `c` of the test's database through `proxy`, and of its
/// untokenized twin straight from the upstream.
async fn via_and_twin(
    proxy: &laconic::downstream::ProxyHandle,
    side: &str,
) -> (Collection<Document>, Collection<Document>) {
    let via = common::via_proxy(proxy)
        .await
        .database(&db_name("tok", side))
        .collection("c");
    let twin = common::direct()
        .await
        .database(&db_name("tok", &format!("{side}_twin")))
        .collection("c");
    (via, twin)
}

#[tokio::test]
async fn crud_on_a_tokenized_collection_equals_direct_on_an_untokenized_twin() {
    let proxy = tokenizing_proxy().await;
    let via = crud_script(&common::via_proxy(&proxy).await, &db_name("tok", "proxy")).await;
    let direct = crud_script(&common::direct().await, &db_name("tok", "direct")).await;
    assert_eq!(via.len(), direct.len());
    for (a, b) in via.iter().zip(&direct) {
        assert_eq!(a, b, "operation {} differs", a.0);
    }

    // What the upstream holds: tokens in place of long names and custom attributes.
    let stored = common::direct()
        .await
        .database(&db_name("tok", "proxy"))
        .collection::<Document>("people")
        .find_one(doc! {"_id": 1})
        .await
        .unwrap()
        .unwrap();
    let keys: Vec<&String> = stored.keys().collect();
    assert_eq!(keys[0], "_id");
    assert!(
        !stored.contains_key("first_name") && !stored.contains_key("custom"),
        "{stored:?}"
    );
    for k in keys.iter().skip(1) {
        assert!(
            matches!(decode(k), Stored::Token(_)),
            "{k:?} is not a token"
        );
    }
    let custom = stored
        .values()
        .find_map(|v| v.as_document().filter(|d| d.len() >= 2))
        .expect("the custom sub-document");
    assert!(custom.keys().all(|k| matches!(decode(k), Stored::Token(_))));
    let logical = bson::to_vec(&doc! {"_id": 1, "first_name": "Jon", "last_name": "Hyman"})
        .unwrap()
        .len();
    assert!(bson::to_vec(&stored).unwrap().len() < logical + 60);

    // The dictionary lives beside the data, in seed 000's chained form.
    let chain: Vec<Document> = common::by_id(
        &common::direct()
            .await
            .database(&db_name("tok", "proxy"))
            .collection("__laconic"),
        doc! {"chain": "names"},
    )
    .await;
    assert!(!chain.is_empty());
    let list = chain[0].get_array("names").unwrap();
    assert!(
        list.contains(&Bson::from("first_name")) && list.contains(&Bson::from("Favorite Player"))
    );
    assert_eq!(chain[0].get_i64("seq").unwrap(), 0);

    // A fresh proxy (a restart) reads the store and returns identical documents.
    let again = tokenizing_proxy().await;
    let c = common::via_proxy(&again)
        .await
        .database(&db_name("tok", "proxy"))
        .collection::<Document>("people");
    let direct_twin = common::direct()
        .await
        .database(&db_name("tok", "direct"))
        .collection::<Document>("people");
    assert_eq!(
        common::by_id(&c, doc! {}).await,
        common::by_id(&direct_twin, doc! {}).await
    );
}

#[tokio::test]
async fn sub_documents_set_by_an_update_are_tokenized_in_their_scope() {
    let proxy = tokenizing_proxy().await;
    let via = common::via_proxy(&proxy)
        .await
        .database(&db_name("tok", "set"))
        .collection::<Document>("c");
    via.drop().await.unwrap();
    via.insert_one(doc! {"_id": 1, "custom": {"a": 1}})
        .await
        .unwrap();
    via.update_one(
        doc! {"_id": 1},
        doc! {"$set": {"custom": {"Newly Named": 2, "b": {"c": 3}}}},
    )
    .await
    .unwrap();
    let expected = doc! {"_id": 1, "custom": {"Newly Named": 2, "b": {"c": 3}}};
    assert_eq!(
        via.find_one(doc! {"custom.Newly Named": 2}).await.unwrap(),
        Some(expected.clone())
    );
    assert_eq!(
        via.find_one(doc! {"custom.b.c": 3}).await.unwrap(),
        Some(expected)
    );
    let stored = common::direct()
        .await
        .database(&db_name("tok", "set"))
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap();
    let custom = stored.values().nth(1).unwrap().as_document().unwrap();
    assert!(
        custom.keys().all(|k| matches!(decode(k), Stored::Token(_))),
        "{stored}"
    );
}

/// A key of digits alone is stored as it is, so that a path naming it (in a
/// filter, a projection or an update) finds it: such a part of a path is an
/// array index too, and paths keep it as it is. Before, the key was
/// tokenized: the filter and the projection missed it, and the update wrote
/// it a second time beside its token.
#[tokio::test]
async fn keys_of_digits_alone_are_found_by_paths_as_on_the_twin() {
    let proxy = tokenizing_proxy().await;
    let db = db_name("tok", "digits");
    let (via, twin) = via_and_twin(&proxy, "digits").await;
    let mut seen = Vec::new();
    for c in [&via, &twin] {
        c.drop().await.unwrap();
        c.insert_one(doc! {"_id": 1, "revenue": {"20240101": 150, "20231231": 100}, "custom": {"7": {"Favourite Team": "x"}}})
            .await
            .unwrap();
        let found = c
            .find_one(doc! {"revenue.20240101": 150, "custom.7.Favourite Team": "x"})
            .await
            .unwrap();
        let projected = c
            .find_one(doc! {})
            .projection(doc! {"revenue.20240101": 1, "custom.7": 1})
            .await
            .unwrap();
        c.update_one(
            doc! {"_id": 1},
            doc! {"$inc": {"revenue.20240101": 1}, "$set": {"custom.7.Favourite Team": "y"}},
        )
        .await
        .unwrap();
        seen.push((found, projected, c.find_one(doc! {}).await.unwrap()));
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(
        seen[0].2,
        Some(
            doc! {"_id": 1, "revenue": {"20240101": 151, "20231231": 100}, "custom": {"7": {"Favourite Team": "y"}}}
        )
    );
    // Stored: the digits as they are, the names beside them as tokens.
    let stored = common::stored(&db, "c").await.remove(0);
    let revenue = stored.values().nth(1).unwrap().as_document().unwrap();
    assert_eq!(
        revenue.keys().collect::<Vec<_>>(),
        ["20240101", "20231231"],
        "{stored}"
    );
    let custom = stored.values().nth(2).unwrap().as_document().unwrap();
    let team = custom.get_document("7").unwrap();
    assert!(
        team.keys().all(|k| matches!(decode(k), Stored::Token(_))),
        "{stored}"
    );
}

/// A rule of more than one part (`stats.attrs`, `sales.region`) holds the
/// same names below a key of digits as below an array index: a query reads
/// `stats.7.attrs` as `stats.attrs` whichever `7` is, and an aggregation
/// reads it as the key. Before, a document keyed by digits there was stored
/// by the rules of another place: the filter, the projection and the
/// aggregation missed its names and values, and the update wrote `x` a
/// second time beside its plain form.
#[tokio::test]
async fn rules_of_many_parts_hold_below_keys_of_digits_as_below_indexes() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 6;
    config.tokenize.custom_paths = vec!["stats.attrs".into()];
    config.tokenize.value_paths = vec!["sales.region".into()];
    config.tokenize.store_db = db_name("tok", "rules_store");
    let proxy = common::start(config).await;
    let db = db_name("tok", "rules");
    let (via, twin) = via_and_twin(&proxy, "rules").await;
    let mut seen = Vec::new();
    for c in [&via, &twin] {
        c.drop().await.unwrap();
        c.insert_many([
            doc! {"_id": 1, "stats": {"7": {"attrs": {"x": 1}}}, "sales": {"2024": {"region": "EU"}}},
            doc! {"_id": 2, "stats": [{"attrs": {"x": 2}}], "sales": [{"region": "EU"}]},
        ])
        .await
        .unwrap();
        let mut found = Vec::new();
        for filter in [
            doc! {"stats.7.attrs.x": 1},
            doc! {"sales.2024.region": "EU"},
            doc! {"stats.0.attrs.x": 2},
            doc! {"sales.0.region": "EU"},
        ] {
            found.push(
                c.find_one(filter)
                    .await
                    .unwrap()
                    .map(|d| d.get("_id").cloned()),
            );
        }
        let projected: Vec<Document> = c
            .find(doc! {})
            .projection(doc! {"stats.7.attrs": 1, "sales.2024.region": 1})
            .sort(doc! {"_id": 1})
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        let computed: Vec<Document> = c
            .aggregate([
                doc! {"$sort": {"_id": 1}},
                doc! {"$project": {"x": "$stats.7.attrs.x", "r": "$sales.2024.region"}},
            ])
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        // A move carries the rules below the key of digits along.
        let moved: Vec<Document> = c
            .aggregate([
                doc! {"$match": {"_id": 1}},
                doc! {"$replaceRoot": {"newRoot": "$stats.7"}},
                doc! {"$match": {"attrs.x": 1}},
                doc! {"$project": {"x": "$attrs.x"}},
            ])
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert_eq!(moved, [doc! {"x": 1}]);
        c.update_one(
            doc! {"_id": 1},
            doc! {"$inc": {"stats.7.attrs.x": 1}, "$set": {"sales.2024.region": "US"}},
        )
        .await
        .unwrap();
        seen.push((
            found,
            projected,
            computed,
            c.find_one(doc! {"_id": 1}).await.unwrap(),
        ));
    }
    assert_eq!(seen[0], seen[1]);
    assert_eq!(seen[0].0.iter().flatten().count(), 4, "{:?}", seen[0].0);
    assert_eq!(
        seen[0].3,
        Some(
            doc! {"_id": 1, "stats": {"7": {"attrs": {"x": 2}}}, "sales": {"2024": {"region": "US"}}}
        )
    );
    // Stored: `x` below the key of digits as a token, as below the index.
    for d in common::stored(&db, "c").await {
        let attrs = match d.values().nth(1).unwrap() {
            Bson::Document(s) => s.get_document("7").unwrap().values().next(),
            Bson::Array(a) => a[0].as_document().unwrap().values().next(),
            other => panic!("{other}"),
        };
        let attrs = attrs.unwrap().as_document().unwrap();
        assert!(
            attrs.keys().all(|k| matches!(decode(k), Stored::Token(_))),
            "{d}"
        );
    }
}

#[tokio::test]
async fn unrewritable_constructs_are_refused_by_name() {
    let proxy = tokenizing_proxy().await;
    let c = common::via_proxy(&proxy)
        .await
        .database(&db_name("tok", "refuse"))
        .collection::<Document>("c");
    // Emptied first: an upstream kept between runs holds the last run's document.
    c.drop().await.unwrap();
    c.insert_one(doc! {"long_field_name": 1}).await.unwrap();
    for (filter, construct) in [
        (doc! {"$where": "this.long_field_name == 1"}, "$where"),
        (
            doc! {"$expr": {"$function": {"body": "function(x) { return true }", "args": ["$long_field_name"], "lang": "js"}}},
            "$function",
        ),
    ] {
        let err = c.find_one(filter).await.unwrap_err();
        let e = common::command_error(err);
        assert_eq!(e.code, 115);
        assert!(e.message.contains(construct), "{}", e.message);
    }
    // $expr itself is rewritten.
    assert!(c
        .find_one(doc! {"$expr": {"$eq": ["$long_field_name", 1]}})
        .await
        .unwrap()
        .is_some());
    // The session goes on.
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 1);
}

#[tokio::test]
async fn values_at_value_paths_are_stored_as_tokens_and_queried_through_the_dictionary() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 6;
    config.tokenize.value_paths = vec!["top_artists".into()];
    config.tokenize.store_db = db_name("tokv", "store");
    let proxy = common::start(config).await;
    let via = common::via_proxy(&proxy)
        .await
        .database(&db_name("tokv", "proxy"))
        .collection::<Document>("users");
    let twin = common::direct()
        .await
        .database(&db_name("tokv", "direct"))
        .collection::<Document>("users");
    let artists = [
        "Taylor Swift",
        "Kendrick Lamar",
        "Billie Eilish",
        "The Weeknd",
        "Bad Bunny",
    ];
    let docs: Vec<Document> = (0..20)
        .map(|i: usize| doc! {"_id": i as i32, "display_name": format!("u{i}"), "top_artists": [artists[i % 5], artists[(i + 2) % 5]]})
        .collect();
    for c in [&via, &twin] {
        c.drop().await.unwrap();
        c.insert_many(docs.clone()).await.unwrap();
        c.update_one(
            doc! {"_id": 0},
            doc! {"$push": {"top_artists": "Bad Bunny"}},
        )
        .await
        .unwrap();
    }
    for filter in [
        doc! {"top_artists": "Taylor Swift"},
        doc! {"top_artists": {"$in": ["Bad Bunny", "The Weeknd"]}},
        doc! {"top_artists": {"$ne": "Kendrick Lamar"}},
        doc! {"top_artists": {"$regex": "^b", "$options": "i"}},
        doc! {"top_artists": {"$all": ["Taylor Swift", "Billie Eilish"]}},
        doc! {},
    ] {
        assert_eq!(
            common::by_id(&via, filter.clone()).await,
            common::by_id(&twin, filter.clone()).await,
            "{filter}"
        );
        assert_eq!(
            via.count_documents(filter.clone()).await.unwrap(),
            twin.count_documents(filter.clone()).await.unwrap(),
            "{filter}"
        );
    }
    let mut a = via.distinct("top_artists", doc! {}).await.unwrap();
    let mut b = twin.distinct("top_artists", doc! {}).await.unwrap();
    a.sort_by_key(|v| v.to_string());
    b.sort_by_key(|v| v.to_string());
    assert_eq!(a, b);

    // Stored as binary value tokens, one byte each here.
    let stored = common::direct()
        .await
        .database(&db_name("tokv", "proxy"))
        .collection::<Document>("users")
        .find_one(doc! {"_id": 1})
        .await
        .unwrap()
        .unwrap();
    let values = stored.values().find_map(|v| v.as_array()).unwrap();
    assert!(
        values
            .iter()
            .all(|v| matches!(v, Bson::Binary(b) if b.bytes.len() == 1)),
        "{stored}"
    );

    // Order-dependent queries on the values are refused by name.
    let err = via
        .find(doc! {})
        .sort(doc! {"top_artists": 1})
        .await
        .unwrap_err();
    assert!(err.to_string().contains("top_artists"), "{err}");
    let err = via
        .find(doc! {"top_artists": {"$gt": "M"}})
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("range") && err.to_string().contains("top_artists"),
        "{err}"
    );
    // Moving a value keeps its token, which expands wherever it lands.
    let unwound: Vec<Document> = via
        .aggregate(vec![
            doc! {"$unwind": "$top_artists"},
            doc! {"$project": {"_id": 0, "artist": "$top_artists"}},
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(
        unwound
            .iter()
            .all(|d| matches!(d.get("artist"), Some(Bson::String(_))))
            && !unwound.is_empty(),
        "{unwound:?}"
    );
    let err = via
        .aggregate(vec![
            doc! {"$group": {"_id": "$top_artists", "n": {"$sum": 1}}},
        ])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("top_artists"), "{err}");
}

/// Seed 002's metrics document: 1,543 B of BSON, 463 B of them names. The
/// seed shrinks it by hand to 1,200 B with one-letter names; Laconic stores
/// the same without the application changing a name.
#[tokio::test]
async fn seed_002_metrics_document_is_stored_in_at_most_1200_bytes() {
    let json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(common::root().join("tests/fixtures/seed002-metrics.json"))
            .unwrap(),
    )
    .unwrap();
    let logical = bson::to_document(&json).unwrap();
    assert_eq!(
        bson::to_vec(&logical).unwrap().len(),
        1543,
        "the seed's baseline"
    );

    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 2;
    config.tokenize.store_db = db_name("tokm", "store");
    let proxy = common::start(config).await;
    let via = common::via_proxy(&proxy)
        .await
        .database(&db_name("tokm", "proxy"))
        .collection::<Document>("metrics");
    via.drop().await.unwrap();
    let mut with_id = doc! {"_id": 1};
    with_id.extend(logical.clone());
    via.insert_one(with_id.clone()).await.unwrap();
    assert_eq!(via.find_one(doc! {"_id": 1}).await.unwrap(), Some(with_id));

    let stored = common::direct()
        .await
        .database(&db_name("tokm", "proxy"))
        .collection::<Document>("metrics")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap();
    let id_element = 1 + 4 + 4; // type, "_id\0", int32
    let size = bson::to_vec(&stored).unwrap().len() - id_element;
    assert!(size <= 1200, "stored {size} B");
    eprintln!("seed 002 metrics document: logical 1543 B, stored {size} B");
}

/// Expansion makes replies larger. A batch that would pass the 48 MB message
/// limit with logical names is answered with an error, never sent oversized;
/// smaller batches read the same documents.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_that_outgrow_the_reply_limit_are_cut_and_the_rest_served_by_get_more() {
    use futures::TryStreamExt;
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 100;
    config.tokenize.store_db = db_name("tokbig", "store");
    let proxy = common::start(config).await;
    let c = common::via_proxy(&proxy)
        .await
        .database(&db_name("tokbig", "proxy"))
        .collection::<Document>("c");
    c.drop().await.unwrap();
    // 60 documents of 1 MB with names, so one server batch expands far past
    // 16 MB.
    insert_wide(&c, 60).await;
    let expected: Vec<Document> = (0..60).map(wide_document).collect();
    // The upstream cursor stays open (batch of 40 out of 60): the held
    // documents come first, then the upstream's next batch.
    // The upstream cursor is exhausted by its first batch: the proxy serves
    // the rest under its own cursor id.
    for batch in [40, 60] {
        let got: Vec<Document> = c
            .find(doc! {})
            .sort(doc! {"_id": 1})
            .batch_size(batch)
            .await
            .unwrap()
            .try_collect()
            .await
            .unwrap();
        assert!(got == expected, "batch size {batch}: documents differ");
    }
    // The first batch empty, the next one cut: the driver takes the proxy's
    // id for the cursor from a getMore's reply.
    let got: Vec<Document> = c
        .aggregate(vec![doc! {"$sort": {"_id": 1}}])
        .batch_size(0)
        .await
        .unwrap()
        .with_type::<Document>()
        .try_collect()
        .await
        .unwrap();
    assert!(got == expected, "aggregate: documents differ");
    // A cursor dropped early is killed; the connection goes on working.
    {
        let mut cursor = c.find(doc! {}).batch_size(60).await.unwrap();
        assert!(cursor.advance().await.unwrap());
    }
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 60);
}

/// Document `d` of 1,000 keys of 1,000 bytes: 1 MB with names, about 10 KB
/// stored by a proxy with `min_len` 100.
fn wide_document(d: i32) -> Document {
    let mut doc = doc! {"_id": d};
    for i in 0..1000 {
        doc.insert(format!("{i:04}{}", "n".repeat(996)), d);
    }
    doc
}

/// Inserts documents 0 to `n - 1`, 20 at a time.
async fn insert_wide(c: &mongodb::Collection<Document>, n: i32) {
    for chunk in (0..n).collect::<Vec<i32>>().chunks(20) {
        c.insert_many(chunk.iter().map(|&d| wide_document(d)))
            .await
            .unwrap();
    }
}

/// The `_id`s of a cursor reply's batch, its cursor id and its
/// `postBatchResumeToken`.
fn batch_of(reply: &Document) -> (Vec<Bson>, i64, Option<Document>) {
    let cursor = reply.get_document("cursor").unwrap();
    let batch = cursor
        .get_array("firstBatch")
        .or_else(|_| cursor.get_array("nextBatch"))
        .unwrap();
    let ids = batch
        .iter()
        .map(|d| {
            let d = d.as_document().unwrap();
            // A change event's document's `_id`, or the document's.
            d.get_document("fullDocument")
                .unwrap_or(d)
                .get("_id")
                .unwrap()
                .clone()
        })
        .collect();
    let token = cursor.get_document("postBatchResumeToken").ok().cloned();
    (ids, cursor.get_i64("id").unwrap(), token)
}

/// Two tokenizing proxies sharing one name store.
async fn two_proxies(
    test: &str,
    min_len: usize,
) -> (
    laconic::downstream::ProxyHandle,
    laconic::downstream::ProxyHandle,
) {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = min_len;
    config.tokenize.store_db = db_name(test, "store");
    config.metrics_listen = Some("127.0.0.1:0".into());
    (
        common::start(config.clone()).await,
        common::start(config).await,
    )
}

/// Documents held back from a cut batch are never skipped: the cursor is
/// known to the driver by a proxy id, which another proxy (or this one,
/// restarted) sends upstream as it came, where no cursor has it. The
/// proxy that holds them serves them, then the upstream's next batches,
/// under that one id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_with_held_documents_is_not_continued_past_them_elsewhere() {
    let (a, b) = two_proxies("tokheld", 100).await;
    let (via_a, via_b) = (common::via_proxy(&a).await, common::via_proxy(&b).await);
    let db = via_a.database(&db_name("tokheld", "proxy"));
    let c = db.collection::<Document>("c");
    c.drop().await.unwrap();
    insert_wide(&c, 40).await;
    let mut session = via_a.start_session().await.unwrap();
    let first = db
        .run_command(doc! {"find": "c", "sort": {"_id": 1}, "batchSize": 30})
        .session(&mut session)
        .await
        .unwrap();
    let (mut seen, id, _) = batch_of(&first);
    assert!(
        seen.len() < 30,
        "the batch was cut: {} documents",
        seen.len()
    );
    // Through the other proxy: refused, not the upstream's next batch.
    let elsewhere = via_b
        .database(&db_name("tokheld", "proxy"))
        .run_command(doc! {"getMore": id, "collection": "c"})
        .await;
    let code = match elsewhere.as_ref().map_err(|e| &*e.kind) {
        Err(mongodb::error::ErrorKind::Command(e)) => e.code,
        other => panic!("expected CursorNotFound, got {other:?}"),
    };
    assert_eq!(code, 43, "CursorNotFound");
    // An operator sees the cut and the cursor pinned to proxy A.
    let (at_a, at_b) = (a.metrics_addr.unwrap(), b.metrics_addr.unwrap());
    for (addr, cut, ids) in [(at_a, 1, 1), (at_b, 0, 0)] {
        assert_eq!(
            common::metric(addr, "laconic_cursor_batches_cut_total").await,
            cut
        );
        assert_eq!(common::metric(addr, "laconic_cursor_proxy_ids").await, ids);
    }
    // Through the proxy that holds them: everything, in order, under one id.
    let mut cursor = id;
    while cursor != 0 {
        let next = db
            .run_command(doc! {"getMore": cursor, "collection": "c"})
            .session(&mut session)
            .await
            .unwrap();
        let (ids, next_id, _) = batch_of(&next);
        assert!(
            next_id == id || next_id == 0,
            "cursor id {next_id}, not {id}"
        );
        seen.extend(ids);
        cursor = next_id;
    }
    let all: Vec<Bson> = (0..40).map(Bson::Int32).collect();
    assert_eq!(seen, all);
    // The cursor is exhausted: its proxy id is forgotten.
    assert_eq!(common::metric(at_a, "laconic_cursor_proxy_ids").await, 0);
}

/// A cursor whose batch was cut asks the upstream for no more documents
/// than fitted in the reply. The server fills a batch up to 16 MiB of
/// stored bytes, which names can make many times larger: without that cap
/// every full batch of a long scan would be cut again, and its rest held in
/// the proxy's memory until the next `getMore`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_scan_whose_batch_was_cut_asks_for_batches_that_fit() {
    let (a, _) = two_proxies("tokscan", 100).await;
    let client = common::via_proxy(&a).await;
    let db = client.database(&db_name("tokscan", "proxy"));
    let c = db.collection::<Document>("c");
    c.drop().await.unwrap();
    insert_wide(&c, 60).await;
    // Then small documents: the cap the large ones set widens again.
    c.insert_many((60..400).map(|i| doc! {"_id": i, "a_small_document": i}))
        .await
        .unwrap();
    // One session for the cursor, as a driver's cursor has (commands run
    // apart may each take another implicit session, and a cursor is
    // continued only in the session that opened it).
    let mut session = client.start_session().await.unwrap();
    let first = db
        .run_command(doc! {"find": "c", "sort": {"_id": 1}, "batchSize": 20})
        .session(&mut session)
        .await
        .unwrap();
    let (mut seen, id, _) = batch_of(&first);
    let fitted = seen.len();
    assert!(fitted < 20, "the batch was cut: {fitted} documents");
    // The driver's getMores ask for the server's default batch: the 40
    // large documents left (40 MB with names), and the small ones.
    let (mut cursor, mut largest) = (id, 0);
    while cursor != 0 {
        let next = db
            .run_command(doc! {"getMore": cursor, "collection": "c"})
            .session(&mut session)
            .await
            .unwrap();
        let (ids, next_id, _) = batch_of(&next);
        largest = largest.max(ids.len());
        seen.extend(ids);
        cursor = next_id;
    }
    let all: Vec<Bson> = (0..400).map(Bson::Int32).collect();
    assert_eq!(seen, all);
    assert!(
        largest > 4 * fitted,
        "batches of small documents grow past {fitted}: at most {largest}"
    );
    let metrics = a.metrics_addr.unwrap();
    assert_eq!(
        common::metric(metrics, "laconic_cursor_batches_cut_total").await,
        1,
        "only the first batch was cut"
    );
    assert_eq!(
        common::metric(metrics, "laconic_cursor_held_bytes").await,
        0
    );
}

/// Cursors whose batches another proxy would read as documents (index
/// specs, index statistics: their paths in strings would stay as stored)
/// are known to the driver by a proxy id: through another proxy their
/// `getMore` is refused (CursorNotFound), never answered with stored
/// names; through the proxy that opened them, every batch reads as direct.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_cursors_are_not_read_as_documents_by_another_proxy() {
    let (a, b) = two_proxies("tokix", 6).await;
    let elsewhere = common::via_proxy(&b)
        .await
        .database(&db_name("tokix", "proxy"));
    let commands = [
        doc! {"listIndexes": "c", "cursor": {"batchSize": 1}},
        doc! {"aggregate": "c", "pipeline": [{"$indexStats": {}}], "cursor": {"batchSize": 1}},
    ];
    // Each command's index names and keys, read a batch of one at a time;
    // through the proxy, each cursor is first asked for through the other.
    let run = |client: mongodb::Client, side: &'static str| {
        let (commands, elsewhere) = (commands.clone(), elsewhere.clone());
        async move {
            let db = client.database(&db_name("tokix", side));
            db.drop().await.unwrap();
            let c = db.collection::<Document>("c");
            c.insert_one(doc! {"player_name": "a", "team_name": "b", "goals_scored": 1})
                .await
                .unwrap();
            for keys in [
                doc! {"player_name": 1},
                doc! {"team_name": 1, "goals_scored": -1},
            ] {
                let index = mongodb::IndexModel::builder().keys(keys).build();
                c.create_index(index).await.unwrap();
            }
            let mut session = client.start_session().await.unwrap();
            let mut read = Vec::new();
            for command in commands {
                let mut reply = db.run_command(command).session(&mut session).await.unwrap();
                let mut keys = Vec::new();
                loop {
                    let cursor = reply.get_document("cursor").unwrap();
                    let batch = cursor
                        .get_array("firstBatch")
                        .or_else(|_| cursor.get_array("nextBatch"))
                        .unwrap();
                    for d in batch {
                        let d = d.as_document().unwrap();
                        let name = d.get_str("name").unwrap().to_owned();
                        keys.push((name, d.get_document("key").unwrap().clone()));
                    }
                    let id = cursor.get_i64("id").unwrap();
                    if id == 0 {
                        break;
                    }
                    let get_more = doc! {"getMore": id, "collection": "c"};
                    if side == "proxy" && keys.len() == 1 {
                        let refused = elsewhere.run_command(get_more.clone()).await;
                        let e = common::command_error(refused.unwrap_err());
                        assert_eq!(e.code, 43, "CursorNotFound: {}", e.message);
                    }
                    reply = db
                        .run_command(get_more)
                        .session(&mut session)
                        .await
                        .unwrap();
                }
                keys.sort_by(|x, y| x.0.cmp(&y.0));
                read.push(keys);
            }
            read
        }
    };
    let direct = run(common::direct().await, "direct").await;
    let via = run(common::via_proxy(&a).await, "proxy").await;
    assert_eq!(via, direct);
    assert!(via.iter().all(|keys| keys.len() == 3), "{via:?}");
}

/// A change stream's batch that is cut ends each part with a resume token
/// of its own (its last event's `_id`): a driver that resumes after a part
/// (on a network error, or after the proxy restarted) gets the events
/// held back, not the events after the whole batch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_stream_resumed_after_a_cut_batch_misses_no_event() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 100;
    config.tokenize.store_db = db_name("tokcs", "store");
    let proxy = common::start(config).await;
    let client = common::via_proxy(&proxy).await;
    let db = client.database(&db_name("tokcs", "proxy"));
    let c = db.collection::<Document>("c");
    c.drop().await.unwrap();
    db.create_collection("c").await.unwrap();
    let mut session = client.start_session().await.unwrap();
    let stream = |resume: Option<Document>| {
        let mut spec = doc! {};
        if let Some(token) = resume {
            spec.insert("resumeAfter", token);
        }
        // Only the inserts: a stream opened without a start point may
        // begin before the collection was made (see `common::just_after`).
        let inserts = doc! {"$match": {"operationType": "insert"}};
        doc! {"aggregate": "c", "pipeline": [{"$changeStream": spec}, inserts], "cursor": {}}
    };
    let opened = db
        .run_command(stream(None))
        .session(&mut session)
        .await
        .unwrap();
    let (_, id, _) = batch_of(&opened);
    insert_wide(&c, 40).await;
    // Reads a stream's events until `n` came (or 50 batches did not bring
    // them), with the token each batch ended on. Each getMore names the
    // cursor by the id the reply before gave, as drivers do.
    async fn read(
        db: &mongodb::Database,
        session: &mut mongodb::ClientSession,
        mut id: i64,
        n: usize,
    ) -> Vec<(Vec<Bson>, Document)> {
        let mut batches = Vec::new();
        for _ in 0..50 {
            if events_of(&batches).len() >= n {
                break;
            }
            let next = db
                .run_command(doc! {"getMore": id, "collection": "c", "maxTimeMS": 200})
                .session(&mut *session)
                .await
                .unwrap();
            let (events, next_id, token) = batch_of(&next);
            id = next_id;
            if !events.is_empty() {
                batches.push((events, token.unwrap()));
            }
        }
        batches
    }
    let batches = read(&db, &mut session, id, 40).await;
    let all: Vec<Bson> = (0..40).map(Bson::Int32).collect();
    assert_eq!(events_of(&batches), all);
    let (first, token) = &batches[0];
    assert!(
        first.len() < 40,
        "the batch was cut: {} events",
        first.len()
    );
    // Resumed from the first part's token: the rest, from the next event.
    let mut again = client.start_session().await.unwrap();
    let resumed = db
        .run_command(stream(Some(token.clone())))
        .session(&mut again)
        .await
        .unwrap();
    let (mut events, resumed_id, _) = batch_of(&resumed);
    let rest = read(&db, &mut again, resumed_id, 40 - first.len() - events.len()).await;
    events.extend(events_of(&rest));
    assert_eq!(events, all[first.len()..].to_vec());
}

/// The events of batches, one after another.
fn events_of(batches: &[(Vec<Bson>, Document)]) -> Vec<Bson> {
    batches.iter().flat_map(|(e, _)| e.clone()).collect()
}

#[tokio::test]
async fn bulk_write_ops_are_tokenized_under_their_namespace() {
    use mongodb::options::{DeleteOneModel, InsertOneModel, UpdateOneModel, WriteModel};
    let proxy = tokenizing_proxy().await;
    let run = |client: mongodb::Client, db: String| async move {
        let c = client.database(&db).collection::<Document>("c");
        c.drop().await.unwrap();
        let ns = c.namespace();
        let models = vec![
            WriteModel::InsertOne(
                InsertOneModel::builder()
                    .namespace(ns.clone())
                    .document(doc! {"_id": 1, "long_field": 1, "custom": {"k": "v"}})
                    .build(),
            ),
            WriteModel::InsertOne(
                InsertOneModel::builder()
                    .namespace(ns.clone())
                    .document(doc! {"_id": 2, "long_field": 2})
                    .build(),
            ),
            WriteModel::UpdateOne(
                UpdateOneModel::builder()
                    .namespace(ns.clone())
                    .filter(doc! {"long_field": 1})
                    .update(doc! {"$set": {"another_long": true, "custom.k2": 3}})
                    .build(),
            ),
            WriteModel::DeleteOne(
                DeleteOneModel::builder()
                    .namespace(ns.clone())
                    .filter(doc! {"long_field": 2})
                    .build(),
            ),
        ];
        let r = client.bulk_write(models).await.unwrap();
        (
            r.inserted_count,
            r.matched_count,
            r.modified_count,
            r.deleted_count,
            common::by_id(&c, doc! {}).await,
        )
    };
    let via = run(common::via_proxy(&proxy).await, db_name("tokbw", "proxy")).await;
    let direct = run(common::direct().await, db_name("tokbw", "direct")).await;
    assert_eq!(via, direct);
    assert_eq!(
        via.4,
        vec![doc! {"_id": 1, "long_field": 1, "custom": {"k": "v", "k2": 3}, "another_long": true}]
    );
    let stored = common::direct()
        .await
        .database(&db_name("tokbw", "proxy"))
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap()
        .unwrap();
    assert!(!stored.contains_key("long_field"), "{stored}");
}

#[tokio::test]
async fn duplicate_key_errors_name_logical_fields() {
    /// A unique index on email_address, and a second insert that breaks it.
    async fn duplicate(c: &mongodb::Collection<Document>) -> mongodb::error::WriteError {
        c.drop().await.unwrap();
        let unique = mongodb::options::IndexOptions::builder()
            .unique(true)
            .build();
        c.create_index(
            mongodb::IndexModel::builder()
                .keys(doc! {"email_address": 1})
                .options(unique)
                .build(),
        )
        .await
        .unwrap();
        c.insert_one(doc! {"email_address": "a@example.com"})
            .await
            .unwrap();
        let err = c
            .insert_one(doc! {"email_address": "a@example.com"})
            .await
            .unwrap_err();
        match *err.kind {
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(e)) => e,
            other => panic!("{other:?}"),
        }
    }
    let proxy = tokenizing_proxy().await;
    let c = common::via_proxy(&proxy)
        .await
        .database(&db_name("tokdup", "proxy"))
        .collection::<Document>("c");
    let e = duplicate(&c).await;
    assert_eq!(e.code, 11000);
    assert!(e.message.contains("email_address"), "{}", e.message);
    assert!(!e.message.bytes().any(|b| b < 0x20), "{:?}", e.message);
    // keyPattern and keyValue, where the server sends them, are logical too:
    // the same error directly on an untokenized twin has the same details.
    let twin = common::direct()
        .await
        .database(&db_name("tokdup", "direct"))
        .collection::<Document>("c");
    let d = duplicate(&twin).await;
    assert_eq!(e.details, d.details);
    assert_eq!(
        e.message.replace("tokdup_proxy", "tokdup_direct"),
        d.message
    );
    // The index itself lists logical names.
    let names: Vec<String> = c.list_index_names().await.unwrap();
    assert!(names.contains(&"email_address_1".to_owned()), "{names:?}");
    let specs: Vec<mongodb::IndexModel> =
        futures::TryStreamExt::try_collect(c.list_indexes().await.unwrap())
            .await
            .unwrap();
    assert!(
        specs.iter().any(|s| s.keys == doc! {"email_address": 1}),
        "{specs:?}"
    );
}

#[tokio::test]
async fn collections_follow_their_own_settings_within_one_dictionary() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 6;
    config.tokenize.store_db = db_name("tokns", "store");
    let db = db_name("tokns", "proxy");
    config.tokenize.namespaces = vec![
        laconic::config::NamespaceTokenize {
            namespace: format!("{db}.plain"),
            min_len: Some(0),
            ..Default::default()
        },
        laconic::config::NamespaceTokenize {
            namespace: format!("{db}.props"),
            custom_paths: Some(vec!["props".into()]),
            ..Default::default()
        },
    ];
    let proxy = common::start(config).await;
    let client = common::via_proxy(&proxy).await;
    client.database(&db).drop().await.unwrap();
    let doc = doc! {"_id": 1, "first_name": "Ada", "props": {"k": 1}};
    for coll in ["plain", "props", "other"] {
        let c = client.database(&db).collection::<Document>(coll);
        c.insert_one(doc.clone()).await.unwrap();
        assert_eq!(
            c.find_one(doc! {"first_name": "Ada", "props.k": 1})
                .await
                .unwrap(),
            Some(doc.clone()),
            "{coll}"
        );
    }
    let is_token = |k: &str| matches!(decode(k), Stored::Token(_));
    for (coll, name_token, prop_token) in [
        // Nothing tokenized in `plain`; `props` tokenizes by length and its
        // own custom path; `other` by length only.
        ("plain", false, false),
        ("props", true, true),
        ("other", true, false),
    ] {
        let d = common::stored(&db, coll).await.remove(0);
        let keys: Vec<&String> = d.keys().collect();
        let props = d.get_document("props").unwrap();
        assert_eq!(is_token(keys[1]), name_token, "{coll}: {d:?}");
        assert_eq!(keys[2], "props", "{coll}: {d:?}");
        assert_eq!(
            is_token(props.keys().next().unwrap()),
            prop_token,
            "{coll}: {d:?}"
        );
    }
}

/// A field of the user's named `errmsg` is data like any other: whatever
/// control characters its text holds (here every byte that starts a token,
/// with the dictionary holding many names), it reads back as written, from
/// a cursor, a `findAndModify` and an aggregation.
#[tokio::test]
async fn a_user_field_named_errmsg_reads_back_as_written() {
    let proxy = tokenizing_proxy().await;
    let coll = common::via_proxy(&proxy)
        .await
        .database(&db_name("tok", "errmsg"))
        .collection::<Document>("notes");
    coll.drop().await.unwrap();
    let mut many = doc! {"_id": 0};
    for i in 0..40 {
        many.insert(format!("long_field_{i:02}"), i);
    }
    coll.insert_one(many).await.unwrap();
    let text: String = (0x01u8..=0x1e)
        .chain([0x7f])
        .map(char::from)
        .chain("end".chars())
        .collect();
    let written = doc! {"_id": 1, "errmsg": &text, "details": {"errmsg": &text}};
    coll.insert_one(written.clone()).await.unwrap();

    let found = coll.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
    assert_eq!(found, written);
    let value = coll
        .find_one_and_update(doc! {"_id": 1}, doc! {"$set": {"seen": true}})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(value, written);
    let projected: Vec<Document> = coll
        .aggregate(vec![
            doc! {"$match": {"_id": 1}},
            doc! {"$project": {"errmsg": 1, "details": 1}},
        ])
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(projected, vec![written]);
}

/// Binary subtype 0x8C holds value tokens in a tokenized database. A
/// user's own binary of that subtype would read back as a value, so every
/// way of writing one is refused, naming the subtype; any other subtype is
/// stored and read back as it is.
#[tokio::test]
async fn the_value_token_subtype_is_refused_in_writes() {
    use bson::spec::BinarySubtype;
    let proxy = tokenizing_proxy().await;
    let coll = common::via_proxy(&proxy)
        .await
        .database(&db_name("tok", "subtype"))
        .collection::<Document>("blobs");
    coll.drop().await.unwrap();
    let blob = |subtype: u8| {
        Bson::Binary(bson::Binary {
            subtype: BinarySubtype::UserDefined(subtype),
            bytes: vec![1],
        })
    };
    let refused = |e: mongodb::error::Error| {
        let text = e.to_string();
        assert!(
            text.matches("laconic:").count() == 1 && text.contains("0x8c"),
            "{text}"
        );
        match *e.kind {
            mongodb::error::ErrorKind::Command(ref c) => c.code,
            mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(ref w)) => {
                w.code
            }
            ref other => panic!("{other:?}"),
        }
    };
    let e = coll
        .insert_one(doc! {"_id": 1, "attachment": {"data": blob(0x8C)}})
        .await
        .unwrap_err();
    assert_eq!(refused(e), 115);
    let e = coll
        .insert_many(vec![doc! {"_id": 2}, doc! {"_id": 3, "list": [blob(0x8C)]}])
        .await
        .unwrap_err();
    let text = e.to_string();
    assert!(text.contains("0x8c"), "{text}");
    coll.insert_one(doc! {"_id": 4, "attachment": blob(0x80)})
        .await
        .unwrap();
    let e = coll
        .update_one(doc! {"_id": 4}, doc! {"$set": {"attachment": blob(0x8C)}})
        .await
        .unwrap_err();
    assert_eq!(refused(e), 115);
    let kept = coll.find_one(doc! {"_id": 4}).await.unwrap().unwrap();
    assert_eq!(kept, doc! {"_id": 4, "attachment": blob(0x80)});
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
}
