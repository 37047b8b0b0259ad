//! The reconcile loop of one app (DESIGN §5): sync → decide → plan → commit → persist,
//! driven by view changes and a 1 s tick. Side effects are observed, never assumed.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use flotilla_core::{NodeId, Resources, now_ms};
use flotilla_proto::dial::{Dialer, GrpcChannel};
use flotilla_proto::v1::{self, ledger_service_client::LedgerServiceClient};
use flotilla_view::{ClusterView, ShardSlot, Version};
use rand::Rng;
use serde::Serialize;

use crate::lifecycle::UnitState;
use crate::planner::{ClassCache, MemberRequest, PlanInput, place_unit};
use crate::spec::AppSpec;
use crate::store::{MemberRecord, Store, Stored, UnitRecord, Write};

/// Commit attempts per unit in one pass before it waits for the next pass.
const ATTEMPTS: usize = 3;
/// Units placed per pass at most (the rest wait for the next pass).
const UNITS_PER_PASS: usize = 1024;
/// How often the view is swept for members no unit accounts for (it reads every node).
const SWEEP_EVERY_MS: u64 = 5_000;

/// What the API shows about an app.
#[derive(Debug, Clone, Serialize)]
pub struct AppStatus {
    pub app: String,
    /// Roles whose members receive traffic (the spec's `routing.roles`).
    pub serving_roles: Vec<String>,
    pub desired_units: u32,
    pub min_units: u32,
    pub max_units: u32,
    pub units: Vec<UnitRecord>,
}

/// What the scheduler measured about itself (also exported as metrics), for the
/// loadtest and the status page.
pub struct Stats {
    pub claims_accepted: std::sync::atomic::AtomicU64,
    /// Claims the ledger refused although the plan thought they fit: Omega's conflicts.
    pub claims_rejected: std::sync::atomic::AtomicU64,
    /// Commit round trip, microseconds.
    pub commit_us: std::sync::Mutex<hdrhistogram::Histogram<u64>>,
    /// Time to place one unit against the view, microseconds.
    pub decision_us: std::sync::Mutex<hdrhistogram::Histogram<u64>>,
}

impl Stats {
    fn new() -> Self {
        let h =
            || std::sync::Mutex::new(hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!("3 is valid")));
        Stats {
            claims_accepted: Default::default(),
            claims_rejected: Default::default(),
            commit_us: h(),
            decision_us: h(),
        }
    }

    fn record(h: &std::sync::Mutex<hdrhistogram::Histogram<u64>>, d: Duration) {
        let _ = h.lock().unwrap_or_else(|p| p.into_inner()).record((d.as_micros() as u64).max(1));
    }
}

/// Why the scheduler refused or could not carry out a request of the control plane.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("units must be within {min}..={max} for app {app} (asked for {asked})")]
    OutOfRange { app: String, min: u32, max: u32, asked: u32 },
    #[error("the spec names app {got:?}, not {app:?}")]
    WrongApp { app: String, got: String },
    #[error("{0}")]
    InvalidSpec(String),
    /// The store refused the write: nothing changed, and it is not the caller's fault.
    #[error("cannot record the change: {0}")]
    Store(String),
    #[error("the scheduler stopped")]
    Stopped,
}

impl flotilla_core::ServiceError for CommandError {
    fn kind(&self) -> flotilla_core::ErrorKind {
        use flotilla_core::ErrorKind;
        match self {
            CommandError::OutOfRange { .. } | CommandError::WrongApp { .. } | CommandError::InvalidSpec(_) => {
                ErrorKind::InvalidInput
            }
            CommandError::Store(_) => ErrorKind::Internal,
            CommandError::Stopped => ErrorKind::Unavailable,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            CommandError::OutOfRange { .. } => "out_of_range",
            CommandError::WrongApp { .. } => "wrong_app",
            CommandError::InvalidSpec(_) => "invalid_spec",
            CommandError::Store(_) => "store_failed",
            CommandError::Stopped => "scheduler_stopped",
        }
    }
}

/// Requests from the control plane.
pub enum Command {
    Scale(u32, tokio::sync::oneshot::Sender<Result<u32, CommandError>>),
    /// A new spec for the app (`flotilla apply`): units whose template changed roll.
    Apply(Box<AppSpec>, tokio::sync::oneshot::Sender<Result<String, CommandError>>),
}

/// A handle on a running scheduler, for the control plane and tests.
#[derive(Clone)]
pub struct AppHandle {
    pub app: String,
    status: Arc<ArcSwap<AppStatus>>,
    stats: Arc<Stats>,
    commands: tokio::sync::mpsc::Sender<Command>,
    routes: tokio::sync::watch::Receiver<Arc<v1::RouteTable>>,
}

impl AppHandle {
    /// Sets the desired number of units (within the spec's min and max); the
    /// scheduler persists it and acts on it at once.
    pub async fn scale(&self, units: u32) -> Result<u32, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Scale(units, tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
    }

    /// Replaces the app's spec; units whose template changed are rolled, `max_unavailable`
    /// at a time. Answers with what will happen.
    pub async fn apply(&self, spec: AppSpec) -> Result<String, CommandError> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::Apply(Box::new(spec), tx)).await.map_err(|_| CommandError::Stopped)?;
        rx.await.map_err(|_| CommandError::Stopped)?
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

struct PendingAlloc {
    shard: usize,
    shown_in: Version,
    node: NodeId,
    resources: Resources,
}

pub struct Scheduler {
    spec: AppSpec,
    /// `spec.template_fingerprint()`, kept with the spec.
    fingerprint: String,
    cluster: Arc<ClusterView>,
    shard_addrs: Vec<String>,
    clients: Vec<Option<LedgerServiceClient<GrpcChannel>>>,
    dialer: Dialer,
    store: Arc<dyn Store>,
    stored: Stored,
    status: Arc<ArcSwap<AppStatus>>,
    stats: Arc<Stats>,
    commands: tokio::sync::mpsc::Receiver<Command>,
    routes: tokio::sync::watch::Sender<Arc<v1::RouteTable>>,
    weights: crate::routes::Weights,
    /// Since when each unit has had members whose shard cannot be heard.
    unknown_since: HashMap<String, u64>,
    /// How long Unknown members are waited for before they count as lost.
    pub unknown_grace_ms: u64,
    classes: ClassCache,
    pending: Vec<PendingAlloc>,
    fencing_token: u64,
    started: bool,
    /// When the next orphan sweep is due (Unix ms).
    next_sweep_ms: u64,
    /// Since when each (unit, member) has been absent from the live node it is placed on.
    absent_since: HashMap<(String, String), u64>,
    rng: rand::rngs::StdRng,
}

