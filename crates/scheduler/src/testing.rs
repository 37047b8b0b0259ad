//! Builders for unit tests: node records, a one-shard view, unit records. Tests change
//! what matters to them with struct update syntax (`NodeRecord { status, ..node("n1") }`).

use std::sync::Arc;

use flotilla_core::NodeId;
use flotilla_view::{NodeRecord, ShardSlot, ShardView};

use crate::lifecycle::UnitState;
use crate::store::{MemberRecord, UnitRecord};

/// An Alive, fully healthy node of incarnation 1 with no labels and no capacity.
pub fn node(id: &str) -> NodeRecord {
    NodeRecord::blank(NodeId::new(id).unwrap())
}

/// Shard 0 (epoch 1) holding `nodes`.
pub fn slots(nodes: impl IntoIterator<Item = NodeRecord>, connected: bool) -> Vec<Arc<ShardSlot>> {
    let mut v = ShardView::empty(0, 1);
    for r in nodes {
        v.insert(Arc::new(r));
    }
    vec![Arc::new(ShardSlot::of(Arc::new(v), connected))]
}

/// A unit of app "a" in domain "d" whose `(member, node)` members run on shard 0; the
/// member named "head" has the head role.
pub fn unit(id: &str, generation: u64, state: UnitState, members: &[(&str, &str)]) -> UnitRecord {
    UnitRecord {
        unit_id: id.into(),
        app: "a".into(),
        domain: Some("d".into()),
        generation,
        state,
        members: members
            .iter()
            .map(|(member, node)| MemberRecord {
                member: member.to_string(),
                role: if *member == "head" { "head".into() } else { "worker".into() },
                node_id: Some(node.to_string()),
                incarnation: 1,
                shard: Some(0),
                address: Some(format!("{node}:80")),
                state: Some("running".into()),
                usage: None,
                ports: Default::default(),
                message: None,
                generation: None,
                alternative: 0,
                template: None,
                surged_unix_ms: None,
            })
            .collect(),
        created_unix_ms: 0,
        unplaced_reason: None,
        draining_since_unix_ms: None,
        frame: None,
        roll_waits: None,
        template: None,
        replaced_by: None,
        moving: None,
        moved_unix_ms: None,
        secondary: false,
        drain_timeout_ms: None,
        placement_note: None,
        ended_unix_ms: None,
        surge: Vec::new(),
    }
}
