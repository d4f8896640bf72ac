//! The token namespace: which keys are tokens, how token numbers are spelled,
//! and how user keys that would look like tokens are escaped, so that the
//! mapping between stored keys and logical keys is a bijection and expansion
//! never needs to know the shape of a document.
//!
//! A stored key is, by its first byte:
//!
//! | first byte | meaning |
//! | --- | --- |
//! | `0x01`–`0x1E` or `0x7F` (31 values) | a **token**; the rest of the key spells its number |
//! | `0x1F` | an **escaped user key**: the key without this byte is the user's key |
//! | anything else | a user key stored as it is |
//!
//! Token numbers are spelled in a mixed radix: the first byte is one of the
//! 31 token bytes, each following byte one of 93 printable ASCII characters
//! (`0x21`–`0x7E` except `.`). So the first 31 names take **1 byte**, the
//! next 2,883 take **2 bytes**, the next 268,119 take **3 bytes**. Tokens
//! contain no `.`, never start with `$`, are never purely numeric (their
//! first byte is a control character), and are valid UTF-8.
//!
//! User keys beginning with a control character (or holding a dot followed by
//! one), the only ones that collide, gain one byte (`0x1F`) when stored.

use std::borrow::Cow;

/// The escape byte that marks a user key which begins like a token.
pub const ESCAPE: u8 = 0x1F;

const FIRST: [u8; 31] = [
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10,
    0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1E, 0x7F,
];

/// The 93 bytes that follow the first: printable ASCII without `.`.
fn rest_digit(i: u32) -> u8 {
    let b = 0x21 + i as u8; // 0x21..=0x7E, 94 values
    if b >= b'.' {
        b + 1
    } else {
        b
    }
}

fn rest_value(b: u8) -> Option<u32> {
    match b {
        b'.' => None,
        0x21..=0x2D => Some(u32::from(b - 0x21)),
        0x2F..=0x7E => Some(u32::from(b - 0x22)),
        _ => None,
    }
}

const R: u32 = 93;
const F: u32 = FIRST.len() as u32;

fn first_value(b: u8) -> Option<u32> {
    FIRST.iter().position(|&f| f == b).map(|i| i as u32)
}

/// How many bytes the token for `n` takes.
pub fn token_len(n: u32) -> usize {
    let mut len = 1;
    let mut block = u64::from(F);
    let mut n = u64::from(n);
    while n >= block {
        n -= block;
        block *= u64::from(R);
        len += 1;
    }
    len
}

/// The longest token: 31 · 93⁵ exceeds every `u32`.
pub const MAX_TOKEN_LEN: usize = 6;

/// The bytes of the key that stands for token number `n`, without
/// allocating: `(buffer, length)`.
pub fn encode_bytes(n: u32) -> ([u8; MAX_TOKEN_LEN], usize) {
    let len = token_len(n);
    // Offset of n inside its length block.
    let mut n = u64::from(n);
    let mut block = u64::from(F);
    for _ in 1..len {
        n -= block;
        block *= u64::from(R);
    }
    let mut out = [0u8; MAX_TOKEN_LEN];
    for i in (1..len).rev() {
        out[i] = rest_digit((n % u64::from(R)) as u32);
        n /= u64::from(R);
    }
    out[0] = FIRST[n as usize];
    (out, len)
}

/// The key that stands for token number `n`.
pub fn encode(n: u32) -> String {
    let (bytes, len) = encode_bytes(n);
    // Every byte is ASCII.
    String::from_utf8(bytes[..len].to_vec()).unwrap_or_default()
}

/// What a stored key is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored<'a> {
    /// Token number `n`.
    Token(u32),
    /// A user key (escaped keys are given back unescaped).
    User(&'a str),
}

/// Classifies a stored key.
pub fn decode(key: &str) -> Option<Stored<'_>> {
    let bytes = key.as_bytes();
    let Some(&first) = bytes.first() else {
        return Some(Stored::User(key));
    };
    if first == ESCAPE {
        return Some(Stored::User(&key[1..]));
    }
    let Some(f) = first_value(first) else {
        return Some(Stored::User(key));
    };
    // Offset past the shorter blocks, then the value inside this block.
    let mut base = 0u64;
    let mut block = u64::from(F);
    let mut value = u64::from(f);
    for &b in &bytes[1..] {
        base += block;
        block *= u64::from(R);
        value = value * u64::from(R) + u64::from(rest_value(b)?);
    }
    u32::try_from(base + value).ok().map(Stored::Token)
}

