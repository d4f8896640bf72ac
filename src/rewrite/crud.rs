//! ④ Tokenization of whole commands: which parts of each command carry
//! names, and in which form (catalogue §3–4). Commands that carry names in a
//! form not handled here are refused with an error naming the construct.

use bson::{Bson, Document};

use super::command::Command;
use super::tokenize::{document, logical_parts, path, paths_document};
use crate::error::ProxyError;
use crate::token::{Migration, Names, Policies, Policy};

/// Tokenizes `cmd` in place with the dictionary of the database `scope`,
/// under the policy of each collection it addresses.
pub fn command(
    cmd: &mut Command,
    scope: &str,
    policies: &Policies,
    names: &dyn Names,
) -> Result<(), ProxyError> {
    let name = cmd.name().to_owned();
    tokenize_command(&name, &mut cmd.body, scope, policies, names)
}

/// The collection a command addresses: the string value of its first field.
fn collection_of(body: &Document) -> &str {
    match body.iter().next() {
        Some((_, Bson::String(c))) => c,
        _ => "",
    }
}

/// The namespace of each `nsInfo` entry of a bulkWrite, by index.
pub fn bulk_write_namespaces(cmd: &Command) -> Vec<String> {
    namespaces_of(&cmd.body)
}

fn namespaces_of(body: &Document) -> Vec<String> {
    body.get_array("nsInfo")
        .map(|a| {
            a.iter()
                .map(|ns| {
                    ns.as_document()
                        .and_then(|d| d.get_str("ns").ok())
                        .unwrap_or_default()
                        .to_owned()
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Each bulkWrite op whose namespace lies in the database `scope`, with its
/// kind and namespace.
fn bulk_ops_in<'a>(
    body: &'a Document,
    namespaces: &'a [String],
    scope: &str,
) -> Vec<(String, &'a str, &'a Document)> {
    body.get_array("ops")
        .map(|ops| {
            ops.iter()
                .filter_map(Bson::as_document)
                .filter_map(|op| {
                    let ns = op_namespace(op, namespaces).filter(|ns| in_db(ns, scope))?;
                    op.keys().next().map(|k| (k.clone(), ns, op))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The namespace a bulkWrite op (`{insert|update|delete: <nsInfo index>, …}`)
/// addresses.
fn op_namespace<'a>(op: &Document, namespaces: &'a [String]) -> Option<&'a str> {
    op.values()
        .next()
        .and_then(|v| v.as_i32().map(i64::from).or(v.as_i64()))
        .and_then(|i| usize::try_from(i).ok())
        .and_then(|i| namespaces.get(i))
        .map(String::as_str)
}

fn in_db(ns: &str, db: &str) -> bool {
    ns.split_once('.').is_some_and(|(d, _)| d == db)
}

fn tokenize_command(
    name: &str,
    body: &mut Document,
    scope: &str,
    policies: &Policies,
    names: &dyn Names,
) -> Result<(), ProxyError> {
    let t = Tok::new(policies, scope, collection_of(body), names);
    match name {
        "insert" => t.each(body, "documents", |t, d| {
            *d = t.stored(d);
            Ok(())
        })?,
        "update" => t.each(body, "updates", |t, u| t.write_op(u, "q", "u"))?,
        "delete" => t.each(body, "deletes", |t, d| t.filter_at(d, "q"))?,
        "find" => {
            t.filter_at(body, "filter")?;
            t.projection_at(body, "projection")?;
            t.sort_at(body, "sort")?;
            for k in ["min", "max"] {
                t.paths_at(body, k);
            }
            t.hint(body);
        }
        "findAndModify" | "findandmodify" => {
            t.update_filter_at(body, "query", "update")?;
            t.sort_at(body, "sort")?;
            t.projection_at(body, "fields")?;
            t.hint(body);
            t.update(body, "update")?;
            t.array_filters(body);
        }
        "count" => {
            t.filter_at(body, "query")?;
            t.hint(body);
        }
        "distinct" => {
            t.filter_at(body, "query")?;
            t.hint(body);
            if let Ok(k) = body.get_str("key") {
                let k = path(k, &[], t.policy, names);
                body.insert("key", k);
            }
        }
        "aggregate" => {
            if let Ok(stages) = body.get_array_mut("pipeline") {
                t.pipeline(stages)?;
            }
            t.hint(body);
            if let Ok(v) = body.get_document("let") {
                let v = t.let_vars(v)?;
                body.insert("let", v);
            }
        }
        "createIndexes" => t.each(body, "indexes", |t, ix| {
            t.paths_at(ix, "key");
            t.filter_at(ix, "partialFilterExpression")?;
            t.paths_at(ix, "wildcardProjection");
            t.paths_at(ix, "weights");
            t.path_string_at(ix, "language_override");
            Ok(())
        })?,
        "dropIndexes" | "deleteIndexes" => t.paths_at(body, "index"),
        "explain" => {
            if let Some(Bson::Document(inner)) = body.get_mut("explain") {
                let inner_name = inner.keys().next().cloned().unwrap_or_default();
                tokenize_command(&inner_name, inner, scope, policies, names)?;
            }
        }
        "mapReduce" | "mapreduce" => {
            return Err(refuse("mapReduce (JavaScript reads field names)"))
        }
        "bulkWrite" => bulk_write(body, scope, policies, names)?,
        "create" | "collMod" => {
            t.filter_at(body, "validator")?;
            if let Ok(ts) = body.get_document_mut("timeseries") {
                t.path_string_at(ts, "timeField");
                t.path_string_at(ts, "metaField");
            }
            if let Ok(ix) = body.get_document_mut("index") {
                t.paths_at(ix, "keyPattern");
            }
            // A view's pipeline runs on the collection it is defined on.
            let source = body.get_str("viewOn").map(|v| t.for_collection(v));
            if let (Ok(source), Ok(stages)) = (source, body.get_array_mut("pipeline")) {
                source.pipeline(stages)?;
            }
        }
        n if NO_NAMES.contains(&n) || policies.pass_through.iter().any(|p| p == n) => {}
        other => {
            return Err(ProxyError::Unsupported(format!(
                "the command {other} is unknown to Laconic, so the field names it may carry cannot be rewritten (list it in proxy.tokenize.pass_through if it carries none)"
            )))
        }
    }
    Ok(())
}

/// A bulkWrite: each op under its own namespace and that namespace's
/// policy; only the ops in the tokenized database `scope` are rewritten.
fn bulk_write(
    body: &mut Document,
    scope: &str,
    policies: &Policies,
    names: &dyn Names,
) -> Result<(), ProxyError> {
    let namespaces = namespaces_of(body);
    let Ok(ops) = body.get_array_mut("ops") else {
        return Ok(());
    };
    for op in ops.iter_mut() {
        let Bson::Document(op) = op else { continue };
        let Some(ns) = op_namespace(op, &namespaces).filter(|ns| in_db(ns, scope)) else {
            continue;
        };
        let (db, coll) = ns.split_once('.').unwrap_or((ns, ""));
        let t = Tok::new(policies, db, coll, names);
        let kind = op.keys().next().cloned().unwrap_or_default();
        match kind.as_str() {
            "insert" => {
                if let Ok(d) = op.get_document("document") {
                    let d = t.stored(d);
                    op.insert("document", d);
                }
            }
            "update" => {
                t.write_op(op, "filter", "updateMods")?;
                t.sort_at(op, "sort")?;
            }
            "delete" => {
                t.filter_at(op, "filter")?;
                t.hint(op);
            }
            _ => {}
        }
    }
    Ok(())
}

/// Whether an update is a partial one: update operators or a pipeline.
fn is_partial(u: Option<&Bson>) -> bool {
    match u {
        Some(Bson::Array(_)) => true,
        Some(Bson::Document(u)) => u.keys().next().is_some_and(|k| k.starts_with('$')),
        _ => false,
    }
}

/// While a collection migrates, the filters (matching both stored forms)
/// of an `update`'s or `findAndModify`'s operator and pipeline updates: the
/// session brings the documents they match to the stored form before the
/// command runs, so that the update meets one form only. `cmd` is the
/// command as the driver sent it.
pub fn migration_filters(
    cmd: &Command,
    db: &str,
    policies: &Policies,
    names: &dyn Names,
) -> Result<Vec<Document>, ProxyError> {
    let t = Tok::new(policies, db, cmd.collection().unwrap_or_default(), names);
    if t.migrating.is_none() {
        return Ok(Vec::new());
    }
    let filter = |d: &Document, key: &str| {
        t.checked_filter(&d.get_document(key).cloned().unwrap_or_default(), &[])
    };
    match cmd.name() {
        "update" => cmd
            .body
            .get_array("updates")
            .map(|ops| {
                ops.iter()
                    .filter_map(Bson::as_document)
                    .filter(|op| is_partial(op.get("u")))
                    .map(|op| filter(op, "q"))
                    .collect()
            })
            .unwrap_or(Ok(Vec::new())),
        "findAndModify" | "findandmodify" if is_partial(cmd.body.get("update")) => {
            Ok(vec![filter(&cmd.body, "query")?])
        }
        _ => Ok(Vec::new()),
    }
}

/// Commands that carry no field names (or none the proxy must rewrite).
const NO_NAMES: &[&str] = &[
    "getMore",
    "killCursors",
    "listIndexes",
    "listCollections",
    "drop",
    "dropDatabase",
    "collStats",
    "dbStats",
    "dataSize",
    "validate",
    "ping",
    "hello",
    "isMaster",
    "ismaster",
    "buildInfo",
    "buildinfo",
    "serverStatus",
    "connectionStatus",
    "endSessions",
    "startSession",
    "refreshSessions",
    "commitTransaction",
    "abortTransaction",
    "killAllSessions",
    "killAllSessionsByPattern",
    "killSessions",
    "saslStart",
    "saslContinue",
    "authenticate",
    "logout",
    "getnonce",
    "getLastError",
    "getlasterror",
    "listDatabases",
    "currentOp",
    "killOp",
    "hostInfo",
    "getParameter",
    "getCmdLineOpts",
    "getLog",
    "whatsmyuri",
    "profile",
    "compact",
    "reIndex",
    "convertToCapped",
    "cloneCollectionAsCapped",
    "fsync",
    "fsyncUnlock",
    "top",
    "lockInfo",
    "dbHash",
    "createUser",
    "updateUser",
    "dropUser",
    "dropAllUsersFromDatabase",
    "usersInfo",
    "createRole",
    "updateRole",
    "dropRole",
    "dropAllRolesFromDatabase",
    "rolesInfo",
    "grantRolesToUser",
    "revokeRolesFromUser",
    "grantRolesToRole",
    "revokeRolesFromRole",
    "grantPrivilegesToRole",
    "revokePrivilegesFromRole",
    "listCommands",
    "features",
    "filemd5",
    "getDefaultRWConcern",
    "setDefaultRWConcern",
    "replSetGetStatus",
    "isdbgrid",
    "listSearchIndexes",
];

pub(super) fn refuse(what: &str) -> ProxyError {
    ProxyError::Unsupported(format!("{what} cannot be rewritten to tokenized names"))
}

/// The rewriting context of one collection: its policy, its database's
/// dictionary, and the policies of the other collections it may name.
#[derive(Clone, Copy)]
pub(super) struct Tok<'a> {
    pub(super) policies: &'a Policies,
    pub(super) db: &'a str,
    pub(super) policy: &'a Policy,
    pub(super) names: &'a dyn Names,
    /// The collection is being migrated (its documents are in both forms),
    /// and which way.
    pub(super) migrating: Option<Migration>,
}

impl<'a> Tok<'a> {
    fn new(policies: &'a Policies, db: &'a str, coll: &str, names: &'a dyn Names) -> Tok<'a> {
        Tok {
            policies,
            db,
            policy: policies.get(db, coll),
            names,
            migrating: policies.migration(db, coll),
        }
    }

    /// The same database's collection `coll` (same dictionary, its own policy).
    pub(super) fn for_collection(&self, coll: &str) -> Tok<'a> {
        Tok {
            policy: self.policies.get(self.db, coll),
            migrating: self.policies.migration(self.db, coll),
            ..*self
        }
    }

    fn doc(&self, d: &Document) -> Document {
        document(d, &mut Vec::new(), self.policy, self.names)
    }

    /// A document as it is stored: tokenized, or as written while
    /// `laconic migrate --reverse` writes the collection back to full names.
    fn stored(&self, d: &Document) -> Document {
        if self.migrating == Some(Migration::Reverse) {
            d.clone()
        } else {
            self.doc(d)
        }
    }

    fn each(
        &self,
        body: &mut Document,
        key: &str,
        mut f: impl FnMut(&Self, &mut Document) -> Result<(), ProxyError>,
    ) -> Result<(), ProxyError> {
        if let Ok(items) = body.get_array_mut(key) {
            for item in items.iter_mut() {
                if let Bson::Document(d) = item {
                    f(self, d)?;
                }
            }
        }
        Ok(())
    }

    fn filter_at(&self, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
        if let Ok(f) = parent.get_document(key) {
            let f = self.checked_filter(f, &[])?;
            parent.insert(key.to_owned(), f);
        }
        Ok(())
    }

    fn paths_at(&self, parent: &mut Document, key: &str) {
        if let Ok(p) = parent.get_document(key) {
            let p = paths_document(p, &[], self.policy, self.names);
            parent.insert(key.to_owned(), p);
        }
    }

    /// A string holding one path (`timeField`, `language_override`).
    fn path_string_at(&self, parent: &mut Document, key: &str) {
        if let Ok(p) = parent.get_str(key) {
            let p = path(p, &[], self.policy, self.names);
            parent.insert(key.to_owned(), p);
        }
    }

    fn sort_at(&self, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
        if let Ok(s) = parent.get_document(key) {
            let s = self.sort(s, &[])?;
            parent.insert(key.to_owned(), s);
        }
        Ok(())
    }

    fn projection_at(&self, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
        if let Ok(p) = parent.get_document(key) {
            let p = self.projection(p, &[])?;
            parent.insert(key.to_owned(), p);
        }
        Ok(())
    }

    /// A hint document is a key pattern; a string names an index: left alone.
    fn hint(&self, parent: &mut Document) {
        self.paths_at(parent, "hint");
    }

    /// The filter of an update. While the collection migrates, an operator
    /// or pipeline update (of an `update` or `findAndModify`) meets its
    /// documents in the stored form only (see `migration_filters`), so its
    /// filter names that form alone, and an upsert seeds its new document
    /// from the filter as it would without the proxy.
    fn update_filter_at(
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
                Tok {
                    migrating: None,
                    ..*self
                }
                .filter_at(parent, filter_key)
            }
            _ => self.filter_at(parent, filter_key),
        }
    }

    fn write_op(
        &self,
        op: &mut Document,
        filter_key: &str,
        update_key: &str,
    ) -> Result<(), ProxyError> {
        self.update_filter_at(op, filter_key, update_key)?;
        self.update(op, update_key)?;
        self.array_filters(op);
        self.hint(op);
        Ok(())
    }

    fn update(&self, parent: &mut Document, key: &str) -> Result<(), ProxyError> {
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
                            (_, v) if self.policy.is_value_path(&scope) => {
                                super::tokenize::value_at(
                                    v,
                                    &mut scope.clone(),
                                    self.policy,
                                    self.names,
                                )
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

    /// arrayFilters: `<id>` stays; the path after it is tokenized by name.
    fn array_filters(&self, parent: &mut Document) {
        let Ok(filters) = parent.get_array_mut("arrayFilters") else {
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

/// Filter constructs that cannot be rewritten: JavaScript reads field names;
/// tokenized values keep no order and are not strings.
pub(super) fn check_filter(f: &Document, policy: &Policy) -> Result<(), ProxyError> {
    for (k, v) in f {
        match (k.as_str(), v) {
            ("$where", _) => return Err(refuse("$where (JavaScript reads field names)")),
            ("$and" | "$or" | "$nor", Bson::Array(a)) => {
                for sub in a {
                    if let Bson::Document(d) = sub {
                        check_filter(d, policy)?;
                    }
                }
            }
            (p, v) if is_value_path(policy, p) => check_value_condition(p, v)?,
            _ => {}
        }
    }
    Ok(())
}

fn is_value_path(policy: &Policy, p: &str) -> bool {
    let parts: Vec<&str> = logical_parts(p).collect();
    policy.is_value_path(&parts)
}

fn check_value_condition(path: &str, v: &Bson) -> Result<(), ProxyError> {
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
                        if super::tokenize::compile_regex(pattern, options).is_none() {
                            return Err(refuse_value(&format!("the regular expression /{pattern}/ (look-around or back-references)")));
                        }
                    }
                    "$not" | "$elemMatch" => check_value_condition(path, operand)?,
                    _ => {}
                }
            }
        }
        Bson::RegularExpression(r)
            if super::tokenize::compile_regex(&r.pattern, &r.options).is_none() =>
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

/// What a write needs allocated before it is forwarded.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ToAllocate {
    pub names: Vec<String>,
    pub values: Vec<String>,
}

/// The names and values a write needs tokens for, in the order they appear.
pub fn names_to_allocate(cmd: &Command, scope: &str, policies: &Policies) -> ToAllocate {
    use super::tokenize::{collect_names, collect_names_at, collect_values, collect_values_at};
    let mut out = ToAllocate::default();
    let body = &cmd.body;
    let policy = policies.get(scope, collection_of(body));
    let docs = |key: &str| -> Vec<&Document> {
        body.get_array(key)
            .map(|a| a.iter().filter_map(Bson::as_document).collect())
            .unwrap_or_default()
    };
    let update = |u: Option<&Bson>, policy: &Policy, out: &mut ToAllocate| match u {
        Some(Bson::Document(u)) if u.keys().next().is_some_and(|k| k.starts_with('$')) => {
            for (_, fields) in u {
                let Bson::Document(fields) = fields else {
                    continue;
                };
                for (p, v) in fields {
                    note(p, policy, &[], &mut out.names);
                    let mut parent: Vec<&str> = logical_parts(p).collect();
                    collect_names_at(v, &parent, policy, &mut out.names);
                    collect_values_at(v, policy, &mut parent, &mut out.values);
                }
            }
        }
        Some(Bson::Document(replacement)) => {
            collect_names(replacement, policy, &mut out.names);
            collect_values(replacement, policy, &mut out.values);
        }
        // A pipeline update may write any name it mentions.
        Some(stages @ Bson::Array(_)) => collect_keys(stages, policy, &mut Vec::new(), out),
        _ => {}
    };
    match cmd.name() {
        "insert" => {
            for d in docs("documents") {
                collect_names(d, policy, &mut out.names);
                collect_values(d, policy, &mut out.values);
            }
        }
        "update" => docs("updates")
            .into_iter()
            .for_each(|u| update(u.get("u"), policy, &mut out)),
        "findAndModify" | "findandmodify" => update(body.get("update"), policy, &mut out),
        // Indexes, validators, views, time-series fields and the output of
        // $out/$merge name the fields documents will be stored with: every
        // name they mention needs its token now, or they would name the
        // long forms.
        "createIndexes" | "create" | "collMod" => return names_mentioned(cmd, scope, policies),
        "aggregate" if writes_output(body) => return names_mentioned(cmd, scope, policies),
        "bulkWrite" => {
            let namespaces = bulk_write_namespaces(cmd);
            for (kind, ns, op) in bulk_ops_in(body, &namespaces, scope) {
                let policy = policies.for_namespace(ns);
                match kind.as_str() {
                    "insert" => {
                        if let Ok(d) = op.get_document("document") {
                            collect_names(d, policy, &mut out.names);
                            collect_values(d, policy, &mut out.values);
                        }
                    }
                    "update" => update(op.get("updateMods"), policy, &mut out),
                    _ => {}
                }
            }
        }
        _ => {}
    }
    out
}

/// Whether a pipeline ends by storing its output ($out, $merge).
fn writes_output(body: &Document) -> bool {
    body.get_array("pipeline").is_ok_and(|p| {
        p.iter().any(|s| {
            s.as_document()
                .and_then(|s| s.keys().next())
                .is_some_and(|k| k == "$out" || k == "$merge")
        })
    })
}

/// Every name and value the command would store as a token: a dry run of
/// the rewrite through a dictionary that records what it is asked.
fn names_mentioned(cmd: &Command, scope: &str, policies: &Policies) -> ToAllocate {
    let recorder = crate::token::Recorder::default();
    let mut copy = cmd.clone();
    // A refusal is reported by the real rewrite that follows.
    let _ = command(&mut copy, scope, policies, &recorder);
    ToAllocate {
        names: recorder.names.into_inner(),
        values: recorder.values.into_inner(),
    }
}

/// Path components and values in a command that could be tokens: the cache
/// must know about them before deciding they have none. Only the parts of a
/// command that carry field names are looked at (not `ordered`, `upsert`,
/// `batchSize`, …), so that commands naming no new field cost no round trip.
pub fn names_to_resolve(cmd: &Command, scope: &str, policies: &Policies) -> ToAllocate {
    let mut out = ToAllocate::default();
    resolve_in(cmd.name(), &cmd.body, scope, policies, &mut out);
    out
}

fn resolve_in(name: &str, body: &Document, scope: &str, policies: &Policies, out: &mut ToAllocate) {
    let policy = policies.get(scope, collection_of(body));
    let walk = |v: Option<&Bson>, out: &mut ToAllocate| {
        if let Some(v) = v {
            collect_keys(v, policy, &mut Vec::new(), out);
        }
    };
    let items = |key: &str| -> Vec<&Document> {
        body.get_array(key)
            .map(|a| a.iter().filter_map(Bson::as_document).collect())
            .unwrap_or_default()
    };
    match name {
        "find" => {
            for k in ["filter", "projection", "sort", "hint", "min", "max"] {
                walk(body.get(k), out);
            }
        }
        "update" => {
            for u in items("updates") {
                for k in ["q", "u", "arrayFilters", "hint"] {
                    walk(u.get(k), out);
                }
            }
        }
        "delete" => {
            for d in items("deletes") {
                walk(d.get("q"), out);
            }
        }
        "findAndModify" | "findandmodify" => {
            for k in ["query", "sort", "fields", "update", "arrayFilters", "hint"] {
                walk(body.get(k), out);
            }
        }
        "count" => walk(body.get("query"), out),
        "distinct" => {
            walk(body.get("query"), out);
            if let Ok(k) = body.get_str("key") {
                note(k, policy, &[], &mut out.names);
            }
        }
        // Every key and path of the pipeline, output names included: they
        // map like any other name.
        "aggregate" => {
            for k in ["pipeline", "hint", "let"] {
                walk(body.get(k), out);
            }
        }
        "bulkWrite" => {
            let namespaces = namespaces_of(body);
            for (_, ns, op) in bulk_ops_in(body, &namespaces, scope) {
                let policy = policies.for_namespace(ns);
                for k in ["filter", "updateMods", "document", "arrayFilters", "sort"] {
                    if let Some(v) = op.get(k) {
                        collect_keys(v, policy, &mut Vec::new(), out);
                    }
                }
            }
        }
        "explain" => {
            if let Ok(inner) = body.get_document("explain") {
                let inner_name = inner.keys().next().cloned().unwrap_or_default();
                resolve_in(&inner_name, inner, scope, policies, out);
            }
        }
        _ => {}
    }
}

fn note(components: &str, policy: &Policy, parent: &[String], out: &mut Vec<String>) {
    let mut scope: Vec<&str> = parent.iter().map(String::as_str).collect();
    for c in logical_parts(components) {
        if policy.tokenizes(&scope, c) && !out.iter().any(|n| n == c) {
            out.push(c.to_owned());
        }
        scope.push(c);
    }
}

fn collect_keys(v: &Bson, policy: &Policy, parent: &mut Vec<String>, out: &mut ToAllocate) {
    match v {
        Bson::Document(d) => {
            for (k, v) in d {
                let depth = parent.len();
                note(k, policy, parent, &mut out.names);
                parent.extend(logical_parts(k).map(str::to_owned));
                collect_keys(v, policy, parent, out);
                parent.truncate(depth);
            }
        }
        Bson::Array(a) => a.iter().for_each(|x| collect_keys(x, policy, parent, out)),
        Bson::String(s) if policy.is_value_path(parent) && !out.values.contains(s) => {
            out.values.push(s.clone());
        }
        Bson::String(s) if policy.is_value_path(parent) => {}
        Bson::String(s) if s.starts_with("$$") => {
            if let Some((_, rest)) = s.split_once('.') {
                note(rest, policy, &[], &mut out.names);
            }
        }
        Bson::String(s) if s.starts_with('$') => {
            note(&s[1..], policy, &[], &mut out.names);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;

    fn cmd(body: Document) -> Command {
        let raw = bson::RawDocumentBuf::from_document(&body).unwrap();
        Command::from_msg(&crate::wire::OpMsg::from_body(
            crate::wire::MsgFlags::default(),
            &raw,
        ))
        .unwrap()
    }

    #[test]
    fn only_name_bearing_parts_are_resolved() {
        let policy = Policies::new(Policy::new(6, &[], "laconic"));
        let update = cmd(doc! {
            "update": "people", "ordered": true, "$db": "app",
            "updates": [{"q": {"first_name": "x"}, "u": {"$set": {"last_name": 1}}, "upsert": true, "multi": false}],
        });
        assert_eq!(
            names_to_resolve(&update, "app", &policy).names,
            vec!["first_name", "last_name"]
        );
        let get_more =
            cmd(doc! {"getMore": 5i64, "collection": "people", "batchSize": 10, "$db": "app"});
        assert!(names_to_resolve(&get_more, "app", &policy).names.is_empty());
        let agg = cmd(doc! {"aggregate": "people", "pipeline": [
            {"$match": {"country": "x"}}, {"$group": {"_id": "$region", "total_count": {"$sum": "$amount"}}}
        ], "cursor": {}, "$db": "app"});
        assert_eq!(
            names_to_resolve(&agg, "app", &policy).names,
            vec!["country", "region", "total_count", "amount"]
        );
    }

    /// Policies tokenizing names of 6+ bytes in `app`, with `app.people`
    /// in the given migration state, and a dictionary that knows the names.
    fn migrating(state: crate::token::MigrationState) -> (Policies, crate::token::Dictionary) {
        let policies = Policies::new(Policy::new(6, &[], "laconic"));
        policies
            .migrating
            .replace([("app.people".to_owned(), state)].into_iter().collect());
        let mut dict = crate::token::Dictionary::default();
        dict.add_names(&["first_name".to_owned(), "last_name".to_owned()]);
        (policies, dict)
    }

    #[test]
    fn while_migrating_partial_updates_name_the_stored_form_only() {
        use crate::token::MigrationState as State;
        let (policies, dict) = migrating(State::Migrating(Migration::Forward));
        let tok = |n: &str| {
            crate::token::Names::token(&dict, n)
                .unwrap()
                .as_str()
                .to_owned()
        };
        let (first, last) = (tok("first_name"), tok("last_name"));
        let update = cmd(doc! {
            "update": "people", "$db": "app",
            "updates": [
                {"q": {"first_name": "x"}, "u": {"$set": {"last_name": 1}}, "upsert": true},
                {"q": {"first_name": "y"}, "u": {"first_name": "z"}},
            ],
        });
        // The documents the operator update will meet, in either form...
        assert_eq!(
            migration_filters(&update, "app", &policies, &dict).unwrap(),
            vec![doc! {"$or": [{&first: "x"}, {"first_name": "x"}]}]
        );
        // ...are brought to the stored form first, so its filter names
        // that form alone; the replacement's filter matches both.
        let mut rewritten = update.clone();
        command(&mut rewritten, "app", &policies, &dict).unwrap();
        let ops = rewritten.body.get_array("updates").unwrap();
        assert_eq!(
            ops[0].as_document().unwrap(),
            &doc! {"q": {&first: "x"}, "u": {"$set": {&last: 1}}, "upsert": true}
        );
        assert_eq!(
            ops[1].as_document().unwrap().get_document("q").unwrap(),
            &doc! {"$or": [{&first: "y"}, {"first_name": "y"}]}
        );
        // A bulkWrite's operator updates wait for the end of the migration.
        let mut bulk = cmd(doc! {
            "bulkWrite": 1, "$db": "admin", "nsInfo": [{"ns": "app.people"}],
            "ops": [{"update": 0, "filter": {}, "updateMods": {"$set": {"last_name": 1}}}],
        });
        assert!(matches!(
            command(&mut bulk, "app", &policies, &dict),
            Err(ProxyError::Unsupported(_))
        ));
        // Not migrating: nothing to bring over.
        let other = cmd(doc! {"update": "other", "$db": "app",
        "updates": [{"q": {"first_name": "x"}, "u": {"$set": {"last_name": 1}}}]});
        assert!(migration_filters(&other, "app", &policies, &dict)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn during_and_after_a_reverse_migration_writes_keep_full_names() {
        use crate::token::MigrationState as State;
        let write = cmd(doc! {
            "update": "people", "$db": "app",
            "updates": [{"q": {"first_name": "x"}, "u": {"$inc": {"last_name": 1}}}],
        });
        let insert = cmd(doc! {"insert": "people", "$db": "app",
        "documents": [{"_id": 1, "first_name": "x"}]});
        let (policies, dict) = migrating(State::Migrating(Migration::Reverse));
        let first = crate::token::Names::token(&dict, "first_name")
            .unwrap()
            .as_str()
            .to_owned();
        assert_eq!(
            migration_filters(&write, "app", &policies, &dict).unwrap(),
            vec![doc! {"$or": [{&first: "x"}, {"first_name": "x"}]}]
        );
        for policies in [policies, migrating(State::Reversed).0] {
            for c in [&write, &insert] {
                let mut rewritten = c.clone();
                command(&mut rewritten, "app", &policies, &dict).unwrap();
                assert_eq!(rewritten.body, c.body);
            }
        }
        let (reversed, _) = migrating(State::Reversed);
        assert!(migration_filters(&write, "app", &reversed, &dict)
            .unwrap()
            .is_empty());
        assert!(!reversed.get("app", "people").is_active());
        assert!(reversed.get("app", "others").is_active());
    }
}
