//! Tokenizing raw bytes: inserted documents, element by element, without
//! building owned documents. Every value not changed is copied as a slice;
//! only keys (and, at value paths, strings) change. The result is exactly
//! what the owned mapper gives ([`super::paths::document`]; property-tested
//! below).

use std::borrow::Cow;

use crate::rewrite::batch::Batch;
use crate::rewrite::walker::{
    as_str, begin, cstring, descend, elements, finish, header, put, string_of, Element, Malformed,
    Renamed,
};
use crate::token::namespace::{escape, value_bytes, VALUE_SUBTYPE};
use crate::token::{Names, Policy};
use crate::wire::Documents;

/// Tokenizes a stored-to-be document: keys in their scope, values at value
/// paths as value tokens; everything else copied.
pub fn tokenize<N: Names + ?Sized>(
    doc: &[u8],
    policy: &Policy,
    names: &N,
    out: &mut Vec<u8>,
) -> Result<(), Malformed> {
    Tokenizer { policy, names }.doc(doc, false, &mut Vec::new(), out, 0, None)
}

/// Tokenizes a document (or an array's documents) found under the logical
/// path `parent`, as an update's `$set` value is, at depth `depth`.
pub fn tokenize_under<'d, N: Names + ?Sized>(
    doc: &'d [u8],
    is_array: bool,
    parent: &[&'d str],
    policy: &Policy,
    names: &N,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), Malformed> {
    Tokenizer { policy, names }.doc(doc, is_array, &mut parent.to_vec(), out, depth, None)
}

/// What the keys of a batch's documents tokenized so far became, by their
/// position: at the top level of the documents, and one level below (the
/// documents and arrays of documents under each top-level key, which share
/// what their keys became). The documents of one batch mostly hold the same
/// keys in the same order, and a key found where an earlier document had
/// it becomes what it became there, without asking the policy and the
/// dictionary again: they are the same for the whole batch, and what they
/// make of a key turns on its logical path alone, which a key found at each
/// level above makes the same. Keys that are escaped are not kept: their
/// stored form is built anew each time.
///
/// At most [`BatchKeys::KEPT`] positions per level, two levels: a batch of
/// any shape keeps no more than 64 + 64 × 64 keys (about 360 KB), and only
/// while its `insert` is rewritten, on one thread (a rewrite does not
/// wait on anything).
struct BatchKeys<'d> {
    keys: Vec<Kept<'d>>,
    /// The position of the document's next key (counted here: `enumerate`
    /// in the walk left the walker's step a call of its own).
    next: usize,
    /// Whether what the keys below these became is kept too.
    deeper: bool,
}

/// A key as kept in a [`BatchKeys`]: what [`Tokenizer::key`] made of it,
/// and what the keys below it became.
struct Kept<'d> {
    key: &'d [u8],
    name: &'d str,
    stored: Option<&'d [u8]>,
    below: BatchKeys<'d>,
}

impl<'d> BatchKeys<'d> {
    /// Positions kept per level: a document's first keys are the ones its
    /// batch shares.
    const KEPT: usize = 64;

    /// The keys of a batch's top-level documents.
    fn top() -> BatchKeys<'d> {
        BatchKeys::new(true)
    }

    fn new(deeper: bool) -> BatchKeys<'d> {
        BatchKeys {
            keys: Vec::new(),
            next: 0,
            deeper,
        }
    }

    /// The next key of a document: as kept, or as `find` says (and kept);
    /// with what the keys below it became, if they are kept.
    #[inline]
    #[allow(clippy::type_complexity)]
    fn key(
        &mut self,
        key: &'d [u8],
        find: impl FnOnce() -> Result<(&'d str, Renamed<'d>), Malformed>,
    ) -> Result<(&'d str, Renamed<'d>, Option<&mut BatchKeys<'d>>), Malformed> {
        let at = self.next;
        self.next += 1;
        if self.keys.get(at).is_none_or(|kept| kept.key != key) {
            let (name, stored) = find()?;
            let stored_as = match &stored {
                None => None,
                Some(Cow::Borrowed(s)) => Some(*s),
                Some(Cow::Owned(_)) => return Ok((name, stored, None)),
            };
            let kept = Kept {
                key,
                name,
                stored: stored_as,
                below: BatchKeys::new(false),
            };
            if at < self.keys.len() {
                self.keys[at] = kept;
            } else if at == self.keys.len() && at < Self::KEPT {
                self.keys.push(kept);
            } else {
                return Ok((name, stored, None));
            }
        }
        let deeper = self.deeper;
        let kept = &mut self.keys[at];
        let below = deeper.then_some(&mut kept.below);
        Ok((kept.name, kept.stored.map(Cow::Borrowed), below))
    }
}

