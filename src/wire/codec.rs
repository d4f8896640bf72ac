//! The thin tokio-util shell around the sans-IO codec.

use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::SinkExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::codec::{Decoder, Encoder, Framed};

use super::{Frame, Header, OpCode, WireError, HEADER_LEN};
use crate::budget::{Budget, Share};

/// Frames a byte stream into [`Frame`]s, checking the declared length before
/// buffering a message.
#[derive(Clone, Copy, Debug)]
pub struct MessageCodec {
    max_message_size: usize,
}

impl MessageCodec {
    pub fn new(max_message_size: usize) -> Self {
        MessageCodec { max_message_size }
    }
}

/// Errors from a framed stream: the peer sent something undecodable, or I/O failed.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error(transparent)]
    Wire(#[from] WireError),
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

impl Decoder for MessageCodec {
    type Item = Frame;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        let Some(declared) = declared(src) else {
            return Ok(None);
        };
        let len = Header::check_length(declared, self.max_message_size)?;
        if src.len() < len {
            // Reserve for the rest of this message only; the length is bounded above.
            src.reserve(len - src.len());
            return Ok(None);
        }
        if len < HEADER_LEN {
            return Err(WireError::TooShort(len as i64).into());
        }
        let raw = src.split_to(len).freeze();
        Ok(Some(Frame::parse(raw, self.max_message_size)?))
    }

    fn decode_eof(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        match self.decode(src)? {
            Some(frame) => Ok(Some(frame)),
            None if src.is_empty() => Ok(None),
            None => {
                let left = src.remaining();
                src.clear();
                Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("connection closed inside a message ({left} bytes buffered)"),
                )
                .into())
            }
        }
    }
}

impl Encoder<Frame> for MessageCodec {
    type Error = CodecError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), CodecError> {
        self.encode(frame.into_bytes(), dst)
    }
}

/// A message's complete bytes.
impl Encoder<Bytes> for MessageCodec {
    type Error = CodecError;

    /// Used only behind bytes still in the write buffer ([`send`] writes a
    /// frame from its own bytes otherwise).
    fn encode(&mut self, bytes: Bytes, dst: &mut BytesMut) -> Result<(), CodecError> {
        dst.extend_from_slice(&bytes);
        Ok(())
    }
}

/// Sends one frame and flushes it, written from its own bytes rather than
/// copied into the write buffer first (unless that holds something still);
/// a buffer nothing else holds then goes to [`super::spare`], for a later
/// reply to be written in. The frame is written whole before this returns:
/// callers await it to its end, as a send dropped halfway would leave the
/// peer inside a message.
pub async fn send<S: AsyncWrite + Unpin>(
    conn: &mut Framed<S, MessageCodec>,
    frame: Frame,
) -> Result<(), CodecError> {
    send_keeping(conn, frame, super::spare::pool()).await
}

/// [`send`], its buffer kept in `spares`.
pub(super) async fn send_keeping<S: AsyncWrite + Unpin>(
    conn: &mut Framed<S, MessageCodec>,
    frame: Frame,
    spares: &super::spare::Spares,
) -> Result<(), CodecError> {
    let bytes = frame.into_bytes();
    if !conn.write_buffer().is_empty() {
        return conn.send(bytes).await;
    }
    let io = conn.get_mut();
    io.write_all(&bytes).await?;
    io.flush().await?;
    spares.give(bytes);
    Ok(())
}

/// A message larger than this is read within a share of the budget for
/// messages being read (`proxy.max_read_bytes`), taken once its header
/// says how large it is: until the budget has room for it, nothing more
/// of it is read (the driver's writes wait in the socket's buffers).
pub const UNSHARED_MESSAGE: usize = 64 << 10;

/// What is read at once, at most, while no message's length is known yet.
const READ_CHUNK: usize = 8 << 10;

/// The bytes of an OP_COMPRESSED header that say what it decompresses to:
/// the message header, `originalOpcode` and `uncompressedSize`.
const COMPRESSED_PREFIX: usize = HEADER_LEN + 8;

