//! Placement as a pure function of the view: which domain and which nodes a unit's
//! members go to, or why none can hold it.
//!
//! Every member of a unit lands in one domain (the failure domain). Domains are tried
//! in spread order (fewest units of this app first, never past `max_units_per_domain`).
//! Inside a domain each member takes the best of a bounded random sample of feasible
//! nodes (Borg's relaxed randomisation), scored by the Ray autoscaler v2 tuple extended
//! with health. A domain that could not hold a request class at a view version is not
//! scanned again for that class until its shard's view changes (equivalence classes).
//!
//! Node spread: a unit counts on a node if any of its members runs there. With
//! `spread.max_units_per_node` a node at the max takes no new unit; without it a serving
//! app still prefers nodes holding fewer of its units (compared before bin packing), and
//! the placement says so when it could not avoid sharing a node. `spread.members` puts a
//! unit's members on one node (`pack`) or on distinct nodes (`spread`).
//!
//! Surge: a replacement made before the unit it replaces breaks (drain, rollout) may go
//! past both maxima by the number of units leaving, so a drain never waits on spread; the
//! placement's note says when it did.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use flotilla_core::{NodeId, NodeStatus, Resources};
use flotilla_view::{NodeRecord, ShardSlot, Version};
use imbl::Vector;
use rand::Rng;

use crate::spec::{Constraints, MemberSpread};

/// Feasible nodes compared per member (the sample).
pub const SAMPLE: usize = 16;
/// Nodes looked at per member at most, feasible or not.
pub const MAX_SCAN: usize = 1024;
/// Domains tried per unit at most.
pub const MAX_DOMAINS: usize = 16;

/// Per-node figures the planner reads for every candidate: hashed with foldhash, as
/// SipHash over the id was a measurable share of a placement.
pub type NodeMap<V> = HashMap<NodeId, V, foldhash::fast::FixedState>;

/// One member to place.
#[derive(Debug, Clone)]
pub struct MemberRequest {
    pub member: String,
    pub resources: Resources,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlacedMember {
    pub member: String,
    pub node: NodeId,
    pub incarnation: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Placement {
    pub domain: String,
    pub shard: usize,
    pub members: Vec<PlacedMember>,
    /// Why the unit sits where it does when spread could not be honoured (nodes shared
    /// with other units of the app, a maximum passed by a surge); `units APP` shows it.
    pub note: Option<String>,
}

/// How many nodes each filter excluded, as Nomad reports an unplaceable job.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Unplaced {
    pub excluded: BTreeMap<&'static str, usize>,
    pub domains_tried: usize,
    pub domains_full: usize,
}

impl std::fmt::Display for Unplaced {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no domain can hold the unit ({} tried", self.domains_tried)?;
        if self.domains_full > 0 {
            write!(f, ", {} at max_units_per_domain", self.domains_full)?;
        }
        write!(f, ")")?;
        for (k, v) in &self.excluded {
            write!(f, "; {v} nodes {k}")?;
        }
        Ok(())
    }
}

/// What a node lacks, for `units`: free ports (named ports, see `flotilla_core::ports`)
/// when only they are short, else resources.
fn lacking(wanted: &Resources, capacity: &Resources) -> &'static str {
    let ports = flotilla_core::ports::PORTS_RESOURCE;
    let mut without = wanted.clone();
    if without.custom.remove(ports).is_some() && without.fits_in(capacity) {
        "lacking free ports"
    } else {
        "lacking resources"
    }
}

/// Request classes known not to fit a domain at a shard view version.
#[derive(Debug, Default)]
pub struct ClassCache {
    infeasible: HashMap<(String, Resources), Version>,
}

pub struct PlanInput<'a> {
    pub slots: &'a [Arc<ShardSlot>],
    pub constraints: &'a Constraints,
    pub max_units_per_domain: Option<u32>,
    /// Active units of this app per domain.
    pub units_per_domain: &'a HashMap<String, u32>,
    /// Resources this scheduler holds that the view may not show yet.
    pub pending: &'a NodeMap<Resources>,
    /// Place in this domain only (replacing a unit's lost members).
    pub only_domain: Option<&'a str>,
    /// `spread.max_units_per_node`: a hard limit.
    pub max_units_per_node: Option<u32>,
    /// Units of this app per node, not counting the unit being placed.
    pub units_per_node: &'a NodeMap<u32>,
    /// Prefer nodes holding fewer of the app's units (see `Spread::spreads_over_nodes`).
    pub prefer_spread: bool,
    /// `spread.members`: `None` places each member on its own merits.
    pub members: Option<MemberSpread>,
    /// Nodes the unit already holds (its other members, when only some are placed).
    pub unit_nodes: &'a [NodeId],
    /// A make-before-break replacement may exceed both maxima by this many (the units
    /// leaving); 0 for anything else.
    pub surge: u32,
    /// Among domains holding as many units, try this one first (a replacement's old
    /// domain: once the old unit leaves, the domains stay balanced).
    pub prefer_domain: Option<&'a str>,
}

