//! One pass of the pool autoscaler, pure: what the sync saw (nodes, queued units of
//! every app, the pool's instances and floor) becomes a packing [`Problem`], and its
//! [`Plan`] a decision record. The driver ([`crate::autoscaler`]) does the I/O.

use std::collections::{BTreeMap, HashMap};

use flotilla_core::{MemberOption, MemberShape, Resources};
use serde_json::{Value, json};

use crate::config::PoolConfig;
use crate::model::{NodeRow, Observation, Phase, PoolInstance};
use crate::pack::{
    self, Bundle, Cause, Gang, Labels, Limit, Node, Plan, Problem, Request, Selector, Strategy, Termination,
};
use crate::policy::{PolicyState, Sizing, size};
use crate::shape::{ResourceNames, Shape};

mod prune;
use prune::Pruner;

fn shape(r: &Resources, names: &mut ResourceNames) -> Shape {
    // Every resource vector here was validated as a node capacity or a spec member.
    Shape::from_resources(r, names).unwrap_or_default()
}

/// The packing problem of one pass. With `prune`, nodes that can matter only by their
/// number are left out ([`Problem::inert`], [`prune::Pruner`]): at 100,000 nodes,
/// packing each of them every pass was most of its cost. Pruning never changes the
/// plan: such a node takes no demand (or, a twin, is never reached), is never idle, its
/// labels still name domains and its resources' names keep their order, and when no
/// type is over its max
/// ([`Problem::over_a_max`]; `decide` asks again without pruning), is never picked to
/// terminate. Without a floor only: the floor counts whole capacities.
pub fn problem(cfg: &PoolConfig, obs: &Observation, prune: bool) -> Problem {
    let mut names = ResourceNames::default();
    // A node without a domain label is in the default domain, as the schedulers see it.
    let with_domain = |l: &Labels| {
        let mut l = l.clone();
        l.entry("domain".into()).or_insert_with(|| flotilla_core::DEFAULT_DOMAIN.into());
        l
    };
    let mut node_types = cfg.pack_types(&mut names);
    for t in &mut node_types {
        t.labels = with_domain(&t.labels);
    }
    let by_id: foldhash::HashMap<&str, &PoolInstance> = obs.instances.iter().map(|i| (i.id.as_str(), i)).collect();
    let mut nodes = Vec::new();
    let mut inert = crate::pack::Inert::default();
    let mut pruner = if prune { Pruner::of(obs) } else { None };
    let mut seen = std::collections::HashSet::new();
    for n in obs.nodes {
        let inst = by_id.get(n.node_id.as_str());
        if n.status == flotilla_core::NodeStatus::Dead || inst.is_some_and(|i| i.phase == Phase::Leaving) {
            continue;
        }
        if inst.is_some() {
            seen.insert(n.node_id.as_str());
        }
        // A node that is not plainly alive and schedulable holds its place (it still
        // counts against its type's max) but takes no demand and is never idle. A warm
        // pool's node is cordoned on purpose: it takes demand (held: which claims it;
        // claimed: until its uncordon shows).
        let warm = inst.is_some_and(|i| i.warm);
        let usable = n.status == flotilla_core::NodeStatus::Alive && (!n.cordoned || warm) && !n.drain_requested;
        let idle_ms = obs.idle.idle_ms(n.node_id.as_str(), obs.now_ms);
        if let Some(p) = &mut pruner
            && p.leaves_out(n, inst.copied(), usable, idle_ms > 0, &mut inert)
        {
            if p.first_capacity(&n.capacity) {
                shape(&n.capacity, &mut names);
            }
            continue;
        }
        let total = shape(&n.capacity, &mut names);
        let available = if usable {
            let mut a = total.clone();
            a.sub_times(&shape(&n.allocated, &mut names), 1);
            a
        } else {
            Shape::default()
        };
        nodes.push(Node {
            id: n.node_id.to_string(),
            node_type: inst.map(|i| i.node_type.clone()),
            total,
            available,
            labels: with_domain(n.labels.as_map()),
            idle_ms: if usable { idle_ms } else { 0 },
            pending: false,
        });
    }
    // Instances whose agent has not joined yet: capacity to come.
    for i in obs.instances {
        if i.phase == Phase::Leaving || seen.contains(i.id.as_str()) {
            continue;
        }
        let Some(t) = cfg.node_type(&i.node_type) else { continue };
        let total = shape(&t.resources, &mut names);
        nodes.push(Node {
            id: i.id.clone(),
            node_type: Some(i.node_type.clone()),
            available: total.clone(),
            total,
            labels: with_domain(&t.labels),
            idle_ms: 0,
            pending: true,
        });
    }
    let mut requests = Vec::new();
    let mut request_apps = Vec::new();
    let mut gangs = Vec::new();
    let (mut per_node, mut per_domain) = (Vec::new(), Vec::new());
    for a in obs.apps {
        let s = &a.unit_shape;
        if s.members.is_empty() || a.queued.primary + a.queued.secondary == 0 {
            continue;
        }
        // Each member's options as shapes, once for both priorities. A member with none
        // (its scheduler always sends one) asks for nothing rather than failing the pass.
        let nothing = [MemberOption::default()];
        /// A member's options, each as a shape in this problem's resource names.
        type Options<'m> = Vec<(Shape, &'m MemberOption)>;
        let mut options: Vec<Options> = Vec::with_capacity(s.members.len());
        for m in &s.members {
            let opts = if m.options.is_empty() { &nothing[..] } else { &m.options[..] };
            options.push(opts.iter().map(|o| (shape(&o.resources, &mut names), o)).collect());
        }
        let sets = flotilla_core::unit_shape::option_sets(
            s.members.iter().zip(&options).map(|(m, opts)| (m.group.as_str(), opts.len())),
        );
        let limit = |limits: &mut Vec<Limit>, max: Option<u32>, units: &BTreeMap<String, u32>| {
            max.map(|max| {
                limits.push(Limit { app: a.app.clone(), max, units: units.clone() });
                limits.len() - 1
            })
        };
        let node_limit = limit(&mut per_node, s.max_units_per_node, &s.units_per_node);
        let domain_limit = limit(&mut per_domain, s.max_units_per_domain, &s.units_per_domain);
        for (secondary, count) in [(false, a.queued.primary), (true, a.queued.secondary)] {
            if count == 0 {
                continue;
            }
            // The variants: every member's template first, as its scheduler tries first,
            // then each group on its alternatives alone, then matched sets
            // (`option_sets`).
            let mut variants = sets.iter().map(|set| {
                let bundle = |((m, opts), k): ((&MemberShape, &Options), &usize)| {
                    let (shape, option) = opts.get(*k).or_else(|| opts.last())?;
                    let selector = Selector::for_member(s, option, secondary);
                    Some(Bundle { shape: shape.clone(), selector, group: m.group.clone() })
                };
                s.members.iter().zip(&options).zip(set).filter_map(bundle).collect::<Vec<Bundle>>()
            });
            let bundles = variants.next().unwrap_or_default();
            let alternatives: Vec<Vec<Bundle>> = variants.collect();
            if let ([one], true, None) = (bundles.as_slice(), alternatives.is_empty(), domain_limit) {
                // A one-member unit with one option and no domain limit to count against:
                // a plain request.
                requests.push(Request {
                    shape: one.shape.clone(),
                    count: u64::from(count),
                    selector: one.selector.clone(),
                    per_node: node_limit,
                });
                request_apps.push(a.app.clone());
                continue;
            }
            for k in 0..count {
                gangs.push(Gang {
                    id: format!("{}/{}{k}", a.app, if secondary { "secondary-" } else { "" }),
                    strategy: if s.spread_members { Strategy::StrictSpread } else { Strategy::Pack },
                    bundles: bundles.clone(),
                    alternatives: alternatives.clone(),
                    same: Some("domain".into()),
                    per_node: node_limit,
                    per_domain: domain_limit,
                });
            }
        }
    }
    let floor = obs
        .floor
        .resource_requests
        .iter()
        .map(|r| Request {
            shape: shape(&r.resources, &mut names),
            count: u64::from(r.count),
            selector: Selector::default(),
            per_node: None,
        })
        .collect();
    Problem {
        names,
        node_types,
        max_nodes: cfg.max_nodes,
        nodes,
        requests,
        request_apps,
        gangs,
        per_node,
        per_domain,
        floor,
        inert: crate::pack::Inert { labels: inert.labels.iter().map(with_domain).collect(), ..inert },
    }
}

