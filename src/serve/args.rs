//! Argument groups more than one server shares: how a process serves HTTP, how it
//! reaches the shards, and the shards' liveness settings.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use flotilla_aggregator::{ShardConfig, Timeouts, TlsMaterial};
use flotilla_proto::dial::Dialer;

use super::tokens::{grpc_caller_token_file, reload_tokens};
use crate::cli::http::parse_duration;
use crate::secrets::DataDir;

/// How a process serves its HTTP API, and whom it trusts when it calls another's.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Serve the HTTP API over HTTPS with this certificate chain (PEM); with --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Requests per second one peer address may make to the HTTP API, in bursts of up to
    /// twice that; 0 turns the limit off.
    #[arg(long, default_value_t = 200)]
    pub rate_limit: u32,
    /// PEM file with the CA certificate(s) to trust when calling another process's HTTPS API
    /// (a standalone scheduler's, or the control plane's).
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
    /// A `Host` name the HTTP API answers to, besides IP addresses, single-label names and
    /// names under .localhost, .local and .internal: the name users reach it by (repeat, or
    /// comma-separated; `*.example.com` for a domain, `*` for any). Other names are refused
    /// unless the request carries the API token: a page re-pointing its own name at this
    /// address (DNS rebinding) reads nothing.
    #[arg(long = "allowed-host", value_name = "NAME", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
}

impl HttpArgs {
    pub fn options(&self) -> anyhow::Result<flotilla_control::HttpOptions> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let m = TlsMaterial::load(cert, key)?;
                Some(
                    flotilla_control::tls_config(m.certs, m.key)
                        .with_context(|| format!("--tls-cert {} with --tls-key {}", cert.display(), key.display()))?,
                )
            }
            (None, None) => None,
            _ => bail!("--tls-cert and --tls-key go together"),
        };
        let allowed_hosts =
            flotilla_control::hosts::AllowedHosts::new(&self.allowed_hosts).map_err(anyhow::Error::msg)?;
        Ok(flotilla_control::HttpOptions { tls, rate_limit: self.rate_limit, allowed_hosts, ..Default::default() })
    }

    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        crate::cli::http::http_client(self.ca.as_deref())
    }
}

/// One `--aggregators` entry: `host:port` or a URL, with `|` between a shard's
/// alternates. An empty one (`a,,b`, a trailing comma) is refused here rather than
/// followed for ever as a shard that never answers.
pub fn parse_shard_address(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        return Err("an empty shard address (a trailing or doubled comma?)".into());
    }
    for alt in s.split('|') {
        let alt = alt.trim();
        let host_port = alt.split_once("://").map_or(alt, |(_, rest)| rest);
        let port = host_port.rsplit_once(':').map(|(h, p)| (h, p.trim_end_matches('/')));
        match port {
            Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0) => {}
            _ => return Err(format!("{alt:?} is not host:port (or a URL with a port)")),
        }
    }
    Ok(s.trim().to_string())
}

/// How a process reaches the shards' gRPC services (commit, watch, admin).
#[derive(Debug, Clone, Args)]
pub struct ShardClientArgs {
    /// File whose first line is the shards' gRPC bearer token (default: DATA/grpc-token
    /// when it exists; DATA is $FLOTILLA_DATA, else ./.flotilla).
    #[arg(long)]
    pub grpc_token_file: Option<PathBuf>,
    /// PEM file with the CA that signs the shards' gRPC certificates: speak TLS to them.
    #[arg(long, env = "FLOTILLA_GRPC_CA")]
    pub grpc_ca: Option<PathBuf>,
}

impl ShardClientArgs {
    /// The dialer of a server (control plane, scheduler): it carries the first token of
    /// the token file, and follows the file (every 10 s and on SIGHUP) so a rotation
    /// needs no restart.
    pub fn dialer(&self) -> anyhow::Result<Dialer> {
        let file = self.grpc_token_file.clone().or_else(|| {
            let default = crate::cli::http::data_dir().join("grpc-token");
            default.exists().then_some(default)
        });
        let mut dialer = Dialer::network().on_io_thread();
        if let Some(file) = file {
            let tokens = crate::secrets::read_tokens(&file)?;
            let token = tokens.first().ok_or_else(|| anyhow::anyhow!("{} holds no token", file.display()))?;
            dialer = dialer.with_token(token).with_context(|| format!("the token in {}", file.display()))?;
            reload_tokens(grpc_caller_token_file(file, tokens, dialer.clone()))?;
        }
        if let Some(ca) = &self.grpc_ca {
            dialer = dialer.with_ca(std::fs::read(ca).with_context(|| format!("reading --grpc-ca {}", ca.display()))?);
        }
        Ok(dialer)
    }
}

