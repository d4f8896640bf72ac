//! One request and its replies: the I/O half of rewriting.
//!
//! A session hands each request to an [`Exchange`]: [`Exchange::begin`]
//! decodes it, [`Exchange::request`] decides what goes upstream (or answers
//! it from the cursor table), and [`Exchange::reply`] turns each reply back
//! into what the driver must see. Between them, the exchange does what the
//! pure rewriters ([`crate::rewrite`]) cannot: it reads and grows
//! dictionaries ([`tokens`]), converts documents ahead of an update while a
//! collection migrates ([`migration`]), keeps cursor state
//! ([`CursorTable`]), does heavy work on threads of its own within a
//! memory budget ([`HeavyWork`]), and feeds metrics and shadow mode. How an
//! error ends an exchange is decided in one place,
//! [`crate::error::outcome`].

mod auth;
mod cursors;
mod heavy;
mod migration;
mod tokens;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Instant;

use tracing::warn;

pub use auth::RequiresAuth;
pub use cursors::{CursorTable, Owner};
pub use heavy::HeavyWork;

use crate::budget::Share;
use crate::context::ProxyContext;
use crate::error::{ProxyError, Side};
use crate::observe::{Metrics, Shadow, Shadowed};
use crate::rewrite::{self, catalogue, LegState, ReplyPlan};
use crate::wire::{may_compress, Compressor, Frame, Message, MsgBody};
use tokens::Gate;

/// What a session keeps between exchanges.
#[derive(Debug, Default)]
pub struct SessionState {
    /// The handshake's outcome on both legs.
    pub legs: LegState,
    /// What the proxy knows of the client's authentication.
    pub auth: auth::Auth,
    /// The downstream connection's number (cursors opened without
    /// authentication or a session belong to it).
    pub connection: u64,
}

impl SessionState {
    pub fn new(connection: u64) -> SessionState {
        SessionState {
            connection,
            ..SessionState::default()
        }
    }
}

/// What to do with a request.
pub enum Step {
    /// The proxy answers it itself, with this body, within this share of
    /// the budget for replies.
    Answer(MsgBody, Option<Share>),
    /// This goes upstream.
    Forward(Frame),
}

/// One request, from its decoding to its last reply.
pub struct Exchange {
    /// The request, decompressed.
    frame: Frame,
    /// The compressor the driver used; replies are compressed the same way.
    compressor: Option<Compressor>,
    /// Its name as the driver sent it: the catalogue's own string where
    /// that is how it is spelled (no allocation for the usual commands).
    command: Cow<'static, str>,
    plan: ReplyPlan,
    /// The logical read, kept for shadow mode's comparison.
    shadowed: Option<Frame>,
    /// Who sends it: the owner of the cursors it opens.
    owner: Owner,
    /// The cursors it names by proxy ids, sent upstream under the
    /// upstream's ids.
    aliases: rewrite::cursor::Aliases,
    /// A reply said the upstream host stopped being the primary.
    moved: bool,
    answered: bool,
    _timer: Option<RequestTimer>,
}

impl Exchange {
    /// ③ Decodes a request: decompressed and named.
    pub async fn begin(
        ctx: &ProxyContext,
        frame: Frame,
        started: Instant,
    ) -> Result<Exchange, ProxyError> {
        let (frame, compressor) = decompress(ctx, frame, Side::Downstream).await?;
        if matches!(frame.message(), Message::Reply(_)) {
            // Replies travel one way: the server closes a connection that
            // sends one, and so does the proxy, before anything goes upstream.
            return Err(ProxyError::Malformed {
                side: Side::Downstream,
                source: crate::wire::WireError::ReplyFromClient,
            });
        }
        let name = frame.command_name().unwrap_or_default();
        let index = catalogue::index(name);
        let command = match index.map(|i| catalogue::CATALOGUE[i].name) {
            Some(listed) if listed == name => Cow::Borrowed(listed),
            _ => Cow::Owned(name.to_owned()),
        };
        let _timer = ctx.metrics.enabled().then(|| RequestTimer {
            metrics: ctx.metrics.clone(),
            command: index,
            started,
        });
        Ok(Exchange {
            frame,
            compressor,
            command,
            plan: ReplyPlan::Forward,
            shadowed: None,
            owner: Owner::default(),
            aliases: Vec::new(),
            moved: false,
            answered: false,
            _timer,
        })
    }

