//! One downstream connection and its own upstream connection: the whole
//! pipeline in one loop.
//!
//! ```text
//! read frame → decompress → rewrite request → forward
//!     → read reply (until one without moreToCome) → rewrite reply → write back
//! ```
//!
//! Each driver connection gets a dedicated upstream connection, so
//! authentication, cursors and transactions stay together. Requests and
//! replies are not one-to-one: a request with `moreToCome` gets no reply, and
//! a reply with `moreToCome` is followed by more (exhaust cursors, streaming
//! hello).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;
use tracing::{debug, info, warn};

use super::listener::ProxyContext;
use crate::capture::{CaptureWriter, Direction};
use crate::error::{error_reply, ProxyError, Side};
use crate::observe::{Leg, Way};
use crate::rewrite::{self, LegState};
use crate::shutdown::Shutdown;
use crate::token::Names;
use crate::upstream::{self, UpstreamConn};
use crate::wire::{self, may_compress, CodecError, Compressor, Frame, Message, MessageCodec};

type DownstreamConn = Framed<TcpStream, MessageCodec>;

pub struct Session {
    id: u64,
    peer: SocketAddr,
    downstream: DownstreamConn,
    upstream: Option<UpstreamConn>,
    legs: LegState,
    ctx: Arc<ProxyContext>,
    shutdown: Shutdown,
    capture: Option<CaptureWriter>,
    next_local_id: i32,
}

/// A decompressed request and how its replies must travel back.
struct Request {
    frame: Frame,
    /// The compressor the driver used; replies are compressed the same way.
    compressor: Option<Compressor>,
    /// The command name, for logs and the never-compress list.
    command: String,
}

