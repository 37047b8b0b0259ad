//! Deterministic fault simulation (docs/architecture.md §15).
//!
//! The real shard core (registry, heartbeat ingest, applier, ledger) with its real gRPC
//! services, and the real app scheduler with its real view followers, run on turmoil's
//! simulated network and clock. Turmoil has no QUIC, so simulated agents drive the
//! shard's control path directly (register, report workloads, take pushes) and send it
//! real sealed heartbeat datagrams. One seed draws the faults — partitions between the
//! scheduler and a shard, shard crashes and restarts, scheduler crashes (also with a
//! commit in flight), slow and lossy links, node losses, a deposed scheduler whose stale
//! commits and releases arrive after its successor's (`deposed`) — and the network's
//! latencies. Each scheduler start carries a higher fencing token, as a lease would give.
//!
//! Every 100 ms of simulated time the invariants are checked: no node holds more than
//! its capacity (in the ledger and in what its agent runs); no member is placed twice
//! and no unit has two heads; a scheduler never counts more units than desired. After
//! the faults heal and a settling period, every unit must be Running and the ledgers
//! must hold exactly the units' members: every committed claim is running or released.

mod agents;
mod deposed;
mod faults;
mod hosts;
mod invariants;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use flotilla_scheduler::Store;
use rand::{Rng, SeedableRng};

pub use faults::Fault;

/// Shards in the simulated cluster.
pub const SHARDS: usize = 2;
/// Nodes in each shard's failure domain.
pub const NODES_PER_DOMAIN: usize = 3;
/// Port of every shard's gRPC server.
pub const GRPC_PORT: u16 = 7000;
/// Faults are injected during this much simulated time…
pub const CHAOS: Duration = Duration::from_secs(40);
/// …and everything must have converged this long after the last one healed.
pub const SETTLE: Duration = Duration::from_secs(30);
/// How often the invariants are checked.
const CHECK_EVERY: Duration = Duration::from_millis(100);
/// Simulated time per step.
const TICK: Duration = Duration::from_millis(10);

/// The app every simulation runs: units of a head and one worker, 1 CPU each, on
/// nodes of 2 CPUs, so a lost domain cannot be absorbed by the other.
pub const SPEC: &str = r#"
name = "sim"

[unit]
workers = 1

[unit.head]
command = "sim-workload"
cpu = "1000m"
memory = "256Mi"

[unit.worker]
command = "sim-workload"
cpu = "1000m"
memory = "256Mi"

[spread]
max_units_per_domain = 3

[units]
min = 1
max = 8
initial = 4
drain_timeout_ms = 1000
"#;

/// What a passing run did.
#[derive(Debug)]
pub struct Outcome {
    pub seed: u64,
    pub faults: Vec<String>,
    pub checks: u64,
    /// Units the scheduler created over the run (replacements included).
    pub units_created: u64,
    /// Shards that refused a deposed scheduler's stale commit and release (fenced).
    pub deposed_fenced: u32,
}

/// A broken invariant, with what is needed to replay it.
#[derive(Debug)]
pub struct Violation {
    pub seed: u64,
    pub at: Duration,
    pub what: String,
    pub faults: Vec<String>,
}

impl std::fmt::Display for Violation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {} broke an invariant at {:?}: {}", self.seed, self.at, self.what)?;
        writeln!(f, "faults: {}", self.faults.join("; "))?;
        write!(f, "replay: FLOTILLA_SIM_SEED={} cargo test -p flotilla-faults --test seeds -- --nocapture", self.seed)
    }
}

/// The state that outlives host crashes: the agents (nodes are not shard processes),
/// the scheduler's store, and handles for the invariant checks.
pub(crate) struct World {
    pub agents: Vec<agents::Agent>,
    pub store: Arc<flotilla_scheduler::MemStore>,
    /// Each running shard's ledger; `None` while the shard is down.
    pub ledgers: [Option<Arc<std::sync::Mutex<flotilla_aggregator::Ledger>>>; SHARDS],
    pub shard_starts: [u32; SHARDS],
    pub scheduler_starts: u32,
    pub seed: u64,
    /// Each shard's persisted state (cordons, fencing marks): it outlives a shard crash.
    pub shard_states: [Arc<flotilla_aggregator::MemState>; SHARDS],
    /// A deposed scheduler waiting for its successor to speak to a shard.
    pub deposed: Option<deposed::Pending>,
    /// Its stale requests, for the deposed host to send.
    pub deposed_jobs: Vec<deposed::Job>,
    pub deposed_report: deposed::Report,
}

