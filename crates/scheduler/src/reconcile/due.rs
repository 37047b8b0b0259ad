//! When an app's next pass is due if no view change that concerns it ([`super::watched`])
//! and no command comes first.
//!
//! Most apps are quiet most of the time: every unit Running, every member reported running
//! on the live node it was placed on, nothing in flight (no placement, drain, rollout,
//! surge or replacement, no write refused, no shard unheard). Until the view or a
//! command changes, a pass of a quiet app decides nothing
//! but what its timers say: the orphan sweep and the rebalance look (both every 5 s, at
//! the app's own phase, so one pass does both and a thousand apps in one process spread
//! over the seconds), the autoscaler's interval and the retention of ended units. A
//! quiet app passes when the earliest of them is due; any other app every second, as
//! every grace (missing, unknown, drain, start order) counts in whole seconds.
//!
//! Route weights that move on their own (a health factor's EWMA on its way to a new
//! score) have a timer of their own, which moves them in the last route table
//! ([`crate::routes::Weights::next_change_ms`], [`crate::routes::Weights::reweigh`]).

use crate::lifecycle::UnitState;
use crate::store::{RolloutState, UnitRecord};

use super::Scheduler;

/// The tick of an app that is not quiet, and the shortest a quiet one waits.
pub(super) const TICK_MS: u64 = 1_000;

/// The first moment after `now` at `phase` of a period of `every`: an app's periodic
/// steps land on the same moments whatever pass ran them last.
pub(super) fn next_beat(now: u64, every: u64, phase: u64) -> u64 {
    let every = every.max(1);
    let phase = phase % every;
    let base = now - now % every + phase;
    if base > now { base } else { base + every }
}

/// The app's phase (any period's: [`next_beat`] takes it modulo the period), from its
/// name (FNV-1a): stable across restarts, and spread over apps.
pub(super) fn phase_of(app: &str) -> u64 {
    app.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// Nothing in `u` moves on its own: it ended, or it runs whole and stays.
fn settled(u: &UnitRecord) -> bool {
    match u.state {
        UnitState::Terminated => true,
        UnitState::Running => {
            !u.members.is_empty()
                && u.members.iter().all(|m| m.node_id.is_some() && m.state.as_deref() == Some("running"))
                && u.surge.is_empty()
                && u.replaced_by.is_none()
                && u.moving.is_none()
                && u.roll_waits.is_none()
                && u.draining_since_unix_ms.is_none()
        }
        _ => false,
    }
}

impl Scheduler {
    /// When (Unix ms) the next pass is due after one that started at `started_ms`, and
    /// why: `tick` or, for a quiet app, `timer`.
    pub(super) fn next_pass(&self, started_ms: u64) -> (u64, &'static str) {
        let busy = started_ms + TICK_MS;
        if !self.quiet() {
            return (busy, "tick");
        }
        let timers = [
            Some(self.tracking.next_sweep_ms()),
            Some(self.rebalancing.next_ms()),
            self.autoscaler.next_due_ms(&self.spec),
            crate::retention::next_expiry(&self.stored.units),
        ];
        (timers.into_iter().flatten().min().map_or(busy, |t| t.max(busy)), "timer")
    }

    /// Whether nothing would change from one pass to the next with the same view (see
    /// the module doc).
    fn quiet(&self) -> bool {
        let active = self.leader.held().is_some_and(|l| l.token() == self.token);
        active
            && self.tracking.started
            && self.tracking.settled()
            && self.unsaved.is_empty()
            && !self.wrote
            && self.cluster.slots().iter().all(|s| s.connected)
            && self.stored.units.values().all(settled)
            && self.stored.rollout.as_ref().is_none_or(|r| r.state != RolloutState::InProgress)
            && self.canary_hold().is_none()
            && self.planning.settled()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::unit;

    #[test]
    fn beats_fall_on_the_phase_after_now() {
        assert_eq!(next_beat(10_000, 5_000, 1_200), 11_200);
        assert_eq!(next_beat(11_200, 5_000, 1_200), 16_200, "strictly after now");
        assert_eq!(next_beat(11_199, 5_000, 1_200), 11_200);
        assert_eq!(next_beat(0, 5_000, 0), 5_000);
        assert_eq!(next_beat(7, 5_000, 6_000), 1_000, "a phase past the period wraps");
        assert_eq!(next_beat(7, 0, 3), 8, "a zero period is taken as 1 ms");
    }

    #[test]
    fn phases_are_stable_and_spread() {
        assert_eq!(phase_of("web"), phase_of("web"));
        let beats: std::collections::BTreeSet<u64> =
            (0..100).map(|i| next_beat(0, 5_000, phase_of(&format!("app-{i:05}")))).collect();
        assert!(beats.len() > 90, "{} distinct beats of 100", beats.len());
        assert!(beats.iter().all(|b| *b <= 5_000));
    }

    #[test]
    fn a_unit_is_settled_when_it_runs_whole_or_ended() {
        let mut u = unit("a-1", 1, UnitState::Running, &[("head", "n1"), ("worker-0", "n2")]);
        for m in &mut u.members {
            m.state = Some("running".into());
        }
        assert!(settled(&u));
        let mut starting = u.clone();
        starting.members[1].state = Some("starting".into());
        assert!(!settled(&starting), "a member not running yet");
        let mut lost = u.clone();
        lost.members[1].node_id = None;
        assert!(!settled(&lost), "a worker to place again");
        let mut draining = u.clone();
        draining.draining_since_unix_ms = Some(1);
        assert!(!settled(&draining), "a drain times out");
        let mut replaced = u.clone();
        replaced.replaced_by = Some("a-2".into());
        assert!(!settled(&replaced), "a replacement comes up");
        let mut waits = u.clone();
        waits.roll_waits = Some(("t".into(), 1));
        assert!(!settled(&waits), "a replacement waits for room");
        for state in
            [UnitState::Queued, UnitState::Placing, UnitState::Allocated, UnitState::Starting, UnitState::Degraded]
        {
            assert!(!settled(&unit("a-3", 3, state, &[("head", "n1")])), "{state:?}");
        }
        assert!(settled(&unit("a-4", 4, UnitState::Terminated, &[("head", "n1")])));
    }
}
