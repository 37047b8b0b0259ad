//! The instance lifecycle: Ray autoscaler v2's instance manager as one transition table
//! and a pure state machine over it. No I/O and no clock: every call takes `now_ms`, and
//! the driver does the side effects (provider calls, persistence) that the states ask for.
//!
//! The happy path:
//!
//! ```text
//! QUEUED → REQUESTED → ALLOCATED → AGENT_STARTING → RUNNING
//!        → DRAIN_REQUESTED → DRAINING → DRAINED → TERMINATING → TERMINATED
//! ```
//!
//! The driver's contract, so that a crash at any point neither leaks an instance nor
//! launches one twice (the instance id is the provider's idempotency key):
//!
//! 1. [`Instances::to_launch`] picks QUEUED records; [`Instances::begin_launch`] moves each
//!    to REQUESTED, the driver **persists** it and only then calls the provider's `launch`
//!    with the record's id. A failed call goes to [`Instances::launch_failed`].
//! 2. Every sync lists the provider and reads the cluster view, and
//!    [`Instances::observe`] moves records on what it saw, never on what a call was
//!    supposed to do.
//! 3. Every [`Change::Transition`] into TERMINATING (from `observe`,
//!    [`Instances::request_terminate`] or a drained node) is a `terminate` call to make;
//!    a failed call goes to [`Instances::terminate_failed`]. A restarted driver calls
//!    `terminate` again for every record still TERMINATING (terminate is idempotent).
//! 4. [`Change::Leaked`] names cloud instances that carry the id of a finished record
//!    (a launch that landed after its record gave up): terminate them too.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::provider::CloudInstance;

/// Where an instance is in its life. Named after Ray v2's `Instance.InstanceStatus`, with
/// the Ray-specific ones renamed for Flotilla's agent: `RAY_INSTALLING` is
/// [`AgentStarting`](InstanceState::AgentStarting), `RAY_STOP_REQUESTED` /
/// `RAY_STOPPING` / `RAY_STOPPED` are the drain states. Ray's `ALLOCATION_TIMEOUT` (a
/// Kubernetes pod that stays pending) is folded into the agent start timeout here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceState {
    /// Wanted, not yet asked for (waits for the launch limits).
    Queued,
    /// The provider was asked to launch it (the record was persisted first).
    Requested,
    /// The provider lists it.
    Allocated,
    /// Listed, waiting for its agent to register and turn Alive in the view.
    AgentStarting,
    /// Its node is Alive in the view.
    Running,
    /// Chosen for scale-in; the drain is being asked of its shard.
    DrainRequested,
    /// Its node is draining in the view (units move away).
    Draining,
    /// Its node holds nothing (or the drain timed out): ready to terminate.
    Drained,
    /// The provider was (or is about to be) asked to terminate it.
    Terminating,
    /// Gone from the provider's list. Terminal.
    Terminated,
    /// Never appeared after every launch attempt. Terminal.
    AllocationFailed,
    /// Listed, but its agent never became Alive in time; it is terminated next.
    AgentStartFailed,
    /// Terminate failed or timed out; it is retried.
    TerminationFailed,
}

use InstanceState::*;

impl InstanceState {
    pub const ALL: [InstanceState; 13] = [
        Queued,
        Requested,
        Allocated,
        AgentStarting,
        Running,
        DrainRequested,
        Draining,
        Drained,
        Terminating,
        Terminated,
        AllocationFailed,
        AgentStartFailed,
        TerminationFailed,
    ];

    /// The serde name (`agent_starting`), also the metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Queued => "queued",
            Requested => "requested",
            Allocated => "allocated",
            AgentStarting => "agent_starting",
            Running => "running",
            DrainRequested => "drain_requested",
            Draining => "draining",
            Drained => "drained",
            Terminating => "terminating",
            Terminated => "terminated",
            AllocationFailed => "allocation_failed",
            AgentStartFailed => "agent_start_failed",
            TerminationFailed => "termination_failed",
        }
    }

    /// No transition leaves it.
    pub fn is_terminal(self) -> bool {
        matches!(self, Terminated | AllocationFailed)
    }

    /// A launch is under way: it counts against the launch limits.
    pub fn is_in_flight(self) -> bool {
        matches!(self, Requested | Allocated | AgentStarting)
    }

    /// The instance may exist at the provider (anything after the launch call and before
    /// the end): when the provider stops listing it, it is gone.
    pub fn may_be_listed(self) -> bool {
        !matches!(self, Queued | Requested) && !self.is_terminal()
    }
}

impl fmt::Display for InstanceState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Every legal transition, adapted from Ray v2's `InstanceUtil.get_valid_transitions`.
/// This table is the only authority: [`Instance::transition`] refuses anything else.
pub const TRANSITIONS: &[(InstanceState, InstanceState)] = &[
    (Queued, Requested),
    // Cancelled before it was asked for (the pool shrank meanwhile).
    (Queued, Terminated),
    (Requested, Allocated),
    // The launch timed out or failed: queue again (at most `max_launch_attempts`)...
    (Requested, Queued),
    // ...or give up.
    (Requested, AllocationFailed),
    (Allocated, AgentStarting),
    // The agent registered before the sync that saw the instance listed.
    (Allocated, Running),
    // Its node is Dead in the view, or the driver no longer wants it.
    (Allocated, Terminating),
    // No longer listed: preempted or lost.
    (Allocated, Terminated),
    (AgentStarting, Running),
    (AgentStarting, AgentStartFailed),
    (AgentStarting, Terminating),
    (AgentStarting, Terminated),
    (Running, DrainRequested),
    // The node drains by itself (a preemption notice, an operator's drain).
    (Running, Draining),
    (Running, Terminating),
    (Running, Terminated),
    (DrainRequested, Draining),
    // The drain was refused (the node is no longer idle) or never took effect.
    (DrainRequested, Running),
    (DrainRequested, Terminating),
    (DrainRequested, Terminated),
    (Draining, Drained),
    (Draining, Terminating),
    (Draining, Terminated),
    (Drained, Terminating),
    (Drained, Terminated),
    (AgentStartFailed, Terminating),
    (AgentStartFailed, Terminated),
    (Terminating, Terminated),
    (Terminating, TerminationFailed),
    // Retry the terminate.
    (TerminationFailed, Terminating),
    (TerminationFailed, Terminated),
];

