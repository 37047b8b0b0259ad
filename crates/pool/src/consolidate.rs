//! Consolidation, pure: which node the pool empties next. A pool grown for a burst keeps
//! its nodes while each still holds a unit or two (the idle rule only ends empty ones),
//! so it pays for the burst long after it. This finds a node whose members fit in the
//! room the other nodes have and whose removal saves the most per member moved, or,
//! failing that, nodes of one type whose members fit on one new node of a type with the
//! same labels that costs less than they do: several small for one larger, or one large
//! for a smaller one (a burst's big node left holding a unit).
//!
//! The driver cordons what it picks; the apps' schedulers move the members off a cordoned
//! pool node through rebalance (make before break, within each app's `[disruption]`
//! budget, `flotilla_scheduler::rebalance`); the node, empty, is terminated. One
//! consolidation runs at a time, so the room counted for it is not counted twice, and
//! only while the pool is still (no demand queued, nothing launching). A unit's room is
//! counted in its node's domain only. A type's `min` is never crossed, and types a
//! policy sizes are the policy's (neither emptied nor launched).
//!
//! What a node holds is known as a total and a member count (`NodeRow::workloads`), not
//! member by member: the members are taken as equal shares of the total. A wrong guess
//! costs a consolidation that does not finish; the driver gives it up at its deadline.

use std::collections::{BTreeSet, HashMap};

use serde::Serialize;

use crate::config::PoolConfig;
use crate::model::{NodeRow, Observation, Phase, PoolInstance};
use crate::shape::{ResourceNames, Shape};

/// What to empty next, and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Consolidation {
    /// The nodes to empty, then terminate.
    pub nodes: Vec<String>,
    /// A node type to launch first for their members (a replacement).
    pub launch: Option<String>,
    /// Cost per hour saved once done (a type without a `cost` counts 1 an hour).
    pub saving_per_hour: f64,
    /// Members that move.
    pub members: usize,
    pub explanation: String,
}

/// How many candidates are tried for a fit in one pass: the fit check is O(nodes) each.
const MAX_TRIED: usize = 64;

/// A node the pool could empty.
struct Candidate<'a> {
    row: &'a NodeRow,
    node_type: &'a str,
    cost: f64,
    members: usize,
    /// Its members, as equal shares of what it holds.
    share: Shape,
}

