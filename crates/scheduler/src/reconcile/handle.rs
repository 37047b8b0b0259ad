//! What the world sees of a running scheduler: its handle (status, stats, routes) and
//! the commands the control plane sends it (scale, apply); [`super::command`] carries
//! them out.

use flotilla_core::LockExt;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use arc_swap::ArcSwap;
use flotilla_proto::v1;
use serde::Serialize;

use super::autoscale::{Demand, DemandRequest};
use super::error::CommandError;
use crate::spec::{AppSpec, SpecOrigin};
use crate::store::{Override, RolloutRecord, UnitRecord};

/// What the API shows about an app.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AppStatus {
    pub app: String,
    /// Roles whose members receive traffic (the spec's `routing.roles`).
    pub serving_roles: Vec<String>,
    pub desired_units: u32,
    pub min_units: u32,
    pub max_units: u32,
    /// Shared with the statuses before it where a unit did not change: a pass publishes
    /// without copying every unit of a large app.
    pub units: Vec<Arc<UnitRecord>>,
    /// What each unit asks of the node pool.
    pub unit_shape: flotilla_core::UnitShape,
    /// Set when the app follows an autoscaling policy.
    pub autoscaling: Option<AutoscalingStatus>,
    /// The current spec as TOML (`GET /v1/apps/{app}/spec`); shared between statuses.
    #[serde(skip)]
    pub spec_toml: Arc<str>,
    /// Whether a rollback has a spec to go back to.
    #[serde(skip)]
    pub has_previous_spec: bool,
    /// The kept versions, oldest first; the last is the one in force. Shared between
    /// statuses (replaced only by an apply).
    #[serde(skip)]
    pub versions: Arc<Vec<Arc<crate::store::SpecVersion>>>,
    /// Where the spec in force came from (`file`, `api`, `rollback`, `revert`).
    pub spec_origin: Option<SpecOrigin>,
    /// The template fingerprint of the spec in force (each unit's `template` is the one
    /// it was started from).
    pub template: String,
    /// The app's last rollout: in progress, complete, or failed and why.
    pub rollout: Option<RolloutRecord>,
    /// A canary shifting traffic: its step, share and both versions' numbers.
    pub canary: Option<crate::canary::CanaryStatus>,
    /// Why the store refuses writes now (a full disk), while it does: changes are
    /// refused (`store_unavailable`) and the scheduler retries until it is back.
    pub store_error: Option<String>,
    /// Why the scheduler places nothing yet: it waits for a view of every shard (and
    /// what the unreachable ones' streams failed with).
    pub waiting: Option<String>,
    /// Which instance serves the app and whether it is the active one (holds the lease).
    pub scheduler: crate::leader::Role,
}

/// What `apps` shows about an autoscaled app.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AutoscalingStatus {
    /// `basic` or `utilization`; absent while the named policy is unknown.
    pub policy: Option<&'static str>,
    /// The named policy the app uses, if any.
    pub policy_name: Option<String>,
    /// Floor and ceiling the operator set with `flotilla scale`.
    #[serde(rename = "override")]
    pub override_bounds: Option<Override>,
    pub demand: Option<Demand>,
    pub last_decision: Option<serde_json::Value>,
}

type Histogram = std::sync::Mutex<hdrhistogram::Histogram<u64>>;

/// What the scheduler measured about itself (also exported as metrics), for the
/// loadtest and the status page.
pub struct Stats {
    pub claims_accepted: AtomicU64,
    /// Claims the ledger refused although the plan thought they fit: Omega's conflicts.
    pub claims_rejected: AtomicU64,
    /// Commit round trip, microseconds.
    pub commit_us: Histogram,
    /// Time to place one unit against the view, microseconds.
    pub decision_us: Histogram,
}

impl Stats {
    pub(super) fn new() -> Self {
        let h =
            || std::sync::Mutex::new(hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!("3 is valid")));
        Stats {
            claims_accepted: Default::default(),
            claims_rejected: Default::default(),
            commit_us: h(),
            decision_us: h(),
        }
    }

    pub(super) fn record(h: &Histogram, d: Duration) {
        let _ = h.lock_or_recover().record((d.as_micros() as u64).max(1));
    }
}

pub(super) type Reply<T> = tokio::sync::oneshot::Sender<Result<T, CommandError>>;

/// Who asks for a spec change, and on what condition.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChangeRequest {
    /// The API token's name, recorded in the version.
    pub by: Option<String>,
    /// Apply only if the spec in force is still this version (`--check-version`).
    pub check_version: Option<u64>,
}

/// What an apply or rollback did: the version in force after it, and what will happen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Applied {
    pub version: u64,
    /// False when the spec was the one in force (its rollout restarts; no version is made).
    pub new_version: bool,
    pub result: String,
}

