//! Tokens: the reversible token namespace, the dictionaries that give
//! names their tokens, and the name store that keeps them in the upstream.

pub mod dictionary;
pub mod form;
pub mod layout;
pub mod namespace;
pub mod order;
pub mod policy;
pub mod store;

pub use dictionary::{Dictionary, Epoch, Names, Recorder};
pub use policy::{Migration, Policies, Policy, State as MigrationState};
pub use store::{NameStore, RoundTrips, StoreError};

/// Tokenization as the proxy runs it: which names, and the store that holds them.
#[derive(Clone, Debug)]
pub struct Tokens {
    pub policies: Policies,
    pub store: NameStore,
}

/// Why a dictionary cannot be trusted: the proxy refuses reads and writes
/// of its databases until the operator puts the right one back.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Integrity {
    /// No dictionary, while the database holds documents that may be
    /// tokenized: a new one could give their tokens to other names.
    /// `found`: the database that holds them, `scope` itself or another
    /// database sharing its dictionary.
    #[error("{}", missing(.scope, .found))]
    Missing { scope: String, found: String },
    /// The dictionary this proxy read is gone, and documents remain.
    /// `found`: the database whose documents were written with it, `scope`
    /// itself or another database sharing its dictionary.
    #[error("{}", lost(.scope, .epoch, .found))]
    Lost {
        scope: String,
        epoch: Epoch,
        found: String,
    },
    /// The dictionary lost names this proxy knows (a restore of an older
    /// copy, or entries removed by hand).
    #[error("the dictionary of {scope} went back in time: {what}; was an older copy restored? Import the newest export (`laconic store import`); reads and writes of {scope} are refused until then")]
    Rewound { scope: String, what: String },
    /// The dictionary's documents were changed by hand.
    #[error("the dictionary of {scope} was changed outside Laconic: {what}; restore it from an export (`laconic store import`) and check the data with `laconic store verify {scope}`")]
    Edited { scope: String, what: String },
    /// Written in a format this proxy does not read.
    #[error("the dictionary of {scope} is in format {found}, and this proxy reads format 2: bring its collections back to full names with the first release's `laconic migrate --reverse`, then run `laconic migrate` with this one (see the README's token format)")]
    Format { scope: String, found: i64 },
    /// Documents hold tokens the dictionary does not have.
    #[error("documents of {scope} hold tokens its dictionary does not know ({count} of them): the dictionary may be older than the data, or the data come from another dictionary; see `laconic store verify {scope}`")]
    UnknownTokens { scope: String, count: usize },
    /// A database linked to a shared dictionary that is not the one its
    /// documents were written with.
    #[error("the database {db} was written with dictionary {expected} of {scope}, but {scope} now holds dictionary {found}: restore the databases of the group together")]
    Mismatch {
        db: String,
        scope: String,
        expected: Epoch,
        found: Epoch,
    },
    /// A database that shares a group's dictionary holds documents but no
    /// mark: they were not written through Laconic with that dictionary
    /// (every write through it marks the database first), and read with it
    /// they could bear other names.
    #[error("the database {db} holds documents but no mark of the dictionary it shares with the databases of its group, kept in {scope}: they were not written through Laconic with it (they predate Laconic, were written straight to the server, or were restored without their __laconic_mark collection), and read with it they could bear other names. Reads and writes of {db} are refused: restore the databases of the group together, or, if its documents predate Laconic (or were written with this dictionary by a build that did not mark them), adopt them with `laconic store init {db} --config <the proxies' configuration>`")]
    Unmarked { db: String, scope: String },
    /// Documents were written while a new dictionary settled after a
    /// drop: by a proxy that still used the dropped one, or straight to
    /// the server. Read with the new one, they could bear other names.
    #[error("the database {scope} was dropped and is written again, and documents reached it before its new dictionary settled: written by a proxy that had not yet learned of the drop (with the dropped dictionary) or straight to the server; they cannot be read with the new dictionary. Reads and writes of {scope} are refused: drop it again and write it afresh, or restore it from a backup")]
    Refilled { scope: String },
    /// A change event older than the dictionary its database is read with
    /// now (replayed by a stream started before the database was dropped
    /// and written again): its names were another dictionary's. `since`:
    /// when the dictionary began; `None`: the database has none now.
    #[error("{}", older(.db, .at, .since))]
    Older {
        db: String,
        scope: String,
        at: bson::Timestamp,
        since: Option<bson::Timestamp>,
    },
}