/// Whether a stored key is in the token namespace (a token or an escape).
pub fn is_reserved(key: &str) -> bool {
    key.as_bytes()
        .first()
        .is_some_and(|&b| b == ESCAPE || first_value(b).is_some())
}

/// The stored form of a user key that is kept as it is (not tokenized):
/// escaped if it, or any dot-separated part of it, would otherwise read as a
/// token (keys holding dotted paths are expanded part by part).
pub fn escape(key: &str) -> Cow<'_, str> {
    if is_reserved(key) || (key.contains('.') && key.split('.').any(is_reserved)) {
        let mut s = String::with_capacity(key.len() + 1);
        s.push(ESCAPE as char);
        s.push_str(key);
        Cow::Owned(s)
    } else {
        Cow::Borrowed(key)
    }
}

/// The binary subtype of a tokenized value (user-defined range).
pub const VALUE_SUBTYPE: u8 = 0x8C;

/// A value token's bytes: its number as an unsigned LEB128 varint (1 byte
/// below 128, 2 below 16,384, 3 below 2,097,152).
pub fn value_bytes(mut n: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(3);
    loop {
        let b = (n & 0x7F) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return out;
        }
        out.push(b | 0x80);
    }
}

/// The number a value token's bytes spell; `None` if they are not a varint.
pub fn value_number(bytes: &[u8]) -> Option<u32> {
    let mut n: u64 = 0;
    for (i, &b) in bytes.iter().enumerate() {
        if i >= 5 {
            return None;
        }
        n |= u64::from(b & 0x7F) << (7 * i);
        if b & 0x80 == 0 {
            return (i + 1 == bytes.len())
                .then(|| u32::try_from(n).ok())
                .flatten();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn lengths() {
        assert_eq!(token_len(0), 1);
        assert_eq!(token_len(30), 1);
        assert_eq!(token_len(31), 2);
        assert_eq!(token_len(31 + 2883 - 1), 2);
        assert_eq!(token_len(31 + 2883), 3);
        assert_eq!(encode(0), "\u{1}");
        assert_eq!(encode(30), "\u{7f}");
        assert_eq!(encode(31).len(), 2);
    }

    #[test]
    fn tokens_are_safe_keys() {
        for n in (0..20_000).chain([u32::MAX / 3, u32::MAX]) {
            let t = encode(n);
            assert!(
                !t.contains('.') && !t.starts_with('$') && !t.is_empty(),
                "{n}: {t:?}"
            );
            assert!(t.parse::<u64>().is_err(), "{n}: numeric");
            assert_eq!(decode(&t), Some(Stored::Token(n)), "{n}");
        }
    }

    #[test]
    fn user_keys_that_collide_are_escaped() {
        assert_eq!(escape("first_name"), "first_name");
        assert_eq!(decode("first_name"), Some(Stored::User("first_name")));
        let odd = "\u{1}odd";
        let stored = escape(odd);
        assert_eq!(stored, "\u{1f}\u{1}odd");
        assert_eq!(decode(&stored), Some(Stored::User(odd)));
        assert_eq!(decode(&escape("\u{1f}")), Some(Stored::User("\u{1f}")));
        assert_eq!(
            escape("a.\u{2}b"),
            "\u{1f}a.\u{2}b",
            "a part that reads as a token"
        );
    }

    #[test]
    fn value_tokens_are_short_varints() {
        assert_eq!(value_bytes(0), vec![0]);
        assert_eq!(value_bytes(127).len(), 1);
        assert_eq!(value_bytes(128).len(), 2);
        assert_eq!(value_number(&[0x80]), None, "unterminated");
        assert_eq!(value_number(&[1, 2]), None, "trailing bytes");
    }

    proptest! {
        #[test]
        fn value_numbers_round_trip(n in any::<u32>()) {
            prop_assert_eq!(value_number(&value_bytes(n)), Some(n));
        }

        #[test]
        fn every_number_round_trips(n in any::<u32>()) {
            let t = encode(n);
            prop_assert_eq!(decode(&t), Some(Stored::Token(n)));
        }

        #[test]
        fn every_user_key_round_trips(key in "\\PC*|[\\x01-\\x1f\\x7f].*") {
            let stored = escape(&key);
            prop_assert_eq!(decode(&stored), Some(Stored::User(key.as_str())));
        }
    }
}
