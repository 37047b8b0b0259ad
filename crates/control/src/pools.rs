//! Node pools, as their autoscalers report them. A pool autoscaler (in `flotilla up
//! --autoscale` or its own process) posts its instances and decisions each pass and
//! gets back the pool's floor (`request_resources`), which operators set here:
//!
//! - `GET /v1/pools`, `GET /v1/pools/{pool}`: instances by type and state, decisions;
//! - `PUT /v1/pools/{pool}/constraints`, `GET` the same: the floor;
//! - `POST /v1/pools/{pool}/report`: the autoscaler's report (answered with the floor).

use flotilla_core::RwLockExt;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::{Json, Router};
use flotilla_pool::reconciler::Constraints;
use serde_json::{Value, json};

use crate::apps::authorize;
use crate::{ControlError, ControlState};

/// A pool whose autoscaler stops reporting for this long shows as stale.
const STALE_AFTER: Duration = Duration::from_secs(60);
/// Most pools one control plane tracks.
pub const MAX_POOLS: usize = 64;

struct Pool {
    report: Option<(Arc<Value>, Instant)>,
    constraints: Constraints,
}

/// Pools by name; floors are kept in `DATA/pools/NAME.constraints.json` when the control
/// plane has a data dir, so they outlive a restart.
#[derive(Default)]
pub struct Pools {
    pools: RwLock<BTreeMap<String, Pool>>,
    dir: Option<PathBuf>,
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
        let mut pools = BTreeMap::new();
        for entry in std::fs::read_dir(&dir)?.filter_map(Result::ok) {
            let path = entry.path();
            let Some(name) =
                path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".constraints.json"))
            else {
                continue;
            };
            let text = std::fs::read_to_string(&path)?;
            let constraints: Constraints =
                serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            pools.insert(name.to_string(), Pool { report: None, constraints });
        }
        Ok(Pools { pools: RwLock::new(pools), dir: Some(dir) })
    }

    fn constraints(&self, pool: &str) -> Constraints {
        self.pools.read_or_recover().get(pool).map(|p| p.constraints.clone()).unwrap_or_default()
    }

    fn entry<T>(&self, pool: &str, f: impl FnOnce(&mut Pool) -> T) -> Result<T, ControlError> {
        let mut g = self.pools.write_or_recover();
        if !g.contains_key(pool) && g.len() >= MAX_POOLS {
            return Err(ControlError::BadRequest(format!("at most {MAX_POOLS} pools")));
        }
        let p = g.entry(pool.to_string()).or_insert_with(|| Pool { report: None, constraints: Constraints::default() });
        Ok(f(p))
    }

    fn set_constraints(&self, pool: &str, c: Constraints) -> Result<(), ControlError> {
        if let Some(dir) = &self.dir {
            let tmp = dir.join(format!(".{pool}.constraints.json.tmp"));
            let text = serde_json::to_string_pretty(&c).map_err(|e| ControlError::Storage(e.to_string()))?;
            std::fs::write(&tmp, text)
                .and_then(|()| std::fs::rename(&tmp, dir.join(format!("{pool}.constraints.json"))))
                .map_err(|e| ControlError::Storage(format!("{}: {e}", dir.display())))?;
        }
        self.entry(pool, |p| p.constraints = c)
    }

    fn row(name: &str, p: &Pool) -> Value {
        let mut v = p.report.as_ref().map(|(r, _)| r.as_ref().clone()).unwrap_or_else(|| json!({}));
        v["pool"] = json!(name);
        v["constraints"] = json!(p.constraints);
        v["reported_ms_ago"] = json!(p.report.as_ref().map(|(_, at)| at.elapsed().as_millis() as u64));
        v["stale"] = json!(p.report.as_ref().is_none_or(|(_, at)| at.elapsed() > STALE_AFTER));
        v
    }
}

pub fn routes() -> Router<Arc<ControlState>> {
    Router::new()
        .route("/v1/pools", axum::routing::get(list))
        .route("/v1/pools/{pool}", axum::routing::get(get_pool))
        .route("/v1/pools/{pool}/constraints", axum::routing::get(get_constraints).put(put_constraints))
        .route("/v1/pools/{pool}/report", axum::routing::post(report))
}

async fn list(State(s): State<Arc<ControlState>>) -> Json<Value> {
    metrics::counter!("flotilla_api_requests_total", "route" => "/v1/pools").increment(1);
    let g = s.pools.pools.read_or_recover();
    Json(Value::Array(g.iter().map(|(n, p)| Pools::row(n, p)).collect()))
}

async fn get_pool(State(s): State<Arc<ControlState>>, Path(pool): Path<String>) -> Result<Json<Value>, ControlError> {
    let g = s.pools.pools.read_or_recover();
    let p = g.get(&pool).ok_or_else(|| ControlError::NoSuchPool(pool.clone()))?;
    Ok(Json(Pools::row(&pool, p)))
}

async fn get_constraints(State(s): State<Arc<ControlState>>, Path(pool): Path<String>) -> Json<Value> {
    Json(json!(s.pools.constraints(&pool)))
}

/// `PUT /v1/pools/{pool}/constraints {"resource_requests": [{"resources": {...}, "count": N}]}`:
/// Ray's `request_resources`. The pool holds at least this capacity whatever the demand;
/// an empty list lifts the floor.
async fn put_constraints(
    State(s): State<Arc<ControlState>>,
    Path(pool): Path<String>,
    headers: HeaderMap,
    body: Result<Json<Constraints>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ControlError> {
    authorize(&s, &headers)?;
    valid_name(&pool)?;
    let Json(c) = body.map_err(|e| ControlError::BadRequest(e.body_text()))?;
    c.validate().map_err(ControlError::BadRequest)?;
    s.pools.set_constraints(&pool, c.clone())?;
    tracing::info!(pool, requests = c.resource_requests.len(), "pool floor set");
    metrics::counter!("flotilla_pool_constraints_set_total").increment(1);
    Ok(Json(json!(c)))
}

/// `POST /v1/pools/{pool}/report`: an autoscaler's instances and decisions.
async fn report(
    State(s): State<Arc<ControlState>>,
    Path(pool): Path<String>,
    headers: HeaderMap,
    body: Result<Json<Value>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Value>, ControlError> {
    authorize(&s, &headers)?;
    valid_name(&pool)?;
    let Json(v) = body.map_err(|e| ControlError::BadRequest(e.body_text()))?;
    if !v.is_object() || !v.get("instances").is_some_and(Value::is_array) {
        return Err(ControlError::BadRequest("a report is an object with an \"instances\" array".into()));
    }
    let constraints = s.pools.entry(&pool, |p| {
        p.report = Some((Arc::new(v), Instant::now()));
        p.constraints.clone()
    })?;
    Ok(Json(json!({"constraints": constraints})))
}