/// [`Integrity::Older`]'s text.
fn older(db: &str, at: &bson::Timestamp, since: &Option<bson::Timestamp>) -> String {
    let time = |t: &bson::Timestamp| format!("Timestamp({}, {})", t.time, t.increment);
    match since {
        Some(since) => format!("a change event of {db} is older than the dictionary {db} is read with now (the event is of {}, the dictionary began at {}): the database was dropped and written again since, its names were written with the dictionary it had then, and read with this one they could bear other names. Start the stream after {} (startAtOperationTime), or resume it from a token after that", time(at), time(since), time(since)),
        None => format!("a change event of {db} holds names of a dictionary that is gone (the event is of {}): the database was dropped since, and has no dictionary to read them with. Start the stream after the drop", time(at)),
    }
}

/// [`Integrity::Missing`]'s text: the database that holds documents, and
/// the dictionary they would be read with.
fn missing(scope: &str, found: &str) -> String {
    let (whose, restore) = if found == scope {
        (
            format!("the database {scope} holds documents but no dictionary"),
            "the database".to_owned(),
        )
    } else {
        (
            format!("the database {found} holds documents but the dictionary it shares with the databases of its group, kept in {scope}, does not exist"),
            scope.to_owned(),
        )
    };
    format!("{whose}: if they were written through Laconic, their dictionary is lost (restore it with `laconic store import`, or restore {restore} with its __laconic collection); if they predate Laconic, adopt them with `laconic store init {scope}` or `laconic migrate`")
}

/// [`Integrity::Lost`]'s text.
fn lost(scope: &str, epoch: &Epoch, found: &str) -> String {
    if found == scope {
        format!("the dictionary of {scope} (identity {epoch}) is gone while the database still holds documents written with it: restore it with `laconic store import`, or restore the database with its __laconic collection; reads and writes of {scope} are refused until then")
    } else {
        format!("the dictionary of {scope} (identity {epoch}), which {found} shares with the databases of its group, is gone while {found} still holds documents written with it: restore it with `laconic store import`, or restore {scope} with its __laconic collection; reads and writes of the group's databases are refused until then")
    }
}

impl Integrity {
    pub fn scope(&self) -> &str {
        match self {
            Integrity::Missing { scope, .. }
            | Integrity::Lost { scope, .. }
            | Integrity::Rewound { scope, .. }
            | Integrity::Edited { scope, .. }
            | Integrity::Format { scope, .. }
            | Integrity::UnknownTokens { scope, .. }
            | Integrity::Mismatch { scope, .. }
            | Integrity::Unmarked { scope, .. }
            | Integrity::Older { scope, .. }
            | Integrity::Refilled { scope } => scope,
        }
    }

    /// A short name for metrics and /readyz.
    pub fn kind(&self) -> &'static str {
        match self {
            Integrity::Missing { .. } => "missing",
            Integrity::Lost { .. } => "lost",
            Integrity::Rewound { .. } => "rewound",
            Integrity::Edited { .. } => "edited",
            Integrity::Format { .. } => "format",
            Integrity::UnknownTokens { .. } => "unknown_tokens",
            Integrity::Mismatch { .. } => "mismatch",
            Integrity::Unmarked { .. } => "unmarked",
            Integrity::Refilled { .. } => "refilled",
            Integrity::Older { .. } => "older",
        }
    }
}
