//! The handshake: drivers stay on the proxy, see a capped wire version, and
//! may compress their leg whatever the upstream supports.

use std::sync::Arc;

use parking_lot::Mutex;

use bson::{doc, Document, RawDocumentBuf};
use futures::TryStreamExt;
use laconic::rewrite::MAX_WIRE_VERSION;
use laconic::wire::{Compressor, Message, MsgFlags, OpQuery, OpReply};
use mongodb::event::cmap::CmapEvent;
use mongodb::event::sdam::SdamEvent;
use mongodb::event::EventHandler;
use mongodb::options::{ClientOptions, Compressor as DriverCompressor};
use mongodb::Client;
use tokio::net::TcpStream;

use crate::common::{self, body, db_name, op_msg, raw_session, read_frame, write_frame};

#[tokio::test]
async fn a_driver_without_direct_connection_stays_on_the_proxy() {
    let proxy = common::proxy().await;
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut opts = ClientOptions::parse(format!("mongodb://{}/?retryWrites=false", proxy.addr))
        .await
        .unwrap();
    let s1 = seen.clone();
    opts.sdam_event_handler = Some(EventHandler::callback(move |e: SdamEvent| {
        if let SdamEvent::ServerDescriptionChanged(e) = e {
            s1.lock().push(e.address.to_string());
        }
    }));
    let s2 = seen.clone();
    opts.cmap_event_handler = Some(EventHandler::callback(move |e: CmapEvent| {
        if let CmapEvent::ConnectionCreated(e) = e {
            s2.lock().push(e.address.to_string());
        }
    }));
    let client = Client::with_options(opts).unwrap();
    let c = client
        .database(&db_name("topo", "proxy"))
        .collection::<Document>("c");
    c.insert_one(doc! {"x": 1}).await.unwrap();
    let _: Vec<Document> = c.find(doc! {}).await.unwrap().try_collect().await.unwrap();
    let seen = seen.lock().clone();
    assert!(!seen.is_empty());
    assert!(
        seen.iter().all(|a| a == &proxy.addr.to_string()),
        "the driver contacted {seen:?}, not only {}",
        proxy.addr
    );
}

#[tokio::test]
async fn hello_presents_a_mongos_with_a_capped_wire_version() {
    let proxy = common::proxy().await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    write_frame(&mut s, &op_msg(1, 0, doc! {"hello": 1, "$db": "admin"})).await;
    let reply = body(&read_frame(&mut s).await.unwrap());
    assert_eq!(reply.get_str("msg").unwrap(), "isdbgrid");
    for field in [
        "hosts",
        "setName",
        "me",
        "primary",
        "secondary",
        "setVersion",
    ] {
        assert!(!reply.contains_key(field), "{field} leaked: {reply}");
    }
    let direct = common::direct()
        .await
        .database("admin")
        .run_command(doc! {"hello": 1})
        .await
        .unwrap();
    let upstream_max = direct.get_i32("maxWireVersion").unwrap();
    assert_eq!(
        reply.get_i32("maxWireVersion").unwrap(),
        upstream_max.min(MAX_WIRE_VERSION)
    );
    assert_eq!(
        reply.get_i32("maxBsonObjectSize").unwrap(),
        direct.get_i32("maxBsonObjectSize").unwrap()
    );
}

#[tokio::test]
async fn legacy_op_query_is_master_gets_an_op_reply_and_other_op_queries_an_error() {
    let proxy = common::proxy().await;
    let mut s = TcpStream::connect(proxy.addr).await.unwrap();
    let query = |q: Document, ns: &str| {
        laconic::wire::Frame::new(
            5,
            0,
            Message::Query(OpQuery {
                flags: 0,
                full_collection_name: ns.into(),
                number_to_skip: 0,
                number_to_return: -1,
                query: RawDocumentBuf::from_document(&q)
                    .unwrap()
                    .into_bytes()
                    .into(),
                return_fields_selector: None,
            }),
        )
    };
    write_frame(
        &mut s,
        &query(
            doc! {"isMaster": 1, "helloOk": true, "compression": ["zlib"]},
            "admin.$cmd",
        ),
    )
    .await;
    let reply = read_frame(&mut s).await.unwrap();
    assert_eq!(reply.header.response_to, 5);
    let Message::Reply(OpReply { .. }) = reply.message() else {
        panic!("expected OP_REPLY")
    };
    let b = body(&reply);
    assert_eq!(b.get_str("msg").unwrap(), "isdbgrid");
    assert_eq!(
        b.get_array("compression").unwrap(),
        &vec![bson::Bson::from("zlib")]
    );
    assert!(!b.contains_key("hosts"));

    write_frame(&mut s, &query(doc! {"find": "c"}, "test.$cmd")).await;
    let b = body(&read_frame(&mut s).await.unwrap());
    assert_eq!(b.get_f64("ok").unwrap(), 0.0);
    assert_eq!(b.get_i32("code").unwrap(), 352);
    assert_eq!(b.get_str("codeName").unwrap(), "UnsupportedOpQueryCommand");
    assert!(b.get_str("errmsg").unwrap().contains("find"));

    // The connection is still usable.
    write_frame(&mut s, &op_msg(9, 0, doc! {"ping": 1, "$db": "admin"})).await;
    assert_eq!(
        body(&read_frame(&mut s).await.unwrap())
            .get_f64("ok")
            .unwrap(),
        1.0
    );
}

