//! The documents of one batch mostly share one layout: the same keys, of
//! the same types, in the same order, and differ in their values. The
//! walk of one such document decides, element by element, what its key
//! becomes and whether its value is gone into or copied; [`Batch`] keeps
//! those decisions as a list of steps, and a next document whose element
//! headers are byte for byte the same is rewritten by following them: one
//! comparison per element instead of a search for the key's end, a
//! dictionary look-up and the tests of the walk.
//!
//! Both rewriters follow layouts: the expansion of a cursor's batch
//! ([`Batch::learn`]), and the tokenization of an `insert`'s documents
//! ([`Batch::learn_rewrite`]).
//!
//! What a step does depends only on the header's bytes (the type and the
//! key), on the headers of the documents it is in, on what stays the same
//! for the whole batch (the dictionary, one snapshot; the policy) and, for
//! a binary value, on its subtype, which is tested again each time; the
//! output is the very bytes the walk writes. A document that differs
//! anywhere is rewritten by the walk, and its layout may be kept instead.
//! Only documents the walk rewrites without a question are kept: for the
//! expansion, no unknown token (of a name or a value), no escaped or
//! dotted key; for the tokenization, no value path in the policy.

use super::expand::raw::scalars;
use crate::rewrite::walker::{
    elements, length_rule, nul_at, value_len_by, Elements, Full, Slab, MAX_DEPTH,
};
use crate::token::namespace::{starts_token, value_number, ESCAPE, VALUE_SUBTYPE};
use crate::token::Names;

/// Steps kept for one layout, at most: a document of more elements is
/// walked.
const MOST_STEPS: usize = 256;
/// Levels of documents and arrays kept below a batch's document.
const MOST_LEVELS: usize = 8;

/// What is done with an element whose header matches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// Its value is copied as it is.
    Copy,
    /// A binary value, copied as it is unless its subtype is a value
    /// token's.
    Binary,
    /// A value token, written as the string it stands for (under the
    /// header of a string, its `becomes`) if the dictionary knows it.
    Value,
    /// An array of values either rewrite leaves as they are (no
    /// document, array or value token: tested again, as the walk of the
    /// expansion tests it), copied as it is.
    Scalars,
    /// A document or an array gone into: the steps of its elements follow,
    /// up to their [`Step::End`].
    Into,
    /// The end of a document's steps.
    End,
}

/// One element of the layout.
#[derive(Clone, Copy, Debug)]
struct Op {
    step: Step,
    /// The header (type byte, key, NUL) as it comes: where it is in
    /// [`Batch::bytes`], and how long it is.
    header: (u32, u32),
    /// Its first eight bytes, for a header no longer than that: compared
    /// as one word, under `mask`.
    word: u64,
    mask: u64,
    /// Its type, and how its value's length is read ([`length_rule`]).
    kind: u8,
    rule: u8,
    /// The header it becomes, in [`Batch::bytes`]; `None`: the same.
    becomes: Option<(u32, u32)>,
    /// The header written, `becomes` or the same: its bytes, if it is no
    /// longer than sixteen (written in one move), and its length.
    short: [u8; 16],
    written: u32,
}

/// The layout of the last document learned from one batch (the documents
/// of one array, at one depth), and how often it served.
#[derive(Default)]
pub(crate) struct Batch {
    ops: Vec<Op>,
    bytes: Vec<u8>,
    /// The depth of the documents it is for: a cursor's batch's, the
    /// first met in the reply ([`Batch::claim`]).
    depth: Option<usize>,
    hits: usize,
    misses: usize,
    learned: usize,
    /// See [`Batch::growth`].
    growth: usize,
    /// For a layout of one level, whose values are all copied as they
    /// are: how much longer than a document its rewrite is (what its
    /// renamed headers add, less what they take away). See
    /// [`Batch::stream`].
    flat: Option<isize>,
}

impl Batch {
    /// A batch whose documents are all walked: nothing is learned.
    pub fn walk_only() -> Batch {
        Batch {
            learned: usize::MAX,
            ..Batch::default()
        }
    }

    /// Takes the documents at `depth` for the batch's, unless another
    /// depth was taken first: the expansion of a reply calls it for the
    /// array of a cursor's batch (`firstBatch`, `nextBatch`). Only those
    /// are learned from: the arrays of documents within a user's document
    /// are mostly short, and learning costs a walk.
    pub fn claim(&mut self, depth: usize) {
        self.depth.get_or_insert(depth);
    }

    /// Whether documents of arrays at `depth` are the batch's.
    #[inline(always)]
    pub fn claims(&self, depth: usize) -> bool {
        self.depth == Some(depth)
    }

    /// How many documents followed a layout.
    #[cfg(test)]
    pub fn hits(&self) -> usize {
        self.hits
    }

    /// Whether a layout is kept and tried: a batch of many layouts stops
    /// being tried.
    #[inline(always)]
    pub fn ready(&self) -> bool {
        !self.ops.is_empty() && self.misses <= self.hits + 4
    }

    /// Rewrites `doc`, a document of the batch, into `out` if it has the
    /// layout learned last: where the output ends. `None`: it does not (or
    /// nothing is learned), and the bytes written are to be written over.
    #[inline]
    pub fn follow<N: Names + ?Sized>(
        &mut self,
        doc: &[u8],
        names: &N,
        (buf, pos): (&mut [u8], usize),
    ) -> Result<Option<usize>, Full> {
        if !self.ready() {
            return Ok(None);
        }
        self.tried(doc, names, (buf, pos))
    }

    /// [`Batch::doc`] from the first step, counted as a hit or a miss.
    #[inline(always)]
    fn tried<N: Names + ?Sized>(
        &mut self,
        doc: &[u8],
        names: &N,
        out: (&mut [u8], usize),
    ) -> Result<Option<usize>, Full> {
        let followed = self.doc(doc, names, 0, out)?.map(|(_, end)| end);
        match followed {
            Some(_) => self.hits += 1,
            None => self.misses += 1,
        }
        Ok(followed)
    }

