//! `laconic bench proxy`: one workload, several ways, in one run.
//!
//! The same driver workload runs directly against the upstream, through a
//! plain TCP relay (haproxy in TCP mode, when it is installed: the floor for
//! any user-space proxy), through a pass-through Laconic and through a
//! tokenizing one. Each proxy is a process of its own, so its CPU time per
//! operation can be read from `/proc`: on a shared machine that is steadier
//! than throughput. Each case runs for a fixed time with 1 and with 16
//! concurrent clients, and reports ops/s, p50 and p99 latency, CPU per
//! operation, and the ratios to the direct baseline. `--bulk` adds the two
//! big batches: a 100,000-document `insert_many` and a client `bulkWrite`
//! of 100,001 inserts.

mod process;
mod relay;
pub mod rewrite;
pub mod store;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, oid::ObjectId, Document};
use futures::TryStreamExt;
use mongodb::{Client, Collection};

use crate::upstream::UpstreamAddr;
use process::{cpu_ticks, cpu_time, Laconic};

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
    /// The tokenizing Laconic (target "tokenizing") turns names of at least
    /// N bytes into tokens; 1, the default, tokenizes every name but `_id`.
    /// 0 leaves that target out.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub tokenize_min_len: usize,
    /// Also run a tokenizing Laconic with metrics collection off (target
    /// "no-metrics"), and report metrics on/off as a ratio.
    #[arg(long)]
    pub metrics_off: bool,
    /// Also run a tokenizing Laconic that requires TLS from drivers (target
    /// "tls"), with this certificate chain (PEM; --tls-key and --tls-ca too),
    /// and report its cost against the plain one.
    #[arg(long, value_name = "FILE", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<std::path::PathBuf>,
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<std::path::PathBuf>,
    /// The CA that signed --tls-cert, for the benchmark's driver.
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// Also time the big batches on every target: insert_many of 100,000
    /// documents and a client bulkWrite of 100,001 inserts.
    #[arg(long)]
    pub bulk: bool,
    /// Run only the per-operation cases whose name contains one of these
    /// (e.g. "insert_one,find_one"); all by default.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Also run a tokenizing Laconic of another build (target "other"; a
    /// profile-guided one, say), in turns with the others: two builds
    /// compared in one run, round by round, where runs apart move by more
    /// than builds differ.
    #[arg(long, value_name = "BINARY")]
    pub other_build: Option<std::path::PathBuf>,
}

/// One measured case.
#[derive(Clone, Debug)]
pub struct Measurement {
    pub ops: usize,
    pub elapsed: Duration,
    pub p50: Duration,
    pub p99: Duration,
    /// The proxy process's CPU time over the case (none for "direct").
    pub cpu: Option<Duration>,
    /// The proxy's CPU µs per operation in each round, in the order the
    /// rounds ran.
    pub per_round: Vec<Option<f64>>,
    /// The proxy's user and system time over the case, in clock ticks.
    pub ticks: Option<(u64, u64)>,
}

/// The latencies of one timed run.
#[derive(Clone, Debug)]
struct Sample {
    latencies: Vec<Duration>,
    elapsed: Duration,
    cpu: Option<Duration>,
    ticks: Option<(u64, u64)>,
}

impl Measurement {
    fn from_samples(samples: Vec<Sample>) -> Measurement {
        let elapsed = samples.iter().map(|s| s.elapsed).sum();
        let cpu = samples.iter().map(|s| s.cpu).sum();
        let ticks = samples
            .iter()
            .map(|s| s.ticks)
            .try_fold((0, 0), |(u, k), t| t.map(|(tu, tk)| (u + tu, k + tk)));
        let per_round = samples
            .iter()
            .map(|s| s.cpu.map(|c| per_op(c, s.latencies.len())))
            .collect();
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
            cpu,
            per_round,
            ticks,
        }
    }

    /// The share of the proxy's CPU time spent in user space (its own
    /// code, not the kernel's system calls), from clock ticks.
    pub fn user_share(&self) -> Option<f64> {
        match self.ticks? {
            (0, 0) => None,
            (user, system) => Some(user as f64 / (user + system) as f64),
        }
    }

    pub fn ops_per_sec(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }

    /// The proxy's CPU time per operation, in µs.
    pub fn cpu_per_op(&self) -> Option<f64> {
        self.cpu.map(|c| per_op(c, self.ops))
    }

    /// This proxy's CPU per operation over `base`'s, round by round: the
    /// two ran in the same round, seconds apart, so each ratio is read
    /// under about one state of a shared machine, which drifts between
    /// rounds.
    pub fn cpu_ratios(&self, base: &Measurement) -> Vec<f64> {
        self.per_round
            .iter()
            .zip(&base.per_round)
            .filter_map(|(m, b)| match (m, b) {
                (Some(m), Some(b)) if *b > 0.0 => Some(m / b),
                _ => None,
            })
            .collect()
    }
}

