use bson::{doc, RawDocumentBuf};
use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use tokio_util::codec::Decoder;

use super::*;

fn raw(doc: bson::Document) -> Bytes {
    Bytes::from(RawDocumentBuf::from_document(&doc).unwrap().into_bytes())
}

fn encode(frame: &Frame) -> Vec<u8> {
    let mut v = Vec::new();
    frame.encode_parts(&mut v);
    v
}

fn msg(flags: u32, sections: Vec<Section>) -> Frame {
    Frame::new(
        7,
        0,
        Message::Msg(OpMsg {
            flags: MsgFlags(flags),
            sections,
            checksum: None,
        }),
    )
}

/// An insert of `documents`, in a document sequence.
fn insert(documents: Vec<Bytes>) -> Frame {
    msg(
        0,
        vec![
            Section::Body(raw(doc! {"insert": "c", "$db": "d"})),
            Section::Sequence(DocumentSequence::of("documents".into(), documents).unwrap()),
        ],
    )
}

#[test]
fn op_msg_with_sequence_round_trips() {
    let frame = insert(vec![raw(doc! {"_id": 1}), raw(doc! {"_id": 2, "a": "b"})]);
    let bytes = encode(&frame);
    let parsed = Frame::parse(Bytes::from(bytes.clone()), MAX_MESSAGE_SIZE).unwrap();
    assert_eq!(parsed, frame);
    assert_eq!(encode(&parsed), bytes);
    assert_eq!(parsed.command_name(), Some("insert"));
    let seq: Vec<_> = parsed.op_msg().unwrap().sequences().collect();
    assert_eq!(seq[0].documents().count(), 2);
}

/// A parsed sequence is one slice of the frame it came in, its documents
/// read in place; one made from bytes is checked document by document.
#[test]
fn a_sequence_is_one_slice_of_its_frame_and_checks_the_bytes_it_is_given() {
    let docs = [raw(doc! {"_id": 1}), raw(doc! {"_id": 2, "a": "b"})];
    let bytes = Bytes::from(encode(&insert(docs.to_vec())));
    let parsed = Frame::parse(bytes.clone(), MAX_MESSAGE_SIZE).unwrap();
    let seq = parsed.op_msg().unwrap().sequences().next().unwrap();
    let within = bytes.as_ptr_range();
    assert!(within.contains(&seq.bytes().as_ptr()));
    let read: Vec<&[u8]> = seq.documents().collect();
    assert_eq!(read, [&docs[0][..], &docs[1][..]]);

    let both = [&docs[0][..], &docs[1][..]].concat();
    let made = |b: &[u8]| DocumentSequence::new("documents".into(), Bytes::copy_from_slice(b));
    assert_eq!(made(&both).unwrap(), *seq);
    assert_eq!(made(&[]).unwrap().documents().count(), 0);
    // Cut short, a document's length overruns what is left.
    assert!(made(&both[..both.len() - 1]).is_err());
    // A document that does not end with its NUL.
    let mut unterminated = both.clone();
    *unterminated.last_mut().unwrap() = 1;
    assert!(made(&unterminated).is_err());
    // A length below the smallest document.
    let mut short = both.clone();
    short[..4].copy_from_slice(&4i32.to_le_bytes());
    assert!(made(&short).is_err());
}

#[test]
fn a_clone_shares_the_parsed_message_and_its_bytes() {
    let frame = insert((0..100).map(|i| raw(doc! {"_id": i})).collect());
    let parsed = Frame::parse(Bytes::from(encode(&frame)), MAX_MESSAGE_SIZE).unwrap();
    let forwarded = parsed.clone();
    // A request forwarded as it came is a clone of the one the exchange
    // keeps: its sections are not copied again.
    assert!(std::ptr::eq(parsed.message(), forwarded.message()));
    assert_eq!(forwarded.into_bytes(), parsed.to_bytes());
    // The message taken out of a frame no other holds is the same message.
    assert_eq!(parsed.clone().into_message(), *parsed.message());
    assert_eq!(parsed.into_message(), *frame.message());
}

