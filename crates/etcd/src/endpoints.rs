//! `etcd://HOST:PORT,HOST:PORT`: how a user names an etcd cluster on the command line.

use std::fmt;

use crate::EtcdError;

/// The URL scheme `--store` and `--etcd` take.
pub const SCHEME: &str = "etcd://";

/// More members than any etcd cluster has (etcd recommends 3, 5 or 7): a longer list is
/// a mistake, not a cluster.
pub const MAX_ENDPOINTS: usize = 16;

/// The members of one etcd cluster, as `host:port` pairs (plain HTTP/2 gRPC).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoints {
    hosts: Vec<String>,
}

impl Endpoints {
    /// Parses `etcd://HOST:PORT[,HOST:PORT]...`. Every member needs a host and a port
    /// (etcd has no port a user could forget: 2379 is a convention, not a default we
    /// guess); IPv6 hosts go in brackets (`[::1]:2379`).
    pub fn parse(input: &str) -> Result<Endpoints, EtcdError> {
        let bad = |why: String| EtcdError::Endpoints { input: input.to_string(), why };
        let rest = input.strip_prefix(SCHEME).ok_or_else(|| bad(format!("must start with {SCHEME}")))?;
        if rest.is_empty() {
            return Err(bad("names no member (etcd://HOST:PORT,...)".into()));
        }
        let mut hosts = Vec::new();
        for member in rest.split(',') {
            let member = member.trim();
            if member.is_empty() {
                return Err(bad("has an empty member (a stray comma?)".into()));
            }
            let (host, port) =
                member.rsplit_once(':').ok_or_else(|| bad(format!("member {member:?} has no port (HOST:PORT)")))?;
            let port: u16 =
                port.parse().map_err(|_| bad(format!("member {member:?}: port {port:?} is not 1-65535")))?;
            if port == 0 {
                return Err(bad(format!("member {member:?}: port 0 names no server")));
            }
            let bare = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
            if bare.is_empty() {
                return Err(bad(format!("member {member:?} has no host")));
            }
            if bare.contains(':') && !host.starts_with('[') {
                return Err(bad(format!("member {member:?}: put an IPv6 address in brackets ([::1]:2379)")));
            }
            if !bare.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':')) {
                return Err(bad(format!("member {member:?}: host {host:?} has characters a host name cannot")));
            }
            hosts.push(format!("{host}:{port}"));
        }
        if hosts.len() > MAX_ENDPOINTS {
            return Err(bad(format!("names {} members; at most {MAX_ENDPOINTS}", hosts.len())));
        }
        Ok(Endpoints { hosts })
    }

    /// The members as `host:port`.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }

    /// The members as the URLs the etcd client dials.
    pub fn urls(&self) -> Vec<String> {
        self.hosts.iter().map(|h| format!("http://{h}")).collect()
    }
}

impl fmt::Display for Endpoints {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}", self.hosts.join(","))
    }
}

impl std::str::FromStr for Endpoints {
    type Err = EtcdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Endpoints::parse(s)
    }
}

/// Checks a key prefix (`--store-prefix`): absolute, no trailing slash, printable, so
/// keys built under it (`PREFIX/apps/APP/...`) are unambiguous.
pub fn check_prefix(prefix: &str) -> Result<(), EtcdError> {
    let bad = |why: &str| EtcdError::Prefix { prefix: prefix.to_string(), why: why.to_string() };
    if !prefix.starts_with('/') {
        return Err(bad("must start with '/'"));
    }
    if prefix.len() > 1 && prefix.ends_with('/') {
        return Err(bad("must not end with '/'"));
    }
    if prefix.len() > 200 {
        return Err(bad("is longer than 200 bytes"));
    }
    if prefix.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(bad("has whitespace or control characters"));
    }
    if prefix.contains("//") {
        return Err(bad("has an empty segment (//)"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_members() {
        let e = Endpoints::parse("etcd://127.0.0.1:2379,etcd-1.example:32379,[::1]:2379").unwrap();
        assert_eq!(e.hosts(), ["127.0.0.1:2379", "etcd-1.example:32379", "[::1]:2379"]);
        assert_eq!(e.urls()[0], "http://127.0.0.1:2379");
        assert_eq!(e.to_string(), "etcd://127.0.0.1:2379,etcd-1.example:32379,[::1]:2379");
        assert_eq!(Endpoints::parse(&e.to_string()).unwrap(), e);
    }

    #[test]
    fn refuses_bad_lists_with_a_reason() {
        for (input, says) in [
            ("127.0.0.1:2379", "must start with etcd://"),
            ("http://127.0.0.1:2379", "must start with etcd://"),
            ("etcd://", "names no member"),
            ("etcd://a:1,", "empty member"),
            ("etcd://localhost", "has no port"),
            ("etcd://localhost:99999", "is not 1-65535"),
            ("etcd://localhost:x", "is not 1-65535"),
            ("etcd://localhost:0", "port 0"),
            ("etcd://:2379", "has no host"),
            ("etcd://::1:2379", "brackets"),
            ("etcd://a b:2379", "characters"),
            ("etcd://a/b:2379", "characters"),
        ] {
            let e = Endpoints::parse(input).unwrap_err().to_string();
            assert!(e.contains(says), "{input}: {e}");
        }
        let many = format!("etcd://{}", vec!["h:1"; MAX_ENDPOINTS + 1].join(","));
        assert!(Endpoints::parse(&many).unwrap_err().to_string().contains("at most"));
    }

    #[test]
    fn checks_prefixes() {
        check_prefix("/flotilla").unwrap();
        check_prefix("/").unwrap();
        check_prefix("/team-a/flotilla").unwrap();
        for bad in ["flotilla", "/flotilla/", "/a//b", "/a b", ""] {
            assert!(check_prefix(bad).is_err(), "{bad:?}");
        }
    }
}
