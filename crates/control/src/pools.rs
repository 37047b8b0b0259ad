//! Node pools, as their autoscalers report them. A pool autoscaler (in `flotilla up
//! --autoscale` or its own process) posts its instances and decisions each pass and
//! gets back the pool's floor (`request_resources`), which operators set here:
//!
//! - `GET /v1/pools`, `GET /v1/pools/{pool}`: instances by type and state, decisions;
//! - `PUT /v1/pools/{pool}/constraints`, `GET` the same: the floor;
//! - `PUT /v1/pools/{pool}/node_types/{type}` `{"min","max"}`: bounds replacing the pool
//!   file's for that type;
//! - `POST /v1/pools/{pool}/report`: the autoscaler's report (answered with the floor
//!   and the bounds, which it applies from its next pass).

use crate::catalogue as m;
use flotilla_core::RwLockExt;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::{Json, Router};
use flotilla_pool::cluster::TypeBounds;
use flotilla_pool::model::Constraints;
use serde_json::{Value, json};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::auth::authorize;
use crate::replicas::{STALE_AFTER, Shared};
use crate::{ControlError, ControlState};

/// Most pools one control plane tracks.
pub const MAX_POOLS: usize = 64;

#[derive(Default)]
struct Pool {
    report: Option<(Arc<Value>, Instant)>,
    constraints: Constraints,
    /// The operator's bounds by node type.
    bounds: BTreeMap<String, TypeBounds>,
    /// Changes with every report, floor or bounds (the event stream resends the pool).
    version: u64,
}

/// Pools by name; floors are kept in `DATA/pools/NAME.constraints.json` and bounds in
/// `DATA/pools/NAME.bounds.json` when the control plane has a data dir, so they outlive
/// a restart.
#[derive(Default)]
pub struct Pools {
    pools: RwLock<BTreeMap<String, Pool>>,
    dir: Option<PathBuf>,
    versions: AtomicU64,
}

fn valid_name(name: &str) -> Result<(), ControlError> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(ControlError::BadRequest(format!("pool name {name:?}: 1 to 63 letters, digits, '-' or '_'")))
    }
}

impl Pools {
    /// The pools whose floors are kept in `dir` (created if missing).
    pub fn open(dir: PathBuf) -> anyhow::Result<Pools> {
        std::fs::create_dir_all(&dir)?;
        let mut pools: BTreeMap<String, Pool> = BTreeMap::new();
        for entry in std::fs::read_dir(&dir)?.filter_map(Result::ok) {
            let path = entry.path();
            let Some(file) = path.file_name().and_then(|n| n.to_str()) else { continue };
            let read = || -> anyhow::Result<String> { Ok(std::fs::read_to_string(&path)?) };
            let bad = |e: serde_json::Error| anyhow::anyhow!("{}: {e}", path.display());
            if let Some(name) = file.strip_suffix(".constraints.json") {
                pools.entry(name.to_string()).or_default().constraints = serde_json::from_str(&read()?).map_err(bad)?;
            } else if let Some(name) = file.strip_suffix(".bounds.json") {
                pools.entry(name.to_string()).or_default().bounds = serde_json::from_str(&read()?).map_err(bad)?;
            }
        }
        Ok(Pools { pools: RwLock::new(pools), dir: Some(dir), versions: AtomicU64::new(0) })
    }

    /// Each pool's version: it changes whenever what `GET /v1/pools/{pool}` shows does
    /// (but for its age).
    pub(crate) fn versions(&self) -> Vec<(String, u64)> {
        self.pools.read_or_recover().iter().map(|(n, p)| (n.clone(), p.version)).collect()
    }

    /// The pool's row of `GET /v1/pools/{pool}`.
    pub(crate) fn row_of(&self, pool: &str) -> Option<Value> {
        self.pools.read_or_recover().get(pool).map(|p| Pools::row(pool, p))
    }

