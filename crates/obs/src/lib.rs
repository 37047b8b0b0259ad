//! Observability shared by every Flotilla process: tracing setup, the Prometheus
//! recorder and its `/metrics` endpoint, and an allocation meter used to report
//! how many bytes a new view version really copies.

pub mod alloc;
pub mod health;

use std::net::SocketAddr;
use std::sync::OnceLock;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines, coloured only when stderr is a terminal.
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl LogFormat {
    /// The `--log-format` value that selects this format, for child processes.
    pub fn as_arg(self) -> &'static str {
        match self {
            LogFormat::Text => "text",
            LogFormat::Json => "json",
        }
    }
}

/// The logging flags every Flotilla binary takes (global, so they go before or after a
/// subcommand).
#[derive(Debug, Clone, clap::Args)]
pub struct LogArgs {
    /// How to write logs: `text` (coloured only on a terminal) or `json` (one object a line).
    #[arg(long, global = true, env = "FLOTILLA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// The same as `--log-format json` (kept for existing scripts).
    #[arg(long, global = true, hide = true)]
    pub log_json: bool,
}

impl LogArgs {
    pub fn format(&self) -> LogFormat {
        if self.log_json { LogFormat::Json } else { self.log_format }
    }
}

/// Initialises `tracing` once, writing to stderr in `format`. The level comes from
/// `RUST_LOG` (default `info`).
pub fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        // Colours are for a person at a terminal, never for a log file or a pipe.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
    };
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

/// Serves `/metrics`, `/healthz` and `/readyz` ([`health`]) on `addr` in the
/// background; returns the bound address.
pub async fn serve_metrics(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("binding {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let app = metrics_router().merge(health::router());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::warn!(error = %e, "metrics server stopped");
        }
    });
    tracing::info!(%local, "serving /metrics");
    Ok(local)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process the tests below start: it logs one line and exits.
    const CHILD: &str = "FLOTILLA_OBS_TEST_CHILD";

    /// Runs the named test of this binary again as a child that logs in `format`, its
    /// stderr a pipe (as a file would be); returns what it wrote there.
    fn child_stderr(test: &str, format: LogFormat) -> String {
        let exe = std::env::current_exe().expect("the test binary's path");
        let out = std::process::Command::new(exe)
            .args(["--exact", test, "--nocapture", "--test-threads", "1"])
            .env(CHILD, format.as_arg())
            .env("RUST_LOG", "info")
            .output()
            .expect("running the test binary again");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// In the child: logs one line in the format the parent asked for.
    fn log_in_child() -> bool {
        let Some(format) = std::env::var_os(CHILD) else { return false };
        init_tracing(if format == "json" { LogFormat::Json } else { LogFormat::Text });
        tracing::info!(node = "n1", "hello from the child");
        true
    }

    #[test]
    fn text_logs_off_a_terminal_carry_no_colour_codes() {
        if log_in_child() {
            return;
        }
        let err = child_stderr("tests::text_logs_off_a_terminal_carry_no_colour_codes", LogFormat::Text);
        assert!(err.contains("hello from the child") && err.contains("node=\"n1\""), "{err}");
        assert!(!err.contains('\x1b'), "no ANSI escape in {err:?}");
    }

    #[test]
    fn json_logs_are_one_object_a_line() {
        if log_in_child() {
            return;
        }
        let err = child_stderr("tests::json_logs_are_one_object_a_line", LogFormat::Json);
        let line = err.lines().find(|l| l.contains("hello from the child")).unwrap_or_else(|| panic!("{err}"));
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert_eq!(v["fields"]["message"], "hello from the child");
        assert_eq!(v["fields"]["node"], "n1");
        assert!(!err.contains('\x1b'), "{err:?}");
    }
}
