//! The origin's bytes kept at an HTTP URL (`--artifact-origin-url`): any server that
//! takes `PUT` and answers `GET` with `Range` (nginx's WebDAV, an S3-compatible bucket
//! that allows the control plane's writes). A push is stored here as before, and
//! uploaded there as `BASE/HEX` with its manifest as `BASE/HEX.manifest`; a replica that
//! did not take the push reads both from there and passes them on through its own
//! origin rate. So every control replica serves every pushed artifact, and the bytes
//! outlive the control plane's disk.
//!
//! What the URL answers is input from the network: a manifest is bounded and decoded, a
//! read must be the range asked for, and errors name the status, not the URL (artifact
//! reads need no token, and the URL is the operator's).

use std::path::Path;
use std::time::Duration;

use flotilla_artifact::Digest;
use flotilla_artifact::manifest::{MAX_PIECES, Manifest};
use futures_util::StreamExt;

use crate::catalogue as m;

/// How long an upload may take, at most, per GiB (and a minute at least).
const UPLOAD_PER_GIB: Duration = Duration::from_secs(120);
/// How long a read may wait for the origin's first byte.
const READ_WAIT: Duration = Duration::from_secs(30);

pub struct Remote {
    /// Ends with `/`.
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

/// What a read of the URL gave.
pub enum Read {
    /// The answer carrying the bytes asked for (the range, or the whole).
    Bytes(reqwest::Response),
    /// It does not hold the artifact.
    Missing,
}

impl Remote {
    /// `ca`: PEM certificates to trust for an `https://` URL (this build carries no
    /// public roots, like every client of Flotilla's).
    pub fn new(url: &str, token: Option<String>, ca: Option<&[u8]>) -> anyhow::Result<Remote> {
        let bad = |why: &str| anyhow::anyhow!("--artifact-origin-url {url:?}: {why}");
        let parsed = reqwest::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(bad("not an http:// or https:// URL"));
        }
        if parsed.query().is_some()
            || parsed.fragment().is_some()
            || !parsed.username().is_empty()
            || parsed.password().is_some()
        {
            return Err(bad(
                "a URL without a query, a fragment or a user (a token goes in --artifact-origin-token-file)",
            ));
        }
        let mut client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .redirect(reqwest::redirect::Policy::none());
        match (parsed.scheme(), ca) {
            ("https", None) => return Err(bad("https:// needs --artifact-origin-ca")),
            (_, Some(pem)) => {
                let certs = reqwest::Certificate::from_pem_bundle(pem)
                    .map_err(|e| anyhow::anyhow!("--artifact-origin-ca: {e}"))?;
                anyhow::ensure!(!certs.is_empty(), "--artifact-origin-ca holds no PEM certificate");
                for cert in certs {
                    client = client.add_root_certificate(cert);
                }
            }
            _ => {}
        }
        let url = parsed.as_str();
        let base = if url.ends_with('/') { url.to_string() } else { format!("{url}/") };
        Ok(Remote { base, http: client.build()?, token })
    }

    fn url(&self, d: &Digest, suffix: &str) -> String {
        format!("{}{}{suffix}", self.base, d.hex())
    }

