//! The planner's unit tests: placement against hand-made views.

use super::*;
use flotilla_core::Labels;
use rand::SeedableRng;

fn rec(id: &str, domain: &str, cpu: u64, used: u64, status: NodeStatus, gpu: u32, low: bool) -> Arc<NodeRecord> {
    let mut l = Labels::new();
    l.insert("domain", domain).unwrap();
    if low {
        l.insert("priority", "low").unwrap();
    }
    Arc::new(NodeRecord {
        status,
        labels: Arc::new(l),
        capacity: Resources::new(cpu, 1 << 34, gpu).into(),
        allocated: Resources::new(used, 0, 0).into(),
        ..crate::testing::node(id)
    })
}

fn slots(recs: Vec<Arc<NodeRecord>>) -> Vec<Arc<ShardSlot>> {
    crate::testing::slots(recs.into_iter().map(Arc::unwrap_or_clone), true)
}

fn members(n: usize, cpu: u64) -> Vec<MemberRequest> {
    (0..n).map(|i| MemberRequest::plain(&format!("m{i}"), Resources::new(cpu, 1 << 20, 0))).collect()
}

/// The app-wide constraints tests give, as every member's selector.
#[derive(Default)]
struct Constraints {
    labels: BTreeMap<String, String>,
    allow_low_priority: bool,
}

fn plan(
    s: &[Arc<ShardSlot>],
    c: &Constraints,
    per_domain: &HashMap<String, u32>,
    max: Option<u32>,
    ms: &[MemberRequest],
) -> Result<Placement, Unplaced> {
    let (pending, per_node) = (NodeMap::default(), NodeMap::default());
    let input = PlanInput { max_units_per_domain: max, ..PlanInput::new(s, per_domain, &per_node, &pending) };
    let mut ms = ms.to_vec();
    for (_, o) in ms.iter_mut().flat_map(|m| &mut m.options) {
        o.selector.labels.extend(NodeSelector::exact(&c.labels, false).labels);
        o.selector.allow_low_priority |= c.allow_low_priority;
    }
    place_unit(&input, &ms, &mut ClassCache::default(), &mut rand::rngs::StdRng::seed_from_u64(7))
}

/// Issue #34 item 4: a member goes to a node the pool keeps anyway (its type has a
/// `min`) over a spot node that fits it better, so the spot node can go when idle.
#[test]
fn members_prefer_the_nodes_the_pool_keeps_then_the_cheapest() {
    use flotilla_core::unit_shape::{POOL_COST, POOL_KEEPS};
    let pooled = |id: &str, used: u64, keeps: &str, cost: &str| {
        let mut r = Arc::unwrap_or_clone(rec(id, "a", 1000, used, NodeStatus::Alive, 0, false));
        let mut l = (*r.labels).clone();
        l.insert(POOL_KEEPS, keeps).unwrap();
        l.insert(POOL_COST, cost).unwrap();
        r.labels = Arc::new(l);
        Arc::new(r)
    };
    // The spot node is the tighter fit (Ray's score prefers it); the kept one wins.
    let s = slots(vec![pooled("spot", 500, "false", "60"), pooled("min", 0, "true", "200")]);
    let p = plan(&s, &Constraints::default(), &HashMap::new(), None, &members(1, 400)).unwrap();
    assert_eq!(p.members[0].node.as_str(), "min");
    // Neither kept: the cheaper.
    let s = slots(vec![pooled("gpu", 0, "false", "800"), pooled("spot", 500, "false", "60")]);
    let p = plan(&s, &Constraints::default(), &HashMap::new(), None, &members(1, 400)).unwrap();
    assert_eq!(p.members[0].node.as_str(), "spot");
}

#[test]
fn a_unit_stays_in_one_domain_on_nodes_that_fit() {
    let s = slots(vec![
        rec("a1", "a", 1000, 900, NodeStatus::Alive, 0, false),
        rec("a2", "a", 1000, 0, NodeStatus::Alive, 0, false),
        rec("b1", "b", 1000, 0, NodeStatus::Alive, 0, false),
    ]);
    let p = plan(&s, &Constraints::default(), &HashMap::new(), None, &members(2, 400)).unwrap();
    let nodes: Vec<_> = p.members.iter().map(|m| m.node.as_str().to_string()).collect();
    let domain = &p.domain;
    assert!(nodes.iter().all(|n| n.starts_with(domain.as_str())), "{nodes:?} in {domain}");
    assert!(!nodes.contains(&"a1".to_string()), "a1 has only 100m free");
}

