//! Flotilla on etcd: naming a cluster (`etcd://HOST:PORT,...`), connecting with
//! timeouts, and leadership on a key with a fencing token (an app's active scheduler, a
//! shard's active process). The scheduler's etcd store builds on the same client.
//!
//! Every etcd request here runs under a timeout ([`within`]): etcd being down must turn
//! into an error the caller can report (`apps` shows it), never a hang.

mod endpoints;
mod lease;

use std::time::Duration;

pub use endpoints::{Endpoints, MAX_ENDPOINTS, SCHEME, check_prefix};
pub use etcd_client;
pub use etcd_client::Client;
pub use lease::{
    Campaign, Holder, Leadership, Lease, Waiting, campaign, keep_alive_interval, try_acquire, ttl_secs, wait_for_change,
};

/// The default key prefix (`--store-prefix`).
pub const DEFAULT_PREFIX: &str = "/flotilla";

/// How long one etcd request may take by default: longer than a healthy cluster ever
/// needs (a commit is a few milliseconds), shorter than a lease TTL, so a holder learns
/// etcd is gone while its lease still covers it.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("bad etcd endpoints {input:?}: {why}")]
    Endpoints { input: String, why: String },
    #[error("bad etcd key prefix {prefix:?}: {why}")]
    Prefix { prefix: String, why: String },
    #[error("etcd: {0}")]
    Client(#[from] etcd_client::Error),
    #[error("etcd: {what} timed out after {after:?} (is etcd reachable?)")]
    Timeout { what: &'static str, after: Duration },
    #[error("etcd: {0}")]
    Other(String),
}

/// Runs one etcd request with a deadline, naming it in the error.
pub async fn within<T>(
    limit: Duration,
    what: &'static str,
    f: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(EtcdError::from),
        Err(_) => Err(EtcdError::Timeout { what, after: limit }),
    }
}

/// A client for `endpoints`. Connecting is lazy (gRPC channels dial on first use), so
/// this succeeds while etcd is down and the first request says why it failed; HTTP/2
/// keep-alives notice a dead connection within `timeout`.
pub async fn connect(endpoints: &Endpoints, timeout: Duration) -> Result<Client, EtcdError> {
    let opts = etcd_client::ConnectOptions::new()
        .with_connect_timeout(timeout)
        .with_keep_alive(Duration::from_secs(2), timeout)
        .with_keep_alive_while_idle(true);
    within(timeout + Duration::from_secs(1), "connecting", Client::connect(endpoints.urls(), Some(opts))).await
}

/// `PREFIX/rest`, with exactly one slash between them (a prefix of `/` gives `/rest`).
pub fn key(prefix: &str, rest: &str) -> String {
    format!("{}/{}", prefix.trim_end_matches('/'), rest.trim_start_matches('/'))
}

/// The key an app's active scheduler holds: `PREFIX/apps/APP/leader`.
pub fn scheduler_leader_key(prefix: &str, app: &str) -> String {
    key(prefix, &format!("apps/{app}/leader"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_join_with_one_slash() {
        assert_eq!(key("/flotilla", "apps/a/leader"), "/flotilla/apps/a/leader");
        assert_eq!(key("/", "apps"), "/apps");
        assert_eq!(scheduler_leader_key("/x", "echo"), "/x/apps/echo/leader");
    }
}
