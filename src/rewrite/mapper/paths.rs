//! ④ Logical names → tokens, for documents, paths, filters, projections and
//! sorts. Pure: tokens come from a [`Names`] lookup that never allocates;
//! [`collect_names`] says which names a write needs allocated first.
//!
//! A name with no token yet stays as it is (escaped if it would read as a
//! token): no stored document can hold its token, so a query naming it
//! behaves as it would directly, and reading never allocates.

use std::borrow::Cow;

use bson::{Bson, Document};

use bson::spec::BinarySubtype;
use bson::Binary;

use crate::error::ProxyError;
use crate::token::namespace::{escape, value_bytes, VALUE_SUBTYPE};
use crate::token::{Names, Policy};

/// Names in a document that `policy` tokenizes, for allocation before a write.
pub fn collect_names(doc: &Document, policy: &Policy, out: &mut Vec<String>) {
    let mut path = Vec::new();
    collect_in(doc, policy, &mut path, out);
}

/// The same for a value that lands at the logical path `at` (an update's
/// `$set: {custom: {…}}`, say).
pub fn collect_names_at<'a>(v: &'a Bson, at: &[&'a str], policy: &Policy, out: &mut Vec<String>) {
    let mut path = at.to_vec();
    collect_value(v, policy, &mut path, out);
}

fn collect_in<'a>(
    doc: &'a Document,
    policy: &Policy,
    path: &mut Vec<&'a str>,
    out: &mut Vec<String>,
) {
    for (k, v) in doc {
        if policy.tokenizes(path, k) && !out.iter().any(|n| n == k) {
            out.push(k.clone());
        }
        path.push(k);
        collect_value(v, policy, path, out);
        path.pop();
    }
}

fn collect_value<'a>(v: &'a Bson, policy: &Policy, path: &mut Vec<&'a str>, out: &mut Vec<String>) {
    match v {
        Bson::Document(d) => collect_in(d, policy, path, out),
        Bson::Array(a) => a.iter().for_each(|x| collect_value(x, policy, path, out)),
        _ => {}
    }
}

/// String values at the policy's value paths, for allocation before a write.
pub fn collect_values(doc: &Document, policy: &Policy, out: &mut Vec<String>) {
    collect_values_in(doc, policy, &mut Vec::new(), out);
}

fn collect_values_in<'a>(
    doc: &'a Document,
    policy: &Policy,
    path: &mut Vec<&'a str>,
    out: &mut Vec<String>,
) {
    for (k, v) in doc {
        path.push(k);
        collect_values_at(v, policy, path, out);
        path.pop();
    }
}

/// Strings in `v`, which sits at `path`.
pub fn collect_values_at<'a>(
    v: &'a Bson,
    policy: &Policy,
    path: &mut Vec<&'a str>,
    out: &mut Vec<String>,
) {
    match v {
        Bson::String(s) if policy.is_value_path(path) && !out.iter().any(|x| x == s) => {
            out.push(s.clone());
        }
        Bson::Document(d) if policy.is_value_path(path) => {
            // `$each` of a `$push`/`$addToSet`.
            if let Some(e) = d.get("$each") {
                collect_values_at(e, policy, path, out);
            }
        }
        Bson::Document(d) => collect_values_in(d, policy, path, out),
        Bson::Array(a) => a
            .iter()
            .for_each(|x| collect_values_at(x, policy, path, out)),
        _ => {}
    }
}

/// A value at a value path: strings with a token become value tokens.
pub fn value_literal(v: &Bson, names: &dyn Names) -> Bson {
    match v {
        Bson::String(s) => match names.value_token(s) {
            Some(t) => value_token(t),
            None => v.clone(),
        },
        Bson::Array(a) => Bson::Array(a.iter().map(|x| value_literal(x, names)).collect()),
        Bson::Document(d) if d.contains_key("$each") => {
            let mut out = d.clone();
            if let Some(e) = d.get("$each") {
                out.insert("$each", value_literal(e, names));
            }
            Bson::Document(out)
        }
        other => other.clone(),
    }
}

