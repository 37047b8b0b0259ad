//! The unit lifecycle: every valid transition is in one table.
//!
//! `Queued → Placing → Allocated → Starting → Running → Draining → Stopping → Terminated`,
//! plus `Degraded` (a worker is being replaced) and `Failed` (the head is lost, or the
//! unit cannot run). Side effects never drive transitions directly: the reconcile loop
//! observes their results in its next sync and then moves the unit.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UnitState {
    Queued,
    Placing,
    Allocated,
    Starting,
    Running,
    Degraded,
    Draining,
    Stopping,
    Terminated,
    Failed,
}

use UnitState::*;

/// (from, to) pairs that are allowed; nothing else is.
const TRANSITIONS: &[(UnitState, UnitState)] = &[
    (Queued, Placing),
    (Queued, Terminated), // scaled in before it was placed
    (Placing, Allocated),
    (Placing, Queued), // placement or commit failed: try again later
    (Placing, Failed),
    (Placing, Terminated), // a restarted scheduler replaces what it may have placed
    (Allocated, Starting),
    (Allocated, Degraded),
    (Allocated, Draining),
    (Allocated, Failed),
    (Starting, Running),
    (Starting, Degraded),
    (Starting, Draining),
    (Starting, Failed),
    (Running, Degraded),
    (Running, Draining),
    (Running, Failed),
    (Degraded, Running),
    (Degraded, Starting),
    (Degraded, Draining),
    (Degraded, Failed),
    (Draining, Stopping),
    (Stopping, Terminated),
    (Failed, Stopping),
    (Failed, Terminated),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("a unit cannot go from {from:?} to {to:?}")]
pub struct InvalidTransition {
    pub from: UnitState,
    pub to: UnitState,
}

impl UnitState {
    pub const ALL: [UnitState; 10] =
        [Queued, Placing, Allocated, Starting, Running, Degraded, Draining, Stopping, Terminated, Failed];

    pub fn can_become(self, to: UnitState) -> bool {
        TRANSITIONS.contains(&(self, to))
    }

    pub fn to(self, to: UnitState) -> Result<UnitState, InvalidTransition> {
        if self.can_become(to) { Ok(to) } else { Err(InvalidTransition { from: self, to }) }
    }

    /// Counts toward the app's number of units.
    pub fn is_active(self) -> bool {
        !matches!(self, Terminated | Failed | Draining | Stopping)
    }

    /// Holds (or may hold) resources on nodes.
    pub fn holds_resources(self) -> bool {
        !matches!(self, Queued | Terminated)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Queued => "queued",
            Placing => "placing",
            Allocated => "allocated",
            Starting => "starting",
            Running => "running",
            Degraded => "degraded",
            Draining => "draining",
            Stopping => "stopping",
            Terminated => "terminated",
            Failed => "failed",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_happy_path_is_allowed() {
        let path = [Queued, Placing, Allocated, Starting, Running, Draining, Stopping, Terminated];
        for w in path.windows(2) {
            assert_eq!(w[0].to(w[1]), Ok(w[1]), "{:?} -> {:?}", w[0], w[1]);
        }
    }

    #[test]
    fn failure_paths() {
        assert!(Running.can_become(Degraded) && Degraded.can_become(Running), "a worker is replaced");
        assert!(Running.can_become(Failed) && Failed.can_become(Stopping), "a head is lost");
        assert!(Placing.can_become(Queued), "a rejected commit is retried");
    }

    #[test]
    fn nothing_leaves_terminated_and_nothing_skips_ahead() {
        for s in UnitState::ALL {
            assert!(!Terminated.can_become(s));
        }
        assert_eq!(Queued.to(Running), Err(InvalidTransition { from: Queued, to: Running }));
        assert!(!Running.can_become(Placing));
        assert!(!Failed.can_become(Running), "a failed unit is replaced, never revived");
        assert!(!Draining.can_become(Running));
    }

    #[test]
    fn every_state_but_terminated_has_a_way_out() {
        for s in UnitState::ALL {
            let outs = UnitState::ALL.iter().filter(|t| s.can_become(**t)).count();
            assert_eq!(outs == 0, s == Terminated, "{s:?}");
        }
    }
}
