//! The properties the fuzz targets (`fuzz/`) and the property tests check,
//! on any input however hostile: it is refused or handled, never a panic
//! or a hang, and tokenizing then expanding gives back the very bytes.
//!
//! Each function takes arbitrary bytes and panics only when a property is
//! broken.

use bson::{RawDocument, RawDocumentBuf};

use crate::rewrite::batch::Batch;
use crate::rewrite::catalogue::Slot;
use crate::rewrite::catalogue::CATALOGUE;
use crate::rewrite::expand::{self, Strings};
use crate::rewrite::mapper::splice::{GiveUp, Owned};
use crate::rewrite::mapper::{self, Lookup};
use crate::rewrite::names::Misses;
use crate::rewrite::{shard_key, walker, Command};
use crate::token::{Dictionary, Policies, Policy, Recorder};
use crate::wire::{DocumentSequence, MsgFlags, OpMsg, Section};

/// Names a dictionary of the fuzz checks knows, so that inputs built from
/// them meet tokens.
const NAMES: &[&str] = &[
    "first_name",
    "last_name",
    "custom",
    "Favorite Player",
    "address",
    "location",
    "amount",
];

fn dictionary(extra: &[String]) -> Dictionary {
    let mut d = Dictionary::default();
    let mut names: Vec<String> = NAMES.iter().map(|n| n.to_string()).collect();
    names.extend(extra.iter().cloned());
    d.add_names(&names);
    d
}

fn policy() -> Policy {
    Policy::new(1, &["custom".to_owned()], "laconic")
}

/// The walker accepts or refuses any bytes; what it accepts it copies
/// byte for byte, and the reader of a batch's documents reads them as the
/// element iterator does.
pub fn walker(data: &[u8]) {
    if walker::validate(data).is_ok() {
        let mut out = Vec::new();
        walker::copy(data, &mut out).expect("a validated document copies");
        assert_eq!(out, data);
    }
    documents_as_elements(data);
}

/// Reads `data`'s elements with [`walker::Elements::document`] and the
/// element iterator side by side, from each element to the next: the
/// former reads a document as the latter does (header, value, where the
/// next element starts) and passes over only what is not a document of
/// five bytes or more. How many documents it read.
pub fn documents_as_elements(data: &[u8]) -> usize {
    let (mut items, mut documents) = (walker::elements(data), 0);
    loop {
        let fast = items.document();
        let read = items.next();
        match (fast, &read) {
            (Some((header, value, rest)), Some(Ok(e))) => {
                assert_eq!(e.kind, 0x03);
                assert_eq!(header, &e.raw[..e.raw.len() - e.value.len()]);
                assert_eq!(value, e.value);
                assert_eq!(rest.position(), items.position());
                documents += 1;
            }
            (Some(_), _) => panic!("a document the element iterator does not read"),
            (None, Some(Ok(e))) => assert!(e.kind != 0x03 || e.value.len() < 5),
            (None, _) => {}
        }
        if !matches!(read, Some(Ok(_))) {
            return documents;
        }
    }
}

/// Any valid document, tokenized with every one of its names in the
/// dictionary and expanded again, is the same bytes (key order included).
pub fn roundtrip(data: &[u8]) {
    if walker::validate(data).is_err() {
        return;
    }
    let policy = policy();
    let recorder = Recorder::default();
    let mut out = Vec::new();
    if mapper::raw::tokenize(data, &policy, &recorder, &mut out).is_err() {
        return;
    }
    let dict = dictionary(&recorder.names.borrow());
    out.clear();
    mapper::raw::tokenize(data, &policy, &dict, &mut out).expect("tokenized once, tokenized again");
    let stored = RawDocument::from_bytes(&out).expect("a tokenized document is a document");
    let back = expand::raw_document(stored, &dict).expect("every token is known");
    assert_eq!(
        back.as_bytes(),
        data,
        "tokenize then expand changed the document"
    );
}

