//! `GET /openapi.json`: the API's OpenAPI 3.1 contract, derived by `utoipa` from the
//! handlers' annotations and the types they read and answer with. Routes, parameters,
//! bodies and errors come from the handlers; the answer types below describe answers the
//! handlers build from scheduler state (or pass on from a standalone scheduler), and
//! `tests/api/conformance.py` checks every documented route's real answers against them.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use serde::Serialize;
use serde_json::Value;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::ControlState;

/// Every refusal: `{"error": {"code", "message"}}`; `code` is stable (clients branch on
/// it), `message` is for people.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorDetail {
    pub code: String,
    pub message: String,
}

/// One of the shard's view versions.
#[derive(Debug, Serialize, ToSchema)]
pub struct ViewVersion {
    pub epoch: u64,
    pub seq: u64,
}

/// `GET /v1/shards`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ShardRow {
    pub shard: usize,
    pub address: Option<String>,
    /// Whether this process follows the shard's view now.
    pub connected: bool,
    pub version: ViewVersion,
    pub nodes: usize,
}

/// A member the apps of this process placed on a node.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeMember {
    pub app: String,
    pub unit_id: String,
    pub member: String,
    pub role: String,
    pub state: String,
    pub address: Option<String>,
}

/// Why a drain waits on a unit.
#[derive(Debug, Serialize, ToSchema)]
pub struct DrainWait {
    pub app: String,
    pub unit_id: String,
    pub reason: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DrainWaits {
    pub waiting: Vec<DrainWait>,
}

/// `GET /v1/nodes/{node}`: the node's row, what runs there, and (while it drains) what the
/// drain waits on.
#[derive(Debug, Serialize, ToSchema)]
pub struct NodeDetail {
    #[serde(flatten)]
    pub row: crate::json::NodeRow,
    pub members: Vec<NodeMember>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainWaits>,
}

/// `POST /v1/nodes/{node}/cordon|drain|uncordon`.
#[derive(Debug, Serialize, ToSchema)]
pub struct CordonAnswer {
    pub node_id: String,
    pub cordoned: bool,
    pub drain_requested: bool,
}

/// Queued units by group (the pool autoscaler's demand).
#[derive(Debug, Serialize, ToSchema)]
pub struct Queued {
    pub primary: u32,
    pub secondary: u32,
}

/// The spec in force and where it came from.
#[derive(Debug, Serialize, ToSchema)]
pub struct SpecInForce {
    /// `file`, `api`, `rollback`, `revert`, `dashboard`.
    pub source: Option<String>,
    pub at_unix_ms: Option<u64>,
    pub reason: Option<String>,
    /// The unit template's fingerprint.
    pub template: Option<String>,
}

/// Whether the app's store takes writes (changes answer 503 while it does not).
#[derive(Debug, Serialize, ToSchema)]
pub struct StoreHealth {
    pub healthy: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `GET /v1/apps/{app}` and a row of `GET /v1/apps`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AppSummary {
    pub app: String,
    pub desired_units: u32,
    pub min_units: u32,
    pub max_units: u32,
    /// Units by state (`running`, `queued`, …).
    pub units: BTreeMap<String, u32>,
    pub queued: Queued,
    /// The resources one unit takes (its members' sum), by group.
    pub unit_shape: Value,
    /// The standalone scheduler serving the app; null when this process runs it.
    pub scheduler_url: Option<String>,
    /// The autoscaling policy's state, when the app has one.
    pub autoscaling: Value,
    pub spec: SpecInForce,
    /// The last rollout: `in_progress`, `complete` or `failed` with its reason.
    pub rollout: Value,
    /// Which instance serves the app and whether it holds the app's lease.
    pub scheduler: Value,
    /// Set while the scheduler places nothing for want of a view of every shard.
    pub waiting: Value,
    pub store: StoreHealth,
}

/// A row of `GET /v1/apps` for an app whose standalone scheduler did not answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnreachableApp {
    pub app: String,
    pub scheduler_url: String,
    pub unreachable: bool,
    pub error: ErrorDetail,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub enum AppListRow {
    Summary(Box<AppSummary>),
    Unreachable(UnreachableApp),
}

/// A member of a unit (or a surge member coming up to replace one).
#[derive(Debug, Serialize, ToSchema)]
pub struct MemberRow {
    pub member: String,
    pub role: String,
    pub node_id: Option<String>,
    /// `pending`, `allocated`, `starting`, `running`, `exited`, `failed`, `stopped`, …
    pub state: String,
    /// `host:port` where it serves.
    pub address: Option<String>,
    #[serde(default)]
    pub usage: Value,
    #[serde(default)]
    pub ports: Value,
    #[serde(default)]
    pub port_ranges: Value,
    #[serde(default)]
    pub message: Value,
}

/// `GET /v1/apps/{app}/units`.
#[derive(Debug, Serialize, ToSchema)]
pub struct UnitRow {
    pub unit_id: String,
    pub app: String,
    pub domain: Option<String>,
    /// `queued`, `placing`, `allocated`, `starting`, `running`, `degraded`, `draining`,
    /// `stopping`, `terminated`, `failed`.
    pub state: String,
    pub generation: u64,
    pub unplaced_reason: Option<String>,
    pub placement_note: Option<String>,
    pub surge: Vec<MemberRow>,
    pub replaced_by: Option<String>,
    pub template: Option<String>,
    pub secondary: bool,
    pub ended_unix_ms: Option<u64>,
    pub members: Vec<MemberRow>,
    /// Why no pool can help a queued unit, when one said so.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pool: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RouteRow {
    pub endpoint: String,
    pub node_id: String,
    pub unit_id: String,
    pub member: String,
    pub weight: f64,
}

/// `GET /v1/apps/{app}/routes`: the app's route table as its scheduler published it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RouteTable {
    pub app: String,
    pub version: u64,
    pub routes: Vec<RouteRow>,
}

/// The answer to a scale: the desired units, or the autoscaling override set or lifted.
#[derive(Debug, Serialize, ToSchema)]
pub struct ScaleAnswer {
    pub app: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub desired_units: Option<u32>,
    /// `{"floor", "ceiling"}`, or null once lifted.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub r#override: Option<Value>,
}

/// The answer to an apply or a rollback: the version in force now, and whether the call
/// made it (an apply of the spec in force makes none).
#[derive(Debug, Serialize, ToSchema)]
pub struct Applied {
    pub app: String,
    pub version: u64,
    pub new_version: bool,
    pub result: String,
}

/// One kept version of an app's spec.
#[derive(Debug, Serialize, ToSchema)]
pub struct VersionRow {
    pub version: u64,
    pub in_force: bool,
    pub source: String,
    pub at_unix_ms: u64,
    pub by: Option<String>,
    pub reason: Option<String>,
    pub rollback_of: Option<u64>,
    pub template: Option<String>,
    /// What changed from the version before (`[{"path","before","after"}]`); null for the
    /// oldest kept.
    pub changes: Option<Vec<Value>>,
}

/// `GET /v1/apps/{app}/versions`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Versions {
    pub app: String,
    pub in_force: u64,
    pub versions: Vec<VersionRow>,
}

