//! Expressions (catalogue §5.1): paths in strings, variables bound to paths,
//! object literals whose keys are names, and the operators that take names
//! as strings; the operator tables say which arguments are expressions.

use bson::{Bson, Document};

use super::paths::fields;
use super::{refuse, Mapper};
use crate::error::ProxyError;

/// Variables that are not paths into a document.
pub(super) const SYSTEM_VARIABLES: &[&str] = &[
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
pub(super) enum Use {
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

impl Mapper<'_> {
    pub(super) fn expr(&self, e: &Bson, out: &[String], vars: &Vars) -> Result<Bson, ProxyError> {
        self.expr_as(e, out, vars, Use::Computed)
    }

    /// An expression whose result lands at the output path `out`.
    pub(super) fn expr_as(
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
                if used == Use::Computed && self.policy.is_value_path(&fields(&[], p)) {
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
    pub(super) fn variable(&self, s: &str, vars: &Vars) -> String {
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
    pub(super) fn operator(
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
    pub(super) fn field_operator(
        &self,
        op: &str,
        arg: &Bson,
        vars: &Vars,
    ) -> Result<Bson, ProxyError> {
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

/// The logical path an expression stands for, when it is a bare field path
/// or passes one on (what `$map`'s `as` or a `$let` variable is then bound
/// to; the top otherwise). The same reading decides where a variable's
/// documents come from in the pipeline's layout ([`super::flow`]).
pub(super) fn bound_scope(e: &Bson) -> Vec<String> {
    super::flow::bare_path(e).unwrap_or_default()
}
