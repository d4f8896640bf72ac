//! The proxy's counters, rendered in the Prometheus text format.
//!
//! Everything is an atomic or a small map of atomics: recording costs no
//! lock on the data path beyond a map lookup. Clients choose command names
//! and namespaces, so no label value comes from them unchecked: commands are
//! those of the catalogue (any other is `other`), and namespaces, like
//! dictionary scopes, are capped ([`MAX_NAMESPACES`] by default) with the
//! rest folded into `other` and counted: `/metrics` stays bounded whatever
//! clients send.

use std::fmt::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use dashmap::DashMap;

use crate::error::Side;
use crate::rewrite::catalogue;
use crate::token::store::Status;

/// Latency bucket bounds, in seconds.
const BUCKETS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0,
];

/// Distinct namespaces (and dictionary scopes) given their own series
/// before the rest are folded into `other`.
pub const MAX_NAMESPACES: usize = 500;

/// The operations document bytes are counted for, in the order of
/// `Metrics::documents`' maps.
const DOCUMENT_OPS: [&str; 2] = ["write", "read"];

#[derive(Debug, Default)]
struct Histogram {
    buckets: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    /// Counts `d` in the one bucket it falls in (the rendering adds them
    /// up): one atomic add per request, not one per bucket above it.
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        if let Some(at) = BUCKETS.iter().position(|&bound| secs <= bound) {
            self.buckets[at].fetch_add(1, Relaxed);
        }
        self.count.fetch_add(1, Relaxed);
        self.sum_micros
            .fetch_add(u64::try_from(d.as_micros()).unwrap_or(u64::MAX), Relaxed);
    }
}

/// The two legs of the proxy.
#[derive(Clone, Copy, Debug)]
pub enum Leg {
    /// Between the drivers and the proxy.
    Client,
    /// Between the proxy and the upstream.
    Upstream,
}

/// Which way bytes travel on a leg.
#[derive(Clone, Copy, Debug)]
pub enum Way {
    In,
    Out,
}

/// What the memory budgets hold now, in bytes, and the cursors drivers know
/// by an id of this proxy's.
#[derive(Clone, Copy, Debug, Default)]
pub struct Held {
    /// Heavy work (`proxy.max_work_bytes`).
    pub work: usize,
    /// Messages being read from drivers (`proxy.max_read_bytes`).
    pub read: usize,
    /// Replies on their way to drivers (`proxy.max_reply_bytes`).
    pub reply: usize,
    /// Cursors known to their drivers by a proxy cursor id: served only
    /// through this process (README, "Replies keep the server's size
    /// limit").
    pub proxy_ids: usize,
}

/// What the open connections and the four memory budgets may reach: the
/// configured limits, served beside their gauges so that an alert can
/// divide one by the other (`laconic_reply_bytes /
/// laconic_reply_bytes_limit`) whatever the configuration.
#[derive(Clone, Copy, Debug, Default)]
pub struct Limits {
    /// `proxy.max_connections`.
    pub connections: usize,
    /// `proxy.max_held_bytes`.
    pub held: usize,
    /// `proxy.max_work_bytes`.
    pub work: usize,
    /// `proxy.max_read_bytes`.
    pub read: usize,
    /// `proxy.max_reply_bytes`.
    pub reply: usize,
}

impl Limits {
    pub fn of(config: &crate::config::ProxyConfig) -> Limits {
        Limits {
            connections: config.max_connections,
            held: config.max_held_bytes,
            work: config.max_work_bytes,
            read: config.max_read_bytes,
            reply: config.max_reply_bytes,
        }
    }
}

/// What came of a read sampled for shadow mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shadowed {
    /// Compared, and the same (`outcome="compared"`).
    Same = 0,
    /// Compared, and different (counted as compared too).
    Different = 1,
    /// The shadow deployment did not answer.
    Unanswered = 2,
    /// Not compared: the heavy-work budget had no room for it then.
    Skipped = 3,
}

