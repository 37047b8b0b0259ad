//! Ray autoscaler v2's `ResourceDemandScheduler`, as a pure function: which nodes to
//! launch and which to terminate for a pool's demand.
//!
//! One pass, in Ray's order:
//! 1. enforce each node type's `min`, then its `max` and the pool's `max_nodes`
//!    (terminating the least useful nodes first);
//! 2. the floor (`request_resources`, Ray's cluster resource constraint): fitted against
//!    nodes' whole capacity, launching what is missing;
//! 3. gangs (all or nothing, in the first of their variants that fits; STRICT_SPREAD
//!    one bundle per node, STRICT_PACK as one bundle; a unit's members in one domain,
//!    each on a node its own selector allows, in a domain and on nodes with room under
//!    its app's `max_units_per_domain` and `max_units_per_node`, this pass's units
//!    counted);
//! 4. plain requests, biggest first: onto existing nodes, then onto new ones (a node
//!    takes no more of an app's one-member units than its per-node limit leaves);
//! 5. idle nodes no step needed, past their type's `idle_timeout`, above `min`: terminated.
//!
//! Steps 2–4 use Ray's greedy: among candidate nodes, fill each (requests in order, no
//! backtracking) and keep the one with the best [`node::Score`]. Identical requests are
//! one group with a count, so a fill is one division per distinct shape; that and
//! dense resource vectors are why this is orders of magnitude faster than Ray on the
//! same input and yields the same packing.

mod classes;
mod gang;
mod node;
mod pending;
mod problem;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::ops::Bound::{Excluded, Unbounded};
use std::sync::Arc;

use classes::Classes;
use node::{Origin, SimNode};
use pending::Pending;
pub use problem::{
    Bundle, Cause, Gang, Inert, Infeasible, Labels, Limit, MAX_REASONS, Node, NodeType, Plan, Problem, Request,
    Selector, Strategy, Termination,
};
use problem::{Cap, Group, Item, Source};

use crate::shape::{ResourceNames, Shape};

/// Ray's request order: constrained first, then more resource kinds, then bigger (the
/// sum of the amounts in their own units, as Ray sums them), then by shape. Each key is
/// computed once (a million distinct shapes spent most of a pass in the comparator).
fn sort_groups(groups: Vec<Group>, counts: Vec<u64>, names: &ResourceNames) -> (Vec<Group>, Vec<u64>) {
    let keys: Vec<(u8, usize, usize, f64)> = groups
        .iter()
        .map(|g| {
            let sum: f64 = g.shape.0.iter().enumerate().map(|(i, q)| names.to_value(i, *q)).sum();
            let constraints = g.selector.require.len() + g.selector.forbid.len();
            (u8::from(g.anti.is_some()), constraints, g.shape.kinds().count(), sum)
        })
        .collect();
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by(|a, b| {
        let (ka, kb) = (&keys[*a], &keys[*b]);
        kb.0.cmp(&ka.0)
            .then(kb.1.cmp(&ka.1))
            .then(kb.2.cmp(&ka.2))
            .then(kb.3.total_cmp(&ka.3))
            .then(groups[*b].shape.cmp(&groups[*a].shape))
    });
    let mut slots: Vec<Option<Group>> = groups.into_iter().map(Some).collect();
    order.iter().filter_map(|i| Some((slots[*i].take()?, counts[*i]))).unzip()
}

