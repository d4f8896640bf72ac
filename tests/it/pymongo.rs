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

/// Runs `tests/py/pymongo_session.py` with `uri` (naming the proxy at
/// `proxy`, in front of `upstream`) and checks that all its checks passed.
pub async fn session(uri: String, proxy: String, upstream: String) {
    let python = common::venv_python();
    let script = common::root().join("tests/py/pymongo_session.py");
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .arg(uri)
            .arg(proxy)
            .arg(upstream)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "pymongo session failed:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("all checks passed"), "{stdout}");
}
