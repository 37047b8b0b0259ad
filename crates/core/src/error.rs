//! What kind of failure an error is, independent of the protocol that carries it.
//!
//! Every service error (a refused registration, a claim, an API call) implements
//! [`ServiceError`]: its [`ErrorKind`] decides the gRPC code (in `flotilla-proto`) and the
//! HTTP status (in `flotilla-control`), each mapped in one place, and its `code()` is the
//! stable machine-readable name clients branch on. Nobody decides anything by reading an
//! error's message.

/// The protocol-independent class of a failure: what the caller should do about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request itself is wrong (a bad spec, a value out of range): fix it, do not retry.
    InvalidInput,
    /// The request cannot be read at all (not the format expected, a body that broke
    /// off, plain HTTP to a TLS port): fix it, do not retry.
    Malformed,
    /// The request's address (its path and query) is past its limit.
    AddressTooLong,
    /// The request is in a format the service does not take (a body that is not JSON).
    UnsupportedFormat,
    /// The caller did not send its whole request in time.
    TimedOut,
    /// No credential, or a credential that is not valid.
    Unauthenticated,
    /// A valid credential that does not allow this (a token without the scope, or
    /// limited to other apps).
    Forbidden,
    /// The named thing does not exist.
    NotFound,
    /// The named thing existed and is gone for good (a node that left): asking again
    /// will not help.
    Gone,
    /// The request is valid but conflicts with the current state (wrong shard, stale
    /// incarnation, already placed).
    Conflict,
    /// A body, message or count past its limit.
    TooLarge,
    /// The caller sent too much too fast: retry after a while.
    RateLimited,
    /// A dependency (a shard, a scheduler) cannot be reached or is not ready: retry.
    Unavailable,
    /// This service cannot write now: its store refuses writes (a full disk, etcd
    /// without a quorum) or it does not hold the lease to (a standby). Nothing changed;
    /// the same request works once the store is back, or on the active instance.
    StoreUnavailable,
    /// Something failed on our side (a store write): not the caller's fault.
    Internal,
}

impl ErrorKind {
    /// Every kind, for the mappings' tests.
    pub const ALL: [ErrorKind; 15] = [
        ErrorKind::InvalidInput,
        ErrorKind::Malformed,
        ErrorKind::AddressTooLong,
        ErrorKind::UnsupportedFormat,
        ErrorKind::TimedOut,
        ErrorKind::Unauthenticated,
        ErrorKind::Forbidden,
        ErrorKind::NotFound,
        ErrorKind::Gone,
        ErrorKind::Conflict,
        ErrorKind::TooLarge,
        ErrorKind::RateLimited,
        ErrorKind::Unavailable,
        ErrorKind::StoreUnavailable,
        ErrorKind::Internal,
    ];

    /// Whether the same request may succeed later without change.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorKind::RateLimited | ErrorKind::Unavailable | ErrorKind::StoreUnavailable | ErrorKind::Internal
        )
    }
}

/// An error that crosses a service boundary.
pub trait ServiceError: std::error::Error {
    fn kind(&self) -> ErrorKind;
    /// A stable snake_case name for the exact failure (`join_token`, `no_such_app`).
    fn code(&self) -> &'static str;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_transient_kinds_are_retryable() {
        assert!(ErrorKind::Unavailable.is_retryable());
        assert!(ErrorKind::RateLimited.is_retryable());
        assert!(ErrorKind::StoreUnavailable.is_retryable());
        assert!(!ErrorKind::Malformed.is_retryable());
        assert!(!ErrorKind::InvalidInput.is_retryable());
        assert!(!ErrorKind::Unauthenticated.is_retryable());
    }
}
