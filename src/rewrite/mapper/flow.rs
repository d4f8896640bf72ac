//! How a pipeline's documents are stored from stage to stage (the layouts
//! of [`crate::token::layout`]): each stage is rewritten under the layout
//! of the documents it reads, and says what it moved where.

use bson::{Bson, Document};

use super::expr::SYSTEM_VARIABLES;
use super::paths::fields;
use super::query::is_flag;
use super::{refuse, Mapper};
use crate::error::ProxyError;
use crate::token::layout::Subtree;
use crate::token::Policy;

/// Operators whose result may be (or hold) a document of their arguments,
/// each argument landing where the result does.
const MOVING: &[&str] = &[
    "$addToSet",
    "$arrayElemAt",
    "$concatArrays",
    "$first",
    "$last",
    "$ifNull",
    "$max",
    "$min",
    "$push",
    "$reverseArray",
    "$setDifference",
    "$setIntersection",
    "$setUnion",
    "$slice",
    "$mergeObjects",
    "$locf",
];

/// Operators of named arguments whose result may hold documents of the
/// arguments listed.
const MOVING_NAMED: &[(&str, &[&str])] = &[
    ("$filter", &["input"]),
    ("$sortArray", &["input"]),
    ("$firstN", &["input"]),
    ("$lastN", &["input"]),
    ("$maxN", &["input"]),
    ("$minN", &["input"]),
    ("$top", &["output"]),
    ("$bottom", &["output"]),
    ("$topN", &["output"]),
    ("$bottomN", &["output"]),
    ("$shift", &["output", "default"]),
    ("$zip", &["inputs", "defaults"]),
    ("$cond", &["then", "else"]),
];

/// Operators whose result is a document of names the server makes.
const MAKING_NAMES: &[&str] = &["$regexFind", "$regexFindAll", "$dateToParts"];

/// What lands where in a stage's output: a place, and how the names below
/// it are stored (read from the stage's input).
#[derive(Default)]
struct Landings(Vec<(Vec<String>, Subtree)>);

impl Landings {
    fn put(&mut self, out: &[String], sub: Subtree) {
        self.0.push((out.to_vec(), sub));
    }

    /// The layouts after grafting each place into `base`, the shallower
    /// first. A place given subtrees of more than one form (`$ifNull` of
    /// two paths, `$unionWith`) makes one layout per form.
    fn apply(mut self, base: &Policy) -> Vec<Policy> {
        self.0.sort_by_key(|(out, _)| out.len());
        let mut layouts = vec![base.clone()];
        let mut i = 0;
        while i < self.0.len() {
            let out = &self.0[i].0;
            let same = self.0[i..].iter().take_while(|(o, _)| o == out).count();
            let mut forms: Vec<&Subtree> = Vec::new();
            for (_, s) in &self.0[i..i + same] {
                if !forms.contains(&s) {
                    forms.push(s);
                }
            }
            layouts = layouts
                .iter()
                .flat_map(|l| {
                    forms.iter().map(move |s| {
                        let mut l = l.clone();
                        l.graft(out, s);
                        l
                    })
                })
                .collect();
            layouts = bounded(layouts, base);
            i += same;
        }
        layouts
    }
}

/// At most this many layouts a pipeline's documents may be in at once.
const MAX_FORMS: usize = 8;

/// `layouts` without repeats; past [`MAX_FORMS`], one whose top is opaque
/// (no later stage can name a field).
fn bounded(mut layouts: Vec<Policy>, base: &Policy) -> Vec<Policy> {
    let mut unique: Vec<Policy> = Vec::with_capacity(layouts.len());
    for l in layouts.drain(..) {
        if !unique.contains(&l) {
            unique.push(l);
        }
    }
    if unique.len() > MAX_FORMS {
        let mut l = base.clone();
        l.graft(&[], &Subtree::opaque());
        return vec![l];
    }
    unique
}

/// Variables in scope: bound to a path (`$map`'s `as` over `"$items"`), or
/// to something else (`None`).
#[derive(Clone, Default)]
struct Binds(Vec<(String, Option<Vec<String>>)>);

