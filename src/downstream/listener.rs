//! ① The accept loop: a connection limit, accept back-off, graceful shutdown.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{info, warn};

use super::session::Session;
use crate::capture::CaptureDir;
use crate::config::ProxyConfig;
use crate::observe::Metrics;
use crate::rewrite;
use crate::shutdown::Shutdown;
use crate::token::{NameStore, Tokens};
use crate::upstream::UpstreamAddr;

/// What every session shares.
#[derive(Debug)]
pub struct ProxyContext {
    pub config: ProxyConfig,
    pub upstream: UpstreamAddr,
    pub rewrite: rewrite::Settings,
    pub capture: Option<CaptureDir>,
    /// Cursor documents held back from oversized expanded batches, by the
    /// cursor id the driver knows (any of its connections may ask for them).
    pub held: DashMap<i64, (Instant, rewrite::cursor::Held)>,
    /// Counters for /metrics.
    pub metrics: Metrics,
    /// A driver of the proxy's own to the upstream: /readyz pings through
    /// it, and documents are brought to their stored form through it ahead
    /// of updates while a collection migrates.
    pub own: mongodb::Client,
    /// The untokenized deployment reads are compared with, in shadow mode.
    pub shadow: Option<Arc<crate::observe::Shadow>>,
    next_session: AtomicU64,
}

impl ProxyContext {
    pub async fn new(config: ProxyConfig) -> std::io::Result<ProxyContext> {
        let upstream = UpstreamAddr::parse(&config.upstream)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let capture = match &config.capture_dir {
            Some(dir) => Some(CaptureDir::create(dir)?),
            None => None,
        };
        let own = own_client(&config.upstream).await?;
        let shadow = match &config.shadow {
            Some(s) => Some(Arc::new(
                crate::observe::Shadow::connect(&s.uri, s.sample)
                    .await
                    .map_err(|e| {
                        std::io::Error::new(
                            std::io::ErrorKind::InvalidInput,
                            format!("shadow URI: {e}"),
                        )
                    })?,
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
                cursor_kinds: Default::default(),
            },
            upstream,
            capture,
            config,
            held: DashMap::new(),
            metrics: Metrics::new(metrics),
            own,
            shadow,
            next_session: AtomicU64::new(1),
        })
    }

    pub(crate) fn next_session_id(&self) -> u64 {
        self.next_session.fetch_add(1, Ordering::Relaxed)
    }
}

/// A client that gives up on the upstream after 2 s, for readiness checks.
async fn own_client(uri: &str) -> std::io::Result<mongodb::Client> {
    let invalid = |e: mongodb::error::Error| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("upstream URI: {e}"),
        )
    };
    let mut options = mongodb::options::ClientOptions::parse(uri)
        .await
        .map_err(invalid)?;
    options.server_selection_timeout = Some(Duration::from_secs(2));
    options.connect_timeout = Some(Duration::from_secs(2));
    options.app_name = Some("laconic".into());
    mongodb::Client::with_options(options).map_err(invalid)
}

/// The name store's client and the tokenization policy, when tokenization is on.
async fn tokens(config: &ProxyConfig) -> std::io::Result<Option<Tokens>> {
    let t = &config.tokenize;
    let policies = t.policies();
    if !policies.is_active() {
        return Ok(None);
    }
    let uri = t.store_uri.as_deref().unwrap_or(&config.upstream);
    let client = mongodb::Client::with_uri_str(uri).await.map_err(|e| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("name store client: {e}"),
        )
    })?;
    let store = NameStore::new(client, t.cap, policies.clone())
        .with_legacy(&t.store_db, &t.store_collection);
    Ok(Some(Tokens { policies, store }))
}

/// A bound, not yet running proxy.
pub struct Proxy {
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    ctx: Arc<ProxyContext>,
    shutdown: Shutdown,
}

/// A running proxy: its address, and the means to stop it.
#[derive(Clone, Debug)]
pub struct ProxyHandle {
    pub addr: SocketAddr,
    /// Where /metrics, /healthz and /readyz are served, if they are.
    pub metrics_addr: Option<SocketAddr>,
    pub shutdown: Shutdown,
}

impl Proxy {
    /// Binds the listening socket.
    pub async fn bind(config: ProxyConfig) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(config.listen.as_str()).await?;
        let metrics_listener = match &config.metrics_listen {
            Some(addr) => Some(TcpListener::bind(addr.as_str()).await?),
            None => None,
        };
        Ok(Proxy {
            listener,
            metrics_listener,
            ctx: Arc::new(ProxyContext::new(config).await?),
            shutdown: Shutdown::new(),
        })
    }

    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    pub fn handle(&self) -> std::io::Result<ProxyHandle> {
        Ok(ProxyHandle {
            addr: self.local_addr()?,
            metrics_addr: self
                .metrics_listener
                .as_ref()
                .map(TcpListener::local_addr)
                .transpose()?,
            shutdown: self.shutdown.clone(),
        })
    }

    /// Binds and runs in the background; for tests, benchmarks and embedding.
    pub async fn start(config: ProxyConfig) -> std::io::Result<ProxyHandle> {
        let proxy = Proxy::bind(config).await?;
        let handle = proxy.handle()?;
        tokio::spawn(proxy.run());
        Ok(handle)
    }

    /// Accepts until shutdown is triggered. Sessions run on the shutdown
    /// tracker, so [`Shutdown::drain`] waits for them.
    pub async fn run(mut self) {
        if let Some(l) = self.metrics_listener.take() {
            tokio::spawn(crate::observe::http::serve(
                l,
                self.ctx.clone(),
                self.shutdown.clone(),
            ));
        }
        if let Some(t) = &self.ctx.rewrite.tokens {
            // Dictionaries are read again every second: a dropped, replaced,
            // rewound or edited one is noticed, and a failed one recovers.
            self.shutdown.tracker().spawn(
                t.store
                    .clone()
                    .watch(Duration::from_secs(1), self.shutdown.clone()),
            );
        }
        let limit = Arc::new(Semaphore::new(self.ctx.config.max_connections));
        let mut backoff = Duration::from_millis(5);
        loop {
            let accepted = tokio::select! {
                biased;
                _ = self.shutdown.triggered() => break,
                accepted = self.listener.accept() => accepted,
            };
            let (stream, peer) = match accepted {
                Ok(pair) => {
                    backoff = Duration::from_millis(5);
                    pair
                }
                Err(e) => {
                    // Out of file descriptors and the like: wait, then try again.
                    warn!(error = %e, "accept failed; backing off for {backoff:?}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            let Ok(permit) = limit.clone().try_acquire_owned() else {
                warn!(
                    client.addr = %peer,
                    max_connections = self.ctx.config.max_connections,
                    "connection refused: the connection limit is reached"
                );
                self.ctx.metrics.connection_refused();
                drop(stream);
                continue;
            };
            let _ = stream.set_nodelay(true);
            let session = Session::new(stream, peer, self.ctx.clone(), self.shutdown.clone());
            let ctx = self.ctx.clone();
            ctx.metrics.connection_opened();
            self.shutdown.tracker().spawn(async move {
                session.run().await;
                ctx.metrics.connection_closed();
                drop(permit);
            });
        }
        info!("stopped accepting connections");
    }
}
