//! Expanding raw bytes: replies, element by element, without building owned
//! documents. Keys are replaced as the bytes are copied; values are copied
//! as they are (or, for a value token, written as the string it stands for).

use std::borrow::Cow;

use super::{Strings, Unknown};
use crate::rewrite::walker::{
    as_str, begin, descend, elements, finish, header, string_of, string_value, Malformed,
};
use crate::token::namespace::{
    any_part_reserved, starts_token, value_number, ESCAPE, VALUE_SUBTYPE,
};
use crate::token::Names;

/// Expands a reply: every key, value tokens, and strings as `strings` says.
pub fn expand(
    doc: &[u8],
    names: &dyn Names,
    strings: Strings,
    unknown: &mut Unknown,
    out: &mut Vec<u8>,
) -> Result<(), Malformed> {
    Expander { names, unknown }.doc(doc, false, strings, out, 0)
}

/// One dictionary, and what it lacked.
struct Expander<'a> {
    names: &'a dyn Names,
    unknown: &'a mut Unknown,
}

impl Expander<'_> {
    fn doc(
        &mut self,
        doc: &[u8],
        is_array: bool,
        strings: Strings,
        out: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), Malformed> {
        let names = self.names;
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
                } else if let Some(name) = starts_token(first).then(|| names.name(e.key)).flatten()
                {
                    // The other common case: a whole key that is a known token.
                    (Cow::Borrowed(name.as_bytes()), strings.under(name))
                } else if plain {
                    let k = as_str(e.key)?;
                    (Cow::Borrowed(e.key), strings.under(k))
                } else {
                    let k = as_str(e.key)?;
                    let logical = super::key(k, names, &mut self.unknown.names);
                    let inner = strings.under(&logical);
                    let bytes = match logical {
                        Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
                        Cow::Owned(s) => Cow::Owned(s.into_bytes()),
                    };
                    (bytes, inner)
                }
            };
            match e.kind {
                0x03 | 0x04 => {
                    header(out, e.kind, &key);
                    self.doc(e.value, e.kind == 0x04, inner, out, descend(depth)?)?;
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
                                self.unknown.values.push(n);
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
                        Some(super::expand_text(text, names))
                    } else {
                        super::path_string(text, names, &mut self.unknown.names)
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
}

/// Whether anything in a reply needs expanding: a key that is a token or
/// escaped (or a dotted key holding one), a value token, or an `errmsg`
/// naming tokens. Malformed input needs nothing (it is forwarded as it is).
pub fn needed(doc: &[u8]) -> bool {
    needed_in(doc, false, 0).unwrap_or(false)
}

fn needed_in(doc: &[u8], is_array: bool, depth: usize) -> Result<bool, Malformed> {
    for e in elements(doc) {
        let e = e?;
        if !is_array && any_part_reserved(e.key) {
            return Ok(true);
        }
        let found = match e.kind {
            0x03 | 0x04 => needed_in(e.value, e.kind == 0x04, descend(depth)?)?,
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