/// Merges requests into groups (identical shape, selector, tag and cap), in Ray's order.
/// Items are matched by reference first and moved into their groups after, so a million
/// distinct requests cost no copies of their shapes.
fn group(items: Vec<Item>, names: &ResourceNames) -> (Vec<Group>, Vec<u64>) {
    type Key<'a> = (&'a Shape, &'a Selector, Option<u32>, Option<Cap>);
    // Twin STRICT_SPREAD bundles merge too: their tag still lets one per node.
    let mut index: HashMap<Key, usize, foldhash::fast::FixedState> =
        HashMap::with_capacity_and_hasher(items.len(), Default::default());
    let of_item: Vec<Option<usize>> = items
        .iter()
        .map(|it| {
            let next = index.len();
            (it.count > 0).then(|| *index.entry((&it.shape, &it.selector, it.anti, it.cap)).or_insert(next))
        })
        .collect();
    drop(index);
    let mut selectors: HashMap<Selector, Arc<Selector>> = HashMap::new();
    let (mut groups, mut counts) = (Vec::<Group>::new(), Vec::<u64>::new());
    for (Item { shape, count, selector, anti, cap, label }, g) in items.into_iter().zip(of_item) {
        let Some(g) = g else { continue };
        if let Some(group) = groups.get_mut(g) {
            counts[g] += count;
            group.sources.push((label, count));
            continue;
        }
        let kinds = shape.kinds().fold(0u64, |m, i| m | (1u64 << i.min(63)));
        let selector = match selectors.get(&selector) {
            Some(s) => s.clone(),
            None => selectors.entry(selector.clone()).or_insert_with(|| Arc::new(selector)).clone(),
        };
        groups.push(Group { shape, selector, anti, cap, kinds, sources: vec![(label, count)] });
        counts.push(count);
    }
    sort_groups(groups, counts, names)
}

/// The nodes of a pass, with what is left to launch.
struct Context<'p> {
    p: &'p Problem,
    nodes: Vec<SimNode>,
    /// The live (not terminated) nodes by state, once step 1 has decided which those are.
    classes: Classes,
    /// Live nodes.
    live: usize,
    /// Each node's place in Ray's node list (lower first), which breaks ties as Ray's
    /// stable sort does. Ray rebuilds the list after every placement: the nodes it
    /// filled first, in the order filled, then the others as they were, then running
    /// nodes that could take none of the requests, then the new nodes. `front` and
    /// `back` are the lowest and highest ranks given so far.
    rank: Vec<i64>,
    front: i64,
    back: i64,
    /// New nodes each type may still launch (its max less what it has).
    type_room: Vec<u32>,
    /// Each type's nodes left out of the problem ([`Problem::inert`]).
    inert: Vec<u32>,
    /// All the nodes left out.
    inert_total: usize,
    type_labels: Vec<Arc<Labels>>,
    /// Every type has a cost: cost-aware scoring for new nodes.
    costed: bool,
}

/// What one [`Context::try_schedule`] would do, not yet applied: a gang's attempt in
/// one domain is weighed against its attempts in others before one is kept.
struct Outcome {
    /// Existing nodes filled: (index, the node after).
    filled: Vec<(usize, SimNode)>,
    /// New nodes, filled.
    new: Vec<SimNode>,
    /// Counts left unplaced, by group.
    left: Vec<u64>,
    /// The states whose running nodes could take none of the requests (they go to the
    /// back); ids of [`Context::classes`] as it was when the outcome was made.
    exhausted: Vec<usize>,
}

/// A candidate of [`Context::best_of`]: its rank (an existing node's place in Ray's
/// order, or a new node's place among the types), its id (its state, or that place),
/// its index (the node's, or that place) and the node.
type Candidate<'c> = (i64, usize, usize, &'c SimNode);

/// The candidate [`Context::best_of`] keeps, filled, with what it took: (group, count).
struct Pick {
    rank: i64,
    id: usize,
    index: usize,
    node: SimNode,
    took: Vec<(usize, u64)>,
}

impl Outcome {
    fn placed_all(&self) -> bool {
        self.left.iter().all(|l| *l == 0)
    }
}

impl<'p> Context<'p> {
    fn new_node(&self, t: usize) -> SimNode {
        let total = self.p.node_types[t].resources.clone();
        SimNode::new(Origin::New(t), Some(t), total.clone(), total, self.type_labels[t].clone())
    }

    fn cost_of(&self, n: &SimNode) -> Option<f64> {
        match (self.costed, n.origin) {
            (true, Origin::New(t)) => self.p.node_types[t].cost,
            _ => None,
        }
    }

