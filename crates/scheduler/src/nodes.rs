//! The view as one reconcile pass reads it: every shard's slot, loaded once, and the
//! records of the nodes the app's members are on, found together when the pass begins.
//!
//! Observe, heal and roll each read every member's node record, so a pass searched the
//! view three times per member, and each search of a view much larger than the cache
//! missed on most of its reads (BENCHMARKS.md, "One search per member a pass"). Here
//! the members' nodes are searched once, in the view's own order
//! ([`flotilla_view::ShardView::get_many`]), and the steps read the records from a
//! table the size of the app. The table holds what the view held when the pass began,
//! so a step reads exactly what a search of the pass's slots would return; a node
//! outside it (a replacement placed during the pass) is searched in those slots.

use std::sync::Arc;

use flotilla_core::NodeId;
use flotilla_view::{NodeRecord, ShardSlot};

use crate::planner::NodeMap;
use crate::units::Units;

/// Where the pure deciders (repair, rollout) read node records: the pass's [`Nodes`],
/// or plain slots (their tests, and callers outside a pass).
pub trait NodeLookup {
    fn slot(&self, shard: u32) -> Option<&ShardSlot>;

    /// Node `id`'s record in shard `shard`'s view.
    fn record(&self, shard: u32, id: &str) -> Option<&Arc<NodeRecord>> {
        self.slot(shard)?.view.get(id)
    }
}

impl NodeLookup for [Arc<ShardSlot>] {
    fn slot(&self, shard: u32) -> Option<&ShardSlot> {
        self.get(shard as usize).map(|s| &**s)
    }
}

impl NodeLookup for Vec<Arc<ShardSlot>> {
    fn slot(&self, shard: u32) -> Option<&ShardSlot> {
        self.as_slice().slot(shard)
    }
}

/// See the module doc.
pub struct Nodes {
    slots: Vec<Arc<ShardSlot>>,
    /// Per shard: the members' nodes, and their records (`None`: not in the view).
    found: Vec<NodeMap<Option<Arc<NodeRecord>>>>,
}

impl Nodes {
    /// `slots`, with the records of the nodes `units`' members (and the members coming
    /// up to replace them) are placed on.
    pub fn new(slots: Vec<Arc<ShardSlot>>, units: &Units) -> Nodes {
        let mut wanted: Vec<Vec<&str>> = vec![Vec::new(); slots.len()];
        for u in units.values().filter(|u| u.state.holds_resources()) {
            for m in u.members.iter().chain(&u.surge) {
                if let (Some(id), Some(ids)) = (m.node_id.as_deref(), m.shard.and_then(|s| wanted.get_mut(s as usize)))
                {
                    ids.push(id);
                }
            }
        }
        let found = slots
            .iter()
            .zip(&wanted)
            .map(|(slot, ids)| {
                // Members of one unit often share a node: its second search finds the
                // same path in cache, cheaper than sorting the ids as text to drop it.
                let records = slot.view.get_many(ids);
                let mut found = NodeMap::with_capacity_and_hasher(ids.len(), Default::default());
                for (id, record) in ids.iter().zip(records) {
                    let key = match record {
                        Some(r) => r.node_id.clone(),
                        None => match NodeId::new(id) {
                            Ok(key) => key,
                            // Not an id: no view holds it, and a search says so.
                            Err(_) => continue,
                        },
                    };
                    found.insert(key, record.cloned());
                }
                found
            })
            .collect();
        Nodes { slots, found }
    }

    /// `slots` alone: every record is searched for when read.
    pub fn plain(slots: Vec<Arc<ShardSlot>>) -> Nodes {
        Nodes { slots, found: Vec::new() }
    }
}

impl std::ops::Deref for Nodes {
    type Target = [Arc<ShardSlot>];

    fn deref(&self) -> &[Arc<ShardSlot>] {
        &self.slots
    }
}

impl NodeLookup for Nodes {
    fn slot(&self, shard: u32) -> Option<&ShardSlot> {
        self.slots.slot(shard)
    }

    fn record(&self, shard: u32, id: &str) -> Option<&Arc<NodeRecord>> {
        match self.found.get(shard as usize).and_then(|found| found.get(id)) {
            Some(record) => record.as_ref(),
            None => self.slots.record(shard, id),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::UnitState;
    use crate::testing::{node, slots, unit};

    /// The table answers as a search of the pass's slots does: for the members' nodes
    /// (in the view or not) and for a node no member is on.
    #[test]
    fn a_pass_reads_what_a_search_of_its_slots_returns() {
        let view = slots([node("n1"), node("n2"), node("n3")], true);
        let mut units = Units::default();
        units.insert(unit("u1", 1, UnitState::Running, &[("head", "n1"), ("worker-0", "gone")]));
        units.insert(unit("u2", 1, UnitState::Running, &[("head", "n1"), ("worker-0", "n2")]));
        units.insert(unit("u3", 1, UnitState::Queued, &[("head", "n3")]));
        let nodes = Nodes::new(view.clone(), &units);
        assert_eq!(nodes.found[0].len(), 3, "n1 once, n2, and gone (not in the view); u3 holds nothing");
        for id in ["n1", "n2", "n3", "gone", "not an id", ""] {
            assert_eq!(nodes.record(0, id).map(|r| &r.node_id), view.record(0, id).map(|r| &r.node_id), "{id}");
        }
        assert!(nodes.record(1, "n1").is_none(), "no shard 1");
    }
}
