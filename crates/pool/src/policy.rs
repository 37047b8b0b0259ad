//! A pool sized by load instead of by demand packing: the `basic` (Dataproc) and
//! `utilization` (MR3) policies that size an app's units size two node types, with nodes
//! as the units. Dataproc's primary and secondary worker groups are the pool's high- and
//! low-priority types, as on a Dataproc cluster.
//!
//! The signals are the pool's: pending = the resources of every app's queued units;
//! available and allocated = the free and used resources of the two types' nodes (a node
//! still launching counts as free, as a requested unit does for an app); for
//! `utilization`, each node's allocated ÷ capacity.

use std::collections::BTreeMap;

use flotilla_autoscale::{Decision, GroupUnits, Load, MemberUsage, Res, Signals, State, Units, evaluate};

use crate::config::PoolConfig;
use crate::model::{Observation, Phase, PoolPolicy};

/// The policy's memory between passes, and its last answer (held between evaluations,
/// which come every `interval` of the policy, not every pass).
#[derive(Debug, Default)]
pub struct PolicyState {
    state: Option<State>,
    last: Option<Sizing>,
}

/// Nodes of each sized type the policy wants, and the decision record behind it.
#[derive(Debug, Clone)]
pub struct Sizing {
    pub desired: BTreeMap<String, u32>,
    pub decision: Decision,
}

fn res(r: &flotilla_core::Resources) -> Res {
    Res::new(r.cpu_millis, r.memory_bytes)
}

fn add(a: &mut Res, b: Res, times: u64) {
    a.cpu_millis = a.cpu_millis.saturating_add(b.cpu_millis.saturating_mul(times));
    a.memory_bytes = a.memory_bytes.saturating_add(b.memory_bytes.saturating_mul(times));
}

/// Evaluates the policy when its interval has passed; otherwise repeats its last answer.
pub fn size(cfg: &PoolConfig, pp: &PoolPolicy, st: &mut PolicyState, obs: &Observation) -> Option<Sizing> {
    let due = st.last.as_ref().is_none_or(|l| obs.now_ms.saturating_sub(l.decision.at_ms) >= pp.policy.interval_ms);
    if !due {
        return st.last.clone();
    }
    let group = |t: Option<&str>| {
        let mut g = GroupUnits::default();
        for i in obs.instances.iter().filter(|i| Some(i.node_type.as_str()) == t) {
            match i.phase {
                Phase::Pending | Phase::Running => g.active += 1,
                Phase::Leaving => g.decommissioning += 1,
            }
        }
        g
    };
    let per_unit = cfg.node_type(&pp.primary).map(|t| res(&t.resources)).unwrap_or_default();
    let sized: std::collections::HashMap<&str, Phase> = obs
        .instances
        .iter()
        .filter(|i| pp.types().any(|t| t == i.node_type))
        .map(|i| (i.id.as_str(), i.phase))
        .collect();
    let mut load = Load::default();
    for a in obs.apps {
        // A member counts at its template: what its scheduler asks for first.
        let unit = a.unit_shape.members.iter().filter_map(|m| m.options.first()).fold(Res::default(), |mut acc, o| {
            add(&mut acc, res(&o.resources), 1);
            acc
        });
        add(&mut load.pending, unit, u64::from(a.queued.primary) + u64::from(a.queued.secondary));
    }
    let mut members = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for n in obs.nodes.iter().filter(|n| sized.get(n.node_id.as_str()) == Some(&Phase::Running)) {
        seen.insert(n.node_id.as_str());
        let (cap, used) = (res(&n.capacity), res(&n.allocated));
        add(&mut load.allocated, used, 1);
        let free = Res::new(
            cap.cpu_millis.saturating_sub(used.cpu_millis),
            cap.memory_bytes.saturating_sub(used.memory_bytes),
        );
        add(&mut load.available, free, 1);
        members.push(MemberUsage { used, allocated: cap });
    }
    for i in obs.instances.iter().filter(|i| i.phase == Phase::Pending && sized.contains_key(i.id.as_str())) {
        if !seen.contains(i.id.as_str())
            && let Some(t) = cfg.node_type(&i.node_type)
        {
            add(&mut load.available, res(&t.resources), 1);
        }
    }
    let signals = Signals {
        primary: group(Some(&pp.primary)),
        secondary: group(pp.secondary.as_deref()),
        per_unit,
        load: Some(load),
        members: Some(&members),
    };
    let state = st.state.get_or_insert_with(|| State::new(&pp.policy));
    let decision = evaluate(&pp.policy, state, &signals, obs.now_ms);
    let Units { primary, secondary } = decision.desired;
    let mut desired = BTreeMap::new();
    let clamp = |name: &str, n: u32| cfg.node_type(name).map(|t| n.clamp(t.min, t.max)).unwrap_or(n);
    desired.insert(pp.primary.clone(), clamp(&pp.primary, primary));
    if let Some(s) = &pp.secondary {
        desired.insert(s.clone(), clamp(s, secondary));
    }
    st.last = Some(Sizing { desired, decision });
    st.last.clone()
}

