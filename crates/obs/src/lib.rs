//! Observability shared by every Flotilla process: tracing setup, the Prometheus
//! recorder and its `/metrics` endpoint (with the metric catalogue, process metrics and
//! build info), and an allocation meter used to report how many bytes a new view version
//! really copies.

pub mod alloc;
pub mod catalogue;
pub mod fsutil;
pub mod health;
pub mod process;
pub mod stall;

use std::net::SocketAddr;
use std::sync::{Mutex, OnceLock};

use metrics::Recorder;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

pub use catalogue::{Family, Kind, Section, buckets};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Renders families whose values are read at scrape time (see [`add_collector`]).
type Collector = Box<dyn Fn(&mut String) + Send + Sync>;
static COLLECTORS: Mutex<Vec<Collector>> = Mutex::new(Vec::new());

/// `flotilla_build_info{version} 1`: which release a process runs.
pub const BUILD_INFO: Family = Family::gauge(
    "flotilla_build_info",
    "Always 1; the version label names the Flotilla release running.",
    &["version"],
);

/// The families this crate exports in every process: build info and the `process_*` set.
pub const FAMILIES: &[Family] = &[
    BUILD_INFO,
    process::CPU_SECONDS,
    process::RESIDENT_MEMORY,
    process::VIRTUAL_MEMORY,
    process::OPEN_FDS,
    process::MAX_FDS,
    process::START_TIME,
    process::THREADS,
    LOG_LINES_DROPPED,
];

pub const LOG_LINES_DROPPED: Family = Family::counter(
    "flotilla_log_lines_dropped_total",
    "Log lines this process could not write (its stderr failed, e.g. a full disk under its log file) and dropped.",
    &[],
);

/// Stderr that never fails: a line that cannot be written (a full disk under a log
/// file) is dropped and counted, and the process goes on. tracing-subscriber would
/// otherwise report the failure with `eprintln!`, which panics on that same stderr:
/// that is how a full disk killed every agent.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if std::io::stderr().write_all(buf).is_err() {
            metrics::counter!(LOG_LINES_DROPPED.name).increment(1);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

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
}

impl LogArgs {
    pub fn format(&self) -> LogFormat {
        self.log_format
    }
}

/// The command line with the old `--log-json` spelled `--log-format=json`: scripts that
/// use it keep working, and it is in no help text or shell completion.
pub fn args() -> impl Iterator<Item = std::ffi::OsString> {
    std::env::args_os().map(|a| if a == "--log-json" { "--log-format=json".into() } else { a })
}

/// Initialises `tracing` once, writing to stderr in `format`. The level comes from
/// `RUST_LOG` (default `info`).
pub fn init_tracing(format: LogFormat) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder =
        tracing_subscriber::fmt().with_env_filter(filter).with_writer(|| LossyStderr).log_internal_errors(false);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        // Colours are for a person at a terminal, never for a log file or a pipe.
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).try_init(),
    };
}

/// Installs the process-wide Prometheus recorder with the whole catalogue of this binary:
/// every family described (so `# HELP` renders), every histogram on the buckets of its
/// unit, and `flotilla_build_info` set. Call it first in `main`, before anything records:
/// buckets cannot change once the recorder is installed (a later call only adds
/// descriptions).
pub fn install(sections: &[Section]) -> PrometheusHandle {
    let families = || sections.iter().flat_map(|s| s.families.iter()).chain(FAMILIES);
    let mut fresh = false;
    let handle = HANDLE
        .get_or_init(|| {
            fresh = true;
            let mut builder = PrometheusBuilder::new();
            for f in families().filter(|f| f.kind == Kind::Histogram) {
                builder = match builder.set_buckets_for_metric(Matcher::Full(f.name.to_string()), f.buckets) {
                    Ok(b) => b,
                    Err(e) => panic!("the catalogue's buckets of {} are invalid: {e}", f.name),
                };
            }
            let recorder = default_buckets(builder).build_recorder();
            for f in families() {
                describe(&recorder, f);
            }
            let handle = recorder.handle();
            // A recorder installed earlier (by a test harness) keeps working; we still render ours.
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone();
    if !fresh {
        // Installed before (a test that called metrics_handle()): descriptions still help.
        metrics::with_recorder(|r| families().for_each(|f| describe(r, f)));
    }
    metrics::gauge!(BUILD_INFO.name, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    handle
}

/// Histograms outside the catalogue (none in a binary; some in tests) get seconds buckets.
fn default_buckets(builder: PrometheusBuilder) -> PrometheusBuilder {
    match builder.set_buckets(buckets::SECONDS) {
        Ok(b) => b,
        Err(e) => panic!("the seconds buckets are invalid: {e}"),
    }
}

fn describe(r: &dyn Recorder, f: &Family) {
    let (name, help) = (metrics::KeyName::from_const_str(f.name), metrics::SharedString::const_str(f.help));
    match f.kind {
        Kind::Counter => r.describe_counter(name, None, help),
        Kind::Gauge => r.describe_gauge(name, None, help),
        Kind::Histogram => r.describe_histogram(name, None, help),
    }
}

/// The process-wide recorder's handle, installing a bare one (no catalogue) when
/// [`install`] has not run: for tests that drive components in-process.
pub fn metrics_handle() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let recorder = default_buckets(PrometheusBuilder::new()).build_recorder();
            let handle = recorder.handle();
            let _ = metrics::set_global_recorder(recorder);
            handle
        })
        .clone()
}

