//! The metric families of the view follower, in every process that follows the shards
//! (schedulers, control plane): its part of the catalogue, docs/metrics.md.

use flotilla_obs::{Family, buckets};

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

pub const VIEW_LAG: Family = Family::histogram(
    "flotilla_view_lag_seconds",
    "Age of each view delta when it reaches this follower: from the shard's publish to its arrival here, by shard index (clocks of the two hosts must agree).",
    &["shard"],
    buckets::SECONDS,
);

/// Every family of the view follower.
pub const FAMILIES: &[Family] = &[SNAPSHOTS_RECEIVED, FOLLOW_FAILURES, VIEW_LAG];
