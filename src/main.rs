//! The `laconic` command line: `serve`, `replay`, `bench`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Args, Parser, Subcommand};
use laconic::config::{Config, LogFormat};
use laconic::downstream::Proxy;
use laconic::upstream::UpstreamAddr;
use tracing::{info, warn};

#[derive(Parser)]
#[command(
    name = "laconic",
    version,
    about = "A transparent MongoDB wire-protocol proxy"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Serve(Box<ServeArgs>),
    /// Replay captured sessions against a target and report differing replies.
    Replay(ReplayArgs),
    /// Benchmarks: the proxy against direct and relayed connections, or the shard model.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Generate or decode Locality UUIDs.
    #[command(subcommand)]
    Uuid(UuidCommand),
    /// Where a collection's bytes go, and what tokenization would save.
    Analyze(Box<AnalyzeArgs>),
    /// Rewrite an existing collection into tokenized form, or back (--reverse).
    Migrate(Box<MigrateArgs>),
    /// A live view of a running proxy, from its /metrics (rates per command,
    /// bytes saved, name store, errors).
    Top(TopArgs),
    /// A database's dictionary: verify, export, import, stats, init.
    #[command(subcommand)]
    Store(StoreCommand),
}

#[derive(Args)]
struct StoreTarget {
    /// The deployment (the upstream, not the proxy), as a mongodb:// URI.
    #[arg(long, env = "LACONIC_UPSTREAM")]
    uri: String,
}

#[derive(Subcommand)]
enum StoreCommand {
    /// Check a dictionary, then every document of DB (or DB.COLL) against
    /// it; exits non-zero if a document holds tokens it does not know.
    Verify {
        #[command(flatten)]
        target: StoreTarget,
        /// DB or DB.COLL
        namespace: String,
    },
    /// Write DB's dictionary to FILE (Extended JSON), or to stdout.
    Export {
        #[command(flatten)]
        target: StoreTarget,
        db: String,
        file: Option<PathBuf>,
    },
    /// Put an exported dictionary back into DB: only onto an empty store or
    /// an older state of the same dictionary.
    Import {
        #[command(flatten)]
        target: StoreTarget,
        db: String,
        file: PathBuf,
    },
    /// Names, values, chain documents and mark of DB's dictionary.
    Stats {
        #[command(flatten)]
        target: StoreTarget,
        db: String,
    },
    /// Give DB a dictionary although it holds documents (they predate
    /// Laconic); refused if any of them holds keys that read as tokens.
    Init {
        #[command(flatten)]
        target: StoreTarget,
        db: String,
        /// Names per chain document.
        #[arg(long, default_value_t = 1000)]
        cap: usize,
        /// Adopt even documents whose keys read as tokens.
        #[arg(long)]
        force: bool,
    },
}

#[derive(Args)]
struct TopArgs {
    /// The proxy's metrics address (its --metrics-listen).
    #[arg(long, default_value = "127.0.0.1:9216", env = "LACONIC_METRICS_LISTEN")]
    metrics: String,
    /// Seconds between two scrapes.
    #[arg(long, default_value_t = 2.0)]
    interval: f64,
    /// Print the totals since the proxy started, once, and exit.
    #[arg(long)]
    once: bool,
}

#[derive(Args)]
struct MigrateArgs {
    /// The deployment (the upstream, not the proxy), as a mongodb:// URI.
    #[arg(long, env = "LACONIC_UPSTREAM")]
    uri: String,
    #[arg(long)]
    db: String,
    #[arg(long)]
    collection: String,
    /// Write the documents back with full names.
    #[arg(long)]
    reverse: bool,
    /// Documents per batch.
    #[arg(long, default_value_t = 500)]
    batch: usize,
    /// Print what would be done (documents, indexes) and change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Configuration file whose [proxy.tokenize] settings apply.
    #[arg(long, env = "LACONIC_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    tokenize: TokenizeArgs,
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Throughput and latency directly, through Laconic and through a TCP relay, in one run.
    Proxy(laconic::tools::bench::BenchArgs),
    /// Model a range-sharded collection fed with different _id schemes.
    Shards(laconic::locality::simulate::Params),
    /// The cost of tokenizing and expanding a 1 KB document, against a plain copy.
    Rewrite(laconic::tools::bench::rewrite::RewriteArgs),
    /// Round trips and time the name store costs.
    Store(laconic::tools::bench::store::StoreArgs),
}

