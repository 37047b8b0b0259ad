//! Make-before-break replacement of placed units. A unit whose node is leaving (an
//! operator's `flotilla node drain`, or a cloud's preemption notice) or whose template
//! changed (`flotilla apply`) first gets a replacement unit; only once the replacement
//! is Running does the old unit drain (out of the routes at once, stopped after the
//! drain timeout). Pure decisions over the unit records and the view; the reconcile
//! loop carries them out.
//!
//! - Leaving nodes are urgent (a preemption notice gives tens of seconds): every
//!   affected unit is replaced at once.
//! - Template changes roll at most `rollout.max_unavailable` units at a time, oldest
//!   first, counting every replacement still coming up.
//! - Nothing new starts while the app is above its desired size: scale-in decides first,
//!   so a replacement is never the unit scale-in removes next.

use std::collections::BTreeMap;
use std::sync::Arc;

use flotilla_core::NodeId;
use flotilla_view::ShardSlot;

use crate::lifecycle::UnitState;
use crate::store::UnitRecord;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct RolloutPlan {
    /// Old units whose replacement is Running: drain them now.
    pub drain: Vec<String>,
    /// Old units whose replacement is gone (failed, or scaled in): they count again.
    pub orphaned: Vec<String>,
    /// Units that get a replacement now, and why.
    pub replace: Vec<(String, String)>,
}

/// Does this unit count toward the app's desired number of units? A unit being replaced
/// does not: its replacement does.
pub fn counts_toward_desired(u: &UnitRecord) -> bool {
    u.state.is_active() && u.replaced_by.is_none()
}

/// Why a member's node is about to go away, if it is.
fn node_leaving(node: Option<&str>, shard: Option<u32>, slots: &[Arc<ShardSlot>]) -> Option<&'static str> {
    let slot = slots.get(shard? as usize)?;
    let rec = slot.view.get(&NodeId::new(node?).ok()?)?;
    if rec.drain_requested {
        Some("its node is being drained")
    } else if rec.health.preemption_notice {
        Some("its node has a preemption notice")
    } else {
        None
    }
}

