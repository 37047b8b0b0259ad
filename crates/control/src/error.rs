//! Every HTTP error of the API, mapped in one place: a [`ServiceError`]'s kind decides
//! the status ([`http_status`]), its code is the stable `error.code` clients branch on,
//! and the body is always `{"error": {"code", "message"}}`.

use crate::catalogue as m;
use std::net::IpAddr;
use std::time::Duration;

use axum::Json;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use flotilla_core::{ErrorKind, ServiceError};
use flotilla_scheduler::CommandError;

/// The HTTP status of each kind of failure. A request that cannot be read (`Malformed`)
/// is 400 Bad Request, one read and refused for what it asks (a count out of range, an
/// invalid spec) is 422 Unprocessable Entity. Every dependency the API may miss (a
/// shard, a scheduler) sits behind it, so `Unavailable` is 502 Bad Gateway; but a store
/// that refuses writes (a scheduler's full disk, the replicas' etcd) is this service
/// being unavailable: 503.
pub fn http_status(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::Malformed => StatusCode::BAD_REQUEST,
        ErrorKind::AddressTooLong => StatusCode::URI_TOO_LONG,
        ErrorKind::UnsupportedFormat => StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ErrorKind::TimedOut => StatusCode::REQUEST_TIMEOUT,
        ErrorKind::InvalidInput => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Unauthenticated => StatusCode::UNAUTHORIZED,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::Gone => StatusCode::GONE,
        ErrorKind::Conflict => StatusCode::CONFLICT,
        ErrorKind::TooLarge => StatusCode::PAYLOAD_TOO_LARGE,
        ErrorKind::RateLimited => StatusCode::TOO_MANY_REQUESTS,
        ErrorKind::Unavailable => StatusCode::BAD_GATEWAY,
        ErrorKind::StoreUnavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Internal => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The control plane's own failures (and the scheduler's, which it passes on).
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("no such endpoint")]
    NoSuchEndpoint,
    #[error("no node action {0:?} (cordon, drain or uncordon)")]
    NoSuchAction(String),
    #[error("no shard holds node {0:?}")]
    NoSuchNode(String),
    #[error("no scheduler runs app {0:?}")]
    NoSuchApp(String),
    #[error("no autoscaler has reported pool {0:?}")]
    NoSuchPool(String),
    #[error("no artifact {0} in the origin (push it with `flotilla artifact push FILE`)")]
    NoSuchArtifact(String),
    #[error("this control plane keeps no artifacts: start it with --artifacts-dir")]
    NoArtifactStore,
    /// A unit, or a member of one, the app's scheduler does not know (the message names it).
    #[error("{0}")]
    NoSuchMember(String),
    /// What was asked for lived on a node that left (the message says when).
    #[error("{0}")]
    NodeGone(String),
    /// A request that cannot be read, or whose fields are malformed.
    #[error("{0}")]
    BadRequest(String),
    /// A body sent as something other than JSON.
    #[error("the body must be JSON: send Content-Type: application/json (or none), not {got:?}")]
    NotJson { got: String },
    #[error("{0}")]
    InvalidSpec(String),
    #[error("{0}")]
    InvalidPolicy(String),
    /// A warm with nothing to fetch or nowhere to fetch it (the message says which).
    #[error("{0}")]
    NothingToWarm(String),
    /// The control plane could not keep what it was given (its data dir).
    #[error("cannot store it: {0}")]
    Storage(String),
    /// The artifact origin URL (`--artifact-origin-url`) failed a read or an upload (the
    /// message names no URL: callers of artifact reads need not be authenticated).
    #[error("the artifact origin URL {0}")]
    OriginUnreachable(String),
    /// The store the control-plane replicas share (etcd) did not take a change: retry.
    #[error("the shared store is unavailable: {0}")]
    SharedStoreUnavailable(String),
    #[error("{0}")]
    Unauthorized(&'static str),
    /// A valid token without the scope (or for other apps): the message names what it lacks.
    #[error("{0}")]
    Forbidden(String),
    #[error(transparent)]
    Token(#[from] crate::tokens::TokenError),
    /// A standalone scheduler registering for an app this process schedules itself.
    #[error("{0} runs in this process")]
    AppRunsHere(String),
    /// `WatchRoutes` for an app whose standalone scheduler serves its routes.
    #[error("app {app} is scheduled at {url}: watch it there")]
    ScheduledElsewhere { app: String, url: String },
    #[error("shard {shard}: {message}")]
    ShardUnreachable { shard: usize, message: String },
    #[error("{url}: {message}")]
    SchedulerUnreachable { url: String, message: String },
    /// A standalone scheduler's refusal of a forwarded call, with its status and code,
    /// which are passed on as they are (see [`upstream_code`]).
    #[error("{message}")]
    Forwarded { status: StatusCode, code: &'static str, message: String },
    #[error("the request body is larger than {max} bytes")]
    TooLarge { max: usize },
    #[error("the request target (path and query) is longer than {max} bytes")]
    UriTooLong { max: usize },
    /// A client that did not send its whole body within the time allowed.
    #[error("the request body did not arrive within {secs} s")]
    BodyTimeout { secs: u64 },
    #[error("more than {per_second} requests per second from {peer}: retry in {} ms", retry_in.as_millis().max(1))]
    RateLimited { per_second: u32, peer: IpAddr, retry_in: Duration },
    /// A request forwarded to a scheduler came back to be forwarded again.
    #[error(
        "the request was forwarded to {url} already and came back to be forwarded again: is a scheduler registered with a control plane's own URL? Register the scheduler's own API"
    )]
    ForwardLoop { url: String },
    /// `GET /v1/events` with every stream place taken (or every one for one address).
    #[error("{max} event streams are open already{}: close one (another tab?) or retry later", if *from_one_address { " from this address" } else { "" })]
    TooManySubscribers { max: usize, from_one_address: bool },
    /// `GET …/logs?follow=true` with every follow place of the address taken.
    #[error("{max} log follows are open already from this address: close one or retry later")]
    TooManyFollows { max: usize },
    /// A scheduler registration whose URL is not allowed or did not answer as the
    /// scheduler of that app.
    #[error("{url} is not registered as app {app}'s scheduler: {why}")]
    NotAScheduler { app: String, url: String, why: String },
    /// A `Host` the API does not answer to, on a request without the API token.
    #[error(
        "Host {host:?} is not a name this API answers to (a page re-pointing its own name here?): use its address, or start it with --allowed-host {host}"
    )]
    HostNotAllowed { host: String },
    #[error("this address serves HTTPS: use {url} (with --ca or $FLOTILLA_CA naming the CA of its certificate)")]
    TlsRequired { url: String },
    #[error(transparent)]
    Command(#[from] CommandError),
}

