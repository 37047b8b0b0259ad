use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use flotilla_core::{Labels, NodeId};
use flotilla_view::NodeRecord;
use rand::{Rng, SeedableRng};

use super::*;
use crate::testing::{node, slots, unit};

fn labelled(id: &str, pairs: &[(&str, &str)]) -> NodeRecord {
    let map = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    NodeRecord { labels: Arc::new(Labels::from_map(map).unwrap()), ..node(id) }
}

/// Units `(id, domain, node)` of one member each, Running, placed an hour ago.
fn placed(spec: &[(&str, &str, &str)]) -> Units {
    spec.iter()
        .map(|(id, d, n)| {
            let u = UnitRecord { domain: Some(d.to_string()), ..unit(id, 1, UnitState::Running, &[("head", n)]) };
            (id.to_string(), u)
        })
        .collect()
}

fn counted(units: &Units) -> (HashMap<String, u32>, NodeMap<u32>) {
    let (mut d, mut n) = (HashMap::new(), NodeMap::default());
    for u in units.values().filter(|u| u.state.is_active()) {
        *d.entry(u.domain.clone().unwrap_or_default()).or_default() += 1;
        for m in &u.members {
            *n.entry(NodeId::new(m.node_id.as_deref().unwrap()).unwrap()).or_default() += 1;
        }
    }
    (d, n)
}

const HOUR: u64 = 3_600_000;

fn budget(desired: u32) -> Budget<'static> {
    Budget { max_moving: 1, min_available: 0.9, quiet_ms: 600_000, desired, now_ms: HOUR, template: "t" }
}

#[test]
fn units_packed_on_two_nodes_move_once_four_more_join() {
    let nodes = ["n1", "n2", "n3", "n4", "n5", "n6"].map(|n| labelled(n, &[("domain", "d")]));
    let slots = slots(nodes, true);
    let units = placed(&[
        ("a-1", "d", "n1"),
        ("a-2", "d", "n1"),
        ("a-3", "d", "n1"),
        ("a-4", "d", "n2"),
        ("a-5", "d", "n2"),
        ("a-6", "d", "n2"),
    ]);
    let (d, n) = counted(&units);
    let counts = Counts { per_domain: &d, per_node: &n, spreads: true };
    let found = candidates(&units, &slots, &counts, &budget(6));
    assert_eq!(found.room, 1);
    assert_eq!(found.waiting, None);
    assert_eq!(found.candidates.len(), 6, "{found:?}");
    let c = &found.candidates[0];
    assert_eq!(c.before, Fit { poor: 0, domain: 5, node: 2, spare: 0 });
    assert!(c.why.contains("2 other units on its node, 0 on another"), "{}", c.why);
    // Where the planner would put it: an empty node of the same domain.
    let n3 = node("n3");
    let after = fit_at(&units[&c.unit], "d", &[(&n3.node_id, &n3)], &counts, false);
    assert_eq!(after, Fit { poor: 0, domain: 5, node: 0, spare: 0 });
    assert!(improves(c.before, after));
    // Onto the other crowded node: no better.
    let n2 = node("n2");
    assert!(!improves(c.before, fit_at(&units["a-1"], "d", &[(&n2.node_id, &n2)], &counts, false)));
}

#[test]
fn a_domain_holding_more_than_its_share_after_a_failover_gives_units_back() {
    let nodes =
        ["a1", "a2", "b1", "b2"].map(|n| labelled(n, &[("domain", if n.starts_with('a') { "za" } else { "zb" })]));
    let slots = slots(nodes, true);
    let units = placed(&[("a-1", "za", "a1"), ("a-2", "za", "a2"), ("a-3", "za", "a1"), ("a-4", "za", "a2")]);
    let (d, n) = counted(&units);
    let counts = Counts { per_domain: &d, per_node: &n, spreads: false };
    let found = candidates(&units, &slots, &counts, &budget(4));
    assert_eq!(found.candidates.len(), 4);
    assert!(found.candidates[0].why.contains("3 other units in its domain za, 0 in another"), "{found:?}");
    let b1 = node("b1");
    assert_eq!(fit_at(&units["a-1"], "zb", &[(&b1.node_id, &b1)], &counts, false), Fit::default());
}

#[test]
fn low_priority_and_sub_healthy_nodes_are_poor_for_the_primary_group() {
    let low = labelled("low", &[("domain", "d"), ("priority", "low")]);
    let sick = NodeRecord { health_millis: 300, ..labelled("sick", &[("domain", "d")]) };
    let fine = labelled("fine", &[("domain", "d")]);
    let slots = slots([low, sick, fine], true);
    let mut units = placed(&[("a-1", "d", "low"), ("a-2", "d", "sick"), ("a-3", "d", "fine")]);
    units.get_mut("a-3").unwrap().secondary = true;
    let (d, n) = counted(&units);
    let counts = Counts { per_domain: &d, per_node: &n, spreads: true };
    let found = candidates(&units, &slots, &counts, &budget(3));
    let ids: Vec<&str> = found.candidates.iter().map(|c| c.unit.as_str()).collect();
    assert_eq!(ids, ["a-1", "a-2"], "{found:?}");
    assert!(found.candidates[0].why.contains("low-priority or sub-healthy"));
    let secondary_on_low = UnitRecord { secondary: true, ..units["a-1"].clone() };
    assert_eq!(fit_of(&secondary_on_low, &slots, &counts).poor, 0, "the secondary group is meant for them");
}