#[derive(Subcommand)]
enum UuidCommand {
    /// Print new Locality UUIDs.
    Gen {
        /// Sequential mode: ids of the same 10-minute window share a prefix and increase.
        #[arg(long)]
        sequential: bool,
        /// How many.
        #[arg(short = 'n', default_value_t = 1)]
        n: usize,
        /// A node id that replaces the process-id and MAC fields (for containers).
        #[arg(long, env = "LACONIC_NODE_ID")]
        node_id: Option<u64>,
    },
    /// Print the counter, process id, MAC fragment and timestamp of a Locality UUID.
    Decode {
        uuid: String,
        /// Read the counter as a sequential-mode (big-endian) counter.
        #[arg(long)]
        sequential: bool,
    },
}

#[derive(Args)]
struct ServeArgs {
    /// Configuration file (TOML); see config/laconic.toml.
    #[arg(long, env = "LACONIC_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on; 127.0.0.1:0 picks a free port.
    #[arg(long, env = "LACONIC_LISTEN")]
    listen: Option<String>,
    /// Upstream deployment, as a mongodb:// URI.
    #[arg(long, env = "LACONIC_UPSTREAM")]
    upstream: Option<String>,
    /// Record every session's frames into DIR (format: proto/README.md).
    #[arg(long, value_name = "DIR", env = "LACONIC_CAPTURE")]
    capture: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:9216).
    #[arg(long, value_name = "ADDR", env = "LACONIC_METRICS_LISTEN")]
    metrics_listen: Option<String>,
    /// Collect no metrics (/metrics then says so; the health endpoints stay).
    #[arg(long, env = "LACONIC_NO_METRICS")]
    no_metrics: bool,
    /// Shadow mode: compare a sample of reads with this untokenized deployment.
    #[arg(long, value_name = "URI", env = "LACONIC_SHADOW")]
    shadow: Option<String>,
    /// The fraction of reads shadowed (default 0.01).
    #[arg(long, value_name = "FRACTION", env = "LACONIC_SHADOW_SAMPLE")]
    shadow_sample: Option<f64>,
    /// Downstream connections served at once.
    #[arg(long, env = "LACONIC_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Grace period for requests in flight at shutdown, in milliseconds.
    #[arg(long, env = "LACONIC_SHUTDOWN_GRACE_MS")]
    shutdown_grace_ms: Option<u64>,
    /// Compressors offered to the upstream, comma-separated (snappy, zlib, zstd).
    #[arg(long, value_delimiter = ',', env = "LACONIC_UPSTREAM_COMPRESSORS")]
    upstream_compressors: Option<Vec<String>>,
    /// Rewrite a collection's shard key with Locality UUIDs:
    /// DB.COLL:FIELD:STRATEGY[:sequential], STRATEGY being replace or derive (repeatable).
    #[arg(long = "shard-key", value_name = "SPEC", value_parser = laconic::config::ShardKeyConfig::parse_flag)]
    shard_keys: Vec<laconic::config::ShardKeyConfig>,
    #[command(flatten)]
    tokenize: TokenizeArgs,
    /// Log format.
    #[arg(long, value_enum, env = "LACONIC_LOG_FORMAT")]
    log_format: Option<LogFormat>,
    /// Log filter, e.g. info or laconic=debug.
    #[arg(long, env = "LACONIC_LOG")]
    log_level: Option<String>,
}