impl ServiceError for ControlError {
    fn kind(&self) -> ErrorKind {
        use ControlError::*;
        match self {
            NoSuchEndpoint | NoSuchAction(_) | NoSuchNode(_) | NoSuchApp(_) | NoSuchPool(_) | NoSuchMember(_)
            | NoSuchArtifact(_) => ErrorKind::NotFound,
            NodeGone(_) => ErrorKind::Gone,
            BadRequest(_) | TlsRequired { .. } | HostNotAllowed { .. } => ErrorKind::Malformed,
            InvalidSpec(_) | InvalidPolicy(_) | NotAScheduler { .. } | NothingToWarm(_) => ErrorKind::InvalidInput,
            UriTooLong { .. } => ErrorKind::AddressTooLong,
            NotJson { .. } => ErrorKind::UnsupportedFormat,
            BodyTimeout { .. } => ErrorKind::TimedOut,
            Storage(_) => ErrorKind::Internal,
            SharedStoreUnavailable(_) => ErrorKind::StoreUnavailable,
            Unauthorized(_) => ErrorKind::Unauthenticated,
            Forbidden(_) => ErrorKind::Forbidden,
            Token(crate::tokens::TokenError::Invalid(_)) => ErrorKind::InvalidInput,
            Token(crate::tokens::TokenError::NoFile) => ErrorKind::Conflict,
            Token(crate::tokens::TokenError::NoSuchToken(_)) => ErrorKind::NotFound,
            Token(crate::tokens::TokenError::Storage(_)) => ErrorKind::Internal,
            AppRunsHere(_) | ScheduledElsewhere { .. } | ForwardLoop { .. } | NoArtifactStore => ErrorKind::Conflict,
            ShardUnreachable { .. } | SchedulerUnreachable { .. } | OriginUnreachable(_) => ErrorKind::Unavailable,
            Forwarded { status, .. } => kind_of_status(*status),
            TooLarge { .. } => ErrorKind::TooLarge,
            RateLimited { .. } | TooManySubscribers { .. } | TooManyFollows { .. } => ErrorKind::RateLimited,
            Command(e) => e.kind(),
        }
    }