/// One policy and one dictionary, applied to documents.
struct Tokenizer<'p, N: ?Sized> {
    policy: &'p Policy,
    names: &'p N,
}

impl<'p, N: Names + ?Sized> Tokenizer<'p, N> {
    /// Tokenizes `doc` into `out`. `seen`: what the keys of the batch's
    /// documents before it became at its place in them, for a document of a
    /// batch (an array: for the documents it holds).
    fn doc<'d>(
        &self,
        doc: &'d [u8],
        is_array: bool,
        parent: &mut Vec<&'d str>,
        out: &mut Vec<u8>,
        depth: usize,
        mut seen: Option<&mut BatchKeys<'d>>,
    ) -> Result<(), Malformed>
    where
        'p: 'd,
    {
        let start = begin(out);
        // `doc[..copied]` is in `out` already (its length prefix written
        // anew): elements that stay as they are (same key, a value that is
        // not a document and not at a value path) are copied in runs, up to
        // the next one that changes, as the expander does.
        let mut copied = 4;
        if let Some(seen) = seen.as_deref_mut() {
            seen.next = 0;
        }
        for e in elements(doc) {
            let e = e?;
            if e.kind == 0x05 && e.value.get(4) == Some(&VALUE_SUBTYPE) {
                return Err(Malformed::Reserved);
            }
            let nested = matches!(e.kind, 0x03 | 0x04);
            if is_array {
                if nested {
                    put(out, &doc[copied..e.at]);
                    let seen = seen.as_deref_mut();
                    self.value(e, e.key, false, parent, out, depth, seen)?;
                    copied = e.end();
                }
                continue;
            }
            let (key, stored, below) = match seen.as_deref_mut() {
                Some(seen) => seen.key(e.key, || self.key(parent, e.key))?,
                None => {
                    let (key, stored) = self.key(parent, e.key)?;
                    (key, stored, None)
                }
            };
            parent.push(key);
            let at_value_path =
                !self.policy.value_paths.is_empty() && self.policy.is_value_path(parent);
            if nested || at_value_path {
                put(out, &doc[copied..e.at]);
                let stored = stored.as_deref().unwrap_or(e.key);
                self.value(e, stored, at_value_path, parent, out, depth, below)?;
                copied = e.end();
            } else if let Some(stored) = stored {
                // A plain value under a new key: the run up to the key, its
                // type byte included, then the key; the value starts the
                // next run.
                put(out, &doc[copied..=e.at]);
                cstring(out, &stored);
                copied = e.value_at();
            }
            parent.pop();
        }
        // The run left, without the final NUL that `finish` writes.
        out.extend_from_slice(
            doc.get(copied..doc.len().saturating_sub(1))
                .unwrap_or_default(),
        );
        finish(out, start);
        Ok(())
    }

    /// A key's logical name and its stored form when that is not the key
    /// itself: its token (borrowed from the dictionary, which holds the
    /// name as a string, so a key it knows needs no UTF-8 check of its
    /// own), or the key escaped. `None`: the key is stored as it is (most
    /// keys a policy leaves alone), known without comparing the bytes.
    #[inline]
    fn key<'x>(&self, parent: &[&str], key: &'x [u8]) -> Result<(&'x str, Renamed<'x>), Malformed>
    where
        'p: 'x,
    {
        if self.policy.tokenizes_key(parent, key) {
            if let Some((name, token)) = self.names.token_of(key) {
                return Ok((name, Some(Cow::Borrowed(token.as_bytes()))));
            }
        } else if key == b"_id" {
            // Every document's first key, and never escaped: no UTF-8 check
            // or scan for it.
            return Ok(("_id", None));
        }
        let key = as_str(key)?;
        let stored = match escape(key) {
            Cow::Borrowed(_) => None,
            Cow::Owned(k) => Some(Cow::Owned(k.into_bytes())),
        };
        Ok((key, stored))
    }

    /// One element's value, under its stored `key`; `seen`, for a document
    /// or an array of a batch's documents (see [`Tokenizer::doc`]).
    #[allow(clippy::too_many_arguments)]
    fn value<'d>(
        &self,
        e: Element<'d>,
        key: &[u8],
        at_value_path: bool,
        parent: &mut Vec<&'d str>,
        out: &mut Vec<u8>,
        depth: usize,
        seen: Option<&mut BatchKeys<'d>>,
    ) -> Result<(), Malformed>
    where
        'p: 'd,
    {
        let v = e.value;
        match e.kind {
            0x02 if at_value_path => match self.names.value_token(string_of(v)?) {
                Some(t) => {
                    header(out, 0x05, key);
                    let (bytes, len) = value_bytes(t);
                    out.extend_from_slice(&(len as i32).to_le_bytes());
                    out.push(VALUE_SUBTYPE);
                    out.extend_from_slice(&bytes[..len]);
                }
                None => {
                    header(out, e.kind, key);
                    out.extend_from_slice(v);
                }
            },
            0x04 if at_value_path => {
                header(out, e.kind, key);
                let start = begin(out);
                let depth = descend(depth)?;
                for x in elements(v) {
                    let x = x?;
                    self.value(x, x.key, true, parent, out, depth, None)?;
                }
                finish(out, start);
            }
            0x03 if at_value_path && has_each(v)? => {
                // `{$each: [...]}` in an update, or a document at a value path:
                // as the owned rewriter does, only `$each` is read as values.
                header(out, e.kind, key);
                let start = begin(out);
                let depth = descend(depth)?;
                for x in elements(v) {
                    let x = x?;
                    if x.key == b"$each" {
                        self.value(x, x.key, true, parent, out, depth, None)?;
                    } else {
                        header(out, x.kind, x.key);
                        out.extend_from_slice(x.value);
                    }
                }
                finish(out, start);
            }
            0x03 | 0x04 => {
                header(out, e.kind, key);
                self.doc(v, e.kind == 0x04, parent, out, descend(depth)?, seen)?;
            }
            _ => {
                header(out, e.kind, key);
                out.extend_from_slice(v);
            }
        }
        Ok(())
    }
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
pub fn insert<N: Names + ?Sized>(
    m: &crate::wire::OpMsg,
    policy: &Policy,
    names: &N,
) -> Result<crate::wire::OpMsg, Malformed> {
    use crate::wire::{DocumentSequence, OpMsg, Section};
    let mut sections = Vec::with_capacity(m.sections.len());
    for section in &m.sections {
        sections.push(match section {
            Section::Body(b) => {
                let mut body = Vec::with_capacity(b.len());
                let start = begin(&mut body);
                for e in elements(b) {
                    let e = e?;
                    header(&mut body, e.kind, e.key);
                    if e.key == b"documents" && e.kind == 0x04 {
                        let array = begin(&mut body);
                        let mut batch = Inserted::new(policy, names);
                        let mut docs = elements(e.value).peekable();
                        while let Some(d) = docs.next() {
                            let d = d?;
                            header(&mut body, d.kind, d.key);
                            if d.kind == 0x03 {
                                let (more, at) = (docs.peek().is_some(), body.len());
                                let end = batch.doc(d.value, more, &mut body, at)?;
                                body.truncate(end);
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
                Section::Body(bytes::Bytes::from(body))
            }
            Section::Sequence(seq) if seq.identifier == "documents" => {
                // One buffer for the whole batch, as it came.
                let size = seq.bytes().len();
                let mut stored = Vec::with_capacity(size + size / 4);
                let end = Inserted::new(policy, names).each(seq.documents(), &mut stored)?;
                stored.truncate(end);
                DocumentSequence::new(seq.identifier.clone(), bytes::Bytes::from(stored))
                    .map(Section::Sequence)
                    .map_err(|_| Malformed::Invalid("a tokenized document"))?
            }
            other => other.clone(),
        });
    }
    Ok(OpMsg {
        flags: m.flags.without_checksum(),
        sections,
        checksum: None,
    })
}

/// The documents of one `insert`, tokenized one after another: each by
/// the layout of the last one walked where it has it ([`Batch`]), else
/// walked, with what the keys of the batch's documents became so far
/// ([`BatchKeys`]). A policy with value paths has no layouts: what a
/// string becomes there turns on the string.
struct Inserted<'p, 'd, N: ?Sized> {
    tokenizer: Tokenizer<'p, N>,
    parent: Vec<&'d str>,
    seen: BatchKeys<'d>,
    layout: Batch,
}

impl<'p: 'd, 'd, N: Names + ?Sized> Inserted<'p, 'd, N> {
    fn new(policy: &'p Policy, names: &'p N) -> Self {
        Inserted {
            tokenizer: Tokenizer { policy, names },
            parent: Vec::with_capacity(8),
            seen: BatchKeys::top(),
            layout: match policy.value_paths.is_empty() {
                true => Batch::default(),
                false => Batch::walk_only(),
            },
        }
    }

    /// Tokenizes `doc` into `out` at `at`: where it ends. What `out` holds
    /// past `at` is written over, and past the end, left (a layout is
    /// followed in room made once for many documents: the caller truncates
    /// `out` to the last end). `more`: another document follows it (the
    /// last one is not learned from).
    fn doc(
        &mut self,
        doc: &'d [u8],
        more: bool,
        out: &mut Vec<u8>,
        at: usize,
    ) -> Result<usize, Malformed> {
        if self.layout.ready() {
            self.room_for(doc, out, at);
            let followed = self
                .layout
                .follow(doc, self.tokenizer.names, (&mut out[..], at));
            if let Ok(Some(end)) = followed {
                return Ok(end);
            }
        }
        self.walk(doc, more, out, at)
    }

    /// The documents of a kind-1 sequence, tokenized one after another
    /// into `out` (from its start): where the last ends, as
    /// [`Inserted::doc`] writes them. Those that have the layout of the
    /// last one walked are followed in one loop ([`Batch::follow_each`]),
    /// without a call and a test of the layout for each.
    fn each(&mut self, mut docs: Documents<'d>, out: &mut Vec<u8>) -> Result<usize, Malformed> {
        let mut at = 0;
        loop {
            if self.layout.ready() {
                if let Some(doc) = docs.clone().next() {
                    self.room_for(doc, out, at);
                }
                let names = self.tokenizer.names;
                let (end, room) = self
                    .layout
                    .follow_each(&mut docs, names, (&mut out[..], at));
                at = end;
                if room {
                    continue;
                }
            }
            let Some(doc) = docs.next() else {
                return Ok(at);
            };
            at = self.walk(doc, docs.clone().next().is_some(), out, at)?;
        }
    }

    /// Makes `out` long enough for `doc` from `at` as the layout rewrites
    /// it: twice as long at most, within what is allocated already (no
    /// more bytes zeroed than written, over the batch, and no more memory
    /// than pushing them would take).
    fn room_for(&self, doc: &[u8], out: &mut Vec<u8>, at: usize) {
        let room = at + doc.len() + self.layout.growth();
        if out.len() < room {
            let twice = (2 * out.len()).min(out.capacity());
            out.resize(room.max(twice), 0);
        }
    }

    /// [`Inserted::doc`] by the walk, learning the layout of `doc` if
    /// `more` documents follow.
    fn walk(
        &mut self,
        doc: &'d [u8],
        more: bool,
        out: &mut Vec<u8>,
        at: usize,
    ) -> Result<usize, Malformed> {
        out.truncate(at);
        let seen = Some(&mut self.seen);
        self.tokenizer
            .doc(doc, false, &mut self.parent, out, 0, seen)?;
        if more {
            self.layout.learn_rewrite(doc, &out[at..], 0);
        }
        Ok(out.len())
    }
}

#[cfg(test)]
mod tests {
    use bson::{doc, Bson, Document, RawDocumentBuf};
    use proptest::prelude::*;

    use super::*;
    use crate::rewrite::expand::raw::expand;
    use crate::rewrite::expand::{Strings, Unknown};
    use crate::rewrite::mapper::paths as tokenize;
    use crate::token::Dictionary;

    fn policy() -> Policy {
        Policy::new(6, &["custom".into()], "laconic").with_value_paths(&["artists".into()])
    }

    /// [`policy`] without its value path: the documents of an insert
    /// follow layouts.
    fn keys_only() -> Policy {
        Policy::new(6, &["custom".into()], "laconic")
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
        expand(
            &stored,
            &dict,
            Strings::Data,
            &mut unknown,
            (&mut back, 0),
            &mut |n| n,
        )
        .unwrap();
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
                (&mut Vec::new(), 0),
                &mut |n| n,
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

    /// A batch through `insert`, in a sequence and in the body's array:
    /// each document as the owned rewriter tokenizes it alone. The batch
    /// repeats its documents in other orders, so that keys are found where
    /// an earlier document had them, where it had others, and past its end.
    fn check_batch(docs: &[Document], policy: &Policy) {
        use crate::wire::{DocumentSequence, MsgFlags, OpMsg, Section};
        let policy = policy.clone();
        let mut dict = Dictionary::default();
        for doc in docs {
            let mut names = Vec::new();
            tokenize::collect_names(doc, &policy, &mut names);
            let mut values = Vec::new();
            tokenize::collect_values(doc, &policy, &mut values);
            dict.add_names(&names);
            dict.add_values(&values);
        }
        let batch: Vec<&Document> = docs.iter().chain(docs.iter().rev()).chain(docs).collect();
        let expected: Vec<Vec<u8>> = batch
            .iter()
            .map(|d| bson::to_vec(&tokenize::document(d, &mut Vec::new(), &policy, &dict)).unwrap())
            .collect();
        let sequence: Vec<u8> = batch
            .iter()
            .flat_map(|d| bson::to_vec(d).unwrap())
            .collect();
        let in_body = doc! { "insert": "c", "documents": batch.iter().map(|d| Bson::Document((*d).clone())).collect::<Vec<_>>(), "$db": "d" };
        for m in [
            OpMsg {
                flags: MsgFlags(0),
                sections: vec![
                    Section::Body(
                        bson::to_vec(&doc! { "insert": "c", "$db": "d" })
                            .unwrap()
                            .into(),
                    ),
                    Section::Sequence(
                        DocumentSequence::new("documents".into(), sequence.into()).unwrap(),
                    ),
                ],
                checksum: None,
            },
            OpMsg {
                flags: MsgFlags(0),
                sections: vec![Section::Body(bson::to_vec(&in_body).unwrap().into())],
                checksum: None,
            },
        ] {
            let out = insert(&m, &policy, &dict).unwrap();
            let got: Vec<Vec<u8>> = match &out.sections[..] {
                [_, Section::Sequence(s)] => s.documents().map(<[u8]>::to_vec).collect(),
                _ => out
                    .body()
                    .get_array("documents")
                    .unwrap()
                    .into_iter()
                    .map(|d| d.unwrap().as_document().unwrap().as_bytes().to_vec())
                    .collect(),
            };
            assert_eq!(got, expected);
        }
    }

    #[test]
    fn a_batch_of_alike_documents_tokenizes_as_each_alone() {
        let docs = [
            doc! { "_id": 1, "first_name": "a", "custom": {"k": 1}, "artists": ["Taylor Swift"] },
            doc! { "_id": 2, "first_name": "b", "custom": {"k": 2}, "artists": ["Bad Bunny"] },
            doc! { "_id": 3, "custom": {"first_name": 3}, "first_name": "c", "\u{1}odd": 1 },
            doc! { "first_name": 4 },
            // One level below: the same keys under other names, in arrays,
            // under a custom-attribute path (where short names are
            // tokenized) and at a value path (whose values are tokenized).
            doc! { "custom": {"k": 1, "first_name": 2}, "other": {"k": 1} },
            doc! { "other": {"k": 1, "first_name": 2}, "custom": {"k": 1} },
            doc! { "other": [{"k": 1}, [{"k": 2, "first_name": 3}]], "custom": [{"k": 1}] },
            doc! { "artists": [{"k": 1}, "Taylor Swift"], "custom": {"k": {"k": 1}} },
            doc! { "custom": "Taylor Swift", "artists": {"k": 1, "$each": ["Bad Bunny"]} },
        ];
        check_batch(&docs, &policy());
        check_batch(&docs, &keys_only());
    }

    /// A document of every kind of element a layout holds: a renamed key,
    /// one kept, an escaped one, a custom attribute's, a nested document,
    /// an array of documents, an array of plain values, a binary.
    fn laid_out(n: i32) -> Document {
        doc! {
            "_id": n, "first_name": format!("user {n}"), "age": n,
            "\u{1}odd key": n, "custom": {"Favorite Player": n, "k": [n, {"nested_key": n}]},
            "purchases": [{"item_name": "a", "price": n}, {"item_name": "b", "price": 2}],
            "tags": ["a", "b"],
            "blob": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![n as u8; 3] },
        }
    }

    /// The documents of one insert, through [`Inserted`]: what each became
    /// (or why it was refused), and how many followed a layout.
    fn inserted(
        docs: &[Document],
        policy: &Policy,
        dict: &Dictionary,
    ) -> (Vec<Result<Vec<u8>, Malformed>>, usize) {
        let raw: Vec<Vec<u8>> = docs.iter().map(|d| bson::to_vec(d).unwrap()).collect();
        let mut batch = Inserted::new(policy, dict);
        let results = raw
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut out = vec![9; 3];
                let end = batch.doc(d, i + 1 < raw.len(), &mut out, 3)?;
                assert_eq!(out[..3], [9; 3], "what came before is kept");
                Ok(out[3..end].to_vec())
            })
            .collect();
        (results, batch.layout.hits())
    }

    #[test]
    fn an_insert_is_tokenized_by_its_layout_as_by_the_walk() {
        let policy = keys_only();
        let mut dict = dictionary(&laid_out(1), &policy);
        // A name the dictionary lacks is stored as it is, as the walk does.
        let unknown = "a_name_not_in_the_dictionary";
        let reserved = bson::Binary {
            subtype: bson::spec::BinarySubtype::UserDefined(VALUE_SUBTYPE),
            bytes: vec![1],
        };
        type Change = Box<dyn Fn(&mut Document)>;
        let variants: Vec<(&str, Change)> = vec![
            (
                "an element more",
                Box::new(|d| {
                    d.insert("zzz_more", 1);
                }),
            ),
            (
                "an element fewer",
                Box::new(|d| {
                    d.remove("tags");
                }),
            ),
            (
                "another type",
                Box::new(|d| {
                    d.insert("age", 1i64);
                }),
            ),
            (
                "another key",
                Box::new(|d| {
                    d.insert("age_", 1);
                    d.remove("age");
                }),
            ),
            (
                "a name the dictionary lacks",
                Box::new(move |d| {
                    d.insert(unknown, 1);
                }),
            ),
            (
                "a document in a plain array",
                Box::new(|d| {
                    d.insert("tags", bson::bson!(["a", {"first_name": 1}]));
                }),
            ),
            (
                "a longer array of documents",
                Box::new(|d| {
                    d.insert(
                        "purchases",
                        bson::bson!([{"item_name": "a"}, {"item_name": "b"}, {"price": 1}]),
                    );
                }),
            ),
            (
                "a nested key changed",
                Box::new(|d| {
                    d.insert("custom", doc! {"Favorite Player": 1, "other": 2});
                }),
            ),
            (
                "an empty nested document",
                Box::new(|d| {
                    d.insert("custom", doc! {});
                }),
            ),
            (
                "a string for a document",
                Box::new(|d| {
                    d.insert("custom", "x");
                }),
            ),
        ];
        for (what, change) in &variants {
            let mut docs: Vec<Document> = (0..20).map(laid_out).collect();
            change(&mut docs[10]);
            let mut names = Vec::new();
            tokenize::collect_names(&docs[10], &policy, &mut names);
            dict.add_names(
                &names
                    .into_iter()
                    .filter(|n| n != unknown)
                    .collect::<Vec<_>>(),
            );
            let (got, hits) = inserted(&docs, &policy, &dict);
            for (doc, got) in docs.iter().zip(got) {
                let alone = tokenize::document(doc, &mut Vec::new(), &policy, &dict);
                assert_eq!(got.unwrap(), bson::to_vec(&alone).unwrap(), "{what}");
            }
            assert!(hits >= 16, "{what}: {hits} documents followed the layout");
        }
        // A value token's binary in a document of the layout is refused, as
        // the walk refuses it, at the top and in a plain array.
        for at in ["blob", "tags"] {
            let mut docs: Vec<Document> = (0..6).map(laid_out).collect();
            let value = match at {
                "blob" => Bson::Binary(reserved.clone()),
                _ => bson::bson!([Bson::Binary(reserved.clone()), "b"]),
            };
            docs[4].insert(at, value);
            let (got, hits) = inserted(&docs, &policy, &dict);
            assert!(
                matches!(got[4], Err(Malformed::Reserved)),
                "{at}: {:?}",
                got[4]
            );
            assert!(got[5].is_ok() && hits >= 2, "{at}");
        }
    }

    /// The documents of one insert's sequence, through [`Inserted::each`]
    /// into an empty buffer: what they became, back to back, and how many
    /// followed a layout.
    fn each(
        docs: &[Document],
        policy: &Policy,
        dict: &Dictionary,
    ) -> (Result<Vec<u8>, Malformed>, usize) {
        let raw: Vec<u8> = docs.iter().flat_map(|d| bson::to_vec(d).unwrap()).collect();
        let seq = crate::wire::DocumentSequence::new("documents".into(), raw.into()).unwrap();
        let mut batch = Inserted::new(policy, dict);
        let mut out = Vec::new();
        let got = batch
            .each(seq.documents(), &mut out)
            .map(|end| out[..end].to_vec());
        (got, batch.layout.hits())
    }

    #[test]
    fn a_sequence_is_followed_in_one_loop_as_each_document_alone() {
        let policy = keys_only();
        let dict = dictionary(&laid_out(1), &policy);
        // One of another layout midway, then documents whose keys only grow
        // (escaped ones): the output outgrows its room as the loop goes.
        let mut docs: Vec<Document> = (0..30).map(laid_out).collect();
        docs[12].insert("zzz_more", 1);
        docs.extend((0..40).map(|n| doc! {"_id": n, "\u{1}a": n, "\u{1}b": n}));
        let (got, hits) = each(&docs, &policy, &dict);
        let alone: Vec<u8> = docs
            .iter()
            .flat_map(|d| {
                bson::to_vec(&tokenize::document(d, &mut Vec::new(), &policy, &dict)).unwrap()
            })
            .collect();
        assert_eq!(got.unwrap(), alone);
        assert!(hits >= 60, "{hits} documents followed a layout");
        // A value token's binary in a document of the layout is refused, as
        // the walk refuses it.
        let reserved = bson::Binary {
            subtype: bson::spec::BinarySubtype::UserDefined(VALUE_SUBTYPE),
            bytes: vec![1],
        };
        let mut docs: Vec<Document> = (0..6).map(laid_out).collect();
        docs[4].insert("blob", reserved);
        let (got, hits) = each(&docs, &policy, &dict);
        assert!(matches!(got, Err(Malformed::Reserved)), "{got:?}");
        assert_eq!(hits, 3);
    }

    #[test]
    fn the_last_document_and_a_policy_with_value_paths_learn_nothing() {
        let docs: Vec<Document> = (0..2).map(laid_out).collect();
        let dict = dictionary(&docs[0], &keys_only());
        // The first is learned from, the second follows; one alone is not.
        assert_eq!(inserted(&docs, &keys_only(), &dict).1, 1);
        assert_eq!(inserted(&docs[..1], &keys_only(), &dict).1, 0);
        let (keys, first) = (keys_only(), bson::to_vec(&docs[0]).unwrap());
        let mut batch = Inserted::new(&keys, &dict);
        batch.doc(&first, false, &mut Vec::new(), 0).unwrap();
        assert!(!batch.layout.ready());
        // Keys that only grow (escaped ones) follow too: the room for a
        // document is its length and what its layout's renames add.
        let escaped: Vec<Document> = (0..4).map(|n| doc! {"_id": n, "\u{1}a": n}).collect();
        let (got, hits) = inserted(&escaped, &keys_only(), &dict);
        for (doc, got) in escaped.iter().zip(got) {
            let alone = tokenize::document(doc, &mut Vec::new(), &keys_only(), &dict);
            assert_eq!(got.unwrap(), bson::to_vec(&alone).unwrap());
        }
        assert_eq!(hits, 3);
        // Under a value path a string's token turns on the string.
        let many: Vec<Document> = (0..10).map(laid_out).collect();
        assert_eq!(
            inserted(&many, &policy(), &dictionary(&docs[0], &policy())).1,
            0
        );
    }

    proptest! {
        #[test]
        fn raw_rewrites_agree_with_the_owned_ones(doc in arb_doc()) {
            check(&doc);
        }

        #[test]
        fn a_batch_tokenizes_as_its_documents_alone(docs in prop::collection::vec(arb_doc(), 1..5)) {
            check_batch(&docs, &policy());
            check_batch(&docs, &keys_only());
        }

        /// Batches of a few layouts, whose documents differ in their
        /// top-level numbers, and now and then in a number's type.
        #[test]
        fn a_batch_of_few_layouts_tokenizes_as_its_documents_alone(
            pool in prop::collection::vec(arb_doc(), 1..4),
            picks in prop::collection::vec((0..4usize, any::<i32>()), 1..16),
        ) {
            let docs: Vec<Document> = picks
                .iter()
                .map(|&(pick, n)| {
                    let mut doc = pool[pick % pool.len()].clone();
                    for (_, v) in doc.iter_mut() {
                        if let Bson::Int32(_) = v {
                            *v = match n % 5 {
                                0 => Bson::Int64(n.into()),
                                _ => Bson::Int32(n),
                            };
                        }
                    }
                    doc
                })
                .collect();
            check_batch(&docs, &keys_only());
        }
    }
}
