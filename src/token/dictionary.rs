//! One dictionary as a proxy holds it: names ↔ tokens and values ↔ value
//! numbers, with the identity of the dictionary they came from. Pure: it is
//! built from the store's documents (checked on the way in) and read by the
//! rewriters through [`Names`]. A dictionary never changes once built;
//! allocation builds a new one, so a command rewrites against one snapshot.

use std::collections::HashSet;
use std::sync::Arc;

use bson::{doc, spec::BinarySubtype, Binary, Bson, Document, Timestamp};
use md5::{Digest, Md5};
use rustc_hash::FxHashMap;

use super::namespace::Token;
use super::order::{self, TooLong};
use super::Integrity;

/// The format this proxy reads and writes.
pub const FORMAT: i32 = 2;

/// A dictionary's identity: 16 random bytes made with its first document.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Epoch(pub [u8; 16]);

impl Epoch {
    pub fn random() -> Epoch {
        Epoch(crate::random::bytes())
    }

    pub fn to_bson(self) -> Bson {
        Bson::Binary(Binary {
            subtype: BinarySubtype::Uuid,
            bytes: self.0.to_vec(),
        })
    }

    pub fn from_bson(v: Option<&Bson>) -> Option<Epoch> {
        match v {
            Some(Bson::Binary(b)) if b.bytes.len() == 16 => {
                let mut e = [0u8; 16];
                e.copy_from_slice(&b.bytes);
                Some(Epoch(e))
            }
            _ => None,
        }
    }
}

impl std::fmt::Debug for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

impl std::fmt::Display for Epoch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in &self.0[..6] {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

/// Token lookups for one dictionary, from memory only: what the pure
/// rewriters use.
pub trait Names {
    fn token(&self, name: &str) -> Option<&Token>;
    /// The token of a name given as bytes, with the name as a string: a
    /// dictionary gives its own copy, so the raw rewriters check the UTF-8
    /// only of keys it does not hold.
    fn token_of<'a>(&'a self, name: &'a [u8]) -> Option<(&'a str, &'a Token)> {
        let name = std::str::from_utf8(name).ok()?;
        self.token(name).map(|t| (name, t))
    }
    fn name(&self, token: &[u8]) -> Option<&str>;
    /// The number of a tokenized value (a separate dictionary).
    fn value_token(&self, value: &str) -> Option<u32>;
    fn value(&self, token: u32) -> Option<&str>;
    /// Every known value, for matching a regular expression against them.
    fn values(&self) -> Vec<(u32, Arc<str>)>;
}

/// Where one chain stands: its documents' lengths, the last one open.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    /// Entries per document, in `seq` order.
    pub lengths: Vec<usize>,
}

impl Chain {
    /// The newest document: `(seq, entries)`.
    pub fn open(&self) -> (i64, usize) {
        match self.lengths.last() {
            Some(&n) => (self.lengths.len() as i64 - 1, n),
            None => (0, 0),
        }
    }
}

/// The slots of [`short_slot`]: 31 first bytes, each alone or followed by
/// one of the 94 bytes `0x21..=0x7E`.
const SHORT_SLOTS: usize = 31 * 95;

/// Where a key of one or two bytes that may be a token sits in the table
/// of short tokens; `None` for any other key (looked up by hash).
#[inline]
fn short_slot(key: &[u8]) -> Option<usize> {
    let first = match *key.first()? {
        b @ 0x01..=0x1E => usize::from(b - 1),
        0x7F => 30,
        _ => return None,
    };
    match key {
        [_] => Some(first * 95),
        [_, b @ 0x21..=0x7E] => Some(first * 95 + usize::from(b - 0x20)),
        _ => None,
    }
}

/// A name as the key of a map that is looked up by bytes: it hashes and
/// compares as its bytes do.
#[derive(Clone, Debug, PartialEq, Eq)]
struct NameKey(Arc<str>);

impl std::hash::Hash for NameKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.as_bytes().hash(state)
    }
}

