//! Which nodes a pass can leave out of its packing problem (see
//! [`super::problem`]): those that can take none of the demand, and twins of nodes
//! kept beyond what the demand could fill.

use std::collections::BTreeSet;
use std::sync::Arc;

use flotilla_core::{Labels, Resources};

use crate::model::{AppRow, NodeRow, Observation, Phase, PoolInstance};
use crate::pack::Inert;

/// Decides node by node what a pass leaves out, and counts it.
pub(super) struct Pruner<'o> {
    /// The least any waiting member asks for; None when nothing waits.
    least: Option<Resources>,
    /// The most nodes a pass can fill: one per member of every waiting unit (a fill
    /// places at least one). Nodes alike (labels, capacity, holdings) are filled in
    /// their order, so twins past this many are never reached.
    most_filled: u64,
    /// Nodes alike so far, by their labels and capacity *shared* (the view's follower
    /// interns them) and their holdings: reading every node's labels to compare them
    /// cost more than the rest of a pass at 100,000 nodes. Rows that share nothing (from
    /// `GET /v1/nodes`) are never twins: fewer are left out, none wrongly.
    twins: foldhash::HashMap<(*const Labels, *const Resources, &'o Resources), u64>,
    /// Nodes holding units of an app with a per-node limit: not twins of any other.
    limited: BTreeSet<&'o str>,
    /// The label sets and capacities of the nodes left out, by pointer (shared ones are
    /// looked at once).
    seen_labels: foldhash::HashSet<*const Labels>,
    seen_capacities: foldhash::HashSet<*const Resources>,
}

impl<'o> Pruner<'o> {
    /// None when the pass must list every node: a floor counts whole capacities.
    pub fn of(obs: &Observation<'o>) -> Option<Self> {
        if !obs.floor.resource_requests.is_empty() {
            return None;
        }
        let waiting = obs.apps.iter().filter(|a| a.queued.primary + a.queued.secondary > 0);
        let most_filled = waiting
            .clone()
            .map(|a| u64::from(a.queued.primary + a.queued.secondary) * a.unit_shape.members.len() as u64)
            .sum();
        let limited = waiting
            .filter(|a| a.unit_shape.max_units_per_node.is_some())
            .flat_map(|a| a.unit_shape.units_per_node.keys().map(String::as_str))
            .collect();
        Some(Pruner {
            least: least_demand(obs.apps),
            most_filled,
            twins: Default::default(),
            limited,
            seen_labels: Default::default(),
            seen_capacities: Default::default(),
        })
    }

    /// Whether the pass leaves `n` out (counted in `inert` if so, its labels kept there
    /// once). `inst` is its pool instance, `usable` whether it may take demand, `idle`
    /// whether it holds nothing.
    pub fn leaves_out(
        &mut self,
        n: &'o NodeRow,
        inst: Option<&PoolInstance>,
        usable: bool,
        idle: bool,
        inert: &mut Inert,
    ) -> bool {
        let room = usable && self.least.as_ref().is_some_and(|l| has_room(n, l));
        let out = match inst {
            // Another's node matters only for the demand it can take (it is never
            // terminated), and its twins past what the demand can fill not even that.
            None if !room || self.twin_past_reach(n) => {
                inert.others += 1;
                true
            }
            // The pool's own, running, taking no demand and not idle: only for its number.
            Some(i) if i.phase == Phase::Running && !room && !(usable && idle) => {
                *inert.by_type.entry(i.node_type.clone()).or_default() += 1;
                true
            }
            _ => false,
        };
        if out && self.seen_labels.insert(Arc::as_ptr(&n.labels)) && !inert.labels.contains(n.labels.as_map()) {
            inert.labels.insert(n.labels.as_map().clone());
        }
        out
    }

    /// Whether `capacity`, of a node left out, is met for the first time: an unpruned
    /// pass would meet its resources' names there, and their order breaks ties between
    /// requests, so the caller names them then.
    pub fn first_capacity(&mut self, capacity: &Arc<Resources>) -> bool {
        self.seen_capacities.insert(Arc::as_ptr(capacity))
    }

    fn twin_past_reach(&mut self, n: &'o NodeRow) -> bool {
        if self.limited.contains(n.node_id.as_str()) {
            return false;
        }
        let key = (Arc::as_ptr(&n.labels), Arc::as_ptr(&n.capacity), &*n.allocated);
        let seen = self.twins.entry(key).or_default();
        *seen += 1;
        *seen > self.most_filled
    }
}

