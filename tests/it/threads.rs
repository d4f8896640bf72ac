//! The threads sessions run on (`proxy.threads`): one or several, clients
//! on many connections at once read back what they wrote, key order
//! included, through cursors of many batches, and a shutdown waits for the
//! request in flight.

use std::time::Duration;

use bson::{doc, Document};
use mongodb::options::FindOptions;
use mongodb::Client;

use crate::common::{self, db_name};

fn profile(client: usize, i: usize) -> Document {
    doc! {
        "_id": (client * 10_000 + i) as i64,
        "customer_display_name": format!("client {client}, number {i}"),
        "preferred_contact_channel": if i.is_multiple_of(2) { "email" } else { "phone" },
        "lifetime_purchase_count": i as i64,
        "shipping_address": {"street_line": "1 Long Road", "postal_code": "12345"},
    }
}

/// Six clients, each with a pool of its own, write and read back at once
/// through a tokenizing proxy whose sessions run on `threads` threads;
/// then a large insert is in flight at shutdown.
async fn clients_are_served(test: &str, threads: usize) {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.threads = threads;
    let proxy = common::start(config).await;
    let db = db_name("threads", test);
    let setup = common::via_proxy(&proxy).await;
    setup.database(&db).drop().await.unwrap();

    let mut tasks = Vec::new();
    for client in 0..6 {
        let uri = format!("mongodb://{}/?retryWrites=false&maxPoolSize=2", proxy.addr);
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            let c = Client::with_uri_str(uri).await.unwrap();
            let coll = c.database(&db).collection::<Document>("profiles");
            let written: Vec<Document> = (0..300).map(|i| profile(client, i)).collect();
            for chunk in written.chunks(50) {
                coll.insert_many(chunk.to_vec()).await.unwrap();
            }
            let lo = (client * 10_000) as i64;
            let options = FindOptions::builder()
                .sort(doc! {"_id": 1})
                .batch_size(40)
                .build();
            let mut cursor = coll
                .find(doc! {"_id": {"$gte": lo, "$lt": lo + 10_000}})
                .with_options(options)
                .await
                .unwrap();
            let mut read = Vec::new();
            while cursor.advance().await.unwrap() {
                read.push(cursor.deserialize_current().unwrap());
            }
            assert_eq!(read.len(), written.len(), "client {client}");
            for (r, w) in read.iter().zip(&written) {
                // Byte for byte: the same values under the same names, in
                // the same order.
                assert_eq!(bson::to_vec(r).unwrap(), bson::to_vec(w).unwrap());
            }
            // A filter on a tokenized name finds the same documents.
            let phone = coll
                .count_documents(doc! {"_id": {"$gte": lo, "$lt": lo + 10_000}, "preferred_contact_channel": "phone"})
                .await
                .unwrap();
            assert_eq!(phone, 150, "client {client}");
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let stored = common::stored(&db, "profiles").await;
    assert_eq!(stored.len(), 1800);
    assert!(
        !stored[0].contains_key("customer_display_name"),
        "stored under tokens: {:?}",
        stored[0]
    );

    // A request in flight when the shutdown begins is answered.
    let big = setup.database(&db).collection::<Document>("big");
    let docs: Vec<Document> = (0..20_000)
        .map(|i| doc! {"_id": i, "padding_of_the_document": "x".repeat(100)})
        .collect();
    let insert = tokio::spawn(async move { big.insert_many(docs).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    proxy.shutdown.trigger();
    let drained = proxy.shutdown.drain(Duration::from_secs(60)).await;
    let inserted = insert
        .await
        .unwrap()
        .expect("the request in flight completed");
    assert!(drained, "sessions finished within the grace period");
    assert_eq!(inserted.inserted_ids.len(), 20_000);
}

/// Three threads sharing one runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn threads_sharing_one_runtime_serve_every_client() {
    clients_are_served("shared", 3).await;
}

/// One thread, a single-threaded runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_thread_serves_every_client() {
    clients_are_served("single", 1).await;
}
