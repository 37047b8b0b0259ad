//! A canary rollout from outside (`flotilla rollout status|promote|abort APP`): its step,
//! share and both versions' numbers, and the operator's promote and abort. The app's
//! scheduler decides (`flotilla_scheduler`'s `canary`); this file reads and forwards.

use crate::catalogue as m;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Json, Router};
use flotilla_scheduler::ChangeRequest;
use serde_json::{Value, json};

use crate::apps::not_found;
use crate::auth::authorize;
use crate::forward::{forward, remote};
use crate::tokens::Scope;
use crate::{ControlError, ControlState};

pub fn routes() -> Router<Arc<ControlState>> {
    Router::new()
        .route("/v1/apps/{app}/rollout", get(rollout_status))
        .route("/v1/apps/{app}/rollout/promote", post(promote))
        .route("/v1/apps/{app}/rollout/abort", post(abort))
}

/// `GET /v1/apps/{app}/rollout`: the last rollout and, while a canary shifts traffic,
/// its step, share, why it waits and both versions' numbers over the step.
#[utoipa::path(get, path = "/v1/apps/{app}/rollout", tag = "versions", params(("app" = String, Path)),
    responses((status = 200, description = "`rollout` (the record: template, state, reason, the canary's step) and `canary` (null unless one shifts traffic: step, steps, share, waiting, `new` and `stable` with requests, errors, error_rate and p99_ms over the step, routers)", body = Object),
              (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "rollout_status", skip(s))]
pub(crate) async fn rollout_status(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/rollout").increment(1);
    match s.apps.get(&app) {
        Some(Ok(h)) => {
            let st = h.status();
            Ok(Json(json!({ "app": app, "template": st.template, "rollout": st.rollout, "canary": st.canary })))
        }
        Some(Err(url)) => Ok(Json(remote(&s.http, &url, &format!("/v1/apps/{app}/rollout")).await?)),
        None => Err(not_found(&app)),
    }
}

#[derive(Clone, Copy)]
enum Action {
    Promote,
    Abort,
}

/// `POST /v1/apps/{app}/rollout/promote`: the canary's traffic shifting ends now; the
/// old units drain as their replacements run and the rest rolls as a rolling update.
#[utoipa::path(post, path = "/v1/apps/{app}/rollout/promote", tag = "versions", security(("bearer" = [])), params(("app" = String, Path)),
    responses((status = 200, description = "scope deploy; the rollout record", body = Object), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody),
              (status = 404, description = "no such app", body = crate::answers::ErrorBody), (status = 409, description = "`no_canary`: no canary shifts traffic", body = crate::answers::ErrorBody), (status = 502, body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "rollout_promote", skip(s, headers))]
pub(crate) async fn promote(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ControlError> {
    act(s, app, headers, Action::Promote).await
}

/// `POST /v1/apps/{app}/rollout/abort`: the canary fails now and the spec goes back to
/// the last one that ran; the new version's units are released.
#[utoipa::path(post, path = "/v1/apps/{app}/rollout/abort", tag = "versions", security(("bearer" = [])), params(("app" = String, Path)),
    responses((status = 200, description = "scope deploy; the failed rollout record", body = Object), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody),
              (status = 404, description = "no such app", body = crate::answers::ErrorBody), (status = 409, description = "`no_canary`: no canary shifts traffic", body = crate::answers::ErrorBody), (status = 502, body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "rollout_abort", skip(s, headers))]
pub(crate) async fn abort(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ControlError> {
    act(s, app, headers, Action::Abort).await
}

async fn act(
    s: Arc<ControlState>,
    app: String,
    headers: HeaderMap,
    action: Action,
) -> Result<Json<Value>, ControlError> {
    let (route, verb, kind, what) = match action {
        Action::Promote => ("/v1/apps/{app}/rollout/promote", "promote", "rollout_promote", "promoted its canary"),
        Action::Abort => ("/v1/apps/{app}/rollout/abort", "abort", "rollout_abort", "aborted its canary"),
    };
    metrics::counter!(m::API_REQUESTS.name, "route" => route).increment(1);
    let by = authorize(&s, &headers, Scope::Deploy, Some(&app))?;
    let answer = match s.apps.get(&app) {
        Some(Ok(h)) => {
            let req = ChangeRequest { by: by.clone(), check_version: None };
            let record = match action {
                Action::Promote => h.promote(req).await?,
                Action::Abort => h.abort(req).await?,
            };
            Ok(Json(json!({ "app": app, "rollout": record })))
        }
        Some(Err(url)) => {
            let req = s.http.post(format!("{}/v1/apps/{app}/rollout/{verb}", url.trim_end_matches('/')));
            forward(req, &url, &headers).await
        }
        None => Err(not_found(&app)),
    };
    if answer.is_ok() {
        s.journal.action(kind, Some(&app), by, format!("{app}: {what}"));
    }
    answer
}