/// CPU time in µs per operation.
fn per_op(cpu: Duration, ops: usize) -> f64 {
    cpu.as_secs_f64() * 1e6 / ops.max(1) as f64
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    InsertOne,
    FindOneById,
    UpdateOne,
    InsertMany,
    CursorRead,
    ProfileRead,
}

impl Op {
    const ALL: [Op; 6] = [
        Op::InsertOne,
        Op::FindOneById,
        Op::UpdateOne,
        Op::InsertMany,
        Op::CursorRead,
        Op::ProfileRead,
    ];
    fn name(self) -> &'static str {
        match self {
            Op::InsertOne => "insert_one",
            Op::FindOneById => "find_one by _id",
            Op::UpdateOne => "update_one $inc by _id",
            Op::InsertMany => "insert_many (100 docs)",
            Op::CursorRead => "cursor read (1000 docs)",
            Op::ProfileRead => "profile read (100 docs)",
        }
    }
}

const PRELOADED: usize = 1000;

/// Profiles read at once by [`Op::ProfileRead`].
const PROFILES: usize = 100;

/// The user profile of `laconic bench rewrite` without its long note:
/// documents whose names are most of their bytes, the main case of the
/// name store, which grow 2.8 times when expanded.
fn profile(i: i64) -> Document {
    let mut d = rewrite::names_document();
    d.insert("_id", i);
    d
}

/// One way of reaching the upstream: its driver, its collection, and the
/// process whose CPU time is its cost (none for the direct connection).
struct Target {
    name: &'static str,
    client: Client,
    coll: Collection<Document>,
    profiles: Collection<Document>,
    pid: Option<u32>,
}

impl Target {
    fn cpu(&self) -> Option<Duration> {
        self.pid.and_then(cpu_time)
    }

    fn ticks(&self) -> Option<(u64, u64)> {
        self.pid.and_then(cpu_ticks)
    }
}

