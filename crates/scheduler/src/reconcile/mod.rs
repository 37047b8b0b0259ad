//! The reconcile loop of one app (docs/architecture.md §6), driven by view changes, commands
//! and a tick ([`due`]: every second, or a quiet app's timers). A pass runs its steps in
//! order, one file each:
//!
//! 1. sync ([`observe`]): member states from the view, the orphan sweep, adopt on start;
//!    members held for start order start once their head runs ([`order`]);
//! 2. heal ([`heal`]): failed units, lost workers;
//! 3. [`autoscale`]: every interval, the app's policy sets the desired units;
//! 4. [`scale_in`] past the desired count, and [`roll`]: replacements for units on
//!    leaving nodes or with a stale template;
//! 5. queue units up to the desired count, per group;
//! 6. place and commit the queued ones ([`place`]), re-planning what was rejected;
//!    ended units show their members stopped, and the oldest leave ([`crate::retention`]);
//! 7. persist every write of the pass at once, and publish status and routes.
//!
//! A quiet app's timer runs only the timers' steps (sweep, autoscaler, rebalance look,
//! retention) and what they start (scale in, queue, place): [`Steps::Timers`].
//!
//! The pure deciders are beside this module (`planner`, `repair`, `rollout`, `routes`,
//! `lifecycle`); [`ledgers`] is the one place that speaks to the shards, [`planning`]
//! what placing keeps between passes, [`command`] how the control plane's commands are
//! carried out, [`handle`] what the world sees and [`publish`] how a pass shows it. Side
//! effects never drive transitions directly: their results are observed in the next pass.

mod autoscale;
mod canary;
mod command;
mod dry_run;
mod due;
mod error;
mod handle;
mod heal;
mod ledgers;
mod observe;
mod order;
mod place;
mod planning;
mod publish;
mod rebalance;
mod roll;
mod run;
mod save;
mod scale_in;
mod watched;

use crate::catalogue as m;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::now_ms;
use flotilla_proto::dial::Dialer;
use flotilla_view::ClusterView;

use autoscale::Autoscaler;
pub use autoscale::{Demand, DemandRequest, MAX_DEMAND_COUNT, MAX_DEMAND_ENTRIES, PolicyBook};
pub use dry_run::{ApplyPlan, CannotPlace};
pub use error::{CommandError, STORE_UNAVAILABLE};
use handle::Outputs;
pub use handle::{AppHandle, AppStatus, Applied, AutoscalingStatus, ChangeRequest, Command, Stats};
use ledgers::Ledgers;
pub use ledgers::ShardChannels;
use observe::Tracking;
use order::Held;
use planning::Planning;
pub use rebalance::RebalancePlan;
use save::save;

use crate::lifecycle::UnitState;
use crate::nodes::Nodes;
use crate::spec::AppSpec;
use crate::store::{Store, Stored, UnitRecord, Write};

/// Commit attempts per unit in one pass before it waits for the next pass.
const ATTEMPTS: usize = 3;

/// One app's scheduler. What each step keeps between passes is its own struct
/// ([`observe::Tracking`], [`order::Held`], [`planning::Planning`],
/// [`autoscale::Autoscaler`], [`ledgers::Ledgers`], [`handle::Outputs`]); the steps that
/// only decide take those and the unit records as arguments, not the whole scheduler.
pub struct Scheduler {
    spec: AppSpec,
    /// `spec.fingerprints()`, kept with the spec.
    fingerprints: crate::spec::Fingerprints,
    /// The spec as stored (TOML), shared with every published status.
    spec_text: Arc<str>,
    /// The app's state as stored: the units and what the steps decided.
    stored: Stored,
    store: Arc<dyn Store>,
    /// The writes of the last pass the store refused, in order: written before anything
    /// else once it takes writes again, so no state the scheduler acted on is lost.
    unsaved: Vec<Write>,
    /// Whether this process is the app's active scheduler ([`crate::leader`]).
    leader: crate::leader::Leader,
    /// The token of the lease the state in `stored` was loaded under.
    token: u64,
    cluster: Arc<ClusterView>,
    ledgers: Ledgers,
    commands: tokio::sync::mpsc::Receiver<Command>,
    out: Outputs,
    tracking: Tracking,
    held: Held,
    planning: Planning,
    autoscaler: Autoscaler,
    rebalancing: rebalance::Rebalancing,
    /// Whether the last pass wrote anything (a pass that changed something is followed by
    /// another within the tick).
    wrote: bool,
    /// Where in each period the app's periodic steps fall ([`due::phase_of`]; taken
    /// modulo the period).
    phase_ms: u64,
}

