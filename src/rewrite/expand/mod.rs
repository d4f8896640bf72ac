//! ⑦ Tokens → logical names, in any reply, whatever its shape.
//!
//! A stored key is a token, an escaped user key or a plain user key by its
//! first byte alone ([`crate::token::namespace`]), so expansion walks every
//! key of a reply without knowing which command produced it: cursor batches,
//! `$group` and `$lookup` output, index key patterns, `keyValue` in errors.
//! Keys holding dotted paths (key patterns, `updatedFields`) are expanded one
//! component at a time.

use std::borrow::Cow;

use bson::{Bson, Document};

use bson::spec::BinarySubtype;

use crate::token::namespace::{
    any_part_reserved, decode, starts_token, value_number, Stored, ESCAPE, VALUE_SUBTYPE,
};
use crate::token::Names;

pub mod raw;
mod text;

use text::text_needs_expanding;
pub use text::{expand_text, expand_text_within};

/// Tokens the cache does not know yet: refresh the store, then expand again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unknown {
    /// Stored keys that read as tokens the dictionary lacks (or spell none).
    pub names: Vec<String>,
    pub values: Vec<u32>,
}

impl Unknown {
    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.values.is_empty()
    }

    pub fn count(&self) -> usize {
        self.names.len() + self.values.len()
    }
}

/// Whether any key of the document needs expanding (a cheap first pass).
pub fn needed(doc: &Document) -> bool {
    doc.iter().any(|(k, v)| key_needed(k) || value_needed(v))
}

fn key_needed(k: &str) -> bool {
    any_part_reserved(k.as_bytes())
}

fn value_needed(v: &Bson) -> bool {
    match v {
        Bson::Binary(b) => b.subtype == BinarySubtype::UserDefined(VALUE_SUBTYPE),
        Bson::Document(d) => needed(d),
        Bson::Array(a) => a.iter().any(value_needed),
        _ => false,
    }
}

/// The logical form of a document's stored key. A key the user wrote with
/// dots is escaped whole (one escape byte in front keeps all of it).
pub fn key<'k, N: Names + ?Sized>(
    k: &'k str,
    names: &'k N,
    unknown: &mut Vec<String>,
) -> Cow<'k, str> {
    if k.as_bytes().first() == Some(&ESCAPE) {
        return Cow::Borrowed(&k[1..]);
    }
    path_key(k, names, unknown)
}

/// The logical form of a stored path (an index's key, an updated field):
/// each part is a key of its own, escaped or tokenized alone, the first
/// one included.
pub fn path_key<'k, N: Names + ?Sized>(
    k: &'k str,
    names: &'k N,
    unknown: &mut Vec<String>,
) -> Cow<'k, str> {
    if !k.contains('.') {
        return component(k, names, unknown);
    }
    if !any_part_reserved(k.as_bytes()) {
        return Cow::Borrowed(k);
    }
    Cow::Owned(
        k.split('.')
            .map(|c| component(c, names, unknown))
            .collect::<Vec<_>>()
            .join("."),
    )
}

fn component<'k, N: Names + ?Sized>(
    c: &'k str,
    names: &'k N,
    unknown: &mut Vec<String>,
) -> Cow<'k, str> {
    match decode(c) {
        Stored::Token(t) => match names.name(t.as_bytes()) {
            Some(name) => Cow::Borrowed(name),
            None => {
                unknown.push(c.to_owned());
                Cow::Borrowed(c)
            }
        },
        Stored::User(u) => Cow::Borrowed(u),
        Stored::Malformed => {
            unknown.push(c.to_owned());
            Cow::Borrowed(c)
        }
    }
}

/// Expands every key of a reply; fails with the tokens the cache lacks.
pub fn document(doc: &Document, names: &dyn Names) -> Result<Document, Unknown> {
    let mut unknown = Unknown::default();
    let out = expand_doc(doc, names, &mut unknown);
    if unknown.is_empty() {
        Ok(out)
    } else {
        unknown.names.sort_unstable();
        unknown.names.dedup();
        unknown.values.sort_unstable();
        unknown.values.dedup();
        Err(unknown)
    }
}

/// Expands an index's key pattern, whose keys are paths; fails with the
/// tokens the cache lacks.
pub fn key_pattern(pattern: &Document, names: &dyn Names) -> Result<Document, Unknown> {
    let mut unknown = Unknown::default();
    let out = pattern
        .iter()
        .map(|(k, v)| {
            (
                path_key(k, names, &mut unknown.names).into_owned(),
                v.clone(),
            )
        })
        .collect();
    if unknown.is_empty() {
        Ok(out)
    } else {
        Err(unknown)
    }
}

