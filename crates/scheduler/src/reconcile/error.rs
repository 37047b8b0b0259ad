//! The scheduler's answers to the control plane when it cannot do what was asked.

use flotilla_core::{ErrorKind, ServiceError};

/// The code of a change the store could not record (`ErrorKind::StoreUnavailable`).
pub const STORE_UNAVAILABLE: &str = "store_unavailable";

/// Why the scheduler refused or could not carry out a request of the control plane.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CommandError {
    #[error("units must be within {min}..={max} for app {app} (asked for {asked})")]
    OutOfRange { app: String, min: u32, max: u32, asked: u32 },
    #[error("the spec names app {got:?}, not {app:?}")]
    WrongApp { app: String, got: String },
    #[error("{0}")]
    InvalidSpec(String),
    #[error("{0}")]
    InvalidDemand(String),
    /// Floor and ceiling of an override must be within the spec's bounds, floor ≤ ceiling.
    #[error("{0}")]
    InvalidOverride(String),
    /// The store refused the write (a full disk): nothing changed, it is not the
    /// caller's fault, and the same request works once the store is back (503).
    #[error("cannot record the change: {0}")]
    Store(String),
    /// A rollback with no earlier spec to go back to.
    #[error("app {0} has no previous spec to roll back to")]
    NoPreviousSpec(String),
    /// `apply --check-version V` when the spec in force is no longer version V.
    #[error("app {app}: the spec in force is version {in_force}, not {expected}: someone applied since you read it")]
    VersionConflict { app: String, in_force: u64, expected: u64 },
    /// A rollback to a version that is not (or no longer) kept.
    #[error("app {app} has no version {version} (kept: {kept})")]
    NoSuchVersion { app: String, version: u64, kept: String },
    /// A rollback to the version already in force.
    #[error("app {app}: version {version} is the one in force")]
    AlreadyInForce { app: String, version: u64 },
    /// `rollout promote|abort` with no canary shifting traffic.
    #[error("app {0} has no canary rollout in progress")]
    NoCanary(String),
    #[error("the scheduler stopped")]
    Stopped,
    /// This process is a standby (or lost its lease): the active scheduler takes
    /// changes (503 `not_leader` from this one's API; the control plane follows the active one).
    #[error("this scheduler is not the app's active one: {0}")]
    NotLeader(String),
}

impl ServiceError for CommandError {
    fn kind(&self) -> ErrorKind {
        match self {
            CommandError::OutOfRange { .. }
            | CommandError::WrongApp { .. }
            | CommandError::InvalidSpec(_)
            | CommandError::InvalidDemand(_)
            | CommandError::InvalidOverride(_) => ErrorKind::InvalidInput,
            CommandError::NoPreviousSpec(_)
            | CommandError::VersionConflict { .. }
            | CommandError::AlreadyInForce { .. }
            | CommandError::NoCanary(_) => ErrorKind::Conflict,
            CommandError::NoSuchVersion { .. } => ErrorKind::NotFound,
            // A standby (or a scheduler that lost its lease to an etcd outage) takes no
            // change now; the active one does, or this one once it holds the lease.
            CommandError::Store(_) | CommandError::NotLeader(_) => ErrorKind::StoreUnavailable,
            CommandError::Stopped => ErrorKind::Unavailable,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            CommandError::OutOfRange { .. } => "out_of_range",
            CommandError::WrongApp { .. } => "wrong_app",
            CommandError::InvalidSpec(_) => "invalid_spec",
            CommandError::InvalidDemand(_) => "invalid_demand",
            CommandError::InvalidOverride(_) => "invalid_override",
            CommandError::NoPreviousSpec(_) => "no_previous_spec",
            CommandError::VersionConflict { .. } => "version_conflict",
            CommandError::NoSuchVersion { .. } => "no_such_version",
            CommandError::AlreadyInForce { .. } => "already_in_force",
            CommandError::NoCanary(_) => "no_canary",
            CommandError::Store(_) => STORE_UNAVAILABLE,
            CommandError::Stopped => "scheduler_stopped",
            CommandError::NotLeader(_) => "not_leader",
        }
    }
}
