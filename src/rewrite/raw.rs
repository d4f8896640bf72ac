//! The hot paths on raw bytes: tokenizing inserted documents and expanding
//! replies, element by element, without building owned documents.
//!
//! A BSON element is a type byte, a NUL-terminated key and a value whose
//! length the type gives. Both rewrites copy every value they do not change
//! as a byte slice, and touch only keys (and, at value paths, strings and
//! value tokens). They give exactly what the owned rewriters in
//! [`super::tokenize`] and [`super::expand`] give (property-tested there).

use std::borrow::Cow;

use super::expand::{self, Strings, Unknown};
use crate::token::namespace::{
    any_part_reserved, escape, starts_token, value_bytes, value_number, Token, ESCAPE,
    VALUE_SUBTYPE,
};
use crate::token::{Names, Policy};

/// Raw bytes that are not well-formed BSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed BSON: {0}")]
pub struct Malformed(&'static str);

/// One element: its type, key and value bytes.
struct Element<'a> {
    kind: u8,
    key: &'a [u8],
    value: &'a [u8],
}

/// The elements of a document (or array) given with its length prefix.
fn elements(doc: &[u8]) -> impl Iterator<Item = Result<Element<'_>, Malformed>> {
    let end = doc.len().saturating_sub(1);
    let mut at = 4;
    std::iter::from_fn(move || {
        if at >= end {
            return None;
        }
        let kind = doc[at];
        let key_start = at + 1;
        let Some(nul) = memchr::memchr(0, &doc[key_start..end]) else {
            at = end;
            return Some(Err(Malformed("a key without its NUL")));
        };
        let key = &doc[key_start..key_start + nul];
        let value_start = key_start + nul + 1;
        match value_len(kind, &doc[value_start..end]) {
            Ok(len) => {
                at = value_start + len;
                Some(Ok(Element {
                    kind,
                    key,
                    value: &doc[value_start..value_start + len],
                }))
            }
            Err(e) => {
                at = end;
                Some(Err(e))
            }
        }
    })
}

/// One element as `(type, key, value bytes)`.
pub type RawElement<'a> = (u8, &'a [u8], &'a [u8]);

/// The elements of a document.
pub fn elements_of(doc: &[u8]) -> Result<Vec<RawElement<'_>>, Malformed> {
    elements(doc)
        .map(|e| e.map(|e| (e.kind, e.key, e.value)))
        .collect()
}

#[inline(always)]
fn le_i32(b: &[u8]) -> Result<usize, Malformed> {
    let bytes: [u8; 4] = b
        .get(..4)
        .and_then(|s| s.try_into().ok())
        .ok_or(Malformed("a truncated length"))?;
    usize::try_from(i32::from_le_bytes(bytes)).map_err(|_| Malformed("a negative length"))
}

fn cstring_len(b: &[u8]) -> Result<usize, Malformed> {
    memchr::memchr(0, b)
        .map(|n| n + 1)
        .ok_or(Malformed("a string without its NUL"))
}

/// The length of a value of type `kind` at the start of `rest`.
#[inline(always)]
fn value_len(kind: u8, rest: &[u8]) -> Result<usize, Malformed> {
    let len = match kind {
        0x01 | 0x09 | 0x11 | 0x12 => 8,
        0x02 | 0x0D | 0x0E => 4 + le_i32(rest)?,
        0x03 | 0x04 | 0x0F => le_i32(rest)?,
        0x05 => 4 + 1 + le_i32(rest)?,
        0x06 | 0x0A | 0xFF | 0x7F => 0,
        0x07 => 12,
        0x08 => 1,
        0x0B => {
            let a = cstring_len(rest)?;
            a + cstring_len(rest.get(a..).unwrap_or_default())?
        }
        0x0C => 4 + le_i32(rest)? + 12,
        0x10 => 4,
        0x13 => 16,
        _ => return Err(Malformed("an unknown element type")),
    };
    if len > rest.len() {
        return Err(Malformed("a value that overruns its document"));
    }
    Ok(len)
}

fn begin(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    start
}