impl Scheduler {
    /// Loads the app's state from `store` (adopting what a previous run left) and
    /// returns the scheduler with its handle.
    ///
    /// `spec` is the one given at start (`--app FILE`). The stored spec is the truth: the
    /// file's spec is put in force only when the store has none, or when the file changed
    /// since it was last applied from a file (its fingerprint is kept in the store), so a
    /// spec applied through the API survives a restart with the same file.
    pub fn new(
        spec: AppSpec,
        cluster: Arc<ClusterView>,
        shard_addrs: Vec<String>,
        store: Arc<dyn Store>,
    ) -> anyhow::Result<(Scheduler, AppHandle)> {
        let stored = store.load(&spec.name)?;
        let file_fingerprint = spec.fingerprint();
        let in_force = stored.spec.as_deref().and_then(|text| match AppSpec::parse(text) {
            Ok(s) if s.name == spec.name => Some(s),
            Ok(_) => None,
            Err(e) => {
                tracing::warn!(app = %spec.name, error = %e, "the stored spec no longer parses; the file's applies");
                None
            }
        });
        let file_applies = in_force.is_none() || stored.file_fingerprint.as_deref() != Some(file_fingerprint.as_str());
        let (mut scheduler, handle) =
            Self::with_spec(in_force.unwrap_or_else(|| spec.clone()), cluster, shard_addrs, store, stored)?;
        if file_applies {
            let origin = crate::spec::SpecOrigin::new("file", now_ms());
            let result = scheduler.apply_from(spec, origin, None).map_err(|e| anyhow::anyhow!("{e}"))?.result;
            save(&*scheduler.store, &scheduler.spec.name, &[Write::FileFingerprint(file_fingerprint.clone())])?;
            scheduler.stored.file_fingerprint = Some(file_fingerprint);
            tracing::info!(app = %scheduler.spec.name, %result, "the --app file's spec is in force");
        } else {
            scheduler.record_first_version()?;
            let source = scheduler.stored.spec_origin.as_ref().map_or("file", |o| o.source.as_str());
            tracing::info!(app = %scheduler.spec.name, source, "the stored spec stays in force (the --app file did not change)");
        }
        scheduler.publish();
        Ok((scheduler, handle))
    }

    fn with_spec(
        spec: AppSpec,
        cluster: Arc<ClusterView>,
        shard_addrs: Vec<String>,
        store: Arc<dyn Store>,
        stored: Stored,
    ) -> anyhow::Result<(Scheduler, AppHandle)> {
        let spec_text = toml::to_string(&spec)?;
        let spec_text: Arc<str> = Arc::from(spec_text.as_str());
        let status = AppStatus {
            app: spec.name.clone(),
            serving_roles: spec.routing.roles.clone(),
            desired_units: spec.units.initial,
            min_units: spec.units.min,
            max_units: spec.units.max,
            units: stored.units.values().map(|u| Arc::new(u.clone())).collect(),
            unit_shape: spec.unit_shape(),
            autoscaling: None,
            spec_toml: spec_text.clone(),
            has_previous_spec: stored.previous_spec.is_some(),
            versions: Arc::new(stored.versions.values().map(|v| Arc::new(v.clone())).collect()),
            spec_origin: stored.spec_origin.clone(),
            template: spec.template_fingerprint(),
            rollout: stored.rollout.clone(),
            canary: None,
            store_error: None,
            waiting: None,
            scheduler: crate::leader::Leader::always("local").role(),
        };
        let autoscaler = Autoscaler::new(&spec, &stored.decisions);
        let phase_ms = due::phase_of(&spec.name);
        let (out, handle, commands) = Outputs::new(status, autoscaler.decisions.iter().rev().cloned().collect());
        let scheduler = Scheduler {
            fingerprints: spec.fingerprints(),
            spec_text,
            spec,
            stored,
            store,
            unsaved: Vec::new(),
            leader: crate::leader::Leader::always("local"),
            token: crate::leader::LOCAL_TOKEN,
            cluster,
            ledgers: Ledgers::new(shard_addrs),
            commands,
            out,
            tracking: Tracking::default(),
            held: Held::default(),
            planning: Planning::new(rand::SeedableRng::seed_from_u64(rand::random())),
            autoscaler,
            rebalancing: Default::default(),
            wrote: false,
            phase_ms,
        };
        Ok((scheduler, handle))
    }

