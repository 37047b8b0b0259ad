use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::limits::{
    MAX_CUSTOM_QUANTITY, MAX_CUSTOM_RESOURCES, MAX_LABEL_KEY_LEN, MAX_NODE_CPU_MILLIS, MAX_NODE_GPUS,
    MAX_NODE_MEMORY_BYTES,
};

/// The custom resource an agent offers as its artifact cache's cap, in bytes. Members never
/// ask for it (they share what is cached); the control plane reads it to refuse at apply
/// time an app whose artifacts no node it may use could hold.
pub const ARTIFACT_CACHE_RESOURCE: &str = "artifact-cache";
/// The agent's default `--artifact-cache`, and what a pool's node type offers when it does
/// not say.
pub const DEFAULT_ARTIFACT_CACHE: u64 = 20 << 30;

/// A small dense resource vector. The three common dimensions are fields so that a
/// fit test is a handful of comparisons; rare custom resources live in a sorted map
/// that is empty (and allocation-free) on most nodes.
///
/// In JSON a dimension left out is zero (`{"cpu_millis": 500}` asks for CPU only).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(default)]
pub struct Resources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub gpu: u32,
    #[serde(flatten)]
    pub custom: BTreeMap<String, u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResourceError {
    #[error("resource arithmetic overflowed in {0}")]
    Overflow(&'static str),
    #[error("resource arithmetic underflowed in {0}")]
    Underflow(&'static str),
    #[error("{field} = {value} exceeds the limit of {limit}")]
    TooLarge { field: String, value: u64, limit: u64 },
    #[error("too many custom resources: {0} (at most {MAX_CUSTOM_RESOURCES})")]
    TooManyCustom(usize),
    #[error("custom resource name {0:?} is empty, too long or has characters other than [a-z0-9_.-]")]
    BadCustomName(String),
}

impl Resources {
    pub fn new(cpu_millis: u64, memory_bytes: u64, gpu: u32) -> Self {
        Resources { cpu_millis, memory_bytes, gpu, custom: BTreeMap::new() }
    }

    pub fn is_zero(&self) -> bool {
        self.cpu_millis == 0 && self.memory_bytes == 0 && self.gpu == 0 && self.custom.values().all(|v| *v == 0)
    }

    /// True when `self` (a request) fits into `available`, in one pass.
    pub fn fits_in(&self, available: &Resources) -> bool {
        self.cpu_millis <= available.cpu_millis
            && self.memory_bytes <= available.memory_bytes
            && self.gpu <= available.gpu
            && self.custom.iter().all(|(k, v)| *v == 0 || available.custom.get(k).is_some_and(|a| v <= a))
    }

    pub fn checked_add(&self, other: &Resources) -> Result<Resources, ResourceError> {
        let mut out = self.clone();
        out.cpu_millis = out.cpu_millis.checked_add(other.cpu_millis).ok_or(ResourceError::Overflow("cpu_millis"))?;
        out.memory_bytes =
            out.memory_bytes.checked_add(other.memory_bytes).ok_or(ResourceError::Overflow("memory_bytes"))?;
        out.gpu = out.gpu.checked_add(other.gpu).ok_or(ResourceError::Overflow("gpu"))?;
        // Custom maps hold no zero entries, so equal amounts compare equal.
        for (k, v) in other.custom.iter().filter(|(_, v)| **v > 0) {
            let slot = out.custom.entry(k.clone()).or_insert(0);
            *slot = slot.checked_add(*v).ok_or(ResourceError::Overflow("custom"))?;
        }
        Ok(out)
    }

    /// `self - other`, failing rather than wrapping when `other` does not fit.
    pub fn checked_sub(&self, other: &Resources) -> Result<Resources, ResourceError> {
        let mut out = self.clone();
        out.cpu_millis = out.cpu_millis.checked_sub(other.cpu_millis).ok_or(ResourceError::Underflow("cpu_millis"))?;
        out.memory_bytes =
            out.memory_bytes.checked_sub(other.memory_bytes).ok_or(ResourceError::Underflow("memory_bytes"))?;
        out.gpu = out.gpu.checked_sub(other.gpu).ok_or(ResourceError::Underflow("gpu"))?;
        for (k, v) in &other.custom {
            if *v == 0 {
                continue;
            }
            let slot = out.custom.get_mut(k).ok_or(ResourceError::Underflow("custom"))?;
            *slot = slot.checked_sub(*v).ok_or(ResourceError::Underflow("custom"))?;
            if *slot == 0 {
                out.custom.remove(k);
            }
        }
        Ok(out)
    }

    /// Rejects capacities no real node has, so an agent cannot claim the world.
    pub fn validate_node_capacity(&self) -> Result<(), ResourceError> {
        let too_large = |field: &str, value: u64, limit: u64| {
            if value > limit { Err(ResourceError::TooLarge { field: field.to_string(), value, limit }) } else { Ok(()) }
        };
        too_large("cpu_millis", self.cpu_millis, MAX_NODE_CPU_MILLIS)?;
        too_large("memory_bytes", self.memory_bytes, MAX_NODE_MEMORY_BYTES)?;
        too_large("gpu", u64::from(self.gpu), u64::from(MAX_NODE_GPUS))?;
        if self.custom.len() > MAX_CUSTOM_RESOURCES {
            return Err(ResourceError::TooManyCustom(self.custom.len()));
        }
        for (k, v) in &self.custom {
            let ok = !k.is_empty()
                && k.len() <= MAX_LABEL_KEY_LEN
                && k.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b))
                && !matches!(k.as_str(), "cpu_millis" | "memory_bytes" | "gpu");
            if !ok {
                return Err(ResourceError::BadCustomName(k.clone()));
            }
            too_large(k, *v, MAX_CUSTOM_QUANTITY)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(cpu: u64, mem: u64, gpu: u32) -> Resources {
        Resources::new(cpu, mem, gpu)
    }

    #[test]
    fn fit_checks_every_dimension() {
        let node = r(4000, 8 << 30, 1);
        assert!(r(4000, 8 << 30, 1).fits_in(&node));
        assert!(!r(4001, 1, 0).fits_in(&node));
        assert!(!r(1, (8 << 30) + 1, 0).fits_in(&node));
        assert!(!r(1, 1, 2).fits_in(&node));
        let mut want = r(1, 1, 0);
        want.custom.insert("tpu".into(), 1);
        assert!(!want.fits_in(&node), "a custom resource the node lacks does not fit");
        let mut node2 = node.clone();
        node2.custom.insert("tpu".into(), 4);
        assert!(want.fits_in(&node2));
    }

    #[test]
    fn arithmetic_is_checked() {
        assert_eq!(r(1, 1, 1).checked_sub(&r(2, 0, 0)), Err(ResourceError::Underflow("cpu_millis")));
        assert_eq!(r(u64::MAX, 0, 0).checked_add(&r(1, 0, 0)), Err(ResourceError::Overflow("cpu_millis")));
        let mut a = r(0, 0, 0);
        a.custom.insert("x".into(), 1);
        assert!(r(0, 0, 0).checked_sub(&a).is_err());
        assert_eq!(r(5, 5, 5).checked_sub(&r(2, 3, 4)), Ok(r(3, 2, 1)));
    }

    #[test]
    fn custom_amounts_leave_no_zero_entries_behind() {
        // A node's allocation after a claim with a custom resource comes and goes must
        // equal the sum of what it holds (nothing): the ledger's invariant compares them.
        let mut claim = r(1, 1, 0);
        claim.custom.insert("fpga".into(), 2);
        claim.custom.insert("none".into(), 0);
        let held = r(0, 0, 0).checked_add(&claim).unwrap();
        assert_eq!(held.custom.len(), 1, "a zero amount adds no entry: {held:?}");
        assert_eq!(held.checked_sub(&claim), Ok(r(0, 0, 0)));
    }

    #[test]
    fn capacity_bounds_are_enforced() {
        assert!(r(8000, 1 << 34, 1).validate_node_capacity().is_ok());
        assert!(r(MAX_NODE_CPU_MILLIS + 1, 0, 0).validate_node_capacity().is_err());
        let mut bad = r(1, 1, 0);
        bad.custom.insert("Bad Name".into(), 1);
        assert!(matches!(bad.validate_node_capacity(), Err(ResourceError::BadCustomName(_))));
    }

    proptest! {
        #[test]
        fn add_then_sub_round_trips(a in 0u64..1<<40, b in 0u64..1<<40, c in 0u32..1000, d in 0u64..1<<40, e in 0u64..1<<40, f in 0u32..1000, g in 0u64..3, h in 0u64..3) {
            let mut x = r(a, b, c);
            let mut y = r(d, e, f);
            if g > 0 { x.custom.insert("fpga".into(), g); }
            y.custom.insert("fpga".into(), h);
            let sum = x.checked_add(&y).unwrap();
            prop_assert!(y.fits_in(&sum));
            prop_assert_eq!(sum.checked_sub(&y).unwrap(), x);
        }
    }
}