#[derive(Debug)]
pub struct Metrics {
    /// Collection switched off (`proxy.metrics = false`): nothing is counted.
    off: bool,
    max_namespaces: usize,
    connections_open: AtomicI64,
    held_bytes: AtomicI64,
    /// Cursor batches cut at the reply limit.
    batches_cut: AtomicU64,
    connections_total: AtomicU64,
    connections_refused: AtomicU64,
    /// Requests and their latency, by command: one histogram for each
    /// entry of the catalogue, in its order, and the last for `other`.
    /// Found by index, with neither a hash nor a lock per request.
    requests: Box<[Histogram]>,
    /// [client in, client out, upstream in, upstream out]
    bytes: [AtomicU64; 4],
    /// Document bytes as the application sees them and as they are stored,
    /// by "db.collection" (writes) or "db" (reads): [logical, physical].
    documents: [DashMap<String, [AtomicU64; 2]>; 2],
    /// Series folded into `other` by the namespace cap.
    folded: AtomicU64,
    /// Error replies and closed connections, by kind and by the side
    /// they came from.
    errors: DashMap<(&'static str, Side), AtomicU64>,
    store_hits: AtomicU64,
    store_misses: AtomicU64,
    store_round_trips: AtomicU64,
    /// Sampled reads by command, by [`Shadowed`] outcome.
    shadow: DashMap<&'static str, [AtomicU64; 4]>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new(true)
    }
}

/// A command's label, by its place in the catalogue ([`catalogue::index`]):
/// the catalogue's spelling, or `other`.
fn command_label(index: Option<usize>) -> &'static str {
    index
        .and_then(|i| catalogue::CATALOGUE.get(i))
        .map_or("other", |e| e.name)
}

/// Errors that `deploy/prometheus/laconic-alerts.yaml` alerts on, served
/// at 0 from the start: a counter's series that first appears at 1 gives
/// `increase()` nothing to compare its first sample with, and the first
/// such error would go unseen.
const WATCHED: [(&str, Side); 7] = [
    ("DataCorruptionDetected", Side::Upstream),
    ("InvalidOptions", Side::Upstream),
    ("HostUnreachable", Side::Upstream),
    ("NetworkTimeout", Side::Upstream),
    ("ExceededMemoryLimit", Side::Internal),
    ("ExceededMemoryLimit", Side::Downstream),
    ("CommandNotSupported", Side::Downstream),
];

impl Metrics {
    pub fn new(enabled: bool) -> Metrics {
        Metrics::with_cap(enabled, MAX_NAMESPACES)
    }

    /// With at most `max_namespaces` namespaces given their own series.
    pub fn with_cap(enabled: bool, max_namespaces: usize) -> Metrics {
        Metrics {
            off: !enabled,
            max_namespaces,
            connections_open: AtomicI64::new(0),
            held_bytes: AtomicI64::new(0),
            batches_cut: AtomicU64::new(0),
            connections_total: AtomicU64::new(0),
            connections_refused: AtomicU64::new(0),
            requests: (0..=catalogue::CATALOGUE.len())
                .map(|_| Histogram::default())
                .collect(),
            bytes: Default::default(),
            documents: Default::default(),
            folded: AtomicU64::new(0),
            errors: if enabled {
                WATCHED.iter().map(|&e| (e, AtomicU64::new(0))).collect()
            } else {
                DashMap::new()
            },
            store_hits: AtomicU64::new(0),
            store_misses: AtomicU64::new(0),
            store_round_trips: AtomicU64::new(0),
            shadow: DashMap::new(),
        }
    }

    /// Whether anything is counted: callers skip work done only for metrics.
    pub fn enabled(&self) -> bool {
        !self.off
    }

    pub fn connection_opened(&self) {
        if !self.off {
            self.connections_open.fetch_add(1, Relaxed);
            self.connections_total.fetch_add(1, Relaxed);
        }
    }

