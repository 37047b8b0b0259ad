//! The cluster around the pool autoscaler in a simulation: instances that boot, nodes
//! that take units, and the apps' schedulers reduced to what the pool sees of them
//! (placement, scale-in, drains, rebalance off nodes the pool lets go). The autoscaler
//! reaches it through [`SimProvider`] and [`SimCluster`], as it reaches a cloud and a
//! control plane.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use flotilla_core::{MemberShape, Resources, UnitShape};
use serde_json::Value;

use crate::cluster::{Cluster, ClusterError, ReportAnswer};
use crate::config::PoolConfig;
use crate::model::{AppRow, NodeRow, Queued};
use crate::provider::{BoxFuture, CloudInstance, InstanceProvider, LaunchSpec, ProviderError};

/// What the modelled apps and machines take, in milliseconds of simulated time.
#[derive(Debug, Clone, Copy, PartialEq, Default, serde::Serialize)]
pub struct Timing {
    /// From a launch to the node's agent registered.
    pub boot_ms: u64,
    /// From a unit placed to it running.
    pub start_ms: u64,
    /// A placed unit is not moved by rebalance before this (`disruption.quiet_period`).
    pub quiet_ms: u64,
}

pub(super) struct Instance {
    node_type: String,
    ready_ms: u64,
    cordoned: bool,
    drain_requested: bool,
    terminated: bool,
}

pub(super) struct Unit {
    app: String,
    node: Option<String>,
    queued_ms: u64,
    placed_ms: u64,
    /// The unit this one replaces (a move, make before break).
    replaces: Option<u64>,
}

#[derive(Default)]
pub(super) struct World {
    pub now_ms: u64,
    pub timing: Timing,
    pub instances: BTreeMap<String, Instance>,
    /// Each app's unit and desired count.
    pub apps: BTreeMap<String, (Resources, u32)>,
    pub units: BTreeMap<u64, Unit>,
    next_unit: u64,
    /// How long each unit the apps asked for waited to run, in ms (moves not counted).
    pub waits: Vec<u64>,
    pub moves: u64,
}

/// The world, shared by the provider, the cluster and the loop.
#[derive(Clone, Default)]
pub(super) struct Shared(Arc<Mutex<World>>);

impl Shared {
    pub fn lock(&self) -> MutexGuard<'_, World> {
        // A panic while holding it ends the simulation anyway.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl World {
    fn usable(&self, id: &str) -> bool {
        self.instances
            .get(id)
            .is_some_and(|i| !i.terminated && !i.cordoned && !i.drain_requested && i.ready_ms <= self.now_ms)
    }

    /// What each node holds (computed once a step: placement updates it as it goes).
    fn allocated(&self) -> BTreeMap<String, Resources> {
        let mut a: BTreeMap<String, Resources> = BTreeMap::new();
        for u in self.units.values() {
            if let Some(n) = &u.node {
                let e = a.entry(n.clone()).or_default();
                *e = e.checked_add(&self.apps[&u.app].0).unwrap_or_else(|_| e.clone());
            }
        }
        a
    }

    /// Whether `node` is of a type with a `min` (`flotilla.io/pool-keeps`).
    fn kept(&self, cfg: &PoolConfig, node: &str) -> bool {
        self.instances.get(node).and_then(|i| cfg.node_type(&i.node_type)).is_some_and(|t| t.min > 0)
    }

    /// How much a member on `node` weighs for rebalance's `spare`: 2 on a cordoned pool
    /// node, 1 on a type without a `min`, else 0 (`flotilla_scheduler::rebalance`).
    fn spare(&self, cfg: &PoolConfig, node: &str) -> u32 {
        let Some(i) = self.instances.get(node) else { return 0 };
        if i.cordoned && !i.drain_requested { 2 } else { u32::from(!self.kept(cfg, node)) }
    }

