//! Expanding raw bytes: replies, element by element, without building owned
//! documents. Keys are replaced as the bytes are copied; values are copied
//! as they are (or, for a value token, written as the string it stands for).

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::{Strings, Unknown};
use crate::rewrite::batch::{self, Batch};
use crate::rewrite::walker::{
    as_str, descend, elements, nul_at, string_of, value_len, Element, Full, Malformed, Renamed,
    Slab,
};
use crate::token::namespace::{any_part_reserved, starts_token, value_number, VALUE_SUBTYPE};
use crate::token::Names;

/// How much the last replies grew when expanded, in sixteenths of their
/// stored size: what the next one is given room for, and a little more. A
/// reply that outgrows its room is expanded again in twice the room, so the
/// guess costs nothing but time: a reply of names much longer than their
/// tokens grows more than twice, and each would be expanded twice if the
/// room were a fixed multiple; one of short names grows little, and zeroing
/// room it does not use costs about a tenth of its expansion.
static GROWTH: Growth = Growth::new();

/// The room to give the expansion of a reply of `stored` bytes.
pub fn room(stored: usize) -> usize {
    GROWTH.room(stored)
}

/// A running guess of how much replies grow, in sixteenths.
struct Growth(AtomicUsize);

impl Growth {
    /// Twice, to begin with.
    const fn new() -> Growth {
        Growth(AtomicUsize::new(32))
    }

    fn room(&self, stored: usize) -> usize {
        stored * (self.0.load(Ordering::Relaxed) + 2) / 16 + 64
    }

    /// Learns from a reply of `stored` bytes that expanded to `expanded`:
    /// the guess rises to any growth above it at once, and falls toward
    /// growths below it by a sixteenth of the gap per reply (so that
    /// replies of two kinds, in turns, are given room for the larger).
    /// Replies under 4 KiB teach nothing: their envelope weighs more in
    /// their growth than in a batch's, and expanding one again costs little.
    /// Nor does growth past four times: the guess is shared by every
    /// client, and one client's odd documents must not have every reply
    /// zero many times its size.
    fn learn(&self, stored: usize, expanded: usize) {
        if stored < 4096 {
            return;
        }
        let grew = (expanded * 16).div_ceil(stored).min(64);
        let guess = self.0.load(Ordering::Relaxed);
        let next = if grew >= guess {
            grew
        } else {
            guess - (guess - grew).div_ceil(16)
        };
        if next != guess {
            self.0.store(next, Ordering::Relaxed);
        }
    }
}

/// Expands a reply: every key, value tokens, and strings as `strings` says.
/// It is written in `out` from `base` on, and `out` ends where it ends.
/// Bytes of `out` past `base` are written over: a buffer that held
/// something before (from [`crate::wire::spare`]) needs no zeroing as far
/// as they reach.
///
/// The output is written into room that `grow` grants: asked for the
/// bytes the expansion would like, it answers how many it may have (at
/// most those). A document that does not fit in all it grants is not
/// expanded ([`Refused::Room`]).
pub fn expand<N: Names + ?Sized>(
    doc: &[u8],
    names: &N,
    strings: Strings,
    unknown: &mut Unknown,
    out: (&mut Vec<u8>, usize),
    grow: &mut dyn FnMut(usize) -> usize,
) -> Result<(), Refused> {
    expand_in(
        doc,
        names,
        strings,
        unknown,
        out,
        grow,
        &mut Batch::default(),
    )
}

/// [`expand`], the layouts of batches in `batch` (learned ones hold for
/// every try: the dictionary is the same). With [`Batch::walk_only`],
/// every document is walked: what the layouts must give, for the tests
/// and the fuzz targets to compare.
pub(crate) fn expand_in<N: Names + ?Sized>(
    doc: &[u8],
    names: &N,
    strings: Strings,
    unknown: &mut Unknown,
    (out, base): (&mut Vec<u8>, usize),
    grow: &mut dyn FnMut(usize) -> usize,
    batch: &mut Batch,
) -> Result<(), Refused> {
    let (names_known, values_known) = (unknown.names.len(), unknown.values.len());
    let mut tried = 0;
    let mut room = grow(room(doc.len()));
    loop {
        if room <= tried {
            out.truncate(base);
            return Err(Refused::Room);
        }
        make_room(out, base, room);
        let ran = Expander {
            names,
            unknown: &mut *unknown,
            batch: &mut *batch,
        }
        .doc::<false>(
            doc,
            false,
            strings,
            true,
            (&mut out[base..base + room], 0),
            0,
        );
        match ran {
            Ok(end) => {
                out.truncate(base + end);
                GROWTH.learn(doc.len(), end);
                return Ok(());
            }
            Err(Stop::Full) => {
                unknown.names.truncate(names_known);
                unknown.values.truncate(values_known);
                tried = room;
                room = grow(room * 2);
            }
            Err(Stop::Malformed(m)) => {
                out.truncate(base);
                return Err(Refused::Malformed(m));
            }
        }
    }
}

