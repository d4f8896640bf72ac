//! Which names are tokenized: per database, every field name at or above a
//! length threshold, and every key under the custom-attribute paths.

/// Tokenization settings for the databases they apply to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Names at least this many bytes long are tokenized (0: none by length).
    pub min_len: usize,
    /// Every key under these paths is tokenized, whatever its length.
    pub custom_paths: Vec<Vec<String>>,
    /// String values at these paths (array elements included) are tokenized.
    pub value_paths: Vec<Vec<String>>,
    /// Databases never tokenized (the system ones and the store's own).
    pub excluded_dbs: Vec<String>,
    /// Keys stored as they are whatever the rules above say, each by its
    /// full logical path: `_id` at the top where names of 1 to 3 bytes are
    /// tokenized, and, between an aggregation's stages, the names the
    /// server makes and keys moved from where they were stored so.
    pub plain_keys: Vec<Vec<String>>,
    /// Between an aggregation's stages: below these paths every key is
    /// stored as it is (the server made the document, or a `$literal` did).
    pub plain_below: Vec<Vec<String>>,
    /// Between an aggregation's stages: places holding documents of mixed
    /// stored forms, below which no name can be rewritten (see
    /// [`crate::token::layout`]).
    pub opaque: Vec<Vec<String>>,
}

impl Policy {
    pub fn new(min_len: usize, custom_paths: &[String], store_db: &str) -> Policy {
        Policy {
            min_len,
            custom_paths: custom_paths
                .iter()
                .map(|p| p.split('.').map(str::to_owned).collect())
                .collect(),
            value_paths: Vec::new(),
            excluded_dbs: ["admin", "local", "config", store_db]
                .iter()
                .map(|s| (*s).to_owned())
                .collect(),
            // `_id` at the top is left as it is; only names of 1 to 3 bytes
            // would make it a token (custom paths never hold the top).
            plain_keys: if (1..=3).contains(&min_len) {
                vec![vec!["_id".to_owned()]]
            } else {
                Vec::new()
            },
            plain_below: Vec::new(),
            opaque: Vec::new(),
        }
    }

    /// Tokenizes the string values found at `paths` too.
    pub fn with_value_paths(mut self, paths: &[String]) -> Policy {
        self.value_paths = paths
            .iter()
            .map(|p| p.split('.').map(str::to_owned).collect())
            .collect();
        self
    }

    /// Whether anything is tokenized at all.
    pub fn is_active(&self) -> bool {
        self.min_len > 0 || !self.custom_paths.is_empty() || !self.value_paths.is_empty()
    }

    /// Whether the values at the logical path `path` (array indexes left
    /// out) are tokenized.
    pub fn is_value_path<S: AsRef<str>>(&self, path: &[S]) -> bool {
        self.value_paths.iter().any(|p| is_path(p, path))
    }

    /// Whether documents of `db` are tokenized.
    pub fn applies_to(&self, db: &str) -> bool {
        self.is_active() && !self.excluded_dbs.iter().any(|d| d == db)
    }

    /// Whether `key`, found under the logical path `parent`, becomes a token.
    pub fn tokenizes(&self, parent: &[&str], key: &str) -> bool {
        self.tokenizes_key(parent, key.as_bytes())
    }

    /// [`Policy::tokenizes`] for a key given as bytes.
    #[inline]
    pub fn tokenizes_key(&self, parent: &[&str], key: &[u8]) -> bool {
        if key.is_empty() || key[0] == b'$' {
            return false;
        }
        self.tokenizes_by_rule(parent, key) && !self.kept_plain(parent, key)
    }

    /// Whether a key the rules would tokenize is kept as it is: `_id` at
    /// the top, and what a layout keeps (most policies keep nothing else).
    #[inline]
    fn kept_plain(&self, parent: &[&str], key: &[u8]) -> bool {
        (!self.plain_keys.is_empty() && self.plain_keys.iter().any(|p| is_key(p, parent, key)))
            || (!self.plain_below.is_empty() && covered_by(&self.plain_below, parent))
    }

