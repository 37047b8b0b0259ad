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

use crate::catalogue as m;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::pack::Cause;
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

/// Where an instance stands in its type's warm pool (`crate::warm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Warm {
    /// Held for demand: cordoned, idle on purpose.
    Held,
    /// Taken for demand: uncordoned until the view shows it so, then an ordinary node.
    Claimed,
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
    /// Why a drain was asked for, while DRAIN_REQUESTED: a node asked to go for being
    /// idle that took work since stays; one asked to go for a limit or a policy does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_cause: Option<Cause>,
    /// Launched for the type's warm pool (`crate::warm`), until it is taken for demand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warm: Option<Warm>,
    /// Since when the pool empties it (`crate::consolidate`): cordoned, its members
    /// moving off. Kept in the record so a restarted pool finishes or gives it up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consolidating_since_ms: Option<u64>,
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
            drain_cause: None,
            warm: None,
            consolidating_since_ms: None,
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
        if to != DrainRequested {
            self.drain_cause = None;
        }
        if to != Running {
            self.consolidating_since_ms = None;
        }
        if self.history.len() >= HISTORY_LEN {
            let excess = self.history.len() + 1 - HISTORY_LEN;
            self.history.drain(..excess);
        }
        self.history.push((to, now_ms));
        if to == Allocated && self.allocated_at_ms.is_none() {
            self.allocated_at_ms = Some(now_ms);
        }
        metrics::counter!(m::INSTANCE_TRANSITIONS.name, "from" => from.as_str(), "to" => to.as_str()).increment(1);
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

    /// Marks instance `id`'s place in its type's warm pool (`crate::warm`).
    pub fn set_warm(&mut self, id: &str, warm: Option<Warm>) {
        if let Some(i) = self.map.get_mut(id) {
            i.warm = warm;
        }
    }

    pub fn set_consolidating(&mut self, id: &str, since_ms: Option<u64>) {
        if let Some(i) = self.map.get_mut(id) {
            i.consolidating_since_ms = since_ms;
        }
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
        self.queue_as(node_type, n, now_ms, reason, None)
    }

    /// [`Instances::queue`], the records marked `warm` (a warm pool's instances).
    pub fn queue_as(
        &mut self,
        node_type: &str,
        n: usize,
        now_ms: u64,
        reason: &str,
        warm: Option<Warm>,
    ) -> Vec<String> {
        let mut ids = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.next_id(node_type);
            let mut rec = Instance::new(id.clone(), node_type.to_string(), Queued, now_ms, reason.to_string());
            rec.warm = warm;
            self.map.insert(id.clone(), rec);
            ids.push(id);
        }
        ids
    }

    /// Gives up the QUEUED records of `node_type` (QUEUED → TERMINATED): its type cannot
    /// be had now, and the demand they were for is packed again onto other types.
    pub fn cancel_queued(&mut self, node_type: &str, now_ms: u64, reason: &str) -> Vec<Change> {
        let ids: Vec<String> =
            self.map.values().filter(|i| i.node_type == node_type && i.state == Queued).map(|i| i.id.clone()).collect();
        ids.iter().filter_map(|id| self.move_to(id, Terminated, now_ms, reason).ok()).collect()
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

    /// The REQUESTED record could not be saved, so the provider was not called: QUEUED
    /// again, the attempt not counted (the store failed, not the provider).
    pub fn launch_not_started(&mut self, id: &str, now_ms: u64, why: &str) -> Result<Change, TransitionError> {
        let change = self.move_to(id, Queued, now_ms, &format!("not launched: {why}"))?;
        if let Some(i) = self.map.get_mut(id) {
            i.launch_attempts = i.launch_attempts.saturating_sub(1);
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
    pub fn request_drain(
        &mut self,
        id: &str,
        now_ms: u64,
        cause: Cause,
        detail: &str,
    ) -> Result<Change, TransitionError> {
        let change = self.move_to(id, DrainRequested, now_ms, &format!("{}: {detail}", cause.as_str()))?;
        if let Some(i) = self.map.get_mut(id) {
            i.drain_cause = Some(cause);
        }
        Ok(change)
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
mod tests;
