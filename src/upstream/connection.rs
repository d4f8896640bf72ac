//! Opening the upstream connection of one session.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use super::srv::{Resolver, Seedlist};
use super::topology::Topology;
use crate::budget::{Budget, Share};
use crate::config::uri::{ConnectionString, SrvName};
use crate::error::ProxyError;
use crate::tls::{ClientTls, Stream};
use crate::wire::{CodecError, Compressor, Frame, FrameReader, MessageCodec};

/// One session's framed upstream connection.
pub type UpstreamConn = Framed<Stream, MessageCodec>;

/// Where upstream legs go: the hosts of the upstream URI (or of its SRV
/// records), over TLS when the URI asks for it (read once: its files are
/// loaded here), in the order their [`Topology`] says.
#[derive(Clone, Debug)]
pub struct UpstreamAddr {
    pub tls: Option<Arc<ClientTls>>,
    pub topology: Arc<Topology>,
    /// How often the topology is checked (`heartbeatFrequencyMS`, 10 s).
    pub heartbeat: Duration,
    /// For `mongodb+srv://`: where the hosts come from.
    pub srv: Option<Arc<SrvSource>>,
}

/// The DNS name a `mongodb+srv://` URI names, the resolver it is looked up
/// with, and what the first lookup found.
#[derive(Debug)]
pub struct SrvSource {
    pub name: SrvName,
    pub resolver: Resolver,
    pub first: Seedlist,
}

impl UpstreamAddr {
    /// The upstream of `uri`; a `mongodb+srv://` one is looked up with the
    /// system's resolver, or the DNS server at `dns`.
    pub async fn new(uri: &str, dns: Option<SocketAddr>) -> Result<UpstreamAddr, String> {
        let c = ConnectionString::parse(uri)?;
        let tls = ClientTls::from_options(&c.tls).map_err(|e| e.to_string())?;
        let (hosts, srv) = match c.srv {
            None => (c.hosts, None),
            Some(name) => {
                let resolver = Resolver::new(dns)?;
                let first = resolver.seedlist(&name).await?;
                (
                    first.hosts.clone(),
                    Some(Arc::new(SrvSource {
                        name,
                        resolver,
                        first,
                    })),
                )
            }
        };
        Ok(UpstreamAddr {
            topology: Arc::new(Topology::new(hosts)),
            tls,
            heartbeat: Duration::from_millis(c.heartbeat_ms.unwrap_or(10_000)),
            srv,
        })
    }

    /// Looks the SRV records up again every `every` until `shutdown`; new
    /// sessions follow the hosts they list. A failed lookup keeps the hosts
    /// known (as drivers do).
    pub async fn rescan(self, every: Duration, shutdown: crate::shutdown::Shutdown) {
        let Some(srv) = &self.srv else { return };
        loop {
            tokio::select! {
                biased;
                _ = shutdown.triggered() => return,
                _ = tokio::time::sleep(every) => {}
            }
            match srv.resolver.seedlist(&srv.name).await {
                Ok(seeds) => self.topology.set_hosts(seeds.hosts),
                Err(e) => tracing::warn!(srv = srv.name.host, "{e}; the hosts known are kept"),
            }
        }
    }
}

/// Opens one host (and completes the TLS handshake, when TLS is on).
pub async fn connect_host(
    addr: &UpstreamAddr,
    host: &str,
    timeout: Duration,
    max_message_size: usize,
) -> Result<UpstreamConn, String> {
    let stream = open_host(addr, host, timeout).await?;
    Ok(Framed::new(stream, MessageCodec::new(max_message_size)))
}

async fn open_host(addr: &UpstreamAddr, host: &str, timeout: Duration) -> Result<Stream, String> {
    let open = async {
        let tcp = TcpStream::connect(host).await?;
        tcp.set_nodelay(true)?;
        match &addr.tls {
            Some(tls) => tls.connect(host, tcp).await,
            None => Ok(Stream::Plain(tcp)),
        }
    };
    match tokio::time::timeout(timeout, open).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(e)) => Err(format!("{host}: {e}")),
        Err(_) => Err(format!("{host}: timed out after {timeout:?}")),
    }
}

/// Connects to the host the topology puts first, or the next that answers
/// within `timeout`.
pub async fn connect(
    addr: &UpstreamAddr,
    timeout: Duration,
    max_message_size: usize,
) -> Result<UpstreamConn, ProxyError> {
    let stream = open(addr, timeout).await?;
    Ok(Framed::new(stream, MessageCodec::new(max_message_size)))
}

async fn open(addr: &UpstreamAddr, timeout: Duration) -> Result<Stream, ProxyError> {
    let mut last = String::from("no host tried");
    let order = addr.topology.order();
    for host in &order {
        match open_host(addr, host, timeout).await {
            Ok(stream) => return Ok(stream),
            Err(e) => {
                if order.len() > 1 {
                    addr.topology.down(host);
                }
                last = e;
            }
        }
    }
    Err(ProxyError::UpstreamUnavailable {
        addr: order.join(","),
        reason: last,
    })
}