    /// Follows the layout through the documents of an array (a cursor's
    /// batch) from the next of `items`, as long as each is a document that
    /// has it, writing each as [`Batch::follow`] does, after its header
    /// (type, index, NUL) as it is: where the output ends. `items` is left
    /// at the first element that is not followed (not a document, or one
    /// of another layout, or nothing is learned), for the walk. One loop
    /// for the batch rather than one walk of its array calling
    /// [`Batch::follow`] for each document: most of a cursor read's
    /// documents are followed.
    pub fn follow_run<N: Names + ?Sized>(
        &mut self,
        items: &mut Elements<'_>,
        names: &N,
        (buf, mut pos): (&mut [u8], usize),
    ) -> Result<usize, Full> {
        if let Some(delta) = self.flat.filter(|_| self.ready()) {
            return self.stream(items, delta, (buf, pos));
        }
        while self.ready() {
            let Some((header, doc, next)) = items.document() else {
                break;
            };
            let mut out = Slab {
                buf: &mut *buf,
                pos,
            };
            out.put(header)?;
            let Some(end) = self.tried(doc, names, (out.buf, out.pos))? else {
                break;
            };
            pos = end;
            *items = next;
        }
        Ok(pos)
    }

    /// [`Batch::follow_run`] for a layout of one level
    /// ([`Batch::flat`], `delta`): the array's documents are followed one
    /// after the other in one loop, each element written as its header
    /// (the one it becomes, or the same) and its value, and each
    /// document's length is its own plus `delta`, written before its
    /// elements. A document that parts from the layout is left to the
    /// walk, which writes over what was written of it.
    #[inline(never)]
    fn stream(
        &mut self,
        items: &mut Elements<'_>,
        delta: isize,
        (buf, pos): (&mut [u8], usize),
    ) -> Result<usize, Full> {
        let (array, end) = items.bytes();
        let mut out = Slab { buf, pos };
        let mut at = Elements::position(items);
        let mut hits = 0;
        let missed = loop {
            // A document (type, index, NUL, value) to follow, or the
            // walk's: it says why, if it is not one at all. Not a miss.
            if at >= end || array[at] != 0x03 {
                break false;
            }
            let Some(value_at) = nul_at(&array[at + 1..end]).map(|n| at + 2 + n) else {
                break false;
            };
            let Some(&len) = array.get(value_at..end).and_then(|v| v.first_chunk::<4>()) else {
                break false;
            };
            let len = i32::from_le_bytes(len) as isize;
            let doc_end = value_at as isize + len - 1;
            let Ok(written) = i32::try_from(len + delta) else {
                break false;
            };
            if len < 5 || doc_end >= end as isize || array[doc_end as usize] != 0 {
                break false;
            }
            let doc_end = doc_end as usize;
            let pos_was = out.pos;
            out.put(&array[at..value_at])?;
            out.put(&written.to_le_bytes())?;
            if !self.flat_doc(array, value_at + 4, doc_end, &mut out)? {
                out.pos = pos_was;
                break true;
            }
            out.byte(0)?;
            hits += 1;
            at = doc_end + 1;
        };
        self.hits += hits;
        self.misses += usize::from(missed);
        *items = items.resumed(at);
        Ok(out.pos)
    }

    /// Follows the steps of a [`Batch::flat`] layout through the elements
    /// of a document from `el` to its NUL at `end`, writing each. `false`
    /// where the document parts from the steps.
    #[inline(always)]
    fn flat_doc(
        &self,
        array: &[u8],
        mut el: usize,
        end: usize,
        out: &mut Slab<'_>,
    ) -> Result<bool, Full> {
        let steps = self.ops.split_last().map_or(&[][..], |(_, steps)| steps);
        for op in steps {
            let Some((value_at, value)) = self.element(op, array, el, end) else {
                return Ok(false);
            };
            if !copies(op.step, value) {
                return Ok(false);
            }
            // The header and the value, the value's bytes read from the
            // array: what is moved past them is written over.
            let len = value.len();
            if !out.put_pair(&op.short, op.written as usize, &array[value_at..], len) {
                match op.written {
                    n @ 0..=16 => out.put_short(&op.short, n as usize)?,
                    _ => out.put(self.bytes(op.becomes.unwrap_or(op.header)))?,
                }
                out.put(value)?;
            }
            el = value_at + len;
        }
        Ok(el == end)
    }

