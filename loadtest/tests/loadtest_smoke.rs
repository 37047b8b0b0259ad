//! The loadtest itself must keep working: tiny runs, checking the shape of each
//! report (never its speed).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::process::Command;

/// Runs a scenario with `--json` and returns its last stdout line, checking `keys` are numbers.
fn run(args: &[&str], keys: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla-loadtest"))
        .args(args)
        .arg("--json")
        .arg("--flotilla")
        .arg(flotilla_testkit::bin("flotilla"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let last = stdout.lines().last().unwrap();
    let v: serde_json::Value = serde_json::from_str(last).unwrap();
    for key in keys {
        assert!(v.get(*key).is_some_and(|x| x.is_number()), "{key} missing in {last}");
    }
    v
}

#[test]
fn heartbeats_scenario_reports_every_figure() {
    let v = run(
        &["heartbeats", "--nodes", "300", "--shards", "2", "--seconds", "2", "--flips-per-second", "20"],
        &[
            "nodes",
            "shards",
            "heartbeats_per_datagram",
            "heartbeats_per_second",
            "heartbeats_per_shard_cpu_second",
            "kernel_sink_per_second",
            "kernel_sink_per_cpu_second",
            "ratio_to_kernel",
            "ingest_thread_cpu_seconds",
            "ingest_thread_ratio_to_kernel",
            "view_lag_p50_ms",
            "view_lag_p99_ms",
            "shard_rss_bytes_per_node",
            "view_bytes_copied_per_version",
        ],
    );
    assert_eq!(v["nodes"], 300);
    assert_eq!(v["heartbeats_per_datagram"], 1);
    assert_eq!(v["heartbeats_rejected"], 0.0, "every simulated heartbeat is valid");
    assert!(v["heartbeats_per_second"].as_f64().unwrap() > 0.0);
    assert!(v["view_lag_samples"].as_u64().unwrap() > 0, "health flips reached the watcher");
    // 300 heartbeats a second reached the bare receivers too, and cost them some CPU.
    assert!(v["kernel_sink_per_second"].as_f64().unwrap() > 100.0, "{v}");
    assert!(v["kernel_sink_per_cpu_second"].as_f64().unwrap() > 0.0, "{v}");
    assert!(v["ratio_to_kernel"].as_f64().unwrap() > 0.0, "{v}");
    // The receive thread is part of the shard process.
    let (thread, process) =
        (v["ingest_thread_cpu_seconds"].as_f64().unwrap(), v["shard_cpu_seconds"].as_f64().unwrap());
    assert!((0.0..=process + 0.01).contains(&thread), "{v}");
}

#[test]
fn schedule_scenario_reports_every_figure() {
    let v = run(
        &["schedule", "--nodes", "200", "--schedulers", "4", "--placements", "400"],
        &[
            "nodes",
            "schedulers",
            "placements_requested",
            "placements_committed",
            "placements_per_second",
            "conflict_fraction",
            "commit_latency_p50_ms",
            "commit_latency_p99_ms",
            "decision_p99_us",
            "baseline_placements_per_second",
            "speedup_vs_baseline",
        ],
    );
    assert_eq!(v["placements_committed"], 400, "every placement fits: 200 nodes x 8 cores");
    assert_eq!(v["baseline_placements_committed"], 400);
}

#[test]
fn schedule_scenario_runs_each_store_asked_for() {
    let v = run(
        &["schedule", "--nodes", "200", "--schedulers", "4", "--placements", "400", "--store", "redb,etcd"],
        &["etcd_vs_redb", "placements_per_second"],
    );
    assert_eq!(v["store"], "redb");
    assert_eq!(v["placements_committed"], 400);
    let by = v["placements_per_second_by_store"].as_object().unwrap();
    assert!(by["redb"].as_f64().unwrap() > 0.0 && by["etcd"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn apps_scenario_reports_every_figure() {
    let v = run(
        &[
            "apps",
            "--apps",
            "20",
            "--units",
            "2",
            "--nodes",
            "100",
            "--flips",
            "2",
            "--idle-seconds",
            "2",
            "--scales",
            "5",
            "--control-lists",
            "3",
        ],
        &[
            "start_seconds",
            "idle_cpu_cores",
            "idle_reconcile_passes_per_second",
            "memory_bytes_per_app",
            "scale_to_committed_p50_ms",
            "scale_to_committed_p99_ms",
            "workload_reports",
        ],
    );
    assert_eq!((v["apps"].as_u64(), v["units"].as_u64(), v["scales"].as_u64()), (Some(20), Some(2), Some(5)), "{v}");
    // The simulated nodes ran what they were given, so every unit ran before the idle
    // window; quiet apps pass on their timers (every 5 s), not every second.
    assert!(v["workload_reports"].as_u64().unwrap() > 0, "{v}");
    let passes = v["idle_reconcile_passes_per_second"].as_f64().unwrap();
    assert!(passes < 20.0, "fewer than one pass per app a second: {v}");
    assert!(v["memory_bytes_per_app"].as_u64().unwrap() > 0, "{v}");
    // Registered with a control plane, which lists all 20 (the run fails otherwise).
    let listed = &v["control_list_apps"];
    assert_eq!(listed["lists"], 3, "{v}");
    for view in ["summary", "demand"] {
        assert!(listed[view]["wall_p50_ms"].as_f64().unwrap() > 0.0, "{view}: {v}");
    }
}

#[test]
fn failover_scenario_reports_every_figure() {
    let v = run(
        &["failover", "--trials", "2"],
        &["trials", "route_removal_drain_p99_ms", "route_removal_kill_p99_ms", "replacement_running_p99_ms"],
    );
    assert_eq!(v["trials"], 2);
    assert!(v["route_removal_kill_p99_ms"].as_f64().unwrap() > 0.0);
    assert!(v["route_removal_drain_p99_ms"].as_f64().unwrap() > 0.0);
}

#[test]
fn canary_scenario_rolls_back_the_bad_and_slow_versions_and_promotes_the_good_one() {
    let v = run(
        &[
            "canary",
            "--rate",
            "300",
            "--units",
            "2",
            "--agents",
            "3",
            "--step-interval-s",
            "2",
            "--baseline-s",
            "5",
            "--min-requests",
            "30",
            // Small steps see few requests: a 20 ms service against a 60 ms one and a
            // ratio of 2, so the good version's jitter (a few ms on a busy machine) does
            // not fail it and the slow one (about 2.7x) does.
            "--delay-ms",
            "20",
            "--max-p99-ratio",
            "2",
        ],
        &["baseline_p99_ms", "good_vs_baseline_p99"],
    );
    assert!(v["bad"]["end"].as_str().unwrap().contains("error rate"), "{v}");
    assert!(v["slow"]["end"].as_str().unwrap().contains("max_p99_ratio"), "{v}");
    assert_eq!(v["good"]["end"], "promoted", "{v}");
    assert!(v["bad"]["failed_share"].as_f64().unwrap() > 0.0, "{v}");
}

#[test]
fn policies_scenario_reports_every_figure() {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla-loadtest"))
        .args(["policies", "--apps", "100", "--rounds", "3", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for key in ["apps", "rounds", "round_p50_ms", "round_p99_ms", "actions"] {
        assert!(v.get(key).is_some_and(|x| x.is_number()), "{key} missing in {v}");
    }
    assert_eq!(v["apps"], 100);
    assert!(v["actions"].as_u64().unwrap() > 0, "the moving signals scale some apps");
}

#[test]
fn autoscale_scenario_reports_every_figure() {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla-loadtest"))
        .args(["autoscale", "--requests", "1000", "--no-ray", "--json"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    for key in ["requests", "flotilla_decision_seconds", "flotilla_nodes", "flotilla_memory_waste"] {
        assert!(v.get(key).is_some_and(|x| x.is_number()), "{key} missing in {v}");
    }
    for key in ["ray_decision_seconds", "speedup_vs_ray", "ray_nodes", "ray_memory_waste"] {
        assert!(v.get(key).is_some_and(|x| x.is_null()), "{key} should be null with --no-ray in {v}");
    }
    assert_eq!(v["requests"], 1000);
    assert!(v["flotilla_nodes"].as_u64().unwrap() > 0);
    assert_eq!(v["flotilla_infeasible"], 0, "the generated demand is all feasible");
    let w = v["flotilla_memory_waste"].as_f64().unwrap();
    assert!((0.0..1.0).contains(&w), "waste is a fraction: {w}");
}

#[test]
fn dashboard_scenario_without_a_browser_reports_the_server_figures() {
    let v = run(
        &["dashboard", "--nodes", "200", "--shards", "2", "--seconds", "2", "--no-browser"],
        &[
            "nodes",
            "snapshot_bytes",
            "snapshot_nodes",
            "snapshot_nodes_messages",
            "control_rss_mb",
            "control_cpu_seconds",
        ],
    );
    assert_eq!(v["nodes"], 200);
    assert_eq!(v["snapshot_nodes"], 200, "every node is in the snapshot");
    assert!(v["snapshot_bytes"].as_u64().unwrap() > 200 * 13, "each node's id at least");
    assert!(v.get("first_paint_seconds").is_none(), "no browser, no browser figures");
}

/// The pool autoscaler reading the nodes from its view decides as it did reading
/// `GET /v1/nodes`, and both modes are measured.
#[test]
fn pool_scenario_decides_alike_from_the_view_and_over_http() {
    let v = run(&["pool", "--nodes", "300", "--shards", "2", "--passes", "2", "--queued", "3"], &["nodes", "passes"]);
    let (http, view) = (&v["modes"]["http"], &v["modes"]["view"]);
    for m in [http, view] {
        assert!(m["pass_cpu_ms"]["p50"].as_f64().unwrap() > 0.0, "{m}");
    }
    assert_eq!(http["first_decision"], view["first_decision"], "{v}");
    // Three units of two 1-CPU members on 8-CPU nodes: nothing to launch, all placed.
    assert_eq!(view["first_decision"]["launch"], serde_json::json!({}), "{v}");
    assert!(view["first_decision"]["placed_on_nodes"].as_u64().unwrap() >= 1, "{v}");
}

/// The packing makes Ray 2.60's decisions, run side by side on the same demand: the same
/// nodes of each type for distinct shapes and for gangs (500 of them, where ties between
/// nodes in different states are broken by Ray's node order). Ray comes from PyPI
/// (`ray==2.60.0`, which .ci/run installs).
#[test]
fn autoscale_launches_what_ray_2_60_launches() {
    let cases: [&[&str]; 2] =
        [&["--requests", "600", "--distinct", "--gangs", "100"], &["--requests", "1000", "--gangs", "500"]];
    for args in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_flotilla-loadtest"))
            .arg("autoscale")
            .args(args)
            .args(["--repeat", "1", "--json"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        let v: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
        assert!(v["ray_absent"].is_null(), "Ray 2.60 is needed (pip install ray==2.60.0): {}", v["ray_absent"]);
        assert_eq!(v["flotilla_nodes_by_type"], v["ray_nodes_by_type"], "{args:?}");
        assert_eq!(v["flotilla_infeasible"], v["ray_infeasible"], "{args:?}");
    }
}
