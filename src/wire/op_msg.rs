//! OP_MSG: `flagBits | Section+ | [checksum]`.
//!
//! Sections keep their bytes as [`Bytes`] slices of the frame they came from, so
//! decoding copies nothing and re-encoding an unchanged message reproduces it
//! byte for byte.

use bson::{RawDocument, RawDocumentBuf};
use bytes::Bytes;

use super::reader::Reader;
use super::{Header, WireError, HEADER_LEN};

/// OP_MSG flag bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MsgFlags(pub u32);

impl MsgFlags {
    /// A CRC-32C checksum follows the sections.
    pub const CHECKSUM_PRESENT: u32 = 1 << 0;
    /// More messages follow without waiting (w:0 requests, exhaust replies).
    pub const MORE_TO_COME: u32 = 1 << 1;
    /// The client accepts several replies to this request.
    pub const EXHAUST_ALLOWED: u32 = 1 << 16;
    /// The bits 0–15 a receiver understands; any other bit in 0–15 is an error.
    const KNOWN_REQUIRED: u32 = Self::CHECKSUM_PRESENT | Self::MORE_TO_COME;

    pub fn checksum_present(self) -> bool {
        self.0 & Self::CHECKSUM_PRESENT != 0
    }
    pub fn more_to_come(self) -> bool {
        self.0 & Self::MORE_TO_COME != 0
    }
    pub fn exhaust_allowed(self) -> bool {
        self.0 & Self::EXHAUST_ALLOWED != 0
    }
    /// These flags without `checksumPresent` (used when a changed message drops its checksum).
    pub fn without_checksum(self) -> MsgFlags {
        MsgFlags(self.0 & !Self::CHECKSUM_PRESENT)
    }
}

/// A kind-1 section: a named sequence of documents, kept as they travel,
/// back to back in one buffer. A batch of inserts is read, rewritten and
/// written as one block: no document is a buffer of its own.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DocumentSequence {
    pub identifier: String,
    /// Every document's length prefix was checked to fit, and its last
    /// byte to be a NUL, when the sequence was made.
    documents: Bytes,
}

impl DocumentSequence {
    /// The sequence of the documents written back to back in `documents`.
    pub fn new(identifier: String, documents: Bytes) -> Result<DocumentSequence, WireError> {
        let mut r = Reader::new(&documents);
        while !r.is_empty() {
            r.document("document sequence entry")?;
        }
        Ok(DocumentSequence {
            identifier,
            documents,
        })
    }

    /// The sequence of `documents`, copied into one buffer.
    pub fn of<D: AsRef<[u8]>>(
        identifier: String,
        documents: impl IntoIterator<Item = D>,
    ) -> Result<DocumentSequence, WireError> {
        let mut all = Vec::new();
        for d in documents {
            all.extend_from_slice(d.as_ref());
        }
        DocumentSequence::new(identifier, Bytes::from(all))
    }

    /// The documents, in order.
    pub fn documents(&self) -> Documents<'_> {
        Documents {
            rest: &self.documents,
        }
    }

    /// The documents' bytes, back to back.
    pub fn bytes(&self) -> &Bytes {
        &self.documents
    }
}

/// The documents of a [`DocumentSequence`].
#[derive(Clone)]
pub struct Documents<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for Documents<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        // Each length was checked when the sequence was made; one that
        // did not fit (or could not hold a document, so would not move
        // the walk on) would end the walk here, not panic or spin.
        let len = self.rest.get(..4)?;
        let len = usize::try_from(i32::from_le_bytes([len[0], len[1], len[2], len[3]])).ok()?;
        let (d, rest) = self.rest.split_at_checked(len).filter(|_| len >= 5)?;
        self.rest = rest;
        Some(d)
    }
}

/// One OP_MSG section.
#[derive(Clone, Debug, PartialEq)]
pub enum Section {
    /// Kind 0: the command body.
    Body(Bytes),
    /// Kind 1: a document sequence.
    Sequence(DocumentSequence),
}

/// A body document written in place in the buffer of the message that will
/// carry it, after room for the header, the flags and the section's kind:
/// a reply rewritten into one becomes a frame without being copied again
/// ([`super::Frame::with_body`]).
#[derive(Clone, Debug)]
pub struct MsgBody {
    buf: Vec<u8>,
}

impl MsgBody {
    /// Where the body starts: header, flags and the kind byte come first.
    pub const AT: usize = HEADER_LEN + 4 + 1;

