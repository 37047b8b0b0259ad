//! Rolling a unit by its members: when only some worker groups' templates changed (the
//! unit's frame, its head and the app's constraints and group sizes, holds), each member
//! of those groups gets a replacement in the unit's surge, make before break, and the
//! unit keeps its id, its head and its other members. Pure, like the rest of `rollout`.

use super::Target;
use crate::store::{MemberRecord, UnitRecord};

/// How a unit whose template is not the spec's comes to it.
#[derive(Debug, PartialEq, Eq)]
pub enum Roll {
    /// Replaced whole: its frame changed, or it was placed before members recorded
    /// their group's template.
    Whole,
    /// These members run an old template of their group (none coming up yet, or one of
    /// another template), and are replaced alone.
    Members(Vec<String>),
    /// Every member runs the spec's templates (the last replacement swapped in): the
    /// unit takes the spec's fingerprint.
    Done,
}

/// How `u` (its template not the spec's) rolls to `t`.
pub fn how(u: &UnitRecord, t: &Target) -> Roll {
    if u.frame.as_deref() != Some(t.frame) {
        return Roll::Whole;
    }
    let mut stale = Vec::new();
    for m in u.members.iter().filter(|m| m.role != "head") {
        match (m.template.as_deref(), t.roles.get(&m.role)) {
            (Some(have), Some(want)) if have == want => {}
            (Some(_), Some(_)) => stale.push(m.member.clone()),
            _ => return Roll::Whole,
        }
    }
    if stale.is_empty() { Roll::Done } else { Roll::Members(stale) }
}

/// Why the rollout fails, if `u`'s members of changed groups could not be placed for
/// the progress deadline (`UnitRecord::roll_waits`, for this template).
pub fn stuck(u: &UnitRecord, t: &Target) -> Option<String> {
    let (template, since) = u.roll_waits.as_ref()?;
    let waited = t.now_ms.saturating_sub(*since);
    (template == t.fingerprint && waited >= t.progress_deadline_ms).then(|| {
        format!(
            "rollout failed: members of {} could not be placed within the progress deadline of {}s",
            u.unit_id,
            t.progress_deadline_ms / 1000
        )
    })
}

/// Is `s`, in `u`'s surge, a replacement of the spec's template for its group?
pub fn current(s: &MemberRecord, t: &Target) -> bool {
    s.template.as_deref().is_some_and(|have| t.roles.get(&s.role).is_some_and(|want| want == have))
}

