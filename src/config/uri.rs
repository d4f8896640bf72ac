//! Connection strings: the hosts an upstream URI names (or the DNS name
//! that lists them, for `mongodb+srv://`), and its TLS options.

use std::path::PathBuf;

/// The hosts named by a `mongodb://` URI, and its TLS options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionString {
    /// `host:port` each; empty for `mongodb+srv://` until it is resolved.
    pub hosts: Vec<String>,
    /// For `mongodb+srv://`: the name whose SRV records list the hosts.
    pub srv: Option<SrvName>,
    pub tls: TlsOptions,
    /// `heartbeatFrequencyMS`: how often the hosts' roles are checked.
    pub heartbeat_ms: Option<u64>,
}

/// The TLS options of a connection string, as drivers read them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsOptions {
    /// `tls=true` or `ssl=true`.
    pub enabled: bool,
    /// `tlsCAFile`: the CAs the server's certificate must chain to.
    pub ca_file: Option<PathBuf>,
    /// `tlsCertificateKeyFile`: a client certificate and its key, in one PEM.
    pub cert_key_file: Option<PathBuf>,
    /// `tlsInsecure` (or `tlsAllowInvalidCertificates`): nothing is verified.
    pub insecure: bool,
}

/// The DNS name of a `mongodb+srv://` URI, and how its SRV records are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrvName {
    /// The URI's one host: SRV records are looked up at
    /// `_{service}._tcp.{host}`, and TXT records at `host`.
    pub host: String,
    /// `srvServiceName` (`mongodb`).
    pub service: String,
    /// `srvMaxHosts`: at most this many hosts, chosen at random (0: all).
    pub max_hosts: usize,
}

impl TlsOptions {
    /// Reads the TLS options of a URI's query (`a=1&b=2`); without `tls`,
    /// `ssl` or any other TLS option, TLS is `by_default` (on for
    /// `mongodb+srv://`, as in drivers).
    fn parse(query: &str, by_default: bool) -> Result<TlsOptions, String> {
        let mut o = TlsOptions::default();
        let flag = |k: &str, v: &str| match v {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(format!("{k}={v}: expected true or false")),
        };
        let mut explicit = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = percent_decode(v);
            match k.to_ascii_lowercase().as_str() {
                "tls" | "ssl" => explicit = Some(flag(k, &v)?),
                "tlscafile" => o.ca_file = Some(PathBuf::from(v)),
                "tlscertificatekeyfile" => o.cert_key_file = Some(PathBuf::from(v)),
                "tlsallowinvalidhostnames" if flag(k, &v)? => {
                    return Err("tlsAllowInvalidHostnames=true: the proxy's own connection (the MongoDB Rust driver, with rustls) cannot skip the hostname check alone; name the host in the URI as its certificate does, or use tlsInsecure=true to verify nothing".into())
                }
                "tlsinsecure" | "tlsallowinvalidcertificates" => o.insecure = flag(k, &v)?,
                "tlscertificatekeyfilepassword" => {
                    return Err("tlsCertificateKeyFilePassword: encrypted keys are not supported; give an unencrypted key file readable by the proxy alone".into())
                }
                _ => {}
            }
        }
        // Any TLS option turns TLS on, as in drivers; tls=false with one is
        // a contradiction.
        let implied = o.ca_file.is_some() || o.cert_key_file.is_some() || o.insecure;
        o.enabled = match explicit {
            Some(false) if implied => {
                return Err("tls=false contradicts the other TLS options".into())
            }
            Some(e) => e,
            None => implied || by_default,
        };
        Ok(o)
    }
}

