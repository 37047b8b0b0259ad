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

use flotilla_core::{MemberOption, NodeId, NodeSelector, NodeStatus, Resources};
use flotilla_view::{NodeRecord, ShardSlot, Version};
use imbl::Vector;
use rand::Rng;

use crate::spec::MemberSpread;

/// Feasible nodes compared per member (the sample).
pub const SAMPLE: usize = 16;
/// How far ahead of the candidate it reads the scan asks the CPU to fetch a node's
/// record, and then what the record points to (its allocations, its id's bytes, which
/// the pending lookup hashes): the record must have arrived by then. Each candidate's
/// reads through those pointers were cache misses that cost more than the rest of the
/// scan together (BENCHMARKS.md, "Prefetching the planner's scan").
const PREFETCH_RECORD: usize = 4;
const PREFETCH_FIELDS: usize = 2;
/// Nodes looked at per member at most, feasible or not.
pub const MAX_SCAN: usize = 1024;
/// Domains tried per unit at most.
pub const MAX_DOMAINS: usize = 16;

/// Per-node figures the planner reads for every candidate: hashed with foldhash, as
/// SipHash over the id was a measurable share of a placement.
pub type NodeMap<V> = HashMap<NodeId, V, foldhash::fast::FixedState>;

/// One member to place: each way to run it (its alternative's index, what it asks
/// and where it may run), in the order to try.
#[derive(Debug, Clone)]
pub struct MemberRequest {
    pub member: String,
    pub options: Vec<(u32, MemberOption)>,
}

impl MemberRequest {
    /// A member with one way to run, anywhere.
    #[cfg(test)]
    pub fn plain(member: &str, resources: Resources) -> MemberRequest {
        MemberRequest {
            member: member.to_string(),
            options: vec![(0, MemberOption { resources, ..Default::default() })],
        }
    }

    /// What it asks of a node as alternative `k` runs it.
    pub fn resources(&self, k: u32) -> Option<&Resources> {
        self.options.iter().find(|(i, _)| *i == k).map(|(_, o)| &o.resources)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct PlacedMember {
    pub member: String,
    pub node: NodeId,
    pub incarnation: u64,
    /// Which alternative of its template it runs as (0: the template itself).
    pub alternative: u32,
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

/// Request classes known not to fit a domain at a shard view version: a class is the
/// members' summed resources and a digest of every option they have.
#[derive(Debug, Default)]
pub struct ClassCache {
    infeasible: HashMap<(String, Resources, u64), Version>,
}

pub struct PlanInput<'a> {
    pub slots: &'a [Arc<ShardSlot>],
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
        units_per_domain: &'a HashMap<String, u32>,
        units_per_node: &'a NodeMap<u32>,
        pending: &'a NodeMap<Resources>,
    ) -> Self {
        PlanInput {
            slots,
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
    let class = {
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = foldhash::fast::FixedState::default().build_hasher();
        members.iter().for_each(|m| m.options.hash(&mut h));
        let first = |m: &MemberRequest| m.options.first().map(|(_, o)| o.resources.clone()).unwrap_or_default();
        let total = members.iter().fold(Resources::default(), |acc, m| acc.checked_add(&first(m)).unwrap_or(acc));
        (total, h.finish())
    };
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
        let key = (domain.to_string(), class.0.clone(), class.1);
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

/// A candidate's rank: a node without GPUs first unless the member needs them (Ray's
/// first rule, before spread: a CPU-only head spread onto a GPU node takes room a GPU
/// member of the next unit needs), then fewer of the app's units (when it spreads), then
/// the node the pool keeps anyway and the cheaper
/// (`flotilla_core::unit_shape::preference`), then the fit score.
type Ranked = (u8, std::cmp::Reverse<u32>, (bool, std::cmp::Reverse<u64>), Score);

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
    if input.members == Some(MemberSpread::Pack) && members.len() > 1 {
        return place_packed(input, nodes, members, rng, why);
    }
    place_members(input, nodes, members, rng, why)
}

/// `pack`: the members together are one request on one node, which every member's
/// selector admits, in each of the unit's sets of options in turn
/// (`flotilla_core::unit_shape::option_sets`; a member's group is its name's prefix).
fn place_packed(
    input: &PlanInput<'_>,
    nodes: &Vector<Arc<NodeRecord>>,
    members: &[MemberRequest],
    rng: &mut impl Rng,
    why: &mut Unplaced,
) -> Option<InDomain> {
    let sets = flotilla_core::unit_shape::option_sets(
        members.iter().map(|m| (crate::spec::AppSpec::group_of(&m.member), m.options.len())),
    );
    for set in sets {
        let chosen: Vec<&(u32, MemberOption)> =
            members.iter().zip(&set).filter_map(|(m, k)| m.options.get(*k)).collect();
        let mut together = MemberOption::default();
        for (i, (_, o)) in chosen.iter().enumerate() {
            together.resources = together.resources.checked_add(&o.resources).unwrap_or(together.resources);
            together.selector = if i == 0 { o.selector.clone() } else { both(&together.selector, &o.selector) };
        }
        let one = [MemberRequest { member: String::new(), options: vec![(0, together)] }];
        if let Some((placed, notes)) = place_members(input, nodes, &one, rng, why) {
            let at = placed.into_iter().next()?;
            let placed = members
                .iter()
                .zip(&chosen)
                .map(|(m, (k, _))| PlacedMember {
                    member: m.member.clone(),
                    node: at.node.clone(),
                    incarnation: at.incarnation,
                    alternative: *k,
                })
                .collect();
            return Some((placed, notes));
        }
    }
    None
}

/// The nodes both selectors admit.
fn both(a: &NodeSelector, b: &NodeSelector) -> NodeSelector {
    let mut out = a.clone();
    for (k, vs) in &b.labels {
        out.labels.entry(k.clone()).and_modify(|have| have.retain(|v| vs.contains(v))).or_insert_with(|| vs.clone());
    }
    out.allow_low_priority = a.allow_low_priority && b.allow_low_priority;
    out
}

/// The best node of a sample for one option of a member: its rank, index, the app's
/// units there, how many feasible nodes were seen and whether the domain was scanned
/// whole.
type Best = (Option<(Ranked, usize, u32)>, usize, bool);

/// Each member takes the best of a sample of feasible nodes, scanned from a random
/// place in the domain, in the first of its options any node can take. A candidate
/// costs an indexed read of the domain's records and, only when this app has units or
/// pending claims, two hash lookups: this loop runs up to [`SAMPLE`] times per member
/// and is most of a placement's CPU.
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
    for m in members {
        let mut found = None;
        for (k, option) in &m.options {
            let (best, feasible, scanned_all) = best_node(input, nodes, option, &planned, rng, why);
            if let Some(best) = best {
                found = Some((*k, option, best, feasible, scanned_all));
                break;
            }
        }
        let (alternative, option, (_, at, units_here), feasible, scanned_all) = found?;
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
                *p = p.checked_add(&option.resources).unwrap_or_else(|_| p.clone());
            }
            None => planned.push((node, option.resources.clone())),
        }
        out.push(PlacedMember {
            member: m.member.clone(),
            node: node.node_id.clone(),
            incarnation: node.incarnation.0,
            alternative,
        });
    }
    Some((out, notes))
}

