//! Bounds on what one peer may ask of the HTTP API: the per-peer rate limit
//! ([`RateLimiter`]) and a cap on request bodies. Every refusal is a JSON error and
//! counts in `flotilla_http_requests_rejected_total{reason}`.

use crate::catalogue as m;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use crate::ControlError;
pub use flotilla_core::RateLimiter;

/// The largest request body the API reads (a spec applied with `flotilla apply` too).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Counts one refused request or connection.
pub fn rejected(reason: &'static str) {
    metrics::counter!(m::HTTP_REQUESTS_REJECTED.name, "reason" => reason).increment(1);
}

/// Puts the rate limit (when `limiter` is set) and the body cap in front of every route.
/// The serving loop puts each connection's peer address in the request's extensions.
pub fn apply(router: Router, limiter: Option<Arc<RateLimiter>>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(limiter, guard))
}

fn is_grpc(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

fn too_large() -> Response {
    rejected("too_large");
    ControlError::TooLarge { max: MAX_BODY_BYTES }.into_response()
}

#[tracing::instrument(name = "http_limits", skip_all, fields(method = %req.method(), path = %req.uri().path()))]
async fn guard(State(limiter): State<Option<Arc<RateLimiter>>>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    if let (Some(limiter), Some(peer)) = (&limiter, peer)
        && let Err(wait) = limiter.check(peer, Instant::now())
    {
        rejected("rate_limited");
        tracing::debug!(%peer, "rate limited");
        return ControlError::RateLimited { per_second: limiter.per_second(), peer, retry_in: wait }.into_response();
    }
    // gRPC streams are bounded by their own message size limit, never buffered here.
    if is_grpc(&req) {
        return next.run(req).await;
    }
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    let (parts, body) = req.into_parts();
    let bytes = match http_body_util::Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => return too_large(),
        Err(e) => {
            rejected("bad_body");
            return ControlError::BadRequest(format!("reading the request body: {e}")).into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
}
