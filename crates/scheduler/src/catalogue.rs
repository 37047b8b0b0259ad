//! The metric families an app's scheduler exports (its part of the catalogue,
//! docs/metrics.md). Call sites use these names, so a family cannot drift from its
//! description.

use flotilla_obs::{Family, buckets};

pub const RECONCILE_SECONDS: Family = Family::histogram(
    "flotilla_reconcile_seconds",
    "Time one reconcile pass of a scheduler takes, in seconds.",
    &[],
    buckets::SECONDS,
);
pub const VIEW_CHANGES_ROUTES_ONLY: Family = Family::counter(
    "flotilla_reconcile_view_changes_routes_only_total",
    "Wake-ups of an app's scheduler by a change of its members' nodes that only the route table reads (a health score): the table is computed again, and no pass runs.",
    &[],
);
pub const VIEW_CHANGES_IGNORED: Family = Family::counter(
    "flotilla_reconcile_view_changes_ignored_total",
    "Wake-ups of an app's scheduler by a view change it ran no pass for: the change did not alter its members' nodes' records or the shards' reachability, and no unit waited for room.",
    &[],
);
pub const RECONCILE_PASSES: Family = Family::counter(
    "flotilla_reconcile_passes_total",
    "Reconcile passes by what started them: `start`, `view` (a change that concerns the app), `command`, `lease` (one taken), `tick` (every second while anything is in flight) or `timer` (a quiet app's orphan sweep, rebalance look, autoscaler or retention; unless one of its nodes changed, such a pass runs only those steps and what they start).",
    &["cause"],
);
pub const PLAN_SECONDS: Family = Family::histogram(
    "flotilla_plan_seconds",
    "Time to plan the placement of the queued units of one pass, in seconds.",
    &[],
    buckets::SECONDS,
);
pub const SCHEDULER_COMMIT_SECONDS: Family = Family::histogram(
    "flotilla_scheduler_commit_seconds",
    "Time from sending a commit to a shard to its answer, seen by the scheduler, in seconds.",
    &[],
    buckets::SECONDS,
);
pub const PLACEMENTS: Family = Family::counter(
    "flotilla_placements_total",
    "Unit placements the scheduler tried to commit, by result (committed, conflict, unknown).",
    &["result"],
);
pub const MEMBERS_PLACED: Family = Family::counter(
    "flotilla_members_placed_total",
    "Members committed to a node (placed with their unit, healed or moved), by group and by the alternative of \
     its template each runs as (0: the template itself).",
    &["app", "group", "alternative"],
);
pub const MEMBERS_ROLLED: Family = Family::counter(
    "flotilla_members_rolled_total",
    "Members replaced alone, make before break, because their group's template changed (the unit's head and \
     other groups stayed).",
    &["app"],
);
pub const REBALANCE_MOVES: Family = Family::counter(
    "flotilla_rebalance_moves_total",
    "Units moved to a better place, make before break, by why: off a low-priority or sub-healthy node \
     (poor_node), out of a domain holding more than its share (domain), off a node holding more of the app's \
     units than another (node), off a node of a type the pool keeps no min of onto one it keeps (consolidate).",
    &["app", "reason"],
);
pub const SCHEDULER_CLAIMS: Family = Family::counter(
    "flotilla_scheduler_claims_total",
    "Member claims the shards answered, by result (accepted or conflict).",
    &["result"],
);
pub const SCHEDULER_CONFLICT_RATIO: Family = Family::gauge(
    "flotilla_scheduler_conflict_ratio",
    "Conflicting claims per accepted claim since the scheduler started (Omega's conflict fraction).",
    &["app"],
);
pub const UNITS: Family = Family::gauge("flotilla_units", "An app's units, by state.", &["app", "state"]);
pub const UNITS_REPLACED: Family = Family::counter(
    "flotilla_units_replaced_total",
    "Units replaced make-before-break, by why (node drained, preemption notice, template changed).",
    &["app", "why"],
);
pub const UNITS_FAILED: Family = Family::counter("flotilla_units_failed_total", "Units that failed.", &["app"]);
pub const REPLACEMENTS_RATE_LIMITED: Family = Family::gauge(
    "flotilla_replacements_rate_limited",
    "1 while so many units need repair at once that replacements are rate-limited (a mass failure), else 0.",
    &["app"],
);
pub const ORPHANS_RELEASED: Family = Family::counter(
    "flotilla_orphans_released_total",
    "Claims on the shards that no unit accounts for, released by the scheduler.",
    &["app"],
);
pub const ORPHAN_SWEEPS: Family = Family::counter(
    "flotilla_orphan_sweeps_total",
    "Orphan sweeps due, by whether the app's nodes were `read`, or the sweep was `unchanged`: since the last one that found nothing, neither which workloads of the app the shards' nodes run nor any unit changed.",
    &["result"],
);
pub const STORE_WRITES: Family =
    Family::counter("flotilla_store_writes_total", "Transactions written to the scheduler's durable store.", &[]);
