//! The JSON shapes of docs/architecture.md §13, built from the merged view.

use std::collections::BTreeMap;

use flotilla_core::{NodeStatus, Resources};
use flotilla_view::{ClusterView, NodeRecord};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct Health {
    pub score: f32,
    pub cpu_utilisation: f32,
    pub cpu_steal: f32,
    pub load_per_core: f32,
    pub memory_pressure: f32,
    pub preemption_notice: bool,
}

#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub node_id: String,
    pub incarnation: u64,
    pub status: NodeStatus,
    /// RFC 3339, UTC.
    pub status_since: String,
    pub shard: u32,
    pub labels: BTreeMap<String, String>,
    pub health: Health,
    pub capacity: Resources,
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

/// Formats Unix milliseconds as RFC 3339 in UTC (civil-from-days, Howard Hinnant).
pub fn rfc3339(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z", rem / 3600, rem % 3600 / 60, rem % 60, unix_ms % 1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(rfc3339(1_795_996_800_000), "2026-11-30T00:00:00.000Z");
    }
}