/// What to do about `u`'s surge under `t` (its frame the spec's): members coming up
/// with another template than the spec's (a newer apply, or a rollback, superseded
/// them) are released; a rollout's member not running within the progress deadline is
/// released and fails the rollout. Returns (members to release and why, whether a
/// rollout's replacement is still coming up, the failure if any).
pub fn surge(u: &UnitRecord, t: &Target) -> (Vec<(String, String)>, bool, Option<String>) {
    let mut release = Vec::new();
    let (mut coming, mut failed) = (false, None);
    if u.frame.as_deref() != Some(t.frame) {
        return (release, coming, failed);
    }
    let rolling = u.template.as_deref() != Some(t.fingerprint);
    for s in &u.surge {
        if s.template.is_some() && !current(s, t) {
            release.push((s.member.clone(), "superseded: another spec was applied since it was queued".to_string()));
            continue;
        }
        let running = s.state.as_deref() == Some("running");
        let waited = s.surged_unix_ms.map(|at| t.now_ms.saturating_sub(at));
        if rolling && !running && waited.is_some_and(|w| w >= t.progress_deadline_ms) {
            let why = format!(
                "rollout failed: {} of {} was not running within the progress deadline of {}s ({})",
                s.member,
                u.unit_id,
                t.progress_deadline_ms / 1000,
                s.state.as_deref().unwrap_or("not started")
            );
            failed.get_or_insert_with(|| why.clone());
            release.push((s.member.clone(), why));
        } else if rolling {
            coming = true;
        }
    }
    (release, coming, failed)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::lifecycle::UnitState;

    fn target<'a>(roles: &'a BTreeMap<String, String>) -> Target<'a> {
        Target {
            fingerprint: "t2",
            frame: "f",
            roles,
            desired: 1,
            max_unavailable: 1,
            progress_deadline_ms: 60_000,
            now_ms: 100_000,
            halted: false,
            hold: None,
        }
    }

    fn unit(templates: &[(&str, &str, &str)]) -> UnitRecord {
        let mut u = crate::testing::unit("a-1", 1, UnitState::Running, &[("head", "n1")]);
        u.template = Some("t1".into());
        u.frame = Some("f".into());
        for (member, role, template) in templates {
            u.members.push(MemberRecord {
                member: member.to_string(),
                role: role.to_string(),
                template: Some(template.to_string()),
                ..u.members[0].clone()
            });
        }
        u
    }

    #[test]
    fn only_the_members_of_changed_groups_roll_and_a_new_frame_rolls_the_unit() {
        let roles = BTreeMap::from([("cpu".to_string(), "c1".to_string()), ("gpu".to_string(), "g2".to_string())]);
        let t = target(&roles);
        let u = unit(&[("cpu-0", "cpu", "c1"), ("gpu-0", "gpu", "g1"), ("gpu-1", "gpu", "g1")]);
        assert_eq!(how(&u, &t), Roll::Members(vec!["gpu-0".into(), "gpu-1".into()]));
        let done = unit(&[("cpu-0", "cpu", "c1"), ("gpu-0", "gpu", "g2")]);
        assert_eq!(how(&done, &t), Roll::Done);
        let reframed = UnitRecord { frame: Some("f0".into()), ..u.clone() };
        assert_eq!(how(&reframed, &t), Roll::Whole);
        // Placed before members recorded their group's template: whole, as before.
        let mut old = u.clone();
        old.members[1].template = None;
        assert_eq!(how(&old, &t), Roll::Whole);
    }

    #[test]
    fn a_surge_of_another_template_is_released_and_one_past_the_deadline_fails_the_rollout() {
        let roles = BTreeMap::from([("gpu".to_string(), "g2".to_string())]);
        let t = target(&roles);
        let mut u = unit(&[("gpu-0", "gpu", "g1"), ("gpu-1", "gpu", "g1")]);
        let coming = |member: &str, template: &str, at: u64| MemberRecord {
            member: member.into(),
            role: "gpu".into(),
            template: Some(template.into()),
            surged_unix_ms: Some(at),
            state: Some("starting".into()),
            ..u.members[0].clone()
        };
        u.surge = vec![coming("gpu-0", "g2", 90_000)];
        assert_eq!(surge(&u, &t), (vec![], true, None), "in time: coming up");
        u.surge = vec![coming("gpu-0", "g2", 10_000), coming("gpu-1", "g0", 90_000)];
        let (release, coming_up, failed) = surge(&u, &t);
        assert_eq!(release.iter().map(|(m, _)| m.as_str()).collect::<Vec<_>>(), ["gpu-0", "gpu-1"]);
        assert!(release[1].1.starts_with("superseded"), "{release:?}");
        assert!(!coming_up && failed.is_some_and(|f| f.contains("gpu-0 of a-1 was not running")));
        // A unit already on the spec's template (a worker moved off a leaving node) has
        // no deadline.
        u.template = Some("t2".into());
        u.surge = vec![coming("gpu-0", "g2", 10_000)];
        assert_eq!(surge(&u, &t), (vec![], false, None));
    }

    /// Through `plan`: one unit at a time (max_unavailable 1) rolls its changed
    /// members, the next waits while the first's are coming up, and a unit whose every
    /// member runs the new templates is adopted.
    #[test]
    fn plan_rolls_members_a_unit_at_a_time_and_adopts_units_that_made_it() {
        let roles = BTreeMap::from([("gpu".to_string(), "g2".to_string())]);
        let t = Target { desired: 2, ..target(&roles) };
        let slots = crate::testing::slots([crate::testing::node("n1")], true);
        let mut a = unit(&[("gpu-0", "gpu", "g1")]);
        let mut b = UnitRecord { unit_id: "a-2".into(), generation: 2, ..a.clone() };
        let units = |a: &UnitRecord, b: &UnitRecord| {
            crate::store::Units::from_iter([("a-1".to_string(), a.clone()), ("a-2".to_string(), b.clone())])
        };
        let p = super::super::plan(&units(&a, &b), &slots, &t);
        assert_eq!(p.roll_members, vec![("a-1".to_string(), vec!["gpu-0".to_string()])]);
        assert!(p.replace.is_empty() && p.adopt.is_empty(), "{p:?}");
        // a-1's replacement is coming up: b waits for the room.
        a.surge.push(MemberRecord {
            template: Some("g2".into()),
            surged_unix_ms: Some(99_000),
            ..a.members[1].clone()
        });
        let p = super::super::plan(&units(&a, &b), &slots, &t);
        assert!(p.roll_members.is_empty() && p.release_surge.is_empty(), "{p:?}");
        // Swapped in: a-1 is adopted and b rolls.
        a.members[1] = a.surge.remove(0);
        let p = super::super::plan(&units(&a, &b), &slots, &t);
        assert_eq!((p.adopt.clone(), p.roll_members.len()), (vec!["a-1".to_string()], 1), "{p:?}");
        // A halted rollout rolls nothing more, and adopts what made it.
        b.template = Some("t2".into());
        let p = super::super::plan(&units(&a, &b), &slots, &Target { halted: true, desired: 2, ..target(&roles) });
        assert_eq!((p.adopt, p.roll_members), (vec!["a-1".to_string()], vec![]));
    }

    /// New members that cannot be placed fail the rollout at the deadline too, counted
    /// from the first failed attempt for this template (an older one does not count).
    #[test]
    fn members_that_never_fit_fail_the_rollout_at_the_deadline() {
        let roles = BTreeMap::from([("gpu".to_string(), "g2".to_string())]);
        let t = target(&roles);
        let mut u = unit(&[("gpu-0", "gpu", "g1")]);
        assert_eq!(stuck(&u, &t), None);
        u.roll_waits = Some(("t2".into(), 50_000));
        assert_eq!(stuck(&u, &t), None, "50 s of 60");
        u.roll_waits = Some(("t2".into(), 40_000));
        assert!(stuck(&u, &t).is_some_and(|w| w.contains("members of a-1 could not be placed")));
        u.roll_waits = Some(("t1".into(), 0));
        assert_eq!(stuck(&u, &t), None, "another template's wait");
    }
}