/// True when `from → to` is in [`TRANSITIONS`].
pub fn allowed(from: InstanceState, to: InstanceState) -> bool {
    TRANSITIONS.iter().any(|&(f, t)| f == from && t == to)
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("instance {id}: {from} → {to} is not a legal transition")]
    Illegal { id: String, from: InstanceState, to: InstanceState },
    #[error("no instance {0}")]
    NotFound(String),
}

/// How many `(state, at_ms)` entries a record keeps.
pub const HISTORY_LEN: usize = 10;

/// One instance, as persisted. Its `id` is also the node id its agent registers with and
/// the provider's idempotency key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    pub id: String,
    pub node_type: String,
    pub state: InstanceState,
    /// When it entered `state`.
    pub since_ms: u64,
    /// How many times it went QUEUED → REQUESTED through [`Instances::begin_launch`].
    #[serde(default)]
    pub launch_attempts: u32,
    /// Why the last transition happened.
    #[serde(default)]
    pub reason: Option<String>,
    /// The last [`HISTORY_LEN`] states entered, oldest first.
    #[serde(default)]
    pub history: Vec<(InstanceState, u64)>,
    /// When the provider first listed it.
    #[serde(default)]
    pub allocated_at_ms: Option<u64>,
}

impl Instance {
    /// A record born in `state` (QUEUED, or ALLOCATED when adopted).
    fn new(id: String, node_type: String, state: InstanceState, now_ms: u64, reason: String) -> Self {
        Instance {
            id,
            node_type,
            state,
            since_ms: now_ms,
            launch_attempts: 0,
            reason: Some(reason),
            history: vec![(state, now_ms)],
            allocated_at_ms: (state == Allocated).then_some(now_ms),
        }
    }

    /// The only way a state changes: checked against [`TRANSITIONS`], recorded in the
    /// history and counted in `flotilla_pool_instance_transitions_total{from,to}`.
    pub fn transition(
        &mut self,
        to: InstanceState,
        now_ms: u64,
        reason: impl Into<String>,
    ) -> Result<(), TransitionError> {
        let from = self.state;
        if !allowed(from, to) {
            return Err(TransitionError::Illegal { id: self.id.clone(), from, to });
        }
        self.state = to;
        self.since_ms = now_ms;
        self.reason = Some(reason.into());
        if self.history.len() >= HISTORY_LEN {
            let excess = self.history.len() + 1 - HISTORY_LEN;
            self.history.drain(..excess);
        }
        self.history.push((to, now_ms));
        if to == Allocated && self.allocated_at_ms.is_none() {
            self.allocated_at_ms = Some(now_ms);
        }
        metrics::counter!("flotilla_pool_instance_transitions_total", "from" => from.as_str(), "to" => to.as_str())
            .increment(1);
        tracing::debug!(instance = %self.id, %from, %to, reason = self.reason.as_deref().unwrap_or(""), "instance transition");
        Ok(())
    }

    /// How long it has been in its state.
    pub fn age_ms(&self, now_ms: u64) -> u64 {
        now_ms.saturating_sub(self.since_ms)
    }
}

/// What one sync saw of an instance's node in the merged cluster view (keyed by node id,
/// which is the instance id). A node missing from the map has not registered (yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NodeSeen {
    /// Registered and heartbeating.
    pub alive: bool,
    /// Declared Dead by its shard (heartbeats stopped).
    pub dead: bool,
    /// Its shard marks it draining.
    pub draining: bool,
    /// No claims on it (nothing placed, nothing reserved).
    pub allocated_nothing: bool,
}

/// How long each waiting state may last, and how often a launch is retried. Ray's
/// defaults (`InstanceReconcileConfig`) are for clouds (10 min to allocate, 30 min to
/// install Ray); these suit agents that start in seconds. All configurable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct Timeouts {
    /// REQUESTED without being listed → QUEUED again (or ALLOCATION_FAILED).
    pub request_ms: u64,
    /// AGENT_STARTING without the node turning Alive → AGENT_START_FAILED.
    pub agent_start_ms: u64,
    /// DRAIN_REQUESTED without the node draining → RUNNING (the drain did not take);
    /// DRAINING for longer → DRAINED anyway (what is left is stopped with the node).
    pub drain_ms: u64,
    /// TERMINATING and still listed → TERMINATION_FAILED (then retried).
    pub terminate_ms: u64,
    /// Launch attempts before ALLOCATION_FAILED (Ray's
    /// `max_num_retry_request_to_allocate`, 3).
    pub max_launch_attempts: u32,
    /// How long finished records are kept for `status` before [`Instances::prune`].
    pub retention_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            request_ms: 60_000,
            agent_start_ms: 120_000,
            drain_ms: 120_000,
            terminate_ms: 60_000,
            max_launch_attempts: 3,
            retention_ms: 3_600_000,
        }
    }
}

/// What [`Instances::observe`] (and the other mutators) did, for the driver to act on and
/// to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// A record moved. Into TERMINATING: call the provider's `terminate`.
    Transition { id: String, node_type: String, from: InstanceState, to: InstanceState, reason: String },
    /// A listed cloud instance without a record, of a known node type, now managed
    /// (born ALLOCATED; its later transitions follow as their own changes).
    Adopted { id: String, node_type: String },
    /// A listed cloud instance of a node type this pool does not know: left alone.
    UnknownType { id: String, node_type: String },
    /// A listed cloud instance whose record is finished (ALLOCATION_FAILED or
    /// TERMINATED): a launch that landed late, or a terminate that did not. Terminate it.
    Leaked { id: String, node_type: String, state: InstanceState },
}

/// The pure instance manager: every instance of the pool by id.
#[derive(Debug, Clone)]
pub struct Instances {
    map: BTreeMap<String, Instance>,
    node_types: BTreeSet<String>,
    /// The id generator's state (splitmix64), seeded so tests are deterministic.
    rng: u64,
}