/// One operation at one concurrency, measured on each target.
type Case = (Op, usize, Vec<(&'static str, Measurement)>);

pub async fn run(args: BenchArgs) -> crate::tools::Result<()> {
    let addr = UpstreamAddr::new(&args.upstream, None)
        .await
        .map_err(crate::tools::Error::from)?;
    let upstream_host = addr.topology.hosts()[0].clone();
    let tokenizing = |extra: &str| {
        format!(
            "[proxy]\n{extra}\n[proxy.tokenize]\nmin_len = {}\nstore_db = \"laconic_bench_store\"\n",
            args.tokenize_min_len
        )
    };
    let pass_through = Laconic::start(&args.upstream, "[proxy]\n")?;
    let tokenizer = if args.tokenize_min_len > 0 {
        Some(Laconic::start(&args.upstream, &tokenizing(""))?)
    } else {
        None
    };
    let quiet = if args.metrics_off {
        Some(Laconic::start(
            &args.upstream,
            &tokenizing("metrics = false"),
        )?)
    } else {
        None
    };
    let other = match &args.other_build {
        Some(binary) => Some(Laconic::start_from(
            binary,
            &args.upstream,
            &tokenizing(""),
        )?),
        None => None,
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(Laconic::start(
            &args.upstream,
            &format!(
                "{}[proxy.tls]\nmode = \"required\"\ncert_file = {:?}\nkey_file = {:?}\n",
                tokenizing(""),
                cert.display().to_string(),
                key.display().to_string()
            ),
        )?),
        _ => None,
    };
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
    let mut targets: Vec<(&'static str, String, Option<u32>)> =
        vec![("direct", uri(&upstream_host), None)];
    if let Some(r) = &relay {
        targets.push(("relay", uri(&r.addr), r.pid()));
    }
    targets.push(("laconic", uri(&pass_through.addr), Some(pass_through.pid())));
    if let Some(t) = &tokenizer {
        targets.push(("tokenizing", uri(&t.addr), Some(t.pid())));
    }
    if let Some(q) = &quiet {
        targets.push(("no-metrics", uri(&q.addr), Some(q.pid())));
    }
    if let Some(o) = &other {
        targets.push(("other", uri(&o.addr), Some(o.pid())));
    }
    if let (Some(t), Some(ca)) = (&tls, &args.tls_ca) {
        let ca = ca.display();
        targets.push((
            "tls",
            format!("{}&tls=true&tlsCAFile={ca}", uri(&t.addr)),
            Some(t.pid()),
        ));
    }
    let mut prepared = Vec::new();
    for (name, uri, pid) in targets {
        let client = Client::with_uri_str(&uri).await?;
        // A database per target: documents written directly must not sit
        // beside tokenized ones (a proxy refuses a database whose documents
        // have no dictionary).
        let db = client.database(&format!("laconic_bench_{}", name.replace('-', "_")));
        let coll = db.collection::<Document>("c");
        coll.drop().await?;
        let docs: Vec<Document> = (0..PRELOADED).map(|i| sample(i as i64)).collect();
        coll.insert_many(docs).await?;
        let profiles = db.collection::<Document>("profiles");
        profiles.drop().await?;
        profiles
            .insert_many((0..PROFILES as i64).map(profile))
            .await?;
        prepared.push(Target {
            name,
            client,
            coll,
            profiles,
            pid,
        });
    }

    println!(
        "workload: {:.1} s per case and target in {} rounds; upstream {upstream_host}; {}",
        args.seconds,
        args.rounds,
        if args.tokenize_min_len > 0 {
            format!(
                "\"tokenizing\" turns names of {}+ bytes into tokens",
                args.tokenize_min_len
            )
        } else {
            "no tokenizing target".into()
        }
    );
    // What the scheduler lets the driver and the proxies use (their CPU
    // affinity, as `scripts/bench.sh --split-cpus` sets it, and any quota):
    // where they run moves the one-client cases (README, Benchmarks).
    println!(
        "cpus: the driver and the proxies run on {}",
        std::thread::available_parallelism().map_or_else(|_| "?".into(), |n| n.to_string())
    );
    let summary = run_cases(&args, &prepared).await?;
    print_summary(&summary);
    if args.bulk {
        run_bulk(&prepared).await?;
    }
    for t in prepared {
        t.coll.drop().await?;
        t.profiles.drop().await?;
        t.client.shutdown().await;
    }
    Ok(())
}

/// Every case, the targets taking turns in rotating rounds.
async fn run_cases(args: &BenchArgs, targets: &[Target]) -> crate::tools::Result<Vec<Case>> {
    println!(
        "{:<26} {:>3} {:<10} {:>10} {:>9} {:>9} {:>11} {:>7}",
        "operation", "c", "target", "ops/s", "p50 µs", "p99 µs", "CPU µs/op", "user"
    );
    let mut summary = Vec::new();
    let ops = Op::ALL.into_iter().filter(|op| {
        args.only.is_empty() || args.only.iter().any(|o| op.name().contains(o.as_str()))
    });
    let ops: Vec<Op> = ops.collect();
    for &c in &args.clients {
        for &op in &ops {
            let rounds = args.rounds.max(1);
            let slice = Duration::from_secs_f64(args.seconds / rounds as f64);
            let mut samples: Vec<Vec<Sample>> = vec![Vec::new(); targets.len()];
            for round in 0..rounds {
                for k in 0..targets.len() {
                    let t = (k + round) % targets.len();
                    samples[t].push(measure(&targets[t], op, c, slice).await?);
                }
            }
            let mut results = Vec::new();
            for (target, s) in targets.iter().zip(samples) {
                let m = Measurement::from_samples(s);
                println!(
                    "{:<26} {:>3} {:<10} {:>10.0} {:>9} {:>9} {:>11} {:>7}",
                    op.name(),
                    c,
                    target.name,
                    m.ops_per_sec(),
                    m.p50.as_micros(),
                    m.p99.as_micros(),
                    m.cpu_per_op().map_or("-".into(), |c| format!("{c:.1}")),
                    m.user_share()
                        .map_or("-".into(), |u| format!("{:.0}%", u * 100.0))
                );
                results.push((target.name, m));
            }
            summary.push((op, c, results));
        }
    }
    Ok(summary)
}

/// The ratios of each case, from one run.
fn print_summary(summary: &[Case]) {
    println!();
    println!("ops/s against direct, and the proxies' CPU µs per operation:");
    // Each column's heading, and its width.
    let columns = [
        ("relay", 9),
        ("laconic", 9),
        ("tokenizing", 11),
        ("CPU relay", 9),
        ("laconic", 9),
        ("tokenizing", 11),
        ("tok CPU/relay", 13),
        ("median per round", 18),
        ("metrics on/off", 14),
        ("tls/plain (p50)", 18),
        ("other CPU/relay", 15),
        ("other/tok rounds", 18),
    ];
    let line = |op: &str, c: &str, cells: &[String]| {
        let cells: Vec<String> = cells
            .iter()
            .zip(columns)
            .map(|(cell, (_, w))| format!("{cell:>w$}"))
            .collect();
        println!("{op:<26} {c:>3} {}", cells.join(" "));
    };
    line("operation", "c", &columns.map(|(h, _)| h.to_owned()));
    for (op, c, results) in summary {
        if let Some(cells) = summary_row(results) {
            line(op.name(), &c.to_string(), &cells);
        }
    }
}

/// The summary's cells for one case, in the order of its header: ops/s
/// over direct's, CPU µs per operation, CPU over haproxy's (the whole case,
/// and the median of its rounds), the other targets against the tokenizing
/// one. `None` without a direct measurement.
fn summary_row(results: &[(&str, Measurement)]) -> Option<[String; 12]> {
    let get = |n: &str| results.iter().find(|(name, _)| *name == n).map(|(_, m)| m);
    let d = get("direct")?;
    let ratio = |m: Option<&Measurement>, base: Option<&Measurement>| match (m, base) {
        (Some(m), Some(b)) => format!("{:.3}x", m.ops_per_sec() / b.ops_per_sec()),
        _ => "-".into(),
    };
    let cpu = |n: &str| {
        get(n)
            .and_then(Measurement::cpu_per_op)
            .map_or("-".into(), |c| format!("{c:.1}"))
    };
    let cpu_over = |n: &str, base: &str| match (
        get(n).and_then(Measurement::cpu_per_op),
        get(base).and_then(Measurement::cpu_per_op),
    ) {
        (Some(t), Some(r)) if r > 0.0 => format!("{:.2}x", t / r),
        _ => "-".into(),
    };
    let rounds = |n: &str, base: &str| match (get(n), get(base)) {
        (Some(t), Some(r)) => spread(&t.cpu_ratios(r)),
        _ => "-".into(),
    };
    let tls = get("tls").map_or("-".into(), |t| {
        let plain = get("tokenizing");
        format!(
            "{} ({:+.0} µs)",
            ratio(Some(t), plain),
            plain.map_or(0.0, |p| (t.p50.as_secs_f64() - p.p50.as_secs_f64()) * 1e6)
        )
    });
    Some([
        ratio(get("relay"), Some(d)),
        ratio(get("laconic"), Some(d)),
        ratio(get("tokenizing"), Some(d)),
        cpu("relay"),
        cpu("laconic"),
        cpu("tokenizing"),
        cpu_over("tokenizing", "relay"),
        rounds("tokenizing", "relay"),
        ratio(get("tokenizing"), get("no-metrics")),
        tls,
        cpu_over("other", "relay"),
        rounds("other", "tokenizing"),
    ])
}

/// The median of some ratios, with the lowest and highest ("1.45
/// (1.31-1.62)"), or "-" for none.
fn spread(ratios: &[f64]) -> String {
    let mut r = ratios.to_vec();
    r.sort_by(f64::total_cmp);
    match (r.first(), r.last()) {
        (Some(lo), Some(hi)) => {
            let mid = r.len() / 2;
            let median = if r.len().is_multiple_of(2) {
                (r[mid - 1] + r[mid]) / 2.0
            } else {
                r[mid]
            };
            format!("{median:.2} ({lo:.2}-{hi:.2})")
        }
        _ => "-".into(),
    }
}

/// The two big batches, once per target: wall time and the proxy's CPU.
async fn run_bulk(targets: &[Target]) -> crate::tools::Result<()> {
    const MANY: usize = 100_000;
    const BULK: usize = 100_001;
    println!();
    println!(
        "{:<10} {:>16} {:>8} {:>9} {:>20} {:>8} {:>9}",
        "target",
        format!("insert_many {}k", MANY / 1000),
        "/direct",
        "CPU s",
        format!("bulkWrite {BULK}"),
        "/direct",
        "CPU s"
    );
    let mut direct: Option<(Duration, Duration)> = None;
    for t in targets {
        let coll = t
            .client
            .database(t.coll.namespace().db.as_str())
            .collection::<Document>("bulk");
        coll.drop().await?;
        let cpu0 = t.cpu();
        let start = Instant::now();
        coll.insert_many((0..MANY as i64).map(|i| doc! {"n": i, "name": "x"}))
            .await?;
        let many = start.elapsed();
        let cpu1 = t.cpu();
        coll.drop().await?;
        let models = (0..BULK as i64)
            .map(|i| coll.insert_one_model(doc! {"n": i, "name": "x"}))
            .collect::<Result<Vec<_>, _>>()?;
        let cpu2 = t.cpu();
        let start = Instant::now();
        let result = t.client.bulk_write(models).await?;
        let bulk = start.elapsed();
        let cpu3 = t.cpu();
        crate::tools::ensure!(
            result.inserted_count == BULK as i64,
            "bulkWrite inserted {}",
            result.inserted_count
        );
        crate::tools::ensure!(
            coll.count_documents(doc! {}).await? == BULK as u64,
            "bulkWrite left a different count"
        );
        coll.drop().await?;
        let base = *direct.get_or_insert((many, bulk));
        let secs = |a: Option<Duration>, b: Option<Duration>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}", (b - a).as_secs_f64()),
            _ => "-".into(),
        };
        println!(
            "{:<10} {:>15.2}s {:>7.3}x {:>9} {:>19.2}s {:>7.3}x {:>9}",
            t.name,
            many.as_secs_f64(),
            many.as_secs_f64() / base.0.as_secs_f64(),
            secs(cpu0, cpu1),
            bulk.as_secs_f64(),
            bulk.as_secs_f64() / base.1.as_secs_f64(),
            secs(cpu2, cpu3),
        );
    }
    Ok(())
}

fn sample(i: i64) -> Document {
    doc! { "_id": i, "name": format!("user-{i}"), "email": format!("user{i}@example.com"), "score": i * 7, "tags": ["a", "b", "c"] }
}

async fn measure(
    target: &Target,
    op: Op,
    clients: usize,
    length: Duration,
) -> crate::tools::Result<Sample> {
    let (cpu_before, ticks_before) = (target.cpu(), target.ticks());
    let start = Instant::now();
    let deadline = start + length;
    let coll = Arc::new(target.coll.clone());
    let profiles = Arc::new(target.profiles.clone());
    let mut tasks = Vec::new();
    for t in 0..clients {
        let (coll, profiles) = (coll.clone(), profiles.clone());
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
                    Op::UpdateOne => {
                        let id = i % PRELOADED as i64;
                        let r = coll
                            .update_one(doc! {"_id": id}, doc! {"$inc": {"score": 1}})
                            .await?;
                        crate::tools::ensure!(r.matched_count == 1, "document {id} missing");
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
                    Op::ProfileRead => {
                        let docs: Vec<Document> =
                            profiles.find(doc! {}).await?.try_collect().await?;
                        crate::tools::ensure!(
                            docs.len() == PROFILES,
                            "read {} profiles",
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
    let elapsed = start.elapsed();
    let cpu = match (cpu_before, target.cpu()) {
        (Some(a), Some(b)) => Some(b.saturating_sub(a)),
        _ => None,
    };
    let ticks = match (ticks_before, target.ticks()) {
        (Some(a), Some(b)) => Some((b.0.saturating_sub(a.0), b.1.saturating_sub(a.1))),
        _ => None,
    };
    Ok(Sample {
        latencies,
        elapsed,
        cpu,
        ticks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(ops: usize, cpu_ms: Option<u64>) -> Sample {
        Sample {
            latencies: vec![Duration::from_micros(100); ops],
            elapsed: Duration::from_secs(1),
            cpu: cpu_ms.map(Duration::from_millis),
            ticks: cpu_ms.map(|ms| (ms / 10, 0)),
        }
    }

    #[test]
    fn the_user_share_is_summed_over_the_rounds() {
        let ticks = |t| Sample {
            ticks: t,
            ..round(10, Some(10))
        };
        // 30 + 10 ticks of user time, 10 + 30 of system time.
        let m = Measurement::from_samples(vec![ticks(Some((30, 10))), ticks(Some((10, 30)))]);
        assert_eq!(m.ticks, Some((40, 40)));
        assert_eq!(m.user_share(), Some(0.5));
        let m = Measurement::from_samples(vec![ticks(Some((3, 1))), ticks(Some((0, 0)))]);
        assert_eq!(m.user_share(), Some(0.75));
        // A round without a reading leaves the case without one.
        let m = Measurement::from_samples(vec![ticks(Some((3, 1))), ticks(None)]);
        assert_eq!(m.user_share(), None);
        // Nor is there a share of no time at all.
        let m = Measurement::from_samples(vec![ticks(Some((0, 0)))]);
        assert_eq!(m.user_share(), None);
    }

    #[test]
    fn another_build_is_set_against_haproxy_and_this_build_round_by_round() {
        let m = |rounds: Vec<Sample>| Measurement::from_samples(rounds);
        // 1,000 ops a round; CPU per op: haproxy 100 and 100 µs, this
        // build 200 and 180, the other 150 and 180.
        let results = vec![
            ("direct", m(vec![round(1000, None), round(1000, None)])),
            (
                "relay",
                m(vec![round(1000, Some(100)), round(1000, Some(100))]),
            ),
            (
                "tokenizing",
                m(vec![round(1000, Some(200)), round(1000, Some(180))]),
            ),
            (
                "other",
                m(vec![round(1000, Some(150)), round(1000, Some(180))]),
            ),
        ];
        let row = summary_row(&results).unwrap();
        assert_eq!(row[5], "190.0");
        assert_eq!(row[6], "1.90x");
        assert_eq!(row[7], "1.90 (1.80-2.00)");
        assert_eq!(row[10], "1.65x");
        assert_eq!(row[11], "0.88 (0.75-1.00)");
        // Without it, its cells are empty; without direct, there is no row.
        let row = summary_row(&results[..3]).unwrap();
        assert_eq!((row[10].as_str(), row[11].as_str()), ("-", "-"));
        assert!(summary_row(&results[1..]).is_none());
    }

    #[test]
    fn cpu_ratios_pair_the_rounds() {
        // Round 1: 200 against 100 µs per op; round 2: 150 against 120.
        let tok = Measurement::from_samples(vec![round(1000, Some(200)), round(2000, Some(300))]);
        let relay = Measurement::from_samples(vec![round(1000, Some(100)), round(2500, Some(300))]);
        assert_eq!(tok.per_round, vec![Some(200.0), Some(150.0)]);
        assert_eq!(tok.cpu_ratios(&relay), vec![2.0, 1.25]);
        assert_eq!(spread(&tok.cpu_ratios(&relay)), "1.62 (1.25-2.00)");
        assert_eq!(spread(&[1.5, 1.1, 3.0]), "1.50 (1.10-3.00)");
        // Over the whole case: 500 ms for 3,000 ops against 400 ms for 3,500.
        let whole = tok.cpu_per_op().unwrap() / relay.cpu_per_op().unwrap();
        assert!((whole - (500.0 / 3000.0) / (400.0 / 3500.0)).abs() < 1e-9);
        // A round without a CPU reading pairs with nothing.
        let direct = Measurement::from_samples(vec![round(10, None), round(10, None)]);
        assert!(tok.cpu_ratios(&direct).is_empty());
        assert_eq!(spread(&[]), "-");
    }
}