#[test]
fn the_budget_holds_moves_back_and_says_why() {
    let nodes = ["n1", "n2", "n3"].map(|n| labelled(n, &[("domain", "d")]));
    let slots = slots(nodes, true);
    let mut units = placed(&[("a-1", "d", "n1"), ("a-2", "d", "n1"), ("a-3", "d", "n1")]);
    let (d, n) = counted(&units);
    let counts = Counts { per_domain: &d, per_node: &n, spreads: true };
    // Too recent to move.
    let young = Budget { now_ms: 1000, ..budget(3) };
    assert!(candidates(&units, &slots, &counts, &young).candidates.is_empty());
    // One moving already, at max_moving 1.
    units.get_mut("a-1").unwrap().replaced_by = Some("a-4".into());
    let found = candidates(&units, &slots, &counts, &budget(3));
    assert_eq!((found.room, found.waiting.as_deref()), (0, Some("1 units moving, at disruption.max_moving 1")));
    units.get_mut("a-1").unwrap().replaced_by = None;
    // A move tried lately (made or abandoned) is quiet too; a unit of another template
    // is the rollout's (after a failed rollout it stays: a move would use the failing one).
    units.get_mut("a-1").unwrap().moved_unix_ms = Some(HOUR - 1000);
    units.get_mut("a-2").unwrap().template = Some("old".into());
    let ids: Vec<String> =
        candidates(&units, &slots, &counts, &budget(3)).candidates.into_iter().map(|c| c.unit).collect();
    assert_eq!(ids, ["a-3"]);
    units.get_mut("a-1").unwrap().moved_unix_ms = None;
    units.get_mut("a-2").unwrap().template = None;
    assert_eq!([needed(100, 0.55), needed(3, 0.9), needed(10, 0.0), needed(7, 1.0)], [55, 3, 0, 7]);
    // Degraded below min_available: repair first.
    units.get_mut("a-2").unwrap().members[0].state = Some("failed".into());
    let found = candidates(&units, &slots, &counts, &budget(3));
    assert!(found.waiting.unwrap().contains("below disruption.min_available (3 of 3)"));
}

/// Consolidation: a unit on a node the pool launched above its type's min, while a node
/// it keeps has room, moves there (its own node then idles and goes); between two
/// nodes the pool keeps, or two it need not, nothing moves.
#[test]
fn a_unit_on_a_node_the_pool_need_not_keep_moves_to_one_it_keeps() {
    use flotilla_core::unit_shape::{POOL_COST, POOL_KEEPS};
    let kept = labelled("kept", &[("domain", "d"), (POOL_KEEPS, "true"), (POOL_COST, "200")]);
    let extra = labelled("extra", &[("domain", "d"), (POOL_KEEPS, "false"), (POOL_COST, "200")]);
    let slots = slots([kept.clone(), extra.clone()], true);
    let units = placed(&[("a-1", "d", "extra")]);
    let (d, n) = counted(&units);
    let counts = Counts { per_domain: &d, per_node: &n, spreads: true };
    let found = candidates(&units, &slots, &counts, &budget(1));
    assert_eq!(found.candidates.len(), 1, "{found:?}");
    let c = &found.candidates[0];
    assert!(c.why.contains("on nodes the pool need not keep"), "{}", c.why);
    let after = fit_at(&units["a-1"], "d", &[(&kept.node_id, &kept)], &counts, false);
    assert!(improves(c.before, after), "{:?} → {after:?}", c.before);
    assert!(!improves(c.before, fit_at(&units["a-1"], "d", &[(&extra.node_id, &extra)], &counts, false)));
    // On a kept node already: nothing to do.
    let home = placed(&[("a-1", "d", "kept")]);
    let (d, n) = counted(&home);
    let counts = Counts { per_domain: &d, per_node: &n, spreads: true };
    assert!(candidates(&home, &slots, &counts, &budget(1)).candidates.is_empty());
}