    fn code(&self) -> &'static str {
        use ControlError::*;
        match self {
            NoSuchEndpoint | NoSuchAction(_) => "not_found",
            NoSuchNode(_) => "no_such_node",
            NoSuchApp(_) => "no_such_app",
            NoSuchPool(_) => "no_such_pool",
            NoSuchArtifact(_) => "no_such_artifact",
            NoArtifactStore => "no_artifact_store",
            NoSuchMember(_) => "no_such_member",
            NodeGone(_) => "node_gone",
            BadRequest(_) => "bad_request",
            InvalidSpec(_) => "invalid_spec",
            InvalidPolicy(_) => "invalid_policy",
            NothingToWarm(_) => "nothing_to_warm",
            Storage(_) => "storage_failed",
            OriginUnreachable(_) => "origin_unreachable",
            SharedStoreUnavailable(_) => flotilla_scheduler::STORE_UNAVAILABLE,
            Unauthorized(_) => "unauthorized",
            Forbidden(_) => "forbidden",
            Token(crate::tokens::TokenError::Invalid(_)) => "invalid_token_request",
            Token(crate::tokens::TokenError::NoFile) => "no_tokens_file",
            Token(crate::tokens::TokenError::NoSuchToken(_)) => "no_such_token",
            Token(crate::tokens::TokenError::Storage(_)) => "storage_failed",
            AppRunsHere(_) => "conflict",
            ScheduledElsewhere { .. } => "scheduled_elsewhere",
            ForwardLoop { .. } => "forward_loop",
            ShardUnreachable { .. } => "shard_unreachable",
            SchedulerUnreachable { .. } => "scheduler_unreachable",
            Forwarded { code, .. } => code,
            TooLarge { .. } => "too_large",
            UriTooLong { .. } => "uri_too_long",
            NotJson { .. } => "unsupported_media_type",
            BodyTimeout { .. } => "body_timeout",
            RateLimited { .. } => "rate_limited",
            TooManySubscribers { .. } => "too_many_subscribers",
            TooManyFollows { .. } => "too_many_follows",
            TlsRequired { .. } => "tls_required",
            HostNotAllowed { .. } => "host_not_allowed",
            NotAScheduler { .. } => "not_a_scheduler",
            Command(e) => e.code(),
        }
    }
}

/// Every code a scheduler's API answers with (its [`CommandError`]s and this API's own,
/// which it serves too), so a forwarded refusal keeps the code clients branch on.
const UPSTREAM_CODES: &[&str] = &[
    "not_found",
    "no_such_node",
    "no_such_app",
    "no_such_pool",
    "no_such_member",
    "node_gone",
    "bad_request",
    "invalid_spec",
    "invalid_policy",
    "storage_failed",
    flotilla_scheduler::STORE_UNAVAILABLE,
    "unauthorized",
    "forbidden",
    "conflict",
    "scheduled_elsewhere",
    "forward_loop",
    "shard_unreachable",
    "scheduler_unreachable",
    "too_large",
    "uri_too_long",
    "unsupported_media_type",
    "body_timeout",
    "rate_limited",
    "too_many_subscribers",
    "too_many_follows",
    "tls_required",
    "host_not_allowed",
    "not_a_scheduler",
    "out_of_range",
    "wrong_app",
    "version_conflict",
    "no_such_version",
    "already_in_force",
    "invalid_demand",
    "invalid_override",
    "no_previous_spec",
    "scheduler_stopped",
    "not_leader",
];

