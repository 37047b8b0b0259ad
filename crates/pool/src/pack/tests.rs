use super::Strategy;
use super::*;
use crate::shape::{CPU, GPU, MEMORY};
use proptest::prelude::{ProptestConfig, prop, prop_assert_eq, proptest};

const GIB: u64 = 1 << 30;

fn shape(cpu: u64, mem_gib: u64, gpu: u64) -> Shape {
    Shape(vec![cpu * 1000, mem_gib * GIB, gpu * 1000])
}

fn ty(name: &str, s: Shape, max: u32) -> NodeType {
    NodeType { name: name.into(), resources: s, labels: Labels::new(), min: 0, max, cost: None, idle_timeout_ms: None }
}

fn req(s: Shape, count: u64) -> Request {
    Request { shape: s, count, selector: Selector::default(), per_node: None }
}

fn node(id: &str, t: &NodeType, available: Shape, idle_ms: u64) -> Node {
    Node {
        id: id.into(),
        node_type: Some(t.name.clone()),
        total: t.resources.clone(),
        available,
        labels: t.labels.clone(),
        idle_ms,
        pending: false,
    }
}

fn launched(p: &Plan) -> Vec<(&str, u32)> {
    p.launch.iter().map(|(k, v)| (k.as_str(), *v)).collect()
}

#[test]
fn a_two_gpu_request_picks_the_six_gpu_type_over_two_gpus_and_a_tpu() {
    // Ray's documented example: [GPU: 6] wins over [GPU: 2, TPU: 1] for a 2-GPU request,
    // because the TPU would sit idle (minimum utilisation 0).
    let mut names = ResourceNames::default();
    let tpu = names.intern("TPU").unwrap();
    let mut small = Shape::zero(4);
    small.set(GPU, 2000);
    small.set(tpu, 1000);
    let mut big = Shape::zero(4);
    big.set(GPU, 6000);
    let mut ask = Shape::zero(4);
    ask.set(GPU, 2000);
    let p = Problem {
        names,
        node_types: vec![ty("gpu2-tpu1", small, 10), ty("gpu6", big, 10)],
        requests: vec![req(ask, 1)],
        ..Default::default()
    };
    assert_eq!(launched(&plan(&p)), vec![("gpu6", 1)]);
}

#[test]
fn cpu_work_stays_off_gpu_nodes_and_fills_existing_capacity_first() {
    let cpu = ty("cpu-16", shape(16, 64, 0), 10);
    let gpu = ty("gpu-4", shape(64, 256, 4), 10);
    let p = Problem {
        node_types: vec![gpu.clone(), cpu.clone()],
        nodes: vec![node("old", &cpu, shape(4, 16, 0), 0)],
        requests: vec![req(shape(2, 4, 0), 10)],
        ..Default::default()
    };
    let out = plan(&p);
    // 2 fit on the existing node, 8 × 2 CPU = 16 CPU: one new 16-CPU node.
    assert_eq!(launched(&out), vec![("cpu-16", 1)]);
    assert_eq!(out.needed, vec!["old".to_string()]);
    assert!(out.infeasible.is_empty());
}

#[test]
fn min_max_and_max_nodes_are_enforced() {
    let mut a = ty("a", shape(4, 8, 0), 2);
    a.min = 1;
    let b = ty("b", shape(8, 16, 0), 5);
    let p = Problem {
        node_types: vec![a.clone(), b.clone()],
        nodes: (0..4).map(|i| node(&format!("b{i}"), &b, shape(8, 16, 0), i * 1000)).collect(),
        max_nodes: Some(5),
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("a", 1)], "min = 1 launches one a");
    assert!(out.terminate.is_empty());
    let p = Problem { max_nodes: Some(4), ..p };
    let out = plan(&p);
    // 5 nodes against max_nodes 4: as in Ray, a node not yet running goes first (so
    // min across types must fit within max_nodes, which the pool file checks).
    assert!(out.launch.is_empty());
    let p = Problem { max_nodes: Some(3), ..p };
    let out = plan(&p);
    assert!(out.launch.is_empty());
    // Then the one idle longest.
    assert_eq!(out.terminate.len(), 1, "{:?}", out.terminate);
    assert_eq!(out.terminate[0].node_id, "b3");
    assert_eq!(out.terminate[0].cause, Cause::MaxNodes);

    let mut small = ty("b", shape(8, 16, 0), 1);
    small.max = 1;
    let p = Problem {
        node_types: vec![small.clone()],
        nodes: vec![node("busy", &small, shape(0, 0, 0), 0), node("idle", &small, shape(8, 16, 0), 5000)],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(
        out.terminate.iter().map(|t| (t.node_id.as_str(), t.cause)).collect::<Vec<_>>(),
        vec![("idle", Cause::MaxPerType)]
    );
}

