//! `POST /v1/apps/{app}/warm`: fetch an app's artifacts into the caches of the nodes a
//! scale-up would use, before it comes (`flotilla artifact warm APP [--nodes SELECTOR]`).
//!
//! Each node's shard relays the request over the agent's own connection
//! (`NodeAdminService.Warm`); the agent starts the fetches and answers at once, and they
//! go on peer to peer. Nothing is pinned: until a member uses a warmed artifact, the
//! cache may evict it like any other artifact no member uses.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use flotilla_core::NodeStatus;
use flotilla_proto::v1;
use flotilla_scheduler::AppSpec;
use flotilla_view::NodeRecord;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};

use crate::catalogue as m;
use crate::tokens::Scope;
use crate::{ControlError, ControlState};

/// Nodes asked at once.
const FAN_OUT: usize = 32;
/// Nodes one request may warm, at most: a larger set is refused, to be narrowed.
pub const MAX_NODES: usize = 10_000;
/// The longest selector, in bytes.
const MAX_SELECTOR: usize = 4096;

pub fn routes() -> axum::Router<Arc<ControlState>> {
    axum::Router::new().route("/v1/apps/{app}/warm", axum::routing::post(warm))
}

/// `{"nodes": "SELECTOR"}`, or `{}` for every node the app may be placed on.
#[derive(Debug, Default, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct WarmBody {
    /// Comma-separated: node ids (any of them) and `key=value` labels (all of them), of
    /// the nodes the app may be placed on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    nodes: Option<String>,
}

/// Which nodes a warm asks: ids (a node matching any) and labels (all must match).
#[derive(Debug, Default, PartialEq)]
pub struct Selector {
    ids: Vec<String>,
    labels: Vec<(String, String)>,
}

impl Selector {
    pub fn parse(text: &str) -> Result<Selector, String> {
        if text.len() > MAX_SELECTOR {
            return Err(format!("nodes: {} bytes, at most {MAX_SELECTOR}", text.len()));
        }
        let mut s = Selector::default();
        for term in text.split(',').map(str::trim).filter(|t| !t.is_empty()) {
            match term.split_once('=') {
                Some((k, v)) if !k.is_empty() && !v.is_empty() => s.labels.push((k.into(), v.into())),
                Some(_) => return Err(format!("nodes: {term:?} is not key=value")),
                None => {
                    flotilla_core::NodeId::new(term).map_err(|e| format!("nodes: {term:?} is not a node id: {e}"))?;
                    s.ids.push(term.into());
                }
            }
        }
        if s.ids.is_empty() && s.labels.is_empty() {
            return Err("nodes: name node ids or key=value labels, comma-separated".into());
        }
        Ok(s)
    }

    fn matches(&self, r: &NodeRecord) -> bool {
        (self.ids.is_empty() || self.ids.iter().any(|id| id == r.node_id.as_str()))
            && self.labels.iter().all(|(k, v)| r.labels.get(k) == Some(v.as_str()))
    }
}

/// Whether a scale-up of `spec` could place a member on `r`: alive, not cordoned, and
/// admitted by the planner's own label test.
pub fn may_hold(spec: &AppSpec, r: &NodeRecord) -> bool {
    r.status == NodeStatus::Alive
        && !r.cordoned
        && spec.selectors().iter().any(|(_, s)| s.admits(|k| r.labels.get(k)).is_ok())
}

/// One node's answer.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct WarmNode {
    node_id: String,
    /// Artifacts cached and verified already.
    ready: u32,
    /// Artifacts being fetched now.
    fetching: u32,
    /// Artifacts whose last fetch there failed, each with why (a warm is tried again
    /// only when asked again).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    failed: Vec<String>,
    /// Why the node could not be asked (its agent is not connected, it refused).
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct WarmAnswer {
    app: String,
    /// The app's artifacts, once each.
    artifacts: usize,
    /// Every node asked, sorted by node id.
    nodes: Vec<WarmNode>,
}

#[utoipa::path(post, path = "/v1/apps/{app}/warm", tag = "apps", security(("bearer" = [])), params(("app" = String, Path)),
    request_body = WarmBody,
    responses((status = 200, description = "scope operate: every node asked, with what it holds, is fetching, or failed to fetch", body = WarmAnswer),
              (status = 400, description = "a bad selector, or more than 10000 nodes match", body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody),
                    (status = 404, description = "`no_such_app`", body = crate::answers::ErrorBody),
              (status = 422, description = "`nothing_to_warm`: the app uses no artifacts, or no node matches", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "warm_artifacts", skip(s, headers, body))]
