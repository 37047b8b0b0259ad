//! The metric families of the view follower, in every process that follows the shards
//! (schedulers, control plane): its part of the catalogue, docs/metrics.md.

use flotilla_obs::Family;

pub const SNAPSHOTS_RECEIVED: Family = Family::counter(
    "flotilla_view_snapshots_received_total",
    "Full view snapshots received from shards (at connect, or after falling behind).",
    &[],
);

pub const FOLLOW_FAILURES: Family = Family::counter(
    "flotilla_view_follow_failures_total",
    "Failed connections or streams to a shard's view (each retried with back-off), by shard index.",
    &["shard"],
);

/// Every family of the view follower.
pub const FAMILIES: &[Family] = &[SNAPSHOTS_RECEIVED, FOLLOW_FAILURES];
