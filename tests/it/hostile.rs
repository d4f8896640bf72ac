//! Hostile input on raw sockets: every kind of malformed message closes or
//! answers only the connection that sent it, with the same outcome through
//! a tokenizing proxy as through the pass-through, while another client's
//! session, open throughout, keeps working and memory returns to its level.

use std::time::Duration;

use bson::{doc, Document};
use futures::TryStreamExt;
use laconic::downstream::ProxyHandle;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{self, body, db_name, op_msg, read_frame, write_frame};

/// What became of a connection after one malformed message.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Outcome {
    /// The proxy closed it.
    Closed,
    /// An error reply with this code.
    Error(i32),
    /// A successful reply.
    Ok,
}

fn frame(op: i32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&((16 + payload.len()) as i32).to_le_bytes());
    out.extend_from_slice(&7_i32.to_le_bytes());
    out.extend_from_slice(&0_i32.to_le_bytes());
    out.extend_from_slice(&op.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

fn bson(d: Document) -> Vec<u8> {
    bson::to_vec(&d).unwrap()
}

/// An OP_MSG: flags, then sections as given.
fn msg(flags: u32, sections: &[u8]) -> Vec<u8> {
    let mut p = flags.to_le_bytes().to_vec();
    p.extend_from_slice(sections);
    frame(2013, &p)
}

fn body_section(doc: &[u8]) -> Vec<u8> {
    let mut s = vec![0u8];
    s.extend_from_slice(doc);
    s
}

fn ping() -> Vec<u8> {
    bson(doc! {"ping": 1, "$db": "admin"})
}

fn compressed(op: i32, declared: i32, compressor: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = op.to_le_bytes().to_vec();
    p.extend_from_slice(&declared.to_le_bytes());
    p.push(compressor);
    p.extend_from_slice(payload);
    frame(2012, &p)
}

/// Wraps the document `inner` as the value of `key` (in a one-element
/// array when `array`), built on bytes: a nested `Document` would recurse
/// in the test itself.
fn wrap(inner: &[u8], key: &str, array: bool) -> Vec<u8> {
    let mut value = inner.to_vec();
    if array {
        let mut a = Vec::new();
        a.extend_from_slice(&((4 + 1 + 2 + value.len() + 1) as i32).to_le_bytes());
        a.push(0x03);
        a.extend_from_slice(b"0\0");
        a.extend_from_slice(&value);
        a.push(0);
        value = a;
    }
    let mut d = Vec::new();
    d.extend_from_slice(&((4 + 1 + key.len() + 1 + value.len() + 1) as i32).to_le_bytes());
    d.push(if array { 0x04 } else { 0x03 });
    d.extend_from_slice(key.as_bytes());
    d.push(0);
    d.extend_from_slice(&value);
    d.push(0);
    d
}

/// A filter nested `depth` levels deep (`$and` in `$and`…).
fn nested(depth: usize) -> bson::RawDocumentBuf {
    let mut d = bson(doc! {"leaf_value": 1});
    for _ in 0..depth {
        d = wrap(&d, "$and", true);
    }
    bson::RawDocumentBuf::from_bytes(d).unwrap()
}

/// A value nested `depth` levels deep.
fn value_nested(depth: usize) -> bson::RawDocumentBuf {
    let mut d = bson(doc! {"leaf_value": 1});
    for _ in 0..depth {
        d = wrap(&d, "inner_field", false);
    }
    bson::RawDocumentBuf::from_bytes(d).unwrap()
}

/// Each kind of malformed input, by name.
fn malformed(db: &str) -> Vec<(&'static str, Vec<u8>)> {
    let ping = ping();
    let mut bad_len_up = ping.clone();
    bad_len_up[0] += 100;
    let mut bad_len_down = ping.clone();
    bad_len_down[0] -= 3;
    // {ping: 1, $db: "admin", s: "abc"} with the string's terminator gone.
    let mut unterminated = bson(doc! {"ping": 1, "$db": "admin", "s": "abcd"});
    let n = unterminated.len();
    unterminated[n - 2] = b'x';
    let mut bad_key = bson(doc! {"ping": 1, "$db": "admin", "k!": 1});
    let k = bad_key.windows(2).position(|w| w == b"k!").unwrap();
    bad_key[k] = 0xff;
    bad_key[k + 1] = 0xfe;
    let zeros = zstd::encode_all(&vec![0u8; 40_000_000][..], 3).unwrap();
    let inner = msg(0, &body_section(&ping));
    let nested_compressed = compressed(2012, (inner.len() - 16) as i32, 0, &inner[16..]);
    let mut query = 0_i32.to_le_bytes().to_vec();
    query.extend_from_slice(format!("{db}.$cmd\0").as_bytes());
    query.extend_from_slice(&0_i32.to_le_bytes());
    query.extend_from_slice(&(-1_i32).to_le_bytes());
    query.extend_from_slice(&bson(doc! {"find": "c"}));
    let mut reply = 0_i32.to_le_bytes().to_vec();
    reply.extend_from_slice(&0_i64.to_le_bytes());
    reply.extend_from_slice(&0_i32.to_le_bytes());
    reply.extend_from_slice(&1_i32.to_le_bytes());
    reply.extend_from_slice(&bson(doc! {"ok": 1}));
    let mut kind1 = body_section(&ping);
    kind1.push(1);
    kind1.extend_from_slice(&1000_i32.to_le_bytes());
    kind1.extend_from_slice(b"documents\0");
    let mut checksum = body_section(&ping);
    checksum.extend_from_slice(&0xdead_beef_u32.to_le_bytes());
    let two_bodies = [body_section(&ping), body_section(&ping)].concat();
    vec![
        ("length below the header", {
            let mut f = frame(2013, &[0; 6]);
            f[..4].copy_from_slice(&10_i32.to_le_bytes());
            f
        }),
        ("length over the limit", {
            let mut f = frame(2013, &[0; 16]);
            f[..4].copy_from_slice(&60_000_000_i32.to_le_bytes());
            f
        }),
        ("negative length", {
            let mut f = frame(2013, &[0; 16]);
            f[..4].copy_from_slice(&(-5_i32).to_le_bytes());
            f
        }),
        ("unknown opcode", frame(9999, &[0; 8])),
        ("a client-sent OP_REPLY", frame(1, &reply)),
        ("OP_QUERY other than the handshake", frame(2004, &query)),
        (
            "unknown required flag bit",
            msg(1 << 5, &body_section(&ping)),
        ),
        ("bad checksum", msg(1, &checksum)),
        ("no body section", msg(0, &[])),
        ("two body sections", msg(0, &two_bodies)),
        (
            "unknown section kind",
            msg(0, &[&[7u8][..], &ping].concat()),
        ),
        ("kind-1 size past the message", msg(0, &kind1)),
        (
            "document longer than its section",
            msg(0, &body_section(&bad_len_up)),
        ),
        (
            "document shorter than it says",
            msg(0, &body_section(&bad_len_down)),
        ),
        ("unterminated string", msg(0, &body_section(&unterminated))),
        ("invalid UTF-8 key", msg(0, &body_section(&bad_key))),
        ("unknown compressor", compressed(2013, 100, 7, &[1, 2, 3])),
        ("compressed size that lies", {
            let payload = zstd::encode_all(&inner[16..], 3).unwrap();
            compressed(2013, 5, 3, &payload)
        }),
        (
            "compressed size over the limit",
            compressed(2013, 60_000_000, 3, &[0; 8]),
        ),
        ("nested compression", nested_compressed),
        (
            "decompression bomb",
            compressed(2013, 40_000_000, 3, &zeros),
        ),
    ]
}

/// Commands nested deeper than the server accepts, in every shape.
fn deep(db: &str) -> Vec<(&'static str, Vec<u8>)> {
    use bson::{rawdoc, RawArrayBuf, RawDocumentBuf};
    let m = |d: RawDocumentBuf| msg(0, &body_section(d.as_bytes()));
    let one = |d: RawDocumentBuf| {
        let mut a = RawArrayBuf::new();
        a.push(d);
        a
    };
    let mut set = RawDocumentBuf::new();
    set.append("a_field", value_nested(2000));
    vec![
        (
            "deep find filter",
            m(rawdoc! {"find": "c", "filter": nested(800), "$db": db}),
        ),
        (
            "deep insert",
            m(rawdoc! {"insert": "c", "documents": one(value_nested(3000)), "$db": db}),
        ),
        (
            "deep update value",
            m(
                rawdoc! {"update": "c", "updates": one(rawdoc! {"q": {}, "u": {"$set": set}}), "$db": db},
            ),
        ),
        (
            "deep pipeline",
            m(
                rawdoc! {"aggregate": "c", "pipeline": one(rawdoc! {"$match": nested(800)}), "cursor": {}, "$db": db},
            ),
        ),
        (
            "deep delete filter",
            m(
                rawdoc! {"delete": "c", "deletes": one(rawdoc! {"q": nested(800), "limit": 0}), "$db": db},
            ),
        ),
    ]
}

/// Sends `bytes` on a fresh connection that has done its handshake, and
/// reports what came back.
async fn outcome(proxy: &ProxyHandle, bytes: &[u8]) -> Outcome {
    let mut s = common::raw_session(proxy).await;
    s.write_all(bytes).await.unwrap();
    let read = tokio::time::timeout(Duration::from_secs(20), read_frame(&mut s)).await;
    match read.expect("an answer or a close within 20 s") {
        None => Outcome::Closed,
        Some(f) => {
            let b = body(&f);
            if b.get_f64("ok").unwrap_or(0.0) == 1.0 || b.get_i32("ok").unwrap_or(0) == 1 {
                Outcome::Ok
            } else {
                Outcome::Error(b.get_i32("code").unwrap_or(-1))
            }
        }
    }
}

/// Another client's `ping`, on its own connection, answered.
async fn witness_pings(s: &mut TcpStream) {
    write_frame(s, &op_msg(5, 0, doc! {"ping": 1, "$db": "admin"})).await;
    let f = tokio::time::timeout(Duration::from_secs(20), read_frame(s))
        .await
        .expect("the witness answered")
        .expect("the witness's connection open");
    assert_eq!(body(&f).get_f64("ok").unwrap(), 1.0);
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_hurt_only_their_own_connection_in_both_modes() {
    let db = db_name("hostile", "app");
    let tap = common::tap(common::upstream().host.clone()).await;
    let plain = common::start(common::proxy_config(&format!("mongodb://{}/", tap.addr))).await;
    let mut config = common::proxy_config(&format!("mongodb://{}/", tap.addr));
    config.tokenize.min_len = 4;
    let tokenizing = common::start(config).await;
    let mut witnesses = [
        common::raw_session(&plain).await,
        common::raw_session(&tokenizing).await,
    ];
    let cases = malformed(&db);
    assert!(cases.len() >= 20);
    let before = rss_kib();
    for (name, bytes) in &cases {
        let a = outcome(&plain, bytes).await;
        let b = outcome(&tokenizing, bytes).await;
        assert_eq!(a, b, "{name}: pass-through and tokenizing differ");
        assert_ne!(a, Outcome::Ok, "{name} was accepted");
        if let Outcome::Error(code) = a {
            assert!(code != 6 && code != 1, "{name}: code {code}");
        }
        for w in &mut witnesses {
            witness_pings(w).await;
        }
    }
    // A client's OP_REPLY never reaches the upstream.
    assert!(!tap.opcodes().contains(&1), "an OP_REPLY went upstream");
    // Deep nesting: the server's own error (15 Overflow), the process alive.
    for (name, bytes) in deep(&db) {
        eprintln!("deep case: {name}");
        assert_eq!(
            outcome(&tokenizing, &bytes).await,
            Outcome::Error(15),
            "{name}"
        );
        for w in &mut witnesses {
            witness_pings(w).await;
        }
    }
    let after = rss_kib();
    eprintln!(
        "RSS before {before} KiB, after {} cases {after} KiB",
        cases.len()
    );
    assert!(
        after < before + 64 * 1024,
        "RSS grew from {before} to {after} KiB"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decompression_bombs_leave_other_clients_answered() {
    let proxy = common::proxy().await;
    let zeros = zstd::encode_all(&vec![0u8; 40_000_000][..], 3).unwrap();
    let bomb = compressed(2013, 40_000_000, 3, &zeros);
    let mut witness = common::raw_session(&proxy).await;
    // Four clients bomb at once: more than the runtime has threads.
    let bombing = {
        let addr = proxy.addr;
        tokio::spawn(async move {
            let clients = (0..4).map(|_| {
                let bomb = bomb.clone();
                tokio::spawn(async move {
                    for _ in 0..5 {
                        let mut s = TcpStream::connect(addr).await.unwrap();
                        s.write_all(&bomb).await.unwrap();
                        let mut sink = Vec::new();
                        let _ =
                            tokio::time::timeout(Duration::from_secs(20), s.read_to_end(&mut sink))
                                .await;
                    }
                })
            });
            for c in clients.collect::<Vec<_>>() {
                c.await.unwrap();
            }
        })
    };
    let mut latencies = Vec::new();
    while !bombing.is_finished() {
        let t = std::time::Instant::now();
        witness_pings(&mut witness).await;
        latencies.push(t.elapsed());
    }
    bombing.await.unwrap();
    latencies.sort();
    let at = |q: f64| latencies[((latencies.len() - 1) as f64 * q) as usize];
    eprintln!(
        "another client's ping during 20 decompression bombs from 4 clients at once: {} pings, p50 {:?}, p99 {:?}",
        latencies.len(),
        at(0.5),
        at(0.99)
    );
    assert!(!latencies.is_empty());
}

#[tokio::test]
async fn a_request_pipelined_after_an_exhaust_allowed_write_is_served_after_it() {
    use laconic::wire::MsgFlags;
    let proxy = common::proxy().await;
    let db = db_name("exhaustpipe", "app");
    let mut s = common::raw_session(&proxy).await;
    // Both sent before either reply is read.
    let write = op_msg(
        10,
        MsgFlags::EXHAUST_ALLOWED,
        doc! {"insert": "c", "documents": [{"_id": 1}], "$db": &db},
    );
    let ping = op_msg(11, 0, doc! {"ping": 1, "$db": "admin"});
    let mut both = write.to_bytes().to_vec();
    both.extend_from_slice(&ping.to_bytes());
    s.write_all(&both).await.unwrap();
    for expected in [10, 11] {
        let f = tokio::time::timeout(Duration::from_secs(20), read_frame(&mut s))
            .await
            .unwrap()
            .expect("a reply");
        assert_eq!(f.header.response_to, expected);
        assert_eq!(body(&f).get_f64("ok").unwrap(), 1.0, "{:?}", body(&f));
    }
    assert_eq!(common::stored(&db, "c").await, vec![doc! {"_id": 1}]);
}

/// The upstream stops under a bounded write load and comes back on the same
/// port and storage: every client gets a prompt error while it is gone, the
/// proxy serves again once it is back, and every acknowledged write is there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_going_away_under_load_loses_no_acknowledged_write() {
    upstream_goes_away(common::Upstream::stop, "stopped", &[], false).await;
}

/// The same, with the upstream killed (SIGKILL) rather than stopped. A
/// killed server keeps only what it synced: this one syncs every commit
/// before acknowledging it, as a durable deployment does (journaled writes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_killed_under_load_loses_no_acknowledged_write() {
    upstream_goes_away(
        common::Upstream::kill,
        "killed",
        &["--sync-on-commit"],
        false,
    )
    .await;
}

/// The same, with a driver that retries its writes: none fails. A write in
/// flight when the upstream died closes its connection without a reply, as
/// the upstream's own would have, and the driver, having dropped its
/// pooled connections, sends it again on a new one once the proxy is back
/// in its view (a reply before the close had the retry sent on the closed
/// connection: one write in 400 failed). Each is applied once. (The one
/// failure the upstream itself can give is explained below.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retryable_writes_the_upstream_killed_under_load_fails_no_write() {
    upstream_goes_away(
        common::Upstream::kill,
        "killed_retried",
        &["--sync-on-commit"],
        true,
    )
    .await;
}

async fn upstream_goes_away(go: fn(&common::Upstream), how: &str, durable: &[&str], retry: bool) {
    let storage = common::temp_dir(&format!("restarting-upstream-{how}"));
    let first = common::launch(&[&["--storage", storage.to_str().unwrap()], durable].concat());
    let port = first.port().to_string();
    let mut config = common::proxy_config(&first.uri);
    config.tokenize.min_len = 4;
    config.connect_timeout_ms = 2_000;
    let proxy = common::start(config).await;
    // A retry waits for the proxy to be selectable again: longer than the
    // upstream is gone, however slowly it starts again.
    let client = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?retryWrites={retry}&serverSelectionTimeoutMS={}&connectTimeoutMS=2000",
        proxy.addr,
        if retry { 20_000 } else { 2000 }
    ))
    .await
    .unwrap();
    let c = client
        .database(&db_name(&format!("upstream{how}"), "app"))
        .collection::<Document>("c");
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            let (mut acknowledged, mut failed, mut slowest) =
                (Vec::new(), Vec::new(), Duration::ZERO);
            for i in 0..400 {
                let t = std::time::Instant::now();
                match c.insert_one(doc! {"_id": i, "payload_field": i}).await {
                    Ok(_) => acknowledged.push(i),
                    Err(e) => {
                        eprintln!("write {i} failed after {:?}: {e}", t.elapsed());
                        failed.push((i, e));
                    }
                }
                slowest = slowest.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            (acknowledged, failed, slowest)
        })
    };
    tokio::time::sleep(Duration::from_millis(800)).await;
    go(&first);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let _second = common::launch(
        &[
            &["--storage", storage.to_str().unwrap(), "--port", &port],
            durable,
        ]
        .concat(),
    );
    let (acknowledged, failed, slowest) = writer.await.unwrap();
    eprintln!(
        "upstream {how} under load: {} writes acknowledged, {} refused while it was gone, slowest answer {slowest:?}",
        acknowledged.len(),
        failed.len()
    );
    let patience = Duration::from_secs(if retry { 20 } else { 10 });
    assert!(slowest < patience, "a client waited {slowest:?}");
    // Served again, and every acknowledged write is there, read back by name.
    let stored: Vec<i32> = common::by_id(&c, doc! {})
        .await
        .iter()
        .map(|d| d.get_i32("payload_field").unwrap())
        .collect();
    for i in &acknowledged {
        assert!(stored.contains(i), "acknowledged write {i} is missing");
    }
    if retry {
        // No retryable write fails through the proxy, but for one reason
        // that is the upstream's: a write it applied (and synced) just
        // before it was killed, whose reply was lost, is sent again once
        // it is back, and SecantusDB, which keeps its record of retried
        // writes in memory only, applies it as a new one and refuses it as
        // a duplicate (MongoDB keeps that record in `config.transactions`
        // and answers the retry with the first result). Such a write is
        // stored, once.
        for (i, e) in &failed {
            let code = match &*e.kind {
                mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => {
                    w.code
                }
                _ => 0,
            };
            assert_eq!(code, 11000, "retryable write {i} failed: {e}");
            assert!(
                stored.contains(i),
                "write {i}, applied before the kill, is missing"
            );
        }
        assert!(
            failed.len() <= 1,
            "{} retryable writes failed",
            failed.len()
        );
    } else {
        assert!(!failed.is_empty(), "the upstream was never seen gone");
    }
    assert!(
        acknowledged.len() > 100,
        "{} acknowledged",
        acknowledged.len()
    );
}

