//! Sessions and per-node liveness. A heartbeat touches only its own node's atomics and
//! (rarely writing it) its domain's clock; registration, drain and removal are the only
//! writers of the session table.
//!
//! Sessions live inline in a slab (see `slab`): the session id names its slot, so a
//! heartbeat finds its session without hashing, and the node-id index holds one `u32`
//! per node. Readers (ingest, the applier) share one read lock; a registration takes
//! the write lock for the few instructions that place it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use arc_swap::ArcSwap;
use dashmap::DashMap;
use flotilla_core::{
    ErrorKind, HealthSample, Labels, LockExt, NodeId, NodeStatus, PROTOCOL_VERSION, Resources, RwLockExt, ServiceError,
    shard_for_domain,
};
use flotilla_proto::seal::{SessionKey, derive_session_key};
use flotilla_proto::{convert, v1};
use tokio::sync::mpsc::UnboundedSender;

use crate::ledger::Claim;
use crate::slab::{Slab, SlotIndex, session_id_for, slot_of};
use crate::wire::{self, InvalidRequest};

/// One registered node (one session), stored inline in the registry's slab. Immutable
/// identity, atomic liveness.
pub struct NodeLive {
    pub session_id: u64,
    pub node_id: NodeId,
    pub incarnation: u64,
    pub key: SessionKey,
    /// The control connection the session was opened over (0: none), which alone may
    /// drain it, report for it and receive its pushes.
    pub owner: u32,
    pub last_seen_ms: AtomicU64,
    /// When any node of this node's failure domain was last heard from (ms), shared by
    /// the domain's sessions: a node due to be Dead in a domain that has gone quiet
    /// waits for its peers to show a partition (`DomainSilence::peers_may_follow`).
    pub domain_heard_ms: Arc<AtomicU64>,
    pub last_seq: AtomicU64,
    /// The status in the low byte and the time it was entered (ms) above it: one word,
    /// so a transition moves both at once, in 8 bytes of the session rather than 16.
    status: AtomicU64,
    /// Published health score (thousandths); changes only outside the hysteresis band.
    pub health_millis: AtomicU16,
    /// Heartbeats lost lately (`liveness::record_loss`): a lossy link earns the node
    /// longer silence before it is Suspect. Fits in what was padding.
    pub loss: AtomicU16,
}

impl NodeLive {
    fn pack_status(status: NodeStatus, since_ms: u64) -> u64 {
        (since_ms << 8) | u64::from(status.to_u8())
    }

    /// The status and since when (ms) the node has had it, read together.
    pub fn status_since(&self) -> (NodeStatus, u64) {
        let word = self.status.load(Ordering::Acquire);
        (NodeStatus::from_u8(word as u8).unwrap_or(NodeStatus::Unknown), word >> 8)
    }

    pub fn status(&self) -> NodeStatus {
        self.status_since().0
    }

    /// Moves `from` -> `to` if the node is still in `from`; true when it did.
    pub fn transition(&self, from: NodeStatus, to: NodeStatus, now_ms: u64) -> bool {
        self.status
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                (word as u8 == from.to_u8()).then(|| Self::pack_status(to, now_ms))
            })
            .is_ok()
    }

    /// A heartbeat arrived at `now_ms`. The domain's clock is written only when it
    /// moves (at most once a millisecond), so a domain's nodes share a cache line that
    /// is mostly read; `fetch_max`, so two threads never move it back.
    pub fn heard(&self, now_ms: u64) {
        self.last_seen_ms.store(now_ms, Ordering::Release);
        if self.domain_heard_ms.load(Ordering::Relaxed) < now_ms {
            self.domain_heard_ms.fetch_max(now_ms, Ordering::Relaxed);
        }
    }

    /// The handle change notices carry.
    pub fn session(&self) -> SessionRef {
        SessionRef { session_id: self.session_id, node_id: self.node_id.clone() }
    }
}

