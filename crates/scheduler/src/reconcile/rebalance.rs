//! Rebalance: every few seconds the units [`crate::rebalance`] finds a better place for
//! are planned as their replacement will be; a unit whose planned place scores strictly
//! better gets a replacement (make before break, through the rollout's path: the old
//! unit drains once the new one runs). What would move is published either way, for
//! `flotilla rebalance APP --plan`; each move is a decision record.

use std::sync::Arc;

use flotilla_core::{LockExt, now_ms};
use flotilla_view::{NodeRecord, ShardSlot};
use serde::Serialize;

use super::Scheduler;
use crate::catalogue as m;
use crate::planner::{PlanInput, place_unit};
use crate::rebalance::{Budget, Counts, Fit, candidates, fit_at, improves};
use crate::spec::Switch;
use crate::store::Write;

/// How often the app is looked at: moving is never urgent, and planning every
/// candidate costs a placement each.
const EVERY_MS: u64 = 5_000;

/// Candidates planned per look, worst first.
const MAX_PLANNED: usize = 16;

/// What a look found: the moves that would help, and whether they start.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RebalancePlan {
    pub app: String,
    /// `disruption.rebalance`: `on` or `off`.
    pub rebalance: Switch,
    pub evaluated_unix_ms: u64,
    /// Why nothing may move now (the `[disruption]` budget), when so.
    pub waiting: Option<String>,
    pub moves: Vec<Move>,
}

/// One unit and the better place the planner found for it.
#[derive(Debug, Clone, Serialize)]
pub struct Move {
    pub unit: String,
    pub why: String,
    pub from_domain: Option<String>,
    pub from_nodes: Vec<String>,
    pub to_domain: String,
    pub to_nodes: Vec<String>,
    pub before: Fit,
    pub after: Fit,
    /// Started by this look (within the budget), or only possible.
    pub started: bool,
}

/// Counts unit `u` in `domain` on `nodes` instead of where it is.
fn shift(
    per_domain: &mut std::collections::HashMap<String, u32>,
    per_node: &mut crate::planner::NodeMap<u32>,
    u: &crate::store::UnitRecord,
    domain: &str,
    nodes: &[flotilla_core::NodeId],
) {
    if let Some(n) = u.domain.as_ref().and_then(|d| per_domain.get_mut(d)) {
        *n = n.saturating_sub(1);
    }
    *per_domain.entry(domain.to_string()).or_default() += 1;
    let mut left: Vec<&str> = u.members.iter().filter_map(|m| m.node_id.as_deref()).collect();
    left.sort_unstable();
    left.dedup();
    for id in left.iter().filter_map(|n| flotilla_core::NodeId::new(n).ok()) {
        if let Some(n) = per_node.get_mut(&id) {
            *n = n.saturating_sub(1);
        }
    }
    let mut to = nodes.to_vec();
    to.sort_unstable();
    to.dedup();
    for id in to {
        *per_node.entry(id).or_default() += 1;
    }
}

/// When the app is looked at next.
#[derive(Debug, Default)]
pub(super) struct Rebalancing {
    next_ms: u64,
}

impl Rebalancing {
    pub(super) fn next_ms(&self) -> u64 {
        self.next_ms
    }
}

impl Scheduler {
    pub(super) fn rebalance(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let now = now_ms();
        if now < self.rebalancing.next_ms {
            return;
        }
        self.rebalancing.next_ms = super::due::next_beat(now, EVERY_MS, self.phase_ms);
        let (mut plan, room) = self.rebalance_plan(slots, now);
        let on = self.spec.disruption.rebalance == Switch::On;
        let room = if on && plan.waiting.is_none() { room } else { 0 };
        for mv in plan.moves.iter_mut().take(room) {
            mv.started = true;
            self.start_move(mv, now, writes);
        }
        *self.out.rebalance.lock_or_recover() = Arc::new(plan);
    }

