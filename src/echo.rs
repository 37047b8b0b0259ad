//! `flotilla echo-server`: a tiny HTTP workload that answers with who it is (node,
//! app, unit, role), for demos and tests. It listens on `$FLOTILLA_PORT` by default.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use axum::Json;
use axum::routing::get;
use clap::Args;

#[derive(Debug, Args)]
pub struct EchoArgs {
    /// Where to listen (default: 0.0.0.0:$FLOTILLA_PORT, else 127.0.0.1:8080).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Answer every request this much later (a slow backend, for routing tests).
    #[arg(long, default_value_t = 0)]
    pub delay_ms: u64,
}

pub async fn run(a: EchoArgs) -> anyhow::Result<()> {
    let listen = match a.listen {
        Some(l) => l,
        None => match std::env::var("FLOTILLA_PORT") {
            Ok(p) => SocketAddr::from(([0, 0, 0, 0], p.parse::<u16>().context("FLOTILLA_PORT is not a port")?)),
            Err(_) => SocketAddr::from(([127, 0, 0, 1], 8080)),
        },
    };
    anyhow::ensure!(a.delay_ms <= 60_000, "--delay-ms must be at most 60000");
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let identity = serde_json::json!({
        "node": var("FLOTILLA_NODE_ID"),
        "app": var("FLOTILLA_APP"),
        "unit": var("FLOTILLA_UNIT"),
        "role": var("FLOTILLA_ROLE"),
        "pid": std::process::id(),
    });
    let delay = Duration::from_millis(a.delay_ms);
    let app = axum::Router::new().route("/healthz", get(|| async { "ok" })).fallback(get(move || {
        let body = identity.clone();
        async move {
            tokio::time::sleep(delay).await;
            Json(body)
        }
    }));
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    tracing::info!(addr = %listener.local_addr()?, "echo-server listening");
    axum::serve(listener, app).with_graceful_shutdown(crate::servers::shutdown_signal()).await?;
    Ok(())
}
