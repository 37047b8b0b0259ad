//! The exec provider end to end: `flotilla up --autoscale` with a pool whose instances
//! come from `examples/providers/local-exec.sh`, which runs each one as a real `flotilla
//! agent` process (docs/exec-provider.md). The pool grows for pending units and drains
//! and terminates a node left idle, whose agent process then exits. The script keeps each
//! agent's pid in `DATA/pool/default/ID.pid` with the agent leading its own process
//! group, so `Up`'s drop kills whatever is left even when the test fails.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use flotilla_testkit::{Up, alive, fresh_dir, http, run_ok, wait_for};
use serde_json::Value;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/providers/local-exec.sh");

/// One one-CPU node type, min 1, idle nodes terminated after 3 s; instances launched,
/// listed and terminated by the example script.
fn pool_file() -> String {
    format!(
        r#"
name = "default"
interval = "1s"
upscaling_speed = 4.0
max_concurrent_launches = 4

[timeouts]
request = "30s"
agent_start = "60s"
drain = "30s"
terminate = "30s"

[provider]
kind = "exec"
launch = ["bash", "{SCRIPT}", "launch"]
terminate = ["bash", "{SCRIPT}", "terminate"]
list = ["bash", "{SCRIPT}", "list"]
timeout = "20s"
# Ports away from other tests' agents; SIGKILL 2 s after SIGTERM.
env = {{ FLOTILLA_PORT_BASE = "41000", FLOTILLA_STOP_GRACE = "2" }}

[node_types.small]
cpu = 1
memory = "1Gi"
labels = {{ domain = "domain-a", priority = "high" }}
min = 1
max = 3
idle_timeout = "3s"
"#
    )
}

/// The echo example with members of 400m: one unit (head and worker) fills a node.
fn files(dir: &Path) -> (String, String) {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml"))
        .unwrap()
        .replace("cpu = \"250m\"", "cpu = \"400m\"")
        .replace("initial = 2", "initial = 1");
    let (pool, app) = (dir.join("pool.toml"), dir.join("echo.toml"));
    std::fs::write(&pool, pool_file()).unwrap();
    std::fs::write(&app, spec).unwrap();
    (pool.display().to_string(), app.display().to_string())
}

/// The node ids of the members of running units, by unit.
fn running_units(up: &Up) -> Vec<Vec<String>> {
    up.units("echo")
        .iter()
        .filter(|u| u["state"] == "running")
        .map(|u| {
            u["members"].as_array().into_iter().flatten().map(|m| m["node_id"].as_str().unwrap_or("").into()).collect()
        })
        .collect()
}

/// The script's agents: instance id to pid, from `DATA/pool/default/ID.pid`.
fn script_agents(data: &Path) -> BTreeMap<String, i32> {
    let Ok(entries) = std::fs::read_dir(data.join("pool").join("default")) else { return BTreeMap::new() };
    entries
        .filter_map(|e| {
            let p = e.ok()?.path();
            if p.extension()? != "pid" {
                return None;
            }
            let pid = std::fs::read_to_string(&p).ok()?.trim().parse().ok()?;
            Some((p.file_stem()?.to_str()?.to_string(), pid))
        })
        .collect()
}

/// The process group `pid` leads (0 when it is gone).
fn process_group(pid: i32) -> i32 {
    // SAFETY: getpgid(2) only reads.
    unsafe { libc::getpgid(pid) }
}

fn instances(up: &Up) -> Vec<Value> {
    let (status, body) = http(&up.addr, "GET", "/v1/pools/default", None, "");
    if status != 200 {
        return vec![];
    }
    body["instances"].as_array().cloned().unwrap_or_default()
}

fn in_state(up: &Up, state: &str) -> Vec<String> {
    instances(up).iter().filter(|i| i["state"] == state).filter_map(|i| i["id"].as_str().map(String::from)).collect()
}

