//! The name store against the real upstream: seed 000's schema, one round
//! trip per chain document, many proxies allocating at once, restarts.

use std::collections::{HashMap, HashSet};

use bson::{doc, Document};
use futures::TryStreamExt;
use laconic::token::{NameStore, RoundTrips};
use mongodb::Collection;

use crate::common::{self, db_name};

async fn store_collection(test: &str) -> Collection<Document> {
    let c = common::direct()
        .await
        .database(&db_name(test, "store"))
        .collection::<Document>("names");
    c.drop().await.unwrap();
    c
}

async fn chain(c: &Collection<Document>, scope: &str) -> Vec<Document> {
    c.find(doc! {"scope": scope})
        .sort(doc! {"seq": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

#[tokio::test]
async fn names_are_stored_as_the_seed_describes_with_capped_chained_documents() {
    let c = store_collection("ns_schema").await;
    let store = NameStore::new(c.clone(), 5);
    let names: Vec<String> = (0..12)
        .map(|i| format!("custom attribute number {i}"))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (tokens, trips) = store.tokens("tenant", &refs).await.unwrap();
    assert_eq!(tokens, (0..12).collect::<Vec<u32>>());
    // Open + refresh for each of 3 documents, one push each, and the first load.
    assert!(trips.0 <= 10, "{trips:?}");

    let docs = chain(&c, "tenant").await;
    assert_eq!(docs.len(), 3);
    for (i, d) in docs.iter().enumerate() {
        assert_eq!(d.get_str("_id").unwrap(), format!("tenant/{i}"));
        assert_eq!(d.get_i64("leastvalue").unwrap(), 5 * i as i64);
        let list: Vec<&str> = d
            .get_array("list")
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(list, refs[5 * i..(5 * i + 5).min(12)].to_vec());
    }

    // A hot cache costs no round trip; a known name is never allocated again.
    let (again, trips) = store.tokens("tenant", &refs[3..7]).await.unwrap();
    assert_eq!((again, trips), (vec![3, 4, 5, 6], RoundTrips(0)));
    assert_eq!(store.cached_name("tenant", 7).as_deref(), Some(refs[7]));

    // A cold single name costs one round trip (the push returns the document).
    let (t, trips) = store.tokens("tenant", &["Favorite Player"]).await.unwrap();
    assert_eq!((t, trips), (vec![12], RoundTrips(1)));
    // A batch of 100 new names: one round trip per chain document it fills,
    // plus opening and reading each new document.
    let many: Vec<String> = (0..100).map(|i| format!("batch name {i}")).collect();
    let refs: Vec<&str> = many.iter().map(String::as_str).collect();
    let (t, trips) = store.tokens("tenant", &refs).await.unwrap();
    assert_eq!(t, (13..113).collect::<Vec<u32>>());
    assert!(trips.0 <= 1 + 3 * 20, "{trips:?}");

    // Scopes are separate dictionaries.
    let (t, _) = store.tokens("other", &["Favorite Player"]).await.unwrap();
    assert_eq!(t, vec![0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_proxies_allocating_2000_names_at_once_agree() {
    let c = store_collection("ns_race").await;
    let names: Vec<String> = (0..2000)
        .map(|i| format!("attribute {i:04} of a customer"))
        .collect();
    let mut tasks = Vec::new();
    for p in 0..4u64 {
        // Each "proxy" has its own client, connection pool and cache.
        let coll = common::direct()
            .await
            .database(&db_name("ns_race", "store"))
            .collection::<Document>("names");
        let store = NameStore::new(coll, 100);
        let mut order = names.clone();
        // A different order and batch size per proxy.
        order.rotate_left((p as usize) * 500);
        if p % 2 == 1 {
            order.reverse();
        }
        tasks.push(tokio::spawn(async move {
            let mut mine = HashMap::new();
            for batch in order.chunks(7 + 11 * p as usize) {
                let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
                let (tokens, _) = store.tokens("race", &refs).await.unwrap();
                for (n, t) in batch.iter().zip(tokens) {
                    mine.insert(n.clone(), t);
                }
            }
            mine
        }));
    }
    let mut views = Vec::new();
    for t in tasks {
        views.push(t.await.unwrap());
    }
    for name in &names {
        let t: HashSet<u32> = views.iter().map(|v| v[name]).collect();
        assert_eq!(t.len(), 1, "proxies disagree on {name}: {t:?}");
    }
    let tokens: HashSet<u32> = views[0].values().copied().collect();
    assert_eq!(
        tokens,
        (0..2000).collect::<HashSet<u32>>(),
        "every name has exactly one token"
    );

    let docs = chain(&c, "race").await;
    let mut seen = HashSet::new();
    let mut expected_least = 0;
    for d in &docs {
        assert_eq!(d.get_i64("leastvalue").unwrap(), expected_least);
        let list = d.get_array("list").unwrap();
        assert!(list.len() <= 100);
        for v in list {
            assert!(seen.insert(v.as_str().unwrap().to_owned()), "duplicate {v}");
        }
        expected_least += list.len() as i64;
    }
    assert_eq!(seen.len(), 2000);
}

#[tokio::test]
async fn a_restarted_proxy_reads_the_same_tokens() {
    let c = store_collection("ns_restart").await;
    let names: Vec<String> = (0..40).map(|i| format!("name {i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let (before, _) = NameStore::new(c.clone(), 16)
        .tokens("t", &refs)
        .await
        .unwrap();
    let fresh = NameStore::new(c.clone(), 16);
    let (after, trips) = fresh.tokens("t", &refs).await.unwrap();
    assert_eq!(before, after);
    assert_eq!(trips, RoundTrips(1), "one read, no allocation");
    assert_eq!(
        chain(&c, "t")
            .await
            .iter()
            .map(|d| d.get_array("list").unwrap().len())
            .sum::<usize>(),
        40
    );
}
