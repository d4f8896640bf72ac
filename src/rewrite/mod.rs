//! ④ rewrite request, ⑦ rewrite reply: pure functions over decoded frames.
//!
//! [`request`] looks at a request and either leaves it as it is (`None`: the
//! original bytes are forwarded) or returns the frame to forward instead,
//! together with a [`ReplyPlan`] saying what the replies to it need. [`reply`]
//! applies that plan to each reply. Neither does any I/O.

mod hello;

use crate::error::ProxyError;
use crate::wire::{Compressor, Frame, Message};

pub use hello::{is_hello, MAX_WIRE_VERSION};

/// What the rewriters need to know about the deployment.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Compressors the proxy offers to drivers, in order of preference.
    pub client_compressors: Vec<Compressor>,
    /// Compressors the proxy offers to the upstream.
    pub upstream_compressors: Vec<Compressor>,
}

/// How the replies to a request are to be rewritten.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplyPlan {
    /// Replies go back unchanged.
    Forward,
    /// A `hello`/`isMaster` reply: present the proxy as a mongos and settle
    /// compression on both legs.
    Hello(hello::HelloPlan),
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
    match name {
        Some(n) if hello::is_hello(n) => hello::request(frame, settings, legs),
        _ => Ok(Rewritten {
            frame: None,
            plan: ReplyPlan::Forward,
        }),
    }
}

/// Rewrites one decompressed reply according to its request's plan.
pub fn reply(frame: Frame, plan: &ReplyPlan, legs: &mut LegState) -> Result<Frame, ProxyError> {
    match plan {
        ReplyPlan::Forward => Ok(frame),
        ReplyPlan::Hello(h) => hello::reply(frame, h, legs),
    }
}
