//! The thin tokio-util shell around the sans-IO codec.

use bytes::{Buf, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

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
        let bytes = frame.into_bytes();
        if dst.is_empty() {
            // The usual case, one frame per write: a frame encoded just now
            // is handed over as the write buffer, not copied into it.
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

impl Encoder<Bytes> for MessageCodec {
    type Error = CodecError;

    fn encode(&mut self, bytes: Bytes, dst: &mut BytesMut) -> Result<(), CodecError> {
        dst.extend_from_slice(&bytes);
        Ok(())
    }
}
