//! An app's spec over time: the versions its scheduler keeps (`flotilla history`), a
//! rollback to any of them, and a plan of what applying a spec would do (`apply
//! --plan`). The scheduler decides and keeps them; this file reads and forwards.

use crate::catalogue as m;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use flotilla_scheduler::{ChangeRequest, SpecVersion};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::answers::{VersionRow, Versions};
use crate::apps::{not_found, parse_spec};
use crate::auth::authorize;
use crate::forward::{forward, remote_text};
use crate::tokens::Scope;
use crate::{ControlError, ControlState};

pub fn routes() -> Router<Arc<ControlState>> {
    Router::new()
        .route("/v1/apps/{app}/versions", axum::routing::get(list_versions))
        .route("/v1/apps/{app}/versions/{version}", axum::routing::get(get_version))
        .route("/v1/apps/{app}/rollback", axum::routing::post(rollback))
        .route("/v1/apps/{app}/plan", axum::routing::post(plan))
}

/// A version's row: where it came from, who applied it, and what it changed from the
/// version before it (`null` for the oldest kept, whose predecessor is gone).
fn version_row(v: &SpecVersion, before: Option<&SpecVersion>, in_force: u64, secrets: bool) -> VersionRow {
    let changes = before.map(|b| {
        let mut c = flotilla_scheduler::diff::spec_diff(&b.spec, &v.spec);
        if !secrets {
            c.iter_mut().for_each(crate::secrets::redact_change);
        }
        c
    });
    VersionRow {
        version: v.version,
        in_force: v.version == in_force,
        source: v.origin.source.clone(),
        at_unix_ms: v.origin.at_unix_ms,
        by: v.origin.by.clone(),
        reason: v.origin.reason.clone(),
        rollback_of: v.origin.of_version,
        template: v.template.clone(),
        changes,
    }
}

/// Hides secret-looking values in the changes of a versions answer (a standalone
/// scheduler's, passed on).
fn redact_rows(v: &mut Value) {
    for row in v["versions"].as_array_mut().into_iter().flatten() {
        for c in row["changes"].as_array_mut().into_iter().flatten() {
            let text = |k: &str| c[k].as_str().map(str::to_string);
            let mut change = flotilla_scheduler::diff::Change {
                path: text("path").unwrap_or_default(),
                before: text("before"),
                after: text("after"),
            };
            crate::secrets::redact_change(&mut change);
            *c = json!(change);
        }
    }
}

/// `GET /v1/apps/{app}/versions`: the kept versions, newest first.
#[utoipa::path(get, path = "/v1/apps/{app}/versions", tag = "versions", params(("app" = String, Path)),
    responses((status = 200, body = crate::answers::Versions), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "list_versions", skip(s, headers))]
pub(crate) async fn list_versions(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    headers: HeaderMap,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/versions").increment(1);
    match s.apps.get(&app) {
        Some(Ok(h)) => {
            let st = h.status();
            let secrets = s.credentials().shows_secrets(&headers, &app);
            let in_force = st.versions.last().map_or(0, |v| v.version);
            let versions: Vec<VersionRow> = st
                .versions
                .iter()
                .enumerate()
                .rev()
                .map(|(i, v)| version_row(v, i.checked_sub(1).map(|p| &*st.versions[p]), in_force, secrets))
                .collect();
            Ok(Json(crate::answers::to_json(&Versions { app, in_force, versions })))
        }
        Some(Err(url)) => {
            let text = remote_text(&s.http, &url, &format!("/v1/apps/{app}/versions"), &headers).await?;
            let mut v: Value = serde_json::from_str(&text).map_err(|e| ControlError::SchedulerUnreachable {
                url: url.clone(),
                message: format!("its versions are not JSON: {e}"),
            })?;
            // The scheduler judged the token by its own file; this plane's judgement holds too.
            if !s.credentials().shows_secrets(&headers, &app) {
                redact_rows(&mut v);
            }
            Ok(Json(v))
        }
        None => Err(not_found(&app)),
    }
}

/// `GET /v1/apps/{app}/versions/{version}`: that version's spec (TOML), secrets hidden
/// from readers without the API token as in `GET …/spec`.
#[utoipa::path(get, path = "/v1/apps/{app}/versions/{version}", tag = "versions", params(("app" = String, Path), ("version" = u64, Path)),
    responses((status = 200, description = "that version's spec (TOML)", content_type = "text/plain", body = String),
              (status = 400, description = "not a number", body = crate::answers::ErrorBody), (status = 404, description = "`no_such_version` naming the kept range, or no such app", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "get_version", skip(s, headers))]
