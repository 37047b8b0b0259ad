use std::collections::BTreeSet;
use std::time::Duration;

use flotilla_core::Resources;

use super::*;
use crate::model::{AppRow, Constraints, IdleClock, Queued};

const POOL: &str = r#"
    [node_types.small]
    cpu = 2
    memory = "4Gi"
    labels = { domain = "a" }
    min = 1
    max = 8
    cost = 0.1
    [node_types.large]
    cpu = 8
    memory = "16Gi"
    labels = { domain = "a" }
    max = 2
    cost = 0.25
"#;

/// A running node of `node_type` holding `members` members of `cpu` millicores each.
fn node(id: &str, capacity_cpu: u64, members: usize, cpu: u64) -> NodeRow {
    NodeRow {
        node_id: flotilla_core::NodeId::new(id).unwrap(),
        status: flotilla_core::NodeStatus::Alive,
        labels: Default::default(),
        capacity: std::sync::Arc::new(Resources::new(capacity_cpu, (capacity_cpu / 500) << 30, 0)),
        allocated: Resources::new(cpu * members as u64, (members as u64) << 28, 0).into(),
        cordoned: false,
        drain_requested: false,
        workloads: members,
    }
}

fn inst(id: &str, node_type: &str) -> PoolInstance {
    PoolInstance { id: id.into(), node_type: node_type.into(), phase: Phase::Running, warm: false }
}

fn plan_for(cfg: &PoolConfig, nodes: &[NodeRow], instances: &[PoolInstance], apps: &[AppRow]) -> Option<Consolidation> {
    plan_skipping(cfg, nodes, instances, apps, &BTreeSet::new())
}

fn plan_skipping(
    cfg: &PoolConfig,
    nodes: &[NodeRow],
    instances: &[PoolInstance],
    apps: &[AppRow],
    skip: &BTreeSet<String>,
) -> Option<Consolidation> {
    let obs = Observation {
        nodes,
        apps,
        instances,
        floor: &Constraints::default(),
        idle: &IdleClock::default(),
        unavailable: &Default::default(),
        now_ms: 0,
    };
    plan(cfg, &obs, skip)
}

/// A pool grown to four small nodes for a burst, one 500m member left on each.
fn fragmented() -> (Vec<NodeRow>, Vec<PoolInstance>) {
    let ids = ["s1", "s2", "s3", "s4"];
    (ids.iter().map(|id| node(id, 2000, 1, 500)).collect(), ids.iter().map(|id| inst(id, "small")).collect())
}

#[test]
fn a_fragmented_pool_empties_one_node_at_a_time_down_to_its_min() {
    let cfg = PoolConfig::parse(POOL).unwrap();
    let (mut nodes, mut instances) = fragmented();
    let mut emptied = Vec::new();
    while let Some(c) = plan_for(&cfg, &nodes, &instances, &[]) {
        assert_eq!(c.nodes.len(), 1, "{c:?}");
        assert_eq!((c.launch.as_deref(), c.members), (None, 1), "{c:?}");
        assert!((c.saving_per_hour - 0.1).abs() < 1e-9, "{c:?}");
        assert!(c.explanation.contains("saves 0.100/h"), "{}", c.explanation);
        // Its member moves to the fullest node that takes it, and it goes.
        let gone = c.nodes[0].clone();
        let to = nodes
            .iter()
            .filter(|n| n.node_id.as_str() != gone)
            .max_by_key(|n| n.allocated.cpu_millis)
            .unwrap()
            .node_id
            .clone();
        let n = nodes.iter_mut().find(|n| n.node_id == to).unwrap();
        std::sync::Arc::make_mut(&mut n.allocated).cpu_millis += 500;
        std::sync::Arc::make_mut(&mut n.allocated).memory_bytes += 1 << 28;
        n.workloads += 1;
        nodes.retain(|n| n.node_id.as_str() != gone);
        instances.retain(|i| i.id != gone);
        emptied.push(gone);
        assert!(emptied.len() < 4, "never below min: {emptied:?}");
    }
    assert_eq!(emptied.len(), 3, "four 500m members fit on one 2-cpu node: {emptied:?}");
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].workloads, 4);
}

