//! `laconic store`: a database's dictionary as an operator handles it.
//!
//! - `export DB` writes the dictionary (head, chain documents, mark) as one
//!   Extended JSON document; `import DB FILE` puts one back, only onto an
//!   empty store or onto an older state of the same dictionary (never over
//!   another one, never going back in time).
//! - `verify DB[.COLL]` checks the dictionary itself, then reads every
//!   document and counts the keys that read as tokens the dictionary does
//!   not know (a dictionary older than the data, data from another
//!   dictionary, or keys stored before Laconic that begin with a control
//!   byte) and unknown value tokens; it fails if it finds any.
//! - `stats DB` and `init DB` (adopt a database whose documents predate
//!   Laconic: it gets a dictionary although it holds documents; a group's
//!   member holding documents and no mark is marked with the group's).
//!
//! `verify` and `stats` read a database that shares a group's dictionary
//! (`[[proxy.tokenize.dictionaries]]`, given with the proxies'
//! configuration) with the group's dictionary, checked against the
//! database's own mark; without the configuration, such a database (a mark,
//! and no dictionary of its own) is refused, not checked against nothing.

use std::time::Instant;

use bson::{doc, Document, RawBsonRef, RawDocument, RawDocumentBuf};
use futures::TryStreamExt;
use mongodb::Client;

use crate::token::dictionary::{Epoch, COLLECTION, HEAD_ID};
use crate::token::form::{self, Form};
use crate::token::namespace::{decode, value_number, Stored, VALUE_SUBTYPE};
use crate::token::store::{database, MARK_COLLECTION};
use crate::token::{NameStore, Names, Policies};

