//! ④ rewrite request, ⑦ rewrite reply: pure functions over decoded frames.
//!
//! [`request`] looks at a request and either leaves it as it is (`None`: the
//! original bytes are forwarded) or returns the frame to forward instead,
//! together with a [`ReplyPlan`] saying what the replies to it need. [`reply`]
//! applies that plan to each reply. Neither does any I/O.

mod command;
pub mod crud;
pub mod expand;
mod hello;
pub mod shard_key;
pub mod tokenize;

use bson::RawBsonRef;

use crate::error::ProxyError;
use crate::token::{ScopeNames, Tokens};
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
    /// Name tokenization, when on.
    pub tokens: Option<Tokens>,
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
    /// The name-store scope whose tokens are expanded.
    pub expand: Option<String>,
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
        (Some(_), Message::Msg(m))
            if !settings.shard_keys.is_empty() || settings.tokens.is_some() =>
        {
            rewrite_command(m, frame, settings)
        }
        _ => Ok(Rewritten {
            frame: None,
            plan: ReplyPlan::Forward,
        }),
    }
}

/// The database a command's names belong to, if it is tokenized.
pub fn tokenized_db<'a>(m: &'a OpMsg, settings: &Settings) -> Option<&'a str> {
    let t = settings.tokens.as_ref()?;
    m.body()
        .get_str("$db")
        .ok()
        .filter(|db| t.policy.applies_to(db))
}

fn rewrite_command(m: &OpMsg, frame: &Frame, settings: &Settings) -> Result<Rewritten, ProxyError> {
    let keys = &settings.shard_keys;
    let body = m.body();
    let (name, collection) = match body.iter().next() {
        Some(Ok((n, RawBsonRef::String(c)))) => (n, Some(c)),
        Some(Ok((n, _))) => (n, None),
        _ => ("", None),
    };
    let db = body.get_str("$db").ok();
    let tokens = settings.tokens.as_ref();
    let scope = tokenized_db(m, settings);
    if name == "bulkWrite" {
        if let Some(t) = tokens {
            refuse_tokenized_bulk_write(m, t)?;
        }
    }
    let concerns = !keys.is_empty() && keys.concerns(name, collection, db);
    let mut rules = ReplyRules {
        shard: ReplyNeeds {
            restore: keys.restores(),
            hide: None,
        },
        expand: scope.map(str::to_owned),
    };
    if !concerns && scope.is_none() {
        let plan = if rules == ReplyRules::default() {
            ReplyPlan::Forward
        } else {
            ReplyPlan::Rewrite(rules)
        };
        return Ok(Rewritten { frame: None, plan });
    }
    let mut cmd = Command::from_msg(m)?;
    if concerns {
        rules.shard = keys.request(&mut cmd)?;
    }
    if let (Some(t), Some(scope)) = (tokens, scope) {
        let names = ScopeNames {
            store: &t.store,
            scope,
        };
        crud::command(&mut cmd, &t.policy, &names)?;
    }
    let msg = cmd.into_msg(m)?;
    Ok(Rewritten {
        frame: Some(frame.clone().with_message(Message::Msg(msg))),
        plan: ReplyPlan::Rewrite(rules),
    })
}

fn refuse_tokenized_bulk_write(m: &OpMsg, t: &Tokens) -> Result<(), ProxyError> {
    let cmd = Command::from_msg(m)?;
    let tokenized = cmd.body.get_array("nsInfo").is_ok_and(|a| {
        a.iter()
            .filter_map(|ns| ns.as_document()?.get_str("ns").ok())
            .any(|ns| {
                ns.split_once('.')
                    .is_some_and(|(db, _)| t.policy.applies_to(db))
            })
    });
    if tokenized {
        return Err(ProxyError::Unsupported(
            "bulkWrite on a tokenized database cannot be rewritten to tokenized names yet".into(),
        ));
    }
    Ok(())
}

/// Rewrites one decompressed reply according to its request's plan.
pub fn reply(
    frame: Frame,
    plan: &ReplyPlan,
    legs: &mut LegState,
    settings: &Settings,
) -> Result<Frame, ProxyError> {
    match plan {
        ReplyPlan::Forward => Ok(frame),
        ReplyPlan::Hello(h) => hello::reply(frame, h, legs),
        ReplyPlan::Rewrite(rules) => {
            let Message::Msg(m) = frame.message() else {
                return Ok(frame);
            };
            // Tokens first, raw bytes to raw bytes, so that shard-key rules
            // see logical names.
            let mut body: Option<bson::RawDocumentBuf> = None;
            if let (Some(scope), Some(t)) = (&rules.expand, &settings.tokens) {
                if expand::needed_raw(m.body()) {
                    let names = ScopeNames {
                        store: &t.store,
                        scope,
                    };
                    let expanded = expand::raw_document(m.body(), &names).map_err(|u| {
                        ProxyError::UnknownTokens {
                            scope: scope.clone(),
                            tokens: u.names.into_iter().chain(u.values).collect(),
                        }
                    })?;
                    body = Some(expanded);
                }
            }
            let current = body.as_deref().unwrap_or(m.body());
            let restore =
                rules.shard.restore && shard_key::may_hold_stored_values(current.as_bytes());
            if restore || rules.shard.hide.is_some() {
                let mut doc = command::to_document(current)?;
                if shard_key::reply(&rules.shard, &mut doc) {
                    body = Some(command::to_raw(&doc)?);
                }
            }
            let Some(body) = body else {
                return Ok(frame);
            };
            // Expansion makes replies larger; a driver closes the connection
            // on a message over maxMessageSizeBytes. Never send one.
            let grown = m.encoded_len() - m.body().as_bytes().len() + body.as_bytes().len();
            if grown > crate::wire::MAX_MESSAGE_SIZE {
                return Err(ProxyError::ReplyTooLarge(grown));
            }
            let mut m = m.clone();
            m.set_body(body);
            Ok(frame.with_message(Message::Msg(m)))
        }
    }
}
