//! The one mapping between Flotilla's error kinds and gRPC status codes, both ways.
//!
//! A server turns any [`ServiceError`] into a `tonic::Status` with [`status`], which
//! carries the error's stable code in the `flotilla-error-code` metadata; a client reads
//! a status back with [`RemoteError::from`] and decides on its kind and code, never on
//! the message text.

use flotilla_core::{ErrorKind, ServiceError};

/// Metadata key that carries [`ServiceError::code`] next to the gRPC status.
pub const CODE_METADATA: &str = "flotilla-error-code";

/// The gRPC code for each kind of failure.
pub fn grpc_code(kind: ErrorKind) -> tonic::Code {
    match kind {
        ErrorKind::InvalidInput | ErrorKind::Malformed | ErrorKind::UnsupportedFormat => tonic::Code::InvalidArgument,
        ErrorKind::AddressTooLong => tonic::Code::OutOfRange,
        ErrorKind::TimedOut => tonic::Code::DeadlineExceeded,
        ErrorKind::Unauthenticated => tonic::Code::Unauthenticated,
        ErrorKind::Forbidden => tonic::Code::PermissionDenied,
        ErrorKind::NotFound | ErrorKind::Gone => tonic::Code::NotFound,
        ErrorKind::Conflict => tonic::Code::FailedPrecondition,
        ErrorKind::TooLarge => tonic::Code::OutOfRange,
        ErrorKind::RateLimited => tonic::Code::ResourceExhausted,
        ErrorKind::Unavailable | ErrorKind::StoreUnavailable => tonic::Code::Unavailable,
        ErrorKind::Internal => tonic::Code::Internal,
    }
}

/// The kind of failure a gRPC code stands for (codes no Flotilla server sends map to
/// the nearest kind; anything unexpected is `Unavailable`, which callers retry). The
/// kinds gRPC has no code of their own for come back as the broader kind (a malformed
/// request as `InvalidInput`); the error's code still names the exact failure.
pub fn kind_of(code: tonic::Code) -> ErrorKind {
    match code {
        tonic::Code::InvalidArgument => ErrorKind::InvalidInput,
        tonic::Code::Unauthenticated => ErrorKind::Unauthenticated,
        tonic::Code::PermissionDenied => ErrorKind::Forbidden,
        tonic::Code::NotFound => ErrorKind::NotFound,
        tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists | tonic::Code::Aborted => ErrorKind::Conflict,
        tonic::Code::OutOfRange => ErrorKind::TooLarge,
        tonic::Code::ResourceExhausted => ErrorKind::RateLimited,
        tonic::Code::Internal | tonic::Code::DataLoss | tonic::Code::Unimplemented => ErrorKind::Internal,
        _ => ErrorKind::Unavailable,
    }
}

/// A service error as a gRPC status: the code by its kind, the message, and its stable
/// code in metadata.
pub fn status<E: ServiceError + ?Sized>(e: &E) -> tonic::Status {
    let mut s = tonic::Status::new(grpc_code(e.kind()), e.to_string());
    if let Ok(v) = e.code().parse() {
        s.metadata_mut().insert(CODE_METADATA, v);
    }
    s
}

/// A failed gRPC call as the client sees it: kind, the server's stable code when it sent
/// one, and the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RemoteError {
    pub kind: ErrorKind,
    /// The server's [`ServiceError::code`], or the gRPC code's name when it sent none.
    pub code: String,
    pub message: String,
}

impl RemoteError {
    /// Whether the server refused the request before acting on it, so it certainly had
    /// no effect (as opposed to a call that may have been applied and its answer lost).
    pub fn certainly_not_applied(&self) -> bool {
        matches!(
            self.kind,
            ErrorKind::InvalidInput
                | ErrorKind::Malformed
                | ErrorKind::UnsupportedFormat
                | ErrorKind::Unauthenticated
                | ErrorKind::Forbidden
        )
    }
}

impl From<tonic::Status> for RemoteError {
    fn from(s: tonic::Status) -> Self {
        let code = s
            .metadata()
            .get(CODE_METADATA)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .unwrap_or_else(|| format!("{:?}", s.code()).to_lowercase());
        RemoteError { kind: kind_of(s.code()), code, message: s.message().to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("join token is not valid")]
    struct BadToken;

    impl ServiceError for BadToken {
        fn kind(&self) -> ErrorKind {
            ErrorKind::Unauthenticated
        }
        fn code(&self) -> &'static str {
            "join_token"
        }
    }

    #[test]
    fn a_service_error_survives_the_wire_with_its_kind_and_code() {
        let back = RemoteError::from(status(&BadToken));
        assert_eq!(back.kind, ErrorKind::Unauthenticated);
        assert_eq!(back.code, "join_token");
        assert_eq!(back.message, "join token is not valid");
        assert!(back.certainly_not_applied());
    }

    #[test]
    fn every_kind_round_trips_through_its_grpc_code_or_comes_back_as_the_broader_kind() {
        use ErrorKind::*;
        // The kinds gRPC has no code of their own for.
        let broader = |k| match k {
            Malformed | UnsupportedFormat => InvalidInput,
            AddressTooLong => TooLarge,
            TimedOut | StoreUnavailable => Unavailable,
            Gone => NotFound,
            k => k,
        };
        for k in ErrorKind::ALL {
            assert_eq!(kind_of(grpc_code(k)), broader(k), "{k:?}");
        }
    }

    #[test]
    fn a_status_without_a_code_names_its_grpc_code() {
        let back = RemoteError::from(tonic::Status::unavailable("connection refused"));
        assert_eq!((back.kind, back.code.as_str()), (ErrorKind::Unavailable, "unavailable"));
        assert!(!back.certainly_not_applied());
    }
}
