//! The thin tokio-util shell around the sans-IO codec.

use bytes::{Buf, Bytes, BytesMut};
use futures::SinkExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio_util::codec::{Decoder, Encoder, Framed};

use super::{Frame, Header, WireError, HEADER_LEN};

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
        if src.len() < 4 {
            return Ok(None);
        }
        let declared = i32::from_le_bytes([src[0], src[1], src[2], src[3]]);
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

    fn encode(&mut self, bytes: Bytes, dst: &mut BytesMut) -> Result<(), CodecError> {
        if dst.is_empty() {
            // The usual case, one message per write: bytes nothing else
            // holds (a frame encoded just now) are handed over as the
            // write buffer, not copied into it.
            match bytes.try_into_mut() {
                Ok(owned) => *dst = owned,
                Err(shared) => dst.extend_from_slice(&shared),
            }
        } else {
            dst.extend_from_slice(&bytes);
        }
        Ok(())
    }
}

/// Sends one frame and flushes it. A frame whose bytes are shared (one
/// forwarded as it came: a slice of the buffer it was read into) is
/// written from those bytes rather than copied into the write buffer
/// first; any other goes through the encoder, which takes its buffer over.
/// Either way the frame is written whole before this returns: callers await
/// it to its end, as a send dropped halfway would leave the peer inside a
/// message.
pub async fn send<S: AsyncWrite + Unpin>(
    conn: &mut Framed<S, MessageCodec>,
    frame: Frame,
) -> Result<(), CodecError> {
    let bytes = frame.into_bytes();
    if bytes.is_unique() || !conn.write_buffer().is_empty() {
        return conn.send(bytes).await;
    }
    let io = conn.get_mut();
    io.write_all(&bytes).await?;
    io.flush().await?;
    Ok(())
}
