//! The metric families a shard exports (its part of the catalogue, docs/metrics.md).
//! Call sites use these names, so a family cannot drift from its description.

use flotilla_obs::{Family, buckets};

pub const HEARTBEATS_RECEIVED: Family = Family::counter(
    "flotilla_heartbeats_received_total",
    "Heartbeat datagrams the shard accepted (authenticated, fresh, from a live session).",
    &["shard"],
);
pub const HEARTBEATS_ENCRYPTED: Family = Family::counter(
    "flotilla_heartbeats_encrypted_total",
    "Accepted heartbeats in the earlier, encrypted datagram format (1): agents not upgraded yet. It stays at zero once every agent sends the tagged format (2).",
    &["shard"],
);
pub const HEARTBEATS_REJECTED: Family = Family::counter(
    "flotilla_heartbeats_rejected_total",
    "Heartbeat datagrams the shard dropped, by reason (forged, replayed, unknown_session, wrong_node, dead_node, forgotten_session, empty, truncated, ...).",
    &["shard", "reason"],
);
pub const HEARTBEAT_BATCH_DATAGRAMS: Family = Family::histogram(
    "flotilla_heartbeat_batch_datagrams",
    "Heartbeat datagrams received per receive system call (at most 64).",
    &[],
    buckets::DATAGRAMS,
);
pub const NODES: Family = Family::gauge("flotilla_nodes", "Nodes each shard knows, by status.", &["shard", "status"]);
pub const VIEW_VERSION: Family =
    Family::gauge("flotilla_view_version", "The newest view version the shard published.", &["shard"]);
pub const VIEW_VERSIONS: Family =
    Family::counter("flotilla_view_versions_total", "View versions the shard published.", &["shard"]);
pub const VIEW_DELTA_NODES: Family = Family::histogram(
    "flotilla_view_delta_nodes",
    "Nodes changed per published view version.",
    &["shard"],
    buckets::COUNT,
);
pub const VIEW_APPLY_SECONDS: Family = Family::histogram(
    "flotilla_view_apply_seconds",
    "Time to apply one batch of changes and publish the view version, in seconds.",
    &["shard"],
    buckets::SECONDS,
);
pub const VIEW_BYTES_COPIED_PER_VERSION: Family = Family::histogram(
    "flotilla_view_bytes_copied_per_version",
    "Heap bytes allocated to publish one view version (structural sharing keeps it small), in bytes.",
    &["shard"],
    buckets::BYTES,
);
pub const VIEW_BYTES_COPIED: Family = Family::counter(
    "flotilla_view_bytes_copied_total",
    "Heap bytes allocated to publish view versions, in bytes.",
    &["shard"],
);
pub const HEAP_BYTES: Family =
    Family::gauge("flotilla_heap_bytes", "Heap bytes the process has allocated and not freed, in bytes.", &[]);
pub const WATCHVIEW_SUBSCRIBERS: Family =
    Family::gauge("flotilla_watchview_subscribers", "Open WatchView streams (schedulers, control planes).", &["shard"]);
pub const WATCHVIEW_RESNAPSHOTS: Family = Family::counter(
    "flotilla_watchview_resnapshots_total",
    "WatchView subscribers that fell behind the delta ring and were sent a full snapshot again.",
    &[],
);
pub const SHARD_COMMIT_SECONDS: Family = Family::histogram(
    "flotilla_shard_commit_seconds",
    "Time the shard takes to judge and apply one commit request, in seconds.",
    &[],
    buckets::SECONDS,
);
pub const LEDGER_LOCK_WAIT_SECONDS: Family = Family::histogram(
    "flotilla_ledger_lock_wait_seconds",
    "Time a ledger request (commit, reserve, confirm, release) waits for the ledger's lock, held by other requests and by the applier while it publishes a version, in seconds.",
    &[],
    buckets::SECONDS,
);
pub const CLAIMS: Family = Family::counter(
    "flotilla_claims_total",
    "Claims the shard judged, by result (accepted or the reason of the refusal).",
    &["result"],
);
pub const COMMIT_REQUESTS_REJECTED: Family = Family::counter(
    "flotilla_commit_requests_rejected_total",
    "Ledger requests refused before judging because they did not decode, by reason.",
    &["reason"],
);
pub const CORDON_CHANGES: Family =
    Family::counter("flotilla_cordon_changes_total", "Cordon, drain or uncordon requests that changed a node.", &[]);
