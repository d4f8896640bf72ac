//! ① The accept loop: a connection limit, accept back-off, graceful shutdown.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tracing::{info, warn};

use super::session::Session;
use super::workers::Workers;
use crate::config::ProxyConfig;
use crate::context::ProxyContext;
use crate::shutdown::Shutdown;
use crate::tls::{self, Stream};

/// A bound, not yet running proxy.
pub struct Proxy {
    listener: TcpListener,
    metrics_listener: Option<TcpListener>,
    ctx: Arc<ProxyContext>,
    shutdown: Shutdown,
    workers: Workers,
}

/// A running proxy: its address, and the means to stop it.
#[derive(Clone, Debug)]
pub struct ProxyHandle {
    pub addr: SocketAddr,
    /// Where /metrics, /healthz and /readyz are served, if they are.
    pub metrics_addr: Option<SocketAddr>,
    pub shutdown: Shutdown,
    /// TLS towards drivers, if it is on: [`ProxyHandle::reload_tls`].
    tls: Option<Arc<crate::tls::ServerTls>>,
}

impl ProxyHandle {
    /// Reads the TLS certificate files again (on SIGHUP); a failure keeps
    /// the ones in use.
    pub fn reload_tls(&self) -> Result<(), crate::tls::TlsError> {
        match &self.tls {
            Some(t) => t.reload(),
            None => Ok(()),
        }
    }
}

impl Proxy {
    /// Binds the listening socket.
    pub async fn bind(config: ProxyConfig) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(config.listen.as_str()).await?;
        let metrics_listener = match &config.metrics_listen {
            Some(addr) => Some(TcpListener::bind(addr.as_str()).await?),
            None => None,
        };
        let workers = Workers::start(config.threads)?;
        Ok(Proxy {
            listener,
            metrics_listener,
            ctx: Arc::new(ProxyContext::new(config).await?),
            shutdown: Shutdown::new(),
            workers,
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
            tls: self.ctx.tls.clone(),
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
            // rewound or edited one is noticed, a failed one recovers, and
            // requests rarely find one past its lease.
            let every = Duration::from_millis(self.ctx.config.tokenize.revalidate_ms);
            self.shutdown
                .tracker()
                .spawn(t.store.clone().watch(every, self.shutdown.clone()));
        }
        let upstream = &self.ctx.upstream;
        if upstream.srv.is_some() {
            // The hosts of a mongodb+srv:// URI may change.
            self.shutdown.tracker().spawn(upstream.clone().rescan(
                Duration::from_millis(self.ctx.config.srv_rescan_ms),
                self.shutdown.clone(),
            ));
        }
        if upstream.srv.is_some() || !upstream.topology.is_single() {
            // Which host is the primary, which mongos hosts answer.
            self.shutdown
                .tracker()
                .spawn(upstream.topology.clone().monitor(
                    upstream.clone(),
                    upstream.heartbeat,
                    self.ctx.config.connect_timeout(),
                    self.shutdown.clone(),
                ));
        }
        if let Some(tls) = &self.ctx.tls {
            // Certificates rotate under a sidecar: their files are watched.
            self.shutdown.tracker().spawn(
                tls.clone()
                    .watch(Duration::from_secs(2), self.shutdown.clone()),
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
            // The socket is registered again on the worker that serves it.
            let stream = match stream.into_std() {
                Ok(s) => s,
                Err(e) => {
                    info!(client.addr = %peer, error = %e, "closing connection at accept");
                    continue;
                }
            };
            let ctx = self.ctx.clone();
            let shutdown = self.shutdown.clone();
            ctx.metrics.connection_opened();
            self.workers.spawn(self.shutdown.tracker(), async move {
                let secured = async { secure(&ctx, TcpStream::from_std(stream)?).await };
                match secured.await {
                    Ok(stream) => Session::new(stream, peer, ctx.clone(), shutdown).run().await,
                    Err(e) => {
                        info!(client.addr = %peer, error = %e, "closing connection before its first message")
                    }
                }
                ctx.metrics.connection_closed();
                drop(permit);
            });
        }
        info!("stopped accepting connections");
        // The workers run until the sessions on them end (the drain), or
        // until this runtime stops.
        let (tracker, workers) = (self.shutdown.tracker().clone(), self.workers);
        tokio::spawn(async move {
            tracker.wait().await;
            drop(workers);
        });
    }
}

/// ① The connection as the session reads it: after the TLS handshake when
/// the driver makes one and TLS is served; a TLS handshake to a proxy that
/// serves none is refused at once rather than left to time out.
async fn secure(ctx: &ProxyContext, tcp: TcpStream) -> std::io::Result<Stream> {
    let limit = ctx.config.handshake_timeout();
    let handshake = async {
        match &ctx.tls {
            Some(tls) => tls.accept(tcp).await,
            None if tls::starts_tls(&tcp).await? => Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "a TLS handshake, but TLS is not served (proxy.tls.mode = disabled)",
            )),
            None => Ok(Stream::Plain(tcp)),
        }
    };
    tokio::time::timeout(limit, handshake).await.map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no handshake within {limit:?}"),
        )
    })?
}
