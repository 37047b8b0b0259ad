//! Which `Host` names the API answers to. A page on another site can make a browser
//! send requests here under the site's own name by re-pointing that name's DNS at this
//! address (DNS rebinding); it then reads what unauthenticated GETs show. Such a request
//! carries the attacker's name, so a name nobody allowed is refused, unless the request
//! carries the API token (a rebinding page does not have it).
//!
//! Allowed without configuration, because no outside party can own them: an IP address
//! (v4 or v6, any port), a single-label name (`flotilla-control`, a Kubernetes Service's
//! short name), `localhost` and names under `.localhost`, `.local` and `.internal`
//! (`svc.cluster.local`, `*.internal` reserved for private use). Everything else is
//! named with `--allowed-host` (`*.example.com` for a whole domain, `*` for any), and
//! a scheduler's `--advertise-url` host is added for it.

use std::net::IpAddr;

/// The names the API answers to beyond those always allowed.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts {
    /// Lowercase names, or `.suffix` for `*.suffix`.
    names: Vec<String>,
    any: bool,
}

impl AllowedHosts {
    /// From `--allowed-host` values (names, `*.domain`, or `*`).
    pub fn new<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Result<Self, String> {
        let mut out = AllowedHosts::default();
        for n in names {
            let n = n.as_ref().trim().to_ascii_lowercase();
            if n == "*" {
                out.any = true;
                continue;
            }
            let bare = n.strip_prefix("*.").unwrap_or(&n);
            let valid = !bare.is_empty()
                && bare.len() <= 253
                && bare.split('.').all(|l| {
                    !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                });
            if !valid {
                return Err(format!("--allowed-host {n:?}: a host name, *.domain or *"));
            }
            out.names.push(if n.starts_with("*.") { n[1..].to_string() } else { n });
        }
        Ok(out)
    }

    /// Adds the host of `url` (a scheduler's advertised URL).
    pub fn add_url_host(&mut self, url: &str) {
        if let Ok(u) = reqwest::Url::parse(url)
            && let Some(h) = u.host_str()
        {
            self.names.push(h.trim_start_matches('[').trim_end_matches(']').to_ascii_lowercase());
        }
    }

    /// Whether a request with this `Host` header (none: HTTP/1.0) is answered.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let Some(host) = host else { return true };
        if self.any {
            return true;
        }
        let name = strip_port(host).trim_end_matches('.').to_ascii_lowercase();
        if name.parse::<IpAddr>().is_ok() || !name.contains('.') {
            return true;
        }
        const PRIVATE: [&str; 3] = [".localhost", ".local", ".internal"];
        if PRIVATE.iter().any(|s| name.ends_with(s)) {
            return true;
        }
        self.names.iter().any(|n| match n.strip_prefix('.') {
            Some(_) => name.ends_with(n.as_str()),
            None => *n == name,
        })
    }
}

/// `host:port`, `[v6]:port`, `[v6]`, a bare v6 address or a name, without the port.
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split_once(']').map_or(rest, |(ip, _)| ip);
    }
    match host.rsplit_once(':') {
        // A bare IPv6 address has more than one colon.
        Some((h, p)) if !h.contains(':') && p.bytes().all(|b| b.is_ascii_digit()) => h,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_names_no_outsider_can_own_are_always_allowed() {
        let a = AllowedHosts::default();
        for h in [
            "127.0.0.1:7700",
            "10.0.0.5",
            "[::1]:7700",
            "[fe80::1]",
            "::1",
            "localhost:7700",
            "flotilla-control",
            "x",
            "flotilla-control.flotilla.svc.cluster.local:7700",
            "app.localhost",
            "ctl.internal",
        ] {
            assert!(a.allows(Some(h)), "{h}");
        }
        assert!(a.allows(None), "HTTP/1.0 sends no Host");
        for h in ["evil.example.com", "evil.example.com:7700", "127.0.0.1.nip.io", "LOCALHOST.attacker.net"] {
            assert!(!a.allows(Some(h)), "{h}");
        }
    }

    #[test]
    fn names_given_are_allowed_exactly_or_by_domain() {
        let mut a = AllowedHosts::new(["Flotilla.Example.com", "*.corp.net"]).unwrap();
        a.add_url_host("https://sched-7.example.org:8443/x");
        for h in
            ["flotilla.example.com", "FLOTILLA.example.com:443", "a.corp.net", "b.a.corp.net", "sched-7.example.org"]
        {
            assert!(a.allows(Some(h)), "{h}");
        }
        for h in ["example.com", "x.flotilla.example.com", "corp.net", "evilcorp.net"] {
            assert!(!a.allows(Some(h)), "{h}");
        }
        assert!(AllowedHosts::new(["*"]).unwrap().allows(Some("anything.example")));
        for bad in ["", "a b", "http://x", "*.", "a..b", "*x.com"] {
            assert!(AllowedHosts::new([bad]).is_err(), "{bad:?}");
        }
    }
}