/// Makes `out` at least `base + room` bytes long, keeping its first
/// `base`: bytes it has already are kept as they are, room past them is
/// zeroed. A buffer too small for that is given back before a larger one is
/// taken: what it held past `base` is a failed try's, not worth a copy.
/// (Taking the new one zeroed from the allocator instead cost 3.8% more on
/// the benchmark's 1,000-document batch.)
fn make_room(out: &mut Vec<u8>, base: usize, room: usize) {
    if out.len() >= base + room {
        return;
    }
    if out.capacity() >= base + room {
        out.resize(base + room, 0);
        return;
    }
    let mut fresh = Vec::with_capacity(base + room);
    fresh.extend_from_slice(&out[..base]);
    *out = Vec::new();
    fresh.resize(base + room, 0);
    *out = fresh;
}

/// Why a document was not expanded.
#[derive(Debug)]
pub enum Refused {
    /// The walker cannot go through it.
    Malformed(Malformed),
    /// Its expansion needs more room than it was granted.
    Room,
}

/// Why an expansion stopped: input it cannot go through, or output that
/// did not fit in the room it was given.
enum Stop {
    Malformed(Malformed),
    Full,
}

impl From<Malformed> for Stop {
    fn from(m: Malformed) -> Stop {
        Stop::Malformed(m)
    }
}

impl From<Full> for Stop {
    fn from(_: Full) -> Stop {
        Stop::Full
    }
}

/// One dictionary, what it lacked, and the layout of a batch's documents.
struct Expander<'a, N: ?Sized> {
    names: &'a N,
    unknown: &'a mut Unknown,
    batch: &'a mut Batch,
}

