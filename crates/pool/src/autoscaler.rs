//! The pool autoscaler's loop (Ray v2's `Autoscaler.update_autoscaling_state`): every
//! `interval`, sync, decide in memory ([`crate::reconciler`]), then act through the
//! instance manager's records and the provider. Any error in the sync aborts the pass;
//! the next tick retries it. Side effects are observed at the next sync, never
//! assumed: a launch is a REQUESTED record until the provider lists it.

use crate::catalogue as m;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tracing::Instrument;

use crate::cluster::{Cluster, ClusterError, ReportAnswer, TypeBounds};
use crate::config::PoolConfig;
use crate::instance::{Change, InstanceState, Instances, NodeSeen};
use crate::model::{AppRow, Constraints, IdleClock, NodeRow, Observation, Phase, PoolInstance};
use crate::pack::Cause;
use crate::policy::PolicyState;
use crate::provider::{InstanceProvider, LaunchSpec, ProviderError};
use crate::reconciler;
use crate::store::{PoolStore, StoreError};
use crate::warm::Warm;

/// Decisions kept for `GET /v1/pools/{pool}` (newest first there).
pub const DECISIONS_KEPT: usize = 50;
/// A provider's list that takes longer aborts the pass (the exec provider also has its
/// own command timeout).
const LIST_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, thiserror::Error)]
pub enum PassError {
    #[error("listing instances: {0}")]
    List(#[from] ProviderError),
    #[error("listing instances: the provider did not answer within {0:?}")]
    ListTimeout(Duration),
    #[error("reading the cluster: {0}")]
    Cluster(#[from] ClusterError),
    #[error("persisting instances: {0}")]
    Store(#[from] StoreError),
}

pub struct Autoscaler {
    cfg: PoolConfig,
    provider: Arc<dyn InstanceProvider>,
    cluster: Arc<dyn Cluster>,
    store: PoolStore,
    instances: Instances,
    idle: IdleClock,
    constraints: Constraints,
    policy: PolicyState,
    decisions: VecDeque<Arc<Value>>,
    /// Each node type's `min` and `max` as the pool file sets them.
    file_bounds: BTreeMap<String, TypeBounds>,
    /// The operator's bounds, from the control plane's last answer.
    bounds: BTreeMap<String, TypeBounds>,
    /// Node types whose launches failed: unavailable until the time (ms), the back-off
    /// that set it (reset by a launch the provider takes) and why.
    launch_backoff: HashMap<String, TypeBackoff>,
    /// Since when no demand waited and no pass launched or terminated anything.
    still_since_ms: u64,
    /// Nodes whose consolidation was given up: left alone until the time (ms), and how
    /// many times in a row.
    given_up: HashMap<String, (u64, u32)>,
    /// The node launched for the consolidation in flight: idle until its units move in,
    /// it is not the idle rule's.
    consolidation_launch: Option<String>,
}

/// A node type that could not be had lately (a launch refused, an instance that never
/// appeared or whose agent never joined: a spot type with no capacity, a quota).
struct TypeBackoff {
    until_ms: u64,
    backoff: flotilla_core::Backoff,
    reason: String,
}

/// The first wait after a failed launch, doubling per failure up to the max: a refused
/// launch is rarely fixed in seconds (a quota, a bad image), and retrying every pass
/// floods the provider and the log.
const LAUNCH_BACKOFF_FIRST: Duration = Duration::from_secs(5);
const LAUNCH_BACKOFF_MAX: Duration = Duration::from_secs(300);

/// The labels of a node launched as type `t`: the type's, and what placement prefers it
/// by (`flotilla_core::unit_shape::preference`): whether the pool keeps nodes of the type
/// anyway (a `min`), and its cost.
fn pool_labels(t: &crate::config::PoolNodeType) -> BTreeMap<String, String> {
    use flotilla_core::unit_shape::{POOL_COST, POOL_KEEPS};
    let mut labels = t.labels.clone();
    labels.insert(POOL_KEEPS.into(), (t.min > 0).to_string());
    if let Some(cost) = t.cost {
        labels.insert(POOL_COST.into(), format!("{:.0}", (cost * 1000.0).max(0.0)));
    }
    labels
}

fn phase(s: InstanceState) -> Option<Phase> {
    use InstanceState::*;
    match s {
        Queued | Requested | Allocated | AgentStarting => Some(Phase::Pending),
        Running => Some(Phase::Running),
        DrainRequested | Draining | Drained | Terminating | TerminationFailed | AgentStartFailed => {
            Some(Phase::Leaving)
        }
        Terminated | AllocationFailed => None,
    }
}

impl Autoscaler {
    /// An autoscaler resuming from the records in `store`: what it launched before a
    /// restart is matched to the provider's list by id, neither leaked nor launched twice.
    pub fn new(
        cfg: PoolConfig,
        provider: Arc<dyn InstanceProvider>,
        cluster: Arc<dyn Cluster>,
        store: PoolStore,
    ) -> Result<Self, StoreError> {
        let seed = flotilla_core::now_ms() ^ u64::from(std::process::id()).rotate_left(32);
        Self::seeded(cfg, provider, cluster, store, seed)
    }

    /// As [`Autoscaler::new`], with instance ids drawn from `seed`: a simulation that
    /// replays gets the same ids, so the same ties are broken the same way.
    pub fn seeded(
        cfg: PoolConfig,
        provider: Arc<dyn InstanceProvider>,
        cluster: Arc<dyn Cluster>,
        mut store: PoolStore,
        seed: u64,
    ) -> Result<Self, StoreError> {
        let mut instances = Instances::new(cfg.node_types.iter().map(|t| t.name.clone()), seed);
        let records = store.load()?;
        tracing::info!(pool = %cfg.name, records = records.len(), "pool autoscaler resuming");
        instances.restore(records);
        let file_bounds =
            cfg.node_types.iter().map(|t| (t.name.clone(), TypeBounds { min: t.min, max: t.max })).collect();
        Ok(Autoscaler {
            file_bounds,
            bounds: BTreeMap::new(),
            cfg,
            provider,
            cluster,
            store,
            instances,
            idle: IdleClock::default(),
            constraints: Constraints::default(),
            policy: PolicyState::default(),
            decisions: VecDeque::new(),
            launch_backoff: HashMap::new(),
            still_since_ms: flotilla_core::now_ms(),
            given_up: HashMap::new(),
            consolidation_launch: None,
        })
    }

    /// Runs passes every `interval` until `stop` resolves.
    pub async fn run(mut self, stop: impl std::future::Future<Output = ()>) {
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => break,
                _ = tick.tick() => {}
            }
            let pool = self.cfg.name.clone();
            let start = Instant::now();
            let outcome = match self.pass().instrument(tracing::info_span!("pool_pass", pool = %pool)).await {
                Ok(()) => "ok",
                Err(e) => {
                    tracing::warn!(pool = %pool, error = %e, "pool pass aborted; retrying at the next tick");
                    "error"
                }
            };
            metrics::counter!(m::PASSES.name, "pool" => pool.clone(), "outcome" => outcome).increment(1);
            metrics::histogram!(m::PASS_SECONDS.name, "pool" => pool).record(start.elapsed().as_secs_f64());
        }
    }

    /// One pass: sync, decide, act, persist, report.
    pub async fn pass(&mut self) -> Result<(), PassError> {
        let now = flotilla_core::now_ms();
        let cloud = tokio::time::timeout(LIST_TIMEOUT, self.provider.list())
            .await
            .map_err(|_| PassError::ListTimeout(LIST_TIMEOUT))??;
        let nodes = self.cluster.nodes().await?;
        let apps = self.cluster.apps().await?;
        // The pool's own nodes: all it tracks by instance (at 100,000 nodes most are not
        // its own, and a pass that copied each of their ids cost more than the packing).
        // (Listed by the provider too: `observe` adopts those below.)
        let listed: std::collections::HashSet<&str> = cloud.iter().map(|c| c.id.as_str()).collect();
        let own: Vec<&NodeRow> = nodes
            .iter()
            .filter(|n| self.instances.get(n.node_id.as_str()).is_some() || listed.contains(n.node_id.as_str()))
            .collect();
        self.idle.update(own.iter().copied(), now);
        let seen: HashMap<String, NodeSeen> = own
            .iter()
            .map(|n| {
                let s = NodeSeen {
                    alive: n.status == flotilla_core::NodeStatus::Alive,
                    dead: n.status == flotilla_core::NodeStatus::Dead,
                    draining: n.drain_requested,
                    allocated_nothing: n.allocated.is_zero(),
                };
                (n.node_id.to_string(), s)
            })
            .collect();
        let t = self.cfg.timeouts;
        let mut changes = self.instances.observe(&cloud, &seen, now, &t);
        // An instance that never appeared or never joined makes its type unavailable
        // (once per type and pass); one of the type that runs ends its back-off.
        let mut failed: BTreeMap<&str, String> = BTreeMap::new();
        for c in &changes {
            if let crate::instance::Change::Transition { node_type, to, reason, .. } = c {
                match to {
                    InstanceState::AllocationFailed | InstanceState::AgentStartFailed => {
                        failed.entry(node_type).or_insert_with(|| format!("{}: {reason}", to.as_str()));
                    }
                    InstanceState::Running => {
                        self.launch_backoff.remove(node_type);
                    }
                    _ => {}
                }
            }
        }
        for (node_type, reason) in failed {
            self.back_off(node_type, now, &reason);
        }
        // Fallback: a type that cannot be had now launches nothing more, and what waits
        // to launch as it is given up, so the packing below sends the demand to the next
        // type that can hold it (the Cluster Autoscaler waits 15 minutes for this).
        let unavailable: BTreeMap<String, String> =
            self.unavailable(now).map(|(t, b)| (t.to_string(), b.reason.clone())).collect();
        for (node_type, reason) in &unavailable {
            changes.extend(self.instances.cancel_queued(node_type, now, &format!("its type is unavailable: {reason}")));
        }
        for nt in &self.cfg.node_types {
            metrics::gauge!(m::TYPE_UNAVAILABLE.name, "pool" => self.cfg.name.clone(), "node_type" => nt.name.clone())
                .set(if unavailable.contains_key(&nt.name) { 1.0 } else { 0.0 });
        }

        let pool_instances: Vec<PoolInstance> = self
            .instances
            .iter()
            .filter_map(|i| {
                phase(i.state).map(|phase| PoolInstance {
                    id: i.id.clone(),
                    node_type: i.node_type.clone(),
                    phase,
                    warm: i.warm.is_some(),
                })
            })
            .collect();
        let obs = Observation {
            nodes: &nodes,
            apps: &apps,
            instances: &pool_instances,
            floor: &self.constraints,
            idle: &self.idle,
            unavailable: &unavailable,
            now_ms: now,
        };
        let (plan, record) = reconciler::decide(&self.cfg, &obs, &mut self.policy);
        metrics::histogram!(m::DECISION_SECONDS.name, "pool" => self.cfg.name.clone())
            .record(record["decision_seconds"].as_f64().unwrap_or(0.0));
        for kind in ["packed", "left_out"] {
            let n = record["packing"][format!("nodes_{kind}")].as_u64().unwrap_or(0);
            metrics::gauge!(m::PACKED_NODES.name, "pool" => self.cfg.name.clone(), "kind" => kind).set(n as f64);
        }

        for (node_type, n) in &plan.launch {
            let why = plan.launch_reasons.get(node_type).map(|r| r.join(", ")).unwrap_or_default();
            let ids = self.instances.queue(node_type, *n as usize, now, &why);
            tracing::info!(pool = %self.cfg.name, %node_type, count = ids.len(), reason = %why, "queueing instances");
            metrics::counter!(m::LAUNCHES.name, "pool" => self.cfg.name.clone(), "node_type" => node_type.clone())
                .increment(ids.len() as u64);
        }
        let warm = self.warm_pools(&own, &plan, &unavailable, now).await;
        let mut record = record;
        if !warm.claim.is_empty() || !warm.replenish.is_empty() {
            let mut why: Vec<String> =
                warm.claim.iter().map(|id| format!("claim warm {id} for pending demand")).collect();
            why.extend(warm.replenish.iter().map(|(t, n)| format!("launch {n} × {t} (warm pool)")));
            explain(&mut record, &why);
            record["warm"] = json!({"claimed": warm.claim, "launched": warm.replenish});
        }
        let saw = Seen { nodes: &nodes, own: &own, apps: &apps, instances: &pool_instances, unavailable: &unavailable };
        let step = self.consolidation(&saw, &plan, now, &mut changes).await;
        explain(&mut record, &step.why);
        if let Some(c) = step.record {
            record["consolidation"] = c;
        }
        for term in &plan.terminate {
            if term.cause == Cause::Idle && self.consolidation_launch.as_deref() == Some(term.node_id.as_str()) {
                continue;
            }
            let Some(state) = self.instances.get(&term.node_id).map(|i| i.state) else { continue };
            let cause = term.cause.as_str();
            let r = if state == InstanceState::Running {
                self.instances.request_drain(&term.node_id, now, term.cause, &term.detail)
            } else {
                self.instances.request_terminate(&term.node_id, now, &format!("{cause}: {}", term.detail))
            };
            match r {
                Ok(c) => changes.push(c),
                Err(e) => tracing::warn!(error = %e, "terminating an instance"),
            }
            metrics::counter!(m::TERMINATIONS.name, "pool" => self.cfg.name.clone(),
                "node_type" => term.node_type.clone(), "cause" => cause)
            .increment(1);
        }

        self.drain(&seen, now, &mut changes).await;
        self.terminate(&changes, now).await;
        // A store that takes no writes stops launches (nothing is launched unrecorded),
        // not the report: `flotilla pool` says why the pool stands still.
        let persisted = match self.launch(now).await {
            Ok(()) => self.persist(now),
            Err(e) => Err(e),
        };
        self.export_gauges();
        self.remember(record);
        while self.decisions.len() > DECISIONS_KEPT {
            self.decisions.pop_front();
        }
        let report = self.report();
        match self.cluster.report(&self.cfg.name, &report).await {
            Ok(ReportAnswer { constraints, bounds }) => {
                self.constraints = constraints;
                self.set_bounds(bounds);
            }
            Err(e) => tracing::warn!(error = %e, "reporting the pool to the control plane"),
        }
        Ok(persisted?)
    }

    /// Saves every record (so one the store refused earlier is written once it takes
    /// writes again) and removes those pruned.
    fn persist(&mut self, now: u64) -> Result<(), StoreError> {
        let records: Vec<_> = self.instances.iter().cloned().collect();
        self.store.save(&records)?;
        let pruned = self.instances.prune(now, &self.cfg.timeouts);
        if !pruned.is_empty() {
            self.store.remove(&pruned)?;
        }
        Ok(())
    }

    /// Takes the operator's node type bounds from the next pass on: each replaces the
    /// pool file's `min` and `max` for its type; a type without one goes back to the
    /// file's. A bound naming a type the pool does not have, or with min above max, is
    /// ignored with a warning (when it first arrives).
    pub fn set_bounds(&mut self, bounds: BTreeMap<String, TypeBounds>) {
        if bounds == self.bounds {
            return;
        }
        for (name, b) in &bounds {
            if !self.file_bounds.contains_key(name) {
                tracing::warn!(pool = %self.cfg.name, node_type = %name, "bounds name a node type the pool does not have; ignored");
            } else if let Err(e) = b.validate() {
                tracing::warn!(pool = %self.cfg.name, node_type = %name, error = %e, "bad node type bounds; ignored");
            }
        }
        for t in &mut self.cfg.node_types {
            let file = self.file_bounds.get(&t.name).copied().unwrap_or(TypeBounds { min: t.min, max: t.max });
            let b = bounds.get(&t.name).copied().filter(|b| b.validate().is_ok()).unwrap_or(file);
            if (t.min, t.max) != (b.min, b.max) {
                tracing::info!(pool = %self.cfg.name, node_type = %t.name, min = b.min, max = b.max, "node type bounds changed");
            }
            (t.min, t.max) = (b.min, b.max);
        }
        self.bounds = bounds;
    }

    /// Keeps a pass's record; a quiet pass after a quiet pass replaces it (counted in
    /// `repeated`), so the records kept span hours of calm, not four minutes.
    fn remember(&mut self, mut record: Value) {
        let quiet = |r: &Value| {
            ["launch", "terminate", "infeasible"]
                .iter()
                .all(|k| r[k].as_object().is_none_or(|m| m.is_empty()) && r[k].as_array().is_none_or(|a| a.is_empty()))
                && r.get("policy").is_none()
                && r.get("warm").is_none()
                && r.get("consolidation").is_none()
        };
        if quiet(&record)
            && let Some(last) = self.decisions.back()
            && quiet(last)
            && last["explanation"] == record["explanation"]
        {
            record["repeated"] = json!(last["repeated"].as_u64().unwrap_or(1) + 1);
            record["since_ms"] = last.get("since_ms").cloned().unwrap_or_else(|| last["at_ms"].clone());
            self.decisions.pop_back();
        }
        self.decisions.push_back(Arc::new(record));
    }

    /// DRAIN_REQUESTED: the node is drained (cordoned; what it runs moves make-before-break).
    /// A node asked to go for being idle that took work since goes back to RUNNING
    /// instead; one asked to go for a limit or a policy is drained whatever it runs.
    async fn drain(&mut self, seen: &HashMap<String, NodeSeen>, now: u64, changes: &mut Vec<Change>) {
        let asked: Vec<(String, bool)> = self
            .instances
            .iter()
            .filter(|i| i.state == InstanceState::DrainRequested)
            .map(|i| (i.id.clone(), i.drain_cause == Some(Cause::Idle)))
            .collect();
        for (id, for_idleness) in asked {
            if for_idleness && !seen.get(&id).is_some_and(|s| s.allocated_nothing) {
                if let Ok(c) = self.instances.drain_refused(&id, now, "no longer idle as the drain arrived") {
                    changes.push(c);
                }
                continue;
            }
            // DRAINING follows when the next sync sees the node draining.
            if let Err(e) = self.cluster.drain(&id).await {
                tracing::warn!(instance = %id, error = %e, "draining a node failed; retrying next pass");
            }
        }
    }

    /// Calls the provider for every instance that just entered TERMINATING, and for
    /// listed instances whose records are finished (a late launch, a lost terminate).
    async fn terminate(&mut self, changes: &[Change], now: u64) {
        let mut ids: Vec<String> = Vec::new();
        for c in changes {
            match c {
                Change::Transition { id, to: InstanceState::Terminating, .. } => ids.push(id.clone()),
                Change::Leaked { id, .. } => ids.push(id.clone()),
                _ => {}
            }
        }
        ids.sort();
        ids.dedup();
        for id in ids {
            if let Err(e) = self.provider.terminate(&id).await {
                tracing::warn!(instance = %id, error = %e, "terminating an instance failed");
                let _ = self.instances.terminate_failed(&id, now, &e.to_string());
            }
        }
    }

    /// QUEUED → REQUESTED within `max_concurrent_launches` and `upscaling_speed`. The
    /// record is persisted REQUESTED before the provider is called, so a crash between
    /// the two never launches twice: the next sync finds the instance listed by its id.
    async fn launch(&mut self, now: u64) -> Result<(), StoreError> {
        let ids = self.instances.to_launch(self.cfg.max_concurrent_launches as usize, self.cfg.upscaling_speed, now);
        if ids.is_empty() {
            return Ok(());
        }
        let mut specs = Vec::new();
        for id in &ids {
            // A type whose launches failed waits its back-off; its instances stay queued.
            let waits = self.instances.get(id).and_then(|i| self.launch_backoff.get(&i.node_type));
            if waits.is_some_and(|b| now < b.until_ms) {
                continue;
            }
            if self.instances.begin_launch(id, now).is_err() {
                continue;
            }
            let Some(inst) = self.instances.get(id) else { continue };
            let Some(t) = self.cfg.node_type(&inst.node_type) else { continue };
            specs.push(LaunchSpec {
                id: id.clone(),
                node_type: t.name.clone(),
                resources: t.resources.clone(),
                labels: pool_labels(t),
                cordoned: inst.warm == Some(Warm::Held),
            });
        }
        let records: Vec<_> = specs.iter().filter_map(|s| self.instances.get(&s.id).cloned()).collect();
        if let Err(e) = self.store.save(&records) {
            for spec in &specs {
                let _ = self.instances.launch_not_started(&spec.id, now, &e.to_string());
            }
            return Err(e);
        }
        for spec in specs {
            if self.launch_backoff.get(&spec.node_type).is_some_and(|b| now < b.until_ms) {
                // Its type failed earlier in this pass: the rest wait with it.
                let _ = self.instances.launch_not_started(&spec.id, now, "its type's launches back off");
                continue;
            }
            tracing::info!(instance = %spec.id, node_type = %spec.node_type, "launching an instance");
            match self.provider.launch(&spec).await {
                // The back-off ends when an instance of the type runs (`pass`): a
                // launch the provider takes may still never appear (no capacity).
                Ok(()) => {}
                Err(e) => {
                    let wait = self.back_off(&spec.node_type, now, &format!("launch failed: {e}"));
                    tracing::warn!(instance = %spec.id, error = %e, retry_in = ?wait, "launch failed; launches of its type back off");
                    metrics::counter!(m::LAUNCH_FAILURES.name, "pool" => self.cfg.name.clone(),
                        "node_type" => spec.node_type.clone())
                    .increment(1);
                    let _ = self.instances.launch_failed(&spec.id, now, &e.to_string(), &self.cfg.timeouts);
                }
            }
        }
        Ok(())
    }

    /// Claims the warm nodes the packing put demand on (an uncordon), settles the
    /// claimed ones the view shows uncordoned, and queues warm replacements.
    async fn warm_pools(
        &mut self,
        own: &[&NodeRow],
        plan: &crate::pack::Plan,
        unavailable: &BTreeMap<String, String>,
        now: u64,
    ) -> crate::warm::WarmPlan {
        let cordoned: HashMap<&str, bool> = own.iter().map(|n| (n.node_id.as_str(), n.cordoned)).collect();
        let all: Vec<&crate::instance::Instance> = self.instances.iter().collect();
        let wp = crate::warm::plan(&self.cfg, &all, &cordoned, &plan.demand_on, unavailable);
        for id in &wp.claim {
            tracing::info!(pool = %self.cfg.name, instance = %id, "claiming a warm node for pending demand");
            self.instances.set_warm(id, Some(Warm::Claimed));
            let node_type = self.instances.get(id).map(|i| i.node_type.clone()).unwrap_or_default();
            metrics::counter!(m::WARM_CLAIMS.name, "pool" => self.cfg.name.clone(), "node_type" => node_type)
                .increment(1);
        }
        // A claimed node not registered yet is uncordoned once it shows (`wp.uncordon`).
        for id in wp.claim.iter().filter(|id| cordoned.contains_key(id.as_str())).chain(&wp.uncordon) {
            if let Err(e) = self.cluster.set_cordon(id, false).await {
                tracing::warn!(instance = %id, error = %e, "uncordoning a claimed warm node failed; retrying next pass");
            }
        }
        for id in &wp.settled {
            self.instances.set_warm(id, None);
        }
        for (node_type, n) in &wp.replenish {
            let why = format!("warm pool: {n} held ready");
            let ids = self.instances.queue_as(node_type, *n as usize, now, &why, Some(Warm::Held));
            tracing::info!(pool = %self.cfg.name, %node_type, count = ids.len(), "queueing warm instances");
        }
        for id in &wp.release {
            let why = "warm pool: more held than the type's warm";
            let r = match self.instances.get(id).map(|i| i.state) {
                Some(InstanceState::Running) => self.instances.request_drain(id, now, Cause::Idle, why),
                _ => self.instances.request_terminate(id, now, why),
            };
            if let Err(e) = r {
                tracing::warn!(instance = %id, error = %e, "releasing a surplus warm instance");
            }
        }
        wp
    }

    /// Node types that cannot be had at `now`, with their back-off.
    fn unavailable(&self, now: u64) -> impl Iterator<Item = (&str, &TypeBackoff)> {
        self.launch_backoff.iter().filter(move |(_, b)| now < b.until_ms).map(|(t, b)| (t.as_str(), b))
    }

    /// The instances of `node_type` held warm.
    fn held(&self, node_type: &str) -> usize {
        self.instances.live_of_type(node_type).filter(|i| i.warm == Some(Warm::Held)).count()
    }

    /// Marks `node_type` unavailable for its next back-off (doubling per failure);
    /// returns the wait.
    fn back_off(&mut self, node_type: &str, now: u64, reason: &str) -> Duration {
        let b = self.launch_backoff.entry(node_type.to_string()).or_insert_with(|| TypeBackoff {
            until_ms: 0,
            backoff: flotilla_core::Backoff::new(LAUNCH_BACKOFF_FIRST, LAUNCH_BACKOFF_MAX).with_jitter(0.2),
            reason: String::new(),
        });
        let wait = b.backoff.next_wait();
        b.until_ms = now + u64::try_from(wait.as_millis()).unwrap_or(u64::MAX / 2);
        b.reason = reason.to_string();
        tracing::warn!(pool = %self.cfg.name, %node_type, %reason, unavailable_for = ?wait, "node type unavailable; demand goes to other types");
        wait
    }

    fn export_gauges(&self) {
        let counts = self.instances.by_type_state();
        for t in &self.cfg.node_types {
            for s in InstanceState::ALL {
                let n = counts.get(&(t.name.clone(), s)).copied().unwrap_or(0);
                metrics::gauge!(m::INSTANCES.name, "pool" => self.cfg.name.clone(),
                    "node_type" => t.name.clone(), "state" => s.as_str())
                .set(n as f64);
            }
            metrics::gauge!(m::WARM_INSTANCES.name, "pool" => self.cfg.name.clone(), "node_type" => t.name.clone())
                .set(self.held(&t.name) as f64);
        }
    }

    /// What the control plane shows of the pool: its types, instances and decisions.
    pub fn report(&self) -> Value {
        let mut by_type: BTreeMap<String, BTreeMap<&str, usize>> = BTreeMap::new();
        for ((t, s), n) in self.instances.by_type_state() {
            by_type.entry(t).or_default().insert(s.as_str(), n);
        }
        let types: Vec<Value> = self
            .cfg
            .node_types
            .iter()
            .map(|t| {
                let held = self.held(&t.name);
                json!({"name": t.name, "resources": t.resources, "labels": t.labels, "min": t.min, "max": t.max,
                       "cost": t.cost, "idle_timeout_s": t.idle_timeout.map(|d| d.as_secs()), "warm": t.warm,
                       "warm_held": held})
            })
            .collect();
        let instances: Vec<&crate::instance::Instance> = self.instances.iter().collect();
        json!({
            "provider": self.provider.name(),
            "interval_s": self.cfg.interval.as_secs(),
            "max_nodes": self.cfg.max_nodes,
            "node_types": types,
            "by_type": by_type,
            "instances": instances,
            "decisions": self.decisions.iter().rev().map(|d| d.as_ref()).collect::<Vec<_>>(),
            "store_failing": self.store.failing(),
            // Node types whose launches back off after a failure, and until when (ms).
            "launch_backoff": self.launch_backoff.iter().map(|(t, b)| (t.clone(), b.until_ms)).collect::<BTreeMap<_, _>>(),
            // Of those, the ones still unavailable and why: demand goes to other types.
            "unavailable": self.unavailable(flotilla_core::now_ms())
                .map(|(t, b)| (t, json!({"until_ms": b.until_ms, "reason": b.reason})))
                .collect::<BTreeMap<_, _>>(),
        })
    }

    /// The instance records (for tests and status).
    pub fn instances(&self) -> &Instances {
        &self.instances
    }
}

/// What the pass saw, as the consolidation step reads it.
struct Seen<'a> {
    nodes: &'a [NodeRow],
    /// Of those, the pool's own.
    own: &'a [&'a NodeRow],
    apps: &'a [AppRow],
    instances: &'a [PoolInstance],
    unavailable: &'a BTreeMap<String, String>,
}

/// Appends `why` to a pass record's explanation (replacing "no change").
fn explain(record: &mut Value, why: &[String]) {
    if why.is_empty() {
        return;
    }
    let text = record["explanation"].as_str().unwrap_or_default();
    let text = if text.starts_with("no change") { why.join("; ") } else { format!("{text}; {}", why.join("; ")) };
    record["explanation"] = json!(text);
}

mod consolidation;
#[cfg(test)]
mod tests;