/// The code of a standalone scheduler's JSON refusal, as one of ours; `refused` for a
/// body that is not one of its errors.
pub(crate) fn upstream_code(body: &serde_json::Value) -> &'static str {
    let got = body.pointer("/error/code").and_then(serde_json::Value::as_str).unwrap_or_default();
    UPSTREAM_CODES.iter().find(|c| **c == got).copied().unwrap_or("refused")
}

/// The kind a standalone scheduler's status stands for (it mapped its error with
/// [`http_status`] too), for the metrics and logs of a forwarded refusal.
fn kind_of_status(status: StatusCode) -> ErrorKind {
    match status {
        StatusCode::BAD_REQUEST => ErrorKind::Malformed,
        StatusCode::URI_TOO_LONG => ErrorKind::AddressTooLong,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorKind::UnsupportedFormat,
        StatusCode::REQUEST_TIMEOUT => ErrorKind::TimedOut,
        StatusCode::SERVICE_UNAVAILABLE => ErrorKind::StoreUnavailable,
        StatusCode::UNAUTHORIZED => ErrorKind::Unauthenticated,
        StatusCode::FORBIDDEN => ErrorKind::Forbidden,
        StatusCode::NOT_FOUND => ErrorKind::NotFound,
        StatusCode::GONE => ErrorKind::Gone,
        StatusCode::CONFLICT => ErrorKind::Conflict,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorKind::TooLarge,
        StatusCode::TOO_MANY_REQUESTS => ErrorKind::RateLimited,
        StatusCode::BAD_GATEWAY | StatusCode::GATEWAY_TIMEOUT => ErrorKind::Unavailable,
        s if s.is_client_error() => ErrorKind::InvalidInput,
        _ => ErrorKind::Internal,
    }
}

/// `{"error": {"code", "message"}}` with its status: what every refusal of the API looks
/// like on the wire. Built only from a [`ServiceError`].
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
}

impl ApiError {
    pub fn from_service<E: ServiceError + ?Sized>(e: &E) -> Self {
        ApiError { status: http_status(e.kind()), code: e.code(), message: e.to_string() }
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    pub fn code(&self) -> &'static str {
        self.code
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"code": self.code, "message": self.message}})
    }
}

impl From<&ControlError> for ApiError {
    fn from(e: &ControlError) -> Self {
        let mut api = ApiError::from_service(e);
        // A proxy passes its upstream's answer on unchanged.
        if let ControlError::Forwarded { status, .. } = e {
            api.status = *status;
        }
        api
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        metrics::counter!(m::API_ERRORS.name, "code" => self.code).increment(1);
        (self.status, Json(self.body())).into_response()
    }
}