/// What went wrong in a store tool.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error(transparent)]
    Driver(#[from] mongodb::error::Error),
    #[error(transparent)]
    Store(#[from] crate::token::StoreError),
    #[error(transparent)]
    Integrity(#[from] crate::token::Integrity),
    #[error("{0}")]
    Refused(String),
}

/// The export format's name and version.
const KIND: &str = "laconic-dictionary";

/// A database's dictionary as one document.
pub async fn export(client: &Client, db: &str) -> Result<Document, ToolError> {
    let coll = database(client, db).collection::<Document>(COLLECTION);
    let head = coll
        .find_one(doc! {"_id": HEAD_ID})
        .await?
        .ok_or_else(|| ToolError::Refused(format!("{db} has no dictionary to export")))?;
    let epoch = head.get("epoch").cloned().unwrap_or(bson::Bson::Null);
    let chain: Vec<Document> = coll
        .find(doc! {"chain": {"$exists": true}, "epoch": epoch})
        .sort(doc! {"chain": 1, "seq": 1})
        .await?
        .try_collect()
        .await?;
    let mark = database(client, db)
        .collection::<Document>(MARK_COLLECTION)
        .find_one(doc! {"_id": "mark"})
        .await?;
    let mut out = doc! {"kind": KIND, "format": 2, "db": db, "head": head, "chain": chain};
    if let Some(m) = mark {
        out.insert("mark", m);
    }
    Ok(out)
}

/// Puts an exported dictionary back into `db`: onto an empty store, or onto
/// an older state of the same dictionary (every entry the store holds is in
/// the file). Returns the chain documents written.
pub async fn import(client: &Client, db: &str, export: &Document) -> Result<usize, ToolError> {
    if export.get_str("kind") != Ok(KIND) {
        return Err(ToolError::Refused("not a Laconic dictionary export".into()));
    }
    let head = export
        .get_document("head")
        .map_err(|_| ToolError::Refused("the export has no head".into()))?;
    let chain: Vec<Document> = export
        .get_array("chain")
        .map(|a| a.iter().filter_map(|d| d.as_document().cloned()).collect())
        .unwrap_or_default();
    // The export must itself be a sound dictionary.
    let parsed = crate::token::dictionary::parse_head(db, head)?;
    let dict = crate::token::dictionary::build(db, parsed, &chain)?;

    let coll = database(client, db).collection::<Document>(COLLECTION);
    let mark = database(client, db)
        .collection::<Document>(MARK_COLLECTION)
        .find_one(doc! {"_id": "mark"})
        .await?;
    if let Some(recorded) = mark.as_ref().and_then(|m| Epoch::from_bson(m.get("epoch"))) {
        if recorded != dict.epoch {
            return Err(ToolError::Refused(format!(
                "the documents of {db} were written with dictionary {recorded}, and this export is dictionary {}",
                dict.epoch
            )));
        }
    }
    if let Some(current) = coll.find_one(doc! {"_id": HEAD_ID}).await? {
        let current_epoch = Epoch::from_bson(current.get("epoch"));
        if current_epoch != Some(dict.epoch) {
            return Err(ToolError::Refused(format!(
                "{db} holds another dictionary ({}); an export is imported only onto an empty store or an older state of the same dictionary",
                current_epoch.map_or("unreadable".into(), |e| e.to_string())
            )));
        }
        let store = NameStore::new(client.clone(), parsed.cap, Policies::default());
        store.refresh(db).await?;
        if let Ok(now) = store.dictionary(db) {
            now.is_contained_in(&dict).map_err(|why| {
                ToolError::Refused(format!(
                    "the export is older than the dictionary of {db} ({why}): importing it would take the dictionary back in time"
                ))
            })?;
        }
    } else if coll
        .count_documents(doc! {"chain": {"$exists": true}})
        .await?
        > 0
    {
        return Err(ToolError::Refused(format!(
            "{db} holds chain documents without a head: remove them, or restore the database whole"
        )));
    }
    for d in &chain {
        let id = d.get("_id").cloned().unwrap_or(bson::Bson::Null);
        coll.replace_one(doc! {"_id": id}, d.clone())
            .upsert(true)
            .await?;
    }
    coll.replace_one(doc! {"_id": HEAD_ID}, head.clone())
        .upsert(true)
        .await?;
    // The mark beside the data only ever rises: importing an older copy
    // leaves it saying how much was given out, so proxies still refuse.
    database(client, db)
        .collection::<Document>(MARK_COLLECTION)
        .update_one(
            doc! {"_id": "mark", "epoch": dict.epoch.to_bson()},
            doc! {"$max": {"names": dict.len() as i64, "values": dict.value_count() as i64}},
        )
        .upsert(true)
        .await?;
    Ok(chain.len())
}

/// What `verify` found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Verified {
    pub collections: usize,
    pub documents: u64,
    /// Documents holding a key or value token the dictionary lacks.
    pub bad_documents: u64,
    /// Keys that read as tokens the dictionary does not know.
    pub unknown_tokens: u64,
    /// Keys that begin like a token but spell none (stored before Laconic).
    pub malformed_keys: u64,
    pub unknown_values: u64,
    /// The `_id`s of the first bad documents, as Extended JSON.
    pub examples: Vec<String>,
    pub seconds: f64,
}

impl Verified {
    pub fn ok(&self) -> bool {
        self.bad_documents == 0
    }
}

/// Checks `db`'s dictionary (its group's, under `policies`), then every
/// document of `coll` (or of every collection) against it.
pub async fn verify(
    client: &Client,
    policies: &Policies,
    db: &str,
    coll: Option<&str>,
) -> Result<Verified, ToolError> {
    let started = Instant::now();
    let dict = read_dictionary(client, policies, db).await?;
    let database = client.database(db);
    let names: Vec<String> = match coll {
        Some(c) => vec![c.to_owned()],
        None => database
            .list_collection_names()
            .filter(doc! {"type": "collection"})
            .await?
            .into_iter()
            .filter(|n| !n.starts_with(COLLECTION) && !n.starts_with("system."))
            .collect(),
    };
    let mut v = Verified {
        collections: names.len(),
        ..Verified::default()
    };
    for name in names {
        let mut cursor = database
            .collection::<RawDocumentBuf>(&name)
            .find(doc! {})
            .batch_size(1000)
            .await?;
        while let Some(d) = cursor.try_next().await? {
            v.documents += 1;
            let mut found = Found::default();
            scan(&d, &*dict, &mut found, 0);
            if found.any() {
                v.bad_documents += 1;
                v.unknown_tokens += found.unknown;
                v.malformed_keys += found.malformed;
                v.unknown_values += found.values;
                if v.examples.len() < 10 {
                    let id = d
                        .get("_id")
                        .ok()
                        .flatten()
                        .and_then(|id| bson::Bson::try_from(id.to_raw_bson()).ok())
                        .map_or("?".into(), |id| id.into_relaxed_extjson().to_string());
                    v.examples.push(format!("{name}: _id {id}"));
                }
            }
        }
    }
    v.seconds = started.elapsed().as_secs_f64();
    Ok(v)
}

#[derive(Default)]
struct Found {
    unknown: u64,
    malformed: u64,
    values: u64,
}

impl Found {
    fn any(&self) -> bool {
        self.unknown + self.malformed + self.values > 0
    }
}

/// Counts the keys and values of `d` its dictionary cannot read.
fn scan(d: &RawDocument, names: &dyn Names, found: &mut Found, depth: usize) {
    if depth > crate::rewrite::MAX_DEPTH {
        return;
    }
    for (k, v) in d.into_iter().flatten() {
        for part in k.split('.') {
            match decode(part) {
                Stored::Token(t) if names.name(t.as_bytes()).is_none() => found.unknown += 1,
                Stored::Malformed => found.malformed += 1,
                _ => {}
            }
        }
        scan_value(v, names, found, depth);
    }
}

fn scan_value(v: RawBsonRef<'_>, names: &dyn Names, found: &mut Found, depth: usize) {
    match v {
        RawBsonRef::Document(d) => scan(d, names, found, depth + 1),
        RawBsonRef::Array(a) => {
            for x in a.into_iter().flatten() {
                scan_value(x, names, found, depth + 1);
            }
        }
        RawBsonRef::Binary(b)
            if u8::from(b.subtype) == VALUE_SUBTYPE
                && value_number(b.bytes).is_none_or(|n| names.value(n).is_none()) =>
        {
            found.values += 1
        }
        _ => {}
    }
}

/// The dictionary `db`'s documents are read with: its own, or its group's
/// under `policies`, checked against `db`'s mark. A database with a mark
/// but no dictionary, and no group under `policies`, is refused: it shares
/// a dictionary kept elsewhere, which only the configuration names.
async fn read_dictionary(
    client: &Client,
    policies: &Policies,
    db: &str,
) -> Result<std::sync::Arc<crate::token::Dictionary>, ToolError> {
    let store = NameStore::new(client.clone(), 1000, policies.clone());
    store.refresh(db).await?;
    let scope = policies.scope_of(db);
    if scope == db && !store.exists(db) {
        if let Some(epoch) = marked_with(client, db).await? {
            return Err(ToolError::Refused(format!(
                "{db} has no dictionary of its own, and its mark names dictionary {epoch}: it shares the dictionary of a group, kept in another database; give the proxies' configuration (--config), whose [[proxy.tokenize.dictionaries]] name it"
            )));
        }
    }
    Ok(store.dictionary(db)?)
}

/// Refuses `db` where it shares a group's dictionary under `policies`:
/// `export` and `import` work on the group's home, which keeps it.
pub fn own_dictionary(policies: &Policies, db: &str) -> Result<(), ToolError> {
    match policies.scope_of(db) {
        home if home != db => Err(ToolError::Refused(format!(
            "{db} shares the dictionary of its group, kept in {home}: name {home}"
        ))),
        _ => Ok(()),
    }
}

/// A dictionary's vital statistics, as lines of text: `db`'s own, or, for
/// a member of a group under `policies`, its group's after a line of its
/// own mark.
pub async fn stats(client: &Client, policies: &Policies, db: &str) -> Result<String, ToolError> {
    let dict = read_dictionary(client, policies, db).await?;
    let home = policies.scope_of(db);
    let mut out = String::new();
    if home != db {
        out = format!(
            "{db}: shares the dictionary of {home}; its mark: {}\n",
            mark_line(client, db).await?
        );
    }
    let coll = database(client, home).collection::<Document>(COLLECTION);
    let settings = settings_lines(client, policies, db).await?;
    let Some(head) = coll.find_one(doc! {"_id": HEAD_ID}).await? else {
        return Ok(out + &format!("{home}: no dictionary\n") + &settings);
    };
    let token_bytes: usize = dict.entries().iter().map(|(_, t)| t.len()).sum();
    let name_bytes: usize = dict.entries().iter().map(|(n, _)| n.len()).sum();
    let mean = |bytes: usize| {
        if dict.is_empty() {
            0.0
        } else {
            bytes as f64 / dict.len().max(1) as f64
        }
    };
    Ok(out
        + &format!(
            "{home}: dictionary {}, format {}, cap {}, origin {}, created {}\n\
             names   {:>8}  in {} chain documents; mean name {:.1} B, mean token {:.2} B\n\
             values  {:>8}  in {} chain documents\n\
             mark    {}\n",
            dict.epoch,
            head.get_i32("format").unwrap_or(0),
            dict.cap,
            head.get_str("origin").unwrap_or("?"),
            head.get_datetime("created").map_or("?".into(), |d| d
                .try_to_rfc3339_string()
                .unwrap_or_default()),
            dict.len(),
            dict.name_chain.lengths.len(),
            mean(name_bytes),
            mean(token_bytes),
            dict.value_count(),
            dict.value_chain.lengths.len(),
            mark_line(client, home).await?,
        )
        + &settings)
}

/// The settings recorded for each collection of `db` ([`form`]), each
/// against those the tool was given (the proxies', as `--config` says).
async fn settings_lines(
    client: &Client,
    policies: &Policies,
    db: &str,
) -> Result<String, ToolError> {
    let docs: Vec<Document> = database(client, db)
        .collection::<Document>(COLLECTION)
        .find(doc! {"_id": {"$regex": format!("^{}", form::RECORD_PREFIX)}})
        .await?
        .try_collect()
        .await?;
    let mut records: Vec<_> = form::records(&docs).into_iter().collect();
    records.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::new();
    for (coll, recorded) in records {
        let given = Form::of(policies.stored_form(db, &coll));
        let line = match recorded {
            Some(r) if r == given => format!("{r} (as given)"),
            Some(r) => format!("{r} (given: {given}: proxies given these refuse it)"),
            None => "does not read as settings: proxies refuse it".to_owned(),
        };
        out += &format!("settings {db}.{coll}: {line}\n");
    }
    Ok(out)
}

/// The mark kept in `db`, if any.
async fn read_mark(client: &Client, db: &str) -> Result<Option<Document>, ToolError> {
    Ok(database(client, db)
        .collection::<Document>(MARK_COLLECTION)
        .find_one(doc! {"_id": "mark"})
        .await?)
}

/// The dictionary the mark kept in `db` names, if any.
async fn marked_with(client: &Client, db: &str) -> Result<Option<Epoch>, ToolError> {
    Ok(read_mark(client, db)
        .await?
        .and_then(|m| Epoch::from_bson(m.get("epoch"))))
}

/// What the mark kept in `db` says.
async fn mark_line(client: &Client, db: &str) -> Result<String, ToolError> {
    let mark = read_mark(client, db).await?;
    Ok(mark.map_or("none".into(), |m| {
        format!(
            "{} names and {} values given out",
            m.get_i64("names").unwrap_or(0),
            m.get_i64("values").unwrap_or(0)
        )
    }))
}

/// Adopts a database that shares a group's dictionary, holds documents and
/// no mark (the proxies refuse it: [`crate::token::Integrity::Unmarked`]):
/// marks it with the group's dictionary, so that they read it with that
/// one. Refused if the group has no dictionary yet (its home is given one
/// first), if the database is marked already, and, unless `force`, if a
/// document holds keys that read as tokens (written with some dictionary,
/// maybe another one).
pub async fn adopt_member(
    client: &Client,
    policies: &Policies,
    db: &str,
    force: bool,
) -> Result<(), ToolError> {
    let home = policies.scope_of(db);
    if let Some(epoch) = marked_with(client, db).await? {
        return Err(ToolError::Refused(format!(
            "{db} is marked already, with dictionary {epoch}"
        )));
    }
    let store = NameStore::new(client.clone(), 1000, policies.clone());
    store.refresh(home).await?;
    if !store.exists(home) {
        return Err(ToolError::Refused(format!(
            "the dictionary {db} shares with its group, kept in {home}, does not exist: give {home} one first (`laconic store init {home}`)"
        )));
    }
    if !force {
        no_token_keys(client, db, &format!("if they were written through Laconic with the dictionary of {home}, give --force after checking them with `laconic store verify {db} --config …`; if they predate it, rename those keys")).await?;
    }
    store.claim(db).await?;
    Ok(())
}

/// Refuses `db` if a document holds keys that read as tokens (read
/// against no dictionary), with `advice`.
async fn no_token_keys(client: &Client, db: &str, advice: &str) -> Result<(), ToolError> {
    let v = verify(client, &Policies::default(), db, None).await?;
    if v.ok() {
        return Ok(());
    }
    Err(ToolError::Refused(format!(
        "{} documents of {db} hold keys that read as tokens ({}): {advice}",
        v.bad_documents,
        v.examples.join("; ")
    )))
}

/// Gives a database whose documents predate Laconic a dictionary. Refused
/// if a document holds keys that read as tokens (its dictionary may be
/// lost: restore it instead), unless `force`.
pub async fn init(client: &Client, db: &str, cap: usize, force: bool) -> Result<(), ToolError> {
    if database(client, db)
        .collection::<Document>(COLLECTION)
        .find_one(doc! {"_id": HEAD_ID})
        .await?
        .is_some()
    {
        return Err(ToolError::Refused(format!("{db} already has a dictionary")));
    }
    if !force {
        no_token_keys(client, db, "if they were written through Laconic, restore their dictionary instead; if they predate it, rename those keys (or give --force)").await?;
    }
    let store = NameStore::new(client.clone(), cap, Policies::default());
    store.init(db, "adopted").await?;
    Ok(())
}