#[test]
fn gangs_are_all_or_nothing_and_honour_their_strategy() {
    let t = ty("cpu-8", shape(8, 32, 0), 10);
    let gang = |id: &str, strategy, n: usize, cpu: u64| Gang {
        id: id.into(),
        strategy,
        bundles: vec![Bundle::new(shape(cpu, 1, 0)); n],
        alternatives: Vec::new(),
        same: None,
        per_node: None,
        per_domain: None,
    };
    let p = Problem {
        node_types: vec![t.clone()],
        gangs: vec![gang("spread", Strategy::StrictSpread, 3, 1)],
        ..Default::default()
    };
    assert_eq!(launched(&plan(&p)), vec![("cpu-8", 3)], "three 1-CPU bundles, one per node");
    let p = Problem {
        node_types: vec![t.clone()],
        gangs: vec![gang("pack", Strategy::StrictPack, 4, 2)],
        ..Default::default()
    };
    assert_eq!(launched(&plan(&p)), vec![("cpu-8", 1)], "four 2-CPU bundles on one node");
    let p = Problem {
        node_types: vec![t.clone()],
        gangs: vec![gang("too-packed", Strategy::StrictPack, 5, 2), gang("too-big", Strategy::Pack, 2, 9)],
        ..Default::default()
    };
    let out = plan(&p);
    assert!(out.launch.is_empty(), "nothing launched for gangs that cannot be placed whole: {:?}", out.launch);
    let reasons: Vec<_> = out.infeasible.iter().map(|i| (i.request.as_str(), i.reason.as_str())).collect();
    assert_eq!(
        reasons,
        vec![
            ("gang too-packed", "STRICT_PACK: the bundles together are bigger than every node type"),
            ("gang too-big", "a bundle is bigger than every node type"),
        ]
    );
    // Limits: a spread of 3 with room for 2 nodes places nothing.
    let mut two = t.clone();
    two.max = 2;
    let p = Problem {
        node_types: vec![two],
        gangs: vec![gang("spread", Strategy::StrictSpread, 3, 1)],
        ..Default::default()
    };
    let out = plan(&p);
    assert!(out.launch.is_empty());
    assert_eq!(out.infeasible[0].request, "gang spread");
}

#[test]
fn a_units_members_share_one_domain() {
    let with_domain = |name: &str, d: &str, max| {
        let mut t = ty(name, shape(4, 8, 0), max);
        t.labels.insert("domain".into(), d.into());
        t
    };
    let a = with_domain("a", "domain-a", 10);
    let b = with_domain("b", "domain-b", 10);
    // domain-b has a free node that holds one member; the other needs a new node there.
    let p = Problem {
        node_types: vec![a.clone(), b.clone()],
        nodes: vec![node("b-old", &b, shape(4, 8, 0), 0)],
        gangs: vec![Gang {
            id: "unit".into(),
            strategy: Strategy::Pack,
            bundles: vec![Bundle::new(shape(3, 4, 0)), Bundle::new(shape(3, 4, 0))],
            alternatives: Vec::new(),
            same: Some("domain".into()),
            per_node: None,
            per_domain: None,
        }],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("b", 1)], "the domain needing fewer new nodes wins");
    assert_eq!(out.needed, vec!["b-old".to_string()]);
}