impl IntoResponse for ControlError {
    fn into_response(self) -> Response {
        let mut resp = ApiError::from(&self).into_response();
        if let ControlError::RateLimited { retry_in, .. } = self {
            // Whole seconds, rounded up, at least 1.
            let secs = retry_in.as_secs() + u64::from(retry_in.subsec_nanos() > 0);
            resp.headers_mut().insert(header::RETRY_AFTER, secs.max(1).into());
        }
        resp
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(e: ControlError) -> (u16, &'static str) {
        let api = ApiError::from(&e);
        // Every code this API answers is one a forwarded refusal keeps.
        assert!(UPSTREAM_CODES.contains(&api.code()) || api.code() == "refused", "{}", api.code());
        (api.status().as_u16(), api.code())
    }

    #[test]
    fn every_refusal_keeps_its_status_and_code() {
        use ControlError::*;
        assert_eq!(answer(NoSuchEndpoint), (404, "not_found"));
        assert_eq!(answer(NoSuchAction("x".into())), (404, "not_found"));
        assert_eq!(answer(NoSuchNode("n".into())), (404, "no_such_node"));
        assert_eq!(answer(NoSuchApp("a".into())), (404, "no_such_app"));
        assert_eq!(answer(BadRequest("b".into())), (400, "bad_request"));
        assert_eq!(answer(InvalidSpec("s".into())), (422, "invalid_spec"));
        assert_eq!(answer(Unauthorized("u")), (401, "unauthorized"));
        assert_eq!(answer(AppRunsHere("a".into())), (409, "conflict"));
        assert_eq!(answer(ShardUnreachable { shard: 0, message: "m".into() }), (502, "shard_unreachable"));
        assert_eq!(
            answer(SchedulerUnreachable { url: "u".into(), message: "m".into() }),
            (502, "scheduler_unreachable")
        );
        assert_eq!(answer(TooLarge { max: 1 }), (413, "too_large"));
        assert_eq!(answer(UriTooLong { max: 1 }), (414, "uri_too_long"));
        assert_eq!(answer(NotJson { got: "text/plain".into() }), (415, "unsupported_media_type"));
        assert_eq!(answer(BodyTimeout { secs: 10 }), (408, "body_timeout"));
        let peer = IpAddr::from([127, 0, 0, 1]);
        assert_eq!(answer(RateLimited { per_second: 1, peer, retry_in: Duration::ZERO }), (429, "rate_limited"));
        assert_eq!(answer(TlsRequired { url: "https://x".into() }), (400, "tls_required"));
        assert_eq!(answer(HostNotAllowed { host: "h.example".into() }), (400, "host_not_allowed"));
        let e = NotAScheduler { app: "a".into(), url: "u".into(), why: "w".into() };
        assert_eq!(answer(e), (422, "not_a_scheduler"));
    }

    #[test]
    fn scheduler_refusals_map_through_the_same_path() {
        let out_of_range = CommandError::OutOfRange { app: "a".into(), min: 1, max: 6, asked: 9 };
        assert_eq!(answer(out_of_range.into()), (422, "out_of_range"));
        assert_eq!(answer(CommandError::InvalidSpec("bad".into()).into()), (422, "invalid_spec"));
        let wrong = CommandError::WrongApp { app: "a".into(), got: "b".into() };
        assert_eq!(answer(wrong.into()), (422, "wrong_app"));
        // A failed store write is the server's fault, not the caller's.
        assert_eq!(answer(CommandError::Store("disk full".into()).into()), (503, "store_unavailable"));
        assert_eq!(answer(CommandError::Stopped.into()), (502, "scheduler_stopped"));
        // A standby cannot take a change now; the same request works on the active one.
        assert_eq!(answer(CommandError::NotLeader("b".into()).into()), (503, "not_leader"));
    }

    #[test]
    fn a_forwarded_refusal_keeps_the_upstream_status() {
        for status in [StatusCode::BAD_REQUEST, StatusCode::UNPROCESSABLE_ENTITY, StatusCode::INTERNAL_SERVER_ERROR] {
            let e = ControlError::Forwarded { status, code: "refused", message: "m".into() };
            assert_eq!(answer(e), (status.as_u16(), "refused"));
        }
        // The scheduler's code goes through: a standby's `not_leader` stays one.
        let body = serde_json::json!({"error": {"code": "not_leader", "message": "m"}});
        let e = ControlError::Forwarded {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: upstream_code(&body),
            message: "m".into(),
        };
        assert_eq!(answer(e), (503, "not_leader"));
        assert_eq!(upstream_code(&serde_json::json!({"error": {"code": "made_up"}})), "refused");
        assert_eq!(upstream_code(&serde_json::json!("not an error")), "refused");
    }

    #[test]
    fn a_rate_limited_answer_says_when_to_retry() {
        let peer = IpAddr::from([127, 0, 0, 1]);
        let resp =
            ControlError::RateLimited { per_second: 5, peer, retry_in: Duration::from_millis(1200) }.into_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn every_kind_has_a_status() {
        for k in ErrorKind::ALL {
            let s = http_status(k);
            assert!(s.is_client_error() || s.is_server_error(), "{k:?}: {s}");
            assert_eq!(s.is_server_error(), k.is_retryable() && k != ErrorKind::RateLimited, "{k:?}: {s}");
            // A forwarded refusal's status stands for the kind that made it.
            assert_eq!(kind_of_status(s), k, "{k:?}: {s}");
        }
    }
}