/// The tokenization flags, shared by `serve` and `analyze`.
#[derive(Args)]
struct TokenizeArgs {
    /// Tokenize every field name at least N bytes long (0 turns it off), in
    /// every database but admin, local, config and the name store's.
    #[arg(long, value_name = "N", env = "LACONIC_TOKENIZE_MIN_LEN")]
    tokenize_min_len: Option<usize>,
    /// Tokenize every key under this dotted path, whatever its length (repeatable).
    #[arg(long = "custom-path", value_name = "PATH")]
    custom_paths: Vec<String>,
    /// Tokenize the string values at this dotted path (repeatable).
    #[arg(long = "value-path", value_name = "PATH")]
    value_paths: Vec<String>,
    /// The database that holds the name store.
    #[arg(long, value_name = "NAME", env = "LACONIC_STORE_DB")]
    store_db: Option<String>,
}

impl TokenizeArgs {
    /// Flags override the file.
    fn apply(self, t: &mut laconic::config::TokenizeConfig) {
        if let Some(v) = self.tokenize_min_len {
            t.min_len = v;
        }
        t.custom_paths.extend(self.custom_paths);
        t.value_paths.extend(self.value_paths);
        if let Some(v) = self.store_db {
            t.store_db = v;
        }
    }
}

#[derive(Args)]
struct AnalyzeArgs {
    /// JSON (Extended JSON: a document, an array, or one per line) or BSON
    /// files (one document or a concatenation, such as a mongodump .bson).
    files: Vec<PathBuf>,
    /// Sample a live collection instead: the deployment's URI.
    #[arg(long)]
    uri: Option<String>,
    #[arg(long)]
    db: Option<String>,
    #[arg(long)]
    collection: Option<String>,
    /// Documents to sample from the live collection.
    #[arg(long, default_value_t = 1000)]
    sample: usize,
    /// The namespace (db.collection) whose tokenization settings project
    /// the saving (default: --db/--collection, or any database's).
    #[arg(long)]
    namespace: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = AnalyzeFormat::Text)]
    format: AnalyzeFormat,
    /// Also write a bar chart of document size per input and projection.
    #[arg(long, value_name = "FILE.svg")]
    chart: Option<PathBuf>,
    /// Configuration file whose [proxy.tokenize] settings are projected.
    #[arg(long, env = "LACONIC_CONFIG")]
    config: Option<PathBuf>,
    #[command(flatten)]
    tokenize: TokenizeArgs,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum AnalyzeFormat {
    Text,
    Json,
}

#[derive(Args)]
struct ReplayArgs {
    /// Capture files (.lcap).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Where to send the requests: a mongodb:// URI (the proxy or a server).
    #[arg(long)]
    target: String,
    /// Seconds to wait for each reply.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new()?;
    match cli.command {
        Command::Serve(args) => runtime.block_on(serve(*args)),
        Command::Replay(args) => runtime.block_on(replay(args)),
        Command::Bench(BenchCommand::Proxy(args)) => {
            init_tracing(LogFormat::Text, "warn");
            runtime
                .block_on(laconic::tools::bench::run(args))
                .map_err(tool)
        }
        Command::Bench(BenchCommand::Rewrite(args)) => {
            laconic::tools::bench::rewrite::run(&args);
            Ok(())
        }
        Command::Bench(BenchCommand::Store(args)) => runtime
            .block_on(laconic::tools::bench::store::run(&args))
            .map_err(tool),
        Command::Bench(BenchCommand::Shards(params)) => {
            laconic::locality::simulate::run(&params);
            Ok(())
        }
        Command::Uuid(cmd) => uuid(cmd),
        Command::Analyze(args) => runtime.block_on(analyze(*args)),
        Command::Migrate(args) => runtime.block_on(migrate(*args)),
        Command::Store(cmd) => runtime.block_on(store(cmd)),
        Command::Top(args) => runtime
            .block_on(laconic::tools::top::run(
                &args.metrics,
                std::time::Duration::from_secs_f64(args.interval.max(0.1)),
                args.once,
            ))
            .map_err(tool),
    }
}