/// `PUT /v1/apps/{app}/demand`.
#[derive(Debug, Serialize, ToSchema)]
pub struct DemandAnswer {
    pub app: String,
    pub demand: Value,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PriorityCapacity {
    pub weight: f64,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub gpu: u32,
}

/// `GET /v1/apps/{app}/capacity`: what the app can serve now (route weights × resources).
#[derive(Debug, Serialize, ToSchema)]
pub struct CapacityRow {
    pub app: String,
    pub version: u64,
    pub total_weight: f64,
    pub by_priority: BTreeMap<String, PriorityCapacity>,
}

/// A named autoscaling policy.
#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyRow {
    pub name: String,
    pub policy: String,
    pub interval_ms: u64,
    pub toml: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PolicyApplied {
    pub name: String,
    pub result: String,
}

/// One 10 s sample of a chart.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChartPoint {
    /// Unix seconds.
    pub t: u64,
    pub v: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ChartDecision {
    pub at_ms: Value,
    pub action: Value,
    pub explanation: Value,
}

/// `GET /v1/apps/{app}/history`.
#[derive(Debug, Serialize, ToSchema)]
pub struct AppHistory {
    pub app: String,
    pub step_s: u64,
    pub window_s: u64,
    pub points: Vec<ChartPoint>,
    pub decisions: Vec<ChartDecision>,
}

/// `GET /v1/pools/{pool}/history`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PoolHistory {
    pub pool: String,
    pub step_s: u64,
    pub window_s: u64,
    pub points: Vec<ChartPoint>,
}

/// `GET /v1/events/history`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventsPage {
    pub events: Vec<crate::journal::Event>,
    pub newest: u64,
    pub next_after: u64,
}

/// A named token's grant (never the token).
#[derive(Debug, Serialize, ToSchema)]
pub struct GrantRow {
    pub name: String,
    pub scopes: Vec<String>,
    /// The apps it may act on; null: every app.
    pub apps: Option<Vec<String>>,
}

/// `GET /v1/tokens`.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenList {
    pub file: Option<String>,
    pub tokens: Vec<GrantRow>,
}

/// `POST /v1/tokens`: the token, shown this once.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedToken {
    pub name: String,
    pub scopes: Vec<String>,
    pub apps: Option<Vec<String>>,
    pub token: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Revoked {
    pub name: String,
    pub revoked: bool,
}

/// `GET /v1/whoami`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Whoami {
    pub name: Option<String>,
    pub scopes: Vec<String>,
    pub apps: Option<Vec<String>>,
    /// The API has no token at all: everything is allowed.
    pub open: bool,
}