/// Requests from the control plane.
pub enum Command {
    /// Desired units; on an autoscaled app, a floor and ceiling of that many.
    Scale(u32, Reply<u32>),
    /// A new spec for the app (`flotilla apply`): units whose template changed roll.
    Apply(Box<AppSpec>, ChangeRequest, Reply<Applied>),
    /// What applying a spec would do, changing nothing (`apply --plan`).
    Plan(Box<AppSpec>, Reply<super::dry_run::ApplyPlan>),
    /// Bounds on an autoscaled app's decisions (`None` lifts them).
    Override(Option<Override>, Reply<Option<Override>>),
    /// Re-applies a kept version (`None`: the spec before the last apply, which becomes
    /// the previous one).
    Rollback(Option<u64>, ChangeRequest, Reply<Applied>),
    /// A consumer's demand (requests, TTL in ms), replacing the last one.
    Demand(Vec<DemandRequest>, u64, Reply<Demand>),
    /// Ends a canary's traffic shifting: the rest rolls (`flotilla rollout promote`).
    Promote(ChangeRequest, Reply<RolloutRecord>),
    /// Fails a canary and reverts the spec (`flotilla rollout abort`); answers with the
    /// failed rollout.
    Abort(ChangeRequest, Reply<RolloutRecord>),
}

/// A handle on a running scheduler, for the control plane and tests.
#[derive(Clone)]
pub struct AppHandle {
    pub app: String,
    pub(super) status: Arc<ArcSwap<AppStatus>>,
    pub(super) stats: Arc<Stats>,
    pub(super) commands: tokio::sync::mpsc::Sender<Command>,
    pub(super) routes: tokio::sync::watch::Receiver<Arc<v1::RouteTable>>,
    pub(super) capacity: tokio::sync::watch::Receiver<Arc<v1::Capacity>>,
    pub(super) decisions: Arc<ArcSwap<Vec<Arc<serde_json::Value>>>>,
    pub(super) rebalance: Rebalance,
    pub(super) traffic: Arc<std::sync::Mutex<crate::canary::TrafficBook>>,
}

/// The last rebalance plan. Replaced every look (each one carries when it was made) and
/// read only on request: an `ArcSwap`, whose store pays every reader thread's debts,
/// cost more here than a lock.
pub(super) type Rebalance = Arc<std::sync::Mutex<Arc<super::rebalance::RebalancePlan>>>;

impl AppHandle {
    /// A router's per-version numbers: counted toward the canary step in force, if one
    /// runs; a bad report is refused with what is wrong.
    pub fn report_traffic(&self, report: &v1::TrafficReport) -> Result<bool, String> {
        let outcome = match crate::canary::validate(report) {
            Err(e) => {
                metrics::counter!(crate::catalogue::TRAFFIC_REPORTS.name, "outcome" => "invalid").increment(1);
                return Err(e);
            }
            Ok(()) => self.traffic.lock_or_recover().add(report),
        };
        let name = if outcome { "counted" } else { "ignored" };
        metrics::counter!(crate::catalogue::TRAFFIC_REPORTS.name, "outcome" => name).increment(1);
        Ok(outcome)
    }

    /// Ends the canary's traffic shifting now: the rest rolls as a rolling update.
    pub async fn promote(&self, req: ChangeRequest) -> Result<RolloutRecord, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Promote(req, tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
    }

    /// Fails the canary and reverts to the last spec that ran.
    pub async fn abort(&self, req: ChangeRequest) -> Result<RolloutRecord, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Abort(req, tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
    }

    /// Sets the desired number of units (within the spec's min and max); the
    /// scheduler persists it and acts on it at once.
    pub async fn scale(&self, units: u32) -> Result<u32, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Scale(units, tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
    }

    /// Replaces the app's spec; units whose template changed are rolled, `max_unavailable`
    /// at a time. Answers with the new version and what will happen.
    pub async fn apply(&self, spec: AppSpec, req: ChangeRequest) -> Result<Applied, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Apply(Box::new(spec), req, tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
    }

    /// What `apply` of `spec` would do now; nothing changes.
    pub async fn plan(&self, spec: AppSpec) -> Result<super::dry_run::ApplyPlan, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Plan(Box::new(spec), tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
    }

    /// Re-applies version `to`, or without one the spec the app had before its last
    /// apply, as `apply` would (the current one becomes the previous: a second rollback
    /// undoes the first).
    pub async fn rollback(&self, to: Option<u64>, req: ChangeRequest) -> Result<Applied, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Rollback(to, req, tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
    }

