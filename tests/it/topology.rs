//! Replica-set primaries that move and lists of mongos hosts, which a
//! one-member server cannot show: a fault-injection relay in front of the
//! real upstream plays each host. It forwards every message, and by its
//! mode answers `hello` as a primary, a secondary or a mongos, refuses
//! writes as a secondary would (`NotWritablePrimary`), applies writes as a
//! primary that has lost its majority would (a majority write is applied,
//! then answered with a write concern error), or is down (connections
//! closed at once).

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bson::{doc, Document, RawDocumentBuf};
use futures::{SinkExt, StreamExt};
use laconic::downstream::ProxyHandle;
use laconic::wire::{Frame, Message, MessageCodec, MsgFlags, OpMsg, MAX_MESSAGE_SIZE};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::codec::Framed;

use crate::common::{self, db_name};

const PRIMARY: u8 = 0;
const SECONDARY: u8 = 1;
const MONGOS: u8 = 2;
const DOWN: u8 = 3;
/// A primary whose secondaries are gone: `w: "majority"` times out.
const NO_MAJORITY: u8 = 4;
/// A primary whose connection fails once an application's write has
/// reached it, before the reply comes back; then a primary again.
const CUT_AFTER_WRITE: u8 = 5;

/// One host of a pretend deployment.
struct Relay {
    addr: String,
    mode: Arc<AtomicU8>,
    /// The application's write commands forwarded to the upstream (not the
    /// name store's own).
    writes: Arc<AtomicUsize>,
}

impl Relay {
    fn set(&self, mode: u8) {
        self.mode.store(mode, Ordering::SeqCst);
    }

    fn writes(&self) -> usize {
        self.writes.load(Ordering::SeqCst)
    }
}

const WRITES: &[&str] = &[
    "insert",
    "update",
    "delete",
    "findAndModify",
    "create",
    "drop",
];

async fn relay(target: String, mode: u8, set: Arc<parking_lot::Mutex<Vec<String>>>) -> Relay {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let mode = Arc::new(AtomicU8::new(mode));
    let writes = Arc::new(AtomicUsize::new(0));
    let (m, w, me) = (mode.clone(), writes.clone(), addr.clone());
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            if m.load(Ordering::SeqCst) == DOWN {
                continue; // dropped: closed at once
            }
            let (m, w, set, me, target) = (
                m.clone(),
                w.clone(),
                set.clone(),
                me.clone(),
                target.clone(),
            );
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&target).await else {
                    return;
                };
                let mut c = Framed::new(client, MessageCodec::new(MAX_MESSAGE_SIZE));
                let mut s = Framed::new(server, MessageCodec::new(MAX_MESSAGE_SIZE));
                while let Some(Ok(request)) = c.next().await {
                    let mode = m.load(Ordering::SeqCst);
                    if mode == DOWN {
                        return;
                    }
                    let name = request.command_name().unwrap_or_default().to_owned();
                    let app_write = WRITES.contains(&name.as_str()) && !of_the_store(&request);
                    if mode == SECONDARY && WRITES.contains(&name.as_str()) {
                        let body = doc! {"ok": 0.0, "errmsg": "not primary", "code": 10107, "codeName": "NotWritablePrimary"};
                        let reply = reply_to(&request, &body);
                        if c.send(reply).await.is_err() {
                            return;
                        }
                        continue;
                    }
                    if app_write {
                        w.fetch_add(1, Ordering::SeqCst);
                    }
                    if s.send(request.clone()).await.is_err() {
                        return;
                    }
                    let Some(Ok(reply)) = s.next().await else {
                        return;
                    };
                    if mode == CUT_AFTER_WRITE && app_write {
                        m.store(PRIMARY, Ordering::SeqCst);
                        return; // both connections closed, the write applied
                    }
                    let reply = if matches!(name.as_str(), "hello" | "isMaster" | "ismaster") {
                        let set = set.lock().clone();
                        let member = if matches!(mode, NO_MAJORITY | CUT_AFTER_WRITE) {
                            PRIMARY
                        } else {
                            mode
                        };
                        as_member(&request, &reply, member, &set, &me)
                    } else if mode == NO_MAJORITY && WRITES.contains(&name.as_str()) {
                        without_majority(&request, reply)
                    } else {
                        reply
                    };
                    if c.send(reply).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    Relay { addr, mode, writes }
}

