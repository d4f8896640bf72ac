//! The deployment assets, checked since no container engine runs here: the
//! Dockerfile, the Kubernetes sidecar example and the Grafana dashboard are
//! parsed, and every series the dashboard queries is one `/metrics` serves.

use std::collections::BTreeSet;

use bson::doc;
use serde_yaml::Value;

use crate::common::{self, db_name};

fn text(path: &str) -> String {
    std::fs::read_to_string(common::root().join(path)).unwrap()
}

#[test]
fn the_dockerfile_builds_from_the_tree_and_runs_unprivileged_with_probes_exposed() {
    let dockerfile = text("Dockerfile");
    let lines: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let args = |cmd: &str| -> Vec<&str> {
        lines
            .iter()
            .filter_map(|l| l.strip_prefix(cmd).and_then(|r| r.strip_prefix(' ')))
            .collect()
    };
    assert_eq!(args("FROM").len(), 2, "a build stage and a runtime stage");
    for copy in args("COPY").iter().filter(|c| !c.starts_with("--from")) {
        let parts: Vec<&str> = copy.split_whitespace().collect();
        for source in &parts[..parts.len() - 1] {
            assert!(
                common::root().join(source).exists(),
                "COPY {source}: no such path"
            );
        }
    }
    let user = args("USER");
    assert_eq!(user, vec!["10001"]);
    let exposed: Vec<&str> = args("EXPOSE")
        .iter()
        .flat_map(|e| e.split_whitespace())
        .collect();
    assert_eq!(exposed, vec!["27018", "9216"]);
    assert!(dockerfile.contains("LACONIC_METRICS_LISTEN=0.0.0.0:9216"));
    assert!(dockerfile.contains("LACONIC_LISTEN=0.0.0.0:27018"));
    let entry: Vec<String> = serde_json::from_str(args("ENTRYPOINT")[0]).unwrap();
    assert_eq!(
        entry[..2],
        ["/usr/local/bin/laconic".to_owned(), "serve".to_owned()]
    );

    // The binary is profile-guided unless PGO=0: the build stage runs
    // scripts/build-pgo.sh, copies the binary that script prints, or the
    // plain release build's, to the one path the runtime stage takes.
    assert_eq!(args("ARG"), vec!["PGO=1"]);
    let script = text("scripts/build-pgo.sh");
    let built = script
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("echo "))
        .expect("build-pgo.sh prints the binary's path");
    // And names its build "pgo" (`laconic --version`, `laconic_build_info`).
    assert!(script.contains("-Cprofile-use=$data/merged.profdata\" LACONIC_BUILD=pgo"));
    for (build, binary) in [
        ("scripts/build-pgo.sh", built),
        (
            "cargo build --release --locked --bin laconic",
            "target/release/laconic",
        ),
    ] {
        let copied = format!("{build} && cp {binary} /laconic");
        assert!(
            dockerfile.contains(&copied),
            "the build stage runs {copied:?}"
        );
    }
    assert_eq!(
        args("COPY")
            .iter()
            .filter(|c| c.starts_with("--from"))
            .collect::<Vec<_>>(),
        vec![&"--from=build /laconic /usr/local/bin/laconic"]
    );
    // What the training installs from PyPI needs a venv.
    assert!(dockerfile.contains("python3-venv"));

    // Each RUN, its lines joined as Docker joins them, is a shell command
    // `/bin/sh -c` parses.
    let joined = dockerfile.replace("\\\n", "");
    let runs: Vec<&str> = joined
        .lines()
        .filter_map(|l| l.strip_prefix("RUN "))
        .collect();
    assert_eq!(runs.len(), 3);
    for run in runs {
        let parsed = std::process::Command::new("sh")
            .args(["-n", "-c", run])
            .output()
            .unwrap();
        assert!(
            parsed.status.success(),
            "RUN {run}: {}",
            String::from_utf8_lossy(&parsed.stderr)
        );
    }
}

