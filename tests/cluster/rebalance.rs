//! Rebalance (issue #40, item 1): units placed while few nodes were there move, make
//! before break and one at a time, once more nodes join; with `rebalance = "off"` the
//! plan shows what would move and nothing does.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use flotilla_testkit::{Agent, Group, Up, run_ok, wait_for};
use serde_json::Value;

use crate::common::{ECHO, head_of, running};

fn spec(dir: &std::path::Path, switch: &str) -> String {
    let text = std::fs::read_to_string(ECHO).unwrap();
    let path = dir.join(format!("echo-{switch}.toml"));
    std::fs::write(&path, format!("{text}\n[disruption]\nrebalance = \"{switch}\"\nquiet_period = \"1s\"\n")).unwrap();
    path.display().to_string()
}

fn json(up: &Up, args: &[&str]) -> Value {
    serde_json::from_str(&run_ok(up.cli().args(args).arg("--json"))).unwrap()
}

fn head_nodes(up: &Up) -> Vec<String> {
    running(up).iter().filter_map(|u| head_of(u)["node_id"].as_str().map(str::to_string)).collect()
}

#[test]
fn six_units_packed_on_two_nodes_spread_out_once_four_nodes_join() {
    let dir = flotilla_testkit::fresh_dir("rebalance-specs");
    let off = spec(&dir, "off");
    let up = Up::start("rebalance", &["--agents", "2", "--app", &off]);
    run_ok(up.cli().args(["scale", "echo", "--units", "6"]));
    wait_for("6 running units on the two nodes", Duration::from_secs(60), || {
        let heads = head_nodes(&up);
        (heads.len() == 6).then_some(())
    });
    let before: BTreeSet<String> = head_nodes(&up).into_iter().collect();
    assert_eq!(before.len(), 2, "{before:?}");

    // Four more nodes, two in each domain.
    let aggregators = std::fs::read_to_string(up.data.join("aggregators")).unwrap();
    let mut procs = Group::new();
    for n in 3..=6 {
        let node = format!("node-{n}");
        let domain = if n % 2 == 1 { "domain-a" } else { "domain-b" };
        Agent::new(aggregators.trim(), &node, &up.data.join("extra").join(&node))
            .secrets_of(&up.data)
            .domain(domain)
            .capacity(4, 8 << 30)
            .arg("--port-range", &format!("{}-{}", 21_000 + n * 50, 21_049 + n * 50))
            .spawn(&mut procs, &dir.join(format!("{node}.err")));
    }
    wait_for("6 alive nodes", Duration::from_secs(30), || {
        (up.nodes().iter().filter(|n| n["status"] == "alive").count() == 6).then_some(())
    });

    // Off: the plan shows moves, none started, and nothing moves.
    let plan = wait_for("a plan with moves", Duration::from_secs(30), || {
        let p = json(&up, &["rebalance", "echo", "--plan"]);
        (p["moves"].as_array().is_some_and(|m| !m.is_empty())).then_some(p)
    });
    assert_eq!(plan["rebalance"], "off");
    let m = &plan["moves"][0];
    assert_eq!(m["started"], false, "{plan:#}");
    assert!(m["why"].as_str().unwrap().contains("other units on its node"), "{plan:#}");
    assert!(m["after"]["node"].as_u64() < m["before"]["node"].as_u64(), "{plan:#}");
    let table = run_ok(up.cli().args(["rebalance", "echo", "--plan"]));
    assert!(table.contains("would move") && table.contains("rebalance off"), "{table}");
    std::thread::sleep(Duration::from_secs(6));
    assert_eq!(head_nodes(&up).into_iter().collect::<BTreeSet<_>>(), before, "nothing moves while off");

    // On: one unit at a time moves, never below six running, until each has a node.
    let on = spec(&dir, "on");
    run_ok(up.cli().args(["apply", &on]));
    let started = Instant::now();
    let mut most_moving = 0;
    wait_for("a unit on each of the six nodes", Duration::from_secs(150), || {
        let units = up.units("echo");
        let moving = units
            .iter()
            .filter(|u| u["moving"].is_string() && (u["state"] == "running" || u["state"] == "draining"))
            .count();
        most_moving = most_moving.max(moving);
        let serving = units.iter().filter(|u| u["state"] == "running").count();
        assert!(serving >= 6, "{serving} running while moving: {units:#?}");
        let heads: BTreeSet<String> = head_nodes(&up).into_iter().collect();
        (heads.len() == 6 && moving == 0).then_some(())
    });
    eprintln!("spread over six nodes {:?} after rebalance was turned on", started.elapsed());
    assert_eq!(most_moving, 1, "disruption.max_moving is 1");

    // Each move is a decision and an event; a balanced app has nothing left to move.
    let decisions = json(&up, &["decisions", "echo"]);
    let moves: Vec<&Value> = decisions.as_array().unwrap().iter().filter(|d| d["kind"] == "rebalance").collect();
    assert_eq!(moves.len(), 4, "two units leave each crowded node: {decisions:#}");
    for d in &moves {
        assert_eq!(d["reason"], "node", "{d:#}");
        assert!(d["after"]["node"].as_u64() < d["before"]["node"].as_u64(), "{d:#}");
    }
    let events = json(&up, &["events", "--app", "echo", "--type", "rebalance"]);
    assert_eq!(events["events"].as_array().map(Vec::len), Some(4), "{events:#}");
    std::thread::sleep(Duration::from_secs(6));
    let plan = json(&up, &["rebalance", "echo", "--plan"]);
    assert_eq!(plan["moves"], serde_json::json!([]), "{plan:#}");
    assert_eq!(running(&up).len(), 6);
}
