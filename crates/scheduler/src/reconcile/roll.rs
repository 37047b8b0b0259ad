//! Roll: units on leaving nodes or with a stale template are replaced make before
//! break. `crate::rollout` decides; this carries it out, keeps the app's rollout record
//! and the last spec that ran, and reverts a failed rollout when the spec says so.

use crate::catalogue as m;
use crate::nodes::Nodes;
use std::sync::Arc;

use flotilla_core::now_ms;
use flotilla_view::ShardSlot;

use super::{Scheduler, save};
use crate::lifecycle::UnitState;
use crate::planner::MemberRequest;
use crate::rollout::Target;
use crate::spec::{AppSpec, SpecOrigin};
use crate::store::{UnitRecord, Write};

/// How a note on a unit a drain waits for starts (`units APP`, the node's drain status).
pub const DRAIN_WAITS: &str = "drain waits:";
/// How a note on a unit whose replacement cannot be placed starts.
pub const WAITS_FOR: &str = "waits for its replacement";
/// How a note on a unit whose members roll alone (a group's template changed) starts
/// when one cannot be placed or is released.
pub const ROLLOUT_WAITS: &str = "rollout waits:";

impl Scheduler {
    /// Replacements first; the old unit drains once its replacement is Running.
    pub(super) async fn roll(&mut self, slots: &Nodes, writes: &mut Vec<Write>) {
        let now = now_ms();
        let target = Target {
            fingerprint: &self.fingerprints.template,
            frame: &self.fingerprints.frame,
            roles: &self.fingerprints.roles,
            desired: self.desired(),
            max_unavailable: self.spec.rollout.max_unavailable,
            progress_deadline_ms: self.spec.rollout.progress_deadline.as_ms(),
            now_ms: now,
            halted: self.stored.rollout.as_ref().is_some_and(|r| r.halts(&self.fingerprints.template)),
            hold: self.canary_hold(),
        };
        let plan = crate::rollout::plan(&self.stored.units, slots, &target);
        for (id, why) in &plan.release {
            self.release_replacement(id, why, slots, writes).await;
        }
        for id in &plan.drain {
            if let Some(mut u) = self.stored.units.get_mut(id)
                && let Ok(to) = u.state.to(UnitState::Draining)
            {
                tracing::info!(unit = %id, replacement = ?u.replaced_by, "replacement running: draining the old unit");
                u.state = to;
                u.draining_since_unix_ms = Some(now);
                writes.push(Write::Unit(u.shared()));
            }
        }
        for id in &plan.orphaned {
            if let Some(mut u) = self.stored.units.get_mut(id) {
                tracing::warn!(unit = %id, replacement = ?u.replaced_by, "the replacement is gone; the unit stays");
                u.replaced_by = None;
                u.moving = None;
                writes.push(Write::Unit(u.shared()));
            }
        }
        for (id, why) in plan.replace {
            let secondary = self.stored.units.get(&id).is_some_and(|u| u.secondary);
            let new = self.queue_unit(secondary, writes);
            if let Some(mut u) = self.stored.units.get_mut(&id) {
                tracing::info!(unit = %id, replacement = %new, %why, "replacing the unit, make before break");
                metrics::counter!(m::UNITS_REPLACED.name, "app" => self.spec.name.clone(), "why" => why).increment(1);
                u.replaced_by = Some(new);
                writes.push(Write::Unit(u.shared()));
            }
        }
        for (id, member, why) in &plan.release_surge {
            tracing::warn!(unit = %id, %member, %why, "releasing a member coming up");
            self.release_surge(
                id,
                std::slice::from_ref(member),
                format!("{ROLLOUT_WAITS} {member} released: {why}"),
                writes,
            )
            .await;
        }
        for id in &plan.adopt {
            if let Some(mut u) = self.stored.units.get_mut(id) {
                tracing::info!(unit = %id, "every member runs the spec's templates: the unit is rolled");
                u.template = Some(self.fingerprints.template.clone());
                u.roll_waits = None;
                if u.placement_note.as_deref().is_some_and(|n| n.starts_with(ROLLOUT_WAITS)) {
                    u.placement_note = None;
                }
                writes.push(Write::Unit(u.shared()));
            }
        }
        self.drop_lost_surge(slots, writes).await;
        for (id, members, why) in plan.replace_members {
            self.surge_members(&id, &members, &why, DRAIN_WAITS, slots, writes).await;
        }
        for (id, members) in plan.roll_members {
            metrics::counter!(m::MEMBERS_ROLLED.name, "app" => self.spec.name.clone()).increment(members.len() as u64);
            self.surge_members(&id, &members, "its group's template changed", ROLLOUT_WAITS, slots, writes).await;
        }
        self.note_waiting_drains(slots, writes);
        // A canary goes back whatever failed it (its analysis, or a replacement that never
        // ran): its held old units must not drain beside new ones nobody judged.
        let forced = plan.failed.is_some() && self.canary_hold().is_some();
        let canary_failed = self.follow_canary(now, writes);
        let forced = forced || canary_failed.is_some();
        self.follow_rollout(plan.failed.or(canary_failed), forced, now, writes);
    }