    /// A buffer to write a body into: room for what comes before it, and
    /// `capacity` bytes for the document.
    pub fn buffer(capacity: usize) -> Vec<u8> {
        let mut buf = Vec::with_capacity(Self::AT + capacity);
        buf.resize(Self::AT, 0);
        buf
    }

    /// A buffer to write a body of about `want` bytes into, from `AT` on:
    /// one that carried an earlier message where one is kept
    /// ([`super::spare`]). Its bytes past `AT` are an earlier message's,
    /// to be written over (and the buffer cut where the body ends).
    pub fn spare(want: usize) -> Vec<u8> {
        let mut buf = super::spare::take(Self::AT + want);
        if buf.len() < Self::AT {
            buf.resize(Self::AT, 0);
        }
        buf
    }

    /// The body written into `buf` (from [`MsgBody::buffer`]): one document,
    /// whose length prefix and final NUL are checked.
    pub fn new(buf: Vec<u8>) -> Result<MsgBody, WireError> {
        let mut r = Reader::new(&buf);
        r.take(Self::AT, "OP_MSG body")?;
        r.document("OP_MSG body")?;
        if !r.is_empty() {
            return Err(WireError::TrailingBytes("OP_MSG body"));
        }
        Ok(MsgBody { buf })
    }

    /// A body that is a copy of `doc`.
    pub fn copy_of(doc: &RawDocument) -> MsgBody {
        let mut buf = Self::buffer(doc.as_bytes().len());
        buf.extend_from_slice(doc.as_bytes());
        MsgBody { buf }
    }

    /// The body document.
    pub fn document(&self) -> &RawDocument {
        // `new` checked the length prefix and the final NUL.
        RawDocument::from_bytes(&self.buf[Self::AT..]).unwrap_or_else(|_| empty_document())
    }

    /// The whole buffer, with its first [`MsgBody::AT`] bytes to fill in.
    pub(super) fn into_buffer(self) -> Vec<u8> {
        self.buf
    }
}

/// A decoded OP_MSG.
#[derive(Clone, Debug)]
pub struct OpMsg {
    pub flags: MsgFlags,
    /// Sections in wire order (they may come in any order).
    pub sections: Vec<Section>,
    /// The checksum as received; when encoding, a present flag recomputes it.
    pub checksum: Option<u32>,
}

/// Two messages are equal when they encode alike: the stored checksum is
/// derived from the rest and left out.
impl PartialEq for OpMsg {
    fn eq(&self, other: &OpMsg) -> bool {
        self.flags == other.flags && self.sections == other.sections
    }
}

impl OpMsg {
    /// A message with a single body and no sequences.
    pub fn from_body(flags: MsgFlags, body: &RawDocument) -> OpMsg {
        OpMsg {
            flags: flags.without_checksum(),
            sections: vec![Section::Body(Bytes::copy_from_slice(body.as_bytes()))],
            checksum: None,
        }
    }

    /// Parses the message whose complete bytes (header included) are `frame`.
    pub fn parse(frame: &Bytes) -> Result<OpMsg, WireError> {
        let mut r = Reader::new(frame);
        r.take(HEADER_LEN, "message header")?;
        let flags = MsgFlags(r.u32("OP_MSG flags")?);
        let unknown = flags.0 & 0xFFFF & !MsgFlags::KNOWN_REQUIRED;
        if unknown != 0 {
            return Err(WireError::UnknownRequiredFlags(unknown));
        }
        let end = if flags.checksum_present() {
            if frame.len() < HEADER_LEN + 4 + 4 {
                return Err(WireError::Truncated("OP_MSG checksum"));
            }
            frame.len() - 4
        } else {
            frame.len()
        };
        let checksum = if flags.checksum_present() {
            let declared =
                u32::from_le_bytes([frame[end], frame[end + 1], frame[end + 2], frame[end + 3]]);
            let computed = crc32c::crc32c(&frame[..end]);
            if declared != computed {
                return Err(WireError::ChecksumMismatch { declared, computed });
            }
            Some(declared)
        } else {
            None
        };

        let mut r = Reader::new(&frame[..end]);
        r.take(HEADER_LEN + 4, "OP_MSG flags")?;
        // Most messages are one body: room for it from the start.
        let mut sections = Vec::with_capacity(1);
        let mut bodies = 0;
        while !r.is_empty() {
            match r.u8("section kind")? {
                0 => {
                    let (s, e) = r.document("OP_MSG body")?;
                    sections.push(Section::Body(frame.slice(s..e)));
                    bodies += 1;
                }
                1 => sections.push(Section::Sequence(parse_sequence(frame, &mut r)?)),
                kind => return Err(WireError::UnknownSectionKind(kind)),
            }
        }
        match bodies {
            0 => Err(WireError::MissingBody),
            1 => Ok(OpMsg {
                flags,
                sections,
                checksum,
            }),
            _ => Err(WireError::MultipleBodies),
        }
    }

