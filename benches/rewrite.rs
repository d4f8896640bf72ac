//! Criterion: the cost of the two rewrites on a 1.3 KB user profile, against
//! walking and copying the same bytes unchanged (`cargo bench --bench rewrite`).
//! `laconic bench rewrite` prints the same comparison without criterion.

use bson::RawDocumentBuf;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use laconic::rewrite::mapper::raw;
use laconic::rewrite::{expand, walker};
use laconic::tools::bench::rewrite::sample;

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
    g.bench_function("tokenize", |b| {
        b.iter(|| {
            let mut out = Vec::with_capacity(2048);
            raw::tokenize(doc.as_bytes(), &policy, &dict, &mut out).unwrap();
            out
        })
    });
    g.bench_function("expand", |b| {
        b.iter(|| expand::raw_document(&stored, &dict).unwrap())
    });
    g.finish();
}

criterion_group!(benches, rewrite);
criterion_main!(benches);