#[test]
fn selectors_keep_requests_off_forbidden_nodes() {
    let mut low = ty("low", shape(8, 16, 0), 10);
    low.labels.insert("priority".into(), "low".into());
    let mut high = ty("high", shape(8, 16, 0), 10);
    high.labels.insert("priority".into(), "high".into());
    let forbid = [("priority".to_string(), ["low".to_string()].into())].into();
    let p = Problem {
        node_types: vec![low.clone(), high.clone()],
        nodes: vec![node("free-low", &low, shape(8, 16, 0), 0)],
        requests: vec![Request {
            shape: shape(2, 2, 0),
            count: 1,
            selector: Selector { require: BTreeMap::new(), forbid },
            per_node: None,
        }],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("high", 1)]);
    assert!(out.needed.is_empty());
}

#[test]
fn the_floor_is_held_against_whole_capacity() {
    let t = ty("cpu-4", shape(4, 8, 0), 10);
    // A busy node still counts toward the floor: it asks for capacity, not free capacity.
    let p = Problem {
        node_types: vec![t.clone()],
        nodes: vec![node("busy", &t, shape(0, 0, 0), 0)],
        floor: vec![req(shape(1, 0, 0), 12)],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("cpu-4", 2)]);
    assert_eq!(out.launch_reasons["cpu-4"], vec!["2 for the floor (request_resources)".to_string()]);
}

#[test]
fn idle_nodes_go_after_their_timeout_unless_needed_or_at_min() {
    let mut t = ty("cpu-4", shape(4, 8, 0), 10);
    t.min = 1;
    t.idle_timeout_ms = Some(60_000);
    let free = shape(4, 8, 0);
    let p = Problem {
        node_types: vec![t.clone()],
        nodes: vec![
            node("long-idle", &t, free.clone(), 600_000),
            node("idle", &t, free.clone(), 120_000),
            node("fresh", &t, free.clone(), 10_000),
            node("busy", &t, shape(0, 0, 0), 0),
        ],
        requests: vec![req(shape(4, 8, 0), 1)],
        ..Default::default()
    };
    let out = plan(&p);
    assert!(out.launch.is_empty());
    // One idle node takes the request (the best fit); of the others only the ones past
    // the timeout go.
    let gone: Vec<_> = out.terminate.iter().map(|t| t.node_id.as_str()).collect();
    assert_eq!(out.needed.len(), 1);
    assert!(!gone.contains(&out.needed[0].as_str()));
    assert!(!gone.contains(&"fresh") && !gone.contains(&"busy"));
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert!(out.terminate.iter().all(|t| t.cause == Cause::Idle));

    // At min, nothing goes.
    let p = Problem { node_types: vec![t.clone()], nodes: vec![node("only", &t, free, 600_000)], ..Default::default() };
    assert!(plan(&p).terminate.is_empty());
}

#[test]
fn with_costs_the_cheapest_capacity_per_request_wins() {
    let mut small = ty("small", shape(4, 16, 0), 100);
    let mut big = ty("big", shape(16, 64, 0), 100);
    small.cost = Some(1.0);
    big.cost = Some(3.0);
    let p = Problem {
        node_types: vec![small.clone(), big.clone()],
        requests: vec![req(shape(1, 4, 0), 16)],
        ..Default::default()
    };
    assert_eq!(launched(&plan(&p)), vec![("big", 1)], "16 per node at 3.0 beats 4 per node at 1.0");
    big.cost = Some(5.0);
    let p = Problem { node_types: vec![small, big], requests: vec![req(shape(1, 4, 0), 16)], ..Default::default() };
    assert_eq!(launched(&plan(&p)), vec![("small", 4)]);
}

