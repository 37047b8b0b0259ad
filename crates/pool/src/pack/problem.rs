//! The packing problem and its answer as plain data: node types, nodes, requests and
//! gangs in, a [`Plan`] out, and the merged request groups the passes work on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use flotilla_core::{MemberOption, UnitShape};

use crate::shape::{ResourceNames, Shape};

/// Node labels.
pub type Labels = BTreeMap<String, String>;

/// A kind of node the pool can launch.
#[derive(Debug, Clone)]
pub struct NodeType {
    pub name: String,
    pub resources: Shape,
    pub labels: Labels,
    pub min: u32,
    pub max: u32,
    /// Price per hour; when every type has one, the cheapest capacity per request wins.
    pub cost: Option<f64>,
    /// A node of this type idle longer than this is terminated (None: never).
    pub idle_timeout_ms: Option<u64>,
}

/// A node that exists (running, or launched and not yet running).
#[derive(Debug, Clone)]
pub struct Node {
    pub id: String,
    /// The pool's node type; `None` for a node the pool does not manage (its capacity
    /// is used, but it is never terminated or counted against a type).
    pub node_type: Option<String>,
    pub total: Shape,
    pub available: Shape,
    pub labels: Labels,
    /// How long the node has held nothing (0 when busy).
    pub idle_ms: u64,
    /// Launched but not yet running: it counts as capacity, never as idle.
    pub pending: bool,
}

/// Which nodes a request may use: for every `require`d label one of its values, no label
/// with one of its `forbid`den values.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Selector {
    pub require: BTreeMap<String, BTreeSet<String>>,
    pub forbid: BTreeMap<String, BTreeSet<String>>,
}

impl Selector {
    /// Where a member of a unit of `shape` may go in `option` (of the secondary group when
    /// `secondary`): what `UnitShape::admits` says, as data the packer groups requests
    /// by. A property test holds the two together.
    pub fn for_member(shape: &UnitShape, option: &MemberOption, secondary: bool) -> Selector {
        let mut forbid: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        if !(option.selector.allow_low_priority || secondary) {
            let (k, v) = flotilla_core::unit_shape::LOW_PRIORITY;
            forbid.entry(k.into()).or_default().insert(v.into());
        }
        let full = shape.full_domains();
        if !full.is_empty() {
            forbid.insert("domain".into(), full);
        }
        Selector { require: option.selector.labels.clone(), forbid }
    }

    pub fn is_empty(&self) -> bool {
        self.require.is_empty() && self.forbid.is_empty()
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.require.iter().all(|(k, vs)| labels.get(k).is_some_and(|v| vs.contains(v)))
            && self.forbid.iter().all(|(k, vs)| labels.get(k).is_none_or(|v| !vs.contains(v)))
    }

    /// The nodes both `self` and `other` allow: a gang's bundles packed as one, or a
    /// bundle kept to one domain. Values of a key both require that do not overlap leave
    /// it no value, which no node matches.
    pub fn and(&self, other: &Selector) -> Selector {
        let mut out = self.clone();
        for (k, vs) in &other.require {
            out.require
                .entry(k.clone())
                .and_modify(|mine| mine.retain(|v| vs.contains(v)))
                .or_insert_with(|| vs.clone());
        }
        for (k, vs) in &other.forbid {
            out.forbid.entry(k.clone()).or_default().extend(vs.iter().cloned());
        }
        out
    }

    /// For reasons, as an operator reads labels: `gpu_model = a100 | h100, priority != low`.
    pub fn describe(&self) -> String {
        let values = |vs: &BTreeSet<String>| vs.iter().map(String::as_str).collect::<Vec<_>>().join(" | ");
        let require = self.require.iter().map(|(k, vs)| format!("{k} = {}", values(vs)));
        let forbid = self.forbid.iter().map(|(k, vs)| format!("{k} != {}", values(vs)));
        let all: Vec<String> = require.chain(forbid).collect();
        if all.is_empty() { "any labels".into() } else { all.join(", ") }
    }
}

/// `count` identical bundles of resources.
#[derive(Debug, Clone)]
pub struct Request {
    pub shape: Shape,
    pub count: u64,
    pub selector: Selector,
    /// Each bundle is a unit of the app `Problem::per_node[i]` limits.
    pub per_node: Option<usize>,
}

