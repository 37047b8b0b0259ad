//! Scale-in: queued units go first, then the least healthy and youngest placed ones
//! drain (out of the routes at once); their members are released after the drain
//! timeout, and the unit ends Terminated once no agent runs them.

use std::sync::Arc;

use flotilla_core::now_ms;
use flotilla_view::ShardSlot;

use super::ledgers::Ledgers;
use crate::lifecycle::UnitState;
use crate::rollout::counts_toward_desired;
use crate::spec::AppSpec;
use crate::store::{UnitRecord, Units, Write};

/// How long a Stopping unit waits for its agents to report its members gone, after the
/// drain timeout, before it ends all the same.
const STOP_WAIT_MS: u64 = 15_000;

/// Scales each group of `units` in to its `desired` count (`victim_drain_ms`: how long the
/// units it starts draining drain, when the autoscaler said), and moves the draining
/// units along: released past their drain timeout, ended once no agent runs them.
pub(super) async fn scale_in(
    spec: &AppSpec,
    units: &mut Units,
    desired: [u32; 2],
    victim_drain_ms: Option<u64>,
    ledgers: &mut Ledgers,
    slots: &[Arc<ShardSlot>],
    writes: &mut Vec<Write>,
) {
    let now = now_ms();
    for (group, desired) in desired.into_iter().enumerate() {
        choose_victims(units, group == 1, desired as usize, victim_drain_ms, slots, now, writes);
    }
    let spec_drain_ms = spec.units.drain_timeout_ms;
    let drain_ms = |u: &UnitRecord| u.drain_timeout_ms.unwrap_or(spec_drain_ms);
    let due: Vec<UnitRecord> = units
        .values()
        .filter(|u| u.state == UnitState::Draining && u.draining_since_unix_ms.is_some_and(|t| now >= t + drain_ms(u)))
        .cloned()
        .collect();
    for u in due {
        if ledgers.release_unit(&u, &[]).await.is_ok()
            && let Some(mut u) = units.get_mut(&u.unit_id)
        {
            u.state = UnitState::Stopping;
            writes.push(Write::Unit(u.shared()));
        }
    }
    // Stopping → Terminated once no agent reports its members any more.
    let stopped = |u: &UnitRecord| {
        let waited = u.draining_since_unix_ms.is_some_and(|t| now >= t + drain_ms(u) + STOP_WAIT_MS);
        u.state == UnitState::Stopping && (waited || !still_runs(u, slots))
    };
    units.update_matching(stopped, |u| {
        u.state = UnitState::Terminated;
        writes.push(Write::Unit(u.shared()));
    });
}

/// Past the `desired` count of a group: ends its queued units and starts draining the
/// placed ones `crate::repair::scale_in_order` picks, for `drain_ms` when given, and the
/// units those were coming up to replace (`crate::rollout::replaced_by`).
fn choose_victims(
    units: &mut Units,
    secondary: bool,
    desired: usize,
    drain_ms: Option<u64>,
    slots: &[Arc<ShardSlot>],
    now: u64,
    writes: &mut Vec<Write>,
) {
    let active: Vec<&UnitRecord> =
        units.values().filter(|u| counts_toward_desired(u) && u.secondary == secondary).collect();
    if active.len() <= desired {
        return;
    }
    let mut excess = active.len() - desired;
    let queued: Vec<String> =
        active.iter().filter(|u| u.state == UnitState::Queued).map(|u| u.unit_id.clone()).take(excess).collect();
    excess -= queued.len();
    let placed: Vec<&UnitRecord> = active.iter().filter(|u| u.state != UnitState::Queued).copied().collect();
    let victims = crate::repair::scale_in_order(&placed, excess, slots);
    let pairs = crate::rollout::replaced_by(units, &[queued.as_slice(), victims.as_slice()].concat());
    for id in queued {
        if let Some(mut u) = units.get_mut(&id) {
            u.state = UnitState::Terminated;
            writes.push(Write::Unit(u.shared()));
        }
    }
    for id in victims.into_iter().chain(pairs) {
        if let Some(mut u) = units.get_mut(&id)
            && let Ok(to) = u.state.to(UnitState::Draining)
        {
            tracing::info!(unit = %id, "scale-in: draining");
            u.state = to;
            u.draining_since_unix_ms = Some(now);
            u.drain_timeout_ms = drain_ms;
            writes.push(Write::Unit(u.shared()));
        }
    }
}

/// Whether an agent still reports any member of `u` running.
fn still_runs(u: &UnitRecord, slots: &[Arc<ShardSlot>]) -> bool {
    u.members.iter().chain(&u.surge).any(|m| {
        m.node_id.as_deref().zip(m.shard).is_some_and(|(n, s)| {
            slots.get(s as usize).and_then(|slot| slot.view.get(n).cloned()).is_some_and(|r| {
                r.workloads.iter().any(|w| {
                    w.unit == u.unit_id && w.member == m.member && w.generation == m.key_generation(u.generation)
                })
            })
        })
    })
}
