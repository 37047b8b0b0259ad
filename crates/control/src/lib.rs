//! The control plane's HTTP API (JSON). It keeps no state of its own: everything it
//! shows comes from the shards' views, followed over `WatchView`.

pub mod apps;
mod autoscaling;
pub mod catalogue;
mod error;
pub mod events;
mod json;
pub mod limits;
pub mod nodes;
mod policies;
mod pools;
pub mod replicas;
pub mod routes_grpc;
mod serve;
pub mod ui;

use crate::catalogue as m;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::State;
use axum::routing::get;
use axum::{Json, Router};
use flotilla_proto::dial::Dialer;
use flotilla_proto::v1;
use flotilla_view::ClusterView;

pub use autoscaling::capacity_row;
pub use error::{ApiError, ControlError, http_status};
pub use json::{NodeRow, node_rows};
pub use policies::Policies;
pub use pools::Pools;
pub use serve::{HttpOptions, MAX_CONNECTIONS_PER_PEER, MAX_STREAMS_PER_CONNECTION, tls_config};

pub struct ControlState {
    pub cluster: Arc<ClusterView>,
    /// Shard addresses in index order, shown by `/v1/shards`.
    pub shards: Vec<String>,
    /// Bearer token for mutating calls (none: they are open); a reload replaces it.
    pub api_token: flotilla_core::SharedToken,
    pub apps: apps::Apps,
    /// For calls to standalone schedulers' APIs (trusting the CA they may serve HTTPS with).
    pub http: reqwest::Client,
    /// How the shards' gRPC is reached (its token and TLS).
    pub dialer: Dialer,
    /// Named autoscaling policies.
    pub policies: Policies,
    /// Node pools as their autoscalers report them, and their floors.
    pub pools: Pools,
    /// The store shared with other control-plane replicas (etcd), when there is one.
    pub replicas: Option<Arc<replicas::Replicas>>,
}

/// The whole API. Its `/v1/events` stream has one [`events::Hub`] per router.
pub fn router(state: Arc<ControlState>) -> Router {
    let hub = events::Hub::new(state.clone());
    Router::new()
        .route("/v1/nodes", get(nodes::list))
        .route("/v1/nodes/{node}", get(nodes::get))
        .route("/v1/shards", get(list_shards))
        .route("/v1/nodes/{node}/{action}", axum::routing::post(node_action))
        .merge(apps::routes())
        .merge(autoscaling::routes())
        .merge(pools::routes())
        .merge(ui::routes())
        .fallback(|| async { ControlError::NoSuchEndpoint })
        // gRPC shares the port (HTTP/2); its paths name the service.
        .route_service(
            "/flotilla.v1.RouteService/{*method}",
            v1::route_service_server::RouteServiceServer::new(routes_grpc::RoutesGrpc(state.clone())),
        )
        .with_state(state)
        .merge(events::routes(hub))
        .merge(flotilla_obs::metrics_router())
        // /healthz and /readyz: the process's readiness gates (a scheduler's view and store).
        .merge(flotilla_obs::health::router())
}

/// `POST /v1/nodes/{node}/cordon|drain|uncordon`. A drain also asks every app's scheduler
/// to replace the members the node runs elsewhere before they are stopped.
async fn node_action(
    State(s): State<Arc<ControlState>>,
    axum::extract::Path((node, action)): axum::extract::Path<(String, String)>,
    headers: axum::http::HeaderMap,
) -> Result<Json<serde_json::Value>, ControlError> {
    let what = match action.as_str() {
        "cordon" => NodeAction::Cordon,
        "drain" => NodeAction::Drain,
        "uncordon" => NodeAction::Uncordon,
        _ => return Err(ControlError::NoSuchAction(action)),
    };
    set_cordon(&s, &node, &headers, what).await
}

#[derive(Clone, Copy, PartialEq)]
enum NodeAction {
    Cordon,
    Drain,
    Uncordon,
}

/// Asks the shard that owns `node` to (un)cordon or drain it; the change shows in the
/// next view.
async fn set_cordon(
    s: &ControlState,
    node: &str,
    headers: &axum::http::HeaderMap,
    what: NodeAction,
) -> Result<Json<serde_json::Value>, ControlError> {
    let (cordoned, drain) = (what != NodeAction::Uncordon, what == NodeAction::Drain);
    apps::authorize(s, headers)?;
    let not_found = || ControlError::NoSuchNode(node.to_string());
    let id = flotilla_core::NodeId::new(node).map_err(|_| not_found())?;
    let shard = s.cluster.slots().iter().position(|slot| slot.view.get(&id).is_some()).ok_or_else(not_found)?;
    let addr = s.shards.get(shard).ok_or_else(not_found)?;
    let unreachable = |message: String| ControlError::ShardUnreachable { shard, message };
    // `a|b`: the shard's active process and its standbys; the first that answers.
    let mut channel = Err(String::from("no address"));
    for alt in flotilla_core::shard_alternates(addr) {
        channel = s.dialer.connect(alt, Some(std::time::Duration::from_secs(10))).await.map_err(|e| e.to_string());
        if channel.is_ok() {
            break;
        }
    }
    let mut client =
        flotilla_proto::v1::node_admin_service_client::NodeAdminServiceClient::new(channel.map_err(unreachable)?);
    let r = client
        .set_cordon(flotilla_proto::v1::CordonRequest { node_id: node.to_string(), cordoned, drain })
        .await
        .map_err(|e| unreachable(e.message().to_string()))?
        .into_inner();
    if !r.found {
        return Err(not_found());
    }
    tracing::info!(node, cordoned, drain, "node cordon changed");
    Ok(Json(serde_json::json!({"node_id": node, "cordoned": cordoned, "drain_requested": drain})))
}

async fn list_shards(State(s): State<Arc<ControlState>>) -> Json<serde_json::Value> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/shards").increment(1);
    let rows: Vec<_> = s
        .cluster
        .slots()
        .iter()
        .enumerate()
        .map(|(i, slot)| {
            serde_json::json!({
                "shard": i,
                "address": s.shards.get(i),
                "connected": slot.connected,
                "version": {"epoch": slot.view.version.epoch, "seq": slot.view.version.seq},
                "nodes": slot.view.len(),
            })
        })
        .collect();
    Json(serde_json::Value::Array(rows))
}

/// Serves the API on `listener` (HTTPS when `options` carry TLS, with their per-peer
/// rate limit and the body cap) until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<ControlState>,
    options: HttpOptions,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr: SocketAddr = listener.local_addr()?;
    tracing::info!(%addr, scheme = options.scheme(), rate_limit = options.rate_limit, "control API listening");
    let limiter = limits::RateLimiter::new(options.rate_limit).map(Arc::new);
    let token = state.api_token.clone();
    let app = limits::apply(router(state), limiter, token);
    serve::serve_router(listener, app, options.tls, shutdown).await
}

/// Starts one follower task per shard address (`host:port`).
pub fn follow_all(cluster: &Arc<ClusterView>, shards: &[String], dialer: &Dialer) {
    for (i, a) in shards.iter().enumerate() {
        tokio::spawn(flotilla_view::follow_shard(cluster.clone(), i, a.clone(), dialer.clone()));
    }
}