/// The RSS of process `pid`, in KiB.
fn rss_of(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A figure of process `pid`'s status (`VmRSS:`, `VmHWM:`…), in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Connections the upstream of the tests takes at once (SecantusDB's cap is
/// 1,000; the proxy's own connections need a few).
const SESSIONS: usize = 990;

/// Many connections at once, each with its own upstream leg: every one is
/// served, another client is served meanwhile, and the proxy's memory per
/// connection stays small, idle (after the handshake) and active (a read of
/// tokenized documents in flight on each).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_connections_are_each_served_in_bounded_memory() {
    // An upstream of the test's own: other tests' connections must not
    // count against its cap.
    let upstream = common::launch(&[]);
    let (mut child, addr) = common::serve_process_at(
        &upstream.uri,
        &["--tokenize-min-len", "4", "--max-connections", "2000"],
    );
    let pid = child.id();
    let db = db_name("thousand", "app");
    let client = mongodb::Client::with_uri_str(format!("mongodb://{addr}/?maxPoolSize=1"))
        .await
        .unwrap();
    let c = client.database(&db).collection::<Document>("c");
    let docs: Vec<Document> = (0..20)
        .map(|i| doc! {"_id": i, "a_long_field_name": i, "another_long_name": "x"})
        .collect();
    c.insert_many(docs.clone()).await.unwrap();
    let before = rss_of(pid);

    let mut sessions = Vec::with_capacity(SESSIONS);
    for _ in 0..SESSIONS {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        write_frame(&mut s, &op_msg(1, 0, doc! {"hello": 1, "$db": "admin"})).await;
        sessions.push(s);
    }
    for s in &mut sessions {
        let reply = tokio::time::timeout(Duration::from_secs(60), read_frame(s))
            .await
            .expect("a hello reply in time")
            .expect("a hello reply");
        assert_eq!(body(&reply).get_f64("ok").unwrap(), 1.0);
    }
    let idle = rss_of(pid);

    // Every session reads the tokenized documents at once.
    let find = op_msg(
        2,
        0,
        doc! {"find": "c", "filter": {}, "sort": {"_id": 1}, "$db": &db},
    );
    let bytes = find.to_bytes();
    for s in &mut sessions {
        s.write_all(&bytes).await.unwrap();
    }
    let active = rss_of(pid);
    assert_eq!(
        common::by_id(&c, doc! {}).await,
        docs,
        "another client is served meanwhile"
    );
    for s in &mut sessions {
        let reply = tokio::time::timeout(Duration::from_secs(60), read_frame(s))
            .await
            .expect("a find reply in time")
            .expect("a find reply");
        let b = body(&reply);
        let batch = b
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .unwrap_or_else(|_| panic!("{b:?}"));
        assert_eq!(batch.len(), 20);
        assert_eq!(batch[0].as_document().unwrap(), &docs[0]);
    }
    let served = rss_of(pid);
    drop(sessions);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = rss_of(pid);
    eprintln!(
        "{SESSIONS} connections: RSS {before} KiB before, {idle} KiB idle after the handshake ({:.1} KiB each), {active} KiB with a read in flight on each, {served} KiB once all were answered ({:.1} KiB each), {after} KiB after they closed",
        (idle - before) as f64 / SESSIONS as f64,
        (served.max(active) - before) as f64 / SESSIONS as f64,
    );
    // A bound on memory, not a timing: far above the ~30 KiB measured per
    // connection, far below what an unbounded buffer per connection takes.
    assert!(
        served.max(active) - before < SESSIONS as u64 * 200,
        "{} KiB for {SESSIONS} connections",
        served.max(active) - before
    );
    assert_eq!(
        common::by_id(&c, doc! {}).await.len(),
        20,
        "the proxy serves on once they closed"
    );
    child.kill().unwrap();
    let _ = child.wait();
}

