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
//! - A rollout cannot get stuck (Kubernetes' progress deadline, Nomad's
//!   `progress_deadline`): a replacement not Running with every member running within
//!   `rollout.progress_deadline` of being queued is released and the rollout fails; no
//!   more units roll to that template until the next apply.
//! - A newer spec supersedes an in-flight rollout at once: replacements of another
//!   template are released, running or not, and the units they were to replace roll
//!   to the new one (or stay, if they already match it: a rollback keeps them).

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use flotilla_core::NodeId;
use flotilla_view::ShardSlot;

use crate::lifecycle::UnitState;
use crate::store::UnitRecord;

mod members;
pub use members::Roll;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct RolloutPlan {
    /// Old units whose replacement is Running: drain them now.
    pub drain: Vec<String>,
    /// Old units whose replacement is gone (failed, scaled in, or released now): they
    /// count again.
    pub orphaned: Vec<String>,
    /// Units that get a replacement now, and why.
    pub replace: Vec<(String, String)>,
    /// Replacements coming up that are released now, and why (superseded by a newer
    /// spec, not needed any more, or past the progress deadline).
    pub release: Vec<(String, String)>,
    /// Why the rollout failed in this pass (a replacement missed the progress deadline).
    pub failed: Option<String>,
    /// Workers on leaving nodes whose unit's head stays: each is replaced alone, make
    /// before break (unit, members, why). The unit keeps its id and its head serves on.
    pub replace_members: Vec<(String, Vec<String>, String)>,
    /// Members of groups whose template changed, in units whose frame holds: each is
    /// replaced alone, make before break, as on a leaving node (unit, members).
    pub roll_members: Vec<(String, Vec<String>)>,
    /// Members coming up in a unit's surge that are released now (unit, member, why):
    /// superseded by another spec, or past the progress deadline.
    pub release_surge: Vec<(String, String, String)>,
    /// Units whose members all run the spec's templates now: they take its fingerprint.
    pub adopt: Vec<String>,
}

/// What a rollout is rolling to and how it stands.
pub struct Target<'a> {
    /// The template fingerprint of the spec in force.
    pub fingerprint: &'a str,
    /// Its frame and its groups' templates (`crate::spec::Fingerprints`).
    pub frame: &'a str,
    pub roles: &'a BTreeMap<String, String>,
    pub desired: u32,
    pub max_unavailable: u32,
    pub progress_deadline_ms: u64,
    pub now_ms: u64,
    /// The rollout to this template failed: no more units roll to it (units on leaving
    /// nodes are still replaced).
    pub halted: bool,
}

/// Does this unit count toward the app's desired number of units? A unit being replaced
/// does not: its replacement does.
pub fn counts_toward_desired(u: &UnitRecord) -> bool {
    u.state.is_active() && u.replaced_by.is_none()
}

/// Has a replacement made it: Running, and every member's agent says running (a
/// crash-looping member has not).
pub fn progressing(u: &UnitRecord) -> bool {
    u.state == UnitState::Running && u.members.iter().all(|m| m.state.as_deref().is_none_or(|s| s == "running"))
}

/// Is every unit on `fingerprint` and running: nothing replaced or coming up, every
/// placed unit that counts of this template and progressing, and at least one of them?
/// An in-progress rollout is then complete, and the spec is one that ran.
pub fn settled(units: &BTreeMap<String, UnitRecord>, fingerprint: &str) -> bool {
    let mut any = false;
    for u in units.values().filter(|u| u.state.is_active()) {
        if u.replaced_by.is_some() {
            return false;
        }
        if matches!(u.state, UnitState::Queued | UnitState::Placing) {
            continue;
        }
        if u.template.as_deref().is_some_and(|t| t != fingerprint) || !progressing(u) {
            return false;
        }
        any = true;
    }
    any
}

/// Why a member's node is about to go away, if it is.
fn node_leaving(node: Option<&str>, shard: Option<u32>, slots: &[Arc<ShardSlot>]) -> Option<&'static str> {
    let slot = slots.get(shard? as usize)?;
    let rec = slot.view.get(&NodeId::new(node?).ok()?)?;
    if rec.drain_requested {
        Some("its node is being drained")
    } else if rec.health.preemption_notice() {
        Some("its node has a preemption notice")
    } else {
        None
    }
}