/// A value stored at a value path: strings become value tokens (in arrays
/// too); a document is stored as any other, except an update's
/// `{$each: […]}`, whose elements are values.
pub fn value_at(v: &Bson, parent: &mut Vec<String>, policy: &Policy, names: &dyn Names) -> Bson {
    match v {
        Bson::String(_) => value_literal(v, names),
        Bson::Array(a) => Bson::Array(
            a.iter()
                .map(|x| value_at(x, parent, policy, names))
                .collect(),
        ),
        Bson::Document(d) if d.contains_key("$each") => {
            let mut out = d.clone();
            if let Some(e) = d.get("$each") {
                out.insert("$each", value_at(e, parent, policy, names));
            }
            Bson::Document(out)
        }
        Bson::Document(d) => Bson::Document(document(d, parent, policy, names)),
        other => other.clone(),
    }
}

pub fn value_token(t: u32) -> Bson {
    Bson::Binary(Binary {
        subtype: BinarySubtype::UserDefined(VALUE_SUBTYPE),
        bytes: {
            let (b, len) = value_bytes(t);
            b[..len].to_vec()
        },
    })
}

/// The stored form of one key found under the logical path `parent`.
pub fn key<'k>(parent: &[&str], k: &'k str, policy: &Policy, names: &dyn Names) -> Cow<'k, str> {
    if policy.tokenizes(parent, k) {
        if let Some(t) = names.token(k) {
            return Cow::Owned(t.as_str().to_owned());
        }
    }
    escape(k)
}

/// A document as it is stored: keys tokenized in their scope, order kept.
pub fn document(
    doc: &Document,
    parent: &mut Vec<String>,
    policy: &Policy,
    names: &dyn Names,
) -> Document {
    let mut out = Document::new();
    for (k, v) in doc {
        let stored = {
            let p: Vec<&str> = parent.iter().map(String::as_str).collect();
            key(&p, k, policy, names).into_owned()
        };
        parent.push(k.clone());
        let v = if policy.is_value_path(parent) {
            value_at(v, parent, policy, names)
        } else {
            value(v, parent, policy, names)
        };
        out.insert(stored, v);
        parent.pop();
    }
    out
}

fn value(v: &Bson, parent: &mut Vec<String>, policy: &Policy, names: &dyn Names) -> Bson {
    match v {
        Bson::Document(d) => Bson::Document(document(d, parent, policy, names)),
        Bson::Array(a) => Bson::Array(a.iter().map(|x| value(x, parent, policy, names)).collect()),
        other => other.clone(),
    }
}

/// Whether a path component is positional or an index: kept as it is.
fn is_positional(c: &str) -> bool {
    c == "$"
        || c == "$[]"
        || (c.starts_with("$[") && c.ends_with(']'))
        || c == "$**"
        || crate::token::policy::is_index_like(c.as_bytes())
}

/// A dotted path, tokenized one component at a time in its parent's scope.
/// `parent` is the logical path the path is relative to.
pub fn path(p: &str, parent: &[String], policy: &Policy, names: &dyn Names) -> String {
    let mut scope: Vec<&str> = parent.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    for c in p.split('.') {
        if is_positional(c) {
            out.push(Cow::Borrowed(c));
            continue;
        }
        out.push(key(&scope, c, policy, names));
        scope.push(c);
    }
    out.join(".")
}

/// The components of a path that name fields (positional parts and array
/// indexes left out): the logical scope the rest of the path lives in.
pub fn logical_parts(p: &str) -> impl Iterator<Item = &str> {
    p.split('.')
        .filter(|c| !is_positional(c) && !c.starts_with('$'))
}

/// A dotted path of an aggregation (a stage's output key, a `$field.path`
/// in an expression) after `parent`. Every part is a field's name: such a
/// path does not index arrays, so a part of digits alone names a field too
/// (`{$project: {"7": …}}` puts a field `7` at the top, not the top itself).
pub fn fields(parent: &[String], p: &str) -> Vec<String> {
    let mut v = parent.to_vec();
    v.extend(p.split('.').map(str::to_owned));
    v
}

