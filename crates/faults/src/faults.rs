//! The faults one seed draws, and the timed actions that inject and heal them.

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;

use crate::hosts::{SCHEDULER, shard_host};
use crate::{SHARDS, Shared};

#[derive(Debug, Clone)]
pub enum Fault {
    /// No traffic between the scheduler and a shard.
    Partition { shard: usize },
    /// The shard process dies and restarts (a new epoch; it recovers its ledger).
    ShardCrash { shard: usize },
    /// The scheduler process dies and restarts from its store.
    SchedulerCrash,
    /// A node is lost, so that the scheduler commits replacements once the loss is
    /// detected. The moment a shard's ledger takes a new allocation, the links are held
    /// (its answer is still on the wire) and the scheduler dies; the held messages
    /// arrive before it restarts, or (`late`) after the new scheduler started.
    CrashMidCommit { node: usize, late: bool },
    /// The link to a shard becomes slow.
    SlowLink { shard: usize, max_latency: Duration },
    /// The link to a shard loses messages (turmoil breaks TCP connections on loss).
    LossyLink { shard: usize, fail_rate: f64 },
    /// A node is lost and comes back later as a new incarnation.
    NodeLoss { node: usize },
    /// The scheduler is paused as a node is lost; its successor (a higher fencing token)
    /// replaces what the node ran; the old one wakes up and sends stale commits and
    /// releases on new connections (see `crate::deposed`): all must be fenced.
    DeposedScheduler { node: usize },
}

/// One fault, when it starts and how long it lasts.
#[derive(Debug, Clone)]
pub struct Planned {
    pub fault: Fault,
    pub at: Duration,
    pub lasts: Duration,
}

impl std::fmt::Display for Planned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} at {:?} for {:?}", self.fault, self.at, self.lasts)
    }
}

#[derive(Debug, Clone)]
pub enum Action {
    Partition(usize),
    Repair(usize),
    Release(usize),
    CrashShard(usize),
    BounceShard(usize),
    CrashScheduler,
    BounceScheduler,
    Latency(usize, Duration),
    FailRate(usize, f64),
    LoseNode(usize),
    RestartNode(usize),
    /// Pause (crash) the scheduler, remembering what it knew, until `until` at most.
    Depose {
        until: Duration,
    },
    /// Crash the scheduler as soon as a ledger takes a new allocation (or at `until`).
    CrashOnNextCommit {
        lasts: Duration,
        late: bool,
        until: Duration,
    },
}

/// Two to six faults inside the chaos window, each healed before it ends.
pub fn plan(rng: &mut StdRng, chaos: Duration) -> Vec<Planned> {
    let nodes = SHARDS * crate::NODES_PER_DOMAIN;
    let n = rng.random_range(2..=6);
    let mut plan: Vec<Planned> = (0..n)
        .map(|_| {
            let shard = rng.random_range(0..SHARDS);
            let fault = match rng.random_range(0..8) {
                0 => Fault::Partition { shard },
                1 => Fault::ShardCrash { shard },
                2 => Fault::SchedulerCrash,
                3 => Fault::CrashMidCommit { node: rng.random_range(0..nodes), late: rng.random_bool(0.5) },
                4 => Fault::SlowLink { shard, max_latency: Duration::from_millis(rng.random_range(100..1500)) },
                5 => Fault::LossyLink { shard, fail_rate: rng.random_range(0.01..0.2) },
                6 => Fault::DeposedScheduler { node: rng.random_range(0..nodes) },
                _ => Fault::NodeLoss { node: rng.random_range(0..nodes) },
            };
            let at = Duration::from_millis(rng.random_range(2_000..chaos.as_millis() as u64 - 12_000));
            let lasts = Duration::from_millis(rng.random_range(300..10_000));
            Planned { fault, at, lasts }
        })
        .collect();
    plan.sort_by_key(|p| p.at);
    plan
}

