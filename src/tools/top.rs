//! `laconic top`: a quick view of a running proxy, without Grafana. It
//! scrapes `/metrics` every few seconds and prints rates over the last
//! interval: requests and latency by command, bytes per leg, what
//! tokenization saves, the name store, errors.
//!
//! The parsing and the view are pure (`Scrape`, `view`); `run` only fetches.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A sample's labels, `(name, value)` in order.
type Labels = Vec<(String, String)>;

/// One scrape: every sample by metric name and its labels.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Scrape {
    samples: BTreeMap<String, Vec<(Labels, f64)>>,
}

impl Scrape {
    /// Parses the Prometheus text format (the subset Laconic writes).
    pub fn parse(text: &str) -> Scrape {
        let mut samples: BTreeMap<String, Vec<_>> = BTreeMap::new();
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, labels(rest.trim_end_matches('}'))),
                None => (series, Vec::new()),
            };
            samples
                .entry(name.to_owned())
                .or_default()
                .push((labels, value));
        }
        Scrape { samples }
    }

    /// Every sample: its metric's name, its labels and its value.
    pub fn samples(&self) -> impl Iterator<Item = (&str, &[(String, String)], f64)> {
        self.samples
            .iter()
            .flat_map(|(name, s)| s.iter().map(move |(l, v)| (name.as_str(), &l[..], *v)))
    }

    /// The sum of `name`'s samples whose labels include all of `with`.
    pub fn sum(&self, name: &str, with: &[(&str, &str)]) -> f64 {
        self.samples
            .get(name)
            .into_iter()
            .flatten()
            .filter(|(labels, _)| {
                with.iter()
                    .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .map(|(_, v)| v)
            .sum()
    }

    /// The distinct values of `label` among `name`'s samples.
    fn label_values(&self, name: &str, label: &str) -> Vec<String> {
        let mut out: Vec<String> = self
            .samples
            .get(name)
            .into_iter()
            .flatten()
            .filter_map(|(labels, _)| labels.iter().find(|(k, _)| k == label))
            .map(|(_, v)| v.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// `(upper bound, cumulative count)` of a command's latency histogram.
    fn buckets(&self, command: &str) -> Vec<(f64, f64)> {
        let mut out: Vec<(f64, f64)> = self
            .samples
            .get("laconic_request_duration_seconds_bucket")
            .into_iter()
            .flatten()
            .filter(|(labels, _)| labels.iter().any(|(k, v)| k == "command" && v == command))
            .filter_map(|(labels, v)| {
                let le = labels.iter().find(|(k, _)| k == "le")?.1.as_str();
                let bound = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((bound, *v))
            })
            .collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

/// `a="x",b="y"` (values may hold escaped quotes).
fn labels(text: &str) -> Labels {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some((key, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, n)) = chars.next() {
                        value.push(if n == 'n' { '\n' } else { n });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        out.push((key.trim_start_matches(',').trim().to_owned(), value));
        rest = &after[end..];
    }
    out
}

/// The quantile `q` of the requests counted between two scrapes, from the
/// histograms' bucket bounds (the bound of the bucket it falls in).
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> Option<f64> {
    let delta: Vec<(f64, f64)> = after
        .iter()
        .map(|(bound, n)| {
            let was = before
                .iter()
                .find(|(b, _)| b == bound)
                .map_or(0.0, |(_, n)| *n);
            (*bound, n - was)
        })
        .collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    delta
        .iter()
        .find(|(_, n)| *n >= total * q)
        .map(|(bound, _)| *bound)
}

fn bytes(n: f64) -> String {
    match n {
        n if n >= 1e9 => format!("{:.1} GB", n / 1e9),
        n if n >= 1e6 => format!("{:.1} MB", n / 1e6),
        n if n >= 1e3 => format!("{:.1} kB", n / 1e3),
        n => format!("{n:.0} B"),
    }
}

fn latency(bound: Option<f64>) -> String {
    match bound {
        None => "-".into(),
        Some(b) if b.is_infinite() => "> 5 s".into(),
        Some(b) => format!("≤ {:.2} ms", b * 1e3),
    }
}

/// The view of a proxy between two scrapes `secs` apart (rates), or of
/// one scrape alone (`before` empty: totals since start).
pub fn view(before: &Scrape, after: &Scrape, secs: f64) -> String {
    let rate = |name: &str, with: &[(&str, &str)]| {
        let d = after.sum(name, with) - before.sum(name, with);
        if secs > 0.0 {
            d / secs
        } else {
            d
        }
    };
    let per = if secs > 0.0 { "/s" } else { "" };
    let mut out = String::new();
    if after
        .samples
        .keys()
        .all(|k| !k.starts_with("laconic_requests"))
    {
        out.push_str("(no request metrics: is metrics collection off?)\n");
    }
    let _ = writeln!(
        out,
        "connections  {} open, {:.1}{per} new, {:.1}{per} refused",
        after.sum("laconic_connections_open", &[]),
        rate("laconic_connections_total", &[]),
        rate("laconic_connections_refused_total", &[]),
    );
    let _ = writeln!(
        out,
        "requests     {:.1}{per}, errors {:.1}{per}",
        rate("laconic_requests_total", &[]),
        rate("laconic_errors_total", &[]),
    );
    let leg = |leg: &str, dir: &str| {
        bytes(rate(
            "laconic_bytes_total",
            &[("leg", leg), ("direction", dir)],
        ))
    };
    let _ = writeln!(
        out,
        "bytes{per:<8}client in {} out {}, upstream in {} out {}",
        leg("client", "in"),
        leg("client", "out"),
        leg("upstream", "in"),
        leg("upstream", "out"),
    );
    let _ = writeln!(
        out,
        "held         cursors {}, heavy work {}, reading {}, replies {}",
        bytes(after.sum("laconic_cursor_held_bytes", &[])),
        bytes(after.sum("laconic_heavy_work_bytes", &[])),
        bytes(after.sum("laconic_read_bytes", &[])),
        bytes(after.sum("laconic_reply_bytes", &[])),
    );
    let _ = writeln!(
        out,
        "cursors      {} known by a proxy id, batches cut {:.1}/s",
        after.sum("laconic_cursor_proxy_ids", &[]),
        rate("laconic_cursor_batches_cut_total", &[]),
    );
    let logical = rate("laconic_document_bytes_total", &[("form", "logical")]);
    let physical = rate("laconic_document_bytes_total", &[("form", "physical")]);
    if logical > 0.0 {
        let _ = writeln!(
            out,
            "documents    {} logical, {} stored: {:.1}% saved",
            bytes(logical),
            bytes(physical),
            100.0 * (logical - physical) / logical
        );
    }
    let names = after.sum("laconic_name_store_names", &[]);
    if names > 0.0
        || after
            .samples
            .contains_key("laconic_name_store_round_trips_total")
    {
        let _ = writeln!(
            out,
            "name store   {names} names, {:.1}{per} hits, {:.1}{per} misses, {:.1}{per} round trips",
            rate("laconic_name_store_lookups_total", &[("result", "hit")]),
            rate("laconic_name_store_lookups_total", &[("result", "miss")]),
            rate("laconic_name_store_round_trips_total", &[]),
        );
    }
    let refused = after.sum("laconic_dictionaries_refused", &[]);
    if refused > 0.0 {
        let _ = writeln!(out, "dictionaries {refused} refused (see /readyz)");
    }
    for kind in after.label_values("laconic_errors_total", "kind") {
        let r = rate("laconic_errors_total", &[("kind", &kind)]);
        if r > 0.0 {
            let _ = writeln!(out, "  errors      {kind}: {r:.1}{per}");
        }
    }
    out.push_str(&commands(before, after, secs));
    out
}

/// The table of commands by rate, with their latencies.
fn commands(before: &Scrape, after: &Scrape, secs: f64) -> String {
    let per = if secs > 0.0 { "/s" } else { "" };
    let rate = |name: &str, with: &[(&str, &str)]| {
        let d = after.sum(name, with) - before.sum(name, with);
        if secs > 0.0 {
            d / secs
        } else {
            d
        }
    };
    let mut out = String::new();
    let mut rows: Vec<(String, f64)> = after
        .label_values("laconic_requests_total", "command")
        .into_iter()
        .map(|c| {
            let r = rate("laconic_requests_total", &[("command", &c)]);
            (c, r)
        })
        .filter(|(_, r)| *r > 0.0)
        .collect();
    rows.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if !rows.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<24} {:>10} {:>12} {:>12}",
            "command",
            format!("req{per}"),
            "p50",
            "p99"
        );
        for (command, r) in rows {
            let (b, a) = (before.buckets(&command), after.buckets(&command));
            let _ = writeln!(
                out,
                "{command:<24} {r:>10.1} {:>12} {:>12}",
                latency(quantile(&b, &a, 0.5)),
                latency(quantile(&b, &a, 0.99)),
            );
        }
    }
    out
}

/// Fetches `http://host:port/metrics` (plain HTTP/1.0, the proxy's own port).
async fn fetch(addr: &str) -> crate::tools::Result<String> {
    let mut conn =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await??;
    conn.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    tokio::time::timeout(Duration::from_secs(5), conn.read_to_string(&mut text)).await??;
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| crate::tools::fail!("{addr}: not an HTTP reply"))?;
    crate::tools::ensure!(
        head.starts_with("HTTP/1.") && head.split_whitespace().nth(1) == Some("200"),
        "{addr}: {}",
        head.lines().next().unwrap_or_default()
    );
    Ok(body.to_owned())
}

/// Prints the view every `interval`, or once (totals since start).
pub async fn run(addr: &str, interval: Duration, once: bool) -> crate::tools::Result<()> {
    let addr = addr
        .trim_start_matches("http://")
        .trim_end_matches("/metrics")
        .trim_end_matches('/');
    let mut before = Scrape::parse(&fetch(addr).await?);
    if once {
        print!("{}", view(&Scrape::default(), &before, 0.0));
        return Ok(());
    }
    let mut at = Instant::now();
    loop {
        tokio::time::sleep(interval).await;
        let after = Scrape::parse(&fetch(addr).await?);
        let now = Instant::now();
        // Clear the screen, then the view.
        print!(
            "\x1b[2J\x1b[Hlaconic top  {addr}  every {:.1} s\n\n{}",
            interval.as_secs_f64(),
            view(&before, &after, (now - at).as_secs_f64())
        );
        (before, at) = (after, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::{Leg, Metrics, Way};
    use crate::rewrite::catalogue::index;

    #[test]
    fn reads_what_the_proxy_writes() {
        let m = Metrics::default();
        m.connection_opened();
        let before = Scrape::parse(&m.render(&[], Default::default(), Default::default()));
        for _ in 0..98 {
            m.request(index("find"), Duration::from_micros(400));
        }
        for _ in 0..2 {
            m.request(index("find"), Duration::from_millis(30));
        }
        m.request(index("insert"), Duration::from_millis(2));
        m.bytes(Leg::Client, Way::In, 4000);
        m.documents("app.users", "write", 1000, 600);
        m.error("CommandNotSupported", crate::error::Side::Downstream);
        m.store_lookup(true);
        m.batch_cut();
        let after = Scrape::parse(&m.render(
            &[crate::token::store::Status {
                scope: "app".into(),
                state: "ready",
                names: 12,
                values: 0,
                error: None,
            }],
            crate::observe::Held {
                work: 2_000_000,
                read: 70_000,
                reply: 5_000_000,
                proxy_ids: 3,
            },
            crate::observe::Limits::default(),
        ));
        assert_eq!(after.sum("laconic_requests_total", &[]), 101.0);
        assert_eq!(
            after.sum("laconic_requests_total", &[("command", "find")]),
            100.0
        );
        let v = view(&before, &after, 2.0);
        for line in [
            "connections  1 open, 0.0/s new, 0.0/s refused",
            "requests     50.5/s, errors 0.5/s",
            "held         cursors 0 B, heavy work 2.0 MB, reading 70.0 kB, replies 5.0 MB",
            "cursors      3 known by a proxy id, batches cut 0.5/s",
            "documents    500 B logical, 300 B stored: 40.0% saved",
            "name store   12 names, 0.5/s hits, 0.0/s misses, 0.0/s round trips",
            "  errors      CommandNotSupported: 0.5/s",
        ] {
            assert!(v.lines().any(|l| l == line), "{line:?} missing from\n{v}");
        }
        let find = v.lines().find(|l| l.starts_with("find ")).unwrap();
        assert!(
            find.contains("50.0") && find.contains("≤ 0.50 ms") && find.contains("≤ 50.00 ms"),
            "{find}"
        );
        // find comes first: the busiest command.
        assert!(v.find("find ").unwrap() < v.find("insert ").unwrap());
    }

    #[test]
    fn labels_with_escapes() {
        assert_eq!(
            labels(r#"db="a\"b",collection="c""#),
            vec![
                ("db".to_owned(), "a\"b".to_owned()),
                ("collection".to_owned(), "c".to_owned())
            ]
        );
    }

    #[test]
    fn metrics_switched_off() {
        let v = view(
            &Scrape::default(),
            &Scrape::parse(&Metrics::new(false).render(
                &[],
                Default::default(),
                Default::default(),
            )),
            0.0,
        );
        assert!(v.starts_with("(no request metrics"), "{v}");
    }
}
