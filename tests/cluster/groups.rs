//! Heterogeneous units under `flotilla up --autoscale`: a CPU-only head and a GPU
//! worker group whose preferred build runs on `a100` nodes and whose alternative runs
//! on `l4` nodes (fake GPUs: the pool's local agents offer `--gpus` and the label
//! `gpu_model`). The head lands on the CPU node; the first worker on the a100; once the
//! a100 type is at its max the pool launches an l4 and the next unit's worker runs its
//! alternative there; a lost GPU worker comes back on a node of its own kind.

use std::time::Duration;

use flotilla_testkit::{Up, fresh_dir, http, metric, metrics_page, run_ok, signal, wait_for};

const POOL: &str = r#"
name = "default"
interval = "1s"
upscaling_speed = 4.0
idle_timeout = "1h"

[timeouts]
request = "30s"
agent_start = "60s"

[node_types.cpu]
cpu = 2
memory = "2Gi"
labels = { domain = "domain-a", priority = "high" }
min = 1
max = 1

[node_types.a100]
cpu = 1
memory = "1Gi"
gpu = 1
labels = { domain = "domain-a", priority = "high", gpu_model = "a100" }
min = 1
max = 1

[node_types.l4]
cpu = 1
memory = "1Gi"
gpu = 1
labels = { domain = "domain-a", priority = "high", gpu_model = "l4" }
min = 0
max = 2
"#;

const APP: &str = r#"
name = "infer"

[unit.head]
command = "flotilla"
args = ["echo-server"]
cpu = "200m"
memory = "64Mi"
serves_http = true
readiness_path = "/healthz"

[unit.groups.gpu]
command = "flotilla"
args = ["echo-server"]
cpu = "500m"
memory = "64Mi"
gpu = 1
count = 1
node_labels = { gpu_model = ["a100", "h100"] }
env = { BUILD = "cuda" }

[[unit.groups.gpu.alternatives]]
node_labels = { gpu_model = "l4" }
env = { BUILD = "cuda-small" }
performance = 0.5

[units]
min = 1
max = 3
initial = 1

[routing]
roles = ["head", "gpu"]
"#;

/// The node each member of a running unit is on, and the alternative it runs as.
fn placed(up: &Up) -> Vec<Vec<(String, String, u64)>> {
    up.units("infer")
        .iter()
        .filter(|u| u["state"] == "running")
        .map(|u| {
            u["members"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    (
                        m["member"].as_str().unwrap_or_default().to_string(),
                        m["node_id"].as_str().unwrap_or_default().to_string(),
                        m["alternative"].as_u64().unwrap_or(0),
                    )
                })
                .collect()
        })
        .collect()
}

/// The pool type of a node: its instance id is `pool-TYPE-N`.
fn kind(node: &str) -> &str {
    node.strip_prefix("pool-").and_then(|n| n.rsplit_once('-')).map_or("", |(t, _)| t)
}