/// A command whose rewrite is long (an `update` of 60,000 pipeline
/// statements, which the owned mapper rewrites, the last one refused so
/// that the upstream never works on it) is rewritten off the runtime's
/// threads. The proxy runs on this test's runtime of one thread, where a
/// rewrite done in place holds everything else: its liveness probe, polled
/// from another thread, must keep being answered while the command is.
#[tokio::test]
async fn a_long_rewrite_leaves_the_proxy_answering_others() {
    use std::io::{Read, Write};
    use std::time::Instant;
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 1;
    config.metrics_listen = Some("127.0.0.1:0".into());
    let proxy = common::start(config).await;
    let (addr, probe) = (proxy.addr, proxy.metrics_addr.unwrap());
    let db = db_name("longrewrite", "app");
    let mut updates: Vec<Document> = (0..60_000)
        .map(|i| doc! {"q": {"name": format!("n{i}")}, "u": [{"$set": {"score": i}}]})
        .collect();
    updates.push(doc! {"q": {"$where": "true"}, "u": [{"$set": {"score": 0}}]});
    let command = op_msg(
        1,
        0,
        doc! {"update": "c", "updates": updates, "ordered": true, "$db": &db},
    )
    .to_bytes();
    assert!(command.len() > 2 << 20, "{} bytes", command.len());
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let polling = {
        let done = done.clone();
        tokio::task::spawn_blocking(move || {
            let mut answered = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let mut s = std::net::TcpStream::connect(probe).unwrap();
                s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                    .unwrap();
                let mut out = String::new();
                s.read_to_string(&mut out).unwrap();
                assert!(out.starts_with("HTTP/1.1 200"), "{out}");
                answered.push(Instant::now());
                std::thread::sleep(Duration::from_millis(5));
            }
            answered
        })
    };
    let sending = tokio::task::spawn_blocking(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(&command).unwrap();
        let sent = Instant::now();
        let mut len = [0u8; 4];
        s.read_exact(&mut len).unwrap();
        let mut rest = vec![0u8; i32::from_le_bytes(len) as usize - 4];
        s.read_exact(&mut rest).unwrap();
        (sent, Instant::now(), rest)
    });
    let (sent, replied, reply) = sending.await.unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered = polling.await.unwrap();
    // The reply: the proxy's refusal of `$where`, after the rewrite.
    let reply = bson::from_slice::<Document>(&reply[17..]).unwrap();
    assert_eq!(reply.get_f64("ok").unwrap(), 0.0, "{reply}");
    assert!(
        reply.get_str("errmsg").unwrap().contains("$where"),
        "{reply}"
    );
    let during: Vec<_> = answered
        .iter()
        .filter(|t| **t > sent && **t < replied)
        .collect();
    let longest = during
        .windows(2)
        .map(|w| *w[1] - *w[0])
        .chain(during.first().map(|t| **t - sent))
        .chain(during.last().map(|t| replied - **t))
        .max()
        .unwrap_or(replied - sent);
    let took = replied - sent;
    eprintln!(
        "a rewrite of {took:?}: {} probes answered meanwhile, the longest wait {longest:?}",
        during.len()
    );
    assert!(
        longest * 2 < took,
        "the probe waited {longest:?} of the command's {took:?}"
    );
}

