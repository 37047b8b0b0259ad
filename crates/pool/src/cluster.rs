//! What the pool autoscaler reads from and asks of the control plane, over its HTTP
//! API: the same calls an operator's tools make, so the autoscaler runs in `flotilla up`
//! or as its own process alike.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::NodeStatus;
use flotilla_view::{ClusterView, NodeRecord};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::model::{AppRow, Constraints, NodeRow};
use crate::provider::BoxFuture;

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{path}: {message}")]
    Call { path: String, message: String },
}

/// The largest `max` an operator may set on a node type.
pub const MAX_TYPE_BOUND: u32 = 100_000;

/// An operator's bounds on one node type (`PUT /v1/pools/{pool}/node_types/{type}`),
/// replacing the pool file's `min` and `max` for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeBounds {
    pub min: u32,
    pub max: u32,
}

impl TypeBounds {
    pub fn validate(&self) -> Result<(), String> {
        if self.min > self.max {
            return Err(format!("min {} is more than max {}", self.min, self.max));
        }
        if self.max > MAX_TYPE_BOUND {
            return Err(format!("max {} is more than {MAX_TYPE_BOUND}", self.max));
        }
        Ok(())
    }
}

/// The control plane's answer to a report: the pool's floor and the operator's bounds
/// by node type.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReportAnswer {
    pub constraints: Constraints,
    pub bounds: BTreeMap<String, TypeBounds>,
}

/// The control plane as the autoscaler uses it.
pub trait Cluster: Send + Sync {
    fn nodes(&self) -> BoxFuture<'_, Result<Vec<NodeRow>, ClusterError>>;
    fn apps(&self) -> BoxFuture<'_, Result<Vec<AppRow>, ClusterError>>;
    /// Cordons the node and has every app move its members elsewhere first.
    fn drain<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ClusterError>>;
    /// Cordons the node (one the pool empties: its apps move their members off it
    /// within their disruption budgets) or uncordons it (a warm node claimed for demand,
    /// a consolidation given up).
    fn set_cordon<'a>(&'a self, node: &'a str, cordoned: bool) -> BoxFuture<'a, Result<(), ClusterError>>;
    /// Posts the pool's report; the answer carries its floor and node type bounds.
    fn report<'a>(&'a self, pool: &'a str, report: &'a Value) -> BoxFuture<'a, Result<ReportAnswer, ClusterError>>;
}

/// The control plane's HTTP API.
pub struct HttpCluster {
    client: reqwest::Client,
    base: String,
    token: Option<String>,
}

const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Answers larger than this are refused (a node list of 100,000 rows is about 60 MiB).
const MAX_ANSWER: usize = 256 << 20;

impl HttpCluster {
    pub fn new(client: reqwest::Client, base: &str, token: Option<String>) -> Self {
        HttpCluster { client, base: base.trim_end_matches('/').to_string(), token }
    }

    async fn call<T: DeserializeOwned>(&self, req: reqwest::RequestBuilder, path: &str) -> Result<T, ClusterError> {
        let err = |message: String| ClusterError::Call { path: path.to_string(), message };
        let req = match &self.token {
            Some(t) => req.bearer_auth(t),
            None => req,
        };
        let resp = req.timeout(CALL_TIMEOUT).send().await.map_err(|e| err(e.to_string()))?;
        if resp.content_length().is_some_and(|n| n > MAX_ANSWER as u64) {
            return Err(err(format!("answer of more than {MAX_ANSWER} bytes")));
        }
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| err(e.to_string()))?;
        if body.len() > MAX_ANSWER {
            return Err(err(format!("answer of {} bytes, more than {MAX_ANSWER}", body.len())));
        }
        if !status.is_success() {
            let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
            let msg = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("no message");
            return Err(err(format!("{status}: {msg}")));
        }
        serde_json::from_slice(&body).map_err(|e| err(format!("unreadable answer: {e}")))
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }
}

impl Cluster for HttpCluster {
    fn nodes(&self) -> BoxFuture<'_, Result<Vec<NodeRow>, ClusterError>> {
        Box::pin(async move { self.call(self.client.get(self.url("/v1/nodes")), "/v1/nodes").await })
    }

    fn apps(&self) -> BoxFuture<'_, Result<Vec<AppRow>, ClusterError>> {
        // Only what the pool reads of each app: at a thousand apps the summaries are
        // ten times the bytes to build, send and parse every pass.
        Box::pin(
            async move { self.call(self.client.get(self.url("/v1/apps?view=demand")), "/v1/apps?view=demand").await },
        )
    }

    fn drain<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ClusterError>> {
        Box::pin(async move {
            let path = format!("/v1/nodes/{node}/drain");
            let _: Value = self.call(self.client.post(self.url(&path)), &path).await?;
            Ok(())
        })
    }

    fn set_cordon<'a>(&'a self, node: &'a str, cordoned: bool) -> BoxFuture<'a, Result<(), ClusterError>> {
        Box::pin(async move {
            let path = format!("/v1/nodes/{node}/{}", if cordoned { "cordon" } else { "uncordon" });
            let _: Value = self.call(self.client.post(self.url(&path)), &path).await?;
            Ok(())
        })
    }

    fn report<'a>(&'a self, pool: &'a str, report: &'a Value) -> BoxFuture<'a, Result<ReportAnswer, ClusterError>> {
        Box::pin(async move {
            let path = format!("/v1/pools/{pool}/report");
            let v: Value = self.call(self.client.post(self.url(&path)).json(report), &path).await?;
            answer_of(&v).map_err(|message| ClusterError::Call { path, message })
        })
    }
}

