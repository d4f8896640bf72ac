//! Queries and their companions: filters (with the checks that refuse
//! what cannot be rewritten), `$jsonSchema`, sorts, projections, and the
//! path helpers every other part uses.

use bson::{Bson, Document};

use super::expr::{Use, Vars};
use super::paths::{key, logical, path, paths_document};
use super::{each_field, refuse, Mapper};
use crate::error::ProxyError;

impl Mapper<'_> {
    pub(super) fn checked_filter(
        &self,
        f: &Document,
        parent: &[String],
    ) -> Result<Document, ProxyError> {
        check_filter(f)?;
        let stored =
            super::paths::filter(f, parent, self.policy, self.names, &|op, v| match (op, v) {
                ("$jsonSchema", Bson::Document(schema)) => {
                    self.json_schema(schema, parent).map(Bson::Document)
                }
                _ => self.expr(v, &[], &Vars::default()),
            })?;
        if self.migrating.is_none() || !parent.is_empty() {
            return Ok(stored);
        }
        // A collection being migrated holds both forms: match either.
        let old_form = super::paths::filter(
            f,
            parent,
            &crate::token::Policy::default(),
            self.names,
            &|_, v| Ok(v.clone()),
        )?;
        if old_form == stored {
            return Ok(stored);
        }
        Ok(bson::doc! {"$or": [stored, old_form]})
    }

    /// A `$jsonSchema` relative to `parent`: property names in `properties`,
    /// `required` and `dependencies` are names; keywords stay.
    pub(super) fn json_schema(
        &self,
        schema: &Document,
        parent: &[String],
    ) -> Result<Document, ProxyError> {
        let names_list = |v: &Bson| match v {
            Bson::Array(a) => Bson::Array(
                a.iter()
                    .map(|n| match n {
                        Bson::String(n) => Bson::String(self.name(parent, n)),
                        other => other.clone(),
                    })
                    .collect(),
            ),
            other => other.clone(),
        };
        // At a value path, strings are stored as value tokens (binData): a
        // keyword that reads a string's type or text cannot be kept.
        let value_path = self.policy.is_value_path(parent);
        let out = each_field(schema, |k, v| {
            Ok(match (k, v) {
                ("bsonType" | "type", t) if value_path && names_string_type(t) => {
                    return Err(value_schema(k, parent))
                }
                ("minLength" | "maxLength" | "pattern", _) if value_path => {
                    return Err(value_schema(k, parent))
                }
                ("enum", v) if value_path => {
                    super::paths::value_at(v, &mut parent.to_vec(), self.policy, self.names)
                }
                ("patternProperties", _) => {
                    return Err(refuse(
                        "$jsonSchema patternProperties (a regular expression over field names)",
                    ))
                }
                ("properties", Bson::Document(props)) => {
                    let mut o = Document::new();
                    for (name, sub) in props {
                        let mut scope = parent.to_vec();
                        scope.push(name.clone());
                        let sub = match sub {
                            Bson::Document(d) => Bson::Document(self.json_schema(d, &scope)?),
                            other => other.clone(),
                        };
                        o.insert(self.name(parent, name), sub);
                    }
                    Bson::Document(o)
                }
                ("required", list) => names_list(list),
                ("dependencies", Bson::Document(deps)) => {
                    let mut o = Document::new();
                    for (name, dep) in deps {
                        let dep = match dep {
                            Bson::Document(d) => Bson::Document(self.json_schema(d, parent)?),
                            other => names_list(other),
                        };
                        o.insert(self.name(parent, name), dep);
                    }
                    Bson::Document(o)
                }
                (
                    "items" | "additionalItems" | "additionalProperties" | "not",
                    Bson::Document(d),
                ) => Bson::Document(self.json_schema(d, parent)?),
                ("items" | "allOf" | "anyOf" | "oneOf", Bson::Array(a)) => Bson::Array(
                    a.iter()
                        .map(|x| match x {
                            Bson::Document(d) => self.json_schema(d, parent).map(Bson::Document),
                            other => Ok(other.clone()),
                        })
                        .collect::<Result<_, _>>()?,
                ),
                ("enum", Bson::Array(a)) => Bson::Array(
                    a.iter()
                        .map(|x| match x {
                            Bson::Document(d) => Bson::Document(super::paths::document(
                                d,
                                &mut parent.to_vec(),
                                self.policy,
                                self.names,
                            )),
                            other => other.clone(),
                        })
                        .collect(),
                ),
                _ => v.clone(),
            })
        })?;
        Ok(out)
    }

    pub(super) fn path(&self, p: &str, parent: &[String]) -> String {
        path(p, parent, self.policy, self.names)
    }

    /// One name (no dot traversal) under `parent`.
    pub(super) fn name(&self, parent: &[String], n: &str) -> String {
        let p: Vec<&str> = parent.iter().map(String::as_str).collect();
        key(&p, n, self.policy, self.names).into_owned()
    }

    /// `"$a.b"` as a field reference, with no computation on it.
    pub(super) fn field_ref(&self, p: &str) -> String {
        match p.strip_prefix('$') {
            Some(rest) if !rest.starts_with('$') => format!("${}", self.path(rest, &[])),
            _ => p.to_owned(),
        }
    }

    pub(super) fn path_list(&self, d: &mut Document, field: &str) {
        if let Ok(list) = d.get_array(field) {
            let list: Vec<Bson> = list
                .iter()
                .map(|p| match p {
                    Bson::String(p) => Bson::String(self.path(p, &[])),
                    other => other.clone(),
                })
                .collect();
            d.insert(field, list);
        }
    }

    /// A sort: paths relative to `parent`; sorting by a tokenized value is
    /// refused (tokens keep no order).
    pub(super) fn sort(&self, s: &Document, parent: &[String]) -> Result<Document, ProxyError> {
        if let Some(p) = s
            .keys()
            .find(|p| self.policy.is_value_path(&logical(parent, p)))
        {
            return Err(ProxyError::Unsupported(format!(
                "a sort on the tokenized value path {p} cannot be kept correct: tokenized values keep no order"
            )));
        }
        Ok(paths_document(s, parent, self.policy, self.names))
    }

    /// A projection (find's or `$project`'s) relative to `parent`: keys are
    /// paths, or nested projections; values are flags, projection operators
    /// or (in aggregation, and in find since 4.4) expressions.
    pub(super) fn projection(
        &self,
        p: &Document,
        parent: &[String],
    ) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in p {
            if k.starts_with('$') {
                out.insert(k.clone(), v.clone());
                continue;
            }
            let scope = logical(parent, k);
            let v = match v {
                Bson::Document(d) => match d.keys().next().map(String::as_str) {
                    Some("$elemMatch") => {
                        let mut m = d.clone();
                        if let Ok(e) = d.get_document("$elemMatch") {
                            m.insert("$elemMatch", self.checked_filter(e, &scope)?);
                        }
                        Bson::Document(m)
                    }
                    Some("$slice" | "$meta") => v.clone(),
                    Some(op) if op.starts_with('$') => {
                        self.expr_as(v, &scope, &Vars::default(), Use::Computed)?
                    }
                    _ => Bson::Document(self.projection(d, &scope)?),
                },
                v if is_flag(v) => v.clone(),
                other => self.expr_as(other, &scope, &Vars::default(), Use::Moved)?,
            };
            out.insert(self.path(k, parent), v);
        }
        Ok(out)
    }
}

