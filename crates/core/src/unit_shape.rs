//! What one unit asks of the node pool, in terms both its scheduler and the pool
//! autoscaler understand, so neither needs the other's crate.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::Resources;

/// One unit's members and where they may run: the pool autoscaler packs the queued
/// units of every app by it (all members of a unit in one domain).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UnitShape {
    /// Each member's resources, the head first.
    pub members: Vec<Resources>,
    /// Labels a node must carry.
    pub labels: BTreeMap<String, String>,
    /// Whether primary units may use low-priority nodes (secondary ones always may).
    pub allow_low_priority: bool,
}