/// The least of each resource any queued unit's member may ask for (componentwise over
/// every option of every member), or None when nothing waits: a node without room for
/// it can take nothing this pass.
fn least_demand(apps: &[AppRow]) -> Option<Resources> {
    let mut least: Option<Resources> = None;
    let asks = apps
        .iter()
        .filter(|a| a.queued.primary + a.queued.secondary > 0)
        .flat_map(|a| a.unit_shape.members.iter())
        .flat_map(|m| if m.options.is_empty() { None } else { Some(m.options.iter()) }.into_iter().flatten());
    for o in asks {
        let r = &o.resources;
        least = Some(match least {
            None => r.clone(),
            Some(l) => Resources {
                cpu_millis: l.cpu_millis.min(r.cpu_millis),
                memory_bytes: l.memory_bytes.min(r.memory_bytes),
                gpu: l.gpu.min(r.gpu),
                // A resource an option does not name, it asks none of.
                custom: l.custom.iter().filter_map(|(k, v)| Some((k.clone(), (*v).min(*r.custom.get(k)?)))).collect(),
            },
        });
    }
    // A member with no options asks for nothing (see `problem`): anything has room.
    let asks_nothing = apps.iter().any(|a| {
        a.queued.primary + a.queued.secondary > 0 && a.unit_shape.members.iter().any(|m| m.options.is_empty())
    });
    if asks_nothing { Some(Resources::default()) } else { least }
}

/// Whether `n` has room for `least` beside what it holds.
fn has_room(n: &NodeRow, least: &Resources) -> bool {
    let (c, a) = (&n.capacity, &n.allocated);
    c.cpu_millis.saturating_sub(a.cpu_millis) >= least.cpu_millis
        && c.memory_bytes.saturating_sub(a.memory_bytes) >= least.memory_bytes
        && c.gpu.saturating_sub(a.gpu) >= least.gpu
        && least.custom.iter().all(|(k, v)| {
            let held = a.custom.get(k).copied().unwrap_or(0);
            c.custom.get(k).copied().unwrap_or(0).saturating_sub(held) >= *v
        })
}

#[cfg(test)]
mod tests {
    use super::super::problem;
    use crate::config::PoolConfig;
    use crate::model::{AppRow, Constraints, IdleClock, NodeRow, Observation, Phase, PoolInstance, Queued};
    use crate::pack::{Plan, plan};
    use flotilla_core::{MemberShape, NodeStatus, Resources, UnitShape};
    use proptest::prelude::*;

    const POOL: &str = r#"
        [node_types.small-a]
        cpu = 1
        memory = "1Gi"
        labels = { domain = "domain-a" }
        min = 1
        max = 16
        idle_timeout = "10s"
        [node_types.small-b]
        cpu = 2
        memory = "2Gi"
        labels = { domain = "domain-b" }
        max = 16
        idle_timeout = "10s"
    "#;

    /// What a plan decides, comparable.
    fn decided(p: &Plan) -> String {
        format!("{:?} {:?} {:?} {:?} {:?}", p.launch, p.terminate, p.infeasible, p.needed, p.demand_on)
    }

    /// A thousand empty nodes alike and one unit of two members waiting: two of them can
    /// be filled, so two are packed; the others count against `max_nodes` only.
    #[test]
    fn twins_past_what_the_demand_can_fill_are_counted_not_packed() {
        let cfg = PoolConfig::parse(&format!("max_nodes = 1001\n{POOL}")).unwrap();
        let labels = std::sync::Arc::new(
            flotilla_core::Labels::from_map([("domain".into(), "domain-a".into())].into()).unwrap(),
        );
        let (capacity, allocated) =
            (std::sync::Arc::new(Resources::new(2000, 4 << 30, 0)), std::sync::Arc::new(Resources::default()));
        let nodes: Vec<NodeRow> = (0..1000)
            .map(|i| NodeRow {
                node_id: flotilla_core::NodeId::new(&format!("n-{i:04}")).unwrap(),
                status: NodeStatus::Alive,
                labels: labels.clone(),
                capacity: capacity.clone(),
                allocated: allocated.clone(),
                cordoned: false,
                drain_requested: false,
                workloads: 0,
            })
            .collect();
        let m = Resources::new(1000, 64 << 20, 0);
        let apps = [AppRow {
            app: "echo".into(),
            queued: Queued { primary: 1, secondary: 0 },
            unit_shape: UnitShape {
                members: vec![MemberShape::plain("head", m.clone()), MemberShape::plain("worker", m)],
                ..Default::default()
            },
        }];
        let obs = Observation {
            nodes: &nodes,
            apps: &apps,
            instances: &[],
            floor: &Constraints::default(),
            idle: &IdleClock::default(),
            unavailable: &Default::default(),
            now_ms: 0,
        };
        let pruned = problem(&cfg, &obs, true);
        assert_eq!(pruned.nodes.iter().map(|n| n.id.as_str()).collect::<Vec<_>>(), ["n-0000", "n-0001"]);
        assert_eq!(pruned.inert.others, 998);
        let whole = problem(&cfg, &obs, false);
        assert_eq!(decided(&plan(&pruned)), decided(&plan(&whole)));
        // The one launch for small-a's min still fits under max_nodes with every node counted.
        assert_eq!(plan(&pruned).launch.get("small-a"), Some(&1));
    }

