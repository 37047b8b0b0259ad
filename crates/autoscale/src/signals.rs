//! What the scheduler observed for one app at one evaluation. Plain `Copy` data and a borrowed
//! slice, so building it costs nothing.

/// An amount of the two resources the policies size by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Res {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl Res {
    pub const fn new(cpu_millis: u64, memory_bytes: u64) -> Self {
        Res { cpu_millis, memory_bytes }
    }
}

/// Units of one group: `active` counts units running or requested and not being removed;
/// `decommissioning` counts units draining after a scale-down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupUnits {
    pub active: u32,
    pub decommissioning: u32,
}

/// Dataproc's YARN memory metrics, for both resources. Capacity is `allocated + available`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Load {
    /// Demand not yet placed: queued work and consumer demand. Units already counted as
    /// `active` (requested but not yet running) must not be counted here again.
    pub pending: Res,
    /// Free resources of the app's units (requested-but-unplaced units count as free).
    pub available: Res,
    /// Resources of the app's units given to work.
    pub allocated: Res,
}

/// One member's usage, for the `utilization` policy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemberUsage {
    pub used: Res,
    pub allocated: Res,
}

/// The signals of one evaluation. `None` means "no data": the policy then does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Signals<'a> {
    /// The primary group (high-priority placement); the only group for `utilization`'s scale-out.
    pub primary: GroupUnits,
    /// The secondary group (low-priority placement).
    pub secondary: GroupUnits,
    /// Resources of one unit (head or worker as the app defines a unit).
    pub per_unit: Res,
    /// Pending, available and allocated resources (`basic`; `utilization` reads `pending` only
    /// to start units when there are none).
    pub load: Option<Load>,
    /// Per-member usage (`utilization`). `Some(&[])` means no unit is running.
    pub members: Option<&'a [MemberUsage]>,
}

impl Signals<'_> {
    pub(crate) fn decommissioning(&self) -> u32 {
        self.primary.decommissioning.saturating_add(self.secondary.decommissioning)
    }
}