/// Renders families read at scrape time after the recorder's: `collector` appends whole
/// families (`# HELP`, `# TYPE`, samples) to the page. For values that are state rather
/// than events, such as the current route weights: a series for something that left
/// disappears with it, which a gauge in the recorder never does.
pub fn add_collector(collector: impl Fn(&mut String) + Send + Sync + 'static) {
    COLLECTORS.lock().unwrap_or_else(|e| e.into_inner()).push(Box::new(collector));
}

/// The whole `/metrics` page: the recorder's families, the collectors', the process metrics.
pub fn render() -> String {
    let mut out = metrics_handle().render();
    for c in COLLECTORS.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        c(&mut out);
    }
    process::render(&mut out);
    out
}

/// An axum router serving `GET /metrics` from the process recorder.
pub fn metrics_router() -> axum::Router {
    metrics_handle();
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(|| async {
            (
                [(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
                tokio::task::spawn_blocking(render).await.unwrap_or_default(),
            )
        }),
    )
}

/// Serves `/metrics`, `/healthz` and `/readyz` ([`health`]) on `addr` in the
/// background; returns the bound address.
pub async fn serve_metrics(addr: SocketAddr) -> anyhow::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind(addr).await.map_err(|e| anyhow::anyhow!("binding {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let app = metrics_router().merge(health::router());
    tokio::spawn(serve_bounded(listener, app));
    tracing::info!(%local, "serving /metrics");
    Ok(local)
}

/// Connections the metrics port holds at once: scrapers and probes need a few.
const METRICS_CONNECTIONS: usize = 64;
/// Time a client of the metrics port has to send its first byte, and its headers.
const METRICS_HEADER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// The largest request head the metrics port reads (its routes take no body).
const METRICS_MAX_HEAD: usize = 16 * 1024;

/// Serves `app` so that a slow or idle client cannot hold the port: a bounded number of
/// connections, a first-byte and header timeout, and a small head buffer.
async fn serve_bounded(listener: tokio::net::TcpListener, app: axum::Router) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(METRICS_HEADER_TIMEOUT).max_buf_size(METRICS_MAX_HEAD);
    let builder = std::sync::Arc::new(builder);
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(METRICS_CONNECTIONS));
    loop {
        let tcp = match listener.accept().await {
            Ok((tcp, _)) => tcp,
            Err(e) => {
                tracing::warn!(error = %e, "accepting a metrics connection failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        // Full: the newcomer is closed at once; the scraper retries on its next round.
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let (app, builder) = (app.clone(), builder.clone());
        tokio::spawn(async move {
            let _slot = slot;
            let mut first = [0u8; 1];
            if !matches!(tokio::time::timeout(METRICS_HEADER_TIMEOUT, tcp.peek(&mut first)).await, Ok(Ok(1))) {
                return;
            }
            let svc = hyper_util::service::TowerToHyperService::new(app);
            if let Err(e) = builder.serve_connection(TokioIo::new(tcp), svc).await {
                tracing::debug!(error = %e, "metrics connection ended with an error");
            }
        });
    }
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
