//! What every session shares: the configuration, the rewriting settings
//! (with the name store), the cursor table, the counters, the proxy's own
//! upstream client and shadow deployment. Built once, before accepting.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::capture::CaptureDir;
use crate::config::ProxyConfig;
use crate::exchange::{CursorTable, HeavyWork, RequiresAuth};
use crate::observe::Metrics;
use crate::rewrite;
use crate::token::{NameStore, Tokens};
use crate::upstream::UpstreamAddr;

/// What every session shares.
#[derive(Debug)]
pub struct ProxyContext {
    pub config: ProxyConfig,
    pub upstream: UpstreamAddr,
    pub rewrite: rewrite::Settings,
    pub capture: Option<CaptureDir>,
    /// The cursors the proxy knows of (their kinds, documents held back).
    pub cursors: CursorTable,
    /// Counters for /metrics.
    pub metrics: Arc<Metrics>,
    /// A driver of the proxy's own to the upstream: /readyz pings through
    /// it, and documents are brought to their stored form through it ahead
    /// of updates while a collection migrates.
    pub own: mongodb::Client,
    /// Whether the upstream requires authentication (asked once a minute).
    pub requires_auth: RequiresAuth,
    /// The untokenized deployment reads are compared with, in shadow mode.
    pub shadow: Option<Arc<crate::observe::Shadow>>,
    /// TLS towards drivers, if it is on.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// The threads and the memory budget for heavy work: decompressing
    /// and rewriting huge messages (see [`crate::exchange`]).
    pub heavy: HeavyWork,
    /// The memory budget for messages being read from drivers (see
    /// [`crate::wire::FrameReader`]).
    pub reading: crate::budget::Budget,
    /// The memory budget for upstream replies on their way to drivers (see
    /// [`crate::upstream::Leg`]).
    pub replies: crate::budget::Budget,
    next_session: AtomicU64,
}

impl ProxyContext {
    pub async fn new(config: ProxyConfig) -> std::io::Result<ProxyContext> {
        let upstream = UpstreamAddr::new(&config.upstream, config.dns_server())
            .await
            .map_err(|e| invalid(format!("upstream URI: {e}")))?;
        if !upstream.topology.is_single() {
            // Sessions open on the right host from the first one on.
            upstream
                .topology
                .check(&upstream, config.connect_timeout())
                .await;
        }
        let tls = crate::tls::ServerTls::load(&config.tls).map_err(invalid)?;
        let capture = match &config.capture_dir {
            Some(dir) => Some(CaptureDir::create(dir)?),
            None => None,
        };
        let own = own_client(
            &driver_uri(&config.upstream, config.dns_server()).await?,
            config.connect_timeout(),
        )
        .await?;
        let shadow = match &config.shadow {
            Some(s) => Some(Arc::new(
                crate::observe::Shadow::connect(&s.uri, s.sample)
                    .await
                    .map_err(|e| invalid(format!("shadow URI: {e}")))?,
            )),
            None => None,
        };
        let metrics = config.metrics;
        Ok(ProxyContext {
            rewrite: rewrite::Settings {
                client_compressors: config.client_compressors(),
                upstream_compressors: config.upstream_compressors(),
                shard_keys: rewrite::shard_key::ShardKeys::new(config.shard_key_rules()),
                tokens: tokens(&config).await?,
            },
            upstream,
            capture,
            cursors: CursorTable::new(config.max_held_bytes),
            tls,
            heavy: HeavyWork::new(config.max_work_bytes, HeavyWork::threads())?,
            reading: crate::budget::Budget::new(config.max_read_bytes),
            replies: crate::budget::Budget::new(config.max_reply_bytes),
            config,
            requires_auth: RequiresAuth::default(),
            metrics: Arc::new(Metrics::new(metrics)),
            own,
            shadow,
            next_session: AtomicU64::new(1),
        })
    }

    pub(crate) fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }
}

/// A setting the proxy cannot start with.
fn invalid(why: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string())
}

/// The URI the proxy's own drivers use for `uri`. A `mongodb+srv://` URI
/// is theirs to look up, with the system's resolver, and to look up again;
/// when the proxy's lookups go to a DNS server of their own (`dns_server`),
/// which a driver cannot be pointed at, they get the hosts it lists.
async fn driver_uri(uri: &str, dns: Option<std::net::SocketAddr>) -> std::io::Result<String> {
    let srv = crate::config::uri::ConnectionString::parse(uri)
        .map_err(invalid)?
        .srv;
    match (srv, dns) {
        (Some(name), Some(_)) => {
            let seeds = crate::upstream::srv::Resolver::new(dns)
                .map_err(invalid)?
                .seedlist(&name)
                .await
                .map_err(invalid)?;
            Ok(crate::upstream::srv::plain_uri(uri, &seeds))
        }
        _ => Ok(uri.to_owned()),
    }
}

/// The proxy's own client of the upstream. Its connections, and the
/// checks of its monitor, are timed like the sessions' (`connect_timeout`):
/// a monitor's check that gives up sooner than a busy upstream answers
/// takes the client's connections down with it, conversions in flight
/// included. Readiness checks set their own shorter limit.
async fn own_client(uri: &str, connect_timeout: Duration) -> std::io::Result<mongodb::Client> {
    let bad_uri = |e: mongodb::error::Error| invalid(format!("upstream URI: {e}"));
    let mut options = mongodb::options::ClientOptions::parse(uri)
        .await
        .map_err(bad_uri)?;
    options.connect_timeout = Some(connect_timeout);
    options.app_name = Some("laconic".into());
    mongodb::Client::with_options(options).map_err(bad_uri)
}

/// The name store's client and the tokenization policy, when tokenization is on.
async fn tokens(config: &ProxyConfig) -> std::io::Result<Option<Tokens>> {
    let t = &config.tokenize;
    let policies = t.policies();
    if !policies.is_active() {
        return Ok(None);
    }
    let uri = driver_uri(
        t.store_uri.as_deref().unwrap_or(&config.upstream),
        config.dns_server(),
    )
    .await?;
    let client = mongodb::Client::with_uri_str(uri)
        .await
        .map_err(|e| invalid(format!("name store client: {e}")))?;
    let store = NameStore::new(client, t.cap, policies.clone())
        .with_legacy(&t.store_db, &t.store_collection)
        .with_records(&t.store_db);
    Ok(Some(Tokens { policies, store }))
}
