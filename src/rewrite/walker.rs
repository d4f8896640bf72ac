//! The one raw BSON walker: a document's elements, one level at a time,
//! as slices of the bytes they came in (nothing is copied or parsed beyond
//! what a rewrite asks for), and the few writer helpers the rewrites share.
//!
//! A BSON element is a type byte, a NUL-terminated key and a value whose
//! length its type gives. Every walk that goes down into documents goes
//! through [`descend`], so no input can be deeper than [`MAX_DEPTH`] levels:
//! MongoDB's own limit for any object (`maxBSONDepth`). A request deeper
//! than that gets the server's error for it (code 15, `Overflow`); nothing
//! recurses without bound, whoever sends it.

/// A key as a rewrite writes it, when that is not the key as it came
/// (`None`: the key stays, and its bytes stay in the run being copied).
pub type Renamed<'k> = Option<std::borrow::Cow<'k, [u8]>>;

/// How deeply documents may nest below the outermost one.
pub const MAX_DEPTH: usize = 200;

/// Raw bytes a walk cannot go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Malformed {
    #[error("malformed BSON: {0}")]
    Invalid(&'static str),
    /// Nested deeper than [`MAX_DEPTH`].
    #[error("BSONObj exceeds maximum nested object depth")]
    TooDeep,
    /// A binary of the subtype a tokenized database keeps value tokens in,
    /// in a request to one: stored, it would read back as a value.
    #[error(
        "binary subtype {:#04x} is reserved for value tokens",
        crate::token::namespace::VALUE_SUBTYPE
    )]
    Reserved,
}

/// One element: its type, key and value bytes.
#[derive(Clone, Copy, Debug)]
pub struct Element<'a> {
    pub kind: u8,
    pub key: &'a [u8],
    pub value: &'a [u8],
    /// The whole element as it came: type byte, key, NUL and value.
    pub raw: &'a [u8],
    /// Where the element starts in its document.
    pub at: usize,
}

impl<'a> Element<'a> {
    /// Where the element's value starts in its document.
    #[inline]
    pub fn value_at(&self) -> usize {
        self.at + self.raw.len() - self.value.len()
    }

    /// Where the element ends in its document.
    #[inline]
    pub fn end(&self) -> usize {
        self.at + self.raw.len()
    }

    /// The element's key, if it is UTF-8.
    pub fn name(&self) -> Option<&'a str> {
        std::str::from_utf8(self.key).ok()
    }

    /// The string the element holds, if it holds one.
    pub fn str(&self) -> Option<&'a str> {
        (self.kind == 0x02).then(|| string_of(self.value).ok())?
    }

    /// The embedded document the element holds, if it holds one.
    pub fn document(&self) -> Option<&'a bson::RawDocument> {
        (self.kind == 0x03).then(|| bson::RawDocument::from_bytes(self.value).ok())?
    }

    /// The boolean the element holds, if it holds one.
    pub fn bool(&self) -> Option<bool> {
        (self.kind == 0x08).then(|| self.value[0] != 0)
    }

    /// The 64-bit integer the element holds, if it holds one.
    pub fn i64(&self) -> Option<i64> {
        match self.kind {
            0x12 => Some(i64::from_le_bytes(self.value.try_into().ok()?)),
            _ => None,
        }
    }

    /// The number the element holds (a double, an int32 or an int64), as
    /// an `f64`.
    pub fn number(&self) -> Option<f64> {
        let word = |n: usize| self.value.get(..n);
        match self.kind {
            0x01 => Some(f64::from_le_bytes(word(8)?.try_into().ok()?)),
            0x10 => Some(i32::from_le_bytes(word(4)?.try_into().ok()?).into()),
            0x12 => Some(i64::from_le_bytes(word(8)?.try_into().ok()?) as f64),
            _ => None,
        }
    }

    /// The subtype and bytes of the binary the element holds, if it holds one.
    pub fn binary(&self) -> Option<(u8, &'a [u8])> {
        match self.kind {
            0x05 => Some((*self.value.get(4)?, self.value.get(5..)?)),
            _ => None,
        }
    }
}

/// Top-level fields of a raw document, found with the walker: keys are
/// compared as bytes, and no value is read but the one asked for. This is
/// what the per-command path uses to read a command or a reply (the bson
/// crate's getters check every element they pass). On a document the
/// walker cannot go through, a field after the fault is not found.
pub trait Fields {
    /// The first element named `key`.
    fn field(&self, key: &str) -> Option<Element<'_>>;

    /// The first element: a command's name and argument.
    fn first(&self) -> Option<Element<'_>>;

    /// The string `key` holds, if it holds one.
    fn str_field(&self, key: &str) -> Option<&str> {
        self.field(key)?.str()
    }

    /// The document `key` holds, if it holds one.
    fn doc_field(&self, key: &str) -> Option<&bson::RawDocument> {
        self.field(key)?.document()
    }
}

impl Fields for bson::RawDocument {
    fn field(&self, key: &str) -> Option<Element<'_>> {
        elements(self.as_bytes())
            .map_while(Result::ok)
            .find(|e| e.key == key.as_bytes())
    }

    fn first(&self) -> Option<Element<'_>> {
        elements(self.as_bytes()).next()?.ok()
    }
}

