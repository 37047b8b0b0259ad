//! The `nodes` message: node rows sent as columns. At 100,000 nodes a snapshot of one
//! JSON array per node was 10 MB, and the browser spent more time receiving and parsing
//! it than anything else on its first paint. As columns, with the repeated strings
//! (status, domain, priority) and the capacities (a pool's nodes share a few) sent once
//! per message and referred to by index, it is about 40 % of that, and `JSON.parse`
//! makes 16 arrays instead of 100,000. The page (`ui/js/store.js`, `applyNodes`) keeps
//! them as columns too (`ui/js/node-table.js`), with the strings and capacities resolved.
//!
//! Every column holds one entry per node, in the same order:
//!
//! | column | entry |
//! |---|---|
//! | `id` | the node id |
//! | `status`, `domain`, `priority` | an index into `strings` |
//! | `shard` | the shard that owns the node |
//! | `health` | the health score, 0–1 |
//! | `capacity` | an index into `capacities`, each `[cpu_millis, memory_bytes, gpu]` |
//! | `cpu_alloc`, `mem_alloc`, `gpu_alloc` | what is allocated |
//! | `flags` | bits: 1 cordoned, 2 drain requested, 4 preempting (its cloud gave notice) |
//! | `incarnation` | the agent's incarnation |
//!
//! `removed` lists the ids of nodes gone since the last message.

use std::sync::Arc;

use foldhash::HashMap;

use flotilla_view::{NodeRecord, ShardSlot};
use serde::Serialize;

use super::rows::{Frame, frame, priority_of, status_of};

/// Most nodes in one `nodes` message.
pub const SNAPSHOT_CHUNK: usize = 5_000;

/// Bits of the `flags` column.
pub const CORDONED: u8 = 1;
pub const DRAIN_REQUESTED: u8 = 2;
pub const PREEMPTING: u8 = 4;

/// One `nodes` message (see the module doc); keys in the order they are written.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct NodeColumns<'a> {
    pub removed: Vec<&'a str>,
    pub id: Vec<&'a str>,
    pub status: Vec<u32>,
    pub shard: Vec<u32>,
    pub domain: Vec<u32>,
    pub priority: Vec<u32>,
    pub health: Vec<f32>,
    pub capacity: Vec<u32>,
    pub cpu_alloc: Vec<u64>,
    pub mem_alloc: Vec<u64>,
    pub gpu_alloc: Vec<u32>,
    pub flags: Vec<u8>,
    pub incarnation: Vec<u64>,
    pub strings: Vec<&'a str>,
    pub capacities: Vec<(u64, u64, u32)>,
    #[serde(skip)]
    string_index: HashMap<&'a str, u32>,
    #[serde(skip)]
    capacity_index: HashMap<(u64, u64, u32), u32>,
    /// By the address of a label set or a capacity the rows hold: the view interns them,
    /// so most nodes are found here without hashing a string.
    #[serde(skip)]
    by_labels: HashMap<usize, (u32, u32)>,
    #[serde(skip)]
    by_capacity: HashMap<usize, u32>,
}

impl<'a> NodeColumns<'a> {
    /// The columns of `rows` (each with whether its shard is heard: a node of a shard
    /// that is not is Unknown) and the `removed` ids.
    pub fn of(rows: &'a [(Arc<NodeRecord>, bool)], removed: Vec<&'a str>) -> NodeColumns<'a> {
        let mut c = NodeColumns { removed, ..Default::default() };
        for (r, connected) in rows {
            c.push(r, *connected);
        }
        c
    }

    fn push(&mut self, r: &'a NodeRecord, connected: bool) {
        self.id.push(r.node_id.as_str());
        let status = self.string(status_of(r, connected).as_str());
        self.status.push(status);
        self.shard.push(r.shard);
        let (domain, priority) = match self.by_labels.get(&(Arc::as_ptr(&r.labels) as usize)) {
            Some(&known) => known,
            None => {
                let known = (self.string(r.labels.domain()), self.string(priority_of(r)));
                self.by_labels.insert(Arc::as_ptr(&r.labels) as usize, known);
                known
            }
        };
        self.domain.push(domain);
        self.priority.push(priority);
        self.health.push(r.health_score());
        let capacity = match self.by_capacity.get(&(Arc::as_ptr(&r.capacity) as usize)) {
            Some(&known) => known,
            None => {
                let cap = (r.capacity.cpu_millis, r.capacity.memory_bytes, r.capacity.gpu);
                let next = self.capacities.len() as u32;
                let known = *self.capacity_index.entry(cap).or_insert_with(|| {
                    self.capacities.push(cap);
                    next
                });
                self.by_capacity.insert(Arc::as_ptr(&r.capacity) as usize, known);
                known
            }
        };
        self.capacity.push(capacity);
        self.cpu_alloc.push(r.allocated.cpu_millis);
        self.mem_alloc.push(r.allocated.memory_bytes);
        self.gpu_alloc.push(r.allocated.gpu);
        let flag = |on: bool, bit: u8| if on { bit } else { 0 };
        let flags = flag(r.cordoned, CORDONED)
            | flag(r.drain_requested, DRAIN_REQUESTED)
            | flag(r.health.preemption_notice(), PREEMPTING);
        self.flags.push(flags);
        self.incarnation.push(r.incarnation.0);
    }

    fn string(&mut self, s: &'a str) -> u32 {
        let next = self.strings.len() as u32;
        *self.string_index.entry(s).or_insert_with(|| {
            self.strings.push(s);
            next
        })
    }
}

