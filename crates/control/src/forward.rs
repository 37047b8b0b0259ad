//! Calls to standalone schedulers' APIs (`flotilla scheduler --control URL`): reads the
//! control plane passes on, and mutating calls forwarded with the caller's token. Their
//! refusals come back as the scheduler gave them; no answer is `SchedulerUnreachable`.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::http::HeaderMap;
use serde_json::{Value, json};

use crate::ControlError;
use crate::error::upstream_code;

use crate::limits::{HOP, HOP_HEADER};

/// Whether the request being served may be forwarded to `url`: never when it was
/// forwarded already (a loop), and within its peer's budget of forwarded requests.
/// Calls outside a request (the event stream's polls) always may.
pub(crate) fn may_forward(url: &str) -> Result<(), ControlError> {
    let Ok(hop) = HOP.try_with(Arc::clone) else { return Ok(()) };
    if hop.forwarded {
        crate::limits::rejected("forward_loop");
        return Err(ControlError::ForwardLoop { url: url.to_string() });
    }
    hop.charge()
}

pub(crate) fn unreachable(url: &str, e: reqwest::Error) -> ControlError {
    ControlError::SchedulerUnreachable { url: url.to_string(), message: e.to_string() }
}

pub(crate) async fn remote(http: &reqwest::Client, url: &str, path: &str) -> Result<Value, ControlError> {
    remote_within(http, url, path, Duration::from_secs(5)).await
}

/// GET `path` of a standalone scheduler's API, allowing `timeout` for the whole answer;
/// its refusal (a JSON error) comes back as one.
pub(crate) async fn remote_within(
    http: &reqwest::Client,
    url: &str,
    path: &str,
    timeout: Duration,
) -> Result<Value, ControlError> {
    may_forward(url)?;
    let resp = http
        .get(format!("{}{path}", url.trim_end_matches('/')))
        .header(HOP_HEADER, "1")
        .timeout(timeout)
        .send()
        .await
        .map_err(|e| unreachable(url, e))?;
    let status = resp.status();
    let v: Value = resp.json().await.map_err(|e| unreachable(url, e))?;
    if !status.is_success() {
        let message = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("refused").to_string();
        return Err(ControlError::Forwarded { status, code: upstream_code(&v), message: format!("{url}: {message}") });
    }
    Ok(v)
}

/// GET `path` of a standalone scheduler with the caller's token, if it sent one (the
/// scheduler hides secrets from readers without it); the answer's text.
pub(crate) async fn remote_text(
    http: &reqwest::Client,
    url: &str,
    path: &str,
    headers: &HeaderMap,
) -> Result<String, ControlError> {
    may_forward(url)?;
    let mut req = http
        .get(format!("{}{path}", url.trim_end_matches('/')))
        .header(HOP_HEADER, "1")
        .timeout(Duration::from_secs(5));
    if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
        req = req.header(axum::http::header::AUTHORIZATION, v.clone());
    }
    let resp = req.send().await.map_err(|e| unreachable(url, e))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| unreachable(url, e))?;
    if !status.is_success() {
        let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
        let message = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("refused").to_string();
        return Err(ControlError::Forwarded { status, code: upstream_code(&v), message });
    }
    Ok(text)
}

/// The row of an app whose standalone scheduler did not answer: the app, where it was
/// asked, `"unreachable": true` and the error. A reachable app's row carries no such
/// field, so readers of the summary shape only gain one.
pub(crate) fn unreachable_row(app: &str, url: &str, e: &ControlError) -> Value {
    use flotilla_core::ServiceError;
    crate::answers::to_json(&crate::answers::UnreachableApp {
        app: app.to_string(),
        scheduler_url: url.to_string(),
        unreachable: true,
        error: crate::answers::ErrorDetail { code: e.code().to_string(), message: e.to_string() },
    })
}

/// The rows of `apps` from the standalone scheduler process at `url`, in `apps`' order:
/// one `GET url{list}` (`/v1/apps` in some view) for all of them, since one process
/// hosts up to thousands (`--apps-dir`). An app it does not list, or every app when it
/// does not answer, gets its unreachable row.
pub(crate) async fn remote_rows(
    http: &reqwest::Client,
    url: &str,
    list: &str,
    apps: &[String],
    timeout: Duration,
) -> Vec<Value> {
    match remote_within(http, url, list, timeout).await {
        Ok(listing) => pick_rows(listing, url, apps),
        Err(e) => {
            tracing::debug!(url, apps = apps.len(), error = %e, "a standalone scheduler did not answer");
            apps.iter().map(|app| unreachable_row(app, url, &e)).collect()
        }
    }
}

/// The rows of `apps` out of a scheduler process's `GET /v1/apps` answer, each naming
/// `url` as its scheduler; an app missing from it is unreachable (it moved, or the
/// process no longer hosts it).
fn pick_rows(listing: Value, url: &str, apps: &[String]) -> Vec<Value> {
    let rows = match listing {
        Value::Array(rows) => rows,
        _ => Vec::new(),
    };
    by_app(rows, apps)
        .into_iter()
        .zip(apps)
        .map(|(row, app)| match row {
            Some(mut v) => {
                if v.get("scheduler_url").is_none_or(Value::is_null) {
                    v["scheduler_url"] = json!(url);
                }
                v
            }
            None => unreachable_row(app, url, &crate::ControlError::NoSuchApp(app.clone())),
        })
        .collect()
}

/// The row of each of `apps` in a listing (by its `app`), in `apps`' order; `None` for
/// one it does not list.
pub(crate) fn by_app(rows: Vec<Value>, apps: &[String]) -> Vec<Option<Value>> {
    let mut by_app: std::collections::HashMap<String, Value> =
        rows.into_iter().filter_map(|row| Some((row.get("app")?.as_str()?.to_string(), row))).collect();
    apps.iter().map(|app| by_app.remove(app)).collect()
}

/// Whether a `GET /v1/apps` row is an app's scheduler answering for it (it names the
/// app and the instance serving it), as a registration needs.
pub(crate) fn answers_as_scheduler(row: &Value, app: &str) -> bool {
    row["app"].as_str() == Some(app) && row["scheduler"]["instance"].is_string() && row.get("unreachable").is_none()
}

/// Sends a mutating call on to a standalone scheduler with the caller's token, and
/// passes its answer (or its error) back.
pub(crate) async fn forward(
    req: reqwest::RequestBuilder,
    url: &str,
    headers: &HeaderMap,
) -> Result<Json<Value>, ControlError> {
    may_forward(url)?;
    let mut req = req.timeout(Duration::from_secs(5)).header(HOP_HEADER, "1");
    if let Some(v) = headers.get(axum::http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()) {
        req = req.header("authorization", v);
    }
    let resp = req.send().await.map_err(|e| unreachable(url, e))?;
    let status = resp.status();
    let v: Value = resp.json().await.map_err(|e| unreachable(url, e))?;
    if status.is_success() {
        Ok(Json(v))
    } else {
        let msg = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("refused").to_string();
        Err(ControlError::Forwarded { status, code: upstream_code(&v), message: msg })
    }
}