/// Reads messages from a peer: the bytes of the message being read, and
/// its share of a memory budget. Only the rest of that message is read
/// once its length is known, so nothing after it is buffered outside it.
///
/// A driver's request ([`FrameReader::new`]) holds a share of its length
/// while it is read, for a time: it must arrive by its deadline ([`Pace`]),
/// or the connection is closed. A client that sends the header of a large
/// message and stops would otherwise hold its share for as long as it
/// keeps the connection, and a few such headers would hold the whole
/// budget from every other client's large messages.
///
/// An upstream reply ([`FrameReader::for_replies`]) holds a share of what
/// reading, rewriting and writing it back holds, and hands it on with the
/// frame ([`FrameReader::next_held`]) to whoever does that.
#[derive(Debug)]
pub struct FrameReader {
    codec: MessageCodec,
    sharing: Sharing,
    buf: BytesMut,
    held: Option<(Share, Option<Instant>)>,
}

/// What a large message's share counts, and for how long it may be held
/// while the message is read.
#[derive(Clone, Copy, Debug)]
enum Sharing {
    /// Its length, by a deadline.
    Requests(Pace),
    /// `per_byte` times its size once decompressed, for as long as it takes.
    Replies { per_byte: usize },
}

/// How fast a message holding a share of the read budget must arrive (or
/// a reply holding one be taken): by `grace` plus its length at
/// `min_rate` bytes a second, from when its share was granted.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    pub grace: Duration,
    pub min_rate: u64,
}

impl Pace {
    /// The time `len` bytes may take.
    pub fn time_for(&self, len: usize) -> Duration {
        let rate = self.min_rate.max(1) as f64;
        self.grace + Duration::from_secs_f64(len as f64 / rate)
    }
}

impl FrameReader {
    /// A reader of a driver's requests, at `pace`.
    pub fn new(max_message_size: usize, pace: Pace) -> FrameReader {
        FrameReader::sharing(max_message_size, Sharing::Requests(pace))
    }

    /// A reader of upstream replies, each over [`UNSHARED_MESSAGE`]
    /// holding `per_byte` times its size once decompressed.
    pub fn for_replies(max_message_size: usize, per_byte: usize) -> FrameReader {
        FrameReader::sharing(max_message_size, Sharing::Replies { per_byte })
    }

    fn sharing(max_message_size: usize, sharing: Sharing) -> FrameReader {
        FrameReader {
            codec: MessageCodec::new(max_message_size),
            sharing,
            buf: BytesMut::new(),
            held: None,
        }
    }