pub fn plan(
    units: &BTreeMap<String, UnitRecord>,
    slots: &[Arc<ShardSlot>],
    fingerprint: &str,
    desired: u32,
    max_unavailable: u32,
) -> RolloutPlan {
    let mut p = RolloutPlan::default();
    let mut in_flight = 0u32;
    for u in units.values().filter(|u| u.state.is_active()) {
        let Some(new) = &u.replaced_by else { continue };
        match units.get(new).map(|n| n.state) {
            Some(UnitState::Running) => p.drain.push(u.unit_id.clone()),
            Some(s) if s.is_active() => in_flight += 1,
            _ => p.orphaned.push(u.unit_id.clone()),
        }
    }
    let counted = units.values().filter(|u| counts_toward_desired(u) || p.orphaned.contains(&u.unit_id)).count();
    if counted > desired as usize {
        return p;
    }
    let placed = |u: &&UnitRecord| {
        matches!(u.state, UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded)
            && (u.replaced_by.is_none() || p.orphaned.contains(&u.unit_id))
    };
    let mut rolls: Vec<&UnitRecord> = Vec::new();
    for u in units.values().filter(placed) {
        if let Some(why) = u.members.iter().find_map(|m| node_leaving(m.node_id.as_deref(), m.shard, slots)) {
            p.replace.push((u.unit_id.clone(), why.to_string()));
        } else if u.template.as_deref().is_some_and(|t| t != fingerprint) {
            rolls.push(u);
        }
    }
    rolls.sort_by_key(|u| u.generation);
    let room = max_unavailable.saturating_sub(in_flight) as usize;
    p.replace.extend(rolls.into_iter().take(room).map(|u| (u.unit_id.clone(), "its template changed".to_string())));
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::HealthSample;
    use flotilla_view::NodeRecord;

    /// Nodes n1..n4; `drained` are being drained, `noticed` have a preemption notice.
    fn slots(drained: &[&str], noticed: &[&str]) -> Vec<Arc<ShardSlot>> {
        let records = ["n1", "n2", "n3", "n4"].map(|id| NodeRecord {
            health: HealthSample { preemption_notice: noticed.contains(&id), ..Default::default() },
            cordoned: drained.contains(&id),
            drain_requested: drained.contains(&id),
            ..crate::testing::node(id)
        });
        crate::testing::slots(records, true)
    }

    fn unit(id: &str, generation: u64, state: UnitState, node: &str, template: &str) -> (String, UnitRecord) {
        let u = UnitRecord {
            template: Some(template.into()),
            ..crate::testing::unit(id, generation, state, &[("head", node)])
        };
        (id.to_string(), u)
    }

    #[test]
    fn nothing_to_do_when_nodes_stay_and_templates_match() {
        let units = BTreeMap::from([unit("a-1", 1, UnitState::Running, "n1", "t1")]);
        assert_eq!(plan(&units, &slots(&[], &[]), "t1", 1, 1), RolloutPlan::default());
    }

    #[test]
    fn units_on_leaving_nodes_are_all_replaced_at_once() {
        let units = BTreeMap::from([
            unit("a-1", 1, UnitState::Running, "n1", "t1"),
            unit("a-2", 2, UnitState::Running, "n2", "t1"),
            unit("a-3", 3, UnitState::Starting, "n3", "t1"),
        ]);
        let p = plan(&units, &slots(&["n1"], &["n3"]), "t1", 3, 1);
        assert_eq!(
            p.replace,
            vec![
                ("a-1".to_string(), "its node is being drained".to_string()),
                ("a-3".to_string(), "its node has a preemption notice".to_string()),
            ]
        );
    }

    #[test]
    fn a_changed_template_rolls_max_unavailable_at_a_time_oldest_first() {
        let mut units = BTreeMap::from([
            unit("a-3", 3, UnitState::Running, "n3", "old"),
            unit("a-1", 1, UnitState::Running, "n1", "old"),
            unit("a-2", 2, UnitState::Running, "n2", "old"),
        ]);
        let s = slots(&[], &[]);
        assert_eq!(plan(&units, &s, "new", 3, 1).replace, vec![("a-1".into(), "its template changed".into())]);
        assert_eq!(plan(&units, &s, "new", 3, 2).replace.len(), 2);

        // a-1's replacement is still starting: nothing more rolls.
        units.get_mut("a-1").unwrap().replaced_by = Some("a-4".into());
        units.extend([unit("a-4", 4, UnitState::Starting, "n4", "new")]);
        assert_eq!(plan(&units, &s, "new", 3, 1), RolloutPlan::default());

        // Once it runs, a-1 drains and the next one rolls.
        units.get_mut("a-4").unwrap().state = UnitState::Running;
        let p = plan(&units, &s, "new", 3, 1);
        assert_eq!(p.drain, vec!["a-1".to_string()]);
        assert_eq!(p.replace, vec![("a-2".into(), "its template changed".into())]);
    }

    #[test]
    fn a_lost_replacement_puts_the_old_unit_back() {
        let mut units = BTreeMap::from([
            unit("a-1", 1, UnitState::Running, "n1", "t1"),
            unit("a-2", 2, UnitState::Terminated, "n2", "t1"),
        ]);
        units.get_mut("a-1").unwrap().replaced_by = Some("a-2".into());
        let p = plan(&units, &slots(&["n1"], &[]), "t1", 1, 1);
        assert_eq!(p.orphaned, vec!["a-1".to_string()]);
        assert_eq!(p.replace, vec![("a-1".to_string(), "its node is being drained".to_string())], "and tried again");
    }

    #[test]
    fn nothing_starts_while_scale_in_is_due() {
        let units = BTreeMap::from([
            unit("a-1", 1, UnitState::Running, "n1", "t1"),
            unit("a-2", 2, UnitState::Running, "n2", "t1"),
        ]);
        assert!(plan(&units, &slots(&["n1"], &[]), "t2", 1, 1).replace.is_empty());
    }
}
