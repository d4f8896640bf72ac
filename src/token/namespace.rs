//! The token namespace (format 2): which stored keys are tokens, how a token
//! is spelled, and how user keys that would look like tokens are escaped, so
//! that the mapping between stored keys and logical keys is a bijection and
//! expansion never needs to know the shape of a document.
//!
//! A stored key is, by its first byte:
//!
//! | first byte | meaning |
//! | --- | --- |
//! | `0x01`–`0x1E` or `0x7F` (31 values) | a **token** |
//! | `0x1F` | an **escaped user key**: the key without this byte is the user's key |
//! | anything else | a user key stored as it is |
//!
//! **Tokens sort like their names.** Every position of a token has an
//! ordered alphabet whose bytes alternate between *continuation* and
//! *final* digits (`c0 < f1 < c1 < f2 < … < cN`): the first byte comes from
//! the 31 control bytes above, every later byte from the 93 printable ASCII
//! bytes other than `.`. A token is any number of continuation bytes and
//! then one final byte. Read as a fraction, such a string is a point in
//! (0, 1) with no trailing zero, so between any two tokens there is always
//! another, and plain byte order of tokens is the order of those points.
//! The name store allocates each new name a token between the tokens of its
//! neighbouring names ([`crate::token::order`]), so among the tokenized names
//! of one dictionary, byte order of tokens equals byte order of names: the
//! server orders the fields an update creates, and compares sub-documents,
//! as it would with the names.
//!
//! **Tokens are self-delimiting**: a token ends at its first final byte, so
//! a token inside a text (an error message) is found without knowing what
//! follows it. 15 tokens take 1 byte, 736 more take 2, 34,592 more 3.
//!
//! Tokens contain no `.`, never start with `$`, are never numeric (their
//! first byte is a control character) and are ASCII. User keys beginning
//! with a control character (or holding a dot followed by one), the only
//! ones that collide, gain one byte (`0x1F`) when stored.

use std::borrow::Cow;
use std::fmt;

/// The escape byte that marks a user key which begins like a token.
pub const ESCAPE: u8 = 0x1F;

/// The longest token the store allocates.
pub const MAX_TOKEN_LEN: usize = 24;

/// The first byte of every token, in order: `c0 f1 c1 … f15 c15`.
const FIRST: [u8; 31] = [
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x0E, 0x0F, 0x10,
    0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1A, 0x1B, 0x1C, 0x1D, 0x1E, 0x7F,
];

/// How many bytes the alphabet of a position holds.
pub(crate) fn alphabet_len(pos: usize) -> usize {
    if pos == 0 {
        FIRST.len()
    } else {
        93
    }
}

/// The byte of alphabet index `i` at position `pos`.
pub(crate) fn byte_at(pos: usize, i: usize) -> u8 {
    if pos == 0 {
        FIRST[i]
    } else {
        // 0x21..=0x7E without `.`.
        let b = 0x21 + i as u8;
        if b >= b'.' {
            b + 1
        } else {
            b
        }
    }
}

/// The alphabet index of byte `b` at position `pos`.
pub(crate) fn index_of(pos: usize, b: u8) -> Option<usize> {
    if pos == 0 {
        return match b {
            0x01..=0x1E => Some(usize::from(b - 1)),
            0x7F => Some(30),
            _ => None,
        };
    }
    match b {
        0x21..=0x2D => Some(usize::from(b - 0x21)),
        0x2F..=0x7E => Some(usize::from(b - 0x22)),
        _ => None,
    }
}

/// Odd alphabet indexes are final digits, even ones continuation digits.
pub(crate) fn is_final(i: usize) -> bool {
    i % 2 == 1
}

/// Whether `b` begins a token: the one test for "a token starts here",
/// for keys and for text alike.
#[inline]
pub fn starts_token(b: u8) -> bool {
    matches!(b, 0x01..=0x1E | 0x7F)
}

/// Whether a stored key beginning with `b` is in the token namespace (a
/// token, or an escaped user key).
#[inline]
pub fn in_namespace(b: u8) -> bool {
    starts_token(b) || b == ESCAPE
}

/// The length of the token at the start of `bytes`, if one is spelled
/// there: continuation bytes up to and including the first final byte.
pub fn token_len(bytes: &[u8]) -> Option<usize> {
    for (pos, &b) in bytes.iter().enumerate().take(MAX_TOKEN_LEN) {
        let i = index_of(pos, b)?;
        if is_final(i) {
            return Some(pos + 1);
        }
    }
    None
}

