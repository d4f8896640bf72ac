//! `laconic replay`: send a capture's requests to a target and report the
//! replies that differ from the recorded ones.
//!
//! Fields that legitimately change from run to run are ignored (see
//! [`crate::capture::diff::VOLATILE`]); cursor ids are mapped from the recorded ones to the target's,
//! so `getMore` and `killCursors` follow the right cursor. Handshake replies
//! are compared on `ok` alone, since they describe the server answering.
//! SASL conversations cannot be replayed (their proofs are single-use) and
//! are skipped.

use std::collections::HashMap;
use std::time::Duration;

use bson::{Bson, Document, RawDocumentBuf};

use crate::capture::diff::{diff_docs, show};
use crate::capture::{Direction, Record};
use crate::error::ProxyError;
use crate::rewrite::is_hello;
use crate::upstream::{self, UpstreamAddr};
use crate::wire::{Frame, Message, MAX_MESSAGE_SIZE};

/// One reply that did not match.
#[derive(Clone, Debug, PartialEq)]
pub struct Difference {
    /// Index of the request among the capture's requests.
    pub request: usize,
    pub command: String,
    /// The first differing path inside the reply (`cursor.firstBatch.0.a`).
    pub path: String,
    pub expected: String,
    pub actual: String,
}

/// What a replay found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ReplayReport {
    pub requests: usize,
    pub replies: usize,
    pub skipped: usize,
    pub differences: Vec<Difference>,
}

/// Replays `records` against `target`.
pub async fn replay(
    records: &[Record],
    target: &UpstreamAddr,
    timeout: Duration,
) -> Result<ReplayReport, ProxyError> {
    let mut conn = upstream::connect(target, timeout, MAX_MESSAGE_SIZE).await?;
    let mut report = ReplayReport::default();
    let mut cursors: HashMap<i64, i64> = HashMap::new();

    let mut i = 0;
    while i < records.len() {
        let request = &records[i];
        i += 1;
        if request.direction != Direction::Request {
            continue;
        }
        let expected: Vec<&Record> = records[i..]
            .iter()
            .take_while(|r| r.direction == Direction::Reply)
            .collect();
        i += expected.len();
        let index = report.requests;
        report.requests += 1;

        let command = request.frame.command_name().unwrap_or_default().to_owned();
        if command.to_ascii_lowercase().starts_with("sasl") || command == "authenticate" {
            report.skipped += 1;
            continue;
        }
        let frame = prepare(&request.frame, &cursors)?;
        upstream::send(&mut conn, frame).await?;
        if request.frame.more_to_come() {
            continue;
        }
        let mut stream_open = false;
        for (n, want) in expected.iter().enumerate() {
            let got = match tokio::time::timeout(timeout, upstream::next_reply(&mut conn)).await {
                Ok(reply) => reply?,
                Err(_) => {
                    return Err(ProxyError::UpstreamLost(format!(
                        "no reply to request {index} ({command}) within {timeout:?}"
                    )))
                }
            };
            report.replies += 1;
            let (want_doc, got_doc) = (reply_document(&want.frame), reply_document(&got));
            let diff = if is_hello(&command) {
                compare_field(&want_doc, &got_doc, "ok")
            } else {
                compare(&want_doc, &got_doc, &mut cursors)
            };
            if let Some((path, expected, actual)) = diff {
                report.differences.push(Difference {
                    request: index,
                    command: command.clone(),
                    path,
                    expected,
                    actual,
                });
            }
            stream_open = got.more_to_come();
            if !stream_open && n + 1 < expected.len() {
                report.differences.push(Difference {
                    request: index,
                    command: command.clone(),
                    path: "(replies)".into(),
                    expected: format!("{} replies", expected.len()),
                    actual: format!("{} replies", n + 1),
                });
                break;
            }
        }
        if stream_open {
            // The capture ended inside an exhaust stream (a streaming hello):
            // nothing more can be sent on this connection.
            break;
        }
    }
    Ok(report)
}