    /// The next message from `io`, `None` at the end of the stream; its
    /// share is given back as it leaves. Cancellation safe: what was read
    /// stays buffered here, and so does the share taken for it.
    pub async fn next<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        budget: &Budget,
    ) -> Option<Result<Frame, CodecError>> {
        Some(self.next_held(io, budget).await?.map(|(frame, _)| frame))
    }

    /// The next message and the share it holds, if it is large (as
    /// [`FrameReader::next`]).
    pub async fn next_held<R: AsyncRead + Unpin>(
        &mut self,
        io: &mut R,
        budget: &Budget,
    ) -> Option<Result<(Frame, Option<Share>), CodecError>> {
        loop {
            let declared = match declared(&self.buf) {
                None => None,
                Some(len) => match Header::check_length(len, self.codec.max_message_size) {
                    Ok(len) => Some(len),
                    Err(e) => return Some(Err(e.into())),
                },
            };
            let room = match declared {
                Some(len) if self.buf.len() >= len => {
                    let share = self.held.take().map(|(share, _)| share);
                    let whole = self.codec.decode(&mut self.buf).transpose();
                    return whole.map(|read| read.map(|frame| (frame, share)));
                }
                Some(len) if len > UNSHARED_MESSAGE && self.held.is_none() => {
                    // Large: the rest of it within a share, once the
                    // budget has room for it.
                    match self.share_for(len) {
                        Some(bytes) => {
                            let share = budget.share(bytes).await;
                            let deadline = match self.sharing {
                                Sharing::Requests(pace) => {
                                    Some(Instant::now() + pace.time_for(len))
                                }
                                Sharing::Replies { .. } => None,
                            };
                            self.held = Some((share, deadline));
                            len - self.buf.len()
                        }
                        // Its share depends on more of its header.
                        None => COMPRESSED_PREFIX - self.buf.len(),
                    }
                }
                Some(len) => len - self.buf.len(),
                None => {
                    // What is left of the last chunk (of a buffer that held
                    // a large message: no more than a chunk), or a new one.
                    if self.buf.capacity() == self.buf.len() {
                        self.buf.reserve(READ_CHUNK);
                    }
                    (self.buf.capacity() - self.buf.len()).min(READ_CHUNK)
                }
            };
            self.buf.reserve(room);
            let deadline = self.held.as_ref().and_then(|(_, deadline)| *deadline);
            let mut room = (&mut self.buf).limit(room);
            let read = io.read_buf(&mut room);
            let read = match deadline {
                None => read.await,
                Some(deadline) => match tokio::time::timeout_at(deadline, read).await {
                    Ok(read) => read,
                    Err(_) => return Some(Err(self.late().into())),
                },
            };
            match read {
                Ok(0) => {
                    let end = self.codec.decode_eof(&mut self.buf).transpose()?;
                    return Some(end.map(|frame| (frame, None)));
                }
                Ok(_) => {}
                Err(e) => return Some(Err(e.into())),
            }
        }
    }

    /// The share a message of `len` bytes takes, once enough of its header
    /// is in to say.
    fn share_for(&self, len: usize) -> Option<usize> {
        match self.sharing {
            Sharing::Requests(_) => Some(len),
            Sharing::Replies { per_byte } => {
                let opcode = i32::from_le_bytes(self.buf.get(12..16)?.try_into().ok()?);
                let size = if opcode == OpCode::Compressed as i32 {
                    let inner = i32::from_le_bytes(self.buf.get(20..24)?.try_into().ok()?);
                    let inner = usize::try_from(inner).unwrap_or(0);
                    len.max(inner.min(self.codec.max_message_size) + HEADER_LEN)
                } else {
                    len
                };
                Some(size.saturating_mul(per_byte))
            }
        }
    }

    /// Why a message that missed its deadline ends its connection.
    fn late(&self) -> std::io::Error {
        let len = declared(&self.buf).unwrap_or_default();
        let pace = match self.sharing {
            Sharing::Requests(pace) => format!(
                "; proxy.min_read_rate is {} bytes a second, after {:?}",
                pace.min_rate, pace.grace
            ),
            Sharing::Replies { .. } => String::new(),
        };
        std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!(
                "a message of {len} bytes did not arrive in time ({} of them did{pace})",
                self.buf.len(),
            ),
        )
    }
}

/// The length a buffered message declares, once its first 4 bytes are in.
fn declared(buf: &[u8]) -> Option<i32> {
    Some(i32::from_le_bytes(buf.get(..4)?.try_into().ok()?))
}

#[cfg(test)]
mod tests {
    use bson::doc;
    use tokio::io::AsyncWriteExt;

    use super::*;
    use crate::wire::{Message, MsgFlags, OpMsg, MAX_MESSAGE_SIZE};

    /// Time enough for any message here.
    const PATIENT: Pace = Pace {
        grace: Duration::from_secs(600),
        min_rate: 1,
    };

    /// The bytes of a `ping` carrying a string of `pad` bytes.
    fn message(pad: usize) -> Vec<u8> {
        let body = bson::RawDocumentBuf::from_document(
            &doc! {"ping": 1, "pad": "x".repeat(pad), "$db": "admin"},
        )
        .unwrap();
        let frame = Frame::new(
            1,
            0,
            Message::Msg(OpMsg::from_body(MsgFlags::default(), &body)),
        );
        frame.into_bytes().to_vec()
    }