impl Binds {
    fn with(&self, name: &str, to: Option<Vec<String>>) -> Binds {
        let mut b = self.clone();
        b.0.push((name.to_owned(), to));
        b
    }

    fn get(&self, name: &str) -> Option<&Option<Vec<String>>> {
        self.0.iter().rev().find(|(n, _)| n == name).map(|(_, p)| p)
    }
}

/// The path a bare field path or `$$ROOT`/`$$CURRENT` path stands for,
/// also behind what only passes it on or falls back to a literal holding no
/// document (`{$ifNull: ["$items", []]}`, what `$map` is often given).
pub(super) fn bare_path(e: &Bson) -> Option<Vec<String>> {
    if let Bson::Document(d) = e {
        let (op, arg) = d.iter().next()?;
        let passed = match (op.as_str(), arg) {
            ("$ifNull", Bson::Array(a)) => {
                let (first, rest) = a.split_first()?;
                rest.iter()
                    .all(|x| !holds_document(x) && !is_expression(x))
                    .then_some(first)
            }
            ("$filter" | "$sortArray", Bson::Document(f)) => f.get("input"),
            ("$reverseArray", x) => Some(x),
            ("$slice", Bson::Array(a)) => a.first(),
            _ => None,
        };
        return passed.and_then(bare_path);
    }
    let Bson::String(s) = e else { return None };
    let rest = s
        .strip_prefix("$$ROOT")
        .or_else(|| s.strip_prefix("$$CURRENT"))
        .map(|r| r.trim_start_matches('.'))
        .or_else(|| s.strip_prefix('$').filter(|p| !p.starts_with('$')))?;
    Some(if rest.is_empty() {
        Vec::new()
    } else {
        fields(&[], rest)
    })
}

