//! The 16-byte `MsgHeader` that starts every MongoDB wire message.

use super::WireError;

/// Length of a message header in bytes.
pub const HEADER_LEN: usize = 16;

/// The largest message a MongoDB server accepts or sends (`maxMessageSizeBytes`).
pub const MAX_MESSAGE_SIZE: usize = 48_000_000;

/// The opcodes Laconic understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpCode {
    /// OP_REPLY, the reply to an OP_QUERY.
    Reply = 1,
    /// OP_QUERY, used by older drivers for the first `isMaster`.
    Query = 2004,
    /// OP_COMPRESSED, a compressed wrapper around another message.
    Compressed = 2012,
    /// OP_MSG, the message every modern driver and server speaks.
    Msg = 2013,
}

impl OpCode {
    /// Maps a raw opcode to a known one.
    pub fn from_i32(code: i32) -> Result<Self, WireError> {
        match code {
            1 => Ok(OpCode::Reply),
            2004 => Ok(OpCode::Query),
            2012 => Ok(OpCode::Compressed),
            2013 => Ok(OpCode::Msg),
            other => Err(WireError::UnknownOpCode(other)),
        }
    }
}

/// A message header: four little-endian int32s.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Total message length, header included.
    pub length: i32,
    /// The sender's identifier for this message.
    pub request_id: i32,
    /// For replies, the `request_id` of the request being answered.
    pub response_to: i32,
    /// The raw opcode.
    pub op_code: i32,
}

impl Header {
    /// Reads a header from the first 16 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Header, WireError> {
        if buf.len() < HEADER_LEN {
            return Err(WireError::Truncated("message header"));
        }
        let word = |i: usize| i32::from_le_bytes([buf[i], buf[i + 1], buf[i + 2], buf[i + 3]]);
        Ok(Header {
            length: word(0),
            request_id: word(4),
            response_to: word(8),
            op_code: word(12),
        })
    }

    /// Appends the header's 16 bytes to `dst`.
    pub fn write(&self, dst: &mut Vec<u8>) {
        dst.extend_from_slice(&self.length.to_le_bytes());
        dst.extend_from_slice(&self.request_id.to_le_bytes());
        dst.extend_from_slice(&self.response_to.to_le_bytes());
        dst.extend_from_slice(&self.op_code.to_le_bytes());
    }

    /// Checks a declared message length against the protocol's bounds.
    pub fn check_length(length: i32, max: usize) -> Result<usize, WireError> {
        let len = usize::try_from(length).map_err(|_| WireError::TooShort(i64::from(length)))?;
        if len < HEADER_LEN {
            return Err(WireError::TooShort(len as i64));
        }
        if len > max {
            return Err(WireError::TooLarge { length: len, max });
        }
        Ok(len)
    }
}
