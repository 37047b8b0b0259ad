//! The metric families of the node pool autoscaler (its part of the catalogue,
//! docs/metrics.md). Call sites use these names, so a family cannot drift from its
//! description.

use flotilla_obs::{Family, buckets};

pub const PASSES: Family = Family::counter(
    "flotilla_pool_passes_total",
    "Pool autoscaler passes, by outcome (ok or error).",
    &["pool", "outcome"],
);
pub const PASS_SECONDS: Family = Family::histogram(
    "flotilla_pool_pass_seconds",
    "Time one pool autoscaler pass takes, provider calls included, in seconds.",
    &["pool"],
    buckets::SECONDS,
);
pub const DECISION_SECONDS: Family = Family::histogram(
    "flotilla_pool_decision_seconds",
    "Time the pool autoscaler takes to decide what to launch and terminate, in seconds.",
    &["pool"],
    buckets::SECONDS,
);
pub const PACKED_NODES: Family = Family::gauge(
    "flotilla_pool_packed_nodes",
    "Nodes the last pass weighed: `packed` one by one, or `left_out` and counted (busy or full, or twins of \
     packed ones past what the demand can fill: they matter to the plan only by their number).",
    &["pool", "kind"],
);
pub const LAUNCHES: Family = Family::counter(
    "flotilla_pool_launches_total",
    "Instances queued for launch, by node type.",
    &["pool", "node_type"],
);
pub const LAUNCH_FAILURES: Family = Family::counter(
    "flotilla_pool_launch_failures_total",
    "Instance launches the provider failed, by node type.",
    &["pool", "node_type"],
);
pub const TYPE_UNAVAILABLE: Family = Family::gauge(
    "flotilla_pool_node_type_unavailable",
    "1 while a node type cannot be had (its launches failed, an instance never appeared or its agent never \
     joined): nothing more of it launches and its demand goes to other types, until its back-off ends.",
    &["pool", "node_type"],
);
pub const WARM_INSTANCES: Family = Family::gauge(
    "flotilla_pool_warm_instances",
    "Instances held warm: launched, registered, cordoned and holding nothing until demand claims them.",
    &["pool", "node_type"],
);
pub const WARM_CLAIMS: Family = Family::counter(
    "flotilla_pool_warm_claims_total",
    "Warm instances claimed for pending demand (uncordoned instead of launched).",
    &["pool", "node_type"],
);
pub const CONSOLIDATIONS: Family = Family::counter(
    "flotilla_pool_consolidations_total",
    "Consolidations: nodes the pool empties because their members fit elsewhere, by outcome (started; done, \
     the node terminated; given_up, its members did not move within the deadline or it was uncordoned).",
    &["pool", "outcome"],
);
pub const TERMINATIONS: Family = Family::counter(
    "flotilla_pool_terminations_total",
    "Instances the pool autoscaler terminated, by node type and cause.",
    &["pool", "node_type", "cause"],
);
pub const INSTANCES: Family = Family::gauge(
    "flotilla_pool_instances",
    "Pool instances, by node type and state.",
    &["pool", "node_type", "state"],
);
pub const INSTANCE_TRANSITIONS: Family = Family::counter(
    "flotilla_pool_instance_transitions_total",
    "Pool instance state changes, by from and to state.",
    &["from", "to"],
);
pub const PROVIDER_CALLS: Family = Family::counter(
    "flotilla_pool_provider_calls_total",
    "Calls to the instance provider, by provider, operation and outcome.",
    &["provider", "op", "outcome"],
);
pub const PROVIDER_CALL_SECONDS: Family = Family::histogram(
    "flotilla_pool_provider_call_seconds",
    "Time one instance provider call takes, in seconds.",
    &["provider", "op"],
    buckets::SECONDS,
);

pub const STORE_ERRORS: Family = Family::counter(
    "flotilla_pool_store_errors_total",
    "Failed operations of the pool's instance store (a load, a save, a remove, a reopen), by op.",
    &["pool", "op"],
);
pub const STORE_REOPENS: Family = Family::counter(
    "flotilla_pool_store_reopens_total",
    "Times the pool closed and reopened its instance store after an operation failed (with back-off), by result.",
    &["pool", "result"],
);
pub const STORE_HEALTHY: Family = Family::gauge(
    "flotilla_pool_store_healthy",
    "1 while the pool's instance store takes writes, 0 from a failed operation until a reopen succeeds.",
    &["pool"],
);

/// Every family of the pool autoscaler.
pub const FAMILIES: &[Family] = &[
    PASSES,
    PASS_SECONDS,
    DECISION_SECONDS,
    PACKED_NODES,
    LAUNCHES,
    LAUNCH_FAILURES,
    TYPE_UNAVAILABLE,
    WARM_INSTANCES,
    WARM_CLAIMS,
    CONSOLIDATIONS,
    TERMINATIONS,
    INSTANCES,
    INSTANCE_TRANSITIONS,
    PROVIDER_CALLS,
    PROVIDER_CALL_SECONDS,
    STORE_ERRORS,
    STORE_REOPENS,
    STORE_HEALTHY,
];
