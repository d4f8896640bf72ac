//! Shard-key rules as configured: which collection, which field, which
//! strategy and mode ([`crate::rewrite::shard_key`] applies them).

use crate::locality::Mode;

/// How a collection's shard key is rewritten.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Strategy {
    Replace,
    /// The name of the added shard-key field.
    Derive {
        field: String,
    },
}

/// One collection's rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    /// `db.collection`.
    pub namespace: String,
    /// The field whose ObjectIds are rewritten (usually `_id`).
    pub field: String,
    pub strategy: Strategy,
    pub mode: Mode,
}

/// The field `derive` adds when none is named.
pub const DEFAULT_DERIVED_FIELD: &str = "_lk";

impl Rule {
    /// Parses `DB.COLL:FIELD:STRATEGY[:sequential]` (the `--shard-key` flag).
    pub fn parse(spec: &str) -> Result<Rule, String> {
        let parts: Vec<&str> = spec.split(':').collect();
        let (ns, field, strategy) = match parts.as_slice() {
            [ns, field, strategy] | [ns, field, strategy, _] => (*ns, *field, *strategy),
            _ => return Err("expected DB.COLL:FIELD:STRATEGY[:sequential]".into()),
        };
        let mode = match parts.get(3) {
            None => Mode::Default,
            Some(&"sequential") => Mode::Sequential,
            Some(other) => return Err(format!("unknown mode {other:?}: expected sequential")),
        };
        Rule::new(ns, field, strategy, mode, None)
    }

    pub fn new(
        namespace: &str,
        field: &str,
        strategy: &str,
        mode: Mode,
        derived_field: Option<&str>,
    ) -> Result<Rule, String> {
        match namespace.split_once('.') {
            Some((db, coll)) if !db.is_empty() && !coll.is_empty() => {}
            _ => return Err(format!("{namespace:?} is not a DB.COLLECTION namespace")),
        }
        if field.is_empty() || field.starts_with('$') || field.contains('.') {
            return Err(format!("{field:?} is not a top-level field name"));
        }
        let strategy = match strategy {
            "replace" => Strategy::Replace,
            "derive" => Strategy::Derive {
                field: derived_field.unwrap_or(DEFAULT_DERIVED_FIELD).to_owned(),
            },
            other => {
                return Err(format!(
                    "unknown strategy {other:?}: expected replace or derive"
                ))
            }
        };
        Ok(Rule {
            namespace: namespace.to_owned(),
            field: field.to_owned(),
            strategy,
            mode,
        })
    }
}
