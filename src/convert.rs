//! Bringing stored documents from one form to the other, in place: each
//! document expanded to its logical form, then tokenized (or left with full
//! names), and written back with one conditional update that applies only
//! while every field it had when read still holds the same value. `laconic
//! migrate` converts a collection with it, batch by batch; proxies convert
//! the documents an update will meet while a collection migrates.

use bson::{doc, Bson, Document, RawDocumentBuf};
use futures::TryStreamExt;
use mongodb::Collection;

use crate::rewrite::expand;
use crate::rewrite::mapper::paths as tokenize;
use crate::rewrite::mapper::raw;
use crate::token::{NameStore, Names, Policy};

/// A conversion that could not be done.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error(transparent)]
    Driver(#[from] mongodb::error::Error),
    #[error(transparent)]
    Store(#[from] crate::token::StoreError),
    #[error(transparent)]
    Integrity(#[from] crate::token::Integrity),
    #[error(transparent)]
    Bson(#[from] bson::raw::Error),
    #[error(transparent)]
    Encode(#[from] bson::ser::Error),
    #[error(transparent)]
    Decode(#[from] bson::de::Error),
    #[error(transparent)]
    Malformed(#[from] crate::rewrite::walker::Malformed),
    #[error("{0}")]
    Other(String),
}

impl ConvertError {
    /// Whether the upstream (or the name store) could not be reached, or a
    /// connection to it failed: a conversion stopped by it can be done
    /// again, each of its writes being conditional.
    pub fn is_network_failure(&self) -> bool {
        match self {
            ConvertError::Driver(e) => crate::token::store::is_network_failure(e),
            ConvertError::Store(e) => e.is_network_failure(),
            _ => false,
        }
    }
}

/// A collection and the form its documents are brought to.
pub struct Target<'a> {
    pub coll: &'a Collection<RawDocumentBuf>,
    pub store: &'a NameStore,
    pub db: &'a str,
    pub policy: &'a Policy,
    /// Full names (`--reverse`) rather than tokens.
    pub reverse: bool,
}

impl Target<'_> {
    /// Brings `docs` to the target form, each with one conditional update;
    /// a document a writer changed in between is read again and redone.
    /// Returns (documents rewritten, documents redone).
    pub async fn convert(&self, docs: Vec<RawDocumentBuf>) -> Result<(u64, u64), ConvertError> {
        let (mut rewritten, mut retried) = (0, 0);
        let mut pending = docs;
        let mut attempts = 0;
        while !pending.is_empty() {
            attempts += 1;
            if attempts > 10 {
                return Err(ConvertError::Other(format!(
                    "documents of {}.{} keep changing under the migration; try again",
                    self.db,
                    self.coll.name()
                )));
            }
            let (updates, ids) =
                rewrite_batch(&pending, self.store, self.db, self.policy, self.reverse).await?;
            if updates.is_empty() {
                break;
            }
            let count = updates.len();
            let reply = self
                .coll
                .client()
                .database(self.db)
                .run_command(
                    doc! {"update": self.coll.name(), "updates": updates, "ordered": false},
                )
                .await?;
            let matched = match reply.get("n") {
                Some(Bson::Int32(n)) => *n as usize,
                Some(Bson::Int64(n)) => *n as usize,
                _ => 0,
            };
            if matched == count {
                rewritten += count as u64;
                break;
            }
            // The ones a writer changed in between are not in their target
            // form: read them again and redo them.
            let again: Vec<RawDocumentBuf> = self
                .coll
                .find(doc! {"_id": {"$in": ids.clone()}})
                .await?
                .try_collect()
                .await?;
            let (still, _) =
                rewrite_batch(&again, self.store, self.db, self.policy, self.reverse).await?;
            let redo: Vec<Bson> = still
                .iter()
                .filter_map(|u| u.as_document()?.get_document("q").ok()?.get("_id").cloned())
                .collect();
            rewritten += (ids.len() - redo.len()) as u64;
            retried += redo.len() as u64;
            pending = again
                .into_iter()
                .filter(|d| {
                    d.get("_id")
                        .ok()
                        .flatten()
                        .and_then(|v| Bson::try_from(v.to_raw_bson()).ok())
                        .is_some_and(|id| redo.contains(&id))
                })
                .collect();
        }
        Ok((rewritten, retried))
    }

    /// Brings every document `filter` (in stored form) matches to the
    /// target form, a batch at a time: what a proxy does before an update
    /// of a collection being migrated. Returns the documents rewritten.
    pub async fn convert_matching(&self, filter: Document) -> Result<u64, ConvertError> {
        let mut cursor = self.coll.find(filter).batch_size(500).await?;
        let mut total = 0;
        loop {
            let mut batch = Vec::new();
            while batch.len() < 500 {
                match cursor.try_next().await? {
                    Some(d) => batch.push(d),
                    None => break,
                }
            }
            if batch.is_empty() {
                return Ok(total);
            }
            total += self.convert(batch).await?.0;
        }
    }
}

/// The replacements a batch needs (`update` statements) and their `_id`s.
async fn rewrite_batch(
    docs: &[RawDocumentBuf],
    store: &NameStore,
    db: &str,
    policy: &Policy,
    reverse: bool,
) -> Result<(Vec<Bson>, Vec<Bson>), ConvertError> {
    // Logical forms first (with the cache as it is, refreshed if it lacks a token).
    let mut logical = Vec::with_capacity(docs.len());
    for d in docs {
        let l = match normalize(d, &*store.dictionary(db)?) {
            Ok(l) => l,
            Err(_) => {
                store.refresh(db).await?;
                normalize(d, &*store.dictionary(db)?).map_err(|u| {
                    ConvertError::Other(format!(
                        "document {:?} holds {} keys that read as tokens its dictionary does not know (keys of documents stored before Laconic that begin with a control byte: rename them first, see the README)",
                        d.get("_id").ok().flatten(),
                        u.count()
                    ))
                })?
            }
        };
        logical.push(l);
    }
    if !reverse {
        let mut names = Vec::new();
        let mut values = Vec::new();
        for l in &logical {
            tokenize::collect_names(l, policy, &mut names);
            tokenize::collect_values(l, policy, &mut values);
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let values: Vec<&str> = values.iter().map(String::as_str).collect();
        store.allocate(db, &names, &values).await?;
    }
    let mut updates = Vec::new();
    let mut ids = Vec::new();
    for (d, l) in docs.iter().zip(&logical) {
        let target = if reverse {
            bson::to_vec(l)?
        } else {
            let raw_logical = RawDocumentBuf::from_document(l)?;
            let mut out = Vec::with_capacity(raw_logical.as_bytes().len());
            raw::tokenize(
                raw_logical.as_bytes(),
                policy,
                &*store.dictionary(db)?,
                &mut out,
            )?;
            out
        };
        if target == d.as_bytes() {
            continue;
        }
        let original = Document::try_from(d.as_ref())?;
        let target = Document::from_reader(&target[..])?;
        let id = original.get("_id").cloned().unwrap_or(Bson::Null);
        updates.push(Bson::Document(doc! {
            "q": unchanged(&original),
            "u": [{"$replaceWith": {"$mergeObjects": [{"$literal": target}, added_since(&original)]}}],
        }));
        ids.push(id);
    }
    Ok((updates, ids))
}

/// A filter matching the document only while every field it had when read
/// still holds the same value (equality on sub-documents is exact). Keys
/// that a filter would read as operators or paths are left out.
fn unchanged(original: &Document) -> Document {
    original
        .iter()
        .filter(|(k, _)| !k.starts_with('$') && !k.contains('.'))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// The fields a writer added after the document was read: everything but
/// the fields it had. Kept by the replacement, after the rewritten ones.
fn added_since(original: &Document) -> Bson {
    let keys: Vec<Bson> = original.keys().map(|k| Bson::String(k.clone())).collect();
    Bson::Document(doc! {
        "$arrayToObject": {"$filter": {
            "input": {"$objectToArray": "$$ROOT"},
            "cond": {"$not": [{"$in": ["$$this.k", {"$literal": keys}]}]},
        }},
    })
}

/// A stored document in its logical form. A field present both as a token
/// and under its full name (a proxy write to a document not yet migrated)
/// keeps the tokenized value, the later one; but a key of digits alone
/// keeps the value under its full name: builds that tokenized such keys
/// wrote them as they are when an update named them by path (see
/// [`crate::token::policy::is_index_like`]), after the document's insert.
fn normalize(d: &RawDocumentBuf, names: &dyn Names) -> Result<Document, expand::Unknown> {
    let stored = Document::try_from(d.as_ref()).unwrap_or_default();
    merge(&stored, names, &mut expand::Unknown::default())
}

fn merge(
    stored: &Document,
    names: &dyn Names,
    unknown: &mut expand::Unknown,
) -> Result<Document, expand::Unknown> {
    let mut out = Document::new();
    for (k, v) in stored {
        let is_token = crate::token::namespace::is_reserved(k) && !k.starts_with('\u{1f}');
        let key = expand::key(k, names, &mut unknown.names).into_owned();
        let value = match v {
            Bson::Document(sub) => Bson::Document(merge(sub, names, unknown)?),
            other => {
                let one = doc! {"v": other.clone()};
                expand::document(&one, names)?
                    .remove("v")
                    .unwrap_or(Bson::Null)
            }
        };
        let token_is_later = !crate::token::policy::is_index_like(key.as_bytes());
        if out.contains_key(&key) && is_token != token_is_later {
            continue; // the value in the other form is the later write
        }
        out.insert(key, value);
    }
    if unknown.names.is_empty() && unknown.values.is_empty() {
        Ok(out)
    } else {
        Err(unknown.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::token::Dictionary;

    /// A field in both forms keeps the later write: the token's, but for a
    /// key of digits alone, the one written as it is (by a path, after the
    /// insert that tokenized it), whichever comes first in the document.
    #[test]
    fn a_field_in_both_forms_keeps_the_later_write() {
        let mut dict = Dictionary::default();
        dict.add_names(&["amount".to_owned(), "2024".to_owned()]);
        let token = |n: &str| dict.token(n).unwrap().as_str().to_owned();
        let (amount, year) = (token("amount"), token("2024"));
        for stored in [
            doc! {&amount: 2, "amount": 1, &year: 10, "2024": 11},
            doc! {"amount": 1, &amount: 2, "2024": 11, &year: 10},
        ] {
            let logical = merge(&stored, &dict, &mut expand::Unknown::default()).unwrap();
            assert_eq!(logical.get_i32("amount").unwrap(), 2, "{stored:?}");
            assert_eq!(logical.get_i32("2024").unwrap(), 11, "{stored:?}");
            assert_eq!(logical.len(), 2);
        }
    }
}