/// The owned mapper holds hundreds of bytes per element of what it parses
/// (an aggregate's pipeline, here): such a rewrite is given a share of the
/// proxy's budget for heavy work (`max_work_bytes`) by the shape of what it
/// parses, before parsing it. One that would hold more than the whole
/// budget is refused with error 146 (a command, or the one statement of it
/// the raw splice does not take), while the raw splice rewrites the same
/// values elsewhere; those that fit are rewritten within it. The proxy's peak RSS shows it: four aggregates at once, each
/// holding about 55 MB while it is rewritten, would hold about 220 MB
/// together.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_rewrites_stay_within_the_work_budget() {
    const BUDGET: u64 = 128 << 20;
    let config = common::temp_dir("work-budget").join("laconic.toml");
    std::fs::write(&config, format!("[proxy]\nmax_work_bytes = {BUDGET}\n")).unwrap();
    let (mut child, addr) = common::serve_process(&[
        "--tokenize-min-len",
        "1",
        "--config",
        config.to_str().unwrap(),
    ]);
    let pid = child.id();
    let client = mongodb::Client::with_uri_str(format!("mongodb://{addr}/"))
        .await
        .unwrap();
    let db = client.database(&db_name("workbudget", "app"));
    db.collection::<Document>("c").drop().await.unwrap();
    let docs: Vec<Document> = (0..10).map(|i| doc! {"_id": i, "score": i}).collect();
    db.collection::<Document>("c")
        .insert_many(docs.clone())
        .await
        .unwrap();
    let aggregate = |n: i32| {
        let scores: Vec<i32> = (0..n).collect();
        doc! {
            "aggregate": "c",
            "pipeline": [{"$match": {"score": {"$in": scores}}}, {"$sort": {"_id": 1}}],
            "cursor": {},
        }
    };
    let before = status_kib(pid, "VmHWM:");

    // About 260 MB to rewrite: refused before it is parsed.
    let e = common::command_error(db.run_command(aggregate(400_000)).await.unwrap_err());
    assert_eq!((e.code, e.code_name.as_str()), (146, "ExceededMemoryLimit"));
    assert!(
        e.message.starts_with("laconic: rewriting this aggregate")
            && e.message.contains("max_work_bytes"),
        "{}",
        e.message
    );
    // A statement the owned mapper rewrites (a pipeline update): refused
    // by name, the rest of the command spliced raw.
    let big: Vec<i32> = (0..400_000).collect();
    let update = doc! {
        "update": "c",
        "updates": [
            {"q": {"_id": 1}, "u": {"$set": {"seen": true}}},
            {"q": {"_id": -1}, "u": [{"$set": {"list": {"$literal": &big}}}]},
        ],
    };
    let e = common::command_error(db.run_command(update).await.unwrap_err());
    assert_eq!(e.code, 146);
    assert!(
        e.message
            .starts_with("laconic: rewriting a statement of this update"),
        "{}",
        e.message
    );
    // The same values in a filter the raw splice rewrites: nothing is
    // parsed into documents, and nothing refused.
    let find = doc! {"find": "c", "filter": {"score": {"$in": &big}}, "sort": {"_id": 1}};
    let found = db.run_command(find).await.unwrap();
    assert_eq!(
        found
            .get_document("cursor")
            .unwrap()
            .get_array("firstBatch")
            .unwrap()
            .len(),
        10
    );
    let refused = status_kib(pid, "VmHWM:");

    // Four of about 65 MB each, at once: each rewritten and answered.
    let runs: Vec<_> = (0..4)
        .map(|_| {
            let (db, command) = (db.clone(), aggregate(100_000));
            tokio::spawn(async move { db.run_command(command).await })
        })
        .collect();
    for run in runs {
        let reply = run.await.unwrap().unwrap();
        let batch: Vec<&Document> = reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .unwrap_or_else(|_| panic!("{reply}"))
            .iter()
            .filter_map(bson::Bson::as_document)
            .collect();
        assert_eq!(batch, docs.iter().collect::<Vec<_>>());
    }
    let peak = status_kib(pid, "VmHWM:");
    eprintln!(
        "peak RSS {before} KiB before, {refused} KiB after the refusals, {peak} KiB after four rewrites at once within a budget of {} KiB",
        BUDGET >> 10
    );
    assert!(
        (peak - before) << 10 < BUDGET,
        "the peak rose by {} KiB, past the budget of {} KiB",
        peak - before,
        BUDGET >> 10
    );
    child.kill().unwrap();
    let _ = child.wait();
}

