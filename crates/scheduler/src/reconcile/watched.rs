//! Which view changes concern an app. The view changes many times a second (any node's
//! health class, any commit of any app); a process hosting a thousand apps
//! (`flotilla scheduler --apps-dir`) that ran a pass of every app on each change spent
//! 1.2 cores doing nothing (BENCHMARKS.md, "A thousand apps in one scheduler").
//!
//! For an app with no unit waiting for room, what a pass decides from the view comes
//! from the records of the nodes its members are on (their health, cordons and drains,
//! what their agents report) and from which shards are connected. A change to anything
//! else (room freed on another node, an orphan left on one) is seen by the pass the tick
//! runs ([`super::due`]), as are all timers; a queued unit makes every change concern the
//! app, since any node may now have room for it.
//!
//! The nodes are registered with the view ([`flotilla_view::Interest`]), so a change of
//! another node does not even wake the app's loop; the comparison here settles whether a
//! wake-up (a change of one of its nodes, a snapshot, connectivity) concerns it.

use std::sync::Arc;

use flotilla_core::NodeId;
use flotilla_view::{ClusterView, NodeRecord, ShardSlot, ShardView};

use crate::lifecycle::UnitState;
use crate::store::UnitRecord;

/// What the last pass saw of the view that concerns the app.
#[derive(Debug, Default)]
pub(super) struct Watched {
    /// The members' nodes and their records as seen; `None` when every change concerns
    /// the app.
    nodes: Option<Vec<Seen>>,
    connected: Vec<bool>,
    /// Each shard's view when it was last found to concern the app in nothing: a shard
    /// whose view is the same one since is not looked at again (a change usually comes
    /// from one shard).
    checked: Vec<Arc<ShardView>>,
}

#[derive(Debug)]
struct Seen {
    shard: usize,
    node: NodeId,
    record: Option<Arc<NodeRecord>>,
}

impl Watched {
    /// Every change concerns the app (it has not adopted from the view yet).
    pub fn everything() -> Watched {
        Watched::default()
    }

