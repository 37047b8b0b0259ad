//! What to do about a unit whose members' nodes failed, and which units go first on
//! scale-in. Pure decisions over the view; the reconcile loop carries them out.
//!
//! - A lost head fails the whole unit (it is the failure domain): its survivors are
//!   released and a replacement unit (new id, next generation) is queued.
//! - A lost worker degrades the unit: only that worker is replaced, in the same domain;
//!   the unit keeps its id and its routes.
//! - A member whose shard cannot be heard is Unknown, never lost, until a live shard
//!   declares its node Dead or the unknown grace expires.

use std::sync::Arc;

use flotilla_core::NodeStatus;
use flotilla_view::{NodeRecord, ShardSlot};

use crate::lifecycle::UnitState;
use crate::nodes::NodeLookup;
use crate::store::{MemberRecord, UnitRecord};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberHealth {
    Ok,
    Lost(&'static str),
    /// Its shard is unreachable or recovering.
    Unknown,
}

/// How long after a shard (re)started a node missing from its view is Unknown rather than
/// lost: its agent may not have registered again yet. An agent notices a silent shard
/// within its QUIC idle timeout (10 s), tries that address again for up to 5 s, then the
/// next one (a standby now serving): 30 s covers it with room (the lab's isolated shard
/// host, `tests/lab/shards.rs`, replaced everything at 15 s). A shard's epoch is its
/// start time (Unix ms), so this needs no word from the shard.
pub const REJOIN_GRACE_MS: u64 = 30_000;

/// The member state the scheduler records when the member's live node has not run it for
/// [`MISSING_AFTER_MS`].
pub const MISSING: &str = "missing";
/// How long a member may be absent from its live node's workloads before it is missing.
pub const MISSING_AFTER_MS: u64 = 10_000;

/// Member `m`'s shard and its node's record in that shard's view (`None` when the view
/// lacks the node); `None` when the member is not placed or its shard is not known.
pub fn node_of<'a>(
    m: &MemberRecord,
    nodes: &'a (impl NodeLookup + ?Sized),
) -> Option<(&'a ShardSlot, Option<&'a Arc<NodeRecord>>)> {
    let (Some(node), Some(shard)) = (m.node_id.as_deref(), m.shard) else { return None };
    Some((nodes.slot(shard)?, nodes.record(shard, node)))
}

/// True when member `m` of unit `unit` (at `generation`) is placed on a node that is
/// Alive in a settled, reachable view and whose agent does not report the member.
/// `node`: the member's ([`node_of`]), looked up once by the caller.
pub fn runs_nowhere(
    unit: &str,
    generation: u64,
    m: &MemberRecord,
    node: Option<(&ShardSlot, Option<&Arc<NodeRecord>>)>,
    now_ms: u64,
) -> bool {
    let Some((slot, rec)) = node.filter(|(slot, _)| slot.connected) else { return false };
    if now_ms.saturating_sub(slot.view.version.epoch) < REJOIN_GRACE_MS {
        return false;
    }
    rec.is_some_and(|rec| {
        rec.status == NodeStatus::Alive
            && rec.incarnation.0 == m.incarnation
            && !rec.workloads.iter().any(|w| w.unit == unit && w.member == m.member && w.generation == generation)
    })
}