/// `laconic serve` as a process with the `[proxy]` settings `settings`,
/// its address, and an empty collection through it of a database named
/// for `test`.
async fn serving(
    test: &str,
    settings: &str,
) -> (std::process::Child, String, mongodb::Collection<Document>) {
    let config = common::temp_dir(test).join("laconic.toml");
    std::fs::write(&config, format!("[proxy]\n{settings}\n")).unwrap();
    let (child, addr) = common::serve_process(&["--config", config.to_str().unwrap()]);
    let client = mongodb::Client::with_uri_str(format!("mongodb://{addr}/"))
        .await
        .unwrap();
    let c = common::empty_collection(&client, test).await;
    (child, addr, c)
}

/// Messages being read from drivers are held within `max_read_bytes`:
/// eight connections each send the first 20 MB of a message declaring 40
/// MB, and stop. Only the first is read past its first chunk (its share is
/// the whole budget of 16 MiB), while a driver's small commands are served;
/// once it closes, the next is read. Before the budget, the proxy read all
/// eight, holding 160 MB for messages that never end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_being_read_stay_within_the_read_budget() {
    const PART: usize = 20_000_000;
    let (mut child, addr, c) = serving("readbudget", "max_read_bytes = 16777216").await;
    let pid = child.id();
    let before = rss_of(pid);

    let mut part = 40_000_000i32.to_le_bytes().to_vec();
    part.resize(PART, 0);
    let part = std::sync::Arc::new(part);
    let mut stalled = Vec::new();
    for _ in 0..8 {
        let mut s = TcpStream::connect(&addr).await.unwrap();
        write_frame(&mut s, &op_msg(1, 0, doc! {"hello": 1, "$db": "admin"})).await;
        read_frame(&mut s).await.expect("a hello reply");
        let part = part.clone();
        // The write blocks once the socket's buffers are full: the proxy
        // reads no more of a message the budget has no room for.
        stalled.push(tokio::spawn(async move {
            let _ = s.write_all(&part).await;
            std::future::pending::<()>().await;
        }));
    }
    // Meanwhile, small commands are served.
    for i in 0..20 {
        c.insert_one(doc! {"_id": i}).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let held = rss_of(pid);
    eprintln!("RSS {before} KiB before, {held} KiB with eight messages of 40 MB begun");
    // The one message read, and room for the rest of the process.
    assert!(
        (held - before) << 10 < (PART + (16 << 20)) as u64,
        "the RSS rose by {} KiB",
        held - before
    );
    // They close; a message of 20 MB is read and answered.
    for s in stalled {
        s.abort();
    }
    let big: Vec<Document> = (0..20)
        .map(|i| doc! {"_id": 100 + i, "pad": "x".repeat(1_000_000)})
        .collect();
    c.insert_many(big).await.unwrap();
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 40);
    child.kill().unwrap();
    let _ = child.wait();
}

