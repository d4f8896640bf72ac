//! The Prometheus alerting rules in `deploy/prometheus/laconic-alerts.yaml`,
//! checked since no Prometheus runs here: every expression is parsed as
//! Prometheus parses it, every series and label it reads is one a proxy
//! serves, and real proxies are driven into the failures the alerts name.
//! Each expression is evaluated over two scrapes of the proxy, taken before
//! and after a step, as Prometheus would evaluate it over that window
//! (`for:` durations aside): under healthy traffic no alert fires, and each
//! failure fires its own alerts and no other.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use bson::{doc, Document};
use futures::TryStreamExt;
use promql_parser::label::{MatchOp, Matcher};
use promql_parser::parser::{self, Expr};
use serde_yaml::Value;

use crate::common::{self, db_name};

type Labels = BTreeMap<String, String>;

/// One scrape (as `laconic top` reads it): every sample, its metric's
/// name under `__name__`.
struct Scrape(Vec<(Labels, f64)>);

impl Scrape {
    fn parse(text: &str) -> Scrape {
        let scrape = laconic::tools::top::Scrape::parse(text);
        let samples = scrape
            .samples()
            .map(|(name, labels, value)| {
                let mut labels: Labels = labels.iter().cloned().collect();
                labels.insert("__name__".into(), name.into());
                (labels, value)
            })
            .collect();
        Scrape(samples)
    }

    fn families(&self) -> BTreeSet<&str> {
        self.0.iter().map(|(l, _)| l["__name__"].as_str()).collect()
    }
}

/// What an expression evaluates to.
enum Evaluated {
    Scalar(f64),
    Vector(Vec<(Labels, f64)>),
}

/// The series of `after` that a selector picks.
fn select(name: &Option<String>, matchers: &[Matcher], after: &Scrape) -> Vec<(Labels, f64)> {
    after
        .0
        .iter()
        .filter(|(l, _)| name.as_deref().is_none_or(|n| l["__name__"] == n))
        .filter(|(l, _)| {
            matchers
                .iter()
                .all(|m| m.is_match(l.get(&m.name).map_or("", String::as_str)))
        })
        .cloned()
        .collect()
}

/// Evaluates `expr` at the time of `after`, with `before` as the sample a
/// range reaches back to. Knows what the rules use; anything else fails the
/// test by name, so that a new rule is evaluated or the evaluator grows.
fn eval(expr: &Expr, before: &Scrape, after: &Scrape) -> Evaluated {
    match expr {
        Expr::NumberLiteral(n) => Evaluated::Scalar(n.val),
        Expr::Paren(p) => eval(&p.expr, before, after),
        Expr::VectorSelector(v) => Evaluated::Vector(select(&v.name, &v.matchers.matchers, after)),
        Expr::Call(c) if c.func.name == "increase" => {
            let Expr::MatrixSelector(m) = &*c.args.args[0] else {
                panic!("increase of {expr}")
            };
            let (name, matchers) = (&m.vs.name, &m.vs.matchers.matchers);
            let earlier = select(name, matchers, before);
            // As in Prometheus: a series needs a sample at both ends of
            // the range; one that first appears within it gives nothing.
            let grown = select(name, matchers, after)
                .into_iter()
                .filter_map(|(mut l, v)| {
                    let (_, was) = earlier.iter().find(|(e, _)| *e == l)?;
                    l.remove("__name__");
                    Some((l, v - was))
                })
                .collect();
            Evaluated::Vector(grown)
        }
        Expr::Aggregate(a) => {
            let Evaluated::Vector(v) = eval(&a.expr, before, after) else {
                panic!("{expr} over a scalar")
            };
            let by: Vec<String> = match &a.modifier {
                Some(parser::LabelModifier::Include(l)) => l.labels.clone(),
                None => Vec::new(),
                Some(other) => panic!("{other:?} in {expr}"),
            };
            let mut groups: BTreeMap<Labels, Vec<f64>> = BTreeMap::new();
            for (l, x) in v {
                let key = l.into_iter().filter(|(k, _)| by.contains(k)).collect();
                groups.entry(key).or_default().push(x);
            }
            let op = a.op.to_string();
            Evaluated::Vector(
                groups
                    .into_iter()
                    .map(|(l, xs)| {
                        let x = match op.as_str() {
                            "sum" => xs.iter().sum(),
                            "max" => xs.iter().copied().fold(f64::MIN, f64::max),
                            other => panic!("{other} in {expr}"),
                        };
                        (l, x)
                    })
                    .collect(),
            )
        }
        Expr::Binary(b) if b.modifier.is_none() => {
            let (lhs, rhs) = (eval(&b.lhs, before, after), eval(&b.rhs, before, after));
            let op = b.op.to_string();
            match (lhs, rhs) {
                (Evaluated::Vector(v), Evaluated::Scalar(s)) if b.op.is_comparison_operator() => {
                    Evaluated::Vector(v.into_iter().filter(|(_, x)| compare(&op, *x, s)).collect())
                }
                (Evaluated::Vector(l), Evaluated::Vector(r)) if op == "/" => {
                    let unnamed = |mut l: Labels| {
                        l.remove("__name__");
                        l
                    };
                    let r: Vec<(Labels, f64)> =
                        r.into_iter().map(|(l, x)| (unnamed(l), x)).collect();
                    Evaluated::Vector(
                        l.into_iter()
                            .filter_map(|(l, x)| {
                                let l = unnamed(l);
                                let (_, y) = r.iter().find(|(k, _)| *k == l)?;
                                Some((l, x / y))
                            })
                            .collect(),
                    )
                }
                _ => panic!("the test does not evaluate {expr}"),
            }
        }
        other => panic!("the test does not evaluate {other}"),
    }
}

