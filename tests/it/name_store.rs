//! The name store against the real upstream: the dictionary in each
//! database's `__laconic` collection, capped chained documents, one round
//! trip per chain document, token order equal to name order, many proxies
//! allocating at once, restarts.

use std::collections::{HashMap, HashSet};

use bson::{doc, Document};
use futures::TryStreamExt;
use laconic::token::{NameStore, Names, RoundTrips};
use mongodb::Collection;

use crate::common::{self, db_name};

/// A dropped database for `test`, and its dictionary collection.
async fn store_db(test: &str) -> (String, Collection<Document>) {
    let name = db_name(test, "store");
    let db = common::direct().await.database(&name);
    db.drop().await.unwrap();
    (name, db.collection("__laconic"))
}

async fn store(cap: usize) -> NameStore {
    NameStore::new(common::direct().await, cap, Default::default())
}

async fn chain(c: &Collection<Document>) -> Vec<Document> {
    c.find(doc! {"chain": "names"})
        .sort(doc! {"seq": 1})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap()
}

fn token(store: &NameStore, scope: &str, name: &str) -> Vec<u8> {
    let d = store.dictionary(scope).unwrap();
    d.token(name)
        .unwrap_or_else(|| panic!("{name} has no token"))
        .as_bytes()
        .to_vec()
}

