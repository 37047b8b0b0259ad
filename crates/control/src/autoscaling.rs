//! The autoscaling API: an app's decisions, its consumers' demand, its serving capacity,
//! and the named policies. Apps whose scheduler runs elsewhere are asked there.

use crate::catalogue as m;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::routing::{get, put};
use axum::{Json, Router};
use flotilla_proto::v1;
use flotilla_scheduler::DemandRequest;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::answers::to_json;
use crate::answers::{CapacityRow, PriorityCapacity};
use crate::apps::not_found;
use crate::auth::authorize;
use crate::forward::{forward, remote};
use crate::tokens::Scope;
use crate::{ControlError, ControlState};

/// Longest a decisions listing is (the store keeps this many).
const MAX_DECISIONS: usize = flotilla_scheduler::DECISIONS_KEPT;

pub fn routes() -> Router<Arc<ControlState>> {
    Router::new()
        .route("/v1/apps/{app}/decisions", get(decisions))
        .route("/v1/apps/{app}/demand", put(demand))
        .route("/v1/apps/{app}/capacity", get(capacity))
        .route("/v1/policies", get(list_policies))
        .route("/v1/policies/{name}", put(apply_policy))
}

/// `GET /v1/apps/{app}/decisions`: the app's autoscaling decisions, newest first.
#[utoipa::path(get, path = "/v1/apps/{app}/decisions", tag = "autoscaling", params(("app" = String, Path)),
    responses((status = 200, description = "the autoscaling decisions, newest first, with the numbers behind each", body = [Object]), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn decisions(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/decisions").increment(1);
    match s.apps.get(&app) {
        Some(Ok(h)) => {
            let d = h.decisions();
            Ok(Json(Value::Array(d.iter().take(MAX_DECISIONS).map(|r| r.as_ref().clone()).collect())))
        }
        Some(Err(url)) => Ok(Json(remote(&s.http, &url, &format!("/v1/apps/{app}/decisions")).await?)),
        None => Err(not_found(&app)),
    }
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct DemandBody {
    /// `[{"resources": {"cpu_millis", "memory_bytes", …}, "count": N}]`
    #[schema(value_type = Vec<Object>)]
    requests: Vec<DemandRequest>,
    ttl_seconds: u64,
}

/// `PUT /v1/apps/{app}/demand {"requests": [{"resources": {...}, "count": N}], "ttl_seconds": T}`:
/// what consumers need the app to be able to run (like Ray's `request_resources`),
/// replacing the last demand, for `ttl_seconds`.
#[utoipa::path(put, path = "/v1/apps/{app}/demand", tag = "autoscaling", security(("bearer" = [])), params(("app" = String, Path)), request_body = DemandBody,
    responses((status = 200, description = "scope operate", body = crate::answers::DemandAnswer), (status = 400, body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody), (status = 422, body = crate::answers::ErrorBody), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn demand(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: Result<crate::body::JsonBody<DemandBody>, crate::body::BodyRejection>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/demand").increment(1);
    authorize(&s, &headers, Scope::Operate, Some(&app))?;
    let crate::body::JsonBody(b) = body.map_err(|e| {
        e.expecting(
            "expected {\"requests\": [{\"resources\": {\"cpu_millis\": N, \"memory_bytes\": N}, \"count\": N}], \
             \"ttl_seconds\": N}",
        )
    })?;
    match s.apps.get(&app) {
        Some(Ok(h)) => {
            let d = h.demand(b.requests, b.ttl_seconds.saturating_mul(1000)).await?;
            Ok(Json(to_json(&crate::answers::DemandAnswer { app, demand: to_json(&d) })))
        }
        Some(Err(url)) => {
            let req = s.http.put(format!("{}/v1/apps/{app}/demand", url.trim_end_matches('/')));
            forward(req.json(&json!({"requests": b.requests, "ttl_seconds": b.ttl_seconds})), &url, &headers).await
        }
        None => Err(not_found(&app)),
    }
}

/// The capacity row: total weight, and weight and weighted resources by priority.
pub fn capacity_row(c: &v1::Capacity) -> Value {
    let by_priority = c
        .by_priority
        .iter()
        .map(|p| {
            let r = p.resources.clone().unwrap_or_default();
            let row = PriorityCapacity {
                weight: p.weight,
                cpu_millis: r.cpu_millis,
                memory_bytes: r.memory_bytes,
                gpu: r.gpu,
            };
            (p.priority.clone(), row)
        })
        .collect();
    to_json(&CapacityRow { app: c.app.clone(), version: c.version, total_weight: c.total_weight, by_priority })
}

/// `GET /v1/apps/{app}/capacity`: what the app can serve now (`WatchCapacity` streams it).
#[utoipa::path(get, path = "/v1/apps/{app}/capacity", tag = "autoscaling", params(("app" = String, Path)),
    responses((status = 200, body = crate::answers::CapacityRow), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn capacity(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/capacity").increment(1);
    match s.apps.get(&app) {
        Some(Ok(h)) => Ok(Json(capacity_row(&h.capacity().borrow()))),
        Some(Err(url)) => Ok(Json(remote(&s.http, &url, &format!("/v1/apps/{app}/capacity")).await?)),
        None => Err(not_found(&app)),
    }
}

#[utoipa::path(get, path = "/v1/policies", tag = "autoscaling", responses((status = 200, body = [crate::answers::PolicyRow])))]
pub(crate) async fn list_policies(State(s): State<Arc<ControlState>>) -> Json<Value> {
    Json(s.policies.list())
}

/// `PUT /v1/policies/{name}` with the policy file (TOML): validated in full, then every
/// app that names it follows it from its next evaluation.
#[utoipa::path(put, path = "/v1/policies/{name}", tag = "autoscaling", security(("bearer" = [])), params(("name" = String, Path)),
    request_body(content = String, content_type = "text/plain", description = "the policy file (TOML)"),
    responses((status = 200, description = "scope deploy", body = crate::answers::PolicyApplied), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody), (status = 422, description = "an invalid policy, every problem named", body = crate::answers::ErrorBody)))]
pub(crate) async fn apply_policy(
    State(s): State<Arc<ControlState>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: String,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/policies/{name}").increment(1);
    let by = authorize(&s, &headers, Scope::Deploy, None)?;
    s.policies.apply(&name, &body)?;
    if let Some(replicas) = &s.replicas {
        replicas.put(crate::replicas::Shared::Policy { name: &name, toml: &body }).await?;
    }
    s.journal.action("policy", None, by, format!("policy {name} applied"));
    Ok(Json(to_json(&crate::answers::PolicyApplied { name, result: "applied".into() })))
}
