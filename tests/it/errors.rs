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