/// Names one session of one node in change notices; the applier reads the session's
/// current state from the registry (a session replaced meanwhile is skipped).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRef {
    pub session_id: u64,
    pub node_id: NodeId,
}

/// What a registration hands back: the session's identity and key.
#[derive(Debug, Clone)]
pub struct Registered {
    pub session_id: u64,
    pub node_id: NodeId,
    pub incarnation: u64,
    pub key: SessionKey,
}

/// What the applier is told; it reads the node's current state itself, so the order
/// in which two threads report the same node does not matter.
pub enum Change {
    /// A new session: start watching its deadlines and publish it. What a node
    /// declared at registration lives only in its view record, not in the session.
    Registered(SessionRef, Descriptor),
    /// Something about this node changed (status, health): republish it.
    Dirty(SessionRef),
    /// Its published health moved; the sample that moved it.
    Health(SessionRef, HealthSample),
    /// This session was forgotten (Dead past retention) and no other took the node.
    Removed(SessionRef),
    /// The node's agent reported new workload states.
    Workloads(NodeId),
    /// The ledger changed these nodes' allocations: fold them into the next version,
    /// push their assignment sets, and tell `ack` which version shows them.
    Ledger(Vec<NodeId>, Option<tokio::sync::oneshot::Sender<flotilla_view::Version>>),
}

/// What a node declares when it registers.
pub struct Descriptor {
    pub labels: Arc<Labels>,
    pub capacity: Arc<Resources>,
    pub health: HealthSample,
    /// What the agent runs (validated), for a ledger that holds nothing for the node
    /// (a restarted shard), and the version of that set.
    pub running: Vec<Claim>,
    pub running_version: u64,
}

/// Why a registration was refused. `closes_connection` errors end the QUIC connection
/// with the reason, as a wrong credential must.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegisterError {
    #[error("protocol version {0} is not supported (this shard speaks {PROTOCOL_VERSION})")]
    ProtocolVersion(u32),
    #[error("join token is not valid")]
    JoinToken,
    #[error("node id: {0}")]
    NodeId(String),
    #[error("{0}")]
    Invalid(String),
    #[error("domain {domain:?} belongs to shard {owner}, not to shard {this}")]
    WrongShard { domain: String, owner: usize, this: usize },
    #[error("incarnation {0} is older than the registered incarnation {1}")]
    StaleIncarnation(u64, u64),
}

impl RegisterError {
    pub fn closes_connection(&self) -> bool {
        matches!(self, RegisterError::ProtocolVersion(_) | RegisterError::JoinToken)
    }
}

impl ServiceError for RegisterError {
    fn kind(&self) -> ErrorKind {
        match self {
            RegisterError::ProtocolVersion(_) | RegisterError::NodeId(_) | RegisterError::Invalid(_) => {
                ErrorKind::InvalidInput
            }
            RegisterError::JoinToken => ErrorKind::Unauthenticated,
            RegisterError::WrongShard { .. } | RegisterError::StaleIncarnation(..) => ErrorKind::Conflict,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            RegisterError::ProtocolVersion(_) => "protocol_version",
            RegisterError::JoinToken => "join_token",
            RegisterError::NodeId(_) => "node_id",
            RegisterError::Invalid(_) => "invalid",
            RegisterError::WrongShard { .. } => "wrong_shard",
            RegisterError::StaleIncarnation(..) => "stale_incarnation",
        }
    }
}

/// Why a workload report was refused. Every refusal has the one code `workloads`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    #[error("unknown session")]
    UnknownSession,
    #[error("a session reports only for its own node")]
    OtherNode,
    /// The session was not registered over the connection that reports for it (the
    /// QUIC layer checks this before the registry sees the report).
    #[error("this connection holds no session for that node")]
    NotOwner,
    #[error(transparent)]
    Invalid(#[from] InvalidRequest),
}