#[test]
fn exec_provider_with_the_example_script_grows_and_shrinks_a_pool_of_real_agents() {
    let dir = fresh_dir("pool-exec-files");
    let (pool, app) = files(&dir);
    let up = Up::start("pool-exec", &["--autoscale", "--pool", &pool, "--app", &app]);

    // The min node, launched by the script, takes the one unit.
    wait_for("the first unit on the min node", Duration::from_secs(90), || {
        let units = running_units(&up);
        (units.len() == 1 && units[0].iter().all(|n| n.starts_with("pool-"))).then_some(())
    });

    // Two units need two nodes: the pool launches a second agent through the script.
    run_ok(up.cli().args(["scale", "echo", "--units", "2"]));
    let units = wait_for("two running units on pool nodes", Duration::from_secs(120), || {
        let units = running_units(&up);
        (units.len() == 2 && units.iter().flatten().all(|n| n.starts_with("pool-"))).then_some(units)
    });
    let mut nodes: Vec<String> = units.into_iter().flatten().collect();
    nodes.sort();
    nodes.dedup();
    assert_eq!(nodes.len(), 2, "one node per unit: {nodes:?}");
    let agents = script_agents(&up.data);
    for n in &nodes {
        let pid = *agents.get(n).unwrap_or_else(|| panic!("no pid file for {n}: {agents:?}"));
        assert!(alive(pid), "{n}'s agent {pid} is not running");
        assert_eq!(process_group(pid), pid, "{n}'s agent {pid} does not lead its process group");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        assert!(args.windows(2).any(|w| w[0] == b"--node-id" && w[1] == n.as_bytes()), "{n}: {pid} is not its agent");
    }
    let mut running = wait_for("two running instances", Duration::from_secs(10), || {
        let r = in_state(&up, "running");
        (r.len() == 2).then_some(r)
    });
    running.sort();
    assert_eq!(running, nodes, "the pool's running instances are the units' nodes");

    // Back to one unit: the node left idle is drained, terminated by the script, and its
    // agent exits; the other stays (it runs the unit, and min is 1).
    run_ok(up.cli().args(["scale", "echo", "--units", "1"]));
    let gone = wait_for("an idle node terminated", Duration::from_secs(90), || {
        let t = in_state(&up, "terminated");
        t.into_iter().find(|id| nodes.contains(id))
    });
    let pid = agents[&gone];
    wait_for("the terminated node's agent gone", Duration::from_secs(30), || (!alive(pid)).then_some(()));
    let units = running_units(&up);
    assert_eq!(units.len(), 1, "{units:?}");
    let kept: Vec<&String> = nodes.iter().filter(|n| **n != gone).collect();
    assert!(units[0].iter().all(|n| n == kept[0]), "the unit runs on the node that stays: {units:?}, kept {kept:?}");
    assert!(alive(agents[kept[0]]), "the node that stays lost its agent");
    wait_for("the script no longer lists it", Duration::from_secs(30), || {
        (!script_agents(&up.data).contains_key(&gone)).then_some(())
    });

    // Dropping `Up` kills the agents the script started (their pid files are where it
    // looks), and removes the data dir.
    let pids: Vec<i32> = script_agents(&up.data).into_values().collect();
    assert!(!pids.is_empty());
    drop(up);
    wait_for("every agent the script started stopped", Duration::from_secs(15), || {
        pids.iter().all(|p| !alive(*p)).then_some(())
    });
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #40 item 4: the cheapest type cannot be had (its launches fail, as a spot type
/// with no capacity does): it is marked unavailable, with the provider's reason, and the
/// unit's demand goes to the next cheapest type at once, whose node takes it.
#[test]
fn a_node_type_whose_launches_fail_falls_back_to_the_next_cheapest() {
    let dir = fresh_dir("pool-fallback-files");
    let wrapper = dir.join("spot-exhausted.sh");
    std::fs::write(
        &wrapper,
        format!(
            "#!/usr/bin/env bash\n\
             if [[ $1 == launch && $FLOTILLA_NODE_TYPE == spot ]]; then\n\
             \x20 echo 'ZONE_RESOURCE_POOL_EXHAUSTED: no spot capacity in domain-a' >&2; exit 1\n\
             fi\n\
             exec bash {SCRIPT} \"$@\"\n"
        ),
    )
    .unwrap();
    let w = wrapper.display().to_string();
    let pool = pool_file()
        .replace(&format!("bash\", \"{SCRIPT}"), &format!("bash\", \"{w}"))
        .replace("[node_types.small]", "[node_types.ondemand]")
        .replace("min = 1\nmax = 3", "min = 0\nmax = 3\ncost = 0.20")
        + "\n[node_types.spot]\ncpu = 1\nmemory = \"1Gi\"\nlabels = { domain = \"domain-a\", priority = \"high\" }\nmax = 3\ncost = 0.05\n";
    let (pool_path, app) = files(&dir);
    std::fs::write(&pool_path, pool).unwrap();
    let up = Up::start("pool-fallback", &["--autoscale", "--pool", &pool_path, "--app", &app]);

    let unit = wait_for("the unit running on an ondemand node", Duration::from_secs(120), || {
        let units = running_units(&up);
        (units.len() == 1 && units[0].iter().all(|n| n.starts_with("pool-ondemand-"))).then(|| units[0].clone())
    });
    let (status, body) = http(&up.addr, "GET", "/v1/pools/default", None, "");
    assert_eq!(status, 200, "{body}");
    let reason = body["unavailable"]["spot"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("ZONE_RESOURCE_POOL_EXHAUSTED"), "{body:#}");
    let spot: Vec<&Value> = body["instances"].as_array().unwrap().iter().filter(|i| i["node_type"] == "spot").collect();
    assert!(!spot.is_empty() && spot.iter().all(|i| i["state"] == "terminated"), "{spot:#?}");
    let decisions = body["decisions"].as_array().unwrap();
    assert!(
        decisions.iter().any(|d| d["explanation"].as_str().is_some_and(|e| e.contains("spot unavailable"))),
        "{decisions:#?}"
    );
    // The fallback took one pass (1 s), not the instance request timeout (30 s).
    let failed = spot.iter().filter_map(|i| i["since_ms"].as_u64()).min().unwrap();
    let launched = body["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|i| i["node_type"] == "ondemand")
        .filter_map(|i| i["history"][0][1].as_u64())
        .min()
        .unwrap();
    assert!(launched.saturating_sub(failed) < 10_000, "ondemand queued {} ms after spot gave up", launched - failed);
    eprintln!("{unit:?} on ondemand; queued {} ms after spot gave up", launched.saturating_sub(failed));
    let _ = std::fs::remove_dir_all(&dir);
}
