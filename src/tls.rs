//! TLS on both legs, with rustls.
//!
//! - **The driver leg** ([`ServerTls`]): `[proxy.tls]` names a certificate
//!   chain and key (and optionally a CA that client certificates must chain
//!   to). `mode` says, as mongod's `tlsMode`, whether plain TCP is still
//!   served: `allowed` tells the two apart by the first byte (a TLS
//!   handshake record is `0x16`). The files are read again when they change
//!   (checked every two seconds) or on SIGHUP, so certificates rotate under
//!   a running proxy; a connection keeps the certificate it started with.
//! - **The upstream leg** ([`ClientTls`]): configured by the upstream URI's
//!   own options (`tls`/`ssl`, `tlsCAFile`, `tlsCertificateKeyFile`,
//!   `tlsInsecure`), as a driver would read them. Server name indication
//!   and hostname verification are on; without `tlsCAFile` the web's root
//!   certificates are trusted. (`tlsAllowInvalidHostnames` is refused: the
//!   proxy's own driver connection could not honour it.)
//!
//! Frames are captured, counted and rewritten after decryption.

use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::config::uri::TlsOptions;
use crate::config::{TlsConfig, TlsMode};

/// A connection on either leg: plain TCP, or TLS over it.
pub enum Stream {
    Plain(TcpStream),
    Server(Box<tokio_rustls::server::TlsStream<TcpStream>>),
    Client(Box<tokio_rustls::client::TlsStream<TcpStream>>),
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Server(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Client(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Server(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Client(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Server(s) => Pin::new(s).poll_flush(cx),
            Stream::Client(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Server(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Client(s) => Pin::new(s).poll_shutdown(cx),
        }
    }
}

/// A TLS setting that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("{what} {}: {reason}", path.display())]
pub struct TlsError {
    what: &'static str,
    path: PathBuf,
    reason: String,
}

fn error(what: &'static str, path: &Path, reason: impl ToString) -> TlsError {
    TlsError {
        what,
        path: path.to_owned(),
        reason: reason.to_string(),
    }
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| error("cannot read the certificates in", path, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| error("cannot read the certificates in", path, e))?;
    if certs.is_empty() {
        return Err(error("no certificate in", path, "expected PEM"));
    }
    Ok(certs)
}

fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| error("cannot read the private key in", path, e))
}

fn roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    for c in certificates(path)? {
        roots
            .add(c)
            .map_err(|e| error("an unusable CA certificate in", path, e))?;
    }
    Ok(roots)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

// --- the driver leg --------------------------------------------------------

/// The driver leg's TLS: the configuration in use, rebuilt when its files
/// change.
pub struct ServerTls {
    settings: TlsConfig,
    config: RwLock<Arc<ServerConfig>>,
    /// When the files were last read, by their modification times.
    stamp: RwLock<Vec<Option<SystemTime>>>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("settings", &self.settings)
            .finish()
    }
}

impl ServerTls {
    /// The driver leg's TLS, or `None` when it is disabled.
    pub fn load(settings: &TlsConfig) -> Result<Option<Arc<ServerTls>>, TlsError> {
        if settings.mode == TlsMode::Disabled {
            return Ok(None);
        }
        let tls = ServerTls {
            settings: settings.clone(),
            config: RwLock::new(Arc::new(Self::build(settings)?)),
            stamp: RwLock::new(Self::stamps(settings)),
        };
        Ok(Some(Arc::new(tls)))
    }

    fn files(settings: &TlsConfig) -> Vec<&Path> {
        let mut files: Vec<&Path> = settings.cert_file.iter().map(PathBuf::as_path).collect();
        files.extend(settings.key_file.iter().map(PathBuf::as_path));
        files.extend(settings.client_ca_file.iter().map(PathBuf::as_path));
        files
    }

    fn stamps(settings: &TlsConfig) -> Vec<Option<SystemTime>> {
        Self::files(settings)
            .into_iter()
            .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .collect()
    }

    fn build(settings: &TlsConfig) -> Result<ServerConfig, TlsError> {
        let (Some(cert), Some(key)) = (&settings.cert_file, &settings.key_file) else {
            return Err(error(
                "TLS needs a certificate and a key:",
                Path::new("proxy.tls"),
                "set cert_file and key_file",
            ));
        };
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| error("TLS", cert, e))?;
        let builder = match &settings.client_ca_file {
            Some(ca) => {
                let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(roots(ca)?),
                    provider(),
                )
                .build()
                .map_err(|e| error("cannot verify clients with", ca, e))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        builder
            .with_single_cert(certificates(cert)?, private_key(key)?)
            .map_err(|e| error("the certificate does not match the key in", key, e))
    }

