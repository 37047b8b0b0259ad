//! Conversions between wire messages and core types. Decoding validates every
//! bound and names the offending field.

use flotilla_core::{HealthSample, LabelError, Labels, NodeStatus, ResourceError, Resources};

use crate::v1;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    #[error("field `{0}` is missing")]
    Missing(&'static str),
    #[error("labels: {0}")]
    Labels(#[from] LabelError),
    #[error("resources: {0}")]
    Resources(#[from] ResourceError),
    #[error("health sample field `{0}` is not a finite number in range")]
    Health(&'static str),
    #[error("unknown node status {0}")]
    Status(i32),
}

impl From<&Resources> for v1::Resources {
    fn from(r: &Resources) -> Self {
        v1::Resources {
            cpu_millis: r.cpu_millis,
            memory_bytes: r.memory_bytes,
            gpu: r.gpu,
            custom: r.custom.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        }
    }
}

impl From<v1::Resources> for Resources {
    fn from(r: v1::Resources) -> Self {
        Resources {
            cpu_millis: r.cpu_millis,
            memory_bytes: r.memory_bytes,
            gpu: r.gpu,
            custom: r.custom.into_iter().collect(),
        }
    }
}

/// Decodes a node's capacity as reported by an agent, refusing insane values.
pub fn node_capacity(r: Option<v1::Resources>) -> Result<Resources, DecodeError> {
    let r: Resources = r.ok_or(DecodeError::Missing("capacity"))?.into();
    r.validate_node_capacity()?;
    Ok(r)
}

pub fn labels(map: std::collections::HashMap<String, String>) -> Result<Labels, DecodeError> {
    Ok(Labels::from_map(map.into_iter().collect())?)
}

impl From<&HealthSample> for v1::HealthSample {
    fn from(h: &HealthSample) -> Self {
        v1::HealthSample {
            cpu_utilisation: h.cpu_utilisation,
            cpu_steal: h.cpu_steal,
            load_per_core: h.load_per_core,
            memory_pressure: h.memory_pressure,
            preemption_notice: h.preemption_notice,
            workload_latency_ms: h.workload_latency_ms,
        }
    }
}

/// Decodes a health sample; every ratio must be finite and within [0, 1] (load per
/// core within [0, 10_000], latency within an hour).
pub fn health(h: Option<v1::HealthSample>) -> Result<HealthSample, DecodeError> {
    let Some(h) = h else { return Ok(HealthSample::default()) };
    let check = |v: f32, max: f32, name: &'static str| {
        if v.is_finite() && (0.0..=max).contains(&v) { Ok(v) } else { Err(DecodeError::Health(name)) }
    };
    Ok(HealthSample {
        cpu_utilisation: check(h.cpu_utilisation, 1.0, "cpu_utilisation")?,
        cpu_steal: check(h.cpu_steal, 1.0, "cpu_steal")?,
        load_per_core: check(h.load_per_core, 10_000.0, "load_per_core")?,
        memory_pressure: check(h.memory_pressure, 1.0, "memory_pressure")?,
        preemption_notice: h.preemption_notice,
        workload_latency_ms: check(h.workload_latency_ms, 3_600_000.0, "workload_latency_ms")?,
    })
}

impl From<NodeStatus> for v1::NodeStatus {
    fn from(s: NodeStatus) -> Self {
        match s {
            NodeStatus::Alive => v1::NodeStatus::Alive,
            NodeStatus::Suspect => v1::NodeStatus::Suspect,
            NodeStatus::Draining => v1::NodeStatus::Draining,
            NodeStatus::Dead => v1::NodeStatus::Dead,
            NodeStatus::Unknown => v1::NodeStatus::Unknown,
        }
    }
}

pub fn status(raw: i32) -> Result<NodeStatus, DecodeError> {
    match v1::NodeStatus::try_from(raw) {
        Ok(v1::NodeStatus::Alive) => Ok(NodeStatus::Alive),
        Ok(v1::NodeStatus::Suspect) => Ok(NodeStatus::Suspect),
        Ok(v1::NodeStatus::Draining) => Ok(NodeStatus::Draining),
        Ok(v1::NodeStatus::Dead) => Ok(NodeStatus::Dead),
        Ok(v1::NodeStatus::Unknown) => Ok(NodeStatus::Unknown),
        _ => Err(DecodeError::Status(raw)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_ranges_are_enforced() {
        let ok = v1::HealthSample { cpu_utilisation: 0.5, load_per_core: 2.0, ..Default::default() };
        assert!(health(Some(ok)).is_ok());
        let bad = v1::HealthSample { cpu_steal: f32::NAN, ..Default::default() };
        assert_eq!(health(Some(bad)), Err(DecodeError::Health("cpu_steal")));
        let bad = v1::HealthSample { memory_pressure: 1.5, ..Default::default() };
        assert_eq!(health(Some(bad)), Err(DecodeError::Health("memory_pressure")));
    }

    #[test]
    fn capacity_must_be_present_and_sane() {
        assert_eq!(node_capacity(None), Err(DecodeError::Missing("capacity")));
        let huge = v1::Resources { cpu_millis: u64::MAX, ..Default::default() };
        assert!(matches!(node_capacity(Some(huge)), Err(DecodeError::Resources(_))));
    }

    #[test]
    fn statuses_round_trip() {
        for s in NodeStatus::ALL {
            assert_eq!(status(v1::NodeStatus::from(s) as i32), Ok(s));
        }
        assert_eq!(status(99), Err(DecodeError::Status(99)));
    }
}
