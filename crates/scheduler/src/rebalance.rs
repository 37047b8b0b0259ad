//! Rebalance: placed units move (make before break) when the view now allows a better
//! place than the one they got. Placement only ever chooses once: units placed on the
//! two nodes there were stay there when four more join, and the units a failover sent to
//! one domain stay there once the other recovers (Nomad #1635, Karmada's missing return).
//!
//! A unit's place is scored as a tuple, lower is better, compared in order:
//! 1. `poor`: its members on nodes it would rather not use (low-priority nodes for a
//!    unit of the primary group; sub-healthy nodes);
//! 2. `domain`: other units of the app in its domain (the planner balances domains);
//! 3. `node`: other units of the app on its most crowded node (when the app spreads
//!    over nodes: `Spread::spreads_over_nodes`);
//! 4. `spare`: its members on nodes the pool means to let go: twice each on a pool node
//!    the pool cordoned to empty it (`flotilla_pool::consolidate` picks it, knowing
//!    costs and what fits where), once each on a node of a type the pool keeps no `min`
//!    of (`flotilla.io/pool-keeps=false`). Moved, they leave the node idle and the pool
//!    terminates it (consolidation, as Karpenter's; within the `[disruption]` budget
//!    like every move, and never at the cost of spread). So a cordoned pool node's
//!    members move off it gently: an operator's cordon of one means it is going.
//!
//! [`candidates`] finds, from counts alone, the units some place could score better
//! for; the reconcile step plans each with the planner, as its replacement would be
//! planned, and moves it only if that placement scores strictly better ([`improves`]).
//! So a balanced app never moves (no churn). The replacement is then placed by the
//! placement pass, with the same preferences (so, usually, where it was planned). The
//! `[disruption]` budget bounds what moves: at most `max_moving` in flight, nothing
//! while fewer than `min_available` run, nothing placed within `quiet_period`.

use std::collections::HashMap;
use std::sync::Arc;

use flotilla_core::NodeId;
use flotilla_core::unit_shape::{LOW_PRIORITY, POOL_COST, POOL_KEEPS};
use flotilla_view::{NodeRecord, ShardSlot};
use serde::Serialize;

use crate::lifecycle::UnitState;
use crate::planner::NodeMap;
use crate::rollout::progressing;
use crate::store::{UnitRecord, Units};

/// A node scoring below this health is sub-healthy: routing sends it little, and a
/// unit there is better elsewhere.
pub const SUBHEALTHY: f32 = 0.5;

/// A place's score; lower is better (see the module's doc).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Fit {
    pub poor: u32,
    pub domain: u32,
    pub node: u32,
    pub spare: u32,
}

impl std::fmt::Display for Fit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} on poor nodes, {} others in its domain, {} on its node, {} on nodes the pool need not keep (twice on one it empties)",
            self.poor, self.domain, self.node, self.spare
        )
    }
}

/// Does moving from `before` to `after` help? Strictly better, or it is churn.
pub fn improves(before: Fit, after: Fit) -> bool {
    after < before
}

/// The budget a pass may spend (`[disruption]`), and what it may move.
#[derive(Debug, Clone, Copy)]
pub struct Budget<'a> {
    pub max_moving: u32,
    /// Fraction of the desired units that must run.
    pub min_available: f64,
    pub quiet_ms: u64,
    pub desired: u32,
    pub now_ms: u64,
    /// The template fingerprint in force: a unit of another one is the rollout's to
    /// replace (or, after a failed rollout, stays where it is: a move would put it on
    /// the failing template).
    pub template: &'a str,
}

/// A unit worth planning a move for, worst first.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub unit: String,
    pub before: Fit,
    pub why: String,
}

/// What [`candidates`] found: units to try, how many may move now, and why none may.
#[derive(Debug, Default, PartialEq)]
pub struct Found {
    pub candidates: Vec<Candidate>,
    /// Moves this pass may start (the budget left).
    pub room: u32,
    /// Why nothing may move now, when so (the budget, not the placements).
    pub waiting: Option<String>,
}

/// The app's units per domain and per node, as the planner counts them (active units;
/// a unit counts once on each node any of its members runs on).
pub struct Counts<'a> {
    pub per_domain: &'a HashMap<String, u32>,
    pub per_node: &'a NodeMap<u32>,
    /// Whether the app spreads over nodes.
    pub spreads: bool,
}

/// Whether `r` is a node a unit would rather not be on (`secondary` units are meant for
/// low-priority nodes).
fn poor(r: &NodeRecord, secondary: bool) -> bool {
    (!secondary && r.labels.get(LOW_PRIORITY.0) == Some(LOW_PRIORITY.1)) || r.health_score() < SUBHEALTHY
}

/// How much a member on `r` weighs in `spare`: 2 on a pool node that is cordoned (the
/// pool is emptying it: `flotilla_pool::consolidate`), 1 on a node of a type the pool
/// keeps no `min` of (idle, it is terminated), else 0. A unit on a node being emptied
/// so moves even onto one of a type without a `min`.
fn spare(r: &NodeRecord) -> u32 {
    let (keeps, _) = r.labels.pool_preference();
    let pools = r.labels.get(POOL_COST).is_some() || r.labels.get(POOL_KEEPS).is_some();
    if pools && r.cordoned && !r.drain_requested { 2 } else { u32::from(!keeps) }
}

fn node_record<'a>(slots: &'a [Arc<ShardSlot>], shard: Option<u32>, node: &str) -> Option<&'a Arc<NodeRecord>> {
    slots.get(shard? as usize)?.view.get(node)
}