    /// The node placement picks for a unit of `app` (never `not`): a type the pool keeps,
    /// then the cheaper, then the fullest after (the planner's bin packing), then by id.
    fn best_node(
        &self,
        cfg: &PoolConfig,
        allocated: &BTreeMap<String, Resources>,
        app: &str,
        not: Option<&str>,
        max_spare: u32,
    ) -> Option<String> {
        let unit = &self.apps[app].0;
        let mut best: Option<((bool, i64, u64), &str)> = None;
        for (id, i) in &self.instances {
            if Some(id.as_str()) == not || !self.usable(id) || self.spare(cfg, id) >= max_spare {
                continue;
            }
            let Some(t) = cfg.node_type(&i.node_type) else { continue };
            let used = allocated.get(id.as_str()).cloned().unwrap_or_default();
            let Ok(after) = used.checked_add(unit) else { continue };
            if !after.fits_in(&t.resources) {
                continue;
            }
            let cost = -(t.cost.unwrap_or(0.0) * 1e6) as i64;
            let rank = (t.min > 0, cost, after.cpu_millis);
            if best.as_ref().is_none_or(|(b, _)| rank > *b) {
                best = Some((rank, id));
            }
        }
        best.map(|(_, id)| id.to_string())
    }

    fn queue(&mut self, app: &str, replaces: Option<u64>) {
        self.next_unit += 1;
        let u = Unit { app: app.to_string(), node: None, queued_ms: self.now_ms, placed_ms: 0, replaces };
        self.units.insert(self.next_unit, u);
    }

    fn running(&self, u: &Unit) -> bool {
        u.node.is_some() && u.placed_ms + self.start_ms() <= self.now_ms
    }

    fn start_ms(&self) -> u64 {
        self.timing.start_ms
    }

    /// One second of the apps' schedulers: scale to the desired counts, replace units on
    /// draining or gone nodes, place what is queued, finish moves, and (every 5 s)
    /// rebalance one unit per app off a node the pool lets go.
    pub fn step(&mut self, cfg: &PoolConfig, rebalance: bool) {
        let apps: Vec<(String, u32)> = self.apps.iter().map(|(a, (_, n))| (a.clone(), *n)).collect();
        for (app, desired) in apps {
            let mine: Vec<u64> =
                self.units.iter().filter(|(_, u)| u.app == app && u.replaces.is_none()).map(|(id, _)| *id).collect();
            for _ in mine.len()..desired as usize {
                self.queue(&app, None);
            }
            if mine.len() > desired as usize {
                // Scale-in: queued first, then units on nodes the pool would rather
                // free, then the youngest (`flotilla_scheduler::repair::scale_in_order`).
                let mut ranked: Vec<(bool, bool, std::cmp::Reverse<u64>, u64)> = mine
                    .iter()
                    .map(|id| {
                        let u = &self.units[id];
                        let kept = u.node.as_deref().is_some_and(|n| self.kept(cfg, n));
                        (u.node.is_some(), kept, std::cmp::Reverse(*id), *id)
                    })
                    .collect();
                ranked.sort();
                for (_, _, _, id) in ranked.into_iter().take(mine.len() - desired as usize) {
                    self.units.remove(&id);
                    self.units.retain(|_, u| u.replaces != Some(id));
                }
            }
        }
        // Units whose node went are queued again; units on a draining node are replaced.
        let lost: Vec<u64> = self
            .units
            .iter()
            .filter(|(_, u)| u.node.as_ref().is_some_and(|n| self.instances.get(n).is_none_or(|i| i.terminated)))
            .map(|(id, _)| *id)
            .collect();
        for id in lost {
            if let Some(u) = self.units.get_mut(&id) {
                u.node = None;
                u.queued_ms = self.now_ms;
            }
        }
        let draining: Vec<u64> = self
            .units
            .iter()
            .filter(|(id, u)| {
                u.replaces.is_none()
                    && u.node.as_ref().is_some_and(|n| self.instances[n].drain_requested)
                    && !self.units.values().any(|r| r.replaces == Some(**id))
            })
            .map(|(id, _)| *id)
            .collect();
        for id in draining {
            let app = self.units[&id].app.clone();
            self.queue(&app, Some(id));
            self.moves += 1;
        }
        // Placement, oldest first.
        let queued: Vec<u64> = self.units.iter().filter(|(_, u)| u.node.is_none()).map(|(id, _)| *id).collect();
        let mut allocated = self.allocated();
        let mut full: std::collections::BTreeSet<&str> = Default::default();
        for id in queued {
            let app = self.units[&id].app.clone();
            // An app none of whose units fit now is not tried again this step.
            if full.contains(app.as_str()) {
                continue;
            }
            let Some(node) = self.best_node(cfg, &allocated, &app, None, u32::MAX) else {
                if let Some((a, _)) = self.apps.get_key_value(&app) {
                    full.insert(a.as_str());
                }
                continue;
            };
            let e = allocated.entry(node.clone()).or_default();
            *e = e.checked_add(&self.apps[&app].0).unwrap_or_else(|_| e.clone());
            let now = self.now_ms;
            let start = self.start_ms();
            let Some(u) = self.units.get_mut(&id) else { continue };
            u.node = Some(node);
            u.placed_ms = now;
            if u.replaces.is_none() {
                self.waits.push(now + start - u.queued_ms);
            }
        }
        // A replacement running ends the unit it replaces.
        let done: Vec<(u64, u64)> =
            self.units.iter().filter(|(_, u)| self.running(u)).filter_map(|(id, u)| Some((*id, u.replaces?))).collect();
        for (id, old) in done {
            self.units.remove(&old);
            if let Some(u) = self.units.get_mut(&id) {
                u.replaces = None;
            }
        }
        if rebalance && self.now_ms.is_multiple_of(5000) {
            self.rebalance(cfg);
        }
    }