    fn request(&self, method: reqwest::Method, url: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, url);
        match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    /// Uploads the whole at `blob` and its manifest; the manifest last, so a reader that
    /// finds it finds the bytes too.
    pub async fn upload(&self, d: &Digest, blob: &Path, manifest: &Manifest) -> Result<(), String> {
        let result = async {
            let file = tokio::fs::File::open(blob).await.map_err(|e| format!("{}: {e}", blob.display()))?;
            let size = file.metadata().await.map_err(|e| e.to_string())?.len();
            let timeout = UPLOAD_PER_GIB.saturating_mul((size >> 30) as u32 + 1).max(Duration::from_secs(60));
            let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(file));
            let put =
                self.request(reqwest::Method::PUT, &self.url(d, "")).header(reqwest::header::CONTENT_LENGTH, size);
            success(put.body(body).timeout(timeout).send().await, "taking the bytes")?;
            let put = self.request(reqwest::Method::PUT, &self.url(d, ".manifest"));
            success(put.body(manifest.encode()).timeout(READ_WAIT).send().await, "taking the manifest")
        }
        .await;
        count("upload", if result.is_ok() { "ok" } else { "error" });
        if let Err(e) = &result {
            tracing::warn!(artifact = %d, url = %self.base, error = %e, "the origin URL did not take a push");
        }
        result
    }

    /// The manifest of `d`, if the URL holds it (read to a bound, and decoded).
    pub async fn manifest(&self, d: &Digest) -> Result<Option<Manifest>, String> {
        let result = async {
            let resp = self.request(reqwest::Method::GET, &self.url(d, ".manifest")).timeout(READ_WAIT).send().await;
            let resp = match resp.map_err(describe)? {
                r if r.status() == reqwest::StatusCode::NOT_FOUND => return Ok(None),
                r if r.status() != reqwest::StatusCode::OK => return Err(format!("answered {}", r.status())),
                r => r,
            };
            let max = MAX_PIECES as usize * 32 + 64;
            let (mut body, mut stream) = (Vec::new(), resp.bytes_stream());
            while let Some(chunk) = stream.next().await {
                body.extend_from_slice(&chunk.map_err(describe)?);
                if body.len() > max {
                    return Err(format!("sent a manifest of more than {max} bytes"));
                }
            }
            Manifest::decode(&body).map(Some).map_err(|e| format!("sent a bad manifest: {e}"))
        }
        .await;
        count("manifest", outcome(&result.as_ref().map(Option::is_some)));
        result
    }

    /// Bytes `range` (inclusive) of `d`, whose size is `size`, or the whole; the answer
    /// must be what was asked.
    pub async fn read(&self, d: &Digest, size: u64, range: Option<(u64, u64)>) -> Result<Read, String> {
        let mut req = self.request(reqwest::Method::GET, &self.url(d, ""));
        if let Some((a, b)) = range {
            req = req.header(reqwest::header::RANGE, format!("bytes={a}-{b}"));
        }
        let result = async {
            let resp = match tokio::time::timeout(READ_WAIT, req.send()).await {
                Ok(r) => r.map_err(describe)?,
                Err(_) => return Err(format!("did not answer within {READ_WAIT:?}")),
            };
            let status = resp.status();
            if status == reqwest::StatusCode::NOT_FOUND {
                return Ok(Read::Missing);
            }
            let content_range = resp.headers().get(reqwest::header::CONTENT_RANGE).and_then(|v| v.to_str().ok());
            let as_asked = match range {
                Some((a, b)) => {
                    status == reqwest::StatusCode::PARTIAL_CONTENT
                        && content_range.is_some_and(|c| c == format!("bytes {a}-{b}/{size}"))
                }
                None => status == reqwest::StatusCode::OK,
            };
            if !as_asked {
                return Err(format!("answered {status} {}, not the bytes asked for", content_range.unwrap_or("")));
            }
            Ok(Read::Bytes(resp))
        }
        .await;
        count("read", outcome(&result.as_ref().map(|r| matches!(r, Read::Bytes(_)))));
        if let Err(e) = &result {
            tracing::warn!(artifact = %d, url = %self.base, error = %e, "a read of the origin URL failed");
        }
        result
    }
}

/// A request error without its URL (for answers); the whole of it goes to the log.
fn describe(e: reqwest::Error) -> String {
    tracing::warn!(error = ?e, "a request to the origin URL failed");
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "refused the connection".into()
    } else {
        e.without_url().to_string()
    }
}

fn success(resp: reqwest::Result<reqwest::Response>, what: &str) -> Result<(), String> {
    let resp = resp.map_err(|e| format!("{what}: {}", describe(e)))?;
    if resp.status().is_success() { Ok(()) } else { Err(format!("{what}: answered {}", resp.status())) }
}

fn outcome(found: &Result<bool, &String>) -> &'static str {
    match found {
        Ok(true) => "ok",
        Ok(false) => "missing",
        Err(_) => "error",
    }
}

fn count(op: &'static str, outcome: &'static str) {
    metrics::counter!(m::ORIGIN_REMOTE.name, "op" => op, "result" => outcome).increment(1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_origin_url_that_would_lose_or_leak_something_is_refused() {
        let refused = |url: &str| Remote::new(url, None, None).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(Remote::new("http://store:9000/artifacts", None, None).is_ok());
        assert!(refused("ftp://store/a").contains("not an http:// or https:// URL"));
        assert!(refused("http://store/a#x").contains("without a query, a fragment or a user"));
        assert!(refused("http://me:secret@store/a").contains("without a query, a fragment or a user"));
        assert!(refused("http://:secret@store/a").contains("without a query, a fragment or a user"));
        let ca = |pem: &[u8]| Remote::new("https://store/a", None, Some(pem)).err().map(|e| e.to_string());
        assert!(ca(b"not a certificate").unwrap_or_default().contains("no PEM certificate"));
        assert!(refused("https://store/a").contains("https:// needs --artifact-origin-ca"));
    }
}