/// An app's `spread.max_units_per_node` or `max_units_per_domain`: at most `max` of its
/// units on a node (or in a domain), which holds `units` of them already (by node id, or
/// domain). The scheduler will not place past it, so the pool must not count on that
/// room.
#[derive(Debug, Clone, Default)]
pub struct Limit {
    pub app: String,
    pub max: u32,
    pub units: BTreeMap<String, u32>,
}

/// Ray's placement group strategies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Strategy {
    /// Every bundle on a different node.
    StrictSpread,
    /// All bundles on one node.
    StrictPack,
    /// Best effort: the autoscaler only needs the bundles to fit somewhere.
    Pack,
    Spread,
}

/// One bundle of a gang, with the nodes it may use: a unit's members differ (a CPU head,
/// GPU workers on a GPU type), so each has its own.
#[derive(Debug, Clone)]
pub struct Bundle {
    pub shape: Shape,
    pub selector: Selector,
    /// The member group it is for, so a reason can say whose demand no node type holds
    /// (empty for a Ray bundle).
    pub group: String,
}

impl Bundle {
    /// A bundle any node may take, for no group (Ray's).
    pub fn new(shape: Shape) -> Bundle {
        Bundle { shape, selector: Selector::default(), group: String::new() }
    }
}

/// Bundles placed all or nothing.
#[derive(Debug, Clone)]
pub struct Gang {
    pub id: String,
    pub strategy: Strategy,
    /// The way its scheduler tries first.
    pub bundles: Vec<Bundle>,
    /// The other ways (a member on another kind of node), tried in order only when no
    /// earlier one can be placed, as its scheduler falls back to a member's alternatives
    /// only when its template does not fit. Each is as long as `bundles`, bundle `i` for
    /// the same member.
    pub alternatives: Vec<Vec<Bundle>>,
    /// Every bundle on nodes sharing this label's value (a unit's one domain).
    pub same: Option<String>,
    /// The gang is a unit of the app `Problem::per_node[i]` limits.
    pub per_node: Option<usize>,
    /// ... and `Problem::per_domain[i]` (with `same` the domain label).
    pub per_domain: Option<usize>,
}

impl Gang {
    /// `bundles`, then each of `alternatives`.
    pub fn variants(&self) -> impl Iterator<Item = &[Bundle]> {
        std::iter::once(self.bundles.as_slice()).chain(self.alternatives.iter().map(Vec::as_slice))
    }
}

/// One packing problem.
#[derive(Debug, Clone, Default)]
pub struct Problem {
    pub names: ResourceNames,
    pub node_types: Vec<NodeType>,
    /// Most nodes of all types together (existing included).
    pub max_nodes: Option<u32>,
    pub nodes: Vec<Node>,
    pub requests: Vec<Request>,
    /// The app each of `requests` came from (same index), to say whose demand the pool
    /// cannot place; gangs name theirs in their id (`app/k`).
    pub request_apps: Vec<String>,
    pub gangs: Vec<Gang>,
    /// The per-node and per-domain limits requests and gangs refer to.
    pub per_node: Vec<Limit>,
    pub per_domain: Vec<Limit>,
    /// Capacity the pool must hold whatever the demand (`request_resources`).
    pub floor: Vec<Request>,
    /// Nodes left out of `nodes` because they can matter to the plan only by their
    /// number (`crate::reconciler::problem`).
    pub inert: Inert,
}

/// Nodes a problem leaves out, counted. They are never picked to be terminated, so a
/// problem with a type over its max must list them all ([`Problem::over_a_max`]).
#[derive(Debug, Clone, Default)]
pub struct Inert {
    /// The pool's running nodes, by type, that take no demand (no room for the least
    /// of it, or not usable) and are not idle. They count against their type's `min` and
    /// `max`, and `max_nodes`.
    pub by_type: BTreeMap<String, u32>,
    /// Other nodes (not the pool's): with no room for the demand, or twins of nodes
    /// listed that the demand cannot all reach. They count against `max_nodes` only.
    pub others: u32,
    /// Their label sets, each once: a gang's `same` label may take their values too
    /// (`gang::Domains`), as it would with them listed.
    pub labels: BTreeSet<Labels>,
}

impl Inert {
    pub fn total(&self) -> u64 {
        self.by_type.values().map(|n| u64::from(*n)).sum::<u64>() + u64::from(self.others)
    }
}