    pub fn connection_closed(&self) {
        if !self.off {
            self.connections_open.fetch_sub(1, Relaxed);
        }
    }

    pub fn connection_refused(&self) {
        if !self.off {
            self.connections_refused.fetch_add(1, Relaxed);
        }
    }

    /// A request answered after `took`; `command`: its command's place in
    /// the catalogue ([`catalogue::index`]), `None` for one not listed.
    pub fn request(&self, command: Option<usize>, took: Duration) {
        if self.off {
            return;
        }
        let other = self.requests.len() - 1;
        self.requests[command.map_or(other, |i| i.min(other))].observe(took);
    }

    pub fn bytes(&self, leg: Leg, way: Way, n: usize) {
        if self.off {
            return;
        }
        let i = match (leg, way) {
            (Leg::Client, Way::In) => 0,
            (Leg::Client, Way::Out) => 1,
            (Leg::Upstream, Way::In) => 2,
            (Leg::Upstream, Way::Out) => 3,
        };
        self.bytes[i].fetch_add(n as u64, Relaxed);
    }

    /// Documents of `namespace` that are `logical` bytes to the application
    /// and `physical` bytes stored; `op` is "write" or "read".
    pub fn documents(&self, namespace: &str, op: &'static str, logical: usize, physical: usize) {
        if self.off {
            return;
        }
        debug_assert!(DOCUMENT_OPS.contains(&op), "{op}");
        let map = &self.documents[usize::from(op != DOCUMENT_OPS[0])];
        let add = |entry: &[AtomicU64; 2]| {
            entry[0].fetch_add(logical as u64, Relaxed);
            entry[1].fetch_add(physical as u64, Relaxed);
        };
        // Known namespaces, the common case, are counted without a new key.
        if let Some(entry) = map.get(namespace) {
            return add(&entry);
        }
        let mut key = namespace.to_owned();
        if self.documents.iter().map(DashMap::len).sum::<usize>() >= self.max_namespaces {
            self.folded.fetch_add(1, Relaxed);
            key = "other".into();
        }
        add(&map.entry(key).or_default());
    }

    /// An error reply or a closed connection: its code name, and the side
    /// it came from (a driver's connection lost mid-reply and an upstream
    /// that cannot be reached are both `HostUnreachable`).
    pub fn error(&self, kind: &'static str, side: Side) {
        if !self.off {
            self.errors
                .entry((kind, side))
                .or_default()
                .fetch_add(1, Relaxed);
        }
    }

    /// A command whose names the cache knew (`hit`) or that needed the store.
    pub fn store_lookup(&self, hit: bool) {
        if !self.off {
            let c = if hit {
                &self.store_hits
            } else {
                &self.store_misses
            };
            c.fetch_add(1, Relaxed);
        }
    }

    pub fn store_round_trips(&self, n: usize) {
        if !self.off {
            self.store_round_trips.fetch_add(n as u64, Relaxed);
        }
    }

    /// One sampled read, and what came of it.
    pub fn shadow(&self, command: &str, outcome: Shadowed) {
        if self.off {
            return;
        }
        let entry = self
            .shadow
            .entry(command_label(catalogue::index(command)))
            .or_default();
        if outcome == Shadowed::Different {
            // A difference is a comparison too.
            entry[Shadowed::Same as usize].fetch_add(1, Relaxed);
        }
        entry[outcome as usize].fetch_add(1, Relaxed);
    }

    /// Bytes of documents held back for cursors now.
    pub fn held_bytes(&self, bytes: usize) {
        self.held_bytes
            .store(i64::try_from(bytes).unwrap_or(i64::MAX), Relaxed);
    }

    /// A cursor batch was cut where it reached the reply limit, the rest
    /// to be held back.
    pub fn batch_cut(&self) {
        if !self.off {
            self.batches_cut.fetch_add(1, Relaxed);
        }
    }