    /// One move per app at a time (`max_moving = 1`): a running unit past its quiet period
    /// on a node the pool lets go, to a node it lets go less.
    fn rebalance(&mut self, cfg: &PoolConfig) {
        let apps: Vec<String> = self.apps.keys().cloned().collect();
        let mut allocated = self.allocated();
        for app in apps {
            if self.units.values().any(|u| u.app == app && u.replaces.is_some()) {
                continue;
            }
            let mut found = None;
            for (id, u) in self.units.iter().filter(|(_, u)| u.app == app && self.running(u)) {
                let node = u.node.as_deref().unwrap_or_default();
                let spare = self.spare(cfg, node);
                if spare == 0 || self.now_ms < u.placed_ms + self.timing.quiet_ms {
                    continue;
                }
                if let Some(to) = self.best_node(cfg, &allocated, &app, Some(node), spare) {
                    found = Some((*id, to));
                    break;
                }
            }
            let Some((old, to)) = found else { continue };
            let e = allocated.entry(to.clone()).or_default();
            *e = e.checked_add(&self.apps[&app].0).unwrap_or_else(|_| e.clone());
            self.queue(&app, Some(old));
            let now = self.now_ms;
            if let Some(u) = self.units.get_mut(&self.next_unit) {
                u.node = Some(to);
                u.placed_ms = now;
            }
            self.moves += 1;
        }
    }

    /// Units the apps asked for that have not run yet, and since when (ms): their waits,
    /// were the trace to end now.
    pub fn still_waiting(&self) -> impl Iterator<Item = u64> + '_ {
        self.units.values().filter(|u| u.replaces.is_none() && u.node.is_none()).map(|u| self.now_ms - u.queued_ms)
    }

    /// Units the apps asked for and have not got running.
    pub fn pending(&self) -> usize {
        self.units.values().filter(|u| u.replaces.is_none() && !self.running(u)).count()
    }

    pub fn running_units(&self) -> usize {
        self.units.values().filter(|u| u.replaces.is_none() && self.running(u)).count()
    }

    /// Instances paid for now (launched, not terminated), and their cost per hour.
    pub fn paid(&self, cfg: &PoolConfig) -> (usize, f64) {
        let live = self.instances.values().filter(|i| !i.terminated);
        live.fold((0, 0.0), |(n, c), i| (n + 1, c + cfg.node_type(&i.node_type).and_then(|t| t.cost).unwrap_or(0.0)))
    }
}

/// The cloud: instances boot for `boot_ms`, then their agents register.
pub(super) struct SimProvider(pub Shared);

