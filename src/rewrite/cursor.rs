//! Holding back what an expanded cursor batch cannot carry.
//!
//! Expansion makes documents larger: a batch the server sized at 16 MB can
//! come to several times that once its tokens are replaced by long names. A
//! server never sends a reply body over 16 MiB + 16 KiB, and a driver drops
//! the connection on a message over `maxMessageSizeBytes`, so the proxy keeps
//! to the server's own limit: the batch is cut where it fills, and the rest
//! is held back and served, in order, by the cursor's next `getMore`s before
//! the upstream is asked for more. When the upstream cursor was already
//! exhausted, the driver is given a proxy cursor id (see [`proxy_cursor_id`])
//! that `getMore` and `killCursors` are answered for by the proxy itself.
//!
//! Everything here is pure: the session keeps the held batches (shared by
//! every connection, since a driver may send `getMore` on any of its
//! connections) and does the I/O.

use std::collections::VecDeque;

use bson::{doc, Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf};

use crate::error::ProxyError;
use crate::rewrite::expand::Strings;
use crate::rewrite::{walker, CursorKind, Expansion};
use crate::wire::MsgBody;

/// The largest reply body a server sends (`BSONObjectMaxInternalSize`).
pub const MAX_REPLY_BODY: usize = 16 * 1024 * 1024 + 16 * 1024;

/// Documents of one cursor that are waiting for its next `getMore`.
#[derive(Clone, Debug, PartialEq)]
pub struct Held {
    pub ns: String,
    pub docs: VecDeque<RawDocumentBuf>,
    /// The upstream's cursor id; 0 once the upstream cursor is exhausted.
    pub upstream_id: i64,
}

/// A fresh cursor id for a cursor the proxy alone still serves: random and
/// positive, as a server's are (a clash with a live server cursor of the
/// same deployment is as likely as two server cursors clashing). Only its
/// owner may use it ([`crate::exchange::CursorTable`]).
pub fn proxy_cursor_id() -> i64 {
    (crate::random::u64() >> 1).max(1) as i64
}

/// The cursor of a reply body: `(id, ns, batch field)`, if it is a cursor reply.
fn cursor_of(body: &RawDocument) -> Option<(i64, &str, &'static str, &bson::RawArray)> {
    let cursor = body.get_document("cursor").ok()?;
    let id = cursor.get_i64("id").ok()?;
    let ns = cursor.get_str("ns").unwrap_or_default();
    for field in ["firstBatch", "nextBatch"] {
        if let Ok(batch) = cursor.get_array(field) {
            return Some((id, ns, field, batch));
        }
    }
    None
}

/// Cuts an expanded cursor reply that exceeds `limit` bytes. Returns the
/// body to send, with the id the driver must use for the cursor from now on,
/// and the documents held back under that id. `None` when the body fits or
/// is not a cursor reply.
pub fn split(body: &RawDocument, limit: usize) -> Result<Option<(MsgBody, i64, Held)>, ProxyError> {
    if body.as_bytes().len() <= limit {
        return Ok(None);
    }
    let Some((upstream_id, ns, field, batch)) = cursor_of(body) else {
        return Ok(None);
    };
    let invalid = |e: bson::raw::Error| ProxyError::Internal(format!("cursor reply: {e}"));
    let docs: Vec<&RawDocument> = batch
        .into_iter()
        .map(|d| match d.map_err(invalid)? {
            RawBsonRef::Document(d) => Ok(d),
            _ => Err(ProxyError::Internal("a batch holds a non-document".into())),
        })
        .collect::<Result<_, _>>()?;
    let batch_len = batch.as_bytes().len();
    let envelope = body.as_bytes().len() - batch_len;
    // Room for the batch once the id may have grown to a proxy id (same size).
    let mut room = limit.saturating_sub(envelope + 5);
    let mut keep = 0;
    for d in &docs {
        // An array element: type byte, index key and its NUL, the document.
        let cost = 1 + decimal_len(keep) + 1 + d.as_bytes().len();
        if cost > room && keep > 0 {
            break;
        }
        room = room.saturating_sub(cost);
        keep += 1;
    }
    if keep == docs.len() {
        return Ok(None);
    }
    let client_id = if upstream_id == 0 {
        proxy_cursor_id()
    } else {
        upstream_id
    };
    let held = Held {
        ns: ns.to_owned(),
        docs: docs[keep..].iter().map(|d| (*d).to_owned()).collect(),
        upstream_id,
    };
    let out = rebuild(body, field, &docs[..keep], client_id)?;
    Ok(Some((out, client_id, held)))
}