/// Any document, sent as the body of any command of the catalogue (its
/// first field replaced by the command's name), is rewritten or refused.
pub fn request(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    if walker::validate(rest).is_err() {
        return;
    }
    let Ok(doc) = RawDocument::from_bytes(rest) else {
        return;
    };
    let entry = &CATALOGUE[usize::from(pick) % CATALOGUE.len()];
    let mut body = RawDocumentBuf::new();
    body.append(entry.name, "c");
    for (k, v) in doc.iter().flatten() {
        if k != entry.name && k != "$db" {
            body.append(k, v.to_raw_bson());
        }
    }
    body.append("$db", "app");
    let m = OpMsg::from_body(MsgFlags::default(), &body);
    let policies = Policies::new(policy());
    // What the proxy refuses before rewriting, and the databases it
    // reaches: answered, whatever the command holds.
    let _ = crate::rewrite::guard::check(&m, &policies);
    let _ = crate::rewrite::guard::reached(&m, &policies);
    let dict = dictionary(&[]);
    let owned = Command::from_msg(&m).and_then(|mut cmd| {
        mapper::command(&mut cmd, "app", &policies, Lookup::of(&dict))?;
        cmd.into_msg(&m)
    });
    // Where a raw rewrite (the insert path, the splice) takes the command,
    // it gives what the owned mapper gives, byte for byte once array keys
    // are numbered afresh (the owned parse renumbers an array whose keys
    // are not 0, 1, 2…; the raw rewrites forward them as the client sent
    // them, as without the proxy).
    let renumbered = |m: &OpMsg| {
        let cmd = Command::from_msg(m).expect("a rewritten command parses");
        bson::to_vec(&cmd.body).expect("and serializes")
    };
    let policy = policy();
    // The owned mapper for the statements the splice does not take, of a
    // collection of a database sharing the dictionary.
    let misses = std::cell::RefCell::new(Misses::default());
    let (policies, dict) = (&policies, &dict);
    let statement = |db: String, coll: String| {
        move |slots: &[Slot], raw: &[u8], out: &mut Vec<u8>| {
            mapper::statement(raw, slots, policies, &db, &coll, Lookup::of(dict), out)
        }
    };
    if entry.name == "insert" {
        insert_as_sequence(&m, &policy, dict);
    }
    let raw = match entry.name {
        "insert" => mapper::raw::insert(&m, &policy, dict).map_err(GiveUp::from),
        "bulkWrite" => {
            // Each op with the names of its namespace, if that database
            // shares the dictionary, as the owned mapper takes it.
            let ns_info = m.body().get_array("nsInfo").ok();
            let statements: Vec<_> = ns_info
                .into_iter()
                .flatten()
                .map(|ns| {
                    let ns = ns.ok()?.as_document()?.get_str("ns").ok()?;
                    let (db, coll) = ns.split_once('.')?;
                    policies
                        .same_dictionary(db, "app")
                        .then(|| statement(db.to_owned(), coll.to_owned()))
                })
                .collect();
            let namespaces: Vec<_> = statements
                .iter()
                .map(|statement| {
                    Some(mapper::splice::OpNames {
                        policy: &policy,
                        read: dict,
                        store: dict,
                        owned: Some(Owned {
                            statement: statement.as_ref()?,
                            misses: &misses,
                        }),
                    })
                })
                .collect();
            mapper::splice::bulk_write(&m, &namespaces)
        }
        name => {
            let statement = statement("app".into(), "c".into());
            let owned = Owned {
                statement: &statement,
                misses: &misses,
            };
            mapper::splice::command(&m, name, &policy, dict, dict, Some(&owned))
        }
    };
    match raw {
        Ok(raw) => {
            let owned = owned.expect("a raw rewrite takes nothing the owned mapper refuses");
            assert_eq!(renumbered(&raw), renumbered(&owned));
        }
        // A statement the owned mapper refused: so does it the whole command.
        Err(GiveUp::Refused(e)) => {
            let whole = owned.expect_err("the owned mapper refuses the command too");
            assert_eq!(e.to_string(), whole.to_string());
        }
        Err(GiveUp::Uncommon | GiveUp::Malformed(_)) => {}
    }
}