    /// The request as the driver sent it (decompressed).
    pub fn request_frame(&self) -> &Frame {
        &self.frame
    }

    pub fn command(&self) -> &str {
        &self.command
    }

    /// The driver expects no reply (`moreToCome`: an unacknowledged write).
    pub fn expects_reply(&self) -> bool {
        !self.frame.more_to_come()
    }

    /// The driver accepts a stream of replies.
    pub fn exhaust(&self) -> bool {
        self.frame.exhaust_allowed()
    }

    /// ④ What goes upstream, or the proxy's own answer.
    pub async fn request(
        &mut self,
        ctx: &Arc<ProxyContext>,
        state: &mut SessionState,
        leg: &mut crate::upstream::Leg,
    ) -> Result<Step, ProxyError> {
        let mut gate = Gate::Rewrite;
        let mut renamed = None;
        // The tokenized databases the command's names belong to, read once;
        // and those it reads or moves stored documents from and into besides.
        let (dbs, reached) = self.frame.op_msg().map_or_else(Default::default, |m| {
            (
                rewrite::token_databases(m, &ctx.rewrite),
                rewrite::reached(m, &ctx.rewrite),
            )
        });
        // Every one of them must have a sound dictionary (most commands
        // reach no other).
        let mut touched = std::borrow::Cow::Borrowed(dbs.as_slice());
        for db in reached.read.iter().chain(&reached.into) {
            if !touched.contains(db) {
                touched.to_mut().push(db.clone());
            }
        }
        if let Message::Msg(m) = self.frame.message() {
            let request = m.body();
            // Who sends a command that may open or continue a cursor (the
            // hot writes open none).
            let writes = matches!(
                self.command.as_ref(),
                "insert" | "update" | "delete" | "findAndModify"
            );
            if ctx.rewrite.tokens.is_some() && !writes && !auth::is_authentication(&self.command) {
                self.owner = Owner {
                    users: state.auth.users(leg).await?,
                    lsid: Owner::lsid_of(request),
                    connection: state.connection,
                };
                ctx.cursors.check(&self.command, request, &self.owner)?;
                if self.command == "endSessions" {
                    ctx.cursors.sessions_ended(request);
                }
            }
            // A getMore of documents held back from an oversized batch is
            // answered here; the upstream is asked again once they are
            // served, under the upstream's id for the cursor. Like a reply
            // of the upstream's, the answer is written within a share of
            // the budget for replies, taken before its documents leave the
            // held count.
            let aliases = ctx.cursors.aliased(&self.command, request);
            let share = match ctx.cursors.answer_len(&self.command, request) {
                Some(len) if len > crate::wire::UNSHARED_MESSAGE => {
                    Some(ctx.replies.share(len).await)
                }
                _ => None,
            };
            if let Some(body) = ctx.cursors.answer(&self.command, request) {
                ctx.metrics.held_bytes(ctx.cursors.held_bytes());
                return Ok(Step::Answer(body?, share));
            }
            if !aliases.is_empty() {
                // A body the walker cannot read goes as it came, and is
                // refused upstream.
                if let Ok(Some(body)) = rewrite::cursor::rename_ids(request, &aliases) {
                    // A cursor whose batch was cut asks for no more than
                    // fitted, so that its batches are not cut again.
                    let body = match ctx.cursors.most(request) {
                        Some(most) => rewrite::cursor::cap_batch(body.document(), most)
                            .ok()
                            .flatten()
                            .unwrap_or(body),
                        None => body,
                    };
                    let mut upstream = m.clone();
                    upstream.set_body(body.document().to_owned());
                    renamed = Some(self.frame.with_message(Message::Msg(upstream)));
                }
                self.aliases = aliases;
            }
            rewrite::admit(&self.frame, &ctx.rewrite)?;
            if self.command == "dropDatabase" {
                // It names nothing, and a database refused for its
                // dictionary can still be dropped: its documents go too.
                gate = Gate::PassThrough;
            } else if !rewrite::is_hello(&self.command) {
                gate = tokens::admit(ctx, &touched, &state.auth).await?;
            }
        }
        if let Some(renamed) = renamed {
            self.frame = renamed;
        }
        if gate == Gate::Rewrite {
            if let Some(f) = self
                .rewritten(ctx, state, leg, &dbs, (&touched, &reached.into))
                .await?
            {
                return self.forward(ctx, f);
            }
        }
        let out = self.frame.clone();
        self.forward(ctx, out)
    }