/// `n` in decimal (an array element's key), written at the end of `buf`.
fn decimal(mut n: usize, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

fn decimal_len(n: usize) -> usize {
    n.checked_ilog10().map_or(1, |l| l as usize + 1)
}

/// The reply body with its batch and cursor id replaced, key order kept,
/// written in one pass into the buffer of the message that will carry it.
fn rebuild(
    body: &RawDocument,
    field: &str,
    docs: &[&RawDocument],
    id: i64,
) -> Result<MsgBody, ProxyError> {
    let invalid = |e: walker::Malformed| ProxyError::Internal(format!("cursor reply: {e}"));
    // At most the body as it came: the batch is part of the one it held,
    // and an id of 8 bytes may have been one of 4.
    let mut out = MsgBody::buffer(body.as_bytes().len() + 4);
    let start = walker::begin(&mut out);
    for element in walker::elements(body.as_bytes()) {
        let e = element.map_err(invalid)?;
        if e.key != b"cursor" {
            out.extend_from_slice(e.raw);
            continue;
        }
        if e.kind != DOCUMENT {
            return Err(ProxyError::Internal("cursor is not a document".into()));
        }
        walker::header(&mut out, DOCUMENT, e.key);
        let cursor = walker::begin(&mut out);
        for element in walker::elements(e.value) {
            let c = element.map_err(invalid)?;
            match c.key {
                b"id" => {
                    walker::header(&mut out, INT64, c.key);
                    out.extend_from_slice(&id.to_le_bytes());
                }
                k if k == field.as_bytes() => write_batch(&mut out, k, docs),
                _ => out.extend_from_slice(c.raw),
            }
        }
        walker::finish(&mut out, cursor);
    }
    walker::finish(&mut out, start);
    MsgBody::new(out).map_err(|e| ProxyError::Internal(format!("cursor reply: {e}")))
}

/// A batch of documents as the array element `key`.
fn write_batch(out: &mut Vec<u8>, key: &[u8], docs: &[&RawDocument]) {
    walker::header(out, ARRAY, key);
    let array = walker::begin(out);
    let mut digits = [0u8; 20];
    for (i, d) in docs.iter().enumerate() {
        walker::header(out, DOCUMENT, decimal(i, &mut digits));
        out.extend_from_slice(d.as_bytes());
    }
    walker::finish(out, array);
}

const DOCUMENT: u8 = 0x03;
const ARRAY: u8 = 0x04;
const INT64: u8 = 0x12;

/// The `getMore` reply served from held documents: as many as `batch_size`
/// (if given) and `limit` allow, at least one. The cursor stays open while
/// documents are held or the upstream cursor lives.
pub fn get_more_reply(
    held: &mut Held,
    client_id: i64,
    batch_size: Option<usize>,
    limit: usize,
) -> Result<MsgBody, ProxyError> {
    let mut docs = Vec::new();
    let mut room = limit.saturating_sub(held.ns.len() + 64);
    let mut size = 0;
    while let Some(d) = held.docs.front() {
        let cost = 1 + decimal_len(docs.len()) + 1 + d.as_bytes().len();
        if !docs.is_empty() && (cost > room || batch_size.is_some_and(|n| docs.len() >= n)) {
            break;
        }
        room = room.saturating_sub(cost);
        size += cost;
        docs.extend(held.docs.pop_front());
    }
    let id = if held.docs.is_empty() && held.upstream_id == 0 {
        0
    } else {
        client_id
    };
    let refs: Vec<&RawDocument> = docs.iter().map(|d| d.as_ref()).collect();
    // {cursor: {nextBatch: [...], id, ns}, ok: 1.0}
    let mut out = MsgBody::buffer(size + held.ns.len() + 64);
    let start = walker::begin(&mut out);
    walker::header(&mut out, DOCUMENT, b"cursor");
    let cursor = walker::begin(&mut out);
    write_batch(&mut out, b"nextBatch", &refs);
    walker::header(&mut out, INT64, b"id");
    out.extend_from_slice(&id.to_le_bytes());
    walker::header(&mut out, 0x02, b"ns");
    walker::string_value(&mut out, &held.ns);
    walker::finish(&mut out, cursor);
    walker::header(&mut out, 0x01, b"ok");
    out.extend_from_slice(&1.0f64.to_le_bytes());
    walker::finish(&mut out, start);
    MsgBody::new(out).map_err(|e| ProxyError::Internal(format!("cursor reply: {e}")))
}

/// The reply to a `killCursors` of cursors only the proxy serves.
pub fn kill_cursors_reply(ids: &[i64]) -> RawDocumentBuf {
    let ids: Vec<Bson> = ids.iter().map(|&i| Bson::Int64(i)).collect();
    let d: Document = doc! {
        "cursorsKilled": ids,
        "cursorsNotFound": [],
        "cursorsAlive": [],
        "cursorsUnknown": [],
        "ok": 1.0,
    };
    RawDocumentBuf::from_document(&d).unwrap_or_default()
}

/// What the batches of a cursor the proxy did not see opened hold (it was
/// opened through another proxy, or before this one restarted), read from
/// a reply to its `getMore`, whose documents' kind is `documents`. A
/// change stream's cursor carries a `postBatchResumeToken`: its batches
/// are change events, each of a cluster-wide stream (`ns`
/// `admin.$cmd.aggregate`) with its own database's dictionary. A
/// `listCollections` cursor (`ns` `<db>.$cmd.listCollections`) holds
/// collection options, with paths in strings. A `bulkWrite`'s results
/// (`admin.$cmd.bulkWrite`) cannot be read without the command that asked
/// for them (each op's database): refused. Any other cursor holds
/// documents.
pub fn kind_of_unknown(
    body: &RawDocument,
    documents: &CursorKind,
) -> Result<CursorKind, ProxyError> {
    let Ok(cursor) = body.get_document("cursor") else {
        return Ok(documents.clone());
    };
    let ns = cursor.get_str("ns").unwrap_or_default();
    let kind = |strings, expand| CursorKind { strings, expand };
    if cursor.get("postBatchResumeToken").ok().flatten().is_some() {
        return Ok(match ns {
            "admin.$cmd.aggregate" => kind(Strings::Events, Some(Expansion::PerEvent)),
            _ => kind(Strings::Events, documents.expand.clone()),
        });
    }
    if ns.ends_with(".$cmd.listCollections") {
        return Ok(kind(Strings::Paths, documents.expand.clone()));
    }
    if ns == "admin.$cmd.bulkWrite" {
        let id = cursor.get_i64("id").unwrap_or_default();
        return Err(ProxyError::Unsupported(format!(
            "getMore of bulkWrite cursor {id}, which was opened through another proxy or before this one restarted: its results cannot be read without the bulkWrite; read them through the proxy that ran it"
        )));
    }
    Ok(documents.clone())
}

/// The cursor id and `batchSize` of a `getMore` body.
pub fn get_more_target(body: &RawDocument) -> Option<(i64, Option<usize>)> {
    let id = body.get_i64("getMore").ok()?;
    let batch_size = match body.get("batchSize").ok().flatten() {
        Some(RawBsonRef::Int32(n)) => usize::try_from(n).ok().filter(|&n| n > 0),
        Some(RawBsonRef::Int64(n)) => usize::try_from(n).ok().filter(|&n| n > 0),
        _ => None,
    };
    Some((id, batch_size))
}

/// The cursor ids of a `killCursors` body.
pub fn kill_cursors_targets(body: &RawDocument) -> Vec<i64> {
    body.get_array("cursors")
        .map(|a| a.into_iter().filter_map(|v| v.ok()?.as_i64()).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(id: i64, docs: usize, size: usize) -> RawDocumentBuf {
        let batch: Vec<Bson> = (0..docs)
            .map(|i| Bson::Document(doc! {"_id": i as i32, "pad": "x".repeat(size)}))
            .collect();
        let d = doc! {"cursor": {"firstBatch": batch, "id": id, "ns": "app.c"}, "ok": 1.0};
        RawDocumentBuf::from_document(&d).unwrap()
    }

    fn ids(body: &RawDocument, field: &str) -> Vec<i32> {
        let cursor = body.get_document("cursor").unwrap();
        cursor
            .get_array(field)
            .unwrap()
            .into_iter()
            .map(|d| d.unwrap().as_document().unwrap().get_i32("_id").unwrap())
            .collect()
    }

    #[test]
    fn a_batch_that_fits_is_left_alone() {
        assert!(split(&reply(7, 10, 100), 10_000).unwrap().is_none());
    }

    #[test]
    fn an_oversized_batch_is_cut_and_the_rest_served_in_order() {
        let body = reply(7, 10, 1000);
        let (out, id, mut held) = split(&body, 3500).unwrap().unwrap();
        let out = out.document();
        assert!(out.as_bytes().len() <= 3500);
        assert_eq!(id, 7);
        assert_eq!(ids(out, "firstBatch"), vec![0, 1, 2]);
        assert_eq!(
            out.get_document("cursor").unwrap().get_i64("id").unwrap(),
            7
        );
        let mut seen = Vec::new();
        while !held.docs.is_empty() {
            let next = get_more_reply(&mut held, id, Some(2), 3500).unwrap();
            let next = next.document();
            assert!(next.as_bytes().len() <= 3500);
            assert_eq!(
                next.get_document("cursor").unwrap().get_i64("id").unwrap(),
                7
            );
            seen.extend(ids(next, "nextBatch"));
        }
        assert_eq!(seen, (3..10).collect::<Vec<_>>());
    }

    #[test]
    fn an_exhausted_upstream_cursor_gets_a_proxy_id_that_closes_when_drained() {
        let (out, id, mut held) = split(&reply(0, 4, 1000), 2500).unwrap().unwrap();
        let out = out.document();
        assert!(id > 0);
        assert_ne!(id, proxy_cursor_id(), "ids are drawn at random");
        assert_eq!(
            out.get_document("cursor").unwrap().get_i64("id").unwrap(),
            id
        );
        let next = get_more_reply(&mut held, id, None, 100_000).unwrap();
        let next = next.document();
        assert_eq!(ids(next, "nextBatch"), vec![2, 3]);
        assert_eq!(
            next.get_document("cursor").unwrap().get_i64("id").unwrap(),
            0
        );
    }

    /// The cut reply and the `getMore` replies are, byte for byte, what
    /// the bson crate builds for the same documents: every other field of
    /// the envelope and the cursor kept, in order.
    #[test]
    fn replies_are_written_as_the_bson_crate_would() {
        let docs: Vec<Document> = (0..12)
            .map(|i| doc! {"_id": i, "pad": "x".repeat(400)})
            .collect();
        let envelope = |field: &str, batch: &[Document], id: i64| {
            let cursor = doc! {field: batch.to_vec(), "id": id, "ns": "app.c",
            "postBatchResumeToken": {"_data": "82"}};
            RawDocumentBuf::from_document(&doc! {
                "cursor": cursor, "ok": 1.0,
                "$clusterTime": {"clusterTime": bson::Timestamp {time: 1, increment: 2}},
                "operationTime": bson::Timestamp {time: 1, increment: 2},
            })
            .unwrap()
        };
        let (out, id, mut held) = split(&envelope("firstBatch", &docs, 7), 2000)
            .unwrap()
            .unwrap();
        assert_eq!(out.document(), &*envelope("firstBatch", &docs[..4], 7));
        let next = get_more_reply(&mut held, id, Some(5), 100_000).unwrap();
        let want = doc! {"cursor": {"nextBatch": docs[4..9].to_vec(), "id": 7_i64, "ns": "app.c"}, "ok": 1.0};
        assert_eq!(
            next.document().as_bytes(),
            RawDocumentBuf::from_document(&want).unwrap().as_bytes()
        );
    }

    /// A cursor not seen opened is read as its `getMore` reply says.
    #[test]
    fn an_unknown_cursor_is_read_as_its_reply_says() {
        let documents = CursorKind {
            strings: Strings::Data,
            expand: Some(Expansion::One("app".into())),
        };
        let kind = |cursor: Document| {
            let body = RawDocumentBuf::from_document(&doc! {"cursor": cursor, "ok": 1.0}).unwrap();
            kind_of_unknown(&body, &documents)
        };
        let token = doc! {"_data": "82"};
        let stream = kind(
            doc! {"nextBatch": [], "postBatchResumeToken": token.clone(), "id": 5_i64, "ns": "app.c"},
        );
        assert_eq!(stream.unwrap().strings, Strings::Events);
        let cluster = kind(doc! {"nextBatch": [], "postBatchResumeToken": token, "id": 5_i64, "ns": "admin.$cmd.aggregate"}).unwrap();
        assert_eq!(
            (cluster.strings, cluster.expand),
            (Strings::Events, Some(Expansion::PerEvent))
        );
        let listed = kind(doc! {"nextBatch": [], "id": 5_i64, "ns": "app.$cmd.listCollections"});
        assert_eq!(listed.unwrap().strings, Strings::Paths);
        let found = kind(doc! {"nextBatch": [], "id": 5_i64, "ns": "app.c"});
        assert_eq!(found.unwrap(), documents);
        let bulk = kind(doc! {"nextBatch": [], "id": 5_i64, "ns": "admin.$cmd.bulkWrite"});
        assert!(
            matches!(bulk, Err(ProxyError::Unsupported(m)) if m.contains("bulkWrite cursor 5"))
        );
    }

    #[test]
    fn a_single_document_larger_than_the_limit_still_travels() {
        let (out, _, held) = split(&reply(9, 2, 5000), 3000).unwrap().unwrap();
        let out = out.document();
        assert_eq!(ids(out, "firstBatch"), vec![0]);
        assert_eq!(held.docs.len(), 1);
    }
}
