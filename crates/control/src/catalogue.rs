//! The metric families the control plane exports (its part of the catalogue,
//! docs/metrics.md). Call sites use these names, so a family cannot drift from its
//! description.

use flotilla_obs::{Family, buckets};

pub const API_REQUESTS: Family = Family::counter(
    "flotilla_api_requests_total",
    "HTTP API requests, by route template (such as /v1/apps/{app}/units).",
    &["route"],
);
pub const API_FORBIDDEN: Family = Family::counter(
    "flotilla_api_forbidden_total",
    "Calls refused because the caller's token lacks the scope they need (or is limited to other apps), by scope.",
    &["scope"],
);
pub const TOKENS: Family = Family::gauge("flotilla_api_tokens", "Named API tokens in force (the tokens file).", &[]);
pub const TOKENS_RELOADED: Family = Family::counter(
    "flotilla_api_tokens_reloaded_total",
    "Reads of the tokens file: ok (changed), unchanged, or error (the previous tokens stay).",
    &["result"],
);
pub const TOKENS_CHANGED: Family = Family::counter(
    "flotilla_api_tokens_changed_total",
    "Named tokens created or revoked through the API, by action.",
    &["action"],
);
pub const JOURNAL_RECORDED: Family = Family::counter(
    "flotilla_events_recorded_total",
    "Events kept in the history (flotilla events), by type.",
    &["type"],
);
pub const JOURNAL_KEPT: Family = Family::gauge("flotilla_events_kept", "Events the history keeps now.", &[]);
pub const JOURNAL_TRIMMED: Family = Family::counter(
    "flotilla_events_trimmed_total",
    "Events dropped from the history for its count or age bound.",
    &[],
);
pub const JOURNAL_ERRORS: Family = Family::counter(
    "flotilla_events_record_errors_total",
    "Writes of events the history's store refused (the events are lost; the state is not).",
    &[],
);
pub const CHART_SAMPLES: Family = Family::counter(
    "flotilla_chart_samples_total",
    "Samples of apps and pools kept for the history charts (every 10 s), by result.",
    &["result"],
);
pub const API_ERRORS: Family =
    Family::counter("flotilla_api_errors_total", "HTTP API error answers, by error code.", &["code"]);
pub const HTTP_REQUESTS_REJECTED: Family = Family::counter(
    "flotilla_http_requests_rejected_total",
    "HTTP requests or connections refused, by reason (rate_limited, unauthenticated, too_large, uri_too_long, header_too_large, header_timeout, body_timeout, bad_body, bad_request, bad_query, unprocessable, too_many_connections, too_many_subscribers, too_many_subscribers_from_peer, forward_loop, forward_rate_limited, host_not_allowed, write_stalled, plaintext_on_tls, tls_handshake).",
    &["reason"],
);
pub const UI_REQUESTS: Family =
    Family::counter("flotilla_ui_requests_total", "Files of the web dashboard served.", &[]);
pub const POLICIES_APPLIED: Family =
    Family::counter("flotilla_policies_applied_total", "Named autoscaling policies created or changed.", &[]);
pub const POOL_CONSTRAINTS_SET: Family = Family::counter(
    "flotilla_pool_constraints_set_total",
    "Pool resource floors (constraints) set through the API.",
    &[],
);
pub const POOL_BOUNDS_SET: Family = Family::counter(
    "flotilla_pool_bounds_set_total",
    "Changes of a node type's minimum or maximum accepted through the API.",
    &[],
);
pub const EVENTS_SUBSCRIBERS: Family =
    Family::gauge("flotilla_events_subscribers", "Open event streams (dashboards in browsers).", &[]);
pub const EVENTS_MESSAGES: Family = Family::counter(
    "flotilla_events_messages_total",
    "Event stream messages sent, by event type (a broadcast counts once).",
    &["event"],
);
pub const EVENTS_SNAPSHOTS: Family =
    Family::counter("flotilla_events_snapshots_total", "Full snapshots sent on event streams.", &[]);
pub const EVENTS_SNAPSHOT_BUILDS: Family = Family::counter(
    "flotilla_events_snapshot_builds_total",
    "Snapshot node chunks built afresh, for a subscriber or ahead of one; other snapshots resend the last build's with the changes since.",
    &[],
);
pub const EVENTS_LAGGED: Family = Family::counter(
    "flotilla_events_lagged_total",
    "Event stream subscribers that fell behind and were sent a new snapshot.",
    &[],
);
pub const EVENTS_STALLED: Family = Family::counter(
    "flotilla_events_stalled_subscribers_total",
    "Event stream subscribers dropped for reading nothing while their queue was full for 10 s (a browser that was only slow reconnects).",
    &[],
);
pub const EVENTS_TICK_SECONDS: Family = Family::histogram(
    "flotilla_events_tick_seconds",
    "Time to compute one tick of the event stream's changes, in seconds.",
    &[],
    buckets::SECONDS,
);
pub const WATCHROUTES_STREAMS: Family = Family::counter(
    "flotilla_watchroutes_streams_total",
    "WatchRoutes streams opened (routers following an app).",
    &[],
);
pub const WATCHCAPACITY_STREAMS: Family = Family::counter(
    "flotilla_watchcapacity_streams_total",
    "WatchCapacity streams opened (consumers pacing themselves by an app's capacity).",
    &[],
);