/// One token: a short byte string kept inline (no allocation).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Token {
    len: u8,
    bytes: [u8; MAX_TOKEN_LEN],
}

impl Token {
    /// The token spelled by exactly `bytes`, if they spell one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Token> {
        (token_len(bytes)? == bytes.len()).then(|| Token::new_unchecked(bytes))
    }

    pub(crate) fn new_unchecked(bytes: &[u8]) -> Token {
        let mut t = Token {
            len: bytes.len() as u8,
            bytes: [0; MAX_TOKEN_LEN],
        };
        t.bytes[..bytes.len()].copy_from_slice(bytes);
        t
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The token as a key (tokens are ASCII).
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(self.as_bytes()).unwrap_or_default()
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }
}

impl PartialOrd for Token {
    fn partial_cmp(&self, other: &Token) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Token {
    fn cmp(&self, other: &Token) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Token({:?})", self.as_str())
    }
}

/// Hashed as its bytes, so that maps keyed by tokens are looked up by slices.
impl std::hash::Hash for Token {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state);
    }
}

impl std::borrow::Borrow<[u8]> for Token {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

/// What a stored key is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stored<'a> {
    /// A token.
    Token(Token),
    /// A user key (escaped keys are given back unescaped).
    User(&'a str),
    /// A key that begins like a token but spells none: never written by a
    /// proxy (a key stored before the proxy, or written around it).
    Malformed,
}

/// Classifies a stored key.
pub fn decode(key: &str) -> Stored<'_> {
    let bytes = key.as_bytes();
    match bytes.first() {
        Some(&ESCAPE) => Stored::User(&key[1..]),
        Some(&b) if starts_token(b) => match Token::from_bytes(bytes) {
            Some(t) => Stored::Token(t),
            None => Stored::Malformed,
        },
        _ => Stored::User(key),
    }
}

/// Whether a stored key is in the token namespace (a token or an escape).
pub fn is_reserved(key: &str) -> bool {
    key.as_bytes().first().is_some_and(|&b| in_namespace(b))
}

/// Whether a key, or any dot-separated part of it, is in the namespace.
pub fn any_part_reserved(key: &[u8]) -> bool {
    let mut part = key;
    loop {
        if part.first().is_some_and(|&b| in_namespace(b)) {
            return true;
        }
        // Keys are short: a plain scan beats setting up `memchr`.
        match part.iter().position(|&b| b == b'.') {
            Some(dot) => part = &part[dot + 1..],
            None => return false,
        }
    }
}

