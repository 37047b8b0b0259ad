//! View records on the wire. Decoding validates (the bytes came over a socket).

use std::sync::Arc;

use flotilla_core::{Incarnation, NodeId, NodeIdError};
use flotilla_proto::convert::{self, DecodeError};
use flotilla_proto::v1;

use crate::record::{Delta, NodeRecord, Version};

#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("node id: {0}")]
    NodeId(#[from] NodeIdError),
    #[error("{0}")]
    Decode(#[from] DecodeError),
    #[error("field `{0}` is missing")]
    Missing(&'static str),
}

impl From<Version> for v1::ViewVersion {
    fn from(v: Version) -> Self {
        v1::ViewVersion { epoch: v.epoch, seq: v.seq }
    }
}

impl From<v1::ViewVersion> for Version {
    fn from(v: v1::ViewVersion) -> Self {
        Version { epoch: v.epoch, seq: v.seq }
    }
}

pub fn record_to_wire(r: &NodeRecord) -> v1::NodeRecord {
    v1::NodeRecord {
        node_id: r.node_id.to_string(),
        incarnation: r.incarnation.0,
        status: v1::NodeStatus::from(r.status) as i32,
        status_since_unix_ms: r.status_since_unix_ms,
        shard: r.shard,
        labels: r.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        health: Some(v1::NodeHealth { score: r.health_score(), sample: Some((&r.health.sample()).into()) }),
        capacity: Some(r.capacity.as_ref().into()),
        allocated: Some(r.allocated.as_ref().into()),
        workloads: r.workloads.as_ref().clone(),
        cordoned: r.cordoned,
        drain_requested: r.drain_requested,
    }
}

pub fn record_from_wire(r: v1::NodeRecord) -> Result<NodeRecord, WireError> {
    let health = r.health.unwrap_or_default();
    let score = if health.score.is_finite() { health.score } else { 0.0 };
    Ok(NodeRecord {
        node_id: NodeId::new(&r.node_id)?,
        incarnation: Incarnation(r.incarnation),
        status: convert::status(r.status)?,
        status_since_unix_ms: r.status_since_unix_ms,
        shard: r.shard,
        labels: Arc::new(convert::labels(r.labels)?),
        health_millis: flotilla_core::Hysteresis::to_millis(score),
        health: convert::health(health.sample)?.into(),
        capacity: Arc::new(r.capacity.ok_or(WireError::Missing("capacity"))?.into()),
        allocated: Arc::new(r.allocated.unwrap_or_default().into()),
        workloads: Arc::new(r.workloads),
        cordoned: r.cordoned,
        drain_requested: r.drain_requested,
    })
}

pub fn delta_to_wire(d: &Delta) -> v1::ViewDelta {
    v1::ViewDelta {
        from: Some(d.from.into()),
        to: Some(d.to.into()),
        shard: d.shard,
        upserts: d.upserts.iter().map(|r| record_to_wire(r)).collect(),
        removed: d.removed.iter().map(|n| n.to_string()).collect(),
        published_unix_ms: d.published_unix_ms,
    }
}

pub fn delta_from_wire(d: v1::ViewDelta) -> Result<Delta, WireError> {
    Ok(Delta {
        shard: d.shard,
        from: d.from.ok_or(WireError::Missing("from"))?.into(),
        to: d.to.ok_or(WireError::Missing("to"))?.into(),
        upserts: d.upserts.into_iter().map(|r| record_from_wire(r).map(Arc::new)).collect::<Result<_, _>>()?,
        removed: d.removed.iter().map(|s| NodeId::new(s)).collect::<Result<_, _>>()?,
        published_unix_ms: d.published_unix_ms,
    })
}