impl Mapper<'_> {
    /// The layouts of the documents a pipeline outputs, from this mapper's
    /// (the layout of the documents it reads).
    pub(super) fn flow(&self, stages: &[Bson]) -> Vec<Policy> {
        let mut layouts = vec![self.policy.clone()];
        for stage in stages {
            if let Some((name, arg)) = stage.as_document().and_then(|s| s.iter().next()) {
                layouts = self.next_layouts(&layouts, name, arg);
            }
        }
        layouts
    }

    /// The layouts after the stage `name`, from each of `layouts`.
    pub(super) fn next_layouts(&self, layouts: &[Policy], name: &str, arg: &Bson) -> Vec<Policy> {
        let next = layouts
            .iter()
            .flat_map(|l| {
                self.with_layout(l)
                    .layout_after(name, arg)
                    .unwrap_or_else(|| vec![l.clone()])
            })
            .collect();
        bounded(next, self.policy)
    }

    /// The layouts after the stage `name` (`None`: this mapper's alone).
    pub(super) fn layout_after(&self, name: &str, arg: &Bson) -> Option<Vec<Policy>> {
        let mut out = Landings::default();
        let none = Binds::default();
        // Keys the server writes as they are.
        let mut made: Vec<Vec<String>> = Vec::new();
        match (name, arg) {
            ("$addFields" | "$set", Bson::Document(f)) => {
                for (k, v) in f {
                    self.lands(v, &fields(&[], k), &none, &mut out);
                }
            }
            ("$project", Bson::Document(p)) => self.projected(p, &[], &mut out),
            ("$replaceRoot", Bson::Document(r)) => {
                if let Some(e) = r.get("newRoot") {
                    self.lands(e, &[], &none, &mut out);
                }
            }
            ("$replaceWith", e) => self.lands(e, &[], &none, &mut out),
            ("$group", Bson::Document(g)) => {
                for (k, v) in g {
                    let at = [k.clone()];
                    match k.as_str() {
                        "_id" => self.lands(v, &at, &none, &mut out),
                        _ => self.accumulated(v, &at, &mut out),
                    }
                }
                made.push(vec!["_id".to_owned()]);
            }
            ("$bucket" | "$bucketAuto", Bson::Document(b)) => {
                match b.get_document("output") {
                    Ok(o) => o
                        .iter()
                        .for_each(|(k, v)| self.accumulated(v, std::slice::from_ref(k), &mut out)),
                    Err(_) => made.push(vec!["count".to_owned()]),
                }
                made.push(vec!["_id".to_owned()]);
                if name == "$bucketAuto" {
                    for bound in ["min", "max"] {
                        let at = vec!["_id".to_owned(), bound.to_owned()];
                        if let Some(e) = b.get("groupBy") {
                            self.lands(e, &at, &none, &mut out);
                        }
                        made.push(at);
                    }
                }
            }
            ("$sortByCount", e) => {
                self.lands(e, &["_id".to_owned()], &none, &mut out);
                made.push(vec!["_id".to_owned()]);
                made.push(vec!["count".to_owned()]);
            }
            ("$setWindowFields", Bson::Document(w)) => {
                if let Ok(o) = w.get_document("output") {
                    for (k, spec) in o {
                        self.accumulated(spec, &fields(&[], k), &mut out);
                    }
                }
            }
            ("$fill", Bson::Document(f)) => {
                if let Ok(o) = f.get_document("output") {
                    for (k, spec) in o {
                        if let Some(v) = spec.as_document().and_then(|s| s.get("value")) {
                            self.lands(v, &fields(&[], k), &none, &mut out);
                        }
                    }
                }
            }
            ("$lookup", Bson::Document(l)) => {
                if let (Ok(as_), Ok(foreign)) = (l.get_str("as"), self.from("$lookup", l)) {
                    let joined = match l.get_array("pipeline") {
                        Ok(p) => foreign.flow(p),
                        Err(_) => vec![foreign.policy.clone()],
                    };
                    for j in joined {
                        out.put(&fields(&[], as_), j.subtree::<&str>(&[]));
                    }
                }
            }
            ("$graphLookup", Bson::Document(g)) => {
                if let (Ok(as_), Ok(foreign)) = (g.get_str("as"), self.from("$graphLookup", g)) {
                    out.put(&fields(&[], as_), foreign.policy.subtree::<&str>(&[]));
                }
            }
            ("$facet", Bson::Document(f)) => {
                for (k, v) in f {
                    let stages = v.as_array().map_or(&[][..], Vec::as_slice);
                    for l in self.flow(stages) {
                        out.put(std::slice::from_ref(k), l.subtree::<&str>(&[]));
                    }
                }
            }
            ("$unionWith", u) => {
                // Its documents and this pipeline's, side by side.
                let others = match u {
                    Bson::String(c) => vec![self.for_collection(c).policy.clone()],
                    Bson::Document(d) => match self.foreign_namespace("$unionWith", d) {
                        Ok(f) => match d.get_array("pipeline") {
                            Ok(p) => f.flow(p),
                            Err(_) => vec![f.policy.clone()],
                        },
                        Err(_) => Vec::new(),
                    },
                    _ => Vec::new(),
                };
                out.put(&[], self.policy.subtree::<&str>(&[]));
                for o in others {
                    out.put(&[], o.subtree::<&str>(&[]));
                }
            }
            ("$geoNear", Bson::Document(g)) => {
                if let Ok(p) = g.get_str("includeLocs") {
                    out.put(&fields(&[], p), Subtree::opaque());
                }
            }
            _ => {}
        }
        if out.0.is_empty() && made.is_empty() {
            return None;
        }
        let mut layouts = out.apply(self.policy);
        for l in &mut layouts {
            made.iter().for_each(|k| l.plain_key(k.clone()));
        }
        (layouts.len() > 1 || layouts[0] != *self.policy).then_some(layouts)
    }

    /// A `$project`'s computed fields (flags keep what is there).
    fn projected(&self, p: &Document, at: &[String], out: &mut Landings) {
        for (k, v) in p {
            let place = fields(at, k);
            match v {
                v if is_flag(v) => {}
                Bson::Document(d) if d.keys().next().is_some_and(|k| !k.starts_with('$')) => {
                    self.projected(d, &place, out)
                }
                Bson::Document(d) if d.contains_key("$elemMatch") || d.contains_key("$slice") => {}
                v => self.lands(v, &place, &Binds::default(), out),
            }
        }
    }

    /// `{<accumulator>: <argument>}` whose result lands at `at`.
    fn accumulated(&self, v: &Bson, at: &[String], out: &mut Landings) {
        match v {
            Bson::Document(acc) => {
                for (op, arg) in acc {
                    self.operator_lands(op, arg, at, &Binds::default(), out);
                }
            }
            v => self.lands(v, at, &Binds::default(), out),
        }
    }

    /// Where what the expression `e` yields, landing at `at`, comes from.
    fn lands(&self, e: &Bson, at: &[String], binds: &Binds, out: &mut Landings) {
        match e {
            Bson::String(s) if s.starts_with("$$") => {
                let body = &s[2..];
                let (var, rest) = body.split_once('.').unwrap_or((body, ""));
                let rest = if rest.is_empty() {
                    Vec::new()
                } else {
                    fields(&[], rest)
                };
                let from = match var {
                    "ROOT" | "CURRENT" => Some(rest),
                    v if SYSTEM_VARIABLES.contains(&v) => return,
                    v => match binds.get(v) {
                        Some(Some(path)) => Some(fields(path, &rest.join("."))),
                        Some(None) => None,
                        // `$merge`'s `whenMatched` reads the incoming
                        // document as `$$new`: stored as the target stores
                        // its own (`$merge` into other settings is refused).
                        None if v == "new" => Some(rest),
                        None => None,
                    },
                };
                match from {
                    Some(from) => out.put(at, self.policy.subtree(&from)),
                    None => out.put(at, Subtree::opaque()),
                }
            }
            Bson::String(s) if s.starts_with('$') => {
                out.put(at, self.policy.subtree(&fields(&[], &s[1..])));
            }
            Bson::Array(a) => a.iter().for_each(|x| self.lands(x, at, binds, out)),
            Bson::Document(d) => match d.iter().next() {
                Some((op, arg)) if op.starts_with('$') => {
                    self.operator_lands(op, arg, at, binds, out)
                }
                _ => {
                    // An object literal: its keys are written in the form
                    // of the place they land in, its values land below.
                    out.put(at, self.policy.subtree(at));
                    for (k, v) in d {
                        let mut place = at.to_vec();
                        place.push(k.clone());
                        self.lands(v, &place, binds, out);
                    }
                }
            },
            _ => {}
        }
    }

    fn operator_lands(
        &self,
        op: &str,
        arg: &Bson,
        at: &[String],
        binds: &Binds,
        out: &mut Landings,
    ) {
        let named = |key: &str| arg.as_document().and_then(|d| d.get(key));
        match op {
            "$literal" => {
                if holds_document(arg) {
                    out.put(at, Subtree::plain());
                }
            }
            op if MAKING_NAMES.contains(&op) => out.put(at, Subtree::plain()),
            "$cond" if arg.as_array().is_some() => {
                let a = arg.as_array().map_or(&[][..], Vec::as_slice);
                a.iter().skip(1).for_each(|x| self.lands(x, at, binds, out));
            }
            "$switch" => {
                if let Some(Bson::Array(branches)) = named("branches") {
                    for b in branches {
                        if let Some(then) = b.as_document().and_then(|b| b.get("then")) {
                            self.lands(then, at, binds, out);
                        }
                    }
                }
                if let Some(d) = named("default") {
                    self.lands(d, at, binds, out);
                }
            }
            "$let" => {
                let mut inner = binds.clone();
                if let Some(Bson::Document(vars)) = named("vars") {
                    for (name, e) in vars {
                        inner = inner.with(name, bare_path(e));
                    }
                }
                if let Some(e) = named("in") {
                    self.lands(e, at, &inner, out);
                }
            }
            "$map" | "$reduce" => {
                let input = named("input").and_then(bare_path);
                let inner = match op {
                    "$reduce" => binds.with("this", input).with("value", None),
                    _ => binds.with(named("as").and_then(Bson::as_str).unwrap_or("this"), input),
                };
                if let Some(init) = named("initialValue") {
                    self.lands(init, at, binds, out);
                }
                if let Some(e) = named("in") {
                    self.lands(e, at, &inner, out);
                }
            }
            "$getField" => {
                let field = match arg {
                    Bson::String(f) => Some(f.as_str()),
                    _ => named("field").and_then(Bson::as_str),
                };
                let input = match named("input") {
                    None => Some(Vec::new()),
                    Some(i) => bare_path(i),
                };
                match (field, input) {
                    (Some(f), Some(mut from)) if !f.starts_with('$') => {
                        from.push(f.to_owned());
                        out.put(at, self.policy.subtree(&from));
                    }
                    _ => out.put(at, Subtree::opaque()),
                }
            }
            "$setField" | "$unsetField" => {
                if let Some(i) = named("input") {
                    self.lands(i, at, binds, out);
                }
                if let (Some(Bson::String(f)), Some(v)) = (named("field"), named("value")) {
                    let mut place = at.to_vec();
                    place.push(f.clone());
                    self.lands(v, &place, binds, out);
                }
            }
            op if MOVING.contains(&op) => self.lands(arg, at, binds, out),
            op => {
                if let Some((_, keys)) = MOVING_NAMED.iter().find(|(o, _)| *o == op) {
                    for k in *keys {
                        if let Some(v) = named(k) {
                            self.lands(v, at, binds, out);
                        }
                    }
                }
            }
        }
    }

    /// Refuses a stage that names anything below an opaque place of the
    /// layout it reads. Conservative: every key (below the keys holding
    /// it) and every string counts as a path, and a variable of the user's
    /// may stand for any place.
    pub(super) fn check_opaque(&self, name: &str, arg: &Bson) -> Result<(), ProxyError> {
        if self.policy.opaque.is_empty() {
            return Ok(());
        }
        let mut named = Named::default();
        named.walk(arg, &[]);
        let hit = if named.variables {
            self.policy.opaque.first().map(Vec::as_slice)
        } else {
            named.paths.iter().find_map(|p| self.policy.opaque_at(p))
        };
        match hit {
            None => Ok(()),
            Some(o) => Err(refuse(&format!(
                "the stage {name} naming fields below {} after an earlier stage put documents there whose names are stored in a form that cannot be told",
                super::stages::place_name(o)
            ))),
        }
    }
}

