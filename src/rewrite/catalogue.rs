//! The command catalogue: for every command the proxy knows, where names
//! travel in it (catalogue §3 of the wire reference), what it stores, how its
//! replies are read, and whether it is a read. Every pass walks this one
//! table: tokenizing ([`super::mapper`]), the names a command needs
//! allocated or read first (the misses of that walk), shard-key rewriting
//! ([`super::shard_key`]), the migration's convert-ahead
//! ([`super::names::migration_filters`]), the reading of replies, shadow
//! mode's list of reads, and the refusal of commands it does not list.
//! Adding a command's field paths is one entry here.

/// Where names travel in a command, slot by slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// A query filter (`$expr`, `$jsonSchema` included).
    Filter(&'static str),
    /// Documents to store (an array of them).
    Documents(&'static str),
    /// One document to store.
    Document(&'static str),
    /// A write: the filter of the documents it changes, the change (an
    /// operator document, a replacement or a pipeline), and the
    /// `arrayFilters` whose conditions apply to the elements of the arrays
    /// the change names before each `$[<id>]`; an upsert also stores its
    /// filter's equalities.
    Update {
        filter: &'static str,
        update: &'static str,
        array_filters: &'static str,
    },
    /// A find projection.
    Projection(&'static str),
    /// A sort.
    Sort(&'static str),
    /// A hint: an index name (left alone) or a key pattern.
    Hint(&'static str),
    /// A document whose keys are paths: key patterns, `min`/`max`,
    /// `weights`, `wildcardProjection`, `dropIndexes`' `index`.
    Keys(&'static str),
    /// A string holding one path (`distinct`'s `key`, `timeField`).
    Path(&'static str),
    /// An aggregation pipeline.
    Pipeline(&'static str),
    /// `let` variables: their values are expressions.
    Let(&'static str),
    /// An array of sub-documents, each with these slots.
    Each(&'static str, &'static [Slot]),
    /// A sub-document with these slots.
    Within(&'static str, &'static [Slot]),
    /// A view: its pipeline runs on the collection `on` names.
    View {
        on: &'static str,
        pipeline: &'static str,
    },
    /// `explain`: the command it explains.
    Explain(&'static str),
    /// The 8.0 `bulkWrite`: `ops`, each under its `nsInfo` namespace.
    BulkOps,
}

/// Which names a command stores (they get tokens before it is forwarded).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stores {
    /// None: a name without a token stays as it is.
    Nothing,
    /// Those of the documents and changes it writes.
    Data,
    /// Every name it mentions: indexes, validators, views and time-series
    /// fields name the fields documents will be stored with.
    Everything,
    /// Every name, if its pipeline ends in `$out` or `$merge`.
    Output,
}

/// How the string values of a command's replies are read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replies {
    /// Documents: strings are the user's data.
    Data,
    /// Metadata (index specs, collection options, explain output): strings
    /// that spell paths are paths.
    Paths,
    /// Write results: a validation error names properties in strings.
    Writes,
    /// By the pipeline's first stage (a change stream, a diagnostic stage).
    Pipeline,
    /// As the cursor it continues.
    Cursor,
}

/// One command.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub name: &'static str,
    pub slots: &'static [Slot],
    pub stores: Stores,
    pub replies: Replies,
    /// A read whose answer does not depend on how documents are stored:
    /// shadow mode repeats it.
    pub read: bool,
    /// What a client needs to store names with it (any of these actions).
    pub actions: &'static [&'static str],
    /// Refused on tokenized databases, with the reason.
    pub refused: Option<&'static str>,
}

const fn entry(name: &'static str, slots: &'static [Slot]) -> Entry {
    Entry {
        name,
        slots,
        stores: Stores::Nothing,
        replies: Replies::Data,
        read: false,
        actions: &[],
        refused: None,
    }
}

const fn no_names(name: &'static str) -> Entry {
    entry(name, &[])
}

const WRITE: &[&str] = &["insert", "update"];

use Slot::*;

const UPDATE: &[Slot] = &[
    Update {
        filter: "q",
        update: "u",
        array_filters: "arrayFilters",
    },
    Hint("hint"),
    Sort("sort"),
];
const DELETE: &[Slot] = &[Filter("q"), Hint("hint")];
const INDEX: &[Slot] = &[
    Keys("key"),
    Filter("partialFilterExpression"),
    Keys("wildcardProjection"),
    Keys("weights"),
    Path("language_override"),
];
const COLLECTION: &[Slot] = &[
    Filter("validator"),
    Within("timeseries", &[Path("timeField"), Path("metaField")]),
    Within("index", &[Keys("keyPattern")]),
    View {
        on: "viewOn",
        pipeline: "pipeline",
    },
];

/// Every command the proxy rewrites, or knows to carry no names.
pub static CATALOGUE: &[Entry] = &[
    Entry {
        stores: Stores::Data,
        replies: Replies::Writes,
        actions: &["insert"],
        ..entry("insert", &[Documents("documents")])
    },
    Entry {
        stores: Stores::Data,
        replies: Replies::Writes,
        actions: WRITE,
        ..entry("update", &[Each("updates", UPDATE)])
    },
    Entry {
        replies: Replies::Writes,
        ..entry("delete", &[Each("deletes", DELETE)])
    },
    Entry {
        read: true,
        ..entry(
            "find",
            &[
                Filter("filter"),
                Projection("projection"),
                Sort("sort"),
                Keys("min"),
                Keys("max"),
                Hint("hint"),
            ],
        )
    },
    Entry {
        stores: Stores::Data,
        replies: Replies::Writes,
        actions: WRITE,
        ..entry(
            "findAndModify",
            &[
                Update {
                    filter: "query",
                    update: "update",
                    array_filters: "arrayFilters",
                },
                Sort("sort"),
                Projection("fields"),
                Hint("hint"),
            ],
        )
    },
    Entry {
        read: true,
        ..entry("count", &[Filter("query"), Hint("hint")])
    },
    Entry {
        read: true,
        ..entry("distinct", &[Filter("query"), Hint("hint"), Path("key")])
    },
    Entry {
        stores: Stores::Output,
        replies: Replies::Pipeline,
        read: true,
        actions: WRITE,
        ..entry(
            "aggregate",
            &[Pipeline("pipeline"), Hint("hint"), Let("let")],
        )
    },
    Entry {
        stores: Stores::Everything,
        actions: &["createIndex"],
        ..entry("createIndexes", &[Each("indexes", INDEX)])
    },
    entry("dropIndexes", &[Keys("index")]),
    entry("deleteIndexes", &[Keys("index")]),
    Entry {
        stores: Stores::Everything,
        actions: &["createCollection"],
        ..entry("create", COLLECTION)
    },
    Entry {
        stores: Stores::Everything,
        actions: &["collMod"],
        ..entry("collMod", COLLECTION)
    },
    Entry {
        replies: Replies::Paths,
        ..entry("explain", &[Explain("explain")])
    },
    Entry {
        stores: Stores::Data,
        replies: Replies::Writes,
        actions: WRITE,
        ..entry("bulkWrite", &[BulkOps])
    },
    Entry {
        refused: Some("mapReduce (JavaScript reads field names)"),
        ..no_names("mapReduce")
    },
    Entry {
        replies: Replies::Cursor,
        ..no_names("getMore")
    },
    Entry {
        replies: Replies::Paths,
        ..no_names("listIndexes")
    },
    Entry {
        replies: Replies::Paths,
        ..no_names("listCollections")
    },
    no_names("killCursors"),
    no_names("drop"),
    no_names("dropDatabase"),
    no_names("collStats"),
    no_names("dbStats"),
    no_names("dataSize"),
    no_names("validate"),
    no_names("ping"),
    no_names("hello"),
    no_names("isMaster"),
    no_names("buildInfo"),
    no_names("serverStatus"),
    no_names("connectionStatus"),
    no_names("endSessions"),
    no_names("startSession"),
    no_names("refreshSessions"),
    no_names("commitTransaction"),
    no_names("abortTransaction"),
    no_names("killAllSessions"),
    no_names("killAllSessionsByPattern"),
    no_names("killSessions"),
    no_names("saslStart"),
    no_names("saslContinue"),
    no_names("authenticate"),
    no_names("logout"),
    no_names("getnonce"),
    no_names("getLastError"),
    no_names("listDatabases"),
    no_names("currentOp"),
    no_names("killOp"),
    no_names("hostInfo"),
    no_names("getParameter"),
    no_names("getCmdLineOpts"),
    no_names("getLog"),
    no_names("whatsmyuri"),
    no_names("profile"),
    no_names("compact"),
    no_names("reIndex"),
    no_names("convertToCapped"),
    no_names("cloneCollectionAsCapped"),
    no_names("fsync"),
    no_names("fsyncUnlock"),
    no_names("top"),
    no_names("lockInfo"),
    no_names("dbHash"),
    no_names("createUser"),
    no_names("updateUser"),
    no_names("dropUser"),
    no_names("dropAllUsersFromDatabase"),
    no_names("usersInfo"),
    no_names("createRole"),
    no_names("updateRole"),
    no_names("dropRole"),
    no_names("dropAllRolesFromDatabase"),
    no_names("rolesInfo"),
    no_names("grantRolesToUser"),
    no_names("revokeRolesFromUser"),
    no_names("grantRolesToRole"),
    no_names("revokeRolesFromRole"),
    no_names("grantPrivilegesToRole"),
    no_names("revokePrivilegesFromRole"),
    no_names("listCommands"),
    no_names("features"),
    no_names("filemd5"),
    no_names("getDefaultRWConcern"),
    no_names("setDefaultRWConcern"),
    no_names("replSetGetStatus"),
    no_names("isdbgrid"),
    no_names("listSearchIndexes"),
];

/// The slots of one `bulkWrite` op, by its kind (its first key).
pub fn bulk_op_slots(kind: &str) -> &'static [Slot] {
    match kind {
        "insert" => &[Document("document")],
        "update" => &[
            Update {
                filter: "filter",
                update: "updateMods",
                array_filters: "arrayFilters",
            },
            Hint("hint"),
            Sort("sort"),
        ],
        "delete" => &[Filter("filter"), Hint("hint")],
        _ => &[],
    }
}

/// The entry of a command, by the name a driver sends (the lower-case
/// spellings drivers still use included).
pub fn lookup(name: &str) -> Option<&'static Entry> {
    index(name).map(|i| &CATALOGUE[i])
}

/// Where [`lookup`]'s entry is in [`CATALOGUE`]: what a request keeps to
/// find it again without another search.
pub fn index(name: &str) -> Option<usize> {
    let name = match name {
        "findandmodify" => "findAndModify",
        "mapreduce" => "mapReduce",
        "ismaster" => "isMaster",
        "buildinfo" => "buildInfo",
        "getlasterror" => "getLastError",
        other => other,
    };
    CATALOGUE.iter().position(|e| e.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_command_is_listed_once() {
        let mut names: Vec<&str> = CATALOGUE.iter().map(|e| e.name).collect();
        names.sort_unstable();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
        assert!(lookup("findandmodify").is_some_and(|e| e.name == "findAndModify"));
        assert!(lookup("noSuchCommand").is_none());
        for (i, e) in CATALOGUE.iter().enumerate() {
            assert_eq!(index(e.name), Some(i), "{}", e.name);
        }
    }

    #[test]
    fn commands_that_store_names_say_what_a_client_needs() {
        for e in CATALOGUE {
            assert_eq!(
                e.stores != Stores::Nothing,
                !e.actions.is_empty(),
                "{}",
                e.name
            );
        }
    }
}