#[test]
fn infeasible_requests_are_named_with_the_reason() {
    let p = Problem {
        node_types: vec![ty("cpu-4", shape(4, 8, 0), 1)],
        requests: vec![req(shape(1, 1, 0), 6), req(shape(8, 1, 0), 1)],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("cpu-4", 1)]);
    let mut got: Vec<_> = out.infeasible.iter().map(|i| (i.request.clone(), i.count, i.reason.clone())).collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("request[0]".into(), 2, "the node types' max or max_nodes is reached".into()),
            ("request[1]".into(), 1, "no node type is big enough".into()),
        ]
    );
}

/// Ray's loop without grouping: every request on its own, in the sorted order.
fn reference(types: &[NodeType], requests: &[(Shape, u64)], names: &ResourceNames) -> BTreeMap<String, u32> {
    let mut reqs: Vec<Shape> = Vec::new();
    for (s, n) in requests {
        for _ in 0..*n {
            reqs.push(s.clone());
        }
    }
    let key = |s: &Shape| {
        let sum: f64 = s.0.iter().enumerate().map(|(i, q)| names.to_value(i, *q)).sum();
        (s.kinds().count(), sum)
    };
    reqs.sort_by(|a, b| {
        let (x, y) = (key(a), key(b));
        y.0.cmp(&x.0).then(y.1.total_cmp(&x.1)).then(b.cmp(a))
    });
    let mut room: Vec<u32> = types.iter().map(|t| t.max).collect();
    let mut order: Vec<usize> = (0..types.len()).collect();
    let mut out = BTreeMap::new();
    while !reqs.is_empty() && !order.is_empty() {
        let mut best: Option<(usize, Vec<Shape>, node::Score)> = None;
        for (oi, t) in order.iter().enumerate() {
            let mut n = SimNode::new(
                Origin::New(*t),
                Some(*t),
                types[*t].resources.clone(),
                types[*t].resources.clone(),
                Arc::new(Labels::new()),
            );
            let g = |s: &Shape| Group {
                shape: s.clone(),
                selector: Arc::new(Selector::default()),
                anti: None,
                cap: None,
                kinds: s.kinds().fold(0, |m, i| m | (1 << i)),
                sources: vec![],
            };
            let mut rest = Vec::new();
            for r in &reqs {
                let gr = g(r);
                if n.room_for(&gr, Source::Demand, 1) == 1 {
                    n.place(&gr, Source::Demand, 1);
                } else {
                    rest.push(r.clone());
                }
            }
            if rest.len() == reqs.len() {
                continue;
            }
            let score = n.score(Source::Demand, names, None);
            if best.as_ref().is_none_or(|b| score.cmp(&b.2).is_gt()) {
                best = Some((oi, rest, score));
            }
        }
        let Some((oi, rest, _)) = best else { break };
        let t = order.remove(oi);
        room[t] -= 1;
        if room[t] > 0 {
            order.push(t);
        }
        *out.entry(types[t].name.clone()).or_default() += 1;
        reqs = rest;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    /// Grouping identical requests changes the speed, never the packing.
    #[test]
    fn grouped_packing_equals_request_by_request(
        shapes in prop::collection::vec((1u64..9, 1u64..40, 0u64..3, 1u64..12), 1..6),
        maxes in prop::collection::vec(1u32..30, 3),
    ) {
        let names = ResourceNames::default();
        let types = vec![
            ty("cpu-8", shape(8, 32, 0), maxes[0]),
            ty("mem-16", shape(16, 128, 0), maxes[1]),
            ty("gpu-4", shape(32, 128, 4), maxes[2]),
        ];
        let requests: Vec<(Shape, u64)> = shapes.iter().map(|(c, m, g, n)| (shape(*c, *m, *g), *n)).collect();
        let p = Problem {
            node_types: types.clone(),
            requests: requests.iter().map(|(s, n)| req(s.clone(), *n)).collect(),
            ..Default::default()
        };
        prop_assert_eq!(plan(&p).launch, reference(&types, &requests, &names));
    }
}

#[test]
fn waste_is_measured_on_the_new_nodes() {
    let p = Problem {
        node_types: vec![ty("t", shape(4, 16, 0), 10)],
        requests: vec![req(shape(1, 2, 0), 6)],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("t", 2)]);
    assert_eq!(out.new_capacity.get(CPU), 8000);
    assert_eq!(out.new_used.get(CPU), 6000);
    assert_eq!(out.new_used.get(MEMORY), 12 * GIB);
}

