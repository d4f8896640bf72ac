//! How names are stored between an aggregation's stages.
//!
//! A collection's [`Policy`] says, place by place, how its documents store
//! names: which keys are tokens, which hold value tokens, which are left as
//! they are. A stage may put documents where that no longer holds: a
//! `$lookup` puts another collection's documents under its `as`, a
//! `$replaceRoot` makes a custom-attribute subtree the top, a `$group`
//! moves whole documents into an array, `$sortByCount` makes a `count` the
//! server names. Those documents keep the form they were stored in, so a
//! later stage must name their fields in that form, not in the form their
//! new place would have.
//!
//! The stored form of the documents a stage outputs is itself a [`Policy`]
//! (a *layout*): the collection's, with what each stage moved grafted in.
//! Each stage is rewritten under the layout of its input. A place whose
//! documents may come in more than one form is *opaque*: a later stage
//! naming anything below it is refused.

use super::policy::{below, covered_by, is_index_like, is_prefix, rest};
use super::Policy;

/// How names are stored below one place, relative to it: what a move
/// carries to its new place.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subtree {
    /// Every key below is a custom attribute (a custom path holds the place).
    custom_all: bool,
    /// Every key below is stored as it is.
    plain_all: bool,
    /// Nothing below can be rewritten.
    opaque_all: bool,
    custom: Vec<Vec<String>>,
    values: Vec<Vec<String>>,
    plain_keys: Vec<Vec<String>>,
    plain_below: Vec<Vec<String>>,
    opaque: Vec<Vec<String>>,
}

impl Subtree {
    /// Names below stored as they are: a document the server made, or a
    /// `$literal` one.
    pub fn plain() -> Subtree {
        Subtree {
            plain_all: true,
            ..Subtree::default()
        }
    }

    /// Documents in more than one form, or in a form that cannot be told.
    pub fn opaque() -> Subtree {
        Subtree {
            opaque_all: true,
            ..Subtree::default()
        }
    }

    /// Whether nothing below is stored apart from the rules by length: a
    /// subtree that reads the same wherever it is put (at any depth).
    pub fn is_uniform(&self) -> bool {
        *self == Subtree::default()
    }
}

/// `paths` at or below `at`, relative to it, sorted.
fn within<A: AsRef<str>>(paths: &[Vec<String>], at: &[A]) -> Vec<Vec<String>> {
    let mut r: Vec<Vec<String>> = paths
        .iter()
        .filter_map(|p| rest(p, at))
        .map(<[String]>::to_vec)
        .collect();
    r.sort();
    r
}

fn place(out: &[String], rel: &[String]) -> Vec<String> {
    let mut p = out.to_vec();
    p.extend_from_slice(rel);
    p
}

impl Policy {
    /// How names are stored below the logical path `from`.
    pub fn subtree<A: AsRef<str>>(&self, from: &[A]) -> Subtree {
        let custom_all = covered_by(&self.custom_paths, from);
        let plain_all = covered_by(&self.plain_below, from);
        let opaque_all = covered_by(&self.opaque, from);
        Subtree {
            custom_all,
            plain_all,
            opaque_all,
            custom: if custom_all {
                Vec::new()
            } else {
                within(&self.custom_paths, from)
            },
            values: within(&self.value_paths, from),
            plain_keys: below(&self.plain_keys, from),
            plain_below: if plain_all {
                Vec::new()
            } else {
                within(&self.plain_below, from)
            },
            opaque: within(&self.opaque, from),
        }
    }

