//! What one pass of the pool autoscaler sees, and the policy that sizes its node types:
//! the plain data the config, the policy and the reconciler share, so each of them
//! depends on this module and none on another.

use std::collections::HashMap;
use std::sync::Arc;

use flotilla_autoscale::Policy;
use flotilla_core::{Labels, NodeId, NodeStatus, Resources, UnitShape};
use serde::{Deserialize, Serialize};

/// A node as `GET /v1/nodes` lists it (the fields the pool reads). Its id, labels and
/// resources are shared with the view's record when read from it
/// ([`crate::cluster::ViewCluster`]): a pass at 100,000 nodes copies none of them, and
/// allocates nothing per node but the row.
#[derive(Debug, Clone, Deserialize)]
pub struct NodeRow {
    pub node_id: NodeId,
    pub status: NodeStatus,
    #[serde(default)]
    pub labels: Arc<Labels>,
    #[serde(default)]
    pub capacity: Arc<Resources>,
    #[serde(default)]
    pub allocated: Arc<Resources>,
    #[serde(default)]
    pub cordoned: bool,
    #[serde(default)]
    pub drain_requested: bool,
    /// How many members it runs (what a consolidation of it moves).
    #[serde(default)]
    pub workloads: usize,
}

/// Queued units of one group of an app.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
pub struct Queued {
    #[serde(default)]
    pub primary: u32,
    #[serde(default)]
    pub secondary: u32,
}

/// An app as `GET /v1/apps` lists it (the fields the pool reads): its queued units are
/// the pool's pending demand.
#[derive(Debug, Clone, Deserialize)]
pub struct AppRow {
    pub app: String,
    #[serde(default)]
    pub queued: Queued,
    #[serde(default)]
    pub unit_shape: UnitShape,
}

/// `request_resources`: capacity the pool must hold (`PUT /v1/pools/{pool}/constraints`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Constraints {
    #[serde(default)]
    pub resource_requests: Vec<FloorRequest>,
}

#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct FloorRequest {
    pub resources: Resources,
    #[serde(default = "one")]
    pub count: u32,
}

fn one() -> u32 {
    1
}

/// Bounds on a floor: beyond them it is a mistake.
pub const MAX_FLOOR_REQUESTS: usize = 256;
pub const MAX_FLOOR_COUNT: u32 = 100_000;

impl Constraints {
    pub fn validate(&self) -> Result<(), String> {
        if self.resource_requests.len() > MAX_FLOOR_REQUESTS {
            return Err(format!("{} resource_requests, at most {MAX_FLOOR_REQUESTS}", self.resource_requests.len()));
        }
        for (i, r) in self.resource_requests.iter().enumerate() {
            if r.count > MAX_FLOOR_COUNT {
                return Err(format!("resource_requests[{i}].count: {} is more than {MAX_FLOOR_COUNT}", r.count));
            }
            r.resources.validate_node_capacity().map_err(|e| format!("resource_requests[{i}].resources: {e}"))?;
        }
        Ok(())
    }
}

/// Where a pool instance is in its life, as packing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Queued or launching: capacity to come.
    Pending,
    /// Its agent is registered.
    Running,
    /// Being drained or terminated: no longer capacity.
    Leaving,
}

#[derive(Debug, Clone)]
pub struct PoolInstance {
    pub id: String,
    pub node_type: String,
    pub phase: Phase,
    /// A warm pool's (`crate::warm`), held or claimed: cordoned on purpose, capacity the
    /// packing may use, never idle-terminated while cordoned.
    pub warm: bool,
}

/// Since when each of the pool's nodes has held nothing (no other node is ever
/// terminated for idleness); a node is idle from when it is first seen
/// alive, schedulable and with nothing allocated. A cordoned node (a warm pool's, held
/// on purpose; an operator's) is not idle: uncordoned, its clock starts then, so a warm
/// node just claimed is not terminated before the units it was claimed for land.
#[derive(Debug, Default, Clone)]
pub struct IdleClock(HashMap<String, u64>);

impl IdleClock {
    pub fn update<'n>(&mut self, nodes: impl IntoIterator<Item = &'n NodeRow>, now_ms: u64) {
        let mut next = HashMap::with_capacity(self.0.len());
        for n in nodes {
            if n.status == NodeStatus::Alive && !n.cordoned && n.allocated.is_zero() {
                next.insert(n.node_id.to_string(), self.0.get(n.node_id.as_str()).copied().unwrap_or(now_ms));
            }
        }
        self.0 = next;
    }

    pub fn idle_ms(&self, node: &str, now_ms: u64) -> u64 {
        self.0.get(node).map(|since| now_ms.saturating_sub(*since)).unwrap_or(0)
    }
}

/// What one sync saw.
pub struct Observation<'a> {
    pub nodes: &'a [NodeRow],
    pub apps: &'a [AppRow],
    pub instances: &'a [PoolInstance],
    pub floor: &'a Constraints,
    pub idle: &'a IdleClock,
    /// Node types that cannot be had now (their launches failed), and why: nothing more
    /// of them is launched, so their demand goes to other types.
    pub unavailable: &'a std::collections::BTreeMap<String, String>,
    pub now_ms: u64,
}

/// Which types the policy sizes.
#[derive(Debug, Clone)]
pub struct PoolPolicy {
    pub primary: String,
    pub secondary: Option<String>,
    pub policy: Policy,
}

impl PoolPolicy {
    /// The types this policy sizes.
    pub fn types(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.primary.as_str()).chain(self.secondary.as_deref())
    }
}