/// The elements of one document (or array), given with its length prefix.
pub struct Elements<'a> {
    doc: &'a [u8],
    at: usize,
    end: usize,
}

/// Walks the elements of `doc`.
pub fn elements(doc: &[u8]) -> Elements<'_> {
    Elements {
        doc,
        at: 4,
        end: doc.len().saturating_sub(1),
    }
}

impl<'a> Iterator for Elements<'a> {
    type Item = Result<Element<'a>, Malformed>;

    // Inlined into every walk in a release build: a tenth fewer
    // instructions per element. Not in a debug build, whose unoptimized
    // frames would then be large enough for the rewriters' recursion to
    // MAX_DEPTH to overflow a 2 MiB worker stack (see the stack test below).
    #[cfg_attr(not(debug_assertions), inline(always))]
    #[cfg_attr(debug_assertions, inline)]
    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.end {
            return None;
        }
        let doc = self.doc;
        let kind = doc[self.at];
        let key_start = self.at + 1;
        // A key of one byte (a token, an array index below 10) is the
        // common case in stored documents: tested alone, it keeps the word
        // search off the chain from one element to the next.
        let nul = match &doc[key_start..self.end] {
            [k, 0, ..] if *k != 0 => 1,
            rest => match nul_at(rest) {
                Some(nul) => nul,
                None => {
                    self.at = self.end;
                    return Some(Err(Malformed::Invalid("a key without its NUL")));
                }
            },
        };
        let key = &doc[key_start..key_start + nul];
        let value_start = key_start + nul + 1;
        match value_len(kind, &doc[value_start..self.end]) {
            Ok(len) => {
                let start = self.at;
                self.at = value_start + len;
                Some(Ok(Element {
                    kind,
                    key,
                    value: &doc[value_start..self.at],
                    raw: &doc[start..self.at],
                    at: start,
                }))
            }
            Err(e) => {
                self.at = self.end;
                Some(Err(e))
            }
        }
    }
}

impl<'a> Elements<'a> {
    /// Where the next element starts in the document.
    pub fn position(&self) -> usize {
        self.at
    }

    /// The whole document (or array) walked, and where its final NUL is.
    #[inline(always)]
    pub fn bytes(&self) -> (&'a [u8], usize) {
        (self.doc, self.end)
    }

    /// The elements from `at`, an element's start that an outside walk
    /// of the same bytes reached.
    #[inline(always)]
    pub fn resumed(&self, at: usize) -> Elements<'a> {
        Elements {
            doc: self.doc,
            at: at.min(self.end),
            end: self.end,
        }
    }

    /// The next element, if it is a document that can be read: its header
    /// (type, key, NUL), its value, and the elements after it. `None`: there
    /// is none, it is not a document, or it cannot be read (as the iterator
    /// would say). Fewer tests than [`Iterator::next`], for the documents
    /// of a cursor's batch.
    #[inline(always)]
    pub fn document(&self) -> Option<(&'a [u8], &'a [u8], Elements<'a>)> {
        let (doc, at, end) = (self.doc, self.at, self.end);
        if at >= end || doc[at] != 0x03 {
            return None;
        }
        let value_at = at + 2 + nul_at(&doc[at + 1..end])?;
        let len = i32::from_le_bytes(*doc.get(value_at..end)?.first_chunk::<4>()?);
        let value_end = value_at + usize::try_from(len).ok().filter(|&n| n >= 5)?;
        if value_end > end {
            return None;
        }
        let next = Elements {
            doc,
            at: value_end,
            end,
        };
        Some((&doc[at..value_at], &doc[value_at..value_end], next))
    }
}

/// The position of the first NUL: keys are short, so eight bytes at a time
/// for the first 32 (one word test each), then `memchr`.
#[inline(always)]
pub(crate) fn nul_at(b: &[u8]) -> Option<usize> {
    const LOW: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let mut at = 0;
    while at < 32 {
        let Some(Ok(word)) = b.get(at..at + 8).map(<[u8; 8]>::try_from) else {
            break;
        };
        let w = u64::from_le_bytes(word);
        // The lowest set bit marks the first zero byte exactly.
        let zero = w.wrapping_sub(LOW) & !w & HIGH;
        if zero != 0 {
            return Some(at + (zero.trailing_zeros() / 8) as usize);
        }
        at += 8;
    }
    memchr::memchr(0, b.get(at..)?).map(|n| at + n)
}

/// The depth below `depth`, unless that is too deep: every walk that goes
/// down into a document or an array asks this first.
#[inline]
pub fn descend(depth: usize) -> Result<usize, Malformed> {
    if depth >= MAX_DEPTH {
        Err(Malformed::TooDeep)
    } else {
        Ok(depth + 1)
    }
}

#[inline(always)]
fn le_i32(b: &[u8]) -> Result<usize, Malformed> {
    let bytes: [u8; 4] = b
        .get(..4)
        .and_then(|s| s.try_into().ok())
        .ok_or(Malformed::Invalid("a truncated length"))?;
    usize::try_from(i32::from_le_bytes(bytes)).map_err(|_| Malformed::Invalid("a negative length"))
}

fn cstring_len(b: &[u8]) -> Result<usize, Malformed> {
    memchr::memchr(0, b)
        .map(|n| n + 1)
        .ok_or(Malformed::Invalid("a string without its NUL"))
}

