//! Where instances come from. A provider launches, lists and terminates instances by id;
//! the id is the idempotency key: a provider tags what it launches with it and lists it
//! back, so a restarted autoscaler finds its instances again and a repeated launch or
//! terminate of one id does no harm.
//!
//! - [`local`]: `flotilla agent` processes on this machine;
//! - [`exec`]: user commands (any cloud CLI, a Kubernetes node-group tool), by the
//!   protocol in `docs/exec-provider.md`.
//!
//! Every call is counted in `flotilla_pool_provider_calls_total{provider,op,outcome}`,
//! timed in `flotilla_pool_provider_call_seconds{provider,op}` and runs in a tracing span.

use crate::catalogue as m;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tracing::Instrument;

pub mod exec;
pub mod local;

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What to launch: one node of `node_type`, offering `resources`, labelled `labels`, whose
/// agent registers as node `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchSpec {
    pub id: String,
    pub node_type: String,
    pub resources: flotilla_core::Resources,
    pub labels: BTreeMap<String, String>,
    /// For a warm pool: the agent registers cordoned (`flotilla agent --cordoned`).
    pub cordoned: bool,
}

/// One instance the provider lists.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloudInstance {
    pub id: String,
    pub node_type: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("{command}: could not start: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("{command}: exited with {status}{}", stderr_suffix(.stderr))]
    Exit { command: String, status: String, stderr: String },
    #[error("{command}: no answer within {after:?}; killed")]
    Timeout { command: String, after: Duration },
    #[error("{command}: printed more than {limit} bytes on stdout")]
    Oversized { command: String, limit: usize },
    #[error("{command}: unreadable output: {detail}")]
    BadOutput { command: String, detail: String },
    #[error("{what}: {source}")]
    Io { what: String, source: std::io::Error },
    #[error("provider misconfigured: {0}")]
    Config(String),
    #[error("launch spec for {id} refused: {detail}")]
    BadSpec { id: String, detail: String },
}

fn stderr_suffix(stderr: &str) -> String {
    if stderr.is_empty() { String::new() } else { format!("; stderr: {stderr}") }
}

/// The provider interface the pool driver calls.
pub trait InstanceProvider: Send + Sync {
    fn name(&self) -> &'static str;
    /// Every instance that exists now (launched or adopted, not yet gone).
    fn list(&self) -> BoxFuture<'_, Result<Vec<CloudInstance>, ProviderError>>;
    /// Start launching `spec`. Ok means accepted, not running: the instance shows up in a
    /// later `list`. Launching an id that exists is a no-op.
    fn launch<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<(), ProviderError>>;
    /// Start terminating `id`. Ok means accepted; the instance leaves `list` later.
    /// Terminating an unknown id is a no-op.
    fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>>;
}

/// Runs one provider call in a span, counting and timing it.
pub(crate) async fn observed<T>(
    provider: &'static str,
    op: &'static str,
    id: Option<&str>,
    fut: impl Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    let span = tracing::info_span!("provider_call", provider, op, instance = id.unwrap_or(""));
    let start = Instant::now();
    let result = fut.instrument(span.clone()).await;
    let outcome = if result.is_ok() { "ok" } else { "error" };
    metrics::counter!(m::PROVIDER_CALLS.name, "provider" => provider, "op" => op, "outcome" => outcome).increment(1);
    metrics::histogram!(m::PROVIDER_CALL_SECONDS.name, "provider" => provider, "op" => op)
        .record(start.elapsed().as_secs_f64());
    if let Err(e) = &result {
        span.in_scope(|| tracing::warn!(error = %e, "provider call failed"));
    }
    result
}

/// An id a provider will put on a command line, in a file name and in an environment
/// variable: a node id (`[A-Za-z0-9._-]`, at most 128 bytes), not `.` or `..`.
pub(crate) fn check_id(id: &str) -> Result<(), ProviderError> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id != "."
        && id != ".."
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(ProviderError::BadSpec {
            id: id.to_string(),
            detail: "not a node id ([A-Za-z0-9._-], 1..=128 bytes)".into(),
        })
    }
}