impl Scheduler {
    /// Loads the app's state from `store` (adopting what a previous run left) and
    /// returns the scheduler with its handle.
    pub fn new(
        spec: AppSpec,
        cluster: Arc<ClusterView>,
        shard_addrs: Vec<String>,
        store: Arc<dyn Store>,
    ) -> anyhow::Result<(Scheduler, AppHandle)> {
        let mut stored = store.load(&spec.name)?;
        let spec_text = toml::to_string(&spec)?;
        if stored.spec.as_deref() != Some(spec_text.as_str()) {
            store.write(&spec.name, &[Write::Spec(spec_text.clone())])?;
            stored.spec = Some(spec_text);
        }
        let status = Arc::new(ArcSwap::from_pointee(AppStatus {
            app: spec.name.clone(),
            serving_roles: spec.routing.roles.clone(),
            desired_units: spec.units.initial,
            min_units: spec.units.min,
            max_units: spec.units.max,
            units: stored.units.values().cloned().collect(),
        }));
        let stats = Arc::new(Stats::new());
        let (tx, commands) = tokio::sync::mpsc::channel(16);
        let (routes, routes_rx) =
            tokio::sync::watch::channel(Arc::new(v1::RouteTable { app: spec.name.clone(), ..Default::default() }));
        let handle = AppHandle {
            app: spec.name.clone(),
            status: status.clone(),
            stats: stats.clone(),
            commands: tx,
            routes: routes_rx,
        };
        let clients = vec![None; shard_addrs.len()];
        Ok((
            Scheduler {
                fingerprint: spec.template_fingerprint(),
                spec,
                cluster,
                shard_addrs,
                clients,
                dialer: Dialer::network(),
                store,
                stored,
                status,
                stats,
                commands,
                routes,
                weights: Default::default(),
                unknown_since: HashMap::new(),
                unknown_grace_ms: 60_000,
                classes: ClassCache::default(),
                pending: Vec::new(),
                fencing_token: 1,
                started: false,
                next_sweep_ms: 0,
                absent_since: HashMap::new(),
                rng: rand::SeedableRng::seed_from_u64(rand::random()),
            },
            handle,
        ))
    }

    /// Reaches the shards through `dialer` (a token, TLS, or a simulated network).
    pub fn with_dialer(mut self, dialer: Dialer) -> Self {
        self.dialer = dialer;
        self
    }