    /// Why a pool cannot place `app`'s queued units, as its latest decision said (a
    /// pool whose autoscaler stopped reporting says nothing): `pool NAME cannot place
    /// them: REASON`.
    pub(crate) fn cannot_place(&self, app: &str) -> Option<String> {
        let pools = self.pools.read_or_recover();
        pools.iter().find_map(|(name, p)| {
            let (report, at) = p.report.as_ref()?;
            if at.elapsed() > STALE_AFTER {
                return None;
            }
            let reason = report.pointer("/decisions/0/cannot_place")?.get(app)?.as_str()?;
            Some(format!("pool {name} cannot place them: {reason}"))
        })
    }

    /// The node types of every pool that reports (`(POOL/TYPE, its report)`): nodes
    /// that may come.
    pub(crate) fn node_types(&self) -> Vec<(String, Value)> {
        let pools = self.pools.read_or_recover();
        let reported = pools.iter().filter_map(|(name, p)| {
            let (report, _) = p.report.as_ref().filter(|(_, at)| at.elapsed() <= STALE_AFTER)?;
            Some((name, report.get("node_types")?.as_array()?.clone()))
        });
        reported
            .flat_map(|(pool, types)| {
                types.into_iter().map(move |t| (format!("{pool}/{}", t["name"].as_str().unwrap_or("?")), t))
            })
            .collect()
    }

    /// Writes `DATA/pools/NAME.SUFFIX` (through a temporary file) when there is a data dir.
    fn persist(&self, pool: &str, suffix: &str, v: &impl serde::Serialize) -> Result<(), ControlError> {
        let Some(dir) = &self.dir else { return Ok(()) };
        let text = serde_json::to_string_pretty(v).map_err(|e| ControlError::Storage(e.to_string()))?;
        flotilla_obs::fsutil::write_atomic(&dir.join(format!("{pool}.{suffix}")), text.as_bytes(), 0o644)
            .map_err(|e| ControlError::Storage(e.to_string()))
    }

    fn set_bounds(
        &self,
        pool: &str,
        node_type: &str,
        b: TypeBounds,
    ) -> Result<BTreeMap<String, TypeBounds>, ControlError> {
        let mut all = self.pools.read_or_recover().get(pool).map(|p| p.bounds.clone()).unwrap_or_default();
        all.insert(node_type.to_string(), b);
        self.persist(pool, "bounds.json", &all)?;
        self.entry(pool, |p| p.bounds = all.clone())?;
        Ok(all)
    }

    fn constraints(&self, pool: &str) -> Constraints {
        self.pools.read_or_recover().get(pool).map(|p| p.constraints.clone()).unwrap_or_default()
    }

    fn entry<T>(&self, pool: &str, f: impl FnOnce(&mut Pool) -> T) -> Result<T, ControlError> {
        let mut g = self.pools.write_or_recover();
        if !g.contains_key(pool) && g.len() >= MAX_POOLS {
            return Err(ControlError::BadRequest(format!("at most {MAX_POOLS} pools")));
        }
        let p = g.entry(pool.to_string()).or_default();
        p.version = self.versions.fetch_add(1, Ordering::Relaxed) + 1;
        Ok(f(p))
    }

    fn set_constraints(&self, pool: &str, c: Constraints) -> Result<(), ControlError> {
        self.persist(pool, "constraints.json", &c)?;
        self.entry(pool, |p| p.constraints = c)
    }

