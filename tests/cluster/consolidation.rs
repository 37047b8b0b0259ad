//! Issue #40 item 2, with real agents: the pool empties a node whose units fit on the
//! others (same node type), the apps move them make before break within their
//! `[disruption]` budget, and the emptied node is terminated.

use std::collections::BTreeSet;
use std::time::Duration;

use flotilla_testkit::{Up, fresh_dir, get_text, http, run_ok, wait_for};
use serde_json::Value;

use crate::pool::{instances_in, pool};

/// One type of two-CPU nodes (two units each), one kept; consolidation after 2 s still.
const POOL: &str = r#"
name = "default"
interval = "1s"
upscaling_speed = 4.0
idle_timeout = "3s"

[timeouts]
request = "30s"
agent_start = "60s"
drain = "30s"

[node_types.big]
cpu = 2
memory = "2Gi"
labels = { domain = "domain-a", priority = "high" }
min = 1
max = 4
cost = 0.2

[consolidation]
after = "2s"
deadline = "90s"
"#;

/// The echo example as a batch app (no routed member serves, so it does not spread over
/// nodes) of two members of `member_cpu`, one unit per node while `max_units_per_node = 1`.
fn batch(name: &str, member_cpu: &str, initial: u32, one_per_node: bool) -> String {
    let spread = if one_per_node { "max_units_per_node = 1" } else { "# max_units_per_node = 1" };
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml"))
        .unwrap()
        .replace("name = \"echo\"", &format!("name = \"{name}\""))
        .replace("cpu = \"250m\"", &format!("cpu = \"{member_cpu}\""))
        .replace("serves_http = true", "serves_http = false")
        .replace("readiness_path = \"/healthz\"\n", "")
        .replace("# max_units_per_node = 1", spread)
        .replace("max_units_per_domain = 3", "max_units_per_domain = 20")
        .replace("initial = 2", &format!("initial = {initial}"))
        .replace("max = 6", "max = 20")
        + "\n[disruption]\nquiet_period = \"1s\"\n"
}

fn spec(one_per_node: bool) -> String {
    batch("batch", "400m", 3, one_per_node)
}

fn nodes_of(units: &[Value]) -> BTreeSet<String> {
    units
        .iter()
        .filter(|u| u["state"] == "running")
        .flat_map(|u| u["members"].as_array().into_iter().flatten())
        .filter_map(|m| m["node_id"].as_str().map(str::to_string))
        .collect()
}

