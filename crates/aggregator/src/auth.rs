//! Who may call the shard's gRPC services (WatchView, LedgerService, NodeAdmin), and how
//! often: every request carries `authorization: Bearer <token>` and counts against its
//! peer's rate, both checked in one layer before any service sees it.

use crate::catalogue as m;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use flotilla_core::{ErrorKind, RateLimiter, ServiceError};
use flotilla_proto::status::status;
use tonic::{Request, Status};

/// The accepted tokens (several while one is being rotated; clones share them) and the
/// per-peer rate. With no token, every caller is accepted: a shard that only trusted
/// hosts can reach, as in tests.
#[derive(Clone, Default)]
pub struct GrpcAuth {
    tokens: Arc<ArcSwap<Vec<String>>>,
    limiter: Option<Arc<RateLimiter>>,
}

/// Why a gRPC request was refused before any service saw it. The code is also the
/// `flotilla_grpc_requests_rejected_total` reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrpcRefusal {
    #[error("more than {per_second} requests per second from {peer}: retry in {retry_ms} ms")]
    RateLimited { per_second: u32, peer: IpAddr, retry_ms: u128 },
    #[error("this shard needs `authorization: Bearer <token>` on every call")]
    NoToken,
    #[error("the bearer token is not one this shard accepts")]
    Forged,
}

impl ServiceError for GrpcRefusal {
    fn kind(&self) -> ErrorKind {
        match self {
            GrpcRefusal::RateLimited { .. } => ErrorKind::RateLimited,
            GrpcRefusal::NoToken | GrpcRefusal::Forged => ErrorKind::Unauthenticated,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            GrpcRefusal::RateLimited { .. } => "rate_limited",
            GrpcRefusal::NoToken => "unauthenticated",
            GrpcRefusal::Forged => "forged",
        }
    }
}

impl GrpcAuth {
    /// `per_peer_per_second` 0: no rate limit.
    pub fn new(tokens: Vec<String>, per_peer_per_second: u32) -> Self {
        let auth =
            GrpcAuth { tokens: Default::default(), limiter: RateLimiter::new(per_peer_per_second).map(Arc::new) };
        auth.set_tokens(tokens);
        auth
    }

    /// Replaces the accepted tokens (a rotation); calls in flight keep the old answer.
    pub fn set_tokens(&self, tokens: Vec<String>) {
        self.tokens.store(Arc::new(tokens.into_iter().filter(|t| !t.is_empty()).collect()));
    }

    pub fn tokens(&self) -> Arc<Vec<String>> {
        self.tokens.load_full()
    }

    pub fn is_open(&self) -> bool {
        self.tokens.load().is_empty()
    }

    /// The check: the peer's rate, then its token. A refusal is counted here.
    pub fn check(&self, request: &Request<()>) -> Result<(), GrpcRefusal> {
        let verdict = self.judge(request);
        if let Err(e) = &verdict {
            metrics::counter!(m::GRPC_REQUESTS_REJECTED.name, "reason" => e.code()).increment(1);
            tracing::debug!(reason = e.code(), "gRPC request refused");
        }
        verdict
    }

    fn judge(&self, request: &Request<()>) -> Result<(), GrpcRefusal> {
        if let (Some(limiter), Some(peer)) = (&self.limiter, request.remote_addr())
            && let Err(wait) = limiter.check(peer.ip(), Instant::now())
        {
            return Err(GrpcRefusal::RateLimited {
                per_second: limiter.per_second(),
                peer: peer.ip(),
                retry_ms: wait.as_millis().max(1),
            });
        }
        if self.is_open() {
            return Ok(());
        }
        let presented = request.metadata().get("authorization").map(|v| v.to_str().map(flotilla_core::bearer_token));
        match presented {
            None => Err(GrpcRefusal::NoToken),
            Some(Ok(Some(token)))
                if self
                    .tokens
                    .load()
                    .iter()
                    .any(|t| flotilla_core::constant_time_eq(t.as_bytes(), token.as_bytes())) =>
            {
                Ok(())
            }
            Some(_) => Err(GrpcRefusal::Forged),
        }
    }
}

/// The check as a tonic interceptor: its signature wants a `Status`, built by the one mapping.
impl tonic::service::Interceptor for GrpcAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        self.check(&request).map_err(|e| status(&e))?;
        Ok(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::service::Interceptor;

    fn with(header: Option<&str>) -> Request<()> {
        let mut r = Request::new(());
        if let Some(h) = header {
            r.metadata_mut().insert("authorization", h.parse().unwrap());
        }
        r
    }

    #[test]
    fn only_a_listed_token_passes() {
        let auth = GrpcAuth::new(vec!["old".into(), "new".into()], 0);
        assert!(auth.check(&with(Some("Bearer new"))).is_ok());
        assert!(auth.check(&with(Some("Bearer old"))).is_ok());
        // RFC 7235: the scheme is case-insensitive.
        assert!(auth.check(&with(Some("bearer new"))).is_ok());
        assert!(auth.check(&with(Some("BEARER new"))).is_ok());
        assert_eq!(auth.check(&with(None)), Err(GrpcRefusal::NoToken));
        let missing = auth.clone().call(with(None)).unwrap_err();
        assert_eq!(missing.code(), tonic::Code::Unauthenticated);
        assert!(missing.message().contains("Bearer"), "{}", missing.message());
        assert_eq!(auth.check(&with(Some("Bearer nope"))), Err(GrpcRefusal::Forged));
        assert_eq!(auth.check(&with(Some("new"))), Err(GrpcRefusal::Forged), "the scheme is required");
        assert_eq!(auth.clone().call(with(Some("new"))).unwrap_err().code(), tonic::Code::Unauthenticated);
        // Rotated: the old token is retired, a clone (the serving layer's) sees it at once.
        auth.clone().set_tokens(vec!["new".into()]);
        assert!(auth.check(&with(Some("Bearer old"))).is_err());
        assert!(auth.check(&with(Some("Bearer new"))).is_ok());
    }

    #[test]
    fn without_tokens_everyone_passes() {
        assert!(GrpcAuth::new(vec![String::new()], 0).check(&with(None)).is_ok());
    }

    #[test]
    fn a_peer_past_its_rate_is_told_when_to_retry() {
        let auth = GrpcAuth::new(vec![], 1);
        let from = |peer: &str| {
            let mut r = Request::new(());
            r.extensions_mut().insert(tonic::transport::server::TcpConnectInfo {
                local_addr: None,
                remote_addr: Some(peer.parse().unwrap()),
            });
            r
        };
        assert!(auth.check(&from("10.0.0.1:5000")).is_ok());
        assert!(auth.check(&from("10.0.0.1:5001")).is_ok(), "a burst of twice the rate");
        let e = auth.clone().call(from("10.0.0.1:5002")).unwrap_err();
        assert_eq!(e.code(), tonic::Code::ResourceExhausted);
        assert!(e.message().contains("retry in"), "{}", e.message());
        assert_eq!(flotilla_proto::status::RemoteError::from(e).code, "rate_limited");
        assert!(auth.check(&from("10.0.0.2:5000")).is_ok(), "another peer has its own bucket");
    }
}