/// The consolidation to start now, if any. `skip` holds nodes given up lately.
pub fn plan(cfg: &PoolConfig, obs: &Observation, skip: &BTreeSet<String>) -> Option<Consolidation> {
    if obs.apps.iter().any(|a| a.queued.primary + a.queued.secondary > 0)
        || obs.instances.iter().any(|i| i.phase == Phase::Pending)
    {
        return None;
    }
    let mut names = ResourceNames::default();
    let by_id: HashMap<&str, &PoolInstance> = obs.instances.iter().map(|i| (i.id.as_str(), i)).collect();
    let sized = |t: &str| cfg.policy.as_ref().is_some_and(|p| p.types().any(|s| s == t));
    let usable = |n: &NodeRow| n.status == flotilla_core::NodeStatus::Alive && !n.cordoned && !n.drain_requested;
    // What counts toward a type's `min`: instances not on their way out.
    let mut live: HashMap<&str, u32> = HashMap::new();
    for i in obs.instances.iter().filter(|i| i.phase != Phase::Leaving) {
        *live.entry(i.node_type.as_str()).or_default() += 1;
    }
    // Room: what every usable node has free. An empty pool node the idle rule may end is
    // no room; one its type keeps (up to its `min`, after its busy nodes) is.
    let mut keeps_empty: HashMap<&str, u32> = cfg.node_types.iter().map(|t| (t.name.as_str(), t.min)).collect();
    for n in obs.nodes.iter().filter(|n| !n.allocated.is_zero()) {
        if let Some(k) = by_id.get(n.node_id.as_str()).and_then(|i| keeps_empty.get_mut(i.node_type.as_str())) {
            *k = k.saturating_sub(1);
        }
    }
    let mut room: Vec<(&str, &str, Shape)> = Vec::new();
    let mut candidates = Vec::new();
    for n in obs.nodes.iter().filter(|n| usable(n)) {
        let inst = by_id.get(n.node_id.as_str()).copied();
        let kept = match inst {
            None => true,
            Some(i) if i.warm => false,
            Some(_) if !n.allocated.is_zero() => true,
            Some(i) => keeps_empty.get_mut(i.node_type.as_str()).is_some_and(|k| {
                let kept = *k > 0;
                *k = k.saturating_sub(1);
                kept
            }),
        };
        if kept {
            let mut free = shape(&n.capacity, &mut names);
            free.sub_times(&shape(&n.allocated, &mut names), 1);
            room.push((n.node_id.as_str(), domain(n), free));
        }
        let Some(i) = inst.filter(|i| i.phase == Phase::Running && !i.warm) else { continue };
        let Some(t) = cfg.node_type(&i.node_type) else { continue };
        if n.allocated.is_zero() || sized(&t.name) || skip.contains(n.node_id.as_str()) {
            continue;
        }
        let members = n.workloads.max(1);
        candidates.push(Candidate {
            row: n,
            node_type: t.name.as_str(),
            cost: t.cost.unwrap_or(1.0),
            members,
            share: share(&shape(&n.allocated, &mut names), members as u64),
        });
    }
    let above_min = |c: &&Candidate| {
        cfg.node_type(c.node_type).is_some_and(|t| live.get(c.node_type).copied().unwrap_or(0) > t.min)
    };
    // Most saved per member moved first; then fewer members, then by id (stable).
    candidates.sort_by(|a, b| {
        (b.cost / b.members as f64)
            .total_cmp(&(a.cost / a.members as f64))
            .then(a.members.cmp(&b.members))
            .then(a.row.node_id.cmp(&b.row.node_id))
    });
    let limits = Limits::of(obs);
    for c in candidates.iter().filter(above_min).take(MAX_TRIED) {
        // A unit stays in its domain (rebalance weighs the domain before `spare`).
        let others = || room.iter().filter(|(id, d, _)| *id != c.row.node_id.as_str() && *d == domain(c.row));
        let mut free: Vec<Shape> = others().map(|(_, _, f)| f.clone()).collect();
        if limits.room_for(c.row.node_id.as_str(), others().map(|(id, _, _)| *id))
            && fits(&c.share, c.members, &mut free)
        {
            return Some(Consolidation {
                nodes: vec![c.row.node_id.to_string()],
                launch: None,
                saving_per_hour: c.cost,
                members: c.members,
                explanation: format!(
                    "consolidate {} ({}): its {} member(s) fit on the other nodes; saves {:.3}/h",
                    c.row.node_id, c.node_type, c.members, c.cost
                ),
            });
        }
    }
    replace(cfg, obs, &candidates, &live, &limits, &mut names)
}

/// The apps' `max_units_per_node`: a unit moves only to a node holding fewer of its
/// app's units than that (soft spread is not known here; a unit it keeps in place ends
/// the consolidation at its deadline).
struct Limits<'a>(Vec<(u32, &'a std::collections::BTreeMap<String, u32>)>);

impl<'a> Limits<'a> {
    fn of(obs: &Observation<'a>) -> Self {
        Limits(
            obs.apps
                .iter()
                .filter_map(|a| Some((a.unit_shape.max_units_per_node?, &a.unit_shape.units_per_node)))
                .collect(),
        )
    }

    fn on(held: &std::collections::BTreeMap<String, u32>, node: &str) -> u32 {
        held.get(node).copied().unwrap_or(0)
    }

    /// Whether the units on `node` of every limited app have somewhere among `to`.
    fn room_for<'n>(&self, node: &str, to: impl Iterator<Item = &'n str> + Clone) -> bool {
        self.0.iter().all(|(max, held)| {
            let here = Self::on(held, node);
            here == 0 || to.clone().map(|n| max.saturating_sub(Self::on(held, n))).sum::<u32>() >= here
        })
    }

    /// Whether the units of every limited app on `nodes` fit on one new node.
    fn fit_on_one(&self, nodes: &[String]) -> bool {
        self.0.iter().all(|(max, held)| nodes.iter().map(|n| Self::on(held, n)).sum::<u32>() <= *max)
    }
}