pub(crate) async fn get_version(
    State(s): State<Arc<ControlState>>,
    Path((app, version)): Path<(String, String)>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/versions/{version}").increment(1);
    let n: u64 = version.parse().map_err(|_| {
        ControlError::BadRequest(format!("version {version:?} is not a number (see `flotilla history`)"))
    })?;
    let text = match s.apps.get(&app) {
        Some(Ok(h)) => {
            let st = h.status();
            let Some(v) = st.versions.iter().find(|v| v.version == n) else {
                let kept = match (st.versions.first(), st.versions.last()) {
                    (Some(a), Some(b)) => format!("{}..={}", a.version, b.version),
                    _ => "none".into(),
                };
                return Err(flotilla_scheduler::CommandError::NoSuchVersion { app, version: n, kept }.into());
            };
            if s.credentials().shows_secrets(&headers, &app) { v.spec.clone() } else { crate::secrets::redact(&v.spec) }
        }
        Some(Err(url)) => {
            let text = remote_text(&s.http, &url, &format!("/v1/apps/{app}/versions/{n}"), &headers).await?;
            if s.credentials().shows_secrets(&headers, &app) { text } else { crate::secrets::redact(&text) }
        }
        None => return Err(not_found(&app)),
    };
    Ok(([(CONTENT_TYPE, "text/plain; charset=utf-8")], text).into_response())
}

/// `POST /v1/apps/{app}/rollback` with `{"to": N}`: re-applies kept version N (404
/// `no_such_version` if it is not kept, 409 `already_in_force`). Without a body: the
/// spec the app had before its last apply (409 `no_previous_spec` when it has none); the
/// current one becomes the previous, so a second rollback undoes the first. Either way
/// a new version whose source is `rollback`, rolled out as an apply is.
#[derive(Debug, Default, Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct RollbackBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    to: Option<u64>,
}

#[utoipa::path(post, path = "/v1/apps/{app}/rollback", tag = "versions", security(("bearer" = [])), params(("app" = String, Path)),
    request_body(content = Option<RollbackBody>, description = "`{\"to\": N}`, or none: the spec before the last apply"),
    responses((status = 200, description = "scope operate", body = crate::answers::Applied), (status = 400, body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody),
              (status = 404, description = "`no_such_version`, or no such app", body = crate::answers::ErrorBody),
              (status = 409, description = "`already_in_force` or `no_previous_spec`", body = crate::answers::ErrorBody), (status = 502, body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "rollback", skip(s, headers, body))]
pub(crate) async fn rollback(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/rollback").increment(1);
    let by = authorize(&s, &headers, Scope::Operate, Some(&app))?;
    let b: RollbackBody = if body.iter().all(u8::is_ascii_whitespace) {
        RollbackBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| ControlError::BadRequest(format!("expected {{\"to\": VERSION}} or no body: {e}")))?
    };
    let answer = match s.apps.get(&app) {
        Some(Ok(h)) => {
            let req = ChangeRequest { by: by.clone(), check_version: None };
            Ok(Json(crate::answers::Applied::of(&app, h.rollback(b.to, req).await?)))
        }
        Some(Err(url)) => {
            let req = s.http.post(format!("{}/v1/apps/{app}/rollback", url.trim_end_matches('/')));
            forward(req.json(&b), &url, &headers).await
        }
        None => Err(not_found(&app)),
    };
    if let Ok(Json(a)) = &answer {
        let to = b.to.map_or("the previous spec".to_string(), |n| format!("version {n}"));
        s.journal.action(
            "rollback",
            Some(&app),
            by,
            format!("{app}: rolled back to {to}, now version {}", a["version"]),
        );
    }
    answer
}

/// `POST /v1/apps/{app}/plan` with a spec (TOML): what applying it would do, changing
/// nothing (see `flotilla_scheduler::ApplyPlan`). Validated as `PUT …/spec` is (every
/// problem named), and it needs the API token as an apply does: the answer shows the
/// spec's values.
#[utoipa::path(post, path = "/v1/apps/{app}/plan", tag = "versions", security(("bearer" = [])), params(("app" = String, Path)),
    request_body(content = String, content_type = "text/plain", description = "the spec to plan (TOML)"),
    responses((status = 200, description = "scope deploy; nothing changes: the diff, the units that would roll, be created or stop, and what would not fit", body = Object),
              (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody), (status = 422, description = "an invalid spec: every problem named", body = crate::answers::ErrorBody), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "plan", skip(s, headers, body))]
pub(crate) async fn plan(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/plan").increment(1);
    authorize(&s, &headers, Scope::Deploy, Some(&app))?;
    let spec = parse_spec(&app, &body)?;
    crate::artifact_fit::check(&s, &spec).await?;
    match s.apps.get(&app) {
        Some(Ok(h)) => {
            let p = h.plan(spec).await?;
            Ok(Json(json!(p)))
        }
        Some(Err(url)) => {
            let req = s.http.post(format!("{}/v1/apps/{app}/plan", url.trim_end_matches('/')));
            forward(req.body(body), &url, &headers).await
        }
        None => Err(not_found(&app)),
    }
}