/// The stored form of a user key that is kept as it is (not tokenized):
/// escaped if it, or any dot-separated part of it, would otherwise read as a
/// token (keys holding dotted paths are expanded part by part).
pub fn escape(key: &str) -> Cow<'_, str> {
    if any_part_reserved(key.as_bytes()) {
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
pub fn value_bytes(mut n: u32) -> ([u8; 5], usize) {
    let mut out = [0u8; 5];
    let mut len = 0;
    loop {
        let b = (n & 0x7F) as u8;
        n >>= 7;
        if n == 0 {
            out[len] = b;
            return (out, len + 1);
        }
        out[len] = b | 0x80;
        len += 1;
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

/// Format 1 (before order-preserving tokens): a token was a number, its
/// first byte one of the 31 control bytes and each further byte one of the
/// 93 printable bytes, in a mixed radix. Kept only so that `laconic migrate
/// --upgrade` can read data written in that format.
pub mod v1 {
    use super::{index_of, FIRST};

    /// The number a format-1 key spells, if it is a format-1 token.
    pub fn decode(key: &str) -> Option<u32> {
        let bytes = key.as_bytes();
        let first = *bytes.first()?;
        let f = FIRST.iter().position(|&b| b == first)? as u64;
        let (mut base, mut block, mut value) = (0u64, FIRST.len() as u64, f);
        for &b in &bytes[1..] {
            base += block;
            block *= 93;
            value = value * 93 + index_of(1, b)? as u64;
        }
        u32::try_from(base + value).ok()
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn every_dotted_part_is_read_for_the_namespace() {
        let old = |key: &[u8]| {
            key.iter()
                .enumerate()
                .any(|(i, &b)| (i == 0 || key[i - 1] == b'.') && in_namespace(b))
        };
        for key in [
            &b""[..],
            b"a",
            b"\x01a",
            b"a.\x01",
            b"a..\x1f",
            b"a.b",
            b".",
            b"a.",
            b"\x7f",
            b"a\x01.b",
            b"a.b.c.\x1e",
        ] {
            assert_eq!(any_part_reserved(key), old(key), "{key:?}");
        }
    }

    #[test]
    fn alphabets_alternate_and_increase() {
        for pos in [0, 1] {
            let bytes: Vec<u8> = (0..alphabet_len(pos)).map(|i| byte_at(pos, i)).collect();
            assert!(bytes.windows(2).all(|w| w[0] < w[1]), "{pos}");
            assert!(!is_final(0) && !is_final(alphabet_len(pos) - 1));
            for (i, &b) in bytes.iter().enumerate() {
                assert_eq!(index_of(pos, b), Some(i));
            }
        }
        assert!(!(0..93).any(|i| byte_at(1, i) == b'.'));
    }

    #[test]
    fn tokens_delimit_themselves() {
        // f1 alone; c0 then f1; a quote after a one-byte token is not part of it.
        assert_eq!(token_len(b"\x02'"), Some(1));
        assert_eq!(token_len(b"\x01\"x"), Some(2));
        assert_eq!(token_len(b"\x01\x01"), None);
        assert_eq!(token_len(b"\x01."), None);
        assert_eq!(decode("\u{1}"), Stored::Malformed);
        assert!(matches!(decode("\u{2}"), Stored::Token(_)));
    }

    #[test]
    fn user_keys_that_collide_are_escaped() {
        assert_eq!(escape("first_name"), "first_name");
        assert_eq!(decode("first_name"), Stored::User("first_name"));
        let odd = "\u{1}odd";
        let stored = escape(odd);
        assert_eq!(stored, "\u{1f}\u{1}odd");
        assert_eq!(decode(&stored), Stored::User(odd));
        assert_eq!(decode(&escape("\u{1f}")), Stored::User("\u{1f}"));
        assert_eq!(escape("a.\u{2}b"), "\u{1f}a.\u{2}b");
    }

    #[test]
    fn format_1_tokens_still_decode() {
        assert_eq!(v1::decode("\u{1}"), Some(0));
        assert_eq!(v1::decode("\u{7f}"), Some(30));
        assert_eq!(v1::decode("\u{1}!"), Some(31));
        assert_eq!(v1::decode("name"), None);
    }

    #[test]
    fn value_tokens_are_short_varints() {
        assert_eq!(value_bytes(0), ([0, 0, 0, 0, 0], 1));
        assert_eq!(value_bytes(127).1, 1);
        assert_eq!(value_bytes(128).1, 2);
        assert_eq!(value_number(&[0x80]), None, "unterminated");
        assert_eq!(value_number(&[1, 2]), None, "trailing bytes");
    }

    proptest! {
        #[test]
        fn value_numbers_round_trip(n in any::<u32>()) {
            let (b, len) = value_bytes(n);
            prop_assert_eq!(value_number(&b[..len]), Some(n));
        }

        #[test]
        fn every_user_key_round_trips(key in "\\PC*|[\\x01-\\x1f\\x7f].*") {
            let stored = escape(&key);
            prop_assert_eq!(decode(&stored), Stored::User(key.as_str()));
        }

        #[test]
        fn a_token_in_text_ends_where_it_ends(len in 1usize..6, seed in any::<u64>(), tail in "\\PC{0,8}") {
            // Any well-formed token followed by any text is found whole.
            let mut bytes = Vec::new();
            let mut s = seed;
            for pos in 0..len {
                let n = alphabet_len(pos);
                let mut i = (s % n as u64) as usize;
                s /= 7;
                let want_final = pos + 1 == len;
                if is_final(i) != want_final { i = if i + 1 < n { i + 1 } else { i - 1 }; }
                bytes.push(byte_at(pos, i));
            }
            let token = Token::from_bytes(&bytes).unwrap();
            let mut text = bytes.clone();
            text.extend_from_slice(tail.as_bytes());
            prop_assert_eq!(token_len(&text), Some(token.len()));
        }
    }
}
