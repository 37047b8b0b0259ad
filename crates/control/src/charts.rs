//! What the dashboard's history charts read: every [`STEP_S`] seconds a sample of each
//! app scheduled in this process (desired, running and estimated units, serving cores)
//! and of each pool (instances running, by node type) goes into [`crate::series`];
//! `GET /v1/apps/{app}/history` and `GET /v1/pools/{pool}/history` serve a window of it
//! (`1h`, `6h` or `24h`), the app's with its autoscaling decisions to mark on the chart.

use crate::catalogue as m;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use serde::Deserialize;
use serde_json::Value;

use crate::answers::{AppHistory, ChartDecision, PoolHistory};
use crate::series::STEP_S;
use crate::{ControlError, ControlState};

/// One app's sample.
fn app_sample(h: &flotilla_scheduler::AppHandle) -> BTreeMap<String, f64> {
    let s = h.status();
    let running = s.units.iter().filter(|u| u.state == flotilla_scheduler::UnitState::Running).count();
    let mut v =
        BTreeMap::from([("desired".to_string(), f64::from(s.desired_units)), ("running".to_string(), running as f64)]);
    let estimate = s.autoscaling.as_ref().and_then(|a| a.last_decision.as_ref()?.pointer("/inputs/estimate")?.as_f64());
    if let Some(e) = estimate {
        v.insert("estimated".into(), e);
    }
    let cap = h.capacity().borrow().clone();
    let millis: u64 = cap.by_priority.iter().filter_map(|p| p.resources.as_ref()).map(|r| r.cpu_millis).sum();
    v.insert("capacity_cores".into(), millis as f64 / 1000.0);
    v
}

/// One pool's sample: running instances by node type, and all of them.
fn pool_sample(row: &Value) -> BTreeMap<String, f64> {
    let mut v = BTreeMap::new();
    let mut total = 0.0;
    for i in row["instances"].as_array().into_iter().flatten().filter(|i| i["state"] == "running") {
        let t = i["node_type"].as_str().unwrap_or("?");
        *v.entry(t.to_string()).or_insert(0.0) += 1.0;
        total += 1.0;
    }
    v.insert("total".into(), total);
    v
}

/// Samples every [`STEP_S`] seconds until the process stops.
pub fn spawn(state: Arc<ControlState>) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(STEP_S));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tick.tick().await;
            let mut samples: Vec<(String, BTreeMap<String, f64>)> =
                state.apps.locals().iter().map(|h| (format!("app/{}", h.app), app_sample(h))).collect();
            for (pool, _) in state.pools.versions() {
                if let Some(row) = state.pools.row_of(&pool) {
                    samples.push((format!("pool/{pool}"), pool_sample(&row)));
                }
            }
            let series = state.series.clone();
            let t = flotilla_core::system_ms() / 1000;
            let written = tokio::task::spawn_blocking(move || series.record(t, samples)).await;
            match written {
                Ok(Ok(())) => metrics::counter!(m::CHART_SAMPLES.name, "result" => "ok").increment(1),
                Ok(Err(e)) => {
                    metrics::counter!(m::CHART_SAMPLES.name, "result" => "error").increment(1);
                    tracing::warn!(error = %e, "cannot keep the charts' history");
                }
                Err(_) => {}
            }
        }
    });
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct Window {
    /// `1h` (the default), `6h` or `24h`.
    window: Option<String>,
}

/// The window asked for, in seconds (`1h`, the default, `6h` or `24h`), and the Unix
/// second it starts at.
fn window_s(w: Result<Query<Window>, axum::extract::rejection::QueryRejection>) -> Result<(u64, u64), ControlError> {
    let Query(w) = w.map_err(|e| ControlError::BadRequest(format!("{}; it takes window=1h|6h|24h", e.body_text())))?;
    let window = match w.window.as_deref().unwrap_or("1h") {
        "1h" => 3_600,
        "6h" => 6 * 3_600,
        "24h" => 86_400,
        other => return Err(ControlError::BadRequest(format!("window={other:?}: 1h, 6h or 24h"))),
    };
    Ok((window, (flotilla_core::system_ms() / 1000).saturating_sub(window)))
}

pub fn routes() -> axum::Router<Arc<ControlState>> {
    axum::Router::new()
        .route("/v1/apps/{app}/history", axum::routing::get(app_history))
        .route("/v1/pools/{pool}/history", axum::routing::get(pool_history))
}

/// `{"app","step_s","window_s","points":[{"t","v":{"desired","running","estimated","capacity_cores"}}],
/// "decisions":[{"at_ms","action","explanation"}]}`.
#[utoipa::path(get, path = "/v1/apps/{app}/history", tag = "charts", params(("app" = String, Path), Window),
    responses((status = 200, body = crate::answers::AppHistory), (status = 400, body = crate::answers::ErrorBody), (status = 404, body = crate::answers::ErrorBody)))]
pub(crate) async fn app_history(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    window: Result<Query<Window>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<AppHistory>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/history").increment(1);
    let (window, since) = window_s(window)?;
    let points = s.series.read(&format!("app/{app}"), since);
    let endpoint = s.apps.get(&app);
    if points.is_none() && endpoint.is_none() {
        return Err(ControlError::NoSuchApp(app));
    }
    // A standalone scheduler's app is not sampled here: its history is empty.
    let handle = endpoint.and_then(Result::ok);
    let decisions = handle.map_or_else(Vec::new, |h| {
        h.decisions()
            .iter()
            .filter(|d| d["at"].as_u64().is_some_and(|at| at / 1000 >= since))
            .map(|d| ChartDecision {
                at_ms: d["at"].clone(),
                action: d["action"].clone(),
                explanation: d["explanation"].clone(),
            })
            .collect()
    });
    Ok(Json(AppHistory { app, step_s: STEP_S, window_s: window, points: points.unwrap_or_default(), decisions }))
}

/// `{"pool","step_s","window_s","points":[{"t","v":{"TYPE": running, ..., "total"}}]}`.
#[utoipa::path(get, path = "/v1/pools/{pool}/history", tag = "charts", params(("pool" = String, Path), Window),
    responses((status = 200, body = crate::answers::PoolHistory), (status = 400, body = crate::answers::ErrorBody), (status = 404, description = "`no_such_pool`", body = crate::answers::ErrorBody)))]
pub(crate) async fn pool_history(
    State(s): State<Arc<ControlState>>,
    Path(pool): Path<String>,
    window: Result<Query<Window>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<PoolHistory>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/pools/{pool}/history").increment(1);
    let (window, since) = window_s(window)?;
    // A pool that reported but was not sampled yet has an empty history.
    let points = match s.series.read(&format!("pool/{pool}"), since) {
        Some(p) => p,
        None if s.pools.row_of(&pool).is_some() => Vec::new(),
        None => return Err(ControlError::NoSuchPool(pool)),
    };
    Ok(Json(PoolHistory { pool, step_s: STEP_S, window_s: window, points }))
}
