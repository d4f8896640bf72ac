//! ④ Aggregation: pipelines, stages and expressions (catalogue §5).
//!
//! Every name a pipeline mentions goes through the same mapping as stored
//! documents (`tokenize::key`: a name the policy tokenizes and the dictionary
//! knows becomes its token, any other name stays as it is, escaped if it
//! would read as a token). That holds for names the user invents too
//! (`$group` outputs, `as`, `$count`): an invented name is mapped exactly
//! where it is defined and wherever a later stage refers to it, and the
//! reply's expansion turns it back by its shape alone. So no stage needs an
//! analysis of its output, and the only constructs refused are those whose
//! names cannot be seen on the wire: JavaScript, computed field names, names
//! turned into data, Atlas Search, and operators or stages this module does
//! not know.

use bson::{Bson, Document};

use super::crud::{refuse, Tok};
use super::tokenize::{key, logical, logical_parts, path, paths_document};
use crate::error::ProxyError;

/// Variables that are not paths into a document.
const SYSTEM_VARIABLES: &[&str] = &[
    "NOW",
    "CLUSTER_TIME",
    "REMOVE",
    "DESCEND",
    "PRUNE",
    "KEEP",
    "SEARCH_META",
    "USER_ROLES",
];

/// Operators whose argument is a document of named arguments (not an
/// object literal): the argument names are kept, their values rewritten.
const NAMED_ARGUMENTS: &[&str] = &[
    "$dateToString",
    "$dateFromString",
    "$dateToParts",
    "$dateFromParts",
    "$dateAdd",
    "$dateSubtract",
    "$dateDiff",
    "$dateTrunc",
    "$regexMatch",
    "$regexFind",
    "$regexFindAll",
    "$replaceOne",
    "$replaceAll",
    "$trim",
    "$ltrim",
    "$rtrim",
    "$convert",
    "$firstN",
    "$lastN",
    "$maxN",
    "$minN",
    "$percentile",
    "$median",
    "$shift",
    "$derivative",
    "$integral",
    "$expMovingAvg",
    "$zip",
    "$cond",
    "$covariancePop",
    "$covarianceSamp",
];

/// Operators whose arguments are expressions (one, or an array of them).
const PLAIN_ARGUMENTS: &[&str] = &[
    "$abs",
    "$acos",
    "$acosh",
    "$add",
    "$addToSet",
    "$allElementsTrue",
    "$and",
    "$anyElementTrue",
    "$arrayElemAt",
    "$asin",
    "$asinh",
    "$atan",
    "$atan2",
    "$atanh",
    "$avg",
    "$binarySize",
    "$bitAnd",
    "$bitNot",
    "$bitOr",
    "$bitXor",
    "$bsonSize",
    "$ceil",
    "$cmp",
    "$concat",
    "$concatArrays",
    "$cos",
    "$cosh",
    "$count",
    "$dayOfMonth",
    "$dayOfWeek",
    "$dayOfYear",
    "$degreesToRadians",
    "$denseRank",
    "$divide",
    "$documentNumber",
    "$eq",
    "$exp",
    "$first",
    "$floor",
    "$gt",
    "$gte",
    "$hour",
    "$ifNull",
    "$in",
    "$indexOfArray",
    "$indexOfBytes",
    "$indexOfCP",
    "$isArray",
    "$isNumber",
    "$isoDayOfWeek",
    "$isoWeek",
    "$isoWeekYear",
    "$last",
    "$linearFill",
    "$ln",
    "$locf",
    "$log",
    "$log10",
    "$lt",
    "$lte",
    "$ltrim",
    "$max",
    "$mergeObjects",
    "$millisecond",
    "$min",
    "$minute",
    "$mod",
    "$month",
    "$multiply",
    "$ne",
    "$not",
    "$or",
    "$pow",
    "$push",
    "$radiansToDegrees",
    "$rand",
    "$range",
    "$rank",
    "$reverseArray",
    "$round",
    "$second",
    "$setDifference",
    "$setEquals",
    "$setIntersection",
    "$setIsSubset",
    "$setUnion",
    "$sin",
    "$sinh",
    "$size",
    "$slice",
    "$split",
    "$sqrt",
    "$stdDevPop",
    "$stdDevSamp",
    "$strcasecmp",
    "$strLenBytes",
    "$strLenCP",
    "$substr",
    "$substrBytes",
    "$substrCP",
    "$subtract",
    "$sum",
    "$tan",
    "$tanh",
    "$toBool",
    "$toDate",
    "$toDecimal",
    "$toDouble",
    "$toHashedIndexKey",
    "$toInt",
    "$toLong",
    "$toLower",
    "$toObjectId",
    "$toString",
    "$toUpper",
    "$trunc",
    "$tsIncrement",
    "$tsSecond",
    "$type",
    "$week",
    "$year",
    "$toUUID",
    "$sampleRate",
    "$isoDate",
];