    /// The kind-0 body.
    pub fn body(&self) -> &RawDocument {
        self.sections
            .iter()
            .find_map(|s| match s {
                // `parse` checked the length prefix and the trailing NUL.
                Section::Body(b) => RawDocument::from_bytes(b).ok(),
                Section::Sequence(_) => None,
            })
            .unwrap_or_else(|| empty_document())
    }

    /// Replaces the kind-0 body, keeping every other section where it was.
    pub fn set_body(&mut self, body: RawDocumentBuf) {
        let bytes = Bytes::from(body.into_bytes());
        for s in &mut self.sections {
            if let Section::Body(b) = s {
                *b = bytes;
                return;
            }
        }
        self.sections.insert(0, Section::Body(bytes));
    }

    /// The document sequences, in wire order.
    pub fn sequences(&self) -> impl Iterator<Item = &DocumentSequence> {
        self.sections.iter().filter_map(|s| match s {
            Section::Sequence(seq) => Some(seq),
            Section::Body(_) => None,
        })
    }

    /// The first key of the body: the command name for a request.
    pub fn command_name(&self) -> Option<&str> {
        // The key of the first element: after the length and its type byte
        // (a document with no element has its final NUL there instead).
        let body = self.body().as_bytes();
        let key = body.get(5..body.len() - 1).filter(|_| body[4] != 0)?;
        let end = memchr::memchr(0, key)?;
        std::str::from_utf8(&key[..end]).ok()
    }

    /// Serialized length of the message, header included.
    pub fn encoded_len(&self) -> usize {
        let sections: usize = self
            .sections
            .iter()
            .map(|s| match s {
                Section::Body(b) => 1 + b.len(),
                Section::Sequence(seq) => 1 + sequence_len(seq),
            })
            .sum();
        let checksum = if self.flags.checksum_present() { 4 } else { 0 };
        HEADER_LEN + 4 + sections + checksum
    }

    /// Appends the complete message (header included) to `dst`. The header's
    /// length is computed; a present `checksumPresent` flag recomputes the CRC.
    pub fn encode(&self, request_id: i32, response_to: i32, dst: &mut Vec<u8>) {
        let start = dst.len();
        dst.reserve(self.encoded_len());
        Header {
            length: self.encoded_len() as i32,
            request_id,
            response_to,
            op_code: super::OpCode::Msg as i32,
        }
        .write(dst);
        dst.extend_from_slice(&self.flags.0.to_le_bytes());
        for s in &self.sections {
            match s {
                Section::Body(b) => {
                    dst.push(0);
                    dst.extend_from_slice(b);
                }
                Section::Sequence(seq) => {
                    dst.push(1);
                    dst.extend_from_slice(&(sequence_len(seq) as i32).to_le_bytes());
                    dst.extend_from_slice(seq.identifier.as_bytes());
                    dst.push(0);
                    dst.extend_from_slice(&seq.documents);
                }
            }
        }
        if self.flags.checksum_present() {
            let crc = crc32c::crc32c(&dst[start..]);
            dst.extend_from_slice(&crc.to_le_bytes());
        }
    }
}

fn sequence_len(seq: &DocumentSequence) -> usize {
    4 + seq.identifier.len() + 1 + seq.documents.len()
}

fn parse_sequence(frame: &Bytes, r: &mut Reader<'_>) -> Result<DocumentSequence, WireError> {
    let start = r.position();
    let size = r.i32("document sequence size")?;
    let size = usize::try_from(size).map_err(|_| WireError::BadSequence("negative size"))?;
    if size < 4 || size - 4 > r.remaining() {
        return Err(WireError::BadSequence("size overruns the message"));
    }
    let end = start + size;
    let identifier = r.cstring("document sequence identifier")?.to_owned();
    if r.position() > end {
        return Err(WireError::BadSequence("identifier overruns the section"));
    }
    let first = r.position();
    while r.position() < end {
        let (_, e) = r.document("document sequence entry")?;
        if e > end {
            return Err(WireError::BadSequence("document overruns the section"));
        }
    }
    Ok(DocumentSequence {
        identifier,
        documents: frame.slice(first..end),
    })
}

fn empty_document() -> &'static RawDocument {
    static EMPTY: [u8; 5] = [5, 0, 0, 0, 0];
    RawDocument::from_bytes(&EMPTY).expect("the empty document is valid")
}