/// `nodes` messages of at most [`SNAPSHOT_CHUNK`] nodes; the removed ids go in the last.
pub(super) fn node_frames(rows: &[(Arc<NodeRecord>, bool)], removed: Vec<&str>) -> Vec<Frame> {
    if rows.is_empty() && removed.is_empty() {
        return Vec::new();
    }
    let chunks: Vec<&[(Arc<NodeRecord>, bool)]> =
        if rows.is_empty() { vec![&[]] } else { rows.chunks(SNAPSHOT_CHUNK).collect() };
    let last = chunks.len() - 1;
    let mut removed = Some(removed);
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let gone = if i == last { removed.take().unwrap_or_default() } else { Vec::new() };
            frame("nodes", &NodeColumns::of(c, gone))
        })
        .collect()
}

/// Every node of `slots` as `nodes` messages, by id, each handed to `each` as soon as it
/// is built (the page applies the first while the rest are built); all of them, or None
/// once `each` says stop. By id: the page lays its heatmap out by id within each domain,
/// and ids that come in order cost it one pass. The ids are sorted as slices beside the
/// rows, so a comparison does not go through two pointers to reach their bytes.
pub(super) fn snapshot_chunks(slots: &[Arc<ShardSlot>], mut each: impl FnMut(&Frame) -> bool) -> Option<Vec<Frame>> {
    let mut keyed: Vec<(&str, &Arc<NodeRecord>, bool)> =
        slots.iter().flat_map(|s| s.view.nodes.values().map(|r| (r.node_id.as_str(), r, s.connected))).collect();
    keyed.sort_unstable_by_key(|k| k.0);
    let rows: Vec<(Arc<NodeRecord>, bool)> = keyed.into_iter().map(|(_, r, c)| (r.clone(), c)).collect();
    let mut out = Vec::with_capacity(rows.len().div_ceil(SNAPSHOT_CHUNK));
    for chunk in rows.chunks(SNAPSHOT_CHUNK) {
        let f = frame("nodes", &NodeColumns::of(chunk, Vec::new()));
        if !each(&f) {
            return None;
        }
        out.push(f);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::Resources;
    use flotilla_view::ShardView;
    use serde_json::json;

    fn node(id: &str, domain: &str, cpu: u64) -> Arc<NodeRecord> {
        let mut r = crate::events::fixtures::node(id, domain, 500);
        Arc::make_mut(&mut r).capacity = Resources::new(cpu, 8 << 30, 1).into();
        r
    }

    #[test]
    fn repeated_strings_and_capacities_are_sent_once() {
        let mut cordoned = node("c", "y", 4000);
        Arc::make_mut(&mut cordoned).cordoned = true;
        let mut noticed = node("d", "x", 4000);
        let n = Arc::make_mut(&mut noticed);
        n.drain_requested = true;
        n.health = flotilla_core::HealthSample { preemption_notice: true, ..Default::default() }.into();
        let rows = vec![(node("a", "x", 4000), true), (node("b", "x", 8000), false), (cordoned, true), (noticed, true)];
        let v = serde_json::to_value(NodeColumns::of(&rows, vec!["gone"])).unwrap();
        assert_eq!(
            v,
            json!({
                "removed": ["gone"],
                "id": ["a", "b", "c", "d"],
                "status": [0, 3, 0, 0],
                "shard": [0, 0, 0, 0],
                "domain": [1, 1, 4, 1],
                "priority": [2, 2, 2, 2],
                "health": [0.5, 0.5, 0.5, 0.5],
                "capacity": [0, 1, 0, 0],
                "cpu_alloc": [1000, 1000, 1000, 1000],
                "mem_alloc": [1u64 << 30, 1u64 << 30, 1u64 << 30, 1u64 << 30],
                "gpu_alloc": [0, 0, 0, 0],
                "flags": [0, 0, CORDONED, DRAIN_REQUESTED | PREEMPTING],
                "incarnation": [1, 1, 1, 1],
                "strings": ["alive", "x", "high", "unknown", "y"],
                "capacities": [[4000, 8u64 << 30, 1], [8000, 8u64 << 30, 1]],
            })
        );
    }

    #[test]
    fn a_snapshot_is_by_id_in_chunks_and_the_removed_go_last() {
        let mut v = ShardView::empty(0, 1);
        for i in (0..SNAPSHOT_CHUNK + 1).rev() {
            v.insert(node(&format!("n{i:05}"), "x", 4000));
        }
        let slot = Arc::new(ShardSlot::of(Arc::new(v), true));
        let frames = snapshot_chunks(&[slot], |_| true).unwrap();
        assert_eq!(frames.len(), 2);
        let data = |f: &Frame| -> serde_json::Value {
            let s = std::str::from_utf8(f).unwrap();
            serde_json::from_str(s.strip_prefix("event: nodes\ndata: ").unwrap().trim_end()).unwrap()
        };
        let (first, second) = (data(&frames[0]), data(&frames[1]));
        let ids: Vec<&str> = first["id"].as_array().unwrap().iter().map(|i| i.as_str().unwrap()).collect();
        assert_eq!(ids.len(), SNAPSHOT_CHUNK);
        assert!(ids.windows(2).all(|w| w[0] < w[1]), "by id");
        assert_eq!(second["id"], json!([format!("n{SNAPSHOT_CHUNK:05}")]));

        let rows: Vec<_> = (0..SNAPSHOT_CHUNK + 1).map(|i| (node(&format!("n{i}"), "x", 4000), true)).collect();
        let frames = node_frames(&rows, vec!["gone"]);
        assert_eq!(
            (data(&frames[0])["removed"].clone(), data(&frames[1])["removed"].clone()),
            (json!([]), json!(["gone"]))
        );
        let only_removed = node_frames(&[], vec!["gone"]);
        assert_eq!(data(&only_removed[0])["id"], json!([]));
    }
}