/// Whether a command writes the name store (a dictionary, in its
/// database's `__laconic`, or the record of one, in `laconic.dictionaries`).
fn of_the_store(request: &Frame) -> bool {
    let Some(m) = request.op_msg() else {
        return false;
    };
    let body = m.body();
    let target = body.into_iter().next().and_then(|e| e.ok()?.1.as_str());
    let db = body.get_str("$db").unwrap_or_default();
    target == Some("__laconic") || (db == "laconic" && target == Some("dictionaries"))
}

fn reply_to(request: &Frame, body: &Document) -> Frame {
    let raw = RawDocumentBuf::from_document(body).unwrap();
    let message = match request.message() {
        Message::Query(_) => Message::Reply(laconic::wire::OpReply::single(&raw)),
        _ => Message::Msg(OpMsg::from_body(MsgFlags::default(), &raw)),
    };
    Frame::new(
        request.header.request_id.wrapping_add(1),
        request.header.request_id,
        message,
    )
}

/// The reply of a primary that applied `request` and waited in vain for a
/// majority, if `request` asked for one: the server's reply with a write
/// concern error added, as `mongod` answers when `wtimeout` runs out.
fn without_majority(request: &Frame, reply: Frame) -> Frame {
    let Message::Msg(m) = request.message() else {
        return reply;
    };
    let asked = Document::try_from(m.body()).unwrap();
    let majority = asked
        .get_document("writeConcern")
        .is_ok_and(|w| w.get_str("w") == Ok("majority"));
    let Message::Msg(r) = reply.message() else {
        return reply;
    };
    if !majority {
        return reply;
    }
    let mut body = Document::try_from(r.body()).unwrap();
    body.insert(
        "writeConcernError",
        doc! {"code": 64, "codeName": "WriteConcernFailed", "errmsg": "waiting for replication timed out", "errInfo": {"wtimeout": true}},
    );
    reply_to(request, &body)
}

/// The upstream's `hello` reply, as the member `mode` says this host is.
fn as_member(request: &Frame, reply: &Frame, mode: u8, set: &[String], me: &str) -> Frame {
    let raw = match reply.message() {
        Message::Msg(m) => m.body(),
        Message::Reply(r) => match r.first() {
            Some(d) => d,
            None => return reply.clone(),
        },
        _ => return reply.clone(),
    };
    let mut body = Document::try_from(raw).unwrap();
    for k in [
        "msg",
        "setName",
        "hosts",
        "primary",
        "me",
        "secondary",
        "isWritablePrimary",
        "ismaster",
    ] {
        body.remove(k);
    }
    match mode {
        MONGOS => {
            body.insert("isWritablePrimary", true);
            body.insert("ismaster", true);
            body.insert("msg", "isdbgrid");
        }
        _ => {
            body.insert("isWritablePrimary", mode == PRIMARY);
            body.insert("ismaster", mode == PRIMARY);
            body.insert("secondary", mode == SECONDARY);
            body.insert("setName", "rs0");
            body.insert("hosts", set.to_vec());
            body.insert("me", me);
        }
    }
    reply_to(request, &body)
}

async fn relays(modes: &[u8]) -> Vec<Relay> {
    // The addresses are known only once bound: the set lists them after.
    let set = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let mut out = Vec::new();
    for &m in modes {
        out.push(relay(common::upstream().host.clone(), m, set.clone()).await);
    }
    *set.lock() = out.iter().map(|r| r.addr.clone()).collect();
    out
}