#[test]
fn a_body_written_in_place_is_the_frame_it_makes() {
    let reply = doc! {"cursor": {"firstBatch": [{"_id": 1, "name": "a"}], "id": 0i64}, "ok": 1.0};
    let doc = RawDocumentBuf::from_document(&reply).unwrap();
    let mut buf = MsgBody::buffer(doc.as_bytes().len());
    buf.extend_from_slice(doc.as_bytes());
    let body = MsgBody::new(buf).unwrap();
    assert_eq!(body.document().as_bytes(), doc.as_bytes());
    let request = msg(0, vec![Section::Body(raw(doc! {"find": "c", "$db": "d"}))]);
    let flags = MsgFlags(MsgFlags::CHECKSUM_PRESENT | MsgFlags::MORE_TO_COME);
    let framed = request.with_body(flags, body.clone());
    // The same bytes as the message built from parts and encoded, and the
    // same frame once parsed back; the checksum is left out.
    let mut expected = OpMsg::from_body(flags, &doc);
    assert_eq!(expected.flags, MsgFlags(MsgFlags::MORE_TO_COME));
    let built = request.with_message(Message::Msg(expected.clone()));
    assert_eq!(framed.to_bytes(), Bytes::from(encode(&built)));
    assert_eq!(framed.header.length as usize, framed.to_bytes().len());
    assert_eq!(framed, built);
    let parsed = Frame::parse(framed.to_bytes(), MAX_MESSAGE_SIZE).unwrap();
    assert_eq!(parsed, framed);
    expected.set_body(doc.clone());
    assert_eq!(framed.op_msg().unwrap(), &expected);
    // `copy_of` makes the same body.
    assert_eq!(
        request.with_body(flags, MsgBody::copy_of(&doc)).to_bytes(),
        framed.to_bytes()
    );
}

/// A frame made in place is written from its own buffer, not copied into
/// the write buffer, and the buffer is kept for a later reply, its bytes as
/// they were sent; a forwarded frame's buffer (a slice of what was read,
/// which holds more) is not.
#[tokio::test]
async fn a_frame_made_in_place_is_sent_without_a_copy_and_its_buffer_kept() {
    use super::spare::{Spares, SMALLEST};
    use tokio::io::AsyncReadExt;
    use tokio_util::codec::Framed;
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let mut conn = Framed::new(a, MessageCodec::new(MAX_MESSAGE_SIZE));
    let spares = Spares::new();
    let doc = RawDocumentBuf::from_document(&doc! {"n": "x".repeat(SMALLEST), "ok": 1.0}).unwrap();
    let request = msg(0, vec![Section::Body(raw(doc! {"ping": 1, "$db": "d"}))]);
    let framed = request.with_body(MsgFlags(0), MsgBody::copy_of(&doc));
    let (at, expected) = {
        let bytes = framed.to_bytes();
        (bytes.as_ptr() as usize, bytes.to_vec())
    };
    super::codec::send_keeping(&mut conn, framed, &spares)
        .await
        .unwrap();
    assert!(conn.write_buffer().is_empty());
    let kept = spares.take(SMALLEST);
    assert_eq!(kept.as_ptr() as usize, at, "the frame's own buffer");
    assert_eq!(kept, expected);
    // Forwarded as it came: written, not kept.
    let mut read = expected.clone();
    read.extend_from_slice(b"the next message");
    let read = Bytes::from(read);
    let forwarded = Frame::parse(read.slice(..expected.len()), MAX_MESSAGE_SIZE).unwrap();
    super::codec::send_keeping(&mut conn, forwarded, &spares)
        .await
        .unwrap();
    assert!(spares.take(SMALLEST).is_empty());
    drop(conn);
    let mut got = Vec::new();
    b.read_to_end(&mut got).await.unwrap();
    assert_eq!(got, [expected.clone(), expected].concat());
}