    /// The request rewritten, with the names it stores given tokens first
    /// (`None`: it goes as the driver sent it). Rewritten again if a
    /// migration's state changed while it got ready: it is sent only as
    /// the proxy's current view of the store, read within its lease, would
    /// rewrite it. `touched`: every tokenized database it names or moves
    /// documents between; `into`: those it moves documents into.
    async fn rewritten(
        &mut self,
        ctx: &Arc<ProxyContext>,
        state: &mut SessionState,
        leg: &mut crate::upstream::Leg,
        dbs: &[String],
        (touched, into): (&[String], &[String]),
    ) -> Result<Option<Frame>, ProxyError> {
        if ctx.rewrite.tokens.is_none() {
            // No name store: nothing to give tokens, claim, record, convert
            // or keep current; only hello and shard keys are rewritten.
            let rewritten = self.rewrite(ctx, &state.legs, dbs).await?;
            self.plan = rewritten.plan;
            return Ok(rewritten.frame);
        }
        let admitted = Instant::now();
        // The collections it names, read once.
        let named = match (&ctx.rewrite.tokens, self.frame.message()) {
            (Some(_), Message::Msg(m)) => rewrite::named(m),
            _ => rewrite::Named::default(),
        };
        for _ in 0..3 {
            let marks = tokens::marks(ctx);
            tokens::alike(ctx, &named).await?;
            // Rewritten once; again only if it named something the
            // dictionaries lacked (stored names get tokens first).
            let mut rewritten = self.rewrite(ctx, &state.legs, dbs).await?;
            let mut refreshed = false;
            if ctx.rewrite.tokens.is_some() && rewritten.misses.is_empty() {
                ctx.metrics.store_lookup(true);
            }
            while let (false, Message::Msg(m)) = (rewritten.misses.is_empty(), self.frame.message())
            {
                match tokens::settle(
                    ctx,
                    &rewritten.misses,
                    m,
                    &self.command,
                    &mut state.auth,
                    leg,
                    &mut refreshed,
                )
                .await?
                {
                    tokens::Settled::Done => break,
                    tokens::Settled::PassThrough => return Ok(None),
                    tokens::Settled::Again => {
                        rewritten = self.rewrite(ctx, &state.legs, dbs).await?;
                    }
                }
            }
            tokens::claim(ctx, (dbs, &self.command), into).await?;
            tokens::record(ctx, &named).await?;
            migration::convert_ahead(ctx, &self.frame, &self.command).await?;
            if tokens::still_current(ctx, touched, marks, admitted).await? {
                self.plan = rewritten.plan;
                return Ok(rewritten.frame);
            }
        }
        Err(tokens::stale(touched))
    }