fn uri(relays: &[Relay], options: &str) -> String {
    let hosts: Vec<&str> = relays.iter().map(|r| r.addr.as_str()).collect();
    format!("mongodb://{}/?{options}", hosts.join(","))
}

/// A tokenizing proxy in front of relays playing a replica set (`modes`),
/// and collection `c` of test `test`'s database, emptied, through it with
/// a driver that retries its writes.
async fn retrying_through_a_set(
    modes: &[u8],
    test: &str,
) -> (Vec<Relay>, ProxyHandle, mongodb::Collection<Document>) {
    let hosts = relays(modes).await;
    let mut config = common::proxy_config(&uri(&hosts, "replicaSet=rs0&heartbeatFrequencyMS=500"));
    config.tokenize.min_len = 4;
    let proxy = common::start(config).await;
    let client = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?retryWrites=true&maxIdleTimeMS=120000",
        proxy.addr
    ))
    .await
    .unwrap();
    let c = common::empty_collection(&client, test).await;
    (hosts, proxy, c)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_follow_the_primary_and_writes_survive_a_failover() {
    // After its connection closes the driver re-checks the proxy at once
    // (no sooner than 500 ms after its last check), whatever its heartbeat,
    // and then retries.
    let (hosts, _proxy, c) = retrying_through_a_set(&[SECONDARY, PRIMARY], "failover").await;
    for i in 0..20 {
        c.insert_one(doc! {"_id": i, "written_before": true})
            .await
            .unwrap();
    }
    assert_eq!(hosts[0].writes(), 0, "a write went to the secondary");
    assert!(hosts[1].writes() >= 20);

    // The primary steps down and the other member takes over, while a
    // writer keeps writing with retryable writes: every one succeeds.
    let writer = {
        let c = c.clone();
        tokio::spawn(async move {
            let mut acknowledged = Vec::new();
            for i in 100..300 {
                if c.insert_one(doc! {"_id": i, "written_during": true})
                    .await
                    .is_ok()
                {
                    acknowledged.push(i);
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            acknowledged
        })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = hosts[0].writes();
    let flipped = Instant::now();
    hosts[1].set(SECONDARY);
    hosts[0].set(PRIMARY);
    let mut failover = None;
    while failover.is_none() && flipped.elapsed() < Duration::from_secs(30) {
        if hosts[0].writes() > before {
            failover = Some(flipped.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let acknowledged = writer.await.unwrap();
    eprintln!(
        "failover: first write on the new primary {:?} after the step-down; {} of 200 writes acknowledged",
        failover.expect("writes reached the new primary"),
        acknowledged.len()
    );
    // Every acknowledged write is there.
    let stored = common::by_id(&c, doc! {"written_during": true}).await;
    let ids: Vec<i32> = stored.iter().map(|d| d.get_i32("_id").unwrap()).collect();
    for i in &acknowledged {
        assert!(ids.contains(i), "acknowledged write {i} is missing");
    }
    // None is lost to the failover: the session on the old primary closes
    // without its NotWritablePrimary, the driver drops the connections it
    // pooled there, and its retry opens one on the new primary.
    assert_eq!(acknowledged.len(), 200, "a retryable write failed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_spread_over_the_mongos_hosts_that_answer() {
    let hosts = relays(&[MONGOS, DOWN, MONGOS]).await;
    let proxy = common::start(common::proxy_config(&uri(
        &hosts,
        "heartbeatFrequencyMS=500",
    )))
    .await;
    let db = db_name("mongoses", "app");
    // A new client each time: a new session, a new upstream connection.
    let insert_as_new_client = |i: i32| {
        let (addr, db) = (proxy.addr, db.clone());
        async move {
            mongodb::Client::with_uri_str(format!("mongodb://{addr}/"))
                .await
                .unwrap()
                .database(&db)
                .collection::<Document>("c")
                .insert_one(doc! {"i": i})
                .await
                .unwrap();
        }
    };
    // Sessions go to the hosts in turn, but each driver client opens about
    // three (its monitors' and its pool's, in the order their timing
    // falls), so which host takes a client's insert is about a coin's
    // toss: 30 of them put fewer than 6 on one host once in some thousands
    // of runs, where 12 of them put fewer than 3 on one once in some tens.
    for i in 0..30 {
        insert_as_new_client(i).await;
    }
    let (a, down, b) = (hosts[0].writes(), hosts[1].writes(), hosts[2].writes());
    assert_eq!(down, 0);
    assert!(a >= 6 && b >= 6, "spread {a} / {b}");
    // The host that was down comes back: it takes sessions again, once a
    // heartbeat (every 0.5 s; later on a loaded machine) has seen it.
    hosts[1].set(MONGOS);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut i = 100;
    while hosts[1].writes() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the host that came back took no session in 30 s"
        );
        insert_as_new_client(i).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The SRV name of the tests. The hosts an SRV record lists must lie in
/// the parent domain of the URI's host, and the relays are at 127.0.0.1,
/// whose parent "domain" is `0.0.1`: the one loopback name every machine
/// resolves without a DNS server of its own.
const SRV_NAME: &str = "cluster0.0.0.1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_list_the_hosts_and_new_sessions_follow_them_when_they_change() {
    let hosts = relays(&[MONGOS, MONGOS]).await;
    let dns = crate::dns::Dns::start().await;
    // A record outside the domain is skipped, as drivers skip it.
    dns.set_srv(SRV_NAME, &[&hosts[0].addr, "evil.example.com:27017"]);
    dns.set_txt(SRV_NAME, "authSource=admin");
    let mut config = common::proxy_config(&format!(
        "mongodb+srv://{SRV_NAME}/?tls=false&heartbeatFrequencyMS=500"
    ));
    config.dns_server = Some(dns.addr.to_string());
    config.srv_rescan_ms = 1000;
    config.tokenize.min_len = 4;
    let proxy = common::start(config).await;
    let db = db_name("srv", "app");
    // Emptied first, on the server: an upstream kept between runs holds
    // the last run's documents, and a drop through the proxy would count
    // as a write on a host.
    common::direct()
        .await
        .database(&db)
        .collection::<Document>("c")
        .drop()
        .await
        .unwrap();
    let insert_as_new_client = |i: i32| {
        let (addr, db) = (proxy.addr, db.clone());
        async move {
            let c = mongodb::Client::with_uri_str(format!("mongodb://{addr}/"))
                .await
                .unwrap()
                .database(&db)
                .collection::<Document>("c");
            c.insert_one(doc! {"i": i, "long_field_name": "tokenized"})
                .await
                .unwrap();
            c
        }
    };
    for i in 0..4 {
        insert_as_new_client(i).await;
    }
    assert!(
        hosts[0].writes() >= 4,
        "the SRV record's host took the sessions"
    );
    assert_eq!(
        hosts[1].writes(),
        0,
        "a host no record lists took a session"
    );

    // The records now list the other host: within a rescan or two, new
    // sessions go there alone.
    dns.set_srv(SRV_NAME, &[&hosts[1].addr]);
    let changed = Instant::now();
    let mut i = 100;
    while hosts[1].writes() == 0 {
        assert!(
            changed.elapsed() < Duration::from_secs(15),
            "new sessions never followed the SRV records"
        );
        insert_as_new_client(i).await;
        i += 1;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let on_old = hosts[0].writes();
    for j in 0..4 {
        insert_as_new_client(1000 + j).await;
    }
    assert_eq!(
        hosts[0].writes(),
        on_old,
        "a session went to a host dropped from the records"
    );

    // A failed lookup (the name is gone) keeps the hosts known.
    dns.set_srv(SRV_NAME, &[]);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let c = insert_as_new_client(2000).await;
    // Every document reads back under its names, through the name store's
    // connection resolved from the same records.
    let back = common::by_id(&c, doc! {}).await;
    assert_eq!(back.len(), 4 + (i - 100) as usize + 4 + 1);
    assert!(back
        .iter()
        .all(|d| d.get_str("long_field_name") == Ok("tokenized")));
    let stored = common::stored(&db, "c").await;
    assert_eq!(stored.len(), back.len());
    assert!(
        stored.iter().all(|d| !d.contains_key("long_field_name")),
        "the names were not tokenized"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn srv_records_outside_the_domain_or_malformed_txt_stop_the_start_with_the_reason() {
    let hosts = relays(&[MONGOS]).await;
    let dns = crate::dns::Dns::start().await;
    let start = |name: &str| {
        let mut config = common::proxy_config(&format!("mongodb+srv://{name}/?tls=false"));
        config.dns_server = Some(dns.addr.to_string());
        laconic::downstream::Proxy::start(config)
    };
    dns.set_srv("c1.0.0.1", &["evil.example.com:27017"]);
    let err = start("c1.0.0.1").await.unwrap_err().to_string();
    assert!(err.contains("name no host in the domain 0.0.1"), "{err}");

    dns.set_srv("c2.0.0.1", &[&hosts[0].addr]);
    dns.set_txt("c2.0.0.1", "w=majority");
    let err = start("c2.0.0.1").await.unwrap_err().to_string();
    assert!(err.contains("only authSource and replicaSet"), "{err}");

    let err = start("c3.0.0.1").await.unwrap_err().to_string();
    assert!(
        err.contains("SRV lookup of _mongodb._tcp.c3.0.0.1."),
        "{err}"
    );
}

/// A replica set whose primary has lost its secondaries: it applies every
/// write, and answers one that asked for a majority with a write concern
/// error once its wait runs out. The name store asks for a majority, so a
/// command that needs new names is refused with the server's error (which
/// drivers do not retry), while the names the dictionary has keep working.
/// Once the majority is back the command goes through, its names stored
/// once, and everything reads back under the names it was written with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_majority_new_names_are_refused_and_known_ones_keep_working() {
    let hosts = relays(&[PRIMARY]).await;
    let mut config = common::proxy_config(&uri(&hosts, "replicaSet=rs0&heartbeatFrequencyMS=500"));
    config.tokenize.min_len = 4;
    let proxy = common::start(config).await;
    let client = common::via_proxy(&proxy).await;
    let name = db_name("no_majority", "app");
    let db = client.database(&name);
    db.drop().await.unwrap();
    let c = db.collection::<Document>("c");
    c.insert_one(doc! {"_id": 1, "known_field_name": 1})
        .await
        .unwrap();

    hosts[0].set(NO_MAJORITY);
    // Known names: nothing to allocate, the write goes through.
    c.insert_one(doc! {"_id": 2, "known_field_name": 2})
        .await
        .unwrap();
    // A new name: its allocation is applied but never acknowledged.
    let e = c
        .insert_one(doc! {"_id": 3, "a_brand_new_field_name": 3})
        .await
        .unwrap_err();
    let mongodb::error::ErrorKind::Command(refused) = &*e.kind else {
        panic!("{e}");
    };
    assert_eq!(
        (refused.code, refused.code_name.as_str()),
        (64, "WriteConcernFailed")
    );
    assert!(
        refused.message.starts_with("laconic: the name store's"),
        "{e}"
    );
    assert!(!e.contains_label("RetryableWriteError"), "{e}");
    assert_eq!(
        common::by_id(&c, doc! {}).await,
        vec![
            doc! {"_id": 1, "known_field_name": 1},
            doc! {"_id": 2, "known_field_name": 2}
        ]
    );

    hosts[0].set(PRIMARY);
    c.insert_one(doc! {"_id": 3, "a_brand_new_field_name": 3})
        .await
        .unwrap();
    assert_eq!(
        common::by_id(&c, doc! {"_id": 3}).await,
        vec![doc! {"_id": 3, "a_brand_new_field_name": 3}]
    );
    // The allocation applied during the fault and the one after it are
    // one entry: the name has one token.
    let chain: Vec<Document> = common::stored(&name, "__laconic")
        .await
        .into_iter()
        .filter(|d| d.get_str("chain") == Ok("names"))
        .collect();
    let entries: Vec<&str> = chain
        .iter()
        .flat_map(|d| d.get_array("names").unwrap())
        .filter_map(|n| n.as_str())
        .filter(|n| *n == "a_brand_new_field_name")
        .collect();
    assert_eq!(entries.len(), 1, "{chain:?}");
    let stored = common::stored(&name, "c").await;
    assert!(
        stored
            .iter()
            .all(|d| d.keys().all(|k| k == "_id" || k.len() <= 2)),
        "{stored:?}"
    );
}

/// The upstream connection fails after a write reached the server and
/// before its reply came back. The driver's connection closes as it would
/// if the server's had, so a retryable write is sent again on a new one,
/// and the server applies it once (it knows the transaction number). A
/// write that is not retryable gets the network error, as it would
/// directly, and stays applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_whose_reply_is_lost_upstream_is_retried_and_applied_once() {
    let (hosts, proxy, c) = retrying_through_a_set(&[PRIMARY], "lost_reply").await;
    c.insert_one(doc! {"_id": 1, "counter_field": 0})
        .await
        .unwrap();

    let sent = hosts[0].writes();
    hosts[0].set(CUT_AFTER_WRITE);
    c.update_one(doc! {"_id": 1}, doc! {"$inc": {"counter_field": 1}})
        .await
        .unwrap();
    assert_eq!(hosts[0].mode.load(Ordering::SeqCst), PRIMARY, "no cut");
    assert_eq!(hosts[0].writes() - sent, 2, "sent, then sent again");
    assert_eq!(
        common::by_id(&c, doc! {}).await,
        vec![doc! {"_id": 1, "counter_field": 1}],
        "applied once"
    );

    // A second driver, pymongo, does the same.
    hosts[0].set(CUT_AFTER_WRITE);
    let script = "import sys, pymongo\n\
        c = pymongo.MongoClient(sys.argv[1])[sys.argv[2]]['c']\n\
        r = c.update_one({'_id': 1}, {'$inc': {'counter_field': 1}})\n\
        assert r.matched_count == 1, r.raw_result\n";
    let out = tokio::process::Command::new(common::venv_python())
        .args(["-c", script])
        .arg(format!("mongodb://{}/?retryWrites=true", proxy.addr))
        .arg(db_name("lost_reply", "app"))
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(hosts[0].mode.load(Ordering::SeqCst), PRIMARY, "no cut");
    assert_eq!(
        common::by_id(&c, doc! {}).await,
        vec![doc! {"_id": 1, "counter_field": 2}],
        "applied once"
    );

    // Without retryable writes: the driver is told of the network failure,
    // as it would be by a server whose connection failed.
    let plain = common::via_proxy(&proxy)
        .await
        .database(&db_name("lost_reply", "app"))
        .collection::<Document>("c");
    hosts[0].set(CUT_AFTER_WRITE);
    let e = plain
        .update_one(doc! {"_id": 1}, doc! {"$inc": {"counter_field": 1}})
        .await
        .unwrap_err();
    assert!(matches!(*e.kind, mongodb::error::ErrorKind::Io(_)), "{e}");
    assert_eq!(hosts[0].mode.load(Ordering::SeqCst), PRIMARY, "no cut");
    assert_eq!(
        common::by_id(&c, doc! {}).await,
        vec![doc! {"_id": 1, "counter_field": 3}]
    );
}