proptest::proptest! {
    /// The pool packs a member only where its scheduler would place it: the selector the
    /// packer matches says what `UnitShape::admits` says, for any node labels and any
    /// option (each label one of a set of values, which may be empty or name the
    /// priority or the domain).
    #[test]
    fn a_members_selector_admits_exactly_the_nodes_its_scheduler_would(
        required in proptest::collection::btree_map(
            "(zone|gpu|priority|domain)",
            proptest::collection::btree_set("(a|b|low|domain-a)", 0..3),
            0..3,
        ),
        allow_low_priority: bool,
        secondary: bool,
        units_per_domain in proptest::collection::btree_map("domain-(a|b|c)", 0u32..4, 0..3),
        max_units_per_domain in proptest::option::of(1u32..3),
        node in proptest::collection::btree_map("(zone|gpu|priority|domain)", "(a|b|low|high|domain-a|domain-b|domain-c)", 0..4),
    ) {
        let shape = flotilla_core::UnitShape { units_per_domain, max_units_per_domain, ..Default::default() };
        let option = flotilla_core::MemberOption {
            resources: flotilla_core::Resources::default(),
            selector: flotilla_core::NodeSelector { labels: required, allow_low_priority },
        };
        // The pool gives every node a domain label (the default one when it has none).
        let mut labels = node;
        labels.entry("domain".into()).or_insert_with(|| flotilla_core::DEFAULT_DOMAIN.into());
        let admitted = shape.admits(&option, |k| labels.get(k).map(String::as_str), secondary).is_ok();
        proptest::prop_assert_eq!(Selector::for_member(&shape, &option, secondary).matches(&labels), admitted);
    }
}

/// A per-node limit caps units, not bundles: one-member units (plain requests) count
/// one each, a gang's bundles on one node count once.
#[test]
fn a_per_node_limit_caps_the_units_on_each_node() {
    let t = ty("cpu-8", shape(8, 32, 0), 10);
    let limit = |units: &[(&str, u32)]| Limit {
        app: "a".into(),
        max: 2,
        units: units.iter().map(|(n, c)| (n.to_string(), *c)).collect(),
    };
    let p = Problem {
        node_types: vec![t.clone()],
        nodes: vec![node("full", &t, shape(8, 32, 0), 0)],
        requests: vec![Request { per_node: Some(0), ..req(shape(1, 1, 0), 5) }],
        per_node: vec![limit(&[("full", 2)])],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("cpu-8", 3)], "two a node, none on the full one");
    assert!(out.needed.is_empty());

    let pack = |id: &str| Gang {
        id: id.into(),
        strategy: Strategy::Pack,
        bundles: vec![Bundle::new(shape(1, 1, 0)); 2],
        alternatives: Vec::new(),
        same: None,
        per_node: Some(0),
        per_domain: None,
    };
    let p = Problem {
        node_types: vec![t.clone()],
        gangs: (0..4).map(|i| pack(&format!("a/{i}"))).collect(),
        per_node: vec![limit(&[])],
        ..Default::default()
    };
    assert_eq!(launched(&plan(&p)), vec![("cpu-8", 2)], "a unit's two members count once");
}