    /// What `units` depend on in `slots`, the view as it was when the pass began.
    pub fn of<'a>(units: impl IntoIterator<Item = &'a UnitRecord>, slots: &[Arc<ShardSlot>]) -> Watched {
        let mut nodes: Vec<Seen> = Vec::new();
        for u in units {
            // Room anywhere may let these go on: a unit to place, a member to place again
            // (a lost worker), a replacement that found no room. An ended unit kept for
            // the record waits for nothing.
            let unplaced =
                u.state.is_active() && (u.members.iter().any(|m| m.node_id.is_none()) || u.roll_waits.is_some());
            if matches!(u.state, UnitState::Queued | UnitState::Placing) || unplaced {
                return Watched::everything();
            }
            // An ended unit kept for the record runs nowhere: its nodes' changes are not
            // the app's.
            if u.state == UnitState::Terminated {
                continue;
            }
            // Replacement workers coming up (make before break) are watched as members.
            for m in u.members.iter().chain(&u.surge) {
                let (Some(id), Some(shard)) = (m.node_id.as_deref(), m.shard) else { continue };
                let Ok(node) = NodeId::new(id) else { continue };
                let shard = shard as usize;
                let record = slots.get(shard).and_then(|s| s.view.get(&node)).cloned();
                nodes.push(Seen { shard, node, record });
            }
        }
        // Members of one unit often share a node: each node is looked at once.
        nodes.sort_unstable_by(|a, b| (a.shard, a.node.as_str()).cmp(&(b.shard, b.node.as_str())));
        nodes.dedup_by(|a, b| a.shard == b.shard && a.node == b.node);
        Watched {
            nodes: Some(nodes),
            connected: slots.iter().map(|s| s.connected).collect(),
            checked: slots.iter().map(|s| s.view.clone()).collect(),
        }
    }

    /// Registers with `interest` what the app depends on, so only changes of its nodes
    /// (and of connectivity) wake it.
    pub fn register(&self, interest: &mut flotilla_view::Interest) {
        match &self.nodes {
            Some(nodes) => interest.watch(nodes.iter().map(|seen| (seen.shard, &seen.node))),
            None => interest.everything(),
        }
    }

    /// Whether the view as it is now differs from what the last pass saw in anything the
    /// app depends on.
    pub fn concerned(&mut self, cluster: &ClusterView) -> bool {
        let Some(nodes) = &self.nodes else { return true };
        let slots = cluster.slots();
        if slots.len() != self.connected.len() || slots.iter().zip(&self.connected).any(|(s, c)| s.connected != *c) {
            return true;
        }
        let same =
            |shard: usize| self.checked.get(shard).zip(slots.get(shard)).is_some_and(|(c, s)| Arc::ptr_eq(c, &s.view));
        let changed = nodes.iter().filter(|seen| !same(seen.shard)).any(|seen| {
            let now = slots.get(seen.shard).and_then(|s| s.view.get(&seen.node));
            match (now, &seen.record) {
                (Some(a), Some(b)) => !Arc::ptr_eq(a, b),
                (None, None) => false,
                _ => true,
            }
        });
        if !changed {
            self.checked = slots.iter().map(|s| s.view.clone()).collect();
        }
        changed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_view::ShardView;

    fn unit(id: &str, state: UnitState, nodes: &[&str]) -> UnitRecord {
        let members: Vec<(String, &str)> = nodes.iter().enumerate().map(|(i, n)| (format!("m{i}"), *n)).collect();
        let members: Vec<(&str, &str)> = members.iter().map(|(m, n)| (m.as_str(), *n)).collect();
        crate::testing::unit(id, 1, state, &members)
    }

    fn record(node: &str, cordoned: bool) -> Arc<NodeRecord> {
        let mut r = NodeRecord::blank(NodeId::new(node).unwrap());
        r.cordoned = cordoned;
        Arc::new(r)
    }

    /// A one-shard cluster whose view holds `records`.
    fn install(cluster: &ClusterView, records: &[Arc<NodeRecord>], connected: bool) {
        let mut view = ShardView::empty(0, 1);
        for r in records {
            view.insert(r.clone());
        }
        cluster.install(0, view, connected);
    }

    #[test]
    fn only_changes_to_the_members_nodes_or_the_shards_concern_an_app() {
        let cluster = ClusterView::new(1);
        let (a, b, other) = (record("a", false), record("b", false), record("other", false));
        install(&cluster, &[a.clone(), b.clone(), other.clone()], true);
        let units = [unit("u1", UnitState::Running, &["a", "b"]), unit("u2", UnitState::Allocated, &["a"])];
        let mut watched = Watched::of(&units, &cluster.slots());
        assert!(!watched.concerned(&cluster), "nothing changed");

        // Another node's record changes: not the app's concern.
        install(&cluster, &[a.clone(), b.clone(), record("other", true)], true);
        assert!(!watched.concerned(&cluster));
        // A member's node is cordoned, leaves the view, or its shard goes unreachable.
        install(&cluster, &[a.clone(), record("b", true), other.clone()], true);
        assert!(watched.concerned(&cluster));
        install(&cluster, &[a.clone(), other.clone()], true);
        assert!(watched.concerned(&cluster));
        install(&cluster, &[a.clone(), b.clone(), other.clone()], false);
        assert!(watched.concerned(&cluster));
        // Back as it was: no concern again.
        install(&cluster, &[a, b, other], true);
        assert!(!watched.concerned(&cluster));
    }

    #[test]
    fn a_queued_unit_or_no_pass_yet_makes_every_change_a_concern() {
        let cluster = ClusterView::new(1);
        install(&cluster, &[record("a", false)], true);
        let units = [unit("u1", UnitState::Running, &["a"]), unit("u2", UnitState::Queued, &[])];
        assert!(Watched::of(&units, &cluster.slots()).concerned(&cluster));
        assert!(Watched::everything().concerned(&cluster));
        // A node the app waits for that is not in the view yet counts when it appears.
        let mut watched = Watched::of(&[unit("u1", UnitState::Starting, &["late"])], &cluster.slots());
        assert!(!watched.concerned(&cluster));
        install(&cluster, &[record("a", false), record("late", false)], true);
        assert!(watched.concerned(&cluster));
        // A member to place again (a lost worker) waits for room too.
        let mut lost = unit("u1", UnitState::Degraded, &["a", "gone"]);
        lost.members[1].node_id = None;
        assert!(Watched::of(std::slice::from_ref(&lost), &cluster.slots()).concerned(&cluster));
        lost.state = UnitState::Failed;
        assert!(!Watched::of(&[lost], &cluster.slots()).concerned(&cluster), "an ended unit waits for nothing");
    }

    #[test]
    fn the_nodes_of_an_ended_unit_are_not_watched() {
        let cluster = ClusterView::new(1);
        let a = record("a", false);
        install(&cluster, &[a.clone(), record("b", false)], true);
        let units = [unit("u1", UnitState::Running, &["a"]), unit("u0", UnitState::Terminated, &["b"])];
        let mut watched = Watched::of(&units, &cluster.slots());
        install(&cluster, &[a, record("b", true)], true);
        assert!(!watched.concerned(&cluster), "u0 ended: b is not the app's");
        install(&cluster, &[record("a", true), record("b", true)], true);
        assert!(watched.concerned(&cluster));
    }

    #[test]
    fn a_replacement_workers_node_is_watched_as_a_members() {
        let cluster = ClusterView::new(1);
        install(&cluster, &[record("a", false), record("b", false)], true);
        let mut u = unit("u1", UnitState::Running, &["a"]);
        u.surge = unit("u1", UnitState::Running, &["b"]).members;
        let mut watched = Watched::of(&[u], &cluster.slots());
        assert!(!watched.concerned(&cluster));
        install(&cluster, &[record("a", false), record("b", true)], true);
        assert!(watched.concerned(&cluster));
    }
}