/// A message holding a share of the read budget must keep coming: one
/// that sends the header of a 40 MB message and stops holds the whole
/// budget (16 MiB here) only until its deadline (1 s of grace, then 100
/// MB a second: 1.4 s), is closed, and a driver's large insert that
/// waited for the budget is then read and answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_that_stops_coming_gives_its_share_back() {
    let (mut child, addr, c) = serving(
        "readpace",
        "max_read_bytes = 16777216\nhandshake_timeout_ms = 1000\nmin_read_rate = 100000000",
    )
    .await;

    let mut staller = TcpStream::connect(&addr).await.unwrap();
    write_frame(
        &mut staller,
        &op_msg(1, 0, doc! {"hello": 1, "$db": "admin"}),
    )
    .await;
    read_frame(&mut staller).await.expect("a hello reply");
    let started = std::time::Instant::now();
    staller
        .write_all(&40_000_000i32.to_le_bytes())
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    // 2 MB: it needs a share, and waits for the staller's.
    let big: Vec<Document> = (0..2)
        .map(|i| doc! {"_id": i, "pad": "x".repeat(1_000_000)})
        .collect();
    tokio::time::timeout(Duration::from_secs(20), c.insert_many(big))
        .await
        .expect("the insert is served once the staller's deadline passes")
        .unwrap();
    let waited = started.elapsed();
    eprintln!("the insert was answered {waited:?} after the staller's header");
    assert!(waited >= Duration::from_millis(1300), "{waited:?}");
    // The staller's connection was closed, without a reply.
    let mut byte = [0u8; 1];
    let closed = tokio::time::timeout(Duration::from_secs(5), staller.read(&mut byte)).await;
    assert!(matches!(closed, Ok(Ok(0) | Err(_))), "{closed:?}");
    assert_eq!(c.count_documents(doc! {}).await.unwrap(), 2);
    child.kill().unwrap();
    let _ = child.wait();
}