impl ServiceError for ReportError {
    fn kind(&self) -> ErrorKind {
        match self {
            ReportError::UnknownSession => ErrorKind::NotFound,
            ReportError::OtherNode | ReportError::NotOwner => ErrorKind::Unauthenticated,
            ReportError::Invalid(e) => e.kind(),
        }
    }

    fn code(&self) -> &'static str {
        "workloads"
    }
}

/// The session table: sessions in a slab, and the node-id index of their slots.
#[derive(Default)]
struct Sessions {
    slab: Slab<NodeLive>,
    by_node: SlotIndex,
}

fn node_key(live: &NodeLive) -> &str {
    live.node_id.as_str()
}

impl Sessions {
    fn get(&self, session_id: u64) -> Option<&NodeLive> {
        self.slab.get(slot_of(session_id)).filter(|l| l.session_id == session_id)
    }

    fn node(&self, id: &str) -> Option<&NodeLive> {
        self.by_node.find(&self.slab, id, node_key).and_then(|s| self.slab.get(s))
    }
}

/// [`Registry::read_sessions`]: sessions by id, and a prefetch of the ones a batch names.
pub struct SessionsRead<'a>(std::sync::RwLockReadGuard<'a, Sessions>);

impl SessionsRead<'_> {
    pub fn get(&self, session_id: u64) -> Option<&NodeLive> {
        self.0.get(session_id)
    }

    pub fn prefetch(&self, session_id: u64) {
        self.0.slab.prefetch(slot_of(session_id));
    }

    /// Prefetches the node id of `session_id`'s session (a line of its own, compared
    /// with each heartbeat's): reads the slot, so only once that is likely in cache.
    pub fn prefetch_node_id(&self, session_id: u64) {
        if let Some(live) = self.get(session_id) {
            flotilla_core::prefetch(live.node_id.location(), 64);
        }
    }
}

pub struct Registry {
    pub shard: usize,
    pub shards: usize,
    master: Vec<u8>,
    /// Every token a registration may carry (newest first while an old one is retired);
    /// replaced at run time by [`Registry::set_join_tokens`].
    join_tokens: ArcSwap<Vec<String>>,
    sessions: RwLock<Sessions>,
    /// Most nodes of a pool share their label set and their capacity: keep one copy of each.
    label_sets: DashMap<Labels, Arc<Labels>>,
    capacities: DashMap<Resources, Arc<Resources>>,
    /// What each node's agent last reported about the members it runs.
    workloads: DashMap<NodeId, Arc<Vec<v1::WorkloadStatus>>>,
    /// The one empty report every node that reported nothing shares.
    no_workloads: Arc<Vec<v1::WorkloadStatus>>,
    /// Nodes an operator cordoned (by name: a restarted node stays cordoned), and
    /// whether a drain was asked for too.
    cordoned: DashMap<NodeId, bool>,
    /// Each domain's clock (`NodeLive::domain_heard_ms`), held by its sessions.
    domain_clocks: Mutex<HashMap<String, Weak<AtomicU64>>>,
    changes: UnboundedSender<Change>,
}

/// Distinct label sets (and capacities) kept for sharing; past this, new ones are simply
/// not shared.
const MAX_INTERNED_LABEL_SETS: usize = 65_536;

/// The shared copy of `value` (registered in `sets` unless it holds too many already).
fn intern<T: std::hash::Hash + Eq + Clone>(sets: &DashMap<T, Arc<T>>, value: T) -> Arc<T> {
    if let Some(shared) = sets.get(&value) {
        return shared.value().clone();
    }
    let shared = Arc::new(value);
    if sets.len() < MAX_INTERNED_LABEL_SETS {
        sets.insert((*shared).clone(), shared.clone());
    }
    shared
}

impl Registry {
    pub fn new(
        shard: usize,
        shards: usize,
        master: Vec<u8>,
        join_tokens: Vec<String>,
        changes: UnboundedSender<Change>,
    ) -> Self {
        Registry {
            shard,
            shards,
            master,
            join_tokens: ArcSwap::from_pointee(join_tokens),
            sessions: RwLock::new(Sessions::default()),
            label_sets: DashMap::new(),
            capacities: DashMap::new(),
            workloads: DashMap::new(),
            no_workloads: Arc::new(Vec::new()),
            cordoned: DashMap::new(),
            domain_clocks: Mutex::default(),
            changes,
        }
    }