/// A pool node the pool cordoned to empty it (`flotilla_pool::consolidate`): its unit
/// moves to any uncordoned node, one of a type without a min too; a cordoned node the
/// pool did not launch holds its units (an operator's cordon means no new work only).
#[test]
fn a_unit_on_a_pool_node_being_emptied_moves_even_to_a_node_the_pool_need_not_keep() {
    use flotilla_core::unit_shape::{POOL_COST, POOL_KEEPS};
    let pool = |id: &str, keeps: &str| labelled(id, &[("domain", "d"), (POOL_KEEPS, keeps), (POOL_COST, "100")]);
    let emptied = NodeRecord { cordoned: true, ..pool("small-1", "false") };
    let other = pool("small-2", "false");
    let slots = slots([emptied.clone(), other.clone()], true);
    let units = placed(&[("a-1", "d", "small-1")]);
    let (d, n) = counted(&units);
    let counts = Counts { per_domain: &d, per_node: &n, spreads: true };
    let found = candidates(&units, &slots, &counts, &budget(1));
    assert_eq!(found.candidates.len(), 1, "{found:?}");
    assert_eq!(found.candidates[0].before.spare, 2);
    let after = fit_at(&units["a-1"], "d", &[(&other.node_id, &other)], &counts, false);
    assert!(improves(found.candidates[0].before, after), "{:?} → {after:?}", found.candidates[0].before);

    let static_cordoned = NodeRecord { cordoned: true, ..labelled("static", &[("domain", "d")]) };
    let slots = crate::testing::slots([static_cordoned, labelled("static-2", &[("domain", "d")])], true);
    let units = placed(&[("a-1", "d", "static")]);
    let (d, n) = counted(&units);
    let counts = Counts { per_domain: &d, per_node: &n, spreads: true };
    assert!(candidates(&units, &slots, &counts, &budget(1)).candidates.is_empty());
}

/// The no-churn property: in a cluster whose domains differ by at most one unit of the
/// app, and whose nodes too, no unit is a candidate, whatever the sizes.
#[test]
fn a_balanced_cluster_never_moves_a_unit() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(40);
    for _ in 0..300 {
        let domains = rng.random_range(1..=4usize);
        let per = rng.random_range(1..=5usize);
        let units_n = rng.random_range(0..=3 * domains * per);
        let names: Vec<(String, String)> =
            (0..domains).flat_map(|d| (0..per).map(move |i| (format!("d{d}"), format!("n{d}-{i}")))).collect();
        let slots = slots(names.iter().map(|(d, n)| labelled(n, &[("domain", d)])), true);
        // Round-robin over domains, and over each domain's nodes: balanced by construction.
        let spec: Vec<(String, String, String)> = (0..units_n)
            .map(|k| {
                let d = k % domains;
                let i = (k / domains) % per;
                (format!("a-{k}"), format!("d{d}"), format!("n{d}-{i}"))
            })
            .collect();
        let spec: Vec<(&str, &str, &str)> = spec.iter().map(|(a, b, c)| (a.as_str(), b.as_str(), c.as_str())).collect();
        let units = placed(&spec);
        let (d, n) = counted(&units);
        let spreads = rng.random_bool(0.5);
        let counts = Counts { per_domain: &d, per_node: &n, spreads };
        let found = candidates(&units, &slots, &counts, &budget(units_n as u32));
        assert!(found.candidates.is_empty(), "{domains} domains × {per} nodes, {units_n} units: {found:?}");
    }
}

/// A move is a rollout's replacement to `rollout::plan`: not released as needless (its
/// unit matches the spec), drained once it runs, given up past the progress deadline
/// without failing any rollout, and superseded by an apply like any replacement.
#[test]
fn a_move_joins_the_rollouts_replacements_without_failing_them() {
    use crate::rollout::{Target, plan};
    let roles = BTreeMap::new();
    let target = |fingerprint, now_ms| Target {
        fingerprint,
        frame: "",
        roles: &roles,
        desired: 1,
        max_unavailable: 1,
        progress_deadline_ms: 300_000,
        now_ms,
        halted: false,
        hold: None,
    };
    let slots = slots([labelled("n1", &[("domain", "d")]), labelled("n2", &[("domain", "d")])], true);
    let mut units = placed(&[("a-1", "d", "n1")]);
    if let Some(mut old) = units.get_mut("a-1") {
        old.template = Some("t1".into());
        old.replaced_by = Some("a-2".into());
        old.moving = Some("2 other units on its node, 0 on another".into());
    }
    let new = UnitRecord { template: Some("t1".into()), ..unit("a-2", 2, UnitState::Starting, &[("head", "n2")]) };
    units.insert(new);
    assert_eq!(plan(&units, &slots, &target("t1", 1_000)).release, vec![], "a move is no needless replacement");
    let late = plan(&units, &slots, &target("t1", 400_000));
    assert!(late.release[0].1.starts_with("move abandoned"), "{late:?}");
    assert_eq!((late.orphaned, late.failed), (vec!["a-1".to_string()], None), "the unit stays; no rollout failed");
    let applied = plan(&units, &slots, &target("t2", 1_000));
    assert!(applied.release[0].1.starts_with("superseded"), "{applied:?}");
    units.get_mut("a-2").unwrap().state = UnitState::Running;
    assert_eq!(plan(&units, &slots, &target("t1", 1_000)).drain, vec!["a-1".to_string()]);
    // Without the mark, the same replacement of a matching unit on a staying node goes.
    units.get_mut("a-1").unwrap().moving = None;
    units.get_mut("a-2").unwrap().state = UnitState::Starting;
    assert!(plan(&units, &slots, &target("t1", 1_000)).release[0].1.starts_with("not needed"));
}