/// Sixteen documents of about 1 MB each, under a long (tokenized) name:
/// a `find` of them all is a reply of about 16 MB.
async fn large_documents(c: &mongodb::Collection<Document>) -> Vec<Document> {
    let docs: Vec<Document> = (0..16)
        .map(|i| doc! {"_id": i, "a_rather_long_field_name": format!("{i:x}").repeat(1_000_000)})
        .collect();
    c.insert_many(docs.clone()).await.unwrap();
    docs
}

/// A connection that asks for all of `c`'s documents in one batch and
/// reads none of the reply, with a receive buffer of 4 KiB: what the proxy
/// writes of it stays in the proxy.
async fn not_reading(addr: &str, c: &mongodb::Collection<Document>) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut s = socket.connect(addr.parse().unwrap()).await.unwrap();
    write_frame(&mut s, &op_msg(1, 0, doc! {"hello": 1, "$db": "admin"})).await;
    read_frame(&mut s).await.expect("a hello reply");
    let find = doc! {"find": c.name(), "batchSize": 100, "$db": c.namespace().db};
    write_frame(&mut s, &op_msg(2, 0, find)).await;
    s
}

/// Replies on their way to drivers are held within `max_reply_bytes`:
/// eight connections each ask for a 16 MB batch of tokenized documents and
/// read none of it. With a budget of 64 MiB (one such reply's share), one
/// reply is read from the upstream, expanded and written as far as the
/// driver takes it; the others wait in the upstream's socket buffers, and
/// a driver's small reads are served meanwhile. Before the budget, the
/// proxy read and expanded all eight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_stay_within_the_reply_budget() {
    const BUDGET: u64 = 64 << 20;
    let (mut child, addr, c) = serving(
        "replybudget",
        &format!("max_reply_bytes = {BUDGET}\n\n[proxy.tokenize]\nmin_len = 4"),
    )
    .await;
    let pid = child.id();
    let docs = large_documents(&c).await;
    // One read of them all, as the baseline of what the process keeps.
    let all: Vec<Document> = c.find(doc! {}).await.unwrap().try_collect().await.unwrap();
    assert_eq!(all, docs);
    let before = rss_of(pid);

    let mut stalled = Vec::new();
    for _ in 0..8 {
        stalled.push(not_reading(&addr, &c).await);
    }
    // Meanwhile, small reads are served.
    for i in 0..20 {
        let one = c
            .find_one(doc! {"_id": i % 16})
            .projection(doc! {"a_rather_long_field_name": 0})
            .await
            .unwrap();
        assert_eq!(one, Some(doc! {"_id": i % 16}));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let held = rss_of(pid);
    eprintln!("RSS {before} KiB before, {held} KiB with eight replies of 16 MB not taken");
    assert!(
        (held - before) << 10 < BUDGET + (16 << 20),
        "the RSS rose by {} KiB",
        held - before
    );
    // They close; a driver's read of them all is served.
    drop(stalled);
    let all: Vec<Document> = c.find(doc! {}).await.unwrap().try_collect().await.unwrap();
    assert_eq!(all, docs);
    child.kill().unwrap();
    let _ = child.wait();
}

/// Names can make a reply many times its stored size: a name of 1,000
/// bytes is stored in two. A reply's expansion grows within what the
/// proxy could send in one reply and hold for the cursor (16 MiB and
/// `max_held_bytes`, 4 MiB here), taken from the budget for replies: a
/// batch whose names would pass that is refused (146) before the memory
/// is spent, and the same documents read in smaller batches come back
/// whole. Before, the proxy expanded the whole batch first, and refused
/// it only then: 96 MB here, a gigabyte for 40 documents of 10 MB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_whose_names_outgrow_the_room_is_refused_before_it_is_expanded() {
    let (mut child, _addr, c) = serving(
        "namesroom",
        "max_held_bytes = 4194304\n\n[proxy.tokenize]\nmin_len = 4",
    )
    .await;
    let pid = child.id();
    // 96 documents of 1 MB, each a thousand times one long name, stored
    // in about 15 KB.
    let name = "n".repeat(1000);
    let one =
        |i: i32| doc! {"_id": i, "a": (0..1000).map(|_| doc! {&name: true}).collect::<Vec<_>>()};
    for i in 0..96 {
        c.insert_one(one(i)).await.unwrap();
    }
    let before = rss_of(pid);
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let peak = {
        let sampling = sampling.clone();
        tokio::spawn(async move {
            let mut peak = 0;
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_of(pid));
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            peak
        })
    };
    let all = c.find(doc! {}).batch_size(96).await;
    let e = match all {
        Ok(cursor) => cursor.try_collect::<Vec<_>>().await.unwrap_err(),
        Err(e) => e,
    };
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let peak = peak.await.unwrap();
    eprintln!("RSS {before} KiB before the read, {peak} KiB at most while it was refused");
    let e = common::command_error(e);
    assert_eq!((e.code, e.code_name.as_str()), (146, "ExceededMemoryLimit"));
    assert!(
        e.message
            .starts_with("laconic: the documents of this reply would be more than 20 MiB")
            && e.message.contains("batchSize"),
        "{}",
        e.message
    );
    assert!(
        peak.saturating_sub(before) < 64 << 10,
        "the RSS rose by {} KiB",
        peak - before
    );
    // In batches of four (4 MB with their names), every name comes back.
    let read: Vec<Document> = c
        .find(doc! {})
        .batch_size(4)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(read.len(), 96);
    for (i, d) in read.into_iter().enumerate() {
        assert_eq!(d, one(i as i32));
    }
    child.kill().unwrap();
    let _ = child.wait();
}