impl<'a> PlanInput<'a> {
    /// An input with no node spread, no surge and nothing pending: callers set the rest.
    pub fn new(
        slots: &'a [Arc<ShardSlot>],
        constraints: &'a Constraints,
        units_per_domain: &'a HashMap<String, u32>,
        units_per_node: &'a NodeMap<u32>,
        pending: &'a NodeMap<Resources>,
    ) -> Self {
        PlanInput {
            slots,
            constraints,
            max_units_per_domain: None,
            units_per_domain,
            pending,
            only_domain: None,
            max_units_per_node: None,
            units_per_node,
            prefer_spread: false,
            members: None,
            unit_nodes: &[],
            surge: 0,
            prefer_domain: None,
        }
    }
}

/// See [`score`].
pub type Score = (u8, u8, f32, f32, f32);

/// The score tuple, compared lexicographically (higher is better):
/// 1. not a GPU node unless the member needs GPUs (keep GPUs for GPU work);
/// 2. how many resource types of the node the member uses;
/// 3. the smallest utilisation over used dimensions after placement (bin packing);
/// 4. the mean utilisation after placement;
/// 5. the node's health score.
pub fn score(node: &NodeRecord, used_after: &Resources, req: &Resources) -> Score {
    let gpu_ok = u8::from(req.gpu > 0 || node.capacity.gpu == 0);
    let (mut types, mut dims, mut min, mut sum) = (0, 0u8, f32::INFINITY, 0.0);
    for (want, used, cap) in [
        (req.cpu_millis, used_after.cpu_millis, node.capacity.cpu_millis),
        (req.memory_bytes, used_after.memory_bytes, node.capacity.memory_bytes),
        (u64::from(req.gpu), u64::from(used_after.gpu), u64::from(node.capacity.gpu)),
    ] {
        if cap > 0 {
            let u = used as f32 / cap as f32;
            (dims, min, sum) = (dims + 1, min.min(u), sum + u);
            types += u8::from(want > 0);
        }
    }
    let mean = if dims == 0 { 0.0 } else { sum / f32::from(dims) };
    (gpu_ok, types, if min.is_finite() { min } else { 0.0 }, mean, node.health_score())
}

/// Places a whole unit, or says why it cannot.
pub fn place_unit(
    input: &PlanInput<'_>,
    members: &[MemberRequest],
    cache: &mut ClassCache,
    rng: &mut impl Rng,
) -> Result<Placement, Unplaced> {
    let mut why = Unplaced::default();
    let class = members.iter().fold(Resources::default(), |acc, m| acc.checked_add(&m.resources).unwrap_or(acc));
    // (shard, domain, its nodes, units of this app there, (not preferred, random tie-break))
    type Candidate<'s> = (usize, &'s str, &'s Vector<Arc<NodeRecord>>, u32, (bool, u32));
    let mut domains: Vec<Candidate<'_>> = input
        .slots
        .iter()
        .enumerate()
        .flat_map(|(shard, slot)| slot.domains.iter().map(move |(d, ids)| (shard, d, ids)))
        .filter(|(_, d, _)| input.only_domain.is_none_or(|only| only == *d))
        .map(|(shard, d, ids)| {
            let preferred = input.prefer_domain == Some(d);
            (shard, d, ids, input.units_per_domain.get(d).copied().unwrap_or(0), (!preferred, rng.random::<u32>()))
        })
        .collect();
    // A replacement's old domain counts without the unit leaving it.
    domains.sort_by_key(|&(_, _, _, units, (other, tie))| (units.saturating_sub(u32::from(!other)), other, tie));
    for (shard, domain, nodes, units, _) in domains.into_iter().take(MAX_DOMAINS) {
        if input.max_units_per_domain.is_some_and(|m| units >= m.saturating_add(input.surge)) {
            why.domains_full += 1;
            continue;
        }
        let slot = &input.slots[shard];
        if !slot.connected {
            *why.excluded.entry("in a shard that is unreachable").or_default() += nodes.len();
            continue;
        }
        let key = (domain.to_string(), class.clone());
        if cache.infeasible.get(&key) == Some(&slot.view.version) {
            *why.excluded.entry("in domains known to be full for this request").or_default() += 1;
            continue;
        }
        why.domains_tried += 1;
        match place_in_domain(input, nodes, members, rng, &mut why) {
            Some((placed, mut notes)) => {
                if let Some(m) = input.max_units_per_domain.filter(|m| units >= *m) {
                    notes.insert(
                        0,
                        format!(
                            "surge: {} units in {domain}, above max_units_per_domain {m} while {} leave",
                            units + 1,
                            input.surge
                        ),
                    );
                }
                let note = (!notes.is_empty()).then(|| notes.join("; "));
                return Ok(Placement { domain: domain.to_string(), shard, members: placed, note });
            }
            // Known full for the class only when nothing about this unit or the app's
            // other units (which change within a pass) excluded a node.
            None if class_only(input) => {
                cache.infeasible.insert(key, slot.view.version);
            }
            None => {}
        }
    }
    Err(why)
}

