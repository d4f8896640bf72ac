//! Configuration: a TOML file, overridden by environment variables and flags.
//!
//! Precedence, highest first: command-line flag, `LACONIC_*` environment
//! variable (read by clap, so tests never touch the process environment),
//! the `--config` file, the defaults below. [`Config::validate`] runs once at
//! start-up and fails fast with the offending setting named.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::wire::{Compressor, MAX_MESSAGE_SIZE};

pub mod shard_key;
pub mod uri;

/// The whole configuration.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub proxy: ProxyConfig,
    pub log: LogConfig,
}

/// Which names are stored as tokens, and where the name store lives.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TokenizeConfig {
    /// Field names at least this many bytes long are tokenized (0: none by length).
    pub min_len: usize,
    /// Every key under these dotted paths is tokenized, whatever its length.
    pub custom_paths: Vec<String>,
    /// String values at these dotted paths (array elements included) are tokenized.
    pub value_paths: Vec<String>,
    /// The database holding the name store (never tokenized itself).
    pub store_db: String,
    /// The name store's collection.
    pub store_collection: String,
    /// Names per name-store document before the next one is opened.
    pub cap: usize,
    /// How the proxy's own client reaches the store (default: the upstream URI).
    pub store_uri: Option<String>,
    /// How often every dictionary and migration marker the proxy holds is
    /// read again (ms). A command for a database whose last read began more
    /// than [`crate::token::store::VIEW_LEASE`] ago reads it first.
    pub revalidate_ms: u64,
    /// Settings for one database or collection, overriding the ones above.
    pub namespaces: Vec<NamespaceTokenize>,
    /// Commands and aggregation stages the proxy does not know, declared
    /// free of field names: forwarded as they are instead of refused.
    pub pass_through: Vec<String>,
    /// Databases that share one dictionary (each database has its own
    /// otherwise).
    pub dictionaries: Vec<DictionaryGroup>,
}

/// One `[[proxy.tokenize.dictionaries]]` entry: databases sharing one
/// dictionary, kept in `home` (the first database listed by default).
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DictionaryGroup {
    pub home: Option<String>,
    /// Database names, or `*` for every tokenized database.
    pub databases: Vec<String>,
}

/// Tokenization settings for one database (`"app"`) or collection
/// (`"app.users"`). A setting left out is inherited: a collection's from its
/// database's entry if there is one, a database's from `[proxy.tokenize]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct NamespaceTokenize {
    pub namespace: String,
    pub min_len: Option<usize>,
    pub custom_paths: Option<Vec<String>>,
    pub value_paths: Option<Vec<String>>,
}

impl Default for TokenizeConfig {
    fn default() -> Self {
        TokenizeConfig {
            min_len: 0,
            custom_paths: Vec::new(),
            value_paths: Vec::new(),
            store_db: "laconic".into(),
            store_collection: "name_store".into(),
            cap: 1000,
            store_uri: None,
            revalidate_ms: 1000,
            namespaces: Vec::new(),
            pass_through: Vec::new(),
            dictionaries: Vec::new(),
        }
    }
}

impl TokenizeConfig {
    /// The policy of every namespace, with the inheritance above applied.
    pub fn policies(&self) -> crate::token::Policies {
        use crate::token::{Policies, Policy};
        let policy = |min_len: usize, custom: &[String], values: &[String]| {
            Policy::new(min_len, custom, &self.store_db).with_value_paths(values)
        };
        let mut policies =
            Policies::new(policy(self.min_len, &self.custom_paths, &self.value_paths));
        // Databases first, so that collections can inherit from them.
        let mut rules: Vec<&NamespaceTokenize> = self.namespaces.iter().collect();
        rules.sort_by_key(|r| r.namespace.contains('.'));
        for r in rules {
            let base = policies.for_namespace(&r.namespace).clone();
            let custom: Vec<String> = match &r.custom_paths {
                Some(c) => c.clone(),
                None => base.custom_paths.iter().map(|p| p.join(".")).collect(),
            };
            let values: Vec<String> = match &r.value_paths {
                Some(v) => v.clone(),
                None => base.value_paths.iter().map(|p| p.join(".")).collect(),
            };
            let p = policy(r.min_len.unwrap_or(base.min_len), &custom, &values);
            policies = policies.with_rule(&r.namespace, p);
        }
        policies.pass_through = self.pass_through.clone();
        policies.groups = self
            .dictionaries
            .iter()
            .map(|g| crate::token::policy::Group {
                home: g
                    .home
                    .clone()
                    .or_else(|| g.databases.iter().find(|d| *d != "*").cloned())
                    .unwrap_or_else(|| self.store_db.clone()),
                databases: g.databases.clone(),
            })
            .collect();
        policies
    }
}

