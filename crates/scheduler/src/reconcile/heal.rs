//! Heal: a unit whose head is lost fails and is replaced; lost workers are replaced in
//! place, in the unit's domain. `crate::repair` decides; this carries it out.

use crate::catalogue as m;
use crate::nodes::Nodes;
use std::collections::HashMap;
use std::sync::Arc;

use flotilla_core::{NodeId, now_ms};
use flotilla_view::ShardSlot;

use super::ledgers::claims;
use super::{Scheduler, save};
use crate::lifecycle::UnitState;
use crate::planner::{MemberRequest, Placement, PlanInput, Unplaced, place_unit};
use crate::repair::{MemberHealth, Repair, decide, health_of};
use crate::store::{UnitRecord, Write};

impl Scheduler {
    /// Fails units whose head is lost and replaces lost workers in place. When many
    /// members vanish at once (a partition looks like a mass failure), only one unit is
    /// repaired per pass.
    pub(super) async fn heal(&mut self, slots: &Nodes, writes: &mut Vec<Write>) {
        let now = now_ms();
        let mut decisions = Vec::new();
        let mut placed = 0usize;
        for u in self.stored.units.values() {
            if !matches!(u.state, UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded)
            {
                self.tracking.unknown_since.remove(&u.unit_id);
                continue;
            }
            placed += 1;
            let health = health_of(u, slots, now);
            let unknown = health.contains(&MemberHealth::Unknown);
            let since = if unknown {
                *self.tracking.unknown_since.entry(u.unit_id.clone()).or_insert(now)
            } else {
                self.tracking.unknown_since.remove(&u.unit_id);
                now
            };
            match decide(u, &health, now.saturating_sub(since), self.tracking.unknown_grace_ms) {
                Repair::Nothing | Repair::Wait => {}
                r => decisions.push((u.unit_id.clone(), r)),
            }
        }
        let mass = placed >= 4 && decisions.len() * 2 > placed;
        metrics::gauge!(m::REPLACEMENTS_RATE_LIMITED.name, "app" => self.spec.name.clone()).set(if mass {
            1.0
        } else {
            0.0
        });
        if mass {
            tracing::warn!(app = %self.spec.name, failing = decisions.len(), units = placed, "many units failing at once: repairing one per pass");
            decisions.truncate(1);
        }
        for (id, r) in decisions {
            match r {
                Repair::FailUnit(why) => self.fail_unit(&id, why, writes).await,
                Repair::ReplaceWorkers(members) => self.replace_workers(&id, &members, slots, writes).await,
                Repair::Nothing | Repair::Wait => {}
            }
        }
        // Degraded units whose replacement could not be placed yet try again.
        let waiting: Vec<String> = self
            .stored
            .units
            .values()
            .filter(|u| u.state == UnitState::Degraded && u.members.iter().any(|m| m.node_id.is_none()))
            .map(|u| u.unit_id.clone())
            .collect();
        for id in waiting {
            self.place_missing(&id, slots).await;
            if let Some(u) = self.stored.units.get_shared(&id) {
                writes.push(Write::Unit(u.clone()));
            }
        }
        // Failed units whose release did not go through are retried.
        let failed: Vec<UnitRecord> =
            self.stored.units.values().filter(|u| u.state == UnitState::Failed).cloned().collect();
        for u in failed {
            if self.ledgers.release_unit(&u, &[]).await.is_ok()
                && let Some(mut u) = self.stored.units.get_mut(&u.unit_id)
            {
                u.state = UnitState::Terminated;
                writes.push(Write::Unit(u.shared()));
            }
        }
    }

    /// The unit's head is lost: it fails, what it holds is released and it ends; the
    /// next pass queues its replacement.
    async fn fail_unit(&mut self, id: &str, why: String, writes: &mut Vec<Write>) {
        tracing::warn!(unit = %id, %why, "unit failed; a replacement is queued");
        metrics::counter!(m::UNITS_FAILED.name, "app" => self.spec.name.clone()).increment(1);
        // Write ahead: a scheduler that dies after the release must find the unit Failed
        // (and retry the release), never Running with nothing held.
        let Some(mut u) = self.stored.units.get_mut(id) else { return };
        let unit = u.clone();
        if u.state.can_become(UnitState::Failed) {
            u.state = UnitState::Failed;
        }
        u.unplaced_reason = Some(why);
        if let Err(e) = save(&*self.store, &self.spec.name, &[Write::Unit(u.shared())]) {
            tracing::warn!(unit = %id, error = %e, "cannot record the failure; will retry");
            // Kept with the pass's writes, so it is written once the store is back.
            writes.push(Write::Unit(u.shared()));
            return;
        }
        drop(u);
        // Failed units whose release does not go through are retried by `heal`.
        if let Err(e) = self.ledgers.release_unit(&unit, &[]).await {
            tracing::warn!(unit = %id, error = %e, "releasing a failed unit; will retry");
        } else if let Some(mut u) = self.stored.units.get_mut(id) {
            u.state = UnitState::Terminated;
            writes.push(Write::Unit(u.shared()));
        }
    }