fn finish(out: &mut Vec<u8>, start: usize) {
    out.push(0);
    let len = (out.len() - start) as i32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

#[inline(always)]
fn header(out: &mut Vec<u8>, kind: u8, key: &[u8]) {
    out.push(kind);
    out.extend_from_slice(key);
    out.push(0);
}

fn string_value(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as i32 + 1).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

fn as_str(b: &[u8]) -> Result<&str, Malformed> {
    std::str::from_utf8(b).map_err(|_| Malformed("a key that is not UTF-8"))
}

/// The string a type-0x02 value holds.
fn string_of(value: &[u8]) -> Result<&str, Malformed> {
    let len = le_i32(value)?;
    let bytes = value
        .get(4..4 + len.saturating_sub(1))
        .ok_or(Malformed("a truncated string"))?;
    as_str(bytes)
}

// === Tokenize ===

/// Tokenizes a stored-to-be document: keys in their scope, values at value
/// paths as value tokens; everything else copied.
pub fn tokenize(
    doc: &[u8],
    policy: &Policy,
    names: &dyn Names,
    out: &mut Vec<u8>,
) -> Result<(), Malformed> {
    let mut parent = Vec::new();
    tokenize_doc(doc, false, &mut parent, policy, names, out)
}

fn tokenize_doc<'d>(
    doc: &'d [u8],
    is_array: bool,
    parent: &mut Vec<&'d str>,
    policy: &Policy,
    names: &dyn Names,
    out: &mut Vec<u8>,
) -> Result<(), Malformed> {
    let start = begin(out);
    for e in elements(doc) {
        let e = e?;
        if is_array {
            value(e.kind, e.key, e.value, false, parent, policy, names, out)?;
            continue;
        }
        let key = as_str(e.key)?;
        let stored = StoredKey::of(parent, key, policy, names);
        parent.push(key);
        let at_value_path = !policy.value_paths.is_empty() && policy.is_value_path(parent);
        value(
            e.kind,
            stored.bytes(),
            e.value,
            at_value_path,
            parent,
            policy,
            names,
            out,
        )?;
        parent.pop();
    }
    finish(out, start);
    Ok(())
}

/// A key as stored, built without allocating.
enum StoredKey<'k> {
    Plain(&'k str),
    Token(Token),
    Escaped(String),
}