impl Session {
    pub(crate) fn new(
        stream: TcpStream,
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
            downstream: Framed::new(stream, MessageCodec::new(ctx.config.max_message_size)),
            upstream: None,
            legs: LegState::default(),
            capture,
            ctx,
            shutdown,
            next_local_id: 1,
        }
    }

    /// Serves the connection until either side closes it or shutdown.
    pub async fn run(mut self) {
        debug!(session = self.id, client.addr = %self.peer, "session opened");
        match self.serve().await {
            Ok(()) => debug!(session = self.id, "session closed"),
            Err(e) => {
                self.ctx.metrics.error(e.code().1);
                match e.side() {
                    Side::Downstream => {
                        info!(session = self.id, client.addr = %self.peer, error = %e, "closing connection")
                    }
                    Side::Upstream | Side::Internal => {
                        warn!(session = self.id, client.addr = %self.peer, error = %e, "closing connection")
                    }
                }
            }
        }
    }

    async fn serve(&mut self) -> Result<(), ProxyError> {
        let mut first = true;
        while let Some(frame) = self.read_request(first).await? {
            first = false;
            if let Err(e) = self.handle(frame).await {
                if e.side() == Side::Upstream && e.code().0 == 6 {
                    // A server that comes back may be another one (restored
                    // or wiped): dictionaries are read again before use.
                    if let Some(t) = &self.ctx.rewrite.tokens {
                        t.store.suspect_all();
                    }
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// ② Reads the next request. `None` when the driver closed the connection
    /// or shutdown began while the session was idle.
    async fn read_request(&mut self, first: bool) -> Result<Option<Frame>, ProxyError> {
        // `FramedRead::next` is cancellation safe: a partly read frame stays
        // in the codec's buffer, and the session ends anyway if shutdown wins.
        let next = async {
            if first {
                let limit = self.ctx.config.handshake_timeout();
                match tokio::time::timeout(limit, self.downstream.next()).await {
                    Ok(r) => r,
                    Err(_) => Some(Err(CodecError::Io(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no handshake within {limit:?}"),
                    )))),
                }
            } else {
                self.downstream.next().await
            }
        };
        let next = tokio::select! {
            biased;
            _ = self.shutdown.triggered() => return Ok(None),
            next = next => next,
        };
        match next {
            None => Ok(None),
            Some(Ok(frame)) => {
                self.ctx
                    .metrics
                    .bytes(Leg::Client, Way::In, frame.header.length as usize);
                Ok(Some(frame))
            }
            Some(Err(e)) => Err(downstream_error(e)),
        }
    }

    /// ③–⑧ for one request.
    async fn handle(&mut self, frame: Frame) -> Result<(), ProxyError> {
        let started = Instant::now();
        let request = self.decode(frame)?;
        let _timer = self.ctx.metrics.enabled().then(|| RequestTimer {
            ctx: self.ctx.clone(),
            command: request.command.clone(),
            started,
        });
        if let Some(c) = &mut self.capture {
            c.record(Direction::Request, &request.frame);
        }

        // A getMore for documents held back from an oversized batch is
        // answered here; the upstream is asked again once they are served.
        if request.command == "killCursors" {
            if let Some(m) = request.frame.op_msg() {
                for id in rewrite::cursor::kill_cursors_targets(m.body()) {
                    self.ctx.rewrite.cursor_kinds.remove(&id);
                }
            }
        }
        if let Some(body) = self.answer_from_held(&request) {
            return self.answer(&request, &body).await;
        }

        // ④ rewrite request (a failure forwards nothing)
        let more_to_come = request.frame.more_to_come();
        let (outbound, plan) = match self.prepare(&request).await {
            Ok(r) => r,
            Err(e) if more_to_come => {
                // The driver expects no reply to this request: the refusal can
                // only be logged, and the request is not forwarded.
                warn!(session = self.id, command = %request.command, error = %e, "unacknowledged request refused");
                return if e.ends_session() { Err(e) } else { Ok(()) };
            }
            Err(e) => {
                self.reply_error(&request, &e).await?;
                return if e.ends_session() { Err(e) } else { Ok(()) };
            }
        };
        if request.command == "insert"
            && self.ctx.rewrite.tokens.is_some()
            && self.ctx.metrics.enabled()
        {
            self.count_documents(&request.frame, &outbound);
        }

        // Shadow mode: the logical request, kept for the comparison.
        let shadowed = match (&self.ctx.shadow, request.frame.op_msg()) {
            (Some(shadow), Some(m))
                if !more_to_come && shadow.wants(&request.command, m.body()) =>
            {
                bson::Document::try_from(m.body()).ok()
            }
            _ => None,
        };

        // ⑤ forward
        if let Err(e) = self.forward(outbound, &request.command).await {
            if !more_to_come {
                self.reply_error(&request, &e).await?;
            }
            return Err(e);
        }
        if more_to_come {
            return Ok(()); // w:0: the upstream sends no reply
        }

        // ⑥ read replies, ⑦ rewrite them, ⑧ write them back
        let exhaust = request.frame.exhaust_allowed();
        let mut answered = false;
        loop {
            let reply = match self.next_reply(exhaust).await {
                Ok(Some(reply)) => reply,
                Ok(None) => return Ok(()),
                Err(e) => {
                    if !answered {
                        self.reply_error(&request, &e).await?;
                    }
                    return Err(e);
                }
            };
            let reply = decompress(reply, Side::Upstream, self.ctx.config.max_message_size)?.0;
            let more = reply.more_to_come();
            let reply = match self.rewrite_reply(reply, &plan).await {
                Ok(reply) => reply,
                Err(e) => {
                    // The upstream answered but the answer cannot be shown
                    // faithfully: the driver gets an error in its place.
                    if !answered {
                        self.reply_error(&request, &e).await?;
                    }
                    return if more || e.ends_session() {
                        Err(e)
                    } else {
                        Ok(())
                    };
                }
            };
            if let (Some(logical), Some(shadow), Some(m)) =
                (&shadowed, &self.ctx.shadow, reply.op_msg())
            {
                if let Ok(answer) = bson::Document::try_from(m.body()) {
                    tokio::spawn(
                        shadow
                            .clone()
                            .check(logical.clone(), answer, self.ctx.clone()),
                    );
                }
            }
            self.write_back(reply, &request).await?;
            answered = true;
            if !more {
                return Ok(());
            }
        }
    }

    /// ④ The request as it is forwarded, and how its reply is read: the
    /// tokens it needs allocated, then the rewrite, then (while its
    /// collection migrates) the documents an update will meet brought to the
    /// stored form.
    async fn prepare(
        &mut self,
        request: &Request,
    ) -> Result<(Frame, rewrite::ReplyPlan), ProxyError> {
        rewrite::admit(&request.frame, &self.ctx.rewrite)?;
        self.prepare_tokens(request).await?;
        let rewritten = rewrite::request(&request.frame, &self.ctx.rewrite, &self.legs)?;
        let outbound = rewritten.frame.unwrap_or_else(|| request.frame.clone());
        self.convert_ahead(request).await?;
        Ok((outbound, rewritten.plan))
    }

    /// While `laconic migrate` rewrites a collection, an operator or
    /// pipeline update could meet a document still in the other form and
    /// write beside its fields: the documents its filters match are
    /// rewritten first, the way the migration does it (one conditional
    /// update each), so that the update meets the stored form only.
    async fn convert_ahead(&self, request: &Request) -> Result<(), ProxyError> {
        let (Some(t), Some(m)) = (&self.ctx.rewrite.tokens, request.frame.op_msg()) else {
            return Ok(());
        };
        if !matches!(
            request.command.as_str(),
            "update" | "findAndModify" | "findandmodify"
        ) {
            return Ok(());
        }
        // Read from the raw body: only a migrating collection's updates are parsed.
        let body = m.body();
        let (Ok(db), Some(Ok((_, bson::RawBsonRef::String(coll))))) =
            (body.get_str("$db"), body.iter().next())
        else {
            return Ok(());
        };
        let Some(migration) = t.policies.migration(db, coll) else {
            return Ok(());
        };
        let cmd = rewrite::Command::from_msg(m)?;
        let names = t.store.dictionary(db)?;
        let filters = rewrite::crud::migration_filters(&cmd, db, &t.policies, &*names)?;
        let target = crate::convert::Target {
            coll: &self.ctx.own.database(db).collection(coll),
            store: &t.store,
            db,
            policy: t.policies.get(db, coll),
            reverse: migration == crate::token::Migration::Reverse,
        };
        for filter in filters {
            let n = target.convert_matching(filter).await.map_err(|e| {
                ProxyError::Migration(format!(
                    "{db}.{coll} is being migrated, and the documents this update matches could not be brought to one form first: {e}"
                ))
            })?;
            debug!(
                session = self.id,
                db,
                coll,
                documents = n,
                "rewritten ahead of an update"
            );
        }
        Ok(())
    }

    /// Counts an insert's document bytes as sent and as stored.
    fn count_documents(&self, original: &Frame, stored: &Frame) {
        let (Some(m), Some(out)) = (original.op_msg(), stored.op_msg()) else {
            return;
        };
        let body = m.body();
        let (Ok(db), Some(Ok((_, coll)))) = (body.get_str("$db"), body.iter().next()) else {
            return;
        };
        let ns = format!("{db}.{}", coll.as_str().unwrap_or_default());
        self.ctx.metrics.documents(
            &ns,
            "write",
            rewrite::inserted_bytes(m),
            rewrite::inserted_bytes(out),
        );
    }

    /// Allocates the tokens a write needs, and makes sure the cache knows
    /// every name a command mentions before the pure rewrite looks them up.
    async fn prepare_tokens(&self, request: &Request) -> Result<(), ProxyError> {
        let Some(t) = &self.ctx.rewrite.tokens else {
            return Ok(());
        };
        let Message::Msg(m) = request.frame.message() else {
            return Ok(());
        };
        let Some(db) = rewrite::token_scope(m, &self.ctx.rewrite)? else {
            return Ok(());
        };
        let db = db.as_str();
        let cmd = rewrite::Command::from_msg(m)?;
        let mut trips = t.store.ensure_loaded(db).await?.0;
        // A database whose dictionary cannot be trusted is refused whole.
        t.store.dictionary(db)?;
        let allocate = rewrite::crud::names_to_allocate(&cmd, db, &t.policies);
        if !allocate.names.is_empty() || !allocate.values.is_empty() {
            let names: Vec<&str> = allocate.names.iter().map(String::as_str).collect();
            let values: Vec<&str> = allocate.values.iter().map(String::as_str).collect();
            trips += t.store.allocate(db, &names, &values).await?.0;
        }
        // Names another proxy may have given tokens since this one last read
        // the dictionary; values matched by a regular expression need the
        // whole value dictionary, so it is read again whatever the command names.
        let resolve = rewrite::crud::names_to_resolve(&cmd, db, &t.policies);
        let dict = t.store.dictionary(db)?;
        let stale = resolve.names.iter().any(|n| dict.token(n).is_none())
            || (t.policies.has_value_paths()
                && resolve.values.iter().any(|v| dict.value_token(v).is_none()));
        if stale {
            trips += t.store.refresh(db).await?.0;
            t.store.dictionary(db)?;
        }
        self.ctx.metrics.store_lookup(trips == 0);
        self.ctx.metrics.store_round_trips(trips);
        Ok(())
    }

    /// The reply to a `getMore` or `killCursors` of documents held back, if
    /// the request is one.
    fn answer_from_held(&self, request: &Request) -> Option<bson::RawDocumentBuf> {
        use rewrite::cursor;
        if self.ctx.held.is_empty() {
            return None;
        }
        let Message::Msg(m) = request.frame.message() else {
            return None;
        };
        match request.command.as_str() {
            "getMore" => {
                let (id, batch_size) = cursor::get_more_target(m.body())?;
                let mut entry = self.ctx.held.get_mut(&id)?;
                let (since, held) = entry.value_mut();
                *since = Instant::now();
                let body = cursor::get_more_reply(held, id, batch_size, cursor::MAX_REPLY_BODY);
                let drained = held.docs.is_empty();
                drop(entry);
                if drained {
                    self.ctx.held.remove(&id);
                }
                Some(body)
            }
            "killCursors" => {
                let ids = cursor::kill_cursors_targets(m.body());
                let mut proxy_only = !ids.is_empty();
                for id in &ids {
                    match self.ctx.held.remove(id) {
                        Some((_, (_, h))) if h.upstream_id == 0 => {}
                        _ => proxy_only = false,
                    }
                }
                proxy_only.then(|| cursor::kill_cursors_reply(&ids))
            }
            _ => None,
        }
    }

    /// Keeps documents held back for a cursor; ones a driver abandoned go
    /// when the server would have timed the cursor out (10 minutes idle).
    fn hold(&self, id: i64, held: rewrite::cursor::Held) {
        const IDLE: Duration = Duration::from_secs(600);
        self.ctx.held.retain(|_, (since, _)| since.elapsed() < IDLE);
        self.ctx.held.insert(id, (Instant::now(), held));
    }

    /// ⑦ Rewrites a reply; tokens another proxy allocated since this one last
    /// read the store are loaded once, then the reply is expanded again.
    async fn rewrite_reply(
        &mut self,
        reply: Frame,
        plan: &rewrite::ReplyPlan,
    ) -> Result<Frame, ProxyError> {
        let physical = reply.op_msg().map(|m| m.body().as_bytes().len());
        let replied = self.expand_reply(reply, plan).await?;
        if let (rewrite::ReplyPlan::Rewrite(rules), Some(physical), Some(m)) =
            (plan, physical, replied.frame.op_msg())
        {
            if let Some(db) = &rules.expand {
                let logical = m.body().as_bytes().len();
                self.ctx.metrics.documents(db, "read", logical, physical);
            }
        }
        if let Some((id, held)) = replied.held {
            self.hold(id, held);
        }
        Ok(replied.frame)
    }

    async fn expand_reply(
        &mut self,
        reply: Frame,
        plan: &rewrite::ReplyPlan,
    ) -> Result<rewrite::Replied, ProxyError> {
        match rewrite::reply(reply.clone(), plan, &mut self.legs, &self.ctx.rewrite) {
            Err(ProxyError::Dictionary(crate::token::Integrity::UnknownTokens {
                scope, ..
            })) => {
                if let Some(t) = &self.ctx.rewrite.tokens {
                    t.store.refresh(&scope).await?;
                    if !t.store.exists(&scope) && t.store.has_documents(&scope).await? {
                        return Err(crate::token::Integrity::Missing { scope }.into());
                    }
                }
                rewrite::reply(reply, plan, &mut self.legs, &self.ctx.rewrite)
            }
            other => other,
        }
    }

    /// ③ decode: decompress and name the request.
    fn decode(&self, frame: Frame) -> Result<Request, ProxyError> {
        let (frame, compressor) =
            decompress(frame, Side::Downstream, self.ctx.config.max_message_size)?;
        let command = frame.command_name().unwrap_or_default().to_owned();
        Ok(Request {
            frame,
            compressor,
            command,
        })
    }

    /// ⑤ Sends a request upstream, connecting first if this is the session's
    /// first request, and compressing it if the upstream leg negotiated it.
    async fn forward(&mut self, frame: Frame, command: &str) -> Result<(), ProxyError> {
        if self.upstream.is_none() {
            let conn = upstream::connect(
                &self.ctx.upstream,
                self.ctx.config.connect_timeout(),
                self.ctx.config.max_message_size,
            )
            .await?;
            self.upstream = Some(conn);
        }
        let frame = match self.legs.upstream_compressor {
            Some(c) if may_compress(command) => frame
                .compress(c)
                .map_err(|e| ProxyError::Internal(e.to_string()))?,
            _ => frame,
        };
        let conn = self
            .upstream
            .as_mut()
            .ok_or_else(|| ProxyError::Internal("no upstream".into()))?;
        self.ctx
            .metrics
            .bytes(Leg::Upstream, Way::Out, frame.header.length as usize);
        upstream::send(conn, frame).await
    }

    /// ⑥ The next reply. While an exhaust stream runs, the driver sends
    /// nothing: a message from it, its close, or shutdown end the stream.
    async fn next_reply(&mut self, exhaust: bool) -> Result<Option<Frame>, ProxyError> {
        let conn = self
            .upstream
            .as_mut()
            .ok_or_else(|| ProxyError::Internal("no upstream".into()))?;
        let metrics = &self.ctx.metrics;
        let counted = |reply: Result<Frame, ProxyError>| {
            if let Ok(r) = &reply {
                metrics.bytes(Leg::Upstream, Way::In, r.header.length as usize);
            }
            reply.map(Some)
        };
        if !exhaust {
            return counted(upstream::next_reply(conn).await);
        }
        // Both `next` futures are cancellation safe (buffered in their codecs).
        tokio::select! {
            biased;
            _ = self.shutdown.triggered() => Ok(None),
            from_driver = self.downstream.next() => match from_driver {
                None => Ok(None),
                Some(Err(e)) => Err(downstream_error(e)),
                Some(Ok(_)) => Err(ProxyError::Malformed {
                    side: Side::Downstream,
                    source: wire::WireError::Truncated("exhaust stream: the driver sent a request before the last reply"),
                }),
            },
            reply = upstream::next_reply(conn) => counted(reply),
        }
    }

    /// ⑧ Writes a reply back, compressed as the request was.
    async fn write_back(&mut self, reply: Frame, request: &Request) -> Result<(), ProxyError> {
        if let Some(c) = &mut self.capture {
            c.record(Direction::Reply, &reply);
        }
        let reply = match request.compressor {
            Some(c) if may_compress(&request.command) => reply
                .compress(c)
                .map_err(|e| ProxyError::Internal(e.to_string()))?,
            _ => reply,
        };
        self.ctx
            .metrics
            .bytes(Leg::Client, Way::Out, reply.header.length as usize);
        self.downstream
            .send(reply)
            .await
            .map_err(|e| ProxyError::DownstreamLost(e.to_string()))
    }

    /// Answers `request` with the error, in the protocol the driver used.
    async fn reply_error(&mut self, request: &Request, err: &ProxyError) -> Result<(), ProxyError> {
        debug!(session = self.id, command = %request.command, error = %err, "answering with an error");
        self.ctx.metrics.error(err.code().1);
        let id = self.local_id();
        let reply = error_reply(err, &request.frame, id);
        self.write_back(reply, request).await
    }

    /// Answers an OP_MSG `request` with `body`, without the upstream.
    async fn answer(
        &mut self,
        request: &Request,
        body: &bson::RawDocument,
    ) -> Result<(), ProxyError> {
        let id = self.local_id();
        let msg = wire::OpMsg::from_body(wire::MsgFlags::default(), body);
        let reply = Frame::new(id, request.frame.header.request_id, Message::Msg(msg));
        self.write_back(reply, request).await
    }

    fn local_id(&mut self) -> i32 {
        let id = self.next_local_id;
        self.next_local_id = self.next_local_id.wrapping_add(1);
        id
    }
}

/// Records a request's latency when its handling ends, however it ends.
struct RequestTimer {
    ctx: Arc<ProxyContext>,
    command: String,
    started: Instant,
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        self.ctx
            .metrics
            .request(&self.command, self.started.elapsed());
    }
}

/// Unwraps OP_COMPRESSED, returning the compressor used.
fn decompress(
    frame: Frame,
    side: Side,
    max: usize,
) -> Result<(Frame, Option<Compressor>), ProxyError> {
    let Message::Compressed(c) = frame.message() else {
        return Ok((frame, None));
    };
    let malformed = |source| ProxyError::Malformed { side, source };
    let compressor = c.compressor().map_err(malformed)?;
    let inner = c.decompress(&frame.header, max).map_err(malformed)?;
    Ok((inner, Some(compressor)))
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
