//! What operators deploy besides the binaries, checked with the real tools and against
//! the metric catalogue, no cluster needed: the Prometheus configs and alert rules
//! through `promtool` (Debian package `prometheus`), each alert unit-tested with series
//! (`deploy/prometheus/alerts_test.yml`) and given a runbook (`docs/runbooks.md`), and
//! every query of the alerts and of the Grafana dashboard (`deploy/grafana/flotilla.json`)
//! naming only metrics of `docs/metrics.md`.
//!
//! `FLOTILLA_METRICS_CATALOGUE=PATH` checks against another catalogue than
//! `docs/metrics.md` (a stand-in while it is being written).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

mod alerts;
mod dashboard;
mod promql;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository's root.
fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// `promtool`, from PATH or /usr/bin; a missing one fails the test with how to get it.
fn promtool() -> Command {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file());
    let Some(path) = found else {
        panic!("promtool not found: install the Debian package `prometheus` (apt-get install prometheus)")
    };
    Command::new(path)
}

/// Runs `promtool ARGS` in `dir`; panics with its output unless it succeeds.
fn promtool_ok(dir: &Path, args: &[&str]) -> String {
    let out = run_promtool(dir, args);
    let text = output_text(&out);
    assert!(out.status.success(), "promtool {} failed ({}):\n{text}", args.join(" "), out.status);
    text
}

fn run_promtool(dir: &Path, args: &[&str]) -> Output {
    promtool().args(args).current_dir(dir).output().expect("running promtool")
}

fn output_text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The metric catalogue: `docs/metrics.md`, or `$FLOTILLA_METRICS_CATALOGUE`.
fn catalogue() -> promql::Catalogue {
    let path = std::env::var_os("FLOTILLA_METRICS_CATALOGUE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("docs").join("metrics.md"));
    let catalogue = promql::Catalogue::parse(&read(&path));
    assert!(catalogue.len() > 20, "{} lists only {} metrics", path.display(), catalogue.len());
    catalogue
}