    /// Makes the pools those the replicas' shared store lists: floors, bounds and the
    /// last report, whichever replica was told. A pool's version moves only when what it
    /// shows changed.
    pub(crate) fn replace_shared(&self, shared: BTreeMap<String, crate::replicas::SharedPool>) {
        let mut g = self.pools.write_or_recover();
        g.retain(|name, _| shared.contains_key(name));
        for (name, sp) in shared.into_iter().take(MAX_POOLS) {
            let constraints = sp.constraints.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default();
            let bounds = sp.bounds.and_then(|v| serde_json::from_value(v).ok()).unwrap_or_default();
            let p = g.entry(name).or_default();
            let same_report = match (&p.report, &sp.report) {
                (Some((mine, _)), Some((theirs, _))) => **mine == *theirs,
                (None, None) => true,
                _ => false,
            };
            if same_report && p.constraints == constraints && p.bounds == bounds {
                continue;
            }
            if !same_report {
                p.report = sp.report.map(|(v, at_unix_ms)| {
                    let age = Duration::from_millis(flotilla_core::system_ms().saturating_sub(at_unix_ms));
                    (Arc::new(v), Instant::now().checked_sub(age).unwrap_or_else(Instant::now))
                });
            }
            p.constraints = constraints;
            p.bounds = bounds;
            p.version = self.versions.fetch_add(1, Ordering::Relaxed) + 1;
        }
    }

    fn row(name: &str, p: &Pool) -> Value {
        let mut report: std::collections::BTreeMap<String, Value> = match p.report.as_ref().map(|(r, _)| r.as_ref()) {
            Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            _ => Default::default(),
        };
        // What this plane knows of the pool wins over what a report says of itself.
        for k in ["pool", "constraints", "bounds", "reported_ms_ago", "stale"] {
            report.remove(k);
        }
        crate::answers::to_json(&crate::answers::PoolRow {
            pool: name.to_string(),
            constraints: json!(p.constraints),
            bounds: json!(p.bounds),
            reported_ms_ago: p.report.as_ref().map(|(_, at)| at.elapsed().as_millis() as u64),
            stale: p.report.as_ref().is_none_or(|(_, at)| at.elapsed() > STALE_AFTER),
            report,
        })
    }
}

pub fn routes() -> Router<Arc<ControlState>> {
    Router::new()
        .route("/v1/pools", axum::routing::get(list))
        .route("/v1/pools/{pool}", axum::routing::get(get_pool))
        .route("/v1/pools/{pool}/constraints", axum::routing::get(get_constraints).put(put_constraints))
        .route("/v1/pools/{pool}/node_types/{node_type}", axum::routing::put(put_bounds))
        .route("/v1/pools/{pool}/report", axum::routing::post(report))
}

#[utoipa::path(get, path = "/v1/pools", operation_id = "list_pools", tag = "pools", responses((status = 200, body = [crate::answers::PoolRow])))]
pub(crate) async fn list(State(s): State<Arc<ControlState>>) -> Json<Value> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/pools").increment(1);
    let g = s.pools.pools.read_or_recover();
    Json(Value::Array(g.iter().map(|(n, p)| Pools::row(n, p)).collect()))
}

#[utoipa::path(get, path = "/v1/pools/{pool}", tag = "pools", params(("pool" = String, Path)),
    responses((status = 200, body = crate::answers::PoolRow), (status = 404, description = "`no_such_pool`", body = crate::answers::ErrorBody)))]
pub(crate) async fn get_pool(
    State(s): State<Arc<ControlState>>,
    Path(pool): Path<String>,
) -> Result<Json<Value>, ControlError> {
    let g = s.pools.pools.read_or_recover();
    let p = g.get(&pool).ok_or_else(|| ControlError::NoSuchPool(pool.clone()))?;
    Ok(Json(Pools::row(&pool, p)))
}

#[utoipa::path(get, path = "/v1/pools/{pool}/constraints", tag = "pools", params(("pool" = String, Path)),
    responses((status = 200, description = "the pool's floor: `{\"resource_requests\": [{\"resources\", \"count\"}]}`", body = Object)))]
pub(crate) async fn get_constraints(State(s): State<Arc<ControlState>>, Path(pool): Path<String>) -> Json<Value> {
    Json(json!(s.pools.constraints(&pool)))
}