/// The paths a stage's argument may name.
#[derive(Default)]
struct Named {
    paths: Vec<Vec<String>>,
    /// It reads a variable of the user's (`$$this.a`).
    variables: bool,
}

impl Named {
    fn walk(&mut self, v: &Bson, at: &[String]) {
        match v {
            Bson::String(s) => self.string(s),
            Bson::Array(a) => a.iter().for_each(|x| self.walk(x, at)),
            Bson::Document(d) => {
                for (k, x) in d {
                    if k.starts_with('$') {
                        self.walk(x, at);
                    } else {
                        let place = fields(at, k);
                        self.walk(x, &place);
                        self.paths.push(place);
                    }
                }
            }
            _ => {}
        }
    }

    fn string(&mut self, s: &str) {
        let path = match s.strip_prefix("$$") {
            Some(var) => match var.split_once('.') {
                Some(("ROOT" | "CURRENT", rest)) => rest,
                Some(_) => {
                    self.variables = true;
                    return;
                }
                None => return,
            },
            None => s.strip_prefix('$').unwrap_or(s),
        };
        self.paths.push(fields(&[], path));
    }
}

/// Whether a value is an expression: a path, a variable, or an operator.
fn is_expression(v: &Bson) -> bool {
    match v {
        Bson::String(s) => s.starts_with('$'),
        Bson::Array(a) => a.iter().any(is_expression),
        Bson::Document(d) => d
            .iter()
            .any(|(k, x)| k.starts_with('$') || is_expression(x)),
        _ => false,
    }
}

/// Whether a literal value holds a document (whose keys stay as written).
fn holds_document(v: &Bson) -> bool {
    match v {
        Bson::Document(_) => true,
        Bson::Array(a) => a.iter().any(holds_document),
        _ => false,
    }
}