/// The pass's decision record: the demand, the packing result and why each launch or
/// termination happens.
pub fn record(cfg: &PoolConfig, obs: &Observation, p: &Problem, plan: &Plan, decision_seconds: f64) -> Value {
    let report = crate::demand::report(p, plan.clone(), decision_seconds);
    let demand: Vec<Value> = obs
        .apps
        .iter()
        .filter(|a| a.queued.primary + a.queued.secondary > 0)
        .map(|a| json!({"app": a.app, "queued": a.queued, "members": a.unit_shape.members}))
        .collect();
    let pending = obs.instances.iter().filter(|i| i.phase == Phase::Pending).count();
    let running = obs.instances.iter().filter(|i| i.phase == Phase::Running).count();
    let mut why = Vec::new();
    for (t, n) in &plan.launch {
        let reasons = plan.launch_reasons.get(t).map(|r| r.join(", ")).unwrap_or_default();
        why.push(format!("launch {n} × {t} ({reasons})"));
    }
    for t in &plan.terminate {
        why.push(format!("terminate {} ({}: {})", t.node_id, t.cause.as_str(), t.detail));
    }
    // Whose demand nothing the pool may launch can hold, and why: the API shows it on
    // the app's queued units, so their reason says the pool cannot help.
    let mut cannot_place: BTreeMap<&str, &str> = BTreeMap::new();
    for i in &plan.infeasible {
        why.push(format!("cannot place {} × {}: {}", i.count, i.request, i.reason));
        if let Some(app) = p.app_of(&i.request) {
            cannot_place.entry(app).or_insert(i.reason.as_str());
        }
    }
    for (t, reason) in obs.unavailable {
        why.push(format!("{t} unavailable ({reason}): its demand goes to other types"));
    }
    if why.is_empty() {
        why.push("no change: the pool holds the demand".into());
    }
    json!({
        "at_ms": obs.now_ms,
        "pool": cfg.name,
        "demand": {"units": demand, "floor": obs.floor.resource_requests},
        "instances": {"pending": pending, "running": running},
        "launch": plan.launch,
        "terminate": plan.terminate,
        "infeasible": plan.infeasible,
        "cannot_place": cannot_place,
        "unavailable": obs.unavailable,
        "packing": {
            "placed_on_existing": plan.needed,
            "launched": report.launched,
            "waste": report.waste,
            "reasons": plan.launch_reasons,
        },
        "decision_seconds": decision_seconds,
        "explanation": why.join("; "),
    })
}

