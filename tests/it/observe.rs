//! The sidecar's HTTP port: counters after a workload, and readiness that
//! follows the upstream down and back up.

use std::time::Duration;

use bson::{doc, Document};
use futures::TryStreamExt;
use tokio::net::{TcpListener, TcpStream};

use crate::common::{self, db_name};

use common::get;

fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{series} not in\n{metrics}"))
}

/// How the binary under test was built: by the same cargo profile as the
/// tests (`scripts/build-pgo.sh` builds no test).
fn this_build() -> &'static str {
    if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    }
}

#[test]
fn the_version_names_how_the_binary_was_built() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_laconic"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("laconic {} ({})\n", env!("CARGO_PKG_VERSION"), this_build())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_the_workload_and_the_bytes_saved() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 6;
    config.tokenize.store_db = db_name("obs", "store");
    // A value path no document has: its dictionary stays empty, and must
    // not be read again for every command.
    config.tokenize.value_paths = vec!["never_present".into()];
    config.metrics_listen = Some("127.0.0.1:0".into());
    let proxy = common::start(config).await;
    let addr = proxy.metrics_addr.expect("a metrics address");
    let c = common::via_proxy(&proxy)
        .await
        .database(&db_name("obs", "proxy"))
        .collection::<Document>("profiles");
    c.drop().await.unwrap();
    let docs: Vec<Document> = (0..20)
        .map(|i| doc! {"_id": i, "first_name": "Ada", "email_address": "ada@example.com", "favourite_colour": "green"})
        .collect();
    c.insert_many(docs).await.unwrap();
    for i in 0..5 {
        c.find_one(doc! {"_id": i}).await.unwrap().unwrap();
    }
    let refused = c.find_one(doc! {"$where": "true"}).await;
    assert!(refused.is_err());

    assert_eq!(get(addr, "/healthz").await, (200, "ok\n".into()));
    assert_eq!(get(addr, "/readyz").await.0, 200);
    let (status, m) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    let build = format!(
        "laconic_build_info{{version=\"{}\",build=\"{}\"}}",
        env!("CARGO_PKG_VERSION"),
        this_build()
    );
    assert_eq!(value(&m, &build), 1.0);
    assert!(value(&m, "laconic_requests_total{command=\"insert\"}") >= 1.0);
    // Five find_one plus the refused one.
    assert!(value(&m, "laconic_requests_total{command=\"find\"}") >= 6.0);
    let db = db_name("obs", "proxy");
    let saved = value(&m, &format!("laconic_document_bytes_saved_total{{db=\"{db}\",collection=\"profiles\",op=\"write\"}}"));
    assert!(saved > 20.0 * 30.0, "{saved}");
    assert!(
        value(
            &m,
            &format!(
                "laconic_document_bytes_saved_total{{db=\"{db}\",collection=\"\",op=\"read\"}}"
            )
        ) > 0.0
    );
    assert!(
        value(
            &m,
            "laconic_errors_total{kind=\"CommandNotSupported\",side=\"client\"}"
        ) >= 1.0
    );
    assert_eq!(value(&m, "laconic_reply_bytes_limit"), 768_000_000.0);
    assert!(value(&m, "laconic_connections_total") >= 1.0);
    assert!(value(&m, "laconic_bytes_total{leg=\"client\",direction=\"in\"}") > 0.0);
    assert!(value(&m, "laconic_name_store_round_trips_total") >= 1.0);
    assert!(value(&m, "laconic_name_store_lookups_total{result=\"hit\"}") >= 1.0);
    assert!(value(&m, &format!("laconic_name_store_names{{scope=\"{db}\"}}")) >= 3.0);
    assert!(m.contains("laconic_request_duration_seconds_bucket{command=\"find\",le=\"+Inf\"}"));
    assert_eq!(get(addr, "/nope").await.0, 404);

    // Known names cost no round trip to the name store.
    let trips = value(&m, "laconic_name_store_round_trips_total");
    for i in 0..5 {
        c.find_one(doc! {"_id": i, "first_name": "Ada"})
            .await
            .unwrap()
            .unwrap();
    }
    let m = get(addr, "/metrics").await.1;
    assert_eq!(value(&m, "laconic_name_store_round_trips_total"), trips);

    // `laconic top --once` reads the same counters.
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_laconic"));
    command.args(["top", "--once", "--metrics", &addr.to_string()]);
    let top = common::run_ok(command).await;
    let find = top
        .lines()
        .find(|l| l.starts_with("find "))
        .unwrap_or_else(|| panic!("no find row in\n{top}"));
    assert!(
        find.split_whitespace()
            .nth(1)
            .unwrap()
            .parse::<f64>()
            .unwrap()
            >= 6.0,
        "{find}"
    );
    assert!(top.contains("% saved"), "{top}");
    assert!(top.contains("CommandNotSupported"), "{top}");
}

