//! Scale-in: queued units go first, then the least healthy and youngest placed ones
//! drain (out of the routes at once); their members are released after the drain
//! timeout, and the unit ends Terminated once no agent runs them.

use std::sync::Arc;

use flotilla_core::{NodeId, now_ms};
use flotilla_view::ShardSlot;

use super::Scheduler;
use crate::lifecycle::UnitState;
use crate::rollout::counts_toward_desired;
use crate::store::{UnitRecord, Write};

/// How long a Stopping unit waits for its agents to report its members gone, after the
/// drain timeout, before it ends all the same.
const STOP_WAIT_MS: u64 = 15_000;

impl Scheduler {
    pub(super) async fn scale_in(&mut self, slots: &[Arc<ShardSlot>], writes: &mut Vec<Write>) {
        let now = now_ms();
        self.choose_victims(slots, now, writes);
        let spec_drain_ms = self.spec.units.drain_timeout_ms;
        let drain_ms = |u: &UnitRecord| u.drain_timeout_ms.unwrap_or(spec_drain_ms);
        let due: Vec<UnitRecord> = self
            .stored
            .units
            .values()
            .filter(|u| {
                u.state == UnitState::Draining && u.draining_since_unix_ms.is_some_and(|t| now >= t + drain_ms(u))
            })
            .cloned()
            .collect();
        for u in due {
            if self.release_unit(&u, &[]).await.is_ok()
                && let Some(u) = self.stored.units.get_mut(&u.unit_id)
            {
                u.state = UnitState::Stopping;
                writes.push(Write::Unit(u.clone()));
            }
        }
        // Stopping → Terminated once no agent reports its members any more.
        for u in self.stored.units.values_mut().filter(|u| u.state == UnitState::Stopping) {
            let waited = u.draining_since_unix_ms.is_some_and(|t| now >= t + drain_ms(u) + STOP_WAIT_MS);
            if waited || !still_runs(u, slots) {
                u.state = UnitState::Terminated;
                writes.push(Write::Unit(u.clone()));
            }
        }
    }

    /// Past the desired count of a group: ends its queued units and starts draining the
    /// placed ones `crate::repair::scale_in_order` picks.
    fn choose_victims(&mut self, slots: &[Arc<ShardSlot>], now: u64, writes: &mut Vec<Write>) {
        for (group, desired) in self.desired_groups().into_iter().enumerate() {
            self.choose_victims_in(group == 1, desired as usize, slots, now, writes);
        }
    }

    fn choose_victims_in(
        &mut self,
        secondary: bool,
        desired: usize,
        slots: &[Arc<ShardSlot>],
        now: u64,
        writes: &mut Vec<Write>,
    ) {
        let active: Vec<&UnitRecord> =
            self.stored.units.values().filter(|u| counts_toward_desired(u) && u.secondary == secondary).collect();
        if active.len() <= desired {
            return;
        }
        let mut excess = active.len() - desired;
        let queued: Vec<String> =
            active.iter().filter(|u| u.state == UnitState::Queued).map(|u| u.unit_id.clone()).take(excess).collect();
        excess -= queued.len();
        let placed: Vec<&UnitRecord> = active.iter().filter(|u| u.state != UnitState::Queued).copied().collect();
        let victims = crate::repair::scale_in_order(&placed, excess, slots);
        for id in queued {
            if let Some(u) = self.stored.units.get_mut(&id) {
                u.state = UnitState::Terminated;
                writes.push(Write::Unit(u.clone()));
            }
        }
        for id in victims {
            if let Some(u) = self.stored.units.get_mut(&id)
                && let Ok(to) = u.state.to(UnitState::Draining)
            {
                tracing::info!(unit = %id, "scale-in: draining");
                u.state = to;
                u.draining_since_unix_ms = Some(now);
                u.drain_timeout_ms = self.autoscaler.drain_ms;
                writes.push(Write::Unit(u.clone()));
            }
        }
    }
}

/// Whether an agent still reports any member of `u` running.
fn still_runs(u: &UnitRecord, slots: &[Arc<ShardSlot>]) -> bool {
    u.members.iter().chain(&u.surge).any(|m| {
        m.node_id.as_deref().zip(m.shard).is_some_and(|(n, s)| {
            slots.get(s as usize).and_then(|slot| slot.view.get(&NodeId::new(n).ok()?).cloned()).is_some_and(|r| {
                r.workloads.iter().any(|w| {
                    w.unit == u.unit_id && w.member == m.member && w.generation == m.key_generation(u.generation)
                })
            })
        })
    })
}
