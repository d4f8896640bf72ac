//! Shadow mode: for a sample of reads, the logical command also goes to a
//! second, untokenized deployment, and the two answers are compared
//! (ignoring what differs between any two runs, as replay does). A
//! difference is counted and logged with the command and the path where the
//! answers part, never with document contents.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use bson::{Document, RawDocument};
use tracing::{debug, warn};

use super::{Metrics, Shadowed};
use crate::rewrite::walker::{descend, elements};

/// The shadow deployment and how often to ask it.
#[derive(Debug)]
pub struct Shadow {
    client: mongodb::Client,
    /// Every `every`-th eligible read is shadowed.
    every: u64,
    seen: AtomicU64,
}

/// Reads that are compared: their answers are the same whoever stores the
/// documents.
/// Fields the driver adds to a command for its own session and topology.
const SESSION_FIELDS: &[&str] = &[
    "lsid",
    "$clusterTime",
    "$db",
    "txnNumber",
    "autocommit",
    "startTransaction",
    "$readPreference",
    "apiVersion",
    "apiStrict",
    "apiDeprecationErrors",
];

impl Shadow {
    /// `sample` is the fraction of reads to shadow (0 < sample ≤ 1).
    pub async fn connect(uri: &str, sample: f64) -> mongodb::error::Result<Shadow> {
        let client = mongodb::Client::with_uri_str(uri).await?;
        let every = (1.0 / sample.clamp(1e-6, 1.0)).round().max(1.0) as u64;
        Ok(Shadow {
            client,
            every,
            seen: AtomicU64::new(0),
        })
    }

    /// Whether this request is a read to shadow now.
    pub fn wants(&self, command: &str, body: &RawDocument) -> bool {
        // Reads inside a transaction are not repeated outside it.
        let in_transaction = body.get("txnNumber").ok().flatten().is_some();
        let read = crate::rewrite::catalogue::lookup(command).is_some_and(|e| e.read);
        if !read || in_transaction {
            return false;
        }
        if command == "aggregate" {
            // Pipelines that write or stream are not reads to repeat.
            let pipeline = body.get_array("pipeline").ok();
            if pipeline.is_none_or(|p| names_a_stage(p.as_bytes(), NOT_READS, 0)) {
                return false;
            }
        }
        self.seen.fetch_add(1, Relaxed).is_multiple_of(self.every)
    }

    /// Sends the logical command to the shadow and compares its answer with
    /// `reply`, the one the driver got.
    pub async fn check(self: Arc<Self>, request: Document, reply: Document, metrics: Arc<Metrics>) {
        let metrics = &*metrics;
        let command = request.keys().next().cloned().unwrap_or_default();
        let db = request.get_str("$db").unwrap_or("admin").to_owned();
        let mut cmd = request;
        for f in SESSION_FIELDS {
            cmd.remove(*f);
        }
        if command == "find" {
            cmd.insert("singleBatch", true);
        }
        let answer = match self.client.database(&db).run_command(cmd).await {
            Ok(a) => a,
            Err(e) => match *e.kind {
                // A command error is an answer too: compare it.
                mongodb::error::ErrorKind::Command(c) => bson::doc! {
                    "ok": 0.0, "errmsg": c.message, "code": c.code, "codeName": c.code_name,
                },
                other => {
                    debug!(command = ?command, error = %other, "the shadow did not answer");
                    metrics.shadow(&command, Shadowed::Unanswered);
                    return;
                }
            },
        };
        let difference = crate::capture::diff::diff_docs(&reply, &answer, "");
        if let Some((path, _, _)) = &difference {
            warn!(
                command = ?command,
                db = ?db,
                path = ?path,
                "shadow difference: the untokenized deployment answers otherwise"
            );
        }
        let outcome = match difference {
            Some(_) => Shadowed::Different,
            None => Shadowed::Same,
        };
        metrics.shadow(&command, outcome);
        if let Some(id) = answer
            .get_document("cursor")
            .ok()
            .and_then(|c| c.get_i64("id").ok())
            .filter(|&id| id != 0)
        {
            let coll = answer
                .get_document("cursor")
                .ok()
                .and_then(|c| c.get_str("ns").ok())
                .and_then(|ns| ns.split_once('.'))
                .map(|(_, c)| c.to_owned())
                .unwrap_or_default();
            let _ = self
                .client
                .database(&db)
                .run_command(bson::doc! {"killCursors": coll, "cursors": [id]})
                .await;
        }
    }
}

/// Stages that write or stream: a pipeline naming one is not repeated on
/// the shadow deployment.
const NOT_READS: &[&[u8]] = &[
    b"$out",
    b"$merge",
    b"$changeStream",
    b"$changeStreamSplitLargeEvent",
];

/// Whether any key of `doc`, at any depth, is one of `stages` (or `doc`
/// cannot be gone through: then it is not repeated either).
fn names_a_stage(doc: &[u8], stages: &[&[u8]], depth: usize) -> bool {
    let Ok(depth) = descend(depth) else {
        return true;
    };
    elements(doc).any(|e| match e {
        Err(_) => true,
        Ok(e) => {
            stages.contains(&e.key)
                || (matches!(e.kind, 0x03 | 0x04) && names_a_stage(e.value, stages, depth))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writing and streaming stages are found wherever they are, and only
    /// as keys: a string that spells one is a value.
    #[test]
    fn pipelines_that_write_or_stream_are_found() {
        let found = |pipeline: bson::Document| {
            let raw = bson::RawDocumentBuf::from_document(&pipeline).unwrap();
            names_a_stage(raw.as_bytes(), NOT_READS, 0)
        };
        assert!(found(
            bson::doc! {"0": {"$match": {"a": 1}}, "1": {"$out": "report"}}
        ));
        assert!(found(bson::doc! {"0": {"$merge": {"into": "report"}}}));
        assert!(found(bson::doc! {"0": {"$changeStream": {}}}));
        assert!(found(
            bson::doc! {"0": {"$facet": {"x": [{"$changeStreamSplitLargeEvent": {}}]}}}
        ));
        assert!(!found(
            bson::doc! {"0": {"$match": {"note": "$out"}}, "1": {"$project": {"merge": "$merge"}}}
        ));
        assert!(!found(bson::doc! {}));
    }
}
