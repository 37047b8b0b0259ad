//! Node liveness, drains, cordons and preemption notices.

use std::time::{Duration, Instant};

use flotilla_testkit::{Up, alive, flotilla, fresh_dir, http, run_ok, signal, wait_for};
use serde_json::Value;

use crate::common::{ECHO, head_of, on_node, running, statuses, workload_pid};

#[test]
fn up_brings_every_agent_alive_and_notices_kill_and_drain() {
    let mut up = Up::start("lifecycle", &["--agents", "6", "--shards", "2"]);
    let started = Instant::now();
    wait_for("6 alive nodes", Duration::from_secs(20), || {
        let s = statuses(&up);
        (s.len() == 6 && s.iter().all(|s| s == "alive")).then_some(())
    });
    eprintln!("6 nodes alive after {:?}", started.elapsed());
    let nodes = up.nodes();
    let domains: std::collections::BTreeSet<_> = nodes.iter().map(|n| n["labels"]["domain"].to_string()).collect();
    assert!(domains.len() >= 2, "at least two domains: {domains:?}");
    assert!(nodes.iter().any(|n| n["labels"]["priority"] == "low"));
    let shards: std::collections::BTreeSet<_> = nodes.iter().map(|n| n["shard"].as_u64()).collect();
    assert_eq!(shards.len(), 2, "both shards own nodes");
    for n in &nodes {
        assert!(n["capacity"]["cpu_millis"].as_u64().unwrap() >= 4000);
        assert!(n["status_since"].as_str().unwrap().ends_with('Z'));
        assert!(n["incarnation"].as_u64().unwrap() > 0);
    }

    // kill -9: Suspect after 2 s, Dead after 3 s (with generous slack), in that order.
    let killed_at = Instant::now();
    signal(up.agent_pid("node-2"), libc::SIGKILL);
    let mut seen_suspect = None;
    let dead_after = wait_for("node-2 dead", Duration::from_secs(10), || {
        let st = up.node("node-2").map(|n| n["status"].as_str().unwrap().to_string());
        if st.as_deref() == Some("suspect") && seen_suspect.is_none() {
            seen_suspect = Some(killed_at.elapsed());
        }
        (st.as_deref() == Some("dead")).then(|| killed_at.elapsed())
    });
    let suspect_after = seen_suspect.expect("node-2 was Suspect before it was Dead");
    assert!(suspect_after >= Duration::from_millis(900), "not suspect before its timeout: {suspect_after:?}");
    assert!(dead_after <= Duration::from_secs(3 + 3), "dead within its timeout (+slack): {dead_after:?}");

    // Drain (the PreStop hook): Draining at once, long before any timeout could fire.
    let data = up.agent_dir("node-4");
    let t = Instant::now();
    let answer = run_ok(flotilla().args(["agent", "drain", "--data", data.to_str().unwrap()]));
    assert!(answer.starts_with("ok node-4"), "{answer}");
    let took = wait_for("node-4 draining", Duration::from_secs(5), || {
        (up.node("node-4")?["status"] == "draining").then(|| t.elapsed())
    });
    assert!(took < Duration::from_millis(1500), "draining after {took:?}, before suspect_after (2 s)");
    // The other nodes are untouched.
    assert_eq!(up.node("node-1").unwrap()["status"], "alive");

    // Ctrl-C: every agent drains and exits; nothing outlives `up`.
    let pids: Vec<i32> = ["node-1", "node-3", "node-5", "node-6"].iter().map(|n| up.agent_pid(n)).collect();
    assert!(up.stop(), "up exits cleanly");
    for pid in pids {
        assert!(!alive(pid), "agent {pid} outlived up");
    }
    let log = std::fs::read_to_string(up.data.join("up.err")).unwrap();
    assert!(log.matches("node draining").count() >= 4, "agents drained on the way out");
}