/// Shadow mode: a second, untokenized deployment holding the same data.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShadowConfig {
    /// Its mongodb:// URI.
    pub uri: String,
    /// The fraction of reads (find, aggregate, count, distinct) repeated there.
    #[serde(default = "default_shadow_sample")]
    pub sample: f64,
}

fn default_shadow_sample() -> f64 {
    0.01
}

/// Where to listen, where to forward, and the limits in between.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ProxyConfig {
    /// Address to accept drivers on (`127.0.0.1:0` picks a free port).
    pub listen: String,
    /// The upstream deployment, as a `mongodb://` or `mongodb+srv://` URI.
    pub upstream: String,
    /// The DNS server `mongodb+srv://` names are looked up with (`IP:PORT`;
    /// unset: the system's resolver).
    pub dns_server: Option<String>,
    /// How often a `mongodb+srv://` name's records are looked up again.
    pub srv_rescan_ms: u64,
    /// Downstream connections served at once; further ones are closed at accept.
    pub max_connections: usize,
    /// Threads that serve sessions (0: one per core; README, "Threads").
    pub threads: usize,
    /// Time allowed to open the upstream connection.
    pub connect_timeout_ms: u64,
    /// Time a new downstream connection has to send its first message, and
    /// the grace of a large message before `min_read_rate` applies.
    pub handshake_timeout_ms: u64,
    /// On SIGTERM/SIGINT, how long requests in flight may take to finish.
    pub shutdown_grace_ms: u64,
    /// The largest message accepted on either leg.
    pub max_message_size: usize,
    /// Bytes of expanded documents the proxy may hold back, for all cursors
    /// together, when expansion makes a batch larger than a reply may be.
    pub max_held_bytes: usize,
    /// Bytes of memory heavy work may hold, all sessions together: the
    /// decompression and rewrite of messages over 1 MiB, and rewrites that
    /// parse a command into documents (README, "Huge commands").
    pub max_work_bytes: usize,
    /// Bytes of messages being read from drivers, all connections
    /// together, counting each message over 64 KiB from its header on
    /// (README, "Messages being read").
    pub max_read_bytes: usize,
    /// Bytes a second a message holding a share of `max_read_bytes` must
    /// arrive at, at least, after `handshake_timeout_ms` of grace: one
    /// that does not closes its connection.
    pub min_read_rate: u64,
    /// Bytes of upstream replies on their way to drivers, all sessions
    /// together, counting each reply over 64 KiB from its header until it
    /// is written back, with what rewriting it holds, and any reply's
    /// expansion past 4 times its stored size (README, "Replies").
    pub max_reply_bytes: usize,
    /// Bytes a second a driver must take a reply holding a share of
    /// `max_reply_bytes` at, at least, after `handshake_timeout_ms` of
    /// grace: one that does not has its connection closed.
    pub min_write_rate: u64,
    /// Compressors offered to drivers, in order of preference.
    pub client_compressors: Vec<String>,
    /// Compressors offered to the upstream (empty: the upstream leg is uncompressed).
    pub upstream_compressors: Vec<String>,
    /// Record every session's frames into this directory.
    pub capture_dir: Option<PathBuf>,
    /// Serve /metrics, /healthz and /readyz on this address (off if unset).
    pub metrics_listen: Option<String>,
    /// Collect the counters /metrics serves (on by default; off, /metrics
    /// says so and /healthz and /readyz are still served).
    pub metrics: bool,
    /// Compare a sample of reads with an untokenized deployment.
    pub shadow: Option<ShadowConfig>,
    /// Collections whose shard key is rewritten with Locality UUIDs.
    pub shard_keys: Vec<ShardKeyConfig>,
    /// Name tokenization.
    pub tokenize: TokenizeConfig,
    /// TLS on the driver leg (the upstream leg's comes from its URI).
    pub tls: TlsConfig,
}

/// `[proxy.tls]`: TLS towards drivers.
#[derive(Clone, Debug, Default, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct TlsConfig {
    pub mode: TlsMode,
    /// PEM certificate chain.
    pub cert_file: Option<PathBuf>,
    /// PEM private key.
    pub key_file: Option<PathBuf>,
    /// PEM CA bundle: when set, drivers must present a certificate it signed.
    pub client_ca_file: Option<PathBuf>,
}