fn expand_doc(doc: &Document, names: &dyn Names, unknown: &mut Unknown) -> Document {
    let mut out = Document::new();
    for (k, v) in doc {
        out.insert(
            key(k, names, &mut unknown.names).into_owned(),
            expand_value(v, names, unknown),
        );
    }
    out
}

fn expand_value(v: &Bson, names: &dyn Names, unknown: &mut Unknown) -> Bson {
    match v {
        Bson::Binary(b) if b.subtype == BinarySubtype::UserDefined(VALUE_SUBTYPE) => {
            match value_number(&b.bytes).map(|n| (n, names.value(n))) {
                Some((_, Some(value))) => Bson::String(value.to_string()),
                Some((n, None)) => {
                    unknown.values.push(n);
                    v.clone()
                }
                None => v.clone(),
            }
        }
        Bson::Document(d) => Bson::Document(expand_doc(d, names, unknown)),
        Bson::Array(a) => Bson::Array(a.iter().map(|x| expand_value(x, names, unknown)).collect()),
        other => other.clone(),
    }
}

// === Raw bytes in, raw bytes out ===
//
// The same expansion without building owned documents: keys are replaced as
// the bytes are copied, values are copied as they are (or, for a value
// token, written as the string it stands for). Replies take this path.

use bson::{RawDocument, RawDocumentBuf};

use crate::wire::MsgBody;

/// Which string values hold paths (and so may hold tokens). Keys are always
/// expanded; strings only where the reply's kind says they are paths.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Strings {
    /// Documents: string values are the user's data.
    #[default]
    Data,
    /// Collection and index metadata, explain output: every string that
    /// spells a path of tokens (`"$<token>.<token>"`, `required` names,
    /// `timeField`, `language_override`) is expanded.
    Paths,
    /// Change events: strings under an event's `updateDescription`'s
    /// `removedFields`, `truncatedArrays` and `disambiguatedPaths` are
    /// paths; the rest are documents.
    Events,
    /// Inside a change event's `updateDescription`.
    Update,
    /// Write replies: a validation error's `errInfo` names properties in
    /// strings, a duplicate key's `keyPattern` and `keyValue` have paths
    /// for keys; everything else is data.
    Writes,
    /// A document whose keys are paths the server wrote (an update event's
    /// `updatedFields`, a duplicate key's `keyPattern` and `keyValue`):
    /// each part of a key is read alone. Its values are data.
    PathKeys,
}

impl Strings {
    /// How the strings under `key` are read. The switch to paths happens
    /// only where the server puts them: a key of the same name inside a
    /// user's document (an inserted document's `removedFields`, a
    /// duplicate key's value under `errInfo`) is the user's data.
    pub(super) fn under(self, key: &str) -> Strings {
        match (self, key) {
            (Strings::Paths, _) => Strings::Paths,
            // A change stream's reply, down to its events.
            (Strings::Events, "cursor" | "firstBatch" | "nextBatch") => Strings::Events,
            (Strings::Events, "updateDescription") => Strings::Update,
            (Strings::Update, "removedFields" | "truncatedArrays" | "disambiguatedPaths") => {
                Strings::Paths
            }
            // A write reply, down to its errors' accounts.
            (Strings::Writes, "writeErrors" | "writeConcernError") => Strings::Writes,
            (Strings::Writes, "errInfo") => Strings::Paths,
            (Strings::Update, "updatedFields") | (Strings::Writes, "keyPattern" | "keyValue") => {
                Strings::PathKeys
            }
            _ => Strings::Data,
        }
    }

    /// Whether the keys read this way are paths: a stored key then escapes
    /// each of its parts alone, where a document's key is escaped whole.
    pub(super) fn keys_are_paths(self) -> bool {
        matches!(self, Strings::Paths | Strings::PathKeys)
    }
}