    /// [`Batch::follow_run`] for documents written back to back (a kind-1
    /// sequence's): from the next of `docs`, as long as each has the
    /// layout, each written as [`Batch::follow`] does, where the last one
    /// ended. `docs` is left at the first not followed: one of another
    /// layout (or none is learned), for the walk, or one whose rewrite may
    /// not fit in `buf` (then `true`: the caller makes room and comes
    /// back). Where the output ends.
    pub fn follow_each<'d, N, D>(
        &mut self,
        docs: &mut D,
        names: &N,
        (buf, mut pos): (&mut [u8], usize),
    ) -> (usize, bool)
    where
        N: Names + ?Sized,
        D: Iterator<Item = &'d [u8]> + Clone,
    {
        while self.ready() {
            let mut rest = docs.clone();
            let Some(doc) = rest.next() else {
                break;
            };
            if buf.len() < pos + doc.len() + self.growth {
                return (pos, true);
            }
            match self.tried(doc, names, (&mut *buf, pos)) {
                Ok(Some(end)) => (pos, *docs) = (end, rest),
                // The room is there: a miss, for the walk.
                Ok(None) | Err(Full) => break,
            }
        }
        (pos, false)
    }

    /// Keeps the layout of `doc`, a document of the batch at `depth` that
    /// the walk just expanded, if it has one worth keeping. A batch of many
    /// layouts is learned from a few times, then no more: a walk to learn
    /// costs about half an expansion.
    pub fn learn<N: Names + ?Sized>(&mut self, doc: &[u8], depth: usize, names: &N) {
        self.relearn(depth, |batch| batch.steps(doc, false, names, 0));
    }

    /// Keeps the layout of `doc`, a document of the batch at `depth`, as
    /// the walk just rewrote it into `out`, for a rewrite whose decisions
    /// turn on the headers alone: one that changes keys and nothing else,
    /// goes into every document and array that holds one, and copies
    /// every other value as it is but a binary it refuses (the
    /// tokenization of a policy without value paths). Read off the two
    /// documents side by side: an element whose key changed becomes its
    /// new header. A document whose elements or values differ otherwise
    /// is not kept.
    pub fn learn_rewrite(&mut self, doc: &[u8], out: &[u8], depth: usize) {
        self.relearn(depth, |batch| batch.pairs(doc, out, 0));
    }

    /// Learning, as often as it pays: `steps` writes the new layout.
    fn relearn(&mut self, depth: usize, steps: impl FnOnce(&mut Batch) -> Option<()>) {
        if self.learned >= 2 + self.hits / 4 {
            return;
        }
        self.learned += 1;
        self.ops.clear();
        self.bytes.clear();
        self.growth = 0;
        if depth + MOST_LEVELS >= MAX_DEPTH || steps(self).is_none() {
            self.ops.clear();
        }
        self.flat = self.delta();
    }

    /// What a layout of one level, whose steps copy every value as it
    /// is, adds to a document's length: `None` for any other.
    fn delta(&self) -> Option<isize> {
        let (last, steps) = self.ops.split_last()?;
        let mut delta = 0;
        for op in steps {
            match op.step {
                Step::Copy | Step::Binary | Step::Scalars => {}
                Step::Value | Step::Into | Step::End => return None,
            }
            if let Some((_, len)) = op.becomes {
                delta += len as isize - op.header.1 as isize;
            }
        }
        (last.step == Step::End).then_some(delta)
    }

    /// How many bytes longer than a document its rewrite by the layout
    /// can be: what its renamed headers add.
    pub fn growth(&self) -> usize {
        self.growth
    }

    /// Writes the steps of `doc`'s elements, then its [`Step::End`].
    /// `None`: the walk of it asks a question a step cannot answer alone.
    fn steps<N: Names + ?Sized>(
        &mut self,
        doc: &[u8],
        is_array: bool,
        names: &N,
        level: usize,
    ) -> Option<()> {
        if doc.len() < 5 {
            return None;
        }
        for e in elements(doc) {
            let e = e.ok()?;
            let logical = match is_array {
                true => None,
                false => data_key(e.key, names)?,
            };
            let step = match e.kind {
                // As the walk decides: an array of plain values is copied.
                0x04 if scalars(e.value) => Step::Scalars,
                0x03 | 0x04 => Step::Into,
                0x05 if e.value.get(4) == Some(&VALUE_SUBTYPE) => Step::Value,
                0x05 => Step::Binary,
                _ => Step::Copy,
            };
            let stored = doc.get(e.at..e.value_at())?;
            let logical = match (step, logical) {
                (Step::Value, name) => {
                    let key = name.map_or(e.key, str::as_bytes);
                    Some(self.keep(&[&[0x02], key, &[0]]))
                }
                (_, name) => name.map(|name| self.keep(&[&[e.kind], name.as_bytes(), &[0]])),
            };
            self.push(step, stored, logical);
            if step == Step::Into {
                if level + 1 >= MOST_LEVELS {
                    return None;
                }
                self.steps(e.value, e.kind == 0x04, names, level + 1)?;
            }
            if self.ops.len() > MOST_STEPS {
                return None;
            }
        }
        self.push(Step::End, &[], None);
        Some(())
    }

    /// Writes the steps that rewrite `doc`'s elements into `out`'s, then
    /// their [`Step::End`]. `None`: `out` is not `doc` with keys changed.
    fn pairs(&mut self, doc: &[u8], out: &[u8], level: usize) -> Option<()> {
        if doc.len() < 5 {
            return None;
        }
        let mut written = elements(out);
        for e in elements(doc) {
            let (e, o) = (e.ok()?, written.next()?.ok()?);
            let step = match e.kind {
                _ if o.kind != e.kind => return None,
                0x04 if scalars(e.value) => Step::Scalars,
                0x03 | 0x04 => Step::Into,
                0x05 if e.value.get(4) == Some(&VALUE_SUBTYPE) => return None,
                0x05 => Step::Binary,
                _ => Step::Copy,
            };
            if step != Step::Into && e.value != o.value {
                return None;
            }
            let becomes =
                (e.key != o.key).then(|| self.keep(&[&o.raw[..o.raw.len() - o.value.len()]]));
            self.push(step, &e.raw[..e.raw.len() - e.value.len()], becomes);
            if step == Step::Into {
                if level + 1 >= MOST_LEVELS {
                    return None;
                }
                self.pairs(e.value, o.value, level + 1)?;
            }
            if self.ops.len() > MOST_STEPS {
                return None;
            }
        }
        if written.next().is_some() {
            return None;
        }
        self.push(Step::End, &[], None);
        Some(())
    }

    fn keep(&mut self, parts: &[&[u8]]) -> (u32, u32) {
        let at = self.bytes.len();
        for p in parts {
            self.bytes.extend_from_slice(p);
        }
        (at as u32, (self.bytes.len() - at) as u32)
    }

    fn push(&mut self, step: Step, header: &[u8], becomes: Option<(u32, u32)>) {
        let mut first = [0u8; 8];
        let n = header.len().min(8);
        first[..n].copy_from_slice(&header[..n]);
        let mask = match header.len() {
            8.. => u64::MAX,
            n => (1u64 << (8 * n)) - 1,
        };
        let mut short = [0u8; 16];
        if let Some(b) = becomes {
            self.growth += (b.1 as usize).saturating_sub(header.len());
        }
        let kind = header.first().copied().unwrap_or(0);
        let at = self.keep(&[header]);
        let written = becomes.unwrap_or(at);
        if let Some(to) = short.get_mut(..written.1 as usize) {
            to.copy_from_slice(self.bytes(written));
        }
        self.ops.push(Op {
            step,
            header: at,
            word: u64::from_le_bytes(first),
            mask,
            kind,
            rule: length_rule(kind),
            becomes,
            short,
            written: written.1,
        });
    }

    #[inline(always)]
    fn bytes(&self, (at, len): (u32, u32)) -> &[u8] {
        &self.bytes[at as usize..(at + len) as usize]
    }

    /// Follows the steps from `ops[at]` through `doc`, writing what the
    /// walk would into `buf` from `pos`: where the steps after its
    /// [`Step::End`] start, and where the output ends. `None` where `doc`
    /// parts from them. (The output is a local [`Slab`], not the caller's:
    /// where it ends stays in a register.)
    fn doc<N: Names + ?Sized>(
        &self,
        doc: &[u8],
        names: &N,
        mut at: usize,
        (buf, pos): (&mut [u8], usize),
    ) -> Result<Option<(usize, usize)>, Full> {
        if doc.len() < 5 {
            return Ok(None);
        }
        let end = doc.len() - 1;
        // Where the output ends is a local, not a field of a [`Slab`] lent
        // out: it stays in a register through the loop.
        let (start, mut pos) = {
            let mut out = Slab {
                buf: &mut *buf,
                pos,
            };
            (out.begin()?, out.pos)
        };
        // `doc[..copied]` is in `out` already, as in the walk.
        let (mut copied, mut el) = (4, 4);
        loop {
            let Some(op) = self.ops.get(at) else {
                return Ok(None);
            };
            at += 1;
            if op.step == Step::End {
                break;
            }
            let Some((value_at, value)) = self.element(op, doc, el, end) else {
                return Ok(None);
            };
            let len = value.len();
            match op.step {
                // Written whole, apart: the loop keeps to what most
                // elements need.
                Step::Value | Step::Into | Step::End => {
                    let run = &doc[copied..el];
                    let out = Slab {
                        buf: &mut *buf,
                        pos,
                    };
                    match self.whole(op, run, &doc[el..value_at], value, names, at, out)? {
                        Some((next, end)) => (at, pos) = (next, end),
                        None => return Ok(None),
                    }
                    copied = value_at + len;
                    el = copied;
                    continue;
                }
                step if !copies(step, value) => return Ok(None),
                _ => {}
            }
            // Copied as it is, under its name.
            if op.becomes.is_some() {
                let mut out = Slab {
                    buf: &mut *buf,
                    pos,
                };
                self.rename(op, &doc[copied..el], &mut out)?;
                (pos, copied) = (out.pos, value_at);
            }
            el = value_at + len;
        }
        // No element past the layout's.
        if el != end {
            return Ok(None);
        }
        let mut out = Slab { buf, pos };
        out.put(&doc[copied..end])?;
        out.finish(start)?;
        Ok(Some((at, out.pos)))
    }

    /// Writes an element the loop of [`Batch::doc`] does not: a value
    /// token's (`op` a [`Step::Value`]) or a document's or an array's gone
    /// into ([`Step::Into`]), after `run`, the bytes before its `header`:
    /// where the steps after it start, and where the output ends. `None`:
    /// `value` parts from them.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn whole<N: Names + ?Sized>(
        &self,
        op: &Op,
        run: &[u8],
        header: &[u8],
        value: &[u8],
        names: &N,
        at: usize,
        mut out: Slab<'_>,
    ) -> Result<Option<(usize, usize)>, Full> {
        match op.step {
            Step::Value => {
                let token = match value.get(4) {
                    Some(&VALUE_SUBTYPE) => value.get(5..).and_then(value_number),
                    _ => None,
                };
                let Some(v) = token.and_then(|n| names.value(n)) else {
                    return Ok(None);
                };
                if op.becomes.is_none() {
                    return Ok(None);
                }
                self.rename(op, run, &mut out)?;
                out.string_value(v)?;
                Ok(Some((at, out.pos)))
            }
            Step::Into => {
                match op.becomes {
                    None => {
                        out.put(run)?;
                        out.put(header)?;
                    }
                    Some(_) => self.rename(op, run, &mut out)?,
                }
                self.doc(value, names, at, (out.buf, out.pos))
            }
            _ => Ok(None),
        }
    }

    /// A run of bytes, then the header `op`'s element becomes.
    #[inline(always)]
    fn rename(&self, op: &Op, run: &[u8], out: &mut Slab<'_>) -> Result<(), Full> {
        out.put(run)?;
        match op.becomes {
            Some((_, len)) if len <= 16 => out.put_short(&op.short, len as usize),
            Some(becomes) => out.put(self.bytes(becomes)),
            None => Ok(()),
        }
    }

    /// The element `op` is for at `doc[el..]`, before the document's NUL
    /// at `end`: where its value is, and the value. `None` where its
    /// header is another or its value cannot be read.
    #[inline(always)]
    fn element<'d>(
        &self,
        op: &Op,
        doc: &'d [u8],
        el: usize,
        end: usize,
    ) -> Option<(usize, &'d [u8])> {
        let value_at = el + op.header.1 as usize;
        // The header, and its NUL, before the document's own NUL.
        let rest = doc.get(value_at..end)?;
        if !self.same(op, doc, el) {
            return None;
        }
        let len = value_len_by(op.rule, op.kind, rest).ok()?;
        Some((value_at, &rest[..len]))
    }

    /// Whether the header of `op` is at `doc[at..]`, which holds it.
    #[inline(always)]
    fn same(&self, op: &Op, doc: &[u8], at: usize) -> bool {
        match doc.get(at..at + 8) {
            Some(w) if op.header.1 <= 8 => {
                let w = u64::from_le_bytes(w.try_into().unwrap_or_default());
                (w ^ op.word) & op.mask == 0
            }
            _ => doc[at..at + op.header.1 as usize] == *self.bytes(op.header),
        }
    }
}