/// Whether plain TCP is still served beside TLS, as mongod's `tlsMode`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum TlsMode {
    /// Plain TCP only (a TLS handshake is refused at once).
    #[default]
    Disabled,
    /// Both.
    Allowed,
    /// TLS only.
    Required,
}

/// One `[[proxy.shard_keys]]` entry.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShardKeyConfig {
    /// `db.collection`.
    pub namespace: String,
    /// The field holding driver-generated ObjectIds.
    #[serde(default = "default_shard_field")]
    pub field: String,
    /// `replace` or `derive`.
    pub strategy: String,
    /// `default` (spread writes) or `sequential` (cluster them in 10-minute windows).
    #[serde(default)]
    pub mode: String,
    /// For `derive`: the added field (default `_lk`).
    pub derived_field: Option<String>,
}

fn default_shard_field() -> String {
    "_id".into()
}

impl ShardKeyConfig {
    pub fn to_rule(&self) -> Result<shard_key::Rule, String> {
        let mode = match self.mode.as_str() {
            "" | "default" => crate::locality::Mode::Default,
            "sequential" => crate::locality::Mode::Sequential,
            other => {
                return Err(format!(
                    "unknown mode {other:?}: expected default or sequential"
                ))
            }
        };
        shard_key::Rule::new(
            &self.namespace,
            &self.field,
            &self.strategy,
            mode,
            self.derived_field.as_deref(),
        )
    }

    /// Parses the `--shard-key DB.COLL:FIELD:STRATEGY[:sequential]` flag.
    pub fn parse_flag(spec: &str) -> Result<ShardKeyConfig, String> {
        let rule = shard_key::Rule::parse(spec)?;
        Ok(ShardKeyConfig {
            namespace: rule.namespace,
            field: rule.field,
            strategy: spec.split(':').nth(2).unwrap_or_default().to_owned(),
            mode: spec.split(':').nth(3).unwrap_or("default").to_owned(),
            derived_field: None,
        })
    }
}

/// Logging.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// A tracing filter such as `info` or `laconic=debug`.
    pub level: String,
}

#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// The default of `max_work_bytes` and `max_read_bytes`: 16 of the
/// largest messages (two rewritten raw at once, each holding up to 8
/// times its size).
pub const DEFAULT_MAX_WORK_BYTES: usize = 16 * MAX_MESSAGE_SIZE;

/// The least `max_work_bytes` (what one rewrite on a runtime thread may
/// hold before it is moved to the heavy work), and `max_read_bytes`.
pub const MIN_WORK_BYTES: usize = 16 << 20;

/// More threads than any machine this serves has cores.
const MAX_THREADS: usize = 1024;

impl Default for ProxyConfig {
    fn default() -> Self {
        ProxyConfig {
            listen: "127.0.0.1:27018".into(),
            upstream: "mongodb://127.0.0.1:27017/".into(),
            dns_server: None,
            srv_rescan_ms: 60_000,
            max_connections: 4096,
            threads: 0,
            connect_timeout_ms: 10_000,
            handshake_timeout_ms: 10_000,
            shutdown_grace_ms: 10_000,
            max_message_size: MAX_MESSAGE_SIZE,
            max_held_bytes: 256 << 20,
            max_work_bytes: DEFAULT_MAX_WORK_BYTES,
            max_read_bytes: DEFAULT_MAX_WORK_BYTES,
            min_read_rate: 256 << 10,
            max_reply_bytes: DEFAULT_MAX_WORK_BYTES,
            min_write_rate: 256 << 10,
            client_compressors: Compressor::SUPPORTED
                .iter()
                .map(|c| c.name().to_owned())
                .collect(),
            upstream_compressors: Vec::new(),
            capture_dir: None,
            metrics_listen: None,
            metrics: true,
            shadow: None,
            shard_keys: Vec::new(),
            tokenize: TokenizeConfig::default(),
            tls: TlsConfig::default(),
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            level: "info".into(),
        }
    }
}

/// A configuration that cannot be used, with the setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config file {path}: {source}")]
    Parse {
        path: PathBuf,
        source: Box<toml::de::Error>,
    },
    #[error("invalid setting {setting} = {value:?}: {reason}")]
    Invalid {
        setting: &'static str,
        value: String,
        reason: String,
    },
}

