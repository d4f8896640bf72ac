//! How a collection's documents are stored, recorded beside them.
//!
//! The tokenize settings that apply to a collection (`min_len`,
//! `custom_paths`, `value_paths`, after inheritance) decide how its
//! documents, indexes and validators are stored. Two proxies given other
//! settings would store the same document two ways, and a query through
//! one would miss what the other stored. So the first write through a
//! proxy records the collection's [`Form`] in its database's `__laconic`
//! (`_id: "settings/<collection>"`), every proxy reads the records with
//! the dictionary, and a proxy whose own settings for a collection differ
//! from its record refuses the commands that name it ([`Conflict`]).
//! `laconic migrate` changes a record; a `drop` through a proxy removes it.
//! A proxy that tokenizes nothing in a database reads no records there: it
//! reads whether the database holds a dictionary, and refuses it if so
//! ([`Found::Dictionary`]).

use std::collections::HashMap;
use std::fmt;

use bson::{doc, Document};
use parking_lot::RwLock;

use super::Policy;

/// The prefix of a settings record's `_id` in a database's `__laconic`.
pub const RECORD_PREFIX: &str = "settings/";

/// The settings a collection's documents are stored with: what of a
/// [`Policy`] decides the stored form, paths sorted and written dotted.
/// Nothing tokenized is `min_len` 0 and no paths.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Form {
    pub min_len: usize,
    pub custom_paths: Vec<String>,
    pub value_paths: Vec<String>,
}

impl Form {
    /// The form of documents stored under `policy` (`None`: as they are).
    pub fn of(policy: Option<&Policy>) -> Form {
        let Some(p) = policy.filter(|p| p.is_active()) else {
            return Form::default();
        };
        let dotted = |paths: &[Vec<String>]| {
            let mut v: Vec<String> = paths.iter().map(|p| p.join(".")).collect();
            v.sort();
            v.dedup();
            v
        };
        Form {
            min_len: p.min_len,
            custom_paths: dotted(&p.custom_paths),
            value_paths: dotted(&p.value_paths),
        }
    }

    /// Whether documents stored under `policy` have this form ([`Form::of`]
    /// without its allocations: this runs for every command).
    pub fn matches(&self, policy: Option<&Policy>) -> bool {
        let Some(p) = policy.filter(|p| p.is_active()) else {
            return *self == Form::default();
        };
        let same = |mine: &[String], theirs: &[Vec<String>]| {
            let dotted_eq = |s: &str, parts: &Vec<String>| s.split('.').eq(parts.iter());
            mine.iter().all(|m| theirs.iter().any(|t| dotted_eq(m, t)))
                && theirs.iter().all(|t| mine.iter().any(|m| dotted_eq(m, t)))
        };
        self.min_len == p.min_len
            && same(&self.custom_paths, &p.custom_paths)
            && same(&self.value_paths, &p.value_paths)
    }

    /// The record's fields (its `_id` aside).
    pub fn to_document(&self) -> Document {
        doc! {
            "min_len": self.min_len as i64,
            "custom_paths": &self.custom_paths,
            "value_paths": &self.value_paths,
        }
    }

    /// The form a record holds; `None` if it does not read as one.
    pub fn from_document(d: &Document) -> Option<Form> {
        let min_len = match d.get("min_len")? {
            bson::Bson::Int32(n) => usize::try_from(*n).ok()?,
            bson::Bson::Int64(n) => usize::try_from(*n).ok()?,
            _ => return None,
        };
        let paths = |key: &str| -> Option<Vec<String>> {
            d.get_array(key)
                .ok()?
                .iter()
                .map(|p| p.as_str().map(str::to_owned))
                .collect()
        };
        Some(Form {
            min_len,
            custom_paths: paths("custom_paths")?,
            value_paths: paths("value_paths")?,
        })
    }
}

impl fmt::Display for Form {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == Form::default() {
            return f.write_str("nothing tokenized");
        }
        write!(
            f,
            "min_len = {}, custom_paths = {:?}, value_paths = {:?}",
            self.min_len, self.custom_paths, self.value_paths
        )
    }
}