    proptest! {
        /// Leaving out the nodes that can take nothing changes no decision: launches,
        /// terminations (idle, max), what cannot be placed and where demand went.
        #[test]
        fn pruning_never_changes_the_plan(
            // Each node: its pool type (a, b) or none, quarters of its CPU held,
            // cordoned, alive.
            specs in proptest::collection::vec((proptest::option::of(any::<bool>()), 0u64..5, any::<bool>(), any::<bool>()), 0..40),
            queued in 0u32..4,
            spread in any::<bool>(),
            member_cpu in 1u64..5,
            max_nodes in proptest::option::of(16u32..80),
            // One unit per node, and every third node already holds one.
            per_node_limit in any::<bool>(),
            // One unit per domain, and domain-a holds one already.
            per_domain_limit in any::<bool>(),
        ) {
            let max_nodes = max_nodes.map(|m| format!("max_nodes = {m}\n")).unwrap_or_default();
            let cfg = PoolConfig::parse(&format!("{max_nodes}{POOL}")).unwrap();
            let mut nodes = Vec::new();
            let mut instances = Vec::new();
            // Shared, as the view's follower shares them: twins are found by pointer.
            let labels_of = |d: &str| std::sync::Arc::new(flotilla_core::Labels::from_map([("domain".to_string(), d.to_string())].into()).unwrap());
            let (in_a, in_b, in_c) = (labels_of("domain-a"), labels_of("domain-b"), labels_of("domain-c"));
            let (one_cpu, two_cpu) = (std::sync::Arc::new(Resources::new(1000, 4 << 30, 0)), std::sync::Arc::new(Resources::new(2000, 4 << 30, 0)));
            for (i, (pool, held, cordoned, alive)) in specs.iter().copied().enumerate() {
                let (id, cap, domain) = match pool {
                    Some(false) => (format!("a-{i}"), 1000, "domain-a"),
                    Some(true) => (format!("b-{i}"), 2000, "domain-b"),
                    // domain-c has no pool type: only such nodes name it.
                    None => (format!("n-{i}"), 2000, ["domain-a", "domain-b", "domain-c"][i % 3]),
                };
                if let Some(b) = pool {
                    let node_type = if b { "small-b" } else { "small-a" };
                    instances.push(PoolInstance { id: id.clone(), node_type: node_type.into(), phase: Phase::Running, warm: false });
                }
                nodes.push(NodeRow {
                    node_id: flotilla_core::NodeId::new(&id).unwrap(),
                    status: if alive { NodeStatus::Alive } else { NodeStatus::Suspect },
                    labels: match domain { "domain-a" => in_a.clone(), "domain-b" => in_b.clone(), _ => in_c.clone() },
                    capacity: if cap == 1000 { one_cpu.clone() } else { two_cpu.clone() },
                    allocated: Resources::new((held * cap / 4).min(cap), 0, 0).into(),
                    cordoned,
                    drain_requested: false,
                    workloads: 0,
                });
            }
            let mut idle = IdleClock::default();
            idle.update(&nodes, 0);
            let m = Resources::new(member_cpu * 250, 64 << 20, 0);
            let apps = [AppRow {
                app: "echo".into(),
                queued: Queued { primary: queued, secondary: 0 },
                unit_shape: UnitShape {
                    members: vec![MemberShape::plain("head", m.clone()), MemberShape::plain("worker", m)],
                    spread_members: spread,
                    max_units_per_node: per_node_limit.then_some(1),
                    max_units_per_domain: per_domain_limit.then_some(1),
                    units_per_domain: if per_domain_limit { [("domain-a".to_string(), 1)].into() } else { Default::default() },
                    units_per_node: if per_node_limit {
                        nodes.iter().step_by(3).map(|n: &NodeRow| (n.node_id.to_string(), 1)).collect()
                    } else {
                        Default::default()
                    },
                },
            }];
            let obs = Observation {
                nodes: &nodes,
                apps: &apps,
                instances: &instances,
                floor: &Constraints::default(),
                idle: &idle,
                unavailable: &Default::default(),
                now_ms: 20_000,
            };
            let pruned = problem(&cfg, &obs, true);
            prop_assume!(pruned.inert.total() == 0 || !pruned.over_a_max());
            let whole = problem(&cfg, &obs, false);
            prop_assert!(pruned.nodes.len() <= whole.nodes.len());
            prop_assert_eq!(decided(&plan(&pruned)), decided(&plan(&whole)));
        }
    }
}