    /// Seeds the scheduler's choices (sampling, back-off, transaction ids), so a
    /// simulation replays them.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.rng = rand::SeedableRng::seed_from_u64(seed);
        self
    }

    fn desired(&self) -> u32 {
        self.stored.desired_units.unwrap_or(self.spec.units.initial).clamp(self.spec.units.min, self.spec.units.max)
    }

    /// Runs until the process stops: a pass on every view change (at most every 50 ms)
    /// and at least once a second.
    pub async fn run(mut self) {
        let mut changes = self.cluster.changes();
        loop {
            let started = Instant::now();
            if let Err(e) = self.reconcile().await {
                tracing::warn!(app = %self.spec.name, error = %format!("{e:#}"), "reconcile failed");
            }
            metrics::histogram!("flotilla_reconcile_seconds").record(started.elapsed().as_secs_f64());
            self.publish_routes();
            let tick = tokio::time::sleep(Duration::from_secs(1));
            tokio::select! {
                _ = tick => {}
                r = changes.changed() => {
                    if r.is_err() { return; }
                    // Routes follow the view at once (a node that stops being Alive gets
                    // weight 0 in this batch); the reconcile pass may wait a little.
                    self.publish_routes();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Some(cmd) = self.commands.recv() => self.command(cmd),
            }
        }
    }

    pub fn command(&mut self, cmd: Command) {
        match cmd {
            Command::Scale(n, reply) => {
                let (min, max) = (self.spec.units.min, self.spec.units.max);
                let r = if n < min || n > max {
                    Err(CommandError::OutOfRange { app: self.spec.name.clone(), min, max, asked: n })
                } else {
                    self.store
                        .write(&self.spec.name, &[Write::DesiredUnits(n)])
                        .map(|()| {
                            self.stored.desired_units = Some(n);
                            tracing::info!(app = %self.spec.name, units = n, "desired units set");
                            n
                        })
                        .map_err(|e| CommandError::Store(e.to_string()))
                };
                let _ = reply.send(r);
            }
            Command::Apply(spec, reply) => {
                let _ = reply.send(self.apply(*spec));
            }
        }
    }

    fn apply(&mut self, spec: AppSpec) -> Result<String, CommandError> {
        if spec.name != self.spec.name {
            return Err(CommandError::WrongApp { app: self.spec.name.clone(), got: spec.name });
        }
        spec.validate().map_err(|e| CommandError::InvalidSpec(e.to_string()))?;
        let text = toml::to_string(&spec).map_err(|e| CommandError::InvalidSpec(e.to_string()))?;
        self.store.write(&self.spec.name, &[Write::Spec(text.clone())]).map_err(|e| CommandError::Store(e.to_string()))?;
        self.stored.spec = Some(text);
        let fingerprint = spec.template_fingerprint();
        let stale = self
            .stored
            .units
            .values()
            .filter(|u| crate::rollout::counts(u) && u.template.as_deref().is_some_and(|t| t != fingerprint))
            .count();
        let message = if stale == 0 {
            "no unit's template changed".to_string()
        } else {
            format!("{stale} unit(s) will roll, {} at a time", spec.rollout.max_unavailable)
        };
        tracing::info!(app = %spec.name, %fingerprint, stale, "spec applied");
        metrics::counter!("flotilla_spec_applied_total", "app" => spec.name.clone()).increment(1);
        self.spec = spec;
        self.fingerprint = fingerprint;
        self.classes = ClassCache::default();
        Ok(message)
    }

    /// One pass of the loop.
    #[tracing::instrument(skip_all, fields(app = %self.spec.name))]
    pub async fn reconcile(&mut self) -> anyhow::Result<()> {
        let slots = self.cluster.slots();
        let mut writes = Vec::new();
        if !self.started {
            // Place nothing against a partial view: wait until every shard has answered once.
            if slots.iter().any(|s| !s.connected) {
                return Ok(());
            }
            self.adopt(&mut writes).await;
            self.started = true;
        }
        // Routes first: members of nodes that stopped being Alive leave the table before
        // this pass releases or stops anything.
        self.publish_routes();
        self.pending.retain(|p| {
            slots.get(p.shard).is_none_or(|s| s.view.version.epoch == p.shown_in.epoch && s.view.version < p.shown_in)
        });

        // Sync: what the agents report about the members (through the view).
        self.observe(&slots, &mut writes);
        self.sweep_orphans(&slots).await;

        // Repair what failed, and carry scale-in forward.
        self.repair(&slots, &mut writes).await;
        self.scale_in(&slots, &mut writes).await;

        // Replace units on leaving nodes or with a stale template, make before break.
        self.roll(&slots, &mut writes);

        // Decide: enough units?
        let counted = self.stored.units.values().filter(|u| crate::rollout::counts(u)).count() as u32;
        for _ in counted..self.desired() {
            self.queue_unit(&mut writes);
        }

        // Plan and commit the queued units, re-planning only what was rejected.
        let mut queued: Vec<String> = self
            .stored
            .units
            .values()
            .filter(|u| u.state == UnitState::Queued)
            .map(|u| u.unit_id.clone())
            .take(UNITS_PER_PASS)
            .collect();
        for attempt in 0..ATTEMPTS {
            if queued.is_empty() {
                break;
            }
            if attempt > 0 {
                let ms = self.rng.random_range(5..25) * attempt as u64;
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            let slots = self.cluster.slots();
            queued = self.place_and_commit(&slots, &queued, &mut writes).await;
        }
        for id in &queued {
            if let Some(u) = self.stored.units.get(id) {
                writes.push(Write::Unit(u.clone()));
            }
        }
        self.store.write(&self.spec.name, &writes)?;
        self.publish();
        Ok(())
    }

    /// Queues a new unit (next generation, current template) and returns its id.
    fn queue_unit(&mut self, writes: &mut Vec<Write>) -> String {
        let generation = self.stored.next_generation.max(1);
        self.stored.next_generation = generation + 1;
        let unit = UnitRecord {
            unit_id: format!("{}-{generation}", self.spec.name),
            app: self.spec.name.clone(),
            domain: None,
            generation,
            state: UnitState::Queued,
            members: Vec::new(),
            created_unix_ms: now_ms(),
            unplaced_reason: None,
            draining_since_unix_ms: None,
            template: Some(self.fingerprint.clone()),
            replaced_by: None,
        };
        tracing::info!(unit = %unit.unit_id, "unit queued");
        writes.push(Write::Unit(unit.clone()));
        writes.push(Write::NextGeneration(self.stored.next_generation));
        let id = unit.unit_id.clone();
        self.stored.units.insert(id.clone(), unit);
        id
    }

    /// Carries out the rollout plan (see `rollout`): replacements first, the old unit
    /// drains once its replacement is Running.
    fn roll(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let plan = crate::rollout::plan(
            &self.stored.units,
            slots,
            &self.fingerprint,
            self.desired(),
            self.spec.rollout.max_unavailable,
        );
        let now = now_ms();
        for id in &plan.drain {
            if let Some(u) = self.stored.units.get_mut(id)
                && let Ok(to) = u.state.to(UnitState::Draining)
            {
                tracing::info!(unit = %id, replacement = ?u.replaced_by, "replacement running: draining the old unit");
                u.state = to;
                u.draining_since_unix_ms = Some(now);
                writes.push(Write::Unit(u.clone()));
            }
        }
        for id in &plan.orphaned {
            if let Some(u) = self.stored.units.get_mut(id) {
                tracing::warn!(unit = %id, replacement = ?u.replaced_by, "the replacement is gone; the unit stays");
                u.replaced_by = None;
                writes.push(Write::Unit(u.clone()));
            }
        }
        for (id, why) in plan.replace {
            let new = self.queue_unit(writes);
            if let Some(u) = self.stored.units.get_mut(&id) {
                tracing::info!(unit = %id, replacement = %new, %why, "replacing the unit, make before break");
                metrics::counter!("flotilla_units_replaced_total", "app" => self.spec.name.clone(), "why" => why)
                    .increment(1);
                u.replaced_by = Some(new);
                writes.push(Write::Unit(u.clone()));
            }
        }
    }

    /// Releases the ledger entries of `members` of a unit (all of them when empty), on
    /// every shard that holds one. Release is idempotent, so a retry is harmless.
    async fn release(&mut self, unit: &UnitRecord, members: &[String]) -> anyhow::Result<()> {
        let mut by_shard: BTreeMap<u32, Vec<v1::ClaimKey>> = BTreeMap::new();
        for m in unit.members.iter().filter(|m| members.is_empty() || members.contains(&m.member)) {
            if let Some(shard) = m.shard {
                by_shard.entry(shard).or_default().push(v1::ClaimKey {
                    app: unit.app.clone(),
                    unit: unit.unit_id.clone(),
                    member: m.member.clone(),
                    generation: unit.generation,
                });
            }
        }
        for (shard, keys) in by_shard {
            self.send_release(shard as usize, &format!("{}-release", unit.unit_id), keys).await?;
        }
        Ok(())
    }

    /// Fails units whose head is lost and replaces lost workers in place. When many
    /// members vanish at once (a partition looks like a mass failure), only one unit is
    /// repaired per pass.
    async fn repair(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        use crate::repair::{MemberHealth, Repair, decide, member_health};
        let now = now_ms();
        let mut decisions = Vec::new();
        let mut placed = 0usize;
        for u in self.stored.units.values() {
            if !matches!(u.state, UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded)
            {
                self.unknown_since.remove(&u.unit_id);
                continue;
            }
            placed += 1;
            let unknown = u.members.iter().any(|m| member_health(m, slots, now) == MemberHealth::Unknown);
            let since = if unknown {
                *self.unknown_since.entry(u.unit_id.clone()).or_insert(now)
            } else {
                self.unknown_since.remove(&u.unit_id);
                now
            };
            match decide(u, slots, now.saturating_sub(since), self.unknown_grace_ms, now) {
                Repair::Nothing | Repair::Wait => {}
                r => decisions.push((u.unit_id.clone(), r)),
            }
        }
        let mass = placed >= 4 && decisions.len() * 2 > placed;
        metrics::gauge!("flotilla_replacements_rate_limited", "app" => self.spec.name.clone()).set(if mass {
            1.0
        } else {
            0.0
        });
        if mass {
            tracing::warn!(app = %self.spec.name, failing = decisions.len(), units = placed, "many units failing at once: repairing one per pass");
            decisions.truncate(1);
        }
        for (id, r) in decisions {
            let Some(unit) = self.stored.units.get(&id).cloned() else { continue };
            match r {
                Repair::FailUnit(why) => {
                    tracing::warn!(unit = %id, %why, "unit failed; a replacement is queued");
                    metrics::counter!("flotilla_units_failed_total", "app" => self.spec.name.clone()).increment(1);
                    // Write ahead: a scheduler that dies after the release must find the
                    // unit Failed (and retry the release), never Running with nothing held.
                    let Some(u) = self.stored.units.get_mut(&id) else { continue };
                    if u.state.can_become(UnitState::Failed) {
                        u.state = UnitState::Failed;
                    }
                    u.unplaced_reason = Some(why);
                    if let Err(e) = self.store.write(&self.spec.name, &[Write::Unit(u.clone())]) {
                        tracing::warn!(unit = %id, error = %e, "cannot record the failure; will retry");
                        continue;
                    }
                    // Failed units whose release does not go through are retried below.
                    if let Err(e) = self.release(&unit, &[]).await {
                        tracing::warn!(unit = %id, error = %e, "releasing a failed unit; will retry");
                    } else if let Some(u) = self.stored.units.get_mut(&id) {
                        u.state = UnitState::Terminated;
                        writes.push(Write::Unit(u.clone()));
                    }
                }
                Repair::ReplaceWorkers(members) => {
                    tracing::warn!(unit = %id, ?members, "workers lost; replacing them in the unit's domain");
                    // Write ahead, as for a failed unit: once the workers are forgotten in
                    // the store, whatever the release leaves behind is an orphan the sweep
                    // releases.
                    let Some(u) = self.stored.units.get_mut(&id) else { continue };
                    if u.state != UnitState::Degraded && u.state.can_become(UnitState::Degraded) {
                        u.state = UnitState::Degraded;
                    }
                    for m in u.members.iter_mut().filter(|m| members.contains(&m.member)) {
                        m.node_id = None;
                        m.shard = None;
                        m.state = None;
                        m.address = None;
                    }
                    if let Err(e) = self.store.write(&self.spec.name, &[Write::Unit(u.clone())]) {
                        tracing::warn!(unit = %id, error = %e, "cannot record the lost workers; will retry");
                        continue;
                    }
                    if let Err(e) = self.release(&unit, &members).await {
                        tracing::warn!(unit = %id, error = %e, "releasing lost workers; the orphan sweep retries");
                    }
                    self.place_missing(&id, slots).await;
                    if let Some(u) = self.stored.units.get(&id) {
                        writes.push(Write::Unit(u.clone()));
                    }
                }
                Repair::Nothing | Repair::Wait => {}
            }
        }
        // Degraded units whose replacement could not be placed yet try again.
        let waiting: Vec<String> = self
            .stored
            .units
            .values()
            .filter(|u| u.state == UnitState::Degraded && u.members.iter().any(|m| m.node_id.is_none()))
            .map(|u| u.unit_id.clone())
            .collect();
        for id in waiting {
            self.place_missing(&id, slots).await;
            if let Some(u) = self.stored.units.get(&id) {
                writes.push(Write::Unit(u.clone()));
            }
        }
        // Failed units whose release did not go through are retried.
        let failed: Vec<UnitRecord> =
            self.stored.units.values().filter(|u| u.state == UnitState::Failed).cloned().collect();
        for u in failed {
            if self.release(&u, &[]).await.is_ok()
                && let Some(u) = self.stored.units.get_mut(&u.unit_id)
            {
                u.state = UnitState::Terminated;
                writes.push(Write::Unit(u.clone()));
            }
        }
    }

    /// Places the members of a unit that have no node, in the unit's domain.
    async fn place_missing(&mut self, id: &str, slots: &[Arc<ShardSlot>]) {
        let Some(unit) = self.stored.units.get(id).cloned() else { return };
        let missing: Vec<MemberRequest> = self
            .spec
            .members()
            .iter()
            .filter(|(member, _, _)| unit.members.iter().any(|m| &m.member == member && m.node_id.is_none()))
            .map(|(member, _, t)| MemberRequest { member: member.clone(), resources: t.resources() })
            .collect();
        if missing.is_empty() {
            return;
        }
        let pending: HashMap<NodeId, Resources> = HashMap::new();
        let per_domain = HashMap::new();
        let input = PlanInput {
            slots,
            constraints: &self.spec.constraints,
            max_units_per_domain: None,
            units_per_domain: &per_domain,
            pending: &pending,
            only_domain: unit.domain.as_deref(),
        };
        let plan = place_unit(&input, &missing, &mut self.classes, &mut self.rng);
        let p = match plan {
            Ok(p) => p,
            Err(why) => {
                if let Some(u) = self.stored.units.get_mut(id) {
                    u.unplaced_reason = Some(format!("replacement: {why}"));
                }
                return;
            }
        };
        let claims: Vec<v1::Claim> = self.claims(id, &p);
        let req = v1::CommitRequest {
            txn_id: format!("{id}-replace-{:016x}", self.rng.random::<u64>()),
            fencing_token: self.fencing_token,
            claims,
        };
        let shard = p.shard;
        let resp = match self.client(shard).await {
            Ok(c) => c.commit(req).await.map(|r| r.into_inner()).ok(),
            Err(_) => None,
        };
        let Some(resp) = resp else { return };
        if !resp.results.iter().all(|r| r.accepted) {
            if let Some(u) = self.stored.units.get_mut(id) {
                u.unplaced_reason = Some("replacement commit rejected; retrying".into());
            }
            return;
        }
        if let Some(u) = self.stored.units.get_mut(id) {
            for pm in &p.members {
                if let Some(m) = u.members.iter_mut().find(|m| m.member == pm.member) {
                    m.node_id = Some(pm.node.to_string());
                    m.incarnation = pm.incarnation;
                    m.shard = Some(shard as u32);
                }
            }
            u.unplaced_reason = None;
            tracing::info!(unit = %id, "replacement members allocated");
        }
    }

    /// Scale-in: queued units go first, then the least healthy and youngest placed ones
    /// drain (out of routes at once), their members stop after the drain timeout, and
    /// they end Terminated.
    async fn scale_in(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let now = now_ms();
        let desired = self.desired() as usize;
        let active: Vec<&UnitRecord> = self.stored.units.values().filter(|u| crate::rollout::counts(u)).collect();
        if active.len() > desired {
            let mut excess = active.len() - desired;
            let queued: Vec<String> = active
                .iter()
                .filter(|u| u.state == UnitState::Queued)
                .map(|u| u.unit_id.clone())
                .take(excess)
                .collect();
            excess -= queued.len();
            let placed: Vec<&UnitRecord> = active.iter().filter(|u| u.state != UnitState::Queued).copied().collect();
            let victims = crate::repair::scale_in_order(&placed, excess, slots);
            for id in queued {
                if let Some(u) = self.stored.units.get_mut(&id) {
                    u.state = UnitState::Terminated;
                    writes.push(Write::Unit(u.clone()));
                }
            }
            for id in victims {
                if let Some(u) = self.stored.units.get_mut(&id)
                    && let Ok(to) = u.state.to(UnitState::Draining)
                {
                    tracing::info!(unit = %id, "scale-in: draining");
                    u.state = to;
                    u.draining_since_unix_ms = Some(now);
                    writes.push(Write::Unit(u.clone()));
                }
            }
        }
        let drain_ms = self.spec.units.drain_timeout_ms;
        let due: Vec<UnitRecord> = self
            .stored
            .units
            .values()
            .filter(|u| u.state == UnitState::Draining && u.draining_since_unix_ms.is_some_and(|t| now >= t + drain_ms))
            .cloned()
            .collect();
        for u in due {
            if self.release(&u, &[]).await.is_ok()
                && let Some(u) = self.stored.units.get_mut(&u.unit_id)
            {
                u.state = UnitState::Stopping;
                writes.push(Write::Unit(u.clone()));
            }
        }
        // Stopping → Terminated once no agent reports its members any more.
        let stopping: Vec<String> =
            self.stored.units.values().filter(|u| u.state == UnitState::Stopping).map(|u| u.unit_id.clone()).collect();
        for id in stopping {
            let Some(u) = self.stored.units.get(&id) else { continue };
            let still = u.members.iter().any(|m| {
                m.node_id.as_deref().zip(m.shard).is_some_and(|(n, s)| {
                    slots.get(s as usize).and_then(|slot| slot.view.get(&NodeId::new(n).ok()?).cloned()).is_some_and(
                        |r| {
                            r.workloads
                                .iter()
                                .any(|w| w.unit == u.unit_id && w.member == m.member && w.generation == u.generation)
                        },
                    )
                })
            });
            let waited = u.draining_since_unix_ms.is_some_and(|t| now >= t + drain_ms + 15_000);
            if (!still || waited)
                && let Some(u) = self.stored.units.get_mut(&id)
            {
                u.state = UnitState::Terminated;
                writes.push(Write::Unit(u.clone()));
            }
        }
    }

    /// Moves units along with what their members' agents report: Allocated → Starting
    /// once a member started, Starting → Running once every member is ready.
    fn observe(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let now = now_ms();
        let mut absent = HashMap::new();
        for unit in self.stored.units.values_mut() {
            if !matches!(
                unit.state,
                UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded
            ) {
                continue;
            }
            let mut changed = false;
            let mut all_running = !unit.members.is_empty();
            let mut any_reported = false;
            for m in &mut unit.members {
                let status = m.node_id.as_deref().and_then(|n| {
                    let slot = slots.get(m.shard? as usize)?;
                    let rec = slot.view.get(&NodeId::new(n).ok()?)?;
                    rec.workloads
                        .iter()
                        .find(|w| w.unit == unit.unit_id && w.member == m.member && w.generation == unit.generation)
                        .cloned()
                });
                let (state, address) = match &status {
                    Some(w) => {
                        let st = v1::WorkloadState::try_from(w.state).unwrap_or(v1::WorkloadState::Unspecified);
                        let name = match st {
                            v1::WorkloadState::Starting => "starting",
                            v1::WorkloadState::Running => "running",
                            v1::WorkloadState::Exited => "exited",
                            v1::WorkloadState::Failed => "failed",
                            v1::WorkloadState::Unspecified => "unknown",
                        };
                        (Some(name.to_string()), (!w.address.is_empty()).then(|| w.address.clone()))
                    }
                    // A live node that does not run the member although it should: after
                    // the grace the member is missing (a shard that restarted before the
                    // agent took the push forgot it), and repair replaces it.
                    None if crate::repair::runs_nowhere(&unit.unit_id, unit.generation, m, slots, now) => {
                        let key = (unit.unit_id.clone(), m.member.clone());
                        let since = self.absent_since.get(&key).copied().unwrap_or(now);
                        absent.insert(key, since);
                        let state = if now.saturating_sub(since) >= crate::repair::MISSING_AFTER_MS {
                            Some(crate::repair::MISSING.to_string())
                        } else {
                            m.state.clone()
                        };
                        (state, m.address.clone())
                    }
                    None => (m.state.clone(), m.address.clone()),
                };
                any_reported |= status.is_some();
                all_running &= state.as_deref() == Some("running");
                if m.state != state || m.address != address {
                    m.state = state;
                    m.address = address;
                    changed = true;
                }
            }
            let next = match unit.state {
                UnitState::Allocated if all_running => Some(UnitState::Starting),
                UnitState::Allocated if any_reported => Some(UnitState::Starting),
                UnitState::Starting | UnitState::Degraded if all_running => Some(UnitState::Running),
                _ => None,
            };
            if let Some(to) = next
                && let Ok(to) = unit.state.to(to)
            {
                tracing::info!(unit = %unit.unit_id, from = unit.state.as_str(), to = to.as_str(), "unit state");
                unit.state = to;
                changed = true;
            }
            if changed {
                writes.push(Write::Unit(unit.clone()));
            }
        }
        self.absent_since = absent;
    }

    /// Releases what agents run for this app that no unit record accounts for: a commit
    /// that timed out but landed, or a member a restarted shard took back from its agent
    /// after it had been released. Runs every `SWEEP_EVERY_MS`, between two passes'
    /// commits, so nothing it sees is still in flight.
    async fn sweep_orphans(&mut self, slots: &[Arc<ShardSlot>]) {
        let now = now_ms();
        if now < self.next_sweep_ms {
            return;
        }
        self.next_sweep_ms = now + SWEEP_EVERY_MS;
        let mut orphans: BTreeMap<usize, Vec<v1::ClaimKey>> = BTreeMap::new();
        for (shard, slot) in slots.iter().enumerate().filter(|(_, s)| s.connected) {
            for rec in slot.view.nodes.values() {
                for w in rec.workloads.iter().filter(|w| w.app == self.spec.name) {
                    let owned = self.stored.units.get(&w.unit).is_some_and(|u| {
                        u.generation == w.generation
                            && u.state != UnitState::Terminated
                            && (u.state == UnitState::Placing
                                || u.members.iter().any(|m| {
                                    m.member == w.member && m.node_id.as_deref() == Some(rec.node_id.as_str())
                                }))
                    });
                    if !owned {
                        orphans.entry(shard).or_default().push(v1::ClaimKey {
                            app: w.app.clone(),
                            unit: w.unit.clone(),
                            member: w.member.clone(),
                            generation: w.generation,
                        });
                    }
                }
            }
        }
        for (shard, keys) in orphans {
            tracing::warn!(shard, orphans = keys.len(), "releasing members no unit accounts for");
            metrics::counter!("flotilla_orphans_released_total", "app" => self.spec.name.clone())
                .increment(keys.len() as u64);
            let tag = format!("{}-sweep", self.spec.name);
            if let Err(e) = self.send_release(shard, &tag, keys).await {
                tracing::warn!(error = %e, "releasing orphans; will retry");
                self.next_sweep_ms = now;
            }
        }
    }

    /// On start: a unit a previous run was placing (written Placing before its commit
    /// left) may hold ledger entries that run somewhere, or will once a late commit lands.
    /// It is never placed again under the same keys, which could run a member twice: it
    /// ends, a replacement with a new id is queued, and what it holds is released, now
    /// (best effort) and by the orphan sweep after.
    async fn adopt(&mut self, writes: &mut Vec<Write>) {
        let unsure: Vec<UnitRecord> =
            self.stored.units.values().filter(|u| u.state == UnitState::Placing).cloned().collect();
        if unsure.is_empty() {
            return;
        }
        let keys: Vec<v1::ClaimKey> = unsure
            .iter()
            .flat_map(|u| {
                self.spec.members().into_iter().map(move |(member, _, _)| v1::ClaimKey {
                    app: u.app.clone(),
                    unit: u.unit_id.clone(),
                    member,
                    generation: u.generation,
                })
            })
            .collect();
        let tag = format!("{}-adopt", self.spec.name);
        for shard in 0..self.shard_addrs.len() {
            if let Err(e) = self.send_release(shard, &tag, keys.clone()).await {
                tracing::warn!(error = %e, "releasing what a previous run was placing; the orphan sweep retries");
            }
        }
        for u in unsure {
            if let Some(rec) = self.stored.units.get_mut(&u.unit_id) {
                if let Ok(to) = rec.state.to(UnitState::Terminated) {
                    rec.state = to;
                }
                rec.members.clear();
                rec.unplaced_reason = Some("a previous run was placing it when it stopped; replaced".into());
                writes.push(Write::Unit(rec.clone()));
            }
        }
        tracing::info!(units = keys.len(), "replacing the units a previous run was placing");
    }

    /// Releases `keys` on `shard` in one request (its transaction id is `tag` and a random
    /// suffix). A failed call drops the shard's channel: the next one connects afresh.
    async fn send_release(&mut self, shard: usize, tag: &str, keys: Vec<v1::ClaimKey>) -> anyhow::Result<()> {
        let req = v1::ReleaseRequest {
            txn_id: format!("{tag}-{:016x}", self.rng.random::<u64>()),
            fencing_token: self.fencing_token,
            keys,
        };
        if let Err(e) = self.client(shard).await?.release(req).await {
            self.clients[shard] = None;
            return Err(anyhow::anyhow!("release on shard {shard}: {}", e.message()));
        }
        Ok(())
    }

    async fn client(&mut self, shard: usize) -> anyhow::Result<&mut LedgerServiceClient<GrpcChannel>> {
        if self.clients[shard].is_none() {
            let channel = self.dialer.connect(&self.shard_addrs[shard], Some(Duration::from_secs(10))).await?;
            self.clients[shard] = Some(LedgerServiceClient::new(channel));
        }
        self.clients[shard].as_mut().ok_or_else(|| anyhow::anyhow!("no client"))
    }

    fn units_per_domain(&self) -> HashMap<String, u32> {
        let mut m = HashMap::new();
        for u in self.stored.units.values().filter(|u| u.state.is_active()) {
            if let Some(d) = &u.domain {
                *m.entry(d.clone()).or_insert(0) += 1;
            }
        }
        m
    }

    /// Plans every unit in `ids`, commits them grouped by shard, and returns the ids
    /// still queued (rejected or unplaceable).
    async fn place_and_commit(
        &mut self,
        slots: &[Arc<ShardSlot>],
        ids: &[String],
        writes: &mut Vec<Write>,
    ) -> Vec<String> {
        let requests: Vec<MemberRequest> = self
            .spec
            .members()
            .iter()
            .map(|(member, _, t)| MemberRequest { member: member.clone(), resources: t.resources() })
            .collect();
        let mut pending: HashMap<NodeId, Resources> = HashMap::new();
        for p in &self.pending {
            let e = pending.entry(p.node.clone()).or_default();
            *e = e.checked_add(&p.resources).unwrap_or_else(|_| e.clone());
        }
        let mut per_domain = self.units_per_domain();
        let mut by_shard: BTreeMap<usize, Vec<(String, crate::planner::Placement)>> = BTreeMap::new();
        let mut still = Vec::new();
        for id in ids {
            let started = Instant::now();
            let input = PlanInput {
                slots,
                constraints: &self.spec.constraints,
                max_units_per_domain: self.spec.spread.max_units_per_domain,
                units_per_domain: &per_domain,
                pending: &pending,
                only_domain: None,
            };
            let plan = place_unit(&input, &requests, &mut self.classes, &mut self.rng);
            metrics::histogram!("flotilla_plan_seconds").record(started.elapsed().as_secs_f64());
            Stats::record(&self.stats.decision_us, started.elapsed());
            let Some(unit) = self.stored.units.get_mut(id) else { continue };
            match plan {
                Err(why) => {
                    // A pass that only hit the class cache examined nothing new: keep the
                    // reason the last real examination gave.
                    if why.domains_tried > 0 || unit.unplaced_reason.is_none() {
                        let reason = why.to_string();
                        if unit.unplaced_reason.as_deref() != Some(reason.as_str()) {
                            tracing::info!(unit = %id, %reason, "unit cannot be placed yet");
                        }
                        unit.unplaced_reason = Some(reason);
                    }
                    still.push(id.clone());
                }
                Ok(p) => {
                    for (m, r) in p.members.iter().zip(&requests) {
                        let e = pending.entry(m.node.clone()).or_default();
                        *e = e.checked_add(&r.resources).unwrap_or_else(|_| e.clone());
                    }
                    *per_domain.entry(p.domain.clone()).or_insert(0) += 1;
                    unit.state = UnitState::Placing;
                    by_shard.entry(p.shard).or_default().push((id.clone(), p));
                }
            }
        }
        // Write ahead: a scheduler that dies with a commit in flight must find its units
        // Placing when it restarts (adopt releases what they may hold) and must never
        // reuse their ids for other units.
        if !by_shard.is_empty() {
            for (id, _) in by_shard.values().flatten() {
                if let Some(u) = self.stored.units.get(id) {
                    writes.push(Write::Unit(u.clone()));
                }
            }
            if let Err(e) = self.store.write(&self.spec.name, &std::mem::take(writes)) {
                tracing::warn!(error = %e, "cannot record the units being placed; committing nothing");
                for (id, _) in by_shard.into_values().flatten() {
                    if let Some(u) = self.stored.units.get_mut(&id) {
                        u.state = UnitState::Queued;
                    }
                    still.push(id);
                }
                return still;
            }
        }
        for (shard, units) in by_shard {
            let claims: Vec<v1::Claim> = units.iter().flat_map(|(id, p)| self.claims(id, p)).collect();
            let txn_id = format!("{}-{}-{:016x}", self.spec.name, now_ms(), self.rng.random::<u64>());
            let started = Instant::now();
            let sent = self.client(shard).await.map(|c| c.clone());
            // Whether a failed commit may have been applied all the same.
            let mut ambiguous = false;
            let result = match sent {
                Ok(mut c) => c
                    .commit(v1::CommitRequest { txn_id, fencing_token: self.fencing_token, claims })
                    .await
                    .map(|r| r.into_inner())
                    .map_err(|e| {
                        ambiguous = !matches!(
                            e.code(),
                            tonic::Code::InvalidArgument | tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                        );
                        anyhow::anyhow!("commit to shard {shard}: {}", e.message())
                    }),
                Err(e) => Err(e),
            };
            metrics::histogram!("flotilla_commit_latency_seconds").record(started.elapsed().as_secs_f64());
            Stats::record(&self.stats.commit_us, started.elapsed());
            match result {
                Ok(resp) => {
                    let shown_in: Version = resp.applied_in.unwrap_or_default().into();
                    let accepted = resp.results.iter().filter(|r| r.accepted).count() as u64;
                    let rejected = resp.results.len() as u64 - accepted;
                    self.stats.claims_accepted.fetch_add(accepted, std::sync::atomic::Ordering::Relaxed);
                    self.stats.claims_rejected.fetch_add(rejected, std::sync::atomic::Ordering::Relaxed);
                    metrics::counter!("flotilla_scheduler_claims_total", "result" => "accepted").increment(accepted);
                    metrics::counter!("flotilla_scheduler_claims_total", "result" => "conflict").increment(rejected);
                    let (ok, conflicts) = (
                        self.stats.claims_accepted.load(std::sync::atomic::Ordering::Relaxed),
                        self.stats.claims_rejected.load(std::sync::atomic::Ordering::Relaxed),
                    );
                    // Omega's conflict fraction: conflicts per successful claim, since start.
                    metrics::gauge!("flotilla_conflict_fraction", "app" => self.spec.name.clone())
                        .set(conflicts as f64 / ok.max(1) as f64);
                    let verdicts: HashMap<(String, String), (bool, String)> = resp
                        .results
                        .into_iter()
                        .filter_map(|r| {
                            let k = r.key?;
                            Some(((k.unit, k.member), (r.accepted, r.detail)))
                        })
                        .collect();
                    for (id, p) in units {
                        let rejected: Vec<String> = p
                            .members
                            .iter()
                            .filter_map(|m| match verdicts.get(&(id.clone(), m.member.clone())) {
                                Some((true, _)) => None,
                                Some((false, why)) => Some(format!("{} on {}: {why}", m.member, m.node)),
                                None => Some(format!("{}: no answer", m.member)),
                            })
                            .collect();
                        let Some(unit) = self.stored.units.get_mut(&id) else { continue };
                        if rejected.is_empty() {
                            metrics::counter!("flotilla_placements_total", "result" => "committed").increment(1);
                            unit.state = UnitState::Allocated;
                            unit.domain = Some(p.domain.clone());
                            unit.unplaced_reason = None;
                            unit.members = member_records(&self.spec, &p, shard);
                            for (m, (_, _, t)) in p.members.iter().zip(self.spec.members()) {
                                self.pending.push(PendingAlloc {
                                    shard,
                                    shown_in,
                                    node: m.node.clone(),
                                    resources: t.resources(),
                                });
                            }
                            tracing::info!(unit = %id, domain = %p.domain, "unit allocated");
                            writes.push(Write::Unit(unit.clone()));
                        } else {
                            metrics::counter!("flotilla_placements_total", "result" => "conflict").increment(1);
                            unit.state = UnitState::Queued;
                            unit.unplaced_reason = Some(format!("commit rejected: {}", rejected.join("; ")));
                            still.push(id);
                        }
                    }
                }
                Err(e) if ambiguous => {
                    // The claims may hold on the shard: placing the units again elsewhere
                    // under the same keys could run a member twice. They fail instead
                    // (their release is retried until it goes through) and replacements
                    // with new ids are queued.
                    tracing::warn!(error = %e, "commit outcome unknown: failing its units");
                    self.clients[shard] = None;
                    for (id, p) in units {
                        if let Some(unit) = self.stored.units.get_mut(&id) {
                            metrics::counter!("flotilla_placements_total", "result" => "unknown").increment(1);
                            unit.state = UnitState::Failed;
                            unit.domain = Some(p.domain.clone());
                            unit.members = member_records(&self.spec, &p, shard);
                            unit.unplaced_reason = Some(format!("commit outcome unknown: {e}"));
                            writes.push(Write::Unit(unit.clone()));
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "commit failed; will retry");
                    self.clients[shard] = None;
                    for (id, _) in units {
                        if let Some(unit) = self.stored.units.get_mut(&id) {
                            unit.state = UnitState::Queued;
                            unit.unplaced_reason = Some(e.to_string());
                        }
                        still.push(id);
                    }
                }
            }
        }
        still
    }

    fn claims(&self, unit_id: &str, p: &crate::planner::Placement) -> Vec<v1::Claim> {
        let generation = self.stored.units.get(unit_id).map(|u| u.generation).unwrap_or(0);
        let templates = self.spec.members();
        p.members
            .iter()
            .filter_map(|m| {
                templates
                    .iter()
                    .find(|(name, _, _)| *name == m.member)
                    .map(|(member, role, t)| (m, member.clone(), role, t))
            })
            .map(|(m, member, role, t)| v1::Claim {
                key: Some(v1::ClaimKey { app: self.spec.name.clone(), unit: unit_id.to_string(), member, generation }),
                node_id: m.node.to_string(),
                incarnation: m.incarnation,
                resources: Some((&t.resources()).into()),
                allow_low_priority: self.spec.constraints.allow_low_priority,
                group: unit_id.to_string(),
                workload: Some(v1::Workload {
                    role: role.to_string(),
                    command: t.command.clone(),
                    args: t.args.clone(),
                    env: t.env.clone().into_iter().collect(),
                    readiness_path: t.readiness_path.clone().unwrap_or_default(),
                    restart: t.restart.clone().unwrap_or_default(),
                }),
            })
            .collect()
    }

    /// Recomputes the route table and publishes it under a new version if it changed.
    pub fn publish_routes(&mut self) {
        let slots = self.cluster.slots();
        let units: Vec<&UnitRecord> = self.stored.units.values().collect();
        let routes =
            self.weights.table(&units, &self.spec.routing.roles, &slots, &self.spec.routing.performance, now_ms());
        let current = self.routes.borrow().clone();
        if current.routes != routes {
            let changed = routes.iter().filter(|r| !current.routes.contains(r)).count();
            metrics::counter!("flotilla_route_weight_changes_total", "app" => self.spec.name.clone())
                .increment(changed as u64);
            self.routes.send_replace(Arc::new(v1::RouteTable {
                app: self.spec.name.clone(),
                version: current.version + 1,
                routes,
            }));
        }
    }

    fn publish(&self) {
        let mut counts = [0i64; 10];
        for u in self.stored.units.values() {
            counts[UnitState::ALL.iter().position(|s| *s == u.state).unwrap_or(0)] += 1;
        }
        for (s, c) in UnitState::ALL.iter().zip(counts) {
            metrics::gauge!("flotilla_units", "app" => self.spec.name.clone(), "state" => s.as_str()).set(c as f64);
        }
        self.status.store(Arc::new(AppStatus {
            app: self.spec.name.clone(),
            serving_roles: self.spec.routing.roles.clone(),
            desired_units: self.desired(),
            min_units: self.spec.units.min,
            max_units: self.spec.units.max,
            units: self.stored.units.values().cloned().collect(),
        }));
    }
}

/// The members of a unit as placed by `p` on `shard`.
fn member_records(spec: &AppSpec, p: &crate::planner::Placement, shard: usize) -> Vec<MemberRecord> {
    let templates = spec.members();
    let role_of = |member: &str| templates.iter().find(|(n, _, _)| n == member).map(|(_, r, _)| *r).unwrap_or("worker");
    p.members
        .iter()
        .map(|m| MemberRecord {
            member: m.member.clone(),
            role: role_of(&m.member).to_string(),
            node_id: Some(m.node.to_string()),
            incarnation: m.incarnation,
            shard: Some(shard as u32),
            address: None,
            state: None,
        })
        .collect()
}