    /// A large message is read within a share of the budget, and only once
    /// the budget has room for it; a small one needs none; nothing past a
    /// message is read with it; a read dropped halfway loses nothing.
    #[tokio::test]
    async fn large_messages_are_read_within_the_budget() {
        let budget = Budget::new(1 << 20);
        let (big, small) = (message(600 << 10), message(100));
        let reader = || FrameReader::new(MAX_MESSAGE_SIZE, PATIENT);
        let (mut a, mut a_io) = (reader(), tokio::io::duplex(1 << 20));
        let (mut b, mut b_io) = (reader(), tokio::io::duplex(1 << 20));

        // A's message, all but its last byte, then a small one after it.
        a_io.0.write_all(&big[..big.len() - 1]).await.unwrap();
        let read = tokio::time::timeout(Duration::from_millis(50), a.next(&mut a_io.1, &budget));
        assert!(read.await.is_err(), "a message not yet whole");
        assert_eq!(a.buf.len(), big.len() - 1, "read while it waited");
        assert_eq!(budget.held(), big.len().div_ceil(1024) * 1024);

        // B's message, as large: the budget has no room for it yet, so no
        // more of it than its first chunk is read.
        b_io.0.write_all(&big).await.unwrap();
        let read = tokio::time::timeout(Duration::from_millis(50), b.next(&mut b_io.1, &budget));
        assert!(read.await.is_err(), "waits for room");
        assert!(b.buf.len() <= READ_CHUNK, "{} bytes buffered", b.buf.len());

        // A's message ends: its share is given back, and B's is read.
        let mut rest = big[big.len() - 1..].to_vec();
        rest.extend_from_slice(&small);
        a_io.0.write_all(&rest).await.unwrap();
        let frame = a.next(&mut a_io.1, &budget).await.unwrap().unwrap();
        assert_eq!(frame.into_bytes().len(), big.len());
        assert!(a.buf.is_empty(), "nothing past the message was read");
        assert_eq!(budget.held(), 0);
        let frame = b.next(&mut b_io.1, &budget).await.unwrap().unwrap();
        assert_eq!(frame.into_bytes().len(), big.len());

        // The small one needs no share. A's buffer held a large message:
        // while B's share is held, no more than a chunk of A's next large
        // one is read into it.
        let frame = a.next(&mut a_io.1, &budget).await.unwrap().unwrap();
        assert_eq!(frame.into_bytes().to_vec(), small);
        let held_by_b = budget.share(1 << 20).await;
        a_io.0.write_all(&big).await.unwrap();
        let read = tokio::time::timeout(Duration::from_millis(50), a.next(&mut a_io.1, &budget));
        assert!(read.await.is_err(), "waits for room");
        assert!(a.buf.len() <= READ_CHUNK, "{} bytes buffered", a.buf.len());
        drop(held_by_b);
        let frame = a.next(&mut a_io.1, &budget).await.unwrap().unwrap();
        assert_eq!(frame.into_bytes().len(), big.len());
        drop(a_io.0);
        assert!(a.next(&mut a_io.1, &budget).await.is_none());
        assert_eq!(budget.held(), 0);
    }

