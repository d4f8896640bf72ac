//! `laconic analyze`: where a document's bytes go (seed 002's analyser), and
//! what tokenization would save on them.
//!
//! The breakdown counts, over raw BSON:
//! - **data by type**: each value's bytes (a string's length prefix and NUL
//!   included; a binary's length prefix and payload, its subtype apart);
//! - **binary type markers**: one subtype byte per binary;
//! - **attributes**: the bytes of every key, array indexes included, NUL
//!   apart;
//! - **null terminators**: every key's NUL, every document's and array's
//!   final NUL, and every string value's NUL (also part of its data);
//! - **document lengths**: the 4-byte prefix of every document and array,
//!   by the name of the field that holds it (`root` for the top level; the
//!   documents inside an array count under the array's name);
//! - **data by attribute**: value bytes by the name of the field that holds
//!   them (array elements under the array's name);
//! - the **total** and the **overhead**: the share of the total that is not
//!   data.

mod report;

use std::collections::BTreeMap;

use bson::RawDocumentBuf;
use serde::Serialize;

pub use report::{chart_svg, saving, text};

use crate::rewrite::mapper::raw;
use crate::rewrite::walker;
use crate::token::{Dictionary, Names, Policy};

/// Where the bytes of one or more documents go.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Breakdown {
    pub documents: usize,
    /// Value bytes by BSON type name, in type-number order.
    pub data_by_type: Vec<(String, usize)>,
    pub binary_markers: usize,
    pub attributes: usize,
    pub null_terminators: usize,
    /// Length prefixes by the name of the field holding the container.
    pub document_lengths: BTreeMap<String, usize>,
    /// Value bytes by the name of the field holding them.
    pub data_by_attribute: BTreeMap<String, usize>,
    pub total: usize,
}

impl Breakdown {
    pub fn data(&self) -> usize {
        self.data_by_type.iter().map(|(_, n)| n).sum()
    }

    pub fn document_lengths_total(&self) -> usize {
        self.document_lengths.values().sum()
    }

    /// The share of the bytes that are not data, in percent.
    pub fn overhead(&self) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        100.0 * (1.0 - self.data() as f64 / self.total as f64)
    }

    /// Adds one document's raw bytes.
    pub fn add(&mut self, doc: &[u8]) -> Result<(), walker::Malformed> {
        self.add_named(doc, None)
    }

    /// Adds one stored document, its tokens labelled with the names they
    /// stand for.
    pub fn add_named(
        &mut self,
        doc: &[u8],
        names: Option<&dyn Names>,
    ) -> Result<(), walker::Malformed> {
        let mut by_type: BTreeMap<u8, usize> = self
            .data_by_type
            .iter()
            .filter_map(|(name, n)| type_number(name).map(|t| (t, *n)))
            .collect();
        let mut walker = Walker {
            b: self,
            by_type: &mut by_type,
            names,
        };
        walker.container(doc, "root", 0)?;
        self.documents += 1;
        self.total += doc.len();
        self.data_by_type = by_type
            .into_iter()
            .map(|(t, n)| (type_name(t).to_owned(), n))
            .collect();
        Ok(())
    }
}

struct Walker<'a> {
    b: &'a mut Breakdown,
    by_type: &'a mut BTreeMap<u8, usize>,
    names: Option<&'a dyn Names>,
}

