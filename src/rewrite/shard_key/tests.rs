use bson::{doc, oid::ObjectId, spec::BinarySubtype, Binary, Bson, Document};

use super::*;
use crate::config::shard_key::{Rule, Strategy};
use crate::locality::Mode;
use crate::rewrite::command::Command;

fn replace_rule() -> ShardKeys {
    ShardKeys::new(vec![Rule::parse("app.users:_id:replace").unwrap()])
}

fn cmd(body: Document) -> Command {
    let raw = bson::RawDocumentBuf::from_document(&body).unwrap();
    let m = crate::wire::OpMsg::from_body(crate::wire::MsgFlags::default(), &raw);
    Command::from_msg(&m).unwrap()
}

fn stored(oid: ObjectId, mode: Mode) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::UserDefined(SUBTYPE),
        bytes: crate::locality::from_object_id(&oid.bytes(), mode).to_vec(),
    })
}

#[test]
fn flags_parse() {
    let r = Rule::parse("db.a.b:_id:derive:sequential").unwrap();
    assert_eq!(r.namespace, "db.a.b");
    assert_eq!(r.mode, Mode::Sequential);
    assert_eq!(
        r.strategy,
        Strategy::Derive {
            field: "_lk".into()
        }
    );
    assert!(Rule::parse("nodot:_id:replace").is_err());
    assert!(Rule::parse("a.b:_id:shuffle").is_err());
    assert!(Rule::parse("a.b:x.y:replace").is_err());
}

#[test]
fn replace_rewrites_inserts_equality_in_and_ne_and_restores_replies() {
    let keys = replace_rule();
    let (a, b) = (ObjectId::new(), ObjectId::new());
    let mut c = cmd(doc! {"insert": "users", "documents": [{"_id": a, "n": 1}], "$db": "app"});
    keys.request(&mut c).unwrap();
    assert_eq!(
        c.body.get_array("documents").unwrap()[0],
        Bson::Document(doc! {"_id": stored(a, Mode::Default), "n": 1})
    );

    let mut c = cmd(
        doc! {"find": "users", "filter": {"$or": [{"_id": a}, {"_id": {"$in": [a, b], "$ne": b}}]}, "$db": "app"},
    );
    keys.request(&mut c).unwrap();
    assert_eq!(
        c.body.get_document("filter").unwrap(),
        &doc! {"$or": [{"_id": stored(a, Mode::Default)}, {"_id": {"$in": [stored(a, Mode::Default), stored(b, Mode::Default)], "$ne": stored(b, Mode::Default)}}]}
    );

    let reply = doc! {"cursor": {"firstBatch": [{"_id": stored(a, Mode::Default), "nested": [{"ref": stored(b, Mode::Default)}]}], "id": 0i64}, "ok": 1.0};
    assert_replied(
        true,
        None,
        reply,
        doc! {"cursor": {"firstBatch": [{"_id": a, "nested": [{"ref": b}]}], "id": 0i64}, "ok": 1.0},
    );
}

/// [`super::reply`] of `reply` is `want`, byte for byte (key order too).
fn assert_replied(restore: bool, hide: Option<&str>, reply: Document, want: Document) {
    let raw = bson::RawDocumentBuf::from_document(&reply).unwrap();
    let out = super::reply(restore, hide, raw.as_bytes())
        .unwrap()
        .expect("a changed reply");
    let want = bson::RawDocumentBuf::from_document(&want).unwrap();
    assert_eq!(out.document(), &*want, "{:?}", out.document());
}

/// Stored values are restored anywhere in a reply, and nothing else is:
/// a binary of the subtype but not of 16 bytes stays. The added field is
/// taken out of returned documents only (a batch's, `findAndModify`'s
/// `value`), not from deeper ones or the envelope. A reply with nothing
/// to change is left as it came.
#[test]
fn replies_are_restored_raw_where_the_owned_rewrite_restored_them() {
    let (a, b) = (ObjectId::new(), ObjectId::new());
    let odd = Bson::Binary(Binary {
        subtype: BinarySubtype::UserDefined(SUBTYPE),
        bytes: vec![1; 12],
    });
    let reply = doc! {
        "cursor": {"nextBatch": [
            {"_lk": 1, "x": {"_lk": 2, "ids": [stored(a, Mode::Default), odd.clone()]}},
            {"y": stored(b, Mode::Default), "_lk": 3},
        ], "id": 5i64, "ns": "app.users"},
        "value": {"_lk": 4, "z": stored(a, Mode::Default)},
        "_lk": 6,
        "ok": 1.0,
    };
    let want = doc! {
        "cursor": {"nextBatch": [
            {"x": {"_lk": 2, "ids": [a, odd.clone()]}},
            {"y": b},
        ], "id": 5i64, "ns": "app.users"},
        "value": {"z": a},
        "_lk": 6,
        "ok": 1.0,
    };
    assert_replied(true, Some("_lk"), reply, want);
    let plain = bson::RawDocumentBuf::from_document(&doc! {"n": 1, "x": odd}).unwrap();
    assert!(super::reply(true, Some("_lk"), plain.as_bytes())
        .unwrap()
        .is_none());
}