impl<'a, N: Names + ?Sized> Expander<'a, N> {
    /// Expands one document (or array) into `out`. The bytes of elements
    /// that stay as they are are not copied one by one: they are copied in
    /// runs, up to the next element that changes, so a document whose keys
    /// are plain is one copy.
    ///
    /// `envelope`: the document is the reply itself or one of its error
    /// reports (`writeErrors`, `writeConcernError`), whose `errmsg` the
    /// server wrote and may name fields in. Anywhere else (a cursor's
    /// documents, a `findAndModify` value) an `errmsg` is the user's data.
    ///
    /// `DATA`: the document is the user's data (strings are
    /// [`Strings::Data`], and it is no envelope), as everything under a
    /// cursor's documents is. The walk of those, most of a reply's bytes,
    /// is compiled apart, without the tests that cannot hold in it.
    ///
    /// Writes into `out.0` from `out.1`, and returns where it stopped.
    /// (The slice and the position are passed apart, in registers, and
    /// held in a local [`Slab`].)
    fn doc<const DATA: bool>(
        &mut self,
        doc: &[u8],
        is_array: bool,
        strings: Strings,
        envelope: bool,
        (buf, pos): (&mut [u8], usize),
        depth: usize,
    ) -> Result<usize, Stop> {
        let (strings, envelope) = if DATA {
            (Strings::Data, false)
        } else {
            (strings, envelope)
        };
        let mut out = Slab { buf, pos };
        let names = self.names;
        // The array of a cursor's batch, if it holds only documents.
        if is_array
            && (DATA || (strings == Strings::Data && !envelope))
            && self.batch.claims(depth + 1)
        {
            if let Some(end) = self.batch_docs(doc, (&mut *out.buf, out.pos), depth)? {
                return Ok(end);
            }
        }
        let start = out.begin()?;
        // `doc[..copied]` is in `out` already (its length prefix written anew).
        let mut copied = 4;
        for e in elements(doc) {
            let e = e?;
            let (key, inner) = if is_array {
                (None, strings)
            } else {
                self.key(e.key, strings)?
            };
            let logical = key.as_deref().unwrap_or(e.key);
            match e.kind {
                // An array of plain values (a document's tags, numbers)
                // has nothing to expand: it stays in the run being copied.
                0x04 if inner == Strings::Data && !envelope && scalars(e.value) => {
                    rename(doc, &e, key.as_deref(), &mut copied, &mut out)?
                }
                0x03 | 0x04 => {
                    match &key {
                        None => out.put(&doc[copied..e.value_at()])?,
                        Some(k) => {
                            // The run up to the key, type byte included.
                            out.put(&doc[copied..=e.at])?;
                            out.cstring(k)?;
                        }
                    }
                    let envelope = envelope
                        && (is_array || matches!(logical, b"writeErrors" | b"writeConcernError"));
                    // A document of an array, and whether one follows it.
                    let item = (is_array && e.kind == 0x03).then(|| e.end() + 1 < doc.len());
                    let (buf, depth) = ((&mut *out.buf, out.pos), descend(depth)?);
                    let is_array = e.kind == 0x04;
                    if is_array && matches!(logical, b"firstBatch" | b"nextBatch") {
                        self.batch.claim(depth + 1);
                    }
                    out.pos = if DATA || (inner == Strings::Data && !envelope) {
                        self.data(e.value, is_array, item, buf, depth)?
                    } else {
                        self.doc::<false>(e.value, is_array, inner, envelope, buf, depth)?
                    };
                    copied = e.end();
                }
                0x05 if e.value.get(4) == Some(&VALUE_SUBTYPE) => {
                    let bytes = e.value.get(5..).unwrap_or_default();
                    match value_number(bytes).map(|n| (n, names.value(n))) {
                        Some((_, Some(v))) => {
                            out.put(&doc[copied..e.at])?;
                            out.header(0x02, logical)?;
                            out.string_value(v)?;
                            copied = e.end();
                        }
                        other => {
                            if let Some((n, None)) = other {
                                self.unknown.values.push(n);
                            }
                            rename(doc, &e, key.as_deref(), &mut copied, &mut out)?;
                        }
                    }
                }
                0x02 if (inner == Strings::Paths || (envelope && logical == b"errmsg"))
                    && super::text_needs_expanding(&e.value[4..]) =>
                {
                    let text = string_of(e.value)?;
                    // No longer than the room left: a string may echo a
                    // value whose every byte reads as a long name.
                    let most = out.buf.len() - out.pos;
                    let expanded = if inner == Strings::Paths {
                        super::path_string(text, names, &mut self.unknown.names, most)
                            .map_err(|_| Full)?
                    } else {
                        Some(super::expand_text_within(text, names, most).ok_or(Full)?)
                    };
                    match expanded {
                        Some(s) => {
                            out.put(&doc[copied..e.at])?;
                            out.header(e.kind, logical)?;
                            out.string_value(&s)?;
                            copied = e.end();
                        }
                        None => rename(doc, &e, key.as_deref(), &mut copied, &mut out)?,
                    }
                }
                _ => rename(doc, &e, key.as_deref(), &mut copied, &mut out)?,
            }
        }
        // The run left, without the final NUL that `finish` writes.
        out.put(
            doc.get(copied..doc.len().saturating_sub(1))
                .unwrap_or_default(),
        )?;
        out.finish(start)?;
        Ok(out.pos)
    }

    /// Expands `array`, the array of a cursor's batch, as [`Expander::doc`]
    /// would if it holds only documents: as many in a row as have the
    /// layout of the last are followed by it ([`Batch::follow_run`]), the
    /// first that does not is walked (and learned from, see
    /// [`Expander::data`]), and so on. `None`: it holds something else (the
    /// server's batches never do), for the walk of the whole array to
    /// expand it, and what the documents before it lacked is forgotten
    /// (the walk finds it again). A loop of its own, apart from the walk
    /// of every other array.
    #[inline(never)]
    fn batch_docs(
        &mut self,
        array: &[u8],
        (buf, pos): (&mut [u8], usize),
        depth: usize,
    ) -> Result<Option<usize>, Stop> {
        let (names_known, values_known) = (self.unknown.names.len(), self.unknown.values.len());
        let mut out = Slab { buf, pos };
        let start = out.begin()?;
        let mut items = elements(array);
        loop {
            if self.batch.ready() {
                out.pos =
                    self.batch
                        .follow_run(&mut items, self.names, (&mut *out.buf, out.pos))?;
            }
            let Some(e) = items.next() else {
                break;
            };
            let e = e?;
            if e.kind != 0x03 {
                self.unknown.names.truncate(names_known);
                self.unknown.values.truncate(values_known);
                return Ok(None);
            }
            out.put(&array[e.at..e.value_at()])?;
            let item = Some(e.end() + 1 < array.len());
            let (buf, depth) = ((&mut *out.buf, out.pos), descend(depth)?);
            out.pos = self.data(e.value, false, item, buf, depth)?;
        }
        out.finish(start)?;
        Ok(Some(out.pos))
    }