pub fn logical(parent: &[String], p: &str) -> Vec<String> {
    let mut v = parent.to_vec();
    v.extend(logical_parts(p).map(str::to_owned));
    v
}

/// How a filter's `$expr` and `$jsonSchema` are rewritten (by the
/// aggregation and schema rewriters, which may refuse them).
pub type Special<'a> = &'a dyn Fn(&str, &Bson) -> Result<Bson, ProxyError>;

/// The clauses of an `$and`, `$or` or `$nor`, each document rewritten by
/// `f` (anything else left for the server to refuse).
pub(super) fn clauses(
    a: &[Bson],
    mut f: impl FnMut(&Document) -> Result<Document, ProxyError>,
) -> Result<Vec<Bson>, ProxyError> {
    a.iter()
        .map(|s| match s {
            Bson::Document(d) => f(d).map(Bson::Document),
            other => Ok(other.clone()),
        })
        .collect()
}

/// A query filter relative to `parent`; its `$expr` and `$jsonSchema` are
/// rewritten by `expr`.
pub fn filter(
    f: &Document,
    parent: &[String],
    policy: &Policy,
    names: &dyn Names,
    expr: Special<'_>,
) -> Result<Document, ProxyError> {
    let mut out = Document::new();
    for (k, v) in f {
        match k.as_str() {
            "$and" | "$or" | "$nor" => {
                let subs = match v {
                    Bson::Array(a) => clauses(a, |d| filter(d, parent, policy, names, expr))?,
                    _ => Vec::new(),
                };
                out.insert(k.clone(), subs);
            }
            "$expr" | "$jsonSchema" => {
                out.insert(k.clone(), expr(k, v)?);
            }
            k if k.starts_with('$') => {
                // $text, $comment, … ($where is refused before this).
                out.insert(k.to_owned(), v.clone());
            }
            p => {
                let scope = logical(parent, p);
                out.insert(
                    path(p, parent, policy, names),
                    condition(v, &scope, policy, names, expr)?,
                );
            }
        }
    }
    Ok(out)
}

/// The value under a path in a filter: an operator document or a literal.
pub(super) fn condition(
    v: &Bson,
    scope: &[String],
    policy: &Policy,
    names: &dyn Names,
    expr: Special<'_>,
) -> Result<Bson, ProxyError> {
    if policy.is_value_path(scope) {
        // Checked here, where the whole path is known (an `$elemMatch`'s
        // fields are below the array it matches in).
        super::query::check_value_condition(&scope.join("."), v)?;
        return value_condition(v, scope, policy, names, expr);
    }
    Ok(match v {
        Bson::Document(d) if d.keys().next().is_some_and(|k| k.starts_with('$')) => {
            let mut out = Document::new();
            for (op, operand) in d {
                let rewritten = match op.as_str() {
                    "$elemMatch" => match operand {
                        Bson::Document(e)
                            if e.keys().next().is_some_and(|k| k.starts_with('$')) =>
                        {
                            condition(operand, scope, policy, names, expr)?
                        }
                        Bson::Document(e) => Bson::Document(filter(e, scope, policy, names, expr)?),
                        other => other.clone(),
                    },
                    "$not" => condition(operand, scope, policy, names, expr)?,
                    "$eq" | "$ne" | "$gt" | "$gte" | "$lt" | "$lte" | "$in" | "$nin" | "$all" => {
                        literal(operand, scope, policy, names)
                    }
                    _ => operand.clone(),
                };
                out.insert(op.clone(), rewritten);
            }
            Bson::Document(out)
        }
        other => literal(other, scope, policy, names),
    })
}

