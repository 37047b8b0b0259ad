//! Node spread and drains that never wait on it (issue #18, items 3 and 4): a serving
//! app's units on distinct nodes, a drain with every domain at its max that completes
//! by a surge shown in `units`, and a worker on a drained node replaced alone, make
//! before break, while its unit and its head stay.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use flotilla_testkit::{Up, alive, fresh_dir, http, run_ok, wait_for, who};
use serde_json::Value;

use crate::common::{ECHO, head_of, running, workload_pid};

fn nodes_of(unit: &Value, role: &str) -> Vec<String> {
    unit["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["role"] == role)
        .filter_map(|m| m["node_id"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn six_units_spread_over_six_nodes_and_a_drain_at_every_domains_max_completes_by_a_surge() {
    // The reproduction as it stands: `up --agents 6 --app examples/echo.toml`
    // (2 initial units, placed once every local agent registered), then scale to 6.
    let up = Up::start("spread6", &["--agents", "6", "--shards", "2", "--app", ECHO]);
    running_units(&up, 2);
    run_ok(up.cli().args(["scale", "echo", "--units", "6"]));
    let units = wait_for("6 running echo units", Duration::from_secs(40), || {
        let r = running(&up);
        (r.len() == 6).then_some(r)
    });
    // The failure: three units' heads on node-1 and three on node-4. Now each
    // unit has a node of its own (a serving app spreads while nodes allow).
    let heads: BTreeSet<String> = units.iter().flat_map(|u| nodes_of(u, "head")).collect();
    assert_eq!(heads.len(), 6, "six heads on six distinct nodes: {units:#?}");
    assert!(units.iter().all(|u| u["placement_note"].is_null()), "spread honoured, nothing to say: {units:#?}");

    // Every domain holds max_units_per_domain (3) units: a drain used to queue the
    // replacement forever. Now it may pass the max by the unit leaving, and says so.
    let victim = units.iter().find(|u| nodes_of(u, "head") == nodes_of(u, "worker")).expect("a unit on one node");
    let (id, node) = (victim["unit_id"].as_str().unwrap().to_string(), nodes_of(victim, "head")[0].clone());
    let head_pid = workload_pid(head_of(victim)["address"].as_str().unwrap());
    let out = up.cli().args(["node", "drain", &node, "--wait", "--timeout", "60s"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the drain completes: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains(&format!("{node}: drained, no member runs there")), "{stdout}");
    let units = up.units("echo");
    let old = units.iter().find(|u| u["unit_id"] == id.as_str()).unwrap();
    let new_id = old["replaced_by"].as_str().expect("replaced make before break").to_string();
    let new = units.iter().find(|u| u["unit_id"] == new_id.as_str()).unwrap();
    assert_eq!(new["state"], "running", "{new:#?}");
    let note = new["placement_note"].as_str().unwrap_or_default();
    assert!(
        note.contains("surge: 4 units in") && note.contains("above max_units_per_domain 3 while 1 leave"),
        "{note}"
    );
    assert!(!alive(head_pid), "the old head stopped");
    wait_for("the old unit terminated", Duration::from_secs(30), || {
        up.units("echo").iter().any(|u| u["unit_id"] == id.as_str() && u["state"] == "terminated").then_some(())
    });
    // `units echo` shows the surge to a person too.
    let table = run_ok(up.cli().args(["units", "echo"]));
    assert!(table.contains(&format!("{new_id}: note: surge: 4 units in")), "{table}");
    assert_eq!(running(&up).len(), 6, "the app never dropped below its size");
}

/// The units and the newest lines of `up`'s log, for a failure's message.
fn dump(up: &Up) -> String {
    let log = std::fs::read_to_string(up.data.join("up.err")).unwrap_or_default();
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    format!("units: {:#?}\nup.err (newest first):\n{}", up.units("echo"), tail.join("\n"))
}

/// Waits for `n` running echo units, or panics with what there is.
fn running_units(up: &Up, n: usize) -> Vec<Value> {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(30) {
        let r = running(up);
        if r.len() == n {
            return r;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{n} running echo units not seen within 30s\n{}", dump(up))
}

/// Polls (through the API, quickly) until the old worker (`old_pid`) has exited, and
/// returns when the unit's new worker was first seen running, answering at its address,
/// and when the old one exited.
fn watch_worker_move(up: &Up, id: &str, old_pid: i32) -> (Duration, Duration) {
    let t0 = Instant::now();
    let (mut new_running, mut old_exited) = (None, None);
    while t0.elapsed() < Duration::from_secs(40) && old_exited.is_none() {
        let old_alive = alive(old_pid);
        let (_, units) = http(&up.addr, "GET", "/v1/apps/echo/units", None, "");
        let unit = units.as_array().into_iter().flatten().find(|u| u["unit_id"] == id);
        let surge = unit.into_iter().flat_map(|u| u["surge"].as_array().into_iter().flatten());
        for m in surge.filter(|m| m["state"] == "running") {
            if new_running.is_none() && m["address"].as_str().and_then(who).is_some() {
                assert!(old_alive, "the old worker had exited before its replacement ran");
                new_running = Some(t0.elapsed());
            }
        }
        if !old_alive {
            old_exited = Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    match (new_running, old_exited) {
        (Some(r), Some(e)) => (r, e),
        (r, e) => panic!("new worker running: {r:?}, old worker exited: {e:?}\n{}", dump(up)),
    }
}

#[test]
fn a_worker_on_a_drained_node_is_replaced_alone_make_before_break_and_a_drain_with_nowhere_to_go_says_so() {
    let dir = fresh_dir("spread-members");
    let spec = dir.join("echo.toml");
    let text = std::fs::read_to_string(ECHO).unwrap();
    std::fs::write(&spec, text.replace("max_units_per_domain = 3", "max_units_per_domain = 3\nmembers = \"spread\""))
        .unwrap();
    let up = Up::start("spread-worker", &["--agents", "6", "--shards", "2", "--app", spec.to_str().unwrap()]);
    let units = running_units(&up, 2);
    let u = &units[0];
    let (head, worker) = (nodes_of(u, "head")[0].clone(), nodes_of(u, "worker")[0].clone());
    assert_ne!(head, worker, "spread.members = \"spread\": head and worker on distinct nodes");
    let id = u["unit_id"].as_str().unwrap().to_string();
    let head_addr = head_of(u)["address"].as_str().unwrap().to_string();
    let head_pid = workload_pid(&head_addr);
    let worker_m = u["members"].as_array().unwrap().iter().find(|m| m["role"] == "worker").unwrap().clone();
    let worker_pid = workload_pid(worker_m["address"].as_str().unwrap());

    // Drain the worker's node: only the worker moves, and the old one stops only after
    // the new one runs.
    run_ok(up.cli().args(["node", "drain", &worker]));
    let (new_running, old_exited) = watch_worker_move(&up, &id, worker_pid);
    eprintln!("{id}: new worker running after {new_running:?}, old worker exited after {old_exited:?}");
    assert!(new_running < old_exited, "make before break: new ran at {new_running:?}, old exited at {old_exited:?}");
    let after = wait_for("the unit with its moved worker", Duration::from_secs(20), || {
        let u = up.units("echo").into_iter().find(|u| u["unit_id"] == id.as_str())?;
        (u["state"] == "running" && u["surge"].as_array().is_some_and(Vec::is_empty)).then_some(u)
    });
    let moved_to = nodes_of(&after, "worker")[0].clone();
    assert!(moved_to != worker && moved_to != head, "the worker moved to a third node: {after:#?}");
    assert_eq!(nodes_of(&after, "head"), vec![head.clone()], "the head stays");
    assert_eq!(workload_pid(&head_addr), head_pid, "the head kept serving, the same process");
    assert!(after["replaced_by"].is_null(), "the unit was not replaced: {after:#?}");
    let note = after["placement_note"].as_str().unwrap_or_default();
    assert!(note.contains(&format!("worker-0 moved {worker} → {moved_to}, make before break")), "{note}");
    let drained = wait_for("the drained node empty", Duration::from_secs(30), || {
        let n = up.node(&worker)?;
        (n["allocated"]["cpu_millis"] == 0).then_some(n)
    });
    assert_eq!(drained["drain_requested"], true);
    assert_eq!(running(&up).len(), 2, "no unit was added or lost");

    // Drain the node the worker moved to: its domain has no third node left (the head's
    // node holds a member already), so the drain waits, and says why everywhere.
    run_ok(up.cli().args(["node", "drain", &moved_to]));
    let why = wait_for("the drain's reason in the node's status", Duration::from_secs(20), || {
        let (status, v) = http(&up.addr, "GET", &format!("/v1/nodes/{moved_to}"), None, "");
        let w = v.pointer("/drain/waiting/0/reason")?.as_str()?.to_string();
        (status == 200).then_some(w)
    });
    assert!(why.contains("worker-0 cannot move") && why.contains("no domain can hold the unit"), "{why}");
    let table = run_ok(up.cli().args(["units", "echo"]));
    assert!(table.contains(&format!("{id}: note: drain waits: worker-0 cannot move")), "{table}");
    let nodes = run_ok(up.cli().args(["nodes"]));
    assert!(nodes.contains(&format!("{moved_to}: drain waits on echo/{id}: worker-0 cannot move")), "{nodes}");
    // The drain's own status says so too, rather than hanging silently.
    let out = up.cli().args(["node", "drain", &moved_to, "--wait", "--timeout", "3s"]).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && said.contains("drain waits on echo/"), "{said}");
    // Ending the drain clears the note; the unit kept running where it is throughout.
    run_ok(up.cli().args(["node", "uncordon", &moved_to]));
    wait_for("the note cleared", Duration::from_secs(20), || {
        let u = up.units("echo").into_iter().find(|u| u["unit_id"] == id.as_str())?;
        u["placement_note"].as_str().is_none_or(|n| !n.starts_with("drain waits")).then_some(())
    });
    assert_eq!(workload_pid(&head_addr), head_pid, "the head never moved");
}
