//! `flotilla sim --pool`: the real pool autoscaler ([`Autoscaler::pass`]: packing, warm
//! pools, fallback, consolidation, the instance lifecycle and its store) run against a
//! modelled cluster ([`world`]) in simulated time, over a demand trace ([`demand`]). It
//! reports what the pool paid (node-hours, cost), the units it moved, how long units
//! waited, and the cost at the end against the cheapest pool that holds the units left
//! ([`optimum`]); with and without consolidation and warm pools.
//!
//! The autoscaler reads time through `flotilla_core::now_ms`, so a process that simulates
//! installs this module's clock first ([`install_clock`]) and runs nothing else.

pub mod demand;
pub mod optimum;
mod world;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

pub use demand::{Demand, DemandError};
pub use world::Timing;

use crate::autoscaler::Autoscaler;
use crate::config::PoolConfig;
use crate::store::PoolStore;
use world::{Shared, SimCluster, SimProvider};

static NOW_MS: AtomicU64 = AtomicU64::new(0);

/// Simulated time starts here (2026-01-01), so records and ids look as they would.
const EPOCH_MS: u64 = 1_767_225_600_000;

fn now() -> u64 {
    NOW_MS.load(Ordering::Relaxed)
}

/// Makes simulated time the process's clock; false if another clock was installed first.
pub fn install_clock() -> bool {
    flotilla_core::install_clock(now) && {
        NOW_MS.store(EPOCH_MS, Ordering::Relaxed);
        true
    }
}

/// About this many points of the time series are kept.
const SERIES_POINTS: u64 = 2000;

/// The pool and its units at one time.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub at_s: u64,
    /// Units the apps want.
    pub demand: u32,
    pub running: usize,
    pub pending: usize,
    /// Instances paid for (launched, booting or running, not terminated).
    pub nodes: usize,
    pub cost_per_hour: f64,
}