    /// The Prometheus text exposition, with the dictionaries' states and
    /// what the memory budgets hold now.
    pub fn render(&self, dictionaries: &[Status], held: Held, limits: Limits) -> String {
        let mut out = String::new();
        if self.off {
            out.push_str("# metrics collection is off (proxy.metrics = false)\n");
            return out;
        }
        family(
            &mut out,
            "laconic_build_info",
            "gauge",
            "Always 1: this proxy's version, and how it was built (pgo, release or debug).",
        );
        let _ = writeln!(
            out,
            "laconic_build_info{{version=\"{}\",build=\"{}\"}} 1",
            escape(crate::VERSION),
            escape(crate::BUILD)
        );
        self.render_connections(&mut out, held, limits);
        self.render_requests(&mut out);
        self.render_bytes(&mut out);
        self.render_store(&mut out, dictionaries);
        self.render_shadow_and_errors(&mut out);
        out
    }

    fn render_connections(&self, out: &mut String, held: Held, limits: Limits) {
        for (name, kind, help, v) in [
            (
                "laconic_connections_open",
                "gauge",
                "Driver connections open now.",
                self.connections_open.load(Relaxed),
            ),
            (
                "laconic_connections_total",
                "counter",
                "Driver connections accepted.",
                self.connections_total.load(Relaxed) as i64,
            ),
            (
                "laconic_connections_refused_total",
                "counter",
                "Driver connections refused at the connection limit.",
                self.connections_refused.load(Relaxed) as i64,
            ),
            (
                "laconic_cursor_held_bytes",
                "gauge",
                "Bytes of expanded documents held back for cursors (bounded by proxy.max_held_bytes).",
                self.held_bytes.load(Relaxed),
            ),
            (
                "laconic_cursor_batches_cut_total",
                "counter",
                "Cursor batches cut where expansion made them pass the reply limit, the rest held back for the next getMore.",
                self.batches_cut.load(Relaxed) as i64,
            ),
            (
                "laconic_cursor_proxy_ids",
                "gauge",
                "Cursors their drivers know by a proxy cursor id now: their getMores are served only through this process.",
                i64::try_from(held.proxy_ids).unwrap_or(i64::MAX),
            ),
            (
                "laconic_heavy_work_bytes",
                "gauge",
                "Bytes of the heavy-work budget held now: large rewrites, decompression, shadow comparisons (bounded by proxy.max_work_bytes).",
                i64::try_from(held.work).unwrap_or(i64::MAX),
            ),
            (
                "laconic_read_bytes",
                "gauge",
                "Bytes of the budget for messages being read held now: messages over 64 KiB (bounded by proxy.max_read_bytes).",
                i64::try_from(held.read).unwrap_or(i64::MAX),
            ),
            (
                "laconic_reply_bytes",
                "gauge",
                "Bytes of the budget for replies held now: replies over 64 KiB being read, rewritten and written back (bounded by proxy.max_reply_bytes).",
                i64::try_from(held.reply).unwrap_or(i64::MAX),
            ),
        ] {
            family(out, name, kind, help);
            let _ = writeln!(out, "{name} {v}");
        }
        for (name, setting, limit) in [
            (
                "laconic_connections_limit",
                "max_connections",
                limits.connections,
            ),
            (
                "laconic_cursor_held_bytes_limit",
                "max_held_bytes",
                limits.held,
            ),
            (
                "laconic_heavy_work_bytes_limit",
                "max_work_bytes",
                limits.work,
            ),
            ("laconic_read_bytes_limit", "max_read_bytes", limits.read),
            ("laconic_reply_bytes_limit", "max_reply_bytes", limits.reply),
        ] {
            let gauge = name.trim_end_matches("_limit");
            family(
                out,
                name,
                "gauge",
                &format!("The most {gauge} may reach: proxy.{setting}."),
            );
            let _ = writeln!(out, "{name} {limit}");
        }
    }