/// How long a value of each type is, for [`value_len`]: a fixed size,
/// plus the length word the value starts with where [`PREFIXED`] is set.
/// [`OTHER`]: a regular expression (two C strings), or no type at all.
static LENGTHS: [u8; 256] = {
    let mut t = [OTHER; 256];
    let mut kind = 0;
    while kind < 256 {
        t[kind] = match kind {
            0x01 | 0x09 | 0x11 | 0x12 => 8,
            0x02 | 0x0D | 0x0E => PREFIXED | 4,
            0x03 | 0x04 | 0x0F => PREFIXED,
            0x05 => PREFIXED | 5,
            0x06 | 0x0A | 0xFF | 0x7F => 0,
            0x07 => 12,
            0x08 => 1,
            0x0C => PREFIXED | 16,
            0x10 => 4,
            0x13 => 16,
            _ => OTHER,
        };
        kind += 1;
    }
    t
};
const PREFIXED: u8 = 0x80;
const OTHER: u8 = 0x7F;

/// The length of a value of type `kind` at the start of `rest`.
///
/// Read from a table, not by a `match` on the type: a jump to one of a
/// dozen places per element, whose target changes from one element to
/// the next. What the table does not settle (a regular expression, a
/// length that is negative or overruns, a value shorter than a length
/// word) is decided by [`checked_len`].
#[inline(always)]
pub fn value_len(kind: u8, rest: &[u8]) -> Result<usize, Malformed> {
    value_len_by(length_rule(kind), kind, rest)
}

/// How [`value_len`] reads the length of a value of type `kind`: kept by
/// a rewriter that meets the same type again and again (a layout's step),
/// for [`value_len_by`].
#[inline(always)]
pub fn length_rule(kind: u8) -> u8 {
    LENGTHS[usize::from(kind)]
}

/// [`value_len`] by the [`length_rule`] of `kind`.
#[inline(always)]
pub fn value_len_by(t: u8, kind: u8, rest: &[u8]) -> Result<usize, Malformed> {
    if let Some(word) = rest.first_chunk::<4>() {
        let word = i32::from_le_bytes(*word);
        let prefixed = t & PREFIXED != 0;
        // The length word counts only where the type has one.
        let counted = (word as u32 as usize) & if prefixed { usize::MAX } else { 0 };
        let len = usize::from(t & !PREFIXED) + counted;
        if t != OTHER && !(prefixed && word < 0) && len <= rest.len() {
            return Ok(len);
        }
    }
    checked_len(kind, rest)
}

/// [`value_len`] for what its table does not settle, and the reason a
/// value cannot be read.
#[cold]
fn checked_len(kind: u8, rest: &[u8]) -> Result<usize, Malformed> {
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
        _ => return Err(Malformed::Invalid("an unknown element type")),
    };
    if len > rest.len() {
        return Err(Malformed::Invalid("a value that overruns its document"));
    }
    Ok(len)
}

/// Checks a whole document: lengths that agree, NULs where they belong,
/// keys and strings that are UTF-8, known types, and depth. What passes
/// can be walked, and parsed, without surprise.
pub fn validate(doc: &[u8]) -> Result<(), Malformed> {
    validate_at(doc, 0, None)
}

/// [`validate`], and no binary of subtype `reserved` anywhere
/// ([`Malformed::Reserved`]).
pub fn validate_without(doc: &[u8], reserved: u8) -> Result<(), Malformed> {
    validate_at(doc, 0, Some(reserved))
}

fn validate_at(doc: &[u8], depth: usize, reserved: Option<u8>) -> Result<(), Malformed> {
    let invalid = |why| Err(Malformed::Invalid(why));
    if doc.len() < 5 || le_i32(doc)? != doc.len() {
        return invalid("a document whose length is not its size");
    }
    if doc[doc.len() - 1] != 0 {
        return invalid("a document without its final NUL");
    }
    let mut seen_end = 4;
    for e in elements(doc) {
        let e = e?;
        if !is_utf8(e.key) {
            return invalid("a key that is not UTF-8");
        }
        match e.kind {
            0x03 | 0x04 => validate_at(e.value, descend(depth)?, reserved)?,
            0x02 | 0x0D | 0x0E => utf8_string(e.value)?,
            0x0B => {
                // A regular expression: pattern and options, two C strings.
                for part in e.value.split(|&b| b == 0).take(2) {
                    if !is_utf8(part) {
                        return invalid("a regular expression that is not UTF-8");
                    }
                }
            }
            0x0C => {
                // A DBPointer: a namespace string, then an ObjectId.
                utf8_string(&e.value[..e.value.len() - 12])?;
            }
            0x08 if e.value[0] > 1 => return invalid("a boolean that is neither 0 nor 1"),
            0x05 if reserved == Some(e.value[4]) => return Err(Malformed::Reserved),
            0x05 if e.value[4] == 0x02 => {
                // The old binary subtype repeats its length inside.
                let size = e.value.len().checked_sub(9);
                if !size.is_some_and(|n| le_i32(&e.value[5..]) == Ok(n)) {
                    return invalid("an old binary whose inner length is not its size");
                }
            }
            0x0F => {
                // Code with scope: its total length, a string, then a
                // document; any of them may lie.
                let rest = e.value.get(4..).unwrap_or_default();
                let code = 4 + le_i32(rest)?;
                utf8_string(rest.get(..code).unwrap_or_default())?;
                validate_at(
                    rest.get(code..).unwrap_or_default(),
                    descend(depth)?,
                    reserved,
                )?;
            }
            _ => {}
        }
        seen_end = e.value.as_ptr() as usize - doc.as_ptr() as usize + e.value.len();
    }
    if seen_end != doc.len() - 1 {
        return invalid("bytes after the last element");
    }
    Ok(())
}

