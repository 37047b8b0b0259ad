//! The one writer of the shard's view. It gathers change notices for up to one batch
//! window, then publishes a single new version; it also owns the timing wheel that
//! turns silence into Suspect, Dead and, after retention, removal.

use crate::catalogue as m;
use flotilla_core::LockExt;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_core::{NodeId, NodeStatus, PackedHealth};
use flotilla_view::{NodeRecord, ViewPublisher};
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;

use crate::ledger::{Claim, Ledger};
use crate::liveness::{Timeouts, Verdict, Wheel, cut_off, evaluate, is_silent, loss_grace_ms, wait_for_peers};
use crate::registry::{Change, Registry, SessionRef};
use crate::silence::DomainSilence;

/// Wheel granularity: deadlines fire within this much of their time.
pub const WHEEL_SLOT_MS: u64 = 100;

/// A node whose assignment set changed: the QUIC pusher sends it the current set.
pub struct Push {
    pub node: NodeId,
}

pub struct Applier {
    registry: Arc<Registry>,
    ledger: Arc<Mutex<Ledger>>,
    pushes: tokio::sync::mpsc::UnboundedSender<Push>,
    ledger_dirty: HashSet<NodeId>,
    acks: Vec<tokio::sync::oneshot::Sender<flotilla_view::Version>>,
    publisher: Arc<ViewPublisher>,
    timeouts: Timeouts,
    batch_window: Duration,
    wheel: Wheel,
    /// Nodes to republish (from their current session, whichever spoke).
    dirty: HashSet<NodeId>,
    samples: HashMap<NodeId, PackedHealth>,
    /// Descriptors of nodes registered since the last flush.
    fresh: HashMap<NodeId, (Arc<flotilla_core::Labels>, Arc<flotilla_core::Resources>)>,
    /// The allocation every idle node's record shares.
    nothing_allocated: Arc<flotilla_core::Resources>,
    /// What newly registered agents run, for the ledger to adopt (see `Ledger::adopt`).
    adopt: HashMap<NodeId, (Vec<Claim>, u64)>,
    /// The assignment version each newly registered agent holds.
    registered: HashMap<NodeId, u64>,
    removed: Vec<SessionRef>,
    counts: [i64; 5],
    /// Whether a silent node's domain is mostly silent (then it goes Unknown, not Dead).
    silence: DomainSilence,
    metrics: Metrics,
}

struct Metrics {
    version: metrics::Gauge,
    delta_nodes: metrics::Histogram,
    apply_seconds: metrics::Histogram,
    bytes_copied: metrics::Histogram,
    bytes_copied_total: metrics::Counter,
    versions_total: metrics::Counter,
    nodes: Vec<metrics::Gauge>,
    heap: metrics::Gauge,
}

impl Applier {
    pub fn new(
        registry: Arc<Registry>,
        ledger: Arc<Mutex<Ledger>>,
        pushes: tokio::sync::mpsc::UnboundedSender<Push>,
        publisher: Arc<ViewPublisher>,
        timeouts: Timeouts,
        batch_window: Duration,
        partition_threshold: f64,
    ) -> Self {
        let shard = registry.shard.to_string();
        let slots = ((timeouts.dead_after_ms.max(timeouts.retention_ms) / WHEEL_SLOT_MS) as usize + 2).min(4096);
        let metrics = Metrics {
            version: metrics::gauge!(m::VIEW_VERSION.name, "shard" => shard.clone()),
            delta_nodes: metrics::histogram!(m::VIEW_DELTA_NODES.name, "shard" => shard.clone()),
            apply_seconds: metrics::histogram!(m::VIEW_APPLY_SECONDS.name, "shard" => shard.clone()),
            bytes_copied: metrics::histogram!(m::VIEW_BYTES_COPIED_PER_VERSION.name, "shard" => shard.clone()),
            bytes_copied_total: metrics::counter!(m::VIEW_BYTES_COPIED.name, "shard" => shard.clone()),
            versions_total: metrics::counter!(m::VIEW_VERSIONS.name, "shard" => shard.clone()),
            nodes: NodeStatus::ALL
                .iter()
                .map(|s| metrics::gauge!(m::NODES.name, "shard" => shard.clone(), "status" => s.as_str()))
                .collect(),
            heap: metrics::gauge!(m::HEAP_BYTES.name),
        };
        Applier {
            registry,
            ledger,
            pushes,
            ledger_dirty: HashSet::new(),
            acks: Vec::new(),
            publisher,
            timeouts,
            batch_window,
            wheel: Wheel::new(WHEEL_SLOT_MS, slots, flotilla_core::now_ms()),
            dirty: HashSet::new(),
            samples: HashMap::new(),
            fresh: HashMap::new(),
            nothing_allocated: Arc::default(),
            adopt: HashMap::new(),
            registered: HashMap::new(),
            removed: Vec::new(),
            counts: [0; 5],
            silence: DomainSilence::new(partition_threshold),
            metrics,
        }
    }

