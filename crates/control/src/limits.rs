//! Bounds on what one peer may ask of the HTTP API, put in front of every route by
//! [`apply`]: the per-peer rate limit ([`RateLimiter`]), the request target's length, the
//! API token of a mutating call (checked from the headers, before any body is read), one
//! cap on every request body whatever its content type ([`MAX_BODY_BYTES`]) and the time
//! a client has to send it ([`BODY_TIMEOUT`]). Only gRPC calls to the gRPC services that
//! share the port pass without a buffered body (tonic bounds their messages). Every
//! refusal is a JSON error and counts once in `flotilla_http_requests_rejected_total{reason}`:
//! a handler's 400 or 422 too, by its status, unless the handler counted it itself.

use crate::catalogue as m;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use crate::ControlError;
use crate::hosts::AllowedHosts;
pub use flotilla_core::RateLimiter;

/// The largest request body the API reads (a spec applied with `flotilla apply` too), on
/// every route and whatever the content type.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// `flotilla artifact push`'s path: its body streams to the origin under the origin's own
/// cap (`--artifact-max-bytes`), never buffered here.
pub const ARTIFACT_PUSH_PATH: &str = "/v1/artifacts";
/// Time a client has to send a request's whole body once its headers are read: a client
/// that trickles one is cut, so it cannot hold a connection (and its buffer) for long.
pub const BODY_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest request target (path and query) the API reads; a request head over
/// what a connection buffers (64 KiB) is refused by hyper before any route sees it.
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// The gRPC services on the API's port ([`crate::routes_grpc`]) live under this prefix.
const GRPC_PREFIX: &str = "/flotilla.v1.";

tokio::task_local! {
    /// Set while a request runs through [`guard`]: [`rejected`] marks it, so a refusal a
    /// handler counted with its own reason is not counted again by its status.
    static COUNTED: Arc<AtomicBool>;
}

/// The header every call to a scheduler's API carries. A request that arrives with it
/// was forwarded once already and is never forwarded again (`forward.rs`): a scheduler
/// registered with a control plane's own URL would otherwise turn one request into a
/// loop.
pub const HOP_HEADER: &str = "x-flotilla-forwarded";

/// A peer's forwarded calls per second, as a fraction of its request rate: one request
/// forwarded to a standalone scheduler costs that scheduler a request, so a peer may not
/// spend the whole of its budget on other processes.
const FORWARD_SHARE: u32 = 4;

/// What the request being served knows about forwarding it to a standalone scheduler.
pub(crate) struct Hop {
    /// It carries [`HOP_HEADER`]: it was forwarded here already.
    pub forwarded: bool,
    /// The peer's budget of forwarded requests (none when the API has no rate limit).
    budget: Option<(Arc<RateLimiter>, IpAddr)>,
    /// The budget's answer, asked once per request however many schedulers it asks:
    /// how long to wait when there was none left.
    verdict: OnceLock<Result<(), Duration>>,
}

impl Hop {
    /// Charges the request's peer for forwarding it (once per request).
    pub(crate) fn charge(&self) -> Result<(), ControlError> {
        let Some((limiter, peer)) = &self.budget else { return Ok(()) };
        let Err(retry_in) = *self.verdict.get_or_init(|| limiter.check(*peer, Instant::now())) else { return Ok(()) };
        rejected("forward_rate_limited");
        Err(ControlError::RateLimited { per_second: limiter.per_second(), peer: *peer, retry_in })
    }
}

tokio::task_local! {
    /// Set while the API serves a request.
    pub(crate) static HOP: Arc<Hop>;
}

/// A missing or unknown token, counted.
pub(crate) fn unauthenticated(why: &'static str) -> ControlError {
    rejected("unauthenticated");
    ControlError::Unauthorized(why)
}

/// Counts one refused request or connection.
pub fn rejected(reason: &'static str) {
    metrics::counter!(m::HTTP_REQUESTS_REJECTED.name, "reason" => reason).increment(1);
    let _ = COUNTED.try_with(|c| c.store(true, Ordering::Relaxed));
}

/// What [`guard`] holds: the rate limiter, the API token mutating calls need and the
/// `Host` names answered.
#[derive(Clone)]
struct Guard {
    limiter: Option<Arc<RateLimiter>>,
    creds: crate::tokens::Credentials,
    hosts: Arc<AllowedHosts>,
    /// Each peer's budget of requests forwarded to standalone schedulers.
    forwards: Option<Arc<RateLimiter>>,
}

/// Puts the limits in front of every route: the rate limit (when `limiter` is set), the
/// target length, the `Host` ([`AllowedHosts`]), the API token for mutating calls (when
/// `token` is set) and the body cap and timeout. The serving loop puts each
/// connection's peer address in the request's extensions.
pub fn apply(
    router: Router,
    limiter: Option<Arc<RateLimiter>>,
    creds: crate::tokens::Credentials,
    hosts: AllowedHosts,
) -> Router {
    let forwards =
        limiter.as_ref().and_then(|l| RateLimiter::new((l.per_second() / FORWARD_SHARE).max(1))).map(Arc::new);
    let guard = Guard { limiter, creds, hosts: Arc::new(hosts), forwards };
    router.layer(axum::middleware::from_fn_with_state(guard, self::guard))
}

