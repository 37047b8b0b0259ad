//! Roll: units on leaving nodes or with a stale template are replaced make before
//! break. `crate::rollout` decides; this carries it out.

use crate::catalogue as m;
use std::sync::Arc;

use flotilla_core::now_ms;
use flotilla_view::ShardSlot;

use super::Scheduler;
use crate::lifecycle::UnitState;
use crate::store::Write;

impl Scheduler {
    /// Replacements first; the old unit drains once its replacement is Running.
    pub(super) fn roll(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let plan = crate::rollout::plan(
            &self.stored.units,
            slots,
            &self.fingerprint,
            self.desired(),
            self.spec.rollout.max_unavailable,
        );
        let now = now_ms();
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
    }
}
