//! A second driver: pymongo through the proxy, given only the proxy's address.

use std::process::Command;

use crate::common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pymongo_runs_crud_cursors_aggregation_transactions_and_change_streams() {
    let proxy = common::proxy().await;
    let python = common::venv_python();
    let script = common::root().join("tests/py/pymongo_session.py");
    let upstream = common::upstream().host.clone();
    let proxy_addr = proxy.addr.to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg(script)
            .arg(format!("mongodb://{proxy_addr}/?retryWrites=false"))
            .arg(proxy_addr)
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
