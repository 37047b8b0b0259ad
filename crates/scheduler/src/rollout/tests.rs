use super::*;
use crate::store::MemberRecord;
use flotilla_core::HealthSample;
use flotilla_view::NodeRecord;
use flotilla_view::ShardSlot;
use std::sync::Arc;

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
    units: &Units,
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
        hold: None,
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
    let units = Units::from_iter([unit("a-1", 1, UnitState::Running, "n1", "t1")]);
    assert_eq!(plan_(&units, &slots(&[], &[]), "t1", 1, 1), RolloutPlan::default());
}

#[test]
fn units_on_leaving_nodes_are_all_replaced_at_once() {
    let units = Units::from_iter([
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
    let units = Units::from_iter([("a-1".to_string(), worker_leaves.clone()), ("a-2".to_string(), head_leaves)]);
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
    let mut units = Units::from_iter([
        unit("a-3", 3, UnitState::Running, "n3", "old"),
        unit("a-1", 1, UnitState::Running, "n1", "old"),
        unit("a-2", 2, UnitState::Running, "n2", "old"),
    ]);
    let s = slots(&[], &[]);
    assert_eq!(plan_(&units, &s, "new", 3, 1).replace, vec![("a-1".into(), "its template changed".into())]);
    assert_eq!(plan_(&units, &s, "new", 3, 2).replace.len(), 2);

    // a-1's replacement is still starting: nothing more rolls.
    units.get_mut("a-1").unwrap().replaced_by = Some("a-4".into());
    units.insert(unit("a-4", 4, UnitState::Starting, "n4", "new").1);
    assert_eq!(plan_(&units, &s, "new", 3, 1), RolloutPlan::default());

    // Once it runs, a-1 drains and the next one rolls.
    units.get_mut("a-4").unwrap().state = UnitState::Running;
    let p = plan_(&units, &s, "new", 3, 1);
    assert_eq!(p.drain, vec!["a-1".to_string()]);
    assert_eq!(p.replace, vec![("a-2".into(), "its template changed".into())]);
}

#[test]
fn a_lost_replacement_puts_the_old_unit_back() {
    let mut units = Units::from_iter([
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
    let units = Units::from_iter([
        unit("a-1", 1, UnitState::Running, "n1", "t1"),
        unit("a-2", 2, UnitState::Running, "n2", "t1"),
    ]);
    assert!(plan_(&units, &slots(&["n1"], &[]), "t2", 1, 1).replace.is_empty());
}

/// echo-1 and echo-2 run template "old"; "new" is applied and echo-1 gets echo-3.
fn rolling() -> Units {
    let mut units = Units::from_iter([
        unit("a-1", 1, UnitState::Running, "n1", "old"),
        unit("a-2", 2, UnitState::Running, "n2", "old"),
        unit("a-3", 3, UnitState::Starting, "n3", "new"),
    ]);
    units.get_mut("a-1").unwrap().replaced_by = Some("a-3".into());
    if let Some(mut r) = units.get_mut("a-3") {
        r.created_unix_ms = 10_000;
        r.members[0].state = Some("failed".into());
    }
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
        hold: None,
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
    assert_eq!(plan(&units, &s, &target("new", 20_000)).replace, vec![("a-1".into(), "its template changed".into())]);
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
    assert!(!settled(&Units::default(), "old"), "no unit ran it");
}

#[test]
fn will_roll_counts_the_replacements_of_a_finished_rollout_once() {
    // The reported case: 72Mi rolled a-1 and a-2 to a-3 and a-4, which run; the old
    // units ended but still name their replacements. 88Mi rolls a-3 and a-4.
    let mut units = Units::from_iter([
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
    units: Units,
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
            units: Units::default(),
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
        self.units.insert(u);
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
        self.units.update_matching(|u| u.state == UnitState::Starting, |u| u.state = UnitState::Running);
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
            hold: None,
        };
        let p = plan(&self.units, &Vec::new(), &target);
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

#[test]
fn a_canary_holds_its_old_units_and_rolls_no_more_than_its_step_allows() {
    let mut units = Units::from_iter([
        unit("a-1", 1, UnitState::Running, "n1", "t1"),
        unit("a-2", 2, UnitState::Running, "n2", "t1"),
        unit("a-3", 3, UnitState::Running, "n3", "t1"),
        unit("a-4", 4, UnitState::Running, "n4", "t2"),
    ]);
    units.get_mut("a-1").unwrap().replaced_by = Some("a-4".into());
    let target = |hold| Target {
        fingerprint: "t2",
        frame: "",
        roles: &NO_ROLES,
        desired: 3,
        max_unavailable: 3,
        progress_deadline_ms: 300_000,
        now_ms: 1_000,
        halted: false,
        hold,
    };
    let s = slots(&[], &[]);
    // The first step's one unit runs: its old unit serves on, nothing more rolls.
    let p = plan(&units, &s, &target(Some(1)));
    assert_eq!((p.drain.len(), p.replace.len()), (0, 0), "{p:?}");
    // The next step asks for two: one more, oldest first, its old unit kept too.
    let p = plan(&units, &s, &target(Some(2)));
    assert_eq!(p.replace, vec![("a-2".to_string(), "its template changed".to_string())]);
    assert!(p.drain.is_empty());
    // A held unit whose node is leaving drains all the same (its node drain must not
    // wait for the canary's promotion).
    let p = plan(&units, &slots(&["n1"], &[]), &target(Some(1)));
    assert_eq!(p.drain, vec!["a-1".to_string()]);
    // Failed and not reverted (no other spec ran): nothing drains, nothing more rolls.
    let p = plan(&units, &s, &target(Some(0)));
    assert_eq!((p.drain.len(), p.replace.len()), (0, 0), "{p:?}");
    // Promoted: the held unit drains and the rest roll as a rolling update does.
    let p = plan(&units, &s, &target(None));
    assert_eq!(p.drain, vec!["a-1".to_string()]);
    assert_eq!(p.replace.len(), 2);
}