/// A per-domain limit counts the units this pass places too: a domain with room for one
/// more unit gets one, not as many as its nodes hold (issue #34 item 1: the pool
/// launched into a domain the scheduler would then refuse).
#[test]
fn a_per_domain_limit_counts_the_units_this_pass_places() {
    let in_domain = |name: &str, d: &str| {
        let mut t = ty(name, shape(4, 16, 0), 10);
        t.labels.insert("domain".into(), d.into());
        t
    };
    let unit = |i: usize| Gang {
        id: format!("a/{i}"),
        strategy: Strategy::Pack,
        bundles: vec![Bundle::new(shape(1, 1, 0)); 2],
        alternatives: Vec::new(),
        same: Some("domain".into()),
        per_node: None,
        per_domain: Some(0),
    };
    let p = Problem {
        node_types: vec![in_domain("t-a", "domain-a"), in_domain("t-b", "domain-b")],
        gangs: (0..4).map(unit).collect(),
        per_domain: vec![Limit { app: "a".into(), max: 2, units: [("domain-a".to_string(), 1)].into() }],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("t-a", 1), ("t-b", 1)], "one more unit in domain-a, two in domain-b");
    assert_eq!(out.infeasible.len(), 1, "{:?}", out.infeasible);
    assert!(out.infeasible[0].reason.contains("max_units_per_domain"), "{:?}", out.infeasible);
}

/// Thousands of gangs list a handful of reasons per type, the rest folded into one.
#[test]
fn launch_reasons_stay_short_however_many_gangs() {
    let t = ty("cpu-8", shape(8, 32, 0), 1000);
    let gang = |i: usize| Gang {
        id: format!("g{i}"),
        strategy: Strategy::StrictSpread,
        bundles: vec![Bundle::new(shape(8, 1, 0)); 2],
        alternatives: Vec::new(),
        same: None,
        per_node: None,
        per_domain: None,
    };
    let p = Problem { node_types: vec![t], gangs: (0..50).map(gang).collect(), ..Default::default() };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("cpu-8", 100)]);
    let reasons = &out.launch_reasons["cpu-8"];
    assert_eq!(reasons.len(), MAX_REASONS + 1, "{reasons:?}");
    assert_eq!(reasons.last().map(String::as_str), Some("84 for 42 others"));
}

/// A type in `domain` with labels `extra`, costing `cost` an hour.
fn typed(name: &str, s: Shape, max: u32, cost: Option<f64>, labels: &[(&str, &str)]) -> NodeType {
    let mut t = ty(name, s, max);
    t.cost = cost;
    t.labels = labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    t
}

/// Only nodes whose `key` is one of `values`, never a low-priority one.
fn only(key: &str, values: &[&str]) -> Selector {
    let mut s = Selector::for_member(&Default::default(), &Default::default(), false);
    s.require.insert(key.into(), values.iter().map(|v| v.to_string()).collect());
    s
}

/// Allowed in either domain: the gang's one domain narrows it.
fn head() -> Bundle {
    Bundle { shape: shape(2, 4, 0), selector: only("domain", &["domain-a", "domain-b"]), group: "head".into() }
}

fn gpu_on(models: &[&str]) -> Bundle {
    Bundle { shape: shape(8, 32, 1), selector: only("gpu_model", models), group: "gpu".into() }
}

/// A unit of a CPU head and a GPU worker, in one domain, its worker on `models` first,
/// then on each of `then`.
fn unit(id: &str, models: &[&str], then: &[&[&str]]) -> Gang {
    Gang {
        id: id.into(),
        strategy: Strategy::Pack,
        bundles: vec![head(), gpu_on(models)],
        alternatives: then.iter().map(|m| vec![head(), gpu_on(m)]).collect(),
        same: Some("domain".into()),
        per_node: None,
        per_domain: None,
    }
}