/// `%XX` escapes of a URI option's value.
fn percent_decode(v: &str) -> String {
    let b = v.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, ..) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What the proxy does with a connection-string option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptionUse {
    /// Honoured on every upstream connection: the sessions' and the
    /// proxy's own (TLS, heartbeats).
    Everywhere,
    /// Honoured by the proxy's own connection (the name store's, health
    /// checks). A session's leg carries its driver's own settings instead:
    /// credentials, concerns, timeouts and pools are the driver's, and reach
    /// the upstream in its commands.
    Own,
    /// Refused at start, with the reason.
    Refused(&'static str),
}

/// Every option of the connection string specification, by lower-case
/// name. An option not listed is refused as unknown.
const OPTIONS: &[(&str, OptionUse)] = {
    use OptionUse::*;
    &[
        ("tls", Everywhere),
        ("ssl", Everywhere),
        ("tlscafile", Everywhere),
        ("tlscertificatekeyfile", Everywhere),
        ("tlsinsecure", Everywhere),
        ("tlsallowinvalidcertificates", Everywhere),
        ("tlsallowinvalidhostnames", Everywhere),
        ("tlscertificatekeyfilepassword", Everywhere),
        // The proxy checks no revocation (OCSP or CRL): turning the check off
        // is what it does anyway.
        ("tlsdisableocspendpointcheck", Everywhere),
        ("tlsdisablecertificaterevocationcheck", Everywhere),
        ("heartbeatfrequencyms", Everywhere),
        ("appname", Own),
        ("authsource", Own),
        ("authmechanism", Own),
        ("authmechanismproperties", Own),
        ("gssapiservicename", Own),
        ("directconnection", Own),
        ("replicaset", Own),
        ("journal", Own),
        ("w", Own),
        ("wtimeoutms", Own),
        ("readconcernlevel", Own),
        ("readpreference", Own),
        ("readpreferencetags", Own),
        ("maxstalenessseconds", Own),
        ("retryreads", Own),
        ("retrywrites", Own),
        ("maxpoolsize", Own),
        ("minpoolsize", Own),
        ("maxidletimems", Own),
        ("maxconnecting", Own),
        ("waitqueuetimeoutms", Own),
        ("serverselectiontimeoutms", Own),
        ("serverselectiontryonce", Own),
        ("sockettimeoutms", Own),
        ("localthresholdms", Own),
        ("timeoutms", Own),
        ("servermonitoringmode", Own),
        ("uuidrepresentation", Own),
        ("zlibcompressionlevel", Own),
        ("connecttimeoutms", Refused("set connect_timeout_ms in [proxy] instead: it times every upstream connection, the sessions' included")),
        ("compressors", Refused("set upstream_compressors in [proxy] instead: it compresses every upstream connection, the sessions' included")),
        ("loadbalanced", Refused("load-balanced mode is not supported: name the mongos hosts in the URI, and the proxy spreads sessions over them")),
        ("srvmaxhosts", Everywhere),
        ("srvservicename", Everywhere),
        ("proxyhost", Refused("a SOCKS5 proxy on the upstream leg is not supported")),
        ("proxyport", Refused("a SOCKS5 proxy on the upstream leg is not supported")),
        ("proxyusername", Refused("a SOCKS5 proxy on the upstream leg is not supported")),
        ("proxypassword", Refused("a SOCKS5 proxy on the upstream leg is not supported")),
    ]
};

/// What the proxy does with the option `name` (any case); `None` if it is
/// not a connection-string option.
pub fn option_use(name: &str) -> Option<OptionUse> {
    let lower = name.to_ascii_lowercase();
    OPTIONS.iter().find(|(n, _)| *n == lower).map(|(_, u)| *u)
}

/// Refuses an option the proxy cannot honour, or does not know.
fn check_options(query: &str) -> Result<(), String> {
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let name = pair.split_once('=').map_or(pair, |(k, _)| k);
        match option_use(name) {
            Some(OptionUse::Everywhere | OptionUse::Own) => {}
            Some(OptionUse::Refused(why)) => return Err(format!("{name}: {why}")),
            None => {
                return Err(format!(
                    "{name}: not a connection string option Laconic knows; remove it (the README lists what each option does through the proxy)"
                ))
            }
        }
    }
    Ok(())
}