/// The per-type floor of launches pending at once (Ray v1's
/// `AUTOSCALER_UPSCALING_INITIAL_NUM_NODES`).
pub const UPSCALING_INITIAL_NODES: usize = 5;

/// Room for `pool-` and an 8-hex suffix within a node id's 128 bytes.
pub const MAX_NODE_TYPE_LEN: usize = 100;

impl Instances {
    /// An empty manager for the pool's `node_types`. `seed` drives the id suffixes; give
    /// it something random in production (ids are also checked against every record).
    pub fn new(node_types: impl IntoIterator<Item = String>, seed: u64) -> Self {
        Instances { map: BTreeMap::new(), node_types: node_types.into_iter().collect(), rng: seed }
    }

    /// Records loaded from the store (a restart). A later duplicate id replaces an earlier.
    pub fn restore(&mut self, records: impl IntoIterator<Item = Instance>) {
        for r in records {
            self.map.insert(r.id.clone(), r);
        }
    }

    /// The node types adoption accepts (the config may change at runtime).
    pub fn set_node_types(&mut self, node_types: impl IntoIterator<Item = String>) {
        self.node_types = node_types.into_iter().collect();
    }

    pub fn get(&self, id: &str) -> Option<&Instance> {
        self.map.get(id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Instance> {
        self.map.values()
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// How many records of each node type are in each state (zeros left out).
    pub fn by_type_state(&self) -> BTreeMap<(String, InstanceState), usize> {
        let mut out = BTreeMap::new();
        for i in self.map.values() {
            *out.entry((i.node_type.clone(), i.state)).or_default() += 1;
        }
        out
    }

    /// The records of `node_type` that are neither finished nor on their way out: what the
    /// pool has or will have of that type (for `min_workers` / `max_workers`).
    pub fn live_of_type<'a>(&'a self, node_type: &'a str) -> impl Iterator<Item = &'a Instance> + 'a {
        self.map.values().filter(move |i| {
            i.node_type == node_type
                && !i.state.is_terminal()
                && !matches!(i.state, Terminating | TerminationFailed | AgentStartFailed)
        })
    }

    fn next_id(&mut self, node_type: &str) -> String {
        loop {
            // splitmix64
            self.rng = self.rng.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.rng;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^= z >> 31;
            let id = format!("pool-{node_type}-{:08x}", z as u32);
            if !self.map.contains_key(&id) {
                return id;
            }
        }
    }

    /// `n` new QUEUED records of `node_type`, with fresh ids (returned).
    pub fn queue(&mut self, node_type: &str, n: usize, now_ms: u64, reason: &str) -> Vec<String> {
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.next_id(node_type);
            let rec = Instance::new(id.clone(), node_type.to_string(), Queued, now_ms, reason.to_string());
            self.map.insert(id.clone(), rec);
            ids.push(id);
        }
        ids
    }

    /// Which QUEUED records to launch now, oldest first. Two limits, from Ray's
    /// autoscalers:
    ///
    /// - globally, at most `max_concurrent_launches` in flight (REQUESTED, ALLOCATED and
    ///   AGENT_STARTING). Ray v2's reconciler (`_compute_to_launch`) counts only REQUESTED;
    ///   here an agent that has not registered is still a launch under way;
    /// - per node type, at most `max(5, ceil(upscaling_speed × max(running, 1)))` in
    ///   flight at once, where `running` counts that type's RUNNING records: a pool grows
    ///   geometrically (speed 1.0 at most doubles it per round of launches). Ray v2 applies
    ///   `max(1, …)` per reconcile round (every 5 s) without counting what is already
    ///   pending; bounding what is pending at once (Ray v1's reading, with v1's floor
    ///   `AUTOSCALER_UPSCALING_INITIAL_NUM_NODES = 5`) makes the limit independent of
    ///   how often the driver runs, and the floor keeps a pool that starts from zero from
    ///   growing one node at a time.
    ///
    /// Types are served in name order, so the global limit is shared deterministically.
    /// `now_ms` is unused today (a backoff between launch attempts would use it).
    pub fn to_launch(&self, max_concurrent_launches: usize, upscaling_speed: f64, now_ms: u64) -> Vec<String> {
        let _ = now_ms;
        let mut in_flight_total = 0usize;
        let mut per_type: BTreeMap<&str, (usize, usize, Vec<&Instance>)> = BTreeMap::new();
        for i in self.map.values() {
            let e = per_type.entry(i.node_type.as_str()).or_default();
            match i.state {
                s if s.is_in_flight() => {
                    in_flight_total += 1;
                    e.1 += 1;
                }
                Running => e.0 += 1,
                Queued => e.2.push(i),
                _ => {}
            }
        }
        let speed = if upscaling_speed.is_finite() && upscaling_speed > 0.0 { upscaling_speed } else { 0.0 };
        let mut budget = max_concurrent_launches.saturating_sub(in_flight_total);
        let mut out = Vec::new();
        for (_, (running, in_flight, mut queued)) in per_type {
            if budget == 0 {
                break;
            }
            if queued.is_empty() {
                continue;
            }
            let allowed_pending = ((speed * running.max(1) as f64).ceil() as usize).max(UPSCALING_INITIAL_NODES);
            let n = allowed_pending.saturating_sub(in_flight).min(budget).min(queued.len());
            queued.sort_by(|a, b| a.since_ms.cmp(&b.since_ms).then_with(|| a.id.cmp(&b.id)));
            out.extend(queued.iter().take(n).map(|i| i.id.clone()));
            budget -= n;
        }
        out
    }

    fn move_to(&mut self, id: &str, to: InstanceState, now_ms: u64, reason: &str) -> Result<Change, TransitionError> {
        let rec = self.map.get_mut(id).ok_or_else(|| TransitionError::NotFound(id.to_string()))?;
        let from = rec.state;
        rec.transition(to, now_ms, reason)?;
        Ok(Change::Transition {
            id: id.to_string(),
            node_type: rec.node_type.clone(),
            from,
            to,
            reason: reason.to_string(),
        })
    }

    /// QUEUED → REQUESTED, counting the attempt. Persist the record, then call `launch`.
    pub fn begin_launch(&mut self, id: &str, now_ms: u64) -> Result<Change, TransitionError> {
        let attempt = self.map.get(id).map(|i| i.launch_attempts + 1).unwrap_or(1);
        let change = self.move_to(id, Requested, now_ms, &format!("launch attempt {attempt}"))?;
        if let Some(i) = self.map.get_mut(id) {
            i.launch_attempts = attempt;
        }
        Ok(change)
    }

    /// The provider refused the launch: queue it again, or give up after
    /// `max_launch_attempts`. (A launch that may still land is harmless: the next sync
    /// matches it by id, or reports it as [`Change::Leaked`].)
    pub fn launch_failed(
        &mut self,
        id: &str,
        now_ms: u64,
        error: &str,
        t: &Timeouts,
    ) -> Result<Change, TransitionError> {
        let attempts = self.map.get(id).map(|i| i.launch_attempts).unwrap_or(0);
        if attempts >= t.max_launch_attempts {
            self.move_to(id, AllocationFailed, now_ms, &format!("launch failed after {attempts} attempts: {error}"))
        } else {
            self.move_to(id, Queued, now_ms, &format!("launch failed, queued again: {error}"))
        }
    }

    /// RUNNING → DRAIN_REQUESTED: the driver chose it for scale-in and asks its shard to
    /// drain it.
    pub fn request_drain(&mut self, id: &str, now_ms: u64, reason: &str) -> Result<Change, TransitionError> {
        self.move_to(id, DrainRequested, now_ms, reason)
    }

    /// DRAIN_REQUESTED → RUNNING: the shard refused the drain (the node is busy again).
    pub fn drain_refused(&mut self, id: &str, now_ms: u64, reason: &str) -> Result<Change, TransitionError> {
        self.move_to(id, Running, now_ms, reason)
    }

    /// The driver no longer wants it: a QUEUED one is cancelled (TERMINATED), anything
    /// that may exist goes to TERMINATING (call `terminate`).
    pub fn request_terminate(&mut self, id: &str, now_ms: u64, reason: &str) -> Result<Change, TransitionError> {
        let to = match self.map.get(id).map(|i| i.state) {
            Some(Queued) => Terminated,
            _ => Terminating,
        };
        self.move_to(id, to, now_ms, reason)
    }

    /// The provider's `terminate` failed: TERMINATING → TERMINATION_FAILED; the next
    /// sync retries.
    pub fn terminate_failed(&mut self, id: &str, now_ms: u64, error: &str) -> Result<Change, TransitionError> {
        self.move_to(id, TerminationFailed, now_ms, &format!("terminate failed: {error}"))
    }

    /// Apply what one sync saw: the provider's list and the view's nodes. Records move
    /// only on this evidence (and on timeouts), never on a call having been made.
    pub fn observe(
        &mut self,
        cloud: &[CloudInstance],
        nodes: &HashMap<String, NodeSeen>,
        now_ms: u64,
        t: &Timeouts,
    ) -> Vec<Change> {
        let mut changes = Vec::new();
        let listed: HashMap<&str, &CloudInstance> = cloud.iter().map(|c| (c.id.as_str(), c)).collect();

        // Listed instances this manager has no live record of.
        let mut seen = BTreeSet::new();
        for c in cloud {
            if !seen.insert(c.id.as_str()) {
                continue;
            }
            match self.map.get(&c.id) {
                Some(r) if r.state.is_terminal() => {
                    changes.push(Change::Leaked { id: c.id.clone(), node_type: c.node_type.clone(), state: r.state })
                }
                Some(_) => {}
                None if self.node_types.contains(&c.node_type) => {
                    let rec = Instance::new(
                        c.id.clone(),
                        c.node_type.clone(),
                        Allocated,
                        now_ms,
                        "adopted: listed by the provider without a record".into(),
                    );
                    self.map.insert(c.id.clone(), rec);
                    changes.push(Change::Adopted { id: c.id.clone(), node_type: c.node_type.clone() });
                }
                None => changes.push(Change::UnknownType { id: c.id.clone(), node_type: c.node_type.clone() }),
            }
        }

        let ids: Vec<String> = self.map.keys().cloned().collect();
        for id in ids {
            // Several steps may follow from one observation (REQUESTED → ALLOCATED →
            // RUNNING when the agent was quick); each is a legal transition of its own.
            for _ in 0..4 {
                let Some(rec) = self.map.get(&id) else { break };
                let Some((to, reason)) = step(rec, listed.contains_key(id.as_str()), nodes.get(&id), now_ms, t) else {
                    break;
                };
                match self.move_to(&id, to, now_ms, &reason) {
                    // A failed terminate is retried on the next sync, not in a tight loop.
                    Ok(c) if to == TerminationFailed => {
                        changes.push(c);
                        break;
                    }
                    Ok(c) => changes.push(c),
                    Err(e) => {
                        // `step` only proposes legal moves; never loop on a bad one.
                        tracing::error!(error = %e, "instance step proposed an illegal transition");
                        break;
                    }
                }
            }
        }
        changes
    }

    /// Drop finished records older than `retention_ms`; returns their ids (to remove from
    /// the store).
    pub fn prune(&mut self, now_ms: u64, t: &Timeouts) -> Vec<String> {
        let old: Vec<String> = self
            .map
            .values()
            .filter(|i| i.state.is_terminal() && i.age_ms(now_ms) >= t.retention_ms)
            .map(|i| i.id.clone())
            .collect();
        for id in &old {
            self.map.remove(id);
        }
        old
    }
}

/// The next move of one record given what the sync saw, or None. Pure; every proposal is
/// in [`TRANSITIONS`] (a test checks).
fn step(
    rec: &Instance,
    listed: bool,
    node: Option<&NodeSeen>,
    now_ms: u64,
    t: &Timeouts,
) -> Option<(InstanceState, String)> {
    let age = rec.age_ms(now_ms);
    let dead = node.is_some_and(|n| n.dead);
    let alive = node.is_some_and(|n| n.alive && !n.dead);
    let gone = || (Terminated, "no longer listed by the provider: preempted or lost".to_string());
    match rec.state {
        Queued if listed => {
            Some((Requested, "listed by the provider: an earlier launch of this id landed late".into()))
        }
        Queued => None,
        Requested if listed => Some((Allocated, "listed by the provider".into())),
        Requested if age >= t.request_ms => {
            if rec.launch_attempts >= t.max_launch_attempts {
                Some((
                    AllocationFailed,
                    format!(
                        "not listed {}s after launch attempt {} of {}",
                        t.request_ms / 1000,
                        rec.launch_attempts,
                        t.max_launch_attempts
                    ),
                ))
            } else {
                Some((
                    Queued,
                    format!(
                        "not listed {}s after launch attempt {}: queued again",
                        t.request_ms / 1000,
                        rec.launch_attempts
                    ),
                ))
            }
        }
        Requested => None,
        Terminating if !listed => Some((Terminated, "no longer listed by the provider".into())),
        Terminating if age >= t.terminate_ms => {
            Some((TerminationFailed, format!("still listed {}s after terminate", t.terminate_ms / 1000)))
        }
        Terminating => None,
        TerminationFailed if !listed => Some((Terminated, "no longer listed by the provider".into())),
        TerminationFailed => Some((Terminating, "retrying terminate".into())),
        Terminated | AllocationFailed => None,
        _ if !listed => Some(gone()),
        Allocated | AgentStarting | Running | DrainRequested | Draining if dead => {
            Some((Terminating, "its node is Dead in the view".into()))
        }
        Allocated if alive => Some((Running, "its node is Alive in the view".into())),
        Allocated => Some((AgentStarting, "listed; waiting for its agent to register".into())),
        AgentStarting if alive => Some((Running, "its node is Alive in the view".into())),
        AgentStarting if age >= t.agent_start_ms => {
            Some((AgentStartFailed, format!("its agent did not turn Alive within {}s", t.agent_start_ms / 1000)))
        }
        AgentStarting => None,
        AgentStartFailed => Some((Terminating, "agent start failed".into())),
        Running if node.is_some_and(|n| n.draining) => Some((Draining, "its node is draining in the view".into())),
        Running => None,
        DrainRequested if node.is_some_and(|n| n.draining) => {
            Some((Draining, "its node is draining in the view".into()))
        }
        DrainRequested if age >= t.drain_ms => {
            Some((Running, format!("the drain did not take effect within {}s", t.drain_ms / 1000)))
        }
        DrainRequested => None,
        Draining if node.is_some_and(|n| n.allocated_nothing) => Some((Drained, "its node holds nothing".into())),
        Draining if age >= t.drain_ms => Some((Drained, format!("drain timed out after {}s", t.drain_ms / 1000))),
        Draining => None,
        Drained => Some((Terminating, "drained".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const T: Timeouts = Timeouts {
        request_ms: 60_000,
        agent_start_ms: 120_000,
        drain_ms: 120_000,
        terminate_ms: 60_000,
        max_launch_attempts: 3,
        retention_ms: 3_600_000,
    };

    fn manager() -> Instances {
        Instances::new(["cpu".to_string(), "gpu".to_string()], 42)
    }

    fn listed(ids: &[&str]) -> Vec<CloudInstance> {
        ids.iter().map(|id| CloudInstance { id: id.to_string(), node_type: "cpu".into() }).collect()
    }

    fn seen(id: &str, n: NodeSeen) -> HashMap<String, NodeSeen> {
        HashMap::from([(id.to_string(), n)])
    }

    const ALIVE: NodeSeen = NodeSeen { alive: true, dead: false, draining: false, allocated_nothing: false };

    fn state(im: &Instances, id: &str) -> InstanceState {
        im.get(id).map(|i| i.state).unwrap_or(Queued)
    }

    fn one_queued(im: &mut Instances) -> String {
        im.queue("cpu", 1, 0, "test").remove(0)
    }

    #[test]
    fn the_table_accepts_exactly_its_transitions() {
        for &(from, to) in TRANSITIONS {
            let mut i = Instance::new("x".into(), "cpu".into(), from, 0, "t".into());
            assert_eq!(i.transition(to, 1, "t"), Ok(()), "{from} → {to}");
            assert_eq!(i.state, to);
        }
        for (from, to) in [
            (Queued, Running),
            (Queued, Allocated),
            (Requested, Running),
            (Running, Queued),
            (Running, Drained),
            (Terminated, Queued),
            (Terminated, Terminating),
            (AllocationFailed, Queued),
            (Terminating, Running),
            (Drained, Running),
            (AgentStartFailed, Running),
            (Running, Running),
        ] {
            let mut i = Instance::new("x".into(), "cpu".into(), from, 0, "t".into());
            assert!(matches!(i.transition(to, 1, "t"), Err(TransitionError::Illegal { .. })), "{from} → {to}");
            assert_eq!(i.state, from, "a refused transition changes nothing");
        }
    }

    #[test]
    fn every_state_is_reachable_and_only_the_terminal_ones_are_dead_ends() {
        let mut reached = BTreeSet::from([Queued]);
        loop {
            let before = reached.len();
            for &(f, t) in TRANSITIONS {
                if reached.contains(&f) {
                    reached.insert(t);
                }
            }
            if reached.len() == before {
                break;
            }
        }
        assert_eq!(reached.len(), InstanceState::ALL.len(), "{reached:?}");
        for s in InstanceState::ALL {
            let has_exit = TRANSITIONS.iter().any(|&(f, _)| f == s);
            assert_eq!(!has_exit, s.is_terminal(), "{s}");
            // The serde name is as_str().
            assert_eq!(serde_json::to_string(&s).ok(), Some(format!("\"{}\"", s.as_str())));
        }
    }

    #[test]
    fn history_is_bounded() {
        let mut i = Instance::new("x".into(), "cpu".into(), Running, 0, "t".into());
        for n in 0..20 {
            let to = if n % 2 == 0 { DrainRequested } else { Running };
            assert_eq!(i.transition(to, n, "flap"), Ok(()));
        }
        assert_eq!(i.history.len(), HISTORY_LEN);
        assert_eq!(i.history.last(), Some(&(Running, 19)));
    }

    #[test]
    fn ids_are_fresh_and_deterministic() {
        let mut a = manager();
        let mut b = manager();
        let ia = a.queue("cpu", 50, 0, "t");
        assert_eq!(ia, b.queue("cpu", 50, 0, "t"));
        assert_eq!(ia.iter().collect::<BTreeSet<_>>().len(), 50);
        assert!(ia.iter().all(|id| id.starts_with("pool-cpu-") && id.len() == "pool-cpu-".len() + 8));
    }

    #[test]
    fn the_happy_path_through_observe() {
        let mut im = manager();
        let id = one_queued(&mut im);
        assert_eq!(im.to_launch(10, 1.0, 0), vec![id.clone()]);
        im.begin_launch(&id, 1_000).ok();
        assert_eq!(state(&im, &id), Requested);

        // Not listed yet: patience.
        assert!(im.observe(&[], &HashMap::new(), 2_000, &T).is_empty());
        im.observe(&listed(&[&id]), &HashMap::new(), 3_000, &T);
        assert_eq!(state(&im, &id), AgentStarting);
        let ch = im.observe(&listed(&[&id]), &seen(&id, ALIVE), 4_000, &T);
        assert_eq!(state(&im, &id), Running, "{ch:?}");

        im.request_drain(&id, 5_000, "idle").ok();
        assert_eq!(state(&im, &id), DrainRequested);
        let draining = NodeSeen { draining: true, ..ALIVE };
        im.observe(&listed(&[&id]), &seen(&id, draining), 6_000, &T);
        assert_eq!(state(&im, &id), Draining);
        let ch = im.observe(&listed(&[&id]), &seen(&id, NodeSeen { allocated_nothing: true, ..draining }), 7_000, &T);
        assert_eq!(state(&im, &id), Terminating, "drained, then terminated: {ch:?}");
        assert!(ch.iter().any(|c| matches!(c, Change::Transition { to: Drained, .. })));
        assert!(ch.iter().any(|c| matches!(c, Change::Transition { to: Terminating, .. })));

        im.observe(&listed(&[&id]), &HashMap::new(), 8_000, &T);
        assert_eq!(state(&im, &id), Terminating, "still listed: still terminating");
        im.observe(&[], &HashMap::new(), 9_000, &T);
        assert_eq!(state(&im, &id), Terminated);
        let path: Vec<InstanceState> = im.get(&id).map(|i| i.history.iter().map(|h| h.0).collect()).unwrap_or_default();
        assert_eq!(path[..5], [Queued, Requested, Allocated, AgentStarting, Running]);
        assert_eq!(path.len(), HISTORY_LEN, "history keeps the last {HISTORY_LEN}");

        // Kept for a while, then pruned.
        assert!(im.prune(9_000 + T.retention_ms - 1, &T).is_empty());
        assert_eq!(im.prune(9_000 + T.retention_ms, &T), vec![id]);
        assert!(im.is_empty());
    }

    #[test]
    fn a_quick_agent_skips_agent_starting() {
        let mut im = manager();
        let id = one_queued(&mut im);
        im.begin_launch(&id, 0).ok();
        im.observe(&listed(&[&id]), &seen(&id, ALIVE), 1_000, &T);
        assert_eq!(state(&im, &id), Running);
    }

    #[test]
    fn a_launch_is_retried_three_times_then_fails() {
        let mut im = manager();
        let id = one_queued(&mut im);
        let mut now = 0;
        for attempt in 1..=3 {
            assert_eq!(im.to_launch(10, 1.0, now), vec![id.clone()]);
            im.begin_launch(&id, now).ok();
            assert_eq!(im.get(&id).map(|i| i.launch_attempts), Some(attempt));
            now += T.request_ms - 1;
            im.observe(&[], &HashMap::new(), now, &T);
            assert_eq!(state(&im, &id), Requested, "not yet timed out");
            now += 1;
            im.observe(&[], &HashMap::new(), now, &T);
            let want = if attempt < 3 { Queued } else { AllocationFailed };
            assert_eq!(state(&im, &id), want, "attempt {attempt}");
        }
        assert!(im.to_launch(10, 1.0, now).is_empty());

        // A launch that lands after the record gave up is a leak to terminate.
        let ch = im.observe(&listed(&[&id]), &HashMap::new(), now + 1, &T);
        assert_eq!(ch, vec![Change::Leaked { id: id.clone(), node_type: "cpu".into(), state: AllocationFailed }]);
        assert_eq!(state(&im, &id), AllocationFailed);
    }

    #[test]
    fn a_refused_launch_is_queued_again_then_fails() {
        let mut im = manager();
        let id = one_queued(&mut im);
        for attempt in 1..=3 {
            im.begin_launch(&id, attempt).ok();
            im.launch_failed(&id, attempt, "quota", &T).ok();
        }
        assert_eq!(state(&im, &id), AllocationFailed);
    }

    #[test]
    fn a_late_launch_of_a_requeued_record_is_matched() {
        let mut im = manager();
        let id = one_queued(&mut im);
        im.begin_launch(&id, 0).ok();
        im.observe(&[], &HashMap::new(), T.request_ms, &T);
        assert_eq!(state(&im, &id), Queued);
        im.observe(&listed(&[&id]), &HashMap::new(), T.request_ms + 1, &T);
        assert_eq!(state(&im, &id), AgentStarting);
        assert_eq!(im.len(), 1);
    }

    #[test]
    fn a_lost_instance_is_terminated() {
        for at in [Allocated, AgentStarting, Running, DrainRequested, Draining] {
            let mut im = manager();
            let id = one_queued(&mut im);
            if let Some(i) = im.map.get_mut(&id) {
                i.state = at;
            }
            let ch = im.observe(&[], &seen(&id, ALIVE), 1_000, &T);
            assert_eq!(state(&im, &id), Terminated, "{at}");
            assert!(
                matches!(&ch[..], [Change::Transition { reason, .. }] if reason.contains("preempted or lost")),
                "{ch:?}"
            );
        }
    }

    #[test]
    fn a_dead_node_is_terminated() {
        let mut im = manager();
        let id = one_queued(&mut im);
        im.begin_launch(&id, 0).ok();
        im.observe(&listed(&[&id]), &seen(&id, ALIVE), 1_000, &T);
        let dead = NodeSeen { alive: false, dead: true, ..Default::default() };
        let ch = im.observe(&listed(&[&id]), &seen(&id, dead), 2_000, &T);
        assert_eq!(state(&im, &id), Terminating, "{ch:?}");
    }

    #[test]
    fn a_refused_drain_returns_to_running() {
        let mut im = manager();
        let id = one_queued(&mut im);
        im.begin_launch(&id, 0).ok();
        im.observe(&listed(&[&id]), &seen(&id, ALIVE), 1_000, &T);
        im.request_drain(&id, 2_000, "idle").ok();
        assert_eq!(im.drain_refused(&id, 2_100, "node busy again").map(|_| state(&im, &id)), Ok(Running));

        // A drain that never shows in the view also lapses.
        im.request_drain(&id, 3_000, "idle").ok();
        im.observe(&listed(&[&id]), &seen(&id, ALIVE), 3_000 + T.drain_ms - 1, &T);
        assert_eq!(state(&im, &id), DrainRequested);
        im.observe(&listed(&[&id]), &seen(&id, ALIVE), 3_000 + T.drain_ms, &T);
        assert_eq!(state(&im, &id), Running);
    }

    #[test]
    fn a_drain_that_takes_too_long_ends_anyway() {
        let mut im = manager();
        let id = one_queued(&mut im);
        if let Some(i) = im.map.get_mut(&id) {
            i.state = Draining;
            i.since_ms = 0;
        }
        let busy = NodeSeen { draining: true, ..ALIVE };
        im.observe(&listed(&[&id]), &seen(&id, busy), T.drain_ms - 1, &T);
        assert_eq!(state(&im, &id), Draining);
        im.observe(&listed(&[&id]), &seen(&id, busy), T.drain_ms, &T);
        assert_eq!(state(&im, &id), Terminating);
    }

    #[test]
    fn agents_that_never_start_are_terminated() {
        let mut im = manager();
        let id = one_queued(&mut im);
        im.begin_launch(&id, 0).ok();
        im.observe(&listed(&[&id]), &HashMap::new(), 1_000, &T);
        assert_eq!(state(&im, &id), AgentStarting);
        im.observe(&listed(&[&id]), &HashMap::new(), 1_000 + T.agent_start_ms - 1, &T);
        assert_eq!(state(&im, &id), AgentStarting);
        let ch = im.observe(&listed(&[&id]), &HashMap::new(), 1_000 + T.agent_start_ms, &T);
        assert_eq!(state(&im, &id), Terminating);
        assert!(ch.iter().any(|c| matches!(c, Change::Transition { to: AgentStartFailed, .. })));
    }

    #[test]
    fn a_stuck_terminate_is_retried() {
        let mut im = manager();
        let id = one_queued(&mut im);
        im.begin_launch(&id, 0).ok();
        im.observe(&listed(&[&id]), &seen(&id, ALIVE), 0, &T);
        im.request_terminate(&id, 1_000, "scale in").ok();
        im.observe(&listed(&[&id]), &HashMap::new(), 1_000 + T.terminate_ms, &T);
        assert_eq!(state(&im, &id), TerminationFailed);
        let ch = im.observe(&listed(&[&id]), &HashMap::new(), 1_000 + T.terminate_ms + 1, &T);
        assert_eq!(state(&im, &id), Terminating, "retried: {ch:?}");
        im.terminate_failed(&id, 70_000, "api down").ok();
        assert_eq!(state(&im, &id), TerminationFailed);
        im.observe(&[], &HashMap::new(), 80_000, &T);
        assert_eq!(state(&im, &id), Terminated);
    }

    #[test]
    fn cancelling_a_queued_record_terminates_it() {
        let mut im = manager();
        let id = one_queued(&mut im);
        im.request_terminate(&id, 1, "no longer needed").ok();
        assert_eq!(state(&im, &id), Terminated);
    }

    #[test]
    fn unknown_listed_instances_are_adopted_or_reported() {
        let mut im = manager();
        let cloud = vec![
            CloudInstance { id: "pool-gpu-0000beef".into(), node_type: "gpu".into() },
            CloudInstance { id: "someone-elses".into(), node_type: "tpu".into() },
        ];
        let ch = im.observe(&cloud, &HashMap::new(), 5, &T);
        assert_eq!(state(&im, "pool-gpu-0000beef"), AgentStarting);
        assert!(im.get("someone-elses").is_none());
        assert!(ch.contains(&Change::Adopted { id: "pool-gpu-0000beef".into(), node_type: "gpu".into() }));
        assert!(ch.contains(&Change::UnknownType { id: "someone-elses".into(), node_type: "tpu".into() }));
        assert_eq!(im.live_of_type("gpu").count(), 1);
    }

    #[test]
    fn launches_are_limited_globally_and_by_upscaling_speed() {
        let mut im = manager();
        im.queue("cpu", 20, 0, "demand");
        // Nothing running: the initial five.
        assert_eq!(im.to_launch(10, 1.0, 0).len(), UPSCALING_INITIAL_NODES);
        assert_eq!(im.to_launch(2, 1.0, 0).len(), 2, "the global limit");
        // Eight running: speed 1.0 allows eight pending, 0.5 the floor of five, 10 eighty
        // (capped by the global limit).
        for id in im.queue("cpu", 8, 0, "t") {
            if let Some(i) = im.map.get_mut(&id) {
                i.state = Running;
            }
        }
        assert_eq!(im.to_launch(100, 1.0, 0).len(), 8);
        assert_eq!(im.to_launch(100, 0.5, 0).len(), 5);
        assert_eq!(im.to_launch(10, 10.0, 0).len(), 10);
        // In-flight ones count against both limits.
        let picked = im.to_launch(100, 1.0, 0);
        for id in &picked[..3] {
            im.begin_launch(id, 1).ok();
        }
        assert_eq!(im.to_launch(100, 1.0, 2).len(), 5, "8 allowed pending, 3 in flight");
        assert_eq!(im.to_launch(4, 10.0, 2).len(), 1, "4 concurrent, 3 in flight");
        // A nonsense speed is zero: the floor, never a stall.
        assert_eq!(im.to_launch(100, f64::NAN, 2).len(), 2);
    }

    #[test]
    fn launches_go_oldest_first() {
        let mut im = manager();
        let mut ids = Vec::new();
        for t in (0..6).rev() {
            ids.push((t, im.queue("gpu", 1, t * 10, "t").remove(0)));
        }
        let picked = im.to_launch(100, 1.0, 100);
        assert_eq!(picked.len(), 5);
        let newest = ids.iter().find(|(t, _)| *t == 5).map(|(_, id)| id.clone()).unwrap_or_default();
        assert!(!picked.contains(&newest));
    }

    #[test]
    fn counts_by_type_and_state() {
        let mut im = manager();
        let ids = im.queue("cpu", 2, 0, "t");
        im.queue("gpu", 1, 0, "t");
        im.begin_launch(&ids[0], 1).ok();
        let c = im.by_type_state();
        assert_eq!(c.get(&("cpu".to_string(), Queued)), Some(&1));
        assert_eq!(c.get(&("cpu".to_string(), Requested)), Some(&1));
        assert_eq!(c.get(&("gpu".to_string(), Queued)), Some(&1));
    }

    fn arb_node() -> impl Strategy<Value = Option<NodeSeen>> {
        proptest::option::of((any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(alive, dead, draining, allocated_nothing)| NodeSeen { alive, dead, draining, allocated_nothing },
        ))
    }

    #[derive(Debug, Clone)]
    enum Op {
        Queue(usize),
        Launch(usize),
        Drain(usize),
        Terminate(usize),
        Observe { listed_mask: u16, extra: u8, nodes: Vec<Option<NodeSeen>>, advance: u64 },
    }

    fn arb_op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (1usize..3).prop_map(Op::Queue),
            (0usize..16).prop_map(Op::Launch),
            (0usize..16).prop_map(Op::Drain),
            (0usize..16).prop_map(Op::Terminate),
            (any::<u16>(), 0u8..4, proptest::collection::vec(arb_node(), 16), 0u64..200_000)
                .prop_map(|(listed_mask, extra, nodes, advance)| Op::Observe { listed_mask, extra, nodes, advance }),
        ]
    }

    proptest! {
        #[test]
        fn observe_stays_within_the_table(ops in proptest::collection::vec(arb_op(), 1..60)) {
            let mut im = manager();
            let mut now = 0u64;
            for op in ops {
                let ids: Vec<String> = im.map.keys().cloned().collect();
                let pick = |i: usize| ids.get(i % ids.len().max(1)).cloned().unwrap_or_default();
                let before: BTreeMap<String, InstanceState> = im.map.iter().map(|(k, v)| (k.clone(), v.state)).collect();
                let mut cur = before.clone();
                let changes = match op {
                    Op::Queue(n) => {
                        cur.extend(im.queue("cpu", n, now, "prop").into_iter().map(|id| (id, Queued)));
                        Vec::new()
                    }
                    Op::Launch(i) => im.begin_launch(&pick(i), now).into_iter().collect(),
                    Op::Drain(i) => im.request_drain(&pick(i), now, "prop").into_iter().collect(),
                    Op::Terminate(i) => im.request_terminate(&pick(i), now, "prop").into_iter().collect(),
                    Op::Observe { listed_mask, extra, nodes, advance } => {
                        now += advance;
                        let mut cloud: Vec<CloudInstance> = ids
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| listed_mask & (1 << (i % 16)) != 0)
                            .map(|(_, id)| CloudInstance { id: id.clone(), node_type: "cpu".into() })
                            .collect();
                        // Strangers, some of them listed twice.
                        for e in 0..extra {
                            let c = CloudInstance { id: format!("stray-{e}"), node_type: ["cpu", "tpu"][e as usize % 2].into() };
                            cloud.push(c.clone());
                            cloud.push(c);
                        }
                        let seen: HashMap<String, NodeSeen> = ids
                            .iter()
                            .zip(nodes)
                            .filter_map(|(id, n)| n.map(|n| (id.clone(), n)))
                            .collect();
                        im.observe(&cloud, &seen, now, &T)
                    }
                };
                // Every change is a legal transition, chained from the state before.
                for c in &changes {
                    match c {
                        Change::Transition { id, from, to, .. } => {
                            prop_assert!(allowed(*from, *to), "{from} → {to}");
                            prop_assert_eq!(cur.get(id), Some(from));
                            cur.insert(id.clone(), *to);
                        }
                        Change::Adopted { id, .. } => {
                            prop_assert!(!cur.contains_key(id), "adopted twice: {}", id);
                            cur.insert(id.clone(), Allocated);
                        }
                        Change::UnknownType { id, .. } => prop_assert!(!im.map.contains_key(id)),
                        Change::Leaked { id, .. } => prop_assert!(before.get(id).is_some_and(|s| s.is_terminal())),
                    }
                }
                let after: BTreeMap<String, InstanceState> = im.map.iter().map(|(k, v)| (k.clone(), v.state)).collect();
                prop_assert_eq!(&cur, &after, "the changes describe every move");
                // One record per id, and it is keyed by its own id.
                for (k, v) in &im.map {
                    prop_assert_eq!(k, &v.id);
                }
                // Records never disappear except by prune.
                for id in before.keys() {
                    prop_assert!(after.contains_key(id));
                }
            }
        }
    }
}
