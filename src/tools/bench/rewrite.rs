//! `laconic bench rewrite`: the cost of tokenizing and expanding documents,
//! against a plain copy of the same raw BSON, in one run on one core.

use std::time::{Duration, Instant};

use bson::{doc, Document, RawDocumentBuf};

use crate::rewrite::expand;
use crate::rewrite::mapper::paths as tokenize;
use crate::rewrite::mapper::raw;
use crate::rewrite::walker;
use crate::token::{Dictionary, Policy};
use crate::wire::{DocumentSequence, MsgFlags, OpMsg, Section};

#[derive(clap::Args, Debug, Clone)]
pub struct RewriteArgs {
    /// Seconds each measurement runs for.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
}

/// A document of about 1 KB: a user profile with custom attributes.
pub fn sample_document() -> Document {
    let mut custom = Document::new();
    for i in 0..20 {
        custom.insert(format!("Custom Attribute Number {i:02}"), i);
    }
    doc! {
        "_id": 42,
        "first_name": "Jonathan",
        "last_name": "Hyman",
        "email_address": "jon@example.com",
        "custom": custom,
        "top_artists": ["Taylor Swift", "Kendrick Lamar", "Billie Eilish"],
        "purchase_history": [{"product_category": "books", "amount_spent": 12.5}, {"product_category": "music", "amount_spent": 9.99}],
        "notes": "x".repeat(300),
    }
}

fn rate(bytes: usize, runs: usize, elapsed: Duration) -> (f64, f64) {
    let secs = elapsed.as_secs_f64();
    (
        bytes as f64 * runs as f64 / secs / 1e6,
        secs * 1e9 / runs as f64,
    )
}

fn time<F: FnMut()>(length: Duration, mut f: F) -> (usize, Duration) {
    let start = Instant::now();
    let mut runs = 0;
    while start.elapsed() < length {
        for _ in 0..64 {
            f();
        }
        runs += 64;
    }
    (runs, start.elapsed())
}

/// The sample document, the policy it is measured under, and a dictionary
/// holding its names and values (as the name store would).
pub fn sample() -> (Document, Policy, Dictionary) {
    let logical = sample_document();
    let policy =
        Policy::new(8, &["custom".into()], "laconic").with_value_paths(&["top_artists".into()]);
    let mut dict = Dictionary::default();
    let mut names = Vec::new();
    tokenize::collect_names(&logical, &policy, &mut names);
    dict.add_names(&names);
    let mut values = Vec::new();
    tokenize::collect_values(&logical, &policy, &mut values);
    dict.add_values(&values);
    (logical, policy, dict)
}

/// The reply of `laconic bench proxy`'s cursor read: its 1,000 documents
/// in one batch, as the driver reads them and as they are stored with every
/// name but `_id` a token, and the dictionary of those tokens.
pub fn cursor_batch() -> (RawDocumentBuf, RawDocumentBuf, Dictionary) {
    let policy = Policy::new(1, &[], "laconic");
    let docs: Vec<Document> = (0..1000).map(super::sample).collect();
    let mut dict = Dictionary::default();
    let mut names = Vec::new();
    tokenize::collect_names(&docs[0], &policy, &mut names);
    dict.add_names(&names);
    let reply = |docs: Vec<Document>| {
        RawDocumentBuf::from_document(
            &doc! {"cursor": {"firstBatch": docs, "id": 0i64, "ns": "bench.c"}, "ok": 1.0},
        )
        .unwrap_or_default()
    };
    let stored = docs
        .iter()
        .map(|d| tokenize::document(d, &mut Vec::new(), &policy, &dict))
        .collect();
    (reply(docs), reply(stored), dict)
}