    /// [`Policy::tokenizes_key`] by length and custom paths alone.
    ///
    /// A key of digits alone (`"2024"`, `"1"`) is never tokenized: in a
    /// path, such a part names an array index as well as a field
    /// (`revenue.2024` reads `{revenue: {"2024": …}}` and the 2025th element
    /// of an array), so paths keep it as it is, and a document must store
    /// it so too, or a query, a projection or an update by path would miss
    /// it (an update then wrote the key a second time, beside its token).
    #[inline]
    pub(super) fn tokenizes_by_rule(&self, parent: &[&str], key: &[u8]) -> bool {
        if is_index_like(key) {
            return false;
        }
        if self.min_len > 0 && key.len() >= self.min_len {
            return true;
        }
        covered_by(&self.custom_paths, parent)
    }

    /// Whether the names of `path`, read from a document at any depth (as
    /// a `$redact` expression reads them), are stored alike at every depth.
    /// Three things make a depth differ: `_id` is left as it is at the top
    /// only (names of 1 to 3 bytes are tokenized elsewhere); below a
    /// custom-attribute path, names too short for `min_len` are tokenized;
    /// and a value path holds tokens at its own depth only.
    pub fn same_at_every_depth(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('.').collect();
        let short = |p: &str| {
            !p.starts_with('$')
                && !is_index_like(p.as_bytes())
                && (self.min_len == 0 || p.len() < self.min_len)
        };
        let id = self
            .plain_keys
            .iter()
            .any(|k| k.last().is_some_and(|l| parts.contains(&l.as_str())))
            || !self.plain_below.is_empty()
            || !self.opaque.is_empty();
        let custom = !self.custom_paths.is_empty() && parts.iter().any(|p| short(p));
        let value = self
            .value_paths
            .iter()
            .any(|v| v.last().map(String::as_str) == parts.last().copied());
        !(id || custom || value)
    }
}

/// Whether a key is made of ASCII digits alone, as an array index is.
#[inline]
pub fn is_index_like(key: &[u8]) -> bool {
    key.first().is_some_and(u8::is_ascii_digit) && key.iter().all(u8::is_ascii_digit)
}

/// Whether one of `places` is `at` or holds it, read as [`holds`] reads.
pub(super) fn covered_by<A: AsRef<str>>(places: &[Vec<String>], at: &[A]) -> bool {
    places.iter().any(|p| holds(p, at))
}

/// Whether the rule `rule` (a place of a policy) is the logical path `path`
/// or holds it: part by part, or with the parts of `path` made of digits
/// alone left out.
///
/// Such a part is an array index or a key of digits, and a query cannot
/// tell which (`stats.7.attrs` reads `{stats: [..]}` and
/// `{stats: {"7": ..}}` alike), so a query's logical path leaves it out,
/// as a document's path leaves out an index. A rule of the configuration
/// has no such part (`Config::validate`): it holds below a key of digits
/// as below an index, wherever the path comes from. A place an
/// aggregation stage computed may be a key of digits itself (`{$project:
/// {"7": ..}}`): that rule holds only part by part.
#[inline]
fn holds<A: AsRef<str>, B: AsRef<str>>(rule: &[A], path: &[B]) -> bool {
    is_prefix(rule, path) || {
        let mut fields = fields_of(path);
        rule.iter().all(|r| fields.next() == Some(r.as_ref()))
    }
}

/// Whether the rule `rule` is the logical path `path`, read as [`holds`]
/// reads.
#[inline]
fn is_path<B: AsRef<str>>(rule: &[String], path: &[B]) -> bool {
    rest(rule, path).is_some_and(<[String]>::is_empty)
}