/// An insert whose body holds one `documents` array, of documents only,
/// is tokenized to the same documents when they come in a kind-1
/// sequence, as drivers send them (followed in one loop where they share
/// a layout), or refused both ways.
fn insert_as_sequence(m: &OpMsg, policy: &Policy, dict: &Dictionary) {
    let body = m.body();
    if body
        .iter()
        .flatten()
        .filter(|(k, _)| *k == "documents")
        .count()
        != 1
    {
        return;
    }
    let Ok(array) = body.get_array("documents") else {
        return;
    };
    let Some(docs) = array
        .into_iter()
        .map(|d| Some(d.ok()?.as_document()?.as_bytes()))
        .collect::<Option<Vec<&[u8]>>>()
    else {
        return;
    };
    let mut rest = RawDocumentBuf::new();
    for (k, v) in body.iter().flatten() {
        if k != "documents" {
            rest.append(k, v.to_raw_bson());
        }
    }
    let sequence = DocumentSequence::of("documents".into(), docs).expect("documents");
    let in_sequence = OpMsg {
        flags: m.flags,
        sections: vec![
            Section::Body(rest.into_bytes().into()),
            Section::Sequence(sequence),
        ],
        checksum: None,
    };
    match (
        mapper::raw::insert(m, policy, dict),
        mapper::raw::insert(&in_sequence, policy, dict),
    ) {
        (Ok(from_body), Ok(from_sequence)) => {
            let from_body: Vec<&[u8]> = from_body
                .body()
                .get_array("documents")
                .expect("the tokenized array")
                .into_iter()
                .map(|d| d.ok().and_then(|d| d.as_document()).map(|d| d.as_bytes()))
                .collect::<Option<_>>()
                .expect("of documents");
            let sequence = from_sequence.sequences().next().expect("the sequence");
            assert_eq!(sequence.documents().collect::<Vec<_>>(), from_body);
        }
        (from_body, from_sequence) => assert_eq!(
            from_body.map(|_| ()),
            from_sequence.map(|_| ()),
            "refused alike"
        ),
    }
}

/// Any reply is expanded or refused, whichever way its strings are read;
/// any text has its tokens named or left alone. The shard-key rewrite of
/// any reply is refused, or is what parsing it into documents and
/// rewriting those gives (`shard_key_oracle`), byte for byte once array
/// keys are numbered afresh (parsing renumbers an array whose keys are not
/// 0, 1, 2…; the raw pass forwards them as the upstream sent them).
pub fn reply(data: &[u8]) {
    let dict = dictionary(&[]);
    if let Ok(doc) = RawDocument::from_bytes(data) {
        // A batch's documents expanded by the layout of the one before
        // are the bytes the walk of each writes, or the same refusal.
        for strings in [Strings::Data, Strings::Events, Strings::Writes] {
            let run = |mut batch: Batch| {
                let (mut out, mut unknown) = (Vec::new(), expand::Unknown::default());
                let grow = &mut |n| n;
                expand::raw::expand_in(
                    data,
                    &dict,
                    strings,
                    &mut unknown,
                    (&mut out, 0),
                    grow,
                    &mut batch,
                )
                .map(|()| (out, unknown))
                .map_err(|e| format!("{e:?}"))
            };
            let walked = run(Batch::walk_only());
            assert_eq!(run(Batch::default()), walked, "{strings:?}");
        }
        for strings in [
            Strings::Data,
            Strings::Paths,
            Strings::Events,
            Strings::Writes,
        ] {
            let _ = expand::raw_document_with(doc, &dict, strings);
        }
        // Within a room of any size: the whole expansion where it fits,
        // refused where it does not, never a part.
        let whole = expand::raw_document_with(doc, &dict, Strings::Data);
        for most in [0, data.len(), 2 * data.len() + 7] {
            let within =
                expand::raw_document_within(doc, &dict, Strings::Data, &mut |n| n.min(most));
            match (&whole, within) {
                (Ok(w), Ok(got)) => assert_eq!(w, &got),
                (Ok(w), Err(expand::Unreadable::Room)) => assert!(w.as_bytes().len() > most),
                (Ok(_), Err(e)) => panic!("refused within {most} bytes: {e:?}"),
                (Err(_), got) => assert!(got.is_err()),
            }
        }
        // In the buffer of an earlier message, as a reply to a driver is
        // written: the same bytes, nothing of the earlier ones.
        let stale = vec![0xEE; (3 * data.len()).max(crate::wire::spare::SMALLEST)];
        crate::wire::spare::give(bytes::Bytes::from(stale));
        let body = expand::raw_body_within(doc, &dict, Strings::Data, &mut |n| n);
        match (&whole, body) {
            (Ok(w), Ok(body)) => assert_eq!(w.as_bytes(), body.document().as_bytes()),
            (whole, body) => assert_eq!(whole.is_ok(), body.is_ok()),
        }
    }
    let _ = expand::expand_text(&String::from_utf8_lossy(data), &dict);
    for (restore, hide) in [(true, None), (false, Some("_lk")), (true, Some("_lk"))] {
        let Ok(raw) = shard_key::reply(restore, hide, data) else {
            continue;
        };
        let valid = walker::validate(data).is_ok();
        let Some(owned) = valid
            .then(|| crate::rewrite::to_document(RawDocument::from_bytes(data).ok()?).ok())
            .flatten()
        else {
            continue;
        };
        let want = shard_key_oracle(owned, restore, hide);
        let renumbered = |d: &RawDocument| {
            let d = crate::rewrite::to_document(d).expect("a rewritten reply parses");
            bson::to_vec(&d).expect("and serializes")
        };
        let got = raw.map(|b| renumbered(b.document()));
        assert_eq!(got, want.map(|d| renumbered(&d)));
    }
}