/// A collection this proxy may not rewrite: its documents are stored
/// otherwise than this proxy's settings would store them.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{}", conflict(.db, .coll, .found, .own))]
pub struct Conflict {
    pub db: String,
    pub coll: String,
    /// What says how they are stored.
    pub found: Found,
    /// What this proxy's settings say.
    pub own: Form,
}

/// What says how a collection's documents are stored, against this
/// proxy's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Its record, of other settings.
    Settings(Form),
    /// Its record, which does not read as settings.
    Unreadable,
    /// Its database holds a dictionary (or a group's mark), and this proxy
    /// tokenizes nothing in it.
    Dictionary,
}

fn conflict(db: &str, coll: &str, found: &Found, own: &Form) -> String {
    let advice = "every proxy of a deployment must be given the same settings, or one would store documents that queries through the others miss, or read names as tokens";
    match found {
        Found::Unreadable => format!("the settings recorded for {db}.{coll} (`settings/{coll}` in {db}.__laconic) do not read as tokenize settings: they were changed outside Laconic. Commands naming {db}.{coll} are refused; `laconic migrate` records them again"),
        Found::Settings(recorded) => format!("{db}.{coll} is stored with other tokenize settings ({recorded}) than this proxy's ({own}): {advice}. Commands naming {db}.{coll} are refused by this proxy: give it the settings recorded, or change the collection's with `laconic migrate` (`--reverse`, then into tokens with the new settings)"),
        Found::Dictionary => format!("the database {db} holds a dictionary (other proxies tokenize it, or did), and this proxy's settings tokenize nothing in it: {advice}. Commands naming {db}.{coll} are refused by this proxy: give it the settings of the others"),
    }
}

/// The records of the collections of the databases this proxy read, as the
/// store last said (a map shared by every clone of the policies; state,
/// not configuration, like [`super::policy::Migrating`]). A record that
/// does not read as settings is held as `None`.
#[derive(Debug, Default)]
pub struct Forms {
    /// Looked up for every command: hashed with foldhash, as the store's
    /// maps are.
    by_db: RwLock<HashMap<String, Records, Hasher>>,
}

type Hasher = foldhash::quality::RandomState;

/// The records of one database's collections.
pub type Records = HashMap<String, Option<Form>, Hasher>;

impl Forms {
    /// Whether `db.coll` has a record, as last read or written.
    pub fn has(&self, db: &str, coll: &str) -> bool {
        self.by_db
            .read()
            .get(db)
            .is_some_and(|c| c.contains_key(coll))
    }

    /// Whether `db.coll` has a record, and it does not say that documents
    /// stored under `policy` (asked for only if it has one) are stored as
    /// its documents are.
    pub fn conflict<'p>(
        &self,
        db: &str,
        coll: &str,
        policy: impl FnOnce() -> Option<&'p Policy>,
    ) -> Option<Conflict> {
        let map = self.by_db.read();
        let recorded = map.get(db)?.get(coll)?;
        let policy = policy();
        let found = match recorded {
            Some(r) if r.matches(policy) => return None,
            Some(r) => Found::Settings(r.clone()),
            None => Found::Unreadable,
        };
        Some(Conflict {
            db: db.to_owned(),
            coll: coll.to_owned(),
            found,
            own: Form::of(policy),
        })
    }

    /// Replaces what is known of the collections of `db`.
    pub fn set_db(&self, db: &str, records: Records) {
        let mut map = self.by_db.write();
        if map.get(db) != Some(&records) {
            map.insert(db.to_owned(), records);
        }
    }

    /// Notes one record, written or read.
    pub fn note(&self, db: &str, coll: &str, form: Option<Form>) {
        self.by_db
            .write()
            .entry(db.to_owned())
            .or_default()
            .insert(coll.to_owned(), form);
    }

    /// Forgets the record of `db.coll` (removed).
    pub fn forget(&self, db: &str, coll: &str) {
        if let Some(colls) = self.by_db.write().get_mut(db) {
            colls.remove(coll);
        }
    }
}

