//! What the pool autoscaler reads from and asks of the control plane, over its HTTP
//! API: the same calls an operator's tools make, so the autoscaler runs in `flotilla up`
//! or as its own process alike.

use std::time::Duration;

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::provider::BoxFuture;
use crate::reconciler::{AppRow, Constraints, NodeRow};

#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error("{path}: {message}")]
    Call { path: String, message: String },
}

/// The control plane as the autoscaler uses it.
pub trait Cluster: Send + Sync {
    fn nodes(&self) -> BoxFuture<'_, Result<Vec<NodeRow>, ClusterError>>;
    fn apps(&self) -> BoxFuture<'_, Result<Vec<AppRow>, ClusterError>>;
    /// Cordons the node and has every app move its members elsewhere first.
    fn drain<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ClusterError>>;
    /// Posts the pool's report; the answer carries its floor.
    fn report<'a>(&'a self, pool: &'a str, report: &'a Value) -> BoxFuture<'a, Result<Constraints, ClusterError>>;
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
        Box::pin(async move { self.call(self.client.get(self.url("/v1/apps")), "/v1/apps").await })
    }

    fn drain<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ClusterError>> {
        Box::pin(async move {
            let path = format!("/v1/nodes/{node}/drain");
            let _: Value = self.call(self.client.post(self.url(&path)), &path).await?;
            Ok(())
        })
    }

    fn report<'a>(&'a self, pool: &'a str, report: &'a Value) -> BoxFuture<'a, Result<Constraints, ClusterError>> {
        Box::pin(async move {
            let path = format!("/v1/pools/{pool}/report");
            let v: Value = self.call(self.client.post(self.url(&path)).json(report), &path).await?;
            let c = v.get("constraints").cloned().unwrap_or(Value::Null);
            if c.is_null() {
                return Ok(Constraints::default());
            }
            serde_json::from_value(c).map_err(|e| ClusterError::Call { path, message: format!("bad constraints: {e}") })
        })
    }
}
