//! Errors, tagged with the side at fault, and the one place where they become
//! MongoDB-style replies (`ok: 0`, `errmsg`, `code`, `codeName`).

use bson::{doc, RawDocument, RawDocumentBuf};

use crate::rewrite::walker::Fields;
use crate::token::StoreError;
use crate::wire::{Frame, Message, MsgFlags, OpMsg, OpReply, WireError};

/// Which side of the proxy an error came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Side {
    /// The driver sent something the proxy will not forward.
    Downstream,
    /// The upstream could not be reached or stopped answering.
    Upstream,
    /// A fault in the proxy itself.
    Internal,
}

/// An error that ends a request or a session.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// A frame that could not be decoded; the connection that sent it is closed.
    #[error("malformed message from {side:?}: {source}")]
    Malformed { side: Side, source: WireError },
    /// The driver's connection failed or closed inside a message.
    #[error("the downstream connection failed: {0}")]
    DownstreamLost(String),
    /// The upstream could not be connected to.
    #[error("cannot connect to the upstream at {addr}: {reason}")]
    UpstreamUnavailable { addr: String, reason: String },
    /// The upstream closed the connection or failed while a request was in flight.
    #[error("the upstream connection failed: {0}")]
    UpstreamLost(String),
    /// A legacy OP_QUERY other than the `isMaster` handshake.
    #[error("Unsupported OP_QUERY command: {0}. The client driver may require an upgrade.")]
    UnsupportedOpQuery(String),
    /// The name store could not allocate or read tokens; the command is
    /// not forwarded.
    #[error(transparent)]
    Store(#[from] crate::token::StoreError),
    /// A dictionary that cannot be trusted (lost, rewound, edited, of
    /// another format) or that lacks tokens a reply holds: the command is
    /// refused rather than answered under wrong names.
    #[error(transparent)]
    Dictionary(#[from] crate::token::Integrity),
    /// A collection whose documents are stored with other tokenize
    /// settings than this proxy's, as recorded beside them: rewritten
    /// with this proxy's, its queries would miss documents.
    #[error("{0}")]
    Settings(Box<crate::token::form::Conflict>),
    /// A reply that expansion would make larger than a message may be
    /// (the bytes it would be, or at least be).
    #[error("the reply would be {} bytes with logical names, over the 48,000,000-byte message limit; use a smaller batchSize", match .1 { true => format!("more than {}", .0), false => .0.to_string() })]
    ReplyTooLarge(usize, bool),
    /// A request nested deeper than MongoDB accepts (`maxBSONDepth`): the
    /// server's own error.
    #[error("BSONObj exceeds maximum nested object depth")]
    Overflow,
    /// A client may not do this (write a dictionary's collections).
    #[error("{0}")]
    Unauthorized(String),
    /// A request the proxy cannot forward faithfully.
    #[error("{0}")]
    Unsupported(String),
    /// A `getMore` or `killCursors` of a cursor opened in another logical
    /// session (or, without one, on another connection).
    #[error("{0}")]
    OtherSession(String),
    /// Held batches would pass the proxy's budget for them.
    #[error("{0}")]
    MemoryLimit(String),
    /// Rewriting `what` would parse it into documents holding about
    /// `needs` bytes, more than the `allowed` the rewrite was given
    /// (`proxy.max_work_bytes` for the last try).
    #[error(
        "rewriting {what} parses it into documents, which would hold about {} MiB, more than the {} MiB the proxy may give it (proxy.max_work_bytes, for all heavy work together): send it in smaller parts, or raise max_work_bytes",
        needs.div_ceil(1 << 20),
        allowed >> 20
    )]
    WorkBudget {
        what: String,
        needs: usize,
        allowed: usize,
    },
    /// Documents of a collection being migrated could not be rewritten ahead
    /// of an update: they kept changing, or (`network`) the upstream could
    /// not be reached.
    #[error("{message}")]
    Migration { message: String, network: bool },
    #[error("internal error: {0}")]
    Internal(String),
}

impl From<crate::token::form::Conflict> for ProxyError {
    fn from(c: crate::token::form::Conflict) -> ProxyError {
        ProxyError::Settings(Box::new(c))
    }
}