/// The shard-key rewrite of a reply done on documents, as the proxy did
/// before it was done raw: `None` when nothing changes.
fn shard_key_oracle(
    mut doc: bson::Document,
    restore: bool,
    hide: Option<&str>,
) -> Option<RawDocumentBuf> {
    use bson::{spec::BinarySubtype, Bson};
    fn restored(v: &mut Bson) -> bool {
        match v {
            Bson::Binary(b) if b.subtype == BinarySubtype::UserDefined(shard_key::SUBTYPE) => {
                let Ok(uuid) = <[u8; 16]>::try_from(b.bytes.as_slice()) else {
                    return false;
                };
                match crate::locality::to_object_id(&uuid) {
                    Some(oid) => {
                        *v = Bson::ObjectId(bson::oid::ObjectId::from_bytes(oid));
                        true
                    }
                    None => false,
                }
            }
            Bson::Document(d) => d.iter_mut().fold(false, |c, (_, v)| restored(v) | c),
            Bson::Array(a) => a.iter_mut().fold(false, |c, v| restored(v) | c),
            _ => false,
        }
    }
    let mut changed = false;
    if restore {
        changed |= doc.iter_mut().fold(false, |c, (_, v)| restored(v) | c);
    }
    if let Some(field) = hide {
        if let Ok(cursor) = doc.get_document_mut("cursor") {
            for batch in ["firstBatch", "nextBatch"] {
                if let Ok(docs) = cursor.get_array_mut(batch) {
                    for d in docs.iter_mut() {
                        if let Bson::Document(d) = d {
                            changed |= d.remove(field).is_some();
                        }
                    }
                }
            }
        }
        if let Ok(v) = doc.get_document_mut("value") {
            changed |= v.remove(field).is_some();
        }
    }
    changed
        .then(|| RawDocumentBuf::from_document(&doc).ok())
        .flatten()
}

#[cfg(test)]
mod tests {
    use crate::token::Names;
    use bson::doc;
    use proptest::prelude::*;

    use super::*;

    fn seeds() -> Vec<Vec<u8>> {
        [
            doc! {"first_name": "Ada", "custom": {"Favorite Player": 1, "\u{2}odd": [1, {"a.b": 2}]}, "zz": null},
            doc! {"filter": {"first_name": {"$in": ["x"]}, "$or": [{"address.location": 1}]}, "sort": {"amount": -1}},
            doc! {"updates": [{"q": {"first_name": 1}, "u": {"$set": {"custom.New One": 2, "last_name": 3}}}]},
            doc! {"pipeline": [{"$match": {"amount": {"$gt": 1}}}, {"$group": {"_id": "$first_name", "n": {"$sum": 1}}}]},
            doc! {"documents": [{"_id": 1, "first_name": "x", "\u{1f}": 2}]},
            // An insert of documents of one layout: those after the first
            // are tokenized by the layout of the one before.
            doc! {"documents": (0..4).map(|i| doc! {
                "_id": i, "first_name": "x", "custom": {"Favorite Player": i, "k": [i, {"last_name": 2}]}, "tags": ["a"],
            }).collect::<Vec<_>>()},
            doc! {"ops": [
                {"insert": 0, "document": {"_id": 1, "first_name": "x", "custom": {"Favorite Player": 1}}},
                {"update": 0, "filter": {"first_name": "x"}, "updateMods": {"$set": {"last_name": 3}}, "upsert": true},
                {"delete": 1i64, "filter": {"amount": {"$gt": 1}}},
            ], "nsInfo": [{"ns": "app.c"}, {"ns": "other.c"}]},
            batch(),
            flat_batch(),
            doc! {"cursor": {"firstBatch": [
                {"_id": stored(), "_lk": 1, "x": [stored(), {"_lk": 2}]},
                {"_lk": stored()},
            ], "id": 0i64, "ns": "app.c"}, "value": {"_lk": stored()}, "_lk": stored(), "ok": 1.0},
        ]
        .iter()
        .map(|d| bson::to_vec(d).unwrap())
        .collect()
    }