/// A gRPC call to one of the port's gRPC services: its messages are framed and bounded
/// by tonic, and it may stream for as long as it is watched, so it is not buffered.
/// A gRPC content type anywhere else gets the same treatment as any other body.
fn is_grpc_call(req: &Request) -> bool {
    req.uri().path().starts_with(GRPC_PREFIX)
        && req
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("application/grpc"))
}

fn refuse(reason: &'static str, e: ControlError) -> Response {
    rejected(reason);
    e.into_response()
}

fn too_large() -> Response {
    refuse("too_large", ControlError::TooLarge { max: MAX_BODY_BYTES })
}

#[tracing::instrument(name = "http_limits", skip_all, fields(method = %req.method(), path = %req.uri().path()))]
async fn guard(State(g): State<Guard>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    if let (Some(limiter), Some(peer)) = (&g.limiter, peer)
        && let Err(wait) = limiter.check(peer, Instant::now())
    {
        tracing::debug!(%peer, "rate limited");
        let e = ControlError::RateLimited { per_second: limiter.per_second(), peer, retry_in: wait };
        return refuse("rate_limited", e);
    }
    let target = req.uri().path_and_query().map_or(0, |p| p.as_str().len());
    if target > MAX_URI_BYTES {
        return refuse("uri_too_long", ControlError::UriTooLong { max: MAX_URI_BYTES });
    }
    // A browser cannot speak HTTP/2 in the clear, nor to another name over TLS: a page
    // re-pointing its name here sends HTTP/1.1, gRPC-looking or not.
    let h2 = req.version() == axum::http::Version::HTTP_2;
    if !(h2 && is_grpc_call(&req)) {
        let host = match req.headers().get(header::HOST) {
            Some(v) => v.to_str().ok().map(Some),
            None => Some(req.uri().host()),
        };
        let allowed = host.is_some_and(|h| g.hosts.allows(h));
        if !allowed && g.creds.carried(req.headers()).is_none() {
            let host = host.flatten().unwrap_or("(not text)").chars().take(256).collect();
            tracing::debug!(%host, "a Host this API does not answer to");
            return refuse("host_not_allowed", ControlError::HostNotAllowed { host });
        }
    }
    if is_grpc_call(&req) {
        return next.run(req).await;
    }
    // Agents announce with a token derived from the join token, checked by the handler.
    let announce = req.method() == axum::http::Method::POST
        && req.uri().path().starts_with("/v1/artifacts/")
        && req.uri().path().ends_with("/announce");
    // Authenticate from the headers alone: a caller without the token never gets a
    // byte of its body read (hyper closes the connection after the answer).
    if !req.method().is_safe()
        && !announce
        && let Err(why) = g.creds.grant(req.headers())
    {
        return unauthenticated(why).into_response();
    }
    // A push streams to disk under the origin's own cap, never buffered here.
    if req.method() == axum::http::Method::PUT && req.uri().path() == ARTIFACT_PUSH_PATH {
        return next.run(req).await;
    }
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    // Read as it arrives (never sized from Content-Length), up to the cap, in time.
    let (parts, body) = req.into_parts();
    let bytes =
        match tokio::time::timeout(BODY_TIMEOUT, http_body_util::Limited::new(body, MAX_BODY_BYTES).collect()).await {
            Ok(Ok(b)) => b.to_bytes(),
            Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => return too_large(),
            Ok(Err(e)) => {
                return refuse("bad_body", ControlError::BadRequest(format!("reading the request body: {e}")));
            }
            Err(_) => return refuse("body_timeout", ControlError::BodyTimeout { secs: BODY_TIMEOUT.as_secs() }),
        };
    let counted = Arc::new(AtomicBool::new(false));
    let hop = Hop {
        forwarded: parts.headers.contains_key(HOP_HEADER),
        budget: g.forwards.clone().zip(peer),
        verdict: OnceLock::new(),
    };
    let run = COUNTED.scope(counted.clone(), next.run(Request::from_parts(parts, Body::from(bytes))));
    let resp = HOP.scope(Arc::new(hop), run).await;
    if counted.load(Ordering::Relaxed) {
        return resp;
    }
    count_refusal(resp).await
}

/// Counts a handler's refusal by its status, and gives a framework's plain-text one
/// (an extractor's) the API's JSON shape.
async fn count_refusal(resp: Response) -> Response {
    let reason = match resp.status() {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNPROCESSABLE_ENTITY => "unprocessable",
        StatusCode::PAYLOAD_TOO_LARGE => "too_large",
        StatusCode::URI_TOO_LONG => "uri_too_long",
        _ => return resp,
    };
    rejected(reason);
    let json = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if json {
        return resp;
    }
    let status = resp.status();
    let text = match axum::body::to_bytes(resp.into_body(), 16 * 1024).await {
        Ok(b) => String::from_utf8_lossy(&b).trim().to_string(),
        Err(_) => String::new(),
    };
    let message = if text.is_empty() { status.canonical_reason().unwrap_or("refused").to_string() } else { text };
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => ControlError::TooLarge { max: MAX_BODY_BYTES },
        StatusCode::URI_TOO_LONG => ControlError::UriTooLong { max: MAX_URI_BYTES },
        StatusCode::BAD_REQUEST => ControlError::BadRequest(message),
        _ => ControlError::Forwarded { status, code: "refused", message },
    }
    .into_response()
}