    /// The clock the sessions of `domain` share, started at `now_ms` if none holds it.
    fn domain_clock(&self, domain: &str, now_ms: u64) -> Arc<AtomicU64> {
        let mut clocks = self.domain_clocks.lock_or_recover();
        if let Some(clock) = clocks.get(domain).and_then(Weak::upgrade) {
            return clock;
        }
        // A domain new here, or whose sessions have all gone: forget every such domain.
        clocks.retain(|_, c| c.strong_count() > 0);
        let clock = Arc::new(AtomicU64::new(now_ms));
        clocks.insert(domain.to_string(), Arc::downgrade(&clock));
        clock
    }

    pub fn emit(&self, c: Change) {
        // The applier outlives the registry except during shutdown, when nothing matters.
        let _ = self.changes.send(c);
    }

    /// Replaces the accepted join tokens. Registrations from now on need one of these;
    /// sessions opened with a removed token stay.
    pub fn set_join_tokens(&self, tokens: Vec<String>) {
        self.join_tokens.store(Arc::new(tokens));
    }

    pub fn join_tokens(&self) -> Arc<Vec<String>> {
        self.join_tokens.load_full()
    }

    pub fn master(&self) -> &[u8] {
        &self.master
    }

    /// Runs `f` on the session `session_id` names, if it is still held. `f` runs under
    /// the table's read lock: it must not call back into the registry's writers.
    pub fn with_session<R>(&self, session_id: u64, f: impl FnOnce(&NodeLive) -> R) -> Option<R> {
        self.sessions.read_or_recover().get(session_id).map(f)
    }

