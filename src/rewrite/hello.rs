//! The handshake: `hello`/`isMaster` requests and their replies.
//!
//! Laconic presents itself as a **mongos** (`msg: "isdbgrid"`): the replica-set
//! fields that would send a driver to the upstream's own address (`hosts`,
//! `me`, `primary`, `setName`, …) are removed, so a driver given only the
//! proxy's address stays on it, whatever address it used. `maxWireVersion`
//! is capped at the newest version whose commands Laconic understands, and
//! compression is negotiated separately on each leg.

use bson::{RawBsonRef, RawDocument, RawDocumentBuf};

use super::{LegState, ReplyPlan, Rewritten, Settings};
use crate::error::ProxyError;
use crate::wire::{Compressor, Frame, Message, OpQuery, OpReply};

/// The newest wire version Laconic understands (MongoDB 8.0).
pub const MAX_WIRE_VERSION: i32 = 25;

/// Fields of a replica-set member's hello reply that a mongos does not send.
const TOPOLOGY_FIELDS: &[&str] = &[
    "hosts",
    "passives",
    "arbiters",
    "primary",
    "me",
    "setName",
    "setVersion",
    "electionId",
    "secondary",
    "arbiterOnly",
    "passive",
    "hidden",
    "tags",
    "isreplicaset",
    "lastWrite",
];

/// What a hello's replies need.
#[derive(Clone, Debug, PartialEq)]
pub struct HelloPlan {
    /// Whether the request negotiated compression (it carried `compression`).
    pub negotiates: bool,
    /// The compressors both the driver and the proxy support, in the driver's order.
    pub client_offer: Vec<Compressor>,
    /// The compressors the proxy offered the upstream.
    pub upstream_offer: Vec<Compressor>,
}

pub fn is_hello(command: &str) -> bool {
    command == "hello" || command.eq_ignore_ascii_case("ismaster")
}

/// Replaces the driver's `compression` list with the proxy's upstream offer.
/// The connection's first hello always carries that offer, whether or not the
/// driver asked for compression on its own leg.
pub(super) fn request(
    frame: &Frame,
    settings: &Settings,
    legs: &LegState,
) -> Result<Rewritten, ProxyError> {
    let command = match frame.message() {
        Message::Msg(m) => Some(m.body()),
        Message::Query(q) => q.command(),
        _ => None,
    }
    .ok_or_else(|| ProxyError::Internal("hello without a body".into()))?;

    let asked = match command.get("compression") {
        Ok(Some(RawBsonRef::Array(a))) => Some(
            a.into_iter()
                .filter_map(|v| v.ok().and_then(|v| v.as_str()))
                .filter_map(Compressor::from_name)
                .collect::<Vec<_>>(),
        ),
        _ => None,
    };
    let asked = match asked {
        Some(asked) => asked,
        None if !legs.handshaken && !settings.upstream_compressors.is_empty() => Vec::new(),
        None => {
            return Ok(Rewritten {
                misses: Default::default(),
                frame: None,
                plan: ReplyPlan::Hello(HelloPlan {
                    negotiates: false,
                    client_offer: Vec::new(),
                    upstream_offer: Vec::new(),
                }),
            })
        }
    };
    let plan = HelloPlan {
        negotiates: true,
        client_offer: asked
            .into_iter()
            .filter(|c| settings.client_compressors.contains(c))
            .collect(),
        upstream_offer: settings.upstream_compressors.clone(),
    };
    let offer = names(&plan.upstream_offer);
    let new_command = copy_replacing(command, "compression", offer.as_ref())?;
    let message = match frame.message() {
        Message::Msg(m) => {
            let mut m = m.clone();
            m.set_body(new_command);
            Message::Msg(m)
        }
        Message::Query(q) => {
            let query = match q.query() {
                Some(outer) if outer.get_document("$query").is_ok() => {
                    replace_subdocument(outer, "$query", &new_command)?
                }
                _ => new_command,
            };
            Message::Query(OpQuery {
                query: query.into_bytes().into(),
                ..q.clone()
            })
        }
        _ => unreachable_message()?,
    };
    Ok(Rewritten {
        misses: Default::default(),
        frame: Some(frame.with_message(message)),
        plan: ReplyPlan::Hello(plan),
    })
}