impl PartialEq for Forms {
    fn eq(&self, _: &Forms) -> bool {
        true
    }
}

impl Eq for Forms {}

/// The collection a settings record is of, from its `_id`.
pub fn record_of(id: &str) -> Option<&str> {
    id.strip_prefix(RECORD_PREFIX)
}

/// The records among documents of a database's `__laconic`.
pub fn records(docs: &[Document]) -> Records {
    docs.iter()
        .filter_map(|d| {
            let coll = record_of(d.get_str("_id").ok()?)?;
            Some((coll.to_owned(), Form::from_document(d)))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_matches_the_policy_it_was_made_of_and_no_other() {
        let p = Policy::new(8, &["custom".into(), "a.b".into()], "laconic")
            .with_value_paths(&["region".into()]);
        let form = Form::of(Some(&p));
        assert_eq!(form.custom_paths, vec!["a.b", "custom"]);
        assert!(form.matches(Some(&p)));
        // Paths in another order are the same settings.
        let reordered = Policy::new(8, &["a.b".into(), "custom".into()], "laconic")
            .with_value_paths(&["region".into()]);
        assert!(form.matches(Some(&reordered)));
        let shorter = Policy::new(6, &["custom".into(), "a.b".into()], "laconic")
            .with_value_paths(&["region".into()]);
        assert!(!form.matches(Some(&shorter)));
        let fewer = Policy::new(8, &["custom".into()], "laconic");
        assert!(!form.matches(Some(&fewer)));
        // `a.b` is not `a` and `b`.
        let split = Policy::new(8, &["custom".into(), "a".into()], "laconic")
            .with_value_paths(&["region".into()]);
        assert!(!form.matches(Some(&split)));
        assert!(!form.matches(None));
        assert!(Form::default().matches(None));
        assert!(Form::default().matches(Some(&Policy::default())));
        assert!(!Form::default().matches(Some(&p)));
    }

    #[test]
    fn a_form_reads_back_from_its_record_and_an_edited_one_does_not() {
        let p = Policy::new(4, &["props".into()], "laconic");
        let form = Form::of(Some(&p));
        let mut record = form.to_document();
        record.insert("_id", "settings/users");
        assert_eq!(Form::from_document(&record), Some(form.clone()));
        let read = records(&[record.clone(), doc! {"_id": "migration/users"}]);
        assert_eq!(read.len(), 1);
        assert_eq!(read["users"], Some(form));
        record.insert("min_len", "four");
        assert_eq!(Form::from_document(&record), None);
        let forms = Forms::default();
        forms.set_db("app", records(&[record]));
        let c = forms
            .conflict("app", "users", || Some(&p))
            .expect("refused");
        assert!(c.to_string().contains("changed outside Laconic"), "{c}");
        assert_eq!(forms.conflict("app", "orders", || Some(&p)), None);
    }

    #[test]
    fn a_conflict_names_both_settings() {
        let forms = Forms::default();
        let recorded = Policy::new(8, &[], "laconic");
        forms.note("app", "users", Some(Form::of(Some(&recorded))));
        assert_eq!(forms.conflict("app", "users", || Some(&recorded)), None);
        let own = Policy::new(6, &["custom".into()], "laconic");
        let c = forms
            .conflict("app", "users", || Some(&own))
            .expect("refused");
        let text = c.to_string();
        assert!(text.contains("min_len = 8, custom_paths = []"), "{text}");
        assert!(
            text.contains("min_len = 6, custom_paths = [\"custom\"]"),
            "{text}"
        );
        let untokenized = forms.conflict("app", "users", || None).expect("refused");
        assert!(untokenized.to_string().contains("(nothing tokenized)"));
        forms.forget("app", "users");
        assert!(!forms.has("app", "users"));
    }
}
