//! Control-plane replicas. With `flotilla control --store etcd://…` any number of control
//! processes behind one address give the same answers: what one of them is told
//! (scheduler registrations, named policies, pool floors, bounds and reports) goes to
//! etcd before it is answered, and every replica mirrors etcd's copy each second. So no
//! replica's memory is the only place a scheduler can be found.
//!
//! Registrations and pool reports are soft state: each carries an etcd lease as long as
//! the in-memory TTL it replaces, so a scheduler that stops registering drops out of every
//! replica at once. Policies, floors and bounds are kept until changed.
//!
//! Keys, under the store prefix:
//! - `control/schedulers/APP` → the scheduler's URL (lease);
//! - `control/policies/NAME` → the policy file (TOML);
//! - `control/pools/POOL/constraints`, `…/bounds` → JSON;
//! - `control/pools/POOL/report` → `{"at_unix_ms": …, "report": …}` (lease).

use crate::catalogue as m;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_etcd::etcd_client::{GetOptions, PutOptions};
use flotilla_etcd::{REQUEST_TIMEOUT, within};
use serde_json::Value;

use crate::{ControlError, ControlState};

/// How often a replica reloads etcd's copy: changes made through another replica show
/// within this long.
pub const MIRROR_EVERY: Duration = Duration::from_secs(1);
/// A standalone scheduler that stops re-registering is dropped after this long.
pub(crate) const REMOTE_TTL: Duration = Duration::from_secs(30);
/// A pool whose autoscaler stops reporting for this long shows as stale.
pub(crate) const STALE_AFTER: Duration = Duration::from_secs(60);

/// The shared part of the control plane's state, in etcd.
pub struct Replicas {
    client: flotilla_etcd::Client,
    /// `PREFIX/control/`, with its trailing slash.
    root: String,
}

/// One thing a replica was told, as it is kept in etcd.
pub(crate) enum Shared<'a> {
    Scheduler { app: &'a str, url: &'a str },
    Policy { name: &'a str, toml: &'a str },
    Constraints { pool: &'a str, json: String },
    Bounds { pool: &'a str, json: String },
    Report { pool: &'a str, json: String },
}

impl Shared<'_> {
    fn kind(&self) -> &'static str {
        match self {
            Shared::Scheduler { .. } => "scheduler",
            Shared::Policy { .. } => "policy",
            Shared::Constraints { .. } => "constraints",
            Shared::Bounds { .. } => "bounds",
            Shared::Report { .. } => "report",
        }
    }

    /// Its key under `control/`, its value, and its lease TTL when it is soft state.
    fn entry(&self) -> (String, String, Option<Duration>) {
        match self {
            Shared::Scheduler { app, url } => (format!("schedulers/{app}"), url.to_string(), Some(REMOTE_TTL)),
            Shared::Policy { name, toml } => (format!("policies/{name}"), toml.to_string(), None),
            Shared::Constraints { pool, json } => (format!("pools/{pool}/constraints"), json.clone(), None),
            Shared::Bounds { pool, json } => (format!("pools/{pool}/bounds"), json.clone(), None),
            Shared::Report { pool, json } => (format!("pools/{pool}/report"), json.clone(), Some(STALE_AFTER)),
        }
    }
}

/// etcd's copy, as one listing of `control/` reads it.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Mirror {
    pub schedulers: BTreeMap<String, String>,
    pub policies: Vec<String>,
    pub pools: BTreeMap<String, SharedPool>,
}

#[derive(Debug, Default, PartialEq)]
pub(crate) struct SharedPool {
    pub constraints: Option<Value>,
    pub bounds: Option<Value>,
    /// The last report and when it was made (unix ms).
    pub report: Option<(Value, u64)>,
}