pub const STORE_ERRORS: Family = Family::counter(
    "flotilla_store_errors_total",
    "Failed operations of the scheduler's durable store (a write, or a reopen while it is failing), by op.",
    &["op"],
);
pub const STORE_REOPENS: Family = Family::counter(
    "flotilla_store_reopens_total",
    "Times the scheduler closed and reopened its store after a write failed (with back-off), by result.",
    &["result"],
);
pub const STORE_HEALTHY: Family = Family::gauge(
    "flotilla_store_healthy",
    "1 while the scheduler's store takes writes, 0 from a failed write until a reopen succeeds.",
    &[],
);
pub const STORE_FENCED: Family = Family::counter(
    "flotilla_store_fenced_total",
    "Store writes refused because this scheduler no longer holds the app's lease (nothing was written).",
    &[],
);
pub const SCHEDULER_LEADER: Family = Family::gauge(
    "flotilla_scheduler_leader",
    "1 while this process is the app's active scheduler (holds its lease), 0 while it is a standby.",
    &["app"],
);
pub const SCHEDULER_FENCING_TOKEN: Family = Family::gauge(
    "flotilla_scheduler_fencing_token",
    "The fencing token of the lease this scheduler last held (the lease key's create revision); only grows.",
    &["app"],
);
pub const SCHEDULER_TAKEOVERS: Family = Family::counter(
    "flotilla_scheduler_takeovers_total",
    "Times this process became the app's active scheduler (took its lease), the first time included.",
    &["app"],
);
pub const SCHEDULER_LEASE_LOSSES: Family = Family::counter(
    "flotilla_scheduler_lease_losses_total",
    "Times this process lost the app's lease while active (keep-alives unanswered, key taken, write fenced).",
    &["app"],
);
pub const SCHEDULER_NOT_LEADER: Family = Family::counter(
    "flotilla_scheduler_not_leader_total",
    "Commits and releases not sent because the lease was lost since the pass began, by op.",
    &["op"],
);
pub const SPEC_APPLIED: Family =
    Family::counter("flotilla_spec_applied_total", "New app specs the scheduler accepted.", &["app"]);
pub const SPEC_ROLLBACKS: Family =
    Family::counter("flotilla_spec_rollbacks_total", "App specs rolled back to an earlier version.", &["app"]);
pub const SPEC_VERSION_CONFLICTS: Family = Family::counter(
    "flotilla_spec_version_conflicts_total",
    "Applies refused because the spec in force was no longer the version they were checked against.",
    &["app"],
);
pub const SPEC_PLANS: Family =
    Family::counter("flotilla_spec_plans_total", "Specs planned without applying them (apply --plan).", &["app"]);
