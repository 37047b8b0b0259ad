//! Who may call the shard's gRPC services (WatchView, LedgerService, NodeAdmin): every
//! request carries `authorization: Bearer <token>`, checked in one layer before any
//! service sees it.

use std::sync::Arc;

use tonic::{Request, Status};

/// The accepted tokens (several while one is being rotated). With none, every caller
/// is accepted: a shard that only trusted hosts can reach, as in tests.
#[derive(Clone, Default)]
pub struct GrpcAuth {
    tokens: Arc<Vec<String>>,
}

impl GrpcAuth {
    pub fn new(tokens: Vec<String>) -> Self {
        GrpcAuth { tokens: Arc::new(tokens.into_iter().filter(|t| !t.is_empty()).collect()) }
    }

    pub fn is_open(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The check, as a tonic interceptor.
    pub fn check(&self, request: Request<()>) -> Result<Request<()>, Status> {
        if self.is_open() {
            return Ok(request);
        }
        let presented = request.metadata().get("authorization").map(|v| v.to_str().map(|s| s.strip_prefix("Bearer ")));
        let refuse = |reason: &'static str, message: &str| {
            metrics::counter!("flotilla_grpc_requests_rejected_total", "reason" => reason).increment(1);
            tracing::debug!(reason, "gRPC request refused");
            Err(Status::unauthenticated(message.to_string()))
        };
        match presented {
            None => refuse("unauthenticated", "this shard needs `authorization: Bearer <token>` on every call"),
            Some(Ok(Some(token)))
                if self.tokens.iter().any(|t| flotilla_core::constant_time_eq(t.as_bytes(), token.as_bytes())) =>
            {
                Ok(request)
            }
            Some(_) => refuse("forged", "the bearer token is not one this shard accepts"),
        }
    }
}

impl tonic::service::Interceptor for GrpcAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.check(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(header: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(h) = header {
            r.metadata_mut().insert("authorization", h.parse().unwrap());
        }
        r
    }

    #[test]
    fn only_a_listed_token_passes() {
        let auth = GrpcAuth::new(vec!["old".into(), "new".into()]);
        assert!(auth.check(with(Some("Bearer new"))).is_ok());
        assert!(auth.check(with(Some("Bearer old"))).is_ok());
        let missing = auth.check(with(None)).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(missing.message().contains("Bearer"), "{}", missing.message());
        assert!(auth.check(with(Some("Bearer nope"))).is_err());
        assert!(auth.check(with(Some("new"))).is_err(), "the scheme is required");
    }

    #[test]
    fn without_tokens_everyone_passes() {
        assert!(GrpcAuth::new(vec![String::new()]).check(with(None)).is_ok());
    }
}