#[test]
fn nothing_is_consolidated_below_min_while_demand_waits_or_where_nothing_fits() {
    let cfg = PoolConfig::parse(POOL).unwrap();
    let (nodes, instances) = fragmented();
    // The type's min is 4: none of them may go.
    let keep_all = PoolConfig::parse(&POOL.replacen("min = 1", "min = 4", 1)).unwrap();
    assert_eq!(plan_for(&keep_all, &nodes, &instances, &[]), None);
    // An app's units wait, or an instance is launching: the pool is not still.
    let queued =
        AppRow { app: "a".into(), queued: Queued { primary: 1, secondary: 0 }, unit_shape: Default::default() };
    assert_eq!(plan_for(&cfg, &nodes, &instances, &[queued]), None);
    let mut launching = instances.clone();
    launching.push(PoolInstance { phase: Phase::Pending, ..inst("s5", "small") });
    assert_eq!(plan_for(&cfg, &nodes, &launching, &[]), None);
    // Every node full: no room anywhere.
    let full: Vec<NodeRow> = ["s1", "s2"].iter().map(|id| node(id, 2000, 2, 1000)).collect();
    assert_eq!(plan_for(&cfg, &full, &instances[..2], &[]), None);
    // An instance on its way out does not count toward the min: with s4 leaving and a
    // min of 3, none of the other three may go.
    let min3 = PoolConfig::parse(&POOL.replacen("min = 1", "min = 3", 1)).unwrap();
    let mut leaving = instances.clone();
    leaving[3].phase = Phase::Leaving;
    assert_eq!(plan_for(&min3, &nodes[..3], &leaving, &[]), None);
    assert!(plan_for(&min3, &nodes, &instances, &[]).is_some());
    // An app's spread limit holds its units apart: no node may take another of them.
    let apart = |max: u32| AppRow {
        app: "a".into(),
        queued: Queued::default(),
        unit_shape: flotilla_core::UnitShape {
            max_units_per_node: Some(max),
            units_per_node: ["s1", "s2", "s3", "s4"].iter().map(|n| (n.to_string(), 1)).collect(),
            ..Default::default()
        },
    };
    assert_eq!(plan_for(&cfg, &nodes, &instances, &[apart(1)]), None);
    assert!(plan_for(&cfg, &nodes, &instances, &[apart(2)]).is_some());
    // Nodes given up lately are not tried again.
    let skip: BTreeSet<String> = ["s1", "s2", "s3", "s4"].iter().map(|s| s.to_string()).collect();
    assert_eq!(plan_skipping(&cfg, &nodes, &instances, &[], &skip), None);
}

#[test]
fn cordoned_warm_and_idle_nodes_are_no_room_but_a_kept_empty_node_is() {
    let cfg = PoolConfig::parse(POOL).unwrap();
    // s1 holds one member; s2 is empty and above min (the idle rule ends it): no room.
    let nodes = vec![node("s1", 2000, 1, 500), node("s2", 2000, 0, 0), node("s3", 2000, 1, 500)];
    let instances = vec![inst("s1", "small"), inst("s2", "small"), inst("s3", "small")];
    // s1 and s3 each have room for the other's member: one of them goes (s1, by id).
    let c = plan_for(&cfg, &nodes, &instances, &[]).expect("a consolidation");
    assert_eq!(c.nodes, vec!["s1".to_string()]);
    // With s3 cordoned (an operator's), s1's member has nowhere but the idle s2: nothing.
    let mut cordoned = nodes.clone();
    cordoned[2].cordoned = true;
    assert_eq!(plan_for(&cfg, &cordoned, &instances, &[]), None);
    // Nor is a node in another domain (a unit keeps its domain).
    let mut apart = nodes.clone();
    std::sync::Arc::make_mut(&mut apart[2].labels).insert("domain", "b").unwrap();
    assert_eq!(plan_for(&cfg, &apart, &instances, &[]), None);
    // An empty node of a type with a min is kept: s1's member goes to it.
    let kept = vec![node("k1", 8000, 0, 0), node("s1", 2000, 1, 500)];
    // (small without a min, large with one).
    let with_min =
        PoolConfig::parse(&POOL.replacen("min = 1", "min = 0", 1).replacen("max = 2", "min = 1\n    max = 2", 1))
            .unwrap();
    let c = plan_for(&with_min, &kept, &[inst("k1", "large"), inst("s1", "small")], &[]).expect("onto the kept node");
    assert_eq!(c.nodes, vec!["s1".to_string()]);
    // Unless it is a warm pool's (claimed, so not cordoned yet): that is no room.
    let warm = [PoolInstance { warm: true, ..inst("k1", "large") }, inst("s1", "small")];
    assert_eq!(plan_for(&with_min, &kept, &warm, &[]), None);
}