pub const ROLLOUTS_FAILED: Family = Family::counter(
    "flotilla_rollouts_failed_total",
    "Rollouts that failed: a replacement was not running within the spec's rollout.progress_deadline.",
    &["app"],
);
pub const ROLLOUTS_SUPERSEDED: Family = Family::counter(
    "flotilla_rollouts_superseded_total",
    "Rollouts still in progress when a newer spec was applied (their replacements coming up are released).",
    &["app"],
);
pub const ROLLOUTS_REVERTED: Family = Family::counter(
    "flotilla_rollouts_reverted_total",
    "Failed rollouts reverted to the last spec that ran (rollout.auto_revert, or a canary that failed).",
    &["app"],
);
pub const ROLLOUT_STEP: Family = Family::gauge(
    "flotilla_rollout_step",
    "The step a canary rollout is at (1 for the first; 0 without a canary shifting traffic).",
    &["app"],
);
pub const ROLLOUT_SHARE: Family = Family::gauge(
    "flotilla_rollout_share",
    "Share of requests the routes send to the version a canary rollout tests (0 to 1).",
    &["app"],
);
pub const CANARY_VERDICTS: Family = Family::counter(
    "flotilla_rollout_canary_verdicts_total",
    "Canary steps ended, by verdict: passed, promoted (by the analysis or flotilla rollout promote), aborted (by the analysis or flotilla rollout abort).",
    &["app", "verdict"],
);
pub const TRAFFIC_REPORTS: Family = Family::counter(
    "flotilla_rollout_traffic_reports_total",
    "Routers' per-version traffic reports a scheduler received, by outcome: counted (a canary step is judged on it), ignored (no step runs) or invalid.",
    &["outcome"],
);
pub const ROUTE_WEIGHT_CHANGES: Family = Family::counter(
    "flotilla_route_weight_changes_total",
    "Route entries whose weight changed, in the tables a scheduler publishes or a router applies.",
    &["app"],
);
pub const APP_CAPACITY_WEIGHT: Family = Family::gauge(
    "flotilla_app_capacity_weight",
    "Sum of the route weights of an app's serving members (its capacity in healthy-member units).",
    &["app"],
);
pub const AUTOSCALER_DECISIONS: Family = Family::counter(
    "flotilla_autoscaler_decisions_total",
    "Autoscaling decisions, by policy kind and action.",
    &["app", "policy", "action"],
);
pub const AUTOSCALER_DESIRED_UNITS: Family =
    Family::gauge("flotilla_autoscaler_desired_units", "Units the autoscaler last asked for.", &["app"]);
pub const AUTOSCALER_ESTIMATED_UNITS: Family = Family::gauge(
    "flotilla_autoscaler_estimated_units",
    "Units the autoscaling policy estimated the demand needs, before bounds and damping.",
    &["app"],
);

/// Every family a scheduler exports.
pub const FAMILIES: &[Family] = &[
    RECONCILE_SECONDS,
    VIEW_CHANGES_IGNORED,
    VIEW_CHANGES_ROUTES_ONLY,
    RECONCILE_PASSES,
    PLAN_SECONDS,
    SCHEDULER_COMMIT_SECONDS,
    PLACEMENTS,
    MEMBERS_PLACED,
    MEMBERS_ROLLED,
    REBALANCE_MOVES,
    SCHEDULER_CLAIMS,
    SCHEDULER_CONFLICT_RATIO,
    UNITS,
    UNITS_REPLACED,
    UNITS_FAILED,
    REPLACEMENTS_RATE_LIMITED,
    ORPHANS_RELEASED,
    ORPHAN_SWEEPS,
    STORE_WRITES,
    STORE_ERRORS,
    STORE_REOPENS,
    STORE_HEALTHY,
    STORE_FENCED,
    SCHEDULER_LEADER,
    SCHEDULER_FENCING_TOKEN,
    SCHEDULER_TAKEOVERS,
    SCHEDULER_LEASE_LOSSES,
    SCHEDULER_NOT_LEADER,
    SPEC_APPLIED,
    SPEC_ROLLBACKS,
    SPEC_VERSION_CONFLICTS,
    SPEC_PLANS,
    ROLLOUTS_FAILED,
    ROLLOUTS_SUPERSEDED,
    ROLLOUTS_REVERTED,
    ROLLOUT_STEP,
    ROLLOUT_SHARE,
    CANARY_VERDICTS,
    TRAFFIC_REPORTS,
    ROUTE_WEIGHT_CHANGES,
    APP_CAPACITY_WEIGHT,
    AUTOSCALER_DECISIONS,
    AUTOSCALER_DESIRED_UNITS,
    AUTOSCALER_ESTIMATED_UNITS,
];