    fn absorb(&mut self, c: Change) {
        match c {
            Change::Registered(live, d) => {
                self.wheel.schedule(live.session_id, flotilla_core::now_ms() + self.timeouts.suspect_after_ms);
                self.samples.insert(live.node_id.clone(), d.health.into());
                self.registered.insert(live.node_id.clone(), d.running_version);
                if !d.running.is_empty() {
                    self.adopt.insert(live.node_id.clone(), (d.running, d.running_version));
                }
                self.fresh.insert(live.node_id.clone(), (d.labels, d.capacity));
                self.dirty.insert(live.node_id);
            }
            Change::Dirty(live) => {
                self.dirty.insert(live.node_id);
            }
            Change::Health(live, sample) => {
                self.samples.insert(live.node_id.clone(), sample.into());
                self.dirty.insert(live.node_id);
            }
            Change::Removed(live) => self.removed.push(live),
            Change::Workloads(n) => {
                self.dirty.insert(n);
            }
            Change::Ledger(nodes, ack) => {
                for n in nodes {
                    self.dirty.insert(n.clone());
                    self.ledger_dirty.insert(n);
                }
                self.acks.extend(ack);
            }
        }
    }

    /// Fires due deadlines: each due node is evaluated once and rescheduled.
    pub fn tick(&mut self, now: u64) {
        self.metrics.heap.set(flotilla_obs::alloc::live_bytes() as f64);
        let expired = self.ledger.lock_or_recover().expire(now);
        if !expired.is_empty() {
            self.absorb(Change::Ledger(expired, None));
        }
        let mut due = Vec::new();
        self.wheel.expire(now, &mut due);
        let view = self.publisher.load();
        for sid in due {
            let (timeouts, silence) = (&self.timeouts, &self.silence);
            let Some((verdict, from, node)) = self.registry.with_session(sid, |live| {
                let (status, since) = live.status_since();
                let grace = loss_grace_ms(live.loss.load(Ordering::Relaxed));
                let last_seen = live.last_seen_ms.load(Ordering::Acquire);
                let mut verdict = evaluate(status, last_seen, since, now, timeouts, grace);
                if matches!(verdict, Verdict::Keep { .. }) {
                    // Most due nodes were heard since: no need to look them up in the view.
                    return (verdict, status, None);
                }
                let domain = view.get(&live.node_id).map(|r| r.labels.domain());
                if matches!(verdict, Verdict::Transition { to: NodeStatus::Dead, .. })
                    && let Some(d) = domain
                {
                    if silence.partitioned(d) {
                        verdict = cut_off(status, since, now, timeouts);
                    } else if status == NodeStatus::Unknown
                        && let Some(until) = silence.rejoin_until(d, now)
                    {
                        // Its domain was cut off and is heard again: it may be on its way.
                        verdict = Verdict::Keep { check_at: until };
                    } else if silence.peers_may_follow(
                        d,
                        is_silent(status),
                        now.saturating_sub(live.domain_heard_ms.load(Ordering::Relaxed)),
                    ) {
                        // Peers falling silent too may not be Suspect yet (their own
                        // grace, jitter): look again before calling this one Dead.
                        verdict = wait_for_peers(last_seen, grace, now, timeouts).unwrap_or(verdict);
                    }
                }
                let node = match verdict {
                    Verdict::Keep { .. } => None,
                    Verdict::Transition { to, .. } if !live.transition(status, to, now) => None,
                    Verdict::Transition { .. } | Verdict::Remove => {
                        Some((live.node_id.clone(), domain.unwrap_or_default().to_string()))
                    }
                };
                (verdict, status, node)
            }) else {
                continue;
            };
            match verdict {
                Verdict::Keep { check_at } => self.wheel.schedule(sid, check_at),
                Verdict::Transition { to, check_at } => {
                    if let Some((node, domain)) = node {
                        tracing::info!(%node, %from, %to, "node status changed");
                        if to == NodeStatus::Unknown && from != NodeStatus::Unknown {
                            tracing::warn!(%node, %domain, "most of the node's domain is silent: Unknown, not Dead");
                        }
                        if !is_silent(from) && is_silent(to) {
                            self.silence.fell_silent(&domain);
                        }
                        self.dirty.insert(node);
                    }
                    self.wheel.schedule(sid, check_at);
                }
                Verdict::Remove => {
                    tracing::info!(node = ?node.map(|n| n.0.to_string()), "dead node leaves the view");
                    self.registry.remove(sid);
                }
            }
        }
    }

