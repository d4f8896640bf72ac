//! Writes: an update's filter and change (operators, a replacement or a
//! pipeline), `arrayFilters`, and what a migration changes about them.

use bson::{Bson, Document};

use super::paths::{document, logical_parts, path};
use super::Mapper;
use crate::error::ProxyError;
use crate::token::{Migration, Names, Policy};

impl Mapper<'_> {
    /// The filter of an update. While the collection migrates, an operator
    /// or pipeline update (of an `update` or `findAndModify`) meets its
    /// documents in the stored form only (see `migration_filters`), so its
    /// filter names that form alone, and an upsert seeds its new document
    /// from the filter as it would without the proxy.
    pub(super) fn update_filter_at(
        &self,
        parent: &mut Document,
        filter_key: &str,
        update_key: &str,
    ) -> Result<(), ProxyError> {
        match self.migrating {
            Some(way) if update_key != "updateMods" && is_partial(parent.get(update_key)) => {
                if way == Migration::Reverse {
                    return Ok(()); // stored with full names
                }
                Mapper {
                    migrating: None,
                    ..*self
                }
                .filter_at(parent, filter_key)
            }
            _ => self.filter_at(parent, filter_key),
        }
    }

    /// A write's filter and change. The change's names are stored; so are
    /// an upsert's filter's (it seeds the new document).
    pub(super) fn write_op(
        &self,
        op: &mut Document,
        filter_key: &str,
        update_key: &str,
    ) -> Result<(), ProxyError> {
        let upsert = op.get_bool("upsert").unwrap_or(false);
        let stores = self.storing();
        let filter = if upsert { &stores } else { self };
        filter.update_filter_at(op, filter_key, update_key)?;
        stores.update(op, update_key)
    }

    pub(super) fn update(&self, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
        // While a collection migrates, an operator or pipeline update could
        // meet a document still in the other form and write beside it. The
        // session brings the documents an `update` or `findAndModify` filter
        // matches to the stored form first; a bulkWrite's are paused.
        if self.migrating.is_some() && is_partial(parent.get(key)) && key == "updateMods" {
            return Err(ProxyError::Unsupported(
                "a bulkWrite update of a collection that laconic migrate is rewriting: its operator and pipeline updates are paused until it finishes (update and findAndModify commands, inserts and reads go on)".into(),
            ));
        }
        if self.migrating == Some(Migration::Reverse) {
            return Ok(()); // stored with full names
        }
        let new = match parent.get(key) {
            Some(Bson::Document(u)) if u.keys().next().is_some_and(|k| k.starts_with('$')) => {
                let mut out = Document::new();
                for (op, fields) in u {
                    let Bson::Document(fields) = fields else {
                        out.insert(op.clone(), fields.clone());
                        continue;
                    };
                    let mut f = Document::new();
                    for (p, v) in fields {
                        let scope: Vec<String> = logical_parts(p).map(str::to_owned).collect();
                        let v = match (op.as_str(), v) {
                            ("$rename", Bson::String(to)) => {
                                Bson::String(path(to, &[], self.policy, self.names))
                            }
                            ("$unset" | "$inc" | "$mul" | "$currentDate" | "$pop" | "$bit", v) => {
                                v.clone()
                            }
                            (_, v) if self.policy.is_value_path(&scope) => super::paths::value_at(
                                v,
                                &mut scope.clone(),
                                self.policy,
                                self.names,
                            ),
                            (_, Bson::Document(d)) => Bson::Document(document(
                                d,
                                &mut scope.clone(),
                                self.policy,
                                self.names,
                            )),
                            (_, Bson::Array(_)) | (_, _) => {
                                literal(v, &scope, self.policy, self.names)
                            }
                        };
                        f.insert(path(p, &[], self.policy, self.names), v);
                    }
                    out.insert(op.clone(), f);
                }
                Bson::Document(out)
            }
            Some(Bson::Document(replacement)) => Bson::Document(self.doc(replacement)),
            Some(Bson::Array(stages)) => {
                if let Some(stage) = stages
                    .iter()
                    .filter_map(|s| s.as_document()?.keys().next())
                    .find(|s| !UPDATE_STAGES.contains(&s.as_str()))
                {
                    return Err(ProxyError::Unsupported(format!(
                        "{stage} is not allowed in an update pipeline"
                    )));
                }
                let mut stages = stages.clone();
                self.pipeline(&mut stages)?;
                Bson::Array(stages)
            }
            _ => return Ok(()),
        };
        parent.insert(key.to_owned(), new);
        Ok(())
    }

    /// arrayFilters: `<id>` stays; the path after it is tokenized by name.
    pub(super) fn array_filters(&self, parent: &mut Document, key: &str) {
        let Ok(filters) = parent.get_array_mut(key) else {
            return;
        };
        for f in filters.iter_mut() {
            let Bson::Document(d) = f else { continue };
            let mut out = Document::new();
            for (k, v) in d.iter() {
                let k = match k.split_once('.') {
                    Some((id, rest)) => {
                        format!("{id}.{}", path(rest, &[], self.policy, self.names))
                    }
                    None => k.clone(),
                };
                out.insert(k, v.clone());
            }
            *d = out;
        }
    }
}

/// The stages an update pipeline may hold.
const UPDATE_STAGES: &[&str] = &[
    "$addFields",
    "$set",
    "$project",
    "$unset",
    "$replaceRoot",
    "$replaceWith",
];

fn literal(v: &Bson, scope: &[String], policy: &Policy, names: &dyn Names) -> Bson {
    match v {
        Bson::Document(d) => Bson::Document(document(d, &mut scope.to_vec(), policy, names)),
        Bson::Array(a) => Bson::Array(a.iter().map(|x| literal(x, scope, policy, names)).collect()),
        other => other.clone(),
    }
}

/// Whether an update is a partial one: update operators or a pipeline.
pub(in crate::rewrite) fn is_partial(u: Option<&Bson>) -> bool {
    match u {
        Some(Bson::Array(_)) => true,
        Some(Bson::Document(u)) => u.keys().next().is_some_and(|k| k.starts_with('$')),
        _ => false,
    }
}
