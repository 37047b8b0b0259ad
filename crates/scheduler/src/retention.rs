//! Ended units: what they show, and how long they are kept. A unit that ends
//! (Terminated) keeps its record for inspection (`units APP --all`, why it ended), but
//! its members show that they stopped, not the last state their agents reported while
//! they ran; the newest few are kept, the rest leave the store. Pure.

use crate::lifecycle::UnitState;
use crate::store::{UnitRecord, Units};

/// Ended units kept per app, newest first.
pub const KEEP_ENDED: usize = 10;
/// How long an ended unit is kept at most.
pub const KEEP_ENDED_MS: u64 = 3_600_000;

/// What a member shows once its unit ended.
pub const STOPPED: &str = "stopped";

/// Marks the units that ended since the last pass: when, and their members stopped (no
/// address, no usage; a member that failed or exited keeps that, its last real state).
/// A placement note no longer applies. The ids it changed.
pub fn mark_ended(units: &mut Units, now: u64) -> Vec<String> {
    let mut changed = Vec::new();
    let ended = |u: &UnitRecord| u.state == UnitState::Terminated && u.ended_unix_ms.is_none();
    units.update_matching(ended, |u| {
        let u: &mut UnitRecord = u;
        u.ended_unix_ms = Some(now);
        u.placement_note = None;
        for m in u.members.iter_mut().chain(&mut u.surge) {
            if !matches!(m.state.as_deref(), Some("failed" | "exited")) {
                m.state = Some(STOPPED.to_string());
            }
            m.address = None;
            m.usage = None;
        }
        changed.push(u.unit_id.clone());
    });
    changed
}

/// The ended units to remove: all but the newest [`KEEP_ENDED`], and any that ended
/// more than [`KEEP_ENDED_MS`] ago.
pub fn expired(units: &Units, now: u64) -> Vec<String> {
    let mut ended: Vec<(u64, &str)> =
        units.values().filter_map(|u| Some((u.ended_unix_ms?, u.unit_id.as_str()))).collect();
    ended.sort_by(|a, b| b.cmp(a));
    ended
        .into_iter()
        .enumerate()
        .filter(|(i, (at, _))| *i >= KEEP_ENDED || now.saturating_sub(*at) > KEEP_ENDED_MS)
        .map(|(_, (_, id))| id.to_string())
        .collect()
}

/// When the oldest ended unit has been kept for [`KEEP_ENDED_MS`] (Unix ms), if any ended.
pub fn next_expiry(units: &Units) -> Option<u64> {
    units.values().filter_map(|u| u.ended_unix_ms).min().map(|at| at.saturating_add(KEEP_ENDED_MS + 1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::unit;

    #[test]
    fn an_ended_unit_shows_its_members_stopped_and_when() {
        let mut ended = unit("a-1", 1, UnitState::Terminated, &[("head", "n1"), ("worker-0", "n2")]);
        ended.members[1].state = Some("failed".into());
        ended.placement_note = Some("shares a node".into());
        let running = unit("a-2", 2, UnitState::Running, &[("head", "n1")]);
        let mut units = Units::from_iter([("a-1".to_string(), ended), ("a-2".to_string(), running.clone())]);
        assert_eq!(mark_ended(&mut units, 5_000), ["a-1"]);
        let u = &units["a-1"];
        assert_eq!(u.ended_unix_ms, Some(5_000));
        assert_eq!(u.members[0].state.as_deref(), Some(STOPPED), "never running");
        assert_eq!(u.members[0].address, None, "not the address of whatever runs there now");
        assert_eq!(u.members[1].state.as_deref(), Some("failed"), "its last real state");
        assert_eq!(u.placement_note, None);
        assert_eq!(units["a-2"], running, "a live unit is left alone");
        assert!(mark_ended(&mut units, 6_000).is_empty(), "once");
        assert_eq!(units["a-1"].ended_unix_ms, Some(5_000));
    }

    #[test]
    fn the_newest_ended_units_are_kept_for_an_hour() {
        let mut units = Units::default();
        for g in 1..=14u64 {
            let mut u = unit(&format!("a-{g}"), g, UnitState::Terminated, &[("head", "n1")]);
            u.ended_unix_ms = Some(g * 1_000);
            units.insert(u);
        }
        units.insert(unit("a-15", 15, UnitState::Running, &[("head", "n1")]));
        let mut gone = expired(&units, 20_000);
        gone.sort();
        assert_eq!(gone, ["a-1", "a-2", "a-3", "a-4"], "the oldest past the newest ten");
        let later = 13_000 + KEEP_ENDED_MS + 1;
        assert_eq!(expired(&units, later).len(), 13, "only a-14 ended within the hour");
    }
}