pub fn member_health(m: &MemberRecord, nodes: &(impl NodeLookup + ?Sized), now_ms: u64) -> MemberHealth {
    let (Some(node), Some(shard)) = (m.node_id.as_deref(), m.shard) else { return MemberHealth::Ok };
    if m.state.as_deref() == Some(MISSING) {
        return MemberHealth::Lost("its node does not run it");
    }
    let Some(slot) = nodes.slot(shard) else { return MemberHealth::Unknown };
    if !slot.connected {
        return MemberHealth::Unknown;
    }
    let Some(rec) = nodes.record(shard, node) else {
        if now_ms.saturating_sub(slot.view.version.epoch) < REJOIN_GRACE_MS {
            return MemberHealth::Unknown;
        }
        return MemberHealth::Lost("its node left the view");
    };
    if rec.incarnation.0 != m.incarnation {
        return MemberHealth::Lost("its node restarted");
    }
    match rec.status {
        NodeStatus::Dead => MemberHealth::Lost("its node is dead"),
        NodeStatus::Draining => MemberHealth::Lost("its node is draining"),
        NodeStatus::Unknown => MemberHealth::Unknown,
        NodeStatus::Alive | NodeStatus::Suspect => MemberHealth::Ok,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Repair {
    Nothing,
    /// The head is lost: fail the unit and release everything it holds.
    FailUnit(String),
    /// These workers are lost: replace them in the unit's domain.
    ReplaceWorkers(Vec<String>),
    /// Some members cannot be judged (Unknown) and the grace has not expired.
    Wait,
}

/// Each member's health, in member order: what [`decide`] judges.
pub fn health_of(unit: &UnitRecord, nodes: &(impl NodeLookup + ?Sized), now_ms: u64) -> Vec<MemberHealth> {
    unit.members.iter().map(|m| member_health(m, nodes, now_ms)).collect()
}

/// `health`: each member's ([`health_of`]); `unknown_for_ms`: how long this unit has had
/// Unknown members (0 if none so far).
pub fn decide(unit: &UnitRecord, health: &[MemberHealth], unknown_for_ms: u64, unknown_grace_ms: u64) -> Repair {
    if !matches!(unit.state, UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded) {
        return Repair::Nothing;
    }
    let mut lost_workers = Vec::new();
    let mut unknown = false;
    for (m, h) in unit.members.iter().zip(health) {
        let h = match *h {
            MemberHealth::Unknown if unknown_for_ms >= unknown_grace_ms => {
                MemberHealth::Lost("its shard stayed unknown past the grace")
            }
            h => h,
        };
        match h {
            MemberHealth::Ok => {}
            MemberHealth::Unknown => unknown = true,
            MemberHealth::Lost(why) if m.role == "head" => return Repair::FailUnit(format!("head lost: {why}")),
            MemberHealth::Lost(_) => lost_workers.push(m.member.clone()),
        }
    }
    if !lost_workers.is_empty() {
        Repair::ReplaceWorkers(lost_workers)
    } else if unknown {
        Repair::Wait
    } else {
        Repair::Nothing
    }
}

/// Which `n` units leave first on scale-in: one with a member not running, then one on
/// a node the pool would rather free (not one it keeps anyway:
/// `flotilla_core::unit_shape::preference`), then the lowest health score of its nodes,
/// then the youngest (highest generation).
pub fn scale_in_order(units: &[&UnitRecord], n: usize, slots: &[Arc<ShardSlot>]) -> Vec<String> {
    let rank = |u: &UnitRecord| -> (bool, bool, u16) {
        let all_running =
            u.state == UnitState::Running && u.members.iter().all(|m| m.state.as_deref() == Some("running"));
        let (mut kept, mut min_score) = (true, None::<u16>);
        for m in &u.members {
            let Some(rec) = (|| {
                let slot = slots.get(m.shard? as usize)?;
                slot.view.get(m.node_id.as_deref()?)
            })() else {
                continue;
            };
            kept &= rec.labels.pool_preference().0;
            min_score = Some(min_score.map_or(rec.health_millis, |s| s.min(rec.health_millis)));
        }
        (all_running, kept, min_score.unwrap_or(0))
    };
    let mut ranked: Vec<(&UnitRecord, (bool, bool, u16))> = units.iter().map(|u| (*u, rank(u))).collect();
    ranked.sort_by(|(a, ra), (b, rb)| ra.cmp(rb).then(b.generation.cmp(&a.generation)));
    ranked.into_iter().take(n).map(|(u, _)| u.unit_id.clone()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::Incarnation;
    use flotilla_proto::v1;
    use flotilla_view::{NodeRecord, ShardView};

    use crate::testing::unit;

    fn slots(nodes: &[(&str, NodeStatus, u64, u16)], connected: bool) -> Vec<Arc<ShardSlot>> {
        let records = nodes.iter().map(|(id, status, inc, health)| NodeRecord {
            status: *status,
            incarnation: Incarnation(*inc),
            health_millis: *health,
            ..crate::testing::node(id)
        });
        crate::testing::slots(records, connected)
    }

    fn decided(u: &UnitRecord, s: &[Arc<ShardSlot>], unknown_for_ms: u64, grace_ms: u64, now: u64) -> Repair {
        decide(u, &health_of(u, s, now), unknown_for_ms, grace_ms)
    }

    /// Long after the test shards' epoch (1).
    const NOW: u64 = 1_000_000_000;

    #[test]
    fn a_missing_node_is_unknown_while_its_shard_is_young_then_lost() {
        let u = unit("u", 1, UnitState::Running, &[("head", "gone")]);
        let mut s = slots(&[], true);
        assert!(matches!(decided(&u, &s, 0, 60_000, NOW), Repair::FailUnit(_)), "left the view of an old shard");
        let young = ShardView::empty(0, NOW - 1_000);
        s[0] = Arc::new(ShardSlot::of(Arc::new(young), true));
        assert_eq!(decided(&u, &s, 0, 60_000, NOW), Repair::Wait, "a restarted shard: its agent may be on its way");
        assert!(matches!(decided(&u, &s, 0, 60_000, NOW + REJOIN_GRACE_MS), Repair::FailUnit(_)));
    }

    #[test]
    fn a_member_its_live_node_does_not_run_is_found_then_lost() {
        let u = unit("u", 3, UnitState::Running, &[("head", "n1")]);
        let head = &u.members[0];
        let running = v1::WorkloadStatus {
            app: "a".into(),
            unit: "u".into(),
            member: "head".into(),
            generation: 3,
            ..Default::default()
        };
        let with = |workloads: Vec<v1::WorkloadStatus>, status| {
            crate::testing::slots(
                [NodeRecord { status, workloads: Arc::new(workloads), ..crate::testing::node("n1") }],
                true,
            )
        };
        assert!(!runs_nowhere("u", 3, head, node_of(head, &with(vec![running.clone()], NodeStatus::Alive)), NOW));
        let stale = v1::WorkloadStatus { generation: 2, ..running };
        assert!(
            runs_nowhere("u", 3, head, node_of(head, &with(vec![stale], NodeStatus::Alive)), NOW),
            "another generation is not it"
        );
        assert!(runs_nowhere("u", 3, head, node_of(head, &with(vec![], NodeStatus::Alive)), NOW));
        assert!(
            !runs_nowhere("u", 3, head, node_of(head, &with(vec![], NodeStatus::Suspect)), NOW),
            "liveness decides there"
        );
        assert!(
            !runs_nowhere("u", 3, head, node_of(head, &with(vec![], NodeStatus::Alive)), 1 + REJOIN_GRACE_MS - 1),
            "a young shard"
        );
        let mut gone = u.clone();
        gone.members[0].state = Some(MISSING.into());
        assert!(matches!(decided(&gone, &with(vec![], NodeStatus::Alive), 0, 60_000, NOW), Repair::FailUnit(_)));
    }

    #[test]
    fn a_lost_head_fails_the_unit_a_lost_worker_only_itself() {
        let u = unit("u", 1, UnitState::Running, &[("head", "n1"), ("worker-0", "n2"), ("worker-1", "n3")]);
        let s = slots(&[("n1", NodeStatus::Dead, 1, 1000), ("n2", NodeStatus::Alive, 1, 1000)], true);
        assert!(matches!(decided(&u, &s, 0, 60_000, NOW), Repair::FailUnit(_)));
        let s = slots(
            &[
                ("n1", NodeStatus::Alive, 1, 1000),
                ("n2", NodeStatus::Draining, 1, 1000),
                ("n3", NodeStatus::Alive, 2, 1000),
            ],
            true,
        );
        assert_eq!(
            decided(&u, &s, 0, 60_000, NOW),
            Repair::ReplaceWorkers(vec!["worker-0".into(), "worker-1".into()]),
            "draining, and restarted"
        );
        let s = slots(
            &[
                ("n1", NodeStatus::Suspect, 1, 1000),
                ("n2", NodeStatus::Alive, 1, 1000),
                ("n3", NodeStatus::Alive, 1, 1000),
            ],
            true,
        );
        assert_eq!(decided(&u, &s, 0, 60_000, NOW), Repair::Nothing, "suspect is not lost");
    }

    #[test]
    fn unknown_is_not_dead_until_the_grace_expires() {
        let u = unit("u", 1, UnitState::Running, &[("head", "n1")]);
        let s = slots(&[("n1", NodeStatus::Alive, 1, 1000)], false);
        assert_eq!(decided(&u, &s, 5_000, 60_000, NOW), Repair::Wait);
        assert!(matches!(decided(&u, &s, 60_000, 60_000, NOW), Repair::FailUnit(_)));
        let s = slots(&[("n1", NodeStatus::Unknown, 1, 1000)], true);
        assert_eq!(decided(&u, &s, 0, 60_000, NOW), Repair::Wait);
    }

    #[test]
    fn scale_in_takes_the_least_healthy_then_the_youngest() {
        let s = slots(
            &[
                ("n1", NodeStatus::Alive, 1, 1000),
                ("n2", NodeStatus::Alive, 1, 400),
                ("n3", NodeStatus::Alive, 1, 1000),
            ],
            true,
        );
        let old = unit("old", 1, UnitState::Running, &[("head", "n1")]);
        let young = unit("young", 5, UnitState::Running, &[("head", "n3")]);
        let sick = unit("sick", 2, UnitState::Running, &[("head", "n2")]);
        let starting = unit("starting", 3, UnitState::Starting, &[("head", "n1")]);
        let all = [&old, &young, &sick, &starting];
        assert_eq!(scale_in_order(&all, 1, &s), vec!["starting"]);
        assert_eq!(scale_in_order(&all, 2, &s), vec!["starting", "sick"]);
        assert_eq!(scale_in_order(&all, 3, &s), vec!["starting", "sick", "young"]);
    }

    /// Issue #34 item 4: a pool that grew shrinks again when scale-in removes the units on
    /// nodes it would rather free (spot) before the older ones on nodes it keeps anyway.
    #[test]
    fn scale_in_takes_units_off_the_nodes_the_pool_would_free_first() {
        use flotilla_core::unit_shape::{POOL_COST, POOL_KEEPS};
        let pooled = |id: &str, keeps: &str| {
            let mut labels = flotilla_core::Labels::new();
            labels.insert(POOL_KEEPS, keeps).unwrap();
            labels.insert(POOL_COST, "60").unwrap();
            NodeRecord { health_millis: 1000, labels: Arc::new(labels), ..crate::testing::node(id) }
        };
        let s = crate::testing::slots([pooled("min", "true"), pooled("spot", "false")], true);
        let on_spot = unit("on-spot", 1, UnitState::Running, &[("head", "spot")]);
        let on_min = unit("on-min", 2, UnitState::Running, &[("head", "min")]);
        assert_eq!(scale_in_order(&[&on_spot, &on_min], 1, &s), vec!["on-spot"], "not the youngest: the one on spot");
    }
}