    /// The layout after a stage put, at the logical path `out`, documents
    /// stored as `sub` says. What was below `out` is replaced; the key of
    /// `out` itself stays as the stage wrote it. A place a rule of a path
    /// above it holds (a custom path, a plain subtree) can only take a
    /// subtree the rule holds too; any other becomes opaque.
    pub fn graft(&mut self, out: &[String], sub: &Subtree) {
        let inside = |p: &Vec<String>| is_prefix(out, p);
        self.custom_paths.retain(|c| !inside(c));
        self.value_paths.retain(|v| !inside(v));
        self.plain_keys
            .retain(|k| !(inside(k) && k.len() > out.len()));
        self.plain_below.retain(|p| !inside(p));
        self.opaque.retain(|o| !inside(o));
        if covered_by(&self.opaque, out) {
            return;
        }
        let custom_above = covered_by(&self.custom_paths, out);
        let plain_above = covered_by(&self.plain_below, out);
        if sub.opaque_all || (custom_above && !sub.custom_all) || (plain_above && !sub.plain_all) {
            self.opaque.push(out.to_vec());
            return;
        }
        if sub.custom_all && !custom_above {
            self.custom_paths.push(out.to_vec());
        }
        if sub.plain_all && !plain_above {
            self.plain_below.push(out.to_vec());
        }
        let add = |list: &mut Vec<Vec<String>>, rels: &[Vec<String>]| {
            list.extend(rels.iter().map(|r| place(out, r)));
        };
        add(&mut self.custom_paths, &sub.custom);
        add(&mut self.value_paths, &sub.values);
        add(&mut self.plain_below, &sub.plain_below);
        add(&mut self.opaque, &sub.opaque);
        // A key kept as it is matters only where the rules would make it
        // a token.
        for rel in &sub.plain_keys {
            let key = place(out, rel);
            let (parent, name) = key.split_at(key.len() - 1);
            let parent: Vec<&str> = parent.iter().map(String::as_str).collect();
            if self.tokenizes_by_rule(&parent, name[0].as_bytes()) {
                self.plain_keys.push(key);
            }
        }
        if out.iter().any(|p| is_index_like(p.as_bytes())) {
            let reached = self.reached_past_digits(out, sub);
            self.opaque.extend(reached);
        }
    }

    /// Below a place with a key of digits (`{$project: {"7": ..}}`), the
    /// rules of the places above it still hold as a query reads them,
    /// with that key left out (see `policy::holds`): `custom` holds at
    /// `7.custom`. The places below `out` where such a rule says what
    /// `sub`, the form of what the stage put there, does not: nothing
    /// below them can be told.
    fn reached_past_digits(&self, out: &[String], sub: &Subtree) -> Vec<Vec<String>> {
        let lists = [
            (
                &self.custom_paths,
                &sub.custom,
                sub.custom_all || sub.plain_all,
                0,
            ),
            // A value path: the key holding the values, below its parent.
            (&self.value_paths, &sub.values, false, 1),
            (&self.plain_below, &sub.plain_below, sub.plain_all, 0),
            // A key kept as it is: what is below its parent.
            (&self.plain_keys, &sub.plain_keys, sub.plain_all, 1),
        ];
        let mut places = Vec::new();
        for (rules, carried, moot, up) in lists {
            if moot {
                continue;
            }
            for r in rules.iter().filter(|r| !is_prefix(out, r)) {
                if let Some(rel) = rest(r, out).filter(|rel| !carried.iter().any(|c| c == rel)) {
                    let mut at = place(out, rel);
                    at.truncate(at.len().saturating_sub(up));
                    places.push(at);
                }
            }
        }
        places
    }

    /// The layout after a stage wrote the key at the full logical path
    /// `key` itself, as it is (`count`, say): a name the server makes.
    pub fn plain_key(&mut self, key: Vec<String>) {
        let (parent, name) = key.split_at(key.len().saturating_sub(1));
        let parent: Vec<&str> = parent.iter().map(String::as_str).collect();
        let tokenized = name
            .first()
            .is_some_and(|n| self.tokenizes_by_rule(&parent, n.as_bytes()));
        if tokenized && !self.plain_keys.contains(&key) {
            self.plain_keys.push(key);
        }
    }