impl<'k> StoredKey<'k> {
    fn of(parent: &[&str], key: &'k str, policy: &Policy, names: &dyn Names) -> StoredKey<'k> {
        if policy.tokenizes(parent, key) {
            if let Some(t) = names.token(key) {
                return StoredKey::Token(t);
            }
        }
        match escape(key) {
            Cow::Borrowed(k) => StoredKey::Plain(k),
            Cow::Owned(k) => StoredKey::Escaped(k),
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            StoredKey::Plain(k) => k.as_bytes(),
            StoredKey::Token(t) => t.as_bytes(),
            StoredKey::Escaped(k) => k.as_bytes(),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn value<'d>(
    kind: u8,
    key: &[u8],
    v: &'d [u8],
    at_value_path: bool,
    parent: &mut Vec<&'d str>,
    policy: &Policy,
    names: &dyn Names,
    out: &mut Vec<u8>,
) -> Result<(), Malformed> {
    match kind {
        0x02 if at_value_path => match names.value_token(string_of(v)?) {
            Some(t) => {
                header(out, 0x05, key);
                let (bytes, len) = value_bytes(t);
                out.extend_from_slice(&(len as i32).to_le_bytes());
                out.push(VALUE_SUBTYPE);
                out.extend_from_slice(&bytes[..len]);
            }
            None => {
                header(out, kind, key);
                out.extend_from_slice(v);
            }
        },
        0x04 if at_value_path => {
            header(out, kind, key);
            let start = begin(out);
            for e in elements(v) {
                let e = e?;
                value(e.kind, e.key, e.value, true, parent, policy, names, out)?;
            }
            finish(out, start);
        }
        0x03 if at_value_path && has_each(v)? => {
            // `{$each: [...]}` in an update, or a document at a value path:
            // as the owned rewriter does, only `$each` is read as values.
            header(out, kind, key);
            let start = begin(out);
            for e in elements(v) {
                let e = e?;
                if e.key == b"$each" {
                    value(e.kind, e.key, e.value, true, parent, policy, names, out)?;
                } else {
                    header(out, e.kind, e.key);
                    out.extend_from_slice(e.value);
                }
            }
            finish(out, start);
        }
        0x03 => {
            header(out, kind, key);
            tokenize_doc(v, false, parent, policy, names, out)?;
        }
        0x04 => {
            header(out, kind, key);
            tokenize_doc(v, true, parent, policy, names, out)?;
        }
        _ => {
            header(out, kind, key);
            out.extend_from_slice(v);
        }
    }
    Ok(())
}

/// Whether a document holds a `$each` field.
fn has_each(doc: &[u8]) -> Result<bool, Malformed> {
    for e in elements(doc) {
        if e?.key == b"$each" {
            return Ok(true);
        }
    }
    Ok(false)
}

/// An `insert` with every document tokenized, whether the documents came
/// in the body's `documents` array or in a kind-1 sequence; everything else
/// is kept as it was.
pub fn insert(
    m: &crate::wire::OpMsg,
    policy: &Policy,
    names: &dyn Names,
) -> Result<crate::wire::OpMsg, Malformed> {
    use crate::wire::Section;
    let mut out = m.clone();
    out.flags = m.flags.without_checksum();
    for section in &mut out.sections {
        match section {
            Section::Body(b) => {
                let mut body = Vec::with_capacity(b.len());
                let start = begin(&mut body);
                for e in elements(b) {
                    let e = e?;
                    header(&mut body, e.kind, e.key);
                    if e.key == b"documents" && e.kind == 0x04 {
                        let array = begin(&mut body);
                        for d in elements(e.value) {
                            let d = d?;
                            header(&mut body, d.kind, d.key);
                            if d.kind == 0x03 {
                                tokenize(d.value, policy, names, &mut body)?;
                            } else {
                                body.extend_from_slice(d.value);
                            }
                        }
                        finish(&mut body, array);
                    } else {
                        body.extend_from_slice(e.value);
                    }
                }
                finish(&mut body, start);
                *b = bytes::Bytes::from(body);
            }
            Section::Sequence(seq) if seq.identifier == "documents" => {
                for d in &mut seq.documents {
                    let mut stored = Vec::with_capacity(d.len());
                    tokenize(d, policy, names, &mut stored)?;
                    *d = bytes::Bytes::from(stored);
                }
            }
            Section::Sequence(_) => {}
        }
    }
    Ok(out)
}

/// Walks a document element by element and copies it: the baseline the two
/// rewrites are measured against (same parsing, nothing changed).
pub fn copy(doc: &[u8], out: &mut Vec<u8>) -> Result<(), Malformed> {
    copy_doc(doc, out)
}

fn copy_doc(doc: &[u8], out: &mut Vec<u8>) -> Result<(), Malformed> {
    let start = begin(out);
    for e in elements(doc) {
        let e = e?;
        header(out, e.kind, e.key);
        match e.kind {
            0x03 | 0x04 => copy_doc(e.value, out)?,
            _ => out.extend_from_slice(e.value),
        }
    }
    finish(out, start);
    Ok(())
}

// === Expand ===

/// Expands a reply: every key, value tokens, and strings as `strings` says.
pub fn expand(
    doc: &[u8],
    names: &dyn Names,
    strings: Strings,
    unknown: &mut Unknown,
    out: &mut Vec<u8>,
) -> Result<(), Malformed> {
    expand_doc(doc, false, names, strings, unknown, out)
}

fn expand_doc(
    doc: &[u8],
    is_array: bool,
    names: &dyn Names,
    strings: Strings,
    unknown: &mut Unknown,
    out: &mut Vec<u8>,
) -> Result<(), Malformed> {
    let start = begin(out);
    for e in elements(doc) {
        let e = e?;
        let (key, inner): (Cow<'_, [u8]>, Strings) = if is_array {
            (Cow::Borrowed(e.key), strings)
        } else {
            let first = e.key.first().copied().unwrap_or(0);
            let plain = first != ESCAPE && !starts_token(first) && !e.key.contains(&b'.');
            if plain && strings == Strings::Data {
                // The common case: a user key stored as it is, in a document.
                (Cow::Borrowed(e.key), strings)
            } else if plain {
                let k = as_str(e.key)?;
                (Cow::Borrowed(e.key), strings.under(k))
            } else {
                let k = as_str(e.key)?;
                let logical = expand::key(k, names, &mut unknown.names);
                let inner = strings.under(&logical);
                let bytes = match logical {
                    Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
                    Cow::Owned(s) => Cow::Owned(s.into_bytes()),
                };
                (bytes, inner)
            }
        };
        match e.kind {
            0x03 => {
                header(out, e.kind, &key);
                expand_doc(e.value, false, names, inner, unknown, out)?;
            }
            0x04 => {
                header(out, e.kind, &key);
                expand_doc(e.value, true, names, inner, unknown, out)?;
            }
            0x05 if e.value.get(4) == Some(&VALUE_SUBTYPE) => {
                let bytes = e.value.get(5..).unwrap_or_default();
                match value_number(bytes).map(|n| (n, names.value(n))) {
                    Some((_, Some(v))) => {
                        header(out, 0x02, &key);
                        string_value(out, v);
                    }
                    other => {
                        if let Some((n, None)) = other {
                            unknown.values.push(n);
                        }
                        header(out, e.kind, &key);
                        out.extend_from_slice(e.value);
                    }
                }
            }
            0x02 if (inner == Strings::Paths || &*key == b"errmsg")
                && e.value[4..].iter().any(|&b| b == ESCAPE || starts_token(b)) =>
            {
                let text = string_of(e.value)?;
                let expanded = if &*key == b"errmsg" && inner != Strings::Paths {
                    Some(expand::expand_text(text, names))
                } else {
                    expand::path_string(text, names, &mut unknown.names)
                };
                header(out, e.kind, &key);
                match expanded {
                    Some(s) => string_value(out, &s),
                    None => out.extend_from_slice(e.value),
                }
            }
            _ => {
                header(out, e.kind, &key);
                out.extend_from_slice(e.value);
            }
        }
    }
    finish(out, start);
    Ok(())
}

/// Whether anything in a reply needs expanding: a key that is a token or
/// escaped (or a dotted key holding one), a value token, or an `errmsg`
/// naming tokens. Malformed input needs nothing (it is forwarded as it is).
pub fn needed(doc: &[u8]) -> bool {
    needed_in(doc, false).unwrap_or(false)
}

fn needed_in(doc: &[u8], is_array: bool) -> Result<bool, Malformed> {
    for e in elements(doc) {
        let e = e?;
        if !is_array && any_part_reserved(e.key) {
            return Ok(true);
        }
        let found = match e.kind {
            0x03 => needed_in(e.value, false)?,
            0x04 => needed_in(e.value, true)?,
            0x05 => e.value.get(4) == Some(&VALUE_SUBTYPE),
            0x02 if e.key == b"errmsg" => {
                e.value[4..].iter().any(|&b| b == ESCAPE || starts_token(b))
            }
            _ => false,
        };
        if found {
            return Ok(true);
        }
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use bson::{doc, Bson, Document, RawDocumentBuf};
    use proptest::prelude::*;

    use super::*;
    use crate::rewrite::mapper::paths as tokenize;
    use crate::token::Dictionary;

    fn policy() -> Policy {
        Policy::new(6, &["custom".into()], "laconic").with_value_paths(&["artists".into()])
    }

    fn dictionary(doc: &Document, policy: &Policy) -> Dictionary {
        let mut names = Vec::new();
        tokenize::collect_names(doc, policy, &mut names);
        let mut values = Vec::new();
        tokenize::collect_values(doc, policy, &mut values);
        let mut d = Dictionary::default();
        d.add_names(&names);
        d.add_values(&values);
        d
    }

    fn check(doc: &Document) {
        let policy = policy();
        let dict = dictionary(doc, &policy);
        let raw = RawDocumentBuf::from_document(doc).unwrap();
        // Tokenizing raw gives what the owned rewriter gives, byte for byte.
        let mut stored = Vec::new();
        tokenize(raw.as_bytes(), &policy, &dict, &mut stored).unwrap();
        let owned = tokenize::document(doc, &mut Vec::new(), &policy, &dict);
        assert_eq!(stored, bson::to_vec(&owned).unwrap());
        // Expanding raw gives the original back, byte for byte.
        let mut back = Vec::new();
        let mut unknown = Unknown::default();
        expand(&stored, &dict, Strings::Data, &mut unknown, &mut back).unwrap();
        assert_eq!(unknown, Unknown::default());
        assert_eq!(back, raw.as_bytes());
    }

    #[test]
    fn a_profile_round_trips() {
        check(&doc! {
            "_id": 1, "first_name": "Jon", "custom": {"Favorite Player": "x", "k": [1, {"nested_key": 2}]},
            "artists": ["Taylor Swift", "Bad Bunny"], "score": 1.5, "when": bson::DateTime::from_millis(5),
            "\u{1}odd key": "escaped", "re": bson::Regex { pattern: "a".into(), options: "i".into() },
        });
    }

    #[test]
    fn malformed_input_is_an_error_not_a_panic() {
        let policy = policy();
        let dict = Dictionary::default();
        for bad in [
            &[5, 0, 0, 0, 0][..],
            &[12, 0, 0, 0, 2, b'a', 0, 200, 0, 0, 0, 0],
            &[8, 0, 0, 0, 0x42, b'a', 0, 0],
        ] {
            let mut out = Vec::new();
            let _ = tokenize(bad, &policy, &dict, &mut out);
            let _ = expand(
                bad,
                &dict,
                Strings::Data,
                &mut Unknown::default(),
                &mut Vec::new(),
            );
        }
    }

    fn arb_key() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z_]{1,12}",
            "custom",
            "artists",
            "\\PC{1,8}",
            "[\u{1}-\u{1f}][a-z]{0,4}",
        ]
    }

    fn arb_doc() -> impl Strategy<Value = Document> {
        let leaf = prop_oneof![
            any::<i32>().prop_map(Bson::Int32),
            "[a-zA-Z ]{0,10}".prop_map(Bson::String),
            any::<bool>().prop_map(Bson::Boolean),
            Just(Bson::Null),
        ];
        let value = leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
                prop::collection::vec((arb_key(), inner), 0..4)
                    .prop_map(|kv| Bson::Document(kv.into_iter().collect())),
            ]
        });
        prop::collection::vec((arb_key(), value), 0..6).prop_map(|kv| kv.into_iter().collect())
    }

    proptest! {
        #[test]
        fn raw_rewrites_agree_with_the_owned_ones(doc in arb_doc()) {
            check(&doc);
        }
    }
}