impl InstanceProvider for SimProvider {
    fn name(&self) -> &'static str {
        "sim"
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<CloudInstance>, ProviderError>> {
        let w = self.0.lock();
        let list = w
            .instances
            .iter()
            .filter(|(_, i)| !i.terminated)
            .map(|(id, i)| CloudInstance { id: id.clone(), node_type: i.node_type.clone() })
            .collect();
        Box::pin(async move { Ok(list) })
    }

    fn launch<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<(), ProviderError>> {
        let mut w = self.0.lock();
        let ready_ms = w.now_ms + w.timing.boot_ms;
        w.instances.entry(spec.id.clone()).or_insert(Instance {
            node_type: spec.node_type.clone(),
            ready_ms,
            cordoned: spec.cordoned,
            drain_requested: false,
            terminated: false,
        });
        Box::pin(async { Ok(()) })
    }

    fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        if let Some(i) = self.0.lock().instances.get_mut(id) {
            i.terminated = true;
        }
        Box::pin(async { Ok(()) })
    }
}

/// The control plane: nodes as the view lists them, apps with their queued units.
pub(super) struct SimCluster {
    pub world: Shared,
    pub cfg: PoolConfig,
}

impl Cluster for SimCluster {
    fn nodes(&self) -> BoxFuture<'_, Result<Vec<NodeRow>, ClusterError>> {
        let w = self.world.lock();
        let allocated = w.allocated();
        let mut workloads: BTreeMap<&str, usize> = BTreeMap::new();
        for u in w.units.values() {
            if let Some(n) = &u.node {
                *workloads.entry(n.as_str()).or_default() += 1;
            }
        }
        let rows = w
            .instances
            .iter()
            .filter(|(_, i)| !i.terminated && i.ready_ms <= w.now_ms)
            .filter_map(|(id, i)| {
                let t = self.cfg.node_type(&i.node_type)?;
                Some(NodeRow {
                    // The sim names its instances as valid node ids.
                    node_id: flotilla_core::NodeId::new(id).ok()?,
                    status: flotilla_core::NodeStatus::Alive,
                    // The pool file's labels were checked as labels when it was read.
                    labels: std::sync::Arc::new(flotilla_core::Labels::from_map(t.labels.clone()).unwrap_or_default()),
                    capacity: std::sync::Arc::new(t.resources.clone()),
                    allocated: std::sync::Arc::new(allocated.get(id.as_str()).cloned().unwrap_or_default()),
                    cordoned: i.cordoned || i.drain_requested,
                    drain_requested: i.drain_requested,
                    workloads: workloads.get(id.as_str()).copied().unwrap_or(0),
                })
            })
            .collect();
        Box::pin(async move { Ok(rows) })
    }

    fn apps(&self) -> BoxFuture<'_, Result<Vec<AppRow>, ClusterError>> {
        let w = self.world.lock();
        let rows = w
            .apps
            .iter()
            .map(|(app, (unit, _))| AppRow {
                app: app.clone(),
                queued: Queued {
                    primary: w.units.values().filter(|u| &u.app == app && u.node.is_none()).count() as u32,
                    secondary: 0,
                },
                unit_shape: UnitShape { members: vec![MemberShape::plain("head", unit.clone())], ..Default::default() },
            })
            .collect();
        Box::pin(async move { Ok(rows) })
    }

    fn drain<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ClusterError>> {
        if let Some(i) = self.world.lock().instances.get_mut(node) {
            i.drain_requested = true;
        }
        Box::pin(async { Ok(()) })
    }

    fn set_cordon<'a>(&'a self, node: &'a str, cordoned: bool) -> BoxFuture<'a, Result<(), ClusterError>> {
        if let Some(i) = self.world.lock().instances.get_mut(node) {
            i.cordoned = cordoned;
        }
        Box::pin(async { Ok(()) })
    }

    fn report<'a>(&'a self, _: &'a str, _: &'a Value) -> BoxFuture<'a, Result<ReportAnswer, ClusterError>> {
        Box::pin(async { Ok(ReportAnswer::default()) })
    }
}