/// A session's upstream leg: its connection, opened on the first request
/// that needs it. Replies are read within shares of the budget for replies
/// (`proxy.max_reply_bytes`), which they hand on to whoever writes them
/// back ([`Leg::next_reply`]).
pub struct Leg {
    addr: UpstreamAddr,
    timeout: Duration,
    max_message_size: usize,
    replies: Budget,
    conn: Option<(UpstreamConn, FrameReader)>,
    /// Ids of the requests the proxy itself sends on this connection.
    next_own_id: i32,
}

/// What reading and rewriting a reply holds, per byte of the reply
/// (decompressed): the reply as read, its expansion, and the batch a
/// cursor reply is cut to. Measured (peak RSS of eight sessions at once):
/// 2.9 for documents whose names are a few bytes of each, 6.5 for
/// documents of names and small numbers, which expand to 3.7 times their
/// stored size; this covers expansions to about 4.5 times, and an
/// expansion past 4 times takes the rest from the budget as it grows
/// ([`crate::rewrite::Room`]). While the reply is written back, its share
/// is what is written.
const REPLY_HOLDS: usize = 8;

impl Leg {
    pub fn new(
        addr: UpstreamAddr,
        timeout: Duration,
        max_message_size: usize,
        replies: Budget,
    ) -> Leg {
        Leg {
            addr,
            timeout,
            max_message_size,
            replies,
            conn: None,
            next_own_id: i32::MIN,
        }
    }

    async fn conn(&mut self) -> Result<&mut (UpstreamConn, FrameReader), ProxyError> {
        if self.conn.is_none() {
            let stream = open(&self.addr, self.timeout).await?;
            // Replies are read by the reader; the framing is for writes.
            let framed = Framed::with_capacity(stream, MessageCodec::new(self.max_message_size), 0);
            let reader = FrameReader::for_replies(self.max_message_size, REPLY_HOLDS);
            self.conn = Some((framed, reader));
        }
        self.conn
            .as_mut()
            .ok_or_else(|| ProxyError::Internal("no upstream connection".into()))
    }

    /// Sends a frame, compressed with `compressor` when one is given.
    pub async fn send(
        &mut self,
        frame: Frame,
        compressor: Option<Compressor>,
    ) -> Result<usize, ProxyError> {
        let frame = match compressor {
            Some(c) => frame
                .compress(c)
                .map_err(|e| ProxyError::Internal(e.to_string()))?,
            None => frame,
        };
        let len = frame.header.length as usize;
        send(&mut self.conn().await?.0, frame).await?;
        Ok(len)
    }

    /// Closes the connection (the server it went to stopped being the
    /// primary): the next request would open one on the new primary.
    pub fn drop_connection(&mut self) {
        self.conn = None;
    }

    /// The next reply, as it came (a caller decompresses it), and its share
    /// of the budget for replies if it is large: the caller holds it until
    /// the reply is written back. Cancellation safe: a partly read frame
    /// stays buffered in the reader, with its share.
    pub async fn next_reply(&mut self) -> Result<(Frame, Option<Share>), ProxyError> {
        let Some((framed, reader)) = self.conn.as_mut() else {
            return Err(ProxyError::Internal("no upstream connection".into()));
        };
        read_reply(reader.next_held(framed.get_mut(), &self.replies).await)
    }

    /// Runs a command of the proxy's own on this session's connection (with
    /// the session's authentication): its reply body.
    pub async fn command(
        &mut self,
        body: &bson::RawDocument,
    ) -> Result<bson::RawDocumentBuf, ProxyError> {
        let id = self.next_own_id;
        self.next_own_id = self.next_own_id.wrapping_add(1);
        let msg = crate::wire::OpMsg::from_body(crate::wire::MsgFlags::default(), body);
        send(
            &mut self.conn().await?.0,
            Frame::new(id, 0, crate::wire::Message::Msg(msg)),
        )
        .await?;
        let (reply, _share) = self.next_reply().await?;
        match reply.op_msg() {
            Some(m) if reply.header.response_to == id => Ok(m.body().to_owned()),
            _ => Err(ProxyError::UpstreamLost(
                "the upstream answered the proxy's own command out of turn".into(),
            )),
        }
    }
}

/// Sends one frame upstream.
pub async fn send(conn: &mut UpstreamConn, frame: Frame) -> Result<(), ProxyError> {
    crate::wire::send(conn, frame)
        .await
        .map_err(|e| ProxyError::UpstreamLost(e.to_string()))
}

/// Reads the next reply; a closed connection is an error, since a reply was due.
pub async fn next_reply(conn: &mut UpstreamConn) -> Result<Frame, ProxyError> {
    let read = conn.next().await.map(|r| r.map(|frame| (frame, ())));
    read_reply(read).map(|(frame, ())| frame)
}

fn read_reply<T>(read: Option<Result<(Frame, T), CodecError>>) -> Result<(Frame, T), ProxyError> {
    match read {
        Some(Ok(read)) => Ok(read),
        Some(Err(e)) => Err(ProxyError::UpstreamLost(e.to_string())),
        None => Err(ProxyError::UpstreamLost(
            "connection closed by the upstream".into(),
        )),
    }
}
