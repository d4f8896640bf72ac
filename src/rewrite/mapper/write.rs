//! Writes: an update's filter and change (operators, a replacement or a
//! pipeline), `arrayFilters`, and what a migration changes about them.

use bson::{Bson, Document};

use super::paths::{
    clauses, condition, document, logical, logical_parts, path, paths_document, value_at,
};
use super::Mapper;
use crate::error::ProxyError;
use crate::token::{Migration, Names, Policy};

impl Mapper<'_> {
    /// The filter of an update. While the collection migrates, an operator
    /// or pipeline update (of an `update`, a `findAndModify` or a
    /// `bulkWrite`) meets its documents in the stored form only (see
    /// `migration_filters`), so its
    /// filter names that form alone, and an upsert seeds its new document
    /// from the filter as it would without the proxy.
    pub(super) fn update_filter_at(
        &self,
        parent: &mut Document,
        filter_key: &str,
        update_key: &str,
    ) -> Result<(), ProxyError> {
        match self.migrating {
            Some(way) if is_partial(parent.get(update_key)) => {
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

    /// A write's filter, change and `arrayFilters`. The change's names are
    /// stored; so are an upsert's filter's (it seeds the new document).
    pub(super) fn write_op(
        &self,
        op: &mut Document,
        filter_key: &str,
        update_key: &str,
        array_filters_key: &str,
    ) -> Result<(), ProxyError> {
        let upsert = op.get_bool("upsert").unwrap_or(false);
        let stores = self.storing_documents();
        let filter = if upsert { &stores } else { self };
        filter.update_filter_at(op, filter_key, update_key)?;
        // Read against the change's paths as the client wrote them.
        self.array_filters(op, array_filters_key, update_key)?;
        stores.update(op, update_key)
    }

    pub(super) fn update(&self, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
        // While a collection migrates, an operator or pipeline update could
        // meet a document still in the other form and write beside it: the
        // session brings the documents its filter matches to the stored
        // form first (`migration_filters`).
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
                            ("$push", Bson::Document(m)) if m.contains_key("$each") => {
                                Bson::Document(self.push_modifiers(p, &scope, m)?)
                            }
                            // A condition on the array's elements, as a
                            // filter's on the array would be.
                            ("$pull", v) => {
                                condition(v, &scope, self.policy, self.names, &as_it_is)?
                            }
                            (_, v) if self.policy.is_value_path(&scope) => {
                                value_at(v, &mut scope.clone(), self.policy, self.names)
                            }
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

    /// `$push` with modifiers: the elements of `$each` are stored as the
    /// array's values are, and `$sort`'s keys are paths in its elements.
    fn push_modifiers(
        &self,
        p: &str,
        scope: &[String],
        m: &Document,
    ) -> Result<Document, ProxyError> {
        self.check_push_sort(p, scope, m.get("$sort"))?;
        let mut out = Document::new();
        for (k, v) in m {
            let v = match (k.as_str(), v) {
                ("$each", v) if self.policy.is_value_path(scope) => {
                    value_at(v, &mut scope.to_vec(), self.policy, self.names)
                }
                ("$each", v) => literal(v, scope, self.policy, self.names),
                ("$sort", Bson::Document(by)) => {
                    Bson::Document(paths_document(by, scope, self.policy, self.names))
                }
                _ => v.clone(),
            };
            out.insert(k.clone(), v);
        }
        Ok(out)
    }

    /// `$push`'s `$sort` orders the array by stored values: refused where
    /// they are value tokens (the array's own values, or a field of its
    /// documents that is a value path).
    fn check_push_sort(
        &self,
        p: &str,
        scope: &[String],
        sort: Option<&Bson>,
    ) -> Result<(), ProxyError> {
        let sorted = match sort {
            Some(Bson::Document(by)) => by
                .keys()
                .map(|k| logical(scope, k))
                .find(|path| self.policy.is_value_path(path)),
            Some(_) => Some(scope.to_vec()).filter(|s| self.policy.is_value_path(s)),
            None => None,
        };
        match sorted {
            Some(path) => Err(ProxyError::Unsupported(format!(
                "$push with $sort on {p} by the tokenized value path {} cannot be kept correct: tokenized values keep no order",
                path.join(".")
            ))),
            None => Ok(()),
        }
    }

    /// arrayFilters: each condition on `<id>` (or on `<id>.<path>`) applies
    /// to the elements of the array the change names before `$[<id>]`, so
    /// it is rewritten as a filter on that array's elements would be: below
    /// a custom-attribute path, on a value path, with literal documents in
    /// their stored form. An identifier the change does not name is read
    /// from the top (the server refuses it).
    fn array_filters(
        &self,
        op: &mut Document,
        key: &str,
        update_key: &str,
    ) -> Result<(), ProxyError> {
        let scopes = identifier_scopes(op.get(update_key));
        let Ok(filters) = op.get_array_mut(key) else {
            return Ok(());
        };
        for f in filters.iter_mut() {
            if let Bson::Document(d) = f {
                *d = self.array_filter(d, &scopes)?;
            }
        }
        Ok(())
    }

    fn array_filter(
        &self,
        d: &Document,
        scopes: &[(String, Vec<String>)],
    ) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in d {
            match (k.as_str(), v) {
                ("$and" | "$or" | "$nor", Bson::Array(subs)) => {
                    let subs = clauses(subs, |d| self.array_filter(d, scopes))?;
                    out.insert(k.clone(), subs);
                }
                (k, _) if k.starts_with('$') => {
                    out.insert(k.to_owned(), v.clone());
                }
                (k, v) => {
                    let (id, rest) = k.split_once('.').map_or((k, None), |(i, r)| (i, Some(r)));
                    let array = scopes
                        .iter()
                        .find(|(bound, _)| bound == id)
                        .map_or(&[][..], |(_, s)| s.as_slice());
                    let (key, scope) = match rest {
                        Some(rest) => (
                            format!("{id}.{}", path(rest, array, self.policy, self.names)),
                            logical(array, rest),
                        ),
                        None => (id.to_owned(), array.to_vec()),
                    };
                    let condition = condition(v, &scope, self.policy, self.names, &as_it_is)?;
                    out.insert(key, condition);
                }
            }
        }
        Ok(out)
    }
}

/// The identifiers `$[<id>]` of an operator update, each with the logical
/// path of the array it stands in (the first place it appears).
fn identifier_scopes(update: Option<&Bson>) -> Vec<(String, Vec<String>)> {
    let mut scopes: Vec<(String, Vec<String>)> = Vec::new();
    let Some(Bson::Document(u)) = update else {
        return scopes;
    };
    for fields in u.values() {
        let Bson::Document(fields) = fields else {
            continue;
        };
        for p in fields.keys() {
            let mut array = Vec::new();
            for c in p.split('.') {
                match c.strip_prefix("$[").and_then(|c| c.strip_suffix(']')) {
                    Some(id) if !id.is_empty() => {
                        if !scopes.iter().any(|(bound, _)| bound == id) {
                            scopes.push((id.to_owned(), array.clone()));
                        }
                    }
                    _ => array.extend(logical_parts(c).map(str::to_owned)),
                }
            }
        }
    }
    scopes
}

/// Conditions on array elements hold no `$expr` (the server refuses one):
/// anything of the kind goes as it came.
fn as_it_is(_: &str, v: &Bson) -> Result<Bson, ProxyError> {
    Ok(v.clone())
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
