//! OP_QUERY and OP_REPLY, which older drivers still use for the first `isMaster`.

use bson::RawDocument;
use bytes::Bytes;

use super::reader::Reader;
use super::{Header, OpCode, WireError, HEADER_LEN};

/// An OP_QUERY request.
#[derive(Clone, Debug, PartialEq)]
pub struct OpQuery {
    pub flags: i32,
    pub full_collection_name: String,
    pub number_to_skip: i32,
    pub number_to_return: i32,
    pub query: Bytes,
    pub return_fields_selector: Option<Bytes>,
}

impl OpQuery {
    pub fn parse(frame: &Bytes) -> Result<OpQuery, WireError> {
        let mut r = Reader::new(frame);
        r.take(HEADER_LEN, "message header")?;
        let flags = r.i32("OP_QUERY flags")?;
        let full_collection_name = r.cstring("OP_QUERY collection name")?.to_owned();
        let number_to_skip = r.i32("OP_QUERY numberToSkip")?;
        let number_to_return = r.i32("OP_QUERY numberToReturn")?;
        let (s, e) = r.document("OP_QUERY query")?;
        let query = frame.slice(s..e);
        let return_fields_selector = if r.is_empty() {
            None
        } else {
            let (s, e) = r.document("OP_QUERY returnFieldsSelector")?;
            Some(frame.slice(s..e))
        };
        if !r.is_empty() {
            return Err(WireError::TrailingBytes("OP_QUERY"));
        }
        Ok(OpQuery {
            flags,
            full_collection_name,
            number_to_skip,
            number_to_return,
            query,
            return_fields_selector,
        })
    }

    /// The query document; `parse` checked its framing.
    pub fn query(&self) -> Option<&RawDocument> {
        RawDocument::from_bytes(&self.query).ok()
    }

    /// The command document: the query, or its `$query` member when wrapped.
    pub fn command(&self) -> Option<&RawDocument> {
        let q = self.query()?;
        match q.get_document("$query") {
            Ok(inner) => Some(inner),
            Err(_) => Some(q),
        }
    }

    /// The command name, if this is a command (`<db>.$cmd`).
    pub fn command_name(&self) -> Option<&str> {
        if !self.full_collection_name.ends_with(".$cmd") {
            return None;
        }
        self.command()?
            .iter()
            .next()
            .and_then(|r| r.ok())
            .map(|(k, _)| k)
    }

    pub fn encode(&self, request_id: i32, response_to: i32, dst: &mut Vec<u8>) {
        let len = HEADER_LEN
            + 4
            + self.full_collection_name.len()
            + 1
            + 8
            + self.query.len()
            + self.return_fields_selector.as_ref().map_or(0, Bytes::len);
        Header {
            length: len as i32,
            request_id,
            response_to,
            op_code: OpCode::Query as i32,
        }
        .write(dst);
        dst.extend_from_slice(&self.flags.to_le_bytes());
        dst.extend_from_slice(self.full_collection_name.as_bytes());
        dst.push(0);
        dst.extend_from_slice(&self.number_to_skip.to_le_bytes());
        dst.extend_from_slice(&self.number_to_return.to_le_bytes());
        dst.extend_from_slice(&self.query);
        if let Some(sel) = &self.return_fields_selector {
            dst.extend_from_slice(sel);
        }
    }
}

/// An OP_REPLY.
#[derive(Clone, Debug, PartialEq)]
pub struct OpReply {
    pub response_flags: i32,
    pub cursor_id: i64,
    pub starting_from: i32,
    pub number_returned: i32,
    pub documents: Vec<Bytes>,
}

impl OpReply {
    /// A reply carrying one document, as servers answer commands.
    pub fn single(document: &RawDocument) -> OpReply {
        OpReply {
            response_flags: 0,
            cursor_id: 0,
            starting_from: 0,
            number_returned: 1,
            documents: vec![Bytes::copy_from_slice(document.as_bytes())],
        }
    }

    pub fn parse(frame: &Bytes) -> Result<OpReply, WireError> {
        let mut r = Reader::new(frame);
        r.take(HEADER_LEN, "message header")?;
        let response_flags = r.i32("OP_REPLY flags")?;
        let cursor_id = r.i64("OP_REPLY cursorID")?;
        let starting_from = r.i32("OP_REPLY startingFrom")?;
        let number_returned = r.i32("OP_REPLY numberReturned")?;
        let mut documents = Vec::new();
        while !r.is_empty() {
            let (s, e) = r.document("OP_REPLY document")?;
            documents.push(frame.slice(s..e));
        }
        Ok(OpReply {
            response_flags,
            cursor_id,
            starting_from,
            number_returned,
            documents,
        })
    }

    /// The first document, which carries a command reply.
    pub fn first(&self) -> Option<&RawDocument> {
        self.documents
            .first()
            .and_then(|d| RawDocument::from_bytes(d).ok())
    }

    pub fn encode(&self, request_id: i32, response_to: i32, dst: &mut Vec<u8>) {
        let len = HEADER_LEN + 20 + self.documents.iter().map(Bytes::len).sum::<usize>();
        Header {
            length: len as i32,
            request_id,
            response_to,
            op_code: OpCode::Reply as i32,
        }
        .write(dst);
        dst.extend_from_slice(&self.response_flags.to_le_bytes());
        dst.extend_from_slice(&self.cursor_id.to_le_bytes());
        dst.extend_from_slice(&self.starting_from.to_le_bytes());
        dst.extend_from_slice(&self.number_returned.to_le_bytes());
        for d in &self.documents {
            dst.extend_from_slice(d);
        }
    }
}
