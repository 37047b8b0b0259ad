//! Events that last (issue #36, item 4): node status changes, unit transitions,
//! rollouts and operator actions are recorded with sequence numbers, filtered by app,
//! node, type and age, paged, followed with `-f`, and still there after a restart of
//! `up`.

use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::Duration;

use flotilla_testkit::{Up, http, run_ok, signal, wait_for};
use serde_json::Value;

use crate::common::{ECHO, running};

fn history(up: &Up, query: &str) -> Value {
    let (status, v) = http(&up.addr, "GET", &format!("/v1/events/history?{query}"), None, "");
    assert_eq!(status, 200, "{v}");
    v
}

fn messages(v: &Value) -> Vec<String> {
    v["events"].as_array().unwrap().iter().map(|e| e["message"].as_str().unwrap().to_string()).collect()
}

#[test]
fn node_unit_and_operator_events_are_kept_filtered_paged_followed_and_survive_a_restart() {
    let mut up = Up::start("events", &["--agents", "4", "--shards", "1", "--app", ECHO]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));

    // Followed from now: what is recorded next shows up on its stdout.
    let mut follow = up
        .cli()
        .args(["events", "-f", "--app", "echo", "--type", "scale"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = run_ok(up.cli().args(["scale", "echo", "--units", "3", "--wait", "--timeout", "60s"]));
    assert!(out.contains("3"), "{out}");
    let mut lines = BufReader::new(follow.stdout.take().unwrap()).lines();
    let followed = wait_for("the scale in the followed stream", Duration::from_secs(15), || {
        let line = lines.next()?.ok()?;
        line.contains("echo: scaled to 3 units").then_some(line)
    });
    assert!(followed.contains("api-token"), "{followed}");
    signal(follow.id() as i32, libc::SIGTERM);
    let _ = follow.wait();

    // The new unit's transitions (sampled each second), with its app and node.
    let units = wait_for("the third unit's events", Duration::from_secs(20), || {
        let v = history(&up, "app=echo&type=unit");
        messages(&v).iter().any(|m| m.ends_with("running")).then_some(v)
    });
    let running_event = units["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["message"].as_str().is_some_and(|m| m.ends_with("running")));
    let node = running_event.and_then(|e| e["node"].as_str()).unwrap().to_string();

    // The node of a running unit killed: its status changes are events, found by node.
    let victim = node.as_str();
    signal(-up.agent_pid(victim), libc::SIGKILL);
    let dead = wait_for("the node dead in the history", Duration::from_secs(20), || {
        let v = history(&up, &format!("node={victim}"));
        messages(&v).iter().any(|m| m.contains("→ dead")).then_some(v)
    });
    // What ran there is in the node's history too, with why it ended.
    let on_it = wait_for("the unit lost with the node", Duration::from_secs(20), || {
        let v = history(&up, &format!("node={victim}&type=unit"));
        messages(&v).iter().any(|m| m.contains("→ terminated: head lost")).then_some(v)
    });
    assert!(on_it["events"].as_array().unwrap().iter().all(|e| e["node"] == victim), "{on_it}");
    let nodes = history(&up, &format!("node={victim}&type=node"));
    assert!(messages(&nodes).iter().all(|m| m.starts_with(victim)), "{dead}");
    let table = run_ok(up.cli().args(["events", "--node", victim, "--since", "10m"]));
    assert!(table.contains("SEQ") && table.contains("→ dead"), "{table}");

    // Paging forward by sequence number.
    let all = history(&up, "limit=1000");
    let seqs: Vec<u64> = all["events"].as_array().unwrap().iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]) && seqs.len() >= 4, "{all}");
    let page = history(&up, &format!("after={}&limit=2", seqs[0]));
    let got: Vec<u64> = page["events"].as_array().unwrap().iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(got, seqs[1..3].to_vec(), "{page}");
    assert_eq!(page["next_after"], seqs[2]);

    // Bad queries say what is accepted.
    let (status, v) = http(&up.addr, "GET", "/v1/events/history?since=yesterday", None, "");
    assert_eq!(status, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("1h30m"), "{v}");
    let (status, _) = http(&up.addr, "GET", "/v1/events/history?limit=5000", None, "");
    assert_eq!(status, 400);
    let (status, v) = http(&up.addr, "GET", "/v1/events/history?color=red", None, "");
    assert_eq!(status, 400, "{v}");
    let out = up.cli().args(["events", "--since", "soon"]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("since="), "{out:?}");

    // Restarted: the history is there, and numbering goes on after it.
    let newest = all["newest"].as_u64().unwrap();
    assert!(up.restart(), "up stops cleanly");
    wait_for("2 or more running units again", Duration::from_secs(60), || (running(&up).len() >= 2).then_some(()));
    let after = history(&up, "limit=1000");
    let kept = messages(&after);
    assert!(kept.iter().any(|m| m == "echo: scaled to 3 units"), "{after}");
    assert!(kept.iter().any(|m| m.starts_with(victim) && m.contains("→ dead")), "{after}");
    run_ok(up.cli().args(["scale", "echo", "--units", "2"]));
    let v = history(&up, &format!("after={newest}&type=scale"));
    assert_eq!(messages(&v), vec!["echo: scaled to 2 units"], "{v}");
    assert!(v["events"][0]["seq"].as_u64().unwrap() > newest);
}