/// The best of a sample of the domain's nodes for `option`, given what this plan
/// `planned` already (see [`place_members`]).
fn best_node(
    input: &PlanInput<'_>,
    nodes: &Vector<Arc<NodeRecord>>,
    option: &MemberOption,
    planned: &[(&NodeRecord, Resources)],
    rng: &mut impl Rng,
    why: &mut Unplaced,
) -> Best {
    let node_max = input.max_units_per_node.map(|m| m.saturating_add(input.surge));
    let len = nodes.len();
    let mut focus = nodes.focus();
    let mut ahead = nodes.focus();
    let start = rng.random_range(0..len);
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
        if let Some(far) = ahead.get((at + PREFETCH_RECORD) % len) {
            flotilla_core::prefetch_value(Arc::as_ptr(far));
        }
        if let Some(near) = ahead.get((at + PREFETCH_FIELDS) % len) {
            flotilla_core::prefetch_value(Arc::as_ptr(&near.allocated));
            flotilla_core::prefetch(near.node_id.location(), 64);
        }
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
        if let Err(refusal) = option.selector.admits(|k| node.labels.get(k)) {
            *why.excluded.entry(refusal.as_str()).or_default() += 1;
            continue;
        }
        let planned_here = planned.iter().find(|(n, _)| std::ptr::eq(*n, &**node)).map(|(_, r)| r);
        let holds_unit = planned_here.is_some() || input.unit_nodes.contains(&node.node_id);
        if input.members == Some(MemberSpread::Spread) && holds_unit {
            *why.excluded.entry("holding another member of the unit (spread.members)").or_default() += 1;
            continue;
        }
        // The app's units here matter only to a limit or a preference (and the notes of
        // both): without either, a candidate costs no count lookup.
        let units_here = match node_max.is_some() || input.prefer_spread {
            true => lookup(input.units_per_node, &node.node_id).copied().unwrap_or(0),
            false => 0,
        };
        if let Err(refusal) = flotilla_core::unit_shape::node_has_room(units_here, node_max, holds_unit) {
            *why.excluded.entry(refusal.as_str()).or_default() += 1;
            continue;
        }
        let mut used = (*node.allocated).clone();
        for extra in [lookup(input.pending, &node.node_id), planned_here].into_iter().flatten() {
            used = used.checked_add(extra).unwrap_or(used);
        }
        let Ok(after) = used.checked_add(&option.resources) else { continue };
        if !after.fits_in(&node.capacity) {
            *why.excluded.entry(lacking(&after, &node.capacity)).or_default() += 1;
            continue;
        }
        feasible += 1;
        let crowd = if input.prefer_spread { units_here } else { 0 };
        let fit = score(node, &after, &option.resources);
        let s = (fit.0, std::cmp::Reverse(crowd), node.labels.pool_preference(), fit);
        if best.as_ref().is_none_or(|(b, _, _)| s.partial_cmp(b) == Some(std::cmp::Ordering::Greater)) {
            best = Some((s, at, units_here));
        }
    }
    (best, feasible, scanned_all)
}

/// A map lookup that skips hashing the id when the map is empty (an app's first pass,
/// or nothing pending).
fn lookup<'m, V>(map: &'m NodeMap<V>, id: &NodeId) -> Option<&'m V> {
    if map.is_empty() { None } else { map.get(id) }
}

#[cfg(test)]
mod tests;
