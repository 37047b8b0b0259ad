//! An artifact's name is its content's sha256: the spec names what it trusts, so nothing
//! a peer or an origin says about the bytes has to be believed.

use std::fmt;

/// A sha256 digest.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest(pub [u8; 32]);

impl Digest {
    /// Parses 64 hex digits (either case), optionally after `sha256:`.
    pub fn parse(s: &str) -> Result<Digest, String> {
        let hex = s.strip_prefix("sha256:").unwrap_or(s);
        if hex.len() != 64 {
            return Err(format!("a sha256 is 64 hex digits, {s:?} has {}", hex.len()));
        }
        let mut out = [0u8; 32];
        for (i, pair) in hex.as_bytes().chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16);
            match (digit(pair[0]), digit(pair[1])) {
                (Some(h), Some(l)) => out[i] = (h * 16 + l) as u8,
                _ => return Err(format!("{s:?} is not hex")),
            }
        }
        Ok(Digest(out))
    }

    pub fn of(bytes: &[u8]) -> Digest {
        let d = ring::digest::digest(&ring::digest::SHA256, bytes);
        let mut out = [0u8; 32];
        out.copy_from_slice(d.as_ref());
        Digest(out)
    }

    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", &self.hex()[..12])
    }
}

/// A running sha256, for bytes that arrive in pieces.
pub struct Hasher(ring::digest::Context);

impl Default for Hasher {
    fn default() -> Self {
        Hasher(ring::digest::Context::new(&ring::digest::SHA256))
    }
}

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> Digest {
        let mut out = [0u8; 32];
        out.copy_from_slice(self.0.finish().as_ref());
        Digest(out)
    }
}

/// Where an artifact comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// `flotilla://sha256:HEX`: the cluster's origin (the control plane), which also
    /// serves the manifest, so every piece is checked as it arrives.
    Cluster(Digest),
    /// `http://…` or `https://…`: fetched from there; checked whole.
    Http(String),
}

pub const CLUSTER_SCHEME: &str = "flotilla://";

impl Source {
    pub fn parse(s: &str) -> Result<Source, String> {
        if let Some(rest) = s.strip_prefix(CLUSTER_SCHEME) {
            return Digest::parse(rest)
                .map(Source::Cluster)
                .map_err(|e| format!("{s:?}: a cluster artifact is flotilla://sha256:HEX ({e})"));
        }
        if let Some(rest) = s.strip_prefix("https://").or_else(|| s.strip_prefix("http://")) {
            if rest.is_empty() || rest.starts_with('/') || s.chars().any(char::is_whitespace) {
                return Err(format!("{s:?} is not a URL with a host"));
            }
            return Ok(Source::Http(s.to_string()));
        }
        Err(format!("{s:?}: a source is flotilla://sha256:HEX, http://… or https://…"))
    }

    /// The name the artifact is kept under in a `dest` directory: the URL's last path
    /// segment, or `sha256-HEX` for a cluster artifact.
    pub fn file_name(&self, digest: &Digest) -> String {
        let from_url = match self {
            Source::Http(url) => url.split(['?', '#']).next().and_then(|u| u.rsplit('/').next()),
            Source::Cluster(_) => None,
        };
        match from_url.filter(|n| !n.is_empty() && *n != "." && *n != "..") {
            Some(n) => n.to_string(),
            None => format!("sha256-{}", digest.hex()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_round_trip_and_bad_ones_say_why() {
        let d = Digest::of(b"hello");
        assert_eq!(d.hex(), "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824");
        assert_eq!(Digest::parse(&d.to_string()).unwrap(), d);
        assert_eq!(Digest::parse(&d.hex().to_uppercase()).unwrap(), d);
        assert!(Digest::parse("abc").unwrap_err().contains("64 hex digits"));
        assert!(Digest::parse(&"g".repeat(64)).unwrap_err().contains("not hex"));
        let mut h = Hasher::default();
        h.update(b"hel");
        h.update(b"lo");
        assert_eq!(h.finish(), d);
    }

    #[test]
    fn sources_parse_and_name_their_file() {
        let d = Digest::of(b"x");
        assert_eq!(Source::parse(&format!("flotilla://{d}")).unwrap(), Source::Cluster(d));
        let http = Source::parse("https://example.com/models/m.tar.gz?sig=1").unwrap();
        assert_eq!(http.file_name(&d), "m.tar.gz");
        assert_eq!(Source::Cluster(d).file_name(&d), format!("sha256-{}", d.hex()));
        assert_eq!(Source::parse("https://h/").unwrap().file_name(&d), format!("sha256-{}", d.hex()));
        for bad in ["ftp://x/y", "flotilla://md5:00", "https://", "http:///x", "https://a b"] {
            assert!(Source::parse(bad).is_err(), "{bad}");
        }
    }
}
