//! A request's command as one document: kind-1 document sequences are merged
//! into the body under their identifiers for rewriting, and split out again
//! afterwards, so a rewriter never cares how a driver chose to send them.

use bson::{Bson, Document, RawDocument, RawDocumentBuf};
use bytes::Bytes;

use crate::error::ProxyError;
use crate::wire::{DocumentSequence, OpMsg, Section};

/// A command with its sequences merged in.
#[derive(Clone, Debug, PartialEq)]
pub struct Command {
    pub body: Document,
    /// The identifiers that arrived as document sequences, in wire order.
    sequences: Vec<String>,
}

impl Command {
    pub fn from_msg(m: &OpMsg) -> Result<Command, ProxyError> {
        let mut body = to_document(m.body())?;
        let mut sequences = Vec::new();
        for seq in m.sequences() {
            let docs = seq
                .documents()
                .map(|d| {
                    RawDocument::from_bytes(d)
                        .map_err(|e| invalid(&e.to_string()))
                        .and_then(to_document)
                        .map(Bson::Document)
                })
                .collect::<Result<Vec<_>, _>>()?;
            body.insert(seq.identifier.clone(), docs);
            sequences.push(seq.identifier.clone());
        }
        Ok(Command { body, sequences })
    }

    /// The command name: the body's first key.
    pub fn name(&self) -> &str {
        self.body.keys().next().map_or("", String::as_str)
    }

    /// The target collection, for commands whose first value names one.
    pub fn collection(&self) -> Option<&str> {
        self.body.values().next().and_then(Bson::as_str)
    }

    pub fn db(&self) -> Option<&str> {
        self.body.get_str("$db").ok()
    }

    /// Rebuilds the message: the merged identifiers go back out as
    /// sequences; flags are kept (a checksum is recomputed when encoded).
    pub fn into_msg(mut self, original: &OpMsg) -> Result<OpMsg, ProxyError> {
        let mut split = Vec::new();
        for id in &self.sequences {
            let docs = match self.body.remove(id) {
                Some(Bson::Array(a)) => a,
                _ => Vec::new(),
            };
            let mut documents = Vec::new();
            for d in docs {
                match d {
                    Bson::Document(d) => documents.extend_from_slice(to_raw(&d)?.as_bytes()),
                    _ => return Err(invalid("a document sequence holds a non-document")),
                }
            }
            split.push(
                DocumentSequence::new(id.clone(), Bytes::from(documents))
                    .map_err(|e| invalid(&e.to_string()))?,
            );
        }
        let body = Bytes::from(to_raw(&self.body)?.into_bytes());
        let mut split = split.into_iter();
        let sections = original
            .sections
            .iter()
            .map(|s| match s {
                Section::Body(_) => Section::Body(body.clone()),
                Section::Sequence(_) => Section::Sequence(split.next().unwrap_or_default()),
            })
            .collect();
        Ok(OpMsg {
            flags: original.flags,
            sections,
            checksum: None,
        })
    }
}

/// The documents a field holds, whether a driver sent them in the body (as
/// an array) or as a kind-1 sequence under the field's name.
pub fn documents<'m>(m: &'m OpMsg, field: &str) -> Vec<&'m RawDocument> {
    let in_body = m
        .body()
        .get_array(field)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|v| v.as_document());
    let in_sequences = m
        .sequences()
        .filter(|s| s.identifier == field)
        .flat_map(|s| s.documents())
        .filter_map(|d| RawDocument::from_bytes(d).ok());
    in_body.chain(in_sequences).collect()
}

/// An owned document. Checked by the walker first: the owned parse
/// recurses, and no input may make it recurse without bound.
pub fn to_document(raw: &RawDocument) -> Result<Document, ProxyError> {
    match super::walker::validate(raw.as_bytes()) {
        Err(super::walker::Malformed::TooDeep) => return Err(ProxyError::Overflow),
        Err(e) => return Err(invalid(&e.to_string())),
        Ok(()) => {}
    }
    Document::try_from(raw).map_err(|e| invalid(&e.to_string()))
}

pub fn to_raw(doc: &Document) -> Result<RawDocumentBuf, ProxyError> {
    RawDocumentBuf::from_document(doc).map_err(|e| invalid(&e.to_string()))
}

fn invalid(why: &str) -> ProxyError {
    ProxyError::Unsupported(format!("invalid BSON in the command: {why}"))
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;
    use crate::wire::MsgFlags;

    #[test]
    fn sequences_merge_and_split_back_unchanged() {
        let raw =
            |d: Document| Bytes::from(RawDocumentBuf::from_document(&d).unwrap().into_bytes());
        let m = OpMsg {
            flags: MsgFlags(0),
            sections: vec![
                Section::Body(raw(doc! {"insert": "c", "$db": "d"})),
                Section::Sequence(
                    DocumentSequence::of(
                        "documents".into(),
                        [raw(doc! {"_id": 1}), raw(doc! {"_id": 2})],
                    )
                    .unwrap(),
                ),
            ],
            checksum: None,
        };
        let c = Command::from_msg(&m).unwrap();
        assert_eq!(
            c.body,
            doc! {"insert": "c", "$db": "d", "documents": [{"_id": 1}, {"_id": 2}]}
        );
        assert_eq!(
            (c.name(), c.collection(), c.db()),
            ("insert", Some("c"), Some("d"))
        );
        assert_eq!(c.into_msg(&m).unwrap(), m);
    }
}
