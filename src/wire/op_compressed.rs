//! OP_COMPRESSED: `originalOpcode | uncompressedSize | compressorId | bytes`,
//! and the three compressors (snappy, zlib, zstd).

use std::io::Read;

use bytes::Bytes;

use super::reader::Reader;
use super::{Frame, Header, OpCode, WireError, HEADER_LEN};

/// A compressor named in the `compression` handshake field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Compressor {
    Noop,
    Snappy,
    Zlib,
    Zstd,
}

impl Compressor {
    /// The compressors Laconic can use, in its order of preference.
    pub const SUPPORTED: [Compressor; 3] = [Compressor::Zstd, Compressor::Snappy, Compressor::Zlib];

    pub fn id(self) -> u8 {
        match self {
            Compressor::Noop => 0,
            Compressor::Snappy => 1,
            Compressor::Zlib => 2,
            Compressor::Zstd => 3,
        }
    }

    pub fn from_id(id: u8) -> Result<Compressor, WireError> {
        match id {
            0 => Ok(Compressor::Noop),
            1 => Ok(Compressor::Snappy),
            2 => Ok(Compressor::Zlib),
            3 => Ok(Compressor::Zstd),
            other => Err(WireError::UnknownCompressor(other)),
        }
    }

    /// The handshake name (`"snappy"`, `"zlib"`, `"zstd"`, `"noop"`).
    pub fn name(self) -> &'static str {
        match self {
            Compressor::Noop => "noop",
            Compressor::Snappy => "snappy",
            Compressor::Zlib => "zlib",
            Compressor::Zstd => "zstd",
        }
    }

    pub fn from_name(name: &str) -> Option<Compressor> {
        match name {
            "noop" => Some(Compressor::Noop),
            "snappy" => Some(Compressor::Snappy),
            "zlib" => Some(Compressor::Zlib),
            "zstd" => Some(Compressor::Zstd),
            _ => None,
        }
    }

    fn compress(self, data: &[u8]) -> Result<Vec<u8>, WireError> {
        let fail = |e: std::io::Error| WireError::Compression(e.to_string());
        match self {
            Compressor::Noop => Ok(data.to_vec()),
            Compressor::Snappy => snap::raw::Encoder::new()
                .compress_vec(data)
                .map_err(|e| WireError::Compression(e.to_string())),
            Compressor::Zlib => {
                use std::io::Write;
                let mut enc =
                    flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(6));
                enc.write_all(data).map_err(fail)?;
                enc.finish().map_err(fail)
            }
            Compressor::Zstd => zstd::bulk::compress(data, 3).map_err(fail),
        }
    }

    /// Decompresses `data`, refusing to produce more than `declared` bytes.
    fn decompress(self, data: &[u8], declared: usize) -> Result<Vec<u8>, WireError> {
        let fail = |e: std::io::Error| WireError::Compression(e.to_string());
        let out = match self {
            Compressor::Noop => data.to_vec(),
            Compressor::Snappy => {
                let len = snap::raw::decompress_len(data)
                    .map_err(|e| WireError::Compression(e.to_string()))?;
                if len != declared {
                    return Err(WireError::DecompressedSizeMismatch {
                        declared,
                        actual: len,
                    });
                }
                snap::raw::Decoder::new()
                    .decompress_vec(data)
                    .map_err(|e| WireError::Compression(e.to_string()))?
            }
            Compressor::Zlib => {
                let mut out = Vec::with_capacity(declared);
                flate2::read::ZlibDecoder::new(data)
                    .take(declared as u64 + 1)
                    .read_to_end(&mut out)
                    .map_err(fail)?;
                out
            }
            Compressor::Zstd => {
                // `capacity` bounds the output: a larger frame is an error.
                zstd::bulk::decompress(data, declared + 1).map_err(fail)?
            }
        };
        if out.len() != declared {
            return Err(WireError::DecompressedSizeMismatch {
                declared,
                actual: out.len(),
            });
        }
        Ok(out)
    }
}

/// An OP_COMPRESSED message, kept compressed until asked.
#[derive(Clone, Debug, PartialEq)]
pub struct OpCompressed {
    pub original_op_code: i32,
    pub uncompressed_size: i32,
    pub compressor_id: u8,
    pub payload: Bytes,
}

impl OpCompressed {
    pub fn parse(frame: &Bytes) -> Result<OpCompressed, WireError> {
        let mut r = Reader::new(frame);
        r.take(HEADER_LEN, "message header")?;
        let original_op_code = r.i32("OP_COMPRESSED originalOpcode")?;
        let uncompressed_size = r.i32("OP_COMPRESSED uncompressedSize")?;
        let compressor_id = r.u8("OP_COMPRESSED compressorId")?;
        let start = r.position();
        Ok(OpCompressed {
            original_op_code,
            uncompressed_size,
            compressor_id,
            payload: frame.slice(start..),
        })
    }

    pub fn compressor(&self) -> Result<Compressor, WireError> {
        Compressor::from_id(self.compressor_id)
    }

    /// Decompresses into the original frame. The declared size is checked
    /// against `max` before anything is allocated, and against the output after.
    pub fn decompress(&self, header: &Header, max: usize) -> Result<Frame, WireError> {
        let op = OpCode::from_i32(self.original_op_code)?;
        if op == OpCode::Compressed {
            return Err(WireError::NestedCompression);
        }
        let declared = usize::try_from(self.uncompressed_size)
            .map_err(|_| WireError::TooShort(i64::from(self.uncompressed_size)))?;
        let total = Header::check_length(
            i32::try_from(declared.saturating_add(HEADER_LEN)).unwrap_or(i32::MAX),
            max,
        )?;
        let body = self.compressor()?.decompress(&self.payload, declared)?;
        let mut raw = Vec::with_capacity(total);
        Header {
            length: total as i32,
            request_id: header.request_id,
            response_to: header.response_to,
            op_code: self.original_op_code,
        }
        .write(&mut raw);
        raw.extend_from_slice(&body);
        Frame::parse(Bytes::from(raw), max)
    }

    /// Compresses a whole frame with `compressor`.
    pub fn compress(frame: &Frame, compressor: Compressor) -> Result<OpCompressed, WireError> {
        let raw = frame.to_bytes();
        let body = &raw[HEADER_LEN..];
        Ok(OpCompressed {
            original_op_code: frame.header.op_code,
            uncompressed_size: body.len() as i32,
            compressor_id: compressor.id(),
            payload: Bytes::from(compressor.compress(body)?),
        })
    }

    pub fn encode(&self, request_id: i32, response_to: i32, dst: &mut Vec<u8>) {
        Header {
            length: (HEADER_LEN + 9 + self.payload.len()) as i32,
            request_id,
            response_to,
            op_code: OpCode::Compressed as i32,
        }
        .write(dst);
        dst.extend_from_slice(&self.original_op_code.to_le_bytes());
        dst.extend_from_slice(&self.uncompressed_size.to_le_bytes());
        dst.push(self.compressor_id);
        dst.extend_from_slice(&self.payload);
    }
}

/// Commands whose messages must never be compressed (the compression spec's list).
pub fn may_compress(command_name: &str) -> bool {
    !matches!(
        command_name.to_ascii_lowercase().as_str(),
        "hello"
            | "ismaster"
            | "saslstart"
            | "saslcontinue"
            | "getnonce"
            | "authenticate"
            | "createuser"
            | "updateuser"
            | "copydbsaslstart"
            | "copydbgetnonce"
            | "copydb"
    )
}