/// Does only the request class decide whether a domain can hold the unit (so a
/// failure may be cached for it)?
fn class_only(input: &PlanInput<'_>) -> bool {
    input.max_units_per_node.is_none() && input.unit_nodes.is_empty() && input.members != Some(MemberSpread::Spread)
}

/// A candidate's rank: fewer of the app's units first (when spreading), then [`score`].
/// Fewer of the app's units first (when it spreads), then the node the pool keeps anyway
/// and the cheaper (`flotilla_core::unit_shape::preference`), then the fit score.
type Ranked = (std::cmp::Reverse<u32>, (bool, std::cmp::Reverse<u64>), Score);

/// The members placed in one domain, and notes on spread that could not be honoured.
type InDomain = (Vec<PlacedMember>, Vec<String>);

fn place_in_domain(
    input: &PlanInput<'_>,
    nodes: &Vector<Arc<NodeRecord>>,
    members: &[MemberRequest],
    rng: &mut impl Rng,
    why: &mut Unplaced,
) -> Option<InDomain> {
    if nodes.is_empty() {
        return None;
    }
    // `pack`: the members together are one request on one node.
    if input.members == Some(MemberSpread::Pack) && members.len() > 1 {
        let total = members.iter().fold(Resources::default(), |acc, m| acc.checked_add(&m.resources).unwrap_or(acc));
        let together = [MemberRequest { member: String::new(), resources: total }];
        let (one, notes) = place_members(input, nodes, &together, rng, why)?;
        let at = one.into_iter().next()?;
        let placed = members
            .iter()
            .map(|m| PlacedMember { member: m.member.clone(), node: at.node.clone(), incarnation: at.incarnation })
            .collect();
        return Some((placed, notes));
    }
    place_members(input, nodes, members, rng, why)
}