    /// Indexes the live nodes by state (after step 1 decided which nodes live), in
    /// Ray's order: the nodes launched for the types' `min` first, then the others.
    fn index(&mut self) {
        self.classes = Classes::default();
        let (mins, others): (Vec<usize>, Vec<usize>) =
            (0..self.nodes.len()).partition(|i| matches!(self.nodes[*i].origin, Origin::New(_)));
        self.rank = vec![0; self.nodes.len()];
        for (r, i) in mins.into_iter().chain(others).enumerate() {
            self.rank[i] = r as i64;
            self.back = r as i64;
        }
        self.front = 0;
        self.live = self.inert_total;
        for (i, n) in self.nodes.iter().enumerate() {
            if n.terminate {
                continue;
            }
            self.classes.insert(i, self.rank[i], n);
            self.live += 1;
        }
    }

    /// Ray's `_sched_best_node` over `candidates` (rank, id, node): fills a copy of
    /// each and keeps the best score, the lowest rank on a tie.
    fn best_of<'c>(
        &self,
        candidates: impl Iterator<Item = Candidate<'c>>,
        pending: &Pending,
        source: Source,
    ) -> Option<Pick> {
        let mut best: Option<(Pick, node::Score)> = None;
        for (rank, id, index, c) in candidates {
            // Cheap test first: most candidates late in a pass take nothing.
            if pending.next_fit(0, c.free_of(source)).is_none() {
                continue;
            }
            let mut node = c.clone();
            let took = node.fill(pending, source);
            if took.is_empty() {
                continue;
            }
            let score = node.score(source, &self.p.names, self.cost_of(&node));
            let better = best.as_ref().is_none_or(|(b, s)| match score.cmp(s) {
                std::cmp::Ordering::Greater => true,
                std::cmp::Ordering::Equal => rank < b.rank,
                std::cmp::Ordering::Less => false,
            });
            if better {
                best = Some((Pick { rank, id, index, node, took }, score));
            }
        }
        best.map(|(pick, _)| pick)
    }

    /// Ray's `_try_schedule`: existing nodes first (the best one at a time, each filled
    /// at most once), then new nodes, one of each type as candidates. Changes nothing:
    /// [`Context::commit`] applies the outcome.
    fn try_schedule(&self, groups: &[Group], counts: &[u64], source: Source) -> Outcome {
        let mut pending = Pending::new(groups, counts);
        // A state's nodes have the same free resources: one look per state.
        let exhausted: Vec<usize> = self
            .classes
            .iter()
            .filter(|(_, members)| {
                members.first().is_some_and(|(_, i)| pending.next_fit(0, self.nodes[*i].free_of(source)).is_none())
            })
            .map(|(id, _)| id)
            .collect();
        let mut filled = Vec::new();
        // Per state, the last node this call filled: the next candidate of the state is
        // the one after it (a state's nodes are taken in rank order).
        let mut used: HashMap<usize, (i64, usize)> = HashMap::new();
        while !pending.is_empty() {
            let candidates = self.classes.iter().filter_map(|(id, members)| {
                let next = match used.get(&id) {
                    Some(last) => members.range((Excluded(*last), Unbounded)).next(),
                    None => members.first(),
                };
                next.map(|(r, i)| (*r, id, *i, &self.nodes[*i]))
            });
            let Some(pick) = self.best_of(candidates, &pending, source) else { break };
            for (g, n) in pick.took {
                pending.take(g, n);
            }
            used.insert(pick.id, (pick.rank, pick.index));
            filled.push((pick.index, pick.node));
        }
        // New nodes, in Ray's candidate order: a type just used goes to the back.
        let mut room = self.type_room.clone();
        let mut order: Vec<usize> = (0..self.p.node_types.len()).filter(|t| room[*t] > 0).collect();
        let mut new = Vec::new();
        while !pending.is_empty() && !order.is_empty() {
            if self.p.max_nodes.is_some_and(|m| (self.live + new.len()) as u64 >= u64::from(m)) {
                break;
            }
            let candidates: Vec<SimNode> = order.iter().map(|t| self.new_node(*t)).collect();
            let candidates = candidates.iter().enumerate().map(|(k, n)| (k as i64, k, k, n));
            let Some(pick) = self.best_of(candidates, &pending, source) else { break };
            for (g, n) in pick.took {
                pending.take(g, n);
            }
            let t = order.remove(pick.index);
            room[t] -= 1;
            if room[t] > 0 {
                order.push(t);
            }
            new.push(pick.node);
        }
        Outcome { filled, new, left: pending.left, exhausted }
    }

    /// Applies what [`Context::try_schedule`] decided, and reorders the nodes as Ray
    /// does (see [`Context::rank`]). A gang's tags only matter while its own bundles are
    /// placed, so they are dropped here (keeping twin nodes twins).
    fn commit(&mut self, o: Outcome) {
        // Before anything moves: the class ids are the ones `try_schedule` saw.
        let mut exhausted: Vec<usize> = Vec::new();
        for id in &o.exhausted {
            for (_, i) in self.classes.members(*id) {
                if let Origin::Existing(e) = self.nodes[*i].origin
                    && !self.p.nodes[e].pending
                {
                    exhausted.push(*i);
                }
            }
        }
        let k = o.filled.len() as i64;
        for (j, (i, mut n)) in o.filled.into_iter().enumerate() {
            self.classes.remove(i, self.rank[i], &self.nodes[i]);
            n.tags.clear();
            self.rank[i] = self.front - k + j as i64;
            self.classes.insert(i, self.rank[i], &n);
            self.nodes[i] = n;
        }
        self.front -= k;
        exhausted.sort_by_key(|i| self.rank[*i]);
        for i in exhausted {
            self.classes.remove(i, self.rank[i], &self.nodes[i]);
            self.back += 1;
            self.rank[i] = self.back;
            self.classes.insert(i, self.rank[i], &self.nodes[i]);
        }
        for mut n in o.new {
            if let Origin::New(t) = n.origin {
                self.type_room[t] = self.type_room[t].saturating_sub(1);
            }
            n.tags.clear();
            self.back += 1;
            self.rank.push(self.back);
            self.classes.insert(self.nodes.len(), self.back, &n);
            self.nodes.push(n);
            self.live += 1;
        }
    }
}