    /// Expands a document or an array of the user's data. A document
    /// of an array (a batch's: `item`, `Some` of whether another follows
    /// it) comes here when the layout of the last one did not fit it (the
    /// walk of the batch's array tried it, [`Batch::follow_run`]): it is
    /// walked, and its layout may be kept for the next (if there is one:
    /// a reply of one document learns nothing).
    #[inline(always)]
    fn data(
        &mut self,
        doc: &[u8],
        is_array: bool,
        item: Option<bool>,
        (buf, pos): (&mut [u8], usize),
        depth: usize,
    ) -> Result<usize, Stop> {
        let Some(more) = item.filter(|_| self.batch.claims(depth)) else {
            return self.doc::<true>(doc, is_array, Strings::Data, false, (buf, pos), depth);
        };
        let end = self.doc::<true>(doc, false, Strings::Data, false, (buf, pos), depth)?;
        if more {
            self.batch.learn(doc, depth, self.names);
        }
        Ok(end)
    }

    /// The logical form of a document's key (`None`: the key as it is),
    /// and how strings under it are read.
    #[inline(always)]
    fn key<'k>(
        &mut self,
        stored: &'k [u8],
        strings: Strings,
    ) -> Result<(Renamed<'k>, Strings), Malformed>
    where
        'a: 'k,
    {
        let names: &'a N = self.names;
        let first = stored.first().copied().unwrap_or(0);
        if starts_token(first) {
            if let Some(name) = names.name(stored) {
                // The common case: a whole key that is a known token (in
                // a user's document, with no call per key to read it).
                let inner = match strings {
                    Strings::Data => Strings::Data,
                    _ => strings.under(name),
                };
                return Ok((Some(Cow::Borrowed(name.as_bytes())), inner));
            }
        }
        let plain = batch::plain(first, stored);
        if plain && strings == Strings::Data {
            // The other common case: a user key stored as it is, in a document.
            return Ok((None, strings));
        }
        let k = as_str(stored)?;
        if plain {
            return Ok((None, strings.under(k)));
        }
        let logical = if strings.keys_are_paths() {
            super::path_key(k, names, &mut self.unknown.names)
        } else {
            super::key(k, names, &mut self.unknown.names)
        };
        let inner = strings.under(&logical);
        let bytes = match logical {
            Cow::Borrowed(s) => Cow::Borrowed(s.as_bytes()),
            Cow::Owned(s) => Cow::Owned(s.into_bytes()),
        };
        Ok((Some(bytes), inner))
    }
}

/// An element whose value stays as it is: nothing to do if its key stays
/// too (it joins the run being copied); otherwise the run up to it, then
/// its type and new key, and its value starts the next run.
#[inline(always)]
fn rename(
    doc: &[u8],
    e: &Element<'_>,
    key: Option<&[u8]>,
    copied: &mut usize,
    out: &mut Slab<'_>,
) -> Result<(), Full> {
    if let Some(k) = key {
        out.put(&doc[*copied..=e.at])?;
        out.cstring(k)?;
        *copied = e.value_at();
    }
    Ok(())
}

/// Whether an array holds only values expansion leaves as they are: no
/// document, array or value token (and nothing malformed). Inlined into
/// the walk of a document in a release build: 4% less time to expand the
/// benchmark's cursor batch, whose documents each hold an array of strings.
/// Its own loop rather than [`elements`]: only the type and the length
/// of each value count, and an array's keys are short (its indexes).
#[cfg_attr(not(debug_assertions), inline(always))]
pub(crate) fn scalars(array: &[u8]) -> bool {
    let end = array.len().saturating_sub(1);
    let mut at = 4;
    while at < end {
        let kind = array[at];
        let nul = match &array[at + 1..end] {
            [k, 0, ..] if *k != 0 => 1,
            [a, b, 0, ..] if *a != 0 && *b != 0 => 2,
            key => match nul_at(key) {
                Some(nul) => nul,
                None => return false,
            },
        };
        let value_at = at + nul + 2;
        match kind {
            0x03 | 0x04 => return false,
            0x05 if array.get(value_at + 4) == Some(&VALUE_SUBTYPE) => return false,
            _ => {}
        }
        match value_len(kind, &array[value_at..end]) {
            Ok(len) => at = value_at + len,
            Err(_) => return false,
        }
    }
    true
}