fn compare(op: &str, x: f64, s: f64) -> bool {
    match op {
        ">" => x > s,
        ">=" => x >= s,
        "<" => x < s,
        "<=" => x <= s,
        "==" => x == s,
        "!=" => x != s,
        other => panic!("comparison {other}"),
    }
}

/// The rules: each alert's name and parsed expression, after checking
/// what every rule must carry.
fn rules() -> Vec<(String, Expr)> {
    let text =
        std::fs::read_to_string(common::root().join("deploy/prometheus/laconic-alerts.yaml"))
            .unwrap();
    let yaml: Value = serde_yaml::from_str(&text).unwrap();
    let readme = std::fs::read_to_string(common::root().join("README.md")).unwrap();
    // GitHub's anchors for the README's headings.
    let anchors: BTreeSet<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
        .map(|h| {
            h.to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect();
    let mut out = Vec::new();
    for group in yaml["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            let name = rule["alert"].as_str().expect("every rule is an alert");
            let expr = rule["expr"].as_str().unwrap();
            let parsed = parser::parse(expr).unwrap_or_else(|e| panic!("{name}: {e}"));
            let severity = rule["labels"]["severity"].as_str().unwrap();
            assert!(
                ["critical", "warning", "info"].contains(&severity),
                "{name}: {severity}"
            );
            let r#for = rule["for"].as_str().unwrap();
            assert!(
                r#for.ends_with('m') && r#for[..r#for.len() - 1].parse::<u32>().is_ok(),
                "{name}: for {for}"
            );
            for field in ["summary", "description"] {
                assert!(
                    rule["annotations"][field]
                        .as_str()
                        .is_some_and(|s| s.len() > 20),
                    "{name} has no {field}"
                );
            }
            let runbook = rule["annotations"]["runbook"].as_str().unwrap();
            let anchor = runbook.strip_prefix("README.md#").unwrap();
            assert!(anchors.contains(anchor), "{name}: no heading for {runbook}");
            out.push((name.to_owned(), parsed));
        }
    }
    out
}

/// Every selector in `expr`: its metric and the labels it matches on.
fn selectors(expr: &Expr, out: &mut Vec<(String, Vec<Matcher>)>) {
    match expr {
        Expr::VectorSelector(v) => out.push((v.name.clone().unwrap(), v.matchers.matchers.clone())),
        Expr::MatrixSelector(m) => selectors(&Expr::VectorSelector(m.vs.clone()), out),
        Expr::Call(c) => c.args.args.iter().for_each(|a| selectors(a, out)),
        Expr::Aggregate(a) => selectors(&a.expr, out),
        Expr::Binary(b) => {
            selectors(&b.lhs, out);
            selectors(&b.rhs, out);
        }
        Expr::Paren(p) => selectors(&p.expr, out),
        _ => {}
    }
}

async fn scrape(addr: SocketAddr) -> Scrape {
    let (status, text) = common::get(addr, "/metrics").await;
    assert_eq!(status, 200);
    Scrape::parse(&text)
}

/// The alerts whose expressions hold over the window from `before` to
/// `after`.
fn firing(rules: &[(String, Expr)], before: &Scrape, after: &Scrape) -> BTreeSet<String> {
    rules
        .iter()
        .filter(|(_, e)| match eval(e, before, after) {
            Evaluated::Vector(v) => !v.is_empty(),
            Evaluated::Scalar(_) => panic!("an alert's expression must be a vector"),
        })
        .map(|(n, _)| n.clone())
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

fn with_metrics(upstream: &str) -> laconic::config::ProxyConfig {
    let mut config = common::proxy_config(upstream);
    config.metrics_listen = Some("127.0.0.1:0".into());
    config
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_alerts_fire_on_the_failures_they_name_and_only_there() {
    let rules = rules();
    assert!(rules.len() >= 10);

    // A tokenizing proxy: healthy traffic fires nothing.
    let mut config = with_metrics(&common::upstream().uri);
    config.tokenize.min_len = 4;
    let proxy = common::start(config).await;
    let metrics = proxy.metrics_addr.unwrap();
    let db = db_name("alerts", "app");
    let direct = common::direct().await;
    direct.database(&db).drop().await.unwrap();
    let c = common::via_proxy(&proxy)
        .await
        .database(&db)
        .collection::<Document>("c");
    let before = scrape(metrics).await;
    c.insert_many((0..20).map(|i| doc! {"_id": i, "first_name": "Ada", "score_value": i}))
        .await
        .unwrap();
    let read: Vec<Document> = c
        .find(doc! {"score_value": {"$gte": 10}})
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(read.len(), 10);
    let after = scrape(metrics).await;
    assert_eq!(firing(&rules, &before, &after), names(&[]));

    // A construct the proxy cannot rewrite.
    let before = after;
    assert!(c.find_one(doc! {"$where": "true"}).await.is_err());
    let after = scrape(metrics).await;
    assert_eq!(
        firing(&rules, &before, &after),
        names(&["LaconicRefusedCommands"])
    );

    // A proxy given other settings than those the collection is stored
    // with (recorded by the first proxy's insert above).
    let mut config = with_metrics(&common::upstream().uri);
    config.tokenize.min_len = 6;
    let other = common::start(config).await;
    let other_metrics = other.metrics_addr.unwrap();
    let before = scrape(other_metrics).await;
    let err = common::via_proxy(&other)
        .await
        .database(&db)
        .collection::<Document>("c")
        .find_one(doc! {"score_value": 1})
        .await
        .unwrap_err();
    assert_eq!(common::command_error(err).code, 72);
    let after = scrape(other_metrics).await;
    assert_eq!(
        firing(&rules, &before, &after),
        names(&["LaconicSettingsDiffer"])
    );

    // A dictionary edited by hand: the database is refused, and reads fail
    // closed.
    let before = scrape(metrics).await;
    direct
        .database(&db)
        .collection::<Document>("__laconic")
        .update_one(
            doc! {"chain": "names"},
            doc! {"$set": {"names.0": "hijacked"}},
        )
        .await
        .unwrap();
    let mut refused = false;
    for _ in 0..100 {
        if common::metric(metrics, "laconic_dictionaries_refused").await > 0 {
            refused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(refused, "the edit was not seen in 10 s");
    let err = c.find_one(doc! {}).await.unwrap_err();
    assert_eq!(common::command_error(err).code, 301);
    let after = scrape(metrics).await;
    assert_eq!(
        firing(&rules, &before, &after),
        names(&["LaconicDictionaryRefused", "LaconicReadsFailClosed"])
    );
    direct.database(&db).drop().await.unwrap();

    // Connections past the limit.
    let mut config = with_metrics(&common::upstream().uri);
    config.max_connections = 1;
    let limited = common::start(config).await;
    let metrics = limited.metrics_addr.unwrap();
    let before = scrape(metrics).await;
    let _held = common::raw_session(&limited).await;
    let mut over = tokio::net::TcpStream::connect(limited.addr).await.unwrap();
    let closed = tokio::time::timeout(Duration::from_secs(5), common::read_frame(&mut over)).await;
    assert!(matches!(closed, Ok(None)));
    let after = scrape(metrics).await;
    assert_eq!(
        firing(&rules, &before, &after),
        names(&["LaconicConnectionsRefused"])
    );

    // An upstream that does not answer: a port nothing listens on.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let unreachable = common::start(with_metrics(&format!("mongodb://127.0.0.1:{dead}/"))).await;
    let metrics = unreachable.metrics_addr.unwrap();
    let before = scrape(metrics).await;
    let mut s = tokio::net::TcpStream::connect(unreachable.addr)
        .await
        .unwrap();
    common::write_frame(
        &mut s,
        &common::op_msg(1, 0, doc! {"ping": 1, "$db": "admin"}),
    )
    .await;
    let _ = tokio::time::timeout(Duration::from_secs(30), common::read_frame(&mut s)).await;
    let after = scrape(metrics).await;
    assert_eq!(
        firing(&rules, &before, &after),
        names(&["LaconicUpstreamUnreachable"])
    );

    // Shadow mode, against a deployment whose copy lacks a document.
    let shadow = common::second_upstream();
    let mut config = with_metrics(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.shadow = Some(laconic::config::ShadowConfig {
        uri: format!("{}?directConnection=true", shadow.uri),
        sample: 1.0,
    });
    let shadowed = common::start(config).await;
    let metrics = shadowed.metrics_addr.unwrap();
    let db = db_name("alerts", "shadowed");
    direct.database(&db).drop().await.unwrap();
    let copy = mongodb::Client::with_uri_str(format!("{}?directConnection=true", shadow.uri))
        .await
        .unwrap();
    copy.database(&db).drop().await.unwrap();
    let c = common::via_proxy(&shadowed)
        .await
        .database(&db)
        .collection::<Document>("c");
    c.insert_one(doc! {"_id": 1, "first_name": "Ada"})
        .await
        .unwrap();
    let before = scrape(metrics).await;
    c.find_one(doc! {"_id": 1}).await.unwrap().unwrap();
    let mut after = scrape(metrics).await;
    for _ in 0..50 {
        if !firing(&rules, &before, &after).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = scrape(metrics).await;
    }
    assert_eq!(
        firing(&rules, &before, &after),
        names(&["LaconicShadowDifferences"])
    );
    direct.database(&db).drop().await.unwrap();

    // Every series, label and label value the rules read is served
    // (Prometheus's own `up` aside): the limits beside the gauges they
    // bound, and, on a proxy that has had no error, the errors the rules
    // watch, so that `increase()` sees the first one.
    let served = after.families();
    for (alert, expr) in &rules {
        let mut used = Vec::new();
        selectors(expr, &mut used);
        for (metric, matchers) in used {
            if metric == "up" {
                continue;
            }
            assert!(
                served.contains(metric.as_str()),
                "{alert}: {metric} is not served"
            );
            for m in matchers {
                let values: Vec<&str> = match &m.op {
                    MatchOp::Equal => vec![&m.value],
                    MatchOp::Re(_) => m.value.split('|').collect(),
                    _ => Vec::new(),
                };
                let has = |value: Option<&str>| {
                    after.0.iter().any(|(l, _)| {
                        l["__name__"] == metric
                            && l.get(&m.name)
                                .is_some_and(|v| value.is_none_or(|value| v == value))
                    })
                };
                assert!(has(None), "{alert}: {metric} has no label {}", m.name);
                for value in values {
                    assert!(
                        has(Some(value)),
                        "{alert}: {metric} has no series with {}=\"{value}\"",
                        m.name
                    );
                }
            }
        }
    }
}