pub const LOG_RELAYS: Family = Family::counter(
    "flotilla_shard_log_relays_total",
    "Requests for a member's logs relayed to its agent, by result (ok, no_node, no_member, busy, invalid, unavailable).",
    &["result"],
);
pub const WARM_RELAYS: Family = Family::counter(
    "flotilla_shard_warm_relays_total",
    "Requests to warm artifacts on a node, relayed to its agent, by result (ok, no_node, invalid, refused, unavailable).",
    &["result"],
);
pub const LEDGER_FENCED: Family = Family::counter(
    "flotilla_ledger_fenced_total",
    "Ledger requests refused because their fencing token was older than the app's mark (a deposed scheduler), by operation (commit, reserve, confirm, release).",
    &["op"],
);
pub const SHARD_STATE_SAVES: Family = Family::counter(
    "flotilla_shard_state_saves_total",
    "Writes of the shard's persisted state (cordons, drains, fencing marks), by result (ok or error).",
    &["result"],
);
pub const SHARD_ACTIVE: Family = Family::gauge(
    "flotilla_shard_active",
    "1 while this process serves its shard index (holds the shard's lease with --store etcd://), 0 while it waits as a standby.",
    &["shard"],
);
pub const SHARD_TAKEOVERS: Family = Family::counter(
    "flotilla_shard_takeovers_total",
    "Times this process took over its shard index after waiting for another holder's lease to lapse.",
    &["shard"],
);
pub const LEDGER_ADOPTED: Family = Family::counter(
    "flotilla_ledger_adopted_total",
    "Claims rebuilt from what agents run after a shard restart, by result (adopted or left_out).",
    &["result"],
);
pub const SHARD_RECOVERING: Family = Family::gauge(
    "flotilla_shard_recovering",
    "1 while a restarted shard waits for its agents before taking claims, else 0.",
    &["shard"],
);
pub const GRPC_REQUESTS_REJECTED: Family = Family::counter(
    "flotilla_grpc_requests_rejected_total",
    "gRPC requests refused by the token check or rate limit, by reason.",
    &["reason"],
);
pub const ASSIGNMENT_PUSHES: Family = Family::counter(
    "flotilla_assignment_pushes_total",
    "Assignment sets pushed to agents, by result (sent or no_connection).",
    &["result"],
);
pub const CONTROL_REQUESTS_REJECTED: Family = Family::counter(
    "flotilla_control_requests_rejected_total",
    "Agent control messages (QUIC) refused, by reason.",
    &["reason"],
);
pub const REGISTRATIONS: Family = Family::counter(
    "flotilla_registrations_total",
    "Agent registrations, by result (accepted or the refusal's code).",
    &["result"],
);
pub const REGISTRATIONS_REJECTED: Family = Family::counter(
    "flotilla_registrations_rejected_total",
    "Agent registrations refused, by reason (join_token, wrong_shard, stale_incarnation, ...).",
    &["reason"],
);
pub const DRAINS: Family = Family::counter("flotilla_drains_total", "Nodes that asked to drain (agent shutdown).", &[]);

/// Every family a shard exports.
pub const FAMILIES: &[Family] = &[
    HEARTBEATS_RECEIVED,
    HEARTBEATS_ENCRYPTED,
    HEARTBEATS_REJECTED,
    HEARTBEAT_BATCH_DATAGRAMS,
    NODES,
    VIEW_VERSION,
    VIEW_VERSIONS,
    VIEW_DELTA_NODES,
    VIEW_APPLY_SECONDS,
    VIEW_BYTES_COPIED_PER_VERSION,
    VIEW_BYTES_COPIED,
    HEAP_BYTES,
    WATCHVIEW_SUBSCRIBERS,
    WATCHVIEW_RESNAPSHOTS,
    SHARD_COMMIT_SECONDS,
    LEDGER_LOCK_WAIT_SECONDS,
    CLAIMS,
    COMMIT_REQUESTS_REJECTED,
    CORDON_CHANGES,
    LOG_RELAYS,
    WARM_RELAYS,
    LEDGER_FENCED,
    SHARD_STATE_SAVES,
    SHARD_ACTIVE,
    SHARD_TAKEOVERS,
    LEDGER_ADOPTED,
    SHARD_RECOVERING,
    GRPC_REQUESTS_REJECTED,
    ASSIGNMENT_PUSHES,
    CONTROL_REQUESTS_REJECTED,
    REGISTRATIONS,
    REGISTRATIONS_REJECTED,
    DRAINS,
];