impl Config {
    /// Loads a TOML file; missing settings keep their defaults.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Config::parse(&text).map_err(|source| ConfigError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })
    }

    pub fn parse(text: &str) -> Result<Config, toml::de::Error> {
        toml::from_str(text)
    }

    /// Checks every setting; the first bad one is reported.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let p = &self.proxy;
        let invalid = |setting, value: String, reason: &str| ConfigError::Invalid {
            setting,
            value,
            reason: reason.to_owned(),
        };
        if p.listen.parse::<SocketAddr>().is_err() {
            return Err(invalid(
                "proxy.listen",
                p.listen.clone(),
                "expected HOST:PORT with an IP address",
            ));
        }
        uri::ConnectionString::parse(&p.upstream)
            .map_err(|e| invalid("proxy.upstream", p.upstream.clone(), &e))?;
        if let Some(d) = &p.dns_server {
            if d.parse::<SocketAddr>().is_err() {
                return Err(invalid("proxy.dns_server", d.clone(), "expected IP:PORT"));
            }
        }
        if p.srv_rescan_ms < 1000 {
            return Err(invalid(
                "proxy.srv_rescan_ms",
                p.srv_rescan_ms.to_string(),
                "must be at least 1000",
            ));
        }
        if p.tls.mode != TlsMode::Disabled
            && (p.tls.cert_file.is_none() || p.tls.key_file.is_none())
        {
            return Err(invalid(
                "proxy.tls.mode",
                format!("{:?}", p.tls.mode).to_lowercase(),
                "TLS needs cert_file and key_file (--tls-cert, --tls-key)",
            ));
        }
        if p.max_connections == 0 {
            return Err(invalid(
                "proxy.max_connections",
                "0".into(),
                "must be at least 1",
            ));
        }
        if p.threads > MAX_THREADS {
            return Err(invalid(
                "proxy.threads",
                p.threads.to_string(),
                "must be at most 1024 (0: one per core)",
            ));
        }
        for (key, bytes) in [
            ("proxy.max_work_bytes", p.max_work_bytes),
            ("proxy.max_read_bytes", p.max_read_bytes),
            ("proxy.max_reply_bytes", p.max_reply_bytes),
        ] {
            if bytes < MIN_WORK_BYTES {
                return Err(invalid(
                    key,
                    bytes.to_string(),
                    "must be at least 16777216 (16 MiB)",
                ));
            }
        }
        for (key, rate) in [
            ("proxy.min_read_rate", p.min_read_rate),
            ("proxy.min_write_rate", p.min_write_rate),
        ] {
            if rate == 0 {
                return Err(invalid(
                    key,
                    "0".into(),
                    "must be at least 1 (bytes a second)",
                ));
            }
        }
        if !(1024..=MAX_MESSAGE_SIZE).contains(&p.max_message_size) {
            return Err(invalid(
                "proxy.max_message_size",
                p.max_message_size.to_string(),
                "must lie between 1024 and 48000000",
            ));
        }
        for (setting, list) in [
            ("proxy.client_compressors", &p.client_compressors),
            ("proxy.upstream_compressors", &p.upstream_compressors),
        ] {
            for name in list {
                if !matches!(Compressor::from_name(name), Some(c) if c != Compressor::Noop) {
                    return Err(invalid(
                        setting,
                        name.clone(),
                        "expected snappy, zlib or zstd",
                    ));
                }
            }
        }
        p.tokenize.validate()?;
        if let Some(s) = &p.shadow {
            if !(s.sample > 0.0 && s.sample <= 1.0) {
                return Err(invalid(
                    "proxy.shadow.sample",
                    s.sample.to_string(),
                    "a fraction above 0 and at most 1",
                ));
            }
        }
        for rule in &p.shard_keys {
            rule.to_rule()
                .map_err(|e| invalid("proxy.shard_keys", rule.namespace.clone(), &e))?;
        }
        Ok(())
    }
}