async fn store(cmd: StoreCommand) -> anyhow::Result<()> {
    use laconic::tools::store as tool;
    let client = |t: &StoreTarget| mongodb::Client::with_uri_str(t.uri.clone());
    match cmd {
        StoreCommand::Verify { target, namespace } => {
            let (db, coll) = match namespace.split_once('.') {
                Some((d, c)) => (d.to_owned(), Some(c.to_owned())),
                None => (namespace.clone(), None),
            };
            let v = tool::verify(&client(&target).await?, &db, coll.as_deref()).await?;
            println!(
                "{namespace}: {} documents in {} collections, {:.0} documents/s; {} hold tokens the dictionary does not know ({} unknown tokens, {} keys that begin like a token, {} unknown values)",
                v.documents,
                v.collections,
                v.documents as f64 / v.seconds.max(1e-9),
                v.bad_documents,
                v.unknown_tokens,
                v.malformed_keys,
                v.unknown_values
            );
            for e in &v.examples {
                println!("  {e}");
            }
            if !v.ok() {
                bail!(
                    "{} documents of {namespace} cannot be read with its dictionary",
                    v.bad_documents
                );
            }
        }
        StoreCommand::Export { target, db, file } => {
            let d = tool::export(&client(&target).await?, &db).await?;
            let text =
                serde_json::to_string_pretty(&bson::Bson::Document(d).into_canonical_extjson())?;
            match file {
                Some(f) => std::fs::write(&f, text + "\n")
                    .with_context(|| format!("writing {}", f.display()))?,
                None => println!("{text}"),
            }
        }
        StoreCommand::Import { target, db, file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {}", file.display()))?;
            let json: serde_json::Value = serde_json::from_str(&text)?;
            let bson::Bson::Document(d) = bson::Bson::try_from(json)? else {
                bail!("{} is not a dictionary export", file.display());
            };
            let n = tool::import(&client(&target).await?, &db, &d).await?;
            println!("imported the dictionary of {db}: {n} chain documents");
        }
        StoreCommand::Stats { target, db } => {
            print!("{}", tool::stats(&client(&target).await?, &db).await?);
        }
        StoreCommand::Init {
            target,
            db,
            cap,
            force,
        } => {
            tool::init(&client(&target).await?, &db, cap, force).await?;
            println!("{db} has a dictionary now");
        }
    }
    Ok(())
}

async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    args.tokenize.apply(&mut config.proxy.tokenize);
    config.validate()?;
    let opts = laconic::tools::migrate::Options {
        uri: args.uri,
        db: args.db,
        collection: args.collection,
        reverse: args.reverse,
        batch: args.batch.max(1),
        dry_run: args.dry_run,
        tokenize: config.proxy.tokenize,
        progress: std::io::stderr().is_terminal(),
    };
    let s = laconic::tools::migrate::run(&opts).await.map_err(tool)?;
    if !opts.dry_run {
        println!(
            "migrated {}.{}: {} documents examined, {} rewritten, {} redone after concurrent writes; indexes rebuilt: {}",
            opts.db,
            opts.collection,
            s.examined,
            s.rewritten,
            s.retried,
            if s.indexes_rebuilt.is_empty() { "none".to_owned() } else { s.indexes_rebuilt.join(", ") }
        );
        println!(
            "collStats size: {} B -> {} B; storageSize: {} B -> {} B",
            s.size_before, s.size_after, s.storage_before, s.storage_after
        );
    }
    Ok(())
}