    /// The request rewritten (pure: [`rewrite::request`]). One of more
    /// than [`INLINE_WORK`], or whose owned rewrite would hold more than
    /// [`INLINE_HOLD`], is rewritten as heavy work ([`HeavyWork`]): its share is what its raw rewrite holds
    /// ([`RAW_HOLDS`] per byte) and what its owned rewrite may hold. An
    /// owned rewrite found to need more is done again with a larger share
    /// (twice as large at least, so a command is tried a few times at
    /// most), until it would need more than the whole budget: then the
    /// command is refused, with error 146 `ExceededMemoryLimit`.
    async fn rewrite(
        &self,
        ctx: &Arc<ProxyContext>,
        legs: &rewrite::LegState,
        dbs: &[String],
    ) -> Result<rewrite::Rewritten, ProxyError> {
        let size = self.frame.header.length.try_into().unwrap_or(usize::MAX);
        let budget = ctx.config.max_work_bytes;
        let mut may_hold = INLINE_HOLD;
        if size <= INLINE_WORK {
            let kinds = |id| ctx.cursors.kind(id);
            match rewrite::request(&self.frame, &ctx.rewrite, legs, &kinds, dbs, may_hold) {
                Err(e @ ProxyError::WorkBudget { .. }) => {
                    may_hold = larger_hold(e, may_hold, budget)?
                }
                done => return done,
            }
        }
        loop {
            let (frame, work, legs, dbs) = (
                self.frame.clone(),
                Arc::clone(ctx),
                legs.clone(),
                dbs.to_vec(),
            );
            let share = size.saturating_mul(RAW_HOLDS).saturating_add(may_hold);
            let done = ctx
                .heavy
                .run(share, move || {
                    let kinds = |id| work.cursors.kind(id);
                    rewrite::request(&frame, &work.rewrite, &legs, &kinds, &dbs, may_hold)
                })
                .await?;
            match done {
                Err(e @ ProxyError::WorkBudget { .. }) => {
                    may_hold = larger_hold(e, may_hold, budget)?
                }
                done => return done,
            }
        }
    }

    fn forward(&mut self, ctx: &ProxyContext, out: Frame) -> Result<Step, ProxyError> {
        if !self.aliases.is_empty() {
            // Its replies name the cursors by the proxy's ids again.
            let aliases = self.aliases.clone();
            match &mut self.plan {
                ReplyPlan::Rewrite(rules) => rules.aliases = aliases,
                plan => {
                    *plan = ReplyPlan::Rewrite(rewrite::ReplyRules {
                        aliases,
                        ..Default::default()
                    })
                }
            }
        }
        if self.command == "insert" && ctx.rewrite.tokens.is_some() && ctx.metrics.enabled() {
            tokens::count_documents(ctx, &self.frame, &out);
        }
        if let (Some(shadow), Message::Msg(m)) = (&ctx.shadow, self.frame.message()) {
            if self.expects_reply() && shadow.wants(&self.command, m.body()) {
                self.shadowed = Some(self.frame.clone());
            }
        }
        Ok(Step::Forward(out))
    }