/// The request of `laconic bench proxy`'s `insert_many`: 100 documents of
/// an `_id` and one number in a document sequence, as drivers send them,
/// the policy that tokenizes every name but `_id`, and the dictionary
/// holding `n`.
pub fn small_insert() -> (OpMsg, Policy, Dictionary) {
    let policy = Policy::new(1, &[], "laconic");
    let mut dict = Dictionary::default();
    dict.add_names(&["n".to_owned()]);
    let batch: Vec<u8> = (0..100)
        .flat_map(|n| {
            bson::to_vec(&doc! {"_id": bson::oid::ObjectId::new(), "n": n}).unwrap_or_default()
        })
        .collect();
    let insert = OpMsg {
        flags: MsgFlags(0),
        sections: vec![
            Section::Body(
                bson::to_vec(&doc! { "insert": "c", "$db": "d" })
                    .unwrap_or_default()
                    .into(),
            ),
            Section::Sequence(
                DocumentSequence::new("documents".into(), batch.into())
                    .expect("100 small documents"),
            ),
        ],
        checksum: None,
    };
    (insert, policy, dict)
}

/// The sample document without its long note: names are most of its
/// bytes, so it grows more than twice when expanded.
pub fn names_document() -> Document {
    let mut d = sample_document();
    d.remove("notes");
    d
}

/// A cursor reply of 100 [`names_document`]s, as they are stored and as
/// the driver reads them.
pub fn names_batch() -> (RawDocumentBuf, RawDocumentBuf, Dictionary) {
    let (_, policy, dict) = sample();
    let logical = names_document();
    let stored = tokenize::document(&logical, &mut Vec::new(), &policy, &dict);
    let reply = |doc: &Document| {
        RawDocumentBuf::from_document(
            &doc! {"cursor": {"firstBatch": vec![doc.clone(); 100], "id": 0i64, "ns": "bench.c"}, "ok": 1.0},
        )
        .unwrap_or_default()
    };
    (reply(&logical), reply(&stored), dict)
}

/// The 10th, 50th and 90th percentiles of single calls of `f`, in µs, over
/// `length`, with `pause` between calls.
fn per_call<F: FnMut()>(length: Duration, pause: Duration, mut f: F) -> [f64; 3] {
    let start = Instant::now();
    let mut calls = Vec::new();
    while start.elapsed() < length {
        if !pause.is_zero() {
            std::thread::sleep(pause);
        }
        let t = Instant::now();
        f();
        calls.push(t.elapsed().as_secs_f64() * 1e6);
    }
    calls.sort_by(f64::total_cmp);
    let at = |p: f64| calls[((calls.len() as f64 * p) as usize).min(calls.len() - 1)];
    [at(0.1), at(0.5), at(0.9)]
}

