//! Units placed from an app spec, their workloads and what happens when those fail.

use std::process::Stdio;
use std::time::Duration;

use flotilla_testkit::{TempDir, Up, alive, flotilla, free_port, get_text, http, run_ok, signal, wait_for, who};
use serde_json::Value;

use crate::common::{ECHO, running};

#[test]
fn up_with_an_app_places_its_units_and_pushes_assignments() {
    let up = Up::start("app", &["--agents", "6", "--shards", "2", "--app", ECHO]);
    let units = wait_for("2 running echo units", Duration::from_secs(30), || {
        let units = up.units("echo");
        (units.len() == 2 && units.iter().all(|u| u["state"] == "running")).then_some(units)
    });
    let nodes = up.nodes();
    let mut per_node: std::collections::BTreeMap<String, (u64, Vec<String>)> = Default::default();
    for u in &units {
        let members = u["members"].as_array().unwrap();
        assert_eq!(members.len(), 2, "one head and one worker");
        let domains: std::collections::BTreeSet<String> = members
            .iter()
            .map(|m| {
                let n = nodes.iter().find(|n| n["node_id"] == m["node_id"]).unwrap();
                n["labels"]["domain"].as_str().unwrap().to_string()
            })
            .collect();
        assert_eq!(domains.len(), 1, "a unit lives in one domain");
        assert_eq!(u["domain"].as_str().unwrap(), domains.iter().next().unwrap());
        for m in members {
            let e = per_node.entry(m["node_id"].as_str().unwrap().to_string()).or_default();
            e.0 += 250;
            e.1.push(format!("{}/{}", u["unit_id"].as_str().unwrap(), m["member"].as_str().unwrap()));
        }
    }
    for (node, (cpu, members)) in &per_node {
        let n = nodes.iter().find(|n| n["node_id"] == node.as_str()).unwrap();
        assert!(n["allocated"]["cpu_millis"].as_u64().unwrap() >= *cpu, "{node}'s allocated includes its members");
        // The agent received exactly these assignments.
        let got = wait_for("assignments on the agent", Duration::from_secs(10), || {
            let text = std::fs::read_to_string(up.agent_dir(node).join("assignments.json")).ok()?;
            let v: Value = serde_json::from_str(&text).ok()?;
            let mut got: Vec<String> = v["assignments"]
                .as_array()?
                .iter()
                .map(|a| format!("{}/{}", a["unit"].as_str().unwrap_or(""), a["member"].as_str().unwrap_or("")))
                .collect();
            got.sort();
            let mut want = members.clone();
            want.sort();
            (got == want).then_some(got)
        });
        assert!(!got.is_empty());
    }
    // Every member answers HTTP on its address, as itself.
    let mut pids = Vec::new();
    for u in &units {
        for m in u["members"].as_array().unwrap() {
            assert_eq!(m["state"], "running");
            let who = who(m["address"].as_str().unwrap()).expect("the member answers");
            assert_eq!(who["unit"], u["unit_id"]);
            assert_eq!(who["node"], m["node_id"]);
            assert_eq!(who["role"], m["role"]);
            pids.push((
                m["address"].as_str().unwrap().to_string(),
                m["node_id"].as_str().unwrap().to_string(),
                who["pid"].as_i64().unwrap() as i32,
            ));
        }
    }
    // kill -9 of a workload: its agent restarts it (a new process at the same address).
    let (addr, _, pid) = pids[0].clone();
    signal(pid, libc::SIGKILL);
    let new_pid = wait_for("the workload restarted", Duration::from_secs(15), || {
        let p = who(&addr)?["pid"].as_i64()? as i32;
        (p != pid).then_some(p)
    });
    assert!(alive(new_pid));
    // kill -9 of an agent: none of its workloads survive it.
    let node = pids[1].1.clone();
    let on_node: Vec<i32> =
        pids.iter().filter(|p| p.1 == node).map(|p| if p.2 == pid { new_pid } else { p.2 }).collect();
    signal(up.agent_pid(&node), libc::SIGKILL);
    wait_for("the killed agent's workloads gone", Duration::from_secs(10), || {
        on_node.iter().all(|p| !alive(*p)).then_some(())
    });

    let apps = run_ok(up.cli().args(["apps", "--json"]));
    assert!(apps.contains("\"echo\""), "{apps}");
    let missing = up.cli().args(["units", "nope"]).output().unwrap();
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no scheduler runs app"));
    // Stopping `up` leaves no workload behind.
    let survivors: Vec<i32> = pids.iter().map(|p| if p.2 == pid { new_pid } else { p.2 }).collect();
    let mut up = up;
    assert!(up.stop(), "up exits cleanly");
    for p in survivors {
        assert!(!alive(p), "workload {p} outlived up");
    }
}