/// `PUT /v1/pools/{pool}/constraints {"resource_requests": [{"resources": {...}, "count": N}]}`:
/// Ray's `request_resources`. The pool holds at least this capacity whatever the demand;
/// an empty list lifts the floor.
#[utoipa::path(put, path = "/v1/pools/{pool}/constraints", tag = "pools", security(("bearer" = [])), params(("pool" = String, Path)),
    request_body(content = Object, description = "`{\"resource_requests\": [{\"resources\": {…}, \"count\": N}]}`"),
    responses((status = 200, description = "scope operate; the floor in force", body = Object), (status = 400, body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody), (status = 422, body = crate::answers::ErrorBody)))]
pub(crate) async fn put_constraints(
    State(s): State<Arc<ControlState>>,
    Path(pool): Path<String>,
    headers: HeaderMap,
    body: Result<crate::body::JsonBody<Constraints>, crate::body::BodyRejection>,
) -> Result<Json<Value>, ControlError> {
    let by = authorize(&s, &headers, crate::tokens::Scope::Operate, None)?;
    valid_name(&pool)?;
    let crate::body::JsonBody(c) = body?;
    c.validate().map_err(ControlError::BadRequest)?;
    s.pools.set_constraints(&pool, c.clone())?;
    if let Some(replicas) = &s.replicas {
        let json = serde_json::to_string(&c).map_err(|e| ControlError::Storage(e.to_string()))?;
        replicas.put(Shared::Constraints { pool: &pool, json }).await?;
    }
    tracing::info!(pool, requests = c.resource_requests.len(), "pool floor set");
    let floor = format!("pool {pool}: floor set to {} request(s)", c.resource_requests.len());
    s.journal.action("pool_floor", None, by, floor);
    metrics::counter!(m::POOL_CONSTRAINTS_SET.name).increment(1);
    Ok(Json(json!(c)))
}

/// When the newest decision of a report was made.
fn newest_decision_ms(report: &Value) -> Option<u64> {
    report.pointer("/decisions/0/at_ms")?.as_u64()
}

/// A report's decisions that launched, terminated or found something infeasible, as
/// events with when each was made (quiet passes are not events).
fn pool_events(pool: &str, report: &Value) -> Vec<(u64, crate::journal::NewEvent)> {
    let acted = |d: &Value| {
        ["launch", "terminate", "infeasible"].iter().any(|k| {
            d[*k].as_object().is_some_and(|m| !m.is_empty()) || d[*k].as_array().is_some_and(|a| !a.is_empty())
        })
    };
    let decisions = report["decisions"].as_array().map(Vec::as_slice).unwrap_or_default();
    decisions
        .iter()
        .filter(|d| acted(d))
        .filter_map(|d| {
            let what = d["explanation"].as_str().unwrap_or("a decision");
            Some((d["at_ms"].as_u64()?, crate::journal::NewEvent::new("pool", format!("pool {pool}: {what}"))))
        })
        .rev()
        .collect()
}

/// `POST /v1/pools/{pool}/report`: an autoscaler's instances and decisions.
#[utoipa::path(post, path = "/v1/pools/{pool}/report", tag = "pools", security(("bearer" = [])), params(("pool" = String, Path)),
    request_body(content = Object, description = "a pool autoscaler's report"),
    responses((status = 200, description = "scope admin", body = crate::answers::ReportAnswer), (status = 400, body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody)))]
pub(crate) async fn report(
    State(s): State<Arc<ControlState>>,
    Path(pool): Path<String>,
    headers: HeaderMap,
    body: Result<crate::body::JsonBody<Value>, crate::body::BodyRejection>,
) -> Result<Json<Value>, ControlError> {
    authorize(&s, &headers, crate::tokens::Scope::Admin, None)?;
    valid_name(&pool)?;
    let crate::body::JsonBody(v) = body?;
    if !v.is_object() || !v.get("instances").is_some_and(Value::is_array) {
        return Err(ControlError::BadRequest("a report is an object with an \"instances\" array".into()));
    }
    let shared = json!({"at_unix_ms": flotilla_core::system_ms(), "report": &v}).to_string();
    let events = pool_events(&pool, &v);
    let (constraints, bounds, seen) = s.pools.entry(&pool, |p| {
        let seen = p.report.as_ref().map(|(r, _)| newest_decision_ms(r).unwrap_or(0));
        p.report = Some((Arc::new(v), Instant::now()));
        (p.constraints.clone(), p.bounds.clone(), seen)
    })?;
    // The first report this process gets is taken as seen (its decisions may be
    // recorded already, before a restart); later ones add what is newer.
    if let Some(seen) = seen {
        s.journal.record(events.into_iter().filter(|(at, _)| *at > seen).map(|(_, e)| e).collect());
    }
    if let Some(replicas) = &s.replicas {
        replicas.put(Shared::Report { pool: &pool, json: shared }).await?;
    }
    Ok(Json(crate::answers::to_json(&crate::answers::ReportAnswer {
        constraints: json!(constraints),
        bounds: json!(bounds),
    })))
}

