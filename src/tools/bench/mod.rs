//! `laconic bench proxy`: one workload, three ways, in one run.
//!
//! The same driver workload runs directly against the upstream, through
//! Laconic, and through a plain TCP relay (haproxy in TCP mode, when it is
//! installed): the relay is the floor for any user-space proxy. Each case
//! runs for a fixed time with 1 and with 16 concurrent clients, and reports
//! ops/s, p50 and p99 latency, and the ratios to the direct baseline.

mod relay;
pub mod rewrite;
pub mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, oid::ObjectId, Document};
use futures::TryStreamExt;
use mongodb::{Client, Collection};

use crate::config::ProxyConfig;
use crate::downstream::Proxy;
use crate::upstream::UpstreamAddr;

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// The upstream to measure against (a mongodb:// URI).
    #[arg(long, env = "LACONIC_UPSTREAM")]
    pub upstream: String,
    /// Seconds each case runs for, per target, over all rounds.
    #[arg(long, default_value_t = 3.0)]
    pub seconds: f64,
    /// Each case is split into this many rounds, the targets taking turns in a
    /// rotating order, so that drift in the upstream affects all of them alike.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Concurrency levels to run.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1usize, 16])]
    pub clients: Vec<usize>,
    /// Skip the haproxy relay even if it is installed.
    #[arg(long)]
    pub no_relay: bool,
    /// Run Laconic with tokenization on: names of at least N bytes become
    /// tokens (the workload's names are 4–5 bytes long).
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub tokenize_min_len: usize,
    /// Also run a second Laconic with metrics collection off (target
    /// "no-metrics"), and report metrics on/off as a ratio.
    #[arg(long)]
    pub metrics_off: bool,
    /// Also run a Laconic that requires TLS from drivers (target "tls"),
    /// with this certificate chain (PEM; --tls-key and --tls-ca too), and
    /// report its cost against the plain one.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<std::path::PathBuf>,
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The CA that signed --tls-cert, for the benchmark's driver.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
}

/// One measured case.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub ops: usize,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
}

/// The latencies of one timed run.
#[derive(Clone, Debug)]
struct Sample {
    latencies: Vec<Duration>,
    elapsed: Duration,
}

impl Measurement {
    fn from_samples(samples: Vec<Sample>) -> Measurement {
        let elapsed = samples.iter().map(|s| s.elapsed).sum();
        let mut all: Vec<Duration> = samples.into_iter().flat_map(|s| s.latencies).collect();
        all.sort();
        let pct = |p: f64| {
            all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
                .copied()
                .unwrap_or_default()
        };
        Measurement {
            ops: all.len(),
            elapsed,
            p50: pct(0.50),
            p99: pct(0.99),
        }
    }

    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    InsertOne,
    FindOneById,
    InsertMany,
    CursorRead,
}

impl Op {
    const ALL: [Op; 4] = [
        Op::InsertOne,
        Op::FindOneById,
        Op::InsertMany,
        Op::CursorRead,
    ];
    fn name(self) -> &'static str {
        match self {
            Op::InsertOne => "insert_one",
            Op::FindOneById => "find_one by _id",
            Op::InsertMany => "insert_many (100 docs)",
            Op::CursorRead => "cursor read (1000 docs)",
        }
    }
}

const PRELOADED: usize = 1000;

/// One operation at one concurrency, measured on each target.
type Case<'a> = (Op, usize, Vec<(&'a str, Measurement)>);