/// Presents the upstream's hello reply as a mongos's, and settles compression.
pub(super) fn reply(
    frame: Frame,
    plan: &HelloPlan,
    legs: &mut LegState,
) -> Result<Frame, ProxyError> {
    let body = match frame.message() {
        Message::Msg(m) => m.body().to_owned(),
        Message::Reply(r) => match r.first() {
            Some(d) => d.to_owned(),
            None => return Ok(frame),
        },
        _ => return Ok(frame),
    };
    if !is_ok(&body) {
        return Ok(frame);
    }
    if plan.negotiates {
        legs.handshaken = true;
        let accepted = match body.get("compression") {
            Ok(Some(RawBsonRef::Array(a))) => a
                .into_iter()
                .filter_map(|v| v.ok().and_then(|v| v.as_str()))
                .filter_map(Compressor::from_name)
                .collect(),
            _ => Vec::new(),
        };
        legs.upstream_compressor = plan
            .upstream_offer
            .iter()
            .copied()
            .find(|c| accepted.contains(c));
    }
    let new_body = present_as_mongos(&body, plan)?;
    let message = match frame.message() {
        Message::Msg(m) => {
            let mut m = m.clone();
            m.set_body(new_body);
            Message::Msg(m)
        }
        Message::Reply(r) => {
            let mut r: OpReply = r.clone();
            r.documents[0] = new_body.into_bytes().into();
            Message::Reply(r)
        }
        _ => unreachable_message()?,
    };
    Ok(frame.with_message(message))
}

fn present_as_mongos(body: &RawDocument, plan: &HelloPlan) -> Result<RawDocumentBuf, ProxyError> {
    let mut out = RawDocumentBuf::new();
    let mut has_msg = false;
    for element in body {
        let (key, value) = element.map_err(bson_error)?;
        if TOPOLOGY_FIELDS.contains(&key) || key == "compression" {
            continue;
        }
        match (key, value) {
            ("maxWireVersion", RawBsonRef::Int32(v)) => {
                out.append(key, v.min(MAX_WIRE_VERSION));
            }
            ("msg", _) => {
                // Once, wherever the server puts it (before or after `ok`).
                if !has_msg {
                    out.append(key, "isdbgrid");
                }
                has_msg = true;
            }
            ("ok", v) => {
                if !has_msg {
                    out.append("msg", "isdbgrid");
                    has_msg = true;
                }
                if plan.negotiates && !plan.client_offer.is_empty() {
                    out.append("compression", names(&plan.client_offer).unwrap_or_default());
                }
                out.append(key, v.to_raw_bson());
            }
            (k, v) => out.append(k, v.to_raw_bson()),
        }
    }
    Ok(out)
}

fn is_ok(body: &RawDocument) -> bool {
    match body.get("ok") {
        Ok(Some(RawBsonRef::Double(v))) => v == 1.0,
        Ok(Some(RawBsonRef::Int32(v))) => v == 1,
        Ok(Some(RawBsonRef::Int64(v))) => v == 1,
        Ok(Some(RawBsonRef::Boolean(v))) => v,
        _ => false,
    }
}

fn names(list: &[Compressor]) -> Option<bson::RawArrayBuf> {
    if list.is_empty() {
        return None;
    }
    let mut a = bson::RawArrayBuf::new();
    for c in list {
        a.push(c.name());
    }
    Some(a)
}

/// A copy of `doc` with `key` replaced by `value` in place (appended when
/// absent, dropped when `value` is `None`); other keys keep their order.
fn copy_replacing(
    doc: &RawDocument,
    key: &str,
    value: Option<&bson::RawArrayBuf>,
) -> Result<RawDocumentBuf, ProxyError> {
    let mut out = RawDocumentBuf::new();
    let mut placed = false;
    for element in doc {
        let (k, v) = element.map_err(bson_error)?;
        if k == key {
            placed = true;
            if let Some(value) = value {
                out.append(k, value.clone());
            }
        } else {
            out.append(k, v.to_raw_bson());
        }
    }
    if let (false, Some(value)) = (placed, value) {
        out.append(key, value.clone());
    }
    Ok(out)
}

