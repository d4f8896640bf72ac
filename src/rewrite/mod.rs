//! ④ rewrite request, ⑦ rewrite reply: pure functions over decoded frames.
//!
//! [`request`] looks at a request and either leaves it as it is (`None`: the
//! original bytes are forwarded) or returns the frame to forward instead,
//! together with a [`ReplyPlan`] saying what the replies to it need. [`reply`]
//! applies that plan to each reply. Neither does any I/O.

pub(crate) mod batch;
pub mod catalogue;
mod command;
pub mod cursor;
pub mod expand;
pub(crate) mod guard;
mod hello;
pub mod mapper;
pub mod names;
mod reply;
mod request;
pub mod shard_key;
pub mod walker;

use crate::token::Tokens;
use crate::wire::{Compressor, Frame};
pub use command::{to_document, Command};
use names::Misses;
use shard_key::{ReplyNeeds, ShardKeys};

pub use guard::{named, Named, Reached};
pub use hello::{is_hello, MAX_WIRE_VERSION};
pub use reply::{by_rules as reply_by_rules, event_databases, reply, Replied, Room};
pub use request::{
    admit, inserted_bytes, reached, request, token_databases, whole_affordable, written_namespaces,
};

pub use walker::MAX_DEPTH;

/// What the rewriters need to know about the deployment.
#[derive(Clone, Debug, Default)]
pub struct Settings {
    /// Compressors the proxy offers to drivers, in order of preference.
    pub client_compressors: Vec<Compressor>,
    /// Compressors the proxy offers to the upstream.
    pub upstream_compressors: Vec<Compressor>,
    /// Shard-key rewriting rules.
    pub shard_keys: ShardKeys,
    /// Name tokenization, when on.
    pub tokens: Option<Tokens>,
}

/// How the batches of a cursor the proxy saw opened are read (plain
/// documents of the `getMore`'s database when it does not know the cursor).
pub type CursorKinds<'a> = &'a dyn Fn(i64) -> Option<CursorKind>;

/// Which dictionaries a reply's tokens are expanded with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expansion {
    /// The one of the command's database.
    One(String),
    /// A `bulkWrite`'s results: each with the dictionary of its op's
    /// database (by op index; `None` for an untokenized one).
    PerOp(std::sync::Arc<[Option<String>]>),
    /// A cluster-wide change stream: each event with its database's.
    PerEvent,
}

/// How the replies of a command, or the batches of a cursor, are read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CursorKind {
    /// Which string values are paths.
    pub strings: expand::Strings,
    /// With which dictionaries (none: the reply holds no tokens).
    pub expand: Option<Expansion>,
}

/// What a reply said of its cursor, for the cursor table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CursorFact {
    /// A cursor that stays open, and how its batches are read.
    pub open: Option<(i64, CursorKind)>,
    /// A cursor the reply closed.
    pub closed: Option<i64>,
}

/// How the replies to a request are to be rewritten.
#[derive(Clone, Debug, PartialEq)]
pub enum ReplyPlan {
    /// Replies go back unchanged.
    Forward,
    /// A `hello`/`isMaster` reply: present the proxy as a mongos and settle
    /// compression on both legs.
    Hello(hello::HelloPlan),
    /// Restore shard-key values, hide derived fields, expand tokens.
    Rewrite(ReplyRules),
}

/// What the replies of a rewritten command need.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplyRules {
    pub shard: ReplyNeeds,
    /// How tokens are expanded.
    pub kind: CursorKind,
    /// The cursor a `getMore` continues, forgotten once it is exhausted.
    pub get_more: Option<i64>,
    /// That cursor was not seen opened (it was opened through another
    /// proxy, or before this one restarted): what its batches hold is read
    /// from the reply ([`cursor::kind_of_unknown`]), `kind` being what a
    /// cursor of documents would hold.
    pub unknown_cursor: bool,
    /// Cursors the driver knows by proxy ids, which the request named by
    /// their upstream ids ([`cursor::rename_ids`]): the replies name them
    /// by the proxy's ids again.
    pub aliases: cursor::Aliases,
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
    /// What the rewrite asked of the dictionaries and did not find.
    pub misses: Misses,
}

impl Rewritten {
    fn unchanged(plan: ReplyPlan) -> Rewritten {
        Rewritten {
            frame: None,
            plan,
            misses: Misses::default(),
        }
    }
}