/// Why the unit must be replaced whole: its head's node is leaving. (A worker's leaving
/// node replaces only that worker: see [`members_leaving`].)
fn unit_leaving(u: &UnitRecord, slots: &[Arc<ShardSlot>]) -> Option<&'static str> {
    u.members.iter().filter(|m| m.role == "head").find_map(|m| node_leaving(m.node_id.as_deref(), m.shard, slots))
}

/// The members of `u` (not its head) on leaving nodes that have no replacement coming
/// up yet, and why the first one leaves.
pub fn members_leaving(u: &UnitRecord, slots: &[Arc<ShardSlot>]) -> Option<(Vec<String>, &'static str)> {
    let mut why = None;
    let members: Vec<String> = u
        .members
        .iter()
        .filter(|m| m.role != "head" && !u.surge.iter().any(|s| s.member == m.member))
        .filter_map(|m| {
            let w = node_leaving(m.node_id.as_deref(), m.shard, slots)?;
            why.get_or_insert(w);
            Some(m.member.clone())
        })
        .collect();
    Some((members, why?))
}

/// Members coming up in `u`'s surge that now run: each takes its member's place (and the
/// member it replaces is released).
pub fn surge_ready(u: &UnitRecord) -> Vec<String> {
    u.surge.iter().filter(|m| m.state.as_deref() == Some("running")).map(|m| m.member.clone()).collect()
}

/// Why replacement `r` has not made it: its state, and each member's that is not running.
fn not_progressing(r: &UnitRecord) -> String {
    let members: Vec<String> = r
        .members
        .iter()
        .filter(|m| m.state.as_deref() != Some("running"))
        .map(|m| format!("{} {}", m.member, m.state.as_deref().unwrap_or("not started")))
        .collect();
    if members.is_empty() {
        r.state.as_str().to_string()
    } else {
        format!("{} ({})", r.state.as_str(), members.join(", "))
    }
}

/// The units `victims` of a scale-in were coming up to replace. A unit and its
/// replacement count as one unit (the replacement counts, the old unit does not), so
/// scaling one in removes both: the old unit would otherwise count again, and roll again.
pub fn replaced_by(units: &BTreeMap<String, UnitRecord>, victims: &[String]) -> Vec<String> {
    units
        .values()
        .filter(|u| u.state.is_active() && u.replaced_by.as_ref().is_some_and(|r| victims.contains(r)))
        .map(|u| u.unit_id.clone())
        .collect()
}

/// How many units a rollout to `fingerprint` will replace, from `units` as they stand:
/// what an apply says before it happens. The units that roll are the placed ones of
/// another template; a unit with a replacement of this template coming up (or being
/// committed: it is placed under the spec in force) is replaced already, and one with a
/// replacement of another template rolls after that replacement is released (see
/// [`plan`]). Queued and placing units take the template in force when they are placed,
/// and never roll. When the app is above its desired size, scale-in goes first and may
/// remove some of these units (a unit and its replacement together: [`replaced_by`])
/// instead: fewer roll, never more.
pub fn will_roll(units: &BTreeMap<String, UnitRecord>, fingerprint: &str) -> usize {
    rolling(units, fingerprint).len()
}

/// The units [`will_roll`] counts, oldest first: the order they roll in.
pub fn rolling<'a>(units: &'a BTreeMap<String, UnitRecord>, fingerprint: &str) -> Vec<&'a UnitRecord> {
    let stale = |u: &UnitRecord| u.template.as_deref().is_some_and(|t| t != fingerprint);
    let placed = |u: &UnitRecord| {
        matches!(u.state, UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded)
    };
    let replacement = |u: &UnitRecord| {
        u.state.is_active().then_some(())?;
        units.get(u.replaced_by.as_deref()?).filter(|r| r.state.is_active())
    };
    let coming_up: HashSet<&str> = units.values().filter_map(replacement).map(|r| r.unit_id.as_str()).collect();
    let mut rolls: Vec<&UnitRecord> = units
        .values()
        .filter(|u| placed(u) && !coming_up.contains(u.unit_id.as_str()))
        .filter(|u| match replacement(u) {
            Some(r) if r.state == UnitState::Placing || !stale(r) => false,
            _ => stale(u),
        })
        .collect();
    rolls.sort_by_key(|u| u.generation);
    rolls
}