/// Nodes in Ray's termination preference: not yet running first, then idle longest,
/// then least used.
fn termination_order(ctx: &Context, idx: &mut [usize]) {
    let util = |n: &SimNode| {
        let (mut sum, mut k) = (0.0, 0);
        for (i, t) in n.total.0.iter().enumerate() {
            if *t > 0 {
                sum += (*t - n.free.get(i).min(*t)) as f64 / *t as f64;
                k += 1;
            }
        }
        if k == 0 { 0.0 } else { sum / f64::from(k) }
    };
    let info = |i: usize| {
        let n = &ctx.nodes[i];
        let (pending, idle) = match n.origin {
            Origin::Existing(e) => (ctx.p.nodes[e].pending, ctx.p.nodes[e].idle_ms),
            Origin::New(_) => (true, 0),
        };
        (!pending, std::cmp::Reverse(idle), util(n))
    };
    // Ties in Ray's node order once there is one (steps 2-4 reorder it), else as given.
    let rank = |i: usize| ctx.rank.get(i).copied().unwrap_or(i as i64);
    idx.sort_by(|a, b| {
        let (x, y) = (info(*a), info(*b));
        x.0.cmp(&y.0).then(x.1.cmp(&y.1)).then(x.2.total_cmp(&y.2)).then(rank(*a).cmp(&rank(*b)))
    });
}