#[tokio::test]
async fn drivers_may_compress_their_leg_with_each_compressor() {
    let proxy = common::proxy().await;
    for (name, compressor) in [
        ("snappy", DriverCompressor::Snappy),
        ("zlib", DriverCompressor::Zlib { level: None }),
        ("zstd", DriverCompressor::Zstd { level: None }),
    ] {
        let mut opts = ClientOptions::parse(format!("mongodb://{}/?retryWrites=false", proxy.addr))
            .await
            .unwrap();
        opts.compressors = Some(vec![compressor]);
        let client = Client::with_options(opts).unwrap();
        let c = client
            .database(&db_name("compress", name))
            .collection::<Document>("c");
        c.drop().await.unwrap();
        let docs: Vec<Document> = (0..500)
            .map(|i| doc! {"_id": i, "text": "compressible ".repeat(20)})
            .collect();
        c.insert_many(docs.clone()).await.unwrap();
        let read: Vec<Document> = common::by_id(&c, doc! {}).await;
        assert_eq!(read, docs, "{name}");
    }
}

#[tokio::test]
async fn a_compressed_request_gets_a_reply_compressed_the_same_way() {
    let proxy = common::proxy().await;
    for c in Compressor::SUPPORTED {
        let mut s = raw_session(&proxy).await;
        let ping = op_msg(3, 0, doc! {"ping": 1, "$db": "admin"})
            .compress(c)
            .unwrap();
        write_frame(&mut s, &ping).await;
        let reply = read_frame(&mut s).await.unwrap();
        let Message::Compressed(oc) = reply.message() else {
            panic!("{c:?}: reply not compressed")
        };
        assert_eq!(oc.compressor().unwrap(), c);
        let inner = oc
            .decompress(&reply.header, laconic::wire::MAX_MESSAGE_SIZE)
            .unwrap();
        assert_eq!(body(&inner).get_f64("ok").unwrap(), 1.0);
    }
}

#[tokio::test]
async fn checksummed_messages_are_verified() {
    let proxy = common::proxy().await;
    let mut s = raw_session(&proxy).await;
    let ping = op_msg(
        4,
        MsgFlags::CHECKSUM_PRESENT,
        doc! {"ping": 1, "$db": "admin"},
    );
    write_frame(&mut s, &ping).await;
    assert_eq!(
        body(&read_frame(&mut s).await.unwrap())
            .get_f64("ok")
            .unwrap(),
        1.0
    );

    let mut bytes = ping.to_bytes().to_vec();
    let n = bytes.len();
    bytes[n - 6] ^= 0x20; // inside the body, covered by the checksum
    tokio::io::AsyncWriteExt::write_all(&mut s, &bytes)
        .await
        .unwrap();
    assert!(
        read_frame(&mut s).await.is_none(),
        "a bad checksum closes the connection"
    );
}

/// The compressors the upstream accepts, asked on a fresh connection.
async fn upstream_compressors() -> Vec<String> {
    let mut s = TcpStream::connect(&common::upstream().host).await.unwrap();
    write_frame(
        &mut s,
        &op_msg(
            1,
            0,
            doc! {"hello": 1, "compression": ["zstd", "snappy", "zlib"], "$db": "admin"},
        ),
    )
    .await;
    let reply = body(&read_frame(&mut s).await.unwrap());
    reply
        .get_array("compression")
        .map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn the_upstream_leg_is_compressed_only_when_the_upstream_accepts_it() {
    let accepted = upstream_compressors().await;
    let tap = common::tap(common::upstream().host.clone()).await;
    let mut config = common::proxy_config(&format!("mongodb://{}/", tap.addr));
    config.upstream_compressors = vec!["zstd".into(), "snappy".into(), "zlib".into()];
    let proxy = common::start(config).await;
    let client = common::via_proxy(&proxy).await;
    let c = client
        .database(&db_name("upcomp", "proxy"))
        .collection::<Document>("c");
    c.drop().await.unwrap();
    let docs: Vec<Document> = (0..200)
        .map(|i| doc! {"_id": i, "s": "abc".repeat(30)})
        .collect();
    c.insert_many(docs.clone()).await.unwrap();
    let read: Vec<Document> = common::by_id(&c, doc! {}).await;
    assert_eq!(read, docs);

    let opcodes = tap.opcodes();
    assert_eq!(
        opcodes.first(),
        Some(&2013),
        "the handshake itself is never compressed"
    );
    let compressed = opcodes.iter().filter(|&&o| o == 2012).count();
    if accepted.is_empty() {
        assert_eq!(
            compressed, 0,
            "the upstream accepts no compressor, so nothing is compressed"
        );
    } else {
        assert!(
            compressed > 0,
            "the upstream accepts {accepted:?}, so requests are compressed: {opcodes:?}"
        );
    }
}