impl Walker<'_> {
    /// A document or array held by the field `name`.
    fn container(&mut self, doc: &[u8], name: &str, depth: usize) -> Result<(), walker::Malformed> {
        *self.b.document_lengths.entry(name.to_owned()).or_default() += 4;
        self.b.null_terminators += 1;
        for e in walker::elements(doc) {
            let walker::Element {
                kind, key, value, ..
            } = e?;
            self.b.attributes += key.len();
            self.b.null_terminators += 1;
            let key = String::from_utf8_lossy(key);
            let label = match self.names {
                Some(names) => {
                    crate::rewrite::expand::key(&key, names, &mut Vec::new()).into_owned()
                }
                None => key.into_owned(),
            };
            self.value(kind, &label, value, depth)?;
        }
        Ok(())
    }

    fn value(
        &mut self,
        kind: u8,
        key: &str,
        v: &[u8],
        depth: usize,
    ) -> Result<(), walker::Malformed> {
        match kind {
            0x03 => self.container(v, key, walker::descend(depth)?),
            0x04 => {
                // Elements of an array count under the array's name.
                *self.b.document_lengths.entry(key.to_owned()).or_default() += 4;
                self.b.null_terminators += 1;
                let depth = walker::descend(depth)?;
                for e in walker::elements(v) {
                    let e = e?;
                    self.b.attributes += e.key.len();
                    self.b.null_terminators += 1;
                    self.value(e.kind, key, e.value, depth)?;
                }
                Ok(())
            }
            0x05 => {
                self.b.binary_markers += 1;
                self.data(kind, key, v.len() - 1);
                Ok(())
            }
            0x02 | 0x0D | 0x0E => {
                self.b.null_terminators += 1;
                self.data(kind, key, v.len());
                Ok(())
            }
            0x0B => {
                self.b.null_terminators += 2;
                self.data(kind, key, v.len());
                Ok(())
            }
            _ => {
                self.data(kind, key, v.len());
                Ok(())
            }
        }
    }

    fn data(&mut self, kind: u8, key: &str, n: usize) {
        *self.by_type.entry(kind).or_default() += n;
        *self.b.data_by_attribute.entry(key.to_owned()).or_default() += n;
    }
}

const TYPES: &[(u8, &str)] = &[
    (0x01, "DOUBLE"),
    (0x02, "STRING"),
    (0x03, "DOCUMENT"),
    (0x04, "ARRAY"),
    (0x05, "BINARY"),
    (0x06, "UNDEFINED"),
    (0x07, "OBJECT_ID"),
    (0x08, "BOOLEAN"),
    (0x09, "DATE_TIME"),
    (0x0A, "NULL"),
    (0x0B, "REGULAR_EXPRESSION"),
    (0x0C, "DB_POINTER"),
    (0x0D, "JAVASCRIPT"),
    (0x0E, "SYMBOL"),
    (0x0F, "JAVASCRIPT_WITH_SCOPE"),
    (0x10, "INT32"),
    (0x11, "TIMESTAMP"),
    (0x12, "INT64"),
    (0x13, "DECIMAL128"),
    (0x7F, "MAX_KEY"),
    (0xFF, "MIN_KEY"),
];

fn type_name(t: u8) -> &'static str {
    TYPES
        .iter()
        .find(|(n, _)| *n == t)
        .map_or("UNKNOWN", |(_, name)| name)
}

fn type_number(name: &str) -> Option<u8> {
    TYPES.iter().find(|(_, n)| *n == name).map(|(t, _)| *t)
}

/// One set of documents analysed as they are and as Laconic would store them.
#[derive(Clone, Debug, Serialize)]
pub struct Analysis {
    pub label: String,
    pub logical: Breakdown,
    pub tokenized: Breakdown,
    /// Distinct names and values the dictionary would hold (stored once per
    /// database, not per document).
    pub dictionary_names: usize,
    pub dictionary_values: usize,
}

impl Analysis {
    /// Bytes saved per document, on average.
    pub fn saved_per_document(&self) -> f64 {
        if self.logical.documents == 0 {
            return 0.0;
        }
        (self.logical.total as f64 - self.tokenized.total as f64) / self.logical.documents as f64
    }

    pub fn saved_percent(&self) -> f64 {
        if self.logical.total == 0 {
            return 0.0;
        }
        100.0 * (1.0 - self.tokenized.total as f64 / self.logical.total as f64)
    }
}