    /// A place below which this layout and `other` store names otherwise
    /// (`None`: they store them alike everywhere).
    pub fn differs_from(&self, other: &Policy) -> Option<Vec<String>> {
        let lists = |p: &Policy| {
            [
                p.custom_paths.clone(),
                p.value_paths.clone(),
                p.plain_keys.clone(),
                p.plain_below.clone(),
                p.opaque.clone(),
            ]
        };
        let (mine, theirs) = (lists(self), lists(other));
        // The highest place that differs: what holds the others.
        mine.iter()
            .zip(&theirs)
            .flat_map(|(a, b)| {
                let only = |x: &[Vec<String>], y: &[Vec<String>]| {
                    x.iter()
                        .filter(|p| !y.contains(p))
                        .cloned()
                        .collect::<Vec<_>>()
                };
                let mut d = only(a, b);
                d.extend(only(b, a));
                d
            })
            .min_by_key(Vec::len)
    }

    /// The opaque place that `path` (a logical path) reaches into, if any.
    pub fn opaque_at<A: AsRef<str>>(&self, path: &[A]) -> Option<&[String]> {
        self.opaque
            .iter()
            .find(|o| is_prefix(o, path) && o.len() < path.len())
            .map(Vec::as_slice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Vec<String> {
        if s.is_empty() {
            Vec::new()
        } else {
            s.split('.').map(str::to_owned).collect()
        }
    }

    fn tok(l: &Policy, parent: &str, key: &str) -> bool {
        let parent = p(parent);
        let parent: Vec<&str> = parent.iter().map(String::as_str).collect();
        l.tokenizes(&parent, key)
    }

    /// A custom-attribute subtree made the top: its short names stay
    /// tokens there, `_id` among them.
    #[test]
    fn a_subtree_made_the_top_keeps_its_form() {
        let base = Policy::new(4, &["custom".into()], "laconic");
        let mut l = base.clone();
        l.graft(&[], &base.subtree(&p("custom")));
        assert!(tok(&l, "", "qty") && tok(&l, "", "_id") && tok(&l, "a", "b"));
        // The top moved under a name: its custom path moves with it, and
        // the short names beside it stay plain.
        let mut l = base.clone();
        l.graft(&p("joined"), &base.subtree::<&str>(&[]));
        assert!(tok(&l, "joined.custom", "qty") && !tok(&l, "joined", "qty"));
        assert!(tok(&l, "custom", "qty"), "the rest keeps its form");
        // Moved out of a custom path, a place loses it.
        let mut l = base.clone();
        l.graft(&p("custom"), &base.subtree(&p("other")));
        assert!(!tok(&l, "custom", "qty"));
    }

    /// `_id` is a token below the top where names of 1 to 3 bytes are; a
    /// document moved from the top keeps its `_id` plain, and a document
    /// made the top brings its token.
    #[test]
    fn ids_move_with_their_documents() {
        let base = Policy::new(2, &[], "laconic");
        assert!(!tok(&base, "", "_id") && tok(&base, "x", "_id"));
        let mut l = base.clone();
        l.graft(&p("docs"), &base.subtree::<&str>(&[]));
        assert!(!tok(&l, "docs", "_id") && tok(&l, "docs.sub", "_id"));
        let mut l = base.clone();
        l.graft(&[], &base.subtree(&p("x")));
        assert!(tok(&l, "", "_id"));
        // Names of 4 bytes or more: `_id` is plain everywhere, and moves
        // change nothing.
        let long = Policy::new(4, &[], "laconic");
        let mut l = long.clone();
        l.graft(&p("docs"), &long.subtree::<&str>(&[]));
        l.graft(&[], &long.subtree(&p("x")));
        assert_eq!(l, long);
    }

    /// A subtree below a key of digits carries the rules a query reads
    /// there: those below the index it may be.
    #[test]
    fn a_subtree_below_a_key_of_digits_carries_the_rules_past_it() {
        let base = Policy::new(4, &["stats.attrs".into()], "laconic")
            .with_value_paths(&["sales.region".into()]);
        for (at, same) in [("stats.7", "stats"), ("sales.2024", "sales")] {
            assert_eq!(base.subtree(&p(at)), base.subtree(&p(same)), "{at}");
        }
        let mut l = base.clone();
        l.graft(&[], &base.subtree(&p("stats.7")));
        assert!(tok(&l, "attrs", "x") && !tok(&l, "", "x"));
        // Put at a key of digits, a subtree whose form the rules above say
        // too stays readable; where they say otherwise, it is opaque.
        let mut l = base.clone();
        l.graft(&p("stats.7"), &base.subtree(&p("stats.0")));
        assert!(l.opaque.is_empty() && tok(&l, "stats.7.attrs", "x"));
        let mut l = base.clone();
        l.graft(&p("7"), &base.subtree(&p("other")));
        l.graft(&p("2024"), &base.subtree::<&str>(&[]));
        assert_eq!(
            l.opaque_at(&p("7.stats.attrs.x")),
            Some(&p("7.stats.attrs")[..])
        );
        assert_eq!(l.opaque_at(&p("7.sales.region")), Some(&p("7.sales")[..]));
        assert_eq!(l.opaque_at(&p("7.total")), None);
        assert_eq!(l.opaque_at(&p("2024.stats.attrs.x")), None);
        let mut l = base.clone();
        l.graft(&p("7"), &Subtree::plain());
        assert_eq!(l.opaque_at(&p("7.sales.region")), Some(&p("7.sales")[..]));
        assert_eq!(l.opaque_at(&p("7.stats.attrs.x")), None, "plain: kept so");
        // Below a value path, a key of digits holds its values too.
        let mut l = base.clone();
        l.graft(&p("sales.region.7"), &Subtree::plain());
        assert_eq!(
            l.opaque_at(&p("sales.region.7")),
            Some(&p("sales.region")[..])
        );
        // `_id` kept as it is at the top holds below a key of digits there.
        let short = Policy::new(2, &[], "laconic");
        let mut l = short.clone();
        l.graft(&p("7"), &short.subtree(&p("x")));
        assert_eq!(l.opaque_at(&p("7._id")), Some(&p("7")[..]));
        let mut l = short.clone();
        l.graft(&p("7"), &short.subtree::<&str>(&[]));
        assert!(l.opaque.is_empty() && !tok(&l, "7", "_id"));
    }

    #[test]
    fn value_paths_and_plain_subtrees_move() {
        let base = Policy::new(4, &[], "laconic").with_value_paths(&["tags".into()]);
        let mut l = base.clone();
        l.graft(&p("t"), &base.subtree(&p("tags")));
        assert!(l.is_value_path(&p("t")) && l.is_value_path(&p("tags")));
        l.graft(&p("tags"), &Subtree::plain());
        assert!(!l.is_value_path(&p("tags")) && !tok(&l, "tags", "longname"));
        let mut l = base.clone();
        l.plain_key(p("count"));
        assert!(!tok(&l, "", "count") && tok(&l, "x", "count"));
        l.plain_key(p("n"));
        assert!(!l.plain_keys.contains(&p("n")), "short: plain anyway");
    }

    /// Below a custom path, only a custom subtree fits; anything else
    /// makes the place opaque, and so does a subtree of mixed forms.
    #[test]
    fn what_cannot_be_told_is_opaque() {
        let base = Policy::new(4, &["custom".into()], "laconic");
        let mut l = base.clone();
        l.graft(&p("custom.copy"), &base.subtree(&p("other")));
        assert_eq!(
            l.opaque_at(&p("custom.copy.x")),
            Some(&p("custom.copy")[..])
        );
        assert_eq!(l.opaque_at(&p("custom.copy")), None, "the place itself");
        let mut l = base.clone();
        l.graft(&p("custom.copy"), &base.subtree(&p("custom.x")));
        assert!(l.opaque.is_empty());
        let mut l = base.clone();
        l.graft(&p("m"), &Subtree::opaque());
        let mut moved = base.clone();
        moved.graft(&p("all"), &l.subtree::<&str>(&[]));
        assert!(moved.opaque_at(&p("all.m.x")).is_some(), "carried along");
        assert_ne!(l.subtree(&p("m")), l.subtree(&p("n")));
    }
}
