//! The metric families a node agent exports (its part of the catalogue, docs/metrics.md).
//! Call sites use these names, so a family cannot drift from its description.

use flotilla_obs::Family;

pub const HEARTBEATS_SENT: Family =
    Family::counter("flotilla_agent_heartbeats_sent_total", "Heartbeat datagrams the agent sent to its shard.", &[]);
pub const HEARTBEAT_REPLIES: Family = Family::counter(
    "flotilla_agent_heartbeat_replies_total",
    "Replies to heartbeats the agent received from its shard, by the action they ask for.",
    &["action"],
);
pub const REGISTRATIONS: Family = Family::counter(
    "flotilla_agent_registrations_total",
    "Registrations the agent attempted with its shard, by result (ok or error).",
    &["result"],
);
pub const ASSIGNMENTS: Family =
    Family::gauge("flotilla_agent_assignments", "Unit members assigned to this node by its shard.", &[]);
pub const ASSIGNMENTS_REFUSED: Family = Family::counter(
    "flotilla_agent_assignments_refused_total",
    "Assignment pushes refused because they were meant for another node.",
    &[],
);
pub const LOG_BYTES_DROPPED: Family = Family::counter(
    "flotilla_agent_log_bytes_dropped_total",
    "Bytes of workload stdout/stderr dropped because the log file could not be written (a full disk); the workload keeps running.",
    &[],
);
pub const LOG_REQUESTS: Family = Family::counter(
    "flotilla_agent_log_requests_total",
    "Requests for a member's logs the agent's shard relayed to it, by result (ok, no_member, invalid, busy).",
    &["result"],
);
pub const WARM_REQUESTS: Family = Family::counter(
    "flotilla_agent_warm_requests_total",
    "Requests to fetch artifacts ahead of need (`flotilla artifact warm`), by result (ok, invalid, no_cache).",
    &["result"],
);
pub const LOG_LINES_DROPPED: Family = Family::counter(
    "flotilla_agent_log_lines_dropped_total",
    "Lines a log follower was too slow to take, dropped so that neither the member nor the agent waits for it.",
    &[],
);
pub const LOG_READERS: Family =
    Family::gauge("flotilla_agent_log_readers", "Log requests the agent is answering now (history or follow).", &[]);
pub const FILE_WRITE_ERRORS: Family = Family::counter(
    "flotilla_agent_file_write_errors_total",
    "Failed writes of the agent's state files in its data dir (agent.pid, metrics.addr, assignments.json), by file; each is retried.",
    &["file"],
);

/// Every family a node agent exports.
pub const FAMILIES: &[Family] = &[
    HEARTBEATS_SENT,
    HEARTBEAT_REPLIES,
    REGISTRATIONS,
    ASSIGNMENTS,
    ASSIGNMENTS_REFUSED,
    LOG_BYTES_DROPPED,
    LOG_REQUESTS,
    WARM_REQUESTS,
    LOG_LINES_DROPPED,
    LOG_READERS,
    FILE_WRITE_ERRORS,
];