    /// Workers of unit `id` on leaving nodes, or of groups whose template changed: each
    /// gets a replacement in the unit's domain under a fresh generation (so its claim
    /// never collides with the old one's), recorded in the unit's surge. The old worker
    /// runs on until the new one does. The node spread may be passed by the members
    /// leaving (the note says so); a note on what waits starts with `waits`.
    async fn surge_members(
        &mut self,
        id: &str,
        members: &[String],
        why: &str,
        waits: &str,
        slots: &[Arc<ShardSlot>],
        writes: &mut Vec<Write>,
    ) {
        let Some(unit) = self.stored.units.get(id).cloned() else { return };
        let requests: Vec<MemberRequest> = self
            .spec
            .members()
            .iter()
            .filter(|(member, _, _)| members.contains(member))
            .map(|(member, _, t)| super::planning::member_again(&self.spec, &unit, member, t))
            .collect();
        if requests.is_empty() {
            return;
        }
        let placed = self.plan_members(&unit, &requests, requests.len() as u32, slots);
        let p = match placed {
            Ok(p) => p,
            Err(e) => {
                let note = format!("{waits} {} cannot move ({why}): {e}", members.join(", "));
                if waits == ROLLOUT_WAITS
                    && let Some(mut u) = self
                        .stored
                        .units
                        .get_mut_if(id, |u| u.roll_waits.as_ref().is_none_or(|(t, _)| *t != self.fingerprints.template))
                {
                    u.roll_waits = Some((self.fingerprints.template.clone(), now_ms()));
                    writes.push(Write::Unit(u.shared()));
                }
                self.set_note(id, note, writes);
                return;
            }
        };
        let Some(generations) = self.fresh_generations(id, &p) else { return };
        let claims = super::ledgers::claims(
            &self.spec,
            id,
            &|m| generations.get(m).copied().unwrap_or(unit.generation),
            unit.secondary,
            &p,
        );
        let txn_id = self.ledgers.txn_id(&format!("{id}-surge"));
        let verdict = self.ledgers.commit(p.shard, txn_id, claims).await;
        let accepted = match &verdict {
            Ok(resp) => resp.results.iter().all(|r| r.accepted),
            Err(_) => false,
        };
        if !accepted {
            let detail = match verdict {
                Ok(resp) => resp.results.iter().find(|r| !r.accepted).map(|r| r.detail.clone()).unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            tracing::info!(unit = %id, %detail, "moving workers off a leaving node: commit refused; retrying");
            self.set_note(
                id,
                format!("{waits} moving {} was refused ({detail}); retrying", members.join(", ")),
                writes,
            );
            return;
        }
        super::planning::count_placed(&self.spec, &p);
        let records = super::ledgers::member_records(&self.spec, &self.fingerprints.roles, &p, p.shard);
        let Some(mut u) = self.stored.units.get_mut(id) else { return };
        let mut moves = Vec::new();
        for mut r in records {
            let from = u.members.iter().find(|m| m.member == r.member).and_then(|m| m.node_id.clone());
            moves.push(format!(
                "{} moving {} → {}",
                r.member,
                from.as_deref().unwrap_or("-"),
                r.node_id.as_deref().unwrap_or("-")
            ));
            r.generation = generations.get(&r.member).copied();
            r.surged_unix_ms = Some(now_ms());
            u.surge.push(r);
        }
        u.roll_waits = None;
        let mut note = format!("{} ({why}), make before break", moves.join(", "));
        if let Some(n) = p.note {
            note.push_str(&format!("; {n}"));
        }
        tracing::info!(unit = %id, %note, "replacing workers alone");
        metrics::counter!(m::UNITS_REPLACED.name, "app" => self.spec.name.clone(), "why" => "worker on a leaving node")
            .increment(1);
        u.placement_note = Some(note);
        writes.push(Write::Unit(u.shared()));
    }

    /// A member coming up to replace one whose node was lost (or, moving off a leaving
    /// node, whose workload failed) leaves the surge and is released; the next pass
    /// places another. A rollout's member whose workload fails stays until the progress
    /// deadline fails the rollout (placing another would restart its clock for ever).
    /// Written first, so a release that fails leaves an orphan the sweep releases.
    async fn drop_lost_surge(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let now = now_ms();
        let template = self.fingerprints.template.clone();
        let lost: Vec<(String, Vec<String>, String)> = self
            .stored
            .units
            .values()
            .filter(|u| u.state.is_active())
            .filter_map(|u| {
                let mut why = String::new();
                let moving = u.template.as_deref() == Some(template.as_str());
                let members: Vec<String> = u
                    .surge
                    .iter()
                    .filter(|m| {
                        let w = match crate::repair::member_health(m, slots, now) {
                            crate::repair::MemberHealth::Lost(w) => w,
                            _ if moving && m.state.as_deref() == Some("failed") => "it failed",
                            _ => return false,
                        };
                        why = format!("{} on {}: {w}", m.member, m.node_id.as_deref().unwrap_or("-"));
                        true
                    })
                    .map(|m| m.member.clone())
                    .collect();
                (!members.is_empty()).then(|| (u.unit_id.clone(), members, why))
            })
            .collect();
        for (id, members, why) in lost {
            tracing::warn!(unit = %id, %why, "a member coming up to replace one was lost; placing another");
            self.release_surge(&id, &members, format!("{DRAIN_WAITS} the replacement {why}; placing another"), writes)
                .await;
        }
    }

    /// Takes `members` out of unit `id`'s surge and releases them, the unit written
    /// first (a release that fails leaves an orphan the sweep releases), with `note`.
    async fn release_surge(&mut self, id: &str, members: &[String], note: String, writes: &mut Vec<Write>) {
        let Some(mut u) = self.stored.units.get_mut(id) else { return };
        let dropped: Vec<_> = u.surge.iter().filter(|m| members.contains(&m.member)).cloned().collect();
        if dropped.is_empty() {
            return;
        }
        u.surge.retain(|m| !members.contains(&m.member));
        u.placement_note = Some(note);
        if let Err(e) = save(&*self.store, &self.spec.name, &[Write::Unit(u.shared())]) {
            tracing::warn!(unit = %id, error = %e, "cannot record the surge member's end; the sweep releases it");
        }
        writes.push(Write::Unit(u.shared()));
        let gone = UnitRecord { members: dropped, surge: Vec::new(), ..u.clone() };
        if let Err(e) = self.ledgers.release_unit(&gone, &[]).await {
            tracing::warn!(unit = %id, error = %e, "releasing a surge member; the orphan sweep retries");
        }
    }

    /// Surge members that run take their member's place; the member they replace is
    /// released after the unit is written (write ahead: if the release fails, the old
    /// member belongs to no unit and the orphan sweep releases it).
    pub(super) async fn swap_surge(&mut self, writes: &mut Vec<Write>) {
        let ready: Vec<(String, Vec<String>)> = self
            .stored
            .units
            .values()
            .filter(|u| u.state.is_active())
            .map(|u| (u.unit_id.clone(), crate::rollout::surge_ready(u)))
            .filter(|(_, r)| !r.is_empty())
            .collect();
        for (id, members) in ready {
            let Some(mut u) = self.stored.units.get_mut(&id) else { continue };
            let old = u.clone();
            let mut moved = Vec::new();
            for name in &members {
                let Some(i) = u.surge.iter().position(|m| &m.member == name) else { continue };
                let new = u.surge.remove(i);
                if let Some(slot) = u.members.iter_mut().find(|m| &m.member == name) {
                    moved.push(format!(
                        "{name} moved {} → {}",
                        slot.node_id.as_deref().unwrap_or("-"),
                        new.node_id.as_deref().unwrap_or("-")
                    ));
                    *slot = new;
                }
            }
            let note = format!("{}, make before break", moved.join(", "));
            tracing::info!(unit = %id, %note, "replacement workers run: releasing the old ones");
            u.placement_note = Some(note);
            if let Err(e) = save(&*self.store, &self.spec.name, &[Write::Unit(u.shared())]) {
                tracing::warn!(unit = %id, error = %e, "cannot record the swap; will retry");
                *u = old;
                continue;
            }
            // Last in the pass's batch too, after any earlier write of the unit.
            writes.push(Write::Unit(u.shared()));
            let old_members = UnitRecord { surge: Vec::new(), ..old };
            if let Err(e) = self.ledgers.release_unit(&old_members, &members).await {
                tracing::warn!(unit = %id, error = %e, "releasing moved workers; the orphan sweep retries");
            }
        }
    }

    /// A unit whose replacement cannot be placed says so (a drain of its node, or a
    /// rollout, waits on it), so `units APP` and the node's drain status show why.
    /// A note that no longer holds (the replacement was placed, the node uncordoned) is
    /// cleared.
    fn note_waiting_drains(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let notes: Vec<(String, Option<String>)> = self
            .stored
            .units
            .values()
            .filter(|u| u.state.is_active())
            .filter_map(|u| {
                let waiting = u.replaced_by.as_deref().and_then(|r| self.stored.units.get(r)).and_then(|r| {
                    let reason = r.unplaced_reason.as_deref().filter(|_| r.state == UnitState::Queued)?;
                    Some(format!("{WAITS_FOR} {}: {reason}", r.unit_id))
                });
                let stale = u.placement_note.as_deref().is_some_and(|n| {
                    n.starts_with(WAITS_FOR)
                        || (n.starts_with(DRAIN_WAITS) && crate::rollout::members_leaving(u, slots).is_none())
                });
                match waiting {
                    Some(w) => Some((u.unit_id.clone(), Some(w))),
                    None if stale => Some((u.unit_id.clone(), None)),
                    None => None,
                }
            })
            .collect();
        for (id, note) in notes {
            match note {
                Some(n) => self.set_note(&id, n, writes),
                None => {
                    if let Some(mut u) = self.stored.units.get_mut(&id) {
                        u.placement_note = None;
                        writes.push(Write::Unit(u.shared()));
                    }
                }
            }
        }
    }

    fn set_note(&mut self, id: &str, note: String, writes: &mut Vec<Write>) {
        if let Some(mut u) = self.stored.units.get_mut_if(id, |u| u.placement_note.as_deref() != Some(note.as_str())) {
            tracing::info!(unit = %id, %note, "unit");
            u.placement_note = Some(note);
            writes.push(Write::Unit(u.shared()));
        }
    }

    /// A replacement that is not wanted any more (superseded, not needed, or past the
    /// progress deadline): it ends, with why, and what it holds is released (members
    /// stopped). A release that does not go through leaves it Failed, retried by `heal`.
    async fn release_replacement(&mut self, id: &str, why: &str, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let Some(mut u) = self.stored.units.get_mut(id) else { return };
        let why = with_agent_messages(why, &u, slots);
        tracing::warn!(unit = %id, %why, "releasing a replacement");
        u.unplaced_reason = Some(why);
        if u.state == UnitState::Queued {
            u.state = UnitState::Terminated;
            writes.push(Write::Unit(u.shared()));
            return;
        }
        let unit = u.clone();
        if u.state.can_become(UnitState::Failed) {
            u.state = UnitState::Failed;
        }
        // Write ahead, as `fail_unit` does: a scheduler that dies after the release finds
        // the unit Failed and retries the release.
        if let Err(e) = save(&*self.store, &self.spec.name, &[Write::Unit(u.shared())]) {
            tracing::warn!(unit = %id, error = %e, "cannot record the release; will retry");
            return;
        }
        drop(u);
        if let Err(e) = self.ledgers.release_unit(&unit, &[]).await {
            tracing::warn!(unit = %id, error = %e, "releasing a replacement; will retry");
        } else if let Some(mut u) = self.stored.units.get_mut(id) {
            u.state = UnitState::Terminated;
            writes.push(Write::Unit(u.shared()));
        }
    }

    /// Moves the rollout record along (failed, or complete once every unit runs the
    /// template), keeps the last spec that ran, and reverts a failed rollout when the
    /// spec has `auto_revert` or `revert` says so (a canary that failed).
    pub(super) fn follow_rollout(&mut self, failed: Option<String>, revert: bool, now: u64, writes: &mut Vec<Write>) {
        let settled = crate::rollout::settled(&self.stored.units, &self.fingerprints.template);
        if let Some(next) = self
            .stored
            .rollout
            .as_ref()
            .and_then(|r| r.advance(&self.fingerprints.template, failed.as_deref(), settled, now))
        {
            tracing::info!(app = %self.spec.name, state = ?next.state, reason = ?next.reason, "rollout");
            if failed.is_some() {
                metrics::counter!(m::ROLLOUTS_FAILED.name, "app" => self.spec.name.clone()).increment(1);
            }
            writes.push(Write::Rollout(next.clone()));
            self.stored.rollout = Some(next);
        }
        if settled && self.stored.good_spec.as_deref() != Some(&*self.spec_text) {
            self.stored.good_spec = Some(self.spec_text.to_string());
            writes.push(Write::GoodSpec(self.spec_text.to_string()));
        }
        let Some(why) = failed.filter(|_| self.spec.rollout.auto_revert || revert) else { return };
        let good = self.stored.good_spec.clone().or_else(|| self.stored.previous_spec.clone());
        let Some(text) = good.filter(|t| **t != *self.spec_text) else {
            tracing::warn!(app = %self.spec.name, "auto_revert: no other spec ran; staying");
            return;
        };
        let spec = match AppSpec::parse(&text) {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(app = %self.spec.name, error = %e, "auto_revert: the last good spec no longer parses");
                return;
            }
        };
        // The pass's writes so far go first, so the revert's land after them.
        self.wrote = true;
        if let Err(e) = save(&*self.store, &self.spec.name, &std::mem::take(writes)) {
            tracing::warn!(app = %self.spec.name, error = %e, "auto_revert: cannot record the pass; will retry");
            return;
        }
        let origin = SpecOrigin { reason: Some(why), ..SpecOrigin::new("revert", now) };
        match self.apply_from(spec, origin, None) {
            Ok(applied) => {
                let result = applied.result;
                metrics::counter!(m::ROLLOUTS_REVERTED.name, "app" => self.spec.name.clone()).increment(1);
                tracing::warn!(app = %self.spec.name, %result, "rollout failed: reverted to the last spec that ran");
            }
            Err(e) => tracing::warn!(app = %self.spec.name, error = %e, "auto_revert failed"),
        }
    }
}

/// `why`, with what the agents said of the unit's members that did not run (the tail of
/// their stderr), so `units APP` shows the cause.
fn with_agent_messages(why: &str, u: &crate::store::UnitRecord, slots: &[Arc<ShardSlot>]) -> String {
    let mut out = why.to_string();
    for m in &u.members {
        let said = m.node_id.as_deref().zip(m.shard).and_then(|(node, shard)| {
            let rec = slots.get(shard as usize)?.view.get(node)?.clone();
            rec.workloads
                .iter()
                .find(|w| w.unit == u.unit_id && w.member == m.member && w.generation == m.key_generation(u.generation))
                .map(|w| w.message.trim().to_string())
                .filter(|s| !s.is_empty())
        });
        if let Some(said) = said {
            let said: String = said.chars().rev().take(200).collect::<Vec<_>>().into_iter().rev().collect();
            out.push_str(&format!("; {}: {said}", m.member));
        }
    }
    out
}