/// Analyses `docs`, and projects them through tokenization under `policy`
/// with a dictionary built from the documents themselves (tokens numbered in
/// the order the names first appear, as the name store would).
pub fn analyse(
    label: &str,
    docs: &[RawDocumentBuf],
    policy: &Policy,
) -> Result<Analysis, walker::Malformed> {
    let mut dict = Dictionary::default();
    let mut names = Vec::new();
    let mut values = Vec::new();
    for d in docs {
        if let Ok(owned) = bson::Document::try_from(d.as_ref()) {
            crate::rewrite::mapper::paths::collect_names(&owned, policy, &mut names);
            crate::rewrite::mapper::paths::collect_values(&owned, policy, &mut values);
        }
    }
    dict.add_names(&names);
    dict.add_values(&values);
    let mut logical = Breakdown::default();
    let mut tokenized = Breakdown::default();
    for d in docs {
        logical.add(d.as_bytes())?;
        let mut stored = Vec::with_capacity(d.as_bytes().len());
        raw::tokenize(d.as_bytes(), policy, &dict, &mut stored)?;
        tokenized.add_named(&stored, Some(&dict))?;
    }
    Ok(Analysis {
        label: label.to_owned(),
        logical,
        tokenized,
        dictionary_names: names.len(),
        dictionary_values: values.len(),
    })
}

/// Documents from a file: Extended JSON (one document, an array of them, or
/// one per line) or BSON (one document, or a concatenation such as a
/// mongodump `.bson` file), told apart by their first byte.
pub fn read_file(path: &std::path::Path) -> crate::tools::Result<Vec<RawDocumentBuf>> {
    let bytes = std::fs::read(path)?;
    let first = bytes.iter().find(|b| !b.is_ascii_whitespace()).copied();
    if matches!(first, Some(b'{') | Some(b'[')) {
        return from_json(std::str::from_utf8(&bytes)?);
    }
    from_bson(&bytes)
}

/// The legacy Extended JSON binary form (`{"$binary": "<base64>", "$type":
/// "00"}`, as mongoexport wrote it) in the canonical one.
fn legacy_binary(v: &mut serde_json::Value) {
    use serde_json::Value;
    match v {
        Value::Object(map) => {
            let legacy = map.len() == 2
                && matches!(map.get("$binary"), Some(Value::String(_)))
                && matches!(map.get("$type"), Some(Value::String(_)));
            if legacy {
                let base64 = map.remove("$binary").unwrap_or_default();
                let sub_type = map.remove("$type").unwrap_or_default();
                map.insert(
                    "$binary".into(),
                    serde_json::json!({"base64": base64, "subType": sub_type}),
                );
            } else {
                map.values_mut().for_each(legacy_binary);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(legacy_binary),
        _ => {}
    }
}

fn from_json(text: &str) -> crate::tools::Result<Vec<RawDocumentBuf>> {
    let to_raw = |mut v: serde_json::Value| -> crate::tools::Result<RawDocumentBuf> {
        legacy_binary(&mut v);
        match bson::Bson::try_from(v)? {
            bson::Bson::Document(d) => Ok(RawDocumentBuf::from_document(&d)?),
            other => crate::tools::bail!("not a document: {other}"),
        }
    };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Array(items)) => items.into_iter().map(to_raw).collect(),
        Ok(v) => Ok(vec![to_raw(v)?]),
        // One document per line (mongoexport's default).
        Err(_) => text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| to_raw(serde_json::from_str(l)?))
            .collect(),
    }
}

fn from_bson(bytes: &[u8]) -> crate::tools::Result<Vec<RawDocumentBuf>> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let len = bytes
            .get(at..at + 4)
            .and_then(|b| b.try_into().ok())
            .map(i32::from_le_bytes)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|&n| n >= 5 && at + n <= bytes.len())
            .ok_or_else(|| crate::tools::fail!("malformed BSON at byte {at}"))?;
        out.push(RawDocumentBuf::from_bytes(bytes[at..at + len].to_vec())?);
        at += len;
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