/// Named ports count as the `ports` resource agents offer: a node whose agent has
/// too few left is not chosen, and the reason says ports.
#[test]
fn a_node_without_enough_free_ports_is_not_chosen() {
    let with_ports = |id: &str, offered: u64, held: u64| {
        let mut r = Arc::unwrap_or_clone(rec(id, "a", 4000, 0, NodeStatus::Alive, 0, false));
        Arc::make_mut(&mut r.capacity).custom.insert("ports".into(), offered);
        Arc::make_mut(&mut r.allocated).custom.insert("ports".into(), held);
        r
    };
    let mut m = members(1, 100);
    m[0].options[0].1.resources.custom.insert("ports".into(), 10);
    let s = crate::testing::slots([with_ports("a1", 50, 45), with_ports("a2", 50, 0)], true);
    let p = plan(&s, &Constraints::default(), &HashMap::new(), None, &m).unwrap();
    assert_eq!(p.members[0].node.as_str(), "a2", "a1 has 5 ports left");
    let s = crate::testing::slots([with_ports("a1", 50, 45)], true);
    let err = plan(&s, &Constraints::default(), &HashMap::new(), None, &m).unwrap_err();
    assert!(err.to_string().contains("1 nodes lacking free ports"), "{err}");
}

#[test]
fn spread_prefers_emptier_domains_and_respects_the_cap() {
    let s = slots(vec![
        rec("a1", "a", 4000, 0, NodeStatus::Alive, 0, false),
        rec("b1", "b", 4000, 0, NodeStatus::Alive, 0, false),
    ]);
    let per = HashMap::from([("a".to_string(), 2)]);
    assert_eq!(plan(&s, &Constraints::default(), &per, None, &members(1, 100)).unwrap().domain, "b");
    let per = HashMap::from([("a".to_string(), 1), ("b".to_string(), 1)]);
    let err = plan(&s, &Constraints::default(), &per, Some(1), &members(1, 100)).unwrap_err();
    assert_eq!(err.domains_full, 2);
}

#[test]
fn the_reason_counts_each_filter() {
    let s = slots(vec![
        rec("a1", "a", 1000, 0, NodeStatus::Dead, 0, false),
        rec("a2", "a", 1000, 0, NodeStatus::Alive, 0, true),
        rec("a3", "a", 100, 0, NodeStatus::Alive, 0, false),
    ]);
    let err = plan(&s, &Constraints::default(), &HashMap::new(), None, &members(1, 500)).unwrap_err();
    assert_eq!(err.excluded.get("not alive"), Some(&1));
    assert_eq!(err.excluded.get("of low priority"), Some(&1));
    assert_eq!(err.excluded.get("lacking resources"), Some(&1));
    assert!(err.to_string().contains("1 nodes not alive"), "{err}");
    let allow = Constraints { allow_low_priority: true, ..Default::default() };
    assert_eq!(plan(&s, &allow, &HashMap::new(), None, &members(1, 500)).unwrap().members[0].node.as_str(), "a2");
    let pick = Constraints { labels: [("zone".to_string(), "z9".to_string())].into(), allow_low_priority: true };
    assert!(
        plan(&s, &pick, &HashMap::new(), None, &members(1, 10))
            .unwrap_err()
            .excluded
            .contains_key("failing label constraints")
    );
}

#[test]
fn cordoned_nodes_are_skipped_and_counted() {
    let mut cordoned = (*rec("a1", "a", 1000, 0, NodeStatus::Alive, 0, false)).clone();
    cordoned.cordoned = true;
    let s = slots(vec![Arc::new(cordoned), rec("a2", "a", 1000, 0, NodeStatus::Alive, 0, false)]);
    let p = plan(&s, &Constraints::default(), &HashMap::new(), None, &members(1, 100)).unwrap();
    assert_eq!(p.members[0].node.as_str(), "a2");
    let s = slots(vec![{
        let mut r = (*rec("a1", "a", 1000, 0, NodeStatus::Alive, 0, false)).clone();
        r.cordoned = true;
        Arc::new(r)
    }]);
    let err = plan(&s, &Constraints::default(), &HashMap::new(), None, &members(1, 100)).unwrap_err();
    assert_eq!(err.excluded.get("cordoned"), Some(&1));
}