/// Each member takes the best of a sample of feasible nodes, scanned from a random
/// place in the domain. A candidate costs an indexed read of the domain's records and,
/// only when this app has units or pending claims, two hash lookups: this loop runs
/// up to [`SAMPLE`] times per member and is most of a placement's CPU.
fn place_members(
    input: &PlanInput<'_>,
    nodes: &Vector<Arc<NodeRecord>>,
    members: &[MemberRequest],
    rng: &mut impl Rng,
    why: &mut Unplaced,
) -> Option<InDomain> {
    // What this plan already put on each node (a few members at most).
    let mut planned: Vec<(&NodeRecord, Resources)> = Vec::with_capacity(members.len());
    let mut out: Vec<PlacedMember> = Vec::with_capacity(members.len());
    let mut notes = Vec::new();
    let node_max = input.max_units_per_node.map(|m| m.saturating_add(input.surge));
    let len = nodes.len();
    let mut focus = nodes.focus();
    for m in members {
        let start = rng.random_range(0..len);
        // (fewer of the app's units first, then the score), the node's index, its units
        let mut best: Option<(Ranked, usize, u32)> = None;
        let mut feasible = 0;
        let mut scanned_all = true;
        for scanned in 0..len {
            if feasible >= SAMPLE {
                scanned_all = false;
                break;
            }
            if scanned >= MAX_SCAN {
                *why.excluded.entry("left unexamined (scan limit)").or_default() += len - scanned;
                scanned_all = false;
                break;
            }
            let at = (start + scanned) % len;
            let Some(node) = focus.get(at) else { continue };
            if node.status != NodeStatus::Alive {
                *why.excluded.entry("not alive").or_default() += 1;
                continue;
            }
            if node.cordoned {
                *why.excluded.entry("cordoned").or_default() += 1;
                continue;
            }
            if node.health.preemption_notice() {
                *why.excluded.entry("under a preemption notice").or_default() += 1;
                continue;
            }
            let c = input.constraints;
            if let Err(refusal) =
                flotilla_core::unit_shape::node_admits(&c.labels, c.allow_low_priority, |k| node.labels.get(k))
            {
                *why.excluded.entry(refusal.as_str()).or_default() += 1;
                continue;
            }
            let planned_here = planned.iter().find(|(n, _)| std::ptr::eq(*n, &**node)).map(|(_, r)| r);
            let holds_unit = planned_here.is_some() || input.unit_nodes.contains(&node.node_id);
            if input.members == Some(MemberSpread::Spread) && holds_unit {
                *why.excluded.entry("holding another member of the unit (spread.members)").or_default() += 1;
                continue;
            }
            let units_here = lookup(input.units_per_node, &node.node_id).copied().unwrap_or(0);
            if let Err(refusal) = flotilla_core::unit_shape::node_has_room(units_here, node_max, holds_unit) {
                *why.excluded.entry(refusal.as_str()).or_default() += 1;
                continue;
            }
            let mut used = (*node.allocated).clone();
            for extra in [lookup(input.pending, &node.node_id), planned_here].into_iter().flatten() {
                used = used.checked_add(extra).unwrap_or(used);
            }
            let Ok(after) = used.checked_add(&m.resources) else { continue };
            if !after.fits_in(&node.capacity) {
                *why.excluded.entry(lacking(&after, &node.capacity)).or_default() += 1;
                continue;
            }
            feasible += 1;
            let crowd = if input.prefer_spread { units_here } else { 0 };
            let s = (std::cmp::Reverse(crowd), node.labels.pool_preference(), score(node, &after, &m.resources));
            if best.as_ref().is_none_or(|(b, _, _)| s.partial_cmp(b) == Some(std::cmp::Ordering::Greater)) {
                best = Some((s, at, units_here));
            }
        }
        let (_, at, units_here) = best?;
        let node: &NodeRecord = nodes.get(at)?;
        let planned_here = planned.iter().position(|(n, _)| std::ptr::eq(*n, node));
        let new_here = planned_here.is_none() && !input.unit_nodes.contains(&node.node_id);
        if new_here && units_here > 0 {
            if let Some(max) = input.max_units_per_node.filter(|max| units_here >= *max) {
                notes.push(format!(
                    "surge: {} units on {}, above max_units_per_node {max} while {} leave",
                    units_here + 1,
                    node.node_id,
                    input.surge
                ));
            } else if input.prefer_spread {
                let fit = if scanned_all {
                    format!("only {feasible} nodes fit")
                } else {
                    format!("each of the {feasible} nodes sampled holds some")
                };
                notes.push(format!("{} units on {}: {fit}", units_here + 1, node.node_id));
            }
        }
        match planned_here {
            Some(i) => {
                let p = &mut planned[i].1;
                *p = p.checked_add(&m.resources).unwrap_or_else(|_| p.clone());
            }
            None => planned.push((node, m.resources.clone())),
        }
        out.push(PlacedMember {
            member: m.member.clone(),
            node: node.node_id.clone(),
            incarnation: node.incarnation.0,
        });
    }
    Some((out, notes))
}

/// A map lookup that skips hashing the id when the map is empty (an app's first pass,
/// or nothing pending).
fn lookup<'m, V>(map: &'m NodeMap<V>, id: &NodeId) -> Option<&'m V> {
    if map.is_empty() { None } else { map.get(id) }
}

