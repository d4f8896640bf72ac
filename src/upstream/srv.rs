//! `mongodb+srv://`: the upstream's hosts come from DNS, as drivers read
//! them (the initial DNS seedlist discovery specification):
//!
//! - SRV records at `_{srvServiceName}._tcp.{host}` list the hosts, each of
//!   which must lie in the URI host's parent domain (a record pointing
//!   anywhere else is skipped, so that a spoofed record cannot send the
//!   traffic elsewhere);
//! - at most one TXT record at `{host}` gives `authSource` and `replicaSet`,
//!   which options in the URI override;
//! - the records are looked up again every `srv_rescan_ms` (60 s), and new
//!   sessions follow the hosts they list.
//!
//! The lookups use the system's resolver (`/etc/resolv.conf`), or the DNS
//! server `dns_server` names.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::proto::rr::RData;
use hickory_resolver::TokioResolver;

use crate::config::uri::SrvName;

/// What the DNS said of a `mongodb+srv://` name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seedlist {
    /// `host:port` each, in the order of the records (or a random choice of
    /// `srvMaxHosts` of them).
    pub hosts: Vec<String>,
    /// The TXT record's options (`authSource`, `replicaSet`), as given.
    pub options: Vec<(String, String)>,
}

/// Looks up SRV and TXT records.
#[derive(Clone)]
pub struct Resolver {
    inner: TokioResolver,
}

impl std::fmt::Debug for Resolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Resolver")
    }
}

impl Resolver {
    /// The system's resolver, or the DNS server at `server` (UDP, then TCP
    /// for long answers).
    pub fn new(server: Option<SocketAddr>) -> Result<Resolver, String> {
        let builder = match server {
            None => TokioResolver::builder_tokio()
                .map_err(|e| format!("the system's DNS configuration: {e}"))?,
            Some(addr) => {
                let mut ns = NameServerConfig::udp_and_tcp(addr.ip());
                for c in &mut ns.connections {
                    c.port = addr.port();
                }
                TokioResolver::builder_with_config(
                    ResolverConfig::from_parts(None, Vec::new(), vec![ns]),
                    Default::default(),
                )
            }
        };
        let inner = builder.build().map_err(|e| format!("DNS resolver: {e}"))?;
        Ok(Resolver { inner })
    }

    /// Looks `name` up afresh (not from the resolver's cache).
    pub async fn seedlist(&self, name: &SrvName) -> Result<Seedlist, String> {
        self.inner.clear_cache();
        let srv_name = format!("_{}._tcp.{}.", name.service, name.host);
        let records = self
            .inner
            .srv_lookup(srv_name.as_str())
            .await
            .map_err(|e| format!("SRV lookup of {srv_name}: {e}"))?;
        let targets = records.answers().iter().filter_map(|r| match &r.data {
            RData::SRV(srv) => Some((srv.target.to_utf8(), srv.port)),
            _ => None,
        });
        let mut hosts = in_domain(&name.host, targets)?;
        if name.max_hosts > 0 && hosts.len() > name.max_hosts {
            for i in (1..hosts.len()).rev() {
                hosts.swap(i, (crate::random::u64() % (i as u64 + 1)) as usize);
            }
            hosts.truncate(name.max_hosts);
        }
        let txt = match self.inner.txt_lookup(format!("{}.", name.host)).await {
            Ok(l) => l
                .answers()
                .iter()
                .filter_map(|r| match &r.data {
                    RData::TXT(t) => Some(
                        t.txt_data
                            .iter()
                            .map(|b| String::from_utf8_lossy(b).into_owned())
                            .collect::<String>(),
                    ),
                    _ => None,
                })
                .collect(),
            Err(e) if e.is_no_records_found() => Vec::new(),
            Err(e) => return Err(format!("TXT lookup of {}: {e}", name.host)),
        };
        Ok(Seedlist {
            hosts,
            options: txt_options(&name.host, &txt)?,
        })
    }
}

/// The SRV targets that lie in `host`'s parent domain (`host` itself when
/// it has fewer than three labels), as `host:port`; an error if none does.
fn in_domain(
    host: &str,
    targets: impl Iterator<Item = (String, u16)>,
) -> Result<Vec<String>, String> {
    let labels: Vec<&str> = host.split('.').collect();
    let domain = if labels.len() >= 3 {
        &labels[1..]
    } else {
        &labels[..]
    };
    let mut hosts = Vec::new();
    for (target, port) in targets {
        let target = target.trim_end_matches('.').to_ascii_lowercase();
        let parts: Vec<&str> = target.split('.').collect();
        if parts.len() > domain.len() && parts[1..].ends_with(domain) {
            hosts.push(format!("{target}:{port}"));
        } else {
            tracing::warn!(
                srv = host,
                target,
                "an SRV record names a host outside the domain {}; it is skipped",
                domain.join(".")
            );
        }
    }
    if hosts.is_empty() {
        return Err(format!(
            "the SRV records of {host} name no host in the domain {}",
            domain.join(".")
        ));
    }
    Ok(hosts)
}