pub async fn run(args: BenchArgs) -> crate::tools::Result<()> {
    let addr = UpstreamAddr::parse(&args.upstream).map_err(crate::tools::Error::from)?;
    let upstream_host = addr.hosts[0].clone();
    let mut config = ProxyConfig {
        listen: "127.0.0.1:0".into(),
        upstream: args.upstream.clone(),
        ..ProxyConfig::default()
    };
    config.tokenize.min_len = args.tokenize_min_len;
    config.tokenize.store_db = "laconic_bench_store".into();
    let quiet = if args.metrics_off {
        let config = ProxyConfig {
            metrics: false,
            ..config.clone()
        };
        Some(Proxy::start(config).await?)
    } else {
        None
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let mut c = config.clone();
            c.tls = crate::config::TlsConfig {
                mode: crate::config::TlsMode::Required,
                cert_file: Some(cert.clone()),
                key_file: Some(key.clone()),
                client_ca_file: None,
            };
            Some(Proxy::start(c).await?)
        }
        _ => None,
    };
    let proxy = Proxy::start(config).await?;
    let relay = if args.no_relay {
        None
    } else {
        match relay::Haproxy::start(&upstream_host).await {
            Ok(r) => Some(r),
            Err(e) => {
                println!("(no TCP relay: {e})");
                None
            }
        }
    };

    let uri = |host: &str| {
        format!("mongodb://{host}/?directConnection=true&retryWrites=false&maxPoolSize=64")
    };
    let mut targets = vec![
        ("direct", uri(&upstream_host)),
        ("laconic", uri(&proxy.addr.to_string())),
    ];
    if let Some(q) = &quiet {
        targets.push(("no-metrics", uri(&q.addr.to_string())));
    }
    if let Some(r) = &relay {
        targets.push(("relay", uri(&r.addr)));
    }
    if let (Some(t), Some(ca)) = (&tls, &args.tls_ca) {
        let ca = ca.display();
        targets.push((
            "tls",
            format!("{}&tls=true&tlsCAFile={ca}", uri(&t.addr.to_string())),
        ));
    }
    let mut clients = Vec::new();
    for (name, uri) in &targets {
        let client = Client::with_uri_str(uri).await?;
        // A database per target: documents written directly must not sit
        // beside tokenized ones (a proxy refuses a database whose documents
        // have no dictionary).
        let coll = client
            .database(&format!("laconic_bench_{}", name.replace('-', "_")))
            .collection::<Document>("c");
        coll.drop().await?;
        let docs: Vec<Document> = (0..PRELOADED).map(|i| sample(i as i64)).collect();
        coll.insert_many(docs).await?;
        clients.push((*name, client, coll));
    }

    println!(
        "workload: {:.1} s per case and target in {} rounds; upstream {upstream_host}; proxy {}{}",
        args.seconds,
        args.rounds,
        proxy.addr,
        if args.tokenize_min_len > 0 {
            format!(" (tokenizing names of {}+ bytes)", args.tokenize_min_len)
        } else {
            String::new()
        }
    );
    let summary = run_cases(&args, &clients).await?;
    print_summary(&summary);
    for (_, client, coll) in clients {
        coll.drop().await?;
        client.shutdown().await;
    }
    proxy.shutdown.trigger();
    for p in quiet.iter().chain(&tls) {
        p.shutdown.trigger();
    }
    Ok(())
}

/// Every case, the targets taking turns in rotating rounds.
async fn run_cases<'a>(
    args: &BenchArgs,
    clients: &[(&'a str, Client, Collection<Document>)],
) -> crate::tools::Result<Vec<Case<'a>>> {
    println!(
        "{:<26} {:>3} {:<10} {:>10} {:>9} {:>9}",
        "operation", "c", "target", "ops/s", "p50 µs", "p99 µs"
    );
    let mut summary = Vec::new();
    for &c in &args.clients {
        for op in Op::ALL {
            let rounds = args.rounds.max(1);
            let slice = Duration::from_secs_f64(args.seconds / rounds as f64);
            let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); clients.len()];
            for round in 0..rounds {
                for k in 0..clients.len() {
                    let t = (k + round) % clients.len();
                    samples[t].push(measure(clients[t].2.clone(), op, c, slice).await?);
                }
            }
            let mut results = Vec::new();
            for ((name, _, _), s) in clients.iter().zip(samples) {
                let m = Measurement::from_samples(s);
                println!(
                    "{:<26} {:>3} {:<10} {:>10.0} {:>9} {:>9}",
                    op.name(),
                    c,
                    name,
                    m.ops_per_sec(),
                    m.p50.as_micros(),
                    m.p99.as_micros()
                );
                results.push((*name, m));
            }
            summary.push((op, c, results));
        }
    }

    Ok(summary)
}

