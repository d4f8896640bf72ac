//! Connection strings: the hosts an upstream URI names, and its TLS options.

use std::path::PathBuf;

/// The hosts named by a `mongodb://` URI, and its TLS options.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConnectionString {
    pub hosts: Vec<String>,
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

impl TlsOptions {
    /// Reads the TLS options of a URI's query (`a=1&b=2`).
    fn parse(query: &str) -> Result<TlsOptions, String> {
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
            None => implied,
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

impl ConnectionString {
    /// Parses `mongodb://[user:pass@]host[:port][,host…][/db][?options]`.
    /// Credentials and options are the driver's business, not the proxy's:
    /// authentication passes through the proxy unchanged.
    pub fn parse(uri: &str) -> Result<ConnectionString, String> {
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
        let query = rest.split_once('?').map_or("", |(_, q)| q);
        let heartbeat_ms = query
            .split('&')
            .filter_map(|p| p.split_once('='))
            .find(|(k, _)| k.eq_ignore_ascii_case("heartbeatFrequencyMS"))
            .map(|(_, v)| {
                v.parse::<u64>()
                    .ok()
                    .filter(|&ms| ms >= 500)
                    .ok_or_else(|| {
                        format!("heartbeatFrequencyMS={v}: expected milliseconds, at least 500")
                    })
            })
            .transpose()?;
        Ok(ConnectionString {
            hosts,
            tls: TlsOptions::parse(query)?,
            heartbeat_ms,
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
        assert!(ConnectionString::parse("mongodb+srv://x").is_err());
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
}