/// Whether a value of a step that copies it as it is may be copied: the
/// plain values of a [`Step::Scalars`] array (tested again, as the walk of
/// the expansion tests it), a binary of a [`Step::Binary`] that is no value
/// token.
#[inline(always)]
fn copies(step: Step, value: &[u8]) -> bool {
    match step {
        Step::Scalars => scalars(value),
        Step::Binary => value.get(4) != Some(&VALUE_SUBTYPE),
        _ => true,
    }
}

/// What a key of a user's document becomes, where the walk needs no
/// more than its bytes to say: a known token its name (`Some(Some)`), a
/// plain key itself (`Some(None)`). `None`: an unknown token, an escaped
/// or a dotted key, which the walk reads further.
#[inline(always)]
fn data_key<'n, N: Names + ?Sized>(stored: &[u8], names: &'n N) -> Option<Option<&'n str>> {
    let first = stored.first().copied().unwrap_or(0);
    if starts_token(first) {
        return names.name(stored).map(Some);
    }
    plain(first, stored).then_some(None)
}

/// A key that is neither a token nor escaped, and holds no dot.
#[inline(always)]
pub(crate) fn plain(first: u8, stored: &[u8]) -> bool {
    first != ESCAPE && !starts_token(first) && !stored.contains(&b'.')
}