#[test]
fn members_of_one_unit_do_not_overbook_a_node_together() {
    let s = slots(vec![rec("a1", "a", 1000, 0, NodeStatus::Alive, 0, false)]);
    assert!(plan(&s, &Constraints::default(), &HashMap::new(), None, &members(2, 600)).is_err());
    assert!(plan(&s, &Constraints::default(), &HashMap::new(), None, &members(2, 500)).is_ok());
}

#[test]
fn scores_pack_tightly_and_keep_gpus_free() {
    let busy = rec("a", "d", 1000, 500, NodeStatus::Alive, 0, false);
    let idle = rec("b", "d", 1000, 0, NodeStatus::Alive, 0, false);
    let gpu = rec("c", "d", 1000, 500, NodeStatus::Alive, 1, false);
    let req = Resources::new(100, 0, 0);
    let after = |r: &NodeRecord| r.allocated.checked_add(&req).unwrap();
    assert!(score(&busy, &after(&busy), &req) > score(&idle, &after(&idle), &req), "bin packing");
    assert!(score(&idle, &after(&idle), &req) > score(&gpu, &after(&gpu), &req), "GPU nodes last for CPU work");
}

#[test]
fn a_full_domain_is_not_rescanned_for_the_same_class() {
    let s = slots(vec![rec("a1", "a", 100, 0, NodeStatus::Alive, 0, false)]);
    let (pending, per, per_node) = (NodeMap::default(), HashMap::new(), NodeMap::default());
    let input = PlanInput::new(&s, &per, &per_node, &pending);
    let mut cache = ClassCache::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let first = place_unit(&input, &members(1, 500), &mut cache, &mut rng).unwrap_err();
    assert_eq!(first.domains_tried, 1);
    let second = place_unit(&input, &members(1, 500), &mut cache, &mut rng).unwrap_err();
    assert_eq!(second.domains_tried, 0, "known full at this version");
}

fn node_id(s: &str) -> NodeId {
    NodeId::new(s).unwrap()
}

