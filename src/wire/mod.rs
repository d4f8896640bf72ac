//! ②③ The sans-IO wire codec: bytes in, typed messages out, and back.
//!
//! Nothing in here touches a socket. [`Frame::parse`] turns one complete
//! message into a [`Frame`]; [`Frame::to_bytes`] turns it back. A frame that
//! was parsed and not changed keeps its original bytes, so forwarding it costs
//! no re-encoding; [`Frame::encode_parts`] re-serializes from the parsed parts
//! and is what the round-trip property tests and the fuzz target check.

mod codec;
mod header;
mod legacy;
mod op_compressed;
mod op_msg;
mod reader;
pub mod spare;

pub use codec::{send, CodecError, FrameReader, MessageCodec, Pace, UNSHARED_MESSAGE};
pub use header::{Header, OpCode, HEADER_LEN, MAX_MESSAGE_SIZE};
pub use legacy::{OpQuery, OpReply};
pub use op_compressed::{may_compress, Compressor, OpCompressed};
pub use op_msg::{DocumentSequence, Documents, MsgBody, MsgFlags, OpMsg, Section};

use std::sync::Arc;

use bytes::Bytes;

/// Why a message could not be decoded. Each of these closes the connection
/// that sent it, and only that connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("message length {0} is shorter than a header")]
    TooShort(i64),
    #[error("message length {length} exceeds the maximum of {max} bytes")]
    TooLarge { length: usize, max: usize },
    #[error("message ends inside the {0}")]
    Truncated(&'static str),
    #[error("unsupported opcode {0}")]
    UnknownOpCode(i32),
    #[error("a client may not send OP_REPLY")]
    ReplyFromClient,
    #[error("OP_MSG sets unknown required flag bits {0:#06x}")]
    UnknownRequiredFlags(u32),
    #[error("OP_MSG checksum mismatch (declared {declared:#010x}, computed {computed:#010x})")]
    ChecksumMismatch { declared: u32, computed: u32 },
    #[error("OP_MSG section of unknown kind {0}")]
    UnknownSectionKind(u8),
    #[error("OP_MSG has no body section")]
    MissingBody,
    #[error("OP_MSG has more than one body section")]
    MultipleBodies,
    #[error("invalid document sequence: {0}")]
    BadSequence(&'static str),
    #[error("invalid BSON document in the {0}")]
    InvalidDocument(&'static str),
    #[error("invalid string in the {0}")]
    InvalidCString(&'static str),
    #[error("trailing bytes after the {0}")]
    TrailingBytes(&'static str),
    #[error("unknown compressor id {0}")]
    UnknownCompressor(u8),
    #[error("OP_COMPRESSED wraps another OP_COMPRESSED")]
    NestedCompression,
    #[error("decompressed size {actual} differs from the declared {declared}")]
    DecompressedSizeMismatch { declared: usize, actual: usize },
    #[error("compression failed: {0}")]
    Compression(String),
}

/// The body of a message, by opcode.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Msg(OpMsg),
    Query(OpQuery),
    Reply(OpReply),
    Compressed(OpCompressed),
}

/// One complete wire message. A clone shares the parsed message and the
/// bytes (a request forwarded as it came is a clone of the one the
/// exchange keeps).
#[derive(Clone, Debug)]
pub struct Frame {
    pub header: Header,
    message: Arc<Message>,
    /// The bytes this frame was parsed from, while it is unchanged.
    raw: Option<Bytes>,
}

impl PartialEq for Frame {
    fn eq(&self, other: &Frame) -> bool {
        self.header.request_id == other.header.request_id
            && self.header.response_to == other.header.response_to
            && self.message == other.message
    }
}

impl Frame {
    /// Parses one complete message (header included). The declared length must
    /// equal `raw.len()` and lie within the protocol's bounds.
    pub fn parse(raw: Bytes, max: usize) -> Result<Frame, WireError> {
        let header = Header::parse(&raw)?;
        let len = Header::check_length(header.length, max)?;
        if len != raw.len() {
            return Err(WireError::Truncated("message"));
        }
        let message = match OpCode::from_i32(header.op_code)? {
            OpCode::Msg => Message::Msg(OpMsg::parse(&raw)?),
            OpCode::Query => Message::Query(OpQuery::parse(&raw)?),
            OpCode::Reply => Message::Reply(OpReply::parse(&raw)?),
            OpCode::Compressed => Message::Compressed(OpCompressed::parse(&raw)?),
        };
        Ok(Frame {
            header,
            message: Arc::new(message),
            raw: Some(raw),
        })
    }

    /// A new frame; its length and opcode are derived when it is encoded.
    pub fn new(request_id: i32, response_to: i32, message: Message) -> Frame {
        let op_code = match &message {
            Message::Msg(_) => OpCode::Msg,
            Message::Query(_) => OpCode::Query,
            Message::Reply(_) => OpCode::Reply,
            Message::Compressed(_) => OpCode::Compressed,
        } as i32;
        let mut frame = Frame {
            header: Header {
                length: 0,
                request_id,
                response_to,
                op_code,
            },
            message: Arc::new(message),
            raw: None,
        };
        frame.header.length = frame.encoded_len() as i32;
        frame
    }

    pub fn message(&self) -> &Message {
        &self.message
    }

    /// A frame with this one's ids whose message is an OP_MSG of `flags`
    /// (its checksum left out) and one body section: the buffer `body` was
    /// written in is the frame's bytes, so sending it copies nothing more.
    pub fn with_body(&self, flags: MsgFlags, body: MsgBody) -> Frame {
        Frame::of_body(self.header.request_id, self.header.response_to, flags, body)
    }

    /// An OP_MSG of `flags` and `body`, sent from the buffer the body was
    /// written in.
    pub fn of_body(request_id: i32, response_to: i32, flags: MsgFlags, body: MsgBody) -> Frame {
        let flags = flags.without_checksum();
        let mut buf = body.into_buffer();
        let header = Header {
            length: buf.len() as i32,
            request_id,
            response_to,
            op_code: OpCode::Msg as i32,
        };
        let mut prefix = Vec::with_capacity(MsgBody::AT);
        header.write(&mut prefix);
        prefix.extend_from_slice(&flags.0.to_le_bytes());
        prefix.push(0);
        buf[..MsgBody::AT].copy_from_slice(&prefix);
        let raw = Bytes::from(buf);
        let message = Message::Msg(OpMsg {
            flags,
            sections: vec![Section::Body(raw.slice(MsgBody::AT..))],
            checksum: None,
        });
        Frame {
            header,
            message: Arc::new(message),
            raw: Some(raw),
        }
    }

    /// A frame with this one's ids and another message, re-encoded when
    /// sent (this one is left as it is).
    pub fn with_message(&self, message: Message) -> Frame {
        Frame::new(self.header.request_id, self.header.response_to, message)
    }

    pub fn into_message(self) -> Message {
        Arc::unwrap_or_clone(self.message)
    }

    /// The OP_MSG inside, if this is one.
    pub fn op_msg(&self) -> Option<&OpMsg> {
        match &*self.message {
            Message::Msg(m) => Some(m),
            _ => None,
        }
    }

    /// `true` when the sender expects no reply to this message, or (for a
    /// reply) when more replies follow.
    pub fn more_to_come(&self) -> bool {
        self.op_msg().is_some_and(|m| m.flags.more_to_come())
    }

    /// `true` when the request accepts a stream of replies.
    pub fn exhaust_allowed(&self) -> bool {
        self.op_msg().is_some_and(|m| m.flags.exhaust_allowed())
    }

    /// The command name of a request, for OP_MSG and OP_QUERY commands.
    pub fn command_name(&self) -> Option<&str> {
        match &*self.message {
            Message::Msg(m) => m.command_name(),
            Message::Query(q) => q.command_name(),
            _ => None,
        }
    }

    /// This frame compressed with `compressor`, keeping its ids (a checksum
    /// inside covers the header rebuilt from them on decompression).
    pub fn compress(&self, compressor: Compressor) -> Result<Frame, WireError> {
        let c = OpCompressed::compress(self, compressor)?;
        Ok(Frame::new(
            self.header.request_id,
            self.header.response_to,
            Message::Compressed(c),
        ))
    }

    /// The frame's bytes: the original ones while unchanged.
    pub fn to_bytes(&self) -> Bytes {
        match &self.raw {
            Some(raw) => raw.clone(),
            None => {
                let mut out = Vec::with_capacity(self.encoded_len());
                self.encode_parts(&mut out);
                Bytes::from(out)
            }
        }
    }

    /// [`Frame::to_bytes`], consuming the frame: its original bytes are
    /// moved out rather than shared.
    pub fn into_bytes(self) -> Bytes {
        match self.raw {
            Some(raw) => raw,
            None => self.to_bytes(),
        }
    }

    /// Serializes the frame from its parsed parts, ignoring any original bytes.
    pub fn encode_parts(&self, dst: &mut Vec<u8>) {
        let (id, to) = (self.header.request_id, self.header.response_to);
        match &*self.message {
            Message::Msg(m) => m.encode(id, to, dst),
            Message::Query(q) => q.encode(id, to, dst),
            Message::Reply(r) => r.encode(id, to, dst),
            Message::Compressed(c) => c.encode(id, to, dst),
        }
    }

    fn encoded_len(&self) -> usize {
        match &*self.message {
            Message::Msg(m) => m.encoded_len(),
            _ => {
                let mut v = Vec::new();
                self.encode_parts(&mut v);
                v.len()
            }
        }
    }
}

/// The round-trip check shared by the fuzz target and the property tests:
/// any input that parses must re-encode to exactly the same bytes, and a
/// compressed message must decompress to a frame that does the same.
pub fn fuzz_roundtrip(data: &[u8]) {
    let raw = Bytes::copy_from_slice(data);
    let Ok(frame) = Frame::parse(raw, MAX_MESSAGE_SIZE) else {
        return;
    };
    let mut out = Vec::new();
    frame.encode_parts(&mut out);
    assert_eq!(out, data, "re-encoding changed the message");
    if let Message::Compressed(c) = frame.message() {
        if let Ok(inner) = c.decompress(&frame.header, MAX_MESSAGE_SIZE) {
            let mut again = Vec::new();
            inner.encode_parts(&mut again);
            assert_eq!(again, inner.to_bytes(), "decompressed frame changed");
        }
    }
}

#[cfg(test)]
mod tests;