    /// Reaches the shards through `dialer` (a token, TLS, or a simulated network).
    pub fn with_dialer(mut self, dialer: Dialer) -> Self {
        self.ledgers.dialer = dialer;
        self
    }

    /// Talks to the shards over `channels`, shared with the other schedulers given them
    /// (one process hosting many apps), rather than over connections of its own.
    pub fn with_channels(mut self, channels: ShardChannels) -> Self {
        self.ledgers.channels = channels;
        self
    }

    /// Waits this long for members whose shard cannot be heard (Unknown) before they count
    /// as lost: a partition must not look like a mass failure (default 60 s).
    pub fn with_unknown_grace(mut self, grace: Duration) -> Self {
        self.tracking.unknown_grace_ms = grace.as_millis().try_into().unwrap_or(u64::MAX);
        self
    }

    /// Acts only while `leader` holds the app's lease, under its token; the state was
    /// just loaded under the lease it holds now.
    pub fn with_leader(mut self, leader: crate::leader::Leader) -> Self {
        self.token = leader.held().map_or(0, |l| l.token());
        self.ledgers.fencing_token = self.token;
        self.ledgers.leader = leader.clone();
        self.leader = leader;
        self.publish();
        self
    }

    /// Reads named autoscaling policies from `book` (the control plane's).
    pub fn with_policies(mut self, book: PolicyBook) -> Self {
        self.autoscaler.book = book;
        self
    }

    /// Holds a local lease of `token` for good (no etcd): every ledger request carries it,
    /// so shards refuse this scheduler once one with a higher token has spoken to them.
    /// The simulation gives each scheduler start a higher one.
    pub fn with_fencing_token(self, token: u64) -> Self {
        let leader = crate::leader::Leader::standby("local");
        leader.set(flotilla_etcd::Lease::local("local", token));
        self.with_leader(leader)
    }

    /// Seeds the scheduler's choices (sampling, back-off, transaction ids), so a
    /// simulation replays them.
    pub fn with_seed(mut self, seed: u64) -> Self {
        let mut rng: rand::rngs::StdRng = rand::SeedableRng::seed_from_u64(seed);
        self.ledgers.rng = rand::SeedableRng::from_rng(&mut rng);
        self.planning = Planning::new(rng);
        self
    }

    fn desired(&self) -> u32 {
        self.stored.desired_units.unwrap_or(self.spec.units.initial).clamp(self.spec.units.min, self.spec.units.max)
    }

    /// Desired units of each group: (primary, secondary). Without autoscaling every
    /// unit is primary.
    fn desired_groups(&self) -> [u32; 2] {
        let total = self.desired();
        let secondary = self.stored.desired_secondary.unwrap_or(0).min(total);
        [total - secondary, secondary]
    }

    /// Units counting toward the desired number, by group.
    fn counted_groups(&self) -> [u32; 2] {
        let mut n = [0, 0];
        for u in self.stored.units.values().filter(|u| crate::rollout::counts_toward_desired(u)) {
            n[usize::from(u.secondary)] += 1;
        }
        n
    }

    /// One pass of the loop, every step.
    pub async fn reconcile(&mut self) -> anyhow::Result<()> {
        self.pass(Steps::All).await
    }