/// A TCP relay to the upstream that can be stopped (its open connections
/// cut too) and started again on the same port: the upstream "goes down"
/// and "comes back".
async fn relay(listener: TcpListener, target: String, stop: tokio::sync::watch::Receiver<bool>) {
    loop {
        let mut watch = stop.clone();
        let accepted = tokio::select! {
            _ = watch.wait_for(|s| *s) => return,
            a = listener.accept() => a,
        };
        let Ok((mut client, _)) = accepted else {
            return;
        };
        let target = target.clone();
        let mut watch = stop.clone();
        tokio::spawn(async move {
            if let Ok(mut server) = TcpStream::connect(&target).await {
                tokio::select! {
                    _ = watch.wait_for(|s| *s) => {}
                    _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                }
            }
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_upstream_down_and_back() {
    let upstream = common::upstream();
    let target = upstream
        .uri
        .trim_start_matches("mongodb://")
        .trim_end_matches('/')
        .to_owned();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(relay(listener, target.clone(), stopped));
    let mut config = common::proxy_config(&format!(
        "mongodb://127.0.0.1:{port}/?directConnection=true"
    ));
    config.metrics_listen = Some("127.0.0.1:0".into());
    let proxy = common::start(config).await;
    let addr = proxy.metrics_addr.unwrap();
    assert_eq!(get(addr, "/readyz").await.0, 200);

    stop.send(true).unwrap();
    task.await.unwrap();
    let mut down = false;
    for _ in 0..20 {
        let (status, body) = get(addr, "/readyz").await;
        if status == 503 {
            assert!(body.starts_with("not ready"), "{body}");
            down = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(down, "/readyz kept answering 200 with the upstream gone");
    assert_eq!(
        get(addr, "/healthz").await.0,
        200,
        "the process still lives"
    );

    let listener = TcpListener::bind(("127.0.0.1", port)).await.unwrap();
    let (_keep, running) = tokio::sync::watch::channel(false);
    tokio::spawn(relay(listener, target, running));
    let mut up = false;
    for _ in 0..40 {
        if get(addr, "/readyz").await.0 == 200 {
            up = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(up, "/readyz did not recover");
}

/// `/metrics` once `until` holds of it, or after 4 s.
async fn metrics_once(addr: std::net::SocketAddr, until: impl Fn(&str) -> bool) -> String {
    let mut m = String::new();
    for _ in 0..40 {
        m = get(addr, "/metrics").await.1;
        if until(&m) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    m
}

/// The sum of `laconic_shadow_reads_total` for `outcome`, of `command`
/// (of every command if it is empty).
fn shadowed(metrics: &str, command: &str, outcome: &str) -> f64 {
    let (command, outcome) = (
        format!("command=\"{command}"),
        format!("outcome=\"{outcome}\""),
    );
    metrics
        .lines()
        .filter(|l| {
            l.starts_with("laconic_shadow_reads_total{")
                && l.contains(&command)
                && l.contains(&outcome)
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shadow_mode_counts_a_corrupted_document_as_a_difference() {
    let shadow_upstream = common::second_upstream();
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 5;
    config.tokenize.store_db = db_name("shadow", "store");
    config.metrics_listen = Some("127.0.0.1:0".into());
    config.shadow = Some(laconic::config::ShadowConfig {
        uri: format!("{}?directConnection=true", shadow_upstream.uri),
        sample: 1.0,
    });
    config.max_work_bytes = laconic::config::MIN_WORK_BYTES;
    let proxy = common::start(config).await;
    let addr = proxy.metrics_addr.unwrap();
    // The same database name on both deployments: tokenized behind the
    // proxy, untokenized in the shadow.
    let db = db_name("shadow", "app");
    let via = common::via_proxy(&proxy)
        .await
        .database(&db)
        .collection::<Document>("people");
    let shadow_client =
        mongodb::Client::with_uri_str(format!("{}?directConnection=true", shadow_upstream.uri))
            .await
            .unwrap();
    let twin = shadow_client.database(&db).collection::<Document>("people");
    via.drop().await.unwrap();
    twin.drop().await.unwrap();
    for c in [&shadow_client, &common::direct().await] {
        for name in ["report", "merged"] {
            c.database(&db)
                .collection::<Document>(name)
                .drop()
                .await
                .unwrap();
        }
    }
    let docs: Vec<Document> = (0..5)
        .map(|i| doc! {"_id": i, "first_name": format!("name {i}"), "score_value": i * 10})
        .collect();
    via.insert_many(docs.clone()).await.unwrap();
    twin.insert_many(docs).await.unwrap();

    // Identical data: reads compare equal.
    for i in 0..5 {
        via.find_one(doc! {"first_name": format!("name {i}")})
            .await
            .unwrap()
            .unwrap();
    }
    assert_eq!(
        via.count_documents(doc! {"score_value": {"$gte": 20}})
            .await
            .unwrap(),
        3
    );
    let mut m = metrics_once(addr, |m| shadowed(m, "", "compared") >= 6.0).await;
    assert!(shadowed(&m, "", "compared") >= 6.0, "{m}");
    assert_eq!(shadowed(&m, "", "different"), 0.0, "{m}");

    // One document corrupted in the shadow: the next read of it differs.
    twin.update_one(doc! {"_id": 3}, doc! {"$set": {"score_value": -1}})
        .await
        .unwrap();
    via.find_one(doc! {"_id": 3}).await.unwrap().unwrap();
    m = metrics_once(addr, |m| shadowed(m, "", "different") >= 1.0).await;
    assert_eq!(shadowed(&m, "", "different"), 1.0, "{m}");

    // Pipelines that write are not repeated on the shadow deployment: its
    // data stays as it was.
    let before = shadowed(&m, "aggregate", "compared");
    for stage in [doc! {"$out": "report"}, doc! {"$merge": {"into": "merged"}}] {
        via.aggregate(vec![doc! {"$match": {}}, stage])
            .await
            .unwrap();
    }
    // A read after them is compared: by then, they would have been too.
    via.aggregate(vec![doc! {"$match": {"_id": 1}}])
        .await
        .unwrap();
    m = metrics_once(addr, |m| shadowed(m, "aggregate", "compared") > before).await;
    assert_eq!(shadowed(&m, "aggregate", "compared"), before + 1.0, "{m}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    let written = |c: &mongodb::Client| {
        let db = c.database(&db);
        async move {
            let names = db.list_collection_names().await.unwrap();
            ["report", "merged"].map(|n| names.iter().any(|c| c == n))
        }
    };
    assert_eq!(written(&shadow_client).await, [false, false]);
    assert_eq!(written(&common::direct().await).await, [true, true]);

    // A read whose comparison the heavy-work budget (16 MiB here) has no
    // room for is answered, and not compared.
    let big: Vec<Document> = (100..2100)
        .map(|i| doc! {"_id": i, "first_name": "big", "score_value": (0..20).collect::<Vec<i32>>()})
        .collect();
    via.insert_many(big.clone()).await.unwrap();
    twin.insert_many(big).await.unwrap();
    let read: Vec<Document> = via
        .find(doc! {"first_name": "big"})
        .batch_size(3000)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert_eq!(read.len(), 2000);
    m = metrics_once(addr, |m| shadowed(m, "find", "skipped") >= 1.0).await;
    assert_eq!(shadowed(&m, "find", "skipped"), 1.0, "{m}");
    // Every comparison's share of the budget is given back.
    m = metrics_once(addr, |m| {
        m.lines().any(|l| l == "laconic_heavy_work_bytes 0")
    })
    .await;
    assert!(m.lines().any(|l| l == "laconic_heavy_work_bytes 0"), "{m}");
}

/// A proxy whose own connection (the name store's) cannot authenticate:
/// `/readyz` says so and why, while a driver with its own credentials
/// still gets answers for what needs no store, through the same proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_a_store_connection_that_cannot_authenticate() {
    let Some(up) = common::auth_upstream() else {
        return; // an external upstream: its credentials are not ours to spoil
    };
    let mut config = common::proxy_config(&format!(
        "mongodb://laconic:wrong-pw@{}/?authSource=admin",
        up.host
    ));
    config.tokenize.min_len = 4;
    config.metrics_listen = Some("127.0.0.1:0".into());
    let proxy = common::start(config).await;
    let (status, body) = get(proxy.metrics_addr.unwrap(), "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("authenticat"), "{body}");
    assert!(body.contains("own connection"), "{body}");
    let driver = common::as_root(proxy.addr, "retryWrites=false").await;
    driver
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
}

/// A proxy whose own user may not read one database's dictionary: that
/// database is refused with the reason (nothing is written without its
/// tokens), `/readyz` names it, and every other database is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dictionary_the_proxys_own_user_cannot_read_is_refused_and_named_on_readyz() {
    let Some(up) = common::auth_upstream() else {
        return; // an external upstream: its users are not ours to add
    };
    let (allowed, denied) = (db_name("narrow", "ok"), db_name("narrow", "denied"));
    let root = common::as_root(&up.host, "directConnection=true").await;
    // One database, and the store's own (where the proxy records which
    // databases have had a dictionary).
    let roles = bson::bson!([
        {"role": "readWrite", "db": &allowed},
        {"role": "readWrite", "db": "laconic"},
    ]);
    let created = root
        .database("admin")
        .run_command(doc! {"createUser": "narrow", "pwd": "narrow-pw", "roles": roles.clone()})
        .await;
    if let Err(e) = created {
        assert!(e.to_string().contains("already exists"), "{e}");
        root.database("admin")
            .run_command(doc! {"grantRolesToUser": "narrow", "roles": roles})
            .await
            .unwrap();
    }
    let mut config = common::proxy_config(&format!(
        "mongodb://narrow:narrow-pw@{}/?authSource=admin",
        up.host
    ));
    config.tokenize.min_len = 4;
    config.metrics_listen = Some("127.0.0.1:0".into());
    let proxy = common::start(config).await;
    // The application authenticates as itself (root here).
    let driver = common::as_root(proxy.addr, "retryWrites=false").await;
    let ok = driver.database(&allowed).collection::<Document>("c");
    ok.insert_one(doc! {"_id": 1, "long_field_name": 1})
        .await
        .unwrap();
    assert_eq!(
        ok.find_one(doc! {}).await.unwrap(),
        Some(doc! {"_id": 1, "long_field_name": 1})
    );
    let err = driver
        .database(&denied)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1, "long_field_name": 1})
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("laconic:"), "{err}");
    assert!(err.contains(&denied), "{err}");
    nothing_written(&root, &denied).await;
    driver
        .database("admin")
        .run_command(doc! {"ping": 1})
        .await
        .unwrap();
    let (status, body) = get(proxy.metrics_addr.unwrap(), "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&format!("refusing {denied}")), "{body}");

    // Without the store's database, it records nothing, so it makes no
    // dictionary: the write is refused, with the server's reason, and not
    // written untokenized.
    let narrower = db_name("narrower", "ok");
    let created = root
        .database("admin")
        .run_command(doc! {
            "createUser": "narrower",
            "pwd": "narrower-pw",
            "roles": [{"role": "readWrite", "db": &narrower}],
        })
        .await;
    if let Err(e) = created {
        assert!(e.to_string().contains("already exists"), "{e}");
    }
    let mut config = common::proxy_config(&format!(
        "mongodb://narrower:narrower-pw@{}/?authSource=admin",
        up.host
    ));
    config.tokenize.min_len = 4;
    let proxy = common::start(config).await;
    let driver = common::as_root(proxy.addr, "retryWrites=false").await;
    let err = driver
        .database(&narrower)
        .collection::<Document>("c")
        .insert_one(doc! {"_id": 1, "long_field_name": 1})
        .await
        .unwrap_err();
    let e = common::command_error(err);
    assert_eq!(e.code, 13, "{}", e.message);
    assert!(
        e.message.contains("not authorized on laconic"),
        "{}",
        e.message
    );
    nothing_written(&root, &narrower).await;
}
/// Checks, through `root`, that `db.c` holds no document: a refused write
/// wrote nothing, untokenized or not.
async fn nothing_written(root: &mongodb::Client, db: &str) {
    let stored = root
        .database(db)
        .collection::<Document>("c")
        .find_one(doc! {})
        .await
        .unwrap();
    assert_eq!(
        stored, None,
        "a document was written without its dictionary"
    );
}
