//! Roll: units on leaving nodes or with a stale template are replaced make before
//! break. `crate::rollout` decides; this carries it out, keeps the app's rollout record
//! and the last spec that ran, and reverts a failed rollout when the spec says so.

use crate::catalogue as m;
use std::sync::Arc;

use flotilla_core::now_ms;
use flotilla_view::ShardSlot;

use super::Scheduler;
use crate::lifecycle::UnitState;
use crate::rollout::Target;
use crate::spec::{AppSpec, SpecOrigin};
use crate::store::Write;

impl Scheduler {
    /// Replacements first; the old unit drains once its replacement is Running.
    pub(super) async fn roll(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let now = now_ms();
        let target = Target {
            fingerprint: &self.fingerprint,
            desired: self.desired(),
            max_unavailable: self.spec.rollout.max_unavailable,
            progress_deadline_ms: self.spec.rollout.progress_deadline.as_ms(),
            now_ms: now,
            halted: self.stored.rollout.as_ref().is_some_and(|r| r.halts(&self.fingerprint)),
        };
        let plan = crate::rollout::plan(&self.stored.units, slots, &target);
        for (id, why) in &plan.release {
            self.release_replacement(id, why, slots, writes).await;
        }
        for id in &plan.drain {
            if let Some(u) = self.stored.units.get_mut(id)
                && let Ok(to) = u.state.to(UnitState::Draining)
            {
                tracing::info!(unit = %id, replacement = ?u.replaced_by, "replacement running: draining the old unit");
                u.state = to;
                u.draining_since_unix_ms = Some(now);
                writes.push(Write::Unit(u.clone()));
            }
        }
        for id in &plan.orphaned {
            if let Some(u) = self.stored.units.get_mut(id) {
                tracing::warn!(unit = %id, replacement = ?u.replaced_by, "the replacement is gone; the unit stays");
                u.replaced_by = None;
                writes.push(Write::Unit(u.clone()));
            }
        }
        for (id, why) in plan.replace {
            let secondary = self.stored.units.get(&id).is_some_and(|u| u.secondary);
            let new = self.queue_unit(secondary, writes);
            if let Some(u) = self.stored.units.get_mut(&id) {
                tracing::info!(unit = %id, replacement = %new, %why, "replacing the unit, make before break");
                metrics::counter!(m::UNITS_REPLACED.name, "app" => self.spec.name.clone(), "why" => why).increment(1);
                u.replaced_by = Some(new);
                writes.push(Write::Unit(u.clone()));
            }
        }
        self.follow_rollout(plan.failed, now, writes);
    }

    /// A replacement that is not wanted any more (superseded, not needed, or past the
    /// progress deadline): it ends, with why, and what it holds is released (members
    /// stopped). A release that does not go through leaves it Failed, retried by `heal`.
    async fn release_replacement(&mut self, id: &str, why: &str, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let Some(u) = self.stored.units.get_mut(id) else { return };
        let why = with_agent_messages(why, u, slots);
        tracing::warn!(unit = %id, %why, "releasing a replacement");
        u.unplaced_reason = Some(why);
        if u.state == UnitState::Queued {
            u.state = UnitState::Terminated;
            writes.push(Write::Unit(u.clone()));
            return;
        }
        let unit = u.clone();
        if u.state.can_become(UnitState::Failed) {
            u.state = UnitState::Failed;
        }
        // Write ahead, as `fail_unit` does: a scheduler that dies after the release finds
        // the unit Failed and retries the release.
        if let Err(e) = self.store.write(&self.spec.name, &[Write::Unit(u.clone())]) {
            tracing::warn!(unit = %id, error = %e, "cannot record the release; will retry");
            return;
        }
        if let Err(e) = self.release_unit(&unit, &[]).await {
            tracing::warn!(unit = %id, error = %e, "releasing a replacement; will retry");
        } else if let Some(u) = self.stored.units.get_mut(id) {
            u.state = UnitState::Terminated;
            writes.push(Write::Unit(u.clone()));
        }
    }

    /// Moves the rollout record along (failed, or complete once every unit runs the
    /// template), keeps the last spec that ran, and reverts a failed rollout when the
    /// spec has `auto_revert`.
    fn follow_rollout(&mut self, failed: Option<String>, now: u64, writes: &mut Vec<Write>) {
        let settled = crate::rollout::settled(&self.stored.units, &self.fingerprint);
        if let Some(next) =
            self.stored.rollout.as_ref().and_then(|r| r.advance(&self.fingerprint, failed.as_deref(), settled, now))
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
        let Some(why) = failed.filter(|_| self.spec.rollout.auto_revert) else { return };
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
        if let Err(e) = self.store.write(&self.spec.name, &std::mem::take(writes)) {
            tracing::warn!(app = %self.spec.name, error = %e, "auto_revert: cannot record the pass; will retry");
            return;
        }
        let origin = SpecOrigin { reason: Some(why), ..SpecOrigin::new("revert", now) };
        match self.apply_from(spec, origin) {
            Ok(result) => {
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
            let rec = slots.get(shard as usize)?.view.get(&flotilla_core::NodeId::new(node).ok()?)?.clone();
            rec.workloads
                .iter()
                .find(|w| w.unit == u.unit_id && w.member == m.member && w.generation == u.generation)
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