/// The request as it goes to the target: recorded cursor ids mapped to the
/// target's, and the recorded `$clusterTime` (signed by another deployment) removed.
fn prepare(frame: &Frame, cursors: &HashMap<i64, i64>) -> Result<Frame, ProxyError> {
    let Message::Msg(m) = frame.message() else {
        return Ok(frame.clone());
    };
    let mut body = Document::try_from(m.body())
        .map_err(|e| ProxyError::Internal(format!("recorded request is not valid BSON: {e}")))?;
    body.remove("$clusterTime");
    let map = |id: i64| cursors.get(&id).copied().unwrap_or(id);
    if let Some(Bson::Int64(id)) = body.get_mut("getMore") {
        *id = map(*id);
    }
    if let Some(Bson::Array(ids)) = body.get_mut("cursors") {
        for v in ids {
            if let Bson::Int64(id) = v {
                *id = map(*id);
            }
        }
    }
    let raw =
        RawDocumentBuf::from_document(&body).map_err(|e| ProxyError::Internal(e.to_string()))?;
    let mut m = m.clone();
    m.set_body(raw);
    Ok(frame.with_message(Message::Msg(m)))
}

fn reply_document(frame: &Frame) -> Document {
    let raw = match frame.message() {
        Message::Msg(m) => Some(m.body()),
        Message::Reply(r) => r.first(),
        _ => None,
    };
    raw.and_then(|d| Document::try_from(d).ok())
        .unwrap_or_default()
}

fn compare_field(want: &Document, got: &Document, key: &str) -> Option<(String, String, String)> {
    let (a, b) = (want.get(key), got.get(key));
    (a != b).then(|| (key.to_owned(), show(a), show(b)))
}

/// The first difference between two replies, ignoring [`crate::capture::diff::VOLATILE`] fields and
/// learning the recorded → target cursor-id mapping on the way.
fn compare(
    want: &Document,
    got: &Document,
    cursors: &mut HashMap<i64, i64>,
) -> Option<(String, String, String)> {
    if let (Some(w), Some(g)) = (cursor_id(want), cursor_id(got)) {
        if w != 0 && g != 0 {
            cursors.insert(w, g);
        }
        if (w == 0) != (g == 0) {
            return Some(("cursor.id".into(), w.to_string(), g.to_string()));
        }
    }
    diff_docs(want, got, "")
}

fn cursor_id(d: &Document) -> Option<i64> {
    d.get_document("cursor").ok()?.get_i64("id").ok()
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    #[test]
    fn volatile_fields_and_cursor_ids_are_not_differences() {
        let mut cursors = HashMap::new();
        let want = doc! {"cursor": {"id": 11i64, "ns": "d.c", "firstBatch": [{"a": 1}]}, "ok": 1.0, "$clusterTime": {"x": 1}, "operationTime": 5};
        let got = doc! {"cursor": {"id": 99i64, "ns": "d.c", "firstBatch": [{"a": 1}]}, "ok": 1.0, "$clusterTime": {"x": 2}};
        assert_eq!(compare(&want, &got, &mut cursors), None);
        assert_eq!(cursors.get(&11), Some(&99));
    }

    #[test]
    fn the_first_differing_path_is_reported() {
        let want =
            doc! {"cursor": {"id": 0i64, "firstBatch": [{"a": 1}, {"a": {"b": "x"}}]}, "ok": 1.0};
        let got =
            doc! {"cursor": {"id": 0i64, "firstBatch": [{"a": 1}, {"a": {"b": "y"}}]}, "ok": 1.0};
        let (path, e, a) = compare(&want, &got, &mut HashMap::new()).unwrap();
        assert_eq!(path, "cursor.firstBatch.1.a.b");
        assert_eq!((e.as_str(), a.as_str()), ("\"x\"", "\"y\""));
        let reordered =
            doc! {"ok": 1.0, "cursor": {"id": 0i64, "firstBatch": [{"a": 1}, {"a": {"b": "x"}}]}};
        assert!(
            compare(&want, &reordered, &mut HashMap::new()).is_some(),
            "key order counts"
        );
    }
}
