//! Warm pools (Karpenter #3240, EC2 warm pools): per node type, `warm` instances are
//! launched ahead of demand and kept registered, holding nothing. Their agents register
//! cordoned (`flotilla agent --cordoned`), so no app places on them and they are not
//! app capacity; the packing sees them as free capacity of the pool, and a pass whose
//! packing puts demand on one claims it: an uncordon, seconds where a launch is a boot.
//! The pass then launches warm replacements. Held instances are never idle-terminated
//! (the idle clock counts only schedulable nodes) and count toward their type's `max`.
//!
//! Pure: [`plan`] decides, the autoscaler uncordons and queues.

use std::collections::{BTreeMap, HashMap};

use crate::config::PoolConfig;
pub use crate::instance::Warm;
use crate::instance::{Instance, InstanceState};

/// What a pass does about the warm pools.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct WarmPlan {
    /// Held instances the packing put demand on: claim them.
    pub claim: Vec<String>,
    /// Claimed instances whose node is seen uncordoned: ordinary nodes from now on.
    pub settled: Vec<String>,
    /// Claimed instances whose node is still cordoned (it registered after the claim,
    /// or the uncordon failed): uncordon again.
    pub uncordon: Vec<String>,
    /// Warm instances to launch per type, so each holds `warm` again.
    pub replenish: BTreeMap<String, u32>,
    /// Held instances past the type's `warm` (it was lowered): they go, newest first.
    pub release: Vec<String>,
}

/// Whether an instance still counts toward its type (not finished, not leaving).
fn live(i: &Instance) -> bool {
    use InstanceState::*;
    matches!(i.state, Queued | Requested | Allocated | AgentStarting | Running)
}

/// The warm pools' pass, once the packing's launches are queued in `instances`.
/// `cordoned` says, for each node in the view, whether it is cordoned; `demand_on` are
/// the instances the packing put pending demand on; `unavailable` the types that cannot
/// be had now.
pub fn plan(
    cfg: &PoolConfig,
    instances: &[&Instance],
    cordoned: &HashMap<&str, bool>,
    demand_on: &[String],
    unavailable: &BTreeMap<String, String>,
) -> WarmPlan {
    let mut p = WarmPlan::default();
    for i in instances.iter().filter(|i| live(i)) {
        match i.warm {
            Some(Warm::Held) if demand_on.contains(&i.id) => p.claim.push(i.id.clone()),
            Some(Warm::Claimed) => match cordoned.get(i.id.as_str()) {
                Some(false) => p.settled.push(i.id.clone()),
                Some(true) => p.uncordon.push(i.id.clone()),
                None => {}
            },
            _ => {}
        }
    }
    let mut total = instances.iter().filter(|i| live(i)).count() as u64;
    for t in &cfg.node_types {
        let of_type = instances.iter().filter(|i| live(i) && i.node_type == t.name);
        let mut held: Vec<&&Instance> =
            of_type.clone().filter(|i| i.warm == Some(Warm::Held) && !p.claim.contains(&i.id)).collect();
        if held.len() > t.warm as usize {
            held.sort_by_key(|i| std::cmp::Reverse(i.history.first().map_or(0, |(_, at)| *at)));
            p.release.extend(held[..held.len() - t.warm as usize].iter().map(|i| i.id.clone()));
            continue;
        }
        if t.warm == 0 || unavailable.contains_key(&t.name) {
            continue;
        }
        let held = held.len() as u32;
        let live_n = of_type.count() as u32;
        let mut n = t.warm.saturating_sub(held).min(t.max.saturating_sub(live_n));
        if let Some(max) = cfg.max_nodes {
            n = n.min(u64::from(max).saturating_sub(total) as u32);
        }
        if n > 0 {
            total += u64::from(n);
            p.replenish.insert(t.name.clone(), n);
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::Instances;

    const POOL: &str = r#"
        max_nodes = 6
        [node_types.w]
        cpu = 2
        memory = "4Gi"
        max = 4
        warm = 2
        [node_types.cold]
        cpu = 2
        memory = "4Gi"
        max = 4
    "#;

    #[test]
    fn warm_pools_fill_are_claimed_settle_and_refill_within_max() {
        let cfg = PoolConfig::parse(POOL).unwrap();
        let mut ins = Instances::new(["w".to_string(), "cold".to_string()], 1);
        // Empty: two warm of `w`, none of `cold`.
        let p = plan(&cfg, &ins.iter().collect::<Vec<_>>(), &HashMap::new(), &[], &BTreeMap::new());
        assert_eq!(p.replenish, BTreeMap::from([("w".to_string(), 2)]));
        let ids = ins.queue_as("w", 2, 0, "warm", Some(Warm::Held));
        let all: Vec<&Instance> = ins.iter().collect();
        assert_eq!(
            plan(&cfg, &all, &HashMap::new(), &[], &BTreeMap::new()),
            WarmPlan::default(),
            "held: nothing to do"
        );
        // Demand on one: claimed, and one more warm launched in its place.
        let p = plan(&cfg, &all, &HashMap::new(), std::slice::from_ref(&ids[0]), &BTreeMap::new());
        assert_eq!(p.claim, vec![ids[0].clone()]);
        assert_eq!(p.replenish, BTreeMap::from([("w".to_string(), 1)]));
        ins.set_warm(&ids[0], Some(Warm::Claimed));
        let all: Vec<&Instance> = ins.iter().collect();
        // Its node still cordoned: uncordon again; seen uncordoned: settled.
        let still = HashMap::from([(ids[0].as_str(), true)]);
        assert_eq!(plan(&cfg, &all, &still, &[], &BTreeMap::new()).uncordon, vec![ids[0].clone()]);
        let free = HashMap::from([(ids[0].as_str(), false)]);
        assert_eq!(plan(&cfg, &all, &free, &[], &BTreeMap::new()).settled, vec![ids[0].clone()]);
        // Never past the type's max, nor max_nodes, nor for a type that cannot be had.
        let gone = BTreeMap::from([("w".to_string(), "launch failed".to_string())]);
        assert_eq!(plan(&cfg, &all, &HashMap::new(), &[], &gone).replenish, BTreeMap::new());
        ins.queue("cold", 4, 0, "demand");
        let all: Vec<&Instance> = ins.iter().collect();
        assert_eq!(plan(&cfg, &all, &HashMap::new(), &[], &BTreeMap::new()).replenish, BTreeMap::new(), "max_nodes 6");
        // `warm` lowered to 0: the held one goes.
        let cold = PoolConfig::parse(&POOL.replace("warm = 2", "warm = 0")).unwrap();
        assert_eq!(plan(&cold, &all, &HashMap::new(), &[], &BTreeMap::new()).release, vec![ids[1].clone()]);
    }

    #[test]
    fn warm_above_max_is_refused_with_the_field_named() {
        let err = PoolConfig::parse(&POOL.replace("warm = 2", "warm = 5")).unwrap_err().to_string();
        assert!(err.contains("node_types.w.warm: 5 is more than max 4"), "{err}");
    }
}