/// An error text echoes values: a duplicate key error prints the key's
/// value, and a value can hold what reads as keys (control bytes that are
/// tokens, after a quote of its own). Read as names, 20,000 copies of
/// such a value (1.2 MB) would make the text 200 MB: its expansion stops
/// at the message limit, and the command is refused (10334), where the
/// proxy used to build the whole text first (740 MB of RSS). A server that
/// escapes the quote (MongoDB prints `\"`) keeps the value a value: the
/// driver gets the duplicate key error with the value as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_text_that_echoes_a_value_is_expanded_within_the_message_limit() {
    let (mut child, _addr, c) = serving("textroom", "[proxy.tokenize]\nmin_len = 4").await;
    let pid = child.id();
    // A long name, and the names of the first tokens.
    let long = "k".repeat(10_000);
    c.insert_one(doc! {"_id": -1, &long: 1, "email": "-"})
        .await
        .unwrap();
    c.create_index(
        mongodb::IndexModel::builder()
            .keys(doc! {"email": 1})
            .options(
                mongodb::options::IndexOptions::builder()
                    .unique(true)
                    .build(),
            )
            .build(),
    )
    .await
    .unwrap();
    let tokens: String = (1u8..31).map(|b| format!("{} ", b as char)).collect();
    let value = format!("\" {}\"", tokens.repeat(20_000));
    c.insert_one(doc! {"_id": 1, "email": &value})
        .await
        .unwrap();
    let before = rss_of(pid);
    let e = common::command_error(
        c.insert_one(doc! {"_id": 2, "email": &value})
            .await
            .unwrap_err(),
    );
    let after = status_kib(pid, "VmHWM:");
    eprintln!(
        "{} {}: RSS {before} KiB before, {after} KiB at most",
        e.code,
        &e.message[..80]
    );
    match e.code {
        10334 => assert!(e
            .message
            .starts_with("laconic: the reply would be more than 48000000 bytes")),
        11000 => assert!(e.message.contains(&value), "{}", &e.message[..200]),
        code => panic!("{code}: {}", &e.message[..200]),
    }
    assert!(
        after.saturating_sub(before) < 300 << 10,
        "the RSS rose by {} KiB",
        after - before
    );
    child.kill().unwrap();
    let _ = child.wait();
}

/// A reply holding a share of the reply budget must be taken: one whose
/// driver reads none of its 16 MB holds the whole budget (16 MiB here)
/// only until its deadline (1 s of grace, then 100 MB a second: about
/// 1.2 s), is closed, and another driver's read of the same documents,
/// which waited for the budget, is then answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_not_taken_gives_its_share_back() {
    let (mut child, addr, c) = serving(
        "replypace",
        "max_reply_bytes = 16777216\nhandshake_timeout_ms = 1000\nmin_write_rate = 100000000\n\n[proxy.tokenize]\nmin_len = 4",
    )
    .await;
    let docs = large_documents(&c).await;
    let mut staller = not_reading(&addr, &c).await;
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let all = tokio::time::timeout(Duration::from_secs(20), async {
        c.find(doc! {}).await?.try_collect::<Vec<_>>().await
    })
    .await
    .expect("the read is served once the staller's deadline passes")
    .unwrap();
    let waited = started.elapsed();
    eprintln!("the read was answered {waited:?} after the staller's request");
    assert_eq!(all, docs);
    assert!(waited >= Duration::from_millis(1100), "{waited:?}");
    // The staller's connection was closed before its reply was whole.
    let mut got = 0usize;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), staller.read(&mut buf)).await {
            Ok(Ok(0) | Err(_)) => break,
            Ok(Ok(n)) => got += n,
            Err(_) => panic!("the staller's connection is still open ({got} bytes read)"),
        }
    }
    assert!(
        got < 16_000_000,
        "{got} bytes of the reply reached the staller"
    );
    child.kill().unwrap();
    let _ = child.wait();
}

/// A cluster-wide change stream's batch is expanded event by event (each
/// with its database's dictionary) raw to raw, within the reply's room.
/// Before, the whole batch was parsed into documents and each event again
/// after its expansion, outside any budget: 400 events of 2,000 fields
/// (8 MB stored) took the RSS of a release build up 310–340 MB (now 50 MB),
/// and 0.85–1.01 s of its CPU (now 0.12–0.15 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_wide_stream_batch_is_expanded_without_parsing_it() {
    use futures::StreamExt;
    let (mut child, addr, c) = serving("eventsraw", "[proxy.tokenize]\nmin_len = 4").await;
    let pid = child.id();
    let client = mongodb::Client::with_uri_str(format!("mongodb://{addr}/"))
        .await
        .unwrap();
    let db = c.namespace().db;
    let one = |i: i32| {
        let mut d = doc! {"_id": i};
        for f in 0..2000 {
            d.insert(format!("field_number_{f:05}"), f);
        }
        d
    };
    // Only this database's inserts: other tests' databases have
    // dictionaries this proxy cannot read (it would refuse their events,
    // 301), and a stream opened without a start point may begin before the
    // collection was made (see `common::just_after`).
    let mut stream = client
        .watch()
        .pipeline(vec![
            doc! {"$match": {"ns.db": &db, "operationType": "insert"}},
        ])
        .batch_size(400)
        .await
        .unwrap();
    for chunk in (0..400).collect::<Vec<i32>>().chunks(50) {
        c.insert_many(chunk.iter().map(|&i| one(i))).await.unwrap();
    }
    let before = rss_of(pid);
    let mut read = 0;
    while read < 400 {
        let e = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await
            .expect("an event within 60 s")
            .unwrap()
            .unwrap();
        assert_eq!(e.full_document, Some(one(read)));
        read += 1;
    }
    let peak = status_kib(pid, "VmHWM:");
    eprintln!("RSS {before} KiB before the events were read, {peak} KiB at most");
    assert!(
        peak.saturating_sub(before) < 128 << 10,
        "the RSS rose by {} KiB",
        peak - before
    );
    child.kill().unwrap();
    let _ = child.wait();
}
