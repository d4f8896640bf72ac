//! Holding back what an expanded cursor batch cannot carry.
//!
//! Expansion makes documents larger: a batch the server sized at 16 MB can
//! come to several times that once its tokens are replaced by long names. A
//! server never sends a reply body over 16 MiB + 16 KiB, and a driver drops
//! the connection on a message over `maxMessageSizeBytes`, so the proxy keeps
//! to the server's own limit: the batch is cut where it fills, and the rest
//! is held back and served, in order, by the cursor's next `getMore`s before
//! the upstream is asked for more. The driver is then given a proxy cursor
//! id (see [`proxy_cursor_id`]): while documents are held, the proxy
//! answers its `getMore`s; once they are served, and if the upstream cursor
//! lives, its `getMore`s and `killCursors` go upstream under the upstream's
//! id ([`rename_ids`]). A proxy that does not hold the documents (another
//! one, or this one restarted) sends that id upstream as it came, and the
//! server answers `CursorNotFound`: the driver never reads past documents
//! it was not given. A change stream's batch that is cut is resumable from
//! the last event sent (its `postBatchResumeToken` is that event's `_id`).
//!
//! Everything here is pure: the session keeps the held batches (shared by
//! every connection, since a driver may send `getMore` on any of its
//! connections) and does the I/O.

use std::collections::VecDeque;

use bson::{doc, Bson, Document, RawBsonRef, RawDocument, RawDocumentBuf};

use crate::error::ProxyError;
use crate::rewrite::expand::Strings;
use crate::rewrite::walker::{self, Fields};
use crate::rewrite::{CursorKind, Expansion};
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
    /// A change stream's `postBatchResumeToken` for the whole batch the
    /// documents were cut from (its type and value): sent with the part
    /// that ends the batch. The parts before it carry their last event's
    /// `_id`, from which the stream resumes just after that event.
    pub resume: Option<(u8, Vec<u8>)>,
    /// How many of the batch's documents fit in the reply: what the
    /// cursor's next `getMore`s ask the upstream for at most, so that
    /// their batches, filled by the server up to its own limit in stored
    /// bytes, are not cut again ([`cap_batch`]).
    pub fits: usize,
}

/// Cursor ids the driver knows by the proxy's ids: `(proxy id, upstream
/// id)` pairs.
pub type Aliases = Vec<(i64, i64)>;

/// `body` (a command or a reply) with the cursor ids it names renamed by
/// `renames` (`(from, to)` pairs), where it names one: a `getMore`'s, a
/// `killCursors`' `cursors`, a reply's `cursor.id` and `cursorsKilled`,
/// `cursorsNotFound`, `cursorsAlive` and `cursorsUnknown`, and a number in
/// an error's `errmsg` ("cursor id 123 not found"). `None` when it names
/// none of them. An id is eight bytes either way, so but for an `errmsg`
/// the body keeps its bytes and their places.
pub fn rename_ids(
    body: &RawDocument,
    renames: &[(i64, i64)],
) -> Result<Option<MsgBody>, walker::Malformed> {
    let rename = |id| renames.iter().find(|r| r.0 == id).map(|r| r.1);
    let bytes = body.as_bytes();
    let mut places = Vec::new();
    let mut message = None;
    for e in walker::elements(bytes) {
        let e = e?;
        let at = e.value_at();
        match (e.key, e.kind) {
            (b"getMore", INT64) => places.push(at),
            (b"errmsg", STRING) => message = Some(walker::string_of(e.value)?),
            (b"cursor", DOCUMENT) => {
                for c in walker::elements(e.value) {
                    let c = c?;
                    if c.key == b"id" && c.kind == INT64 {
                        places.push(at + c.value_at());
                    }
                }
            }
            (
                b"cursors" | b"cursorsKilled" | b"cursorsNotFound" | b"cursorsAlive"
                | b"cursorsUnknown",
                ARRAY,
            ) => {
                for c in walker::elements(e.value) {
                    let c = c?;
                    if c.kind == INT64 {
                        places.push(at + c.value_at());
                    }
                }
            }
            _ => {}
        }
    }
    // Written in place in the buffer of the message that will carry it.
    let mut out: Option<Vec<u8>> = None;
    for at in places {
        let id = i64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default());
        if let Some(new) = rename(id) {
            let out = out.get_or_insert_with(|| {
                let mut buf = MsgBody::buffer(bytes.len());
                buf.extend_from_slice(bytes);
                buf
            });
            let at = MsgBody::AT + at;
            out[at..at + 8].copy_from_slice(&new.to_le_bytes());
        }
    }
    if let Some(message) = message.and_then(|m| renamed_numbers(m, &rename)) {
        let patched = out.as_ref().map_or(bytes, |o| &o[MsgBody::AT..]);
        let mut buf = MsgBody::buffer(patched.len() + message.len());
        let start = walker::begin(&mut buf);
        for e in walker::elements(patched) {
            let e = e?;
            if e.key == b"errmsg" {
                walker::header(&mut buf, STRING, e.key);
                walker::string_value(&mut buf, &message);
            } else {
                buf.extend_from_slice(e.raw);
            }
        }
        walker::finish(&mut buf, start);
        out = Some(buf);
    }
    // Ids of eight bytes replaced by ids of eight, an error's text by a
    // text: still a document.
    Ok(out.and_then(|b| MsgBody::new(b).ok()))
}

