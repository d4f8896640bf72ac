//! One downstream connection and its own upstream connection.
//!
//! ```text
//! ② read frame → exchange.request → ⑤ forward
//!     → ⑥ read reply (until one without moreToCome) → exchange.reply → ⑧ write back
//! ```
//!
//! Each driver connection gets a dedicated upstream connection, so
//! authentication, cursors and transactions stay together. Requests and
//! replies are not one-to-one: a request with `moreToCome` gets no reply, and
//! a reply with `moreToCome` is followed by more (exhaust cursors, streaming
//! hello). What happens between the two ends of one request lives in
//! [`crate::exchange`].

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::tls::Stream;
use tokio_util::codec::Framed;
use tracing::{debug, info, warn};

use crate::budget::Share;
use crate::capture::{CaptureWriter, Direction};
use crate::context::ProxyContext;
use crate::error::{error_reply, ProxyError, Side};
use crate::exchange::{Exchange, SessionState, Step};
use crate::observe::{escaped, Leg as MetricLeg, Way};
use crate::shutdown::{Shutdown, Watch};
use crate::upstream::Leg;
use crate::wire::{self, CodecError, Frame, FrameReader, MessageCodec, MsgFlags};

type DownstreamConn = Framed<Stream, MessageCodec>;

pub struct Session {
    id: u64,
    peer: SocketAddr,
    /// The driver's connection: replies are written through it, and
    /// requests read from it by `reader`.
    downstream: DownstreamConn,
    reader: FrameReader,
    upstream: Leg,
    state: SessionState,
    ctx: Arc<ProxyContext>,
    /// Resolves once shutdown begins.
    stopping: Watch,
    capture: Option<CaptureWriter>,
    next_local_id: i32,
    /// A request the driver sent while an exhaust stream was still
    /// replying: served once the stream ends, as the server would.
    pipelined: Option<Frame>,
}

impl Session {
    pub(crate) fn new(
        stream: Stream,
        peer: SocketAddr,
        ctx: Arc<ProxyContext>,
        shutdown: Shutdown,
    ) -> Session {
        let id = ctx.next_session_id();
        let capture = ctx
            .capture
            .as_ref()
            .and_then(|c| match c.open_session(id, peer) {
                Ok(w) => Some(w),
                Err(e) => {
                    warn!(session = id, error = %e, "cannot open the capture file; not capturing");
                    None
                }
            });
        Session {
            id,
            peer,
            // Its own read buffer is never used: no room for it.
            downstream: Framed::with_capacity(
                stream,
                MessageCodec::new(ctx.config.max_message_size),
                0,
            ),
            reader: FrameReader::new(ctx.config.max_message_size, ctx.config.read_pace()),
            upstream: Leg::new(
                ctx.upstream.clone(),
                ctx.config.connect_timeout(),
                ctx.config.max_message_size,
                ctx.replies.clone(),
            ),
            state: SessionState::new(id),
            capture,
            ctx,
            stopping: shutdown.watch(),
            next_local_id: 1,
            pipelined: None,
        }
    }

    /// Serves the connection until either side closes it or shutdown.
    pub async fn run(mut self) {
        debug!(session = self.id, client.addr = %self.peer, "session opened");
        let served = self.serve().await;
        self.ctx.cursors.connection_closed(self.id);
        self.ctx.metrics.held_bytes(self.ctx.cursors.held_bytes());
        match served {
            Ok(()) => debug!(session = self.id, "session closed"),
            Err(e) => {
                self.ctx.metrics.error(e.code().1, e.side());
                if e.side() == Side::Upstream && e.code().0 == 6 {
                    self.ctx.upstream.topology.suspect();
                    // A server that comes back may be another one (restored
                    // or wiped): dictionaries are read again before use.
                    if let Some(t) = &self.ctx.rewrite.tokens {
                        t.store.suspect_all();
                    }
                }
                match e.side() {
                    Side::Downstream => {
                        info!(session = self.id, client.addr = %self.peer, error = %escaped(&e), "closing connection")
                    }
                    Side::Upstream | Side::Internal => {
                        warn!(session = self.id, client.addr = %self.peer, error = %escaped(&e), "closing connection")
                    }
                }
            }
        }
    }

