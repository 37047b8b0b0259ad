//! Observability shared by every Flotilla process: tracing setup, the Prometheus
//! recorder and its `/metrics` endpoint, and an allocation meter used to report
//! how many bytes a new view version really copies.

pub mod alloc;

use std::net::SocketAddr;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Initialises `tracing` once: human-readable by default, JSON when `json` is set.
/// The level comes from `RUST_LOG` (default `info`).
pub fn init_tracing(json: bool) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = if json { builder.json().try_init() } else { builder.try_init() };
}

/// Installs the process-wide Prometheus recorder (once) and returns its handle.
pub fn metrics_handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = PrometheusBuilder::new()
                .set_buckets(&[
                    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                ])
                .map(|b| b.build_recorder())
                .unwrap_or_else(|_| PrometheusBuilder::new().build_recorder());
            let handle = recorder.handle();
            // A recorder installed earlier (by a test harness) keeps working; we still render ours.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// An axum router serving `GET /metrics` from the process recorder.
pub fn metrics_router() -> axum::Router {
    let handle = metrics_handle();
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let h = handle.clone();
            async move { h.render() }
        }),
    )
}

/// Serves `/metrics` on `addr` in the background; returns the bound address.
pub async fn serve_metrics(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let app = metrics_router();
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "metrics server stopped");
        }
    });
    tracing::info!(%local, "serving /metrics");
    Ok(local)
}