/// Walks a document element by element and copies it: the baseline the
/// rewrites are measured against (the same walk, nothing changed).
pub fn copy(doc: &[u8], out: &mut Vec<u8>) -> Result<(), Malformed> {
    copy_at(doc, out, 0)
}

fn copy_at(doc: &[u8], out: &mut Vec<u8>, depth: usize) -> Result<(), Malformed> {
    let start = begin(out);
    for e in elements(doc) {
        let e = e?;
        match e.kind {
            0x03 | 0x04 => {
                header(out, e.kind, e.key);
                copy_at(e.value, out, descend(depth)?)?
            }
            _ => put(out, e.raw),
        }
    }
    finish(out, start);
    Ok(())
}

// === Writing ===

/// Appends `src` to `out`. Most of what a rewrite copies is short (a key,
/// a number, the run of one small value), and for those a call to `memcpy`
/// costs more than the copy: up to 32 bytes are moved as two fixed-size
/// words that overlap in the middle, which the compiler writes inline.
/// Inlined in a release build only, as [`Elements::next`] is (a debug
/// build's frames would grow past the stack the recursion is allowed).
#[cfg_attr(not(debug_assertions), inline(always))]
pub fn put(out: &mut Vec<u8>, src: &[u8]) {
    #[cfg_attr(not(debug_assertions), inline(always))]
    fn two<const W: usize>(out: &mut Vec<u8>, src: &[u8]) {
        let n = src.len();
        let (Ok(head), Ok(tail)) = (
            <[u8; W]>::try_from(&src[..W]),
            <[u8; W]>::try_from(&src[n - W..]),
        ) else {
            return out.extend_from_slice(src);
        };
        let end = out.len() + n;
        out.extend_from_slice(&head);
        out.truncate(end - W);
        out.extend_from_slice(&tail);
    }
    match src.len() {
        0..=3 => {
            for &b in src {
                out.push(b);
            }
        }
        4..=7 => two::<4>(out, src),
        8..=15 => two::<8>(out, src),
        16..=32 => two::<16>(out, src),
        _ => out.extend_from_slice(src),
    }
}

/// Output written into a slice of fixed length, from a position kept in a
/// local: a rewrite that holds one keeps the slice's address, its length
/// and the position in registers. (Writing through a `&mut Vec<u8>` makes
/// every byte stored load the vector's length again: the byte may alias
/// it.) A write that does not fit fails with [`Full`]; the caller starts
/// again with more room.
pub struct Slab<'b> {
    pub buf: &'b mut [u8],
    pub pos: usize,
}

/// A [`Slab`] without room for what was to be written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