    async fn serve(&mut self) -> Result<(), ProxyError> {
        let mut first = true;
        while let Some(frame) = self.read_request(first).await? {
            first = false;
            let started = Instant::now();
            let mut x = Exchange::begin(&self.ctx, frame, started).await?;
            if let Some(c) = &mut self.capture {
                c.record(Direction::Request, x.request_frame());
            }
            let mut pending = false;
            if let Err(e) = self.exchange(&mut x, &mut pending).await {
                let outcome = x.outcome(&e, pending);
                if outcome.answer {
                    debug!(session = self.id, command = ?x.command(), error = %escaped(&e), "answering with an error");
                    self.ctx.metrics.error(e.code().1, e.side());
                    let id = self.local_id();
                    let reply = error_reply(&e, x.request_frame(), id);
                    self.write_back(&x, reply, None).await?;
                }
                if outcome.close {
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// ④–⑧ for one request. `pending` says, on an error, whether replies
    /// of a stream were still due.
    async fn exchange(&mut self, x: &mut Exchange, pending: &mut bool) -> Result<(), ProxyError> {
        let out = match x
            .request(&self.ctx, &mut self.state, &mut self.upstream)
            .await?
        {
            Step::Answer(body, mut share) => {
                // A batch held back for a cursor is a reply like the
                // upstream's: within a share while it is written back.
                if let Some(share) = &mut share {
                    share.keep(body.document().as_bytes().len());
                }
                let id = self.local_id();
                let asked = x.request_frame().header.request_id;
                let reply = Frame::of_body(id, asked, MsgFlags::default(), body);
                return self.write_back(x, reply, share).await;
            }
            Step::Forward(out) => out,
        };
        // ⑤ forward
        let compressor = match self.state.legs.upstream_compressor {
            Some(c) if wire::may_compress(x.command()) => Some(c),
            _ => None,
        };
        let sent = self.upstream.send(out, compressor).await?;
        self.ctx.metrics.bytes(MetricLeg::Upstream, Way::Out, sent);
        if !x.expects_reply() {
            return Ok(()); // w:0: the upstream sends no reply
        }
        // ⑥ read replies, ⑦ rewrite them, ⑧ write them back
        while let Some((reply, mut share)) = self.next_reply(x.exhaust()).await? {
            *pending = reply.more_to_come();
            let (reply, taken) = x.reply(&self.ctx, &mut self.state, reply).await?;
            // What rewriting it held is freed; what is written stays.
            share = match (share, taken) {
                (Some(mut share), Some(taken)) => {
                    share.merge(taken);
                    Some(share)
                }
                (share, taken) => share.or(taken),
            };
            if let Some(share) = &mut share {
                share.keep(reply.header.length as usize);
            }
            if x.upstream_moved() {
                // Every connection the driver pooled is on the old primary:
                // its connection closes without this reply, so that the
                // driver drops them all and sends its retryable write or
                // read again on a new one, which opens on the new primary.
                self.ctx.upstream.topology.suspect();
                self.upstream.drop_connection();
                return Err(ProxyError::UpstreamLost(
                    "the upstream host is no longer the primary; the driver reconnects to the new one"
                        .into(),
                ));
            }
            self.write_back(x, reply, share).await?;
            x.answered();
            if !*pending {
                break;
            }
        }
        Ok(())
    }

    /// ② Reads the next request. `None` when the driver closed the connection
    /// or shutdown began while the session was idle.
    async fn read_request(&mut self, first: bool) -> Result<Option<Frame>, ProxyError> {
        if let Some(frame) = self.pipelined.take() {
            return Ok(Some(frame));
        }
        // `FrameReader::next` is cancellation safe: a partly read frame
        // stays in its buffer, and the session ends anyway if shutdown wins.
        let next = async {
            let next = self
                .reader
                .next(self.downstream.get_mut(), &self.ctx.reading);
            if first {
                let limit = self.ctx.config.handshake_timeout();
                match tokio::time::timeout(limit, next).await {
                    Ok(r) => r,
                    Err(_) => Some(Err(CodecError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no handshake within {limit:?}"),
                    )))),
                }
            } else {
                next.await
            }
        };
        let next = tokio::select! {
            biased;
            _ = &mut self.stopping => return Ok(None),
            next = next => next,
        };
        match next {
            None => Ok(None),
            Some(Ok(frame)) => {
                self.ctx
                    .metrics
                    .bytes(MetricLeg::Client, Way::In, frame.header.length as usize);
                Ok(Some(frame))
            }
            Some(Err(e)) => Err(downstream_error(e)),
        }
    }

    /// ⑥ The next reply. While an exhaust stream runs, the driver's close
    /// or shutdown end the stream; a request it sends is kept for after it.
    async fn next_reply(
        &mut self,
        exhaust: bool,
    ) -> Result<Option<(Frame, Option<Share>)>, ProxyError> {
        let reply = if exhaust && self.pipelined.is_none() {
            // Both futures are cancellation safe (buffered in their codecs).
            // The driver's side is watched so that a driver that leaves
            // mid-stream ends it; a request it sends meanwhile waits for
            // the stream's end.
            tokio::select! {
                biased;
                _ = &mut self.stopping => return Ok(None),
                from_driver = self.reader.next(self.downstream.get_mut(), &self.ctx.reading) => match from_driver {
                    None => return Ok(None),
                    Some(Err(e)) => return Err(downstream_error(e)),
                    Some(Ok(request)) => {
                        self.ctx
                            .metrics
                            .bytes(MetricLeg::Client, Way::In, request.header.length as usize);
                        self.pipelined = Some(request);
                        self.upstream.next_reply().await?
                    }
                },
                reply = self.upstream.next_reply() => reply?,
            }
        } else {
            self.upstream.next_reply().await?
        };
        self.ctx
            .metrics
            .bytes(MetricLeg::Upstream, Way::In, reply.0.header.length as usize);
        Ok(Some(reply))
    }

    /// ⑧ Writes a reply back, compressed as the request was. One that
    /// holds a `share` of the budget for replies must be taken by the
    /// driver at `proxy.min_write_rate`, or the connection is closed and
    /// the share given back: a driver that stops reading would otherwise
    /// hold it for as long as it keeps the connection.
    async fn write_back(
        &mut self,
        x: &Exchange,
        reply: Frame,
        share: Option<Share>,
    ) -> Result<(), ProxyError> {
        if let Some(c) = &mut self.capture {
            c.record(Direction::Reply, &reply);
        }
        let reply = x.outbound(reply)?;
        let len = reply.header.length as usize;
        self.ctx.metrics.bytes(MetricLeg::Client, Way::Out, len);
        let lost = |e: CodecError| ProxyError::DownstreamLost(e.to_string());
        let send = wire::send(&mut self.downstream, reply);
        if share.is_none() {
            return send.await.map_err(lost);
        }
        let pace = self.ctx.config.write_pace();
        match tokio::time::timeout(pace.time_for(len), send).await {
            Ok(sent) => sent.map_err(lost),
            Err(_) => Err(ProxyError::DownstreamLost(format!(
                "a reply of {len} bytes was not taken in time (proxy.min_write_rate is {} bytes a second, after {:?})",
                pace.min_rate, pace.grace
            ))),
        }
    }

    fn local_id(&mut self) -> i32 {
        let id = self.next_local_id;
        self.next_local_id = self.next_local_id.wrapping_add(1);
        id
    }
}

fn downstream_error(e: CodecError) -> ProxyError {
    match e {
        CodecError::Wire(source) => ProxyError::Malformed {
            side: Side::Downstream,
            source,
        },
        CodecError::Io(e) => ProxyError::DownstreamLost(e.to_string()),
    }
}