/// A condition on a value path: strings compared through the dictionary, and
/// a regular expression matched against the dictionary, becoming `$in` the
/// matching tokens (and the expression itself, for values never tokenized).
/// What the path holds besides strings is compared as it is stored: a
/// document's names as any document's, and an `$elemMatch` of field
/// conditions is a filter on the documents the array holds.
fn value_condition(
    v: &Bson,
    scope: &[String],
    policy: &Policy,
    names: &dyn Names,
    expr: Special<'_>,
) -> Result<Bson, ProxyError> {
    let literal = |x: &Bson| value_at(x, &mut scope.to_vec(), policy, names);
    let is_operators = |d: &Document| d.keys().next().is_some_and(|k| k.starts_with('$'));
    Ok(match v {
        Bson::Document(d) if is_operators(d) => {
            let mut out = Document::new();
            for (op, operand) in d {
                match op.as_str() {
                    "$regex" => {
                        let options = d.get_str("$options").unwrap_or_default();
                        let pattern = match operand {
                            Bson::String(p) => p.clone(),
                            Bson::RegularExpression(r) => r.pattern.clone(),
                            _ => continue,
                        };
                        match regex_in(&pattern, options, names) {
                            Some(list) => {
                                out.insert("$in", list);
                            }
                            None => {
                                out.insert("$regex", operand.clone());
                                if !options.is_empty() {
                                    out.insert("$options", options);
                                }
                            }
                        }
                    }
                    "$options" => {}
                    "$elemMatch" => {
                        let rewritten = match operand {
                            Bson::Document(e) if !e.is_empty() && !is_operators(e) => {
                                Bson::Document(filter(e, scope, policy, names, expr)?)
                            }
                            other => value_condition(other, scope, policy, names, expr)?,
                        };
                        out.insert(op.clone(), rewritten);
                    }
                    "$not" => {
                        out.insert(
                            op.clone(),
                            value_condition(operand, scope, policy, names, expr)?,
                        );
                    }
                    _ => {
                        out.insert(op.clone(), literal(operand));
                    }
                }
            }
            Bson::Document(out)
        }
        Bson::RegularExpression(r) => match regex_in(&r.pattern, &r.options, names) {
            Some(list) => Bson::Document(bson::doc! {"$in": list}),
            None => v.clone(),
        },
        other => literal(other),
    })
}

/// The tokens whose values match, plus the expression for untokenized
/// values; `None` when no value of the dictionary matches, and the
/// expression stays as it came: `$in` the expression alone would be an
/// equality to an upsert, which would store the expression as the value.
fn regex_in(pattern: &str, options: &str, names: &dyn Names) -> Option<Bson> {
    let re = compile_regex(pattern, options)?;
    let mut list: Vec<Bson> = names
        .values()
        .into_iter()
        .filter(|(_, value)| re.is_match(value))
        .map(|(t, _)| value_token(t))
        .collect();
    if list.is_empty() {
        return None;
    }
    list.push(Bson::RegularExpression(bson::Regex {
        pattern: pattern.to_owned(),
        options: options.to_owned(),
    }));
    Some(Bson::Array(list))
}

/// A MongoDB regular expression as a Rust one; `None` if it uses syntax the
/// regex crate lacks (look-around, back-references), which callers refuse.
pub fn compile_regex(pattern: &str, options: &str) -> Option<regex::Regex> {
    regex::RegexBuilder::new(pattern)
        .case_insensitive(options.contains('i'))
        .multi_line(options.contains('m'))
        .dot_matches_new_line(options.contains('s'))
        .ignore_whitespace(options.contains('x'))
        .build()
        .ok()
}

/// A literal value compared with stored data: documents inside are stored-form.
fn literal(v: &Bson, scope: &[String], policy: &Policy, names: &dyn Names) -> Bson {
    let mut parent = scope.to_vec();
    value(v, &mut parent, policy, names)
}

/// A sort, hint or key pattern relative to `parent`: keys are paths, values
/// (1, -1, "text", `{$meta: …}`) stay.
pub fn paths_document(
    p: &Document,
    parent: &[String],
    policy: &Policy,
    names: &dyn Names,
) -> Document {
    let mut out = Document::new();
    for (k, v) in p {
        if k.starts_with('$') {
            out.insert(k.clone(), v.clone());
            continue;
        }
        out.insert(path(k, parent, policy, names), v.clone());
    }
    out
}

#[cfg(test)]
mod tests;