#[test]
fn a_body_buffer_must_hold_one_document() {
    let doc = RawDocumentBuf::from_document(&doc! {"ok": 1.0}).unwrap();
    let written = |bytes: &[u8]| {
        let mut buf = MsgBody::buffer(bytes.len());
        buf.extend_from_slice(bytes);
        MsgBody::new(buf)
    };
    assert!(written(doc.as_bytes()).is_ok());
    assert!(written(&[]).is_err());
    assert!(written(&doc.as_bytes()[..doc.as_bytes().len() - 1]).is_err());
    let mut twice = doc.as_bytes().to_vec();
    twice.extend_from_slice(doc.as_bytes());
    assert!(written(&twice).is_err());
    assert!(MsgBody::new(vec![0; 3]).is_err());
}

#[test]
fn checksum_is_verified_and_recomputed() {
    let frame = msg(
        MsgFlags::CHECKSUM_PRESENT,
        vec![Section::Body(raw(doc! {"ping": 1, "$db": "admin"}))],
    );
    let mut bytes = encode(&frame);
    let parsed = Frame::parse(Bytes::from(bytes.clone()), MAX_MESSAGE_SIZE).unwrap();
    assert!(parsed.op_msg().unwrap().checksum.is_some());
    assert_eq!(encode(&parsed), bytes);
    // Flip one bit of the body: the checksum no longer matches.
    let n = bytes.len();
    bytes[n - 8] ^= 1;
    assert!(matches!(
        Frame::parse(Bytes::from(bytes), MAX_MESSAGE_SIZE),
        Err(WireError::ChecksumMismatch { .. })
    ));
}

#[test]
fn unknown_required_flag_is_an_error_and_optional_bits_are_kept() {
    let bad = encode(&msg(1 << 5, vec![Section::Body(raw(doc! {"ping": 1}))]));
    assert_eq!(
        Frame::parse(Bytes::from(bad), MAX_MESSAGE_SIZE).unwrap_err(),
        WireError::UnknownRequiredFlags(1 << 5)
    );
    let ok = encode(&msg(
        1 << 20 | MsgFlags::EXHAUST_ALLOWED,
        vec![Section::Body(raw(doc! {"ping": 1}))],
    ));
    let parsed = Frame::parse(Bytes::from(ok.clone()), MAX_MESSAGE_SIZE).unwrap();
    assert!(parsed.exhaust_allowed());
    assert_eq!(encode(&parsed), ok);
}

#[test]
fn sizes_are_checked_before_allocating() {
    let mut codec = MessageCodec::new(MAX_MESSAGE_SIZE);
    let mut buf = BytesMut::from(&15i32.to_le_bytes()[..]);
    assert!(codec.decode(&mut buf).is_err());
    let mut buf = BytesMut::from(&48_000_001i32.to_le_bytes()[..]);
    assert!(codec.decode(&mut buf).is_err());
    assert!(
        buf.capacity() < 1_000_000,
        "nothing was reserved for an oversized message"
    );
    let mut buf = BytesMut::from(&(-5i32).to_le_bytes()[..]);
    assert!(codec.decode(&mut buf).is_err());
    // A section that claims more bytes than the message holds.
    let mut bytes = encode(&msg(0, vec![Section::Body(raw(doc! {"ping": 1}))]));
    bytes[21] = 0x7f;
    assert!(Frame::parse(Bytes::from(bytes), MAX_MESSAGE_SIZE).is_err());
}

#[test]
fn codec_waits_for_a_whole_frame_and_reports_eof_inside_one() {
    let bytes = encode(&msg(0, vec![Section::Body(raw(doc! {"ping": 1}))]));
    let mut codec = MessageCodec::new(MAX_MESSAGE_SIZE);
    let mut buf = BytesMut::from(&bytes[..10]);
    assert!(codec.decode(&mut buf).unwrap().is_none());
    assert!(codec.decode_eof(&mut buf).is_err());
    let mut buf = BytesMut::from(&bytes[..]);
    buf.extend_from_slice(&bytes);
    assert!(codec.decode(&mut buf).unwrap().is_some());
    assert!(codec.decode(&mut buf).unwrap().is_some());
    assert!(codec.decode_eof(&mut buf).unwrap().is_none());
}

