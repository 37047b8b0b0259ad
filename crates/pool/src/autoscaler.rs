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
use crate::model::{Constraints, IdleClock, Observation, Phase, PoolInstance};
use crate::pack::Cause;
use crate::policy::PolicyState;
use crate::provider::{InstanceProvider, LaunchSpec, ProviderError};
use crate::reconciler;
use crate::store::{PoolStore, StoreError};

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
    /// Node types whose last launch failed: no launch before the time (ms), and the
    /// back-off that set it (reset by a launch the provider takes).
    launch_backoff: HashMap<String, (u64, flotilla_core::Backoff)>,
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
        mut store: PoolStore,
    ) -> Result<Self, StoreError> {
        let seed = flotilla_core::now_ms() ^ u64::from(std::process::id()).rotate_left(32);
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
        self.idle.update(&nodes, now);
        let seen: HashMap<String, NodeSeen> = nodes
            .iter()
            .map(|n| {
                let s = NodeSeen {
                    alive: n.status == "alive",
                    dead: n.status == "dead",
                    draining: n.drain_requested,
                    allocated_nothing: n.allocated.is_zero(),
                };
                (n.node_id.clone(), s)
            })
            .collect();
        let t = self.cfg.timeouts;
        let mut changes = self.instances.observe(&cloud, &seen, now, &t);

        let pool_instances: Vec<PoolInstance> = self
            .instances
            .iter()
            .filter_map(|i| {
                phase(i.state).map(|phase| PoolInstance { id: i.id.clone(), node_type: i.node_type.clone(), phase })
            })
            .collect();
        let obs = Observation {
            nodes: &nodes,
            apps: &apps,
            instances: &pool_instances,
            floor: &self.constraints,
            idle: &self.idle,
            now_ms: now,
        };
        let (plan, record) = reconciler::decide(&self.cfg, &obs, &mut self.policy);
        metrics::histogram!(m::DECISION_SECONDS.name, "pool" => self.cfg.name.clone())
            .record(record["decision_seconds"].as_f64().unwrap_or(0.0));

        for (node_type, n) in &plan.launch {
            let why = plan.launch_reasons.get(node_type).map(|r| r.join(", ")).unwrap_or_default();
            let ids = self.instances.queue(node_type, *n as usize, now, &why);
            tracing::info!(pool = %self.cfg.name, %node_type, count = ids.len(), reason = %why, "queueing instances");
            metrics::counter!(m::LAUNCHES.name, "pool" => self.cfg.name.clone(), "node_type" => node_type.clone())
                .increment(ids.len() as u64);
        }
        for term in &plan.terminate {
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
            if waits.is_some_and(|(until, _)| now < *until) {
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
            if self.launch_backoff.get(&spec.node_type).is_some_and(|(until, _)| now < *until) {
                // Its type failed earlier in this pass: the rest wait with it.
                let _ = self.instances.launch_not_started(&spec.id, now, "its type's launches back off");
                continue;
            }
            tracing::info!(instance = %spec.id, node_type = %spec.node_type, "launching an instance");
            match self.provider.launch(&spec).await {
                Ok(()) => {
                    self.launch_backoff.remove(&spec.node_type);
                }
                Err(e) => {
                    let (until, backoff) = self.launch_backoff.entry(spec.node_type.clone()).or_insert_with(|| {
                        (0, flotilla_core::Backoff::new(LAUNCH_BACKOFF_FIRST, LAUNCH_BACKOFF_MAX).with_jitter(0.2))
                    });
                    let wait = backoff.next_wait();
                    *until = now + u64::try_from(wait.as_millis()).unwrap_or(u64::MAX / 2);
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

    fn export_gauges(&self) {
        let counts = self.instances.by_type_state();
        for t in &self.cfg.node_types {
            for s in InstanceState::ALL {
                let n = counts.get(&(t.name.clone(), s)).copied().unwrap_or(0);
                metrics::gauge!(m::INSTANCES.name, "pool" => self.cfg.name.clone(),
                    "node_type" => t.name.clone(), "state" => s.as_str())
                .set(n as f64);
            }
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
                json!({"name": t.name, "resources": t.resources, "labels": t.labels, "min": t.min, "max": t.max,
                       "cost": t.cost, "idle_timeout_s": t.idle_timeout.map(|d| d.as_secs())})
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
            "launch_backoff": self.launch_backoff.iter().map(|(t, (until, _))| (t.clone(), *until)).collect::<BTreeMap<_, _>>(),
        })
    }

    /// The instance records (for tests and status).
    pub fn instances(&self) -> &Instances {
        &self.instances
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use flotilla_core::Resources;
    use flotilla_core::UnitShape;

    use super::*;
    use crate::model::{AppRow, NodeRow, Queued};
    use crate::provider::{BoxFuture, CloudInstance};

    #[derive(Default)]
    struct FakeProvider {
        running: Mutex<BTreeMap<String, String>>,
        launches: Mutex<Vec<String>>,
        /// Refuse every launch.
        refuse: std::sync::atomic::AtomicBool,
    }

    impl InstanceProvider for FakeProvider {
        fn name(&self) -> &'static str {
            "fake"
        }
        fn list(&self) -> BoxFuture<'_, Result<Vec<CloudInstance>, ProviderError>> {
            let l = self
                .running
                .lock()
                .unwrap()
                .iter()
                .map(|(id, t)| CloudInstance { id: id.clone(), node_type: t.clone() })
                .collect();
            Box::pin(async move { Ok(l) })
        }
        fn launch<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<(), ProviderError>> {
            self.launches.lock().unwrap().push(spec.id.clone());
            if self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
                let e = ProviderError::Exit { command: "launch".into(), status: "1".into(), stderr: "quota".into() };
                return Box::pin(async move { Err(e) });
            }
            self.running.lock().unwrap().insert(spec.id.clone(), spec.node_type.clone());
            Box::pin(async { Ok(()) })
        }
        fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
            self.running.lock().unwrap().remove(id);
            Box::pin(async { Ok(()) })
        }
    }

    /// A control plane whose nodes are the provider's instances, all Alive and idle.
    struct FakeCluster {
        provider: Arc<FakeProvider>,
        apps: Mutex<Vec<AppRow>>,
        drains: Mutex<Vec<String>>,
        bounds: Mutex<BTreeMap<String, TypeBounds>>,
    }

    impl FakeCluster {
        /// The echo app with `queued` units waiting, each two 1-CPU members.
        fn with_echo(provider: &Arc<FakeProvider>, queued: u32) -> Arc<Self> {
            let member = Resources::new(1000, 1 << 30, 0);
            Arc::new(FakeCluster {
                provider: provider.clone(),
                apps: Mutex::new(vec![AppRow {
                    app: "echo".into(),
                    queued: Queued { primary: queued, secondary: 0 },
                    unit_shape: UnitShape { members: vec![member.clone(), member], ..Default::default() },
                }]),
                drains: Mutex::new(vec![]),
                bounds: Mutex::new(BTreeMap::new()),
            })
        }
    }

    impl Cluster for FakeCluster {
        fn nodes(&self) -> BoxFuture<'_, Result<Vec<NodeRow>, ClusterError>> {
            let drains = self.drains.lock().unwrap().clone();
            let rows = self
                .provider
                .running
                .lock()
                .unwrap()
                .keys()
                .map(|id| NodeRow {
                    node_id: id.clone(),
                    status: "alive".into(),
                    labels: BTreeMap::new(),
                    capacity: Resources::new(2000, 4 << 30, 0),
                    allocated: Resources::default(),
                    cordoned: drains.contains(id),
                    drain_requested: drains.contains(id),
                })
                .collect();
            Box::pin(async move { Ok(rows) })
        }
        fn apps(&self) -> BoxFuture<'_, Result<Vec<AppRow>, ClusterError>> {
            let a = self.apps.lock().unwrap().clone();
            Box::pin(async move { Ok(a) })
        }
        fn drain<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ClusterError>> {
            self.drains.lock().unwrap().push(node.to_string());
            Box::pin(async { Ok(()) })
        }
        fn report<'a>(&'a self, _: &'a str, r: &'a Value) -> BoxFuture<'a, Result<ReportAnswer, ClusterError>> {
            assert!(r["instances"].is_array());
            let bounds = self.bounds.lock().unwrap().clone();
            Box::pin(async move { Ok(ReportAnswer { constraints: Constraints::default(), bounds }) })
        }
    }

    const POOL: &str = r#"
        max_concurrent_launches = 10
        upscaling_speed = 10.0
        idle_timeout = "1s"
        [node_types.t]
        cpu = 2
        memory = "4Gi"
        max = 5
    "#;

    /// An empty dir of this test process's own.
    fn fresh_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("flotilla-pool-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn scaler(dir: &std::path::Path, p: &Arc<FakeProvider>, c: &Arc<FakeCluster>) -> Autoscaler {
        let store = PoolStore::open("test", dir.join("pool.redb")).unwrap();
        Autoscaler::new(PoolConfig::parse(POOL).unwrap(), p.clone(), c.clone(), store).unwrap()
    }

    #[tokio::test]
    async fn queued_units_launch_nodes_once_across_a_restart_and_idle_ones_go() {
        let dir = fresh_dir("driver");
        let provider = Arc::new(FakeProvider::default());
        let cluster = FakeCluster::with_echo(&provider, 3);
        let mut a = scaler(&dir, &provider, &cluster);
        a.pass().await.unwrap();
        // Each unit (2 × 1 CPU) fills one 2-CPU node.
        assert_eq!(provider.launches.lock().unwrap().len(), 3);
        let record = a.report();
        assert!(record["decisions"][0]["explanation"].as_str().unwrap().contains("launch 3 × t"), "{record}");
        drop(a);

        // A restarted autoscaler finds its instances by id: the pending demand is already
        // covered by the nodes coming up, so nothing is launched twice.
        let mut a = scaler(&dir, &provider, &cluster);
        a.pass().await.unwrap();
        assert_eq!(provider.launches.lock().unwrap().len(), 3, "no double launch after a restart");
        assert_eq!(a.instances().iter().filter(|i| i.state == InstanceState::Running).count(), 3);

        // The units are placed (no longer queued); the nodes idle past the timeout are
        // drained, then terminated once the view shows them drained.
        cluster.apps.lock().unwrap()[0].queued = Queued::default();
        a.pass().await.unwrap();
        tokio::time::sleep(Duration::from_millis(1100)).await;
        a.pass().await.unwrap();
        assert_eq!(cluster.drains.lock().unwrap().len(), 3, "every idle node is drained");
        a.pass().await.unwrap();
        a.pass().await.unwrap();
        assert!(provider.running.lock().unwrap().is_empty(), "drained nodes are terminated");
        assert!(a.instances().iter().all(|i| i.state == InstanceState::Terminated));

        // Quiet passes fold into one record.
        let kept = a.report()["decisions"].as_array().unwrap().len();
        for _ in 0..3 {
            a.pass().await.unwrap();
        }
        let report = a.report();
        let decisions = report["decisions"].as_array().unwrap();
        assert!(decisions.len() <= kept + 1, "{report}");
        assert!(decisions[0]["repeated"].as_u64().unwrap() >= 3, "{report}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn operator_bounds_replace_the_files_from_the_next_pass() {
        let dir = fresh_dir("bounds");
        let provider = Arc::new(FakeProvider::default());
        let cluster = FakeCluster::with_echo(&provider, 0);
        let mut a = scaler(&dir, &provider, &cluster);
        a.pass().await.unwrap();
        assert!(provider.launches.lock().unwrap().is_empty(), "no demand, min 0: nothing launched");
        // min 2 for t (and a bound for a type the pool lacks, ignored): taken with the
        // answer to this pass's report, acted on at the next pass.
        *cluster.bounds.lock().unwrap() = BTreeMap::from([
            ("t".into(), TypeBounds { min: 2, max: 4 }),
            ("nope".into(), TypeBounds { min: 1, max: 1 }),
        ]);
        a.pass().await.unwrap();
        assert_eq!(a.report()["node_types"][0]["min"], 2);
        assert_eq!(a.report()["node_types"][0]["max"], 4);
        a.pass().await.unwrap();
        assert_eq!(provider.launches.lock().unwrap().len(), 2, "the raised min is held");
        // Lifting the bounds restores the file's.
        *cluster.bounds.lock().unwrap() = BTreeMap::new();
        a.pass().await.unwrap();
        assert_eq!(a.report()["node_types"][0]["min"], 0);
        assert_eq!(a.report()["node_types"][0]["max"], 5);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue #34 item 7: while the store refuses writes the pool launches nothing (it
    /// could not record the launch), says why in its report, and counts no launch
    /// attempt; once the store takes writes again the same instances go out, once.
    #[tokio::test]
    async fn a_pool_whose_store_fails_launches_nothing_says_why_and_resumes() {
        let dir = fresh_dir("flaky");
        let provider = Arc::new(FakeProvider::default());
        let cluster = FakeCluster::with_echo(&provider, 3);
        let (store, full) = crate::store::testing::flaky(&dir.join("pool.redb")).unwrap();
        let mut a =
            Autoscaler::new(PoolConfig::parse(POOL).unwrap(), provider.clone(), cluster.clone(), store).unwrap();
        full.store(true, std::sync::atomic::Ordering::SeqCst);
        for _ in 0..2 {
            assert!(matches!(a.pass().await, Err(PassError::Store(_))));
        }
        assert!(provider.launches.lock().unwrap().is_empty(), "nothing launched unrecorded");
        let report = a.report();
        assert!(report["store_failing"].as_str().is_some_and(|e| !e.is_empty()), "{report}");
        assert_eq!(a.instances().iter().filter(|i| i.state == InstanceState::Queued).count(), 3, "{report}");
        assert!(a.instances().iter().all(|i| i.launch_attempts == 0), "the store failed, not the provider");

        full.store(false, std::sync::atomic::Ordering::SeqCst);
        a.pass().await.unwrap();
        assert_eq!(provider.launches.lock().unwrap().len(), 3, "the queued three, not three more");
        assert!(a.report()["store_failing"].is_null());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue #35 item 6: a refused launch backs its type off (5 s, doubling): passes
    /// within it launch nothing of the type, where every pass retried before.
    #[tokio::test]
    async fn refused_launches_back_their_type_off() {
        let dir = fresh_dir("refused");
        let provider = Arc::new(FakeProvider::default());
        provider.refuse.store(true, std::sync::atomic::Ordering::SeqCst);
        let cluster = FakeCluster::with_echo(&provider, 3);
        let mut a = scaler(&dir, &provider, &cluster);
        for _ in 0..5 {
            a.pass().await.unwrap();
        }
        assert_eq!(provider.launches.lock().unwrap().len(), 1, "one refused launch, then the back-off");
        let report = a.report();
        let until = report["launch_backoff"]["t"].as_u64().expect("t backs off");
        assert!(until > flotilla_core::now_ms() + 3_000, "{report}");
        assert_eq!(a.instances().iter().filter(|i| i.state == InstanceState::Queued).count(), 3, "they wait queued");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