/// Every family the control plane exports.
pub const REPLICA_WRITES: Family = Family::counter(
    "flotilla_control_replica_writes_total",
    "Changes a control-plane replica put in the shared store (etcd), by kind (scheduler, policy, constraints, bounds, report) and result (ok, error).",
    &["kind", "result"],
);
pub const REPLICA_SYNCS: Family = Family::counter(
    "flotilla_control_replica_syncs_total",
    "Reloads of the shared store's copy by a control-plane replica, by result (ok, error).",
    &["result"],
);
pub const REPLICA_ENTRIES_SKIPPED: Family = Family::counter(
    "flotilla_control_replica_entries_skipped_total",
    "Entries of the shared store a control-plane replica skipped because they do not parse.",
    &[],
);

pub const SCHEDULER_REGISTRATIONS: Family = Family::counter(
    "flotilla_control_scheduler_registrations_total",
    "Registrations of a new standalone scheduler URL, by result (accepted, or refused: not allowed or not answering as the app's scheduler).",
    &["result"],
);

pub const FAMILIES: &[Family] = &[
    SCHEDULER_REGISTRATIONS,
    API_REQUESTS,
    API_ERRORS,
    API_FORBIDDEN,
    JOURNAL_RECORDED,
    JOURNAL_KEPT,
    JOURNAL_TRIMMED,
    JOURNAL_ERRORS,
    CHART_SAMPLES,
    TOKENS,
    TOKENS_RELOADED,
    TOKENS_CHANGED,
    HTTP_REQUESTS_REJECTED,
    UI_REQUESTS,
    POLICIES_APPLIED,
    POOL_CONSTRAINTS_SET,
    POOL_BOUNDS_SET,
    EVENTS_SUBSCRIBERS,
    EVENTS_MESSAGES,
    EVENTS_SNAPSHOTS,
    EVENTS_SNAPSHOT_BUILDS,
    EVENTS_LAGGED,
    EVENTS_STALLED,
    EVENTS_TICK_SECONDS,
    WATCHROUTES_STREAMS,
    WATCHCAPACITY_STREAMS,
    REPLICA_WRITES,
    REPLICA_SYNCS,
    REPLICA_ENTRIES_SKIPPED,
    ARTIFACT_PUSHES,
    ORIGIN_BYTES,
    ORIGIN_REMOTE,
    TRACKER_ANNOUNCES,
    TRACKER_SWARMS,
    TRACKER_PEERS,
    WARMS,
];

pub const ARTIFACT_PUSHES: Family = Family::counter(
    "flotilla_origin_pushes_total",
    "`flotilla artifact push` uploads to the origin, by result (ok, too_large, error).",
    &["result"],
);
pub const ORIGIN_BYTES: Family = Family::counter(
    "flotilla_origin_bytes_total",
    "Artifact bytes the origin sent to agents (and other readers): about one copy per artifact when the swarm works.",
    &[],
);
pub const ORIGIN_REMOTE: Family = Family::counter(
    "flotilla_origin_remote_requests_total",
    "Requests to the origin URL (`--artifact-origin-url`), by op (upload, read, manifest) and result (ok, missing, error).",
    &["op", "result"],
);
pub const TRACKER_ANNOUNCES: Family = Family::counter(
    "flotilla_tracker_announces_total",
    "Agents' artifact announces, by result (ok, unauthenticated: no proof of the cluster's join token, malformed).",
    &["result"],
);
pub const TRACKER_SWARMS: Family =
    Family::gauge("flotilla_tracker_swarms", "Artifacts the tracker follows now (one swarm each).", &[]);
pub const TRACKER_PEERS: Family =
    Family::gauge("flotilla_tracker_peers", "Nodes in the tracker's swarms now, over all artifacts.", &[]);
pub const WARMS: Family = Family::counter(
    "flotilla_warm_nodes_total",
    "Nodes asked to fetch an app's artifacts ahead of need (`flotilla artifact warm`), by result (asked, unreachable).",
    &["result"],
);
