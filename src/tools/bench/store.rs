//! `laconic bench store`: what the name store costs, in round trips to the
//! upstream and in time: a hot cache, one new name, a batch of 100 new names,
//! and a batch that fills one chain document and opens the next.

use std::time::{Duration, Instant};

use crate::token::NameStore;

#[derive(clap::Args, Debug, Clone)]
pub struct StoreArgs {
    /// The upstream holding the store (a mongodb:// URI).
    #[arg(long, env = "LACONIC_UPSTREAM")]
    pub upstream: String,
    /// Names per store document (the default configuration's cap).
    #[arg(long, default_value_t = 1000)]
    pub cap: usize,
}

pub async fn run(args: &StoreArgs) -> crate::tools::Result<()> {
    let client = mongodb::Client::with_uri_str(&args.upstream).await?;
    let scope = "laconic_bench_store";
    let db = client.database(scope);
    db.drop().await?;
    let store = NameStore::new(client.clone(), args.cap, Default::default());
    let names = |prefix: &str, n: usize| -> Vec<String> {
        (0..n)
            .map(|i| format!("{prefix} attribute {i:04}"))
            .collect()
    };
    let mut rows: Vec<(String, usize, Duration)> = Vec::new();
    let mut measure = |label: &str, trips: usize, took: Duration| {
        rows.push((label.to_owned(), trips, took));
    };

    let first = names("first", 10);
    let refs: Vec<&str> = first.iter().map(String::as_str).collect();
    let t = Instant::now();
    let trips = store.allocate(scope, &refs, &[]).await?;
    measure("10 new names, empty store", trips.0, t.elapsed());

    let t = Instant::now();
    let trips = store.allocate(scope, &refs, &[]).await?;
    measure("10 known names (hot cache)", trips.0, t.elapsed());

    let t = Instant::now();
    let trips = store.allocate(scope, &["one more name"], &[]).await?;
    measure("1 new name (cold)", trips.0, t.elapsed());

    let batch = names("batch", 100);
    let refs: Vec<&str> = batch.iter().map(String::as_str).collect();
    let t = Instant::now();
    let trips = store.allocate(scope, &refs, &[]).await?;
    measure("100 new names in one command", trips.0, t.elapsed());

    // Fill the current document to its cap, then cross into the next one.
    let held = 111;
    let fill = names("fill", args.cap.saturating_sub(held + 50));
    let refs: Vec<&str> = fill.iter().map(String::as_str).collect();
    store.allocate(scope, &refs, &[]).await?;
    let crossing = names("crossing", 100);
    let refs: Vec<&str> = crossing.iter().map(String::as_str).collect();
    let t = Instant::now();
    let trips = store.allocate(scope, &refs, &[]).await?;
    measure(
        "100 new names across a document boundary",
        trips.0,
        t.elapsed(),
    );

    // A second proxy's view: one read loads the whole chain.
    let other = NameStore::new(client.clone(), args.cap, Default::default());
    let t = Instant::now();
    let trips = other.refresh(scope).await?;
    measure("a fresh proxy loads the chain", trips.0, t.elapsed());

    println!("name store: cap {} names per document", args.cap);
    println!("{:<44} {:>12} {:>10}", "operation", "round trips", "ms");
    for (label, trips, took) in rows {
        println!("{label:<44} {trips:>12} {:>10.2}", took.as_secs_f64() * 1e3);
    }
    db.drop().await?;
    Ok(())
}