/// Nodes of one type whose members fit on one new node of a type with the same
/// labels that costs less than they do together: the best saving per member moved.
fn replace(
    cfg: &PoolConfig,
    obs: &Observation,
    candidates: &[Candidate],
    live: &HashMap<&str, u32>,
    limits: &Limits,
    names: &mut ResourceNames,
) -> Option<Consolidation> {
    let total_live = obs.instances.len() as u32;
    if cfg.max_nodes.is_some_and(|m| total_live >= m) {
        return None;
    }
    let mut best: Option<Consolidation> = None;
    let sized = |t: &str| cfg.policy.as_ref().is_some_and(|p| p.types().any(|s| s == t));
    for into in &cfg.node_types {
        if sized(&into.name)
            || obs.unavailable.contains_key(&into.name)
            || live.get(into.name.as_str()).copied().unwrap_or(0) >= into.max
        {
            continue;
        }
        let cost_into = into.cost.unwrap_or(1.0);
        let capacity = shape(&into.resources, names);
        for from in cfg.node_types.iter().filter(|f| f.name != into.name && f.labels == into.labels) {
            let mut spare = live.get(from.name.as_str()).copied().unwrap_or(0).saturating_sub(from.min);
            // Smallest first: the most nodes in one.
            let mut of_type: Vec<&Candidate> = candidates.iter().filter(|c| c.node_type == from.name).collect();
            of_type.sort_by_key(|c| (c.row.allocated.cpu_millis, c.row.allocated.memory_bytes, &c.row.node_id));
            let mut free = vec![capacity.clone()];
            let (mut taken, mut members, mut cost) = (Vec::new(), 0, 0.0);
            for c in of_type {
                if spare == 0 {
                    break;
                }
                let mut trial = free.clone();
                taken.push(c.row.node_id.to_string());
                let apart = !limits.fit_on_one(&taken);
                taken.pop();
                if !apart && fits(&c.share, c.members, &mut trial) {
                    free = trial;
                    taken.push(c.row.node_id.to_string());
                    members += c.members;
                    cost += c.cost;
                    spare -= 1;
                }
            }
            let saving = cost - cost_into;
            if taken.is_empty() || saving <= 1e-9 {
                continue;
            }
            let better = best.as_ref().is_none_or(|b| saving / members as f64 > b.saving_per_hour / b.members as f64);
            if better {
                best = Some(Consolidation {
                    explanation: format!(
                        "replace {} ({} × {}, {cost:.3}/h) with one {} ({cost_into:.3}/h): their {members} member(s) \
                         fit on it; saves {saving:.3}/h",
                        taken.join(", "),
                        taken.len(),
                        from.name,
                        into.name
                    ),
                    nodes: taken,
                    launch: Some(into.name.clone()),
                    saving_per_hour: saving,
                    members,
                });
            }
        }
    }
    best
}

/// A node's failure domain, as the schedulers see it.
fn domain(n: &NodeRow) -> &str {
    n.labels.get("domain").unwrap_or(flotilla_core::DEFAULT_DOMAIN)
}

fn shape(r: &flotilla_core::Resources, names: &mut ResourceNames) -> Shape {
    // Every vector here was validated as a node capacity or an allocation of one.
    Shape::from_resources(r, names).unwrap_or_default()
}

/// One of `n` equal shares of `total`, rounded up.
fn share(total: &Shape, n: u64) -> Shape {
    Shape(total.0.iter().map(|q| q.div_ceil(n.max(1))).collect())
}

/// Whether `n` copies of `piece` fit in `free` (best fit: each on the node with the least
/// room that takes it), taking their room as it goes.
fn fits(piece: &Shape, n: usize, free: &mut [Shape]) -> bool {
    for _ in 0..n {
        let best = free.iter_mut().filter(|f| piece.fits_in(f)).min_by(|a, b| a.0.cmp(&b.0));
        match best {
            Some(f) => f.sub_times(piece, 1),
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests;