/// The options of a `mongodb+srv://` name's TXT records: at most one
/// record, of `authSource` and `replicaSet` alone.
fn txt_options(host: &str, records: &[String]) -> Result<Vec<(String, String)>, String> {
    let record = match records {
        [] => return Ok(Vec::new()),
        [one] => one,
        _ => {
            return Err(format!(
                "{host} has {} TXT records; at most one is allowed",
                records.len()
            ))
        }
    };
    record
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v))
                if k.eq_ignore_ascii_case("authSource") || k.eq_ignore_ascii_case("replicaSet") =>
            {
                Ok((k.to_owned(), v.to_owned()))
            }
            Some((k, _)) if k.eq_ignore_ascii_case("loadBalanced") => Err(format!(
                "the TXT record of {host} asks for loadBalanced, which the proxy does not support"
            )),
            _ => Err(format!(
                "the TXT record of {host} has `{pair}`; only authSource and replicaSet are allowed"
            )),
        })
        .collect()
}

/// The `mongodb://` URI a driver of the proxy's own would use for
/// `uri` (a `mongodb+srv://` one) resolved to `seeds`: the hosts listed,
/// TLS on unless the URI turns it off, and the TXT options the URI does not
/// give itself. `srvServiceName` and `srvMaxHosts` are dropped: they only
/// steer the lookup.
pub fn plain_uri(uri: &str, seeds: &Seedlist) -> String {
    let rest = uri.strip_prefix("mongodb+srv://").unwrap_or(uri);
    let (authority, tail) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    let credentials = authority.rsplit_once('@').map(|(c, _)| c);
    let (path, query) = tail.split_once('?').unwrap_or((tail, ""));
    let given = |name: &str| {
        query.split('&').any(|p| {
            p.split('=')
                .next()
                .is_some_and(|k| k.eq_ignore_ascii_case(name))
        })
    };
    let mut options: Vec<String> = query
        .split('&')
        .filter(|p| {
            let k = p.split('=').next().unwrap_or_default();
            !p.is_empty()
                && !k.eq_ignore_ascii_case("srvServiceName")
                && !k.eq_ignore_ascii_case("srvMaxHosts")
        })
        .map(str::to_owned)
        .collect();
    if !given("tls") && !given("ssl") {
        options.push("tls=true".into());
    }
    for (k, v) in &seeds.options {
        if !given(k) {
            options.push(format!("{k}={v}"));
        }
    }
    let mut out = String::from("mongodb://");
    if let Some(c) = credentials {
        out.push_str(c);
        out.push('@');
    }
    out.push_str(&seeds.hosts.join(","));
    out.push_str(if path.is_empty() { "/" } else { path });
    if !options.is_empty() {
        out.push('?');
        out.push_str(&options.join("&"));
    }
    out
}

/// How often the SRV records are looked up again, when not configured.
pub const RESCAN: Duration = Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    fn targets(t: &[(&str, u16)]) -> impl Iterator<Item = (String, u16)> {
        t.iter()
            .map(|(h, p)| ((*h).to_owned(), *p))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn hosts_outside_the_parent_domain_are_skipped() {
        let hosts = in_domain(
            "cluster0.example.com",
            targets(&[
                ("a.example.com.", 27017),
                ("b.evil.com.", 27017),
                ("example.com.", 1),
                ("c.sub.example.com", 27018),
            ]),
        )
        .unwrap();
        assert_eq!(
            hosts,
            vec!["a.example.com:27017", "c.sub.example.com:27018"]
        );
        // Two labels: the hosts lie under the name itself.
        assert_eq!(
            in_domain(
                "example.com",
                targets(&[("a.example.com", 1), ("b.com", 1)])
            )
            .unwrap(),
            vec!["a.example.com:1"]
        );
        let err = in_domain("cluster0.example.com", targets(&[("a.evil.com", 1)])).unwrap_err();
        assert!(
            err.contains("name no host in the domain example.com"),
            "{err}"
        );
    }

    #[test]
    fn txt_records_give_auth_source_and_replica_set_alone() {
        assert_eq!(
            txt_options("h", &["replicaSet=rs0&authSource=admin".into()]).unwrap(),
            vec![
                ("replicaSet".into(), "rs0".into()),
                ("authSource".into(), "admin".into())
            ]
        );
        assert!(txt_options("h", &[]).unwrap().is_empty());
        assert!(txt_options("h", &["a=1".into(), "b=2".into()])
            .unwrap_err()
            .contains("at most one"));
        assert!(txt_options("h", &["w=majority".into()])
            .unwrap_err()
            .contains("`w=majority`"));
        assert!(txt_options("h", &["loadBalanced=true".into()])
            .unwrap_err()
            .contains("loadBalanced"));
    }

    #[test]
    fn the_plain_uri_lists_the_hosts_and_lets_the_uri_override_the_txt_record() {
        let seeds = Seedlist {
            hosts: vec!["a.x.com:27017".into(), "b.x.com:27018".into()],
            options: vec![
                ("replicaSet".into(), "rs0".into()),
                ("authSource".into(), "admin".into()),
            ],
        };
        assert_eq!(
            plain_uri(
                "mongodb+srv://u:p%40w@c.x.com/app?authSource=users&srvMaxHosts=2&w=1",
                &seeds
            ),
            "mongodb://u:p%40w@a.x.com:27017,b.x.com:27018/app?authSource=users&w=1&tls=true&replicaSet=rs0"
        );
        assert_eq!(
            plain_uri("mongodb+srv://c.x.com?tls=false", &seeds),
            "mongodb://a.x.com:27017,b.x.com:27018/?tls=false&replicaSet=rs0&authSource=admin"
        );
    }
}