/// One run over the trace.
#[derive(Debug, Clone, Serialize)]
pub struct Run {
    pub consolidation: bool,
    pub warm: bool,
    pub node_hours: f64,
    pub cost: f64,
    /// Units moved (make before break): consolidation, drains.
    pub units_moved: u64,
    /// From a unit asked for to running, per unit (a unit still waiting at the end, with
    /// what it waited so far; one whose node went, once more from then).
    pub pending_p50_s: f64,
    pub pending_p99_s: f64,
    pub launches: usize,
    /// At the end of the trace.
    pub final_nodes: usize,
    pub final_cost_per_hour: f64,
    /// The cheapest pool for the units the trace ends with (exact, small cases only),
    /// plus the warm pools' instances when this run keeps them.
    pub optimal_cost_per_hour: Option<f64>,
    /// Pool passes that failed (none expected).
    pub failed_passes: u64,
    #[serde(skip)]
    pub series: Vec<Point>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PoolSimReport {
    pub simulated_seconds: u64,
    pub timing: Timing,
    /// As configured first, then the others of: consolidation on and off, warm pools as
    /// configured and none (when any type has `warm`).
    pub runs: Vec<Run>,
}

#[derive(Debug, thiserror::Error)]
pub enum SimError {
    #[error("the simulated clock is not this process's (another was installed first)")]
    Clock,
    #[error("starting the autoscaler: {0}")]
    Start(String),
}

/// Every run of the report over `demand`.
pub fn simulate(cfg: &PoolConfig, demand: &Demand, timing: Timing) -> Result<PoolSimReport, SimError> {
    if now() < EPOCH_MS || flotilla_core::now_ms() != now() {
        return Err(SimError::Clock);
    }
    let has_warm = cfg.node_types.iter().any(|t| t.warm > 0);
    let on = cfg.consolidation.enabled;
    let mut variants = vec![(on, has_warm), (!on, has_warm)];
    if has_warm {
        variants.extend([(on, false), (!on, false)]);
    }
    // The demand in force as the trace ends: rows at the end itself change it for no time
    // (unless they are an app's only rows).
    let mut last: std::collections::BTreeMap<&str, (flotilla_core::Resources, u32)> = Default::default();
    for r in &demand.rows {
        if r.at_s < demand.end_s() || !last.contains_key(r.app.as_str()) {
            last.insert(&r.app, (r.unit.clone(), r.units));
        }
    }
    let units: Vec<_> = last.into_values().collect();
    let optimal = optimum::cheapest(cfg, &units);
    let mut runs = Vec::new();
    for (consolidation, warm) in variants {
        let mut c = cfg.clone();
        c.consolidation.enabled = consolidation;
        if !warm {
            c.node_types.iter_mut().for_each(|t| t.warm = 0);
        }
        let mut r = run(&c, demand, timing)?;
        let held: f64 = c.node_types.iter().map(|t| f64::from(t.warm) * t.cost.unwrap_or(0.0)).sum();
        r.optimal_cost_per_hour = optimal.map(|o| o + held);
        runs.push(r);
    }
    Ok(PoolSimReport { simulated_seconds: demand.end_s(), timing, runs })
}

fn run(cfg: &PoolConfig, demand: &Demand, timing: Timing) -> Result<Run, SimError> {
    let shared = Shared::default();
    shared.lock().timing = timing;
    NOW_MS.store(EPOCH_MS, Ordering::Relaxed);
    let provider = Arc::new(SimProvider(shared.clone()));
    let cluster = Arc::new(SimCluster { world: shared.clone(), cfg: cfg.clone() });
    let store = PoolStore::in_memory(&cfg.name).map_err(|e| SimError::Start(e.to_string()))?;
    let mut scaler =
        Autoscaler::seeded(cfg.clone(), provider, cluster, store, 40).map_err(|e| SimError::Start(e.to_string()))?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .map_err(|e| SimError::Start(e.to_string()))?;
    let interval_s = cfg.interval.as_secs().max(1);
    let end_s = demand.end_s();
    let every = (end_s / SERIES_POINTS).max(1);
    let (mut rows, mut node_s, mut cost, mut failed) = (demand.rows.iter().peekable(), 0u64, 0.0, 0u64);
    let mut series = Vec::new();
    let mut launched = std::collections::BTreeSet::new();
    for t in 0..=end_s {
        NOW_MS.store(EPOCH_MS + t * 1000, Ordering::Relaxed);
        {
            let mut w = shared.lock();
            w.now_ms = t * 1000;
            while let Some(r) = rows.next_if(|r| r.at_s <= t) {
                w.apps.insert(r.app.clone(), (r.unit.clone(), r.units));
            }
            w.step(cfg, true);
        }
        if t % interval_s == 0 && rt.block_on(scaler.pass()).is_err() {
            failed += 1;
        }
        let w = shared.lock();
        let (nodes, per_hour) = w.paid(cfg);
        launched.extend(w.instances.keys().cloned());
        if t < end_s {
            node_s += nodes as u64;
            cost += per_hour / 3600.0;
        }
        if t % every == 0 || t == end_s {
            series.push(Point {
                at_s: t,
                demand: w.apps.values().map(|(_, n)| n).sum(),
                running: w.running_units(),
                pending: w.pending(),
                nodes,
                cost_per_hour: per_hour,
            });
        }
    }
    let w = shared.lock();
    // Units still waiting at the end count with what they waited so far.
    let mut waits: Vec<u64> = w.waits.iter().copied().chain(w.still_waiting()).collect();
    waits.sort_unstable();
    let pct = |p: f64| {
        if waits.is_empty() {
            0.0
        } else {
            waits[((waits.len() as f64 * p).ceil() as usize).clamp(1, waits.len()) - 1] as f64 / 1000.0
        }
    };
    let (final_nodes, final_cost_per_hour) = w.paid(cfg);
    Ok(Run {
        consolidation: cfg.consolidation.enabled,
        warm: cfg.node_types.iter().any(|t| t.warm > 0),
        node_hours: node_s as f64 / 3600.0,
        cost,
        units_moved: w.moves,
        pending_p50_s: pct(0.5),
        pending_p99_s: pct(0.99),
        launches: launched.len(),
        final_nodes,
        final_cost_per_hour,
        optimal_cost_per_hour: None,
        failed_passes: failed,
        series,
    })
}