#[cfg(test)]
mod tests {
    use flotilla_core::Resources;

    use crate::config::PoolConfig;
    use crate::model::{AppRow, Constraints, IdleClock, NodeRow, Observation, Phase, PoolInstance};
    use crate::pack::Cause;
    use crate::reconciler::decide;

    use super::PolicyState;

    const POOL: &str = r#"
        [node_types.primary]
        cpu = 2
        memory = "4Gi"
        labels = { priority = "high" }
        min = 1
        max = 6
        [node_types.spot]
        cpu = 2
        memory = "4Gi"
        labels = { priority = "low" }
        max = 6

        [policy]
        primary = "primary"
        [policy.autoscaling]
        policy = "utilization"
        interval = "1s"
        [policy.autoscaling.utilization]
        metric = "cpu"
        window = "1s"
        scale_out_threshold_percent = 70
        scale_out_grace_period = "1s"
        scale_in_delay_after_scale_out = "1s"
        scale_in_threshold_percent = 30
        scale_in_grace_period = "1s"
        scale_in_min_units = 1
        scale_out_increment_units = 2
        scale_in_decrement_units = 1
        max_units = 6
    "#;

    fn row(id: &str, cpu: u64) -> NodeRow {
        NodeRow {
            node_id: flotilla_core::NodeId::new(id).unwrap(),
            status: flotilla_core::NodeStatus::Alive,
            labels: std::sync::Arc::new(
                flotilla_core::Labels::from_map([("priority".to_string(), "high".to_string())].into()).unwrap(),
            ),
            capacity: std::sync::Arc::new(Resources::new(2000, 4 << 30, 0)),
            allocated: Resources::new(cpu, 0, 0).into(),
            cordoned: false,
            drain_requested: false,
            workloads: 0,
        }
    }

    fn running(ids: &[&str]) -> Vec<PoolInstance> {
        ids.iter()
            .map(|id| PoolInstance {
                id: id.to_string(),
                node_type: "primary".into(),
                phase: Phase::Running,
                warm: false,
            })
            .collect()
    }

    #[test]
    fn mr3s_utilization_policy_sizes_the_primary_type() {
        let cfg = PoolConfig::parse(POOL).unwrap_or_else(|e| panic!("{e}"));
        let mut st = PolicyState::default();
        let instances = running(&["n1", "n2"]);
        let busy = vec![row("n1", 1800), row("n2", 1800)];
        let apps: Vec<AppRow> = vec![];
        let floor = Constraints::default();
        let idle = IdleClock::default();
        let mut last = None;
        // 90% of the CPU allocated, sampled over the window: scale out by 2.
        for now in [0u64, 1000, 2000, 3000, 4000] {
            let obs = Observation {
                nodes: &busy,
                apps: &apps,
                instances: &instances,
                floor: &floor,
                idle: &idle,
                unavailable: &Default::default(),
                now_ms: now,
            };
            let (plan, rec) = decide(&cfg, &obs, &mut st);
            if !plan.launch.is_empty() {
                last = Some((plan, rec));
                break;
            }
        }
        let (plan, rec) = last.expect("the policy scales out");
        assert_eq!(plan.launch.get("primary"), Some(&2), "{rec}");
        assert_eq!(rec["policy"]["policy"], "utilization", "{rec}");
        assert!(rec["explanation"].as_str().unwrap().contains("policy utilization"), "{rec}");

        // Idle nodes: the policy, not idle_timeout, decides; it drains the emptiest node.
        let mut st = PolicyState::default();
        let instances = running(&["n1", "n2", "n3"]);
        let quiet = vec![row("n1", 0), row("n2", 200), row("n3", 0)];
        let mut gone = None;
        for now in (0..20).map(|s| s * 1000) {
            let obs = Observation {
                nodes: &quiet,
                apps: &apps,
                instances: &instances,
                floor: &floor,
                idle: &idle,
                unavailable: &Default::default(),
                now_ms: now,
            };
            let (plan, _) = decide(&cfg, &obs, &mut st);
            if !plan.terminate.is_empty() {
                gone = Some(plan.terminate);
                break;
            }
        }
        let gone = gone.expect("the policy scales in");
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].cause, Cause::Policy);
        assert_ne!(gone[0].node_id, "n2", "the busiest node stays");
    }

    #[test]
    fn the_policy_must_name_types_of_the_right_priority() {
        let bad = POOL.replace("primary = \"primary\"", "primary = \"spot\"");
        let e = PoolConfig::parse(&bad).unwrap_err().to_string();
        assert!(e.contains("policy.primary") && e.contains("priority = \"high\""), "{e}");
        let bad = POOL.replace("scale_out_threshold_percent = 70", "scale_out_threshold_percent = 700");
        assert!(PoolConfig::parse(&bad).unwrap_err().to_string().contains("policy.autoscaling"));
    }
}