    /// Sets (or lifts, with `None`) the floor and ceiling of an autoscaled app.
    pub async fn set_override(&self, bounds: Option<Override>) -> Result<Option<Override>, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Override(bounds, tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
    }

    /// Replaces the consumer demand the app's policy reads, for `ttl_ms`.
    pub async fn demand(&self, requests: Vec<DemandRequest>, ttl_ms: u64) -> Result<Demand, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Demand(requests, ttl_ms, tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
    }

    /// The last autoscaling decision records, newest first.
    pub fn decisions(&self) -> Arc<Vec<Arc<serde_json::Value>>> {
        self.decisions.load_full()
    }

    /// What moving units to better places would do now (`flotilla rebalance APP --plan`),
    /// as the scheduler last looked.
    pub fn rebalance(&self) -> Arc<super::rebalance::RebalancePlan> {
        self.rebalance.lock_or_recover().clone()
    }

    /// The app's serving capacity; `changed()` wakes when it changes.
    pub fn capacity(&self) -> tokio::sync::watch::Receiver<Arc<v1::Capacity>> {
        self.capacity.clone()
    }

    /// The current route table; `changed()` on the receiver wakes on every new version.
    pub fn routes(&self) -> tokio::sync::watch::Receiver<Arc<v1::RouteTable>> {
        self.routes.clone()
    }

    pub fn status(&self) -> Arc<AppStatus> {
        self.status.load_full()
    }

    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }
}

/// The scheduler's side of its handle: where each pass publishes what the handle reads.
pub(super) struct Outputs {
    pub(super) status: Arc<ArcSwap<AppStatus>>,
    pub(super) stats: Arc<Stats>,
    pub(super) routes: tokio::sync::watch::Sender<Arc<v1::RouteTable>>,
    pub(super) capacity: tokio::sync::watch::Sender<Arc<v1::Capacity>>,
    pub(super) decisions: Arc<ArcSwap<Vec<Arc<serde_json::Value>>>>,
    pub(super) rebalance: Rebalance,
    /// The routing weights' memory between passes (`crate::routes`).
    pub(super) weights: crate::routes::Weights,
    /// The routers' numbers over a canary's step in force (shared with the handle).
    pub(super) traffic: Arc<std::sync::Mutex<crate::canary::TrafficBook>>,
    /// The unit counts by state last set on the gauges.
    pub(super) counts: Option<[i64; crate::lifecycle::UnitState::ALL.len()]>,
    /// The app's route metrics, looked up once: a table is published on every weight
    /// that moves, hundreds a second in a process hosting many apps.
    pub(super) weight_changes: metrics::Counter,
    pub(super) capacity_weight: metrics::Gauge,
}

impl Outputs {
    /// The outputs of a scheduler first showing `status` and `decisions` (newest first),
    /// the handle that reads them and the receiver of its commands.
    pub(super) fn new(
        status: AppStatus,
        decisions: Vec<Arc<serde_json::Value>>,
    ) -> (Outputs, AppHandle, tokio::sync::mpsc::Receiver<Command>) {
        let app = status.app.clone();
        let status = Arc::new(ArcSwap::from_pointee(status));
        let stats = Arc::new(Stats::new());
        let (commands, rx) = tokio::sync::mpsc::channel(16);
        let (routes, routes_rx) =
            tokio::sync::watch::channel(Arc::new(v1::RouteTable { app: app.clone(), ..Default::default() }));
        let (capacity, capacity_rx) =
            tokio::sync::watch::channel(Arc::new(v1::Capacity { app: app.clone(), ..Default::default() }));
        let decisions = Arc::new(ArcSwap::from_pointee(decisions));
        let weight_changes = metrics::counter!(crate::catalogue::ROUTE_WEIGHT_CHANGES.name, "app" => app.clone());
        let capacity_weight = metrics::gauge!(crate::catalogue::APP_CAPACITY_WEIGHT.name, "app" => app.clone());
        let plan = super::rebalance::RebalancePlan { app: app.clone(), ..Default::default() };
        let rebalance = Arc::new(std::sync::Mutex::new(Arc::new(plan)));
        let traffic = Arc::new(std::sync::Mutex::new(crate::canary::TrafficBook::default()));
        let handle = AppHandle {
            traffic: traffic.clone(),
            app,
            status: status.clone(),
            stats: stats.clone(),
            commands,
            routes: routes_rx,
            capacity: capacity_rx,
            decisions: decisions.clone(),
            rebalance: rebalance.clone(),
        };
        let outputs = Outputs {
            status,
            stats,
            routes,
            capacity,
            decisions,
            rebalance,
            weights: Default::default(),
            traffic,
            counts: None,
            weight_changes,
            capacity_weight,
        };
        (outputs, handle, rx)
    }
}
