//! The origin's bytes kept at an HTTP URL (`--artifact-origin-url`): any server that
//! takes `PUT` and answers `GET` with `Range` (nginx's WebDAV, an S3-compatible bucket
//! that allows the control plane's writes). A push is stored here as before, and
//! uploaded there as `BASE/HEX` with its manifest as `BASE/HEX.manifest`; a replica that
//! did not take the push reads both from there and passes them on through its own
//! origin rate. So every control replica serves every pushed artifact, and the bytes
//! outlive the control plane's disk.

use std::path::Path;
use std::time::Duration;

use flotilla_artifact::Digest;
use flotilla_artifact::manifest::Manifest;

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

impl Remote {
    pub fn new(url: &str, token: Option<String>) -> anyhow::Result<Remote> {
        let parsed = reqwest::Url::parse(url).map_err(|e| anyhow::anyhow!("--artifact-origin-url {url:?}: {e}"))?;
        anyhow::ensure!(
            matches!(parsed.scheme(), "http" | "https") && parsed.query().is_none(),
            "--artifact-origin-url {url:?}: an http:// or https:// URL without a query"
        );
        let base = if url.ends_with('/') { url.to_string() } else { format!("{url}/") };
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build()?;
        Ok(Remote { base, http, token })
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
            let url = self.url(d, "");
            let put = self.request(reqwest::Method::PUT, &url).header(reqwest::header::CONTENT_LENGTH, size);
            check(put.body(body).timeout(timeout).send().await, &url)?;
            let url = self.url(d, ".manifest");
            let put = self.request(reqwest::Method::PUT, &url).body(manifest.encode()).timeout(READ_WAIT);
            check(put.send().await, &url)
        }
        .await;
        count("upload", &result.as_ref().map(|_| Some(())));
        result
    }

    /// The manifest of `d`, if the origin holds it (checked: it is input from the network).
    pub async fn manifest(&self, d: &Digest) -> Result<Option<Manifest>, String> {
        let url = self.url(d, ".manifest");
        let result = async {
            let resp = self.request(reqwest::Method::GET, &url).timeout(READ_WAIT).send().await;
            let Some(resp) = found(resp.map_err(|e| format!("{url}: {e}")), &url)? else { return Ok(None) };
            let max = flotilla_artifact::manifest::MAX_PIECES as u64 * 32 + 64;
            if resp.content_length().is_some_and(|n| n > max) {
                return Err(format!("{url}: a manifest of more than {max} bytes"));
            }
            let bytes = resp.bytes().await.map_err(|e| format!("{url}: {e}"))?;
            Manifest::decode(&bytes).map(Some).map_err(|e| format!("{url}: {e}"))
        }
        .await;
        count("manifest", &result.as_ref().map(|m| m.as_ref().map(|_| ())));
        result
    }

    /// A read of `d` (the whole, or `range` as the agent asked it), if the origin holds it.
    pub async fn read(&self, d: &Digest, range: Option<&str>) -> Result<Option<reqwest::Response>, String> {
        let url = self.url(d, "");
        let mut req = self.request(reqwest::Method::GET, &url);
        if let Some(r) = range {
            req = req.header(reqwest::header::RANGE, r);
        }
        let sent = match tokio::time::timeout(READ_WAIT, req.send()).await {
            Ok(r) => r.map_err(|e| format!("{url}: {e}")),
            Err(_) => Err(format!("{url}: no answer within {READ_WAIT:?}")),
        };
        let result = found(sent, &url);
        count("read", &result.as_ref().map(|r| r.as_ref().map(|_| ())));
        result
    }
}

fn check(resp: reqwest::Result<reqwest::Response>, url: &str) -> Result<(), String> {
    let resp = resp.map_err(|e| format!("{url}: {e}"))?;
    if resp.status().is_success() { Ok(()) } else { Err(format!("{url}: answered {}", resp.status())) }
}

/// A success, `None` for 404, or why not.
fn found(resp: Result<reqwest::Response, String>, url: &str) -> Result<Option<reqwest::Response>, String> {
    let resp = resp?;
    match resp.status() {
        s if s.is_success() => Ok(Some(resp)),
        reqwest::StatusCode::NOT_FOUND => Ok(None),
        s => Err(format!("{url}: answered {s}")),
    }
}

fn count(op: &'static str, result: &Result<Option<()>, &String>) {
    let outcome = match result {
        Ok(Some(())) => "ok",
        Ok(None) => "missing",
        Err(_) => "error",
    };
    metrics::counter!(m::ORIGIN_REMOTE.name, "op" => op, "result" => outcome).increment(1);
}