#[test]
fn nodes_are_replaced_by_one_of_a_cheaper_type_when_it_costs_less() {
    let cfg = PoolConfig::parse(POOL).unwrap();
    // Four small nodes, each with two 800m members: no member fits on another.
    let ids = ["s1", "s2", "s3", "s4"];
    let nodes: Vec<NodeRow> = ids.iter().map(|id| node(id, 2000, 2, 800)).collect();
    let instances: Vec<PoolInstance> = ids.iter().map(|id| inst(id, "small")).collect();
    let c = plan_for(&cfg, &nodes, &instances, &[]).expect("a replacement");
    // One large (8 CPUs, 0.25/h) holds five such nodes' worth; the type's min keeps one
    // small, so three go (0.30/h for 0.25/h).
    assert_eq!(c.launch.as_deref(), Some("large"), "{c:?}");
    assert_eq!(c.nodes.len(), 3, "{c:?}");
    assert_eq!(c.members, 6);
    assert!((c.saving_per_hour - 0.05).abs() < 1e-9, "{c:?}");
    assert!(c.explanation.contains("with one large"), "{}", c.explanation);
    // Two small ones cost less than a large one: nothing.
    assert_eq!(plan_for(&cfg, &nodes[..3], &instances[..3], &[]), None);
    // A large node left holding one unit, the kept small one full: a small one for it.
    let left = vec![node("s1", 2000, 2, 1000), node("l1", 8000, 1, 1000)];
    let c = plan_for(&cfg, &left, &[inst("s1", "small"), inst("l1", "large")], &[]).expect("a smaller node");
    assert_eq!((c.nodes.as_slice(), c.launch.as_deref()), (&["l1".to_string()][..], Some("small")), "{c:?}");
    assert!((c.saving_per_hour - 0.15).abs() < 1e-9, "{c:?}");
    // Types of other labels are no replacement (a selector may need the labels).
    let other = PoolConfig::parse(&POOL.replacen(
        "labels = { domain = \"a\" }\n    max = 2",
        "labels = { domain = \"b\" }\n    max = 2",
        1,
    ))
    .unwrap();
    assert_eq!(plan_for(&other, &nodes, &instances, &[]), None);
}

#[test]
fn a_bad_consolidation_table_is_refused_by_field() {
    let bad = format!("{POOL}\n[consolidation]\ndeadline = \"1s\"\nafter = \"2d\"\n");
    let e = PoolConfig::parse(&bad).unwrap_err().to_string();
    assert!(e.contains("consolidation.deadline") && e.contains("consolidation.after"), "{e}");
    assert!(PoolConfig::parse(&format!("{POOL}\n[consolidation]\nsurprise = 1\n")).is_err());
    let off = PoolConfig::parse(&format!("{POOL}\n[consolidation]\nenabled = false\nafter = \"5s\"\n")).unwrap();
    assert_eq!(
        off.consolidation,
        crate::config::ConsolidationConfig { enabled: false, after: Duration::from_secs(5), ..Default::default() }
    );
}