    /// One pass of the loop: `steps` says which ([`Scheduler::can_run`] first).
    #[tracing::instrument(skip_all, fields(app = %self.spec.name, ?steps))]
    async fn pass(&mut self, steps: Steps) -> anyhow::Result<()> {
        // The orphan sweep may skip reading the nodes only while no unit changed since
        // it last found nothing: only timers' passes that wrote nothing came since. Any
        // other pass may change units (some steps write at once, not with the pass),
        // and follows what may have (a command, a view change).
        let timers = steps == Steps::Timers;
        if !timers {
            self.tracking.forget_sweep();
        }
        let result = self.steps(steps).await;
        if !timers || self.wrote || result.is_err() {
            self.tracking.forget_sweep();
        }
        result
    }

    async fn steps(&mut self, steps: Steps) -> anyhow::Result<()> {
        self.wrote = false;
        match self.leader.held() {
            None => return self.passive(),
            Some(l) if l.token() != self.token => self.resume(l.token())?,
            Some(_) => {}
        }
        let all = steps != Steps::Timers;
        if !self.unsaved.is_empty() {
            // The store refused the last pass: nothing more happens until it is written.
            if let Err(e) = save(&*self.store, &self.spec.name, &self.unsaved) {
                self.publish();
                return Err(e.into());
            }
            tracing::info!(app = %self.spec.name, writes = self.unsaved.len(), "the writes the store refused are written now");
            self.unsaved.clear();
        }
        let slots = self.cluster.slots();
        let mut writes = Vec::new();
        if !self.tracking.started {
            // Place nothing against a partial view: wait until every shard has answered
            // once, saying why meanwhile.
            if slots.iter().any(|s| !s.connected) {
                // The units the app wants exist meanwhile, queued with the reason.
                self.queue_missing(&mut writes);
                let why = self.waiting_for();
                let untold = |u: &UnitRecord| u.state == UnitState::Queued && u.unplaced_reason != why;
                self.stored.units.update_matching(untold, |u| u.unplaced_reason.clone_from(&why));
                if let Err(e) = save(&*self.store, &self.spec.name, &writes) {
                    self.unsaved = writes;
                    self.publish();
                    return Err(e.into());
                }
                self.publish();
                return Ok(());
            }
            observe::adopt(&self.spec, &mut self.stored.units, &mut self.ledgers, &mut writes).await;
            self.tracking.started = true;
            // Why they waited is over; this pass's planning says why any still wait.
            let stale = |u: &UnitRecord| u.state == UnitState::Queued && u.unplaced_reason.is_some();
            self.stored.units.update_matching(stale, |u| u.unplaced_reason = None);
        }
        // Routes first: members of nodes that stopped being Alive leave the table before
        // this pass releases or stops anything.
        if steps == Steps::All {
            self.publish_routes();
        }
        self.planning.shown(&slots);
        // Only the steps that read every member's node need them found at once.
        let slots = match all {
            true => Nodes::new(slots, &self.stored.units),
            false => Nodes::plain(slots),
        };

        if all {
            // Workers coming up to replace one (make before break) that ran as of the
            // last pass take their member's place, and only then is the old one
            // released; they were shown running (API, `units`) for at least that one pass.
            self.swap_surge(&mut writes).await;
            // Each walk over every unit below takes milliseconds in a large app: the
            // runtime gets a turn between them (see `place::PLAN_CHUNK`).
            self.tracking.observe(&mut self.stored.units, &slots, now_ms(), &mut writes);
            tokio::task::yield_now().await;
            self.held.start_waiting(&self.spec, &self.stored.units, &mut self.ledgers).await;
        }
        self.tracking
            .sweep_orphans(&self.spec.name, &self.stored.units, &mut self.ledgers, &slots, self.phase_ms)
            .await;
        if all {
            self.heal(&slots, &mut writes).await;
            tokio::task::yield_now().await;
        }
        self.autoscaler.step(&self.spec, &mut self.stored, now_ms(), &mut writes);
        let desired = self.desired_groups();
        let drain_ms = self.autoscaler.drain_ms;
        scale_in::scale_in(
            &self.spec,
            &mut self.stored.units,
            desired,
            drain_ms,
            &mut self.ledgers,
            &slots,
            &mut writes,
        )
        .await;
        if all {
            self.roll(&slots, &mut writes).await;
        }
        self.rebalance(&slots, &mut writes);
        tokio::task::yield_now().await;

        self.queue_missing(&mut writes);
        self.place_queued(&mut writes).await;
        self.retire(&mut writes);
        self.wrote |= !writes.is_empty();

        // An empty batch too: a failing store reopens from here.
        if let Err(e) = save(&*self.store, &self.spec.name, &writes) {
            self.unsaved = writes;
            self.publish();
            return Err(e.into());
        }
        self.publish_with(!all && !self.wrote);
        Ok(())
    }