/// A string value that spells a path, with its tokens expanded (`None`:
/// it holds none), or `Err` once it would be longer than `most` bytes.
pub(super) fn path_string<N: Names + ?Sized>(
    s: &str,
    names: &N,
    unknown: &mut Vec<String>,
    most: usize,
) -> Result<Option<String>, TooLong> {
    if !s.bytes().any(|b| starts_token(b) || b == ESCAPE) {
        return Ok(None);
    }
    let (prefix, rest) = if let Some(var) = s.strip_prefix("$$") {
        match var.split_once('.') {
            Some((v, rest)) => (format!("$${v}."), rest),
            None => return Ok(None),
        }
    } else if let Some(rest) = s.strip_prefix('$') {
        ("$".to_owned(), rest)
    } else {
        (String::new(), s)
    };
    // Each part's length first: a string may be any value a command
    // echoes, each of its parts a token of a long name.
    let parts: Vec<_> = rest
        .split('.')
        .map(|c| component(c, names, unknown))
        .collect();
    let len = prefix.len() + parts.iter().map(|p| p.len() + 1).sum::<usize>();
    if len > most.saturating_add(1) {
        return Err(TooLong);
    }
    Ok(Some(format!("{prefix}{}", parts.join("."))))
}

/// A string whose expansion would pass the room it was given.
#[derive(Debug)]
pub(super) struct TooLong;

/// Expands a raw reply whose strings are data.
pub fn raw_document<N: Names + ?Sized>(
    doc: &RawDocument,
    names: &N,
) -> Result<RawDocumentBuf, Unreadable> {
    raw_document_with(doc, names, Strings::Data)
}

/// Expands a raw reply whose string values are read as `strings` says.
pub fn raw_document_with<N: Names + ?Sized>(
    doc: &RawDocument,
    names: &N,
    strings: Strings,
) -> Result<RawDocumentBuf, Unreadable> {
    raw_document_within(doc, names, strings, &mut |n| n)
}

/// [`raw_document_with`] within the room `grow` grants (see
/// [`raw::expand`]).
pub fn raw_document_within<N: Names + ?Sized>(
    doc: &RawDocument,
    names: &N,
    strings: Strings,
    grow: &mut dyn FnMut(usize) -> usize,
) -> Result<RawDocumentBuf, Unreadable> {
    let mut out = Vec::new();
    expand_into(doc, names, strings, (&mut out, 0), grow)?;
    RawDocumentBuf::from_bytes(out).map_err(|_| expanded_malformed())
}

/// [`raw_document_within`], written in place in the buffer of the message
/// that will carry it to the driver: one that carried an earlier reply
/// where there is one ([`MsgBody::spare`]).
pub fn raw_body_within<N: Names + ?Sized>(
    doc: &RawDocument,
    names: &N,
    strings: Strings,
    grow: &mut dyn FnMut(usize) -> usize,
) -> Result<MsgBody, Unreadable> {
    let mut out = MsgBody::spare(raw::room(doc.as_bytes().len()));
    expand_into(doc, names, strings, (&mut out, MsgBody::AT), grow)?;
    MsgBody::new(out).map_err(|_| expanded_malformed())
}

/// Writes the expansion of `doc` in `out` from `base` on (see
/// [`raw::expand`]), within the room `grow` grants.
fn expand_into<N: Names + ?Sized>(
    doc: &RawDocument,
    names: &N,
    strings: Strings,
    out: (&mut Vec<u8>, usize),
    grow: &mut dyn FnMut(usize) -> usize,
) -> Result<(), Unreadable> {
    let mut unknown = Unknown::default();
    // A reply the walker cannot go through (a server never sends one) is
    // not forwarded: its tokens could not be expanded.
    raw::expand(doc.as_bytes(), names, strings, &mut unknown, out, grow).map_err(|e| match e {
        raw::Refused::Malformed(m) => Unreadable::Malformed(m),
        raw::Refused::Room => Unreadable::Room,
    })?;
    if !unknown.is_empty() {
        unknown.names.sort_unstable();
        unknown.names.dedup();
        unknown.values.sort_unstable();
        unknown.values.dedup();
        return Err(Unreadable::Unknown(unknown));
    }
    Ok(())
}

fn expanded_malformed() -> Unreadable {
    Unreadable::Malformed(crate::rewrite::walker::Malformed::Invalid(
        "an expanded reply",
    ))
}

/// Why a reply cannot be expanded.
#[derive(Debug)]
pub enum Unreadable {
    /// Tokens the dictionary lacks: read it again, or fail closed.
    Unknown(Unknown),
    /// Names that would take more memory than the expansion was granted.
    Room,
    Malformed(crate::rewrite::walker::Malformed),
}