impl std::borrow::Borrow<[u8]> for NameKey {
    fn borrow(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

/// A dictionary: its identity, its names and its values.
#[derive(Clone, Debug)]
pub struct Dictionary {
    pub epoch: Epoch,
    /// Names per chain document, as the store says.
    pub cap: usize,
    /// name → token, looked up by the name's bytes
    tokens: FxHashMap<NameKey, Token>,
    /// token → name
    names: FxHashMap<Token, Arc<str>>,
    /// token → name for the tokens of one or two bytes (the 751 most
    /// frequent names), by position: expansion's common case, unhashed.
    short: Vec<Option<Arc<str>>>,
    /// Names in byte order, with their tokens (the same order).
    sorted: Vec<(Arc<str>, Token)>,
    /// value number → value
    values: Vec<Arc<str>>,
    value_numbers: FxHashMap<Arc<str>, u32>,
    pub name_chain: Chain,
    pub value_chain: Chain,
    /// Held back until it settles: its database had another dictionary
    /// before ([`SETTLING`]).
    pub settling: bool,
    /// The upstream's cluster time when it began ([`SINCE`]).
    pub since: Option<Timestamp>,
}

impl Dictionary {
    /// An empty dictionary of a new identity.
    pub fn empty(epoch: Epoch, cap: usize) -> Dictionary {
        Dictionary {
            epoch,
            cap: cap.max(1),
            tokens: FxHashMap::default(),
            names: FxHashMap::default(),
            short: Vec::new(),
            sorted: Vec::new(),
            values: Vec::new(),
            value_numbers: FxHashMap::default(),
            name_chain: Chain::default(),
            value_chain: Chain::default(),
            settling: false,
            since: None,
        }
    }

    /// Whether something written at cluster time `at` (a change event)
    /// is older than this dictionary: its database's names were then
    /// another dictionary's, or none. Unknown for a dictionary made
    /// before heads recorded when they began.
    pub fn began_after(&self, at: Timestamp) -> bool {
        self.since
            .is_some_and(|since| (at.time, at.increment) <= (since.time, since.increment))
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty() && self.values.is_empty()
    }

    pub fn value_count(&self) -> usize {
        self.values.len()
    }

    /// Names and tokens in name order.
    pub fn entries(&self) -> &[(Arc<str>, Token)] {
        &self.sorted
    }

    /// The tokens of the names just below and just above `name`.
    pub fn neighbours(&self, name: &str) -> (Option<Token>, Option<Token>) {
        let i = self.sorted.partition_point(|(n, _)| &**n < name);
        let below = i.checked_sub(1).map(|j| self.sorted[j].1);
        let above = self.sorted.get(i).map(|(_, t)| *t);
        (below, above)
    }

    /// The names just below and just above `name` (for the store's guard).
    pub fn neighbour_names(&self, name: &str) -> (Option<&str>, Option<&str>) {
        let i = self.sorted.partition_point(|(n, _)| &**n < name);
        let below = i.checked_sub(1).map(|j| &*self.sorted[j].0);
        let above = self.sorted.get(i).map(|(n, _)| &**n);
        (below, above)
    }

    /// Tokens for new names (`batch`, in byte order, none known yet), each
    /// between its neighbours' ([`super::order`]).
    pub fn plan(&self, batch: &[&str]) -> Result<Vec<Token>, TooLong> {
        let mut tokens = Vec::with_capacity(batch.len());
        let mut i = 0;
        while i < batch.len() {
            let gap = self.neighbours(batch[i]);
            let mut j = i + 1;
            while j < batch.len() && self.neighbours(batch[j]) == gap {
                j += 1;
            }
            tokens.extend(order::fill(
                j - i,
                gap.0.as_ref(),
                gap.1.as_ref(),
                self.len(),
            )?);
            i = j;
        }
        Ok(tokens)
    }

    /// Gives new names their tokens in memory, as the store would (for the
    /// analyser, benchmarks and tests).
    pub fn add_names(&mut self, names: &[String]) {
        let mut batch: Vec<&str> = names
            .iter()
            .map(String::as_str)
            .filter(|n| self.token(n).is_none())
            .collect();
        batch.sort_unstable();
        batch.dedup();
        if let Ok(tokens) = self.plan(&batch) {
            let entries: Vec<(String, Token)> =
                batch.iter().map(|n| (*n).to_owned()).zip(tokens).collect();
            let _ = self.insert_names(&entries, "");
        }
    }

    /// Gives new values the next numbers, in memory.
    pub fn add_values(&mut self, values: &[String]) {
        let mut fresh: Vec<String> = Vec::new();
        for v in values {
            if self.value_token(v).is_none() && !fresh.contains(v) {
                fresh.push(v.clone());
            }
        }
        let _ = self.push_values(&fresh, "");
    }

    /// Adds names with their tokens; fails if that breaks the order or
    /// gives a name or a token twice.
    pub fn insert_names(
        &mut self,
        entries: &[(String, Token)],
        scope: &str,
    ) -> Result<(), Integrity> {
        for (name, token) in entries {
            match (self.tokens.get(name.as_bytes()), self.names.get(token)) {
                (Some(t), _) if t == token => continue,
                (None, None) => {}
                _ => {
                    return Err(Integrity::Edited {
                        scope: scope.to_owned(),
                        what: format!("the name {name:?} or its token is given twice"),
                    })
                }
            }
            let name: Arc<str> = Arc::from(name.as_str());
            let i = self.sorted.partition_point(|(n, _)| *n < name);
            let fits = i.checked_sub(1).is_none_or(|j| self.sorted[j].1 < *token)
                && self.sorted.get(i).is_none_or(|(_, t)| *token < *t);
            if !fits {
                return Err(Integrity::Edited {
                    scope: scope.to_owned(),
                    what: format!("the token of {name:?} is out of name order"),
                });
            }
            self.sorted.insert(i, (name.clone(), *token));
            self.tokens.insert(NameKey(name.clone()), *token);
            if let Some(at) = short_slot(token.as_bytes()) {
                if self.short.is_empty() {
                    self.short = vec![None; SHORT_SLOTS];
                }
                self.short[at] = Some(name.clone());
            }
            self.names.insert(*token, name);
        }
        Ok(())
    }

    /// Adds values in number order, starting at the next number.
    pub fn push_values(&mut self, values: &[String], scope: &str) -> Result<(), Integrity> {
        for v in values {
            if self.value_numbers.contains_key(v.as_str()) {
                return Err(Integrity::Edited {
                    scope: scope.to_owned(),
                    what: format!("the value {v:?} is given twice"),
                });
            }
            let v: Arc<str> = Arc::from(v.as_str());
            self.value_numbers
                .insert(v.clone(), self.values.len() as u32);
            self.values.push(v);
        }
        Ok(())
    }

    /// Whether `other` holds every name and value of `self`, alike: a
    /// dictionary read again may only have grown.
    pub fn is_contained_in(&self, other: &Dictionary) -> Result<(), String> {
        if self.epoch != other.epoch {
            return Err(format!(
                "its identity changed from {} to {}",
                self.epoch, other.epoch
            ));
        }
        let missing = self
            .sorted
            .iter()
            .filter(|(n, t)| other.tokens.get(n.as_bytes()) != Some(t))
            .count();
        if missing > 0 {
            return Err(format!(
                "{missing} of the {} names this proxy read before are gone or changed",
                self.sorted.len()
            ));
        }
        if other.values.len() < self.values.len()
            || self.values.iter().zip(&other.values).any(|(a, b)| a != b)
        {
            return Err("values this proxy read before are gone or changed".into());
        }
        Ok(())
    }
}

impl Default for Dictionary {
    /// An empty dictionary with the default cap, for tools and tests.
    fn default() -> Dictionary {
        Dictionary::empty(Epoch([0; 16]), 1000)
    }
}

impl Names for Dictionary {
    fn token(&self, name: &str) -> Option<&Token> {
        self.tokens.get(name.as_bytes())
    }
    #[inline]
    fn token_of<'a>(&'a self, name: &'a [u8]) -> Option<(&'a str, &'a Token)> {
        self.tokens.get_key_value(name).map(|(k, t)| (&*k.0, t))
    }
    #[inline(always)]
    fn name(&self, token: &[u8]) -> Option<&str> {
        match short_slot(token) {
            Some(at) => self.short.get(at)?.as_deref(),
            None => self.names.get(token).map(|n| &**n),
        }
    }
    fn value_token(&self, value: &str) -> Option<u32> {
        self.value_numbers.get(value).copied()
    }
    fn value(&self, token: u32) -> Option<&str> {
        self.values.get(token as usize).map(|v| &**v)
    }
    fn values(&self) -> Vec<(u32, Arc<str>)> {
        self.values
            .iter()
            .enumerate()
            .map(|(i, v)| (i as u32, v.clone()))
            .collect()
    }
}

/// A dictionary that knows nothing and writes down every name and value a
/// rewrite asks it for: a dry run of a command through it lists exactly the
/// names the command would store under the policy, whatever the command.
#[derive(Default)]
pub struct Recorder {
    pub names: std::cell::RefCell<Vec<String>>,
    pub values: std::cell::RefCell<Vec<String>>,
}

impl Names for Recorder {
    fn token(&self, name: &str) -> Option<&Token> {
        let mut names = self.names.borrow_mut();
        if !names.iter().any(|n| n == name) {
            names.push(name.to_owned());
        }
        None
    }
    fn name(&self, _: &[u8]) -> Option<&str> {
        None
    }
    fn value_token(&self, value: &str) -> Option<u32> {
        let mut values = self.values.borrow_mut();
        if !values.iter().any(|v| v == value) {
            values.push(value.to_owned());
        }
        None
    }
    fn value(&self, _: u32) -> Option<&str> {
        None
    }
    fn values(&self) -> Vec<(u32, Arc<str>)> {
        Vec::new()
    }
}

// === The stored form ===
//
// In `<db>.__laconic`:
//
//   {_id: "dictionary", epoch, format: 2, cap, created, origin, since?, settling?}
//   {_id: "<epoch>:names/<seq>", chain: "names", epoch, seq, n, names: [...], tokens: [...], checks: [...]}
//   {_id: "<epoch>:values/<seq>", chain: "values", epoch, seq, base, n, values: [...], checks: [...]}
//   {_id: "migration/<collection>", direction, done, last_id, ...}
//   {_id: "settings/<collection>", min_len, custom_paths, value_paths, recorded}
//     (how the collection's documents are stored: `super::form`)
//
// In `<store_db>.dictionaries`, one record per database that has had a
// dictionary (a drop of the database leaves it):
//
//   {_id: "<db>", made, epoch?, since?}: how many dictionaries proxies made
//   for it, and the one it has now and since when (`NameStore::date`).
//
// Every entry carries a check: the first four bytes of the MD5 of the
// dictionary's epoch, the chain, the entry and its token. A hand edit that
// does not recompute it is found by every proxy that reads the entry.

/// The collection, in each tokenized database, that holds its dictionary
/// and the markers of its migrations.
pub const COLLECTION: &str = "__laconic";
/// The `_id` of a dictionary's head document.
pub const HEAD_ID: &str = "dictionary";

/// The check of one entry.
pub fn check(epoch: Epoch, chain: &str, entry: &str, token: &str) -> i32 {
    let mut h = Md5::new();
    h.update(epoch.0);
    h.update(chain.as_bytes());
    h.update([0]);
    h.update(entry.as_bytes());
    h.update([0]);
    h.update(token.as_bytes());
    let d = h.finalize();
    i32::from_le_bytes([d[0], d[1], d[2], d[3]])
}

/// The `_id` of chain document `seq` of the dictionary `epoch`. The
/// identity is part of the `_id`, so that a proxy still holding a replaced
/// dictionary can never write into the new one's documents.
pub fn chain_id(epoch: Epoch, chain: &str, seq: i64) -> String {
    format!("{epoch}:{chain}/{seq}")
}

/// A head document for a new dictionary.
///
/// `settling`: the database had a dictionary before this one (it was
/// dropped, and is being written again): no proxy uses the new one until
/// it has settled ([`SETTLING`]). `since`: the upstream's cluster time
/// just before it was made ([`SINCE`]).
pub fn head_document(
    epoch: Epoch,
    cap: usize,
    origin: &str,
    settling: bool,
    since: Option<Timestamp>,
) -> Document {
    let mut d = doc! {
        "epoch": epoch.to_bson(),
        "format": FORMAT,
        "cap": cap as i64,
        "created": bson::DateTime::now(),
        "origin": origin,
    };
    if settling {
        d.insert(SETTLING, true);
    }
    if let Some(since) = since {
        d.insert(SINCE, since);
    }
    d
}

/// The head's field that holds the upstream's cluster time when the
/// dictionary began: read just before the head was written, and again
/// when a dictionary made after a drop settled. Nothing written at or
/// before it holds the dictionary's tokens, so a change event of that
/// time (replayed by a stream started earlier) is never read with it.
/// Absent where the upstream keeps no cluster time (a standalone server,
/// which has no change streams either).
pub const SINCE: &str = "since";

/// The head's field that holds a new dictionary back until no proxy can
/// still hold the one its database had before: `true` while it settles,
/// [`SPOILED`] if documents were written meanwhile; absent once settled.
pub const SETTLING: &str = "settling";

/// [`SETTLING`] once documents were found written while the dictionary
/// settled: by a proxy that still used the dropped dictionary, or
/// straight to the server.
pub const SPOILED: &str = "spoiled";

/// An empty chain document (the fields an upsert sets on insert).
pub fn empty_chain_document(epoch: Epoch, chain: &str, seq: i64, base: i64) -> Document {
    let mut d =
        doc! {"chain": chain, "epoch": epoch.to_bson(), "seq": seq, "n": 0i64, "checks": []};
    if chain == "names" {
        d.insert("names", Bson::Array(Vec::new()));
        d.insert("tokens", Bson::Array(Vec::new()));
    } else {
        d.insert("base", base);
        d.insert("values", Bson::Array(Vec::new()));
    }
    d
}

/// The head of a dictionary: its identity and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub epoch: Epoch,
    pub cap: usize,
    /// Held back until it settles ([`SETTLING`]).
    pub settling: bool,
    /// When it began ([`SINCE`]).
    pub since: Option<Timestamp>,
}

