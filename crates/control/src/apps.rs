//! Apps and their units. The control plane keeps no state of its own: in-process
//! schedulers (`flotilla up --app`) are asked directly, standalone ones (`flotilla
//! scheduler --control URL`) register their address and are asked over HTTP.

use crate::catalogue as m;
use flotilla_core::RwLockExt;
use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::http::header::CONTENT_TYPE;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router};
use flotilla_scheduler::{AppHandle, AppStatus};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::answers::{
    AppSummary, MemberRow, Queued, RouteRow, RouteTable, ScaleAnswer, SpecInForce, StoreHealth, UnitRow, to_json,
};
use crate::auth::authorize;
use crate::forward::{forward, remote, remote_rows, unreachable};
use crate::replicas::REMOTE_TTL;
use crate::tokens::Scope;
use crate::{ControlError, ControlState};

pub enum AppEndpoint {
    Local(AppHandle),
    /// A standalone scheduler's API, with when it last registered.
    Remote {
        url: String,
        seen: Instant,
    },
}

#[derive(Default)]
pub struct Apps(pub(crate) RwLock<BTreeMap<String, AppEndpoint>>);

impl Apps {
    pub fn add_local(&self, h: AppHandle) {
        self.0.write_or_recover().insert(h.app.clone(), AppEndpoint::Local(h));
    }

    /// The app's in-process scheduler, or the URL of its live standalone one.
    pub(crate) fn get(&self, app: &str) -> Option<Result<AppHandle, String>> {
        let g = self.0.read_or_recover();
        match g.get(app)? {
            AppEndpoint::Local(h) => Some(Ok(h.clone())),
            AppEndpoint::Remote { url, seen } if seen.elapsed() < REMOTE_TTL => Some(Err(url.clone())),
            AppEndpoint::Remote { .. } => None,
        }
    }

    /// Every app with its in-process scheduler or its live standalone one's URL.
    pub(crate) fn endpoints(&self) -> Vec<(String, Result<AppHandle, String>)> {
        let g = self.0.read_or_recover();
        g.iter()
            .filter_map(|(name, e)| match e {
                AppEndpoint::Local(h) => Some((name.clone(), Ok(h.clone()))),
                AppEndpoint::Remote { url, seen } if seen.elapsed() < REMOTE_TTL => {
                    Some((name.clone(), Err(url.clone())))
                }
                AppEndpoint::Remote { .. } => None,
            })
            .collect()
    }

    /// Makes the standalone schedulers those of `remote` (app → URL), as the replicas'
    /// shared store lists them: registered through any replica, live while their lease is.
    pub(crate) fn replace_remote(&self, remote: &BTreeMap<String, String>) {
        let mut g = self.0.write_or_recover();
        g.retain(|app, e| matches!(e, AppEndpoint::Local(_)) || remote.contains_key(app));
        for (app, url) in remote {
            if !matches!(g.get(app), Some(AppEndpoint::Local(_))) {
                g.insert(app.clone(), AppEndpoint::Remote { url: url.clone(), seen: Instant::now() });
            }
        }
    }

    /// The in-process schedulers.
    pub(crate) fn locals(&self) -> Vec<AppHandle> {
        self.endpoints().into_iter().filter_map(|(_, e)| e.ok()).collect()
    }
}

pub fn routes() -> Router<Arc<ControlState>> {
    Router::new()
        .route("/v1/apps", axum::routing::get(list_apps))
        .route("/v1/apps/{app}", axum::routing::get(get_app))
        .route("/v1/apps/{app}/units", axum::routing::get(list_units))
        .route("/v1/apps/{app}/routes", axum::routing::get(list_routes))
        .route("/v1/apps/{app}/scale", axum::routing::put(scale))
        .route("/v1/apps/{app}/spec", axum::routing::put(apply).get(get_spec))
}

pub(crate) fn not_found(app: &str) -> ControlError {
    ControlError::NoSuchApp(app.to_string())
}