/// Shard settings shared by `up` and `aggregator`: liveness, batching, request rates.
#[derive(Debug, Clone, Args)]
pub struct LivenessArgs {
    /// Silence after which a node is Suspect.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub suspect_after: Duration,
    /// Silence after which a node is Dead.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub dead_after: Duration,
    /// How long a Dead node stays in the view.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub dead_retention: Duration,
    /// When at least this fraction of a failure domain (of 3 nodes or more) is silent,
    /// its silent nodes go Unknown instead of Dead: a partition, not deaths, whose work
    /// schedulers wait for (`--unknown-grace`) before replacing it. Above 1: never.
    #[arg(long, default_value_t = flotilla_aggregator::silence::DEFAULT_THRESHOLD)]
    pub partition_threshold: f64,
    /// Longest wait before a change is published as a new view version (at most 50ms).
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    pub batch_window: Duration,
    /// gRPC requests (commits, watches, releases) one peer address may make to a shard
    /// per second, in bursts of twice that; 0 turns the limit off.
    #[arg(long, default_value_t = 10_000)]
    pub grpc_rate_limit: u32,
}

impl LivenessArgs {
    pub fn timeouts(&self) -> anyhow::Result<Timeouts> {
        if self.suspect_after.is_zero() || self.dead_after <= self.suspect_after {
            bail!(
                "--dead-after ({:?}) must be longer than --suspect-after ({:?}), both above 0",
                self.dead_after,
                self.suspect_after
            );
        }
        if self.batch_window > Duration::from_millis(50) {
            bail!("--batch-window must be at most 50ms");
        }
        Ok(Timeouts {
            suspect_after_ms: self.suspect_after.as_millis() as u64,
            dead_after_ms: self.dead_after.as_millis() as u64,
            retention_ms: self.dead_retention.as_millis() as u64,
        })
    }

    pub fn shard_config(
        &self,
        listen: SocketAddr,
        shard: usize,
        shards: usize,
        data: &DataDir,
    ) -> anyhow::Result<ShardConfig> {
        let tls = TlsMaterial::load(&data.tls_cert, &data.tls_key)?;
        let mut c = ShardConfig::new(
            listen,
            shard,
            shards,
            data.shard_secret.as_bytes().to_vec(),
            data.join_tokens.clone(),
            tls,
        );
        c.grpc_tokens = data.grpc_tokens.clone();
        c.grpc_rate_limit = self.grpc_rate_limit;
        c.timeouts = self.timeouts()?;
        if self.partition_threshold.is_nan() || self.partition_threshold <= 0.0 {
            bail!("--partition-threshold must be above 0 (above 1 turns it off), not {}", self.partition_threshold);
        }
        c.partition_threshold = self.partition_threshold;
        c.batch_window = self.batch_window;
        Ok(c)
    }
}

/// Where the artifact origin keeps pushes for every control replica.
#[derive(Debug, Clone, Args)]
pub struct OriginUrlArgs {
    /// Keep pushed artifacts at this HTTP URL as well (`BASE/HEX` and `BASE/HEX.manifest`):
    /// any server that takes PUT and answers GET with Range (nginx's WebDAV, an
    /// S3-compatible bucket that allows the control plane's writes). A push succeeds once
    /// it is there; a replica that did not take it reads it from there.
    #[arg(long, value_name = "URL")]
    pub artifact_origin_url: Option<String>,
    /// A file holding the bearer token sent to --artifact-origin-url (read at start).
    #[arg(long, requires = "artifact_origin_url")]
    pub artifact_origin_token_file: Option<PathBuf>,
    /// PEM certificates to trust for an https:// --artifact-origin-url.
    #[arg(long, requires = "artifact_origin_url")]
    pub artifact_origin_ca: Option<PathBuf>,
}

impl OriginUrlArgs {
    pub fn remote(&self) -> anyhow::Result<Option<flotilla_control::artifact_remote::Remote>> {
        let Some(url) = &self.artifact_origin_url else { return Ok(None) };
        let token = match &self.artifact_origin_token_file {
            Some(f) => Some(
                crate::secrets::read_tokens(f)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("--artifact-origin-token-file {} holds no token", f.display()))?,
            ),
            None => None,
        };
        let ca = match &self.artifact_origin_ca {
            Some(f) => Some(std::fs::read(f).with_context(|| format!("--artifact-origin-ca {}", f.display()))?),
            None => None,
        };
        flotilla_control::artifact_remote::Remote::new(url, token, ca.as_deref()).map(Some)
    }
}