    /// A reply reader's share is `per_byte` times the reply's size, what
    /// a compressed one decompresses to for OP_COMPRESSED, and is handed
    /// out with the frame: held until its taker drops it. A small reply
    /// takes none.
    #[tokio::test]
    async fn a_reply_hands_its_share_to_its_taker() {
        let budget = Budget::new(64 << 20);
        let big = message(600 << 10);
        let mut r = FrameReader::for_replies(MAX_MESSAGE_SIZE, 4);
        let (mut to, mut from) = tokio::io::duplex(1 << 20);
        to.write_all(&big).await.unwrap();
        let (frame, share) = r.next_held(&mut from, &budget).await.unwrap().unwrap();
        assert_eq!(frame.into_bytes().len(), big.len());
        assert_eq!(budget.held(), (4 * big.len()).div_ceil(1024) * 1024);
        drop(share);
        assert_eq!(budget.held(), 0);

        // Compressed to almost nothing, it counts what it decompresses to.
        let frame = Frame::parse(big.clone().into(), MAX_MESSAGE_SIZE).unwrap();
        let packed = frame
            .compress(crate::wire::Compressor::Zstd)
            .unwrap()
            .into_bytes();
        assert!(packed.len() < 16 << 10, "{} bytes", packed.len());
        // Large once decompressed, but not on the wire: no share.
        to.write_all(&packed).await.unwrap();
        let (_, share) = r.next_held(&mut from, &budget).await.unwrap().unwrap();
        assert!(share.is_none());

        // Past 64 KiB on the wire, its share counts its decompressed size.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let noise: String = (0..200_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                char::from(b'a' + (x % 26) as u8)
            })
            .collect();
        let body = bson::RawDocumentBuf::from_document(
            &doc! {"ping": 1, "noise": noise, "pad": "x".repeat(4 << 20), "$db": "admin"},
        )
        .unwrap();
        let frame = Frame::new(
            1,
            0,
            Message::Msg(OpMsg::from_body(MsgFlags::default(), &body)),
        );
        let plain = frame.to_bytes().len();
        let packed = frame
            .compress(crate::wire::Compressor::Zstd)
            .unwrap()
            .into_bytes();
        assert!(
            packed.len() > UNSHARED_MESSAGE && packed.len() < plain / 4,
            "{} bytes of {plain}",
            packed.len()
        );
        let (mut to, mut from) = tokio::io::duplex(1 << 20);
        let sender = tokio::spawn(async move { to.write_all(&packed).await.map(|_| to) });
        let (_, share) = r.next_held(&mut from, &budget).await.unwrap().unwrap();
        assert!(share.is_some());
        assert_eq!(budget.held(), (4 * plain).div_ceil(1024) * 1024);
        drop(share);
        drop(sender.await.unwrap().unwrap());
    }

    /// A message holding a share must arrive by its deadline: one whose
    /// bytes stop coming ends its connection, with its share given back;
    /// one that keeps coming at the pace is read, however long it takes.
    #[tokio::test]
    async fn a_large_message_that_stops_coming_ends_its_connection() {
        let budget = Budget::new(1 << 20);
        // 0.2 s of grace, then 1 MiB a second: 600 KiB in about 0.8 s.
        let pace = Pace {
            grace: Duration::from_millis(200),
            min_rate: 1 << 20,
        };
        let big = message(600 << 10);
        let (mut r, (mut to, mut from)) = (
            FrameReader::new(MAX_MESSAGE_SIZE, pace),
            tokio::io::duplex(1 << 20),
        );
        to.write_all(&big[..300 << 10]).await.unwrap();
        let started = Instant::now();
        let e = r.next(&mut from, &budget).await.unwrap().unwrap_err();
        let waited = started.elapsed();
        assert!(
            matches!(&e, CodecError::Io(e) if e.kind() == std::io::ErrorKind::TimedOut),
            "{e}"
        );
        assert!(e.to_string().contains("min_read_rate"), "{e}");
        assert!(
            (Duration::from_millis(780)..Duration::from_secs(3)).contains(&waited),
            "{waited:?}"
        );
        drop(r);
        assert_eq!(budget.held(), 0);

        // At about 4.8 MB a second, it arrives whole.
        let (mut r, (mut to, mut from)) = (
            FrameReader::new(MAX_MESSAGE_SIZE, pace),
            tokio::io::duplex(1 << 20),
        );
        let sender = tokio::spawn(async move {
            for chunk in big.chunks(48 << 10) {
                to.write_all(chunk).await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            to
        });
        let frame = r.next(&mut from, &budget).await.unwrap().unwrap();
        assert_eq!(frame.into_bytes().len(), 600 * 1024 + message(0).len());
        drop(sender.await.unwrap());
    }
}
