//! The `laconic` command line: `serve`, `replay`, `bench`.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

mod cli;

use anyhow::{bail, Context};
use clap::Parser;
use cli::{
    AnalyzeArgs, AnalyzeFormat, BenchCommand, Cli, Command, MigrateArgs, ReplayArgs, ServeArgs,
    StoreCommand, StoreTarget, UuidCommand,
};
use laconic::config::{Config, LogFormat};
use laconic::downstream::Proxy;
use laconic::upstream::UpstreamAddr;
use tracing::{info, warn};

/// The process's allocator. A proxy allocates and frees a buffer the size
/// of every reply; glibc's allocator gives large freed blocks back to the
/// system at once (trimming the heap, or unmapping), and with many clients
/// at a time the next reply's buffer faults its pages in again: ten page
/// faults per 100 KB reply, a seventh of the proxy's CPU in `laconic bench
/// proxy` with 16 clients. mimalloc keeps freed pages for reuse and gives
/// them back after a delay.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Runtime::new;
    match cli.command {
        // Sessions run on worker threads of their own (`proxy.threads`);
        // this one accepts connections and runs the background work.
        Command::Serve(args) => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(serve(*args)),
        Command::Replay(args) => runtime()?.block_on(replay(args)),
        Command::Bench(BenchCommand::Proxy(args)) => {
            init_tracing(LogFormat::Text, "warn");
            runtime()?
                .block_on(laconic::tools::bench::run(args))
                .map_err(tool)
        }
        Command::Bench(BenchCommand::Rewrite(args)) => {
            laconic::tools::bench::rewrite::run(&args);
            Ok(())
        }
        Command::Bench(BenchCommand::Store(args)) => runtime()?
            .block_on(laconic::tools::bench::store::run(&args))
            .map_err(tool),
        Command::Bench(BenchCommand::Shards(params)) => {
            laconic::locality::simulate::run(&params);
            Ok(())
        }
        Command::Uuid(cmd) => uuid(cmd),
        Command::Analyze(args) => runtime()?.block_on(analyze(*args)),
        Command::Migrate(args) => runtime()?.block_on(migrate(*args)),
        Command::Store(cmd) => runtime()?.block_on(store(cmd)),
        Command::Top(args) => runtime()?
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
    // The groups of the proxies' configuration, if given.
    let policies = |t: &StoreTarget| -> anyhow::Result<laconic::token::Policies> {
        Ok(load_config(t.config.clone(), |_| {})?
            .proxy
            .tokenize
            .policies())
    };
    match cmd {
        StoreCommand::Verify { target, namespace } => {
            let (db, coll) = match namespace.split_once('.') {
                Some((d, c)) => (d.to_owned(), Some(c.to_owned())),
                None => (namespace.clone(), None),
            };
            let policies = policies(&target)?;
            let v = tool::verify(&client(&target).await?, &policies, &db, coll.as_deref()).await?;
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
            tool::own_dictionary(&policies(&target)?, &db)?;
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
            tool::own_dictionary(&policies(&target)?, &db)?;
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
            let policies = policies(&target)?;
            print!(
                "{}",
                tool::stats(&client(&target).await?, &policies, &db).await?
            );
        }
        StoreCommand::Init {
            target,
            db,
            cap,
            force,
        } => {
            let policies = policies(&target)?;
            let home = policies.scope_of(&db);
            if home == db {
                tool::init(&client(&target).await?, &db, cap, force).await?;
                println!("{db} has a dictionary now");
            } else {
                tool::adopt_member(&client(&target).await?, &policies, &db, force).await?;
                println!("{db} is marked with the dictionary of {home} now");
            }
        }
    }
    Ok(())
}

async fn migrate(args: MigrateArgs) -> anyhow::Result<()> {
    use std::io::IsTerminal;
    // Its announcement's wait and a lost cursor are said on stderr.
    init_tracing(LogFormat::Text, "laconic=info,warn");
    let config = load_config(args.config.clone(), |c| {
        args.tokenize.apply(&mut c.proxy.tokenize)
    })?;
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
    let config = load_config(args.config.clone(), |c| {
        args.tokenize.apply(&mut c.proxy.tokenize)
    })?;
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
    let config = load_config(args.config.clone(), |c| args.apply(c))?;
    init_tracing(config.log.format, &config.log.level);

    let grace = config.proxy.shutdown_grace();
    // Handlers go in before the "listening on" line: a script may signal as
    // soon as it reads it.
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int, mut hup) = (
        signal(SignalKind::terminate())?,
        signal(SignalKind::interrupt())?,
        signal(SignalKind::hangup())?,
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
    info!(
        listen = %handle.addr,
        upstream = %redact_uri(&config.proxy.upstream),
        version = laconic::VERSION,
        build = laconic::BUILD,
        "laconic started"
    );

    loop {
        tokio::select! {
            _ = term.recv() => break,
            _ = int.recv() => break,
            _ = hup.recv() => match handle.reload_tls() {
                Ok(()) => info!("SIGHUP: TLS certificate files read again"),
                Err(e) => warn!(error = %e, "SIGHUP: the TLS certificate files cannot be used; keeping the previous ones"),
            },
        }
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
    let target = UpstreamAddr::new(&args.target, None)
        .await
        .map_err(anyhow::Error::msg)?;
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

/// The configuration: the file (or the defaults), then `apply` (the
/// flags), then one validation.
fn load_config(file: Option<PathBuf>, apply: impl FnOnce(&mut Config)) -> anyhow::Result<Config> {
    let mut config = match &file {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    apply(&mut config);
    config.validate()?;
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&config.log.level) {
        bail!("invalid setting log.level = {:?}: {e}", config.log.level);
    }
    Ok(config)
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