pub fn run(args: &RewriteArgs) {
    let (logical, policy, dict) = sample();

    let raw = RawDocumentBuf::from_document(&logical).unwrap_or_default();
    let size = raw.as_bytes().len();
    let stored = tokenize::document(&logical, &mut Vec::new(), &policy, &dict);
    let stored_raw = RawDocumentBuf::from_document(&stored).unwrap_or_default();
    let length = Duration::from_secs_f64(args.seconds);

    // What any proxy does with a document it does not look at.
    let (copy_runs, copy_time) = time(length, || {
        let copy = raw.as_bytes().to_vec();
        std::hint::black_box(copy);
    });
    // Parsing and serializing alone, for reference.
    let (conv_runs, conv_time) = time(length, || {
        let d = Document::try_from(raw.as_ref()).unwrap_or_default();
        std::hint::black_box(RawDocumentBuf::from_document(&d).ok());
    });
    // The same walk, element by element, changing nothing: the fair baseline.
    let (walk_runs, walk_time) = time(length, || {
        let mut out = Vec::with_capacity(size);
        std::hint::black_box(walker::copy(raw.as_bytes(), &mut out).ok());
        std::hint::black_box(out);
    });
    // Tokenize: raw bytes in, raw bytes out, as the proxy does for inserts.
    let (tok_runs, tok_time) = time(length, || {
        let mut out = Vec::with_capacity(size);
        std::hint::black_box(raw::tokenize(raw.as_bytes(), &policy, &dict, &mut out).ok());
        std::hint::black_box(out);
    });
    // Expand, as replies are: raw bytes to raw bytes, no owned documents.
    let (exp_runs, exp_time) = time(length, || {
        std::hint::black_box(expand::raw_document(&stored_raw, &dict).ok());
    });

    println!(
        "document: {size} B logical, {} B stored ({:.0}% smaller)",
        stored_raw.as_bytes().len(),
        100.0 * (1.0 - stored_raw.as_bytes().len() as f64 / size as f64)
    );
    println!("{:<28} {:>10} {:>12}", "operation", "MB/s", "ns per doc");
    let rows = [
        ("memcpy of the bytes", rate(size, copy_runs, copy_time)),
        ("raw → Document → raw", rate(size, conv_runs, conv_time)),
        (
            "raw element copy (baseline)",
            rate(size, walk_runs, walk_time),
        ),
        ("tokenize (raw → raw)", rate(size, tok_runs, tok_time)),
        ("expand (raw → raw)", rate(size, exp_runs, exp_time)),
    ];
    for (name, (mbs, ns)) in rows {
        println!("{name:<28} {mbs:>10.0} {ns:>12.0}");
    }
    let (walk_ns, tok_ns, exp_ns) = (rows[2].1 .1, rows[3].1 .1, rows[4].1 .1);
    println!(
        "tokenize: {:.2}x the element copy; expand: {:.2}x; tokenize + expand: {:.0} MB/s of logical documents",
        tok_ns / walk_ns,
        exp_ns / walk_ns,
        size as f64 / (tok_ns + exp_ns) * 1e3,
    );

    // The same work call by call: on a shared machine the same call can
    // take twice as long in some periods as in others, and more often
    // after the core was idle, as a proxy's core is between replies.
    let (_, batch, batch_dict) = cursor_batch();
    let mut expand_batch = || {
        std::hint::black_box(expand::raw_document(&batch, &batch_dict).ok());
    };
    let busy = per_call(length, Duration::ZERO, &mut expand_batch);
    let paused = per_call(length, Duration::from_micros(300), &mut expand_batch);
    println!(
        "expand the proxy benchmark's cursor batch ({} B stored), µs per call (p10 / p50 / p90):",
        batch.as_bytes().len()
    );
    for (name, [p10, p50, p90]) in [("back to back", busy), ("after 300 µs idle", paused)] {
        println!("  {name:<18} {p10:>8.1} {p50:>8.1} {p90:>8.1}");
    }

    // Replies that grow more than twice: the room given to the first one
    // is too small, and later ones are given room for what it needed.
    let (logical, stored, dict) = names_batch();
    let (runs, elapsed) = time(length, || {
        std::hint::black_box(expand::raw_document(&stored, &dict).ok());
    });
    let (mbs, ns) = rate(logical.as_bytes().len(), runs, elapsed);
    println!(
        "expand a batch of 100 profiles without their note ({} B stored, {:.2}x expanded): {:.1} µs per call, {mbs:.0} MB/s of logical documents",
        stored.as_bytes().len(),
        logical.as_bytes().len() as f64 / stored.as_bytes().len() as f64,
        ns / 1e3,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cursor_batch_expands_to_what_the_driver_reads() {
        let (logical, stored, dict) = cursor_batch();
        assert!(stored.as_bytes().len() < logical.as_bytes().len());
        let expanded = expand::raw_document(&stored, &dict).unwrap();
        assert_eq!(expanded.as_bytes(), logical.as_bytes());
    }

    #[test]
    fn the_names_batch_grows_more_than_twice_and_expands_to_what_the_driver_reads() {
        let (logical, stored, dict) = names_batch();
        assert!(stored.as_bytes().len() * 2 < logical.as_bytes().len());
        let expanded = expand::raw_document(&stored, &dict).unwrap();
        assert_eq!(expanded.as_bytes(), logical.as_bytes());
    }

    #[test]
    fn per_call_gives_ordered_percentiles() {
        let mut n = 0u64;
        let [p10, p50, p90] = per_call(Duration::from_millis(20), Duration::ZERO, || {
            n += 1;
            std::hint::black_box(n);
        });
        assert!(n > 0);
        assert!(p10 <= p50 && p50 <= p90);
    }
}