/// Issue: heterogeneous units. The GPU worker goes to the type its labels ask for, the
/// head to a CPU node in the same domain, never the other way round.
#[test]
fn each_member_of_a_unit_goes_to_a_type_its_own_selector_allows() {
    let a = [("domain", "domain-a")];
    let cpu = typed("cpu", shape(16, 64, 0), 10, Some(0.5), &a);
    let cpu_b = typed("cpu-b", shape(16, 64, 0), 10, Some(0.1), &[("domain", "domain-b")]);
    let a100 = typed("a100", shape(32, 128, 2), 10, Some(4.0), &[("domain", "domain-a"), ("gpu_model", "a100")]);
    let types = vec![a100.clone(), cpu_b.clone(), cpu.clone()];
    // With costs, a node for the head alone is cheaper per member than the GPU node
    // holding both: one of each type, both in domain-a (the only one with an a100 type,
    // although domain-b's CPU type is cheaper).
    let p = Problem { node_types: types.clone(), gangs: vec![unit("u/0", &["a100"], &[])], ..Default::default() };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("a100", 1), ("cpu", 1)], "{:?}", out.infeasible);
    assert_eq!(out.new_used.get(GPU), 1000);
    // A free CPU node takes the head, costs or not (existing nodes are filled before
    // new ones), the one in the GPU worker's domain; only the worker needs a new node.
    let uncosted: Vec<NodeType> = types.iter().cloned().map(|t| NodeType { cost: None, ..t }).collect();
    let p = Problem {
        node_types: uncosted.clone(),
        nodes: vec![node("cpu-free", &cpu, shape(16, 64, 0), 0), node("b-free", &cpu_b, shape(16, 64, 0), 0)],
        gangs: vec![unit("u/0", &["a100"], &[])],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("a100", 1)]);
    assert_eq!(out.needed, vec!["cpu-free".to_string()]);
    // With no costs and no free node, Ray's score is per node: a GPU node holding GPU
    // work is "ok" and matches more resource kinds, so it takes the head as well (one
    // node, not two), as Ray would; the scheduler then has no CPU node to prefer.
    let p = Problem { node_types: uncosted, gangs: vec![unit("u/0", &["a100"], &[])], ..Default::default() };
    assert_eq!(launched(&plan(&p)), vec![("a100", 1)]);
}

/// Issue: when the preferred GPU type reaches its max, further units use the
/// alternative; while it has room, the alternative is not used even if cheaper.
#[test]
fn a_gang_falls_back_to_its_alternative_when_its_preferred_type_is_at_max() {
    let a = [("domain", "domain-a")];
    let cpu = typed("cpu", shape(16, 64, 0), 10, Some(0.4), &a);
    let a100 = typed("a100", shape(16, 64, 1), 1, Some(4.0), &[("domain", "domain-a"), ("gpu_model", "a100")]);
    let l4 = typed("l4", shape(16, 64, 1), 10, Some(1.0), &[("domain", "domain-a"), ("gpu_model", "l4")]);
    let types = vec![cpu.clone(), a100.clone(), l4.clone()];
    // The a100 type at its max, its one node full: the next unit takes an l4.
    let p = Problem {
        node_types: types.clone(),
        nodes: vec![node("a100-busy", &a100, shape(0, 0, 0), 0)],
        gangs: vec![unit("u/0", &["a100"], &[&["l4"]])],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("cpu", 1), ("l4", 1)], "{:?}", out.infeasible);
    assert!(out.infeasible.is_empty());
    // Two units, room for one a100: the first takes it, the second an l4; both heads
    // share one CPU node.
    let p = Problem {
        node_types: types,
        gangs: vec![unit("u/0", &["a100"], &[&["l4"]]), unit("u/1", &["a100"], &[&["l4"]])],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("a100", 1), ("cpu", 1), ("l4", 1)], "{:?}", out.infeasible);
    assert!(out.launch_reasons["l4"].iter().any(|r| r.contains("gang u/1")), "{:?}", out.launch_reasons);
    // Without the alternative the second unit waits, for the type's max.
    let p = Problem {
        node_types: vec![cpu, a100],
        gangs: vec![unit("u/0", &["a100"], &[]), unit("u/1", &["a100"], &[])],
        ..Default::default()
    };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("a100", 1), ("cpu", 1)]);
    let reasons: Vec<_> = out.infeasible.iter().map(|i| (i.request.as_str(), i.reason.as_str())).collect();
    assert_eq!(reasons, vec![("gang u/1", "no single domain can hold every bundle within the pool's limits")]);
}