pub(crate) type Shared = Rc<RefCell<World>>;

fn sim_clock() -> u64 {
    turmoil::since_epoch().map(|d| d.as_millis() as u64).unwrap_or_else(flotilla_core::system_ms)
}

/// Runs one seeded simulation to its end.
pub fn run(seed: u64) -> Result<Outcome, Violation> {
    // Outside a simulation (never, in this crate's tests) this is the system clock.
    flotilla_core::install_clock(sim_clock);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let max_latency = Duration::from_millis(rng.random_range(2..40));
    let mut sim = turmoil::Builder::new()
        .epoch(UNIX_EPOCH + Duration::from_secs(1_790_000_000))
        .simulation_duration(CHAOS + SETTLE + Duration::from_secs(60))
        .tick_duration(TICK)
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(max_latency)
        .rng_seed(seed)
        .build();
    let world: Shared = Rc::new(RefCell::new(World {
        agents: agents::nodes(),
        store: Arc::new(flotilla_scheduler::MemStore::default()),
        ledgers: Default::default(),
        shard_starts: [0; SHARDS],
        scheduler_starts: 0,
        seed,
        shard_states: std::array::from_fn(|_| Arc::default()),
        deposed: None,
        deposed_jobs: Vec::new(),
        deposed_report: deposed::Report::default(),
    }));
    for shard in 0..SHARDS {
        let w = world.clone();
        sim.host(hosts::shard_host(shard), move || hosts::shard(shard, w.clone()));
    }
    let w = world.clone();
    sim.host(hosts::SCHEDULER, move || hosts::scheduler(w.clone()));
    let w = world.clone();
    sim.host(deposed::HOST, move || deposed::host(w.clone()));

    let plan = faults::plan(&mut rng, CHAOS);
    let faults: Vec<String> = plan.iter().map(|f| f.to_string()).collect();
    let violation = |at: Duration, what: String| Violation { seed, at, what, faults: faults.clone() };
    let mut actions = faults::schedule(&plan);
    let mut checks = 0;
    let mut next_check = CHECK_EVERY;
    let end = CHAOS + SETTLE;
    // A crash waiting for the next commit, and how many allocations the ledgers held.
    let mut armed = None;
    let mut allocated = invariants::allocation_count(&world.borrow());
    while sim.elapsed() < end {
        sim.step().map_err(|e| violation(sim.elapsed(), format!("a host failed: {e}")))?;
        let now = sim.elapsed();
        while actions.first().is_some_and(|(at, _)| *at <= now) {
            let (_, action) = actions.remove(0);
            if let faults::Action::CrashOnNextCommit { lasts, late, until } = action {
                armed = Some((lasts, late, until));
            }
            faults::apply(&mut sim, &world, &action);
        }
        let count = invariants::allocation_count(&world.borrow());
        if let Some((lasts, late, until)) = armed
            && (count > allocated || now >= until)
        {
            armed = None;
            actions.extend(faults::crash_mid_commit(&mut sim, now, lasts, late));
            actions.sort_by_key(|(at, _)| *at);
        }
        allocated = count;
        deposed::arm(&mut world.borrow_mut(), now);
        if now >= next_check {
            next_check += CHECK_EVERY;
            checks += 1;
            invariants::always(&world.borrow()).map_err(|e| violation(now, e))?;
        }
    }
    invariants::converged(&world.borrow()).map_err(|e| violation(sim.elapsed(), format!("after settling: {e}")))?;
    let units_created = world.borrow().store.load("sim").map(|s| s.next_generation.saturating_sub(1)).unwrap_or(0);
    let deposed_fenced = world.borrow().deposed_report.fenced;
    Ok(Outcome { seed, faults, checks, units_created, deposed_fenced })
}