/// A pool as its autoscaler last reported it (`node_types`, `by_type`, `instances`,
/// `decisions`), with its floor and bounds.
#[derive(Debug, Serialize, ToSchema)]
pub struct PoolRow {
    pub pool: String,
    pub constraints: Value,
    pub bounds: Value,
    pub reported_ms_ago: Option<u64>,
    pub stale: bool,
    #[serde(flatten)]
    pub report: BTreeMap<String, Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PoolBounds {
    pub pool: String,
    pub bounds: Value,
}

/// What a pool autoscaler's report is answered with (applied from its next pass).
#[derive(Debug, Serialize, ToSchema)]
pub struct ReportAnswer {
    pub constraints: Value,
    pub bounds: Value,
}

struct BearerAuth;

impl Modify for BearerAuth {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Flotilla control plane",
        description = "Nodes, apps and their units, versions, logs, events, tokens and pools. Reads need no token unless noted; changes need `Authorization: Bearer TOKEN` with the scope each names. Every refusal is `{\"error\": {\"code\", \"message\"}}`."
    ),
    paths(
        crate::nodes::list,
        crate::nodes::get,
        crate::nodes::list_shards,
        crate::nodes::node_action,
        crate::events::events,
        crate::apps::list_apps,
        crate::apps::get_app,
        crate::apps::list_units,
        crate::apps::list_routes,
        crate::apps::scale,
        crate::apps::apply,
        crate::apps::get_spec,
        crate::versions::list_versions,
        crate::versions::get_version,
        crate::versions::rollback,
        crate::versions::plan,
        crate::logs::member_logs,
        crate::autoscaling::decisions,
        crate::autoscaling::demand,
        crate::autoscaling::capacity,
        crate::autoscaling::list_policies,
        crate::autoscaling::apply_policy,
        crate::charts::app_history,
        crate::charts::pool_history,
        crate::journal::history,
        crate::auth::list_tokens,
        crate::auth::create_token,
        crate::auth::revoke_token,
        crate::auth::whoami,
        crate::schedulers::register_scheduler,
        crate::pools::list,
        crate::pools::get_pool,
        crate::pools::get_constraints,
        crate::pools::put_constraints,
        crate::pools::put_bounds,
        crate::pools::report,
        openapi_json,
    ),
    modifiers(&BearerAuth)
)]
pub struct ApiDoc;

/// `GET /openapi.json`.
#[utoipa::path(get, path = "/openapi.json", tag = "meta", responses((status = 200, description = "this document", content_type = "application/json")))]
pub(crate) async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(document())
}

/// The document, with this build's version.
pub fn document() -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    doc.info.version = env!("CARGO_PKG_VERSION").to_string();
    doc
}

pub fn routes() -> axum::Router<Arc<ControlState>> {
    axum::Router::new().route("/openapi.json", axum::routing::get(openapi_json))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `.route("PATH", …)` of the API's source, with its methods.
    fn routes_in_source() -> Vec<(String, Vec<String>)> {
        let mut found = Vec::new();
        let mut files = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))];
        while let Some(p) = files.pop() {
            if p.is_dir() {
                files.extend(std::fs::read_dir(&p).unwrap().map(|e| e.unwrap().path()));
                continue;
            }
            let text = std::fs::read_to_string(&p).unwrap();
            for piece in text.split(".route(\"").skip(1) {
                let (path, rest) = piece.split_once('"').unwrap();
                // One route a line: its methods are on it.
                let call = rest.lines().next().unwrap_or_default();
                let methods = ["get", "put", "post", "delete"]
                    .iter()
                    .filter(|m| call.contains(&format!("{m}(")))
                    .map(|m| m.to_string())
                    .collect();
                found.push((path.to_string(), methods));
            }
        }
        found
    }

    #[test]
    fn every_route_of_the_api_is_in_the_document() {
        let doc = serde_json::to_value(document()).unwrap();
        assert_eq!(doc["openapi"], "3.1.0");
        let paths = doc["paths"].as_object().unwrap();
        let routes = routes_in_source();
        assert!(routes.len() > 30, "{routes:?}");
        for (path, methods) in routes {
            // The dashboard's page and files are not API (and this test's own text is no route).
            if path == "/" || path.starts_with("/ui/") || !path.starts_with('/') {
                continue;
            }
            let Some(item) = paths.get(&path) else { panic!("{path} is not in /openapi.json") };
            for m in methods {
                assert!(item.get(&m).is_some(), "{m} {path} is not in /openapi.json");
            }
        }
    }

    #[test]
    fn every_operation_documents_its_errors_and_names_its_token() {
        let doc = serde_json::to_value(document()).unwrap();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (method, op) in item.as_object().unwrap() {
                let responses = op["responses"].as_object().unwrap();
                assert!(responses.keys().any(|c| c.starts_with('2')), "{method} {path}: no success answer");
                if method != "get" || op.get("security").is_some() {
                    for code in ["401", "403"] {
                        assert!(responses.contains_key(code), "{method} {path}: no {code}");
                    }
                }
            }
        }
    }
}
