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

use super::expr::{Use, Vars};
use super::paths::fields;
use super::query::is_flag;
use super::{each_field, refuse, Mapper};
use crate::error::ProxyError;
use crate::token::Policy;

impl Mapper<'_> {
    /// A pipeline of the collection this `Tok` is for. One that opens a
    /// change stream works on change events instead. Returns the layouts
    /// of the documents it outputs where its stages changed them (none:
    /// stored as the collection stores them).
    pub(super) fn pipeline(&self, stages: &mut [Bson]) -> Result<Vec<Policy>, ProxyError> {
        let opens_stream = stages
            .first()
            .and_then(Bson::as_document)
            .and_then(|s| s.keys().next())
            .is_some_and(|k| k == "$changeStream");
        if opens_stream {
            return self.change_stream(&mut stages[1..]).map(|()| Vec::new());
        }
        // Each stage reads documents stored as the stages before it left
        // them (none: as the collection stores them); where they may be
        // stored in more than one form, it is rewritten under each, and
        // must come out the same.
        let mut layouts: Vec<Policy> = Vec::new();
        for stage in stages.iter_mut() {
            let Bson::Document(stage) = stage else {
                continue;
            };
            let Some((name, arg)) = stage.iter().next().map(|(k, v)| (k.clone(), v.clone())) else {
                continue;
            };
            if matches!(name.as_str(), "$out" | "$merge") {
                self.stored_as_read(&layouts)?;
            }
            let current = if layouts.is_empty() {
                std::slice::from_ref(self.policy)
            } else {
                &layouts[..]
            };
            let mut mapped: Option<Bson> = None;
            for l in current {
                let m = self.with_layout(l);
                m.check_opaque(&name, &arg)?;
                let new = m.stage(&name, &arg)?;
                match &mapped {
                    Some(first) if *first != new => {
                        let place = current[0].differs_from(l).unwrap_or_default();
                        return Err(refuse(&format!(
                            "the stage {name} naming fields below {} (an earlier stage put documents there that store them in more than one form)",
                            place_name(&place)
                        )));
                    }
                    Some(_) => {}
                    None => mapped = Some(new),
                }
            }
            let next = self.next_layouts(current, &name, &arg);
            if let Some(new) = mapped {
                stage.insert(name, new);
            }
            layouts = if next.len() == 1 && next[0] == *self.policy {
                Vec::new()
            } else {
                next
            };
        }
        self.stored_as_read(&layouts)?;
        Ok(layouts)
    }

    /// Documents a pipeline stores keep the form the collection stores
    /// them in (`$out`, `$merge` and pipeline updates): refused if an
    /// earlier stage moved names to a place that stores them otherwise.
    fn stored_as_read(&self, layouts: &[Policy]) -> Result<(), ProxyError> {
        let moved = layouts.iter().find_map(|l| l.differs_from(self.policy));
        match moved {
            Some(place) if self.stores_documents => Err(refuse(&format!(
                "storing documents whose names at {} an earlier stage moved there from a place that stores them otherwise, or made itself,",
                place_name(&place)
            ))),
            _ => Ok(()),
        }
    }

    pub(super) fn stage(&self, name: &str, arg: &Bson) -> Result<Bson, ProxyError> {
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
            ("$unset", Bson::Array(a)) => Bson::Array(self.paths(a)),
            ("$redact", e) => {
                // Its expression is evaluated in the document and again in
                // each embedded document it descends into, with paths read
                // from there: one rewrite serves every depth only if the
                // names it reads are stored alike at every depth.
                let mut paths = Vec::new();
                relative_paths(e, &mut paths);
                if let Some(p) = paths.iter().find(|p| !self.policy.same_at_every_depth(p)) {
                    return Err(refuse(&format!(
                        "$redact reading `{p}` (it reads it in embedded documents too, where its names are stored otherwise than at the top)"
                    )));
                }
                self.expr(e, &[], &none)?
            }
            ("$replaceRoot", Bson::Document(r)) => {
                let mut out = r.clone();
                if let Some(e) = r.get("newRoot") {
                    out.insert("newRoot", self.expr_as(e, &[], &none, Use::Moved)?);
                }
                Bson::Document(out)
            }
            ("$replaceWith", e) => self.expr_as(e, &[], &none, Use::Moved)?,
            ("$group", Bson::Document(g)) => Bson::Document(self.group(g)?),
            ("$bucket" | "$bucketAuto", Bson::Document(b)) => Bson::Document(self.bucket(b)?),
            ("$sortByCount", e) => self.expr(e, &[], &none)?,
            ("$facet", Bson::Document(f)) => Bson::Document(self.facet(f)?),
            ("$unwind", Bson::String(p)) => Bson::String(self.field_ref(p)),
            ("$unwind", Bson::Document(u)) => Bson::Document(self.unwind(u)),
            ("$lookup", Bson::Document(l)) => Bson::Document(self.lookup(l)?),
            ("$graphLookup", Bson::Document(g)) => Bson::Document(self.graph_lookup(g)?),
            ("$unionWith", Bson::String(_)) => arg.clone(),
            ("$unionWith", Bson::Document(u)) => Bson::Document(self.union_with(u)?),
            ("$setWindowFields", Bson::Document(w)) => Bson::Document(self.window_fields(w)?),
            ("$densify", Bson::Document(d)) => Bson::Document(self.densify(d)),
            ("$fill", Bson::Document(f)) => Bson::Document(self.fill(f)?),
            ("$geoNear", Bson::Document(g)) => Bson::Document(self.geo_near(g)?),
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
    /// What it outputs is not stored (it feeds a stage of the outer one).
    pub(super) fn sub_pipeline(&self, stages: &[Bson]) -> Result<Bson, ProxyError> {
        let mut stages = stages.to_vec();
        Mapper {
            stores_documents: false,
            ..*self
        }
        .pipeline(&mut stages)?;
        Ok(Bson::Array(stages))
    }

    /// The stages after `$changeStream` see change events: only the paths
    /// below `fullDocument`, `fullDocumentBeforeChange`, `documentKey` and
    /// `updateDescription.updatedFields` are the collection's.
    pub(super) fn change_stream(&self, stages: &mut [Bson]) -> Result<(), ProxyError> {
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
    pub(super) fn event_path(&self, p: &str) -> String {
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
    pub(super) fn event_filter(&self, f: &Document) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in f {
            match (k.as_str(), v) {
                ("$and" | "$or" | "$nor", Bson::Array(a)) => {
                    let subs = super::paths::clauses(a, |d| self.event_filter(d))?;
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
}

impl Mapper<'_> {
    /// A list of path strings (`$unset`).
    fn paths(&self, a: &[Bson]) -> Vec<Bson> {
        a.iter()
            .map(|p| match p {
                Bson::String(p) => Bson::String(self.path(p, &[])),
                other => other.clone(),
            })
            .collect()
    }

    fn bucket(&self, b: &Document) -> Result<Document, ProxyError> {
        each_field(b, |k, v| {
            Ok(match (k, v) {
                ("groupBy", v) => self.expr(v, &[], &Vars::default())?,
                ("output", Bson::Document(o)) => Bson::Document(self.accumulators(o)?),
                _ => v.clone(),
            })
        })
    }

    fn facet(&self, f: &Document) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in f {
            let stages = v.as_array().map_or(&[][..], Vec::as_slice);
            out.insert(self.name(&[], k), self.sub_pipeline(stages)?);
        }
        Ok(out)
    }

    fn unwind(&self, u: &Document) -> Document {
        let mut out = u.clone();
        if let Ok(p) = u.get_str("path") {
            out.insert("path", self.field_ref(p));
        }
        if let Ok(i) = u.get_str("includeArrayIndex") {
            out.insert("includeArrayIndex", self.path(i, &[]));
        }
        out
    }

    fn union_with(&self, u: &Document) -> Result<Document, ProxyError> {
        let foreign = self.foreign_namespace("$unionWith", u)?;
        let mut out = u.clone();
        if let Ok(p) = u.get_array("pipeline") {
            out.insert("pipeline", foreign.sub_pipeline(p)?);
        }
        Ok(out)
    }

    fn densify(&self, d: &Document) -> Document {
        let mut out = d.clone();
        if let Ok(f) = d.get_str("field") {
            out.insert("field", self.path(f, &[]));
        }
        self.path_list(&mut out, "partitionByFields");
        out
    }

    fn geo_near(&self, g: &Document) -> Result<Document, ProxyError> {
        let mut out = g.clone();
        for k in ["distanceField", "includeLocs", "key"] {
            if let Ok(p) = g.get_str(k) {
                out.insert(k, self.path(p, &[]));
            }
        }
        if let Ok(q) = g.get_document("query") {
            out.insert("query", self.checked_filter(q, &[])?);
        }
        Ok(out)
    }

    fn add_fields(&self, f: &Document) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in f {
            let scope = fields(&[], k);
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
    pub(super) fn group(&self, g: &Document) -> Result<Document, ProxyError> {
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

    pub(super) fn accumulators(&self, o: &Document) -> Result<Document, ProxyError> {
        let mut out = Document::new();
        for (k, v) in o {
            out.insert(self.name(&[], k), self.accumulator(v)?);
        }
        Ok(out)
    }

    /// `{<accumulator>: <argument>}`.
    pub(super) fn accumulator(&self, v: &Bson) -> Result<Bson, ProxyError> {
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

    pub(super) fn lookup(&self, l: &Document) -> Result<Document, ProxyError> {
        let foreign = self.from("$lookup", l)?;
        if let (Ok(local), Ok(field)) = (l.get_str("localField"), l.get_str("foreignField")) {
            same_values("$lookup", (self, local), (&foreign, field))?;
        }
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

    /// Whether the path holds value tokens where it holds strings.
    fn holds_values(&self, p: &str) -> bool {
        self.policy.is_value_path(&super::paths::fields(&[], p))
    }

    /// The collection a `$lookup` or `$graphLookup` reads (`from`): one of
    /// this database, or `{db, coll}` of another.
    pub(super) fn from<'s>(
        &'s self,
        stage: &str,
        spec: &'s Document,
    ) -> Result<Mapper<'s>, ProxyError> {
        Ok(match spec.get("from") {
            Some(Bson::String(c)) => self.for_collection(c),
            Some(Bson::Document(ns)) => self.foreign_namespace(stage, ns)?,
            _ => self.clone_for_documents(),
        })
    }

    /// `let` variables: their names stay, their values are expressions.
    /// One that reads a tokenized value path is refused: the variable
    /// carries value tokens into a sub-pipeline, where what it is compared
    /// with (another collection's field, a constant) holds strings.
    pub(super) fn let_vars(&self, let_vars: &Document) -> Result<Document, ProxyError> {
        let mut o = Document::new();
        for (name, e) in let_vars {
            let mut read = Vec::new();
            relative_paths(e, &mut read);
            root_paths(e, &mut read);
            if let Some(p) = read.iter().find(|p| self.holds_values(p)) {
                return Err(refuse(&format!(
                    "the variable {name} reading the tokenized value path {p}: what it is compared with may hold strings, and tokenized values are not strings"
                )));
            }
            o.insert(
                name.clone(),
                self.expr_as(e, &[], &Vars::default(), Use::Moved)?,
            );
        }
        Ok(o)
    }

    pub(super) fn graph_lookup(&self, g: &Document) -> Result<Document, ProxyError> {
        let foreign = self.from("$graphLookup", g)?;
        // The values matched against `connectToField` come from `startWith`
        // first, then from `connectFromField`.
        if let Ok(to) = g.get_str("connectToField") {
            if let Ok(from) = g.get_str("connectFromField") {
                same_values("$graphLookup", (&foreign, from), (&foreign, to))?;
            }
            match g.get("startWith") {
                Some(Bson::String(s)) if s.starts_with('$') && !s.starts_with("$$") => {
                    same_values("$graphLookup", (self, &s[1..]), (&foreign, to))?;
                }
                Some(_) if foreign.holds_values(to) => {
                    return Err(ProxyError::Unsupported(format!(
                        "$graphLookup matching the tokenized value path {to} with what startWith computes cannot be kept correct: tokenized values are not strings"
                    )))
                }
                Some(e) => {
                    let mut read = Vec::new();
                    relative_paths(e, &mut read);
                    for p in read {
                        same_values("$graphLookup", (self, p), (&foreign, to))?;
                    }
                }
                None => {}
            }
        }
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

    pub(super) fn window_fields(&self, w: &Document) -> Result<Document, ProxyError> {
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

    pub(super) fn fill(&self, f: &Document) -> Result<Document, ProxyError> {
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

    pub(super) fn merge(&self, m: &Document) -> Result<Document, ProxyError> {
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
                ("whenMatched", Bson::Array(p)) => {
                    // Its output replaces the target's document: stored.
                    let mut stages = p.clone();
                    self.pipeline(&mut stages)?;
                    Bson::Array(stages)
                }
                _ => v.clone(),
            })
        })?;
        Ok(out)
    }

    /// `$out`/`$merge` write the pipeline's documents, whose names are in
    /// this collection's mapping, into their target: refused unless the
    /// target has the same mapping (same dictionary, same settings).
    pub(super) fn same_mapping(&self, stage: &str, target: &Bson) -> Result<(), ProxyError> {
        let (db, coll) = match target {
            Bson::String(c) => (self.db.to_owned(), c.clone()),
            Bson::Document(d) => (
                d.get_str("db").unwrap_or(self.db).to_owned(),
                d.get_str("coll").unwrap_or_default().to_owned(),
            ),
            _ => return Ok(()),
        };
        let source = Some(self.policy).filter(|p| p.is_active());
        let Some(why) = self.policies.unlike((self.db, source), &db, &coll) else {
            return Ok(());
        };
        Err(ProxyError::Unsupported(format!(
            "{stage} into {db}.{coll} cannot be rewritten: {why}"
        )))
    }

    /// The collection a stage reads from another namespace (`{db, coll}`):
    /// rewritten with the same dictionary, so its database must share it.
    pub(super) fn foreign_namespace<'s>(
        &'s self,
        stage: &str,
        ns: &'s Document,
    ) -> Result<Mapper<'s>, ProxyError> {
        let db = ns.get_str("db").unwrap_or(self.db);
        let coll = ns.get_str("coll").unwrap_or_default();
        if !self.policies.same_dictionary(db, self.db) {
            return Err(ProxyError::Unsupported(format!(
                "{stage} from {db}.{coll} cannot be rewritten: its database has another dictionary (databases that share one are configured in [[proxy.tokenize.dictionaries]])"
            )));
        }
        Ok(self.for_namespace(db, coll))
    }

    pub(super) fn clone_for_documents(&self) -> Mapper<'_> {
        self.for_collection("")
    }

    // === Expressions ===
}

/// A join compares the values of two paths: both must hold value tokens,
/// or neither (a token never equals the string it stands for).
fn same_values(
    stage: &str,
    (a, p): (&Mapper<'_>, &str),
    (b, q): (&Mapper<'_>, &str),
) -> Result<(), ProxyError> {
    match (a.holds_values(p), b.holds_values(q)) {
        (true, false) | (false, true) => {
            let (tokens, strings) = if a.holds_values(p) { (p, q) } else { (q, p) };
            Err(ProxyError::Unsupported(format!(
                "{stage} joining the tokenized value path {tokens} with {strings}, which holds strings, cannot be kept correct: tokenized values are not strings"
            )))
        }
        _ => Ok(()),
    }
}

/// The paths an expression reads relative to the document it is evaluated
/// in: `$a.b`, `$$CURRENT.a.b`, and the fields `$getField` names (as its
/// input, the current document, is by default). Conservative: a string that
/// only looks like a path (in `$literal`, say) counts too.
/// The paths an expression reads from the top through `$$ROOT.`.
fn root_paths<'e>(e: &'e Bson, out: &mut Vec<&'e str>) {
    match e {
        Bson::String(s) => out.extend(s.strip_prefix("$$ROOT.")),
        Bson::Array(a) => a.iter().for_each(|v| root_paths(v, out)),
        Bson::Document(d) => d.values().for_each(|v| root_paths(v, out)),
        _ => {}
    }
}

fn relative_paths<'e>(e: &'e Bson, out: &mut Vec<&'e str>) {
    match e {
        Bson::String(s) => {
            if let Some(p) = s.strip_prefix("$$CURRENT.") {
                out.push(p);
            } else if let Some(p) = s.strip_prefix('$').filter(|p| !p.starts_with('$')) {
                out.push(p);
            }
        }
        Bson::Array(a) => a.iter().for_each(|v| relative_paths(v, out)),
        Bson::Document(d) => {
            for (k, v) in d {
                match (k.as_str(), v) {
                    ("$getField", Bson::String(f)) => out.push(f),
                    ("$getField", Bson::Document(g)) => {
                        if let Some(Bson::String(f)) = g.get("field") {
                            out.push(f);
                        }
                    }
                    _ => {}
                }
                relative_paths(v, out);
            }
        }
        _ => {}
    }
}

/// A logical path as error texts name it.
pub(super) fn place_name(place: &[String]) -> String {
    match place {
        [] => "the top".to_owned(),
        p => p.join("."),
    }
}