/// The plan as timed actions, in order.
pub fn schedule(plan: &[Planned]) -> Vec<(Duration, Action)> {
    let mut out = Vec::new();
    for p in plan {
        let end = p.at + p.lasts;
        match p.fault {
            Fault::Partition { shard } => {
                out.push((p.at, Action::Partition(shard)));
                out.push((end, Action::Repair(shard)));
            }
            Fault::ShardCrash { shard } => {
                out.push((p.at, Action::CrashShard(shard)));
                out.push((end, Action::BounceShard(shard)));
            }
            Fault::SchedulerCrash => {
                out.push((p.at, Action::CrashScheduler));
                out.push((end, Action::BounceScheduler));
            }
            Fault::CrashMidCommit { node, late } => {
                out.push((p.at, Action::LoseNode(node)));
                out.push((
                    p.at,
                    Action::CrashOnNextCommit { lasts: p.lasts, late, until: p.at + Duration::from_secs(8) },
                ));
                out.push((p.at + Duration::from_secs(10) + p.lasts, Action::RestartNode(node)));
            }
            Fault::SlowLink { shard, max_latency } => {
                out.push((p.at, Action::Latency(shard, max_latency)));
                out.push((end, Action::Latency(shard, Duration::from_millis(40))));
            }
            Fault::LossyLink { shard, fail_rate } => {
                out.push((p.at, Action::FailRate(shard, fail_rate)));
                out.push((end, Action::FailRate(shard, 0.0)));
            }
            Fault::NodeLoss { node } => {
                out.push((p.at, Action::LoseNode(node)));
                out.push((end, Action::RestartNode(node)));
            }
            Fault::DeposedScheduler { node } => {
                out.push((p.at, Action::Depose { until: end + Duration::from_secs(20) }));
                out.push((p.at, Action::LoseNode(node)));
                out.push((end, Action::BounceScheduler));
                out.push((end + Duration::from_secs(10), Action::RestartNode(node)));
            }
        }
    }
    // Stable: actions at the same time keep the plan's order.
    out.sort_by_key(|(at, _)| *at);
    out
}

pub fn apply(sim: &mut turmoil::Sim<'_>, world: &Shared, action: &Action) {
    tracing::debug!(?action, "fault");
    match *action {
        Action::Partition(s) => sim.partition(SCHEDULER, shard_host(s)),
        Action::Repair(s) => sim.repair(SCHEDULER, shard_host(s)),
        Action::Release(s) => sim.release(SCHEDULER, shard_host(s)),
        Action::CrashShard(s) => {
            sim.crash(shard_host(s));
            world.borrow_mut().ledgers[s] = None;
        }
        Action::BounceShard(s) => {
            world.borrow_mut().ledgers[s] = None;
            sim.bounce(shard_host(s));
        }
        Action::CrashScheduler => sim.crash(SCHEDULER),
        Action::BounceScheduler => sim.bounce(SCHEDULER),
        Action::Latency(s, d) => sim.set_link_max_message_latency(SCHEDULER, shard_host(s), d),
        Action::FailRate(s, r) => sim.set_link_fail_rate(SCHEDULER, shard_host(s), r),
        Action::LoseNode(n) => {
            if let Some(a) = world.borrow_mut().agents.get_mut(n) {
                a.lose();
            }
        }
        Action::RestartNode(n) => {
            if let Some(a) = world.borrow_mut().agents.get_mut(n) {
                a.restart();
            }
        }
        Action::Depose { until } => {
            crate::deposed::depose(&mut world.borrow_mut(), until);
            sim.crash(SCHEDULER);
        }
        // The driver watches the ledgers for it (see `crate::run`).
        Action::CrashOnNextCommit { .. } => {}
    }
}

/// What a crash with a commit in flight sets off: the links held at once, the scheduler
/// crashed, the held messages released and the scheduler restarted later.
pub fn crash_mid_commit(
    sim: &mut turmoil::Sim<'_>,
    now: Duration,
    lasts: Duration,
    late: bool,
) -> Vec<(Duration, Action)> {
    for s in 0..SHARDS {
        sim.hold(SCHEDULER, shard_host(s));
    }
    sim.crash(SCHEDULER);
    let restart = now + lasts;
    let release = if late { restart + Duration::from_millis(200) } else { now + Duration::from_millis(50) };
    let mut out = vec![(restart, Action::BounceScheduler)];
    out.extend((0..SHARDS).map(|s| (release, Action::Release(s))));
    out
}