#[test]
fn the_kubernetes_example_is_a_valid_sidecar_with_probes_tls_and_a_valid_config() {
    let yaml = text("deploy/kubernetes/laconic-sidecar.yaml");
    let docs: Vec<Value> = serde_yaml::Deserializer::from_str(&yaml)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let of_kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let config_map = of_kind("ConfigMap");
    let toml = config_map["data"]["laconic.toml"].as_str().unwrap();
    let config = laconic::config::Config::parse(toml).unwrap();
    config.validate().unwrap();
    let deployment = of_kind("Deployment");
    let spec = &deployment["spec"]["template"]["spec"];
    let containers = spec["containers"].as_sequence().unwrap();
    assert_eq!(containers.len(), 2, "the application and its sidecar");
    let laconic = containers.iter().find(|c| c["name"] == "laconic").unwrap();
    // Probes on the metrics port the configuration opens.
    let metrics_port: u64 = config
        .proxy
        .metrics_listen
        .as_deref()
        .unwrap()
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let port = laconic["ports"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .unwrap();
    assert_eq!(port["containerPort"].as_u64(), Some(metrics_port));
    assert_eq!(laconic["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(laconic["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(laconic["readinessProbe"]["httpGet"]["port"], "metrics");
    // Memory requested and limited; the upstream URI from a secret.
    assert!(laconic["resources"]["requests"]["memory"].is_string());
    let limit = laconic["resources"]["limits"]["memory"].as_str().unwrap();
    let limit: usize = match limit.split_at(limit.len() - 2) {
        (n, "Mi") => n.parse::<usize>().unwrap() << 20,
        (n, "Gi") => n.parse::<usize>().unwrap() << 30,
        _ => panic!("a memory limit in Mi or Gi: {limit}"),
    };
    // The proxy's budgets fit in the limit beside its resting size (about
    // 31 MB, README) and its connections.
    let p = &config.proxy;
    let budgets = p.max_held_bytes + p.max_work_bytes + p.max_read_bytes + p.max_reply_bytes;
    assert!(
        budgets + (48 << 20) <= limit,
        "budgets of {budgets} bytes in a limit of {limit}"
    );
    let upstream = laconic["env"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "LACONIC_UPSTREAM")
        .unwrap();
    assert!(upstream["valueFrom"]["secretKeyRef"]["name"].is_string());
    // The TLS files the configuration names are in a mounted secret.
    let mounts = laconic["volumeMounts"].as_sequence().unwrap();
    let volumes = spec["volumes"].as_sequence().unwrap();
    for file in [&config.proxy.tls.cert_file, &config.proxy.tls.key_file] {
        let file = file.as_ref().unwrap().to_str().unwrap();
        let mount = mounts
            .iter()
            .find(|m| file.starts_with(m["mountPath"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{file} is not mounted"));
        let volume = volumes.iter().find(|v| v["name"] == mount["name"]).unwrap();
        assert!(
            volume["secret"]["secretName"].is_string(),
            "{file} is not from a secret"
        );
    }
    // The application reaches the sidecar with TLS on the port it listens on.
    let app = containers.iter().find(|c| c["name"] != "laconic").unwrap();
    let uri = app["env"][0]["value"].as_str().unwrap();
    let listen_port = config.proxy.listen.rsplit(':').next().unwrap();
    assert!(
        uri.contains(&format!(":{listen_port}/")) && uri.contains("tls=true"),
        "{uri}"
    );
}

#[tokio::test]
async fn every_series_the_dashboard_queries_is_served() {
    let json: serde_json::Value =
        serde_json::from_str(&text("deploy/grafana/laconic-dashboard.json")).unwrap();
    let exprs: Vec<String> = json["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().unwrap().iter())
        .map(|t| t["expr"].as_str().unwrap().to_owned())
        .collect();
    assert!(exprs.len() >= 10);
    // A proxy that has served some traffic (tokenized writes and reads).
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 4;
    config.metrics_listen = Some("127.0.0.1:0".into());
    let proxy = common::start(config).await;
    let c = common::via_proxy(&proxy)
        .await
        .database(&db_name("dashboard", "app"))
        .collection::<bson::Document>("c");
    c.insert_one(doc! {"a_long_field": 1}).await.unwrap();
    c.find_one(doc! {}).await.unwrap();
    let (_, metrics) = common::get(proxy.metrics_addr.unwrap(), "/metrics").await;
    let served: BTreeSet<&str> = metrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    let name = regex::Regex::new(r"laconic_[a-z_]+").unwrap();
    let by = regex::Regex::new(r"by \(([a-z_, ]+)\)").unwrap();
    for expr in &exprs {
        for m in name.find_iter(expr) {
            let metric = m.as_str();
            let family = metric.trim_end_matches("_bucket");
            assert!(
                served.contains(family),
                "{metric} (in {expr}) is not served"
            );
            // The labels it groups by are the series' own.
            for labels in by.captures_iter(expr) {
                for label in labels[1].split(',').map(str::trim).filter(|l| *l != "le") {
                    let labelled = metrics
                        .lines()
                        .any(|l| l.starts_with(metric) && l.contains(&format!("{label}=\"")));
                    let unlabelled_gauge = !metrics
                        .lines()
                        .any(|l| l.starts_with(&format!("{metric}{{")));
                    assert!(
                        labelled || unlabelled_gauge,
                        "{metric} has no label {label}"
                    );
                }
            }
        }
    }
}