impl Mirror {
    /// Reads a listing (keys relative to `control/`). An entry that does not parse is
    /// skipped and counted: a bad value written by hand must not blank a replica.
    pub(crate) fn from_listing<'a>(entries: impl IntoIterator<Item = (&'a str, &'a str)>) -> Mirror {
        let mut mirror = Mirror::default();
        for (key, value) in entries {
            if !mirror.read(key, value) {
                tracing::warn!(key, "skipping a shared control-plane entry that does not parse");
                metrics::counter!(m::REPLICA_ENTRIES_SKIPPED.name).increment(1);
            }
        }
        mirror
    }

    fn read(&mut self, key: &str, value: &str) -> bool {
        let json = || serde_json::from_str::<Value>(value).ok();
        match key.split('/').collect::<Vec<_>>().as_slice() {
            ["schedulers", app] => self.schedulers.insert(app.to_string(), value.to_string()).is_none(),
            ["policies", _] => {
                self.policies.push(value.to_string());
                true
            }
            ["pools", pool, what] => {
                let p = self.pools.entry(pool.to_string()).or_default();
                match *what {
                    "constraints" => json().map(|v| p.constraints = Some(v)).is_some(),
                    "bounds" => json().map(|v| p.bounds = Some(v)).is_some(),
                    "report" => json()
                        .and_then(|v| Some((v.get("report")?.clone(), v.get("at_unix_ms")?.as_u64()?)))
                        .map(|r| p.report = Some(r))
                        .is_some(),
                    _ => false,
                }
            }
            _ => false,
        }
    }
}

impl Replicas {
    /// `prefix` is the store prefix (`/flotilla`); the control plane keeps its part under
    /// `PREFIX/control/`.
    pub fn new(client: flotilla_etcd::Client, prefix: &str) -> Replicas {
        Replicas { client, root: flotilla_etcd::key(prefix, "control/") }
    }

    /// Keeps `what` in etcd (soft state under a lease of its TTL); the caller answers
    /// only once it is there.
    #[tracing::instrument(name = "replica_put", skip_all, fields(kind = what.kind()))]
    pub(crate) async fn put(&self, what: Shared<'_>) -> Result<(), ControlError> {
        let kind = what.kind();
        let (key, value, ttl) = what.entry();
        let mut c = self.client.clone();
        let put = async {
            let options = match ttl {
                Some(ttl) => Some(PutOptions::new().with_lease(c.lease_grant(ttl.as_secs() as i64, None).await?.id())),
                None => None,
            };
            c.put(format!("{}{key}", self.root), value, options).await
        };
        let result = within(REQUEST_TIMEOUT, "a shared put", put).await;
        let label = if result.is_ok() { "ok" } else { "error" };
        metrics::counter!(m::REPLICA_WRITES.name, "kind" => kind, "result" => label).increment(1);
        result.map(drop).map_err(|e| ControlError::SharedStoreUnavailable(e.to_string()))
    }

    /// Keeps the registrations of `apps` at `url` in etcd under one lease of
    /// [`REMOTE_TTL`], in transactions of at most `MAX_TXN_OPS` puts (etcd refuses more
    /// than 128 by default): a process leading thousands of apps re-registers them all
    /// every few seconds.
    #[tracing::instrument(name = "replica_put_schedulers", skip_all, fields(apps = apps.len()))]
    pub(crate) async fn put_schedulers(&self, apps: &[String], url: &str) -> Result<(), ControlError> {
        use flotilla_etcd::etcd_client::{Txn, TxnOp};
        let mut c = self.client.clone();
        let put = async {
            let lease = c.lease_grant(REMOTE_TTL.as_secs() as i64, None).await?.id();
            for chunk in apps.chunks(flotilla_scheduler::MAX_TXN_OPS) {
                let ops: Vec<TxnOp> = chunk
                    .iter()
                    .map(|app| {
                        let (key, _, _) = Shared::Scheduler { app, url }.entry();
                        TxnOp::put(format!("{}{key}", self.root), url, Some(PutOptions::new().with_lease(lease)))
                    })
                    .collect();
                c.txn(Txn::new().and_then(ops)).await?;
            }
            Ok::<_, flotilla_etcd::etcd_client::Error>(())
        };
        let result = within(REQUEST_TIMEOUT, "a shared put", put).await;
        let label = if result.is_ok() { "ok" } else { "error" };
        metrics::counter!(m::REPLICA_WRITES.name, "kind" => "scheduler", "result" => label)
            .increment(apps.len() as u64);
        result.map_err(|e| ControlError::SharedStoreUnavailable(e.to_string()))
    }