/// The score of unit `u` where it is, counting the others only.
pub fn fit_of(u: &UnitRecord, slots: &[Arc<ShardSlot>], counts: &Counts<'_>) -> Fit {
    let domain = u.domain.as_deref().and_then(|d| counts.per_domain.get(d)).copied().unwrap_or(1).saturating_sub(1);
    let mut fit = Fit { domain, ..Fit::default() };
    for m in &u.members {
        let Some(node) = m.node_id.as_deref() else { continue };
        if let Some(r) = node_record(slots, m.shard, node) {
            fit.poor += u32::from(poor(r, u.secondary));
            fit.spare += spare(r);
        }
        if counts.spreads {
            let here = counts.per_node.get(node).copied().unwrap_or(1);
            fit.node = fit.node.max(here.saturating_sub(1));
        }
    }
    fit
}

/// The score of a placement in `domain` on `nodes` for unit `u` (which leaves its own
/// place: it does not count against the new one).
pub fn fit_at(
    u: &UnitRecord,
    domain: &str,
    nodes: &[(&NodeId, &NodeRecord)],
    counts: &Counts<'_>,
    secondary: bool,
) -> Fit {
    let own = |n: &NodeId| u.members.iter().any(|m| m.node_id.as_deref() == Some(n.as_str()));
    let mut fit = Fit {
        domain: counts
            .per_domain
            .get(domain)
            .copied()
            .unwrap_or(0)
            .saturating_sub(u32::from(u.domain.as_deref() == Some(domain))),
        ..Fit::default()
    };
    for (id, r) in nodes {
        fit.poor += u32::from(poor(r, secondary));
        fit.spare += spare(r);
        if counts.spreads {
            let here = counts.per_node.get(*id).copied().unwrap_or(0);
            fit.node = fit.node.max(here.saturating_sub(u32::from(own(id))));
        }
    }
    fit
}

/// The units some place could score better for, worst first, and the budget left.
/// Counts only: the fewest units in any domain with nodes, and on any node (0 while a
/// node holds none of the app's units).
pub fn candidates(units: &Units, slots: &[Arc<ShardSlot>], counts: &Counts<'_>, b: &Budget<'_>) -> Found {
    let mut found = Found::default();
    let active = || units.values().filter(|u| u.state.is_active());
    let moving = units.values().filter(|u| u.replaced_by.is_some() && u.state.is_active()).count()
        + units.values().filter(|u| u.state == UnitState::Draining && u.moving.is_some()).count();
    found.room = b.max_moving.saturating_sub(moving as u32);
    let running = active().filter(|u| u.replaced_by.is_none() && progressing(u)).count();
    let needed = needed(b.desired, b.min_available);
    let settling = active().any(|u| matches!(u.state, UnitState::Queued | UnitState::Placing));
    found.waiting = if found.room == 0 {
        Some(format!("{moving} units moving, at disruption.max_moving {}", b.max_moving))
    } else if running < needed {
        Some(format!("{running} units running, below disruption.min_available ({needed} of {})", b.desired))
    } else if settling {
        Some("units are being placed".into())
    } else {
        None
    };
    let domains = slots.iter().flat_map(|s| s.domains.iter().map(|(d, nodes)| (d, nodes.len())));
    let (mut fewest_in_domain, mut nodes) = (u32::MAX, 0usize);
    for (d, n) in domains {
        nodes += n;
        if n > 0 {
            fewest_in_domain = fewest_in_domain.min(counts.per_domain.get(d).copied().unwrap_or(0));
        }
    }
    let fewest_on_node =
        if nodes > counts.per_node.len() { 0 } else { counts.per_node.values().copied().min().unwrap_or(0) };
    for u in active().filter(|u| u.replaced_by.is_none() && u.state == UnitState::Running && progressing(u)) {
        let before = fit_of(u, slots, counts);
        let why = if before.poor > 0 {
            format!("{} of its members on low-priority or sub-healthy nodes", before.poor)
        } else if before.domain > fewest_in_domain {
            format!("{} other units in its domain {}, {fewest_in_domain} in another", before.domain, domain_name(u))
        } else if counts.spreads && before.node > fewest_on_node {
            format!("{} other units on its node, {fewest_on_node} on another", before.node)
        } else if before.spare > 0 {
            format!("{} of its members on nodes the pool need not keep or is emptying (counted twice)", before.spare)
        } else {
            continue;
        };
        // Quiet since it was placed, and since its last move was tried (one abandoned
        // at the progress deadline is not tried again at once).
        let since = u.created_unix_ms.max(u.moved_unix_ms.unwrap_or(0));
        if b.now_ms.saturating_sub(since) < b.quiet_ms || u.template.as_deref().is_some_and(|t| t != b.template) {
            continue;
        }
        found.candidates.push(Candidate { unit: u.unit_id.clone(), before, why });
    }
    found.candidates.sort_by(|a, b| b.before.cmp(&a.before).then_with(|| a.unit.cmp(&b.unit)));
    found
}

/// How many of `desired` units must run for a move to start: `min_available` of them,
/// rounded up, less a hair first so 55 % of 100 is 55 (f64 makes it 55.000000000000007).
pub fn needed(desired: u32, min_available: f64) -> usize {
    (f64::from(desired) * min_available - 1e-9).ceil().max(0.0) as usize
}

fn domain_name(u: &UnitRecord) -> &str {
    u.domain.as_deref().unwrap_or("-")
}

#[cfg(test)]
mod tests;