/// Reads a head document.
pub fn parse_head(scope: &str, d: &Document) -> Result<Head, Integrity> {
    let format = match d.get("format") {
        Some(Bson::Int32(f)) => i64::from(*f),
        Some(Bson::Int64(f)) => *f,
        _ => 0,
    };
    if format != i64::from(FORMAT) {
        return Err(Integrity::Format {
            scope: scope.to_owned(),
            found: format,
        });
    }
    let epoch = Epoch::from_bson(d.get("epoch")).ok_or_else(|| Integrity::Edited {
        scope: scope.to_owned(),
        what: "its head has no identity".into(),
    })?;
    let cap = int(d.get("cap"))
        .filter(|&c| c > 0)
        .ok_or_else(|| Integrity::Edited {
            scope: scope.to_owned(),
            what: "its head has no cap".into(),
        })?;
    let settling = match d.get(SETTLING) {
        None => false,
        Some(Bson::Boolean(true)) => true,
        Some(Bson::String(s)) if s == SPOILED => {
            return Err(Integrity::Refilled {
                scope: scope.to_owned(),
            })
        }
        Some(other) => {
            return Err(Integrity::Edited {
                scope: scope.to_owned(),
                what: format!("its head's {SETTLING} is {other}"),
            })
        }
    };
    let since = match d.get(SINCE) {
        None => None,
        Some(Bson::Timestamp(t)) => Some(*t),
        Some(other) => {
            return Err(Integrity::Edited {
                scope: scope.to_owned(),
                what: format!("its head's {SINCE} is {other}"),
            })
        }
    };
    Ok(Head {
        epoch,
        cap: cap as usize,
        settling,
        since,
    })
}

