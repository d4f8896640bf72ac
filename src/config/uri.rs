//! Connection strings: the hosts an upstream URI names.

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