impl TokenizeConfig {
    /// Checks the tokenization settings; the first bad one is reported.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |setting, value: String, reason: &str| ConfigError::Invalid {
            setting,
            value,
            reason: reason.to_owned(),
        };
        let t = self;
        if t.cap == 0 {
            return Err(invalid(
                "proxy.tokenize.cap",
                "0".into(),
                "must be at least 1",
            ));
        }
        if t.revalidate_ms == 0 {
            return Err(invalid(
                "proxy.tokenize.revalidate_ms",
                "0".into(),
                "must be at least 1",
            ));
        }
        if t.store_db.is_empty() || t.store_db.contains('.') {
            return Err(invalid(
                "proxy.tokenize.store_db",
                t.store_db.clone(),
                "not a database name",
            ));
        }
        let rule_paths = t.namespaces.iter().flat_map(|r| {
            r.custom_paths
                .iter()
                .flatten()
                .chain(r.value_paths.iter().flatten())
        });
        for r in &t.namespaces {
            let (db, coll) = r
                .namespace
                .split_once('.')
                .unwrap_or((r.namespace.as_str(), "x"));
            if db.is_empty() || coll.is_empty() || db == t.store_db {
                return Err(invalid(
                    "proxy.tokenize.namespaces",
                    r.namespace.clone(),
                    "expected \"db\" or \"db.collection\", not the store's database",
                ));
            }
        }
        for path in t
            .custom_paths
            .iter()
            .chain(&t.value_paths)
            .chain(rule_paths)
        {
            if path.is_empty() || path.split('.').any(|c| c.is_empty() || c.starts_with('$')) {
                return Err(invalid(
                    "proxy.tokenize.custom_paths",
                    path.clone(),
                    "not a dotted field path",
                ));
            }
            if path
                .split('.')
                .any(|c| crate::token::policy::is_index_like(c.as_bytes()))
            {
                return Err(invalid(
                    "proxy.tokenize.custom_paths",
                    path.clone(),
                    "a part of digits alone is an array index to a query, whatever the \
                     document holds there: name the path without it, and the rule holds \
                     below every index and every key of digits there",
                ));
            }
        }
        let mut seen: Vec<&str> = Vec::new();
        for g in &t.dictionaries {
            if g.databases.is_empty() {
                return Err(invalid(
                    "proxy.tokenize.dictionaries",
                    format!("{:?}", g.databases),
                    "a group names at least one database",
                ));
            }
            for d in g.databases.iter().chain(g.home.as_ref()) {
                if d.is_empty()
                    || d.contains('.')
                    || matches!(d.as_str(), "admin" | "local" | "config")
                {
                    return Err(invalid(
                        "proxy.tokenize.dictionaries",
                        d.clone(),
                        "not a database a dictionary can serve",
                    ));
                }
            }
            for d in &g.databases {
                if seen.contains(&d.as_str())
                    || seen.contains(&"*")
                    || (d == "*" && !seen.is_empty())
                {
                    return Err(invalid(
                        "proxy.tokenize.dictionaries",
                        d.clone(),
                        "a database belongs to one dictionary only",
                    ));
                }
                seen.push(d);
            }
        }
        Ok(())
    }
}