    /// A pass without the lease: acts on nothing, writes nothing; keeps the status (and,
    /// from `run`, the routes) published and learns whether the store answers.
    fn passive(&mut self) -> anyhow::Result<()> {
        // An empty write only asks the store whether it answers (for `apps`).
        let _ = save(&*self.store, &self.spec.name, &[]);
        self.publish();
        Ok(())
    }

    /// Holding a newer lease than the state was loaded under (this process lost the
    /// lease and took it again; another may have acted in between): reloads the app
    /// from the store and adopts from the view again, as a restart would.
    fn resume(&mut self, token: u64) -> anyhow::Result<()> {
        let stored = self.store.load(&self.spec.name)?;
        if let Some(text) = stored.spec.as_deref().filter(|t| **t != *self.spec_text) {
            match AppSpec::parse(text) {
                Ok(spec) if spec.name == self.spec.name => {
                    self.fingerprints = spec.fingerprints();
                    self.spec_text = Arc::from(text);
                    self.spec = spec;
                    self.planning.forget_classes();
                    self.autoscaler.own = self.spec.own_policy();
                    self.autoscaler.force_evaluation();
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(app = %self.spec.name, "the stored spec does not parse; keeping this one")
                }
            }
        }
        tracing::info!(app = %self.spec.name, old_token = self.token, token, units = stored.units.len(), "active again: reloaded the app from the store");
        self.stored = stored;
        // Another process may have run the canary's step meanwhile: count it afresh.
        flotilla_core::LockExt::lock_or_recover(&*self.out.traffic).start(None);
        self.unsaved.clear();
        self.planning.restart();
        self.tracking.restart();
        self.held = Held::default();
        self.token = token;
        self.ledgers.fencing_token = token;
        Ok(())
    }

    /// Places the queued units, re-planning only what was rejected against a fresher
    /// view, up to `ATTEMPTS` times with jittered back-off.
    async fn place_queued(&mut self, writes: &mut Vec<Write>) {
        let queued = self.stored.units.values().filter(|u| u.state == UnitState::Queued);
        let pass = self.planning.pass(queued.clone().count());
        let mut queued: Vec<String> = queued.map(|u| u.unit_id.clone()).take(pass).collect();
        for attempt in 0..ATTEMPTS {
            if queued.is_empty() {
                break;
            }
            if attempt > 0 {
                tokio::time::sleep(self.planning.backoff(attempt)).await;
            }
            queued = self.place_and_commit(&queued, writes).await;
        }
        for id in &queued {
            if let Some(u) = self.stored.units.get_shared(id) {
                writes.push(Write::Unit(u.clone()));
            }
        }
    }

    /// Ended units show their members stopped, and only the newest few are kept
    /// ([`crate::retention`]).
    fn retire(&mut self, writes: &mut Vec<Write>) {
        let now = now_ms();
        for id in crate::retention::mark_ended(&mut self.stored.units, now) {
            writes.extend(self.stored.units.get_shared(&id).cloned().map(Write::Unit));
        }
        for id in crate::retention::expired(&self.stored.units, now) {
            self.stored.units.remove(&id);
            writes.push(Write::DeleteUnit(id));
        }
    }

    /// Queues the units each group lacks to be as large as it should be.
    fn queue_missing(&mut self, writes: &mut Vec<Write>) {
        let (desired, counted) = (self.desired_groups(), self.counted_groups());
        for (group, (want, have)) in desired.into_iter().zip(counted).enumerate() {
            for _ in have..want {
                self.queue_unit(group == 1, writes);
            }
        }
    }

