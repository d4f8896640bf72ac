//! A second driver: pymongo through the proxy, given only the proxy's address.

use std::process::Command;

use crate::common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_runs_crud_cursors_aggregation_transactions_and_change_streams() {
    let proxy = common::proxy().await;
    session(
        format!("mongodb://{}/?retryWrites=false", proxy.addr),
        proxy.addr.to_string(),
        common::upstream().host.clone(),
    )
    .await;
}

/// pymongo reads batches that expansion cut: a first batch and a
/// getMore's, whose cursor id it takes from each reply, and a change
/// stream it resumes from the token it cached at the end of a cut part
/// (`tests/py/pymongo_held.py`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_reads_cut_batches_and_resumes_a_stream_after_a_cut_part() {
    let mut config = common::proxy_config(&common::upstream().uri);
    config.tokenize.min_len = 100;
    config.tokenize.store_db = common::db_name("pyheld", "store");
    let proxy = common::start(config).await;
    let uri = format!("mongodb://{}/?retryWrites=false", proxy.addr);
    let db = common::db_name("pyheld", "proxy");
    run("pymongo_held.py", vec![uri, db]).await;
}

/// Runs `tests/py/pymongo_session.py` with `uri` (naming the proxy at
/// `proxy`, in front of `upstream`) and checks that all its checks passed.
pub async fn session(uri: String, proxy: String, upstream: String) {
    run("pymongo_session.py", vec![uri, proxy, upstream]).await;
}

/// Runs `tests/py/<script>` with `args`, and checks that all its checks
/// passed.
async fn run(script: &str, args: Vec<String>) {
    let python = common::venv_python();
    let script = common::root().join("tests/py").join(script);
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .args(args)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "pymongo failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