/// One pass of the pool autoscaler over `p`.
pub fn plan(p: &Problem) -> Plan {
    let type_index: HashMap<&str, usize> = p.node_types.iter().enumerate().map(|(i, t)| (t.name.as_str(), i)).collect();
    let type_labels: Vec<Arc<Labels>> = p.node_types.iter().map(|t| Arc::new(t.labels.clone())).collect();
    let mut ctx = Context {
        p,
        nodes: Vec::with_capacity(p.nodes.len()),
        classes: Classes::default(),
        live: 0,
        rank: Vec::new(),
        front: 0,
        back: 0,
        type_room: vec![0; p.node_types.len()],
        inert: p.node_types.iter().map(|t| p.inert.by_type.get(&t.name).copied().unwrap_or(0)).collect(),
        inert_total: p.inert.total() as usize,
        type_labels,
        costed: !p.node_types.is_empty() && p.node_types.iter().all(|t| t.cost.is_some()),
    };
    // Equal label sets share one allocation, so twin nodes are recognised by pointer.
    let mut label_sets: HashMap<&Labels, Arc<Labels>> = HashMap::new();
    for (i, n) in p.nodes.iter().enumerate() {
        let t = n.node_type.as_deref().and_then(|name| type_index.get(name).copied());
        let free = if n.pending { n.total.clone() } else { n.available.clone() };
        let labels = label_sets.entry(&n.labels).or_insert_with(|| Arc::new(n.labels.clone())).clone();
        let mut sim = SimNode::new(Origin::Existing(i), t, n.total.clone(), free, labels);
        for (l, limit) in p.per_node.iter().enumerate() {
            if let Some(units) = limit.units.get(&n.id) {
                sim.add_units(l as u32, *units);
            }
        }
        ctx.nodes.push(sim);
    }
    let mut out = Plan::default();

    // 1. min per type, then max per type and globally.
    let count_of = |ctx: &Context, t: usize| {
        ctx.inert[t] as usize + ctx.nodes.iter().filter(|n| !n.terminate && n.node_type == Some(t)).count()
    };
    for (t, ty) in p.node_types.iter().enumerate() {
        let have = count_of(&ctx, t) as u32;
        for _ in have..ty.min {
            let n = ctx.new_node(t);
            ctx.nodes.push(n);
        }
        if have < ty.min {
            out.launch_reasons.entry(ty.name.clone()).or_default().push(format!(
                "{} for min = {}",
                ty.min - have,
                ty.min
            ));
        }
    }
    for (t, ty) in p.node_types.iter().enumerate() {
        let mut of_type: Vec<usize> =
            (0..ctx.nodes.len()).filter(|i| !ctx.nodes[*i].terminate && ctx.nodes[*i].node_type == Some(t)).collect();
        let extra = (of_type.len() + ctx.inert[t] as usize).saturating_sub(ty.max as usize).min(of_type.len());
        if extra > 0 {
            termination_order(&ctx, &mut of_type);
            for i in of_type.into_iter().take(extra) {
                ctx.nodes[i].terminate = true;
                out.terminate_node(&ctx, i, Cause::MaxPerType, format!("{} has max = {}", ty.name, ty.max));
            }
        }
        ctx.type_room[t] = ty.max.saturating_sub(count_of(&ctx, t) as u32);
    }
    if let Some(max) = p.max_nodes {
        let mut managed: Vec<usize> =
            (0..ctx.nodes.len()).filter(|i| !ctx.nodes[*i].terminate && ctx.nodes[*i].node_type.is_some()).collect();
        let live = ctx.nodes.iter().filter(|n| !n.terminate).count() + ctx.inert_total;
        let extra = live.saturating_sub(max as usize).min(managed.len());
        if extra > 0 {
            termination_order(&ctx, &mut managed);
            for i in managed.into_iter().take(extra) {
                ctx.nodes[i].terminate = true;
                out.terminate_node(&ctx, i, Cause::MaxNodes, format!("the pool has max_nodes = {max}"));
            }
        }
    }

    ctx.index();

    // 2. the floor, against whole capacities.
    if !p.floor.is_empty() {
        let items = p.floor.iter().map(|r| Item {
            shape: r.shape.clone(),
            count: r.count,
            selector: r.selector.clone(),
            anti: None,
            cap: None,
            label: "floor".to_string(),
        });
        let (groups, counts) = group(items.collect(), &p.names);
        let o = ctx.try_schedule(&groups, &counts, Source::Floor);
        let missing: u64 = o.left.iter().sum();
        if missing == 0 {
            out.note_new(&ctx, &o.new, "the floor (request_resources)");
            ctx.commit(o);
        } else {
            out.infeasible.push(Infeasible {
                request: "floor".into(),
                count: missing,
                reason: "the node types' max and max_nodes cannot hold the whole floor".into(),
            });
        }
    }

    // 3. gangs, most constrained first, all or nothing.
    let mut gangs: Vec<&Gang> = p.gangs.iter().collect();
    let constraints = |g: &Gang| match g.strategy {
        Strategy::StrictSpread | Strategy::StrictPack => g.bundles.len(),
        _ => 0,
    };
    gangs.sort_by(|a, b| constraints(b).cmp(&constraints(a)).then(b.bundles.len().cmp(&a.bundles.len())));
    // Units of each per-domain limit in each domain, counting those this pass places.
    let mut in_domain: Vec<BTreeMap<String, u32>> = p.per_domain.iter().map(|l| l.units.clone()).collect();
    let domains = gang::Domains::of(p);
    for (tag, gang) in gangs.into_iter().enumerate() {
        let limit = gang.per_domain.and_then(|l| Some((l, p.per_domain.get(l)?.max)));
        let full = |domain: &str| {
            limit.is_some_and(|(l, max)| in_domain.get(l).and_then(|m| m.get(domain)).copied().unwrap_or(0) >= max)
        };
        match gang::place(&ctx, gang, tag as u32, &domains, &full) {
            Ok((o, domain)) => {
                if let (Some((l, _)), Some(d)) = (limit, domain)
                    && let Some(m) = in_domain.get_mut(l)
                {
                    *m.entry(d).or_default() += 1;
                }
                out.note_new(&ctx, &o.new, &format!("gang {}", gang.id));
                ctx.commit(o);
            }
            Err(reason) => out.infeasible.push(Infeasible {
                request: format!("gang {}", gang.id),
                count: gang.bundles.len() as u64,
                reason,
            }),
        }
    }

    // 4. plain requests.
    let items = p.requests.iter().enumerate().map(|(i, r)| Item {
        shape: r.shape.clone(),
        count: r.count,
        selector: r.selector.clone(),
        anti: None,
        cap: cap_of(p, r.per_node, None),
        label: format!("request[{i}]"),
    });
    let (groups, counts) = group(items.collect(), &p.names);
    let mut o = ctx.try_schedule(&groups, &counts, Source::Demand);
    out.note_new(&ctx, &o.new, "pending requests");
    let left = std::mem::take(&mut o.left);
    ctx.commit(o);
    for (g, l) in groups.iter().zip(&left) {
        let mut l = *l;
        // Attribute what is left to the group's last sources (the order Ray fills in).
        for (label, n) in g.sources.iter().rev() {
            if l == 0 {
                break;
            }
            let k = l.min(*n);
            l -= k;
            out.infeasible.push(Infeasible { request: label.clone(), count: k, reason: why_not(p, g) });
        }
    }

    // 5. idle termination.
    // Only a pool's nodes are terminated (at 100,000 nodes, sorting the others was a
    // sixth of a pass).
    let mut order: Vec<usize> = (0..ctx.nodes.len()).filter(|i| ctx.nodes[*i].node_type.is_some()).collect();
    termination_order(&ctx, &mut order);
    let mut remaining: Vec<usize> = (0..p.node_types.len()).map(|t| count_of(&ctx, t)).collect();
    for i in order {
        let n = &ctx.nodes[i];
        let (Origin::Existing(e), Some(t)) = (n.origin, n.node_type) else { continue };
        let node = &p.nodes[e];
        let ty = &p.node_types[t];
        let Some(timeout) = ty.idle_timeout_ms else { continue };
        if n.terminate || node.pending || node.idle_ms <= timeout || n.placed.iter().any(|c| *c > 0) {
            continue;
        }
        if remaining[t] <= ty.min as usize {
            continue;
        }
        remaining[t] -= 1;
        ctx.nodes[i].terminate = true;
        out.terminate_node(
            &ctx,
            i,
            Cause::Idle,
            format!("idle for {:.0} s > idle_timeout {:.0} s", node.idle_ms as f64 / 1e3, timeout as f64 / 1e3),
        );
    }

    for n in &ctx.nodes {
        match n.origin {
            Origin::New(_) if n.terminate => {}
            Origin::New(t) => {
                *out.launch.entry(p.node_types[t].name.clone()).or_default() += 1;
                out.new_capacity.add_times(&n.total, 1);
                let mut used = n.total.clone();
                used.sub_times(&n.free, 1);
                out.new_used.add_times(&used, 1);
            }
            Origin::Existing(e) if n.placed.iter().any(|c| *c > 0) => {
                out.needed.push(p.nodes[e].id.clone());
                if n.placed[Source::Demand as usize] > 0 {
                    out.demand_on.push(p.nodes[e].id.clone());
                }
            }
            Origin::Existing(_) => {}
        }
    }
    out.fold_reasons();
    out.launch_reasons.retain(|t, _| out.launch.contains_key(t));
    out
}

