//! The sidecar's HTTP port: `/metrics` (Prometheus text), `/healthz` (the
//! process lives) and `/readyz` (the upstream answers, and the name store
//! can be read when tokenization is on). A minimal HTTP/1.1 responder: one
//! request per connection, no body.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, warn};

use crate::context::ProxyContext;
use crate::shutdown::Shutdown;

/// Serves until shutdown.
pub async fn serve(listener: TcpListener, ctx: Arc<ProxyContext>, shutdown: Shutdown) {
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.triggered() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((stream, _)) => {
                let ctx = ctx.clone();
                tokio::spawn(async move {
                    if let Err(e) = answer(stream, &ctx).await {
                        debug!(error = %e, "metrics request failed");
                    }
                });
            }
            Err(e) => {
                warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, ctx: &ProxyContext) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    // The request head, within 5 s and 8 KB.
    let read = async {
        while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 8192 {
            let n = stream.read(&mut chunk).await?;
            if n == 0 {
                break;
            }
            buf.extend_from_slice(&chunk[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request head"))??;
    let head = String::from_utf8_lossy(&buf);
    let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or(path);
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4",
            ctx.metrics.render(
                &dictionaries(ctx),
                crate::observe::Held {
                    work: ctx.heavy.budget().held(),
                    read: ctx.reading.held(),
                    reply: ctx.replies.held(),
                    proxy_ids: ctx.cursors.proxy_ids(),
                },
                crate::observe::Limits::of(&ctx.config),
            ),
        ),
        ("GET", "/healthz") => ("200 OK", "text/plain", "ok\n".to_owned()),
        ("GET", "/readyz") => match ready(ctx).await {
            Ok(()) => ("200 OK", "text/plain", readiness_body(ctx)),
            Err(why) => (
                "503 Service Unavailable",
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "try /metrics, /healthz or /readyz\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "GET only\n".to_owned(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}

fn dictionaries(ctx: &ProxyContext) -> Vec<crate::token::store::Status> {
    ctx.rewrite
        .tokens
        .as_ref()
        .map(|t| t.store.statuses())
        .unwrap_or_default()
}

/// "ready", and the databases refused for their dictionaries: the proxy
/// stays ready (it serves every other database), and says which it refuses.
fn readiness_body(ctx: &ProxyContext) -> String {
    let mut body = String::from("ready\n");
    for s in dictionaries(ctx) {
        if let Some(why) = s.error {
            body.push_str(&format!("refusing {}: {why}\n", s.scope));
        }
    }
    body
}

/// Whether the upstream answers a ping and, with tokenization on, the name
/// store can be read.
async fn ready(ctx: &ProxyContext) -> Result<(), String> {
    let limit = Duration::from_secs(2);
    let admin = ctx.own.database("admin");
    let ping = admin.run_command(bson::doc! {"ping": 1});
    match tokio::time::timeout(limit, ping).await {
        Ok(Ok(_)) => {}
        Ok(Err(e)) if matches!(*e.kind, mongodb::error::ErrorKind::Authentication { .. }) => {
            return Err(format!(
                "the proxy's own connection (the name store's) cannot authenticate to the upstream: {e}; check the credentials of the upstream URI (sessions authenticate as their drivers, and are served)"
            ))
        }
        Ok(Err(e)) => return Err(format!("the upstream does not answer: {e}")),
        Err(_) => return Err("the upstream does not answer within 2 s".into()),
    }
    if let Some(t) = &ctx.rewrite.tokens {
        match tokio::time::timeout(limit, t.store.probe()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(format!("the name store cannot be read: {e}")),
            Err(_) => return Err("the name store does not answer within 2 s".into()),
        }
    }
    Ok(())
}
