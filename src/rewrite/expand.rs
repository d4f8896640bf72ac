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

use crate::token::namespace::{decode, is_reserved, value_number, Stored, ESCAPE, VALUE_SUBTYPE};
use crate::token::Names;

/// Tokens the cache does not know yet: refresh the store, then expand again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unknown {
    pub names: Vec<u32>,
    pub values: Vec<u32>,
}

/// Whether any key of the document needs expanding (a cheap first pass).
pub fn needed(doc: &Document) -> bool {
    doc.iter().any(|(k, v)| key_needed(k) || value_needed(v))
}

fn key_needed(k: &str) -> bool {
    is_reserved(k) || (k.contains('.') && k.split('.').any(is_reserved))
}

fn value_needed(v: &Bson) -> bool {
    match v {
        Bson::Binary(b) => b.subtype == BinarySubtype::UserDefined(VALUE_SUBTYPE),
        Bson::Document(d) => needed(d),
        Bson::Array(a) => a.iter().any(value_needed),
        _ => false,
    }
}

/// The logical form of a stored key.
pub fn key<'k>(k: &'k str, names: &dyn Names, unknown: &mut Vec<u32>) -> Cow<'k, str> {
    if k.as_bytes().first() == Some(&ESCAPE) {
        return Cow::Borrowed(&k[1..]);
    }
    if !k.contains('.') {
        return component(k, names, unknown);
    }
    if !k.split('.').any(is_reserved) {
        return Cow::Borrowed(k);
    }
    Cow::Owned(
        k.split('.')
            .map(|c| component(c, names, unknown))
            .collect::<Vec<_>>()
            .join("."),
    )
}

fn component<'k>(c: &'k str, names: &dyn Names, unknown: &mut Vec<u32>) -> Cow<'k, str> {
    match decode(c) {
        Some(Stored::Token(n)) => match names.name(n) {
            Some(name) => Cow::Owned(name.to_string()),
            None => {
                unknown.push(n);
                Cow::Borrowed(c)
            }
        },
        Some(Stored::User(u)) => Cow::Borrowed(u),
        None => Cow::Borrowed(c),
    }
}

