//! ④ rewrite request, ⑦ rewrite reply: pure functions over decoded frames.
//!
//! [`request`] looks at a request and either leaves it as it is (`None`: the
//! original bytes are forwarded) or returns the frame to forward instead,
//! together with a [`ReplyPlan`] saying what the replies to it need. [`reply`]
//! applies that plan to each reply. Neither does any I/O.

mod command;
pub mod expand;
mod hello;
pub mod shard_key;
pub mod tokenize;

use bson::RawBsonRef;

use crate::error::ProxyError;
use crate::wire::{Compressor, Frame, Message, OpMsg};
pub use command::Command;
use shard_key::{ReplyNeeds, ShardKeys};

pub use hello::{is_hello, MAX_WIRE_VERSION};

/// What the rewriters need to know about the deployment.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Compressors the proxy offers to drivers, in order of preference.
    pub client_compressors: Vec<Compressor>,
    /// Compressors the proxy offers to the upstream.
    pub upstream_compressors: Vec<Compressor>,
    /// Shard-key rewriting rules.
    pub shard_keys: ShardKeys,
}

/// How the replies to a request are to be rewritten.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplyPlan {
    /// Replies go back unchanged.
    Forward,
    /// A `hello`/`isMaster` reply: present the proxy as a mongos and settle
    /// compression on both legs.
    Hello(hello::HelloPlan),
    /// Restore shard-key values and hide derived fields.
    ShardKey(ReplyNeeds),
}

/// Per-session state that replies settle and later requests use.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LegState {
    /// Whether the connection's handshake hello has been answered.
    pub handshaken: bool,
    /// The compressor the upstream accepted, if any.
    pub upstream_compressor: Option<Compressor>,
}

/// The request after rewriting: `None` means "forward the original bytes".
pub struct Rewritten {
    pub frame: Option<Frame>,
    pub plan: ReplyPlan,
}

/// Rewrites one decompressed request.
pub fn request(
    frame: &Frame,
    settings: &Settings,
    legs: &LegState,
) -> Result<Rewritten, ProxyError> {
    let name = frame.command_name();
    if let Message::Query(q) = frame.message() {
        // Since 5.1 a server answers only the `isMaster` handshake over
        // OP_QUERY; the proxy holds every other OP_QUERY to that rule itself.
        return match name {
            Some(n) if hello::is_hello(n) => hello::request(frame, settings, legs),
            Some(n) => Err(ProxyError::UnsupportedOpQuery(n.to_owned())),
            None => Err(ProxyError::UnsupportedOpQuery(
                q.full_collection_name.clone(),
            )),
        };
    }
    match (name, frame.message()) {
        (Some(n), _) if hello::is_hello(n) => hello::request(frame, settings, legs),
        (Some(_), Message::Msg(m)) if !settings.shard_keys.is_empty() => {
            shard_key_request(m, frame, settings)
        }
        _ => Ok(Rewritten {
            frame: None,
            plan: ReplyPlan::Forward,
        }),
    }
}

fn shard_key_request(
    m: &OpMsg,
    frame: &Frame,
    settings: &Settings,
) -> Result<Rewritten, ProxyError> {
    let keys = &settings.shard_keys;
    let restore_only = ReplyPlan::ShardKey(ReplyNeeds {
        restore: keys.restores(),
        hide: None,
    });
    let body = m.body();
    let (name, collection) = match body.iter().next() {
        Some(Ok((n, RawBsonRef::String(c)))) => (n, Some(c)),
        Some(Ok((n, _))) => (n, None),
        _ => ("", None),
    };
    let db = body.get_str("$db").ok();
    if !keys.concerns(name, collection, db) {
        return Ok(Rewritten {
            frame: None,
            plan: restore_only,
        });
    }
    let mut cmd = Command::from_msg(m)?;
    let needs = keys.request(&mut cmd)?;
    let msg = cmd.into_msg(m)?;
    Ok(Rewritten {
        frame: Some(frame.clone().with_message(Message::Msg(msg))),
        plan: ReplyPlan::ShardKey(needs),
    })
}

/// Rewrites one decompressed reply according to its request's plan.
pub fn reply(frame: Frame, plan: &ReplyPlan, legs: &mut LegState) -> Result<Frame, ProxyError> {
    match plan {
        ReplyPlan::Forward => Ok(frame),
        ReplyPlan::Hello(h) => hello::reply(frame, h, legs),
        ReplyPlan::ShardKey(needs) => {
            let Message::Msg(m) = frame.message() else {
                return Ok(frame);
            };
            let scan = needs.restore && shard_key::may_hold_stored_values(m.body().as_bytes());
            if !scan && needs.hide.is_none() {
                return Ok(frame);
            }
            let mut body = command::to_document(m.body())?;
            if !shard_key::reply(needs, &mut body) {
                return Ok(frame);
            }
            let mut m = m.clone();
            m.set_body(command::to_raw(&body)?);
            Ok(frame.with_message(Message::Msg(m)))
        }
    }
}
