//! Opening the upstream connection of one session.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use crate::error::ProxyError;
use crate::wire::{Frame, MessageCodec};

/// The hosts named by a `mongodb://` URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamAddr {
    pub hosts: Vec<String>,
}

impl UpstreamAddr {
    /// Parses `mongodb://[user:pass@]host[:port][,host…][/db][?options]`.
    /// Credentials and options are the driver's business, not the proxy's:
    /// authentication passes through the proxy unchanged.
    pub fn parse(uri: &str) -> Result<UpstreamAddr, String> {
        if uri.starts_with("mongodb+srv://") {
            return Err("mongodb+srv:// is not supported; list the hosts explicitly".into());
        }
        let rest = uri
            .strip_prefix("mongodb://")
            .ok_or("expected a mongodb:// URI")?;
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let hosts_part = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let hosts: Vec<String> = hosts_part
            .split(',')
            .filter(|h| !h.is_empty())
            .map(|h| {
                if h.starts_with('[')
                    || h.rsplit_once(':')
                        .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                {
                    h.to_owned()
                } else {
                    format!("{h}:27017")
                }
            })
            .collect();
        if hosts.is_empty() {
            return Err("the URI names no host".into());
        }
        Ok(UpstreamAddr { hosts })
    }
}

/// One session's framed upstream connection.
pub type UpstreamConn = Framed<TcpStream, MessageCodec>;

/// Connects to the first host that answers within `timeout`.
pub async fn connect(
    addr: &UpstreamAddr,
    timeout: Duration,
    max_message_size: usize,
) -> Result<UpstreamConn, ProxyError> {
    let mut last = String::from("no host tried");
    for host in &addr.hosts {
        match tokio::time::timeout(timeout, TcpStream::connect(host.as_str())).await {
            Ok(Ok(stream)) => {
                stream
                    .set_nodelay(true)
                    .map_err(|e| ProxyError::UpstreamUnavailable {
                        addr: host.clone(),
                        reason: e.to_string(),
                    })?;
                return Ok(Framed::new(stream, MessageCodec::new(max_message_size)));
            }
            Ok(Err(e)) => last = format!("{host}: {e}"),
            Err(_) => last = format!("{host}: timed out after {timeout:?}"),
        }
    }
    Err(ProxyError::UpstreamUnavailable {
        addr: addr.hosts.join(","),
        reason: last,
    })
}

/// Sends one frame upstream.
pub async fn send(conn: &mut UpstreamConn, frame: Frame) -> Result<(), ProxyError> {
    conn.send(frame)
        .await
        .map_err(|e| ProxyError::UpstreamLost(e.to_string()))
}

/// Reads the next reply; a closed connection is an error, since a reply was due.
pub async fn next_reply(conn: &mut UpstreamConn) -> Result<Frame, ProxyError> {
    match conn.next().await {
        Some(Ok(frame)) => Ok(frame),
        Some(Err(e)) => Err(ProxyError::UpstreamLost(e.to_string())),
        None => Err(ProxyError::UpstreamLost(
            "connection closed by the upstream".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_hosts() {
        let a = UpstreamAddr::parse("mongodb://u:p@h1:1,h2/db?replicaSet=x").unwrap();
        assert_eq!(a.hosts, vec!["h1:1", "h2:27017"]);
        assert!(UpstreamAddr::parse("mongodb+srv://x").is_err());
        assert!(UpstreamAddr::parse("http://x").is_err());
        assert!(UpstreamAddr::parse("mongodb:///db").is_err());
    }
}
