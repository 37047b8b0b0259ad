//! What a Prometheus user scrapes: every process's `/metrics` passes `promtool check
//! metrics` (Debian's `prometheus` package) with no lint, every family carries `# HELP`,
//! and the process metrics and build info are there.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use flotilla_testkit::{Group, Up, get_text, metric, wait_for, who};

use crate::common::{ECHO, running};

/// `promtool`, from Debian's `prometheus` package (.ci/run installs it).
fn promtool() -> &'static str {
    const PATH: &str = "/usr/bin/promtool";
    assert!(
        std::path::Path::new(PATH).exists(),
        "{PATH} is missing: install the Debian package `prometheus` (apt-get install prometheus), as .ci/run does"
    );
    PATH
}

/// `promtool check metrics` on `page`: whether it passed, and all it said.
fn promtool_on(page: &str) -> (bool, String) {
    let mut child = Command::new(promtool())
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting promtool");
    child.stdin.take().expect("promtool's stdin").write_all(page.as_bytes()).expect("feeding promtool");
    let out = child.wait_with_output().expect("promtool's answer");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// Panics with promtool's output unless `page` passes without a word.
fn promtool_check(what: &str, page: &str) {
    let (ok, said) = promtool_on(page);
    assert!(ok && said.trim().is_empty(), "promtool check metrics on {what}:\n{said}\n---\n{page}");
}

/// Every family on the page has `# HELP`; the process metrics and build info are there;
/// no series is labelled by an endpoint address.
fn check_page(what: &str, page: &str) {
    promtool_check(what, page);
    let typed: Vec<&str> = page.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    assert!(typed.iter().any(|n| n.starts_with("flotilla_")), "{what} exports flotilla_ families:\n{page}");
    for name in typed.iter().filter(|n| n.starts_with("flotilla_")) {
        assert!(page.contains(&format!("# HELP {name} ")), "{what}: {name} has no # HELP:\n{page}");
    }
    // A young process may have used less CPU than one clock tick: 0 is a reading too.
    assert!(metric(page, "process_cpu_seconds_total", "").is_some(), "{what}:\n{page}");
    for family in [
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
        "process_threads",
    ] {
        assert!(metric(page, family, "").is_some_and(|v| v > 0.0), "{what}: {family}:\n{page}");
    }
    let version = format!("version=\"{}\"", env!("CARGO_PKG_VERSION"));
    assert_eq!(metric(page, "flotilla_build_info", &version), Some(1.0), "{what}:\n{page}");
    assert!(!page.contains("endpoint=\""), "{what}: no endpoint address in a label:\n{page}");
}

#[test]
fn every_process_serves_metrics_that_promtool_accepts_with_help_process_metrics_and_build_info() {
    promtool();
    let up = Up::start("promcheck", &["--agents", "2", "--app", ECHO]);
    wait_for("2 running units", Duration::from_secs(60), || (running(&up).len() == 2).then_some(()));
    let control = || get_text(&up.addr, "/metrics").unwrap_or_default();
    wait_for("placements committed and heartbeats counted", Duration::from_secs(20), || {
        let page = control();
        (metric(&page, "flotilla_placements_total", "result=\"committed\"") >= Some(2.0)
            && metric(&page, "flotilla_heartbeats_received_total", "").is_some())
        .then_some(())
    });

    // The router is a process of its own: follow the app and send it some traffic.
    let mut procs = Group::new();
    let pid = procs.spawn_with_env(
        &["route", "--app", "echo", "--listen", "127.0.0.1:0", "--print-addrs"],
        &up.data.join("route.err"),
        &[("FLOTILLA_ADDR", up.addr.as_str())],
    );
    let addrs = procs.addrs(pid);
    let (proxy, router) =
        (addrs["listen"].as_str().unwrap().to_string(), addrs["metrics"].as_str().unwrap().to_string());
    wait_for("the router follows both heads", Duration::from_secs(20), || {
        metric(&get_text(&router, "/metrics")?, "flotilla_route_endpoints", "").filter(|n| *n == 2.0)
    });
    let answered = (0..20).filter(|_| who(&proxy).is_some_and(|v| v["unit"].is_string())).count();
    assert_eq!(answered, 20, "every request answered through the router");

    // The control plane: shards, schedulers and the API in one process (`up`).
    let page = control();
    check_page("the control plane", &page);
    for family in [
        "flotilla_nodes",
        "flotilla_units",
        "flotilla_scheduler_commit_seconds_count",
        "flotilla_shard_commit_seconds_count",
        "flotilla_scheduler_conflict_ratio",
        "flotilla_view_bytes_copied_per_version_count",
    ] {
        assert!(metric(&page, family, "").is_some(), "{family}:\n{page}");
    }
    // Bytes on byte buckets: some version copied less than the largest bucket.
    assert!(page.contains("flotilla_view_bytes_copied_per_version_bucket{shard=\"0\",le=\"1073741824\"}"), "{page}");

    // Every agent, at the address it wrote.
    let mut agents = 0;
    for dir in std::fs::read_dir(up.data.join("agents")).unwrap().flatten().filter(|e| e.path().is_dir()) {
        let addr = std::fs::read_to_string(dir.path().join("metrics.addr")).unwrap();
        let page = get_text(addr.trim(), "/metrics").unwrap_or_default();
        check_page(&format!("agent {}", dir.file_name().to_string_lossy()), &page);
        assert!(metric(&page, "flotilla_agent_heartbeats_sent_total", "").is_some_and(|n| n > 0.0), "{page}");
        agents += 1;
    }
    assert_eq!(agents, 2);

    // The router: weights and requests by app and node, never by address.
    let page = get_text(&router, "/metrics").unwrap_or_default();
    check_page("the router", &page);
    assert!(metric(&page, "flotilla_route_endpoint_weight", "app=\"echo\",node=\"").is_some(), "{page}");
    assert!(metric(&page, "flotilla_route_requests_total", "app=\"echo\",node=\"").is_some(), "{page}");
}

/// The check above is only as good as promtool's verdict: it does flag what it should.
#[test]
fn promtool_flags_a_family_without_help_or_a_counter_without_total() {
    let (ok, said) = promtool_on("# TYPE flotilla_things counter\nflotilla_things 1\n");
    assert!(!ok && said.contains("no help text") && said.contains("_total"), "{said}");
    let good = "# HELP flotilla_things_total Things.\n# TYPE flotilla_things_total counter\nflotilla_things_total 1\n";
    assert_eq!(promtool_on(good), (true, String::new()));
}
