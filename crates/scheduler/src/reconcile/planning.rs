//! What planning keeps between passes: how many queued units the next pass places (the
//! burst's pace), what this scheduler committed that the view does not show yet, the
//! planner's caches of infeasible classes, and the seeded rng for sampling and back-off.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::{NodeId, Resources};
use flotilla_view::{ShardSlot, Version};
use rand::Rng;

use crate::planner::{ClassCache, MemberRequest, NodeMap, Placement};

/// Units placed per pass at most (the rest wait for the next pass).
const UNITS_PER_PASS: usize = 1024;
/// Units the first pass of a burst places. A burst (the scheduler starting or taking over,
/// or queued units after an idle pass) doubles its pass after each full one, up to
/// `UNITS_PER_PASS`: sixteen schedulers starting together used to send the shards 16 ×
/// 1,024 claims within half a second, and the last of those commits waited behind all the
/// others (the commit p99 of the schedule loadtest, BENCHMARKS.md).
const FIRST_PASS_UNITS: usize = 256;

/// Resources this scheduler committed on a node that the view did not show yet when it
/// answered, so the next plans do not count them free.
struct PendingAlloc {
    shard: usize,
    shown_in: Version,
    node: NodeId,
    resources: Resources,
}

pub(super) struct Planning {
    /// Units the next pass may place: `FIRST_PASS_UNITS`, doubling in a burst.
    pass_units: usize,
    pending: Vec<PendingAlloc>,
    /// By group (primary, secondary): secondary units may take low-priority nodes, so
    /// what is infeasible differs.
    classes: [ClassCache; 2],
    rng: rand::rngs::StdRng,
}

impl Planning {
    pub(super) fn new(rng: rand::rngs::StdRng) -> Self {
        Planning { pass_units: FIRST_PASS_UNITS, pending: Vec::new(), classes: Default::default(), rng }
    }

    /// How many of `queued` units this pass places; paces the next pass by it.
    pub(super) fn pass(&mut self, queued: usize) -> usize {
        let now = queued.min(self.pass_units);
        self.pass_units = match now {
            0 => FIRST_PASS_UNITS,
            n if n == self.pass_units => (n * 2).min(UNITS_PER_PASS),
            _ => self.pass_units,
        };
        now
    }

    /// The jittered wait before commit attempt `attempt` (from 1), so schedulers whose
    /// claims collided do not collide again.
    pub(super) fn backoff(&mut self, attempt: usize) -> Duration {
        Duration::from_millis(self.rng.random_range(5..25) * attempt as u64)
    }

    /// The class cache and rng a unit of the group plans with.
    pub(super) fn planner(&mut self, secondary: bool) -> (&mut ClassCache, &mut rand::rngs::StdRng) {
        (&mut self.classes[usize::from(secondary)], &mut self.rng)
    }

    /// A new spec is in force: what was infeasible may fit now.
    pub(super) fn forget_classes(&mut self) {
        self.classes = Default::default();
    }

    /// Forgets this run's commits and pace, as a restart would.
    pub(super) fn restart(&mut self) {
        self.pending.clear();
        self.pass_units = FIRST_PASS_UNITS;
    }

    /// `resources` committed on `node` of `shard`, which answered while its view was
    /// older than `shown_in`.
    pub(super) fn committed(&mut self, shard: usize, shown_in: Version, node: NodeId, resources: Resources) {
        self.pending.push(PendingAlloc { shard, shown_in, node, resources });
    }

    /// Drops the commits the view shows now (or whose shard restarted its epoch).
    pub(super) fn shown(&mut self, slots: &[Arc<ShardSlot>]) {
        self.pending.retain(|p| {
            slots.get(p.shard).is_none_or(|s| s.view.version.epoch == p.shown_in.epoch && s.view.version < p.shown_in)
        });
    }

    /// What is committed but not shown yet, by node.
    /// Nothing committed is still to show in the view.
    pub(super) fn settled(&self) -> bool {
        self.pending.is_empty()
    }

    pub(super) fn pending_by_node(&self) -> NodeMap<Resources> {
        let mut by_node: NodeMap<Resources> = NodeMap::default();
        for p in &self.pending {
            add(&mut by_node, &p.node, &p.resources);
        }
        by_node
    }
}

/// What each member of a unit of `spec` asks for and where it may run, in member
/// order (of a secondary unit when `secondary`).
pub(super) fn member_requests(spec: &crate::spec::AppSpec, secondary: bool) -> Vec<MemberRequest> {
    spec.members()
        .iter()
        .map(|(member, _, t)| MemberRequest { member: member.clone(), options: spec.options(t, secondary) })
        .collect()
}

/// Counts the members of `p`, committed, by group and alternative.
pub(super) fn count_placed(spec: &crate::spec::AppSpec, p: &Placement) {
    for m in &p.members {
        let group = crate::spec::AppSpec::group_of(&m.member).to_string();
        metrics::counter!(crate::catalogue::MEMBERS_PLACED.name, "app" => spec.name.clone(), "group" => group,
            "alternative" => m.alternative.to_string())
        .increment(1);
    }
}

/// A member of `unit` placed again (healed, or moved off a leaving node): as the
/// alternative it ran as first, so a unit's members keep the build they started with
/// while it fits, then the others.
pub(super) fn member_again(
    spec: &crate::spec::AppSpec,
    unit: &crate::store::UnitRecord,
    member: &str,
    t: &crate::spec::MemberTemplate,
) -> MemberRequest {
    let mut options = spec.options(t, unit.secondary);
    let had = unit.members.iter().find(|m| m.member == member).map_or(0, |m| m.alternative);
    if let Some(i) = options.iter().position(|(k, _)| *k == had) {
        let first = options.remove(i);
        options.insert(0, first);
    }
    MemberRequest { member: member.to_string(), options }
}

/// Holds what a planned unit takes, so the next unit planned in the same pass (or dry
/// run) sees it: its members' resources, its nodes (once each) and its domain.
pub(super) fn hold(
    p: &Placement,
    requests: &[MemberRequest],
    pending: &mut NodeMap<Resources>,
    per_node: &mut NodeMap<u32>,
    per_domain: &mut HashMap<String, u32>,
) {
    for (m, r) in p.members.iter().zip(requests) {
        if let Some(resources) = r.resources(m.alternative) {
            add(pending, &m.node, resources);
        }
    }
    let mut nodes: Vec<&NodeId> = p.members.iter().map(|m| &m.node).collect();
    nodes.sort();
    nodes.dedup();
    for n in nodes {
        *per_node.entry(n.clone()).or_insert(0) += 1;
    }
    *per_domain.entry(p.domain.clone()).or_insert(0) += 1;
}

/// Counts `r` as taken on `node`.
pub(super) fn add(pending: &mut NodeMap<Resources>, node: &NodeId, r: &Resources) {
    let e = pending.entry(node.clone()).or_default();
    *e = e.checked_add(r).unwrap_or_else(|_| e.clone());
}
