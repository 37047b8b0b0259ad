//! The control plane's HTTP API (JSON). It keeps no state of its own: everything it
//! shows comes from the shards' views, followed over `WatchView`.

pub mod answers;
pub mod apps;
mod artifact_fit;
pub mod artifact_remote;
pub mod artifacts;
mod auth;
mod autoscaling;
mod body;
pub mod catalogue;
mod charts;
mod error;
pub mod events;
mod forward;
pub mod hosts;
pub mod journal;
mod journal_watch;
mod json;
pub mod limits;
pub mod logs;
pub mod nodes;
pub mod openapi;
mod policies;
mod pools;
mod rebalance;
pub mod replicas;
mod rollouts;
pub mod routes_grpc;
mod schedulers;
pub mod secrets;
pub mod series;
mod serve;
pub mod tokens;
pub mod ui;
mod versions;
mod warm;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use flotilla_proto::dial::Dialer;
use flotilla_proto::v1;
use flotilla_view::ClusterView;

pub use autoscaling::capacity_row;
pub use error::{ApiError, ControlError, http_status};
pub use json::{NodeRow, node_rows};
pub use policies::Policies;
pub use pools::Pools;
pub use schedulers::SchedulerNetworks;
pub use serve::{HttpOptions, MAX_CONNECTIONS_PER_PEER, MAX_STREAMS_PER_CONNECTION, tls_config};

pub struct ControlState {
    pub cluster: Arc<ClusterView>,
    /// Shard addresses in index order, shown by `/v1/shards`.
    pub shards: Vec<String>,
    /// Bearer token for mutating calls (none: they are open); a reload replaces it.
    pub api_token: flotilla_core::SharedToken,
    /// Named tokens with scopes (the tokens file); the API token is `admin` beside them.
    pub tokens: Arc<tokens::Tokens>,
    /// The events kept for `flotilla events` (a file with `up`, else memory).
    pub journal: Arc<journal::Journal>,
    /// The charts' history: apps and pools every 10 s for a day (a file with `up`).
    pub series: Arc<series::Series>,
    pub apps: apps::Apps,
    /// Where a standalone scheduler's URL may point (`--scheduler-networks`).
    pub scheduler_networks: SchedulerNetworks,
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
    /// The artifact origin and tracker (`--artifacts-dir`), when this process keeps them.
    pub artifacts: Option<Arc<artifacts::Origin>>,
}

/// Starts recording what changes (node statuses, units, rollouts, decisions) in the
/// state's journal, once a second, and the charts' samples every 10 s.
pub fn record_events(state: Arc<ControlState>) {
    journal_watch::spawn(state.clone());
    charts::spawn(state);
}

impl ControlState {
    pub fn credentials(&self) -> tokens::Credentials {
        tokens::Credentials { api_token: self.api_token.clone(), tokens: self.tokens.clone() }
    }
}

/// The whole API. Its `/v1/events` stream has one [`events::Hub`] per router.
pub fn router(state: Arc<ControlState>) -> Router {
    let hub = events::Hub::new(state.clone());
    Router::new()
        .route("/v1/nodes", get(nodes::list))
        .route("/v1/nodes/{node}", get(nodes::get))
        .route("/v1/shards", get(nodes::list_shards))
        .route("/v1/nodes/{node}/{action}", axum::routing::post(nodes::node_action))
        .merge(apps::routes())
        .merge(versions::routes())
        .merge(rollouts::routes())
        .merge(logs::routes())
        .merge(openapi::routes())
        .merge(auth::routes())
        .merge(journal::routes())
        .merge(charts::routes())
        .merge(schedulers::routes())
        .merge(autoscaling::routes())
        .merge(rebalance::routes())
        .merge(pools::routes())
        .merge(artifacts::routes())
        .merge(warm::routes())
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
    let creds = state.credentials();
    let app = limits::apply(router(state), limiter, creds, options.allowed_hosts.clone());
    serve::serve_router(listener, app, options.tls, options.write_stall, shutdown).await
}

/// Starts one follower task per shard address (`host:port`).
pub fn follow_all(cluster: &Arc<ClusterView>, shards: &[String], dialer: &Dialer) {
    for (i, a) in shards.iter().enumerate() {
        tokio::spawn(flotilla_view::follow_shard(cluster.clone(), i, a.clone(), dialer.clone()));
    }
}
