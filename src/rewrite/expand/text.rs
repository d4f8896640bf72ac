//! Names and value tokens inside a server's error text, which the server
//! wrote from stored keys, values and the paths the proxy sent: read where
//! a key starts, and in a quoted string only as a path's tokens (in a
//! printed document, only in a field path's).

use crate::token::namespace::{starts_token, token_len, value_number, Token, ESCAPE};
use crate::token::Names;

/// How a server's error text prints a value token (binary subtype 140,
/// [`VALUE_SUBTYPE`](crate::token::namespace::VALUE_SUBTYPE)): `BinData(140, <hex>)`,
/// as MongoDB does, or with the hex in quotes, `BinData(140, "<hex>")`, as
/// SecantusDB's Rust server does.
const VALUE_IN_TEXT: &[u8] = b"BinData(140, ";

/// How a server begins the error of a `$rename` whose source and target
/// clash (`… must differ: <source>: "<target>"`, `… must not be on the same
/// path: …`): the first string it prints in quotes after this is the
/// target, a path the proxy wrote, not a value.
const RENAME_CLASH: &[u8] = b"The source and target field for $rename must ";

/// Whether a text may name a field or hold a value token: what
/// [`expand_text`] reads.
pub(super) fn text_needs_expanding(text: &[u8]) -> bool {
    text.iter().any(|&b| b == ESCAPE || starts_token(b))
        || memchr::memmem::find(text, VALUE_IN_TEXT).is_some()
}

/// The value token printed at the start of `text`, if the dictionary
/// knows it: how many bytes it takes, and its string.
fn value_in_text<'n, N: Names + ?Sized>(text: &[u8], names: &'n N) -> Option<(usize, &'n str)> {
    let rest = text.strip_prefix(VALUE_IN_TEXT)?;
    let printed = &rest[..rest.iter().position(|&b| b == b')')?];
    let hex = match printed.strip_prefix(b"\"") {
        Some(quoted) => quoted.strip_suffix(b"\"")?,
        None => printed,
    };
    if hex.len() % 2 != 0 || hex.len() > 10 {
        return None;
    }
    let mut bytes = [0u8; 5];
    for (i, pair) in hex.chunks(2).enumerate() {
        let digits = std::str::from_utf8(pair).ok()?;
        bytes[i] = u8::from_str_radix(digits, 16).ok()?;
    }
    let value = names.value(value_number(&bytes[..hex.len() / 2])?)?;
    Some((VALUE_IN_TEXT.len() + printed.len() + 1, value))
}

/// The path printed in quotes at the start of `rest` (after the opening
/// quote), each part read as a path's: a token as its name, an escaped key
/// without its escape; and how many bytes it takes there. A part that is a
/// token is taken whole, a quote of its own included (a server that prints
/// quotes bare prints such a token so). `None` where the quotes do not
/// close, or hold an escaped quote (a server printing `\"`): the text is
/// then read as any other.
fn path_in_quotes<N: Names + ?Sized>(rest: &str, names: &N) -> Option<(usize, String)> {
    let bytes = rest.as_bytes();
    let mut end = 0;
    loop {
        if bytes.get(end).copied().is_some_and(starts_token) {
            end += token_len(&bytes[end..]).unwrap_or(1);
        }
        end += memchr::memchr2(b'.', b'"', bytes.get(end..)?)?;
        if bytes[end] == b'"' {
            break;
        }
        end += 1;
    }
    let path = rest.get(..end)?;
    if path.contains('\\') {
        return None;
    }
    Some((
        end,
        super::path_key(path, names, &mut Vec::new()).into_owned(),
    ))
}

/// A string as the server prints a string value in a text: in double
/// quotes, as it is, cut after 150 bytes when 160 or longer.
fn print_string(s: &str, out: &mut String) {
    out.push('"');
    if s.len() < 160 {
        out.push_str(s);
        out.push('"');
    } else {
        let cut = (0..=150)
            .rev()
            .find(|&i| s.is_char_boundary(i))
            .unwrap_or(0);
        out.push_str(&s[..cut]);
        out.push_str("...\"");
    }
}

/// Names inside an error message (`dup key: { <token>: … }`), best effort:
/// a token is found whole by its first byte (tokens delimit themselves) and
/// replaced by its name when the dictionary knows it, and a value token
/// (`BinData(140, <hex>)`, the hex bare or in quotes) by its string in quotes. Anything else, unknown
/// tokens included, is left as it is: a text never names a field it does
/// not name.
///
/// Inside double quotes the server prints a string value: the user's, or a
/// path the proxy wrote. A string is read only as a field path (`"$<token>…"`,
/// an expression's), and, outside a printed document (`{ a: "…" }`), as
/// the target of a `$rename` whose source and target clash, which the
/// server prints after saying so: any other is a value (`resulting value
/// was: "…"`, `element a: "…"`), and a value's own control bytes are left
/// as they are, even one that spells a whole token the dictionary knows.
/// (Until this build such a value, printed outside a document, read as
/// that token's name.) In a path, a token is read but not past the closing
/// quote, and an escape byte stays.
///
/// A key starts a path component, so a token or an escape is read only
/// where a word starts: not right after a letter, a digit, `_`, a non-ASCII
/// byte or a control byte of the user's own (white space aside). A control
/// byte inside a key left as it is stays the user's. An escape byte where a
/// word starts is dropped, and the control byte after it is the first of
/// the user's key, not a token. (A key kept whole behind one escape,
/// `a.<control>…`, reads in a text as a path would: its part after the dot
/// is read as a path's would be.)
///
/// A `\` inside quotes escapes the byte after it, as the server prints a
/// quote that is part of a string (`\"`): a value cannot close the quotes
/// it is printed in, and have what follows read as keys.
pub fn expand_text<N: Names + ?Sized>(text: &str, names: &N) -> String {
    expand_text_within(text, names, usize::MAX).unwrap_or_default()
}