    /// The sessions, read-locked once for a batch of heartbeats; the same rule as
    /// [`Registry::with_session`]: no call back into the registry's writers while held.
    pub fn read_sessions(&self) -> SessionsRead<'_> {
        SessionsRead(self.sessions.read_or_recover())
    }

    /// Runs `f` on the node's current session, if it has one (same rule as
    /// [`Registry::with_session`]).
    pub fn with_node<R>(&self, id: &NodeId, f: impl FnOnce(&NodeLive) -> R) -> Option<R> {
        self.sessions.read_or_recover().node(id.as_str()).map(f)
    }

    /// The node's current session.
    pub fn node(&self, id: &NodeId) -> Option<SessionRef> {
        self.with_node(id, NodeLive::session)
    }

    /// True while `session_id` is still a session this shard holds (each node has at
    /// most one: a newer one replaces it).
    pub fn is_current(&self, session_id: u64) -> bool {
        self.sessions.read_or_recover().get(session_id).is_some()
    }

    /// The control connection `session_id` was opened over, if the session is held.
    pub fn owner(&self, session_id: u64) -> Option<u32> {
        self.with_session(session_id, |l| l.owner)
    }

    /// Validates a registration and opens a session for it (owned by no connection).
    pub fn register(&self, req: v1::RegisterRequest, now_ms: u64) -> Result<Registered, RegisterError> {
        self.register_over(req, now_ms, 0)
    }

    /// Validates a registration and opens a session for it, owned by the control
    /// connection `owner`. A newer incarnation replaces the node; the same incarnation
    /// (the agent lost its connection or the shard restarted) gets a fresh session for
    /// the same node.
    pub fn register_over(
        &self,
        req: v1::RegisterRequest,
        now_ms: u64,
        owner: u32,
    ) -> Result<Registered, RegisterError> {
        if req.protocol_version != PROTOCOL_VERSION {
            return Err(RegisterError::ProtocolVersion(req.protocol_version));
        }
        if !self
            .join_tokens
            .load()
            .iter()
            .any(|t| flotilla_core::constant_time_eq(t.as_bytes(), req.join_token.as_bytes()))
        {
            return Err(RegisterError::JoinToken);
        }
        let node_id = NodeId::new(&req.node_id).map_err(|e| RegisterError::NodeId(e.to_string()))?;
        let labels = convert::labels(req.labels).map_err(|e| RegisterError::Invalid(e.to_string()))?;
        let capacity = convert::node_capacity(req.capacity).map_err(|e| RegisterError::Invalid(e.to_string()))?;
        let health = convert::health(req.health).map_err(|e| RegisterError::Invalid(e.to_string()))?;
        let running = wire::running_from_wire(&node_id, req.incarnation, req.assignments)
            .map_err(|e| RegisterError::Invalid(format!("assignments: {e}")))?;
        let owner_shard = shard_for_domain(labels.domain(), self.shards);
        if owner_shard != self.shard {
            return Err(RegisterError::WrongShard {
                domain: labels.domain().to_string(),
                owner: owner_shard,
                this: self.shard,
            });
        }
        let health_millis = flotilla_core::Hysteresis::to_millis(flotilla_core::health_score(&health));
        let domain_heard_ms = self.domain_clock(labels.domain(), now_ms);
        let random: u64 = rand::random();
        let registered = {
            let mut guard = self.sessions.write_or_recover();
            let sessions = &mut *guard;
            let existing = sessions.by_node.find(&sessions.slab, node_id.as_str(), node_key);
            if let Some(old) = existing.and_then(|s| sessions.slab.get(s))
                && old.incarnation > req.incarnation
            {
                return Err(RegisterError::StaleIncarnation(req.incarnation, old.incarnation));
            }
            let live = |session_id: u64| NodeLive {
                session_id,
                key: derive_session_key(&self.master, session_id, req.incarnation, node_id.as_str()),
                node_id: node_id.clone(),
                incarnation: req.incarnation,
                owner,
                last_seen_ms: AtomicU64::new(now_ms),
                domain_heard_ms: domain_heard_ms.clone(),
                last_seq: AtomicU64::new(0),
                status: AtomicU64::new(NodeLive::pack_status(NodeStatus::Alive, now_ms)),
                health_millis: AtomicU16::new(health_millis),
                loss: AtomicU16::new(0),
            };
            let slot = match existing {
                // The node keeps its slot; the old session id stops matching it.
                Some(slot) => {
                    let mut session_id = session_id_for(slot, random);
                    if sessions.slab.get(slot).is_some_and(|o| o.session_id == session_id) {
                        session_id ^= 1 << crate::slab::SLOT_BITS;
                    }
                    if let Some(cell) = sessions.slab.get_mut(slot) {
                        *cell = live(session_id);
                    }
                    slot
                }
                None => {
                    let slot = sessions.slab.vacant_slot().ok_or_else(|| {
                        RegisterError::Invalid(format!(
                            "this shard holds its limit of {} nodes",
                            crate::slab::MAX_SLOTS
                        ))
                    })?;
                    let placed = sessions.slab.insert(live(session_id_for(slot, random)));
                    debug_assert_eq!(placed, Some(slot), "the vacant slot is the one filled");
                    sessions.by_node.insert(&sessions.slab, slot, node_id.as_str(), node_key);
                    slot
                }
            };
            if req.cordoned && existing.is_none() {
                self.cordoned.entry(node_id.clone()).or_insert(false);
            }
            let l = sessions.slab.get(slot).ok_or_else(|| RegisterError::Invalid("session table".into()))?;
            Registered { session_id: l.session_id, node_id: l.node_id.clone(), incarnation: l.incarnation, key: l.key }
        };
        let running_version = req.assignment_version;
        self.emit(Change::Registered(
            SessionRef { session_id: registered.session_id, node_id: registered.node_id.clone() },
            Descriptor {
                labels: intern(&self.label_sets, labels),
                capacity: intern(&self.capacities, capacity),
                health,
                running,
                running_version,
            },
        ));
        Ok(registered)
    }

    /// Marks the node of `session_id` Draining. The caller has checked that the
    /// request came over the connection that owns the session.
    pub fn drain(&self, session_id: u64, node_id: &str, now_ms: u64) -> Option<NodeStatus> {
        let (changed, status) = self.with_session(session_id, |live| {
            if live.node_id.as_str() != node_id {
                return None;
            }
            let changed = [NodeStatus::Alive, NodeStatus::Suspect, NodeStatus::Unknown]
                .into_iter()
                .find(|&from| live.transition(from, NodeStatus::Draining, now_ms))
                .map(|_| live.session());
            Some((changed, live.status()))
        })??;
        if let Some(s) = changed {
            self.emit(Change::Dirty(s));
        }
        Some(status)
    }

    /// Most members one report may carry.
    pub const MAX_REPORTED_WORKLOADS: usize = wire::MAX_REPORTED_WORKLOADS;

    /// Takes an agent's workload report (the caller checked the session is the
    /// connection's own). Oversized or malformed reports are refused whole.
    pub fn report_workloads(
        &self,
        session_id: u64,
        node_id: &str,
        list: Vec<v1::WorkloadStatus>,
    ) -> Result<(), ReportError> {
        let node = self.with_session(session_id, |l| l.node_id.clone()).ok_or(ReportError::UnknownSession)?;
        if node.as_str() != node_id {
            return Err(ReportError::OtherNode);
        }
        let list = wire::workload_report_from_wire(list)?;
        self.workloads.insert(node.clone(), Arc::new(list));
        self.emit(Change::Workloads(node));
        Ok(())
    }

    /// Cordons (and with `drain`, drains) or uncordons a node this shard holds; false
    /// if it holds no such node.
    pub fn set_cordon(&self, node: &NodeId, cordoned: bool, drain: bool) -> bool {
        let Some(live) = self.node(node) else { return false };
        if cordoned {
            self.cordoned.insert(node.clone(), drain);
        } else {
            self.cordoned.remove(node);
        }
        self.emit(Change::Dirty(live));
        true
    }

    /// Every cordoned node and whether a drain was asked for (the persisted state).
    pub fn cordons(&self) -> Vec<(NodeId, bool)> {
        self.cordoned.iter().map(|e| (e.key().clone(), *e.value())).collect()
    }

    /// A cordon from the persisted state, before the node registers again (cordons are
    /// by name, so it holds for the node's next session).
    pub fn restore_cordon(&self, node: NodeId, drain: bool) {
        self.cordoned.insert(node, drain);
    }

    /// `None`: not cordoned; `Some(drain)`: cordoned, and whether a drain was asked for.
    pub fn cordon(&self, node: &NodeId) -> Option<bool> {
        self.cordoned.get(node).map(|e| *e.value())
    }

    pub fn workloads(&self, node: &NodeId) -> Arc<Vec<v1::WorkloadStatus>> {
        self.workloads.get(node).map(|e| e.value().clone()).unwrap_or_else(|| self.no_workloads.clone())
    }

    /// Forgets a session, and its node when the session is still the node's current
    /// one (a session id names one session only, so that is whenever it is held).
    pub fn remove(&self, session_id: u64) {
        let removed = {
            let mut guard = self.sessions.write_or_recover();
            let sessions = &mut *guard;
            let slot = slot_of(session_id);
            match sessions.slab.get(slot) {
                Some(l) if l.session_id == session_id => {
                    sessions.by_node.remove(l.node_id.as_str(), slot);
                    sessions.slab.remove(slot).map(|l| l.session())
                }
                _ => None,
            }
        };
        if let Some(s) = removed {
            self.workloads.remove(&s.node_id);
            self.emit(Change::Removed(s));
        }
    }

    pub fn len(&self) -> usize {
        self.sessions.read_or_recover().slab.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
pub(crate) mod tests;