async fn analyze(args: AnalyzeArgs) -> anyhow::Result<()> {
    use laconic::tools::analyze;
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    args.tokenize.apply(&mut config.proxy.tokenize);
    config.validate()?;
    let policies = config.proxy.tokenize.policies();
    let namespace = args
        .namespace
        .clone()
        .or_else(|| {
            Some(format!(
                "{}.{}",
                args.db.as_deref()?,
                args.collection.as_deref()?
            ))
        })
        .unwrap_or_else(|| "db.collection".into());
    let mut policy = policies.for_namespace(&namespace).clone();
    let mut note = String::new();
    if !policy.is_active() {
        policy = laconic::token::Policy::new(2, &[], &config.proxy.tokenize.store_db);
        note = "no tokenization configured: projecting --tokenize-min-len 2\n".into();
    }
    let mut inputs: Vec<(String, Vec<bson::RawDocumentBuf>)> = Vec::new();
    for f in &args.files {
        let docs = analyze::read_file(f)
            .map_err(tool)
            .with_context(|| format!("reading {}", f.display()))?;
        let label = f.file_name().map_or_else(
            || f.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        inputs.push((label, docs));
    }
    if let Some(uri) = &args.uri {
        let (Some(db), Some(coll)) = (&args.db, &args.collection) else {
            bail!("--uri needs --db and --collection");
        };
        let client = mongodb::Client::with_uri_str(uri).await?;
        let c = client.database(db).collection::<bson::RawDocumentBuf>(coll);
        let sample = i64::try_from(args.sample).unwrap_or(i64::MAX);
        let mut cursor = c
            .aggregate(vec![bson::doc! {"$sample": {"size": sample}}])
            .with_type::<bson::RawDocumentBuf>()
            .await?;
        let mut docs = Vec::new();
        while cursor.advance().await? {
            docs.push(cursor.deserialize_current()?);
        }
        inputs.push((format!("{db}.{coll} (sample of {})", docs.len()), docs));
    }
    if inputs.is_empty() {
        bail!("nothing to analyse: give files, or --uri with --db and --collection");
    }
    let analyses = inputs
        .iter()
        .map(|(label, docs)| analyze::analyse(label, docs, &policy))
        .collect::<Result<Vec<_>, _>>()?;
    match args.format {
        AnalyzeFormat::Text => {
            print!("{note}");
            for a in &analyses {
                println!("{}", analyze::text(&a.label, &a.logical));
                println!(
                    "{}",
                    analyze::text(&format!("{} with Laconic", a.label), &a.tokenized)
                );
                println!("{}", analyze::saving(a));
            }
        }
        AnalyzeFormat::Json => println!("{}", serde_json::to_string_pretty(&analyses)?),
    }
    if let Some(path) = &args.chart {
        let mut variants: Vec<(String, &analyze::Breakdown)> = Vec::new();
        for a in &analyses {
            variants.push((a.label.clone(), &a.logical));
            variants.push((format!("{} (Laconic)", a.label), &a.tokenized));
        }
        std::fs::write(path, analyze::chart_svg(&variants))?;
    }
    Ok(())
}

fn uuid(cmd: UuidCommand) -> anyhow::Result<()> {
    use laconic::locality::{self, Generator, Mode};
    let mode = |sequential| {
        if sequential {
            Mode::Sequential
        } else {
            Mode::Default
        }
    };
    match cmd {
        UuidCommand::Gen {
            sequential,
            n,
            node_id,
        } => {
            let g = match node_id {
                Some(id) => Generator::with_node_id(mode(sequential), id),
                None => Generator::new(mode(sequential)),
            };
            let mut out = std::io::stdout().lock();
            for _ in 0..n {
                writeln!(out, "{}", locality::format(&g.next()))?;
            }
        }
        UuidCommand::Decode { uuid, sequential } => {
            let bytes = locality::parse(&uuid).context("expected 32 hex digits, as 8-4-4-4-12")?;
            let text = locality::describe(&bytes, mode(sequential))
                .context("not a Locality UUID: the version nibble is not b")?;
            println!("{text}");
            if let Some(oid) = locality::to_object_id(&bytes) {
                let hex: String = oid.iter().map(|b| format!("{b:02x}")).collect();
                println!("derived from ObjectId {hex}");
            }
        }
    }
    Ok(())
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    let p = &mut config.proxy;
    if let Some(v) = args.listen {
        p.listen = v;
    }
    if let Some(v) = args.upstream {
        p.upstream = v;
    }
    if let Some(v) = args.capture {
        p.capture_dir = Some(v);
    }
    if let Some(v) = args.max_connections {
        p.max_connections = v;
    }
    if let Some(v) = args.metrics_listen {
        p.metrics_listen = Some(v);
    }
    if args.no_metrics {
        p.metrics = false;
    }
    if let Some(uri) = args.shadow {
        p.shadow = Some(laconic::config::ShadowConfig {
            uri,
            sample: p.shadow.as_ref().map_or(0.01, |s| s.sample),
        });
    }
    if let (Some(s), Some(f)) = (p.shadow.as_mut(), args.shadow_sample) {
        s.sample = f;
    }
    if let Some(v) = args.shutdown_grace_ms {
        p.shutdown_grace_ms = v;
    }
    if let Some(v) = args.upstream_compressors {
        p.upstream_compressors = v.into_iter().filter(|s| !s.is_empty()).collect();
    }
    p.shard_keys.extend(args.shard_keys);
    args.tokenize.apply(&mut p.tokenize);
    if let Some(v) = args.log_format {
        config.log.format = v;
    }
    if let Some(v) = args.log_level.or_else(|| std::env::var("RUST_LOG").ok()) {
        config.log.level = v;
    }
    config.validate()?;
    init_tracing(config.log.format, &config.log.level);

    let grace = config.proxy.shutdown_grace();
    // Handlers go in before the "listening on" line: a script may signal as
    // soon as it reads it.
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
    );
    let proxy = Proxy::bind(config.proxy.clone())
        .await
        .with_context(|| format!("cannot listen on {}", config.proxy.listen))?;
    let handle = proxy.handle()?;
    let task = tokio::spawn(proxy.run());
    // Scripts and tests wait for this line.
    println!("listening on {}", handle.addr);
    if let Some(addr) = handle.metrics_addr {
        println!("metrics on http://{addr}/metrics");
    }
    std::io::stdout().flush()?;
    info!(listen = %handle.addr, upstream = %redact_uri(&config.proxy.upstream), "laconic started");

    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    info!("shutting down: no new connections; waiting up to {grace:?} for requests in flight");
    handle.shutdown.trigger();
    let _ = task.await;
    if handle.shutdown.drain(grace).await {
        info!("shutdown complete");
    } else {
        warn!("grace period of {grace:?} ran out; closing the remaining connections");
    }
    Ok(())
}