    fn has_work(&self) -> bool {
        !self.dirty.is_empty() || !self.removed.is_empty() || !self.acks.is_empty()
    }

    /// Publishes everything gathered as one version (or nothing, if nothing differs).
    ///
    /// Under the ledger's lock from before it absorbs what is queued in `rx` until it has
    /// published: every ledger decision is either in this version or announced with a
    /// later one (`LedgerGrpc::announce` sends its change under the same lock).
    pub fn flush(&mut self, rx: &mut UnboundedReceiver<Change>) {
        let started = std::time::Instant::now();
        let now = flotilla_core::now_ms();
        let view = self.publisher.load();
        let ledger = self.ledger.clone();
        let mut ledger = ledger.lock_or_recover();
        while let Ok(c) = rx.try_recv() {
            self.absorb(c);
        }
        let mut upserts = Vec::with_capacity(self.dirty.len());
        for id in self.dirty.drain() {
            // A node forgotten since (Dead past retention) is not republished.
            let Some((incarnation, (status, status_since), health_millis)) = self
                .registry
                .with_node(&id, |l| (l.incarnation, l.status_since(), l.health_millis.load(Ordering::Acquire)))
            else {
                continue;
            };
            let prev = view.get(&id);
            let (labels, capacity) = match (self.fresh.remove(&id), prev) {
                (Some(d), _) => d,
                (None, Some(p)) => (p.labels.clone(), p.capacity.clone()),
                (None, None) => continue,
            };
            let sample = self.samples.remove(&id).or_else(|| prev.map(|p| p.health)).unwrap_or_default();
            if prev.is_some_and(|p| p.incarnation.0 != incarnation) {
                // A new incarnation is a new node: nothing the old one held carries over.
                ledger.forget_node(&id);
                self.ledger_dirty.insert(id.clone());
            }
            // A node the ledger knows nothing of (this shard restarted) brings what it runs.
            if let Some((running, version)) = self.adopt.remove(&id)
                && ledger.book(&id).is_none()
            {
                let (adopted, left_out) = ledger.adopt(&id, incarnation, &capacity, running, version);
                tracing::info!(node = %id, adopted, left_out, "ledger rebuilt from what the agent runs");
                metrics::counter!(m::LEDGER_ADOPTED.name, "result" => "adopted").increment(adopted as u64);
                metrics::counter!(m::LEDGER_ADOPTED.name, "result" => "left_out").increment(left_out as u64);
                if left_out > 0 {
                    // Tell the agent to stop what the ledger left out.
                    self.ledger_dirty.insert(id.clone());
                }
            }
            // An agent that registers again (its connection lost, a one-way partition) may
            // have missed pushes meanwhile: it gets the ledger's set if it holds another.
            if let Some(held) = self.registered.remove(&id)
                && ledger.book(&id).is_some_and(|b| b.version != held)
            {
                self.ledger_dirty.insert(id.clone());
            }
            let allocated = match ledger.allocated(&id) {
                a if a == *self.nothing_allocated => self.nothing_allocated.clone(),
                a => Arc::new(a),
            };
            let cordon = self.registry.cordon(&id);
            let workloads = self.registry.workloads(&id);
            let rec = NodeRecord {
                node_id: id,
                incarnation: flotilla_core::Incarnation(incarnation),
                status,
                status_since_unix_ms: status_since,
                shard: self.registry.shard as u32,
                labels,
                health_millis,
                health: sample,
                capacity,
                allocated,
                workloads,
                cordoned: cordon.is_some(),
                drain_requested: cordon == Some(true),
            };
            if prev.is_some_and(|p| **p == rec) {
                continue;
            }
            if let Some(p) = prev {
                self.counts[p.status as usize] -= 1;
            }
            self.counts[rec.status as usize] += 1;
            self.silence.published(
                prev.map(|p| (p.labels.domain(), p.status)),
                Some((rec.labels.domain(), rec.status)),
                now,
            );
            upserts.push(Arc::new(rec));
        }
        self.samples.clear();
        self.fresh.clear();
        self.registered.clear();
        let mut removed = Vec::new();
        for live in self.removed.drain(..) {
            // Gone only if no newer session took the node over.
            if self.registry.node(&live.node_id).is_none()
                && let Some(p) = view.get(&live.node_id)
            {
                self.counts[p.status as usize] -= 1;
                self.silence.published(Some((p.labels.domain(), p.status)), None, now);
                ledger.forget_node(&live.node_id);
                self.ledger_dirty.remove(&live.node_id);
                removed.push(live.node_id.clone());
            }
        }
        self.silence.flushed();
        for node in self.ledger_dirty.drain() {
            let _ = self.pushes.send(Push { node });
        }
        let changes = upserts.len() + removed.len();
        let (delta, bytes) = flotilla_obs::alloc::measure(|| self.publisher.publish(upserts, removed));
        drop(ledger);
        let shown_in = delta.as_ref().map(|d| d.to).unwrap_or_else(|| self.publisher.load().version);
        for ack in self.acks.drain(..) {
            let _ = ack.send(shown_in);
        }
        if let Some(d) = delta {
            self.metrics.version.set(d.to.seq as f64);
            self.metrics.delta_nodes.record(changes as f64);
            self.metrics.bytes_copied.record(bytes as f64);
            self.metrics.bytes_copied_total.increment(bytes);
            self.metrics.versions_total.increment(1);
            self.metrics.apply_seconds.record(started.elapsed().as_secs_f64());
            for (g, c) in self.metrics.nodes.iter().zip(self.counts) {
                g.set(c as f64);
            }
        }
    }

    /// Runs until the change channel closes or `shutdown` fires.
    pub async fn run(mut self, mut rx: UnboundedReceiver<Change>, mut shutdown: tokio::sync::watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_millis(WHEEL_SLOT_MS));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut flush_at: Option<Instant> = None;
        loop {
            let deadline = flush_at.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                c = rx.recv() => match c {
                    Some(c) => self.absorb(c),
                    None => return,
                },
                _ = tick.tick() => self.tick(flotilla_core::now_ms()),
                _ = tokio::time::sleep_until(deadline), if flush_at.is_some() => {}
                _ = shutdown.changed() => return,
            }
            while let Ok(c) = rx.try_recv() {
                self.absorb(c);
            }
            if self.has_work() && flush_at.is_none() {
                flush_at = Some(Instant::now() + self.batch_window);
            }
            if flush_at.is_some_and(|t| Instant::now() >= t) {
                self.flush(&mut rx);
                flush_at = None;
            }
        }
    }
}