#[cfg(test)]
mod tests {
    use bson::spec::BinarySubtype;
    use bson::{doc, Binary, Bson, Document, RawDocumentBuf};
    use proptest::prelude::*;

    use super::*;
    use crate::rewrite::expand::raw::expand_in;
    use crate::rewrite::expand::{Strings, Unknown};
    use crate::token::namespace::value_bytes;
    use crate::token::Dictionary;

    /// Forty names and two values.
    fn dictionary() -> Dictionary {
        let mut dict = Dictionary::default();
        dict.add_names(&(0..40).map(|i| format!("field{i}")).collect::<Vec<_>>());
        dict.add_values(&["gold".to_owned(), "silver".to_owned()]);
        dict
    }

    fn token(dict: &Dictionary, i: usize) -> String {
        dict.token(&format!("field{i}"))
            .unwrap()
            .as_str()
            .to_owned()
    }

    /// A token the dictionary does not know.
    fn unknown_token(dict: &Dictionary) -> String {
        (0x01u8..=0x1E)
            .flat_map(|a| (0x21u8..=0x7E).map(move |b| [a, b]))
            .find(|t| crate::token::namespace::token_len(t) == Some(2) && dict.name(t).is_none())
            .map(|t| String::from_utf8(t.to_vec()).unwrap())
            .unwrap()
    }

    fn value_token(n: u32) -> Bson {
        let (bytes, len) = value_bytes(n);
        Bson::Binary(Binary {
            subtype: BinarySubtype::UserDefined(VALUE_SUBTYPE),
            bytes: bytes[..len].to_vec(),
        })
    }

    fn reply(docs: Vec<Document>) -> Vec<u8> {
        bytes(doc! {"cursor": {"firstBatch": docs, "id": 0i64, "ns": "d.c"}, "ok": 1.0})
    }

    fn bytes(doc: Document) -> Vec<u8> {
        RawDocumentBuf::from_document(&doc).unwrap().into_bytes()
    }

    /// An expansion's bytes, or the tokens it did not know.
    type Expanded = Result<Vec<u8>, Unknown>;

    /// The expansion of `raw` with the layouts of its batches, the walk's,
    /// and how many documents a layout served.
    fn both(raw: &[u8], dict: &Dictionary) -> (Expanded, Expanded, usize) {
        let mut batch = Batch::default();
        let by_layout = run(raw, dict, &mut batch);
        (
            by_layout,
            run(raw, dict, &mut Batch::walk_only()),
            batch.hits,
        )
    }

    /// The expansion of `raw` with the layouts in `batch`.
    fn run(raw: &[u8], dict: &Dictionary, batch: &mut Batch) -> Expanded {
        let (mut out, mut unknown) = (Vec::new(), Unknown::default());
        let ran = expand_in(
            raw,
            dict,
            Strings::Data,
            &mut unknown,
            (&mut out, 0),
            &mut |n| n,
            batch,
        );
        match (ran, unknown.is_empty()) {
            (Ok(()), true) => Ok(out),
            (Ok(()), false) => Err(unknown),
            (Err(e), _) => panic!("refused: {e:?}"),
        }
    }