/// Issue: a group no node type can hold in any of its options is infeasible, and the
/// reason names it and what it asks for; other groups are not blamed.
#[test]
fn a_group_no_type_can_hold_is_named_in_the_reason() {
    let cpu = typed("cpu", shape(16, 64, 0), 10, None, &[("domain", "domain-a")]);
    let a100 = typed("a100", shape(16, 64, 1), 10, None, &[("domain", "domain-a"), ("gpu_model", "a100")]);
    let mut huge = unit("u/huge", &["a100"], &[]);
    huge.bundles[1].shape = shape(8, 32, 4);
    let p = Problem {
        node_types: vec![cpu, a100],
        gangs: vec![unit("u/0", &["h100", "v100"], &[&["b200"]]), huge],
        ..Default::default()
    };
    let out = plan(&p);
    assert!(out.launch.is_empty(), "{:?}", out.launch);
    let reasons: Vec<_> = out.infeasible.iter().map(|i| (i.request.as_str(), i.count, i.reason.as_str())).collect();
    assert_eq!(
        reasons,
        vec![
            (
                "gang u/0",
                2,
                "group \"gpu\": no node type with the labels it asks for (gpu_model = h100 | v100, priority != low) \
                 or (gpu_model = b200, priority != low) is big enough"
            ),
            ("gang u/huge", 2, "group \"gpu\": a member is bigger than every node type"),
        ]
    );
    // A plain request says what it asks for too.
    let p = Problem {
        node_types: vec![typed("cpu", shape(16, 64, 0), 10, None, &[])],
        requests: vec![Request { selector: only("gpu_model", &["a100"]), ..req(shape(1, 1, 0), 1) }],
        ..Default::default()
    };
    assert_eq!(
        plan(&p).infeasible[0].reason,
        "no node type with the labels it asks for (gpu_model = a100, priority != low) is big enough"
    );
}

/// A secondary unit may use low-priority nodes though its option does not allow them;
/// a primary one may not.
#[test]
fn a_secondary_unit_may_use_low_priority_types() {
    let low = typed("spot", shape(8, 32, 0), 10, None, &[("priority", "low")]);
    let option = flotilla_core::MemberOption::default();
    let member = |secondary| Selector::for_member(&Default::default(), &option, secondary);
    let gang = |id: &str, secondary| Gang {
        id: id.into(),
        strategy: Strategy::Pack,
        bundles: vec![Bundle { shape: shape(2, 2, 0), selector: member(secondary), group: "worker".into() }; 2],
        alternatives: Vec::new(),
        same: None,
        per_node: None,
        per_domain: None,
    };
    let p = Problem { node_types: vec![low.clone()], gangs: vec![gang("a/secondary-0", true)], ..Default::default() };
    let out = plan(&p);
    assert_eq!(launched(&out), vec![("spot", 1)]);
    let p = Problem { node_types: vec![low], gangs: vec![gang("a/0", false)], ..Default::default() };
    let out = plan(&p);
    assert!(out.launch.is_empty());
    assert_eq!(
        out.infeasible[0].reason,
        "group \"worker\": no node type with the labels it asks for (priority != low) is big enough"
    );
}

#[test]
fn selectors_combine_and_describe_themselves() {
    let a = only("gpu_model", &["a100", "h100"]);
    let b = only("gpu_model", &["h100", "l4"]);
    let both = a.and(&b);
    assert_eq!(both.describe(), "gpu_model = h100, priority != low");
    let labels = |model: &str| Labels::from([("gpu_model".to_string(), model.to_string())]);
    assert!(both.matches(&labels("h100")) && !both.matches(&labels("a100")));
    let none = only("gpu_model", &["a100"]).and(&only("gpu_model", &["l4"]));
    assert!(!none.matches(&labels("a100")) && !none.matches(&labels("l4")), "no value left: no node");
    assert_eq!(Selector::default().describe(), "any labels");
}