impl Problem {
    /// Whether a type has more nodes than its `max`, or the pool more than
    /// `max_nodes`: then step 1 of [`crate::pack::plan`] picks nodes to terminate, and
    /// needs every one of them listed.
    pub fn over_a_max(&self) -> bool {
        let mut of_type: BTreeMap<&str, u64> =
            self.inert.by_type.iter().map(|(t, n)| (t.as_str(), u64::from(*n))).collect();
        for t in self.nodes.iter().filter_map(|n| n.node_type.as_deref()) {
            *of_type.entry(t).or_default() += 1;
        }
        let over_type =
            self.node_types.iter().any(|t| of_type.get(t.name.as_str()).copied().unwrap_or(0) > u64::from(t.max));
        let all = self.nodes.len() as u64 + self.inert.total();
        over_type || self.max_nodes.is_some_and(|m| all > u64::from(m))
    }
}

/// Why a node is terminated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
    MaxPerType,
    MaxNodes,
    Idle,
    /// A pool policy wants fewer nodes of the type.
    Policy,
    /// Its members moved to other nodes (`crate::consolidate`).
    Consolidation,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::MaxPerType => "max_per_type",
            Cause::MaxNodes => "max_nodes",
            Cause::Idle => "idle",
            Cause::Policy => "policy",
            Cause::Consolidation => "consolidation",
        }
    }
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Termination {
    pub node_id: String,
    pub node_type: String,
    pub cause: Cause,
    pub detail: String,
}

impl Problem {
    /// The app whose demand `request` (an [`Infeasible`]'s: `request[i]` or `gang app/k`)
    /// is, when it is an app's.
    pub fn app_of<'a>(&'a self, request: &'a str) -> Option<&'a str> {
        if let Some(gang) = request.strip_prefix("gang ") {
            return gang.split('/').next();
        }
        let i: usize = request.strip_prefix("request[")?.strip_suffix(']')?.parse().ok()?;
        self.request_apps.get(i).map(String::as_str)
    }
}

/// What could not be placed.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Infeasible {
    /// `request[i]`, `gang <id>` or `floor`.
    pub request: String,
    pub count: u64,
    pub reason: String,
}

/// Most reasons listed per node type: thousands of gangs would otherwise make one
/// launch line thousands of entries long.
pub const MAX_REASONS: usize = 8;

/// The decision of one pass.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// New nodes by type, with why (the first reason per type).
    pub launch: BTreeMap<String, u32>,
    pub launch_reasons: BTreeMap<String, Vec<String>>,
    /// Per type, the new nodes and reasons past [`MAX_REASONS`], folded into its last one.
    pub(crate) reasons_folded: BTreeMap<String, (u32, u32)>,
    pub terminate: Vec<Termination>,
    pub infeasible: Vec<Infeasible>,
    /// Capacity of the new nodes, and the part of it this pass placed demand on.
    pub new_capacity: Shape,
    pub new_used: Shape,
    /// Existing nodes that took demand or floor in this pass (never terminated).
    pub needed: Vec<String>,
    /// Of those, the ones that took pending demand (not only the floor): a warm pool's
    /// node among them is claimed (`crate::warm`).
    pub demand_on: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Source {
    Demand = 0,
    Floor = 1,
}

/// At most `max` units of `Problem::per_node[limit]` on a node. `unit` is the gang (tag)
/// a bundle belongs to, whose bundles count once on a node; `None` when each request is
/// a unit of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct Cap {
    pub limit: u32,
    pub max: u32,
    pub unit: Option<u32>,
}

/// A request before merging: what [`Group`]s are made of.
#[derive(Debug, Clone)]
pub(crate) struct Item {
    pub shape: Shape,
    pub count: u64,
    pub selector: Selector,
    pub anti: Option<u32>,
    pub cap: Option<Cap>,
    pub label: String,
}

/// Identical requests of the pass, merged, in Ray's order.
#[derive(Debug, Clone)]
pub(crate) struct Group {
    pub shape: Shape,
    pub selector: Arc<Selector>,
    /// STRICT_SPREAD: at most one bundle carrying this tag per node.
    pub anti: Option<u32>,
    pub cap: Option<Cap>,
    pub kinds: u64,
    /// What the group stands for, for reports: (label, count) in input order.
    pub sources: Vec<(String, u64)>,
}