impl Slab<'_> {
    /// Room for `n` more bytes: where they end.
    #[inline(always)]
    fn room(&self, n: usize) -> Result<usize, Full> {
        let end = self.pos + n;
        if end > self.buf.len() {
            return Err(Full);
        }
        Ok(end)
    }

    #[inline(always)]
    pub fn byte(&mut self, b: u8) -> Result<(), Full> {
        let slot = self.buf.get_mut(self.pos).ok_or(Full)?;
        *slot = b;
        self.pos += 1;
        Ok(())
    }

    /// Appends `src`: up to 32 bytes as two fixed-size moves that overlap
    /// in the middle (most of what a rewrite copies is a key, a number or
    /// the run of one small value, for which `memcpy` costs more than the
    /// copy), longer ones with `memcpy`.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn put(&mut self, src: &[u8]) -> Result<(), Full> {
        #[cfg_attr(not(debug_assertions), inline(always))]
        fn two<const W: usize>(to: &mut [u8], src: &[u8]) {
            if let (Some(&head), Some(&tail)) = (src.first_chunk::<W>(), src.last_chunk::<W>()) {
                if let Some(to_head) = to.first_chunk_mut::<W>() {
                    *to_head = head;
                }
                if let Some(to_tail) = to.last_chunk_mut::<W>() {
                    *to_tail = tail;
                }
            }
        }
        let end = self.room(src.len())?;
        let to = &mut self.buf[self.pos..end];
        match src.len() {
            0..=3 => {
                for (t, &b) in to.iter_mut().zip(src) {
                    *t = b;
                }
            }
            4..=7 => two::<4>(to, src),
            8..=15 => two::<8>(to, src),
            16..=32 => two::<16>(to, src),
            _ => to.copy_from_slice(src),
        }
        self.pos = end;
        Ok(())
    }

    /// Appends `head[..hlen]`, then `src[..len]` (`len` at most
    /// `src.len()`): an element's header and its value, in three fixed
    /// moves of sixteen bytes behind one test of room, where the header is
    /// no longer than sixteen bytes, the value no longer than 32, the slab
    /// has room for 48 and `src` reaches 32 (the bytes moved past them are
    /// to be written over or cut off). `false`, and nothing written, where
    /// not: the caller writes them apart.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn put_pair(&mut self, head: &[u8; 16], hlen: usize, src: &[u8], len: usize) -> bool {
        let to = self.buf.get_mut(self.pos..).unwrap_or_default();
        match (to.first_chunk_mut::<48>(), src.first_chunk::<32>()) {
            (Some(to), Some(from)) if hlen <= 16 && len <= 32 => {
                to[..16].copy_from_slice(head);
                to[hlen..hlen + 32].copy_from_slice(from);
                self.pos += hlen + len;
                true
            }
            _ => false,
        }
    }

    /// Appends `bytes[..len]` (a header of at most sixteen bytes): all
    /// sixteen in one move where the slab has room for them, the bytes
    /// past `len` to be written over or cut off.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn put_short(&mut self, bytes: &[u8; 16], len: usize) -> Result<(), Full> {
        let to = self
            .buf
            .get_mut(self.pos..)
            .and_then(|b| b.first_chunk_mut::<16>());
        match to {
            Some(to) if len <= 16 => {
                *to = *bytes;
                self.pos += len;
                Ok(())
            }
            _ => self.put(&bytes[..len.min(16)]),
        }
    }

    /// Bytes and their NUL (a key).
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn cstring(&mut self, bytes: &[u8]) -> Result<(), Full> {
        self.put(bytes)?;
        self.byte(0)
    }

    /// An element's type byte and key.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn header(&mut self, kind: u8, key: &[u8]) -> Result<(), Full> {
        self.byte(kind)?;
        self.cstring(key)
    }

    /// A string value: its length, bytes and NUL.
    pub fn string_value(&mut self, s: &str) -> Result<(), Full> {
        self.put(&(s.len() as i32 + 1).to_le_bytes())?;
        self.cstring(s.as_bytes())
    }

    /// Starts a document: a length prefix to fill in by [`Slab::finish`].
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn begin(&mut self) -> Result<usize, Full> {
        let start = self.pos;
        self.put(&[0; 4])?;
        Ok(start)
    }

    /// Ends the document begun at `start`: its NUL and its length.
    #[cfg_attr(not(debug_assertions), inline(always))]
    pub fn finish(&mut self, start: usize) -> Result<(), Full> {
        self.byte(0)?;
        let len = (self.pos - start) as i32;
        self.buf[start..start + 4].copy_from_slice(&len.to_le_bytes());
        Ok(())
    }
}

/// Starts a document in `out`: a length prefix to fill in by [`finish`].
#[inline]
pub fn begin(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    start
}

/// Ends the document begun at `start`: its NUL and its length.
#[inline]
pub fn finish(out: &mut Vec<u8>, start: usize) {
    out.push(0);
    let len = (out.len() - start) as i32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// An element's type byte and key.
#[inline(always)]
pub fn header(out: &mut Vec<u8>, kind: u8, key: &[u8]) {
    out.push(kind);
    cstring(out, key);
}

/// Bytes and their NUL: a key, written after the type byte that a copied
/// run of unchanged bytes ended with.
#[inline(always)]
pub fn cstring(out: &mut Vec<u8>, bytes: &[u8]) {
    put(out, bytes);
    out.push(0);
}

/// A string value: its length, bytes and NUL.
pub fn string_value(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as i32 + 1).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    out.push(0);
}

pub fn as_str(b: &[u8]) -> Result<&str, Malformed> {
    std::str::from_utf8(b).map_err(|_| Malformed::Invalid("a key that is not UTF-8"))
}

/// The string a type-0x02 value holds.
pub fn string_of(value: &[u8]) -> Result<&str, Malformed> {
    std::str::from_utf8(string_bytes(value)?).map_err(|_| NOT_UTF8)
}

const NOT_UTF8: Malformed = Malformed::Invalid("a string that is not UTF-8");

/// The bytes of the string a type-0x02 value holds, its length and NUL
/// checked.
fn string_bytes(value: &[u8]) -> Result<&[u8], Malformed> {
    let len = le_i32(value)?;
    if len == 0 || value.get(3 + len) != Some(&0) {
        return Err(Malformed::Invalid("a string without its NUL"));
    }
    value
        .get(4..4 + len - 1)
        .ok_or(Malformed::Invalid("a truncated string"))
}

/// [`string_of`] where only whether it is one matters ([`validate`]).
fn utf8_string(value: &[u8]) -> Result<(), Malformed> {
    match is_utf8(string_bytes(value)?) {
        true => Ok(()),
        false => Err(NOT_UTF8),
    }
}

/// Whether `b` is UTF-8. Keys and most strings are ASCII, which is tested
/// inline; only the others are decoded. (The standard library's check is a
/// call with its own set-up for every key and string: about a third of
/// the instructions [`validate`] spent on a `find` by `_id`.)
#[inline(always)]
fn is_utf8(b: &[u8]) -> bool {
    b.is_ascii() || std::str::from_utf8(b).is_ok()
}

#[cfg(test)]
mod tests {
    use bson::{doc, Bson, Document, RawDocumentBuf};