    /// Workers of the unit are lost: the unit is Degraded and they are placed again in
    /// its domain, keeping the unit's id and routes.
    async fn replace_workers(
        &mut self,
        id: &str,
        members: &[String],
        slots: &[Arc<ShardSlot>],
        writes: &mut Vec<Write>,
    ) {
        tracing::warn!(unit = %id, ?members, "workers lost; replacing them in the unit's domain");
        // Write ahead, as for a failed unit: once the workers are forgotten in the store,
        // whatever the release leaves behind is an orphan the sweep releases.
        let Some(mut u) = self.stored.units.get_mut(id) else { return };
        let unit = u.clone();
        if u.state != UnitState::Degraded && u.state.can_become(UnitState::Degraded) {
            u.state = UnitState::Degraded;
        }
        for m in u.members.iter_mut().filter(|m| members.contains(&m.member)) {
            m.node_id = None;
            m.shard = None;
            m.state = None;
            m.address = None;
        }
        if let Err(e) = save(&*self.store, &self.spec.name, &[Write::Unit(u.shared())]) {
            tracing::warn!(unit = %id, error = %e, "cannot record the lost workers; will retry");
            // Kept with the pass's writes, so it is written once the store is back.
            writes.push(Write::Unit(u.shared()));
            return;
        }
        drop(u);
        if let Err(e) = self.ledgers.release_unit(&unit, members).await {
            tracing::warn!(unit = %id, error = %e, "releasing lost workers; the orphan sweep retries");
        }
        self.place_missing(id, slots).await;
        if let Some(u) = self.stored.units.get_shared(id) {
            writes.push(Write::Unit(u.clone()));
        }
    }

    /// Places the members of a unit that have no node, in the unit's domain.
    async fn place_missing(&mut self, id: &str, slots: &[Arc<ShardSlot>]) {
        let Some(unit) = self.stored.units.get(id).cloned() else { return };
        let missing: Vec<MemberRequest> = self
            .spec
            .members()
            .iter()
            .filter(|(member, _, _)| unit.members.iter().any(|m| &m.member == member && m.node_id.is_none()))
            .map(|(member, _, t)| super::planning::member_again(&self.spec, &unit, member, t))
            .collect();
        if missing.is_empty() {
            return;
        }
        let p = match self.plan_members(&unit, &missing, 0, slots) {
            Ok(p) => p,
            Err(why) => {
                if let Some(mut u) = self.stored.units.get_mut(id) {
                    u.unplaced_reason = Some(format!("replacement: {why}"));
                }
                return;
            }
        };
        // A key of its own for the replacement: the lost member's key stays with the
        // lost member (its dead node may still list it, and the orphan sweep releases
        // that key), so releasing it never stops the replacement.
        let Some(generations) = self.fresh_generations(id, &p) else { return };
        let claims = claims(
            &self.spec,
            id,
            &|m| generations.get(m).copied().unwrap_or_else(|| unit.generation_of(m)),
            unit.secondary,
            &p,
        );
        let txn_id = self.ledgers.txn_id(&format!("{id}-replace"));
        let Ok(resp) = self.ledgers.commit(p.shard, txn_id, claims).await else { return };
        let Some(mut u) = self.stored.units.get_mut(id) else { return };
        if !resp.results.iter().all(|r| r.accepted) {
            u.unplaced_reason = Some("replacement commit rejected; retrying".into());
            return;
        }
        for pm in &p.members {
            if let Some(m) = u.members.iter_mut().find(|m| m.member == pm.member) {
                m.node_id = Some(pm.node.to_string());
                m.incarnation = pm.incarnation;
                m.shard = Some(p.shard as u32);
                m.generation = generations.get(&pm.member).copied().or(m.generation);
                m.alternative = pm.alternative;
                // It runs its group's template in force now.
                m.template = self.fingerprints.roles.get(&m.role).cloned();
            }
        }
        u.unplaced_reason = None;
        super::planning::count_placed(&self.spec, &p);
        tracing::info!(unit = %id, "replacement members allocated");
    }

    /// Plans `missing` members of a placed unit in its domain, keeping the node spread
    /// (other units' nodes counted, the unit's own nodes known for `spread.members`);
    /// `surge` is how far past `max_units_per_node` it may go (the members leaving).
    pub(super) fn plan_members(
        &mut self,
        unit: &UnitRecord,
        missing: &[MemberRequest],
        surge: u32,
        slots: &[Arc<ShardSlot>],
    ) -> Result<Placement, Unplaced> {
        let pending = crate::planner::NodeMap::default();
        let per_domain = HashMap::new();
        let per_node = self.units_per_node(Some(&unit.unit_id));
        let held: Vec<NodeId> = unit
            .members
            .iter()
            .filter(|m| !missing.iter().any(|r| r.member == m.member))
            .filter_map(|m| NodeId::new(m.node_id.as_deref()?).ok())
            .collect();
        let input = PlanInput {
            only_domain: unit.domain.as_deref(),
            max_units_per_node: self.spec.spread.max_units_per_node,
            prefer_spread: self.spec.spread.spreads_over_nodes(self.spec.serves()),
            members: self.spec.spread.members,
            unit_nodes: &held,
            surge,
            ..PlanInput::new(slots, &per_domain, &per_node, &pending)
        };
        let (classes, rng) = self.planning.planner(unit.secondary);
        place_unit(&input, missing, classes, rng)
    }
}
