//! Connection limits, graceful shutdown, and the binary's start-up contract.

use std::process::Command;
use std::time::Duration;

use bson::{doc, Document};
use mongodb::Collection;
use tokio::net::TcpStream;

use crate::common::{self, db_name, raw_session, read_frame};

#[tokio::test]
async fn connections_over_the_limit_are_closed_at_accept() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.max_connections = 2;
    let proxy = common::start(config).await;
    let _a = raw_session(&proxy).await;
    let _b = raw_session(&proxy).await;
    let mut c = TcpStream::connect(proxy.addr).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut c)).await;
    assert!(
        matches!(closed, Ok(None)),
        "the third connection is refused"
    );
    drop(_a);
    // A slot frees up once a session ends.
    let mut ok = false;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut s = TcpStream::connect(proxy.addr).await.unwrap();
        common::write_frame(
            &mut s,
            &common::op_msg(1, 0, doc! {"hello": 1, "$db": "admin"}),
        )
        .await;
        if tokio::time::timeout(Duration::from_secs(5), read_frame(&mut s))
            .await
            .unwrap()
            .is_some()
        {
            ok = true;
            break;
        }
    }
    assert!(ok);
}

#[tokio::test]
async fn shutdown_lets_the_request_in_flight_finish_and_refuses_new_connections() {
    let proxy = common::proxy().await;
    let client = common::via_proxy(&proxy).await;
    let c: Collection<Document> = client
        .database(&db_name("shutdown", "proxy"))
        .collection("c");
    // Warm the pool so the insert goes out at once on an open connection.
    c.drop().await.unwrap();
    let docs: Vec<Document> = (0..20_000)
        .map(|i| doc! {"_id": i, "pad": "x".repeat(100)})
        .collect();
    let insert = tokio::spawn({
        let c = c.clone();
        async move { c.insert_many(docs).await }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    proxy.shutdown.trigger();
    let drained = proxy.shutdown.drain(Duration::from_secs(60));
    let result = insert.await.unwrap();
    assert!(drained.await, "sessions finished within the grace period");
    let inserted = result
        .expect("the request in flight completed")
        .inserted_ids
        .len();
    assert_eq!(inserted, 20_000);
    assert!(
        TcpStream::connect(proxy.addr).await.is_err(),
        "no longer accepting"
    );
    let n = common::direct()
        .await
        .database(&db_name("shutdown", "proxy"))
        .collection::<Document>("c")
        .count_documents(doc! {})
        .await
        .unwrap();
    assert_eq!(n, 20_000);
}

#[test]
fn the_binary_prints_its_address_and_exits_cleanly_on_sigterm() {
    let (mut child, addr) = common::serve_process(&["--log-format", "json"]);
    let addr = addr.as_str();
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    assert_ne!(port, 0);
    std::net::TcpStream::connect(addr).expect("accepting");
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut logs = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut logs).unwrap();
    let first = logs.lines().next().expect("a log line");
    let parsed: serde_json::Value = serde_json::from_str(first).expect("JSON logs");
    assert!(parsed.get("level").is_some(), "{first}");
}

#[test]
fn invalid_configuration_is_refused_with_the_setting_named() {
    let out = Command::new(env!("CARGO_BIN_EXE_laconic"))
        .args([
            "serve",
            "--listen",
            "nowhere",
            "--upstream",
            "mongodb://127.0.0.1:1/",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("proxy.listen"), "{err}");
}

/// SIGTERM while eight clients write through a tokenizing proxy: the
/// process exits cleanly within its grace period, each client's last
/// write gets an answer or a network error (never a hang), and every
/// write that was acknowledged is there afterwards, under its names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_a_write_load_loses_no_acknowledged_write() {
    let dir = common::temp_dir("sigterm-load");
    let config = dir.join("laconic.toml");
    std::fs::write(&config, "[proxy.tokenize]\nmin_len = 4\n").unwrap();
    let (mut child, addr) = common::serve_process(&[
        "--config",
        config.to_str().unwrap(),
        "--shutdown-grace-ms",
        "5000",
    ]);
    let mut stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || std::io::copy(&mut stderr, &mut std::io::sink()));
    let db = db_name("shutdown", "load");
    let uri = format!("mongodb://{addr}/?retryWrites=false&serverSelectionTimeoutMS=2000");
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let c: Collection<Document> = client.database(&db).collection("c");
    c.drop().await.unwrap();
    let mut writers = Vec::new();
    for w in 0..8i64 {
        let c = c.clone();
        writers.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for i in 0.. {
                let id = w * 1_000_000 + i;
                let write = c.insert_one(doc! {"_id": id, "writer_number": w, "sequence": i});
                match tokio::time::timeout(Duration::from_secs(30), write).await {
                    Ok(Ok(_)) => acked.push(id),
                    Ok(Err(_)) => break,
                    Err(_) => panic!("a write through a stopping proxy hung"),
                }
            }
            acked
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    let began = std::time::Instant::now();
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    let exited = began.elapsed();
    assert!(status.success(), "{status}");
    assert!(
        exited < Duration::from_secs(15),
        "exited {exited:?} after SIGTERM"
    );
    let mut acked = Vec::new();
    for w in writers {
        acked.extend(w.await.unwrap());
    }
    assert!(
        acked.len() >= 8,
        "only {} writes before the signal",
        acked.len()
    );

    // Read back through another proxy with the same settings.
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    let proxy = common::start(config).await;
    let via = mongodb::Client::with_uri_str(format!("mongodb://{}/", proxy.addr))
        .await
        .unwrap();
    let stored: Vec<Document> = common::by_id(&via.database(&db).collection("c"), doc! {}).await;
    let ids: std::collections::HashSet<i64> =
        stored.iter().map(|d| d.get_i64("_id").unwrap()).collect();
    let missing: Vec<_> = acked.iter().filter(|id| !ids.contains(id)).collect();
    assert!(missing.is_empty(), "acknowledged but missing: {missing:?}");
    assert!(stored
        .iter()
        .all(|d| d.contains_key("writer_number") && d.contains_key("sequence")));
    c.drop().await.ok();
}