impl ProxyError {
    pub fn side(&self) -> Side {
        match self {
            ProxyError::Malformed { side, .. } => *side,
            ProxyError::DownstreamLost(_) => Side::Downstream,
            ProxyError::UpstreamUnavailable { .. } | ProxyError::UpstreamLost(_) => Side::Upstream,
            ProxyError::UnsupportedOpQuery(_)
            | ProxyError::Unsupported(_)
            | ProxyError::Unauthorized(_)
            | ProxyError::OtherSession(_)
            | ProxyError::WorkBudget { .. }
            | ProxyError::Overflow => Side::Downstream,
            ProxyError::MemoryLimit(_) => Side::Internal,
            ProxyError::Store(_)
            | ProxyError::Dictionary(_)
            | ProxyError::Settings(_)
            | ProxyError::Migration { .. } => Side::Upstream,
            ProxyError::ReplyTooLarge(..) => Side::Upstream,
            ProxyError::Internal(_) => Side::Internal,
        }
    }

    /// The server error code and name the driver sees. Upstream failures use
    /// codes that drivers treat as retryable network errors.
    pub fn code(&self) -> (i32, &'static str) {
        match self {
            ProxyError::Malformed { .. } => (9, "FailedToParse"),
            ProxyError::DownstreamLost(_) => (6, "HostUnreachable"),
            ProxyError::UpstreamUnavailable { .. } => (6, "HostUnreachable"),
            ProxyError::UpstreamLost(_) => (6, "HostUnreachable"),
            ProxyError::UnsupportedOpQuery(_) => (352, "UnsupportedOpQueryCommand"),
            ProxyError::Unsupported(_) => (115, "CommandNotSupported"),
            ProxyError::Unauthorized(_) => (13, "Unauthorized"),
            ProxyError::OtherSession(_) => (50738, "Location50738"),
            ProxyError::MemoryLimit(_) | ProxyError::WorkBudget { .. } => {
                (146, "ExceededMemoryLimit")
            }
            ProxyError::Overflow => (15, "Overflow"),
            ProxyError::Migration { network: true, .. } => (6, "HostUnreachable"),
            ProxyError::Migration { .. } => (112, "WriteConflict"),
            ProxyError::Store(StoreError::Unreachable(_)) => (6, "HostUnreachable"),
            ProxyError::Store(StoreError::Refused { code, .. }) => (*code, code_name(*code)),
            ProxyError::Store(StoreError::Integrity(_)) | ProxyError::Dictionary(_) => {
                (301, "DataCorruptionDetected")
            }
            ProxyError::Settings(_) => (72, "InvalidOptions"),
            ProxyError::Store(StoreError::Exhausted(_)) => (1, "InternalError"),
            ProxyError::Store(StoreError::TimedOut(_)) => (89, "NetworkTimeout"),
            ProxyError::Store(StoreError::Stale(_)) => (262, "ExceededTimeLimit"),
            ProxyError::ReplyTooLarge(..) => (10334, "BSONObjectTooLarge"),
            ProxyError::Internal(_) => (1, "InternalError"),
        }
    }

    /// Whether the upstream, or the name store in it, could not be reached
    /// or failed mid-request: a network failure, after which a driver may
    /// send its command again.
    pub fn is_network_failure(&self) -> bool {
        match self {
            ProxyError::UpstreamUnavailable { .. } | ProxyError::UpstreamLost(_) => true,
            ProxyError::Store(e) => e.is_network_failure(),
            ProxyError::Migration { network, .. } => *network,
            _ => false,
        }
    }

    /// Whether the session can go on after answering this error.
    pub fn ends_session(&self) -> bool {
        !matches!(
            self,
            ProxyError::UnsupportedOpQuery(_)
                | ProxyError::Unsupported(_)
                | ProxyError::Unauthorized(_)
                | ProxyError::OtherSession(_)
                | ProxyError::MemoryLimit(_)
                | ProxyError::WorkBudget { .. }
                | ProxyError::Overflow
                | ProxyError::Migration { .. }
                | ProxyError::Store(_)
                | ProxyError::Dictionary(_)
                | ProxyError::Settings(_)
                | ProxyError::ReplyTooLarge(..)
        )
    }
}

/// What an error in one exchange comes to: the one policy every session
/// follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// Answer the driver with an error reply.
    pub answer: bool,
    /// Close the driver's connection afterwards.
    pub close: bool,
}