/// The control plane's API with the nodes read from a view this process follows
/// instead of `GET /v1/nodes`: at 100,000 nodes that answer is tens of MiB to build and
/// parse every pass, while the view's records are shared, so a row copies only the
/// node's id.
pub struct ViewCluster {
    view: Arc<ClusterView>,
    api: HttpCluster,
}

impl ViewCluster {
    pub fn new(view: Arc<ClusterView>, api: HttpCluster) -> Self {
        ViewCluster { view, api }
    }
}

/// A node as the pool reads it; one whose shard is not heard is Unknown, never Dead,
/// as `GET /v1/nodes` says.
fn row(r: &NodeRecord, connected: bool) -> NodeRow {
    NodeRow {
        node_id: r.node_id.clone(),
        status: if connected { r.status } else { NodeStatus::Unknown },
        labels: r.labels.clone(),
        capacity: r.capacity.clone(),
        allocated: r.allocated.clone(),
        cordoned: r.cordoned,
        drain_requested: r.drain_requested,
        workloads: r.workloads.len(),
    }
}

impl Cluster for ViewCluster {
    fn nodes(&self) -> BoxFuture<'_, Result<Vec<NodeRow>, ClusterError>> {
        let slots = self.view.slots();
        // Before a shard's first snapshot its nodes are not missing, only unknown: a
        // pass then would take pool instances for never joined.
        let rows = match slots.iter().position(|s| s.updated_unix_ms == 0) {
            Some(shard) => {
                Err(ClusterError::Call { path: "the view".into(), message: format!("no view of shard {shard} yet") })
            }
            None => {
                let mut rows = Vec::with_capacity(slots.iter().map(|s| s.view.len()).sum());
                for s in &slots {
                    rows.extend(s.view.nodes.values().map(|r| row(r, s.connected)));
                }
                Ok(rows)
            }
        };
        Box::pin(async move { rows })
    }

    fn apps(&self) -> BoxFuture<'_, Result<Vec<AppRow>, ClusterError>> {
        self.api.apps()
    }

    fn drain<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ClusterError>> {
        self.api.drain(node)
    }

    fn set_cordon<'a>(&'a self, node: &'a str, cordoned: bool) -> BoxFuture<'a, Result<(), ClusterError>> {
        self.api.set_cordon(node, cordoned)
    }

    fn report<'a>(&'a self, pool: &'a str, report: &'a Value) -> BoxFuture<'a, Result<ReportAnswer, ClusterError>> {
        self.api.report(pool, report)
    }
}

/// Reads the answer to a report; a control plane that predates a field leaves it empty.
pub fn answer_of(v: &Value) -> Result<ReportAnswer, String> {
    let constraints = match v.get("constraints") {
        None | Some(Value::Null) => Constraints::default(),
        Some(c) => serde_json::from_value(c.clone()).map_err(|e| format!("bad constraints: {e}"))?,
    };
    let bounds = match v.get("bounds") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(b) => serde_json::from_value(b.clone()).map_err(|e| format!("bad bounds: {e}"))?,
    };
    Ok(ReportAnswer { constraints, bounds })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_carries_the_floor_and_the_bounds() {
        let v = serde_json::json!({"constraints": {"resource_requests": []}, "bounds": {"t": {"min": 1, "max": 3}}});
        let a = answer_of(&v).unwrap();
        assert_eq!(a.bounds["t"], TypeBounds { min: 1, max: 3 });
        assert_eq!(answer_of(&serde_json::json!({})).unwrap(), ReportAnswer::default());
        assert!(answer_of(&serde_json::json!({"bounds": {"t": {"min": "x"}}})).is_err());
        assert!(TypeBounds { min: 2, max: 1 }.validate().is_err());
        assert!(TypeBounds { min: 0, max: MAX_TYPE_BOUND + 1 }.validate().is_err());
        assert!(TypeBounds { min: 0, max: MAX_TYPE_BOUND }.validate().is_ok());
    }
}