impl ConnectionString {
    /// Parses `mongodb://[user:pass@]host[:port][,host…][/db][?options]`,
    /// or `mongodb+srv://[user:pass@]name[/db][?options]`. Credentials and
    /// options are the driver's business, not the proxy's: authentication
    /// passes through the proxy unchanged.
    pub fn parse(uri: &str) -> Result<ConnectionString, String> {
        let (rest, is_srv) = match uri.strip_prefix("mongodb+srv://") {
            Some(rest) => (rest, true),
            None => (
                uri.strip_prefix("mongodb://")
                    .ok_or("expected a mongodb:// or mongodb+srv:// URI")?,
                false,
            ),
        };
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let hosts_part = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        let named: Vec<&str> = hosts_part.split(',').filter(|h| !h.is_empty()).collect();
        if named.is_empty() {
            return Err("the URI names no host".into());
        }
        let query = rest.split_once('?').map_or("", |(_, q)| q);
        check_options(query)?;
        let option = |name: &str| {
            query
                .split('&')
                .filter_map(|p| p.split_once('='))
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        };
        let heartbeat_ms = option("heartbeatFrequencyMS")
            .map(|v| {
                v.parse::<u64>()
                    .ok()
                    .filter(|&ms| ms >= 500)
                    .ok_or_else(|| {
                        format!("heartbeatFrequencyMS={v}: expected milliseconds, at least 500")
                    })
            })
            .transpose()?;
        let srv = if is_srv {
            Some(SrvName::parse(&named, option)?)
        } else {
            if option("srvServiceName").is_some() || option("srvMaxHosts").is_some() {
                return Err("srvServiceName and srvMaxHosts belong to mongodb+srv:// URIs".into());
            }
            None
        };
        let hosts = match srv {
            Some(_) => Vec::new(),
            None => named
                .iter()
                .map(|h| {
                    if h.starts_with('[')
                        || h.rsplit_once(':')
                            .is_some_and(|(_, p)| p.parse::<u16>().is_ok())
                    {
                        (*h).to_owned()
                    } else {
                        format!("{h}:27017")
                    }
                })
                .collect(),
        };
        Ok(ConnectionString {
            hosts,
            tls: TlsOptions::parse(query, is_srv)?,
            srv,
            heartbeat_ms,
        })
    }
}

