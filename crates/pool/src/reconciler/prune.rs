//! Which nodes a pass can leave out of its packing problem (see
//! [`super::problem`]): those that can take none of the demand.

use flotilla_core::Resources;

use crate::model::{AppRow, NodeRow};

/// The least of each resource any queued unit's member may ask for (componentwise over
/// every option of every member), or None when nothing waits: a node without room for
/// it can take nothing this pass.
pub(super) fn least_demand(apps: &[AppRow]) -> Option<Resources> {
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
pub(super) fn has_room(n: &NodeRow, least: &Resources) -> bool {
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
        max = 6
        idle_timeout = "10s"
        [node_types.small-b]
        cpu = 2
        memory = "2Gi"
        labels = { domain = "domain-b" }
        max = 6
        idle_timeout = "10s"
    "#;

    /// What a plan decides, comparable.
    fn decided(p: &Plan) -> String {
        format!("{:?} {:?} {:?} {:?} {:?}", p.launch, p.terminate, p.infeasible, p.needed, p.demand_on)
    }

    proptest! {
        /// Leaving out the nodes that can take nothing changes no decision: launches,
        /// terminations (idle, max), what cannot be placed and where demand went.
        #[test]
        fn pruning_never_changes_the_plan(
            // Each node: its pool type (a, b) or none, quarters of its CPU held,
            // cordoned, alive.
            specs in proptest::collection::vec((proptest::option::of(any::<bool>()), 0u64..5, any::<bool>(), any::<bool>()), 0..24),
            queued in 0u32..4,
            spread in any::<bool>(),
            member_cpu in 1u64..5,
        ) {
            let cfg = PoolConfig::parse(POOL).unwrap();
            let mut nodes = Vec::new();
            let mut instances = Vec::new();
            for (i, (pool, held, cordoned, alive)) in specs.iter().copied().enumerate() {
                let (id, cap, domain) = match pool {
                    Some(false) => (format!("a-{i}"), 1000, "domain-a"),
                    Some(true) => (format!("b-{i}"), 2000, "domain-b"),
                    None => (format!("n-{i}"), 2000, if i % 2 == 0 { "domain-a" } else { "domain-b" }),
                };
                if let Some(b) = pool {
                    let node_type = if b { "small-b" } else { "small-a" };
                    instances.push(PoolInstance { id: id.clone(), node_type: node_type.into(), phase: Phase::Running, warm: false });
                }
                nodes.push(NodeRow {
                    node_id: id,
                    status: if alive { NodeStatus::Alive } else { NodeStatus::Suspect },
                    labels: std::sync::Arc::new(flotilla_core::Labels::from_map([("domain".to_string(), domain.to_string())].into()).unwrap()),
                    capacity: std::sync::Arc::new(Resources::new(cap, 4 << 30, 0)),
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
                    ..Default::default()
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
            prop_assume!(pruned.inert.is_empty() || !pruned.over_a_max());
            let whole = problem(&cfg, &obs, false);
            prop_assert!(pruned.nodes.len() <= whole.nodes.len());
            prop_assert_eq!(decided(&plan(&pruned)), decided(&plan(&whole)));
        }
    }
}