    use super::*;

    fn nested(depth: usize) -> Vec<u8> {
        let mut d = doc! {"x": 1};
        for _ in 0..depth {
            d = doc! {"a": d};
        }
        // The bson crate's own encoder recurses: build deep ones by hand.
        bson::to_vec(&d).unwrap()
    }

    fn deep_by_hand(depth: usize) -> Vec<u8> {
        // {a: {a: … {} …}} built from the inside out, without recursion.
        let mut inner = vec![5, 0, 0, 0, 0];
        for _ in 0..depth {
            let mut d = Vec::with_capacity(inner.len() + 8);
            let start = begin(&mut d);
            header(&mut d, 0x03, b"a");
            d.extend_from_slice(&inner);
            finish(&mut d, start);
            inner = d;
        }
        inner
    }

    #[test]
    fn a_reserved_binary_subtype_is_refused_at_any_depth() {
        let blob = |subtype: u8| bson::Binary {
            subtype: bson::spec::BinarySubtype::UserDefined(subtype),
            bytes: vec![1],
        };
        let deep = bson::to_vec(&doc! {"a": [{"b": {"c": blob(0x8C)}}]}).unwrap();
        assert_eq!(validate(&deep), Ok(()));
        assert_eq!(validate_without(&deep, 0x8C), Err(Malformed::Reserved));
        let other = bson::to_vec(&doc! {"a": [{"b": {"c": blob(0x80)}}]}).unwrap();
        assert_eq!(validate_without(&other, 0x8C), Ok(()));
    }