/// Queued units by group: the pool autoscaler's demand.
fn queued(s: &AppStatus) -> Queued {
    let mut queued = [0u32; 2];
    for u in s.units.iter().filter(|u| u.state == flotilla_scheduler::UnitState::Queued) {
        queued[usize::from(u.secondary)] += 1;
    }
    Queued { primary: queued[0], secondary: queued[1] }
}

/// What the pool autoscaler reads of an app (`GET /v1/apps?view=demand`).
fn demand(s: &AppStatus) -> Value {
    json!({"app": s.app, "queued": queued(s), "unit_shape": s.unit_shape})
}

pub(crate) fn summary(s: &AppStatus) -> Value {
    let mut by_state: BTreeMap<String, u32> = BTreeMap::new();
    for u in &s.units {
        *by_state.entry(u.state.as_str().to_string()).or_default() += 1;
    }
    to_json(&AppSummary {
        app: s.app.clone(),
        desired_units: s.desired_units,
        min_units: s.min_units,
        max_units: s.max_units,
        units: by_state,
        queued: queued(s),
        unit_shape: to_json(&s.unit_shape),
        scheduler_url: None,
        autoscaling: to_json(&s.autoscaling),
        spec: SpecInForce {
            source: s.spec_origin.as_ref().map(|o| o.source.as_str().to_string()),
            at_unix_ms: s.spec_origin.as_ref().map(|o| o.at_unix_ms),
            reason: s.spec_origin.as_ref().and_then(|o| o.reason.clone()),
            template: s.template.clone(),
        },
        rollout: to_json(&s.rollout),
        canary: to_json(&s.canary),
        scheduler: to_json(&s.scheduler),
        waiting: to_json(&s.waiting),
        store: StoreHealth { healthy: s.store_error.is_none(), error: s.store_error.clone() },
    })
}

/// Queued units' rows with `pool`: why no pool can help them, when one said so.
fn with_pool_note(mut rows: Value, note: Option<String>) -> Value {
    let Some(note) = note else { return rows };
    for row in rows.as_array_mut().into_iter().flatten().filter(|r| r["state"] == "queued") {
        row["pool"] = json!(note);
    }
    rows
}

/// The unit rows of docs/architecture.md §13.
pub fn unit_rows(s: &AppStatus) -> Value {
    let rows: Vec<UnitRow> = s
        .units
        .iter()
        .map(|u| UnitRow {
            unit_id: u.unit_id.clone(),
            app: u.app.clone(),
            domain: u.domain.clone(),
            state: u.state.as_str().to_string(),
            generation: u.generation,
            unplaced_reason: u.unplaced_reason.clone(),
            placement_note: u.placement_note.clone(),
            surge: u
                .surge
                .iter()
                .map(|m| MemberRow {
                    member: m.member.clone(),
                    role: m.role.clone(),
                    alternative: (m.alternative > 0).then_some(m.alternative),
                    node_id: m.node_id.clone(),
                    state: m.state.clone().unwrap_or_else(|| "allocated".into()),
                    address: m.address.clone(),
                    usage: None,
                    ports: None,
                    port_ranges: None,
                    message: None,
                })
                .collect(),
            replaced_by: u.replaced_by.clone(),
            moving: u.moving.clone(),
            template: u.template.clone(),
            secondary: u.secondary,
            ended_unix_ms: u.ended_unix_ms,
            members: u
                .members
                .iter()
                .map(|m| MemberRow {
                    member: m.member.clone(),
                    role: m.role.clone(),
                    alternative: (m.alternative > 0).then_some(m.alternative),
                    node_id: m.node_id.clone(),
                    state: m
                        .state
                        .clone()
                        .unwrap_or_else(|| if m.node_id.is_some() { "allocated".into() } else { "pending".into() }),
                    address: m.address.clone(),
                    usage: Some(to_json(&m.usage)),
                    ports: Some(to_json(&m.ports.named)),
                    port_ranges: Some(
                        m.ports.ranges.iter().map(|(k, (a, b))| (k.clone(), json!({"min": a, "max": b}))).collect(),
                    ),
                    message: Some(to_json(&m.message)),
                })
                .collect(),
            pool: None,
        })
        .collect();
    to_json(&rows)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    #[serde(default)]
    view: ListView,
}