#[tokio::test]
async fn names_are_stored_in_capped_chained_documents_with_tokens_in_name_order() {
    let (scope, c) = store_db("ns_schema").await;
    let store = store(5).await;
    let names: Vec<String> = (0..12)
        .map(|i| format!("custom attribute number {i:02}"))
        .collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let trips = store.allocate(&scope, &refs, &[]).await.unwrap();
    // The first load, the head, then for each of 3 documents an open, a
    // read and a push.
    assert!(trips.0 <= 14, "{trips:?}");

    let docs = chain(&c).await;
    assert_eq!(docs.len(), 3);
    for (i, d) in docs.iter().enumerate() {
        assert_eq!(d.get_i64("seq").unwrap(), i as i64);
        let list = d.get_array("names").unwrap();
        assert_eq!(list.len(), if i < 2 { 5 } else { 2 }, "capped at 5");
        assert_eq!(d.get_array("tokens").unwrap().len(), list.len());
        assert_eq!(d.get_array("checks").unwrap().len(), list.len());
    }
    let head = c
        .find_one(doc! {"_id": "dictionary"})
        .await
        .unwrap()
        .unwrap();
    assert_eq!(head.get_i32("format").unwrap(), 2);
    assert_eq!(head.get_i64("cap").unwrap(), 5);

    // Token order is name order.
    let tokens: Vec<Vec<u8>> = refs.iter().map(|n| token(&store, &scope, n)).collect();
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");

    // A hot cache costs no round trip.
    let trips = store.allocate(&scope, &refs[3..7], &[]).await.unwrap();
    assert_eq!(trips, RoundTrips(0));
    // A new name in the open document costs one (the push returns it).
    let trips = store
        .allocate(&scope, &["custom attribute number 05½"], &[])
        .await
        .unwrap();
    assert_eq!(trips, RoundTrips(1));
    let between = token(&store, &scope, "custom attribute number 05½");
    assert!(tokens[5] < between && between < tokens[6]);

    // Values keep seed 000's numbering: the next numbers, in one push.
    let trips = store
        .allocate(&scope, &[], &["Taylor Swift", "Bad Bunny"])
        .await
        .unwrap();
    let d = store.dictionary(&scope).unwrap();
    let mut numbers = [d.value_token("Taylor Swift"), d.value_token("Bad Bunny")];
    numbers.sort();
    assert_eq!(numbers, [Some(0), Some(1)]);
    assert!(trips.0 <= 4, "{trips:?}");

    // Databases are separate dictionaries.
    let (other, _) = store_db("ns_schema_other").await;
    store
        .allocate(&other, &["Favorite Player"], &[])
        .await
        .unwrap();
    assert_eq!(store.dictionary(&other).unwrap().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_proxies_allocating_2000_names_at_once_agree_and_keep_name_order() {
    let (scope, c) = store_db("ns_race").await;
    let names: Vec<String> = (0..2000)
        .map(|i| format!("attribute {:04} of a customer", (i * 7919) % 2000))
        .collect();
    let mut tasks = Vec::new();
    for p in 0..4u64 {
        // Each "proxy" has its own client, connection pool and cache.
        let store = store(100).await;
        let scope = scope.clone();
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
                store.allocate(&scope, &refs, &[]).await.unwrap();
                let d = store.dictionary(&scope).unwrap();
                for n in batch {
                    mine.insert(n.clone(), d.token(n).unwrap().as_bytes().to_vec());
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
        let t: HashSet<&Vec<u8>> = views.iter().map(|v| &v[name]).collect();
        assert_eq!(t.len(), 1, "proxies disagree on {name}: {t:?}");
    }
    let mut by_name: Vec<(&String, &Vec<u8>)> = views[0].iter().collect();
    by_name.sort();
    assert!(
        by_name.windows(2).all(|w| w[0].1 < w[1].1),
        "token order is name order"
    );

    let docs = chain(&c).await;
    let mut seen = HashSet::new();
    for d in &docs {
        let list = d.get_array("names").unwrap();
        assert!(list.len() <= 100);
        for v in list {
            assert!(seen.insert(v.as_str().unwrap().to_owned()), "duplicate {v}");
        }
    }
    assert_eq!(seen.len(), 2000);
}

#[tokio::test]
async fn a_restarted_proxy_reads_the_same_tokens_in_one_round_trip() {
    let (scope, c) = store_db("ns_restart").await;
    let names: Vec<String> = (0..40).map(|i| format!("name {i}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let first = store(16).await;
    first.allocate(&scope, &refs, &[]).await.unwrap();
    let fresh = store(1000).await;
    let trips = fresh.allocate(&scope, &refs, &[]).await.unwrap();
    assert_eq!(trips, RoundTrips(1), "one read, no allocation");
    for n in &refs {
        assert_eq!(token(&first, &scope, n), token(&fresh, &scope, n));
    }
    // The store's cap rules, whatever the proxy's own setting.
    assert_eq!(fresh.dictionary(&scope).unwrap().cap, 16);
    assert_eq!(
        chain(&c)
            .await
            .iter()
            .map(|d| d.get_array("names").unwrap().len())
            .sum::<usize>(),
        40
    );
}

/// Every command of the store is answered only once a majority has
/// journaled it, reads only majority-committed data, and goes to the
/// primary, whatever the URI asks of the client (here `w=1`, no journal,
/// `local` reads from a secondary). Otherwise a failover could take back a
/// token that documents already hold, and a later allocation could give it
/// to another name.
#[tokio::test]
async fn the_store_writes_and_reads_what_a_majority_holds_whatever_the_uri_says() {
    let (scope, _) = store_db("ns_concerns").await;
    let tap = common::tap(common::upstream().host.clone()).await;
    let uri = format!(
        "mongodb://{}/?directConnection=true&w=1&journal=false&readConcernLevel=local&readPreference=secondaryPreferred",
        tap.addr
    );
    let client = mongodb::Client::with_uri_str(uri).await.unwrap();
    let store = NameStore::new(client, 1000, Default::default());
    store
        .allocate(&scope, &["a long field name", "another one"], &["gold"])
        .await
        .unwrap();
    // A second proxy's first read, then the once-a-second revalidation.
    let other = NameStore::new(
        mongodb::Client::with_uri_str(format!("mongodb://{}/?directConnection=true&w=1", tap.addr))
            .await
            .unwrap(),
        1000,
        Default::default(),
    );
    other.refresh(&scope).await.unwrap();
    other.revalidate().await;
    assert_eq!(
        token(&store, &scope, "another one"),
        token(&other, &scope, "another one")
    );

    let store_collections = ["__laconic", "__laconic_mark"];
    let (mut writes, mut reads) = (Vec::new(), Vec::new());
    for c in tap.commands() {
        let Some((name, target)) = c.iter().next() else {
            continue;
        };
        if c.get_str("$db") != Ok(scope.as_str())
            || !target
                .as_str()
                .is_some_and(|t| store_collections.contains(&t))
        {
            continue;
        }
        match name.as_str() {
            "findAndModify" | "update" | "insert" | "delete" => writes.push(c),
            "find" | "aggregate" => reads.push(c),
            other => panic!("the store sent an unexpected command: {other}"),
        }
    }
    // The head, the mark, the names' chain document (opened, then pushed
    // to) and the values' (the same): at least six writes; a read after
    // each open, and the other store's two.
    assert!(writes.len() >= 6, "{writes:#?}");
    assert!(reads.len() >= 4, "{reads:#?}");
    for w in &writes {
        let concern = w
            .get_document("writeConcern")
            .unwrap_or_else(|_| panic!("{w}"));
        assert_eq!(concern.get_str("w"), Ok("majority"), "{w}");
        assert_eq!(concern.get_bool("j"), Ok(true), "{w}");
        let wait = concern
            .get("wtimeout")
            .and_then(bson::Bson::as_i64)
            .or_else(|| {
                concern
                    .get("wtimeout")
                    .and_then(bson::Bson::as_i32)
                    .map(i64::from)
            });
        assert_eq!(wait, Some(10_000), "{w}");
    }
    for r in &reads {
        let level = r
            .get_document("readConcern")
            .and_then(|c| c.get_str("level"));
        assert_eq!(level, Ok("majority"), "{r}");
        // On a direct connection to one server a driver asks for the
        // primary as `primaryPreferred` (so that the server answers if it is
        // a secondary); the URI's `secondaryPreferred` is not what is sent.
        let mode = r
            .get_document("$readPreference")
            .and_then(|p| p.get_str("mode"));
        assert!(
            matches!(mode, Ok("primaryPreferred") | Ok("primary")) || mode.is_err(),
            "{r}"
        );
    }
}

/// A `dropDatabase` through the proxy while a revalidation of the
/// dictionary is rebuilding what it read before the drop: the proxy's next
/// use reads the store again rather than share that read, which would keep
/// the dropped dictionary and give its tokens to the database's new
/// documents (which no dictionary in the store records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_during_a_revalidation_is_read_again_not_shared() {
    let (scope, _) = store_db("ns_droprace").await;
    let store = store(1000).await;
    let client = common::direct().await;
    // Enough names that rebuilding them outlasts a drop.
    let names: Vec<String> = (0..4000).map(|i| format!("a field name {i:05}")).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    for round in 0..3 {
        store.allocate(&scope, &refs, &[]).await.unwrap();
        // A new name: the store's bytes change, so the revalidation rebuilds.
        store
            .allocate(&scope, &[&format!("round {round}")], &[])
            .await
            .unwrap();
        let revalidation = tokio::spawn({
            let store = store.clone();
            async move { store.revalidate().await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
        client.database(&scope).drop().await.unwrap();
        store.suspect(&scope);
        store.ensure_loaded(&scope).await.unwrap();
        assert!(
            store.dictionary(&scope).unwrap().is_empty(),
            "round {round}: the dictionary dropped with the database is still used"
        );
        revalidation.await.unwrap();
    }
}

/// A revalidation that begins after a `dropDatabase` went through answers
/// for it only once its read is in place: a command arriving while it
/// reads waits for it, instead of taking the dictionary it is replacing for
/// a fresh one (and storing the dropped dictionary's tokens, which no
/// dictionary in the store records).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_during_the_revalidation_after_a_drop_waits_for_it() {
    let (scope, _) = store_db("ns_dropwait").await;
    let store = store(1000).await;
    let client = common::direct().await;
    let mut raced = 0;
    for round in 0..20 {
        store
            .allocate(&scope, &[&format!("a field name {round}")], &[])
            .await
            .unwrap();
        assert!(store.loaded(&scope));
        client.database(&scope).drop().await.unwrap();
        store.suspect(&scope);
        let revalidation = tokio::spawn({
            let store = store.clone();
            async move { store.revalidate().await }
        });
        // Let the revalidation begin its read.
        tokio::time::sleep(std::time::Duration::from_micros(300)).await;
        raced += usize::from(!revalidation.is_finished());
        store.ensure_loaded(&scope).await.unwrap();
        assert!(
            store.dictionary(&scope).unwrap().is_empty(),
            "round {round}: the dictionary dropped with the database is still used"
        );
        revalidation.await.unwrap();
    }
    assert!(raced > 0, "no command arrived during a revalidation");
}