/// The parts of `path` that are not made of digits alone.
fn fields_of<B: AsRef<str>>(path: &[B]) -> impl Iterator<Item = &str> {
    path.iter()
        .map(AsRef::as_ref)
        .filter(|p| !is_index_like(p.as_bytes()))
}

/// The keys of `keys` strictly below `at`, relative to it, sorted.
pub(super) fn below<A: AsRef<str>>(keys: &[Vec<String>], at: &[A]) -> Vec<Vec<String>> {
    let mut r: Vec<Vec<String>> = keys
        .iter()
        .filter_map(|k| rest(k, at).filter(|r| !r.is_empty()))
        .map(<[String]>::to_vec)
        .collect();
    r.sort();
    r
}

/// What of the rule `rule` lies below the logical path `at`, when `at` is
/// the rule or holds it, read as [`holds`] reads (an empty rest: `at` is
/// the rule).
pub(super) fn rest<'r, A: AsRef<str>>(rule: &'r [String], at: &[A]) -> Option<&'r [String]> {
    if is_prefix(at, rule) {
        return Some(&rule[at.len()..]);
    }
    let mut n = 0;
    for f in fields_of(at) {
        if rule.get(n).map(String::as_str) != Some(f) {
            return None;
        }
        n += 1;
    }
    Some(&rule[n..])
}

/// Whether the full path `path` names the key `key` under `parent`, read
/// as [`holds`] reads.
#[inline]
fn is_key(path: &[String], parent: &[&str], key: &[u8]) -> bool {
    path.split_last()
        .is_some_and(|(k, above)| k.as_bytes() == key && is_path(above, parent))
}

/// Whether the path `prefix` starts the path `path` (or is it).
pub(super) fn is_prefix<A: AsRef<str>, B: AsRef<str>>(prefix: &[A], path: &[B]) -> bool {
    prefix.len() <= path.len()
        && prefix
            .iter()
            .zip(path)
            .all(|(a, b)| a.as_ref() == b.as_ref())
}

/// The policy of every namespace: a default, overridden per database
/// (`"app"`) and per collection (`"app.users"`), the most specific first.
/// The dictionary stays one per database whatever the collections' policies:
/// expansion reads tokens by their shape alone, so any collection can hold
/// any token of its database.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policies {
    default: Policy,
    rules: Vec<(String, Policy)>,
    /// Collections `laconic migrate` is rewriting now ("db.coll").
    pub migrating: std::sync::Arc<Migrating>,
    /// The settings recorded for collections ([`super::form`]).
    pub forms: std::sync::Arc<super::form::Forms>,
    /// Commands and aggregation stages unknown to the rewriter that the
    /// operator has declared free of field names: forwarded as they are.
    pub pass_through: Vec<String>,
    /// Databases that share one dictionary.
    pub groups: Vec<Group>,
}

/// Databases sharing one dictionary, kept in the home database: what lets
/// `$lookup`, `$unionWith`, `$out` and `$merge` across them, and field
/// stages in a cluster-wide change stream, be rewritten.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Group {
    /// The database whose `__laconic` collection holds the dictionary.
    pub home: String,
    /// The members; `*` stands for every tokenized database.
    pub databases: Vec<String>,
}

impl Group {
    fn holds(&self, db: &str) -> bool {
        self.databases.iter().any(|d| d == "*" || d == db)
    }

    /// Whether every tokenized database belongs to it.
    pub fn is_everything(&self) -> bool {
        self.databases.iter().any(|d| d == "*")
    }
}

impl Policies {
    pub fn new(default: Policy) -> Policies {
        Policies {
            default,
            rules: Vec::new(),
            pass_through: Vec::new(),
            migrating: Default::default(),
            forms: Default::default(),
            groups: Vec::new(),
        }
    }

    /// The database whose dictionary `db`'s documents use: its group's
    /// home, or itself.
    pub fn scope_of<'a>(&'a self, db: &'a str) -> &'a str {
        self.groups
            .iter()
            .find(|g| g.holds(db))
            .map_or(db, |g| g.home.as_str())
    }