#[test]
fn a_restarted_agent_is_a_new_incarnation() {
    let up = Up::start("restart", &["--agents", "2", "--shards", "1", "--restart-agents"]);
    let first = wait_for("node-1 alive", Duration::from_secs(20), || {
        let n = up.node("node-1")?;
        (n["status"] == "alive").then(|| n["incarnation"].as_u64().unwrap())
    });
    signal(up.agent_pid("node-1"), libc::SIGKILL);
    let second = wait_for("node-1 back", Duration::from_secs(20), || {
        let n = up.node("node-1")?;
        let inc = n["incarnation"].as_u64()?;
        (n["status"] == "alive" && inc != first).then_some(inc)
    });
    assert!(second > first, "incarnations only grow");
    assert_eq!(up.nodes().len(), 2, "the new incarnation replaced the old node");
}

#[test]
fn agent_refuses_bad_configuration_with_every_error() {
    let out = flotilla()
        .args(["agent", "--aggregators", "127.0.0.1:1", "--node-id", "bad id", "--label", "x", "--cores=-2"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in ["--node-id", "--label", "--cores", "--join-token"] {
        assert!(err.contains(needle), "{needle} missing from: {err}");
    }
}

#[test]
fn drain_without_a_running_agent_says_so() {
    let dir = fresh_dir("nodrain");
    let out = flotilla().args(["agent", "drain", "--data", dir.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no agent is running"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cordoned_node_gets_nothing_new() {
    let up = Up::start("cordon", &["--agents", "4", "--shards", "2", "--app", ECHO]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let token = up.token();
    let node_cmd =
        |verb: &str, node: &str| up.cli().args(["node", verb, node]).env("FLOTILLA_TOKEN", &token).output().unwrap();
    for n in ["node-1", "node-2", "node-3", "node-4"] {
        let out = node_cmd("cordon", n);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }
    wait_for("every node shows cordoned", Duration::from_secs(10), || {
        let nodes = up.nodes();
        (nodes.len() == 4 && nodes.iter().all(|n| n["cordoned"] == true)).then_some(())
    });
    // What runs stays; nothing new lands.
    assert_eq!(running(&up).len(), 2);
    let (status, _) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units": 3}"#);
    assert_eq!(status, 200);
    let why = wait_for("the third unit waits, saying why", Duration::from_secs(10), || {
        let units = up.units("echo");
        let queued = units.iter().find(|u| u["state"] == "queued")?;
        queued["unplaced_reason"].as_str().filter(|r| r.contains("cordoned")).map(str::to_string)
    });
    assert!(why.contains("cordoned"), "{why}");
    let out = node_cmd("uncordon", "node-3");
    assert!(out.status.success());
    let placed = wait_for("the third unit placed on the uncordoned node", Duration::from_secs(30), || {
        let units = running(&up);
        (units.len() == 3).then_some(units)
    });
    let on_3 =
        placed.iter().filter(|u| u["members"].as_array().unwrap().iter().all(|m| m["node_id"] == "node-3")).count();
    assert!(on_3 >= 1, "{placed:?}");
    // Operator calls need the token and a known node.
    let (status, _) = http(&up.addr, "POST", "/v1/nodes/node-1/uncordon", Some("wrong"), "");
    assert_eq!(status, 401);
    let (status, _) = http(&up.addr, "POST", "/v1/nodes/nope/cordon", Some(&token), "");
    assert_eq!(status, 404);
}

/// Leaves `node` (by `leave`), and checks that every unit on it got a Running
/// replacement before its head's process exited, and that nothing runs there after.
fn leave_node_make_before_break(up: &Up, node: &str, leave: impl FnOnce()) {
    let before: Vec<Value> = running(up).into_iter().filter(|u| on_node(u, node)).collect();
    assert!(!before.is_empty(), "a unit runs on {node}");
    let pids: Vec<(String, i32)> = before
        .iter()
        .map(|u| {
            let addr = head_of(u)["address"].as_str().unwrap().to_string();
            (u["unit_id"].as_str().unwrap().to_string(), workload_pid(&addr))
        })
        .collect();
    leave();
    let t0 = Instant::now();
    let mut replaced_at: std::collections::HashMap<String, Duration> = Default::default();
    let mut exited_at: std::collections::HashMap<String, Duration> = Default::default();
    while t0.elapsed() < Duration::from_secs(40) && exited_at.len() < pids.len() {
        let units = up.units("echo");
        for (id, pid) in &pids {
            let Some(old) = units.iter().find(|u| u["unit_id"] == id.as_str()) else { continue };
            let replacement = old["replaced_by"].as_str().and_then(|r| units.iter().find(|u| u["unit_id"] == r));
            if replacement.is_some_and(|r| r["state"] == "running") {
                replaced_at.entry(id.clone()).or_insert(t0.elapsed());
            }
            if !alive(*pid) {
                exited_at.entry(id.clone()).or_insert(t0.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for (id, _) in &pids {
        let (r, e) = (replaced_at.get(id), exited_at.get(id));
        eprintln!("{id} on {node}: replacement running after {r:?}, old head exited after {e:?}");
        let (r, e) = (r.expect("a replacement ran"), e.expect("the old head stopped"));
        assert!(r < e, "{id}: replacement Running ({r:?}) before the old head exits ({e:?})");
    }
    wait_for("the old units terminated and nothing left on the node", Duration::from_secs(30), || {
        let units = up.units("echo");
        let old_done =
            pids.iter().all(|(id, _)| units.iter().any(|u| u["unit_id"] == id.as_str() && u["state"] == "terminated"));
        let live = running(up);
        (old_done && live.len() == 2 && !live.iter().any(|u| on_node(u, node))).then_some(())
    });
}

#[test]
fn node_drain_and_preemption_notices_replace_units_before_stopping_them() {
    let up = Up::start("nodedrain", &["--agents", "6", "--shards", "2", "--app", ECHO]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let token = up.token();

    // An operator drain.
    let node = head_of(&running(&up)[0])["node_id"].as_str().unwrap().to_string();
    leave_node_make_before_break(&up, &node, || {
        let out = run_ok(up.cli().args(["node", "drain", &node]).env("FLOTILLA_TOKEN", &token));
        assert!(out.contains("draining"), "{out}");
    });
    let n = up.node(&node).unwrap();
    assert_eq!((n["cordoned"].clone(), n["drain_requested"].clone()), (Value::Bool(true), Value::Bool(true)));
    assert_eq!(n["status"], "alive", "the node itself stays");

    // A cloud's preemption notice on another node.
    let other = head_of(&running(&up)[0])["node_id"].as_str().unwrap().to_string();
    assert_ne!(other, node);
    let notice = up.agent_dir(&other).join("preemption-notice");
    leave_node_make_before_break(&up, &other, || std::fs::write(&notice, "").unwrap());
    assert_eq!(up.node(&other).unwrap()["health"]["preemption_notice"], true);

    let (status, _) = http(&up.addr, "POST", &format!("/v1/nodes/{node}/drain"), None, "");
    assert_eq!(status, 401, "draining needs the token");
}

/// `up`'s shards keep their state (cordons, drains, fencing marks) in the data dir, as a
/// standalone shard does: a cordon outlives a restart of `up`.
#[test]
fn a_cordon_outlives_a_restart_of_up() {
    let mut up = Up::start("cordon-restart", &["--agents", "2"]);
    wait_for("2 alive nodes", Duration::from_secs(20), || (statuses(&up).len() == 2).then_some(()));
    run_ok(up.cli().args(["node", "cordon", "node-1"]));
    assert!(up.restart(), "up stops cleanly");
    let node =
        wait_for("node-1 back", Duration::from_secs(30), || up.node("node-1").filter(|n| n["status"] == "alive"));
    assert_eq!(node["cordoned"], true, "{node}");
    assert_eq!(up.node("node-2").unwrap()["cordoned"], false);
    // The shard owning node-1's domain saved it (one that changed nothing saved nothing).
    assert!(up.data.join("shard-0-of-2.state.json").exists() || up.data.join("shard-1-of-2.state.json").exists());
}