pub fn plan(units: &BTreeMap<String, UnitRecord>, slots: &[Arc<ShardSlot>], t: &Target) -> RolloutPlan {
    let mut p = RolloutPlan::default();
    let mut in_flight = 0u32;
    for u in units.values().filter(|u| u.state.is_active()) {
        let Some(new) = &u.replaced_by else { continue };
        let Some(r) = units.get(new).filter(|r| r.state.is_active()) else {
            p.orphaned.push(u.unit_id.clone());
            continue;
        };
        // A commit in flight settles first (under the spec in force).
        let settling = r.state == UnitState::Placing;
        if !settling && r.template.as_deref().is_some_and(|tpl| tpl != t.fingerprint) {
            // Running or not: the unit it replaces serves on, and rolls to the spec in
            // force if it must (a rollback mid-rollout keeps the old units it went back
            // to, rather than draining them and rolling their replacements back).
            p.release.push((r.unit_id.clone(), "superseded: another spec was applied since it was queued".to_string()));
            p.orphaned.push(u.unit_id.clone());
            continue;
        }
        if progressing(r) {
            p.drain.push(u.unit_id.clone());
            continue;
        }
        let rolling = u.template.as_deref().is_some_and(|tpl| tpl != t.fingerprint);
        let waited_ms = t.now_ms.saturating_sub(r.created_unix_ms);
        let release = if settling {
            None
        } else if !rolling && u.moving.is_some() && waited_ms >= t.progress_deadline_ms {
            // A move that does not make it is given up; the unit stays where it was.
            Some(format!("move abandoned: {} was not running within the progress deadline", r.unit_id))
        } else if !rolling && u.moving.is_none() && unit_leaving(u, slots).is_none() {
            Some(format!("not needed: {} already matches the spec in force", u.unit_id))
        } else if rolling && waited_ms >= t.progress_deadline_ms {
            let why = format!(
                "rollout failed: {} (replacing {}) was not running within the progress deadline of {}s: {}",
                r.unit_id,
                u.unit_id,
                t.progress_deadline_ms / 1000,
                not_progressing(r)
            );
            p.failed.get_or_insert_with(|| why.clone());
            Some(why)
        } else {
            None
        };
        match release {
            Some(why) => {
                p.release.push((r.unit_id.clone(), why));
                p.orphaned.push(u.unit_id.clone());
            }
            None => in_flight += 1,
        }
    }
    // Members rolling alone: replacements of another template are released, one past
    // the deadline fails the rollout, a unit with one coming up is in flight.
    let mut members_in_flight: HashSet<&str> = HashSet::new();
    for u in units.values().filter(|u| u.state.is_active() && !u.surge.is_empty()) {
        let (release, coming, failed) = members::surge(u, t);
        if coming {
            members_in_flight.insert(u.unit_id.as_str());
            in_flight += 1;
        }
        if let Some(f) = failed {
            p.failed.get_or_insert(f);
        }
        p.release_surge.extend(release.into_iter().map(|(m, why)| (u.unit_id.clone(), m, why)));
    }
    let released = |u: &UnitRecord| p.release.iter().any(|(id, _)| *id == u.unit_id);
    let counted = units
        .values()
        .filter(|u| (counts_toward_desired(u) && !released(u)) || p.orphaned.contains(&u.unit_id))
        .count();
    if counted > t.desired as usize {
        return p;
    }
    let placed = |u: &&UnitRecord| {
        matches!(u.state, UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded)
            && (u.replaced_by.is_none() || p.orphaned.contains(&u.unit_id))
            && !released(u)
    };
    let mut rolls: Vec<(&UnitRecord, Roll)> = Vec::new();
    for u in units.values().filter(placed) {
        if let Some(why) = unit_leaving(u, slots) {
            p.replace.push((u.unit_id.clone(), why.to_string()));
        } else if let Some((members, why)) = members_leaving(u, slots) {
            p.replace_members.push((u.unit_id.clone(), members, why.to_string()));
        } else if u.template.as_deref().is_some_and(|tpl| tpl != t.fingerprint) {
            match members::how(u, t) {
                Roll::Done if u.surge.is_empty() => p.adopt.push(u.unit_id.clone()),
                Roll::Done => {}
                roll => {
                    if let Some(why) = members::stuck(u, t) {
                        p.failed.get_or_insert(why);
                    }
                    rolls.push((u, roll));
                }
            }
        }
    }
    if t.halted || p.failed.is_some() {
        return p;
    }
    rolls.sort_by_key(|(u, _)| u.generation);
    let mut room = t.max_unavailable.saturating_sub(in_flight) as usize;
    for (u, roll) in rolls {
        // A unit with members coming up already rolls its other stale ones too, at no
        // cost in room: it is one unit short either way.
        let in_flight = members_in_flight.contains(u.unit_id.as_str());
        if !in_flight {
            if room == 0 {
                continue;
            }
            room -= 1;
        }
        match roll {
            Roll::Members(stale) => {
                let waiting: Vec<String> =
                    stale.into_iter().filter(|m| !u.surge.iter().any(|s| &s.member == m)).collect();
                if !waiting.is_empty() {
                    p.roll_members.push((u.unit_id.clone(), waiting));
                }
            }
            _ if in_flight => {}
            _ => p.replace.push((u.unit_id.clone(), "its template changed".to_string())),
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemberRecord;
    use flotilla_core::HealthSample;
    use flotilla_view::NodeRecord;

    /// Nodes n1..n4; `drained` are being drained, `noticed` have a preemption notice.
    fn slots(drained: &[&str], noticed: &[&str]) -> Vec<Arc<ShardSlot>> {
        let records = ["n1", "n2", "n3", "n4"].map(|id| NodeRecord {
            health: HealthSample { preemption_notice: noticed.contains(&id), ..Default::default() }.into(),
            cordoned: drained.contains(&id),
            drain_requested: drained.contains(&id),
            ..crate::testing::node(id)
        });
        crate::testing::slots(records, true)
    }

    static NO_ROLES: BTreeMap<String, String> = BTreeMap::new();

    /// A plan with no deadline in sight and nothing halted.
    fn plan_(
        units: &BTreeMap<String, UnitRecord>,
        slots: &[Arc<ShardSlot>],
        fingerprint: &str,
        desired: u32,
        max_unavailable: u32,
    ) -> RolloutPlan {
        let t = Target {
            fingerprint,
            frame: "",
            roles: &NO_ROLES,
            desired,
            max_unavailable,
            progress_deadline_ms: 300_000,
            now_ms: 1_000,
            halted: false,
        };
        plan(units, slots, &t)
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
        assert_eq!(plan_(&units, &slots(&[], &[]), "t1", 1, 1), RolloutPlan::default());
    }

    #[test]
    fn units_on_leaving_nodes_are_all_replaced_at_once() {
        let units = BTreeMap::from([
            unit("a-1", 1, UnitState::Running, "n1", "t1"),
            unit("a-2", 2, UnitState::Running, "n2", "t1"),
            unit("a-3", 3, UnitState::Starting, "n3", "t1"),
        ]);
        let p = plan_(&units, &slots(&["n1"], &["n3"]), "t1", 3, 1);
        assert_eq!(
            p.replace,
            vec![
                ("a-1".to_string(), "its node is being drained".to_string()),
                ("a-3".to_string(), "its node has a preemption notice".to_string()),
            ]
        );
    }

    #[test]
    fn a_worker_on_a_leaving_node_is_replaced_alone_and_a_head_replaces_the_unit() {
        let worker_leaves = crate::testing::unit("a-1", 1, UnitState::Running, &[("head", "n1"), ("worker-0", "n2")]);
        let head_leaves = crate::testing::unit("a-2", 2, UnitState::Running, &[("head", "n2"), ("worker-0", "n3")]);
        let units = BTreeMap::from([("a-1".to_string(), worker_leaves.clone()), ("a-2".to_string(), head_leaves)]);
        let p = plan_(&units, &slots(&["n2"], &[]), "t1", 2, 1);
        assert_eq!(p.replace, vec![("a-2".to_string(), "its node is being drained".to_string())]);
        assert_eq!(
            p.replace_members,
            vec![("a-1".to_string(), vec!["worker-0".to_string()], "its node is being drained".to_string())]
        );
        // Once its replacement is coming up, nothing more is asked; once it runs, it is ready.
        let mut moving = worker_leaves;
        moving.surge.push(MemberRecord {
            node_id: Some("n4".into()),
            generation: Some(9),
            state: Some("starting".into()),
            ..moving.members[1].clone()
        });
        assert_eq!(members_leaving(&moving, &slots(&["n2"], &[])), None);
        assert!(surge_ready(&moving).is_empty());
        moving.surge[0].state = Some("running".into());
        assert_eq!(surge_ready(&moving), vec!["worker-0".to_string()]);
        assert_eq!(moving.generation_of("worker-0"), 1, "the old worker's key until the swap");
    }

    #[test]
    fn a_changed_template_rolls_max_unavailable_at_a_time_oldest_first() {
        let mut units = BTreeMap::from([
            unit("a-3", 3, UnitState::Running, "n3", "old"),
            unit("a-1", 1, UnitState::Running, "n1", "old"),
            unit("a-2", 2, UnitState::Running, "n2", "old"),
        ]);
        let s = slots(&[], &[]);
        assert_eq!(plan_(&units, &s, "new", 3, 1).replace, vec![("a-1".into(), "its template changed".into())]);
        assert_eq!(plan_(&units, &s, "new", 3, 2).replace.len(), 2);

        // a-1's replacement is still starting: nothing more rolls.
        units.get_mut("a-1").unwrap().replaced_by = Some("a-4".into());
        units.extend([unit("a-4", 4, UnitState::Starting, "n4", "new")]);
        assert_eq!(plan_(&units, &s, "new", 3, 1), RolloutPlan::default());

        // Once it runs, a-1 drains and the next one rolls.
        units.get_mut("a-4").unwrap().state = UnitState::Running;
        let p = plan_(&units, &s, "new", 3, 1);
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
        let p = plan_(&units, &slots(&["n1"], &[]), "t1", 1, 1);
        assert_eq!(p.orphaned, vec!["a-1".to_string()]);
        assert_eq!(p.replace, vec![("a-1".to_string(), "its node is being drained".to_string())], "and tried again");
    }

    #[test]
    fn nothing_starts_while_scale_in_is_due() {
        let units = BTreeMap::from([
            unit("a-1", 1, UnitState::Running, "n1", "t1"),
            unit("a-2", 2, UnitState::Running, "n2", "t1"),
        ]);
        assert!(plan_(&units, &slots(&["n1"], &[]), "t2", 1, 1).replace.is_empty());
    }

    /// echo-1 and echo-2 run template "old"; "new" is applied and echo-1 gets echo-3.
    fn rolling() -> BTreeMap<String, UnitRecord> {
        let mut units = BTreeMap::from([
            unit("a-1", 1, UnitState::Running, "n1", "old"),
            unit("a-2", 2, UnitState::Running, "n2", "old"),
            unit("a-3", 3, UnitState::Starting, "n3", "new"),
        ]);
        units.get_mut("a-1").unwrap().replaced_by = Some("a-3".into());
        let r = units.get_mut("a-3").unwrap();
        r.created_unix_ms = 10_000;
        r.members[0].state = Some("failed".into());
        units
    }

    fn target(fingerprint: &str, now_ms: u64) -> Target<'_> {
        Target {
            fingerprint,
            frame: "",
            roles: &NO_ROLES,
            desired: 2,
            max_unavailable: 1,
            progress_deadline_ms: 5_000,
            now_ms,
            halted: false,
        }
    }

    #[test]
    fn a_replacement_past_the_progress_deadline_fails_the_rollout_and_is_released() {
        let units = rolling();
        let s = slots(&[], &[]);
        assert_eq!(plan(&units, &s, &target("new", 14_999)), RolloutPlan::default(), "within the deadline: wait");
        let p = plan(&units, &s, &target("new", 15_000));
        assert_eq!(p.orphaned, vec!["a-1".to_string()], "the old unit counts again and keeps serving");
        assert_eq!(p.release.len(), 1);
        let (id, why) = &p.release[0];
        assert_eq!(id, "a-3");
        assert!(why.contains("progress deadline of 5s") && why.contains("head failed"), "{why}");
        assert_eq!(p.failed.as_deref(), Some(why.as_str()));
        assert!(p.replace.is_empty(), "a failed rollout rolls nothing more");
        assert!(p.drain.is_empty());

        // Once failed (halted), a-2 is not rolled to that template again.
        let mut units = units;
        units.get_mut("a-3").unwrap().state = UnitState::Terminated;
        units.get_mut("a-1").unwrap().replaced_by = None;
        let halted = Target { halted: true, ..target("new", 20_000) };
        assert_eq!(plan(&units, &s, &halted), RolloutPlan::default());
        // A new apply (not halted) rolls again.
        assert_eq!(
            plan(&units, &s, &target("new", 20_000)).replace,
            vec![("a-1".into(), "its template changed".into())]
        );
    }

    #[test]
    fn a_crash_looping_replacement_is_not_progress() {
        let mut units = rolling();
        units.get_mut("a-3").unwrap().state = UnitState::Running;
        let s = slots(&[], &[]);
        assert!(plan(&units, &s, &target("new", 11_000)).drain.is_empty(), "a member is failed: no drain");
        assert_eq!(plan(&units, &s, &target("new", 15_000)).release.len(), 1, "and the deadline applies");
        units.get_mut("a-3").unwrap().members[0].state = Some("running".into());
        assert_eq!(plan(&units, &s, &target("new", 15_000)).drain, vec!["a-1".to_string()]);
    }

    #[test]
    fn a_newer_spec_supersedes_the_replacements_coming_up_at_once() {
        let units = rolling();
        let s = slots(&[], &[]);
        // A third template: a-3 (of "new") goes at once, a-1 rolls to "newer" instead.
        let p = plan(&units, &s, &target("newer", 11_000));
        assert_eq!(p.release.len(), 1);
        assert!(p.release[0].1.starts_with("superseded"), "{:?}", p.release);
        assert_eq!(p.failed, None, "superseded is not failed");
        assert_eq!(p.replace, vec![("a-1".into(), "its template changed".into())]);
        // Back to "old" (a revert): a-1 already matches; its replacement goes and nothing rolls.
        let p = plan(&units, &s, &target("old", 11_000));
        assert_eq!(p.release.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), vec!["a-3"]);
        assert_eq!(p.orphaned, vec!["a-1".to_string()]);
        assert!(p.replace.is_empty(), "units matching the spec in force are left alone: {p:?}");
    }

    #[test]
    fn a_replacement_still_placing_settles_first() {
        let mut units = rolling();
        units.get_mut("a-3").unwrap().state = UnitState::Placing;
        assert_eq!(plan(&units, &slots(&[], &[]), &target("newer", 60_000)), RolloutPlan::default());
    }

    #[test]
    fn settled_means_every_unit_runs_the_template() {
        let mut units = rolling();
        assert!(!settled(&units, "new"), "a replacement is coming up");
        units.remove("a-3");
        units.get_mut("a-1").unwrap().replaced_by = None;
        assert!(settled(&units, "old"));
        assert!(!settled(&units, "new"));
        units.get_mut("a-2").unwrap().members[0].state = Some("failed".into());
        assert!(!settled(&units, "old"), "a member is not running");
        assert!(!settled(&BTreeMap::new(), "old"), "no unit ran it");
    }

    #[test]
    fn will_roll_counts_the_replacements_of_a_finished_rollout_once() {
        // The reported case: 72Mi rolled a-1 and a-2 to a-3 and a-4, which run; the old
        // units ended but still name their replacements. 88Mi rolls a-3 and a-4.
        let mut units = BTreeMap::from([
            unit("a-1", 1, UnitState::Terminated, "n1", "t0"),
            unit("a-2", 2, UnitState::Terminated, "n2", "t0"),
            unit("a-3", 3, UnitState::Running, "n3", "t72"),
            unit("a-4", 4, UnitState::Running, "n4", "t72"),
        ]);
        units.get_mut("a-1").unwrap().replaced_by = Some("a-3".into());
        units.get_mut("a-2").unwrap().replaced_by = Some("a-4".into());
        assert_eq!(will_roll(&units, "t88"), 2);
        assert_eq!(will_roll(&units, "t72"), 0);
    }

    /// A pure model of the loop around [`plan`]: each step, units that started run,
    /// scale-in removes what is past the desired count (`repair::scale_in_order`), the
    /// plan is carried out (replacements start; drained and released units end), and new
    /// units of the template in force fill the desired count.
    struct World {
        units: BTreeMap<String, UnitRecord>,
        next: u64,
        fingerprint: String,
        previous: Option<String>,
        desired: u32,
        max_unavailable: u32,
        /// Units replaced because their template changed, by the template rolled to.
        rolled: Vec<String>,
    }

    impl World {
        fn new(desired: u32, max_unavailable: u32) -> World {
            let mut w = World {
                units: BTreeMap::new(),
                next: 1,
                fingerprint: "t0".into(),
                previous: None,
                desired,
                max_unavailable,
                rolled: Vec::new(),
            };
            w.step();
            w
        }

        fn start(&mut self) -> String {
            let (id, u) = unit(&format!("a-{}", self.next), self.next, UnitState::Starting, "n1", &self.fingerprint);
            self.next += 1;
            self.units.insert(id.clone(), u);
            id
        }

        /// Puts `fingerprint` in force; what the apply says will roll.
        fn apply(&mut self, fingerprint: &str) -> usize {
            let says = will_roll(&self.units, fingerprint);
            if fingerprint != self.fingerprint {
                self.previous = Some(std::mem::replace(&mut self.fingerprint, fingerprint.into()));
            }
            says
        }

        fn counted(&self) -> usize {
            self.units.values().filter(|u| counts_toward_desired(u)).count()
        }

        fn step(&mut self) {
            for u in self.units.values_mut().filter(|u| u.state == UnitState::Starting) {
                u.state = UnitState::Running;
            }
            let counted: Vec<&UnitRecord> = self.units.values().filter(|u| counts_toward_desired(u)).collect();
            let excess = counted.len().saturating_sub(self.desired as usize);
            let victims = crate::repair::scale_in_order(&counted, excess, &[]);
            for id in replaced_by(&self.units, &victims).iter().chain(&victims) {
                self.units.get_mut(id).unwrap().state = UnitState::Terminated;
            }
            let target = Target {
                frame: "",
                roles: &NO_ROLES,
                fingerprint: &self.fingerprint,
                desired: self.desired,
                max_unavailable: self.max_unavailable,
                progress_deadline_ms: u64::MAX,
                now_ms: 0,
                halted: false,
            };
            let p = plan(&self.units, &[], &target);
            for id in p.release.iter().map(|(id, _)| id).chain(&p.drain) {
                self.units.get_mut(id).unwrap().state = UnitState::Terminated;
            }
            for id in &p.orphaned {
                self.units.get_mut(id).unwrap().replaced_by = None;
            }
            for (id, why) in &p.replace {
                let new = self.start();
                self.units.get_mut(id).unwrap().replaced_by = Some(new);
                assert_eq!(why, "its template changed", "no node leaves in this model");
                self.rolled.push(self.fingerprint.clone());
            }
            while self.counted() < self.desired as usize {
                self.start();
            }
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Apply(u8),
        Rollback,
        Scale(u32),
        Step,
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![(0u8..3).prop_map(Op::Apply), Just(Op::Rollback), (1u32..5).prop_map(Op::Scale), Just(Op::Step)]
    }

    proptest::proptest! {
        /// Whatever applies, rollbacks, scales and passes came before, and however far
        /// their rollouts got, an apply says how many units its rollout replaces: exactly,
        /// or at most when scale-in is still to remove some.
        #[test]
        fn an_apply_says_what_its_rollout_then_replaces(
            ops in proptest::collection::vec(op(), 0..40),
            last in 0u8..3,
            desired in 1u32..5,
            max_unavailable in 1u32..3,
        ) {
            let mut w = World::new(desired, max_unavailable);
            for op in ops {
                match op {
                    Op::Apply(t) => { w.apply(&format!("t{t}")); }
                    Op::Rollback => if let Some(p) = w.previous.clone() { w.apply(&p); },
                    Op::Scale(n) => w.desired = n,
                    Op::Step => w.step(),
                }
            }
            let fingerprint = format!("t{last}");
            let over = w.counted() > w.desired as usize;
            let says = w.apply(&fingerprint);
            let before = w.rolled.len();
            for _ in 0..60 {
                w.step();
            }
            proptest::prop_assert!(settled(&w.units, &fingerprint), "{:#?}", w.units);
            let rolled = w.rolled[before..].len();
            if over {
                proptest::prop_assert!(rolled <= says, "rolled {rolled}, said {says}");
            } else {
                proptest::prop_assert_eq!(rolled, says);
            }
        }
    }
}