    /// Whether two databases share one dictionary.
    pub fn same_dictionary(&self, a: &str, b: &str) -> bool {
        self.scope_of(a) == self.scope_of(b)
    }

    /// The group a dictionary serves, if it is shared.
    pub fn group(&self, scope: &str) -> Option<&Group> {
        self.groups.iter().find(|g| g.home == scope)
    }

    /// Whether every database and collection has the default settings (no
    /// `[[proxy.tokenize.namespaces]]` entry changes them).
    pub fn uniform(&self) -> bool {
        self.rules.iter().all(|(_, p)| *p == self.default)
    }

    /// The one dictionary every tokenized database shares, if one does.
    pub fn shared_scope(&self) -> Option<&str> {
        self.groups
            .iter()
            .find(|g| g.is_everything())
            .map(|g| g.home.as_str())
    }

    /// Adds the policy of a database (`"app"`) or collection (`"app.users"`).
    pub fn with_rule(mut self, namespace: &str, policy: Policy) -> Policies {
        self.rules.retain(|(ns, _)| ns != namespace);
        self.rules.push((namespace.to_owned(), policy));
        self
    }

    fn rule(&self, namespace: &str) -> Option<&Policy> {
        self.rules
            .iter()
            .find(|(ns, _)| ns == namespace)
            .map(|(_, p)| p)
    }

    /// The policy of the database `db`, before any collection rule.
    pub fn for_db(&self, db: &str) -> &Policy {
        self.rule(db).unwrap_or(&self.default)
    }

    /// The policy of the collection `db.coll`. A collection `laconic
    /// migrate --reverse` has written back to full names is no longer
    /// tokenized, whatever the configuration says, until it is migrated in
    /// again.
    pub fn get(&self, db: &str, coll: &str) -> &Policy {
        if self.migrating.state(db, coll) == Some(State::Reversed) {
            return &UNTOKENIZED;
        }
        self.rules
            .iter()
            .find(|(ns, _)| is_namespace(ns, db, coll))
            .map(|(_, p)| p)
            .unwrap_or_else(|| self.for_db(db))
    }

    /// The policy of a full namespace `db.coll`.
    pub fn for_namespace(&self, ns: &str) -> &Policy {
        match ns.split_once('.') {
            Some((db, coll)) => self.get(db, coll),
            None => self.for_db(ns),
        }
    }

    /// Whether anything is tokenized anywhere.
    pub fn is_active(&self) -> bool {
        self.default.is_active() || self.rules.iter().any(|(_, p)| p.is_active())
    }

    /// Whether any collection of `db` is tokenized: its dictionary is then
    /// in play for every command sent to it.
    pub fn applies_to(&self, db: &str) -> bool {
        self.for_db(db).applies_to(db)
            || self
                .rules
                .iter()
                .any(|(ns, p)| ns.split_once('.').is_some_and(|(d, _)| d == db) && p.applies_to(db))
    }

    /// How the documents of `db.coll` are stored: under this policy (with
    /// `db`'s dictionary), or, `None`, as they are.
    pub fn stored_form(&self, db: &str, coll: &str) -> Option<&Policy> {
        Some(self.get(db, coll)).filter(|p| p.applies_to(db))
    }

    /// Whether `db` is never tokenized, whatever the settings: `admin`,
    /// `local`, `config` and the name store's database.
    pub fn excluded(&self, db: &str) -> bool {
        self.default.excluded_dbs.iter().any(|d| d == db)
    }

    /// Why this proxy may not rewrite a command naming `db.coll`: the
    /// settings recorded for it are not its own ([`super::form`]).
    pub fn conflict(&self, db: &str, coll: &str) -> Option<super::form::Conflict> {
        self.forms.conflict(db, coll, || self.stored_form(db, coll))
    }

