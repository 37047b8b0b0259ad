use std::sync::Arc;

use flotilla_core::{Incarnation, Labels, NodeId, NodeStatus, PackedHealth, Resources};
use imbl::OrdMap;

/// (epoch, sequence). The epoch changes whenever the shard restarts, so a version
/// from a previous life never looks current.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Version {
    pub epoch: u64,
    pub seq: u64,
}

/// Everything a scheduler needs to know about one node, as one immutable value.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeRecord {
    pub node_id: NodeId,
    pub incarnation: Incarnation,
    pub status: NodeStatus,
    pub status_since_unix_ms: u64,
    pub shard: u32,
    /// Shared between nodes with identical labels (most nodes of a pool).
    pub labels: Arc<Labels>,
    /// Published health score in thousandths (see `flotilla_core::Hysteresis`).
    pub health_millis: u16,
    /// The sample that produced the published score, packed (a shard keeps one per node).
    pub health: PackedHealth,
    /// Out of line and shared: the registry interns capacities (most nodes of a pool
    /// offer the same), and every idle node shares one zero allocation, so a record
    /// stays small at a million nodes.
    pub capacity: Arc<Resources>,
    pub allocated: Arc<Resources>,
    /// The members the node's agent runs and their states, as last reported.
    pub workloads: Arc<Vec<flotilla_proto::v1::WorkloadStatus>>,
    /// An operator cordoned it: no new placements.
    pub cordoned: bool,
    /// An operator asked for a drain: schedulers replace the node's members elsewhere
    /// first (make before break), then stop them. Implies `cordoned`.
    pub drain_requested: bool,
}

impl NodeRecord {
    /// An Alive, healthy record of incarnation 1 on shard 0 with no labels, capacity or
    /// allocations: a base for callers to fill in what they know (tests, mostly).
    pub fn blank(node_id: NodeId) -> Self {
        NodeRecord {
            node_id,
            incarnation: Incarnation(1),
            status: NodeStatus::Alive,
            status_since_unix_ms: 0,
            shard: 0,
            labels: Arc::new(Labels::new()),
            health_millis: 1000,
            health: PackedHealth::default(),
            capacity: Arc::default(),
            allocated: Arc::default(),
            workloads: Default::default(),
            cordoned: false,
            drain_requested: false,
        }
    }

    pub fn health_score(&self) -> f32 {
        f32::from(self.health_millis) / 1000.0
    }
}

/// The view's key: a node id behind its hash. The B-tree compares the inline hashes and
/// touches an id's bytes only on a match; ordered by the id alone, a lookup compared ids
/// as strings about 18 times, each through a pointer, and took a quarter of a
/// scheduler's CPU (BENCHMARKS.md, issue #19). The map stays ordered, so two versions
/// still diff in O(changes) (the dashboard's feed), but in hash order: listings sort by
/// id themselves. The seed is fixed, so the order is the same in every
/// process and a simulation replays.
///
/// The id is read through the record the key maps to, which the key holds: a new
/// version copies the tree's leaves it changes, cloning every entry of each, and an
/// entry's key and value then count their references in one allocation rather than two
/// (the id's and the record's). Those copies, and freeing them, cost a fifth less
/// (BENCHMARKS.md, "One search per member a pass"). The tree's branches keep copies of
/// some keys as separators, so a separator can hold an older record of its node (or of
/// one removed) until the branch changes: about one record in 40, of which only the id
/// is ever read.
#[derive(Debug, Clone)]
pub struct ViewKey {
    hash: u64,
    record: Arc<NodeRecord>,
}

impl ViewKey {
    pub fn new(record: Arc<NodeRecord>) -> Self {
        ViewKey { hash: key_hash(record.node_id.as_str()), record }
    }

    pub fn id(&self) -> &NodeId {
        &self.record.node_id
    }
}

impl PartialEq for ViewKey {
    fn eq(&self, other: &Self) -> bool {
        self.hash == other.hash && self.id() == other.id()
    }
}

impl Eq for ViewKey {}

impl PartialOrd for ViewKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ViewKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.hash.cmp(&other.hash).then_with(|| self.id().cmp(other.id()))
    }
}

fn key_hash(id: &str) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(id)
}

/// What the view's B-tree compares: a hash, then an id. A [`ViewKey`] borrows as one,
/// and so does an id as text with its hash ([`IdRef`]), so a lookup by `&str` builds no
/// `NodeId` (an allocation) and clones none. Schedulers look up every member's node each
/// pass by the id their records hold as text; what a lookup costs is still the search's
/// cache misses (BENCHMARKS.md, "Prefetching the planner's scan").
pub trait KeyParts {
    fn key_hash(&self) -> u64;
    fn key_id(&self) -> &str;
}

impl KeyParts for ViewKey {
    fn key_hash(&self) -> u64 {
        self.hash
    }
    fn key_id(&self) -> &str {
        self.record.node_id.as_str()
    }
}

/// An id as text, with its hash: the borrowed form of a [`ViewKey`].
struct IdRef<'a> {
    hash: u64,
    id: &'a str,
}

impl KeyParts for IdRef<'_> {
    fn key_hash(&self) -> u64 {
        self.hash
    }
    fn key_id(&self) -> &str {
        self.id
    }
}

/// The same order as `ViewKey`'s (hash, then id; `NodeId` orders as text).
impl Ord for dyn KeyParts + '_ {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key_hash().cmp(&other.key_hash()).then_with(|| self.key_id().cmp(other.key_id()))
    }
}

impl PartialOrd for dyn KeyParts + '_ {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for dyn KeyParts + '_ {
    fn eq(&self, other: &Self) -> bool {
        self.key_hash() == other.key_hash() && self.key_id() == other.key_id()
    }
}