/// The driver is answered when it awaits a reply it has not had, and the
/// connection closes when the error leaves the session unusable or replies
/// of a stream are still due upstream.
///
/// An upstream connection that fails mid-request is the exception: the
/// driver's connection closes without a reply, as it would if it were
/// connected to the upstream itself. Drivers take that as the network
/// failure it is: they send a retryable write or read again on a new
/// connection (a reply on a connection about to close would have them
/// send it again on that one), end a transaction's attempt, and open new
/// connections in place of those they pooled.
///
/// A driver's connection that failed is not answered either: a reply
/// written after part of another (one the driver did not take in time)
/// would follow it into the socket.
pub fn outcome(e: &ProxyError, reply_due: bool, replies_pending: bool) -> Outcome {
    let lost = matches!(
        e,
        ProxyError::UpstreamLost(_) | ProxyError::DownstreamLost(_)
    );
    Outcome {
        answer: reply_due && !lost,
        close: e.ends_session() || replies_pending,
    }
}

/// The name of a server error code the name store may pass on.
fn code_name(code: i32) -> &'static str {
    match code {
        2 => "BadValue",
        11 => "UserNotFound",
        13 => "Unauthorized",
        18 => "AuthenticationFailed",
        50 => "MaxTimeMSExpired",
        64 => "WriteConcernFailed",
        91 => "ShutdownInProgress",
        112 => "WriteConflict",
        189 => "PrimarySteppedDown",
        10107 => "NotWritablePrimary",
        11000 => "DuplicateKey",
        11600 => "InterruptedAtShutdown",
        13436 => "NotPrimaryOrSecondary",
        _ => "UnknownError",
    }
}

/// The label a server or mongos gives a network failure that `request`
/// met, by what the request is. From wire version 9 on, drivers judge
/// whether to send a write again by its labels alone, not by its code:
/// - a retryable write (a `txnNumber` outside a transaction), and a
///   transaction's commit or abort: `RetryableWriteError`;
/// - any other statement of a transaction (`autocommit: false`):
///   `TransientTransactionError`, so the whole transaction may be run again.
///
/// A read needs none: drivers retry reads by the code.
fn network_label(request: &RawDocument) -> Option<&'static str> {
    request.field("txnNumber")?;
    let command = request.first()?.key;
    if command == b"commitTransaction" || command == b"abortTransaction" {
        return Some("RetryableWriteError");
    }
    Some(match request.field("autocommit") {
        Some(_) => "TransientTransactionError",
        None => "RetryableWriteError",
    })
}

/// The error document: `{ok: 0, errmsg, code, codeName}`, and the
/// `errorLabels` a network failure met by `request` carries.
pub fn error_document(err: &ProxyError, request: Option<&RawDocument>) -> RawDocumentBuf {
    let (code, name) = err.code();
    // The store's refusals carry the server's own name for the code (the
    // table above, which metrics label with, knows only some).
    let name = match err {
        ProxyError::Store(StoreError::Refused { code_name, .. }) if !code_name.is_empty() => {
            code_name.as_str()
        }
        _ => name,
    };
    let mut errmsg = err.to_string();
    // The server's own errors keep the server's own words.
    if !matches!(
        err,
        ProxyError::UnsupportedOpQuery(_) | ProxyError::Overflow
    ) {
        errmsg = format!("laconic: {errmsg}");
    }
    let mut d = doc! { "ok": 0.0, "errmsg": errmsg, "code": code, "codeName": name };
    if let Some(label) = request
        .filter(|_| err.is_network_failure())
        .and_then(network_label)
    {
        d.insert("errorLabels", vec![label]);
    }
    // A document of plain strings and numbers always serializes.
    RawDocumentBuf::from_document(&d).unwrap_or_default()
}