fn replace_subdocument(
    doc: &RawDocument,
    key: &str,
    value: &RawDocumentBuf,
) -> Result<RawDocumentBuf, ProxyError> {
    let mut out = RawDocumentBuf::new();
    for element in doc {
        let (k, v) = element.map_err(bson_error)?;
        if k == key {
            out.append(k, value.clone());
        } else {
            out.append(k, v.to_raw_bson());
        }
    }
    Ok(out)
}

fn bson_error(e: bson::raw::Error) -> ProxyError {
    ProxyError::Unsupported(format!("invalid BSON in the handshake: {e}"))
}

fn unreachable_message<T>() -> Result<T, ProxyError> {
    Err(ProxyError::Internal(
        "unexpected message kind in the handshake".into(),
    ))
}

#[cfg(test)]
mod tests {
    use bson::{doc, Document};

    use super::*;
    use crate::wire::{MsgFlags, OpMsg};

    fn frame(d: Document) -> Frame {
        let raw = RawDocumentBuf::from_document(&d).unwrap();
        Frame::new(
            1,
            0,
            Message::Msg(OpMsg::from_body(MsgFlags::default(), &raw)),
        )
    }

    fn body(f: &Frame) -> Document {
        Document::try_from(f.op_msg().unwrap().body()).unwrap()
    }

    #[test]
    fn replica_set_reply_becomes_a_mongos_reply() {
        let settings = Settings {
            client_compressors: vec![Compressor::Zstd, Compressor::Snappy],
            upstream_compressors: vec![],
            ..Settings::default()
        };
        let req =
            frame(doc! {"hello": 1, "compression": ["snappy", "zlib", "zstd"], "$db": "admin"});
        let rw = request(&req, &settings, &LegState::default()).unwrap();
        let forwarded = rw.frame.unwrap();
        assert_eq!(body(&forwarded), doc! {"hello": 1, "$db": "admin"});
        let ReplyPlan::Hello(plan) = rw.plan else {
            panic!()
        };
        assert_eq!(
            plan.client_offer,
            vec![Compressor::Snappy, Compressor::Zstd]
        );

        let upstream = frame(doc! {
            "isWritablePrimary": true, "topologyVersion": {"counter": 0i64},
            "hosts": ["127.0.0.1:27017"], "setName": "rs0", "setVersion": 1,
            "primary": "127.0.0.1:27017", "me": "127.0.0.1:27017", "secondary": false,
            "maxWireVersion": 27, "minWireVersion": 0, "ok": 1.0,
        });
        let mut legs = LegState::default();
        let out = reply(upstream, &plan, &mut legs).unwrap();
        assert_eq!(
            body(&out),
            doc! {
                "isWritablePrimary": true, "topologyVersion": {"counter": 0i64},
                "maxWireVersion": 25, "minWireVersion": 0, "msg": "isdbgrid",
                "compression": ["snappy", "zstd"], "ok": 1.0,
            }
        );
        assert_eq!(legs.upstream_compressor, None);
    }

    #[test]
    fn upstream_leg_uses_what_the_upstream_accepts() {
        let settings = Settings {
            client_compressors: vec![],
            upstream_compressors: vec![Compressor::Zstd, Compressor::Zlib],
            ..Settings::default()
        };
        let req = frame(doc! {"isMaster": 1, "compression": ["zstd"]});
        let rw = request(&req, &settings, &LegState::default()).unwrap();
        assert_eq!(
            body(&rw.frame.unwrap()),
            doc! {"isMaster": 1, "compression": ["zstd", "zlib"]}
        );
        let ReplyPlan::Hello(plan) = rw.plan else {
            panic!()
        };
        let mut legs = LegState::default();
        let out = reply(
            frame(doc! {"ismaster": true, "compression": ["zlib"], "ok": 1}),
            &plan,
            &mut legs,
        )
        .unwrap();
        assert_eq!(legs.upstream_compressor, Some(Compressor::Zlib));
        assert_eq!(
            body(&out),
            doc! {"ismaster": true, "msg": "isdbgrid", "ok": 1}
        );
    }