/// `PUT /v1/pools/{pool}/node_types/{type} {"min": A, "max": B}`: bounds that replace the
/// pool file's min and max for that type (min ≤ max ≤ 100,000), kept like the floor and
/// handed to the autoscaler with the answer to its next report. When the pool has
/// reported, the type must be one of its node types.
#[utoipa::path(put, path = "/v1/pools/{pool}/node_types/{node_type}", tag = "pools", security(("bearer" = [])), params(("pool" = String, Path), ("node_type" = String, Path)),
    request_body(content = Object, description = "`{\"min\": A, \"max\": B}`, min ≤ max ≤ 100,000"),
    responses((status = 200, description = "scope operate", body = crate::answers::PoolBounds), (status = 400, body = crate::answers::ErrorBody), (status = 401, body = crate::answers::ErrorBody), (status = 403, description = "the token lacks the scope, or is for other apps", body = crate::answers::ErrorBody), (status = 422, body = crate::answers::ErrorBody)))]
#[tracing::instrument(name = "put_pool_bounds", skip(s, headers, body))]
pub(crate) async fn put_bounds(
    State(s): State<Arc<ControlState>>,
    Path((pool, node_type)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<crate::body::JsonBody<TypeBounds>, crate::body::BodyRejection>,
) -> Result<Json<Value>, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/pools/{pool}/node_types/{type}").increment(1);
    let by = authorize(&s, &headers, crate::tokens::Scope::Operate, None)?;
    valid_name(&pool)?;
    valid_name(&node_type).map_err(|_| {
        ControlError::BadRequest(format!("node type {node_type:?}: 1 to 63 letters, digits, '-' or '_'"))
    })?;
    let crate::body::JsonBody(b) = body.map_err(|e| e.expecting("expected {\"min\": A, \"max\": B}"))?;
    b.validate().map_err(ControlError::BadRequest)?;
    let known = s.pools.row_of(&pool).and_then(|r| {
        let types = r.get("node_types")?.as_array()?.iter().filter_map(|t| t.get("name")?.as_str().map(str::to_string));
        Some(types.collect::<Vec<_>>())
    });
    if let Some(types) = known.filter(|t| !t.is_empty())
        && !types.contains(&node_type)
    {
        return Err(ControlError::BadRequest(format!(
            "pool {pool} has no node type {node_type:?} (it has {})",
            types.join(", ")
        )));
    }
    let all = s.pools.set_bounds(&pool, &node_type, b)?;
    if let Some(replicas) = &s.replicas {
        let json = serde_json::to_string(&all).map_err(|e| ControlError::Storage(e.to_string()))?;
        replicas.put(Shared::Bounds { pool: &pool, json }).await?;
    }
    tracing::info!(pool, node_type, min = b.min, max = b.max, "pool node type bounds set");
    let bounds = format!("pool {pool}: {node_type} bounded to {}..={}", b.min, b.max);
    s.journal.action("pool_bounds", None, by, bounds);
    metrics::counter!(m::POOL_BOUNDS_SET.name).increment(1);
    Ok(Json(crate::answers::to_json(&crate::answers::PoolBounds { pool, bounds: json!(all) })))
}
