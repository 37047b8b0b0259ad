//! The JSON shapes of docs/architecture.md §13, built from the merged view.

use std::collections::BTreeMap;

use flotilla_core::{NodeStatus, Resources};
use flotilla_view::{ClusterView, NodeRecord};
use serde::Serialize;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Health {
    pub score: f32,
    pub cpu_utilisation: f32,
    pub cpu_steal: f32,
    pub load_per_core: f32,
    pub memory_pressure: f32,
    pub preemption_notice: bool,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct NodeRow {
    pub node_id: String,
    pub incarnation: u64,
    /// `alive`, `suspect`, `draining`, `dead` or `unknown` (its shard is not heard).
    #[schema(value_type = String)]
    pub status: NodeStatus,
    /// RFC 3339, UTC.
    pub status_since: String,
    pub shard: u32,
    pub labels: BTreeMap<String, String>,
    pub health: Health,
    /// `{"cpu_millis", "memory_bytes", "gpu", …custom}`.
    #[schema(value_type = Object)]
    pub capacity: Resources,
    #[schema(value_type = Object)]
    pub allocated: Resources,
    pub cordoned: bool,
    pub drain_requested: bool,
    /// How many members the node's agent reports running (`flotilla nodes` MEMBERS;
    /// a drain is done when it and `allocated` reach zero).
    pub workloads: usize,
}

pub(crate) fn row(r: &NodeRecord, connected: bool) -> NodeRow {
    NodeRow {
        node_id: r.node_id.to_string(),
        incarnation: r.incarnation.0,
        // A node whose shard we cannot hear is Unknown, never Dead.
        status: if connected { r.status } else { NodeStatus::Unknown },
        status_since: rfc3339(r.status_since_unix_ms),
        shard: r.shard,
        labels: r.labels.as_map().clone(),
        health: {
            let h = r.health.sample();
            Health {
                score: r.health_score(),
                cpu_utilisation: h.cpu_utilisation,
                cpu_steal: h.cpu_steal,
                load_per_core: h.load_per_core,
                memory_pressure: h.memory_pressure,
                preemption_notice: h.preemption_notice,
            }
        },
        capacity: (*r.capacity).clone(),
        allocated: (*r.allocated).clone(),
        cordoned: r.cordoned,
        drain_requested: r.drain_requested,
        workloads: r.workloads.len(),
    }
}

/// Every node of every shard, sorted by node id.
pub fn node_rows(cluster: &ClusterView) -> Vec<NodeRow> {
    let mut rows: Vec<NodeRow> = cluster
        .slots()
        .iter()
        .flat_map(|s| s.view.nodes.values().map(|r| row(r, s.connected)).collect::<Vec<_>>())
        .collect();
    rows.sort_by(|a, b| a.node_id.cmp(&b.node_id));
    rows
}

pub use flotilla_core::rfc3339;