    /// A cursor's batch of documents of one layout, stored (their names
    /// tokens of [`super::dictionary`]).
    fn batch() -> bson::Document {
        let dict = super::dictionary(&[]);
        let t = |n: &str| dict.token(n).unwrap().as_str().to_owned();
        let item = |i: i32| {
            doc! {"_id": i, t("first_name"): "x", t("custom"): {t("last_name"): [i, 2]}, "tags": ["a"]}
        };
        let items: Vec<_> = (0..4).map(item).collect();
        doc! {"cursor": {"firstBatch": items, "id": 0i64, "ns": "app.c"}, "ok": 1.0}
    }

    /// A cursor's batch of documents of one level and one layout: they
    /// are followed as one stream.
    fn flat_batch() -> bson::Document {
        let dict = super::dictionary(&[]);
        let t = |n: &str| dict.token(n).unwrap().as_str().to_owned();
        let item = |i: i32| {
            doc! {t("first_name"): format!("user-{i}"), "_id": i, t("last_name"): i64::from(i), "tags": ["a", "b"]}
        };
        let items: Vec<_> = (0..4).map(item).collect();
        doc! {"cursor": {"firstBatch": items, "id": 0i64, "ns": "app.c"}, "ok": 1.0}
    }

    /// A shard key's ObjectId as the `replace` strategy stores it.
    fn stored() -> bson::Bson {
        let oid = bson::oid::ObjectId::parse_str("65a1b2c3d4e5f60718293a4b").unwrap();
        bson::Bson::Binary(bson::Binary {
            subtype: bson::spec::BinarySubtype::UserDefined(shard_key::SUBTYPE),
            bytes: crate::locality::from_object_id(&oid.bytes(), crate::locality::Mode::Default)
                .to_vec(),
        })
    }

    /// A seed with some of its bytes replaced.
    fn mutated() -> impl Strategy<Value = Vec<u8>> {
        (
            0..seeds().len(),
            proptest::collection::vec((any::<usize>(), any::<u8>()), 0..6),
        )
            .prop_map(|(i, edits)| {
                let mut d = seeds()[i].clone();
                for (at, b) in edits {
                    let n = d.len();
                    d[at % n] = b;
                }
                d
            })
    }

    /// What the fuzz campaigns found, kept: each input once crashed a target.
    #[test]
    fn inputs_the_fuzzers_found_hold_every_property() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/regressions");
        let mut n = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let data = std::fs::read(entry.unwrap().path()).unwrap();
            walker(&data);
            roundtrip(&data);
            request(&data);
            reply(&data);
            n += 1;
        }
        assert!(n >= 3);
    }

    #[test]
    fn the_seeds_hold_every_property() {
        for s in seeds() {
            walker(&s);
            roundtrip(&s);
            for pick in 0..=255u8 {
                request(&[&[pick][..], &s].concat());
            }
            reply(&s);
        }
    }

    proptest! {
        #[test]
        fn mutated_documents_hold_every_property(d in mutated(), pick in any::<u8>()) {
            walker(&d);
            roundtrip(&d);
            request(&[&[pick][..], &d].concat());
            reply(&d);
        }

        #[test]
        fn arbitrary_bytes_hold_every_property(d in proptest::collection::vec(any::<u8>(), 0..200)) {
            walker(&d);
            roundtrip(&d);
            request(&d);
            reply(&d);
        }
    }
}