/// One pass: the problem, the plan, the record. With a pool policy, the two types it
/// sizes are left out of packing (never launched for demand, never idle-terminated) and
/// grown or shrunk to what the policy wants.
pub fn decide(cfg: &PoolConfig, obs: &Observation, policy: &mut PolicyState) -> (Plan, Value) {
    let start = std::time::Instant::now();
    // A type the policy sizes, or that cannot be had now (`Observation::unavailable`),
    // launches nothing for demand: it keeps what it has.
    let sized = |t: &str| cfg.policy.as_ref().is_some_and(|pp| pp.types().any(|s| s == t));
    let problem_of = |prune: bool| {
        let mut p = problem(cfg, obs, prune);
        for t in p.node_types.iter_mut().filter(|t| sized(&t.name) || obs.unavailable.contains_key(&t.name)) {
            t.max = live_of(obs, &t.name).min(t.max as usize) as u32;
            if sized(&t.name) {
                t.idle_timeout_ms = None;
            }
        }
        p
    };
    let mut p = problem_of(true);
    if p.inert.total() > 0 && p.over_a_max() {
        p = problem_of(false);
    }
    let sizing = cfg.policy.as_ref().and_then(|pp| size(cfg, pp, policy, obs));
    let mut plan = pack::plan(&p);
    if let Some(s) = &sizing {
        apply_sizing(obs, s, &mut plan);
    }
    let secs = start.elapsed().as_secs_f64();
    let mut rec = record(cfg, obs, &p, &plan, secs);
    rec["packing"]["nodes_packed"] = json!(p.nodes.len());
    rec["packing"]["nodes_left_out"] = json!(p.inert.total());
    if let Some(s) = &sizing {
        rec["policy"] = serde_json::to_value(&s.decision).unwrap_or(Value::Null);
        rec["policy_desired"] = json!(s.desired);
    }
    (plan, rec)
}

