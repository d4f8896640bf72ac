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