    /// ⑦ One reply, as the driver must see it.
    pub async fn reply(
        &mut self,
        ctx: &Arc<ProxyContext>,
        state: &mut SessionState,
        reply: Frame,
    ) -> Result<(Frame, Option<Share>), ProxyError> {
        let reply = decompress(ctx, reply, Side::Upstream).await?.0;
        let physical = reply.op_msg().map(|m| {
            let body = m.body();
            self.moved |= crate::upstream::topology::moved(body);
            body.as_bytes().len()
        });
        let replied = tokens::expand(ctx, reply, &self.plan, &mut state.legs).await?;
        let frame = replied.frame;
        if let Some(m) = frame.op_msg() {
            let body = m.body();
            state.auth.observe(&self.command, body);
            match self.command.as_ref() {
                "dropDatabase" => tokens::dropped(ctx, &self.frame),
                "drop" | "renameCollection" => tokens::removed(ctx, &self.frame, &frame).await,
                _ => {}
            }
            if let (ReplyPlan::Rewrite(rules), Some(physical)) = (&self.plan, physical) {
                if let Some(rewrite::Expansion::One(db)) = &rules.kind.expand {
                    ctx.metrics
                        .documents(db, "read", body.as_bytes().len(), physical);
                }
            }
            if let (Some(logical), Some(shadow)) = (self.shadowed.take(), &ctx.shadow) {
                compare(ctx, shadow, &self.command, logical, frame.clone());
            }
        }
        ctx.cursors.learn(&replied.cursor, &self.owner);
        if let Some((proxy, upstream)) = replied.alias {
            ctx.cursors.alias(proxy, upstream, &self.owner);
        }
        if let (Some(&(proxy, _)), None, "getMore") =
            (self.aliases.first(), &replied.held, self.command.as_ref())
        {
            let len = frame.op_msg().map_or(0, |m| m.body().as_bytes().len());
            match cursor_id(&frame) {
                Some(0) => ctx.cursors.exhausted(proxy),
                _ if len < rewrite::cursor::MAX_REPLY_BODY / 2 => ctx.cursors.widen(proxy),
                _ => {}
            }
        }
        if let Some((id, held)) = replied.held {
            ctx.metrics.batch_cut();
            let held = ctx.cursors.hold(id, held, &self.owner);
            ctx.metrics.held_bytes(ctx.cursors.held_bytes());
            held?;
        }
        Ok((frame, replied.share))
    }

    /// Whether a reply said the upstream host is no longer the primary: the
    /// session ends once the driver has it, so that the driver's retry and
    /// re-authentication open a session on the new primary.
    pub fn upstream_moved(&self) -> bool {
        self.moved
    }

    /// Notes that the driver has had a reply to this request.
    pub fn answered(&mut self) {
        self.answered = true;
    }

    /// What an error in this exchange comes to (see [`crate::error::outcome`]).
    pub fn outcome(&self, e: &ProxyError, replies_pending: bool) -> crate::error::Outcome {
        if !self.expects_reply() {
            // The driver expects no reply to this request: the refusal can
            // only be logged.
            warn!(command = ?self.command, error = %crate::observe::escaped(e), "unacknowledged request refused");
        }
        crate::error::outcome(e, self.expects_reply() && !self.answered, replies_pending)
    }

    /// ⑧ A reply compressed as the request was (never the handshake's).
    pub fn outbound(&self, reply: Frame) -> Result<Frame, ProxyError> {
        match self.compressor {
            Some(c) if may_compress(&self.command) => reply
                .compress(c)
                .map_err(|e| ProxyError::Internal(e.to_string())),
            _ => Ok(reply),
        }
    }
}

/// The cursor id a reply gives.
fn cursor_id(reply: &Frame) -> Option<i64> {
    use rewrite::walker::Fields;
    reply
        .op_msg()?
        .body()
        .doc_field("cursor")?
        .field("id")?
        .i64()
}

/// Compares a sampled read's answer with the shadow deployment's, in the
/// background (the driver's reply is not held back), within a share of
/// the heavy-work budget: what the command and both answers hold parsed
/// into documents (the shadow's answer about as large as the driver's).
/// A read the budget has no room for now is not compared, and counted as
/// skipped: a sample never waits, and never holds memory the budget does
/// not know of. Both are parsed on a heavy-work thread.
fn compare(ctx: &ProxyContext, shadow: &Arc<Shadow>, command: &str, request: Frame, reply: Frame) {
    let (shadow, heavy, metrics) = (shadow.clone(), ctx.heavy.clone(), ctx.metrics.clone());
    let command = command.to_owned();
    tokio::spawn(async move {
        let (Some(q), Some(a)) = (request.op_msg(), reply.op_msg()) else {
            return;
        };
        let needs = rewrite::mapper::holds(q.body().as_bytes())
            .saturating_add(rewrite::mapper::holds(a.body().as_bytes()).saturating_mul(2));
        let Some(share) = heavy.budget().try_share(needs) else {
            metrics.shadow(&command, Shadowed::Skipped);
            return;
        };
        let parsed = heavy
            .run_held(move || {
                let doc = |f: &Frame| f.op_msg().and_then(|m| rewrite::to_document(m.body()).ok());
                doc(&request).zip(doc(&reply))
            })
            .await;
        if let Ok(Some((request, reply))) = parsed {
            shadow.check(request, reply, metrics).await;
        }
        drop(share);
    });
}

