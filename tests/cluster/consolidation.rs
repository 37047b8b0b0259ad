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
/// nodes) of 800m units, one unit per node while `max_units_per_node = 1`.
fn spec(one_per_node: bool) -> String {
    let spread = if one_per_node { "max_units_per_node = 1" } else { "# max_units_per_node = 1" };
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml"))
        .unwrap()
        .replace("name = \"echo\"", "name = \"batch\"")
        .replace("cpu = \"250m\"", "cpu = \"400m\"")
        .replace("serves_http = true", "serves_http = false")
        .replace("readiness_path = \"/healthz\"\n", "")
        .replace("# max_units_per_node = 1", spread)
        .replace("initial = 2", "initial = 3")
        + "\n[disruption]\nquiet_period = \"1s\"\n"
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