/// Pending and running instances of a type.
fn live_of(obs: &Observation, node_type: &str) -> usize {
    obs.instances.iter().filter(|i| i.node_type == node_type && i.phase != Phase::Leaving).count()
}

/// Grows or shrinks each sized type to the policy's count: launches what is missing;
/// cancels launches first, then drains the nodes that hold least (idle longest first).
fn apply_sizing(obs: &Observation, s: &Sizing, plan: &mut Plan) {
    let why = format!("policy {}: {}", s.decision.policy, s.decision.explanation());
    for (t, want) in &s.desired {
        let have = live_of(obs, t) as u32;
        if *want > have && obs.unavailable.contains_key(t) {
            continue;
        }
        if *want > have {
            *plan.launch.entry(t.clone()).or_default() += want - have;
            plan.launch_reasons.entry(t.clone()).or_default().push(format!("{} for {why}", want - have));
            continue;
        }
        let mut extra = (have - want) as usize;
        if extra == 0 {
            continue;
        }
        let rows: HashMap<&str, &NodeRow> = obs.nodes.iter().map(|n| (n.node_id.as_str(), n)).collect();
        let mut candidates: Vec<(u8, u64, u64, &str)> = obs
            .instances
            .iter()
            .filter(|i| &i.node_type == t && i.phase != Phase::Leaving && !plan.needed.contains(&i.id))
            .map(|i| match rows.get(i.id.as_str()) {
                Some(n) if i.phase == Phase::Running => {
                    (1, n.allocated.cpu_millis, u64::MAX - obs.idle.idle_ms(&i.id, obs.now_ms), i.id.as_str())
                }
                _ => (0, 0, 0, i.id.as_str()),
            })
            .collect();
        candidates.sort();
        for (_, _, _, id) in candidates {
            if extra == 0 {
                break;
            }
            extra -= 1;
            plan.terminate.push(Termination {
                node_id: id.to_string(),
                node_type: t.clone(),
                cause: Cause::Policy,
                detail: why.clone(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AppRow, Constraints, IdleClock, Queued};
    use flotilla_core::UnitShape;

    const POOL: &str = r#"
        [node_types.small-a]
        cpu = 1
        memory = "1Gi"
        labels = { domain = "domain-a", priority = "high" }
        min = 1
        max = 4
        [node_types.low]
        cpu = 1
        memory = "1Gi"
        labels = { domain = "domain-a", priority = "low" }
        max = 4
    "#;

    fn row(id: &str, labels: &[(&str, &str)], allocated_cpu: u64) -> NodeRow {
        NodeRow {
            node_id: flotilla_core::NodeId::new(id).unwrap(),
            status: flotilla_core::NodeStatus::Alive,
            labels: std::sync::Arc::new(
                flotilla_core::Labels::from_map(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
                    .unwrap(),
            ),
            capacity: std::sync::Arc::new(Resources::new(1000, 1 << 30, 0)),
            allocated: Resources::new(allocated_cpu, 0, 0).into(),
            cordoned: false,
            drain_requested: false,
            workloads: 0,
        }
    }

    fn echo(primary: u32, secondary: u32) -> AppRow {
        let m = Resources::new(400, 64 << 20, 0);
        AppRow {
            app: "echo".into(),
            queued: Queued { primary, secondary },
            unit_shape: UnitShape {
                members: vec![MemberShape::plain("head", m.clone()), MemberShape::plain("worker", m)],
                ..Default::default()
            },
        }
    }

    #[test]
    fn queued_units_use_free_nodes_first_and_count_pending_instances_as_capacity() {
        let cfg = PoolConfig::parse(POOL).unwrap();
        let nodes = vec![row("pool-small-a-1", &[("domain", "domain-a"), ("priority", "high")], 0)];
        let instances = vec![
            PoolInstance {
                id: "pool-small-a-1".into(),
                node_type: "small-a".into(),
                phase: Phase::Running,
                warm: false,
            },
            PoolInstance {
                id: "pool-small-a-2".into(),
                node_type: "small-a".into(),
                phase: Phase::Pending,
                warm: false,
            },
        ];
        let apps = vec![echo(3, 0)];
        let obs = Observation {
            nodes: &nodes,
            apps: &apps,
            instances: &instances,
            floor: &Constraints::default(),
            idle: &IdleClock::default(),
            unavailable: &Default::default(),
            now_ms: 0,
        };
        let (plan, record) = decide(&cfg, &obs, &mut PolicyState::default());
        // One unit on the free node, one on the node coming up, one new node; a primary
        // unit never goes to a low-priority type.
        assert_eq!(plan.launch.get("small-a"), Some(&1), "{record}");
        assert!(!plan.launch.contains_key("low"));
        assert_eq!(plan.needed.len(), 2, "{record}");
        assert!(record["explanation"].as_str().unwrap().contains("launch 1 × small-a"), "{record}");

        // Secondary units may take low-priority nodes, and with costs unset the order of
        // types decides: still a node of some type per unit.
        let apps = vec![echo(0, 2)];
        let obs = Observation { apps: &apps, ..obs };
        let (plan, _) = decide(&cfg, &obs, &mut PolicyState::default());
        assert_eq!(plan.launch.values().sum::<u32>(), 0, "two units fit on the two nodes: {:?}", plan.launch);
    }

    /// POOL with a type in domain-b.
    fn pool_with_b() -> PoolConfig {
        let b = "[node_types.small-b]\ncpu = 1\nmemory = \"1Gi\"\nlabels = { domain = \"domain-b\", priority = \"high\" }\nmax = 4\n";
        PoolConfig::parse(&format!("{POOL}\n{b}")).unwrap()
    }

    fn running(id: &str, node_type: &str) -> PoolInstance {
        PoolInstance { id: id.into(), node_type: node_type.into(), phase: Phase::Running, warm: false }
    }

    /// One pass over these nodes (each a running instance of `node_type`) and apps.
    fn decide_on(cfg: &PoolConfig, nodes: &[NodeRow], node_type: &str, apps: &[AppRow]) -> (Plan, Value) {
        let instances: Vec<PoolInstance> = nodes.iter().map(|n| running(n.node_id.as_str(), node_type)).collect();
        let obs = Observation {
            nodes,
            apps,
            instances: &instances,
            floor: &Constraints::default(),
            idle: &IdleClock::default(),
            unavailable: &Default::default(),
            now_ms: 0,
        };
        decide(cfg, &obs, &mut PolicyState::default())
    }

    /// Issue #34 item 1: the app holds its `max_units_per_domain` in domain-a, so the
    /// free node there is no room for its queued unit; the pool launches in domain-b
    /// instead of answering "the pool holds the demand" for ever.
    #[test]
    fn a_full_domains_free_nodes_do_not_count_for_the_apps_units() {
        let nodes = vec![row("pool-small-a-1", &[("domain", "domain-a"), ("priority", "high")], 0)];
        let mut app = echo(1, 0);
        app.unit_shape.max_units_per_domain = Some(2);
        app.unit_shape.units_per_domain = [("domain-a".to_string(), 2)].into();
        let apps = vec![app];
        let (plan, record) = decide_on(&pool_with_b(), &nodes, "small-a", &apps);
        assert_eq!(plan.launch.get("small-b"), Some(&1), "{record}");
        assert!(!plan.launch.contains_key("small-a"), "{record}");

        // With no type outside the full domain the demand is infeasible, and says so.
        let (plan, record) = decide_on(&PoolConfig::parse(POOL).unwrap(), &nodes, "small-a", &apps);
        assert_eq!(plan.launch.values().sum::<u32>(), 0, "{record}");
        assert!(!record["infeasible"].as_array().is_none_or(|a| a.is_empty()), "{record}");
        assert!(record["cannot_place"]["echo"].as_str().is_some_and(|r| !r.is_empty()), "whose demand: {record}");
    }

    /// Issue #34 item 1, per node: a 4-core node holding one of the app's units has room
    /// for four more by resources, but `max_units_per_node = 1` lets the planner put none
    /// there, so the pool launches a node per queued unit instead of holding the demand.
    #[test]
    fn a_node_at_the_apps_per_node_limit_is_no_room_for_its_units() {
        let pool = "[node_types.big]\ncpu = 4\nmemory = \"4Gi\"\nlabels = { domain = \"domain-a\" }\nmax = 8\n";
        let cfg = PoolConfig::parse(pool).unwrap();
        let mut big = row("pool-big-1", &[("domain", "domain-a")], 800);
        big.capacity = Resources::new(4000, 4 << 30, 0).into();
        let nodes = vec![big];
        let mut app = echo(3, 0);
        app.unit_shape.max_units_per_node = Some(1);
        app.unit_shape.units_per_node = [("pool-big-1".to_string(), 1)].into();
        let mut apps = vec![app];
        let (plan, record) = decide_on(&cfg, &nodes, "big", &apps);
        assert_eq!(plan.launch.get("big"), Some(&3), "one new node per unit: {record}");
        assert!(plan.needed.is_empty(), "the full node takes nothing: {record}");

        // With room for two a node, the existing one takes one more and the new ones two.
        apps[0].unit_shape.max_units_per_node = Some(2);
        let (plan, record) = decide_on(&cfg, &nodes, "big", &apps);
        assert_eq!(plan.launch.get("big"), Some(&1), "{record}");
        assert_eq!(plan.needed, vec!["pool-big-1".to_string()], "{record}");
    }

    /// One-member units count against `max_units_per_domain` as well: two of them fit
    /// the idle node in domain-a, but one domain takes one, so the pool launches in
    /// domain-b for the other.
    #[test]
    fn one_member_units_spread_over_domains_as_their_limit_says() {
        let nodes = vec![row("pool-small-a-1", &[("domain", "domain-a"), ("priority", "high")], 0)];
        let mut app = echo(2, 0);
        app.unit_shape.members.truncate(1);
        app.unit_shape.max_units_per_domain = Some(1);
        let (plan, record) = decide_on(&pool_with_b(), &nodes, "small-a", &[app]);
        assert_eq!(plan.launch.get("small-b"), Some(&1), "{record}");
        assert_eq!(plan.needed, vec!["pool-small-a-1".to_string()], "{record}");
    }

    const GPU_POOL: &str = r#"
        [node_types.cpu]
        cpu = 4
        memory = "8Gi"
        labels = { domain = "domain-a" }
        max = 4
        cost = 0.2
        [node_types.a100]
        cpu = 8
        memory = "32Gi"
        gpu = 1
        labels = { domain = "domain-a", gpu_model = "a100" }
        max = 1
        cost = 4.0
        [node_types.l4]
        cpu = 8
        memory = "32Gi"
        gpu = 1
        labels = { domain = "domain-a", gpu_model = "l4" }
        max = 4
        cost = 1.0
    "#;

    /// An app whose units are a CPU-only head and a one-GPU worker on each of `models`
    /// in turn (its template, then its alternatives).
    fn hetero(queued: u32, models: &[&[&str]]) -> AppRow {
        let option = |m: &&[&str]| flotilla_core::MemberOption {
            resources: Resources::new(4000, 8 << 30, 1),
            selector: flotilla_core::NodeSelector {
                labels: [("gpu_model".to_string(), m.iter().map(|v| v.to_string()).collect())].into(),
                allow_low_priority: false,
            },
        };
        let gpu = MemberShape { group: "gpu".into(), options: models.iter().map(option).collect() };
        AppRow {
            app: "hetero".into(),
            queued: Queued { primary: queued, secondary: 0 },
            unit_shape: UnitShape {
                members: vec![MemberShape::plain("head", Resources::new(1000, 1 << 30, 0)), gpu],
                ..Default::default()
            },
        }
    }

    /// Issue: heterogeneous units. The pool launches, per group, the node types whose
    /// labels match: the head on the CPU type, the worker on the a100 type while it has
    /// room, then on its alternative, the l4 type.
    #[test]
    fn a_units_groups_get_the_types_their_labels_match_and_alternatives_past_a_max() {
        let cfg = PoolConfig::parse(GPU_POOL).unwrap();
        let (plan, record) = decide_on(&cfg, &[], "cpu", &[hetero(2, &[&["a100"], &["l4"]])]);
        let launched: Vec<(&str, u32)> = plan.launch.iter().map(|(t, n)| (t.as_str(), *n)).collect();
        // Both heads on one CPU node; the first worker on the one a100 the type allows,
        // the second on an l4.
        assert_eq!(launched, vec![("a100", 1), ("cpu", 1), ("l4", 1)], "{record}");
        assert!(plan.infeasible.is_empty(), "{record}");
        assert!(record["explanation"].as_str().unwrap().contains("launch 1 × l4 (1 for gang hetero/1)"), "{record}");
        let gpu = &record["demand"]["units"][0]["members"][1];
        assert_eq!(gpu["group"], "gpu", "{record}");
        assert_eq!(gpu["options"][1]["selector"]["labels"]["gpu_model"], json!(["l4"]), "{record}");

        // The a100 type at its max, its node fully used: the next unit takes an l4.
        let mut a100 = row("pool-a100-1", &[("domain", "domain-a"), ("gpu_model", "a100")], 8000);
        a100.capacity = Resources::new(8000, 32 << 30, 1).into();
        a100.allocated = a100.capacity.clone();
        let nodes = [a100];
        let (plan, record) = decide_on(&cfg, &nodes, "a100", &[hetero(1, &[&["a100"], &["l4"]])]);
        let launched: Vec<(&str, u32)> = plan.launch.iter().map(|(t, n)| (t.as_str(), *n)).collect();
        assert_eq!(launched, vec![("cpu", 1), ("l4", 1)], "{record}");
        // A one-member unit with an alternative too (a gang, not a plain request).
        let mut solo = hetero(1, &[&["a100"], &["l4"]]);
        solo.unit_shape.members.remove(0);
        let (plan, record) = decide_on(&cfg, &nodes, "a100", &[solo]);
        let launched: Vec<(&str, u32)> = plan.launch.iter().map(|(t, n)| (t.as_str(), *n)).collect();
        assert_eq!(launched, vec![("l4", 1)], "{record}");
    }

    /// Two groups with alternatives: one falls back while the other stays on its
    /// template (the scheduler chooses each member's alternative on its own, so the
    /// pool must not try only matched sets). No a100 type: the GPU group takes its l4
    /// alternative; the CPU group keeps its template (the `cpu` type), though its own
    /// alternative (a zone no type has) cannot be held.
    #[test]
    fn one_group_falls_back_to_its_alternative_while_another_keeps_its_template() {
        let cfg = PoolConfig::parse(
            &GPU_POOL
                .replace("[node_types.a100]", "[node_types.a100-gone]")
                .replace("gpu_model = \"a100\" }\n        max = 1", "gpu_model = \"a100\" }\n        max = 0"),
        )
        .unwrap();
        let mut app = hetero(1, &[&["a100"], &["l4"]]);
        let cpu = |domain: &str| flotilla_core::MemberOption {
            resources: Resources::new(1000, 1 << 30, 0),
            selector: flotilla_core::NodeSelector {
                labels: [("domain".to_string(), [domain.to_string()].into())].into(),
                allow_low_priority: false,
            },
        };
        app.unit_shape
            .members
            .push(MemberShape { group: "cpu".into(), options: vec![cpu("domain-a"), cpu("domain-z")] });
        let (plan, record) = decide_on(&cfg, &[], "cpu", &[app]);
        assert!(plan.infeasible.is_empty(), "{record}");
        assert_eq!(plan.launch.get("l4"), Some(&1), "{record}");
        assert!(plan.launch.contains_key("cpu"), "{record}");
    }

    /// Issue: a group no node type can hold is reported infeasible, named, with what it
    /// asks for; the app's queued units say the pool cannot place them.
    #[test]
    fn a_group_no_type_can_hold_is_infeasible_by_name() {
        let cfg = PoolConfig::parse(GPU_POOL).unwrap();
        let (plan, record) = decide_on(&cfg, &[], "cpu", &[hetero(1, &[&["h100", "b200"]])]);
        assert!(plan.launch.is_empty(), "{record}");
        let want = "group \"gpu\": no node type with the labels it asks for (gpu_model = b200 | h100, priority != low) is big enough";
        assert_eq!(record["cannot_place"]["hetero"], want, "{record}");
    }

    /// A secondary unit may use low-priority types even when its members' options do
    /// not allow them; a primary one may not, and says why.
    #[test]
    fn secondary_units_may_use_low_priority_types() {
        let pool = r#"
            [node_types.small]
            cpu = 1
            memory = "2Gi"
            labels = { priority = "high" }
            max = 4
            [node_types.big-low]
            cpu = 4
            memory = "8Gi"
            labels = { priority = "low" }
            max = 4
        "#;
        let cfg = PoolConfig::parse(pool).unwrap();
        let two_cpu = Resources::new(2000, 1 << 30, 0);
        let mut app = AppRow {
            app: "batch".into(),
            queued: Queued { primary: 1, secondary: 0 },
            unit_shape: UnitShape {
                members: vec![MemberShape::plain("head", two_cpu.clone()), MemberShape::plain("worker", two_cpu)],
                ..Default::default()
            },
        };
        let (plan, record) = decide_on(&cfg, &[], "small", std::slice::from_ref(&app));
        assert!(plan.launch.is_empty(), "{record}");
        let reason = record["cannot_place"]["batch"].as_str().unwrap_or_default();
        assert!(
            reason.contains("group \"head\": no node type with the labels it asks for (priority != low)"),
            "{record}"
        );
        assert!(reason.contains("group \"worker\""), "{record}");

        app.queued = Queued { primary: 0, secondary: 1 };
        let (plan, record) = decide_on(&cfg, &[], "small", std::slice::from_ref(&app));
        assert_eq!(plan.launch.get("big-low"), Some(&1), "both members on one node: {record}");
        // A one-member unit is a plain request: the same rule.
        app.unit_shape.members.truncate(1);
        let (plan, record) = decide_on(&cfg, &[], "small", std::slice::from_ref(&app));
        assert_eq!(plan.launch.get("big-low"), Some(&1), "{record}");
        app.queued = Queued { primary: 1, secondary: 0 };
        let (plan, record) = decide_on(&cfg, &[], "small", &[app]);
        assert!(plan.launch.is_empty(), "{record}");
    }
}
