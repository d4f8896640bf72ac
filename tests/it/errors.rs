//! Bad input closes only the connection that sent it; upstream failures
//! become error replies, never hangs.

use std::time::Duration;

use bson::doc;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::common::{self, body, op_msg, raw_session, read_frame, write_frame};

async fn ping_ok(s: &mut TcpStream, id: i32) {
    write_frame(s, &op_msg(id, 0, doc! {"ping": 1, "$db": "admin"})).await;
    let reply = tokio::time::timeout(Duration::from_secs(10), read_frame(s))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reply.header.response_to, id);
    assert_eq!(body(&reply).get_f64("ok").unwrap(), 1.0);
}

#[tokio::test]
async fn a_malformed_frame_closes_that_connection_alone() {
    let proxy = common::proxy().await;
    let mut good = raw_session(&proxy).await;
    let bad_inputs: Vec<Vec<u8>> = vec![
        vec![3, 0, 0, 0],                       // length under 16
        (60_000_000i32).to_le_bytes().to_vec(), // over maxMessageSizeBytes
        {
            let mut b = op_msg(1, 1 << 7, doc! {"ping": 1}).to_bytes().to_vec(); // unknown required bit
            b.truncate(b.len());
            b
        },
        {
            let mut b = op_msg(1, 0, doc! {"ping": 1}).to_bytes().to_vec();
            b[21] = 0x40; // body length overruns the message
            b
        },
        {
            let mut b = op_msg(1, 0, doc! {"ping": 1}).to_bytes().to_vec();
            b[12..16].copy_from_slice(&2005i32.to_le_bytes()); // a removed legacy opcode
            b
        },
    ];
    for (i, input) in bad_inputs.into_iter().enumerate() {
        let mut bad = raw_session(&proxy).await;
        bad.write_all(&input).await.unwrap();
        let closed = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut bad)).await;
        assert!(
            matches!(closed, Ok(None)),
            "input {i}: connection not closed"
        );
        ping_ok(&mut good, 100 + i as i32).await;
    }
}

#[tokio::test]
async fn an_unreachable_upstream_gives_an_error_reply_not_a_hang() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut config = common::proxy_config(&format!("mongodb://127.0.0.1:{port}/"));
    config.connect_timeout_ms = 1000;
    let proxy = common::start(config).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    write_frame(&mut s, &op_msg(7, 0, doc! {"hello": 1, "$db": "admin"})).await;
    let reply = tokio::time::timeout(Duration::from_secs(10), read_frame(&mut s))
        .await
        .unwrap()
        .unwrap();
    let b = body(&reply);
    assert_eq!(reply.header.response_to, 7);
    assert_eq!(b.get_f64("ok").unwrap(), 0.0);
    assert_eq!(b.get_i32("code").unwrap(), 6);
    assert_eq!(b.get_str("codeName").unwrap(), "HostUnreachable");
    assert!(b.get_str("errmsg").unwrap().contains(&port.to_string()));
    assert!(
        read_frame(&mut s).await.is_none(),
        "then the connection closes"
    );

    // A driver sees a prompt error too.
    let client = mongodb::Client::with_uri_str(format!(
        "mongodb://{}/?serverSelectionTimeoutMS=2000",
        proxy.addr
    ))
    .await
    .unwrap();
    let started = std::time::Instant::now();
    assert!(client
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .is_err());
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[tokio::test]
async fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.handshake_timeout_ms = 300;
    let proxy = common::start(config).await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut s)).await;
    assert!(matches!(closed, Ok(None)));
}

/// Slow-loris: connections that send their first message a byte at a time
/// are closed at the handshake timeout, each costing only its own
/// connection, while another client is served throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trickling_clients_are_closed_at_the_handshake_timeout_and_others_are_served() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.handshake_timeout_ms = 500;
    let proxy = common::start(config).await;
    let mut witness = raw_session(&proxy).await;
    let hello = op_msg(1, 0, doc! {"hello": 1, "$db": "admin"}).to_bytes();
    let started = std::time::Instant::now();
    let lorises: Vec<_> = (0..300)
        .map(|_| {
            let (addr, hello) = (proxy.addr, hello.clone());
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.unwrap();
                for b in hello.iter() {
                    if s.write_all(&[*b]).await.is_err() {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // Closed by the proxy, with no reply, before the message is whole.
                assert!(read_frame(&mut s).await.is_none());
                started.elapsed()
            })
        })
        .collect();
    let mut pings = 0;
    while lorises.iter().any(|l| !l.is_finished()) {
        ping_ok(&mut witness, 2).await;
        pings += 1;
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "a slow client was never closed"
        );
    }
    let mut slowest = Duration::ZERO;
    for l in lorises {
        slowest = slowest.max(l.await.unwrap());
    }
    eprintln!("300 trickling clients closed within {slowest:?}; the witness got {pings} answers meanwhile");
    assert!(pings > 0);
    // A whole hello takes 50 ms a byte, far past the 500 ms allowed.
    assert!(slowest < Duration::from_secs(hello.len() as u64 * 50 / 1000));
}