/// The reply to `request` that reports `err`, in the request's own protocol:
/// OP_REPLY for an OP_QUERY, OP_MSG otherwise.
pub fn error_reply(err: &ProxyError, request: &Frame, request_id: i32) -> Frame {
    let body = error_document(err, request.op_msg().map(|m| m.body()));
    let message = match request.message() {
        Message::Query(_) => Message::Reply(OpReply::single(&body)),
        _ => Message::Msg(OpMsg::from_body(MsgFlags::default(), &body)),
    };
    Frame::new(request_id, request.header.request_id, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A failed connection on either leg closes the driver's without an
    /// answer; a refusal is answered and keeps it.
    #[test]
    fn lost_connections_are_not_answered() {
        for lost in [
            ProxyError::UpstreamLost("reset".into()),
            ProxyError::DownstreamLost("a reply was not taken in time".into()),
        ] {
            let o = outcome(&lost, true, false);
            assert_eq!((o.answer, o.close), (false, true), "{lost}");
        }
        let o = outcome(&ProxyError::Unsupported("$where".into()), true, false);
        assert_eq!((o.answer, o.close), (true, false));
    }

    fn labels(err: &ProxyError, request: bson::Document) -> Vec<String> {
        let request = RawDocumentBuf::from_document(&request).unwrap();
        let d = error_document(err, Some(&request));
        match d.get_array("errorLabels") {
            Ok(a) => a
                .into_iter()
                .map(|l| l.unwrap().as_str().unwrap().to_owned())
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// A network failure carries the label a server gives it, by what
    /// the request was: drivers send a write again on the label alone.
    #[test]
    fn a_network_failure_is_labelled_as_the_server_would_label_it() {
        // The name store past its lease: the command was not sent, and the
        // session goes on.
        let lost = ProxyError::Store(StoreError::TimedOut("read"));
        let lsid = doc! {"id": 1};
        let retryable = doc! {"insert": "c", "documents": [], "lsid": lsid.clone(), "txnNumber": 4_i64, "$db": "a"};
        assert_eq!(labels(&lost, retryable.clone()), ["RetryableWriteError"]);
        let statement = doc! {"find": "c", "lsid": lsid.clone(), "txnNumber": 4_i64, "autocommit": false, "$db": "a"};
        assert_eq!(labels(&lost, statement), ["TransientTransactionError"]);
        let commit = doc! {"commitTransaction": 1, "lsid": lsid.clone(), "txnNumber": 4_i64, "autocommit": false, "$db": "admin"};
        assert_eq!(labels(&lost, commit), ["RetryableWriteError"]);
        // A read, or a write that is not retryable: drivers judge by the code.
        let read = doc! {"find": "c", "lsid": lsid.clone(), "$db": "a"};
        assert!(labels(&lost, read).is_empty());
        let plain = doc! {"insert": "c", "documents": [], "$db": "a"};
        assert!(labels(&lost, plain).is_empty());

        // A conversion ahead of an update cut off: a network failure too,
        // with a network code.
        let cut = ProxyError::Migration {
            message: "cut".into(),
            network: true,
        };
        assert_eq!(cut.code(), (6, "HostUnreachable"));
        assert_eq!(labels(&cut, retryable.clone()), ["RetryableWriteError"]);
        // An answer is no network failure: no label, whatever the request.
        for err in [
            ProxyError::Migration {
                message: "kept changing".into(),
                network: false,
            },
            ProxyError::Store(StoreError::Refused {
                operation: "findAndModify",
                code: 64,
                code_name: "WriteConcernFailed".into(),
                message: "no majority".into(),
            }),
            ProxyError::Unsupported("$where".into()),
        ] {
            assert!(labels(&err, retryable.clone()).is_empty(), "{err}");
        }
        assert_eq!(
            ProxyError::Migration {
                message: "kept changing".into(),
                network: false
            }
            .code(),
            (112, "WriteConflict")
        );
    }

    /// A refusal of the store's command keeps the server's code and its
    /// name for it, also for a code the proxy's own table does not know.
    #[test]
    fn a_store_refusal_answers_with_the_servers_code_and_name() {
        let err = ProxyError::Store(StoreError::Refused {
            operation: "findAndModify",
            code: 100,
            code_name: "UnsatisfiableWriteConcern".into(),
            message: "Not enough data-bearing nodes".into(),
        });
        let d = error_document(&err, None);
        assert_eq!(d.get_i32("code"), Ok(100));
        assert_eq!(d.get_str("codeName"), Ok("UnsatisfiableWriteConcern"));
        assert!(d
            .get_str("errmsg")
            .unwrap()
            .starts_with("laconic: the name store's findAndModify failed"));
    }
}