    /// Queues a new unit (next generation, current template) in the primary or secondary
    /// group, and returns its id.
    fn queue_unit(&mut self, secondary: bool, writes: &mut Vec<Write>) -> String {
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
            frame: None,
            roll_waits: None,
            template: Some(self.fingerprints.template.clone()),
            replaced_by: None,
            moving: None,
            moved_unix_ms: None,
            secondary,
            drain_timeout_ms: None,
            placement_note: None,
            ended_unix_ms: None,
            surge: Vec::new(),
        };
        tracing::info!(unit = %unit.unit_id, "unit queued");
        let (id, unit) = (unit.unit_id.clone(), Arc::new(unit));
        writes.push(Write::Unit(unit.clone()));
        writes.push(Write::NextGeneration(self.stored.next_generation));
        self.stored.units.insert(unit);
        id
    }

    /// A fresh generation for each member of `p` (a member replaced alone), from the app's
    /// counter, written before any claim under it leaves: a scheduler that dies with the
    /// commit in flight never reuses it (the orphan sweep releases a claim that landed
    /// but no unit records). `None` when the store refuses; the caller retries next pass.
    fn fresh_generations(&mut self, unit: &str, p: &crate::planner::Placement) -> Option<HashMap<String, u64>> {
        let mut generations = HashMap::new();
        for m in &p.members {
            let g = self.stored.next_generation.max(1);
            self.stored.next_generation = g + 1;
            generations.insert(m.member.clone(), g);
        }
        if let Err(e) = save(&*self.store, &self.spec.name, &[Write::NextGeneration(self.stored.next_generation)]) {
            tracing::warn!(%unit, error = %e, "cannot record the generation; will retry");
            return None;
        }
        Some(generations)
    }

    /// What a unit asks of the node pool now: the spec's shape, and the app's units in
    /// each domain and on each node under the spec's spread limits (the pool must not
    /// count on room the planner will not use).
    fn unit_shape(&self) -> flotilla_core::UnitShape {
        let mut shape = self.spec.unit_shape();
        if shape.max_units_per_domain.is_some() {
            shape.units_per_domain = self.units_per_domain().into_iter().collect();
        }
        if shape.max_units_per_node.is_some() {
            shape.units_per_node =
                self.units_per_node(None).iter().map(|(node, n)| (node.as_str().to_string(), *n)).collect();
        }
        shape
    }

    /// The shards this scheduler has no view of, and why, while it waits for them.
    fn waiting_for(&self) -> Option<String> {
        let unreachable = self.cluster.unreachable();
        if unreachable.is_empty() {
            return None;
        }
        let shards: Vec<String> = unreachable
            .iter()
            .map(|(i, e)| match e {
                Some(e) => format!("shard {i} ({e})"),
                None => format!("shard {i} (connecting)"),
            })
            .collect();
        Some(format!("no view of every shard yet, so nothing is placed: {}", shards.join("; ")))
    }

    /// A store written before versions existed holds a spec but no version: the spec in
    /// force becomes version 1, so `history` and `--check-version` have one to name.
    fn record_first_version(&mut self) -> anyhow::Result<()> {
        let Some(text) = self.stored.spec.clone().filter(|_| self.stored.versions.is_empty()) else { return Ok(()) };
        let origin = self.stored.spec_origin.clone().unwrap_or_else(|| crate::spec::SpecOrigin::new("file", now_ms()));
        let v =
            crate::store::SpecVersion { version: 1, spec: text, origin, template: self.fingerprints.template.clone() };
        save(&*self.store, &self.spec.name, &[Write::Version(v.clone())])?;
        self.stored.versions.insert(1, v);
        Ok(())
    }
}

/// Which steps a pass runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Steps {
    All,
    /// Every step but the route table first: a change of the app's nodes woke the loop,
    /// which published the table then, and none changed during the breath since.
    Woken,
    /// A quiet app ([`due`]) whose nodes did not change since the last pass: what the
    /// view and the units drive (sync, heal, roll, the route table) would find what the
    /// last pass found, so only the timers' steps run (the orphan sweep, the autoscaler,
    /// the rebalance look, retention) with what they start (scale in, queue and place).
    Timers,
}