/// Whether a `$jsonSchema` type keyword admits strings or binary values,
/// which a value path stores as one another.
fn names_string_type(t: &Bson) -> bool {
    match t {
        Bson::String(t) => matches!(t.as_str(), "string" | "binData"),
        Bson::Array(a) => a.iter().any(names_string_type),
        _ => false,
    }
}

fn value_schema(keyword: &str, path: &[String]) -> ProxyError {
    ProxyError::Unsupported(format!(
        "$jsonSchema {keyword} on the tokenized value path {} cannot be kept correct: tokenized values are not strings",
        path.join(".")
    ))
}

pub(in crate::rewrite) fn is_flag(v: &Bson) -> bool {
    matches!(
        v,
        Bson::Int32(0 | 1) | Bson::Int64(0 | 1) | Bson::Boolean(_)
    ) || matches!(v, Bson::Double(x) if *x == 0.0 || *x == 1.0)
}

/// Filter constructs that cannot be rewritten: JavaScript reads field names.
/// (Conditions on value paths are checked where they are rewritten.)
pub(super) fn check_filter(f: &Document) -> Result<(), ProxyError> {
    for (k, v) in f {
        match (k.as_str(), v) {
            ("$where", _) => return Err(refuse("$where (JavaScript reads field names)")),
            ("$and" | "$or" | "$nor", Bson::Array(a)) => {
                for sub in a {
                    if let Bson::Document(d) = sub {
                        check_filter(d)?;
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// A condition on a value path that cannot be kept correct is refused
/// (called by the filter's rewrite, which knows the whole path).
pub(super) fn check_value_condition(path: &str, v: &Bson) -> Result<(), ProxyError> {
    let refuse_value = |what: &str| {
        ProxyError::Unsupported(format!(
            "{what} on the tokenized value path {path} cannot be kept correct: tokenized values keep no order and are not strings"
        ))
    };
    match v {
        Bson::Document(d) => {
            for (op, operand) in d {
                match op.as_str() {
                    "$gt" | "$gte" | "$lt" | "$lte" => {
                        return Err(refuse_value(&format!("a range query ({op})")))
                    }
                    "$type" => return Err(refuse_value("$type")),
                    "$regex" => {
                        let pattern = operand.as_str().unwrap_or_default();
                        let options = d.get_str("$options").unwrap_or_default();
                        if super::paths::compile_regex(pattern, options).is_none() {
                            return Err(refuse_value(&format!("the regular expression /{pattern}/ (look-around or back-references)")));
                        }
                    }
                    "$not" | "$elemMatch" => check_value_condition(path, operand)?,
                    _ => {}
                }
            }
        }
        Bson::RegularExpression(r)
            if super::paths::compile_regex(&r.pattern, &r.options).is_none() =>
        {
            return Err(refuse_value(&format!(
                "the regular expression /{}/",
                r.pattern
            )));
        }
        _ => {}
    }
    Ok(())
}
