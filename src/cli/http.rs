//! How client commands reach the control plane: `$FLOTILLA_ADDR` (`https://` when it
//! serves HTTPS, trusting the CA in `--ca` / `$FLOTILLA_CA`; without a scheme, `http://`
//! is assumed), the API token for mutating calls, and its refusals as [`Refused`].

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

pub use flotilla_agent::config::parse_duration;

pub const DEFAULT_ADDR: &str = "http://127.0.0.1:7700";

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The control plane's address (`http://` is assumed when it has no scheme).
    #[arg(long, env = "FLOTILLA_ADDR", default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// PEM file with the CA certificate(s) that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
}

/// The control plane's base URL from `--addr` / `$FLOTILLA_ADDR`: `127.0.0.1:7700`
/// means `http://127.0.0.1:7700` (as `up` prints it, but without the scheme people
/// leave off); anything that is still no URL is named in the error.
pub fn base_url(addr: &str) -> anyhow::Result<String> {
    let addr = addr.trim();
    let with_scheme = if addr.contains("://") { addr.to_string() } else { format!("http://{addr}") };
    let url = reqwest::Url::parse(&with_scheme).map_err(|e| {
        anyhow::anyhow!(
            "the control plane address {addr:?} (--addr or $FLOTILLA_ADDR) is not a URL like http://127.0.0.1:7700: {e}"
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        bail!(
            "the control plane address {addr:?} (--addr or $FLOTILLA_ADDR) is not an http:// or https:// URL with a host"
        );
    }
    Ok(with_scheme.trim_end_matches('/').to_string())
}

/// An HTTP client that also trusts the certificates in `ca` (PEM) for HTTPS. Without
/// `ca` it trusts no certificate authority at all: plain HTTP only. It follows no
/// redirect: no Flotilla API sends one, and a control plane following a standalone
/// scheduler's would fetch whatever that scheduler points it at (a metadata service).
pub fn http_client(ca: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder().redirect(reqwest::redirect::Policy::none());
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading the CA file {}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("parsing the CA file {}", ca.display()))?;
        if certs.is_empty() {
            bail!("the CA file {} holds no PEM certificate", ca.display());
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().context("building the HTTP client")
}

/// The control plane as one command talks to it: its base URL and a client.
#[derive(Clone)]
pub struct Api {
    pub base: String,
    client: reqwest::Client,
}

impl Api {
    pub fn new(addr: &str, ca: Option<&Path>) -> anyhow::Result<Api> {
        Ok(Api { base: base_url(addr)?, client: http_client(ca)? })
    }

    fn read_request(&self, url: &str) -> reqwest::RequestBuilder {
        let req = self.client.get(url);
        // Reads need no token, but with one a control plane reached by a name it was not
        // given (`--allowed-host`) answers too (the token proves no web page sent it), and
        // a token limited to some apps reads those.
        match std::env::var("FLOTILLA_TOKEN").ok().filter(|t| !t.is_empty()).or_else(|| token_from_data().ok()) {
            Some(t) => req.bearer_auth(t),
            None => req,
        }
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        send(self.read_request(&url), &self.base).await.with_context(|| url.clone())
    }

    /// A GET whose answer is read as it comes (logs); a refusal is its error message.
    pub async fn open(&self, path: &str) -> anyhow::Result<reqwest::Response> {
        let url = format!("{}{path}", self.base);
        let resp = self
            .read_request(&url)
            .send()
            .await
            .with_context(|| format!("reaching the control plane at {} (set FLOTILLA_ADDR)", self.base))?;
        let status = resp.status();
        if !status.is_success() {
            let body: Value = resp.json().await.unwrap_or(Value::Null);
            let message = body.pointer("/error/message").and_then(Value::as_str).unwrap_or("no message").to_string();
            return Err(Refused { status, message }.into());
        }
        Ok(resp)
    }

    pub async fn write(
        &self,
        method: reqwest::Method,
        path: &str,
        token: &str,
        body: Option<Body>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.base);
        let req = self.client.request(method, &url).bearer_auth(token);
        let req = match body {
            Some(Body::Json(v)) => req.json(&v),
            Some(Body::Text(t)) => req.body(t),
            Some(Body::File(f)) => req
                .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
                .body(reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::new(f))),
            None => req,
        };
        send(req, &self.base).await
    }
}