impl Eq for dyn KeyParts + '_ {}

impl<'a> std::borrow::Borrow<dyn KeyParts + 'a> for ViewKey {
    fn borrow(&self) -> &(dyn KeyParts + 'a) {
        self
    }
}

/// One shard's nodes at one version. Cloning is O(1).
#[derive(Debug, Clone)]
pub struct ShardView {
    pub shard: u32,
    pub version: Version,
    pub nodes: OrdMap<ViewKey, Arc<NodeRecord>>,
}

impl ShardView {
    pub fn empty(shard: u32, epoch: u64) -> Self {
        ShardView { shard, version: Version { epoch, seq: 0 }, nodes: OrdMap::new() }
    }

    /// The record of node `id` (a `NodeId`, or its text: no id is built to search).
    pub fn get(&self, id: &(impl std::borrow::Borrow<str> + ?Sized)) -> Option<&Arc<NodeRecord>> {
        let id = id.borrow();
        self.nodes.get(&IdRef { hash: key_hash(id), id } as &dyn KeyParts)
    }

    /// The records of `ids`, in their order. The searches run in the tree's own order
    /// (by hash), so consecutive ones share the cache lines of their path and leaf: a
    /// scheduler pass that looks up every member's node searched a view much larger than
    /// the cache, and each search in the members' order missed on most of its reads.
    pub fn get_many<'s>(&'s self, ids: &[&str]) -> Vec<Option<&'s Arc<NodeRecord>>> {
        let mut order: Vec<(u64, u32)> = ids.iter().enumerate().map(|(i, id)| (key_hash(id), i as u32)).collect();
        // By hash alone: the order is for locality, not for finding.
        order.sort_unstable_by_key(|&(hash, _)| hash);
        let mut out = vec![None; ids.len()];
        for (hash, i) in order {
            let id = ids[i as usize];
            out[i as usize] = self.nodes.get(&IdRef { hash, id } as &dyn KeyParts);
        }
        out
    }

    /// Adds or replaces a node's record; returns the one it replaced.
    pub fn insert(&mut self, record: Arc<NodeRecord>) -> Option<Arc<NodeRecord>> {
        self.nodes.insert(ViewKey::new(record.clone()), record)
    }

    pub fn remove(&mut self, id: &NodeId) -> Option<Arc<NodeRecord>> {
        let id = id.as_str();
        self.nodes.remove(&IdRef { hash: key_hash(id), id } as &dyn KeyParts)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The next version: this one with `delta` applied. Fails when the delta does not
    /// start at this version (the caller then needs a snapshot).
    pub fn apply(&self, delta: &Delta) -> Option<ShardView> {
        self.apply_replacing(delta).map(|(next, _)| next)
    }

    /// [`ShardView::apply`], also returning the records the delta replaced, in its order
    /// (its upserts, then its removals; `None` for a node the view did not hold): an
    /// index of the view updates from them without searching the previous version.
    pub fn apply_replacing(&self, delta: &Delta) -> Option<(ShardView, Vec<Option<Arc<NodeRecord>>>)> {
        if delta.from != self.version {
            return None;
        }
        let mut next = ShardView { shard: self.shard, version: delta.to, nodes: self.nodes.clone() };
        let mut replaced = Vec::with_capacity(delta.upserts.len() + delta.removed.len());
        for r in &delta.upserts {
            replaced.push(next.insert(r.clone()));
        }
        for id in &delta.removed {
            replaced.push(next.remove(id));
        }
        Some((next, replaced))
    }
}

/// What changed between two consecutive versions.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    pub shard: u32,
    pub from: Version,
    pub to: Version,
    pub upserts: Vec<Arc<NodeRecord>>,
    pub removed: Vec<NodeId>,
    /// When the shard published it (Unix ms; 0 from an older shard).
    pub published_unix_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The borrowed key orders as the owned one does, or a lookup by text would miss
    /// records the B-tree holds (it binary-searches with the borrowed order).
    #[test]
    fn a_lookup_by_text_finds_what_a_lookup_by_id_finds() {
        let mut view = ShardView::empty(0, 1);
        let ids: Vec<NodeId> = (0..5_000).map(|i| NodeId::new(&format!("node-{i}")).expect("id")).collect();
        for id in ids.iter().step_by(2) {
            view.insert(Arc::new(NodeRecord::blank(id.clone())));
        }
        for (i, id) in ids.iter().enumerate() {
            let by_text = view.get(id.as_str()).map(|r| r.node_id.clone());
            assert_eq!(by_text, view.get(id).map(|r| r.node_id.clone()));
            assert_eq!(by_text.as_ref(), (i % 2 == 0).then_some(id), "{id}");
        }
        assert!(view.get("").is_none());
        let texts: Vec<&str> = ids.iter().rev().map(NodeId::as_str).chain(["", "node-x"]).collect();
        let many: Vec<Option<&NodeId>> = view.get_many(&texts).into_iter().map(|r| r.map(|r| &r.node_id)).collect();
        let one_by_one: Vec<Option<&NodeId>> = texts.iter().map(|t| view.get(*t).map(|r| &r.node_id)).collect();
        assert_eq!(many, one_by_one);
    }

    /// A shard keeps one record per node (issue #19's 300 bytes a node): a field that
    /// grows it should be a decision, not an accident.
    #[test]
    fn a_record_stays_at_80_bytes() {
        assert_eq!(std::mem::size_of::<NodeRecord>(), 80);
        assert_eq!(std::mem::size_of::<ViewKey>(), 16);
    }
}