#[test]
fn a_units_groups_run_on_their_own_kinds_of_node_and_alternatives_take_over_past_a_max() {
    let dir = fresh_dir("groups-files");
    let (pool, app) = (dir.join("pool.toml"), dir.join("infer.toml"));
    std::fs::write(&pool, POOL).unwrap();
    std::fs::write(&app, APP).unwrap();
    let up = Up::start("groups", &["--autoscale", "--pool", pool.to_str().unwrap(), "--app", app.to_str().unwrap()]);

    // One unit: the head on the CPU node, the GPU worker on the a100 (its template).
    let units = wait_for("the first unit running", Duration::from_secs(90), || {
        let p = placed(&up);
        (p.len() == 1).then_some(p)
    });
    let kinds: Vec<(&str, &str, u64)> = units[0].iter().map(|(m, n, a)| (m.as_str(), kind(n), *a)).collect();
    assert_eq!(kinds, [("head", "cpu", 0), ("gpu-0", "a100", 0)], "{units:?}");
    let rows = up.units("infer");
    assert_eq!(rows[0]["members"][1]["role"], "gpu", "the role is the group: {rows:?}");

    // A second unit: the a100 type is at its max, so the pool launches an l4 for the
    // alternative and the worker runs as it (`alternative: 1`).
    run_ok(up.cli().args(["scale", "infer", "--units", "2"]));
    let units = wait_for("two units running", Duration::from_secs(120), || {
        let p = placed(&up);
        (p.len() == 2).then_some(p)
    });
    let second = units.iter().find(|u| u.iter().any(|(_, n, _)| kind(n) == "l4")).expect("a unit on an l4");
    let kinds: Vec<(&str, &str, u64)> = second.iter().map(|(m, n, a)| (m.as_str(), kind(n), *a)).collect();
    assert_eq!(kinds, [("head", "cpu", 0), ("gpu-0", "l4", 1)], "{units:?}");
    let (_, pool_state) = http(&up.addr, "GET", "/v1/pools/default", None, "");
    let launched_l4 = pool_state["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|i| i["node_type"] == "l4" || i["id"].as_str().is_some_and(|id| kind(id) == "l4"));
    assert!(launched_l4, "{pool_state}");
    // The metrics count members by group and alternative.
    let page = metrics_page(up.addr.trim_start_matches("http://"));
    let placed_as = |group: &str, alt: &str| {
        let labels = [format!("group=\"{group}\""), format!("alternative=\"{alt}\""), "app=\"infer\"".to_string()];
        let line = page.lines().find(|l| {
            l.starts_with("flotilla_members_placed_total{") && labels.iter().all(|x| l.contains(x.as_str()))
        })?;
        metric(line, "flotilla_members_placed_total", "")
    };
    assert_eq!(
        (placed_as("gpu", "0"), placed_as("gpu", "1"), placed_as("head", "0")),
        (Some(1.0), Some(1.0), Some(2.0))
    );
    // Route weights scale with the member's estimate: the l4 build (0.5) gets half the
    // a100's (1) share.
    let (_, routes) = http(&up.addr, "GET", "/v1/apps/infer/routes", None, "");
    let weight = |kind_of: &str| {
        routes["routes"].as_array().into_iter().flatten().find_map(|r| {
            let gpu = r["member"] == "gpu-0" && kind(r["node_id"].as_str().unwrap_or_default()) == kind_of;
            gpu.then(|| r["weight"].as_f64().unwrap_or_default())
        })
    };
    let (a100, l4) = (weight("a100").unwrap_or_default(), weight("l4").unwrap_or_default());
    assert!(a100 > 0.0 && (l4 / a100 - 0.5).abs() < 0.2, "a100 {a100}, l4 {l4}: {routes}");

    // The a100 node is lost: the pool replaces it (its type's min), and the unit's GPU
    // worker comes back there, as its template, not on the busy l4.
    let first_gpu = units
        .iter()
        .flat_map(|u| u.iter())
        .find(|(m, n, _)| m == "gpu-0" && kind(n) == "a100")
        .map(|(_, n, _)| n.clone())
        .unwrap();
    let pid: i32 = std::fs::read_to_string(up.data.join("pool/default").join(format!("{first_gpu}.pid")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    signal(-pid, libc::SIGKILL);
    let units = wait_for("the lost GPU worker back on a new a100", Duration::from_secs(150), || {
        let p = placed(&up);
        let back =
            p.iter().any(|u| u.iter().any(|(m, n, a)| m == "gpu-0" && kind(n) == "a100" && *n != first_gpu && *a == 0));
        (p.len() == 2 && back).then_some(p)
    });
    for u in &units {
        assert_eq!(kind(&u[0].1), "cpu", "heads stay on the CPU node: {units:?}");
    }
}

/// Two groups beside the head; an apply that changes one group's template rolls only
/// that group's members, make before break: the units keep their ids, their heads and
/// the other group's members (same processes), and each changed member runs the new
/// template. A bad template for that group fails the rollout at its deadline, with the
/// old members serving on.
#[test]
fn an_apply_that_changes_one_group_rolls_only_its_members() {
    const TIERED: &str = r#"
name = "tiered"
[unit.head]
command = "flotilla"
args = ["echo-server"]
cpu = "100m"
memory = "32Mi"
serves_http = true
readiness_path = "/healthz"
[unit.groups.prefill]
command = "flotilla"
args = ["echo-server"]
cpu = "100m"
memory = "32Mi"
serves_http = true
count = 1
[unit.groups.decode]
command = "flotilla"
args = ["echo-server"]
cpu = "100m"
memory = "32Mi"
serves_http = true
count = 1
env = { BUILD = "1" }
[units]
min = 1
max = 4
initial = 2
[rollout]
max_unavailable = 1
progress_deadline = "6s"
"#;
    let dir = fresh_dir("groups-roll-files");
    let v1 = dir.join("v1.toml");
    std::fs::write(&v1, TIERED).unwrap();
    let up = Up::start("groups-roll", &["--agents", "4", "--shards", "1", "--app", v1.to_str().unwrap()]);
    // (unit, member) → the pid of the process answering at its address.
    let pids = |up: &Up| -> Option<std::collections::BTreeMap<(String, String), i64>> {
        let units: Vec<serde_json::Value> =
            up.units("tiered").into_iter().filter(|u| u["state"] == "running").collect();
        let mut out = std::collections::BTreeMap::new();
        for u in &units {
            for m in u["members"].as_array()? {
                let pid = flotilla_testkit::who(m["address"].as_str()?)?["pid"].as_i64()?;
                out.insert((u["unit_id"].as_str()?.to_string(), m["member"].as_str()?.to_string()), pid);
            }
        }
        (out.len() == 6).then_some(out)
    };
    let before = wait_for("2 running units of 3 members", Duration::from_secs(60), || pids(&up));

    let v2 = dir.join("v2.toml");
    std::fs::write(&v2, TIERED.replace("BUILD = \"1\"", "BUILD = \"2\"")).unwrap();
    run_ok(up.cli().args(["apply", v2.to_str().unwrap()]));
    let after = wait_for("the decode members rolled and the rollout complete", Duration::from_secs(90), || {
        let (_, app) = http(&up.addr, "GET", "/v1/apps/tiered", None, "");
        let p = pids(&up)?;
        (app["rollout"]["state"] == "complete" && p.keys().eq(before.keys())).then_some(p)
    });
    for ((unit, member), pid) in &before {
        let now = after[&(unit.clone(), member.clone())];
        if member == "decode-0" {
            assert_ne!(now, *pid, "{unit}/{member} runs the new template: {before:?} {after:?}");
        } else {
            assert_eq!(now, *pid, "{unit}/{member} left alone: {before:?} {after:?}");
        }
    }
    let page = metrics_page(up.addr.trim_start_matches("http://"));
    assert_eq!(metric(&page, "flotilla_members_rolled_total", "app=\"tiered\""), Some(2.0), "one member a unit");
    assert_eq!(metric(&page, "flotilla_units_replaced_total", "why=\"its template changed\""), None, "no unit");

    // A decode template that never starts: the rollout fails at its deadline, the
    // replacement members are released, and every old member serves on.
    let v3 = dir.join("v3.toml");
    let broken = TIERED.replace("BUILD = \"1\" }", "BUILD = \"3\" }\n").replacen(
        "[unit.groups.decode]\ncommand = \"flotilla\"",
        "[unit.groups.decode]\ncommand = \"/nonexistent/bin\"",
        1,
    );
    std::fs::write(&v3, broken).unwrap();
    run_ok(up.cli().args(["apply", v3.to_str().unwrap()]));
    let failed = wait_for("the rollout failed", Duration::from_secs(60), || {
        let (_, app) = http(&up.addr, "GET", "/v1/apps/tiered", None, "");
        (app["rollout"]["state"] == "failed").then_some(app)
    });
    let reason = failed["rollout"]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("decode-0") && reason.contains("progress deadline of 6s"), "{failed}");
    wait_for("no member coming up any more", Duration::from_secs(30), || {
        let units = up.units("tiered");
        units.iter().all(|u| u["surge"].as_array().is_none_or(|s| s.is_empty())).then_some(())
    });
    assert_eq!(pids(&up).as_ref(), Some(&after), "the old members serve on, none replaced");
}