async fn replay(args: ReplayArgs) -> anyhow::Result<()> {
    init_tracing(LogFormat::Text, "warn");
    let target = UpstreamAddr::parse(&args.target).map_err(anyhow::Error::msg)?;
    let mut differing = 0;
    for file in &args.files {
        let records = laconic::capture::read_capture(file)?;
        let report =
            laconic::tools::replay::replay(&records, &target, Duration::from_secs(args.timeout))
                .await
                .with_context(|| format!("replaying {}", file.display()))?;
        println!(
            "{}: {} requests, {} replies compared, {} skipped, {} differing",
            file.display(),
            report.requests,
            report.replies,
            report.skipped,
            report.differences.len()
        );
        for d in &report.differences {
            println!(
                "  request #{} ({}): {}\n    expected: {}\n    actual:   {}",
                d.request, d.command, d.path, d.expected, d.actual
            );
        }
        differing += report.differences.len();
    }
    if differing > 0 {
        bail!("{differing} replies differ");
    }
    Ok(())
}

/// A tool's error, for the binary's report.
fn tool(e: laconic::tools::Error) -> anyhow::Error {
    anyhow::Error::from_boxed(e)
}

fn init_tracing(format: LogFormat, level: &str) {
    let filter = tracing_subscriber::EnvFilter::try_new(level)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// The URI without its credentials, for logs.
fn redact_uri(uri: &str) -> String {
    match (uri.find("://"), uri.rfind('@')) {
        (Some(s), Some(at)) if at > s => format!("{}://***@{}", &uri[..s], &uri[at + 1..]),
        _ => uri.to_owned(),
    }
}