#[test]
fn replace_refuses_sort_and_range_naming_the_collection_and_field() {
    let keys = replace_rule();
    for body in [
        doc! {"find": "users", "filter": {"_id": {"$gt": ObjectId::new()}}, "$db": "app"},
        doc! {"find": "users", "sort": {"_id": 1}, "$db": "app"},
        doc! {"aggregate": "users", "pipeline": [{"$sort": {"_id": -1}}], "cursor": {}, "$db": "app"},
        doc! {"delete": "users", "deletes": [{"q": {"_id": {"$lte": ObjectId::new()}}, "limit": 0}], "$db": "app"},
    ] {
        let err = keys
            .request(&mut cmd(body.clone()))
            .unwrap_err()
            .to_string();
        assert!(err.contains("app.users._id"), "{body}: {err}");
    }
    // Other collections are untouched.
    let mut other = cmd(doc! {"find": "orders", "sort": {"_id": 1}, "$db": "app"});
    keys.request(&mut other).unwrap();
    assert_eq!(
        other.body,
        doc! {"find": "orders", "sort": {"_id": 1}, "$db": "app"}
    );
}

#[test]
fn derive_adds_the_field_pins_queries_and_hides_it() {
    let keys = ShardKeys::new(vec![Rule::parse("app.users:_id:derive").unwrap()]);
    let (a, b) = (ObjectId::new(), ObjectId::new());
    let derived = |o: ObjectId| {
        Bson::Binary(Binary {
            subtype: BinarySubtype::Uuid,
            bytes: crate::locality::from_object_id(&o.bytes(), Mode::Default).to_vec(),
        })
    };

    let mut c = cmd(doc! {"insert": "users", "documents": [{"_id": a, "n": 1}], "$db": "app"});
    keys.request(&mut c).unwrap();
    assert_eq!(
        c.body.get_array("documents").unwrap()[0],
        Bson::Document(doc! {"_id": a, "n": 1, "_lk": derived(a)})
    );

    let mut c = cmd(doc! {"find": "users", "filter": {"_id": {"$in": [a, b]}}, "$db": "app"});
    let needs = keys.request(&mut c).unwrap();
    assert_eq!(
        c.body.get_document("filter").unwrap(),
        &doc! {"_id": {"$in": [a, b]}, "_lk": {"$in": [derived(a), derived(b)]}}
    );
    assert_eq!(needs.hide.as_deref(), Some("_lk"));

    let mut asked =
        cmd(doc! {"find": "users", "filter": {}, "projection": {"_lk": 1}, "$db": "app"});
    assert_eq!(keys.request(&mut asked).unwrap().hide, None);

    let mut c = cmd(
        doc! {"update": "users", "updates": [{"q": {"_id": a}, "u": {"$set": {"x": 1}}, "upsert": true}], "$db": "app"},
    );
    keys.request(&mut c).unwrap();
    let u = c.body.get_array("updates").unwrap()[0]
        .as_document()
        .unwrap()
        .clone();
    assert_eq!(
        u.get_document("u").unwrap(),
        &doc! {"$set": {"x": 1}, "$setOnInsert": {"_lk": derived(a)}}
    );

    let mut unpinned = cmd(
        doc! {"update": "users", "updates": [{"q": {"n": 1}, "u": {"$set": {"x": 1}}, "upsert": true}], "$db": "app"},
    );
    assert!(keys.request(&mut unpinned).is_err());

    assert_replied(
        false,
        Some("_lk"),
        doc! {"cursor": {"firstBatch": [{"_id": a, "_lk": derived(a)}], "id": 0i64}, "ok": 1.0},
        doc! {"cursor": {"firstBatch": [{"_id": a}], "id": 0i64}, "ok": 1.0},
    );
}

#[test]
fn the_byte_precheck_finds_stored_values() {
    let oid = ObjectId::new();
    let raw =
        bson::RawDocumentBuf::from_document(&doc! {"x": stored(oid, Mode::Sequential)}).unwrap();
    assert!(may_hold_stored_values(raw.as_bytes()));
    let raw = bson::RawDocumentBuf::from_document(&doc! {"x": oid}).unwrap();
    assert!(!may_hold_stored_values(raw.as_bytes()));
}