    /// Why documents of `from_db` stored as `from` says (`None`: as they
    /// are) cannot be put into `db.coll` as they are; `None` if they can,
    /// being stored there alike (the same dictionary and the same policy,
    /// or nothing tokenized on either side).
    pub fn unlike(
        &self,
        (from_db, from): (&str, Option<&Policy>),
        db: &str,
        coll: &str,
    ) -> Option<&'static str> {
        let same_dictionary = self.same_dictionary(from_db, db);
        match (from, self.stored_form(db, coll)) {
            (None, None) => None,
            (Some(a), Some(b)) if same_dictionary && a == b => None,
            _ if same_dictionary => Some("its collection's tokenize settings differ from the source's"),
            _ => Some("its database has another dictionary (databases that share one are configured in [[proxy.tokenize.dictionaries]])"),
        }
    }

    /// Whether `laconic migrate` is rewriting `db.coll` now (its documents
    /// are in both forms), and which way.
    pub fn migration(&self, db: &str, coll: &str) -> Option<Migration> {
        match self.migrating.state(db, coll)? {
            State::Migrating(way) => Some(way),
            State::Reversed => None,
        }
    }

    /// Whether any policy tokenizes values (whose dictionary regular
    /// expressions are matched against).
    pub fn has_value_paths(&self) -> bool {
        !self.default.value_paths.is_empty()
            || self.rules.iter().any(|(_, p)| !p.value_paths.is_empty())
    }
}

/// Which way `laconic migrate` rewrites a collection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Migration {
    /// Into tokens: proxies store writes tokenized.
    Forward,
    /// Back to full names (`--reverse`): proxies store writes with full names.
    Reverse,
}

/// What a collection's migration mark (`_id: "migration/<collection>"` in
/// its database's `__laconic`) says of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// A migration is running (or was stopped before its end).
    Migrating(Migration),
    /// Written back to full names by a finished `--reverse`.
    Reversed,
}

/// Whether `ns` is `db.coll`.
fn is_namespace(ns: &str, db: &str, coll: &str) -> bool {
    ns.len() == db.len() + 1 + coll.len()
        && ns.starts_with(db)
        && ns.ends_with(coll)
        && ns.as_bytes()[db.len()] == b'.'
}

static UNTOKENIZED: std::sync::LazyLock<Policy> = std::sync::LazyLock::new(Policy::default);

/// The collections migrations know of, as the store last said (a map
/// shared by every clone of the policies; it is state, not configuration,
/// so it takes no part in comparing policies).
#[derive(Debug, Default)]
pub struct Migrating {
    states: parking_lot::RwLock<std::collections::HashMap<String, State>>,
    /// Bumped whenever a state changes: a command rewritten under one
    /// generation is rewritten again if it is another when it is sent.
    generation: std::sync::atomic::AtomicU64,
}

impl Migrating {
    /// The state of `db.coll`, if a migration knows of it.
    pub fn state(&self, db: &str, coll: &str) -> Option<State> {
        let map = self.states.read();
        if map.is_empty() {
            return None;
        }
        map.get(&format!("{db}.{coll}")).copied()
    }

    /// Replaces what is known of the collections of `db` (its markers, as
    /// read with its dictionary).
    pub fn set_db(&self, db: &str, states: impl IntoIterator<Item = (String, State)>) {
        let of_db = |ns: &String| ns.split_once('.').is_some_and(|(d, _)| d == db);
        let new: std::collections::HashMap<String, State> = states
            .into_iter()
            .map(|(coll, s)| (format!("{db}.{coll}"), s))
            .collect();
        let mut map = self.states.write();
        let mut old = map.iter().filter(|(ns, _)| of_db(ns));
        if old.clone().count() == new.len() && old.all(|(ns, s)| new.get(ns) == Some(s)) {
            return;
        }
        map.retain(|ns, _| !of_db(ns));
        map.extend(new);
        self.bump();
    }