/// [`expand_text`], or `None` once the text would be longer than `most`
/// bytes: a text echoes values, and each token read in one may stand for
/// a long name, so its expansion is bounded by the room its reply has.
pub fn expand_text_within<N: Names + ?Sized>(text: &str, names: &N, most: usize) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len().min(most));
    let mut plain = 0;
    let mut i = 0;
    // Whether `bytes[i - 1]` belongs to a word: no key starts at `i` then.
    let mut in_word = false;
    // Whether `i` is inside double quotes, where the server prints a string.
    let mut quoted = false;
    // How many printed documents `i` is in (braces outside quotes).
    let mut depth = 0usize;
    // Whether tokens are read in the quoted string `i` is in.
    let mut read_quoted = true;
    // Where the target of a `$rename` that clashes may be printed from.
    let mut rename_target =
        memchr::memmem::find(bytes, RENAME_CLASH).map(|at| at + RENAME_CLASH.len());
    while i < bytes.len() {
        let b = bytes[i];
        if quoted && b == b'\\' {
            i += 2;
            in_word = true;
            continue;
        }
        if b == b'"' && !quoted && depth == 0 && rename_target.is_some_and(|at| i >= at) {
            rename_target = None;
            if let Some((len, target)) = path_in_quotes(&text[i + 1..], names) {
                if out.len() + (i - plain) + target.len() + 2 > most {
                    return None;
                }
                out.push_str(&text[plain..i]);
                out.push('"');
                out.push_str(&target);
                out.push('"');
                i += len + 2;
                plain = i;
                in_word = false;
                continue;
            }
        }
        if b == b'"' {
            quoted = !quoted;
            read_quoted = bytes.get(i + 1) == Some(&b'$');
        } else if !quoted && (b == b'{' || b == b'}') {
            depth = if b == b'{' {
                depth + 1
            } else {
                depth.saturating_sub(1)
            };
        } else if !in_word && !quoted {
            if b == ESCAPE {
                out.push_str(&text[plain..i]);
                plain = i + 1;
                // The user's own first byte, kept as it is.
                i += 2;
                in_word = true;
                continue;
            }
            if b == VALUE_IN_TEXT[0] {
                if let Some((len, value)) = value_in_text(&bytes[i..], names) {
                    out.push_str(&text[plain..i]);
                    print_string(value, &mut out);
                    if out.len() > most {
                        return None;
                    }
                    i += len;
                    plain = i;
                    in_word = true;
                    continue;
                }
            }
        }
        if !in_word && starts_token(b) && (!quoted || read_quoted) {
            // Within quotes, a token may end in a `"` of its own only where
            // the string goes on as a path (a dot, then more than white
            // space: not the end of a sentence, `"…". Type`) or ends right
            // after it; otherwise it stops before the closing quote.
            let len = match quoted {
                false => token_len(&bytes[i..]),
                true => token_len(&bytes[i..])
                    .filter(|&len| match bytes.get(i + len) {
                        Some(b'"') => true,
                        Some(b'.') => bytes
                            .get(i + len + 1)
                            .is_some_and(|c| !c.is_ascii_whitespace()),
                        _ => false,
                    })
                    .or_else(|| {
                        let end = memchr::memchr(b'"', &bytes[i..]).map_or(bytes.len(), |n| i + n);
                        token_len(&bytes[i..end])
                    }),
            };
            let found = len.and_then(|len| {
                Some((
                    len,
                    names.name(Token::from_bytes(&bytes[i..i + len])?.as_bytes())?,
                ))
            });
            if let Some((len, name)) = found {
                if out.len() + (i - plain) + name.len() > most {
                    return None;
                }
                out.push_str(&text[plain..i]);
                out.push_str(name);
                i += len;
                plain = i;
                in_word = true;
                continue;
            }
        }
        in_word = b.is_ascii_alphanumeric()
            || b == b'_'
            || b >= 0x80
            || (b.is_ascii_control() && !b.is_ascii_whitespace());
        i += 1;
    }
    if out.len() + (text.len() - plain) > most {
        return None;
    }
    out.push_str(&text[plain..]);
    Some(out)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_value_token_is_printed_with_its_subtype() {
        let printed = format!("BinData({}, ", crate::token::namespace::VALUE_SUBTYPE);
        assert_eq!(super::VALUE_IN_TEXT, printed.as_bytes());
    }
}