    /// One listing of etcd's copy.
    async fn list(&self) -> Result<Mirror, flotilla_etcd::EtcdError> {
        let mut c = self.client.clone();
        let r = within(REQUEST_TIMEOUT, "a listing", c.get(self.root.clone(), Some(GetOptions::new().with_prefix())))
            .await?;
        let entries: Vec<(&str, &str)> = r
            .kvs()
            .iter()
            .filter_map(|kv| Some((kv.key_str().ok()?.strip_prefix(self.root.as_str())?, kv.value_str().ok()?)))
            .collect();
        Ok(Mirror::from_listing(entries))
    }

    /// Mirrors etcd's copy into `state` every [`MIRROR_EVERY`], for ever. While etcd does
    /// not answer, the replica goes on with its last copy.
    pub async fn mirror(self: Arc<Self>, state: Arc<ControlState>) {
        let mut tick = tokio::time::interval(MIRROR_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut failing = false;
        loop {
            tick.tick().await;
            match self.list().await {
                Ok(mirror) => {
                    if std::mem::take(&mut failing) {
                        tracing::info!("the shared store answers again");
                    }
                    state.apps.replace_remote(&mirror.schedulers);
                    state.policies.replace_all(&mirror.policies);
                    state.pools.replace_shared(mirror.pools);
                    metrics::counter!(m::REPLICA_SYNCS.name, "result" => "ok").increment(1);
                }
                Err(e) => {
                    if !std::mem::replace(&mut failing, true) {
                        tracing::warn!(error = %e, "cannot read the shared store: serving the last copy");
                    }
                    metrics::counter!(m::REPLICA_SYNCS.name, "result" => "error").increment(1);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_reads_every_kind_and_skips_what_does_not_parse() {
        let m = Mirror::from_listing([
            ("schedulers/echo", "http://10.0.0.5:8080"),
            ("policies/shared", "[autoscaling]\nname = \"shared\"\n"),
            ("pools/gpu/constraints", r#"{"resource_requests": []}"#),
            ("pools/gpu/bounds", r#"{"a100": {"min": 0, "max": 4}}"#),
            ("pools/gpu/report", r#"{"at_unix_ms": 1700000000000, "report": {"instances": []}}"#),
            ("pools/cpu/report", r#"{"report": {"instances": []}}"#),
            ("pools/cpu/bounds", "not json"),
            ("somewhere/else", "x"),
        ]);
        assert_eq!(m.schedulers.get("echo").map(String::as_str), Some("http://10.0.0.5:8080"));
        assert_eq!(m.policies.len(), 1);
        let gpu = &m.pools["gpu"];
        assert!(gpu.constraints.is_some() && gpu.bounds.is_some());
        assert_eq!(gpu.report.as_ref().map(|r| r.1), Some(1_700_000_000_000));
        let cpu = &m.pools["cpu"];
        assert!(cpu.report.is_none() && cpu.bounds.is_none(), "{cpu:?}");
    }

    #[test]
    fn soft_state_has_a_lease_and_the_rest_does_not() {
        let s = Shared::Scheduler { app: "echo", url: "http://h:1" }.entry();
        assert_eq!((s.0.as_str(), s.2), ("schedulers/echo", Some(REMOTE_TTL)));
        let p = Shared::Policy { name: "p", toml: "x" }.entry();
        assert_eq!((p.0.as_str(), p.2), ("policies/p", None));
        let r = Shared::Report { pool: "gpu", json: "{}".into() }.entry();
        assert_eq!((r.0.as_str(), r.2), ("pools/gpu/report", Some(STALE_AFTER)));
    }
}