impl SrvName {
    /// The one host of a `mongodb+srv://` URI, with its SRV options, checked
    /// as the connection string specification says.
    fn parse<'q>(
        named: &[&str],
        option: impl Fn(&str) -> Option<&'q str>,
    ) -> Result<SrvName, String> {
        let [host] = named else {
            return Err("a mongodb+srv:// URI names exactly one host".into());
        };
        if host.contains(':') {
            return Err(format!(
                "{host}: a mongodb+srv:// host has no port (the SRV records give each host's)"
            ));
        }
        if host.split('.').count() < 2 || host.split('.').any(str::is_empty) {
            return Err(format!(
                "{host}: a mongodb+srv:// host is a domain name of at least two labels"
            ));
        }
        if option("directConnection") == Some("true") {
            return Err("directConnection=true cannot be used with mongodb+srv://".into());
        }
        let max_hosts = match option("srvMaxHosts") {
            None => 0,
            Some(v) => v
                .parse::<usize>()
                .map_err(|_| format!("srvMaxHosts={v}: expected a number of hosts"))?,
        };
        if max_hosts > 0 && option("replicaSet").is_some() {
            return Err("srvMaxHosts cannot be used with replicaSet: a replica set's members are all needed to find its primary".into());
        }
        let service = option("srvServiceName").map_or_else(|| "mongodb".to_owned(), percent_decode);
        Ok(SrvName {
            host: host.to_ascii_lowercase(),
            service,
            max_hosts,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uri_hosts() {
        let a = ConnectionString::parse("mongodb://u:p@h1:1,h2/db?replicaSet=x").unwrap();
        assert_eq!(a.hosts, vec!["h1:1", "h2:27017"]);
        assert!(
            ConnectionString::parse("mongodb+srv://x").is_err(),
            "one label"
        );
        assert!(ConnectionString::parse("http://x").is_err());
        assert!(ConnectionString::parse("mongodb:///db").is_err());
        assert!(!a.tls.enabled);
    }

    #[test]
    fn tls_options_are_read_as_drivers_read_them() {
        let a = ConnectionString::parse(
            "mongodb://h/?tls=true&tlsCAFile=%2Fetc%2Fca.pem&tlsAllowInvalidHostnames=false",
        )
        .unwrap();
        assert_eq!(
            a.tls,
            TlsOptions {
                enabled: true,
                ca_file: Some("/etc/ca.pem".into()),
                cert_key_file: None,
                insecure: false,
            }
        );
        assert!(
            ConnectionString::parse("mongodb://h/?ssl=true")
                .unwrap()
                .tls
                .enabled
        );
        let implied = ConnectionString::parse("mongodb://h/?tlsCertificateKeyFile=/c.pem").unwrap();
        assert!(implied.tls.enabled);
        assert!(ConnectionString::parse("mongodb://h/?tls=false&tlsInsecure=true").is_err());
        assert!(ConnectionString::parse("mongodb://h/?tls=yes").is_err());
        assert!(ConnectionString::parse("mongodb://h/?tlsCertificateKeyFilePassword=x").is_err());
    }

    #[test]
    fn srv_uris_name_one_host_without_a_port_and_turn_tls_on() {
        let c = ConnectionString::parse(
            "mongodb+srv://u:p@Cluster0.Example.com/db?srvServiceName=mdb&srvMaxHosts=2",
        )
        .unwrap();
        assert_eq!(
            c.srv,
            Some(SrvName {
                host: "cluster0.example.com".into(),
                service: "mdb".into(),
                max_hosts: 2,
            })
        );
        assert!(c.hosts.is_empty(), "the hosts come from DNS");
        assert!(c.tls.enabled, "mongodb+srv:// turns TLS on by default");
        assert!(
            !ConnectionString::parse("mongodb+srv://c.example.com/?tls=false")
                .unwrap()
                .tls
                .enabled
        );
        for (uri, named) in [
            (
                "mongodb+srv://a.example.com,b.example.com",
                "exactly one host",
            ),
            ("mongodb+srv://c.example.com:27017", "has no port"),
            ("mongodb+srv://localhost", "at least two labels"),
            (
                "mongodb+srv://c.example.com/?directConnection=true",
                "directConnection=true",
            ),
            (
                "mongodb+srv://c.example.com/?srvMaxHosts=1&replicaSet=rs0",
                "srvMaxHosts cannot be used with replicaSet",
            ),
            (
                "mongodb+srv://c.example.com/?srvMaxHosts=x",
                "srvMaxHosts=x",
            ),
            (
                "mongodb://h/?srvServiceName=x",
                "srvServiceName and srvMaxHosts belong",
            ),
        ] {
            let err = ConnectionString::parse(uri).unwrap_err();
            assert!(err.contains(named), "{uri}: {err}");
        }
    }

    #[test]
    fn every_option_is_honoured_or_refused_by_name() {
        let ok = "mongodb://u:p@h/db?authSource=admin&appName=x&replicaSet=rs0&w=majority&retryWrites=true&maxPoolSize=5&readPreference=primary&tlsDisableOCSPEndpointCheck=true";
        ConnectionString::parse(ok).unwrap();
        for (uri, named) in [
            (
                "mongodb://h/?compressors=zstd",
                "compressors: set upstream_compressors",
            ),
            (
                "mongodb://h/?connectTimeoutMS=5",
                "connectTimeoutMS: set connect_timeout_ms",
            ),
            (
                "mongodb://h/?loadBalanced=true",
                "loadBalanced: load-balanced mode",
            ),
            ("mongodb://h/?proxyHost=socks", "proxyHost: a SOCKS5 proxy"),
            (
                "mongodb://h/?readPrefrence=secondary",
                "readPrefrence: not a connection string option",
            ),
        ] {
            let err = ConnectionString::parse(uri).unwrap_err();
            assert!(err.starts_with(named), "{uri}: {err}");
        }
        // Options are matched in any case, as drivers match them.
        assert_eq!(option_use("MAXPOOLSIZE"), Some(OptionUse::Own));
        assert_eq!(option_use("TLS"), Some(OptionUse::Everywhere));
    }
}