/// Why no node, existing or new, could take a request of `g`.
fn why_not(p: &Problem, g: &Group) -> String {
    let fits_type = p.node_types.iter().any(|t| g.selector.matches(&t.labels) && g.shape.fits_in(&t.resources));
    if !fits_type {
        if p.node_types.iter().any(|t| g.shape.fits_in(&t.resources)) {
            format!("no node type with the labels it asks for ({}) is big enough", g.selector.describe())
        } else {
            "no node type is big enough".into()
        }
    } else {
        "the node types' max or max_nodes is reached".into()
    }
}

/// The cap a request or gang (`unit`: its tag) of `Problem::per_node[limit]` carries.
fn cap_of(p: &Problem, limit: Option<usize>, unit: Option<u32>) -> Option<Cap> {
    let l = limit?;
    Some(Cap { limit: l as u32, max: p.per_node.get(l)?.max, unit })
}

impl Plan {
    fn terminate_node(&mut self, ctx: &Context, i: usize, cause: Cause, detail: String) {
        let n = &ctx.nodes[i];
        let node_type = n.node_type.map(|t| ctx.p.node_types[t].name.clone()).unwrap_or_default();
        match n.origin {
            Origin::Existing(e) => {
                self.terminate.push(Termination { node_id: ctx.p.nodes[e].id.clone(), node_type, cause, detail })
            }
            // A node this pass meant to launch is simply not launched.
            Origin::New(_) => {}
        }
    }

    /// Records why the `new` nodes (to be committed to `ctx`) are launched.
    fn note_new(&mut self, ctx: &Context, new: &[SimNode], why: &str) {
        let mut added: BTreeMap<usize, u32> = BTreeMap::new();
        for n in new {
            if let Origin::New(t) = n.origin {
                *added.entry(t).or_default() += 1;
            }
        }
        for (t, added) in added {
            let name = &ctx.p.node_types[t].name;
            let reasons = self.launch_reasons.entry(name.clone()).or_default();
            if reasons.len() < problem::MAX_REASONS {
                reasons.push(format!("{added} for {why}"));
            } else {
                let (nodes, more) = self.reasons_folded.entry(name.clone()).or_default();
                *nodes += added;
                *more += 1;
            }
        }
    }

    /// The folded reasons as one last entry per type.
    fn fold_reasons(&mut self) {
        for (t, (nodes, more)) in std::mem::take(&mut self.reasons_folded) {
            if let Some(r) = self.launch_reasons.get_mut(&t) {
                r.push(format!("{nodes} for {more} others"));
            }
        }
    }
}