/// Expands every key of a reply; fails with the tokens the cache lacks.
pub fn document(doc: &Document, names: &dyn Names) -> Result<Document, Unknown> {
    let mut unknown = Unknown::default();
    let out = expand_doc(doc, names, &mut unknown);
    if unknown.names.is_empty() && unknown.values.is_empty() {
        Ok(out)
    } else {
        for l in [&mut unknown.names, &mut unknown.values] {
            l.sort_unstable();
            l.dedup();
        }
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

use bson::{RawBsonRef, RawDocument, RawDocumentBuf};

/// Whether anything in a raw reply needs expanding, without allocating.
pub fn needed_raw(doc: &RawDocument) -> bool {
    doc.iter().any(|e| match e {
        Ok(("errmsg", RawBsonRef::String(text))) => text.bytes().any(starts_token),
        Ok((k, v)) => key_needed(k) || raw_value_needed(v),
        Err(_) => false,
    })
}

fn raw_value_needed(v: RawBsonRef<'_>) -> bool {
    match v {
        RawBsonRef::Binary(b) => b.subtype == BinarySubtype::UserDefined(VALUE_SUBTYPE),
        RawBsonRef::Document(d) => needed_raw(d),
        RawBsonRef::Array(a) => RawDocument::from_bytes(a.as_bytes()).is_ok_and(needed_raw),
        _ => false,
    }
}

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
    /// Change events: strings under `removedFields`, `truncatedArrays` and
    /// `disambiguatedPaths` are paths; the rest are documents.
    Events,
    /// Write replies: a validation error's `errInfo` names properties in
    /// strings; everything else is data.
    Writes,
    /// Change events from every database (a cluster-wide stream): each
    /// event is expanded as [`Strings::Events`] with its own database's
    /// dictionary.
    ClusterEvents,
}

impl Strings {
    fn under(self, key: &str) -> Strings {
        match (self, key) {
            (
                Strings::Events | Strings::ClusterEvents,
                "removedFields" | "truncatedArrays" | "disambiguatedPaths",
            )
            | (Strings::Writes, "errInfo") => Strings::Paths,
            (s, _) => s,
        }
    }
}

/// A string value that spells a path, with its tokens expanded.
fn path_string(s: &str, names: &dyn Names, unknown: &mut Vec<u32>) -> Option<String> {
    if !s.bytes().any(starts_token) {
        return None;
    }
    let (prefix, rest) = if let Some(var) = s.strip_prefix("$$") {
        match var.split_once('.') {
            Some((v, rest)) => (format!("$${v}."), rest),
            None => return None,
        }
    } else if let Some(rest) = s.strip_prefix('$') {
        ("$".to_owned(), rest)
    } else {
        (String::new(), s)
    };
    Some(format!("{prefix}{}", key(rest, names, unknown)))
}

/// Expands a raw reply; fails with the tokens the cache lacks.
pub fn raw_document(doc: &RawDocument, names: &dyn Names) -> Result<RawDocumentBuf, Unknown> {
    raw_document_with(doc, names, Strings::Data)
}

/// Expands a raw reply whose string values are read as `strings` says.
pub fn raw_document_with(
    doc: &RawDocument,
    names: &dyn Names,
    strings: Strings,
) -> Result<RawDocumentBuf, Unknown> {
    let mut unknown = Unknown::default();
    let mut out = Vec::with_capacity(doc.as_bytes().len() * 2);
    // Malformed input cannot come from a server's reply that parsed; if it
    // does, the reply is left for the caller to forward unchanged.
    if write_doc(doc, false, names, &mut unknown, &mut out, strings).is_err() {
        return Ok(doc.to_owned());
    }
    if !unknown.names.is_empty() || !unknown.values.is_empty() {
        for l in [&mut unknown.names, &mut unknown.values] {
            l.sort_unstable();
            l.dedup();
        }
        return Err(unknown);
    }
    Ok(RawDocumentBuf::from_bytes(out).unwrap_or_else(|_| doc.to_owned()))
}

fn write_doc(
    doc: &RawDocument,
    is_array: bool,
    names: &dyn Names,
    unknown: &mut Unknown,
    out: &mut Vec<u8>,
    strings: Strings,
) -> Result<(), bson::raw::Error> {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    for element in doc {
        let (k, v) = element?;
        let inner = if is_array { strings } else { strings.under(k) };
        let k = if is_array {
            Cow::Borrowed(k)
        } else {
            key(k, names, &mut unknown.names)
        };
        match v {
            RawBsonRef::Document(d) => {
                element_header(out, 0x03, &k);
                write_doc(d, false, names, unknown, out, inner)?;
            }
            RawBsonRef::Array(a) => {
                element_header(out, 0x04, &k);
                write_doc(
                    RawDocument::from_bytes(a.as_bytes())?,
                    true,
                    names,
                    unknown,
                    out,
                    inner,
                )?;
            }
            RawBsonRef::String(text) if inner == Strings::Paths && k != "errmsg" => {
                match path_string(text, names, &mut unknown.names) {
                    Some(p) => write_scalar(out, &k, RawBsonRef::String(&p)),
                    None => write_scalar(out, &k, v),
                }
            }
            RawBsonRef::String(text) if k == "errmsg" && text.bytes().any(starts_token) => {
                let text = expand_text(text, names);
                write_scalar(out, &k, RawBsonRef::String(&text));
            }
            RawBsonRef::Binary(b) if b.subtype == BinarySubtype::UserDefined(VALUE_SUBTYPE) => {
                match value_number(b.bytes).map(|n| (n, names.value(n))) {
                    Some((_, Some(value))) => {
                        element_header(out, 0x02, &k);
                        out.extend_from_slice(&(value.len() as i32 + 1).to_le_bytes());
                        out.extend_from_slice(value.as_bytes());
                        out.push(0);
                    }
                    other => {
                        if let Some((n, None)) = other {
                            unknown.values.push(n);
                        }
                        write_scalar(out, &k, v);
                    }
                }
            }
            v => write_scalar(out, &k, v),
        }
    }
    out.push(0);
    let len = (out.len() - start) as i32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
    Ok(())
}

fn starts_token(b: u8) -> bool {
    b == ESCAPE || is_reserved(std::str::from_utf8(&[b]).unwrap_or_default())
}

/// Names inside an error message (`dup key: { <token>: … }`), best effort:
/// at each byte that starts a token, the longest run that spells a token the
/// dictionary knows is replaced by its name; an escape byte is dropped.
/// Anything else is left as it is.
pub fn expand_text(text: &str, names: &dyn Names) -> String {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() * 2);
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b == ESCAPE {
            i += 1;
            continue;
        }
        if !starts_token(b) {
            let next = text[i..]
                .char_indices()
                .nth(1)
                .map_or(text.len(), |(j, _)| i + j);
            out.push_str(&text[i..next]);
            i = next;
            continue;
        }
        // Token bytes are ASCII: the run ends at the first byte that cannot follow.
        let mut end = i + 1;
        while end < bytes.len()
            && end - i < 5
            && (0x21..=0x7E).contains(&bytes[end])
            && bytes[end] != b'.'
        {
            end += 1;
        }
        let found = (i + 1..=end).rev().find_map(|e| match decode(&text[i..e]) {
            Some(Stored::Token(n)) => names.name(n).map(|name| (e, name)),
            _ => None,
        });
        match found {
            Some((e, name)) => {
                out.push_str(&name);
                i = e;
            }
            None => {
                out.push(b as char);
                i += 1;
            }
        }
    }
    out
}

fn element_header(out: &mut Vec<u8>, kind: u8, key: &str) {
    out.push(kind);
    out.extend_from_slice(key.as_bytes());
    out.push(0);
}

/// Copies one scalar element: the common types directly, the rest through
/// the bson crate's own writer.
fn write_scalar(out: &mut Vec<u8>, key: &str, v: RawBsonRef<'_>) {
    match v {
        RawBsonRef::Int32(i) => {
            element_header(out, 0x10, key);
            out.extend_from_slice(&i.to_le_bytes());
        }
        RawBsonRef::Int64(i) => {
            element_header(out, 0x12, key);
            out.extend_from_slice(&i.to_le_bytes());
        }
        RawBsonRef::Double(d) => {
            element_header(out, 0x01, key);
            out.extend_from_slice(&d.to_le_bytes());
        }
        RawBsonRef::String(s) => {
            element_header(out, 0x02, key);
            out.extend_from_slice(&(s.len() as i32 + 1).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
            out.push(0);
        }
        RawBsonRef::Boolean(b) => {
            element_header(out, 0x08, key);
            out.push(u8::from(b));
        }
        RawBsonRef::Null => element_header(out, 0x0A, key),
        RawBsonRef::ObjectId(oid) => {
            element_header(out, 0x07, key);
            out.extend_from_slice(&oid.bytes());
        }
        RawBsonRef::DateTime(dt) => {
            element_header(out, 0x09, key);
            out.extend_from_slice(&dt.timestamp_millis().to_le_bytes());
        }
        other => {
            let mut one = RawDocumentBuf::new();
            one.append_ref(key, other);
            let bytes = one.as_bytes();
            // Drop the document's length prefix and final NUL: one element remains.
            out.extend_from_slice(&bytes[4..bytes.len() - 1]);
        }
    }
}