fn int(v: Option<&Bson>) -> Option<i64> {
    match v {
        Some(Bson::Int32(x)) => Some(i64::from(*x)),
        Some(Bson::Int64(x)) => Some(*x),
        _ => None,
    }
}

fn strings<'d>(d: &'d Document, key: &str) -> Option<Vec<&'d str>> {
    d.get_array(key)
        .ok()?
        .iter()
        .map(Bson::as_str)
        .collect::<Option<Vec<_>>>()
}

fn ints(d: &Document, key: &str) -> Option<Vec<i64>> {
    d.get_array(key)
        .ok()?
        .iter()
        .map(|v| int(Some(v)))
        .collect::<Option<Vec<_>>>()
}

/// Builds a dictionary from its head and chain documents, checking every
/// document and entry: chain order, lengths, checks, and that token order
/// is name order. Chain documents of another identity (left by a proxy
/// that still held a replaced dictionary) are not part of it.
pub fn build(scope: &str, head: Head, chain_docs: &[Document]) -> Result<Dictionary, Integrity> {
    let edited = |what: String| Integrity::Edited {
        scope: scope.to_owned(),
        what,
    };
    let mut dict = Dictionary::empty(head.epoch, head.cap);
    dict.settling = head.settling;
    dict.since = head.since;
    for chain in ["names", "values"] {
        let mut docs: Vec<&Document> = chain_docs
            .iter()
            .filter(|d| {
                d.get_str("chain") == Ok(chain)
                    && Epoch::from_bson(d.get("epoch")) == Some(head.epoch)
            })
            .collect();
        docs.sort_by_key(|d| int(d.get("seq")).unwrap_or(i64::MAX));
        let mut entries: Vec<(String, Token)> = Vec::new();
        let mut values: Vec<String> = Vec::new();
        let mut lengths = Vec::new();
        for (i, d) in docs.iter().enumerate() {
            let id = d.get("_id").map(ToString::to_string).unwrap_or_default();
            if int(d.get("seq")) != Some(i as i64) {
                return Err(edited(format!("its {chain} chain has a gap before {id}")));
            }
            let n = int(d.get("n")).unwrap_or(-1);
            let checks = ints(d, "checks").ok_or_else(|| edited(format!("{id} has no checks")))?;
            let items = strings(d, chain).ok_or_else(|| edited(format!("{id} has no {chain}")))?;
            let full = i + 1 < docs.len();
            if n < 0
                || items.len() as i64 != n
                || checks.len() as i64 != n
                || (full && n as usize != head.cap)
                || n as usize > head.cap
            {
                return Err(edited(format!("{id} does not hold the entries it counts")));
            }
            if chain == "names" {
                let tokens = strings(d, "tokens")
                    .filter(|t| t.len() == items.len())
                    .ok_or_else(|| edited(format!("{id} has no tokens for its names")))?;
                for ((name, token), c) in items.iter().zip(tokens).zip(&checks) {
                    let t = Token::from_bytes(token.as_bytes())
                        .ok_or_else(|| edited(format!("{id} holds a malformed token")))?;
                    if i64::from(check(head.epoch, chain, name, token)) != *c {
                        return Err(edited(format!("the entry of {name:?} in {id} was changed")));
                    }
                    entries.push(((*name).to_owned(), t));
                }
            } else {
                let base = int(d.get("base")).unwrap_or(-1);
                if base != values.len() as i64 {
                    return Err(edited(format!("{id} starts at the wrong number")));
                }
                for (k, (value, c)) in items.iter().zip(&checks).enumerate() {
                    let number = (values.len() + k).to_string();
                    if i64::from(check(head.epoch, chain, value, &number)) != *c {
                        return Err(edited(format!("the value {value:?} in {id} was changed")));
                    }
                }
                values.extend(items.iter().map(|v| (*v).to_owned()));
            }
            lengths.push(n as usize);
        }
        if chain == "names" {
            let mut seen = HashSet::new();
            if !entries.iter().all(|(n, _)| seen.insert(n.clone())) {
                return Err(edited("a name is given twice".into()));
            }
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            dict.insert_names(&entries, scope)?;
            dict.name_chain = Chain { lengths };
        } else {
            dict.push_values(&values, scope)?;
            dict.value_chain = Chain { lengths };
        }
    }
    Ok(dict)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names_doc(epoch: Epoch, seq: i64, entries: &[(&str, &str)]) -> Document {
        let mut d = empty_chain_document(epoch, "names", seq, 0);
        d.insert("_id", chain_id(epoch, "names", seq));
        d.insert("n", entries.len() as i64);
        d.insert("names", entries.iter().map(|e| e.0).collect::<Vec<_>>());
        d.insert("tokens", entries.iter().map(|e| e.1).collect::<Vec<_>>());
        d.insert(
            "checks",
            entries
                .iter()
                .map(|(n, t)| check(epoch, "names", n, t))
                .collect::<Vec<_>>(),
        );
        d
    }

    /// Every token reads back as its name, whether it is of one byte, of
    /// two (the table by position) or longer (by hash).
    #[test]
    fn every_token_gives_its_name() {
        let mut dict = Dictionary::default();
        let names: Vec<String> = (0..4000).map(|i| format!("name-{i}")).collect();
        dict.add_names(&names);
        let mut lengths = std::collections::BTreeSet::new();
        for name in &names {
            let token = *dict.token(name).unwrap();
            lengths.insert(token.as_bytes().len());
            assert_eq!(dict.name(token.as_bytes()), Some(name.as_str()));
        }
        assert_eq!(lengths, [1, 2, 3].into());
        assert_eq!(dict.name(b"\x1e\x7e\x7e\x7e"), None);
        assert_eq!(dict.name(b"plain"), None);
    }

    /// A head made after a drop is held back while it settles; one found
    /// spoiled refuses its database; any other value is an edit.
    #[test]
    fn a_heads_settling_is_read_and_spoiled_refuses() {
        let e = Epoch([7; 16]);
        let settling = head_document(e, 2, "created", true, None);
        let head = parse_head("app", &settling).unwrap();
        assert!(head.settling);
        assert!(build("app", head, &[]).unwrap().settling);
        let plain = head_document(e, 2, "created", false, None);
        assert!(!plain.contains_key(SETTLING));
        assert!(!parse_head("app", &plain).unwrap().settling);
        let mut spoiled = settling.clone();
        spoiled.insert(SETTLING, SPOILED);
        assert!(matches!(
            parse_head("app", &spoiled),
            Err(Integrity::Refilled { .. })
        ));
        let mut odd = settling;
        odd.insert(SETTLING, 1);
        assert!(matches!(
            parse_head("app", &odd),
            Err(Integrity::Edited { .. })
        ));
    }

    /// A head says when its dictionary began: events of that cluster time
    /// or before are older than it; a head without it (made before heads
    /// recorded it) says nothing; any other value is an edit.
    #[test]
    fn a_heads_since_dates_what_is_older_than_the_dictionary() {
        let e = Epoch([7; 16]);
        let t = |time, increment| Timestamp { time, increment };
        let head = head_document(e, 2, "created", false, Some(t(100, 5)));
        let d = build("app", parse_head("app", &head).unwrap(), &[]).unwrap();
        assert_eq!(d.since, Some(t(100, 5)));
        assert!(d.began_after(t(99, 900)));
        assert!(d.began_after(t(100, 5)));
        assert!(!d.began_after(t(100, 6)));
        assert!(!d.began_after(t(101, 0)));
        let unknown = head_document(e, 2, "created", false, None);
        let d = build("app", parse_head("app", &unknown).unwrap(), &[]).unwrap();
        assert!(!d.began_after(t(1, 0)));
        let mut odd = head;
        odd.insert(SINCE, "yesterday");
        assert!(matches!(
            parse_head("app", &odd),
            Err(Integrity::Edited { .. })
        ));
    }

    #[test]
    fn a_well_formed_chain_builds_and_edits_are_found() {
        let e = Epoch([7; 16]);
        let head = Head {
            epoch: e,
            cap: 2,
            settling: false,
            since: None,
        };
        let docs = vec![
            names_doc(e, 0, &[("beta", "\u{4}"), ("alpha", "\u{2}")]),
            names_doc(e, 1, &[("gamma", "\u{6}")]),
        ];
        let d = build("app", head, &docs).unwrap();
        assert_eq!(d.len(), 3);
        assert_eq!(d.token("beta").unwrap().as_str(), "\u{4}");
        assert_eq!(d.name(b"\x06"), Some("gamma"));
        assert_eq!(d.neighbour_names("b"), (Some("alpha"), Some("beta")));

        // A renamed entry: its check no longer matches.
        let mut edited = docs.clone();
        edited[0].insert("names", vec!["hijacked", "alpha"]);
        assert!(matches!(
            build("app", head, &edited),
            Err(Integrity::Edited { .. })
        ));
        // An entry removed by hand: the count no longer matches.
        let mut pulled = docs.clone();
        pulled[1].insert("names", Vec::<String>::new());
        assert!(build("app", head, &pulled).is_err());
        // A document of another dictionary is not part of this one: the
        // chain then has a gap.
        let mut other = docs.clone();
        other[0] = names_doc(Epoch([8; 16]), 0, &[("beta", "\u{4}"), ("alpha", "\u{2}")]);
        assert!(build("app", head, &other).is_err());
        let mut stray = docs.clone();
        stray.push(names_doc(Epoch([8; 16]), 2, &[("delta", "\u{5}")]));
        assert_eq!(build("app", head, &stray).unwrap().len(), 3);
        // Tokens out of name order (consistent checks, wrong order).
        let swapped = vec![names_doc(e, 0, &[("alpha", "\u{4}"), ("beta", "\u{2}")])];
        assert!(build("app", head, &swapped).is_err());
    }

    #[test]
    fn a_dictionary_read_again_may_only_grow() {
        let e = Epoch([1; 16]);
        let mut a = Dictionary::empty(e, 10);
        let t = |b: &[u8]| Token::from_bytes(b).unwrap();
        a.insert_names(&[("x".into(), t(b"\x04"))], "s").unwrap();
        let mut b = a.clone();
        b.insert_names(&[("y".into(), t(b"\x06"))], "s").unwrap();
        assert!(a.is_contained_in(&b).is_ok());
        assert!(b.is_contained_in(&a).is_err());
        assert!(a
            .is_contained_in(&Dictionary::empty(Epoch([2; 16]), 10))
            .is_err());
    }
}
