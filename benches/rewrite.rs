//! Criterion: the cost of the two rewrites on a 1.3 KB user profile, against
//! walking and copying the same bytes unchanged (`cargo bench --bench rewrite`).
//! `laconic bench rewrite` prints the same comparison without criterion.

use bson::RawDocumentBuf;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use laconic::rewrite::mapper::raw;
use laconic::rewrite::{expand, walker};
use laconic::token::{Dictionary, Policy};
use laconic::tools::bench::rewrite::{cursor_batch, names_batch, sample, small_insert};
use laconic::wire::{DocumentSequence, MsgFlags, OpMsg, Section};

fn rewrite(c: &mut Criterion) {
    let (logical, policy, dict) = sample();
    let doc = RawDocumentBuf::from_document(&logical).unwrap();
    let mut stored = Vec::new();
    raw::tokenize(doc.as_bytes(), &policy, &dict, &mut stored).unwrap();
    let stored = RawDocumentBuf::from_bytes(stored).unwrap();

    let mut g = c.benchmark_group("profile_1.3KB");
    g.throughput(Throughput::Bytes(doc.as_bytes().len() as u64));
    g.bench_function("memcpy", |b| b.iter(|| doc.as_bytes().to_vec()));
    g.bench_function("element_copy", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(2048);
            walker::copy(doc.as_bytes(), &mut out).unwrap();
            out
        })
    });
    g.bench_function("tokenize", |b| b.iter(|| tokenize(&doc, &policy, &dict)));
    g.bench_function("expand", |b| b.iter(|| expand(&stored, &dict)));
    g.finish();

    // An insert of 100 such profiles in a document sequence, as drivers send
    // it: tokenized as one batch, against each profile tokenized alone.
    let batch: Vec<u8> = (0..100).flat_map(|_| doc.as_bytes().to_vec()).collect();
    let insert = OpMsg {
        flags: MsgFlags(0),
        sections: vec![
            Section::Body(
                bson::to_vec(&bson::doc! { "insert": "c", "$db": "d" })
                    .unwrap()
                    .into(),
            ),
            Section::Sequence(DocumentSequence::new("documents".into(), batch.into()).unwrap()),
        ],
        checksum: None,
    };
    let mut g = c.benchmark_group("insert_100_profiles");
    g.throughput(Throughput::Bytes(100 * doc.as_bytes().len() as u64));
    g.bench_function("tokenize_each", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(100 * 2048);
            for _ in 0..100 {
                raw::tokenize(doc.as_bytes(), &policy, &dict, &mut out).unwrap();
            }
            out
        })
    });
    g.bench_function("insert", |b| {
        b.iter(|| raw::insert(&insert, &policy, &dict).unwrap())
    });
    g.finish();

    // The proxy benchmark's `insert_many`: 100 documents of an `_id` and
    // one number, `n` a token.
    let (small, small_policy, small_dict) = small_insert();
    let mut g = c.benchmark_group("insert_100_small");
    g.throughput(Throughput::Elements(100));
    g.bench_function("insert", |b| {
        b.iter(|| raw::insert(&small, &small_policy, &small_dict).unwrap())
    });
    g.finish();

    // The reply of the proxy benchmark's cursor read: 1,000 small documents
    // in one batch, every name but `_id` a token.
    let (logical, stored, dict) = cursor_batch();
    let mut g = c.benchmark_group("cursor_batch_1000");
    g.throughput(Throughput::Bytes(logical.as_bytes().len() as u64));
    g.bench_function("element_copy", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(logical.as_bytes().len());
            walker::copy(logical.as_bytes(), &mut out).unwrap();
            out
        })
    });
    g.bench_function("expand", |b| b.iter(|| expand(&stored, &dict)));
    // The floor under `expand`: the same stored bytes walked alone, and
    // walked and copied element by element with no key changed.
    g.bench_function("walk_stored", |b| b.iter(|| count(stored.as_bytes())));
    g.bench_function("element_copy_stored", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(stored.as_bytes().len() * 2);
            walker::copy(stored.as_bytes(), &mut out).unwrap();
            out
        })
    });
    g.finish();

    // 100 profiles whose names are most of their bytes: they grow 2.8 times.
    let (logical, stored, dict) = names_batch();
    let mut g = c.benchmark_group("names_batch_100");
    g.throughput(Throughput::Bytes(logical.as_bytes().len() as u64));
    g.bench_function("expand", |b| b.iter(|| expand(&stored, &dict)));
    g.finish();
}

/// The elements of a document, nested ones included: a walk that writes nothing.
fn count(doc: &[u8]) -> usize {
    let mut n = 0;
    for e in walker::elements(doc) {
        let e = e.unwrap();
        n += 1;
        if e.kind == 3 || e.kind == 4 {
            n += count(e.value);
        }
    }
    n
}

// Not inlined, so that an instruction count (`valgrind --tool=callgrind`,
// which a shared machine does not disturb) can be read per call.
#[inline(never)]
fn tokenize(doc: &RawDocumentBuf, policy: &Policy, dict: &Dictionary) -> Vec<u8> {
    let mut out = Vec::with_capacity(2048);
    raw::tokenize(doc.as_bytes(), policy, dict, &mut out).unwrap();
    out
}

#[inline(never)]
fn expand(stored: &RawDocumentBuf, dict: &Dictionary) -> RawDocumentBuf {
    expand::raw_document(stored, dict).unwrap()
}

criterion_group!(benches, rewrite);
criterion_main!(benches);