#[test]
fn legacy_query_and_reply_round_trip() {
    let q = Frame::new(
        1,
        0,
        Message::Query(OpQuery {
            flags: 4,
            full_collection_name: "admin.$cmd".into(),
            number_to_skip: 0,
            number_to_return: -1,
            query: raw(
                doc! {"$query": {"isMaster": 1, "helloOk": true}, "$readPreference": {"mode": "primary"}},
            ),
            return_fields_selector: None,
        }),
    );
    let bytes = encode(&q);
    let parsed = Frame::parse(Bytes::from(bytes.clone()), MAX_MESSAGE_SIZE).unwrap();
    assert_eq!(parsed.command_name(), Some("isMaster"));
    assert_eq!(encode(&parsed), bytes);

    let r = Frame::new(
        2,
        1,
        Message::Reply(OpReply::single(
            &RawDocumentBuf::from_document(&doc! {"ok": 1.0}).unwrap(),
        )),
    );
    let bytes = encode(&r);
    let parsed = Frame::parse(Bytes::from(bytes.clone()), MAX_MESSAGE_SIZE).unwrap();
    assert_eq!(parsed, r);
    assert_eq!(encode(&parsed), bytes);
}

#[test]
fn every_compressor_round_trips_and_sizes_are_checked() {
    let frame = msg(
        0,
        vec![Section::Body(raw(
            doc! {"find": "c", "filter": {"a": "x".repeat(500)}, "$db": "d"},
        ))],
    );
    for c in Compressor::SUPPORTED.into_iter().chain([Compressor::Noop]) {
        let compressed = frame.compress(c).unwrap();
        let bytes = encode(&compressed);
        let parsed = Frame::parse(Bytes::from(bytes.clone()), MAX_MESSAGE_SIZE).unwrap();
        assert_eq!(encode(&parsed), bytes);
        let Message::Compressed(oc) = parsed.message() else {
            panic!()
        };
        let inner = oc.decompress(&parsed.header, MAX_MESSAGE_SIZE).unwrap();
        assert_eq!(inner, frame, "{c:?}");

        let mut lying = oc.clone();
        lying.uncompressed_size -= 1;
        assert!(
            lying.decompress(&parsed.header, MAX_MESSAGE_SIZE).is_err(),
            "{c:?}"
        );
        let mut huge = oc.clone();
        huge.uncompressed_size = i32::MAX;
        assert!(matches!(
            huge.decompress(&parsed.header, MAX_MESSAGE_SIZE),
            Err(WireError::TooLarge { .. })
        ));
    }
}

#[test]
fn commands_that_must_not_be_compressed() {
    for c in [
        "hello",
        "isMaster",
        "ismaster",
        "saslStart",
        "saslContinue",
        "createUser",
    ] {
        assert!(!may_compress(c), "{c}");
    }
    assert!(may_compress("find"));
}

fn arb_document() -> impl Strategy<Value = Bytes> {
    let leaf = prop_oneof![
        any::<i32>().prop_map(bson::Bson::Int32),
        any::<i64>().prop_map(bson::Bson::Int64),
        ".{0,12}".prop_map(bson::Bson::String),
        any::<bool>().prop_map(bson::Bson::Boolean),
        Just(bson::Bson::Null),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(bson::Bson::Array),
            prop::collection::vec(("[a-z$.]{1,6}", inner), 0..4)
                .prop_map(|kv| { bson::Bson::Document(kv.into_iter().collect()) }),
        ]
    });
    prop::collection::vec(("\\PC{1,8}", value), 0..6)
        .prop_map(|kv| raw(kv.into_iter().collect::<bson::Document>()))
}

