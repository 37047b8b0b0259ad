//! What the API answers with: the types its handlers build their answers from, and
//! from which `GET /openapi.json` ([`crate::openapi`]) describes them. Open fields
//! (`Value`) hold scheduler or pool state whose shape is that crate's.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

/// A typed answer as the JSON the handlers pass around (a standalone scheduler's
/// answers arrive as JSON, and pass on unchanged).
pub(crate) fn to_json<T: Serialize>(t: &T) -> Value {
    // Only a map with non-string keys fails, and no answer holds one: say so if one ever does.
    serde_json::to_value(t).unwrap_or_else(|e| {
        tracing::error!(error = %e, answer = std::any::type_name::<T>(), "an answer does not serialise");
        Value::Null
    })
}

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
    pub template: String,
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
    /// A canary shifting traffic (`GET …/rollout`): its step, share and both versions'
    /// numbers over the step; null otherwise.
    pub canary: Value,
    /// Which instance serves the app and whether it holds the app's lease.
    pub scheduler: Value,
    /// Set while the scheduler places nothing for want of a view of every shard.
    pub waiting: Value,
    pub store: StoreHealth,
}

/// The answer to a registration of several apps (`POST /v1/schedulers` with `apps`).
#[derive(Debug, Serialize, ToSchema)]
pub struct RegistrationAnswer {
    pub registered: usize,
    pub refused: Vec<RefusedApp>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct RefusedApp {
    pub app: String,
    pub error: ErrorDetail,
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
    /// `head`, or its group's name (`worker` for `[unit.worker]`).
    pub role: String,
    /// Which of its template's alternatives it runs as (`1` is `alternatives[0]`);
    /// absent for the template itself.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alternative: Option<u32>,
    pub node_id: Option<String>,
    /// `pending`, `allocated`, `starting`, `running`, `exited`, `failed`, `stopped`, …
    pub state: String,
    /// `host:port` where it serves.
    pub address: Option<String>,
    /// Its CPU and memory use, as its agent last measured it (members, not surge).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
    /// Named ports (`{"gcs": 41001}`), as its agent assigned them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ports: Option<Value>,
    /// Port blocks (`{"worker_ports": {"min": 41010, "max": 41109}}`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub port_ranges: Option<Value>,
    /// Why it exited or failed (the tail of its stderr), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<Value>,
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
    /// Why the unit is moving to a better place (a rebalance) while `replaced_by` comes up.
    pub moving: Option<String>,
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
    /// The template fingerprint the member's unit runs (`units APP` VERSION).
    pub version: String,
}

/// `GET /v1/apps/{app}/routes`: the app's route table as its scheduler published it.
#[derive(Debug, Serialize, ToSchema)]
pub struct RouteTable {
    pub app: String,
    pub version: u64,
    pub routes: Vec<RouteRow>,
    /// While a canary shifts traffic: the share of requests the routes of its version get
    /// (the rest go to the others).
    pub split: Option<VersionSplit>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct VersionSplit {
    pub version: String,
    pub share: f64,
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

impl Applied {
    pub fn of(app: &str, a: flotilla_scheduler::Applied) -> Value {
        to_json(&Applied { app: app.to_string(), version: a.version, new_version: a.new_version, result: a.result })
    }
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
    pub template: String,
    /// What changed from the version before (`[{"path","before","after"}]`); null for the
    /// oldest kept.
    #[schema(value_type = Option<Vec<Object>>)]
    pub changes: Option<Vec<flotilla_scheduler::diff::Change>>,
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

/// An autoscaling decision, as a mark on the chart.
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
    pub points: Vec<crate::series::Point>,
    pub decisions: Vec<ChartDecision>,
}

/// `GET /v1/pools/{pool}/history`.
#[derive(Debug, Serialize, ToSchema)]
pub struct PoolHistory {
    pub pool: String,
    pub step_s: u64,
    pub window_s: u64,
    pub points: Vec<crate::series::Point>,
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