    fn budget(&self, now: u64) -> Budget<'_> {
        let d = &self.spec.disruption;
        Budget {
            max_moving: d.max_moving,
            min_available: d.min_available_fraction(),
            quiet_ms: d.quiet_period.as_ms(),
            desired: self.desired(),
            now_ms: now,
            template: &self.fingerprints.template,
        }
    }

    /// The units that would move now, each planned as its replacement will be, and how
    /// many moves the budget leaves room for.
    fn rebalance_plan(&mut self, slots: &[Arc<ShardSlot>], now: u64) -> (RebalancePlan, usize) {
        let mut per_domain = self.units_per_domain();
        let mut per_node = self.units_per_node(None);
        let pending = self.planning.pending_by_node();
        let spreads = self.spec.spread.spreads_over_nodes(self.spec.serves());
        let counts = Counts { per_domain: &per_domain, per_node: &per_node, spreads };
        let found = candidates(&self.stored.units, slots, &counts, &self.budget(now));
        let mut leaving = self.stored.units.values().filter(|u| u.state.is_active() && u.replaced_by.is_some()).count();
        let mut moves = Vec::new();
        for c in found.candidates.iter().take(MAX_PLANNED) {
            let Some(u) = self.stored.units.get(&c.unit) else { continue };
            let input = PlanInput {
                surge: leaving as u32 + 1,
                prefer_domain: u.domain.as_deref(),
                ..self.spread_input(PlanInput::new(slots, &per_domain, &per_node, &pending))
            };
            let requests = super::planning::member_requests(&self.spec, u.secondary);
            let (classes, rng) = self.planning.planner(u.secondary);
            let Ok(p) = place_unit(&input, &requests, classes, rng) else { continue };
            let nodes: Vec<(&flotilla_core::NodeId, &NodeRecord)> = p
                .members
                .iter()
                .filter_map(|pm| slots.get(p.shard)?.view.get(&pm.node).map(|r| (&pm.node, r.as_ref())))
                .collect();
            let counts = Counts { per_domain: &per_domain, per_node: &per_node, spreads };
            let after = fit_at(u, &p.domain, &nodes, &counts, u.secondary);
            if !improves(c.before, after) {
                continue;
            }
            // The next candidate is planned as if this one had moved: two moves of one
            // look do not both go to the one emptier place.
            let planned: Vec<flotilla_core::NodeId> = nodes.iter().map(|(id, _)| (*id).clone()).collect();
            shift(&mut per_domain, &mut per_node, u, &p.domain, &planned);
            leaving += 1;
            moves.push(Move {
                unit: c.unit.clone(),
                why: c.why.clone(),
                from_domain: u.domain.clone(),
                from_nodes: u.members.iter().filter_map(|m| m.node_id.clone()).collect(),
                to_domain: p.domain.clone(),
                to_nodes: p.members.iter().map(|pm| pm.node.to_string()).collect(),
                before: c.before,
                after,
                started: false,
            });
        }
        let plan = RebalancePlan {
            app: self.spec.name.clone(),
            rebalance: self.spec.disruption.rebalance,
            evaluated_unix_ms: now,
            waiting: found.waiting,
            moves,
        };
        (plan, found.room as usize)
    }

    /// Queues the unit's replacement (placed by this pass, as a rollout's is) and
    /// records the decision.
    fn start_move(&mut self, mv: &Move, now: u64, writes: &mut Vec<Write>) {
        let Some(secondary) = self.stored.units.get(&mv.unit).map(|u| u.secondary) else { return };
        let new = self.queue_unit(secondary, writes);
        let Some(mut u) = self.stored.units.get_mut(&mv.unit) else { return };
        u.replaced_by = Some(new.clone());
        u.moving = Some(mv.why.clone());
        u.moved_unix_ms = Some(now);
        writes.push(Write::Unit(u.shared()));
        let reason = if mv.before.poor > mv.after.poor {
            "poor_node"
        } else if mv.before.domain > mv.after.domain {
            "domain"
        } else if mv.before.node > mv.after.node {
            "node"
        } else {
            "consolidate"
        };
        let explanation = format!(
            "rebalance: {} moves ({}), replaced by {new}: from [{}] to [{}] in {}; before {}, after {}",
            mv.unit,
            mv.why,
            mv.from_nodes.join(", "),
            mv.to_nodes.join(", "),
            mv.to_domain,
            mv.before,
            mv.after
        );
        tracing::info!(app = %self.spec.name, unit = %mv.unit, replacement = %new, %explanation, "rebalance move");
        metrics::counter!(m::REBALANCE_MOVES.name, "app" => self.spec.name.clone(), "reason" => reason).increment(1);
        let record = serde_json::json!({
            "kind": "rebalance",
            "policy": "rebalance",
            "action": "move",
            "at": now,
            "app": self.spec.name,
            "unit": mv.unit,
            "replacement": new,
            "reason": reason,
            "explanation": explanation,
            "before": mv.before,
            "after": mv.after,
            "from_nodes": mv.from_nodes,
            "to_nodes": mv.to_nodes,
            "to_domain": mv.to_domain,
        });
        self.autoscaler.record(record, writes);
    }
}