/// The ratios of each case, from one run.
fn print_summary(summary: &[Case<'_>]) {
    println!();
    println!(
        "{:<26} {:>3} {:>18} {:>18} {:>22} {:>18} {:>24}",
        "operation",
        "c",
        "laconic/direct",
        "relay/direct",
        "added p50 vs relay's",
        "metrics on/off",
        "tls/plain (added p50)"
    );
    for (op, c, results) in summary {
        let get = |n: &str| results.iter().find(|(name, _)| *name == n).map(|(_, m)| m);
        let (Some(d), Some(l)) = (get("direct"), get("laconic")) else {
            continue;
        };
        let relay = get("relay");
        let added = |m: &Measurement| m.p50.as_secs_f64() - d.p50.as_secs_f64();
        let ratio = |m: Option<&Measurement>, base: &Measurement| {
            m.map_or("-".into(), |m| {
                format!("{:.3}x", m.ops_per_sec() / base.ops_per_sec())
            })
        };
        let tls = get("tls").map_or("-".into(), |t| {
            format!(
                "{} ({:+.0} µs)",
                ratio(Some(t), l),
                (t.p50.as_secs_f64() - l.p50.as_secs_f64()) * 1e6
            )
        });
        println!(
            "{:<26} {:>3} {:>17.3}x {:>18} {:>22} {:>18} {:>24}",
            op.name(),
            c,
            l.ops_per_sec() / d.ops_per_sec(),
            ratio(relay, d),
            relay.map_or("-".into(), |r| {
                format!("{:+.0} µs vs {:+.0} µs", added(l) * 1e6, added(r) * 1e6)
            }),
            get("no-metrics").map_or("-".into(), |q| ratio(Some(l), q)),
            tls,
        );
    }
}

fn sample(i: i64) -> Document {
    doc! { "_id": i, "name": format!("user-{i}"), "email": format!("user{i}@example.com"), "score": i * 7, "tags": ["a", "b", "c"] }
}

async fn measure(
    coll: Collection<Document>,
    op: Op,
    clients: usize,
    length: Duration,
) -> crate::tools::Result<Sample> {
    let start = Instant::now();
    let deadline = start + length;
    let coll = Arc::new(coll);
    let mut tasks = Vec::new();
    for t in 0..clients {
        let coll = coll.clone();
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut i = t as i64;
            while Instant::now() < deadline {
                let began = Instant::now();
                match op {
                    Op::InsertOne => {
                        coll.insert_one(
                            doc! {"_id": ObjectId::new(), "n": i, "name": "x".repeat(40)},
                        )
                        .await?;
                    }
                    Op::FindOneById => {
                        let id = i % PRELOADED as i64;
                        crate::tools::ensure!(
                            coll.find_one(doc! {"_id": id}).await?.is_some(),
                            "document {id} missing"
                        );
                    }
                    Op::InsertMany => {
                        let docs =
                            (0..100).map(|k| doc! {"_id": ObjectId::new(), "n": i * 100 + k});
                        coll.insert_many(docs).await?;
                    }
                    Op::CursorRead => {
                        let docs: Vec<Document> = coll
                            .find(doc! {"_id": {"$lt": PRELOADED as i64}})
                            .await?
                            .try_collect()
                            .await?;
                        crate::tools::ensure!(
                            docs.len() == PRELOADED,
                            "read {} documents",
                            docs.len()
                        );
                    }
                }
                latencies.push(began.elapsed());
                i += clients as i64;
            }
            Ok::<_, crate::tools::Error>(latencies)
        }));
    }
    let mut latencies = Vec::new();
    for t in tasks {
        latencies.extend(t.await??);
    }
    Ok(Sample {
        latencies,
        elapsed: start.elapsed(),
    })
}
