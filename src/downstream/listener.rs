//! ① The accept loop: a connection limit, accept back-off, graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::{info, warn};

use super::session::Session;
use crate::config::ProxyConfig;
use crate::context::ProxyContext;
use crate::shutdown::Shutdown;

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
            tokio::spawn(super::http::serve(
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