pub async fn get(a: &ListArgs, path: &str) -> anyhow::Result<Value> {
    Api::new(&a.addr, a.ca.as_deref())?.get(path).await
}

/// The control plane answered with an error status (as opposed to not answering):
/// `--wait` gives up at once on a 4xx, where waiting cannot help.
#[derive(Debug)]
pub struct Refused {
    pub status: reqwest::StatusCode,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.status, self.message)
    }
}

impl std::error::Error for Refused {}

/// Sends a request to the control plane; its JSON answer, or its error message.
async fn send(req: reqwest::RequestBuilder, addr: &str) -> anyhow::Result<Value> {
    let hint = if addr.starts_with("https://") {
        " (set FLOTILLA_ADDR; for HTTPS, --ca or $FLOTILLA_CA names the CA that signed its certificate)"
    } else {
        " (set FLOTILLA_ADDR)"
    };
    let resp = req.send().await.with_context(|| format!("reaching the control plane at {addr}{hint}"))?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let message = body.pointer("/error/message").and_then(Value::as_str).unwrap_or("no message").to_string();
        return Err(Refused { status, message }.into());
    }
    Ok(body)
}

/// Prints `v` as pretty JSON on stdout.
pub fn print_json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// The token given on the command line or in `$FLOTILLA_TOKEN`, else the one in the data dir.
pub fn token(given: Option<String>) -> anyhow::Result<String> {
    match given {
        Some(t) => Ok(t),
        None => token_from_data().map_err(|e| {
            anyhow::anyhow!(
                "no API token: {e:#}. Set $FLOTILLA_TOKEN or --token, or $FLOTILLA_DATA to the data dir \
                 of the cluster (`flotilla up` writes DATA/api-token)"
            )
        }),
    }
}

/// `$FLOTILLA_DATA`, else `./.flotilla`.
pub fn data_dir() -> std::path::PathBuf {
    std::env::var_os("FLOTILLA_DATA").map(Into::into).unwrap_or_else(|| "./.flotilla".into())
}

/// The API token from `$FLOTILLA_DATA/api-token` (default data dir `./.flotilla`).
pub fn token_from_data() -> anyhow::Result<String> {
    let path = data_dir().join("api-token");
    let t = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?.trim().to_string();
    anyhow::ensure!(!t.is_empty(), "{} is empty", path.display());
    Ok(t)
}

/// Where a mutating command sends its request, and with which token.
#[derive(Debug, Args)]
pub struct WriteArgs {
    /// The control plane's address (`http://` is assumed when it has no scheme).
    #[arg(long, env = "FLOTILLA_ADDR", default_value = DEFAULT_ADDR)]
    pub addr: String,
    /// The API token (default: $FLOTILLA_TOKEN, else $FLOTILLA_DATA/api-token).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM file with the CA certificate(s) that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
    /// Print the control plane's answer as JSON.
    #[arg(long)]
    pub json: bool,
}

impl WriteArgs {
    pub fn api(&self) -> anyhow::Result<Api> {
        Api::new(&self.addr, self.ca.as_deref())
    }

    /// `PUT path` with the token and `body` (JSON or TOML text); the control plane's answer.
    pub async fn put(&self, path: &str, body: Body) -> anyhow::Result<Value> {
        let api = self.api()?;
        let token = token(self.token.clone())?;
        api.write(reqwest::Method::PUT, path, &token, Some(body)).await
    }
}

pub enum Body {
    Json(Value),
    Text(String),
    /// Streamed, never read into memory whole (`flotilla artifact push`).
    File(tokio::fs::File),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_without_a_scheme_are_http_and_bad_ones_are_named() {
        assert_eq!(base_url("127.0.0.1:7700").unwrap(), "http://127.0.0.1:7700");
        assert_eq!(base_url("https://cp.example:7700/").unwrap(), "https://cp.example:7700");
        assert_eq!(base_url("localhost:7700").unwrap(), "http://localhost:7700");
        let e = base_url("ftp://x").unwrap_err().to_string();
        assert!(e.contains("\"ftp://x\""), "{e}");
        let e = base_url("http://").unwrap_err().to_string();
        assert!(e.contains("\"http://\"") && e.contains("FLOTILLA_ADDR"), "{e}");
    }
}