/// Records a request's latency when its exchange ends, however it ends.
struct RequestTimer {
    metrics: Arc<Metrics>,
    /// The command's place in the catalogue ([`catalogue::index`]).
    command: Option<usize>,
    started: Instant,
}

impl Drop for RequestTimer {
    fn drop(&mut self) {
        self.metrics.request(self.command, self.started.elapsed());
    }
}

/// Work on a message of more than this is done off the runtime's threads,
/// within the proxy's budget for heavy work (`proxy.max_work_bytes`): its
/// decompression (a small frame declaring 47 MB costs about 140 ms), and
/// its rewrite (a 7 MB `update` of 100,000 pipeline statements cost the
/// owned mapper about a second and 300 MB). Either would stall the other
/// sessions of a worker.
const INLINE_WORK: usize = 1 << 20;

/// What the owned mapper may hold rewriting a request on a runtime thread
/// ([`rewrite::mapper::holds`]): a part of a command that would hold more
/// (about 28,000 elements) is rewritten as heavy work, off the runtime's
/// threads and within the budget.
const INLINE_HOLD: usize = crate::config::MIN_WORK_BYTES;

/// Bytes a raw rewrite of a message holds per byte of the message, at
/// most: the message, its rewrite, and a statement the owned mapper
/// rewrites within it. Measured (release build, peak RSS, one run each):
/// about 3 for 12 to 15 MB `find`, `count`, `distinct`, `update`,
/// `delete` and `insert` commands, 8 for a 7 MB `update` of 100,000
/// pipeline statements.
const RAW_HOLDS: usize = 8;

/// What an owned rewrite refused at `may_hold` ([`ProxyError::WorkBudget`])
/// may hold when tried again: what it needed, twice `may_hold` at least,
/// the whole `budget` at most. One that needs more than the budget, or was
/// refused with the whole of it, is refused for good, as over the budget.
fn larger_hold(refused: ProxyError, may_hold: usize, budget: usize) -> Result<usize, ProxyError> {
    match refused {
        ProxyError::WorkBudget { what, needs, .. } if needs > budget || may_hold >= budget => {
            Err(ProxyError::WorkBudget {
                what,
                needs,
                allowed: budget,
            })
        }
        ProxyError::WorkBudget { needs, .. } => {
            Ok(needs.max(may_hold.saturating_mul(2)).min(budget))
        }
        other => Err(other),
    }
}

/// Unwraps OP_COMPRESSED, returning the compressor used. The size the
/// frame declares is checked against the message limit before any work.
async fn decompress(
    ctx: &ProxyContext,
    frame: Frame,
    side: Side,
) -> Result<(Frame, Option<Compressor>), ProxyError> {
    let Message::Compressed(c) = frame.message() else {
        return Ok((frame, None));
    };
    let max = ctx.config.max_message_size;
    let malformed = |source| ProxyError::Malformed { side, source };
    let compressor = c.compressor().map_err(malformed)?;
    let declared = usize::try_from(c.uncompressed_size).unwrap_or(0);
    if declared <= INLINE_WORK || declared > max {
        // Small, or refused before any work.
        let inner = c.decompress(&frame.header, max).map_err(malformed)?;
        return Ok((inner, Some(compressor)));
    }
    // It holds the frame and what it decompresses to.
    let inner = ctx
        .heavy
        .run(2 * declared, move || match frame.message() {
            Message::Compressed(c) => c.decompress(&frame.header, max),
            _ => unreachable!("checked above"),
        })
        .await?
        .map_err(malformed)?;
    Ok((inner, Some(compressor)))
}