pub(crate) async fn warm(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: Result<crate::body::JsonBody<WarmBody>, crate::body::BodyRejection>,
) -> Result<Json<serde_json::Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/warm").increment(1);
    let by = crate::auth::authorize(&s, &headers, Scope::Operate, Some(&app))?;
    let crate::body::JsonBody(b) = body.map_err(|e| e.expecting("expected {} or {\"nodes\": \"SELECTOR\"}"))?;
    let selector = b.nodes.as_deref().map(Selector::parse).transpose().map_err(ControlError::BadRequest)?;
    let spec = match s.apps.get(&app) {
        Some(Ok(h)) => crate::apps::parse_spec(&app, &h.status().spec_toml)?,
        Some(Err(url)) => {
            let req = s.http.post(format!("{}/v1/apps/{app}/warm", url.trim_end_matches('/')));
            return crate::forward::forward(req.json(&b), &url, &headers).await;
        }
        None => return Err(crate::apps::not_found(&app)),
    };
    let artifacts = spec.artifacts();
    if artifacts.is_empty() {
        return Err(ControlError::NothingToWarm(format!("{app} uses no artifacts: there is nothing to warm")));
    }
    // Node → its shard, sorted by node id.
    let mut targets: BTreeMap<String, usize> = BTreeMap::new();
    for (shard, slot) in s.cluster.slots().iter().enumerate() {
        for r in slot.view.nodes.values() {
            if may_hold(&spec, r) && selector.as_ref().is_none_or(|sel| sel.matches(r)) {
                targets.insert(r.node_id.to_string(), shard);
            }
        }
    }
    if targets.is_empty() {
        return Err(ControlError::NothingToWarm(format!(
            "no alive, uncordoned node {app} may be placed on matches{}",
            b.nodes.as_deref().map(|n| format!(" {n:?}")).unwrap_or_default()
        )));
    }
    if targets.len() > MAX_NODES {
        return Err(ControlError::BadRequest(format!(
            "{} nodes match; warm at most {MAX_NODES} at once (narrow it with nodes)",
            targets.len()
        )));
    }
    // One channel a shard, shared by its nodes' requests.
    let mut clients = BTreeMap::new();
    for shard in targets.values() {
        if !clients.contains_key(shard) {
            let client = crate::nodes::admin_client(&s, *shard).await.map_err(|e| e.to_string());
            clients.insert(*shard, client);
        }
    }
    let asks = targets.into_iter().map(|(node, shard)| {
        let (client, artifacts) = (clients.get(&shard).cloned(), artifacts.clone());
        async move { ask(client, node, artifacts).await }
    });
    let nodes: Vec<WarmNode> = futures_util::stream::iter(asks).buffered(FAN_OUT).collect().await;
    for n in &nodes {
        let result = if n.error.is_some() { "unreachable" } else { "asked" };
        metrics::counter!(m::WARMS.name, "result" => result).increment(1);
    }
    let asked = nodes.iter().filter(|n| n.error.is_none()).count();
    s.journal.action("warm", Some(&app), by, format!("{app}: {} artifacts warmed on {asked} nodes", artifacts.len()));
    Ok(Json(crate::answers::to_json(&WarmAnswer { app, artifacts: artifacts.len(), nodes })))
}

type Client = v1::node_admin_service_client::NodeAdminServiceClient<flotilla_proto::dial::GrpcChannel>;

async fn ask(client: Option<Result<Client, String>>, node: String, artifacts: Vec<v1::Artifact>) -> WarmNode {
    let failed =
        |node: String, e: String| WarmNode { node_id: node, ready: 0, fetching: 0, failed: vec![], error: Some(e) };
    let mut client = match client {
        Some(Ok(c)) => c,
        Some(Err(e)) => return failed(node, e),
        None => return failed(node, "its shard is not known".into()),
    };
    match client.warm(v1::WarmRequest { node_id: node.clone(), artifacts }).await {
        Ok(r) => {
            let r = r.into_inner();
            WarmNode { node_id: node, ready: r.ready, fetching: r.fetching, failed: r.failed, error: None }
        }
        Err(st) => failed(node, st.message().to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: &str, labels: &[(&str, &str)]) -> NodeRecord {
        let mut r = NodeRecord::blank(flotilla_core::NodeId::new(id).unwrap());
        let l: BTreeMap<String, String> = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        r.labels = Arc::new(flotilla_core::Labels::try_from(l).unwrap());
        r
    }

    #[test]
    fn a_selector_takes_ids_and_labels_and_names_a_bad_term() {
        let s = Selector::parse("n1, n2,gpu=a100").unwrap();
        assert!(s.matches(&node("n1", &[("gpu", "a100")])));
        assert!(!s.matches(&node("n1", &[])), "every label must match");
        assert!(!s.matches(&node("n3", &[("gpu", "a100")])), "and the node be one named");
        assert!(Selector::parse("zone=a").unwrap().matches(&node("n9", &[("zone", "a")])));
        assert!(Selector::parse("gpu=").unwrap_err().contains("\"gpu=\" is not key=value"));
        assert!(Selector::parse(" , ").unwrap_err().contains("comma-separated"));
        assert!(Selector::parse("no/such node").unwrap_err().contains("is not a node id"));
        assert!(Selector::parse(&"n,".repeat(3000)).unwrap_err().contains("at most 4096"));
    }

    #[test]
    fn only_nodes_a_scale_up_could_use_are_warmed() {
        let spec = |low: bool| {
            let toml = format!(
                "name = \"a\"\n[unit.head]\ncommand = \"x\"\ncpu = \"1\"\nmemory = \"1Gi\"\n\
                 [constraints]\nlabels = {{ zone = \"a\" }}\nallow_low_priority = {low}\n[units]\nmin = 1\nmax = 2\ninitial = 1\n"
            );
            crate::apps::parse_spec("a", &toml).unwrap()
        };
        let c = spec(false);
        assert!(may_hold(&c, &node("n1", &[("zone", "a")])));
        assert!(!may_hold(&c, &node("n1", &[("zone", "b")])));
        assert!(!may_hold(&c, &node("n1", &[("zone", "a"), ("priority", "low")])));
        let c = spec(true);
        assert!(may_hold(&c, &node("n1", &[("zone", "a"), ("priority", "low")])));
        let mut cordoned = node("n1", &[("zone", "a")]);
        cordoned.cordoned = true;
        assert!(!may_hold(&c, &cordoned));
        let mut dead = node("n1", &[("zone", "a")]);
        dead.status = NodeStatus::Dead;
        assert!(!may_hold(&c, &dead));
    }
}