    #[test]
    fn the_first_hello_offers_upstream_compression_even_if_the_driver_asks_none() {
        let settings = Settings {
            client_compressors: vec![Compressor::Zstd],
            upstream_compressors: vec![Compressor::Snappy],
            ..Settings::default()
        };
        let req = frame(doc! {"hello": 1, "$db": "admin"});
        let rw = request(&req, &settings, &LegState::default()).unwrap();
        assert_eq!(
            body(&rw.frame.unwrap()),
            doc! {"hello": 1, "$db": "admin", "compression": ["snappy"]}
        );
        let ReplyPlan::Hello(plan) = rw.plan else {
            panic!()
        };
        let mut legs = LegState::default();
        let out = reply(
            frame(doc! {"isWritablePrimary": true, "compression": ["snappy"], "ok": 1.0}),
            &plan,
            &mut legs,
        )
        .unwrap();
        assert_eq!(legs.upstream_compressor, Some(Compressor::Snappy));
        assert!(legs.handshaken);
        assert!(
            !body(&out).contains_key("compression"),
            "the driver asked for none"
        );
        // Later hellos (monitoring) are left alone.
        let later = request(&req, &settings, &legs).unwrap();
        assert!(later.frame.is_none());
    }

    #[test]
    fn legacy_op_query_handshake_is_rewritten_inside_query() {
        let q = RawDocumentBuf::from_document(&doc! {"$query": {"isMaster": 1, "compression": ["zlib"]}, "$readPreference": {"mode": "primary"}}).unwrap();
        let req = Frame::new(
            3,
            0,
            Message::Query(OpQuery {
                flags: 0,
                full_collection_name: "admin.$cmd".into(),
                number_to_skip: 0,
                number_to_return: -1,
                query: q.into_bytes().into(),
                return_fields_selector: None,
            }),
        );
        let settings = Settings {
            client_compressors: vec![Compressor::Zlib],
            upstream_compressors: vec![],
            ..Settings::default()
        };
        let rw = request(&req, &settings, &LegState::default()).unwrap();
        let Message::Query(out) = rw.frame.unwrap().into_message() else {
            panic!()
        };
        assert_eq!(
            Document::try_from(out.query().unwrap()).unwrap(),
            doc! {"$query": {"isMaster": 1}, "$readPreference": {"mode": "primary"}}
        );
        let ReplyPlan::Hello(plan) = rw.plan else {
            panic!()
        };
        let upstream =
            RawDocumentBuf::from_document(&doc! {"ismaster": true, "hosts": ["x:1"], "ok": 1.0})
                .unwrap();
        let out = reply(
            Frame::new(4, 3, Message::Reply(OpReply::single(&upstream))),
            &plan,
            &mut LegState::default(),
        )
        .unwrap();
        let Message::Reply(r) = out.message() else {
            panic!()
        };
        assert_eq!(
            Document::try_from(r.first().unwrap()).unwrap(),
            doc! {"ismaster": true, "msg": "isdbgrid", "compression": ["zlib"], "ok": 1.0}
        );
        // A mongos that puts `msg` after `ok`: still one `msg`.
        let upstream =
            RawDocumentBuf::from_document(&doc! {"ismaster": true, "ok": 1.0, "msg": "isdbgrid"})
                .unwrap();
        let out = reply(
            Frame::new(6, 5, Message::Reply(OpReply::single(&upstream))),
            &plan,
            &mut LegState::default(),
        )
        .unwrap();
        let Message::Reply(r) = out.message() else {
            panic!()
        };
        let keys: Vec<&str> = r.first().unwrap().iter().map(|e| e.unwrap().0).collect();
        assert_eq!(keys.iter().filter(|k| **k == "msg").count(), 1, "{keys:?}");
    }

    #[test]
    fn error_replies_pass_through() {
        let plan = HelloPlan {
            negotiates: false,
            client_offer: vec![],
            upstream_offer: vec![],
        };
        let f = frame(doc! {"ok": 0.0, "errmsg": "x", "hosts": ["a:1"]});
        let out = reply(f.clone(), &plan, &mut LegState::default()).unwrap();
        assert_eq!(out.to_bytes(), f.to_bytes());
    }
}