#[cfg(test)]
mod tests {
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
        (0..n).map(|i| MemberRequest { member: format!("m{i}"), resources: Resources::new(cpu, 1 << 20, 0) }).collect()
    }

    fn plan(
        s: &[Arc<ShardSlot>],
        c: &Constraints,
        per_domain: &HashMap<String, u32>,
        max: Option<u32>,
        ms: &[MemberRequest],
    ) -> Result<Placement, Unplaced> {
        let (pending, per_node) = (NodeMap::default(), NodeMap::default());
        let input = PlanInput { max_units_per_domain: max, ..PlanInput::new(s, c, per_domain, &per_node, &pending) };
        place_unit(&input, ms, &mut ClassCache::default(), &mut rand::rngs::StdRng::seed_from_u64(7))
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
        m[0].resources.custom.insert("ports".into(), 10);
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
        let c = Constraints::default();
        let input = PlanInput::new(&s, &c, &per, &per_node, &pending);
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
    fn place_many(
        s: &[Arc<ShardSlot>],
        n: usize,
        tune: impl Fn(&mut PlanInput<'_>),
    ) -> Vec<(Vec<String>, Option<String>)> {
        let (c, per_domain) = (Constraints::default(), HashMap::new());
        let mut pending: NodeMap<Resources> = NodeMap::default();
        let mut per_node: NodeMap<u32> = NodeMap::default();
        let mut out = Vec::new();
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for _ in 0..n {
            let mut input = PlanInput::new(s, &c, &per_domain, &per_node, &pending);
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
        let (c, pending, per_domain) = (Constraints::default(), NodeMap::default(), HashMap::new());
        let full =
            PlanInput { max_units_per_node: Some(2), ..PlanInput::new(&s, &c, &per_domain, &per_node, &pending) };
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
        let (c, pending, per_node) = (Constraints::default(), NodeMap::default(), NodeMap::default());
        let per_domain = HashMap::from([("a".to_string(), 3)]);
        let full =
            PlanInput { max_units_per_domain: Some(3), ..PlanInput::new(&s, &c, &per_domain, &per_node, &pending) };
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        assert_eq!(
            place_unit(&full, &members(1, 1), &mut ClassCache::default(), &mut rng).unwrap_err().domains_full,
            1
        );
        let p =
            place_unit(&PlanInput { surge: 1, ..full }, &members(1, 1), &mut ClassCache::default(), &mut rng).unwrap();
        let note = p.note.unwrap_or_default();
        assert!(note.contains("surge: 4 units in a, above max_units_per_domain 3 while 1 leave"), "{note}");
        let per_domain = HashMap::from([("a".to_string(), 4)]);
        let past = PlanInput {
            surge: 1,
            max_units_per_domain: Some(3),
            ..PlanInput::new(&s, &c, &per_domain, &per_node, &pending)
        };
        assert!(place_unit(&past, &members(1, 1), &mut ClassCache::default(), &mut rng).is_err(), "by 1, no more");
    }

    #[test]
    fn members_pack_on_one_node_or_spread_over_distinct_nodes() {
        let s = four_nodes();
        let (c, pending, per_domain, per_node) =
            (Constraints::default(), NodeMap::default(), HashMap::new(), NodeMap::default());
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let nodes =
            |p: &Placement| p.members.iter().map(|m| m.node.to_string()).collect::<std::collections::BTreeSet<_>>();
        let spread = PlanInput {
            members: Some(MemberSpread::Spread),
            ..PlanInput::new(&s, &c, &per_domain, &per_node, &pending)
        };
        let p = place_unit(&spread, &members(4, 100), &mut ClassCache::default(), &mut rng).unwrap();
        assert_eq!(nodes(&p).len(), 4, "{p:?}");
        let err = place_unit(&spread, &members(5, 100), &mut ClassCache::default(), &mut rng).unwrap_err();
        assert!(err.excluded.contains_key("holding another member of the unit (spread.members)"), "{err}");
        let pack =
            PlanInput { members: Some(MemberSpread::Pack), ..PlanInput::new(&s, &c, &per_domain, &per_node, &pending) };
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
        let (c, pending, per_node) = (Constraints::default(), NodeMap::default(), NodeMap::default());
        let per_domain = HashMap::from([("a".to_string(), 3), ("b".to_string(), 2)]);
        for seed in 0..8 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let input = PlanInput {
                prefer_domain: Some("a"),
                surge: 1,
                max_units_per_domain: Some(3),
                ..PlanInput::new(&s, &c, &per_domain, &per_node, &pending)
            };
            let p = place_unit(&input, &members(1, 1), &mut ClassCache::default(), &mut rng).unwrap();
            assert_eq!(p.domain, "a", "a holds 2 once its unit leaves, b 2: the old domain first");
        }
    }
}