    /// Replaces everything (tests and tools).
    pub fn replace(&self, states: std::collections::HashMap<String, State>) {
        *self.states.write() = states;
        self.bump();
    }

    /// How many times a state has changed.
    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::Acquire)
    }

    fn bump(&self) {
        self.generation
            .fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl PartialEq for Migrating {
    fn eq(&self, _: &Migrating) -> bool {
        true
    }
}

impl Eq for Migrating {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_specific_rule_wins() {
        let base = Policy::new(8, &[], "laconic");
        let policies = Policies::new(base.clone())
            .with_rule("logs", Policy::new(0, &[], "laconic"))
            .with_rule("logs.events", Policy::new(4, &[], "laconic"))
            .with_rule("app.raw", Policy::new(0, &[], "laconic"));
        assert_eq!(policies.get("app", "users"), &base);
        assert!(!policies.get("app", "raw").is_active());
        assert!(!policies.get("logs", "other").is_active());
        assert_eq!(policies.get("logs", "events").min_len, 4);
        assert_eq!(policies.for_namespace("logs.events").min_len, 4);
        assert!(policies.applies_to("logs") && policies.applies_to("app"));
        assert!(!policies.applies_to("admin") && !policies.applies_to("laconic"));
        let off = Policies::new(Policy::new(0, &[], "laconic"));
        assert!(!off.is_active() && !off.applies_to("app"));
    }

    #[test]
    fn length_and_custom_paths() {
        let p = Policy::new(8, &["custom".into(), "a.b".into()], "laconic");
        assert!(p.tokenizes(&[], "first_name"));
        assert!(!p.tokenizes(&[], "fn"));
        assert!(!p.tokenizes(&[], "_id"));
        assert!(p.tokenizes(&["custom"], "x"));
        assert!(p.tokenizes(&["custom", "deep"], "y"));
        assert!(!p.tokenizes(&["customer"], "y"));
        assert!(p.tokenizes(&["a", "b"], "c"));
        assert!(!p.tokenizes(&["a"], "c"));
        assert!(!p.tokenizes(&["custom"], "$ref"));
        // Digits alone are an array index in a path: kept as they are.
        assert!(!p.tokenizes(&[], "20240101") && !p.tokenizes(&["custom"], "7"));
        assert!(p.tokenizes(&[], "2024-01-01") && p.tokenizes(&["custom"], "7a"));
        // A rule holds below a key of digits as below an index: the path a
        // query reads, which leaves such parts out.
        assert!(p.tokenizes(&["a", "7", "b"], "c") && p.tokenizes(&["a", "b", "2024"], "c"));
        assert!(p.tokenizes(&["7", "custom"], "x") && !p.tokenizes(&["a", "7"], "c"));
        assert!(!p.tokenizes(&["a", "7b", "b"], "c"));
        let v = p.clone().with_value_paths(&["sales.region".into()]);
        assert!(
            v.is_value_path(&["sales", "2024", "region"]) && v.is_value_path(&["sales", "region"])
        );
        assert!(
            !v.is_value_path(&["sales", "2024"]) && !v.is_value_path(&["sales", "x", "region"])
        );
        // `_id` at the top is kept as it is where names of 1 to 3 bytes are
        // tokenized, and so below a key of digits at the top: a query reads
        // `7._id` as the top's.
        let short = Policy::new(2, &[], "laconic");
        assert!(!short.tokenizes(&[], "_id") && short.tokenizes(&["a"], "_id"));
        assert!(!short.tokenizes(&["7"], "_id") && short.tokenizes(&["7", "a"], "_id"));
        assert!(p.applies_to("app") && !p.applies_to("admin") && !p.applies_to("laconic"));
        assert!(!Policy::new(0, &[], "laconic").applies_to("app"));
    }

    #[test]
    fn a_path_is_stored_alike_at_every_depth_unless_a_depth_treats_it_apart() {
        // Tokenized by length alone, every name is stored alike at every
        // depth, but `_id` (left as it is at the top only) under a short
        // `min_len`.
        let every = Policy::new(1, &[], "laconic");
        assert!(every.same_at_every_depth("qty") && every.same_at_every_depth("a.b"));
        assert!(!every.same_at_every_depth("_id") && !every.same_at_every_depth("a._id"));
        assert!(Policy::new(4, &[], "laconic").same_at_every_depth("_id"));
        // Below a custom-attribute path, short names are tokenized too.
        let custom = Policy::new(4, &["custom".into()], "laconic");
        assert!(custom.same_at_every_depth("quantity"));
        assert!(!custom.same_at_every_depth("qty"));
        assert!(!custom.same_at_every_depth("quantity.n"));
        assert!(custom.same_at_every_depth("$x"));
        assert!(!Policy::new(0, &["custom".into()], "laconic").same_at_every_depth("quantity"));
        // A value path holds tokens at its own depth only.
        let values = Policy::new(4, &[], "laconic").with_value_paths(&["location.city".into()]);
        assert!(
            !values.same_at_every_depth("city") && !values.same_at_every_depth("location.city")
        );
        assert!(values.same_at_every_depth("location"));
    }

    #[test]
    fn names_below_two_places_are_stored_alike_or_not() {
        let p = Policy::new(4, &["custom".into(), "meta.nested".into()], "laconic")
            .with_value_paths(&["tags".into(), "place.city".into()]);
        let same = |a: &[&str], b: &[&str]| p.subtree(a) == p.subtree(b);
        assert!(same(&["x"], &["y", "z"]));
        assert!(
            same(&["custom"], &["custom", "x"]),
            "both custom attributes"
        );
        assert!(
            !same(&["custom"], &["copy"]),
            "out of a custom-attribute path"
        );
        assert!(!same(&["x"], &["custom", "x"]), "into one");
        assert!(!same(&[], &["doc"]), "the top holds custom and meta.nested");
        assert!(!same(&["meta"], &["other"]), "meta holds nested");
        assert!(same(&["meta"], &["meta"]));
        assert!(!same(&["tags"], &["t"]), "a value path's values");
        assert!(
            !same(&["place"], &["spot"]),
            "place holds the value path city"
        );
        let short = Policy::new(2, &[], "laconic");
        assert!(
            short.subtree::<&str>(&[]) != short.subtree(&["doc"]),
            "_id at the top only"
        );
        assert!(short.subtree(&["a"]) == short.subtree(&["b", "c"]));
        let long = Policy::new(4, &[], "laconic");
        assert!(
            long.subtree::<&str>(&[]) == long.subtree(&["doc"]),
            "min_len 4 leaves _id alike"
        );
    }

    /// The generation moves when a state changes, and only then: a marker
    /// rewritten with the same state (a migration's progress) rewrites no
    /// command in flight.
    #[test]
    fn migration_states_count_their_changes() {
        let m = Migrating::default();
        let reverse = || [("events".to_owned(), State::Migrating(Migration::Reverse))];
        m.set_db("app", reverse());
        let g = m.generation();
        assert_eq!(
            m.state("app", "events"),
            Some(State::Migrating(Migration::Reverse))
        );
        m.set_db("app", reverse());
        m.set_db("other", []);
        assert_eq!(m.generation(), g, "nothing changed");
        m.set_db("other", [("events".to_owned(), State::Reversed)]);
        assert_eq!(m.generation(), g + 1);
        assert_eq!(
            m.state("app", "events"),
            Some(State::Migrating(Migration::Reverse))
        );
        m.set_db("app", [("events".to_owned(), State::Reversed)]);
        assert_eq!(m.generation(), g + 2);
        m.set_db("app", []);
        assert_eq!((m.generation(), m.state("app", "events")), (g + 3, None));
        assert_eq!(m.state("other", "events"), Some(State::Reversed));
    }
}