    /// A document of the batch below, stored and as the driver reads it.
    fn user(dict: &Dictionary, i: i32) -> (Document, Document) {
        let t = |n| token(dict, n);
        let stored = doc! {
            "_id": i,
            t(1): format!("user-{i}"),
            t(2): {t(3): i * 2, "plain": [1, 2, 3], t(4): [{t(5): i}, {t(5): "x"}]},
            "tags": ["a", "b"],
            t(6): Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2] },
            t(7): value_token(1),
        };
        let logical = doc! {
            "_id": i,
            "field1": format!("user-{i}"),
            "field2": {"field3": i * 2, "plain": [1, 2, 3], "field4": [{"field5": i}, {"field5": "x"}]},
            "tags": ["a", "b"],
            "field6": Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2] },
            "field7": "silver",
        };
        (stored, logical)
    }

    /// Value tokens, each known to the dictionary, are written as their
    /// strings by the layout; one it does not know is reported by the walk.
    #[test]
    fn a_layout_writes_value_tokens_as_their_strings() {
        let dict = dictionary();
        let (stored, logical): (Vec<_>, Vec<_>) = (0..20).map(|i| user(&dict, i)).unzip();
        let (by_layout, walked, hits) = both(&reply(stored.clone()), &dict);
        assert_eq!(by_layout.as_ref().unwrap(), walked.as_ref().unwrap());
        assert_eq!(by_layout.unwrap(), reply(logical.clone()));
        assert_eq!(hits, 19);
        // In an array (where the key is the index), and another value.
        let t = token(&dict, 7);
        let (mut stored, mut logical) = (stored, logical);
        for (i, (s, l)) in stored.iter_mut().zip(&mut logical).enumerate() {
            let n = (i % 2) as u32;
            s.insert(&t, vec![value_token(n), Bson::Int32(1)]);
            let v = ["gold", "silver"][n as usize];
            l.insert("field7", bson::bson!([v, 1]));
        }
        let (by_layout, walked, hits) = both(&reply(stored.clone()), &dict);
        assert_eq!(by_layout.as_ref().unwrap(), walked.as_ref().unwrap());
        assert_eq!(by_layout.unwrap(), reply(logical));
        assert_eq!(hits, 19);
        // A value the dictionary lacks, in the middle of the batch.
        stored[7].insert(&t, vec![value_token(3), Bson::Int32(1)]);
        let (by_layout, walked, _) = both(&reply(stored), &dict);
        assert_eq!(by_layout.unwrap_err(), walked.unwrap_err());
    }

    /// Documents of one layout are expanded by it, as the walk expands
    /// them; a document that parts from it anywhere is walked, and the
    /// documents after it are expanded by its layout or the one before.
    #[test]
    fn a_batch_is_expanded_by_its_layout_as_by_the_walk() {
        let dict = dictionary();
        let t = |n| token(&dict, n);
        let pair = |i: i32| {
            let (mut s, mut l) = user(&dict, i);
            s.remove(t(7));
            l.remove("field7");
            (s, l)
        };
        let alike: (Vec<_>, Vec<_>) = (0..20).map(pair).unzip();
        let (by_layout, walked, hits) = both(&reply(alike.0.clone()), &dict);
        assert_eq!(by_layout.as_ref().unwrap(), walked.as_ref().unwrap());
        assert_eq!(by_layout.unwrap(), reply(alike.1.clone()));
        // The first is walked; the nested array of documents is not a
        // batch of its own (the depth is the first batch's).
        assert_eq!(hits, 19);

        // Each way of parting from the layout, in the middle of the batch.
        let unknown = unknown_token(&dict);
        let edits = [
            ("another type", change(t(1), 5i64, "field1", 5i64)),
            ("an element more", change(t(9), 1, "field9", 1)),
            ("an element fewer", removal("tags", "tags")),
            (
                "a value token",
                change(t(6), value_token(0), "field6", "gold"),
            ),
            (
                "a document in a plain array",
                change(
                    "tags",
                    bson::bson!(["a", {t(8): 1}]),
                    "tags",
                    bson::bson!(["a", {"field8": 1}]),
                ),
            ),
            (
                "a longer plain array",
                change("tags", vec!["a", "b", "c"], "tags", vec!["a", "b", "c"]),
            ),
            (
                "another key below",
                change(
                    t(2),
                    doc! {t(3): 1, "plain": [1, 2, 3], t(4): [{t(11): 1}, {t(5): "x"}]},
                    "field2",
                    doc! {"field3": 1, "plain": [1, 2, 3], "field4": [{"field11": 1}, {"field5": "x"}]},
                ),
            ),
            ("an escaped key", change("\u{1f}\u{1}", 1, "\u{1}", 1)),
            ("a dotted key", change("a.b", 1, "a.b", 1)),
        ];
        each_edit_is_expanded_as_the_walk_expands_it(&dict, &alike, &edits, &[7], 17);
        // A key the dictionary lacks is reported, not expanded.
        let (mut stored, _) = alike.clone();
        stored[7].insert(&unknown, 1);
        let (by_layout, walked, _) = both(&reply(stored), &dict);
        assert_eq!(by_layout.unwrap_err(), walked.unwrap_err());
    }

    /// A change to both forms of a document, the stored one and the one
    /// the driver reads.
    type Edit = Box<dyn Fn(&mut Document, &mut Document)>;

    /// `key` set to `value` in the stored document, `name` to `read` in
    /// the one the driver reads.
    fn change(
        key: impl Into<String>,
        value: impl Into<Bson>,
        name: &str,
        read: impl Into<Bson>,
    ) -> Edit {
        let (key, value, name, read) = (key.into(), value.into(), name.to_owned(), read.into());
        Box::new(move |s, l| {
            s.insert(key.clone(), value.clone());
            l.insert(name.clone(), read.clone());
        })
    }

    /// `key` taken out of the stored document, `name` out of the read one.
    fn removal(key: impl Into<String>, name: &str) -> Edit {
        let (key, name) = (key.into(), name.to_owned());
        Box::new(move |s, l| {
            s.remove(&key);
            l.remove(&name);
        })
    }

    /// Each edit, made to the document at each of `places` in a batch of
    /// documents of one layout (stored, and as the driver reads them): the
    /// batch is expanded by the layouts as by the walk, to what the driver
    /// reads, with at least `hits` documents served by a layout.
    fn each_edit_is_expanded_as_the_walk_expands_it(
        dict: &Dictionary,
        alike: &(Vec<Document>, Vec<Document>),
        edits: &[(&str, Edit)],
        places: &[usize],
        hits: usize,
    ) {
        for (what, edit) in edits {
            for &at in places {
                let (mut stored, mut logical) = alike.clone();
                edit(&mut stored[at], &mut logical[at]);
                let (by_layout, walked, served) = both(&reply(stored), dict);
                assert_eq!(
                    by_layout.as_ref().unwrap(),
                    walked.as_ref().unwrap(),
                    "{what} at {at}"
                );
                assert_eq!(by_layout.unwrap(), reply(logical), "{what} at {at}");
                assert!(served >= hits, "{what} at {at}: {served}");
            }
        }
    }

    /// A document of one level, stored and as the driver reads it: its
    /// layout is followed as a stream ([`Batch::stream`]).
    fn flat_user(dict: &Dictionary, i: i32) -> (Document, Document) {
        let t = |n| token(dict, n);
        let stored = doc! {
            t(1): format!("user-{i}"),
            "_id": i,
            t(2): format!("user{i}@example.com"),
            t(3): i64::from(i) * 7,
            t(4): ["a", "b", "c"],
            t(6): Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2] },
        };
        let logical = doc! {
            "field1": format!("user-{i}"),
            "_id": i,
            "field2": format!("user{i}@example.com"),
            "field3": i64::from(i) * 7,
            "field4": ["a", "b", "c"],
            "field6": Binary { subtype: BinarySubtype::Generic, bytes: vec![1, 2] },
        };
        (stored, logical)
    }

    /// Documents of one level are followed as one stream, as the walk
    /// expands them; one that parts from the layout anywhere (or is not a
    /// document) is walked, and the stream goes on after it.
    #[test]
    fn a_batch_of_one_level_is_streamed_as_the_walk_expands_it() {
        let dict = dictionary();
        let t = |n| token(&dict, n);
        let alike: (Vec<_>, Vec<_>) = (0..20).map(|i| flat_user(&dict, i)).unzip();
        let mut batch = Batch::default();
        let by_layout = run(&reply(alike.0.clone()), &dict, &mut batch);
        assert!(batch.flat.is_some_and(|d| d > 0), "{:?}", batch.flat);
        assert_eq!(batch.hits, 19);
        assert_eq!(by_layout.unwrap(), reply(alike.1.clone()));

        // A layout of plain keys only: nothing renamed, nothing added.
        let plain: Vec<Document> = (0..10).map(|i| doc! {"a": i, "b": "x"}).collect();
        let mut batch = Batch::default();
        let by_layout = run(&reply(plain.clone()), &dict, &mut batch);
        assert_eq!((batch.flat, batch.hits), (Some(0), 9));
        assert_eq!(by_layout.unwrap(), reply(plain));

        let edits = [
            ("another type", change(t(3), 5i32, "field3", 5i32)),
            ("an element more", change(t(9), 1, "field9", 1)),
            ("an element fewer", removal(t(6), "field6")),
            ("a first element fewer", removal(t(1), "field1")),
            (
                "a value token",
                change(t(6), value_token(0), "field6", "gold"),
            ),
            (
                "a document in a plain array",
                change(
                    t(4),
                    bson::bson!(["a", {t(8): 1}]),
                    "field4",
                    bson::bson!(["a", {"field8": 1}]),
                ),
            ),
            (
                "a value token in a plain array",
                change(
                    t(4),
                    vec![Bson::from("a"), value_token(1)],
                    "field4",
                    vec!["a", "silver"],
                ),
            ),
            (
                "a longer string",
                change(t(2), "y".repeat(300), "field2", "y".repeat(300)),
            ),
            ("another key in place of the last", {
                let (last, other) = (removal(t(6), "field6"), change("plain", 1, "plain", 1));
                Box::new(move |s: &mut Document, l: &mut Document| {
                    last(s, l);
                    other(s, l);
                })
            }),
        ];
        each_edit_is_expanded_as_the_walk_expands_it(&dict, &alike, &edits, &[0, 7, 19], 17);
        // A value in the batch that is not a document: the array is
        // walked whole from there (as a server's batches never are), after
        // the eight documents the stream followed.
        let mut raw = doc! {"cursor": {"firstBatch": alike.0.clone(), "id": 0i64}};
        let mut read = doc! {"cursor": {"firstBatch": alike.1.clone(), "id": 0i64}};
        for (d, v) in [(&mut raw, 5), (&mut read, 5)] {
            let batch = d.get_document_mut("cursor").unwrap();
            batch
                .get_array_mut("firstBatch")
                .unwrap()
                .insert(9, Bson::Int32(v));
        }
        let (by_layout, walked, hits) = both(&bytes(raw), &dict);
        assert_eq!(by_layout.as_ref().unwrap(), walked.as_ref().unwrap());
        assert_eq!(by_layout.unwrap(), bytes(read));
        assert_eq!(hits, 8);
        // A key the dictionary lacks is reported, not expanded.
        let (mut stored, _) = alike.clone();
        stored[7].insert(unknown_token(&dict), 1);
        let (by_layout, walked, _) = both(&reply(stored), &dict);
        assert_eq!(by_layout.unwrap_err(), walked.unwrap_err());
    }

    /// A stream stopped by a full output is written again in more room,
    /// to the same bytes: each try from the start of the reply.
    #[test]
    fn a_stream_out_of_room_is_written_again_in_more() {
        let dict = dictionary();
        let (stored, logical): (Vec<_>, Vec<_>) = (0..50).map(|i| flat_user(&dict, i)).unzip();
        let raw = reply(stored);
        let (mut out, mut unknown) = (Vec::new(), Unknown::default());
        let mut batch = Batch::default();
        let mut asked = Vec::new();
        let mut grow = |n: usize| {
            asked.push(n);
            // Little room at first: the first try runs out of it.
            if asked.len() < 2 {
                n / 4
            } else {
                n
            }
        };
        expand_in(
            &raw,
            &dict,
            Strings::Data,
            &mut unknown,
            (&mut out, 0),
            &mut grow,
            &mut batch,
        )
        .unwrap();
        assert!(asked.len() >= 2, "{asked:?}");
        assert_eq!(out, reply(logical));
        assert!(batch.hits > 0);
    }

    /// A batch of many layouts is learned from a few times, then only
    /// walked: no layout is tried on every document.
    #[test]
    fn a_batch_of_many_layouts_stops_being_learned() {
        let dict = dictionary();
        let docs: Vec<Document> = (0..40).map(|i| doc! {token(&dict, i): i as i32}).collect();
        let mut batch = Batch::default();
        run(&reply(docs), &dict, &mut batch).unwrap();
        assert_eq!((batch.hits, batch.learned), (0, 2));
        assert!(batch.misses <= 5, "{}", batch.misses);
    }

    /// A batch's array that holds something besides documents (no server
    /// sends one, a reply crafted to may) is expanded as the walk expands
    /// it, wherever that thing is, and each unknown token is reported once,
    /// as the walk reports it, though the documents before it were
    /// followed, walked or learned from first.
    #[test]
    fn a_batch_of_documents_and_other_values_is_expanded_as_the_walk_expands_it() {
        let dict = dictionary();
        let unknown = unknown_token(&dict);
        let docs: Vec<Bson> = (0..12)
            .map(|i| {
                let (mut stored, _) = user(&dict, i);
                if i == 4 {
                    stored.insert(&unknown, 1);
                }
                Bson::Document(stored)
            })
            .collect();
        let others = [
            Bson::Int32(7),
            value_token(1),
            value_token(3),
            bson::bson!([{token(&dict, 1): 1}]),
        ];
        for other in others {
            for at in [0, 1, 6, 12] {
                let mut batch = docs.clone();
                batch.insert(at, other.clone());
                let raw = bytes(doc! {
                    "cursor": {"firstBatch": batch, "id": 0i64, "ns": "d.c"},
                    "ok": 1.0,
                });
                let (by_layout, walked, _) = both(&raw, &dict);
                assert_eq!(by_layout, walked, "{other:?} at {at}");
                let Err(lacked) = walked else {
                    panic!("{other:?} at {at}: the unknown token is not reported");
                };
                assert_eq!(lacked.names.len(), 1, "{other:?} at {at}: {lacked:?}");
            }
        }
    }

    /// A reply of one document (a `find_one`'s) walks it and learns
    /// nothing: no other document would follow the layout. Nor does an
    /// array of documents that is not a cursor's batch.
    #[test]
    fn a_reply_of_one_document_learns_nothing() {
        let dict = dictionary();
        let (stored, logical) = user(&dict, 1);
        let mut batch = Batch::default();
        let out = run(&reply(vec![stored.clone()]), &dict, &mut batch);
        assert_eq!(out.unwrap(), reply(vec![logical]));
        assert_eq!((batch.learned, batch.ops.len()), (0, 0));
        // Two documents: the first is learned from, the second follows it.
        let mut stored = stored;
        stored.remove(token(&dict, 7));
        let mut batch = Batch::default();
        run(&reply(vec![stored.clone(), stored]), &dict, &mut batch).unwrap();
        assert_eq!((batch.learned, batch.hits), (1, 1));
        // Documents in an array of a document (a `findAndModify`'s value)
        // are no cursor's batch: nothing is learned.
        let items: Vec<_> = (0..3).map(|i| user(&dict, i).0).collect();
        let mut batch = Batch::default();
        run(
            &bytes(doc! {"value": {"items": items}, "ok": 1.0}),
            &dict,
            &mut batch,
        )
        .unwrap();
        assert_eq!((batch.learned, batch.hits), (0, 0));
    }

    fn leaf() -> impl Strategy<Value = Bson> {
        prop_oneof![
            any::<i32>().prop_map(Bson::Int32),
            any::<i64>().prop_map(Bson::Int64),
            "[a-z]{0,9}".prop_map(Bson::String),
            Just(Bson::Null),
            any::<bool>().prop_map(Bson::Boolean),
            (0u32..4).prop_map(value_token),
            proptest::collection::vec(any::<u8>(), 0..4).prop_map(|bytes| Bson::Binary(Binary {
                subtype: BinarySubtype::Generic,
                bytes
            })),
        ]
    }

    /// Keys of every kind: known tokens, plain, dotted, escaped, unknown.
    fn key(dict: &Dictionary) -> proptest::sample::Select<String> {
        let mut keys: Vec<String> = (0..6).map(|i| token(dict, i)).collect();
        keys.extend(["plain", "a.b", "", "\u{1f}\u{1}x"].map(String::from));
        keys.push(unknown_token(dict));
        proptest::sample::select(keys)
    }

    fn value(dict: &Dictionary) -> impl Strategy<Value = Bson> {
        let key = key(dict);
        leaf().prop_recursive(3, 24, 4, move |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..4).prop_map(Bson::Array),
                proptest::collection::vec((key.clone(), inner), 0..4)
                    .prop_map(|kv| Bson::Document(kv.into_iter().collect())),
            ]
        })
    }

    /// The same layout, other values: numbers and strings changed by
    /// `salt`, and one in five of its 32-bit numbers made 64-bit.
    fn vary(b: &Bson, salt: u32) -> Bson {
        match b {
            Bson::Int32(v) if salt.is_multiple_of(5) => Bson::Int64(i64::from(*v)),
            Bson::Int32(v) => Bson::Int32(v ^ salt as i32),
            Bson::String(_) => Bson::String("y".repeat(salt as usize % 7)),
            Bson::Document(d) => {
                Bson::Document(d.iter().map(|(k, v)| (k.clone(), vary(v, salt))).collect())
            }
            Bson::Array(a) => Bson::Array(a.iter().map(|v| vary(v, salt)).collect()),
            other => other.clone(),
        }
    }

    proptest! {
        /// Any batch of documents of a few layouts, with other values and
        /// some of their numbers of another type: the same bytes as the
        /// walk's, or the same tokens reported unknown.
        #[test]
        fn any_batch_is_expanded_as_the_walk_expands_it(
            pool in proptest::collection::vec(
                proptest::collection::vec((key(&dictionary()), value(&dictionary())), 0..6),
                1..4,
            ),
            picks in proptest::collection::vec((0usize..4, any::<u32>()), 0..16),
        ) {
            let dict = dictionary();
            let pool: Vec<Bson> = pool
                .into_iter()
                .map(|kv| Bson::Document(kv.into_iter().collect()))
                .collect();
            let docs: Vec<Document> = picks
                .iter()
                .filter_map(|(i, salt)| match vary(&pool[i % pool.len()], *salt) {
                    Bson::Document(d) => Some(d),
                    _ => None,
                })
                .collect();
            let (by_layout, walked, _) = both(&reply(docs), &dict);
            prop_assert_eq!(by_layout, walked);
        }

        /// The same, of documents of one level: the layouts are followed
        /// as a stream.
        #[test]
        fn any_batch_of_one_level_is_expanded_as_the_walk_expands_it(
            pool in proptest::collection::vec(
                proptest::collection::vec((key(&dictionary()), leaf()), 0..6),
                1..4,
            ),
            picks in proptest::collection::vec((0usize..4, any::<u32>()), 0..24),
        ) {
            let dict = dictionary();
            let docs: Vec<Document> = picks
                .iter()
                .map(|(i, salt)| {
                    let kv = &pool[i % pool.len()];
                    kv.iter().map(|(k, v)| (k.clone(), vary(v, *salt))).collect()
                })
                .collect();
            let (by_layout, walked, _) = both(&reply(docs), &dict);
            prop_assert_eq!(by_layout, walked);
        }
    }
}