/// Whether anything in a reply needs expanding: a key that is a token or
/// escaped (or a dotted key holding one), a value token, or an `errmsg`
/// naming tokens. Malformed input needs nothing (it is forwarded as it is).
pub fn needed(doc: &[u8]) -> bool {
    needed_in(doc, false, None, 0).unwrap_or(false)
}

/// [`needed`] for a reply whose strings are read as `strings`: a write
/// reply needs it also for an `errInfo` (whose strings spell paths), and is
/// expanded, and so refused, if malformed; other kinds always are.
pub fn needed_as(doc: &[u8], strings: Strings) -> bool {
    match strings {
        Strings::Data => needed(doc),
        Strings::Writes => needed_in(doc, false, Some(b"errInfo"), 0).unwrap_or(true),
        Strings::Paths | Strings::Events | Strings::Update | Strings::PathKeys => true,
    }
}

fn needed_in(
    doc: &[u8],
    is_array: bool,
    paths: Option<&[u8]>,
    depth: usize,
) -> Result<bool, Malformed> {
    for e in elements(doc) {
        let e = e?;
        if !is_array && (any_part_reserved(e.key) || Some(e.key) == paths) {
            return Ok(true);
        }
        let found = match e.kind {
            0x03 | 0x04 => needed_in(e.value, e.kind == 0x04, paths, descend(depth)?)?,
            0x05 => e.value.get(4) == Some(&VALUE_SUBTYPE),
            0x02 if e.key == b"errmsg" => super::text_needs_expanding(&e.value[4..]),
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
    use bson::{doc, RawDocumentBuf};

    use super::*;

    fn bytes(d: bson::Document) -> Vec<u8> {
        RawDocumentBuf::from_document(&d).unwrap().into_bytes()
    }

    #[test]
    fn a_write_reply_is_expanded_only_if_it_may_name_a_field() {
        let plain = bytes(doc! {"n": 1, "ok": 1.0});
        assert!(!needed_as(&plain, Strings::Writes));
        let dup = bytes(
            doc! {"n": 0, "writeErrors": [{"index": 0, "code": 11000, "keyValue": {"\u{1}": 1}}], "ok": 1.0},
        );
        assert!(needed_as(&dup, Strings::Writes));
        let message = bytes(doc! {"writeErrors": [{"errmsg": "dup key: { \u{1}: 1 }"}], "ok": 1.0});
        assert!(needed_as(&message, Strings::Writes));
        // A validation error's errInfo names properties in strings.
        let invalid = bytes(
            doc! {"writeErrors": [{"errInfo": {"details": {"missingProperties": ["\u{1}"]}}}], "ok": 1.0},
        );
        assert!(needed_as(&invalid, Strings::Writes));
        // Malformed: expanded, and so refused, as before.
        assert!(needed_as(&plain[..plain.len() - 2], Strings::Writes));
        assert!(!needed_as(&plain, Strings::Data));
        assert!(needed_as(&plain, Strings::Paths) && needed_as(&plain, Strings::Events));
    }

    /// An array of plain values stays in the copied run; one holding a
    /// document, an array or a value token is expanded, at any position,
    /// and so is one whose strings are paths.
    #[test]
    fn arrays_are_expanded_where_they_hold_something_to_expand() {
        let mut dict = forty_names();
        dict.add_values(&["gold".to_owned()]);
        let token = |n: &str| dict.token(n).unwrap().as_str().to_owned();
        let (number, len) = crate::token::namespace::value_bytes(0);
        let value = bson::Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::UserDefined(VALUE_SUBTYPE),
            bytes: number[..len].to_vec(),
        });
        let (f1, f2) = (token("field1"), token("field2"));
        let stored = doc! {
            &f1: ["a", 1, 2.5, null, {&f2: 1}],
            &f2: [1, [2, {&f1: "x"}]],
            "plain": ["x", value.clone(), 3],
            "last": ["y", "z"],
        };
        let logical = doc! {
            "field1": ["a", 1, 2.5, null, {"field2": 1}],
            "field2": [1, [2, {"field1": "x"}]],
            "plain": ["x", "gold", 3],
            "last": ["y", "z"],
        };
        assert_eq!(expanded_with(&dict, &stored, Strings::Data), logical);
        let reply =
            |tags: &str| doc! {"cursor": {"firstBatch": [{"required": [tags, "b"]}]}, "ok": 1.0};
        assert_eq!(
            expanded_with(&dict, &reply(&f1), Strings::Paths),
            reply("field1")
        );
        assert_eq!(expanded_with(&dict, &reply(&f1), Strings::Data), reply(&f1));
    }

    /// A dictionary of forty names, whose tokens take most control
    /// characters (a newline among them).
    fn forty_names() -> crate::token::Dictionary {
        let mut dict = crate::token::Dictionary::default();
        let names: Vec<String> = (0..40).map(|i| format!("field{i}")).collect();
        dict.add_names(&names);
        dict
    }

    fn expanded_with(
        dict: &crate::token::Dictionary,
        reply: &bson::Document,
        strings: Strings,
    ) -> bson::Document {
        let mut out = Vec::new();
        let mut unknown = Unknown::default();
        expand(
            &bytes(reply.clone()),
            dict,
            strings,
            &mut unknown,
            (&mut out, 0),
            &mut |n| n,
        )
        .unwrap();
        bson::from_slice(&out).unwrap()
    }

    /// Output that outgrows the room it starts with (twice the stored
    /// bytes) is expanded again with more, whatever the prefix already in
    /// the buffer, and each unknown token is reported once, not once per
    /// try.
    #[test]
    fn an_expansion_larger_than_its_first_room_is_whole() {
        let long = |i: usize| format!("{i:02}-{}", "a_long_field_name".repeat(4));
        let mut known = crate::token::Dictionary::default();
        known.add_names(&(0..40).map(long).collect::<Vec<_>>());
        let mut more = known.clone();
        more.add_names(&[long(40)]);
        let token = |i: usize| more.token(&long(i)).unwrap().as_str().to_owned();
        let mut stored = bson::Document::new();
        let mut logical = bson::Document::new();
        for i in 0..40 {
            stored.insert(token(i), i as i32);
            logical.insert(long(i), i as i32);
        }
        let stored = doc! {"cursor": {"firstBatch": [&stored, &stored], "id": 0i64}, "ok": 1.0};
        let logical = doc! {"cursor": {"firstBatch": [&logical, &logical], "id": 0i64}, "ok": 1.0};
        let raw = bytes(stored.clone());
        // After a prefix, in a buffer that holds nothing past it or
        // bytes of an earlier reply (fewer or more than the expansion's).
        for (prefix, stale) in [(0, 0), (3, 0), (5000, 0), (3, 100), (21, 1 << 20)] {
            let mut out = vec![0xEE; prefix + stale];
            let mut unknown = Unknown::default();
            expand(
                &raw,
                &known,
                Strings::Data,
                &mut unknown,
                (&mut out, prefix),
                &mut |n| n,
            )
            .unwrap();
            assert!(
                out.len() - prefix > 8 * raw.len(),
                "{} {}",
                out.len(),
                raw.len()
            );
            assert_eq!(&out[..prefix], vec![0xEE; prefix]);
            assert_eq!(
                bson::from_slice::<bson::Document>(&out[prefix..]).unwrap(),
                logical
            );
            // Byte for byte what a new buffer gets: nothing of the earlier bytes.
            assert_eq!(&out[prefix..], bytes(logical.clone()));
            assert!(unknown.is_empty());
        }
        // One key the dictionary lacks, among names that outgrow the room.
        let mut with_unknown = stored.clone();
        with_unknown.insert(token(40), 1);
        let mut unknown = Unknown::default();
        expand(
            &bytes(with_unknown),
            &known,
            Strings::Data,
            &mut unknown,
            (&mut Vec::new(), 0),
            &mut |n| n,
        )
        .unwrap();
        assert_eq!(unknown.names.len(), 1, "{:?}", unknown.names);
        assert!(unknown.values.is_empty());
        // Room granted up to a limit: what fits below it is expanded,
        // what does not is refused with nothing written, and the room
        // asked for never passes the limit.
        let logical_len = bytes(logical.clone()).len();
        for (most, fits) in [
            (logical_len, true),
            (logical_len - 1, false),
            (raw.len(), false),
        ] {
            let mut out = vec![0xEE; 3];
            let mut asked = Vec::new();
            let ran = expand(
                &raw,
                &known,
                Strings::Data,
                &mut Unknown::default(),
                (&mut out, 3),
                &mut |n| {
                    asked.push(n);
                    n.min(most)
                },
            );
            assert_eq!(ran.is_ok(), fits, "{most}: {asked:?}");
            match fits {
                true => assert_eq!(
                    bson::from_slice::<bson::Document>(&out[3..]).unwrap(),
                    logical
                ),
                false => assert_eq!(out, [0xEE; 3]),
            }
            assert!(asked.len() <= 6, "{asked:?}");
        }
    }

    /// The room given to a reply follows how much the last ones grew: at
    /// once for more, a sixteenth of the gap per reply for less, never
    /// below the larger of two kinds that come in turns, and small replies
    /// do not count.
    #[test]
    fn the_room_follows_how_much_replies_grow() {
        let g = Growth::new();
        let n = 100_000;
        assert_eq!(g.room(n), n * 34 / 16 + 64);
        // Long names: 2.77 times. The next such reply fits the first time.
        g.learn(n, n * 277 / 100);
        assert!(g.room(n) >= n * 277 / 100, "{}", g.room(n));
        // Short names: 1.16 times. The room falls to that, and a little more.
        for _ in 0..16 {
            g.learn(n, n * 116 / 100);
        }
        let after_16 = g.room(n);
        assert!(after_16 < n * 277 / 100, "{after_16}");
        for _ in 0..200 {
            g.learn(n, n * 116 / 100);
        }
        assert!(after_16 > g.room(n), "{after_16}");
        assert!(g.room(n) >= n * 116 / 100, "{}", g.room(n));
        assert!(g.room(n) <= n * 22 / 16 + 64, "{}", g.room(n));
        // In turns: room for the larger.
        for _ in 0..100 {
            g.learn(n, n * 277 / 100);
            g.learn(n, n * 116 / 100);
            assert!(g.room(n) >= n * 277 / 100, "{}", g.room(n));
        }
        // Past four times, the room stops at four times (and a little).
        g.learn(n, n * 14);
        assert_eq!(g.room(n), n * 66 / 16 + 64);
        // A small reply teaches nothing.
        let before = g.room(n);
        g.learn(4095, 100);
        g.learn(4095, 40_000);
        assert_eq!(g.room(n), before);
    }

    /// A path whose first part is escaped (a field beginning with a control
    /// character, then one of its fields) is read part by part where the
    /// server writes paths as keys: an index's key, a duplicate key's
    /// `keyPattern` and `keyValue`, an update event's `updatedFields`, and
    /// in strings. A document's key with dots, escaped whole, stays whole.
    #[test]
    fn a_path_whose_first_part_is_escaped_is_read_part_by_part() {
        let dict = forty_names();
        let t = dict.token("field7").unwrap().as_str().to_owned();
        let stored = format!("\u{1f}\u{2}.{t}");
        let logical = "\u{2}.field7";
        let index = doc! {"cursor": {"firstBatch": [{"v": 2, "key": {&stored: 1}, "name": "ix"}], "id": 0i64}, "ok": 1.0};
        assert_eq!(
            expanded_with(&dict, &index, Strings::Paths),
            doc! {"cursor": {"firstBatch": [{"v": 2, "key": {logical: 1}, "name": "ix"}], "id": 0i64}, "ok": 1.0}
        );
        let duplicate = doc! {"n": 0, "writeErrors": [{"index": 0, "code": 11000,
        "keyPattern": {&stored: 1}, "keyValue": {&stored: {&stored: 5}}}], "ok": 1.0};
        assert_eq!(
            expanded_with(&dict, &duplicate, Strings::Writes),
            doc! {"n": 0, "writeErrors": [{"index": 0, "code": 11000,
            "keyPattern": {logical: 1}, "keyValue": {logical: {format!("\u{2}.{t}"): 5}}}], "ok": 1.0},
            "a value under keyValue is the user's document"
        );
        let event = doc! {"cursor": {"nextBatch": [{"operationType": "update",
        "updateDescription": {"updatedFields": {&stored: {&stored: 1}}, "removedFields": [format!("{stored}.{t}")]}}], "id": 0i64}, "ok": 1.0};
        assert_eq!(
            expanded_with(&dict, &event, Strings::Events),
            doc! {"cursor": {"nextBatch": [{"operationType": "update",
            "updateDescription": {"updatedFields": {logical: {format!("\u{2}.{t}"): 1}}, "removedFields": [format!("{logical}.field7")]}}], "id": 0i64}, "ok": 1.0}
        );
        // A user's document: the key is theirs, dots and all.
        let data = doc! {"cursor": {"firstBatch": [{&stored: 1}], "id": 0i64}, "ok": 1.0};
        assert_eq!(
            expanded_with(&dict, &data, Strings::Data),
            doc! {"cursor": {"firstBatch": [{format!("\u{2}.{t}"): 1}], "id": 0i64}, "ok": 1.0}
        );
        assert_eq!(
            super::super::key_pattern(&doc! {&stored: 1, "plain": -1}, &dict).unwrap(),
            doc! {logical: 1, "plain": -1}
        );
    }

    /// Strings are read as paths only where the server writes paths: an
    /// update event's `removedFields`, a validation error's `errInfo`. A
    /// user's field of the same name is data, whatever it holds.
    #[test]
    fn strings_are_paths_only_where_the_server_puts_them() {
        let dict = forty_names();
        let token = |n: &str| dict.token(n).unwrap().as_str().to_owned();
        let expanded = |reply: &bson::Document, strings| expanded_with(&dict, reply, strings);
        let stored = token("field3");
        let user = doc! {
            "removedFields": [&stored],
            "truncatedArrays": [{"field": &stored}],
            "errInfo": {"details": &stored},
        };
        let event = |doc: bson::Document| {
            doc! {"cursor": {"nextBatch": [doc], "id": 1i64, "ns": "d.c"}, "ok": 1.0}
        };
        let insert = event(doc! {"operationType": "insert", "fullDocument": user.clone()});
        assert_eq!(expanded(&insert, Strings::Events), insert);
        let update = |removed: &str| {
            event(doc! {
                "operationType": "update",
                "updateDescription": {"updatedFields": user.clone(), "removedFields": [removed]},
            })
        };
        assert_eq!(
            expanded(&update(&stored), Strings::Events),
            update("field3")
        );
        let write = |info: &str| {
            doc! {
                "n": 0,
                "writeErrors": [{
                    "index": 0,
                    "code": 121,
                    "errInfo": {"details": {"missingProperties": [info]}},
                    "keyValue": user.clone(),
                }],
                "ok": 1.0,
            }
        };
        assert_eq!(expanded(&write(&stored), Strings::Writes), write("field3"));
        let modified = doc! {"lastErrorObject": {"n": 1}, "value": user.clone(), "ok": 1.0};
        assert_eq!(expanded(&modified, Strings::Writes), modified);
    }

    /// A user document may have a field named `errmsg`, holding any text,
    /// control characters that spell tokens included: it reads back as it
    /// was written. Only the server's own messages name fields by tokens.
    #[test]
    fn only_the_servers_messages_are_read_for_names() {
        let dict = forty_names();
        // A newline is a token here, as another control character is.
        let newline = dict.name(b"\n").unwrap().to_owned();
        let other = dict.token("field7").unwrap().as_str().to_owned();
        // (A token starts a word: after a space, not glued to a letter.)
        let text = format!("line one \nline two {other}");
        let user = doc! {"_id": 1, "errmsg": &text, "more": {"errmsg": &text}};
        let expand_data = |reply: &bson::Document, strings| expanded_with(&dict, reply, strings);
        for reply in [
            doc! {"cursor": {"firstBatch": [user.clone()], "id": 0i64, "ns": "d.c"}, "ok": 1.0},
            doc! {"lastErrorObject": {"n": 1}, "value": user.clone(), "ok": 1.0},
        ] {
            assert_eq!(expand_data(&reply, Strings::Data), reply);
        }
        let event =
            doc! {"_id": {"_data": "1"}, "operationType": "insert", "fullDocument": user.clone()};
        assert_eq!(expand_data(&event, Strings::Events), event);
        // The reply's own message, and its write errors', name fields.
        let said = format!("line one {newline}line two field7");
        let failed = doc! {"ok": 0.0, "errmsg": &text, "code": 11000};
        assert_eq!(
            expand_data(&failed, Strings::Data),
            doc! {"ok": 0.0, "errmsg": said.clone(), "code": 11000}
        );
        let write = doc! {
            "n": 0,
            "writeErrors": [{"index": 0, "code": 11000, "errmsg": &text}],
            "writeConcernError": {"code": 64, "errmsg": &text},
            "ok": 1.0,
        };
        assert_eq!(
            expand_data(&write, Strings::Writes),
            doc! {
                "n": 0,
                "writeErrors": [{"index": 0, "code": 11000, "errmsg": said.clone()}],
                "writeConcernError": {"code": 64, "errmsg": said},
                "ok": 1.0,
            }
        );
    }
}