/// Three units held apart on three nodes; the spread limit lifted, one node's unit fits
/// on another: the pool cordons that node, the unit moves (never fewer than 3 running,
/// at most one moving), the node goes, and the pool runs two nodes. Scaled to one unit,
/// the pool is back at its min.
#[test]
fn a_fragmented_pool_is_consolidated_within_the_apps_budget() {
    let dir = fresh_dir("pool-consolidation-files");
    let (pool_file, app) = (dir.join("pool.toml"), dir.join("batch.toml"));
    std::fs::write(&pool_file, POOL).unwrap();
    std::fs::write(&app, spec(true)).unwrap();
    let up = Up::start(
        "pool-consolidation",
        &["--autoscale", "--pool", pool_file.to_str().unwrap(), "--app", app.to_str().unwrap()],
    );
    let running = |units: &[Value]| units.iter().filter(|u| u["state"] == "running").count();
    let three = wait_for("three units on three nodes", Duration::from_secs(90), || {
        let units = up.units("batch");
        let nodes = nodes_of(&units);
        (running(&units) == 3 && nodes.len() == 3).then_some(nodes)
    });
    // Nothing to consolidate while the limit holds the units apart.
    std::thread::sleep(Duration::from_secs(4));
    let p = pool(&up).expect("the pool's report");
    assert_eq!(instances_in(&p, "running").len(), 3, "{p:#}");
    assert!(!p["decisions"].to_string().contains("consolidate pool-big-"), "{:#}", p["decisions"]);

    std::fs::write(&app, spec(false)).unwrap();
    run_ok(up.cli().arg("apply").arg(&app));
    let mut most_moving = 0;
    let gone = wait_for("a node consolidated and terminated", Duration::from_secs(120), || {
        let units = up.units("batch");
        let placed = units.iter().filter(|u| u["state"] == "running" && u["replaced_by"].is_null()).count();
        assert!(running(&units) >= 3, "a unit became unavailable: {units:#?}");
        assert!(placed >= 3 - 1, "{units:#?}");
        most_moving = most_moving.max(units.iter().filter(|u| !u["moving"].is_null()).count());
        let p = pool(&up)?;
        let terminated: Vec<String> = instances_in(&p, "terminated");
        let gone = three.iter().find(|n| terminated.contains(n))?.clone();
        (instances_in(&p, "running").len() == 2).then_some((gone, p))
    });
    let (node, p) = gone;
    assert!(most_moving <= 1, "disruption.max_moving is 1: {most_moving} moved at once");
    let explained = p["decisions"].to_string();
    assert!(explained.contains(&format!("consolidate {node} (big)")), "{:#}", p["decisions"]);
    assert!(explained.contains(&format!("terminate {node} (consolidation")), "{:#}", p["decisions"]);
    let units = up.units("batch");
    assert_eq!(running(&units), 3, "{units:#?}");
    assert!(!nodes_of(&units).contains(&node), "{units:#?}");
    let (_, decisions) = http(&up.addr, "GET", "/v1/apps/batch/decisions", None, "");
    let moves: Vec<&Value> = decisions.as_array().unwrap().iter().filter(|d| d["kind"] == "rebalance").collect();
    assert_eq!(moves.len(), 1, "{decisions:#}");
    assert_eq!(moves[0]["reason"], "consolidate", "{:#}", moves[0]);
    let metrics = get_text(&up.addr, "/metrics").unwrap_or_default();
    let done = metrics.lines().find(|l| l.starts_with("flotilla_pool_consolidations_total") && l.contains("\"done\""));
    assert!(done.is_some_and(|l| l.ends_with(" 1")), "{done:?}");

    // Scaled to one unit, the pool goes back to its min: one node, the unit on it.
    run_ok(up.cli().args(["scale", "batch", "--units", "1"]));
    wait_for("the pool at its min", Duration::from_secs(120), || {
        let p = pool(&up)?;
        let units = up.units("batch");
        let left = instances_in(&p, "running");
        (left.len() == 1 && running(&units) == 1 && nodes_of(&units).iter().all(|n| left.contains(n))).then_some(())
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #40's benchmark with real agents (BENCHMARKS.md): the shipped fragmented
/// scenario's pool (`examples/pools/burst.toml`, timings shortened, no warm node) grown
/// for 12 units of two apps (9 CPUs), then left with a third of them. The pool ends
/// within 10 % of the cheapest pool for the units left, computed exactly
/// (`flotilla_pool::sim::optimum`), with never fewer units running than asked for.
#[test]
fn a_pool_grown_for_a_burst_ends_within_ten_percent_of_the_cheapest_pool() {
    let dir = fresh_dir("pool-burst-files");
    let shipped = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/pools/burst.toml")).unwrap();
    let pool_text = shipped
        .replace("interval = \"5s\"", "interval = \"1s\"")
        .replace("idle_timeout = \"2m\"", "idle_timeout = \"5s\"")
        .replace("boot_delay = \"60s\"", "boot_delay = \"2s\"")
        .replace("warm = 1\n", "")
        .replace("after = \"2m\"", "after = \"3s\"")
        .replace("deadline = \"15m\"", "deadline = \"60s\"")
        .replace("name = \"burst\"", "name = \"default\"");
    let cfg = flotilla_pool::config::PoolConfig::parse(&pool_text).unwrap();
    let pool_file = dir.join("pool.toml");
    std::fs::write(&pool_file, &pool_text).unwrap();
    let (web, jobs) = (dir.join("web.toml"), dir.join("jobs.toml"));
    std::fs::write(&web, batch("web", "500m", 1, false)).unwrap();
    std::fs::write(&jobs, batch("jobs", "250m", 1, false)).unwrap();
    let up = Up::start(
        "pool-burst",
        &[
            "--autoscale",
            "--pool",
            pool_file.to_str().unwrap(),
            "--app",
            web.to_str().unwrap(),
            "--app",
            jobs.to_str().unwrap(),
        ],
    );
    let running = |app: &str| up.units(app).iter().filter(|u| u["state"] == "running").count();
    let cost_per_hour = |p: &Value| -> f64 {
        p["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| !matches!(i["state"].as_str(), Some("terminated" | "allocation_failed")))
            .map(|i| cfg.node_type(i["node_type"].as_str().unwrap_or_default()).and_then(|t| t.cost).unwrap_or(0.0))
            .sum()
    };
    wait_for("both apps at one unit", Duration::from_secs(90), || {
        (running("web") == 1 && running("jobs") == 1).then_some(())
    });
    let started = std::time::Instant::now();
    for app in ["web", "jobs"] {
        run_ok(up.cli().args(["scale", app, "--units", "6"]));
    }
    wait_for("the burst running", Duration::from_secs(180), || {
        (running("web") == 6 && running("jobs") == 6).then_some(())
    });
    let grown = pool(&up).expect("a pool report");
    let peak = cost_per_hour(&grown);
    for app in ["web", "jobs"] {
        run_ok(up.cli().args(["scale", app, "--units", "2"]));
    }
    let dropped = std::time::Instant::now();
    let unit = |cpu: u64| flotilla_core::Resources::new(cpu, 128 << 20, 0);
    let optimum = flotilla_pool::sim::optimum::cheapest(&cfg, &[(unit(1000), 2), (unit(500), 2)]).expect("small");
    let (end, p) = wait_for("the pool within 10 % of the cheapest", Duration::from_secs(240), || {
        assert!(running("web") >= 2 && running("jobs") >= 2, "a unit became unavailable");
        let p = pool(&up)?;
        let cost = cost_per_hour(&p);
        let consolidating = p["instances"].as_array()?.iter().any(|i| !i["consolidating_since_ms"].is_null());
        (cost <= optimum * 1.1 + 1e-9 && !consolidating).then_some((cost, p))
    });
    let (_, web_decisions) = http(&up.addr, "GET", "/v1/apps/web/decisions", None, "");
    let (_, jobs_decisions) = http(&up.addr, "GET", "/v1/apps/jobs/decisions", None, "");
    let moves = [web_decisions, jobs_decisions]
        .iter()
        .flat_map(|d| d.as_array().cloned().unwrap_or_default())
        .filter(|d| d["kind"] == "rebalance")
        .count();
    let terminated = instances_in(&p, "terminated").len();
    println!(
        "burst with real agents: peak {peak:.2}/h, end {end:.2}/h, cheapest {optimum:.2}/h; {moves} units moved, \
         {terminated} instances terminated; burst running after {:.0} s, settled {:.0} s after the drop",
        (dropped - started).as_secs_f64(),
        dropped.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