/// Places `n` units one after another as the scheduler does (counting each placed
/// unit on its nodes), and returns each unit's nodes and note.
fn place_many(s: &[Arc<ShardSlot>], n: usize, tune: impl Fn(&mut PlanInput<'_>)) -> Vec<(Vec<String>, Option<String>)> {
    let per_domain: HashMap<String, u32> = HashMap::new();
    let mut pending: NodeMap<Resources> = NodeMap::default();
    let mut per_node: NodeMap<u32> = NodeMap::default();
    let mut out = Vec::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    for _ in 0..n {
        let mut input = PlanInput::new(s, &per_domain, &per_node, &pending);
        tune(&mut input);
        let Ok(p) = place_unit(&input, &members(2, 100), &mut ClassCache::default(), &mut rng) else { break };
        for m in &p.members {
            let e = pending.entry(m.node.clone()).or_default();
            *e = e.checked_add(&Resources::new(100, 1 << 20, 0)).unwrap();
        }
        let mut nodes: Vec<String> = p.members.iter().map(|m| m.node.to_string()).collect();
        nodes.dedup();
        for n in &nodes {
            *per_node.entry(node_id(n)).or_default() += 1;
        }
        out.push((nodes, p.note));
    }
    out
}

fn four_nodes() -> Vec<Arc<ShardSlot>> {
    slots((1..=4).map(|i| rec(&format!("a{i}"), "a", 4000, 0, NodeStatus::Alive, 0, false)).collect())
}

#[test]
fn soft_spread_puts_units_on_distinct_nodes_while_nodes_allow_and_says_when_not() {
    let placed = place_many(&four_nodes(), 6, |i| i.prefer_spread = true);
    let firsts: std::collections::BTreeSet<&String> = placed[..4].iter().map(|(n, _)| &n[0]).collect();
    assert_eq!(firsts.len(), 4, "four units on four distinct nodes: {placed:?}");
    assert!(placed[..4].iter().all(|(n, note)| n.len() == 1 && note.is_none()), "{placed:?}");
    let note = placed[4].1.as_deref().unwrap_or_default();
    assert!(note.contains("2 units on a") && note.contains("only 4 nodes fit"), "{note}");
    // Without the preference (a batch app), bin packing stacks units on one node.
    let packed = place_many(&four_nodes(), 4, |_| {});
    assert!(packed.iter().all(|(n, note)| n == &packed[0].0 && note.is_none()), "{packed:?}");
}

#[test]
fn max_units_per_node_is_a_hard_limit_a_surge_may_pass() {
    let placed = place_many(&four_nodes(), 9, |i| {
        i.prefer_spread = true;
        i.max_units_per_node = Some(2);
    });
    assert_eq!(placed.len(), 8, "four nodes of two units each, then no room: {placed:?}");
    let s = four_nodes();
    let per_node: NodeMap<u32> = (1..=4).map(|i| (node_id(&format!("a{i}")), 2)).collect();
    let (pending, per_domain) = (NodeMap::default(), HashMap::new());
    let full = PlanInput { max_units_per_node: Some(2), ..PlanInput::new(&s, &per_domain, &per_node, &pending) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let err = place_unit(&full, &members(1, 100), &mut ClassCache::default(), &mut rng).unwrap_err();
    assert_eq!(err.excluded.get("at max_units_per_node"), Some(&4));
    let surge = PlanInput { surge: 1, ..full };
    let p = place_unit(&surge, &members(1, 100), &mut ClassCache::default(), &mut rng).unwrap();
    let note = p.note.unwrap_or_default();
    assert!(note.contains("surge: 3 units on a") && note.contains("max_units_per_node 2 while 1 leave"), "{note}");
}

#[test]
fn a_surge_passes_max_units_per_domain_by_the_units_leaving() {
    let s = slots(vec![rec("a1", "a", 4000, 0, NodeStatus::Alive, 0, false)]);
    let (pending, per_node) = (NodeMap::default(), NodeMap::default());
    let per_domain = HashMap::from([("a".to_string(), 3)]);
    let full = PlanInput { max_units_per_domain: Some(3), ..PlanInput::new(&s, &per_domain, &per_node, &pending) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    assert_eq!(place_unit(&full, &members(1, 1), &mut ClassCache::default(), &mut rng).unwrap_err().domains_full, 1);
    let p = place_unit(&PlanInput { surge: 1, ..full }, &members(1, 1), &mut ClassCache::default(), &mut rng).unwrap();
    let note = p.note.unwrap_or_default();
    assert!(note.contains("surge: 4 units in a, above max_units_per_domain 3 while 1 leave"), "{note}");
    let per_domain = HashMap::from([("a".to_string(), 4)]);
    let past =
        PlanInput { surge: 1, max_units_per_domain: Some(3), ..PlanInput::new(&s, &per_domain, &per_node, &pending) };
    assert!(place_unit(&past, &members(1, 1), &mut ClassCache::default(), &mut rng).is_err(), "by 1, no more");
}

#[test]
fn members_pack_on_one_node_or_spread_over_distinct_nodes() {
    let s = four_nodes();
    let (pending, per_domain, per_node) = (NodeMap::default(), HashMap::new(), NodeMap::default());
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let nodes = |p: &Placement| p.members.iter().map(|m| m.node.to_string()).collect::<std::collections::BTreeSet<_>>();
    let spread =
        PlanInput { members: Some(MemberSpread::Spread), ..PlanInput::new(&s, &per_domain, &per_node, &pending) };
    let p = place_unit(&spread, &members(4, 100), &mut ClassCache::default(), &mut rng).unwrap();
    assert_eq!(nodes(&p).len(), 4, "{p:?}");
    let err = place_unit(&spread, &members(5, 100), &mut ClassCache::default(), &mut rng).unwrap_err();
    assert!(err.excluded.contains_key("holding another member of the unit (spread.members)"), "{err}");
    let pack = PlanInput { members: Some(MemberSpread::Pack), ..PlanInput::new(&s, &per_domain, &per_node, &pending) };
    let p = place_unit(&pack, &members(4, 900), &mut ClassCache::default(), &mut rng).unwrap();
    assert_eq!(nodes(&p).len(), 1, "{p:?}");
    assert_eq!(p.members.len(), 4);
    assert!(place_unit(&pack, &members(5, 900), &mut ClassCache::default(), &mut rng).is_err(), "4500m on 4000m");
    // A member placed alone keeps off the nodes its unit already holds.
    let held = [node_id("a1"), node_id("a2"), node_id("a3")];
    let alone = PlanInput { unit_nodes: &held, ..spread };
    let p = place_unit(&alone, &members(1, 100), &mut ClassCache::default(), &mut rng).unwrap();
    assert_eq!(p.members[0].node.as_str(), "a4");
}

#[test]
fn a_replacement_prefers_the_domain_its_unit_leaves() {
    let s = slots(vec![
        rec("a1", "a", 4000, 0, NodeStatus::Alive, 0, false),
        rec("b1", "b", 4000, 0, NodeStatus::Alive, 0, false),
    ]);
    let (pending, per_node) = (NodeMap::default(), NodeMap::default());
    let per_domain = HashMap::from([("a".to_string(), 3), ("b".to_string(), 2)]);
    for seed in 0..8 {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let input = PlanInput {
            prefer_domain: Some("a"),
            surge: 1,
            max_units_per_domain: Some(3),
            ..PlanInput::new(&s, &per_domain, &per_node, &pending)
        };
        let p = place_unit(&input, &members(1, 1), &mut ClassCache::default(), &mut rng).unwrap();
        assert_eq!(p.domain, "a", "a holds 2 once its unit leaves, b 2: the old domain first");
    }
}

/// A member with alternatives takes the first whose selector and resources some node
/// can hold, and the placement says which; the unit's other members keep their own
/// selectors (a CPU head never lands on the GPU node it does not need).
#[test]
fn a_member_runs_as_the_first_alternative_a_node_can_hold() {
    let gpu_node = |id: &str, model: &str| {
        let mut r = Arc::unwrap_or_clone(rec(id, "d", 8000, 0, NodeStatus::Alive, 1, false));
        let mut l = (*r.labels).clone();
        l.insert("gpu_model", model).unwrap();
        r.labels = Arc::new(l);
        Arc::new(r)
    };
    let s = slots(vec![rec("cpu", "d", 4000, 0, NodeStatus::Alive, 0, false), gpu_node("l4", "l4")]);
    let only = |model: &str| NodeSelector {
        labels: [("gpu_model".to_string(), [model.to_string()].into())].into(),
        allow_low_priority: false,
    };
    let gpu =
        |k: u32, model: &str| (k, MemberOption { resources: Resources::new(1000, 1 << 20, 1), selector: only(model) });
    let head = MemberRequest::plain("head", Resources::new(1000, 1 << 20, 0));
    let worker = MemberRequest { member: "gpu-0".into(), options: vec![gpu(0, "a100"), gpu(1, "l4")] };
    let p = plan(&s, &Constraints::default(), &HashMap::new(), None, &[head.clone(), worker]).unwrap();
    let at: Vec<(&str, &str, u32)> =
        p.members.iter().map(|m| (m.member.as_str(), m.node.as_str(), m.alternative)).collect();
    assert_eq!(at, [("head", "cpu", 0), ("gpu-0", "l4", 1)]);
    // No option fits: the unit is not placed, and the reason counts the labels.
    let worker = MemberRequest { member: "gpu-0".into(), options: vec![gpu(0, "a100")] };
    let err = plan(&s, &Constraints::default(), &HashMap::new(), None, &[head, worker]).unwrap_err();
    assert!(err.to_string().contains("failing label constraints"), "{err}");
}

/// GPU nodes are kept for GPU work before spread: a CPU-only member of a serving app
/// goes to the CPU node holding one of its units rather than the empty GPU node.
#[test]
fn a_cpu_member_keeps_off_gpu_nodes_before_spreading() {
    let s = slots(vec![
        rec("cpu", "d", 4000, 0, NodeStatus::Alive, 0, false),
        rec("gpu", "d", 4000, 0, NodeStatus::Alive, 1, false),
    ]);
    let (pending, per_domain) = (NodeMap::default(), HashMap::new());
    let per_node: NodeMap<u32> = [(node_id("cpu"), 1)].into_iter().collect();
    let input = PlanInput { prefer_spread: true, ..PlanInput::new(&s, &per_domain, &per_node, &pending) };
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let p = place_unit(&input, &members(1, 100), &mut ClassCache::default(), &mut rng).unwrap();
    assert_eq!(p.members[0].node.as_str(), "cpu");
}
