//! What a rewrite asked of the dictionaries and did not find.
//!
//! A rewrite reads its dictionary through [`Noting`] lookups: every name and
//! value the policy tokenizes and the dictionary lacks is noted, apart for
//! the names the command stores (documents, changes, indexes…) and those it
//! only reads (filters, sorts…). The exchange then gives the stored ones
//! tokens, or reads the dictionary again for the read ones, and rewrites
//! the command once more; a command naming nothing new is rewritten once.

use std::cell::RefCell;
use std::sync::Arc;

use crate::token::namespace::Token;
use crate::token::Names;

/// Names and values one rewrite did not find, by database.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Misses {
    /// Names and values the command stores: `(database, name)`.
    pub stored_names: Vec<(String, String)>,
    pub stored_values: Vec<(String, String)>,
    /// Names and values it only reads.
    pub read_names: Vec<(String, String)>,
    pub read_values: Vec<(String, String)>,
}

impl Misses {
    pub fn is_empty(&self) -> bool {
        self.stores_nothing() && self.read_names.is_empty() && self.read_values.is_empty()
    }

    /// Whether nothing it stores lacks a token.
    pub fn stores_nothing(&self) -> bool {
        self.stored_names.is_empty() && self.stored_values.is_empty()
    }

    /// The databases with names or values to store, each with them.
    pub fn to_store(&self) -> Vec<(String, Vec<String>, Vec<String>)> {
        fn slot(out: &mut Vec<(String, Vec<String>, Vec<String>)>, db: &str) -> usize {
            match out.iter().position(|(d, _, _)| d == db) {
                Some(i) => i,
                None => {
                    out.push((db.to_owned(), Vec::new(), Vec::new()));
                    out.len() - 1
                }
            }
        }
        let mut out = Vec::new();
        for (db, n) in &self.stored_names {
            let i = slot(&mut out, db);
            out[i].1.push(n.clone());
        }
        for (db, v) in &self.stored_values {
            let i = slot(&mut out, db);
            out[i].2.push(v.clone());
        }
        out
    }

    /// Where the lists stand, to go back to with [`Misses::truncate`].
    pub fn mark(&self) -> [usize; 4] {
        [
            self.stored_names.len(),
            self.stored_values.len(),
            self.read_names.len(),
            self.read_values.len(),
        ]
    }

    /// Forgets what was noted since `mark`.
    pub fn truncate(&mut self, mark: [usize; 4]) {
        self.stored_names.truncate(mark[0]);
        self.stored_values.truncate(mark[1]);
        self.read_names.truncate(mark[2]);
        self.read_values.truncate(mark[3]);
    }

    /// The databases whose dictionaries lack names or values a command reads.
    pub fn to_read(&self) -> Vec<String> {
        let mut dbs: Vec<String> = self
            .read_names
            .iter()
            .chain(&self.read_values)
            .map(|(db, _)| db.clone())
            .collect();
        dbs.sort();
        dbs.dedup();
        dbs
    }
}

/// A dictionary that notes what it is asked for and lacks.
pub struct Noting<'a> {
    pub inner: Arc<crate::token::Dictionary>,
    pub db: &'a str,
    pub misses: &'a RefCell<Misses>,
    /// Whether the names asked for are stored (else only read).
    pub storing: bool,
}

impl Noting<'_> {
    fn note(&self, value: bool, item: &str) {
        let mut m = self.misses.borrow_mut();
        let list = match (self.storing, value) {
            (true, false) => &mut m.stored_names,
            (true, true) => &mut m.stored_values,
            (false, false) => &mut m.read_names,
            (false, true) => &mut m.read_values,
        };
        if !list.iter().any(|(d, n)| d == self.db && n == item) {
            list.push((self.db.to_owned(), item.to_owned()));
        }
    }
}

impl Names for Noting<'_> {
    fn token(&self, name: &str) -> Option<&Token> {
        let t = self.inner.token(name);
        if t.is_none() {
            self.note(false, name);
        }
        t
    }
    fn token_of<'b>(&'b self, name: &'b [u8]) -> Option<(&'b str, &'b Token)> {
        let t = self.inner.token_of(name);
        if t.is_none() {
            if let Ok(name) = std::str::from_utf8(name) {
                self.note(false, name);
            }
        }
        t
    }
    fn name(&self, token: &[u8]) -> Option<&str> {
        self.inner.name(token)
    }
    fn value_token(&self, value: &str) -> Option<u32> {
        let t = self.inner.value_token(value);
        if t.is_none() {
            self.note(true, value);
        }
        t
    }
    fn value(&self, token: u32) -> Option<&str> {
        self.inner.value(token)
    }
    fn values(&self) -> Vec<(u32, Arc<str>)> {
        self.inner.values()
    }
}