/// `text` with each whole number that `rename` renames written as its new
/// value; `None` when none is.
fn renamed_numbers(text: &str, rename: &dyn Fn(i64) -> Option<i64>) -> Option<String> {
    let mut out = String::new();
    let mut copied = 0;
    let mut digits = text
        .char_indices()
        .filter(|(_, c)| c.is_ascii_digit())
        .peekable();
    while let Some((start, _)) = digits.next() {
        let mut end = start + 1;
        while digits.peek().is_some_and(|&(i, _)| i == end) {
            digits.next();
            end += 1;
        }
        let negative = text[..start].ends_with('-');
        let from = if negative { start - 1 } else { start };
        let Some(new) = text[from..end].parse().ok().and_then(rename) else {
            continue;
        };
        out.push_str(&text[copied..from]);
        out.push_str(&new.to_string());
        copied = end;
    }
    (copied > 0).then(|| out + &text[copied..])
}

/// A change event's `_id` (its resume token), as a type and value.
fn resume_token_of(event: &RawDocument) -> Result<(u8, Vec<u8>), ProxyError> {
    walker::elements(event.as_bytes())
        .map_while(Result::ok)
        .find(|e| e.key == b"_id")
        .map(|e| (e.kind, e.value.to_vec()))
        .ok_or_else(|| {
            ProxyError::Internal("a change event without _id cannot be cut from its batch".into())
        })
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
/// body to send, with the id the driver must use for the cursor from now on
/// (`known`, the proxy id the driver already uses for it, or a fresh one),
/// and the documents held back under that id. `None` when the body fits or
/// is not a cursor reply.
pub fn split(
    body: &RawDocument,
    limit: usize,
    known: Option<i64>,
) -> Result<Option<(MsgBody, i64, Held)>, ProxyError> {
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
    let client_id = known.unwrap_or_else(proxy_cursor_id);
    let resume = body
        .doc_field("cursor")
        .and_then(|c| c.field("postBatchResumeToken"))
        .map(|t| (t.kind, t.value.to_vec()));
    let cut_at = match resume {
        Some(_) => Some(resume_token_of(docs[keep - 1])?),
        None => None,
    };
    let held = Held {
        ns: ns.to_owned(),
        docs: docs[keep..].iter().map(|d| (*d).to_owned()).collect(),
        upstream_id,
        resume,
        fits: keep,
    };
    let out = rebuild(body, field, &docs[..keep], client_id, cut_at.as_ref())?;
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

/// The reply body with its batch, cursor id and (a change stream's)
/// `postBatchResumeToken` replaced, key order kept, written in one pass
/// into the buffer of the message that will carry it.
fn rebuild(
    body: &RawDocument,
    field: &str,
    docs: &[&RawDocument],
    id: i64,
    resume: Option<&(u8, Vec<u8>)>,
) -> Result<MsgBody, ProxyError> {
    let invalid = |e: walker::Malformed| ProxyError::Internal(format!("cursor reply: {e}"));
    // About the body as it came: the batch is part of the one it held, an
    // id of 8 bytes may have been one of 4, and the resume token is one
    // of the batch's.
    let extra = resume.map_or(0, |(_, v)| v.len());
    let mut out = MsgBody::buffer(body.as_bytes().len() + 4 + extra);
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
                b"postBatchResumeToken" => match resume {
                    Some((kind, value)) => {
                        walker::header(&mut out, *kind, c.key);
                        out.extend_from_slice(value);
                    }
                    None => out.extend_from_slice(c.raw),
                },
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

const DOUBLE: u8 = 0x01;
const STRING: u8 = 0x02;
const DOCUMENT: u8 = 0x03;
const ARRAY: u8 = 0x04;
const INT32: u8 = 0x10;
const INT64: u8 = 0x12;

/// The `getMore` reply served from held documents: as many as `batch_size`
/// (if given) and `limit` allow, at least one. The cursor stays open while
/// documents are held or the upstream cursor lives. A change stream's
/// part carries its last event's `_id` as its `postBatchResumeToken`, and
/// the last part the token of the batch it was cut from.
pub fn get_more_reply(
    held: &mut Held,
    client_id: i64,
    batch_size: Option<usize>,
    limit: usize,
) -> Result<MsgBody, ProxyError> {
    let mut docs = Vec::new();
    // Room for the envelope, and a change stream's resume token (an
    // event's `_id` may be a little longer than the batch's token).
    let token_room = held.resume.as_ref().map_or(0, |(_, v)| 2 * v.len() + 64);
    let mut room = limit.saturating_sub(held.ns.len() + 64 + token_room);
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
    let resume = match (&held.resume, docs.last()) {
        (Some(whole), _) if held.docs.is_empty() => Some(whole.clone()),
        (Some(_), Some(last)) => Some(resume_token_of(last)?),
        _ => None,
    };
    let refs: Vec<&RawDocument> = docs.iter().map(|d| d.as_ref()).collect();
    // {cursor: {nextBatch: [...], postBatchResumeToken, id, ns}, ok: 1.0}
    let token_len = resume.as_ref().map_or(0, |(_, v)| v.len() + 22);
    let mut out = MsgBody::buffer(size + token_len + held.ns.len() + 64);
    let start = walker::begin(&mut out);
    walker::header(&mut out, DOCUMENT, b"cursor");
    let cursor = walker::begin(&mut out);
    write_batch(&mut out, b"nextBatch", &refs);
    if let Some((kind, value)) = &resume {
        walker::header(&mut out, *kind, b"postBatchResumeToken");
        out.extend_from_slice(value);
    }
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
    // Read with the walker: the bson crate's getters check every element
    // they pass, and this reads every reply to a `getMore` of a cursor the
    // proxy did not record, which includes every cursor of documents (only
    // the others' kinds are recorded when they open).
    let Some(cursor) = body.doc_field("cursor") else {
        return Ok(documents.clone());
    };
    let ns = cursor.str_field("ns").unwrap_or_default();
    let kind = |strings, expand| CursorKind { strings, expand };
    if cursor.field("postBatchResumeToken").is_some() {
        return Ok(match ns {
            "admin.$cmd.aggregate" => kind(Strings::Events, Some(Expansion::PerEvent)),
            _ => kind(Strings::Events, documents.expand.clone()),
        });
    }
    if ns.ends_with(".$cmd.listCollections") {
        return Ok(kind(Strings::Paths, documents.expand.clone()));
    }
    if ns == "admin.$cmd.bulkWrite" {
        let id = cursor.field("id").and_then(|e| e.i64()).unwrap_or_default();
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

/// A `getMore` that asks the upstream for at most `most` documents: its
/// `batchSize` lowered to `most`, or added. `None` when it asks for no more
/// already, or for a number the server reads otherwise (0, negative, not a
/// number: it goes as it came, and the server answers it as it would).
/// Fewer documents than asked for is what a server sends too when a batch
/// reaches its size limit.
pub fn cap_batch(body: &RawDocument, most: usize) -> Result<Option<MsgBody>, walker::Malformed> {
    let bytes = body.as_bytes();
    for e in walker::elements(bytes) {
        let e = e?;
        if e.key == b"batchSize" {
            let asked = match e.kind {
                INT32 => e
                    .value
                    .first_chunk()
                    .map(|b| f64::from(i32::from_le_bytes(*b))),
                INT64 => e.value.first_chunk().map(|b| i64::from_le_bytes(*b) as f64),
                DOUBLE => e.value.first_chunk().map(|b| f64::from_le_bytes(*b)),
                _ => None,
            };
            match asked {
                Some(n) if n > most as f64 => break,
                _ => return Ok(None),
            }
        }
    }
    let most = i32::try_from(most.max(1)).unwrap_or(i32::MAX);
    let mut buf = MsgBody::buffer(bytes.len() + 16);
    let start = walker::begin(&mut buf);
    for e in walker::elements(bytes) {
        let e = e?;
        if e.key != b"batchSize" {
            buf.extend_from_slice(e.raw);
        }
    }
    walker::header(&mut buf, INT32, b"batchSize");
    buf.extend_from_slice(&most.to_le_bytes());
    walker::finish(&mut buf, start);
    Ok(MsgBody::new(buf).ok())
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
    fn a_get_more_asks_for_no_more_than_fitted() {
        use bson::{rawdoc, RawBson};
        let capped = |body: RawDocumentBuf| {
            cap_batch(&body, 15)
                .unwrap()
                .map(|b| Document::try_from(b.document()).unwrap())
        };
        // Added where the driver asked for the server's default, after the
        // fields it sent (in their order).
        assert_eq!(
            capped(rawdoc! {"getMore": 5_i64, "collection": "c", "$db": "app"}),
            Some(doc! {"getMore": 5_i64, "collection": "c", "$db": "app", "batchSize": 15})
        );
        // Lowered, whatever its numeric type.
        for asked in [
            RawBson::Int32(100),
            RawBson::Int64(100),
            RawBson::Double(100.0),
        ] {
            let body = rawdoc! {"getMore": 5_i64, "collection": "c", "batchSize": asked};
            assert_eq!(
                capped(body),
                Some(doc! {"getMore": 5_i64, "collection": "c", "batchSize": 15})
            );
        }
        // No more than that already, or what the server reads its own way:
        // as it came.
        for asked in [
            RawBson::Int32(15),
            RawBson::Int64(2),
            RawBson::Int32(0),
            RawBson::Int32(-1),
            RawBson::String("x".into()),
        ] {
            let body = rawdoc! {"getMore": 5_i64, "collection": "c", "batchSize": asked};
            assert_eq!(capped(body), None);
        }
    }

    #[test]
    fn a_batch_that_fits_is_left_alone() {
        assert!(split(&reply(7, 10, 100), 10_000, None).unwrap().is_none());
    }

    /// The cut batch names its cursor by a proxy id, never the upstream's:
    /// a proxy that does not hold the rest cannot continue it past them.
    #[test]
    fn an_oversized_batch_is_cut_and_the_rest_served_in_order() {
        let body = reply(7, 10, 1000);
        let (out, id, mut held) = split(&body, 3500, None).unwrap().unwrap();
        let out = out.document();
        assert!(out.as_bytes().len() <= 3500);
        assert!(id > 0 && id != 7, "a proxy id: {id}");
        assert_eq!(held.upstream_id, 7);
        assert_eq!(ids(out, "firstBatch"), vec![0, 1, 2]);
        assert_eq!(
            out.get_document("cursor").unwrap().get_i64("id").unwrap(),
            id
        );
        let mut seen = Vec::new();
        while !held.docs.is_empty() {
            let next = get_more_reply(&mut held, id, Some(2), 3500).unwrap();
            let next = next.document();
            assert!(next.as_bytes().len() <= 3500);
            assert_eq!(
                next.get_document("cursor").unwrap().get_i64("id").unwrap(),
                id
            );
            seen.extend(ids(next, "nextBatch"));
        }
        assert_eq!(seen, (3..10).collect::<Vec<_>>());
        // A batch cut again keeps the id the driver already has.
        let (_, again, _) = split(&body, 3500, Some(id)).unwrap().unwrap();
        assert_eq!(again, id);
    }

    /// A change stream's batch that is cut can be resumed from the last
    /// event each part gives: its `postBatchResumeToken` is that event's
    /// `_id`, and only the part that ends the batch carries the batch's.
    #[test]
    fn a_cut_change_stream_batch_resumes_from_the_last_event_sent() {
        let events: Vec<Bson> = (0..10)
            .map(|i| {
                Bson::Document(doc! {"_id": {"_data": format!("8{i}")}, "pad": "x".repeat(1000)})
            })
            .collect();
        let batch_end = doc! {"_data": "8Z"};
        let body = RawDocumentBuf::from_document(&doc! {
            "cursor": {"nextBatch": events, "postBatchResumeToken": batch_end.clone(), "id": 7_i64, "ns": "app.c"},
            "ok": 1.0,
        })
        .unwrap();
        let token = |body: &RawDocument| {
            let cursor = body.get_document("cursor").unwrap();
            let token = cursor.get_document("postBatchResumeToken").unwrap();
            let keys: Vec<String> = cursor.iter().map(|e| e.unwrap().0.to_owned()).collect();
            (token.get_str("_data").unwrap().to_owned(), keys)
        };
        let (out, id, mut held) = split(&body, 3500, None).unwrap().unwrap();
        let keys: Vec<String> = ["nextBatch", "postBatchResumeToken", "id", "ns"]
            .map(String::from)
            .to_vec();
        assert_eq!(token(out.document()), ("82".to_owned(), keys.clone()));
        let mut tokens = Vec::new();
        while !held.docs.is_empty() {
            let next = get_more_reply(&mut held, id, Some(3), 1 << 20).unwrap();
            let (t, k) = token(next.document());
            assert_eq!(k, keys);
            tokens.push(t);
        }
        assert_eq!(tokens, ["85", "88", "8Z"]);
    }

    /// Cursor ids are renamed where commands and replies name them, and
    /// nowhere else.
    #[test]
    fn cursor_ids_are_renamed_where_they_are_named() {
        let renamed = |d: Document| {
            let raw = RawDocumentBuf::from_document(&d).unwrap();
            rename_ids(&raw, &[(7, 70)])
                .unwrap()
                .map(|b| Document::try_from(b.document()).unwrap())
        };
        assert_eq!(
            renamed(doc! {"getMore": 7_i64, "collection": "c", "batchSize": 7_i64}),
            Some(doc! {"getMore": 70_i64, "collection": "c", "batchSize": 7_i64})
        );
        assert_eq!(
            renamed(doc! {"killCursors": "c", "cursors": [5_i64, 7_i64]}),
            Some(doc! {"killCursors": "c", "cursors": [5_i64, 70_i64]})
        );
        assert_eq!(
            renamed(
                doc! {"cursor": {"nextBatch": [{"id": 7_i64}], "id": 7_i64, "ns": "a.c"}, "ok": 1.0}
            ),
            Some(
                doc! {"cursor": {"nextBatch": [{"id": 7_i64}], "id": 70_i64, "ns": "a.c"}, "ok": 1.0}
            )
        );
        assert_eq!(
            renamed(
                doc! {"cursorsKilled": [7_i64], "cursorsNotFound": [], "cursorsAlive": [], "cursorsUnknown": [], "ok": 1.0}
            ),
            Some(
                doc! {"cursorsKilled": [70_i64], "cursorsNotFound": [], "cursorsAlive": [], "cursorsUnknown": [], "ok": 1.0}
            )
        );
        assert_eq!(renamed(doc! {"getMore": 8_i64, "collection": "c"}), None);
        assert_eq!(renamed(doc! {"n": 7_i64, "id": 7_i64}), None);
        // An error's text names the id as a number: whole numbers only.
        assert_eq!(
            renamed(doc! {"ok": 0.0, "errmsg": "cursor id 7 not found (77, 7a, -7)", "code": 43}),
            Some(doc! {"ok": 0.0, "errmsg": "cursor id 70 not found (77, 70a, -7)", "code": 43})
        );
        assert_eq!(renamed(doc! {"ok": 0.0, "errmsg": "code 43"}), None);
    }

    #[test]
    fn an_exhausted_upstream_cursor_gets_a_proxy_id_that_closes_when_drained() {
        let (out, id, mut held) = split(&reply(0, 4, 1000), 2500, None).unwrap().unwrap();
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
        let envelope = |field: &str, batch: &[Document], id: i64, resume: Bson| {
            let cursor = doc! {field: batch.to_vec(), "id": id, "ns": "app.c",
            "postBatchResumeToken": resume};
            RawDocumentBuf::from_document(&doc! {
                "cursor": cursor, "ok": 1.0,
                "$clusterTime": {"clusterTime": bson::Timestamp {time: 1, increment: 2}},
                "operationTime": bson::Timestamp {time: 1, increment: 2},
            })
            .unwrap()
        };
        let whole = Bson::Document(doc! {"_data": "82"});
        let (out, id, mut held) = split(&envelope("firstBatch", &docs, 7, whole), 2000, Some(7))
            .unwrap()
            .unwrap();
        // The resume token is the last event's `_id` (an int here).
        let cut = envelope("firstBatch", &docs[..4], 7, Bson::Int32(3));
        assert_eq!(out.document(), &*cut);
        let next = get_more_reply(&mut held, id, Some(5), 100_000).unwrap();
        let want = doc! {"cursor": {"nextBatch": docs[4..9].to_vec(), "postBatchResumeToken": 8, "id": 7_i64, "ns": "app.c"}, "ok": 1.0};
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
        let (out, _, held) = split(&reply(9, 2, 5000), 3000, None).unwrap().unwrap();
        let out = out.document();
        assert_eq!(ids(out, "firstBatch"), vec![0]);
        assert_eq!(held.docs.len(), 1);
    }
}
