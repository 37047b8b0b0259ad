//! `flotilla echo-server`: a tiny HTTP workload that answers with who it is (node,
//! app, unit, role), for demos and tests. It listens on `$FLOTILLA_PORT` by default.
//! `PUT /load?memory_mib=N` makes it hold N MiB (0 lets go), so a test can load a member
//! and watch the autoscaler react. `GET /env` answers with the variables the agent gave it
//! and when it started, so a test can see the ports and head address it was given and
//! the order members started in; `--ready-after` keeps `/healthz` failing for a while (a
//! head slow to come up); `--delay` and `--error-rate` make a slow or failing version (a
//! bad release, by its args alone). Every answered request is a line on stdout (an access log,
//! what `flotilla logs` shows), the start a line on stderr.

use flotilla_core::LockExt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use axum::Json;
use axum::extract::Query;
use axum::http::StatusCode;
use axum::routing::{get, put};
use clap::Args;

#[derive(Debug, Args)]
pub struct EchoArgs {
    /// Where to listen (default: 0.0.0.0:$FLOTILLA_PORT, else 127.0.0.1:8080).
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Answer every request this much later (a slow backend, for routing tests).
    #[arg(long, default_value = "0s", value_parser = crate::cli::http::parse_duration)]
    pub delay: Duration,
    /// Deprecated spelling of --delay, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "delay")]
    pub delay_ms: Option<u64>,
    /// Answer this fraction of requests (0 to 1) with 500, spread evenly: of the first N
    /// requests, exactly ⌊N × rate⌋ fail (a bad version, for canary tests). `/healthz`
    /// and `/env` never fail.
    #[arg(long, default_value_t = 0.0)]
    pub error_rate: f64,
    /// `/healthz` answers 503 until this long after start (a slow head, for start-order tests).
    #[arg(long, default_value = "0s", value_parser = crate::cli::http::parse_duration)]
    pub ready_after: Duration,
}

pub async fn run(a: EchoArgs) -> anyhow::Result<()> {
    let listen = match a.listen {
        Some(l) => l,
        None => match std::env::var("FLOTILLA_PORT") {
            Ok(p) => SocketAddr::from(([0, 0, 0, 0], p.parse::<u16>().context("FLOTILLA_PORT is not a port")?)),
            Err(_) => SocketAddr::from(([127, 0, 0, 1], 8080)),
        },
    };
    let delay = flotilla_agent::config::deprecated_ms(a.delay, a.delay_ms, "--delay-ms", "--delay");
    anyhow::ensure!(delay <= Duration::from_secs(60), "--delay must be at most 60s");
    anyhow::ensure!((0.0..=1.0).contains(&a.error_rate), "--error-rate must be within 0 and 1, not {}", a.error_rate);
    let per_million = (a.error_rate * 1e6).round() as u64;
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let var = |k: &str| std::env::var(k).unwrap_or_default();
    let identity = serde_json::json!({
        "node": var("FLOTILLA_NODE_ID"),
        "app": var("FLOTILLA_APP"),
        "unit": var("FLOTILLA_UNIT"),
        "role": var("FLOTILLA_ROLE"),
        "pid": std::process::id(),
    });
    anyhow::ensure!(a.ready_after <= Duration::from_secs(600), "--ready-after must be at most 10m");
    let started = std::time::Instant::now();
    let ready_after = a.ready_after;
    // Only what the agent passes about the member (never the rest of the environment,
    // which may hold an agent's token): identity, ports, the head's address and ports.
    let identity_vars = ["FLOTILLA_APP", "FLOTILLA_UNIT", "FLOTILLA_MEMBER", "FLOTILLA_ROLE", "FLOTILLA_NODE_ID"];
    let env: serde_json::Map<String, serde_json::Value> = std::env::vars()
        .filter(|(k, _)| {
            k.starts_with("FLOTILLA_PORT") || k.starts_with("FLOTILLA_HEAD_") || identity_vars.contains(&k.as_str())
        })
        .map(|(k, v)| (k, serde_json::Value::String(v)))
        .collect();
    let env = serde_json::json!({"env": env, "started_unix_ms": flotilla_core::system_ms()});
    let held: Arc<Mutex<Vec<u8>>> = Arc::default();
    let access_log = access_log();
    let app = axum::Router::new()
        .route(
            "/healthz",
            get(move || async move {
                if started.elapsed() >= ready_after {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "starting")
                }
            }),
        )
        .route("/env", get(move || async move { Json(env) }))
        .route("/load", put(move |q: Query<Load>| hold(held.clone(), q.0)))
        .fallback(get(move |uri: axum::http::Uri| {
            let (body, log) = (identity.clone(), access_log.clone());
            let n = served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            async move {
                tokio::time::sleep(delay).await;
                let status = if fails(n, per_million) { StatusCode::INTERNAL_SERVER_ERROR } else { StatusCode::OK };
                // Full (stdout not read): the line is dropped, the answer never waits.
                let _ = log.try_send(format!("GET {uri} {}", status.as_u16()));
                (status, Json(body))
            }
        }));
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("binding {listen}"))?;
    tracing::info!(addr = %listener.local_addr()?, "echo-server listening");
    axum::serve(listener, app).with_graceful_shutdown(crate::serve::shutdown_signal()).await?;
    Ok(())
}

/// Whether request `n` (from 0) fails at `per_million` errors a million: exactly
/// ⌊N × rate⌋ of the first N do, as evenly as they can be spread.
fn fails(n: u64, per_million: u64) -> bool {
    (n + 1).saturating_mul(per_million) / 1_000_000 > n.saturating_mul(per_million) / 1_000_000
}

/// Writes the access log's lines to stdout on a thread of its own, so a stdout nobody
/// reads costs lines, never answers.
fn access_log() -> std::sync::mpsc::SyncSender<String> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<String>(1024);
    std::thread::spawn(move || {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        for line in rx {
            if writeln!(out, "{line}").is_err() {
                return;
            }
        }
    });
    tx
}

/// Most memory `PUT /load` may hold.
const MAX_LOAD_MIB: u64 = 4096;

#[derive(serde::Deserialize)]
struct Load {
    memory_mib: u64,
}

/// Holds `memory_mib` MiB, every page written so it counts as used, in place of what was
/// held before.
async fn hold(held: Arc<Mutex<Vec<u8>>>, load: Load) -> Result<Json<serde_json::Value>, (StatusCode, String)> {
    if load.memory_mib > MAX_LOAD_MIB {
        return Err((StatusCode::UNPROCESSABLE_ENTITY, format!("memory_mib: at most {MAX_LOAD_MIB}")));
    }
    let bytes = (load.memory_mib << 20) as usize;
    let mut h = held.lock_or_recover();
    *h = Vec::new();
    *h = vec![1u8; bytes];
    tracing::info!(memory_mib = load.memory_mib, "holding memory");
    Ok(Json(serde_json::json!({"memory_mib": load.memory_mib})))
}

#[cfg(test)]
mod tests {
    use super::fails;

    #[test]
    fn an_error_rate_fails_exactly_its_share_evenly() {
        let failed = |rate: u64, n: u64| (0..n).filter(|i| fails(*i, rate)).count();
        assert_eq!(failed(200_000, 1000), 200);
        assert_eq!(failed(0, 1000), 0);
        assert_eq!(failed(1_000_000, 1000), 1000);
        assert_eq!(failed(333_333, 3000), 999);
        // Evenly: one in every five at 20 %, never two in a row.
        for w in 0..995u64 {
            assert_eq!((w..w + 5).filter(|i| fails(*i, 200_000)).count(), 1, "window at {w}");
        }
    }
}
