//! Comparing two replies to the same request as replay and shadow mode do:
//! key order counts, fields that change from run to run do not.

use bson::{Bson, Document};

/// Reply fields that differ between runs of the same session.
pub const VOLATILE: &[&str] = &[
    "$clusterTime",
    "operationTime",
    "localTime",
    "connectionId",
    "electionId",
    "topologyVersion",
    "lastWrite",
    "opTime",
    "postBatchResumeToken",
    "clusterTime",
    "wallTime",
    "_data",
];

/// The first difference between two documents, ignoring [`VOLATILE`]
/// fields (and a cursor's id): `(path, expected, found)`.
pub fn diff_docs(want: &Document, got: &Document, at: &str) -> Option<(String, String, String)> {
    let keys = |d: &Document| -> Vec<String> {
        d.keys()
            .filter(|k| !VOLATILE.contains(&k.as_str()))
            .filter(|k| !(at == "cursor" && *k == "id"))
            .cloned()
            .collect()
    };
    let (wk, gk) = (keys(want), keys(got));
    if wk != gk {
        return Some((
            if at.is_empty() {
                "(keys)".into()
            } else {
                format!("{at} (keys)")
            },
            format!("{wk:?}"),
            format!("{gk:?}"),
        ));
    }
    for k in wk {
        let path = if at.is_empty() {
            k.clone()
        } else {
            format!("{at}.{k}")
        };
        if let Some(d) = diff_values(want.get(&k), got.get(&k), &path) {
            return Some(d);
        }
    }
    None
}

fn diff_values(
    want: Option<&Bson>,
    got: Option<&Bson>,
    at: &str,
) -> Option<(String, String, String)> {
    match (want, got) {
        (Some(Bson::Document(a)), Some(Bson::Document(b))) => diff_docs(a, b, at),
        (Some(Bson::Array(a)), Some(Bson::Array(b))) => {
            if a.len() != b.len() {
                return Some((
                    format!("{at} (length)"),
                    a.len().to_string(),
                    b.len().to_string(),
                ));
            }
            a.iter()
                .zip(b)
                .enumerate()
                .find_map(|(i, (x, y))| diff_values(Some(x), Some(y), &format!("{at}.{i}")))
        }
        (a, b) if a == b => None,
        (a, b) => Some((at.to_owned(), show(a), show(b))),
    }
}

pub(crate) fn show(v: Option<&Bson>) -> String {
    let s = v.map_or_else(
        || "(missing)".to_owned(),
        |v| v.clone().into_relaxed_extjson().to_string(),
    );
    if s.len() > 200 {
        format!(
            "{}…",
            &s[..s.char_indices().nth(200).map_or(s.len(), |(i, _)| i)]
        )
    } else {
        s
    }
}