    fn render_requests(&self, out: &mut String) {
        family(
            out,
            "laconic_request_duration_seconds",
            "histogram",
            "Requests by command: from reading the request to writing the last reply.",
        );
        // Those seen, by name.
        let mut commands: Vec<(&'static str, &Histogram)> = (self.requests.iter().enumerate())
            .filter(|(_, h)| h.count.load(Relaxed) > 0)
            .map(|(i, h)| (command_label(Some(i)), h))
            .collect();
        commands.sort_unstable_by_key(|&(c, _)| c);
        for &(c, h) in &commands {
            let mut below = 0;
            for (b, bound) in h.buckets.iter().zip(BUCKETS) {
                below += b.load(Relaxed);
                let _ = writeln!(
                    out,
                    "laconic_request_duration_seconds_bucket{{command=\"{c}\",le=\"{bound}\"}} {below}"
                );
            }
            let count = h.count.load(Relaxed);
            let sum = h.sum_micros.load(Relaxed) as f64 / 1e6;
            let _ = writeln!(
                out,
                "laconic_request_duration_seconds_bucket{{command=\"{c}\",le=\"+Inf\"}} {count}\n\
                 laconic_request_duration_seconds_sum{{command=\"{c}\"}} {sum}\n\
                 laconic_request_duration_seconds_count{{command=\"{c}\"}} {count}"
            );
        }
        family(
            out,
            "laconic_requests_total",
            "counter",
            "Requests by command.",
        );
        for (c, h) in &commands {
            let _ = writeln!(
                out,
                "laconic_requests_total{{command=\"{c}\"}} {}",
                h.count.load(Relaxed)
            );
        }
    }

    fn render_bytes(&self, out: &mut String) {
        family(
            out,
            "laconic_bytes_total",
            "counter",
            "Wire bytes by leg and direction.",
        );
        let legs = [
            ("client", "in"),
            ("client", "out"),
            ("upstream", "in"),
            ("upstream", "out"),
        ];
        for (i, (leg, way)) in legs.iter().enumerate() {
            let _ = writeln!(
                out,
                "laconic_bytes_total{{leg=\"{leg}\",direction=\"{way}\"}} {}",
                self.bytes[i].load(Relaxed)
            );
        }
        family(out, "laconic_document_bytes_total", "counter", "Document bytes as the application sees them (logical) and as stored (physical), by namespace and operation.");
        family(
            out,
            "laconic_document_bytes_saved_total",
            "counter",
            "Logical minus physical document bytes: what tokenization saves.",
        );
        let mut docs: Vec<((String, &str), u64, u64)> = DOCUMENT_OPS
            .iter()
            .zip(&self.documents)
            .flat_map(|(op, map)| {
                map.iter().map(|e| {
                    (
                        (e.key().clone(), *op),
                        e.value()[0].load(Relaxed),
                        e.value()[1].load(Relaxed),
                    )
                })
            })
            .collect();
        docs.sort();
        for ((ns, op), logical, physical) in &docs {
            let (db, coll) = ns.split_once('.').unwrap_or((ns, ""));
            let labels = format!(
                "db=\"{}\",collection=\"{}\",op=\"{op}\"",
                escape(db),
                escape(coll)
            );
            let saved = logical.saturating_sub(*physical);
            let _ = writeln!(
                out,
                "laconic_document_bytes_total{{{labels},form=\"logical\"}} {logical}\n\
                 laconic_document_bytes_total{{{labels},form=\"physical\"}} {physical}\n\
                 laconic_document_bytes_saved_total{{{labels}}} {saved}"
            );
        }
        family(
            out,
            "laconic_metrics_folded_total",
            "counter",
            "Observations counted under namespace \"other\" because the namespace cap was reached.",
        );
        let _ = writeln!(
            out,
            "laconic_metrics_folded_total {}",
            self.folded.load(Relaxed)
        );
    }

    fn render_store(&self, out: &mut String, dictionaries: &[Status]) {
        family(
            out,
            "laconic_name_store_names",
            "gauge",
            "Names this proxy holds, by dictionary (database).",
        );
        family(
            out,
            "laconic_dictionary_state",
            "gauge",
            "1 for each dictionary's state (ready, absent, or why it is refused: lost, rewound, edited, format, missing, mismatch, unknown_tokens).",
        );
        for s in dictionaries.iter().take(self.max_namespaces) {
            let scope = escape(&s.scope);
            let _ = writeln!(
                out,
                "laconic_name_store_names{{scope=\"{scope}\"}} {}\n\
                 laconic_dictionary_state{{scope=\"{scope}\",state=\"{}\"}} 1",
                s.names, s.state
            );
        }
        family(
            out,
            "laconic_dictionaries_refused",
            "gauge",
            "Dictionaries whose databases are refused now (lost, rewound, edited…).",
        );
        let refused = dictionaries.iter().filter(|s| s.error.is_some()).count();
        let _ = writeln!(out, "laconic_dictionaries_refused {refused}");
        family(
            out,
            "laconic_name_store_lookups_total",
            "counter",
            "Commands whose names the cache knew (hit) or that needed the store (miss).",
        );
        let _ = writeln!(
            out,
            "laconic_name_store_lookups_total{{result=\"hit\"}} {}\n\
             laconic_name_store_lookups_total{{result=\"miss\"}} {}",
            self.store_hits.load(Relaxed),
            self.store_misses.load(Relaxed)
        );
        family(
            out,
            "laconic_name_store_round_trips_total",
            "counter",
            "Round trips to the name store (reads and allocations).",
        );
        let _ = writeln!(
            out,
            "laconic_name_store_round_trips_total {}",
            self.store_round_trips.load(Relaxed)
        );
    }

    fn render_shadow_and_errors(&self, out: &mut String) {
        family(
            out,
            "laconic_shadow_reads_total",
            "counter",
            "Reads shadowed to the untokenized deployment, by command and outcome.",
        );
        let mut shadowed: Vec<(&str, [u64; 4])> = self
            .shadow
            .iter()
            .map(|e| (*e.key(), [0, 1, 2, 3].map(|i| e.value()[i].load(Relaxed))))
            .collect();
        shadowed.sort_unstable();
        for (c, counts) in shadowed {
            let outcomes = ["compared", "different", "unanswered", "skipped"];
            for (outcome, n) in outcomes.iter().zip(counts) {
                let _ = writeln!(
                    out,
                    "laconic_shadow_reads_total{{command=\"{c}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        family(
            out,
            "laconic_errors_total",
            "counter",
            "Error replies and closed connections, by kind (refusals are CommandNotSupported) and side (client: what a driver sent or a driver's connection lost; upstream: the deployment or the name store in it; proxy: its own limits and faults).",
        );
        let mut errors: Vec<(&str, &str, u64)> = self
            .errors
            .iter()
            .map(|e| {
                let (kind, side) = *e.key();
                (kind, side_label(side), e.value().load(Relaxed))
            })
            .collect();
        errors.sort_unstable();
        for (kind, side, n) in errors {
            let _ = writeln!(
                out,
                "laconic_errors_total{{kind=\"{kind}\",side=\"{side}\"}} {n}"
            );
        }
    }
}

/// The `side` label of an error.
fn side_label(side: Side) -> &'static str {
    match side {
        Side::Downstream => "client",
        Side::Upstream => "upstream",
        Side::Internal => "proxy",
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value as Prometheus quotes it.
fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c if c.is_control() => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(scope: &str, names: usize) -> Status {
        Status {
            scope: scope.into(),
            state: "ready",
            names,
            values: 0,
            error: None,
        }
    }

    #[test]
    fn switched_off_counts_nothing() {
        let m = Metrics::new(false);
        assert!(!m.enabled());
        m.connection_opened();
        m.request(catalogue::index("insert"), Duration::from_micros(300));
        m.bytes(Leg::Client, Way::In, 100);
        m.documents("app.users", "write", 1000, 600);
        m.error("CommandNotSupported", Side::Downstream);
        m.store_round_trips(3);
        assert!(
            m.requests.iter().all(|h| h.count.load(Relaxed) == 0)
                && m.documents.iter().all(DashMap::is_empty)
                && m.errors.is_empty()
        );
        assert_eq!(m.connections_total.load(Relaxed), 0);
        assert_eq!(m.bytes[0].load(Relaxed), 0);
        assert_eq!(
            m.render(&[status("app", 12)], Held::default(), Limits::default()),
            "# metrics collection is off (proxy.metrics = false)\n"
        );
        assert!(Metrics::new(true).enabled());
    }

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::default();
        m.connection_opened();
        m.request(catalogue::index("insert"), Duration::from_micros(300));
        m.request(catalogue::index("insert"), Duration::from_millis(20));
        m.request(catalogue::index("insert"), Duration::from_secs(7));
        m.bytes(Leg::Client, Way::In, 100);
        m.documents("app.users", "write", 1000, 600);
        m.error("CommandNotSupported", Side::Downstream);
        m.batch_cut();
        let held = Held {
            proxy_ids: 2,
            ..Held::default()
        };
        let limits = Limits {
            reply: 768,
            ..Limits::default()
        };
        let text = m.render(&[status("app", 12)], held, limits);
        let build = format!(
            "laconic_build_info{{version=\"{}\",build=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION"),
            if cfg!(debug_assertions) {
                "debug"
            } else {
                "release"
            }
        );
        assert!(
            text.lines().any(|l| l == build),
            "{build} is not in\n{text}"
        );
        for line in [
            "laconic_connections_open 1",
            "laconic_requests_total{command=\"insert\"} 3",
            // Buckets count every request at or below their bound.
            "laconic_request_duration_seconds_bucket{command=\"insert\",le=\"0.00025\"} 0",
            "laconic_request_duration_seconds_bucket{command=\"insert\",le=\"0.0005\"} 1",
            "laconic_request_duration_seconds_bucket{command=\"insert\",le=\"0.01\"} 1",
            "laconic_request_duration_seconds_bucket{command=\"insert\",le=\"0.025\"} 2",
            "laconic_request_duration_seconds_bucket{command=\"insert\",le=\"5\"} 2",
            "laconic_request_duration_seconds_bucket{command=\"insert\",le=\"+Inf\"} 3",
            "laconic_bytes_total{leg=\"client\",direction=\"in\"} 100",
            "laconic_document_bytes_saved_total{db=\"app\",collection=\"users\",op=\"write\"} 400",
            "laconic_name_store_names{scope=\"app\"} 12",
            "laconic_dictionary_state{scope=\"app\",state=\"ready\"} 1",
            "laconic_errors_total{kind=\"CommandNotSupported\",side=\"client\"} 1",
            "laconic_reply_bytes_limit 768",
            // What the alerts watch is there before it first happens.
            "laconic_errors_total{kind=\"DataCorruptionDetected\",side=\"upstream\"} 0",
            "laconic_cursor_batches_cut_total 1",
            "laconic_cursor_proxy_ids 2",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line} missing from\n{text}"
            );
        }
    }

    #[test]
    fn label_values_from_clients_stay_bounded() {
        let m = Metrics::with_cap(true, 10);
        for i in 0..20_000 {
            let forged = format!("cmd{i}\nINFO forged");
            m.request(catalogue::index(&forged), Duration::from_micros(5));
            m.documents(&format!("db{i}.c"), "write", 10, 5);
        }
        let text = m.render(&[], Held::default(), Limits::default());
        assert!(text.len() < 20_000, "{} bytes", text.len());
        assert!(text.contains("laconic_requests_total{command=\"other\"} 20000"));
        assert!(text.contains("laconic_metrics_folded_total 19990"));
        assert_eq!(escape("a\"b\n\u{1}"), "a\\\"b\\n\\u{1}");
    }
}
