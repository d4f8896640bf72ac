//! The `laconic` command line: its subcommands and flags, and how flags
//! override the configuration file.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use laconic::config::{Config, LogFormat};

#[derive(Parser)]
#[command(
    name = "laconic",
    version = version(),
    about = "A transparent MongoDB wire-protocol proxy"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

/// `laconic --version`: the version and how this binary was built
/// ("0.1.0 (pgo)").
fn version() -> &'static str {
    static VERSION: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    VERSION.get_or_init(|| format!("{} ({})", laconic::VERSION, laconic::BUILD))
}

#[derive(Subcommand)]
pub enum Command {
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
pub struct StoreTarget {
    /// The deployment (the upstream, not the proxy), as a mongodb:// URI.
    #[arg(long, env = "LACONIC_UPSTREAM")]
    pub uri: String,
    /// The proxies' configuration file: `verify` and `stats` read a
    /// database of a group (`[[proxy.tokenize.dictionaries]]`) with the
    /// group's dictionary; `export`, `import` and `init` refuse one (name
    /// the group's home).
    #[arg(long, env = "LACONIC_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum StoreCommand {
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
    /// Laconic); refused if any of them holds keys that read as tokens. A
    /// database that shares a group's dictionary (--config) is marked with
    /// it instead, under the same check.
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
pub struct TopArgs {
    /// The proxy's metrics address (its --metrics-listen).
    #[arg(long, default_value = "127.0.0.1:9216", env = "LACONIC_METRICS_LISTEN")]
    pub metrics: String,
    /// Seconds between two scrapes.
    #[arg(long, default_value_t = 2.0)]
    pub interval: f64,
    /// Print the totals since the proxy started, once, and exit.
    #[arg(long)]
    pub once: bool,
}

#[derive(Args)]
pub struct MigrateArgs {
    /// The deployment (the upstream, not the proxy), as a mongodb:// URI.
    #[arg(long, env = "LACONIC_UPSTREAM")]
    pub uri: String,
    #[arg(long)]
    pub db: String,
    #[arg(long)]
    pub collection: String,
    /// Write the documents back with full names.
    #[arg(long)]
    pub reverse: bool,
    /// Documents per batch.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Print what would be done (documents, indexes) and change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Configuration file whose [proxy.tokenize] settings apply.
    #[arg(long, env = "LACONIC_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub tokenize: TokenizeArgs,
}

#[derive(Subcommand)]
pub enum BenchCommand {
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
pub enum UuidCommand {
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
pub struct ServeArgs {
    /// Configuration file (TOML); see config/laconic.toml.
    #[arg(long, env = "LACONIC_CONFIG")]
    pub config: Option<PathBuf>,
    /// Address to listen on; 127.0.0.1:0 picks a free port.
    #[arg(long, env = "LACONIC_LISTEN")]
    pub listen: Option<String>,
    /// Upstream deployment, as a mongodb:// URI.
    #[arg(long, env = "LACONIC_UPSTREAM")]
    pub upstream: Option<String>,
    /// Record every session's frames into DIR (format: proto/README.md).
    #[arg(long, value_name = "DIR", env = "LACONIC_CAPTURE")]
    pub capture: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz on this address (e.g. 0.0.0.0:9216).
    #[arg(long, value_name = "ADDR", env = "LACONIC_METRICS_LISTEN")]
    pub metrics_listen: Option<String>,
    /// Collect no metrics (/metrics then says so; the health endpoints stay).
    #[arg(long, env = "LACONIC_NO_METRICS")]
    pub no_metrics: bool,
    /// Shadow mode: compare a sample of reads with this untokenized deployment.
    #[arg(long, value_name = "URI", env = "LACONIC_SHADOW")]
    pub shadow: Option<String>,
    /// The fraction of reads shadowed (default 0.01).
    #[arg(long, value_name = "FRACTION", env = "LACONIC_SHADOW_SAMPLE")]
    pub shadow_sample: Option<f64>,
    /// Downstream connections served at once.
    #[arg(long, env = "LACONIC_MAX_CONNECTIONS")]
    pub max_connections: Option<usize>,
    /// Threads that serve sessions (0: one per core).
    #[arg(long, env = "LACONIC_THREADS")]
    pub threads: Option<usize>,
    /// Grace period for requests in flight at shutdown, in milliseconds.
    #[arg(long, env = "LACONIC_SHUTDOWN_GRACE_MS")]
    pub shutdown_grace_ms: Option<u64>,
    /// TLS towards drivers: disabled, allowed (TLS and plain TCP) or required.
    #[arg(long, value_enum, env = "LACONIC_TLS_MODE")]
    pub tls_mode: Option<laconic::config::TlsMode>,
    /// PEM certificate chain served to drivers (reloaded when it changes or on SIGHUP).
    #[arg(long, value_name = "FILE", env = "LACONIC_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, value_name = "FILE", env = "LACONIC_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA bundle: drivers must present a certificate it signed.
    #[arg(long, value_name = "FILE", env = "LACONIC_TLS_CLIENT_CA")]
    pub tls_client_ca: Option<PathBuf>,
    /// Compressors offered to the upstream, comma-separated (snappy, zlib, zstd).
    #[arg(long, value_delimiter = ',', env = "LACONIC_UPSTREAM_COMPRESSORS")]
    pub upstream_compressors: Option<Vec<String>>,
    /// Rewrite a collection's shard key with Locality UUIDs:
    /// DB.COLL:FIELD:STRATEGY[:sequential], STRATEGY being replace or derive (repeatable).
    #[arg(long = "shard-key", value_name = "SPEC", value_parser = laconic::config::ShardKeyConfig::parse_flag)]
    pub shard_keys: Vec<laconic::config::ShardKeyConfig>,
    #[command(flatten)]
    pub tokenize: TokenizeArgs,
    /// Log format.
    #[arg(long, value_enum, env = "LACONIC_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Log filter, e.g. info or laconic=debug.
    #[arg(long, env = "LACONIC_LOG")]
    pub log_level: Option<String>,
}

/// The tokenization flags, shared by `serve` and `analyze`.
#[derive(Args)]
pub struct TokenizeArgs {
    /// Tokenize every field name at least N bytes long (0 turns it off), in
    /// every database but admin, local, config and the name store's.
    #[arg(long, value_name = "N", env = "LACONIC_TOKENIZE_MIN_LEN")]
    pub tokenize_min_len: Option<usize>,
    /// Tokenize every key under this dotted path, whatever its length (repeatable).
    #[arg(long = "custom-path", value_name = "PATH")]
    pub custom_paths: Vec<String>,
    /// Tokenize the string values at this dotted path (repeatable).
    #[arg(long = "value-path", value_name = "PATH")]
    pub value_paths: Vec<String>,
    /// The database that holds the name store.
    #[arg(long, value_name = "NAME", env = "LACONIC_STORE_DB")]
    pub store_db: Option<String>,
}

impl TokenizeArgs {
    /// Flags override the file.
    pub fn apply(self, t: &mut laconic::config::TokenizeConfig) {
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
pub struct AnalyzeArgs {
    /// JSON (Extended JSON: a document, an array, or one per line) or BSON
    /// files (one document or a concatenation, such as a mongodump .bson).
    pub files: Vec<PathBuf>,
    /// Sample a live collection instead: the deployment's URI.
    #[arg(long)]
    pub uri: Option<String>,
    #[arg(long)]
    pub db: Option<String>,
    #[arg(long)]
    pub collection: Option<String>,
    /// Documents to sample from the live collection.
    #[arg(long, default_value_t = 1000)]
    pub sample: usize,
    /// The namespace (db.collection) whose tokenization settings project
    /// the saving (default: --db/--collection, or any database's).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = AnalyzeFormat::Text)]
    pub format: AnalyzeFormat,
    /// Also write a bar chart of document size per input and projection.
    #[arg(long, value_name = "FILE.svg")]
    pub chart: Option<PathBuf>,
    /// Configuration file whose [proxy.tokenize] settings are projected.
    #[arg(long, env = "LACONIC_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(flatten)]
    pub tokenize: TokenizeArgs,
}

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum AnalyzeFormat {
    Text,
    Json,
}

#[derive(Args)]
pub struct ReplayArgs {
    /// Capture files (.lcap).
    #[arg(required = true)]
    pub files: Vec<PathBuf>,
    /// Where to send the requests: a mongodb:// URI (the proxy or a server).
    #[arg(long)]
    pub target: String,
    /// Seconds to wait for each reply.
    #[arg(long, default_value_t = 30)]
    pub timeout: u64,
}

impl ServeArgs {
    /// Flags and environment variables override the file.
    pub fn apply(self, config: &mut Config) {
        let p = &mut config.proxy;
        if let Some(v) = self.listen {
            p.listen = v;
        }
        if let Some(v) = self.upstream {
            p.upstream = v;
        }
        if let Some(v) = self.capture {
            p.capture_dir = Some(v);
        }
        if let Some(v) = self.max_connections {
            p.max_connections = v;
        }
        if let Some(v) = self.threads {
            p.threads = v;
        }
        if let Some(v) = self.metrics_listen {
            p.metrics_listen = Some(v);
        }
        if self.no_metrics {
            p.metrics = false;
        }
        if let Some(uri) = self.shadow {
            p.shadow = Some(laconic::config::ShadowConfig {
                uri,
                sample: p.shadow.as_ref().map_or(0.01, |s| s.sample),
            });
        }
        if let (Some(s), Some(f)) = (p.shadow.as_mut(), self.shadow_sample) {
            s.sample = f;
        }
        if let Some(v) = self.shutdown_grace_ms {
            p.shutdown_grace_ms = v;
        }
        if let Some(v) = self.upstream_compressors {
            p.upstream_compressors = v.into_iter().filter(|s| !s.is_empty()).collect();
        }
        if let Some(v) = self.tls_mode {
            p.tls.mode = v;
        }
        if let Some(v) = self.tls_cert {
            p.tls.cert_file = Some(v);
        }
        if let Some(v) = self.tls_key {
            p.tls.key_file = Some(v);
        }
        if let Some(v) = self.tls_client_ca {
            p.tls.client_ca_file = Some(v);
        }
        p.shard_keys.extend(self.shard_keys);
        self.tokenize.apply(&mut p.tokenize);
        if let Some(v) = self.log_format {
            config.log.format = v;
        }
        if let Some(v) = self.log_level.or_else(|| std::env::var("RUST_LOG").ok()) {
            config.log.level = v;
        }
    }
}
