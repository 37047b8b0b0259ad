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

    /// How the view as it is now differs from what the last pass saw in what the app
    /// depends on. A node whose health score alone moved is taken as seen: only the route
    /// table reads it at once.
    pub fn concern(&mut self, cluster: &ClusterView) -> Concern {
        let Some(nodes) = &mut self.nodes else { return Concern::Pass };
        let slots = cluster.slots();
        if slots.len() != self.connected.len() || slots.iter().zip(&self.connected).any(|(s, c)| s.connected != *c) {
            return Concern::Pass;
        }
        let checked = &self.checked;
        let same =
            |shard: usize| checked.get(shard).zip(slots.get(shard)).is_some_and(|(c, s)| Arc::ptr_eq(c, &s.view));
        let mut concern = Concern::Nothing;
        for seen in nodes.iter_mut().filter(|seen| !same(seen.shard)) {
            let now = slots.get(seen.shard).and_then(|s| s.view.get(&seen.node));
            match (now, &seen.record) {
                (Some(a), Some(b)) if Arc::ptr_eq(a, b) => {}
                (None, None) => {}
                (Some(a), Some(b)) if health_only(b, a) => {
                    seen.record = Some(a.clone());
                    concern = Concern::Routes;
                }
                _ => return Concern::Pass,
            }
        }
        self.checked = slots.iter().map(|s| s.view.clone()).collect();
        concern
    }
}

/// What a change of the view means to an app ([`Watched::concern`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Concern {
    Nothing,
    /// Only the route table reads what changed.
    Routes,
    /// A pass decides on it.
    Pass,
}

/// Whether `new` differs from `old` in the health score alone. The route table weighs
/// members by it at once; the steps of a pass that read it (the rebalance look, choosing
/// whom to scale in) read the view when they run, not on its changes. A preemption
/// notice is more than a score: `roll` replaces the node's members.
fn health_only(old: &NodeRecord, new: &NodeRecord) -> bool {
    old.health.preemption_notice() == new.health.preemption_notice()
        && NodeRecord { health_millis: old.health_millis, health: old.health, ..new.clone() } == *old
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
        assert_eq!(watched.concern(&cluster), Concern::Nothing, "nothing changed");

        // Another node's record changes: not the app's concern.
        install(&cluster, &[a.clone(), b.clone(), record("other", true)], true);
        assert_eq!(watched.concern(&cluster), Concern::Nothing);
        // A member's node is cordoned, leaves the view, or its shard goes unreachable.
        install(&cluster, &[a.clone(), record("b", true), other.clone()], true);
        assert_eq!(watched.concern(&cluster), Concern::Pass);
        install(&cluster, &[a.clone(), other.clone()], true);
        assert_eq!(watched.concern(&cluster), Concern::Pass);
        install(&cluster, &[a.clone(), b.clone(), other.clone()], false);
        assert_eq!(watched.concern(&cluster), Concern::Pass);
        // Back as it was: no concern again.
        install(&cluster, &[a, b, other], true);
        assert_eq!(watched.concern(&cluster), Concern::Nothing);
    }

    #[test]
    fn a_queued_unit_or_no_pass_yet_makes_every_change_a_concern() {
        let cluster = ClusterView::new(1);
        install(&cluster, &[record("a", false)], true);
        let units = [unit("u1", UnitState::Running, &["a"]), unit("u2", UnitState::Queued, &[])];
        assert_eq!(Watched::of(&units, &cluster.slots()).concern(&cluster), Concern::Pass);
        assert_eq!(Watched::everything().concern(&cluster), Concern::Pass);
        // A node the app waits for that is not in the view yet counts when it appears.
        let mut watched = Watched::of(&[unit("u1", UnitState::Starting, &["late"])], &cluster.slots());
        assert_eq!(watched.concern(&cluster), Concern::Nothing);
        install(&cluster, &[record("a", false), record("late", false)], true);
        assert_eq!(watched.concern(&cluster), Concern::Pass);
        // A member to place again (a lost worker) waits for room too.
        let mut lost = unit("u1", UnitState::Degraded, &["a", "gone"]);
        lost.members[1].node_id = None;
        assert_eq!(Watched::of(std::slice::from_ref(&lost), &cluster.slots()).concern(&cluster), Concern::Pass);
        lost.state = UnitState::Failed;
        assert_eq!(
            Watched::of(&[lost], &cluster.slots()).concern(&cluster),
            Concern::Nothing,
            "an ended unit waits for nothing"
        );
    }

    #[test]
    fn the_nodes_of_an_ended_unit_are_not_watched() {
        let cluster = ClusterView::new(1);
        let a = record("a", false);
        install(&cluster, &[a.clone(), record("b", false)], true);
        let units = [unit("u1", UnitState::Running, &["a"]), unit("u0", UnitState::Terminated, &["b"])];
        let mut watched = Watched::of(&units, &cluster.slots());
        install(&cluster, &[a, record("b", true)], true);
        assert_eq!(watched.concern(&cluster), Concern::Nothing, "u0 ended: b is not the app's");
        install(&cluster, &[record("a", true), record("b", true)], true);
        assert_eq!(watched.concern(&cluster), Concern::Pass);
    }

    #[test]
    fn a_replacement_workers_node_is_watched_as_a_members() {
        let cluster = ClusterView::new(1);
        install(&cluster, &[record("a", false), record("b", false)], true);
        let mut u = unit("u1", UnitState::Running, &["a"]);
        u.surge = unit("u1", UnitState::Running, &["b"]).members;
        let mut watched = Watched::of(&[u], &cluster.slots());
        assert_eq!(watched.concern(&cluster), Concern::Nothing);
        install(&cluster, &[record("a", false), record("b", true)], true);
        assert_eq!(watched.concern(&cluster), Concern::Pass);
    }

    #[test]
    fn a_members_health_score_alone_concerns_only_the_routes() {
        let cluster = ClusterView::new(1);
        let a = record("a", false);
        install(&cluster, std::slice::from_ref(&a), true);
        let mut watched = Watched::of(&[unit("u1", UnitState::Running, &["a"])], &cluster.slots());
        let with = |f: &dyn Fn(&mut NodeRecord)| {
            let mut r = (*a).clone();
            f(&mut r);
            Arc::new(r)
        };
        let sample =
            |notice| flotilla_core::HealthSample { cpu_steal: 0.4, preemption_notice: notice, ..Default::default() };
        let poorer = with(&|r| {
            r.health_millis = 400;
            r.health = sample(false).into();
        });
        install(&cluster, std::slice::from_ref(&poorer), true);
        assert_eq!(watched.concern(&cluster), Concern::Routes);
        // Taken as seen: the same record again is nothing.
        install(&cluster, &[poorer], true);
        assert_eq!(watched.concern(&cluster), Concern::Nothing);
        // A preemption notice has the members replaced; so does any other field.
        install(&cluster, &[with(&|r| r.health = sample(true).into())], true);
        assert_eq!(watched.concern(&cluster), Concern::Pass);
        install(&cluster, &[with(&|r| r.incarnation.0 += 1)], true);
        assert_eq!(watched.concern(&cluster), Concern::Pass);
    }
}