fn arb_op_msg() -> impl Strategy<Value = Frame> {
    let section = prop_oneof![(
        "[a-zA-Z]{1,10}",
        prop::collection::vec(arb_document(), 0..4)
    )
        .prop_map(|(identifier, documents)| {
            Section::Sequence(DocumentSequence::of(identifier, documents).unwrap())
        }),];
    (
        prop::sample::select(vec![0u32, 1, 2, 3, 1 << 16, 1 << 16 | 1, 1 << 31]),
        arb_document(),
        prop::collection::vec(section, 0..3),
        0usize..3,
        any::<i32>(),
        any::<i32>(),
    )
        .prop_map(|(flags, body, mut sections, body_at, id, to)| {
            sections.insert(body_at.min(sections.len()), Section::Body(body));
            Frame::new(
                id,
                to,
                Message::Msg(OpMsg {
                    flags: MsgFlags(flags),
                    sections,
                    checksum: None,
                }),
            )
        })
}

proptest! {
    #[test]
    fn decoding_then_encoding_reproduces_the_input(frame in arb_op_msg()) {
        let bytes = encode(&frame);
        let parsed = Frame::parse(Bytes::from(bytes.clone()), MAX_MESSAGE_SIZE).unwrap();
        prop_assert_eq!(encode(&parsed), bytes.clone());
        fuzz_roundtrip(&bytes);
    }

    #[test]
    fn compressed_frames_round_trip(frame in arb_op_msg(), c in 0usize..3) {
        let c = Compressor::SUPPORTED[c];
        let compressed = frame.compress(c).unwrap();
        let bytes = encode(&compressed);
        fuzz_roundtrip(&bytes);
        let parsed = Frame::parse(Bytes::from(bytes), MAX_MESSAGE_SIZE).unwrap();
        let Message::Compressed(oc) = parsed.message() else { panic!() };
        prop_assert_eq!(oc.decompress(&parsed.header, MAX_MESSAGE_SIZE).unwrap(), frame);
    }

    #[test]
    fn mutated_frames_never_panic(frame in arb_op_msg(), edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6)) {
        let mut bytes = encode(&frame);
        for (i, b) in edits {
            let i = i.index(bytes.len());
            bytes[i] = b;
        }
        fuzz_roundtrip(&bytes);
        let mut codec = MessageCodec::new(MAX_MESSAGE_SIZE);
        let mut buf = BytesMut::from(&bytes[..]);
        let _ = codec.decode(&mut buf);
    }
}

#[tokio::test]
async fn send_writes_shared_and_owned_frames_whole_and_in_order() {
    use tokio::io::AsyncReadExt;
    use tokio_util::codec::Framed;
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let mut conn = Framed::new(a, MessageCodec::new(MAX_MESSAGE_SIZE));
    // A frame forwarded as it came: a slice of the buffer it was read
    // into, which still holds the bytes after it.
    let first = encode(&msg(0, vec![Section::Body(raw(doc! {"n": 1, "$db": "d"}))]));
    let mut read = first.clone();
    read.extend_from_slice(b"the next message");
    let read = Bytes::from(read);
    let shared = Frame::parse(read.slice(..first.len()), MAX_MESSAGE_SIZE).unwrap();
    // A frame whose bytes nothing else holds.
    let doc = RawDocumentBuf::from_document(&doc! {"ok": 1.0}).unwrap();
    let owned = shared.with_body(MsgFlags(0), MsgBody::copy_of(&doc));
    let second = owned.to_bytes().to_vec();
    send(&mut conn, shared).await.unwrap();
    assert!(conn.write_buffer().is_empty());
    send(&mut conn, owned).await.unwrap();
    assert!(conn.write_buffer().is_empty());
    drop(conn);
    let mut got = Vec::new();
    b.read_to_end(&mut got).await.unwrap();
    assert_eq!(&read[first.len()..], b"the next message");
    assert_eq!(got, [first, second].concat());
}