/// What each row of `GET /v1/apps` holds.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ListView {
    /// The app's summary, as `GET /v1/apps/{app}` answers.
    #[default]
    Summary,
    /// `app`, `queued` and `unit_shape`: what the pool autoscaler reads every pass.
    Demand,
    /// Only this process's own apps, each as the event stream's `app` message.
    Full,
}

impl ListView {
    /// The path that asks a scheduler process for its rows in this view.
    fn path(self) -> &'static str {
        match self {
            ListView::Summary => "/v1/apps",
            ListView::Demand => "/v1/apps?view=demand",
            ListView::Full => "/v1/apps?view=full",
        }
    }
}

/// How long `GET /v1/apps` waits for a standalone scheduler before it lists its apps as
/// unreachable (they are asked at once, so this bounds the whole answer).
const LIST_TIMEOUT: Duration = Duration::from_secs(2);

/// `GET /v1/apps`: every app, in name order. Each standalone scheduler process is asked
/// once for all the apps registered at its URL (one process may host thousands), all
/// processes concurrently; one that does not answer within [`LIST_TIMEOUT`] has its
/// apps listed unreachable, never failing the rest.
///
/// `?view=demand` makes each row `{"app", "queued", "unit_shape"}`: the pool autoscaler's
/// read every pass, a tenth of the bytes. `?view=full` lists only the apps this process
/// runs, each as the dashboard's `app` message (summary, units, routes, decisions,
/// capacity): what a control plane's event stream reads of a scheduler process in one
/// request instead of five per app.
#[utoipa::path(get, path = "/v1/apps", tag = "apps", params(("view" = Option<String>, Query, description = "`summary` (the default), `demand` (`app`, `queued`, `unit_shape`), or `full` (only this process's apps, each as the event stream's `app` message)")),
    responses((status = 200, body = [crate::answers::AppListRow])))]
pub(crate) async fn list_apps(State(s): State<Arc<ControlState>>, Query(q): Query<ListQuery>) -> Json<Value> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps").increment(1);
    if q.view == ListView::Full {
        let full = s.apps.locals().iter().map(crate::events::local_app_of).collect();
        return Json(Value::Array(full));
    }
    let row = if q.view == ListView::Demand { demand } else { summary };
    let mut rows: BTreeMap<String, Value> = BTreeMap::new();
    let mut by_url: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (app, e) in s.apps.endpoints() {
        match e {
            Ok(h) => {
                rows.insert(app, row(&h.status()));
            }
            Err(url) => by_url.entry(url).or_default().push(app),
        }
    }
    let asks: Vec<_> = by_url
        .into_iter()
        .map(|(url, apps)| {
            let http = s.http.clone();
            let ask = async move {
                let rows = remote_rows(&http, &url, q.view.path(), &apps, LIST_TIMEOUT).await;
                apps.into_iter().zip(rows).collect::<Vec<_>>()
            };
            // The request's hop and forward budget go with each spawned ask.
            match crate::limits::HOP.try_with(Arc::clone) {
                Ok(hop) => tokio::spawn(crate::limits::HOP.scope(hop, ask)),
                Err(_) => tokio::spawn(ask),
            }
        })
        .collect();
    for ask in asks {
        rows.extend(ask.await.unwrap_or_default());
    }
    Json(Value::Array(rows.into_values().collect()))
}