impl ProxyConfig {
    /// The DNS server of `dns_server` (checked by [`Config::validate`]).
    pub fn dns_server(&self) -> Option<SocketAddr> {
        self.dns_server.as_deref().and_then(|d| d.parse().ok())
    }
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }
    pub fn handshake_timeout(&self) -> Duration {
        Duration::from_millis(self.handshake_timeout_ms)
    }

    /// How fast a large message must arrive (see [`crate::wire::FrameReader`]).
    pub fn read_pace(&self) -> crate::wire::Pace {
        crate::wire::Pace {
            grace: self.handshake_timeout(),
            min_rate: self.min_read_rate,
        }
    }

    /// How fast a driver must take a large reply.
    pub fn write_pace(&self) -> crate::wire::Pace {
        crate::wire::Pace {
            grace: self.handshake_timeout(),
            min_rate: self.min_write_rate,
        }
    }
    pub fn shutdown_grace(&self) -> Duration {
        Duration::from_millis(self.shutdown_grace_ms)
    }

    fn compressors(names: &[String]) -> Vec<Compressor> {
        names
            .iter()
            .filter_map(|n| Compressor::from_name(n))
            .collect()
    }
    pub fn client_compressors(&self) -> Vec<Compressor> {
        Self::compressors(&self.client_compressors)
    }
    pub fn upstream_compressors(&self) -> Vec<Compressor> {
        Self::compressors(&self.upstream_compressors)
    }
    /// The shard-key rules (validated by [`Config::validate`]; invalid ones are dropped).
    pub fn shard_key_rules(&self) -> Vec<shard_key::Rule> {
        self.shard_keys
            .iter()
            .filter_map(|r| r.to_rule().ok())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_config_file_parses_and_validates() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/laconic.toml");
        let config = Config::load(&path).unwrap();
        config.validate().unwrap();
        assert_eq!(config.proxy.tls, TlsConfig::default());
        assert_eq!(
            config.proxy.max_held_bytes,
            ProxyConfig::default().max_held_bytes
        );
        assert_eq!(config.proxy.threads, ProxyConfig::default().threads);
    }

    #[test]
    fn tls_needs_a_certificate_and_a_key() {
        let c = Config::parse("[proxy.tls]\nmode = \"required\"\n").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("proxy.tls.mode") && err.contains("cert_file"),
            "{err}"
        );
        let c = Config::parse(
            "[proxy.tls]\nmode = \"allowed\"\ncert_file = \"/c.pem\"\nkey_file = \"/k.pem\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.proxy.tls.mode, TlsMode::Allowed);
    }

    #[test]
    fn partial_files_keep_defaults_and_bad_values_are_named() {
        let c = Config::parse("[proxy]\nmax_connections = 7\n").unwrap();
        assert_eq!(c.proxy.max_connections, 7);
        assert_eq!(c.proxy.listen, ProxyConfig::default().listen);

        let mut c = Config::default();
        c.proxy.upstream_compressors = vec!["lz4".into()];
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("proxy.upstream_compressors") && err.contains("lz4"),
            "{err}"
        );

        let mut c = Config::parse("[proxy]\nthreads = 1\n").unwrap();
        assert_eq!(c.proxy.threads, 1);
        c.proxy.threads = 5000;
        let err = c.validate().unwrap_err().to_string();
        assert!(
            err.contains("proxy.threads") && err.contains("5000"),
            "{err}"
        );

        assert!(
            Config::parse("[proxy]\nlisten_addr = 1\n").is_err(),
            "unknown keys are rejected"
        );
    }

    #[test]
    fn shard_key_rules_from_the_file() {
        let c = Config::parse(
            "[[proxy.shard_keys]]\nnamespace = \"app.users\"\nstrategy = \"derive\"\nmode = \"sequential\"\n",
        )
        .unwrap();
        c.validate().unwrap();
        let rule = &c.proxy.shard_key_rules()[0];
        assert_eq!(
            (rule.field.as_str(), rule.mode),
            ("_id", crate::locality::Mode::Sequential)
        );
        let mut bad = c.clone();
        bad.proxy.shard_keys[0].strategy = "shuffle".into();
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("proxy.shard_keys"));
    }

    #[test]
    fn namespace_settings_inherit_from_their_database_then_the_defaults() {
        let c = Config::parse(
            r#"
[proxy.tokenize]
min_len = 8
custom_paths = ["custom"]
[[proxy.tokenize.namespaces]]
namespace = "logs.events"
custom_paths = ["props"]
[[proxy.tokenize.namespaces]]
namespace = "logs"
min_len = 4
value_paths = ["tags"]
"#,
        )
        .unwrap();
        c.validate().unwrap();
        let p = c.proxy.tokenize.policies();
        let events = p.get("logs", "events");
        assert_eq!(events.min_len, 4);
        assert_eq!(events.custom_paths, vec![vec!["props".to_owned()]]);
        assert_eq!(events.value_paths, vec![vec!["tags".to_owned()]]);
        let other = p.get("logs", "other");
        assert_eq!(other.custom_paths, vec![vec!["custom".to_owned()]]);
        assert_eq!(p.get("app", "users").min_len, 8);
        let mut bad = c.clone();
        bad.proxy.tokenize.namespaces[0].namespace = "laconic.x".into();
        assert!(bad
            .validate()
            .unwrap_err()
            .to_string()
            .contains("proxy.tokenize.namespaces"));
    }

    /// A rule's part of digits alone would hold for a document's key of
    /// digits, never for an index, while a query reads it as both.
    #[test]
    fn rule_paths_with_a_part_of_digits_alone_are_refused() {
        for (custom, values, rule) in [
            ("sales.2024", "tags", "props"),
            ("custom", "sales.2024.region", "props"),
            ("custom", "tags", "items.0.attrs"),
        ] {
            let c = Config::parse(&format!(
                "[proxy.tokenize]\ncustom_paths = [\"{custom}\"]\nvalue_paths = [\"{values}\"]\n\
                 [[proxy.tokenize.namespaces]]\nnamespace = \"app\"\ncustom_paths = [\"{rule}\"]\n"
            ))
            .unwrap();
            let err = c.validate().unwrap_err().to_string();
            assert!(err.contains("digits alone"), "{err}");
        }
        let ok = Config::parse(
            "[proxy.tokenize]\ncustom_paths = [\"sales.q4\", \"2024-01\"]\nvalue_paths = [\"v1\"]\n",
        )
        .unwrap();
        ok.validate().unwrap();
    }
}