    /// Reads the files again. A failure keeps the configuration in use.
    pub fn reload(&self) -> Result<(), TlsError> {
        let stamps = Self::stamps(&self.settings);
        let config = Self::build(&self.settings)?;
        *self.config.write() = Arc::new(config);
        *self.stamp.write() = stamps;
        Ok(())
    }

    /// Reads the files again if one of them changed since the last read.
    pub fn reload_if_changed(&self) -> Result<bool, TlsError> {
        if Self::stamps(&self.settings) == *self.stamp.read() {
            return Ok(false);
        }
        self.reload().map(|()| true)
    }

    /// Checks the files every `every` until `shutdown`.
    pub async fn watch(self: Arc<Self>, every: Duration, shutdown: crate::shutdown::Shutdown) {
        loop {
            tokio::select! {
                biased;
                _ = shutdown.triggered() => return,
                _ = tokio::time::sleep(every) => {}
            }
            match self.reload_if_changed() {
                Ok(true) => tracing::info!("TLS certificate files changed: reloaded"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "TLS certificate files changed but cannot be used; keeping the previous ones")
                }
            }
        }
    }

    /// The connection a driver opened, after the TLS handshake if it makes
    /// one. In `required` mode a plain connection is closed; in `allowed`
    /// mode both are served.
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<Stream> {
        let tls = starts_tls(&tcp).await?;
        if !tls {
            return match self.settings.mode {
                TlsMode::Required => Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "a plain connection to a proxy that requires TLS",
                )),
                _ => Ok(Stream::Plain(tcp)),
            };
        }
        let config = self.config.read().clone();
        let stream = tokio_rustls::TlsAcceptor::from(config).accept(tcp).await?;
        Ok(Stream::Server(Box::new(stream)))
    }
}

/// Whether the first byte the client sent opens a TLS handshake record.
pub async fn starts_tls(tcp: &TcpStream) -> io::Result<bool> {
    let mut first = [0u8; 1];
    let n = tcp.peek(&mut first).await?;
    Ok(n == 1 && first[0] == 0x16)
}

// --- the upstream leg ------------------------------------------------------

/// The upstream leg's TLS, from the upstream URI's options.
pub struct ClientTls {
    connector: tokio_rustls::TlsConnector,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

impl ClientTls {
    /// The upstream leg's TLS, or `None` when the URI does not ask for it.
    pub fn from_options(o: &TlsOptions) -> Result<Option<Arc<ClientTls>>, TlsError> {
        if !o.enabled {
            return Ok(None);
        }
        let roots = match &o.ca_file {
            Some(ca) => roots(ca)?,
            None => RootCertStore {
                roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
            },
        };
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| error("TLS", Path::new("upstream"), e))?;
        let builder = if o.insecure {
            let inner = rustls::client::WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .map_err(|e| error("TLS", Path::new("tlsCAFile"), e))?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Insecure { inner }))
        } else {
            builder.with_root_certificates(roots)
        };
        let config = match &o.cert_key_file {
            Some(pem) => builder
                .with_client_auth_cert(certificates(pem)?, private_key(pem)?)
                .map_err(|e| error("the client certificate does not match its key in", pem, e))?,
            None => builder.with_no_client_auth(),
        };
        Ok(Some(Arc::new(ClientTls {
            connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
        })))
    }

    /// TLS over `tcp` to `host` (`name:port`), its name sent and verified.
    pub async fn connect(&self, host: &str, tcp: TcpStream) -> io::Result<Stream> {
        let name = host
            .rsplit_once(':')
            .map_or(host, |(h, _)| h)
            .trim_matches(['[', ']']);
        let server = ServerName::try_from(name.to_owned())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let stream = self.connector.connect(server, tcp).await?;
        Ok(Stream::Client(Box::new(stream)))
    }
}

/// `tlsInsecure`: no certificate is verified (handshake signatures still
/// are), as drivers understand it.
#[derive(Debug)]
struct Insecure {
    inner: Arc<rustls::client::WebPkiServerVerifier>,
}

impl ServerCertVerifier for Insecure {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