/// The app's summary; `scheduler_url` names the standalone scheduler serving it (watch its
/// routes there), or is null when this process runs it.
#[utoipa::path(get, path = "/v1/apps/{app}", tag = "apps", params(("app" = String, Path)),
    responses((status = 200, body = crate::answers::AppSummary), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn get_app(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}").increment(1);
    match s.apps.get(&app) {
        Some(Ok(h)) => Ok(Json(summary(&h.status()))),
        Some(Err(url)) => {
            let mut v = remote(&s.http, &url, &format!("/v1/apps/{app}")).await?;
            if v.get("scheduler_url").is_none_or(Value::is_null) {
                v["scheduler_url"] = json!(url);
            }
            Ok(Json(v))
        }
        None => Err(not_found(&app)),
    }
}

#[utoipa::path(get, path = "/v1/apps/{app}/units", tag = "apps", params(("app" = String, Path)),
    responses((status = 200, body = [crate::answers::UnitRow]), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn list_units(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/units").increment(1);
    match s.apps.get(&app) {
        Some(Ok(h)) => Ok(Json(with_pool_note(unit_rows(&h.status()), s.pools.cannot_place(&app)))),
        Some(Err(url)) => {
            let rows = remote(&s.http, &url, &format!("/v1/apps/{app}/units")).await?;
            Ok(Json(with_pool_note(rows, s.pools.cannot_place(&app))))
        }
        None => Err(not_found(&app)),
    }
}

/// The app's route table as its scheduler last published it (see
/// `flotilla_scheduler::routes` for the weights).
pub fn route_rows(t: &flotilla_proto::v1::RouteTable) -> Value {
    let routes = t
        .routes
        .iter()
        .map(|r| RouteRow {
            endpoint: r.endpoint.clone(),
            node_id: r.node_id.clone(),
            unit_id: r.unit_id.clone(),
            member: r.member.clone(),
            weight: r.weight,
            version: r.version.clone(),
        })
        .collect();
    let split = t.split.as_ref().map(|s| crate::answers::VersionSplit { version: s.version.clone(), share: s.share });
    to_json(&RouteTable { app: t.app.clone(), version: t.version, routes, split })
}

#[utoipa::path(get, path = "/v1/apps/{app}/routes", tag = "apps", params(("app" = String, Path)),
    responses((status = 200, body = crate::answers::RouteTable), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn list_routes(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/routes").increment(1);
    match s.apps.get(&app) {
        Some(Ok(h)) => Ok(Json(route_rows(&h.routes().borrow()))),
        Some(Err(url)) => Ok(Json(remote(&s.http, &url, &format!("/v1/apps/{app}/routes")).await?)),
        None => Err(not_found(&app)),
    }
}

/// `{"units": N}`; on an autoscaled app also `{"min": A, "max": B}` (the policy decides
/// within them) or `{"auto": true}` (lifts them).
#[derive(Deserialize, serde::Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct ScaleBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    units: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max: Option<u32>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    auto: bool,
}

/// `PUT /v1/apps/{app}/scale {"units": N}`: validated by the app's scheduler against the
/// spec's min and max, persisted in its store, acted on within a second. On an
/// autoscaled app it sets a floor and ceiling for the policy (`units` pins both).
#[utoipa::path(put, path = "/v1/apps/{app}/scale", tag = "apps", security(("bearer" = [])), params(("app" = String, Path)),
    request_body = ScaleBody,
    responses((status = 200, description = "scope operate", body = crate::answers::ScaleAnswer),
              (status = 400, body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody), (status = 422, description = "outside the spec's min and max", body = crate::answers::ErrorBody), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn scale(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    headers: HeaderMap,
    body: Result<crate::body::JsonBody<ScaleBody>, crate::body::BodyRejection>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/scale").increment(1);
    let by = authorize(&s, &headers, Scope::Operate, Some(&app))?;
    let expected = "expected {\"units\": N}, {\"min\": A, \"max\": B} or {\"auto\": true}";
    let crate::body::JsonBody(b) = body.map_err(|e| e.expecting(expected))?;
    let what = match (b.units, b.min, b.max, b.auto) {
        (Some(n), _, _, _) => format!("{app}: scaled to {n} units"),
        (_, Some(lo), Some(hi), _) => format!("{app}: autoscaling bounded to {lo}..={hi}"),
        _ => format!("{app}: autoscaling bounds lifted"),
    };
    let answer = match s.apps.get(&app) {
        Some(Ok(h)) => match (b.units, b.min, b.max, b.auto) {
            (Some(n), None, None, false) => {
                let n = h.scale(n).await?;
                Ok(Json(to_json(&ScaleAnswer { app: app.clone(), desired_units: Some(n), r#override: None })))
            }
            (None, Some(floor), Some(ceiling), false) => {
                let o = h.set_override(Some(flotilla_scheduler::Override { floor, ceiling })).await?;
                Ok(Json(to_json(&ScaleAnswer { app: app.clone(), desired_units: None, r#override: Some(to_json(&o)) })))
            }
            (None, None, None, true) => {
                h.set_override(None).await?;
                Ok(Json(to_json(&ScaleAnswer { app: app.clone(), desired_units: None, r#override: Some(Value::Null) })))
            }
            _ => Err(ControlError::BadRequest(expected.into())),
        },
        Some(Err(url)) => {
            let req = s.http.put(format!("{}/v1/apps/{app}/scale", url.trim_end_matches('/')));
            forward(req.json(&b), &url, &headers).await
        }
        None => Err(not_found(&app)),
    };
    if answer.is_ok() {
        s.journal.action("scale", Some(&app), by, what);
    }
    answer
}

/// A spec sent to `PUT …/spec` or `POST …/plan`, validated in full (every problem
/// named) before its scheduler sees it.
pub(crate) fn parse_spec(app: &str, body: &str) -> Result<flotilla_scheduler::AppSpec, ControlError> {
    if body.contains(crate::secrets::REDACTED) {
        return Err(ControlError::InvalidSpec(format!(
            "the spec holds {:?} where a secret was: it was read without the API token; put the real value back",
            crate::secrets::REDACTED
        )));
    }
    let spec = flotilla_scheduler::AppSpec::parse(body).map_err(|e| ControlError::InvalidSpec(e.to_string()))?;
    if spec.name != app {
        return Err(ControlError::InvalidSpec(format!("the spec names app {:?}, not {app:?}", spec.name)));
    }
    Ok(spec)
}

/// `?check_version=V` on `PUT …/spec`.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub(crate) struct ApplyQuery {
    /// Apply only while this version is in force (else 409 `version_conflict`).
    check_version: Option<u64>,
}

/// `PUT /v1/apps/{app}/spec` with the app's TOML spec (`flotilla apply`): validated in
/// full (every problem named), then units whose template changed roll through. With
/// `?check_version=V` it applies only while version V is in force (409
/// `version_conflict` otherwise), so two operators cannot overwrite each other unseen.
#[utoipa::path(put, path = "/v1/apps/{app}/spec", tag = "apps", security(("bearer" = [])), params(("app" = String, Path), ApplyQuery),
    request_body(content = String, content_type = "text/plain", description = "the app's spec (TOML)"),
    responses((status = 200, description = "scope deploy", body = crate::answers::Applied), (status = 400, body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody),
              (status = 409, description = "`version_conflict`: another version is in force", body = crate::answers::ErrorBody),
              (status = 422, description = "an invalid spec: every problem named", body = crate::answers::ErrorBody), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
pub(crate) async fn apply(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    query: Result<axum::extract::Query<ApplyQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    body: String,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/spec").increment(1);
    let by = authorize(&s, &headers, Scope::Deploy, Some(&app))?;
    let axum::extract::Query(q) = query
        .map_err(|e| ControlError::BadRequest(format!("{}; the query takes check_version=VERSION", e.body_text())))?;
    let spec = parse_spec(&app, &body)?;
    crate::artifact_fit::check(&s, &spec).await?;
    let answer = match s.apps.get(&app) {
        Some(Ok(h)) => {
            let req = flotilla_scheduler::ChangeRequest { by: by.clone(), check_version: q.check_version };
            Ok(Json(crate::answers::Applied::of(&app, h.apply(spec, req).await?)))
        }
        Some(Err(url)) => {
            let query = q.check_version.map(|v| format!("?check_version={v}")).unwrap_or_default();
            let req = s.http.put(format!("{}/v1/apps/{app}/spec{query}", url.trim_end_matches('/')));
            forward(req.body(body), &url, &headers).await
        }
        None => Err(not_found(&app)),
    };
    if let Ok(Json(a)) = &answer {
        let what =
            format!("{app}: spec applied, version {}: {}", a["version"], a["result"].as_str().unwrap_or("applied"));
        s.journal.action("apply", Some(&app), by, what);
    }
    answer
}

/// `GET /v1/apps/{app}/spec`: the app's current spec (TOML, as its scheduler stored it),
/// and whether a rollback has a spec to go back to (`x-flotilla-has-previous`). Without
/// the API token (when the API has one), secret-looking env values are hidden
/// ([`crate::secrets`]).
#[utoipa::path(get, path = "/v1/apps/{app}/spec", tag = "apps", params(("app" = String, Path)),
    responses((status = 200, description = "the spec in force (TOML; secret-looking values hidden without a token that may see them)", content_type = "text/plain",
               body = String, headers(("x-flotilla-has-previous" = bool, description = "whether a rollback has a spec to go back to"))), (status = 404, description = "no scheduler runs the app", body = crate::answers::ErrorBody), (status = 502, description = "its standalone scheduler did not answer", body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "get_spec", skip(s, headers))]
pub(crate) async fn get_spec(
    State(s): State<Arc<ControlState>>,
    Path(app): Path<String>,
    headers: HeaderMap,
) -> Result<Response, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/apps/{app}/spec").increment(1);
    let hide = !s.credentials().shows_secrets(&headers, &app);
    let shown = |text: String| if hide { crate::secrets::redact(&text) } else { text };
    match s.apps.get(&app) {
        Some(Ok(h)) => {
            let st = h.status();
            Ok(spec_answer(shown(st.spec_toml.to_string()), st.has_previous_spec))
        }
        Some(Err(url)) => {
            crate::forward::may_forward(&url)?;
            let mut req = s
                .http
                .get(format!("{}/v1/apps/{app}/spec", url.trim_end_matches('/')))
                .header(crate::limits::HOP_HEADER, "1")
                .timeout(Duration::from_secs(5));
            // The scheduler hides them too, unless it is given the caller's token.
            if let Some(v) = headers.get(axum::http::header::AUTHORIZATION) {
                req = req.header(axum::http::header::AUTHORIZATION, v.clone());
            }
            let resp = req.send().await.map_err(|e| unreachable(&url, e))?;
            let status = resp.status();
            let previous = resp.headers().get(HAS_PREVIOUS).is_some_and(|v| v.as_bytes() == b"true");
            let text = resp.text().await.map_err(|e| unreachable(&url, e))?;
            if !status.is_success() {
                let v: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
                let message = v.pointer("/error/message").and_then(Value::as_str).unwrap_or("refused").to_string();
                return Err(ControlError::Forwarded { status, code: crate::error::upstream_code(&v), message });
            }
            Ok(spec_answer(shown(text), previous))
        }
        None => Err(not_found(&app)),
    }
}

/// Says whether `GET /v1/apps/{app}/spec`'s app has a previous spec.
const HAS_PREVIOUS: axum::http::HeaderName = axum::http::HeaderName::from_static("x-flotilla-has-previous");

fn spec_answer(text: String, has_previous: bool) -> Response {
    let previous = if has_previous { "true" } else { "false" };
    ([(CONTENT_TYPE, "text/plain; charset=utf-8"), (HAS_PREVIOUS, previous)], text).into_response()
}