    #[test]
    fn fields_read_what_the_bson_crate_reads() {
        let d = RawDocumentBuf::from_document(&doc! {
            "find": "people", "filter": {"a": 1}, "limit": 1_i32, "getMore": 7_i64,
            "ok": 1.0, "explain": true, "code": 10107_i64,
            "lsid": {"id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: vec![7; 16] }},
            "$db": "app", "find": "again",
        })
        .unwrap();
        let d = d.as_ref();
        assert_eq!(d.first().and_then(|e| e.name()), Some("find"));
        assert_eq!(
            d.str_field("find"),
            d.get_str("find").ok(),
            "the first of two"
        );
        assert_eq!(d.str_field("$db"), Some("app"));
        assert_eq!(d.doc_field("filter"), d.get_document("filter").ok());
        assert_eq!(d.field("getMore").and_then(|e| e.i64()), Some(7));
        assert_eq!(d.field("limit").and_then(|e| e.i64()), None, "an int32");
        assert_eq!(d.field("limit").and_then(|e| e.number()), Some(1.0));
        assert_eq!(d.field("code").and_then(|e| e.number()), Some(10107.0));
        assert_eq!(d.field("ok").and_then(|e| e.number()), Some(1.0));
        assert_eq!(d.field("explain").and_then(|e| e.bool()), Some(true));
        let id = d.doc_field("lsid").and_then(|l| l.field("id")?.binary());
        assert_eq!(id, Some((4, &[7u8; 16][..])));
        assert_eq!(d.str_field("limit"), None, "not a string");
        assert!(d.field("absent").is_none());
        // Past a fault, nothing is found.
        let mut bad = d.as_bytes().to_vec();
        bad[4] = 0x42;
        let bad = bson::RawDocument::from_bytes(&bad).unwrap();
        assert!(bad.first().is_none() && bad.str_field("$db").is_none());
    }

    /// Keys and strings are checked for UTF-8 whether they are ASCII or
    /// not: multi-byte text passes, a byte that starts no character or a
    /// sequence cut short does not, in a key, a string, code or a
    /// DBPointer's namespace.
    #[test]
    fn text_must_be_utf8_ascii_or_not() {
        let good = RawDocumentBuf::from_document(&doc! {
            "名前": "ünïcödé ✓", "plain": "ascii", "code": Bson::JavaScriptCode("é".into()),
        })
        .unwrap();
        assert_eq!(validate(good.as_bytes()), Ok(()));
        let bytes = good.as_bytes().to_vec();
        let at = |needle: &[u8]| {
            bytes
                .windows(needle.len())
                .position(|w| w == needle)
                .unwrap()
        };
        for (spot, bad) in [
            (at("名".as_bytes()), 0xFF),
            (at("名".as_bytes()) + 1, b'a'),
            (at(b"ascii") + 2, 0x80),
            (at("ü".as_bytes()) + 1, b'u'),
            (bytes.len() - 3, b'x'),
        ] {
            let mut b = bytes.clone();
            b[spot] = bad;
            assert!(
                matches!(validate(&b), Err(Malformed::Invalid(_))),
                "byte {spot} as {bad:#04x}"
            );
        }
        // A DBPointer's namespace: a string, then twelve bytes of id.
        let pointer = |ns: &[u8]| {
            let mut d = Vec::new();
            let start = begin(&mut d);
            header(&mut d, 0x0C, b"p");
            d.extend_from_slice(&(ns.len() as i32 + 1).to_le_bytes());
            d.extend_from_slice(ns);
            d.push(0);
            d.extend_from_slice(&[7; 12]);
            finish(&mut d, start);
            d
        };
        assert_eq!(validate(&pointer("db.c".as_bytes())), Ok(()));
        assert!(validate(&pointer(&[b'd', 0xFF])).is_err());
    }

    #[test]
    fn depth_is_bounded_at_the_servers_limit() {
        assert!(validate(&nested(MAX_DEPTH)).is_ok());
        assert_eq!(
            validate(&deep_by_hand(MAX_DEPTH + 1)),
            Err(Malformed::TooDeep)
        );
        assert_eq!(
            copy(&deep_by_hand(100_000), &mut Vec::new()),
            Err(Malformed::TooDeep),
            "a hostile depth is refused, not recursed into"
        );
    }

    #[test]
    fn malformed_documents_are_refused() {
        let good = RawDocumentBuf::from_document(&doc! {"a": "x", "b": [1, {"c": 2}]}).unwrap();
        assert!(validate(good.as_bytes()).is_ok());
        let mut cut = good.as_bytes().to_vec();
        cut.truncate(cut.len() - 1);
        assert!(validate(&cut).is_err());
        let mut bad_key = good.as_bytes().to_vec();
        bad_key[5] = 0xFF;
        assert!(validate(&bad_key).is_err());
        assert!(validate(&[5, 0, 0, 0, 1]).is_err());
        assert!(validate(&[9, 0, 0, 0, 0x08, b'b', 0, 2, 0]).is_err());
        assert!(validate(&[9, 0, 0, 0, 0x08, b'b', 0, 1, 0]).is_ok());
        // The old binary subtype: 5 bytes, of which an inner length (1) and 1 byte.
        let old_binary = |inner: u8| [18, 0, 0, 0, 5, b'b', 0, 5, 0, 0, 0, 2, inner, 0, 0, 0, 7, 0];
        assert!(validate(&old_binary(1)).is_ok());
        assert!(validate(&old_binary(2)).is_err());
        let too_short = [17, 0, 0, 0, 5, b'b', 0, 4, 0, 0, 0, 2, 1, 0, 0, 0, 0];
        assert!(validate(&too_short).is_err());
        // A regular expression whose pattern is not UTF-8.
        assert!(validate(&[11, 0, 0, 0, 0x0B, b'r', 0, 0xFF, 0, 0, 0]).is_err());
        assert!(validate(&[12, 0, 0, 0, 0x0B, b'r', 0, b'a', 0, b'i', 0, 0]).is_ok());
        assert!(validate(&[6, 0, 0, 0, 0x42, 0]).is_err());
        let _ = (Bson::Null, Document::new());
    }

    /// The rewriters recurse once per level: at the depth limit they must
    /// fit in half the stack of a runtime worker (2 MiB), in this build.
    #[test]
    fn rewriting_to_the_depth_limit_fits_half_a_worker_stack() {
        use crate::rewrite::expand::raw::{expand, Refused};
        use crate::rewrite::expand::{Strings, Unknown};
        use crate::rewrite::mapper::raw::tokenize;
        use crate::token::{Dictionary, Policy};
        let deep = deep_by_hand(100_000);
        let at_limit = deep_by_hand(MAX_DEPTH);
        std::thread::Builder::new()
            .stack_size(1 << 20)
            .spawn(move || {
                let policy = Policy::new(1, &[], "laconic");
                let dict = Dictionary::default();
                let mut out = Vec::new();
                assert_eq!(
                    tokenize(&deep, &policy, &dict, &mut out),
                    Err(Malformed::TooDeep)
                );
                out.clear();
                tokenize(&at_limit, &policy, &dict, &mut out).unwrap();
                let mut unknown = Unknown::default();
                for strings in [Strings::Data, Strings::Paths] {
                    let ran = expand(
                        &deep,
                        &dict,
                        strings,
                        &mut unknown,
                        (&mut Vec::new(), 0),
                        &mut |n| n,
                    );
                    assert!(matches!(ran, Err(Refused::Malformed(Malformed::TooDeep))));
                    expand(
                        &at_limit,
                        &dict,
                        strings,
                        &mut unknown,
                        (&mut Vec::new(), 0),
                        &mut |n| n,
                    )
                    .unwrap();
                }
            })
            .unwrap()
            .join()
            .expect("no stack overflow");
    }

    /// The table gives every type's length as the `match` does, and
    /// refuses what it refuses, whatever the length word and the room.
    #[test]
    fn the_length_table_agrees_with_the_match_on_every_type() {
        let words = [i32::MIN, -1, 0, 1, 3, 4, 5, 11, 12, 16, 17, 100, i32::MAX];
        for kind in 0..=255u8 {
            for word in words {
                for room in [0, 1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 20, 21, 32, 40, 120] {
                    let mut rest: Vec<u8> = (0..room).map(|i| (i * 7 % 5) as u8).collect();
                    for (r, w) in rest.iter_mut().zip(word.to_le_bytes()) {
                        *r = w;
                    }
                    assert_eq!(
                        value_len(kind, &rest),
                        checked_len(kind, &rest),
                        "type {kind:#04x}, word {word}, room {room}"
                    );
                }
            }
        }
    }

    #[test]
    fn the_nul_is_found_wherever_it_is() {
        for len in 0..80 {
            for at in 0..len {
                let mut b = vec![0xFFu8; len];
                b[at] = 0;
                if at + 3 < len {
                    b[at + 3] = 0;
                }
                assert_eq!(nul_at(&b), Some(at), "{len} {at}");
            }
            assert_eq!(nul_at(&vec![1u8; len]), None);
            assert_eq!(nul_at(&vec![0x80u8; len]), None);
        }
    }

    #[test]
    fn put_appends_exactly_the_bytes_at_every_length() {
        let src: Vec<u8> = (1..=80).collect();
        for len in 0..=src.len() {
            let mut out = vec![0xEE; 3];
            put(&mut out, &src[..len]);
            assert_eq!(out.len(), 3 + len);
            assert_eq!(&out[..3], &[0xEE; 3]);
            assert_eq!(&out[3..], &src[..len], "{len} bytes");
        }
    }

    /// What fits is written exactly, after what is there; what does not
    /// fit is refused and writes nothing.
    #[test]
    fn a_slab_writes_exactly_what_fits() {
        let src: Vec<u8> = (1..=80).collect();
        for len in 0..=src.len() {
            for room in [len, len + 1, len + 40] {
                let mut buf = vec![0xEE; 3 + room];
                let mut slab = Slab {
                    buf: &mut buf,
                    pos: 3,
                };
                slab.put(&src[..len]).unwrap();
                assert_eq!(slab.pos, 3 + len);
                assert_eq!(&buf[..3], &[0xEE; 3]);
                assert_eq!(&buf[3..3 + len], &src[..len], "{len} bytes");
                assert!(buf[3 + len..].iter().all(|&b| b == 0xEE));
            }
            if len > 0 {
                let mut buf = vec![0xEE; 2 + len];
                let mut slab = Slab {
                    buf: &mut buf,
                    pos: 3,
                };
                assert_eq!(slab.put(&src[..len]), Err(Full));
                assert_eq!(slab.pos, 3);
                assert!(buf.iter().all(|&b| b == 0xEE));
            }
        }
        let mut buf = [0u8; 2];
        let mut slab = Slab {
            buf: &mut buf,
            pos: 0,
        };
        assert_eq!(slab.header(0x10, b"a"), Err(Full));
        slab.pos = 0;
        assert_eq!(slab.cstring(b"a"), Ok(()));
        assert_eq!(slab.byte(1), Err(Full));
        assert_eq!(buf, [b'a', 0]);
    }

    /// `put_pair` writes a header and a value exactly, however far the
    /// value's bytes and the slab reach past them (the slab's bytes past
    /// them may change, to be written over; those before may not), or
    /// writes nothing where it has not the room for its moves.
    #[test]
    fn a_slab_writes_a_header_and_a_value_exactly_or_not_at_all() {
        let bytes: Vec<u8> = (1..=80).collect();
        let head: [u8; 16] = std::array::from_fn(|i| 0xA0 + i as u8);
        for hlen in 0..=17 {
            for len in 0..=33 {
                for past in [0, 1, 31, 32] {
                    for room in [hlen + len, hlen + len + 1, 47, 48, 80] {
                        let src = &bytes[..len + past];
                        let mut buf = vec![0xEE; 3 + room];
                        let mut slab = Slab {
                            buf: &mut buf,
                            pos: 3,
                        };
                        let moved = slab.put_pair(&head, hlen, src, len);
                        let fits = hlen <= 16 && len <= 32 && room >= 48 && src.len() >= 32;
                        assert_eq!(moved, fits, "{hlen} {len} {past} {room}");
                        if !moved {
                            assert_eq!(slab.pos, 3);
                            assert!(buf.iter().all(|&b| b == 0xEE));
                            continue;
                        }
                        assert_eq!(slab.pos, 3 + hlen + len);
                        assert_eq!(&buf[..3], &[0xEE; 3]);
                        assert_eq!(&buf[3..3 + hlen], &head[..hlen]);
                        assert_eq!(&buf[3 + hlen..3 + hlen + len], &src[..len]);
                    }
                }
            }
        }
    }

    #[test]
    fn a_document_element_is_read_as_the_iterator_reads_it() {
        let batch = doc! {"0": {"a": 1}, "1": "x", "2": {}, "10": {"b": [1]}, "100": 7i64};
        let batch = bson::to_vec(&batch).unwrap();
        assert_eq!(crate::fuzzing::documents_as_elements(&batch), 3);
        // Every byte of the array set to values that matter to a reader:
        // NULs, types, lengths that are short, long or negative.
        let mut read = 0;
        for at in 0..batch.len() {
            for b in [0x00, 0x01, 0x03, 0x04, 0x05, 0x30, 0x7f, 0xff] {
                let mut bytes = batch.clone();
                bytes[at] = b;
                read += crate::fuzzing::documents_as_elements(&bytes);
            }
        }
        assert!(read > 8 * batch.len(), "{read} documents read");
    }

    #[test]
    fn a_copy_is_the_same_bytes() {
        let d = RawDocumentBuf::from_document(&doc! {"a": 1, "b": {"c": [1, "x"]}, "r": bson::Regex { pattern: "p".into(), options: "i".into() }}).unwrap();
        let mut out = Vec::new();
        copy(d.as_bytes(), &mut out).unwrap();
        assert_eq!(out, d.as_bytes());
    }
}