#[test]
fn a_bad_app_spec_is_refused_with_every_problem() {
    let dir = TempDir::new("badspec");
    let spec = dir.join("bad.toml");
    std::fs::write(&spec, "name = \"Bad\"\n[unit.head]\ncommand = \"\"\ncpu = \"x\"\nmemory = \"1Mi\"\n[units]\nmin = 2\nmax = 1\ninitial = 1\n").unwrap();
    let out = flotilla()
        .args(["up", "--agents", "0", "--listen", "127.0.0.1:0", "--data"])
        .arg(dir.path())
        .arg("--app")
        .arg(&spec)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in ["bad.toml", "name:", "unit.head.command", "unit.head.cpu", "units.min"] {
        assert!(err.contains(needle), "{needle} missing from {err}");
    }
}

#[test]
fn echo_server_answers_with_its_identity_on_flotilla_port() {
    let port = free_port();
    let mut child = flotilla()
        .arg("echo-server")
        .env("FLOTILLA_PORT", port.to_string())
        .env("FLOTILLA_NODE_ID", "node-7")
        .env("FLOTILLA_UNIT", "echo-3")
        .env("FLOTILLA_ROLE", "head")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let v = wait_for("echo-server", Duration::from_secs(10), || who(&format!("127.0.0.1:{port}")));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(v["node"], "node-7");
    assert_eq!(v["unit"], "echo-3");
    assert_eq!(v["role"], "head");
}

/// Issue #41 item 4: `--error-rate` answers its share of requests 500, evenly (a bad
/// version by its args alone); `/healthz` stays up; a rate outside 0..1 is refused.
#[test]
fn echo_server_fails_its_error_rate_of_requests() {
    let port = free_port();
    let mut child = flotilla()
        .args(["echo-server", "--error-rate", "0.2"])
        .env("FLOTILLA_PORT", port.to_string())
        .stderr(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{port}");
    wait_for("echo-server", Duration::from_secs(10), || get_text(&addr, "/healthz"));
    let statuses: Vec<u16> = (0..10).map(|i| http(&addr, "GET", &format!("/r{i}"), None, "").0).collect();
    let healthz = http(&addr, "GET", "/healthz", None, "").0;
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(statuses, [200, 200, 200, 200, 500, 200, 200, 200, 200, 500]);
    assert_eq!(healthz, 200);
    let out = flotilla().args(["echo-server", "--error-rate", "1.5"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--error-rate must be within 0 and 1"));
}

/// Issue #35 item 8: `up` stopping drains its agents, which is `up` going away, not
/// nodes to replace units from: its schedulers stop first and queue nothing.
#[test]
fn stopping_up_queues_no_replacements() {
    let mut up = Up::start("stop-quietly", &["--agents", "2", "--app", ECHO]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    assert!(up.stop(), "up exits cleanly");
    let log = std::fs::read_to_string(up.data.join("up.err")).unwrap();
    assert!(log.contains("node draining"), "the agents drained: {log}");
    assert!(!log.contains("a replacement is queued"), "{log}");
}