/// Where a value that an expression merely moves may come from: a bare
/// path to a tokenized value is fine there (the value token travels and is
/// expanded in the reply); anywhere else it would be computed on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Moved,
    Computed,
}

/// Variables in scope, each with the logical path it is bound to.
#[derive(Clone, Default)]
pub(super) struct Vars(Vec<(String, Vec<String>)>);

impl Vars {
    fn scope_of(&self, name: &str) -> Vec<String> {
        self.0
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, s)| s.clone())
            .unwrap_or_default()
    }

    fn with(&self, name: &str, scope: Vec<String>) -> Vars {
        let mut v = self.clone();
        v.0.push((name.to_owned(), scope));
        v
    }
}

impl Tok<'_> {
    /// A pipeline of the collection this `Tok` is for. One that opens a
    /// change stream works on change events instead.
    pub(super) fn pipeline(&self, stages: &mut [Bson]) -> Result<(), ProxyError> {
        let opens_stream = stages
            .first()
            .and_then(Bson::as_document)
            .and_then(|s| s.keys().next())
            .is_some_and(|k| k == "$changeStream");
        if opens_stream {
            return self.change_stream(&mut stages[1..]);
        }
        for stage in stages.iter_mut() {
            let Bson::Document(stage) = stage else {
                continue;
            };
            let Some((name, arg)) = stage.iter().next().map(|(k, v)| (k.clone(), v.clone())) else {
                continue;
            };
            let new = self.stage(&name, &arg)?;
            stage.insert(name, new);
        }
        Ok(())
    }

    fn stage(&self, name: &str, arg: &Bson) -> Result<Bson, ProxyError> {
        let none = Vars::default();
        Ok(match (name, arg) {
            ("$match", Bson::Document(f)) => Bson::Document(self.checked_filter(f, &[])?),
            ("$sort", Bson::Document(s)) => Bson::Document(self.sort(s, &[])?),
            ("$skip" | "$limit" | "$sample" | "$indexStats" | "$collStats" | "$planCacheStats"
            | "$currentOp" | "$listSessions" | "$listLocalSessions" | "$changeStreamSplitLargeEvent"
            | "$listSampledQueries" | "$querySettings" | "$listSearchIndexes", _) => arg.clone(),
            ("$count", Bson::String(n)) => Bson::String(self.name(&[], n)),
            ("$project", Bson::Document(p)) => Bson::Document(self.projection(p, &[])?),
            ("$addFields" | "$set", Bson::Document(f)) => Bson::Document(self.add_fields(f)?),
            ("$unset", Bson::String(p)) => Bson::String(self.path(p, &[])),
            ("$unset", Bson::Array(a)) => Bson::Array(
                a.iter()
                    .map(|p| match p {
                        Bson::String(p) => Bson::String(self.path(p, &[])),
                        other => other.clone(),
                    })
                    .collect(),
            ),
            ("$redact", e) => self.expr(e, &[], &none)?,
            ("$replaceRoot", Bson::Document(r)) => {
                let mut out = r.clone();
                if let Some(e) = r.get("newRoot") {
                    out.insert("newRoot", self.expr_as(e, &[], &none, Use::Moved)?);
                }
                Bson::Document(out)
            }
            ("$replaceWith", e) => self.expr_as(e, &[], &none, Use::Moved)?,
            ("$group", Bson::Document(g)) => Bson::Document(self.group(g)?),
            ("$bucket" | "$bucketAuto", Bson::Document(b)) => {
                let mut out = Document::new();
                for (k, v) in b {
                    let v = match k.as_str() {
                        "groupBy" => self.expr(v, &[], &none)?,
                        "output" => match v {
                            Bson::Document(o) => Bson::Document(self.accumulators(o)?),
                            other => other.clone(),
                        },
                        _ => v.clone(),
                    };
                    out.insert(k.clone(), v);
                }
                Bson::Document(out)
            }
            ("$sortByCount", e) => self.expr(e, &[], &none)?,
            ("$facet", Bson::Document(f)) => {
                let mut out = Document::new();
                for (k, v) in f {
                    let stages = v.as_array().map_or(&[][..], Vec::as_slice);
                    out.insert(self.name(&[], k), self.sub_pipeline(stages)?);
                }
                Bson::Document(out)
            }
            ("$unwind", Bson::String(p)) => Bson::String(self.field_ref(p)),
            ("$unwind", Bson::Document(u)) => {
                let mut out = u.clone();
                if let Ok(p) = u.get_str("path") {
                    out.insert("path", self.field_ref(p));
                }
                if let Ok(i) = u.get_str("includeArrayIndex") {
                    out.insert("includeArrayIndex", self.path(i, &[]));
                }
                Bson::Document(out)
            }
            ("$lookup", Bson::Document(l)) => Bson::Document(self.lookup(l)?),
            ("$graphLookup", Bson::Document(g)) => Bson::Document(self.graph_lookup(g)?),
            ("$unionWith", Bson::String(_)) => arg.clone(),
            ("$unionWith", Bson::Document(u)) => {
                let coll = u.get_str("coll").unwrap_or_default();
                let foreign = self.for_collection(coll);
                let mut out = u.clone();
                if let Ok(p) = u.get_array("pipeline") {
                    out.insert("pipeline", foreign.sub_pipeline(p)?);
                }
                Bson::Document(out)
            }
            ("$setWindowFields", Bson::Document(w)) => Bson::Document(self.window_fields(w)?),
            ("$densify", Bson::Document(d)) => {
                let mut out = d.clone();
                if let Ok(f) = d.get_str("field") {
                    out.insert("field", self.path(f, &[]));
                }
                self.path_list(&mut out, "partitionByFields");
                Bson::Document(out)
            }
            ("$fill", Bson::Document(f)) => Bson::Document(self.fill(f)?),
            ("$geoNear", Bson::Document(g)) => {
                let mut out = g.clone();
                for k in ["distanceField", "includeLocs", "key"] {
                    if let Ok(p) = g.get_str(k) {
                        out.insert(k, self.path(p, &[]));
                    }
                }
                if let Ok(q) = g.get_document("query") {
                    out.insert("query", self.checked_filter(q, &[])?);
                }
                Bson::Document(out)
            }
            ("$documents", Bson::Array(docs)) => Bson::Array(
                docs.iter()
                    .map(|d| self.expr_as(d, &[], &none, Use::Moved))
                    .collect::<Result<_, _>>()?,
            ),
            ("$documents", e) => self.expr(e, &[], &none)?,
            ("$out", target) => {
                self.same_mapping("$out", target)?;
                target.clone()
            }
            ("$merge", Bson::Document(m)) => Bson::Document(self.merge(m)?),
            ("$merge", target) => {
                self.same_mapping("$merge", target)?;
                target.clone()
            }
            ("$search" | "$searchMeta" | "$vectorSearch" | "$rankFusion" | "$scoreFusion", _) => {
                return Err(refuse(&format!(
                    "the Atlas Search stage {name} (its paths are resolved by the search index, over stored names)"
                )))
            }
            ("$changeStream", _) => {
                return Err(refuse(
                    "$changeStream on a tokenized database outside its own command form",
                ))
            }
            (n, _) if n.starts_with("$_internal") => {
                return Err(refuse(&format!("the internal stage {n}")))
            }
            (other, _) if self.policies.pass_through.iter().any(|p| p == other) => arg.clone(),
            (other, _) => {
                return Err(ProxyError::Unsupported(format!(
                    "the aggregation stage {other} is unknown to Laconic, so the field names it may carry cannot be rewritten"
                )))
            }
        })
    }

    /// A pipeline nested in a stage (`$lookup`, `$unionWith`, `$facet`,
    /// `$merge`), rewritten for this collection.
    fn sub_pipeline(&self, stages: &[Bson]) -> Result<Bson, ProxyError> {
        let mut stages = stages.to_vec();
        self.pipeline(&mut stages)?;
        Ok(Bson::Array(stages))
    }

    /// The stages after `$changeStream` see change events: only the paths
    /// below `fullDocument`, `fullDocumentBeforeChange`, `documentKey` and
    /// `updateDescription.updatedFields` are the collection's.
    fn change_stream(&self, stages: &mut [Bson]) -> Result<(), ProxyError> {
        for stage in stages.iter_mut() {
            let Bson::Document(stage) = stage else {
                continue;
            };
            let Some((name, arg)) = stage.iter().next().map(|(k, v)| (k.clone(), v.clone())) else {
                continue;
            };
            let new = match (name.as_str(), &arg) {
                ("$match", Bson::Document(f)) => Bson::Document(self.event_filter(f)?),
                ("$project" | "$addFields" | "$set", Bson::Document(p)) => {
                    let mut out = Document::new();
                    for (k, v) in p {
                        let v = match v {
                            v if is_flag(v) => v.clone(),
                            Bson::String(s) if s.starts_with('$') && !s.starts_with("$$") => {
                                Bson::String(format!("${}", self.event_path(&s[1..])))
                            }
                            Bson::String(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) => {
                                v.clone()
                            }
                            _ => {
                                return Err(refuse(&format!(
                                    "an expression in {name} after $changeStream"
                                )))
                            }
                        };
                        out.insert(self.event_path(k), v);
                    }
                    Bson::Document(out)
                }
                ("$unset", Bson::String(p)) => Bson::String(self.event_path(p)),
                ("$unset", Bson::Array(a)) => Bson::Array(
                    a.iter()
                        .map(|p| match p {
                            Bson::String(p) => Bson::String(self.event_path(p)),
                            other => other.clone(),
                        })
                        .collect(),
                ),
                ("$replaceRoot" | "$replaceWith" | "$redact", _) => {
                    return Err(refuse(&format!("{name} after $changeStream")))
                }
                ("$changeStreamSplitLargeEvent", _) => arg,
                (other, _) => {
                    return Err(refuse(&format!("the stage {other} after $changeStream")))
                }
            };
            stage.insert(name, new);
        }
        Ok(())
    }

    /// A path into a change event.
    fn event_path(&self, p: &str) -> String {
        for prefix in [
            "fullDocument.",
            "fullDocumentBeforeChange.",
            "documentKey.",
            "updateDescription.updatedFields.",
        ] {
            if let Some(rest) = p.strip_prefix(prefix) {
                return format!("{prefix}{}", self.path(rest, &[]));
            }
        }
        p.to_owned()
    }

    /// A filter on change events: conditions on the collection's paths are
    /// rewritten as they would be on the collection itself.
    fn event_filter(&self, f: &Document) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in f {
            match (k.as_str(), v) {
                ("$and" | "$or" | "$nor", Bson::Array(a)) => {
                    let subs = a
                        .iter()
                        .map(|x| match x {
                            Bson::Document(d) => self.event_filter(d).map(Bson::Document),
                            other => Ok(other.clone()),
                        })
                        .collect::<Result<Vec<_>, _>>()?;
                    out.insert(k.clone(), subs);
                }
                (op, _) if op.starts_with('$') => {
                    return Err(refuse(&format!("{op} in a $match after $changeStream")))
                }
                (p, v) => {
                    let event = self.event_path(p);
                    let Some((prefix, rest)) = [
                        "fullDocument.",
                        "fullDocumentBeforeChange.",
                        "documentKey.",
                        "updateDescription.updatedFields.",
                    ]
                    .iter()
                    .find_map(|pre| p.strip_prefix(pre).map(|r| (*pre, r))) else {
                        out.insert(event, v.clone());
                        continue;
                    };
                    let mut one = Document::new();
                    one.insert(rest, v.clone());
                    let rewritten = self.checked_filter(&one, &[])?;
                    for (rk, rv) in rewritten {
                        out.insert(format!("{prefix}{rk}"), rv);
                    }
                }
            }
        }
        Ok(out)
    }

    /// A filter after the checks that refuse what cannot be rewritten.
    pub(super) fn checked_filter(
        &self,
        f: &Document,
        parent: &[String],
    ) -> Result<Document, ProxyError> {
        super::crud::check_filter(f, self.policy)?;
        let stored =
            super::tokenize::filter(f, parent, self.policy, self.names, &|op, v| match (op, v) {
                ("$jsonSchema", Bson::Document(schema)) => {
                    self.json_schema(schema, parent).map(Bson::Document)
                }
                _ => self.expr(v, &[], &Vars::default()),
            })?;
        if self.migrating.is_none() || !parent.is_empty() {
            return Ok(stored);
        }
        // A collection being migrated holds both forms: match either.
        let old_form = super::tokenize::filter(
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
    fn json_schema(&self, schema: &Document, parent: &[String]) -> Result<Document, ProxyError> {
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
        let out = each_field(schema, |k, v| {
            Ok(match (k, v) {
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
                            Bson::Document(d) => Bson::Document(super::tokenize::document(
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

    fn path(&self, p: &str, parent: &[String]) -> String {
        path(p, parent, self.policy, self.names)
    }

    /// One name (no dot traversal) under `parent`.
    fn name(&self, parent: &[String], n: &str) -> String {
        let p: Vec<&str> = parent.iter().map(String::as_str).collect();
        key(&p, n, self.policy, self.names).into_owned()
    }

    /// `"$a.b"` as a field reference, with no computation on it.
    fn field_ref(&self, p: &str) -> String {
        match p.strip_prefix('$') {
            Some(rest) if !rest.starts_with('$') => format!("${}", self.path(rest, &[])),
            _ => p.to_owned(),
        }
    }

    fn path_list(&self, d: &mut Document, field: &str) {
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

    fn add_fields(&self, f: &Document) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in f {
            let scope = logical(&[], k);
            out.insert(
                self.path(k, &[]),
                self.expr_as(v, &scope, &Vars::default(), Use::Moved)?,
            );
        }
        Ok(out)
    }

    /// `$group`: `_id` is an expression (an object literal's keys are new
    /// names under `_id`); every other field is an output name with one
    /// accumulator.
    fn group(&self, g: &Document) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in g {
            if k == "_id" {
                // Grouping on a value token would group correctly but
                // leave `_id` in token order for any later sort: computed.
                out.insert(
                    k.clone(),
                    self.expr_as(v, &["_id".to_owned()], &Vars::default(), Use::Computed)?,
                );
            } else {
                out.insert(self.name(&[], k), self.accumulator(v)?);
            }
        }
        Ok(out)
    }

    fn accumulators(&self, o: &Document) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in o {
            out.insert(self.name(&[], k), self.accumulator(v)?);
        }
        Ok(out)
    }

    /// `{<accumulator>: <argument>}`.
    fn accumulator(&self, v: &Bson) -> Result<Bson, ProxyError> {
        let Bson::Document(acc) = v else {
            return self.expr(v, &[], &Vars::default());
        };
        let mut out = Document::new();
        for (op, arg) in acc {
            let arg = match op.as_str() {
                "$accumulator" => {
                    return Err(refuse("$accumulator (JavaScript reads field names)"))
                }
                "$first" | "$last" | "$push" | "$addToSet" => {
                    self.expr_as(arg, &[], &Vars::default(), Use::Moved)?
                }
                _ => self.operator(op, arg, &[], &Vars::default())?,
            };
            out.insert(op.clone(), arg);
        }
        Ok(Bson::Document(out))
    }

    fn lookup(&self, l: &Document) -> Result<Document, ProxyError> {
        let foreign = match l.get("from") {
            Some(Bson::String(c)) => self.for_collection(c),
            Some(Bson::Document(ns)) => self.foreign_namespace("$lookup", ns)?,
            _ => self.clone_for_documents(),
        };
        let out = each_field(l, |k, v| {
            Ok(match (k, v) {
                ("localField", Bson::String(p)) => Bson::String(self.path(p, &[])),
                ("foreignField", Bson::String(p)) => Bson::String(foreign.path(p, &[])),
                ("as", Bson::String(p)) => Bson::String(self.path(p, &[])),
                ("let", Bson::Document(let_vars)) => Bson::Document(self.let_vars(let_vars)?),
                ("pipeline", Bson::Array(p)) => foreign.sub_pipeline(p)?,
                _ => v.clone(),
            })
        })?;
        Ok(out)
    }

    /// `let` variables: their names stay, their values are expressions.
    pub(super) fn let_vars(&self, let_vars: &Document) -> Result<Document, ProxyError> {
        let mut o = Document::new();
        for (name, e) in let_vars {
            o.insert(
                name.clone(),
                self.expr_as(e, &[], &Vars::default(), Use::Moved)?,
            );
        }
        Ok(o)
    }

    fn graph_lookup(&self, g: &Document) -> Result<Document, ProxyError> {
        let foreign = match g.get("from") {
            Some(Bson::String(c)) => self.for_collection(c),
            Some(Bson::Document(ns)) => self.foreign_namespace("$graphLookup", ns)?,
            _ => self.clone_for_documents(),
        };
        let out = each_field(g, |k, v| {
            Ok(match (k, v) {
                ("startWith", e) => self.expr_as(e, &[], &Vars::default(), Use::Moved)?,
                ("connectFromField" | "connectToField", Bson::String(p)) => {
                    Bson::String(foreign.path(p, &[]))
                }
                ("as" | "depthField", Bson::String(p)) => Bson::String(self.path(p, &[])),
                ("restrictSearchWithMatch", Bson::Document(q)) => {
                    Bson::Document(foreign.checked_filter(q, &[])?)
                }
                _ => v.clone(),
            })
        })?;
        Ok(out)
    }

    fn window_fields(&self, w: &Document) -> Result<Document, ProxyError> {
        let out = each_field(w, |k, v| {
            Ok(match (k, v) {
                ("partitionBy", e) => self.expr(e, &[], &Vars::default())?,
                ("sortBy", Bson::Document(s)) => Bson::Document(self.sort(s, &[])?),
                ("output", Bson::Document(o)) => {
                    let mut outputs = Document::new();
                    for (field, spec) in o {
                        let Bson::Document(spec) = spec else {
                            return Err(refuse(&format!("the window output {field}")));
                        };
                        let mut s = Document::new();
                        for (op, arg) in spec {
                            let arg = if op == "window" {
                                arg.clone()
                            } else {
                                self.operator(op, arg, &[], &Vars::default())?
                            };
                            s.insert(op.clone(), arg);
                        }
                        outputs.insert(self.path(field, &[]), s);
                    }
                    Bson::Document(outputs)
                }
                _ => v.clone(),
            })
        })?;
        Ok(out)
    }

    fn fill(&self, f: &Document) -> Result<Document, ProxyError> {
        let mut out = each_field(f, |k, v| {
            Ok(match (k, v) {
                ("partitionBy", e) => self.expr(e, &[], &Vars::default())?,
                ("sortBy", Bson::Document(s)) => Bson::Document(self.sort(s, &[])?),
                ("output", Bson::Document(o)) => {
                    let mut outputs = Document::new();
                    for (field, spec) in o {
                        let spec = match spec {
                            Bson::Document(s) if s.contains_key("value") => {
                                let mut s = s.clone();
                                let e = self.expr(
                                    s.get("value").unwrap_or(&Bson::Null),
                                    &[],
                                    &Vars::default(),
                                )?;
                                s.insert("value", e);
                                Bson::Document(s)
                            }
                            other => other.clone(),
                        };
                        outputs.insert(self.path(field, &[]), spec);
                    }
                    Bson::Document(outputs)
                }
                _ => v.clone(),
            })
        })?;
        self.path_list(&mut out, "partitionByFields");
        Ok(out)
    }

    fn merge(&self, m: &Document) -> Result<Document, ProxyError> {
        if let Some(into) = m.get("into") {
            self.same_mapping("$merge", into)?;
        }
        let out = each_field(m, |k, v| {
            Ok(match (k, v) {
                ("on", Bson::String(p)) => Bson::String(self.path(p, &[])),
                ("on", Bson::Array(ps)) => Bson::Array(
                    ps.iter()
                        .map(|p| match p {
                            Bson::String(p) => Bson::String(self.path(p, &[])),
                            other => other.clone(),
                        })
                        .collect(),
                ),
                ("let", Bson::Document(let_vars)) => Bson::Document(self.let_vars(let_vars)?),
                ("whenMatched", Bson::Array(p)) => self.sub_pipeline(p)?,
                _ => v.clone(),
            })
        })?;
        Ok(out)
    }

    /// `$out`/`$merge` write the pipeline's documents, whose names are in
    /// this collection's mapping, into their target: refused unless the
    /// target has the same mapping (same database, same policy).
    fn same_mapping(&self, stage: &str, target: &Bson) -> Result<(), ProxyError> {
        let (db, coll) = match target {
            Bson::String(c) => (self.db.to_owned(), c.clone()),
            Bson::Document(d) => (
                d.get_str("db").unwrap_or(self.db).to_owned(),
                d.get_str("coll").unwrap_or_default().to_owned(),
            ),
            _ => return Ok(()),
        };
        let target = self.policies.get(&db, &coll);
        let same_db = db == self.db;
        if (same_db && target == self.policy)
            || (!same_db && !self.policies.applies_to(&db) && !self.policy.is_active())
        {
            return Ok(());
        }
        Err(ProxyError::Unsupported(format!(
            "{stage} into {db}.{coll} cannot be rewritten: its documents would be stored under a different name mapping than the source's"
        )))
    }

    fn foreign_namespace(&self, stage: &str, ns: &Document) -> Result<Tok<'_>, ProxyError> {
        let db = ns.get_str("db").unwrap_or(self.db);
        let coll = ns.get_str("coll").unwrap_or_default();
        if db != self.db {
            return Err(ProxyError::Unsupported(format!(
                "{stage} from {db}.{coll}: another database has its own dictionary"
            )));
        }
        Ok(self.for_collection(coll))
    }

    fn clone_for_documents(&self) -> Tok<'_> {
        self.for_collection("")
    }

    // === Expressions ===

    /// An expression whose result is computed on.
    pub(super) fn expr(&self, e: &Bson, out: &[String], vars: &Vars) -> Result<Bson, ProxyError> {
        self.expr_as(e, out, vars, Use::Computed)
    }

    /// An expression whose result lands at the output path `out`.
    fn expr_as(
        &self,
        e: &Bson,
        out: &[String],
        vars: &Vars,
        used: Use,
    ) -> Result<Bson, ProxyError> {
        Ok(match e {
            Bson::String(s) if s.starts_with("$$") => Bson::String(self.variable(s, vars)),
            Bson::String(s) if s.starts_with('$') => {
                let p = &s[1..];
                if used == Use::Computed && self.policy.is_value_path(&logical(&[], p)) {
                    return Err(refuse(&format!(
                        "an expression computing on the tokenized value path {p}"
                    )));
                }
                Bson::String(format!("${}", self.path(p, &[])))
            }
            Bson::Array(a) => Bson::Array(
                a.iter()
                    .map(|x| self.expr_as(x, out, vars, used))
                    .collect::<Result<_, _>>()?,
            ),
            Bson::Document(d) => match d.keys().next() {
                Some(op) if op.starts_with('$') => {
                    if d.len() != 1 {
                        return Err(refuse(&format!(
                            "an expression object mixing the operator {op} with other fields"
                        )));
                    }
                    let arg = d.get(op).unwrap_or(&Bson::Null);
                    let mut o = Document::new();
                    o.insert(op.clone(), self.operator(op, arg, out, vars)?);
                    Bson::Document(o)
                }
                _ => {
                    // An object literal: its keys are names where it lands.
                    let mut o = Document::new();
                    for (k, v) in d {
                        let mut scope = out.to_vec();
                        scope.push(k.clone());
                        o.insert(self.name(out, k), self.expr_as(v, &scope, vars, used)?);
                    }
                    Bson::Document(o)
                }
            },
            other => other.clone(),
        })
    }

    /// `$$ROOT.a`, `$$CURRENT.a`, `$$var.a`: the path after the variable is
    /// renamed in the scope the variable is bound to.
    fn variable(&self, s: &str, vars: &Vars) -> String {
        let body = &s[2..];
        let (var, rest) = match body.split_once('.') {
            Some((v, r)) => (v, Some(r)),
            None => (body, None),
        };
        let Some(rest) = rest else {
            return s.to_owned();
        };
        if SYSTEM_VARIABLES.contains(&var) {
            return s.to_owned();
        }
        let scope = match var {
            "ROOT" | "CURRENT" => Vec::new(),
            v => vars.scope_of(v),
        };
        format!("$${var}.{}", self.path(rest, &scope))
    }

    /// The argument of the operator `op`.
    fn operator(
        &self,
        op: &str,
        arg: &Bson,
        out: &[String],
        vars: &Vars,
    ) -> Result<Bson, ProxyError> {
        let named =
            |f: &dyn Fn(&str, &Bson) -> Result<Bson, ProxyError>| -> Result<Bson, ProxyError> {
                let Bson::Document(d) = arg else {
                    return self.expr(arg, &[], vars);
                };
                let mut o = Document::new();
                for (k, v) in d {
                    o.insert(k.clone(), f(k, v)?);
                }
                Ok(Bson::Document(o))
            };
        match op {
            "$literal" | "$meta" => Ok(arg.clone()),
            "$function" | "$accumulator" | "$where" => Err(refuse(&format!(
                "{op} (JavaScript reads field names)"
            ))),
            "$objectToArray" | "$arrayToObject" => Err(refuse(&format!(
                "{op} over a tokenized collection (it turns field names into data, or data into field names)"
            ))),
            "$getField" | "$setField" | "$unsetField" => self.field_operator(op, arg, vars),
            "$let" => {
                let Bson::Document(d) = arg else {
                    return Err(refuse("$let without its document"));
                };
                let mut inner = vars.clone();
                let mut o = Document::new();
                if let Ok(vs) = d.get_document("vars") {
                    let mut bound = Document::new();
                    for (name, e) in vs {
                        bound.insert(name.clone(), self.expr_as(e, &[], vars, Use::Moved)?);
                        inner = inner.with(name, bound_scope(e));
                    }
                    o.insert("vars", bound);
                }
                if let Some(e) = d.get("in") {
                    o.insert("in", self.expr_as(e, out, &inner, Use::Moved)?);
                }
                Ok(Bson::Document(o))
            }
            "$map" | "$filter" | "$reduce" | "$sortArray" => {
                let Bson::Document(d) = arg else {
                    return Err(refuse(&format!("{op} without its document")));
                };
                let input = d.get("input").map(bound_scope).unwrap_or_default();
                let var = d.get_str("as").unwrap_or("this");
                let inner = match op {
                    "$reduce" => vars.with("this", input.clone()).with("value", Vec::new()),
                    _ => vars.with(var, input.clone()),
                };
                named(&|k, v| match k {
                    "input" => self.expr_as(v, &[], vars, Use::Moved),
                    "as" => Ok(v.clone()),
                    "sortBy" => match v {
                        Bson::Document(s) => self.sort(s, &input).map(Bson::Document),
                        other => Ok(other.clone()),
                    },
                    "in" => self.expr_as(v, out, &inner, Use::Moved),
                    _ => self.expr(v, &[], &inner),
                })
            }
            "$top" | "$bottom" | "$topN" | "$bottomN" => named(&|k, v| match k {
                "sortBy" => match v {
                    Bson::Document(s) => self.sort(s, &[]).map(Bson::Document),
                    other => Ok(other.clone()),
                },
                "output" => self.expr_as(v, out, vars, Use::Moved),
                _ => self.expr(v, &[], vars),
            }),
            "$switch" => named(&|k, v| match (k, v) {
                ("branches", Bson::Array(bs)) => Ok(Bson::Array(
                    bs.iter()
                        .map(|b| match b {
                            Bson::Document(b) => {
                                let mut o = Document::new();
                                for (bk, bv) in b {
                                    let used = if bk == "then" { Use::Moved } else { Use::Computed };
                                    o.insert(bk.clone(), self.expr_as(bv, out, vars, used)?);
                                }
                                Ok(Bson::Document(o))
                            }
                            other => Ok(other.clone()),
                        })
                        .collect::<Result<_, ProxyError>>()?,
                )),
                _ => self.expr_as(v, out, vars, Use::Moved),
            }),
            "$cond" | "$ifNull" | "$mergeObjects" => match arg {
                Bson::Document(_) if op == "$cond" => named(&|k, v| {
                    let used = if k == "if" { Use::Computed } else { Use::Moved };
                    self.expr_as(v, out, vars, used)
                }),
                _ => self.expr_as(arg, out, vars, Use::Moved),
            },
            op if NAMED_ARGUMENTS.contains(&op) => named(&|_, v| self.expr(v, &[], vars)),
            op if PLAIN_ARGUMENTS.contains(&op) => self.expr(arg, out, vars),
            other => Err(ProxyError::Unsupported(format!(
                "the expression operator {other} is unknown to Laconic, so the field names it may carry cannot be rewritten"
            ))),
        }
    }

    /// `$getField`/`$setField`/`$unsetField`: the field is one name, never
    /// traversed; it must be a constant.
    fn field_operator(&self, op: &str, arg: &Bson, vars: &Vars) -> Result<Bson, ProxyError> {
        let computed = || {
            refuse(&format!(
                "{op} with a computed field name (only a constant name can be rewritten)"
            ))
        };
        let constant = |f: &Bson| -> Option<String> {
            match f {
                Bson::String(s) if !s.starts_with('$') => Some(s.clone()),
                Bson::Document(d) if d.len() == 1 => match d.get("$literal") {
                    Some(Bson::String(s)) => Some(s.clone()),
                    _ => None,
                },
                _ => None,
            }
        };
        match arg {
            Bson::String(s) if !s.starts_with('$') => Ok(Bson::String(self.name(&[], s))),
            Bson::Document(d) => {
                let input_scope = d.get("input").map(bound_scope).unwrap_or_default();
                let mut o = Document::new();
                for (k, v) in d {
                    let v = match k.as_str() {
                        "field" => {
                            let name = constant(v).ok_or_else(computed)?;
                            let mapped = self.name(&input_scope, &name);
                            match v {
                                Bson::Document(_) => {
                                    Bson::Document(bson::doc! {"$literal": mapped})
                                }
                                _ => Bson::String(mapped),
                            }
                        }
                        "input" => self.expr_as(v, &[], vars, Use::Moved)?,
                        _ => self.expr_as(v, &[], vars, Use::Moved)?,
                    };
                    o.insert(k.clone(), v);
                }
                Ok(Bson::Document(o))
            }
            _ => Err(computed()),
        }
    }
}

/// A document with each field's value rewritten by `f`, key order kept.
fn each_field(
    d: &Document,
    mut f: impl FnMut(&str, &Bson) -> Result<Bson, ProxyError>,
) -> Result<Document, ProxyError> {
    d.iter().map(|(k, v)| Ok((k.clone(), f(k, v)?))).collect()
}

/// The logical path an expression stands for, when it is a bare field path
/// (what `$map`'s `as` or a `$let` variable is then bound to).
fn bound_scope(e: &Bson) -> Vec<String> {
    match e {
        Bson::String(s) if s.starts_with('$') && !s.starts_with("$$") => {
            logical_parts(&s[1..]).map(str::to_owned).collect()
        }
        _ => Vec::new(),
    }
}

pub(super) fn is_flag(v: &Bson) -> bool {
    matches!(
        v,
        Bson::Int32(0 | 1) | Bson::Int64(0 | 1) | Bson::Boolean(_)
    ) || matches!(v, Bson::Double(x) if *x == 0.0 || *x == 1.0)
}
