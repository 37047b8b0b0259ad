//! Pool autoscaling with real agents: `flotilla up --autoscale` grows the pool when an app
//! is scaled past it and drains and terminates nodes that sit idle; a pool autoscaler
//! killed between a launch and its next sync restarts without leaking or doubling an
//! instance.

use std::path::{Path, PathBuf};
use std::time::Duration;

use flotilla_testkit::{Group, Up, alive, fresh_dir, http, run_ok, signal, wait_for};
use serde_json::Value;

/// Two one-CPU node types, one per domain, with timings in seconds.
const POOL: &str = r#"
name = "default"
interval = "1s"
upscaling_speed = 4.0
max_concurrent_launches = 4
idle_timeout = "3s"

[timeouts]
request = "30s"
agent_start = "60s"
drain = "30s"

[node_types.small-a]
cpu = 1
memory = "1Gi"
labels = { domain = "domain-a", priority = "high" }
min = 1
max = 4

[node_types.small-b]
cpu = 1
memory = "1Gi"
labels = { domain = "domain-b", priority = "high" }
min = 0
max = 2
"#;

/// The echo example with members of 400m: one unit (head and worker) fills a node.
fn files(dir: &Path) -> (PathBuf, PathBuf) {
    let spec = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml"))
        .unwrap()
        .replace("cpu = \"250m\"", "cpu = \"400m\"")
        .replace("max_units_per_domain = 3", "max_units_per_domain = 10")
        .replace("initial = 2", "initial = 1")
        .replace("max = 6", "max = 8");
    let (pool, app) = (dir.join("pool.toml"), dir.join("echo.toml"));
    std::fs::write(&pool, POOL).unwrap();
    std::fs::write(&app, spec).unwrap();
    (pool, app)
}

fn running_units(up: &Up) -> usize {
    up.units("echo").iter().filter(|u| u["state"] == "running").count()
}

pub(crate) fn pool(up: &Up) -> Option<Value> {
    let (status, body) = http(&up.addr, "GET", "/v1/pools/default", None, "");
    (status == 200).then_some(body)
}

pub(crate) fn instances_in(p: &Value, state: &str) -> Vec<String> {
    p["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|i| i["state"] == state)
        .map(|i| i["id"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// Pids of the pool's agents that are still running.
fn live_pool_agents(data: &Path) -> Vec<i32> {
    let dir = data.join("pool").join("default");
    let Ok(entries) = std::fs::read_dir(dir) else { return vec![] };
    entries
        .filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "pid").then(|| std::fs::read_to_string(&p).ok()?.trim().parse::<i32>().ok())?
        })
        .filter(|pid| alive(*pid))
        .collect()
}

/// Issue #34 item 1: the app's one unit fills domain-a (`max_units_per_domain = 1`) on a
/// big node with room to spare. A second unit cannot go there, and the pool must not
/// count on that room: it launches a node in domain-b, and both units run.
#[test]
fn the_pool_grows_past_a_domain_the_apps_spread_limit_fills() {
    let dir = fresh_dir("pool-spread-files");
    let pool = POOL.replace("[node_types.small-a]\ncpu = 1", "[node_types.small-a]\ncpu = 2").replace(
        "labels = { domain = \"domain-a\", priority = \"high\" }",
        "labels = { domain = \"domain-a\", priority = \"low\" }",
    );
    let (pool_file, app) = files(&dir);
    std::fs::write(&pool_file, pool).unwrap();
    let spec = std::fs::read_to_string(&app).unwrap().replace("max_units_per_domain = 10", "max_units_per_domain = 1");
    std::fs::write(&app, spec).unwrap();
    let up = Up::start(
        "pool-spread",
        &["--autoscale", "--pool", pool_file.to_str().unwrap(), "--app", app.to_str().unwrap()],
    );
    wait_for("the first unit on the min node", Duration::from_secs(60), || (running_units(&up) == 1).then_some(()));
    run_ok(up.cli().args(["scale", "echo", "--units", "2"]));
    wait_for("both units running, one per domain", Duration::from_secs(120), || {
        (running_units(&up) == 2).then_some(())
    });
    let domains: std::collections::BTreeSet<String> = up
        .units("echo")
        .iter()
        .filter(|u| u["state"] == "running")
        .filter_map(|u| u["domain"].as_str().map(String::from))
        .collect();
    assert_eq!(domains.len(), 2, "{domains:?}");
    // The pool's history chart: running instances by node type, every 10 s.
    let running_types = wait_for("a pool sample with 2 running instances", Duration::from_secs(30), || {
        let (_, v) = flotilla_testkit::http(&up.addr, "GET", "/v1/pools/default/history?window=1h", None, "");
        v["points"].as_array()?.iter().rev().find(|p| p["v"]["total"] == 2.0).cloned()
    });
    assert_eq!(running_types["v"].as_object().unwrap().len(), 3, "two node types and the total: {running_types}");
}

/// Issue #34 item 1: a unit no node type can hold is infeasible to the pool, which says
/// so in its decision, and the unit's row says the pool cannot help.
#[test]
fn a_unit_no_node_type_can_hold_is_reported_infeasible_by_the_pool_and_on_the_unit() {
    let dir = fresh_dir("pool-infeasible-files");
    let (pool_file, app) = files(&dir);
    let spec = std::fs::read_to_string(&app).unwrap().replace("cpu = \"400m\"", "cpu = \"3\"");
    std::fs::write(&app, spec).unwrap();
    let up = Up::start(
        "pool-infeasible",
        &["--autoscale", "--pool", pool_file.to_str().unwrap(), "--app", app.to_str().unwrap()],
    );
    let p = wait_for("the pool's decision", Duration::from_secs(60), || {
        pool(&up).filter(|p| p.pointer("/decisions/0/cannot_place/echo").is_some())
    });
    let reason = p.pointer("/decisions/0/cannot_place/echo").and_then(Value::as_str).unwrap().to_string();
    assert!(reason.contains("bigger than every node type"), "{reason}");
    let units = up.units("echo");
    let queued = units.iter().find(|u| u["state"] == "queued").expect("a queued unit");
    assert_eq!(queued["pool"].as_str(), Some(format!("pool default cannot place them: {reason}").as_str()), "{queued}");
    let text = run_ok(up.cli().args(["units", "echo"]));
    assert!(text.contains("pool default cannot place them"), "{text}");
}

#[test]
fn up_autoscale_grows_the_pool_for_pending_units_and_shrinks_it_when_idle() {
    let dir = fresh_dir("pool-files");
    let (pool_file, app) = files(&dir);
    let mut up =
        Up::start("pool-up", &["--autoscale", "--pool", pool_file.to_str().unwrap(), "--app", app.to_str().unwrap()]);
    // The pool starts with small-a's min: one node, which takes the one unit.
    wait_for("the first unit on the min node", Duration::from_secs(60), || (running_units(&up) == 1).then_some(()));
    let nodes = up.nodes();
    assert_eq!(nodes.len(), 1, "only the min node: {nodes:?}");
    assert!(nodes[0]["node_id"].as_str().unwrap().starts_with("pool-small-a-"), "{nodes:?}");

    // Scaled past what the pool holds, the pool grows: each new unit needs a node.
    run_ok(up.cli().args(["scale", "echo", "--units", "4"]));
    wait_for("four running units", Duration::from_secs(120), || (running_units(&up) == 4).then_some(()));
    let p = wait_for("four running instances", Duration::from_secs(10), || {
        pool(&up).filter(|p| instances_in(p, "running").len() == 4)
    });
    assert_eq!(up.nodes().len(), 4);
    let launched = p["decisions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["launch"].as_object().is_some_and(|l| !l.is_empty()))
        .cloned()
        .expect("a decision that launched");
    assert!(launched["explanation"].as_str().unwrap().contains("for gang echo/"), "{launched}");
    let text = String::from_utf8(up.cli().args(["pool"]).output().unwrap().stdout).unwrap();
    assert!(text.contains("small-a") && text.contains("running"), "{text}");
    // `status` sums the pool's instances by state.
    let s: Value = serde_json::from_str(&run_ok(up.cli().args(["status", "--json"]))).unwrap();
    assert_eq!(s["pools"][0]["instances"]["running"], 4, "{s}");
    let text = run_ok(up.cli().arg("status"));
    assert!(text.contains("Pools") && text.contains("4 running"), "{text}");

    // A node that leaves on its own (preempted, killed) is a failed instance; its unit
    // comes back as demand and the pool replaces the node.
    let victim = instances_in(&p, "running").pop().unwrap();
    let pid: i32 = std::fs::read_to_string(up.data.join("pool/default").join(format!("{victim}.pid")))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    signal(-pid, libc::SIGKILL);
    let p = wait_for("the lost node replaced", Duration::from_secs(120), || {
        let p = pool(&up)?;
        let lost = p["instances"].as_array()?.iter().any(|i| i["id"] == victim.as_str() && i["state"] == "terminated");
        (lost && instances_in(&p, "running").len() == 4 && running_units(&up) == 4).then_some(p)
    });
    assert!(!instances_in(&p, "running").contains(&victim));

    // Scaled back, the unit that stays is one on a node the pool keeps anyway (small-a
    // has a min; small-b does not), so every other node goes idle and is drained and
    // terminated after its idle timeout: the pool shrinks to the one node it keeps
    // (issue #34 item 4; before, the unit could stay on a small-b node beside an idle
    // min node, and the pool stayed at two).
    run_ok(up.cli().args(["scale", "echo", "--units", "1"]));
    let p = wait_for("the pool back at its one kept node", Duration::from_secs(120), || {
        let p = pool(&up)?;
        (instances_in(&p, "running").len() == 1 && instances_in(&p, "terminated").len() >= 2).then_some(p)
    });
    let kept = instances_in(&p, "running").pop().unwrap();
    assert!(kept.starts_with("pool-small-a-"), "{p}");
    let unit = up.units("echo").into_iter().find(|u| u["state"] == "running").expect("the running unit");
    let on: Vec<&str> = unit["members"].as_array().unwrap().iter().filter_map(|m| m["node_id"].as_str()).collect();
    assert!(on.iter().all(|n| *n == kept), "the unit sits on the kept node {kept}: {unit}");
    let idle =
        p["decisions"].as_array().unwrap().iter().flat_map(|d| d["terminate"].as_array().cloned().unwrap_or_default());
    assert!(idle.into_iter().any(|t| t["cause"] == "idle"), "{p}");
    assert_eq!(running_units(&up), 1);
    // `pool` lists the decisions, newest first: the terminations stay in sight after
    // the quiet passes that follow them (issue #34 item 4), each with when it was.
    let text = run_ok(up.cli().args(["pool"]));
    let rows: Vec<&str> = text.lines().skip_while(|l| !l.trim_start().starts_with("AT")).skip(1).collect();
    assert!(rows.len() >= 3 && rows.len() <= 20, "{text}");
    assert!(rows.iter().any(|r| r.contains("idle")) && rows.iter().any(|r| r.contains("launch")), "{text}");
    assert!(rows.iter().all(|r| r.contains(" ago)")), "{text}");
    wait_for("terminated agents gone", Duration::from_secs(30), || {
        let p = pool(&up)?;
        (live_pool_agents(&up.data).len() == instances_in(&p, "running").len()).then_some(())
    });

    let pids = up.agent_pids();
    assert!(up.stop(), "up stops cleanly");
    wait_for("every pool agent stopped with up", Duration::from_secs(15), || {
        pids.iter().all(|p| !alive(*p)).then_some(())
    });
}

#[test]
fn a_pool_autoscaler_killed_mid_launch_restarts_without_leaking_or_doubling_instances() {
    let dir = fresh_dir("pool-restart-files");
    let (pool_file, app) = files(&dir);
    // No nodes at all: the app's units wait, and a standalone autoscaler grows the pool.
    let up = Up::start("pool-restart", &["--agents", "0", "--app", app.to_str().unwrap()]);
    run_ok(up.cli().args(["scale", "echo", "--units", "3"]));
    let mut g = Group::new();
    let args = [
        "autoscaler",
        "--pool",
        pool_file.to_str().unwrap(),
        "--control",
        &up.addr,
        "--data",
        up.data.to_str().unwrap(),
    ];
    let first = g.spawn(&args, &dir.join("autoscaler-1.log"));
    // Killed as soon as its first agent exists: launched, not yet seen by a sync.
    wait_for("a launched agent", Duration::from_secs(30), || (!live_pool_agents(&up.data).is_empty()).then_some(()));
    signal(first as i32, libc::SIGKILL);
    // Gone (and so its lock on the pool store released) before the second one starts.
    wait_for("the first autoscaler gone", Duration::from_secs(10), || g.try_wait(first));

    let log = dir.join("autoscaler-2.log");
    let _second = g.spawn(&args, &log);
    wait_for("three running units", Duration::from_secs(120), || (running_units(&up) == 3).then_some(()));
    // It serves its metrics like every process, its passes reading nodes from its view.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let metrics = text.split("serving /metrics local=").nth(1).and_then(|r| r.split_whitespace().next());
    let metrics = metrics.unwrap_or_else(|| panic!("no metrics address in its log: {text}"));
    let page = flotilla_testkit::metrics_page(metrics);
    let ok = flotilla_testkit::metric(&page, "flotilla_pool_passes_total", "outcome=\"ok\"").unwrap_or(0.0);
    assert!(ok >= 1.0, "passes: {page}");
    assert!(flotilla_testkit::metric(&page, "flotilla_pool_packed_nodes", "kind=\"packed\"").is_some(), "{page}");
    // Let a few more passes run: nothing more may be launched.
    std::thread::sleep(Duration::from_secs(4));
    let p = pool(&up).expect("the pool reports");
    let mut ids: Vec<String> =
        p["instances"].as_array().unwrap().iter().map(|i| i["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids.dedup();
    let running = instances_in(&p, "running");
    // min 1 of small-a plus one node per unit beyond it: three nodes, each launched once.
    assert_eq!(running.len(), 3, "{p}");
    assert_eq!(ids.len(), 3, "no instance beyond the three it needs: {p}");
    let nodes: Vec<String> = up.nodes().iter().map(|n| n["node_id"].as_str().unwrap().to_string()).collect();
    assert_eq!(nodes.len(), 3, "{nodes:?}");
    assert_eq!(live_pool_agents(&up.data).len(), 3, "one agent process per instance, none leaked");
}

#[test]
fn autoscale_plan_makes_the_documented_example_decision() {
    let demand = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demand.json");
    let out = run_ok(flotilla_testkit::flotilla().args(["autoscale", "plan", "--demand", demand, "--json"]));
    let last: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    assert_eq!(last["nodes_total"], 3, "{last}");
    assert_eq!(last["nodes_by_type"]["gpu-6"], 1, "the 2-GPU request takes the 6-GPU type: {last}");
    assert_eq!(last["nodes_by_type"]["cpu-16"], 2, "{last}");
    assert!(last["infeasible"].as_array().unwrap().is_empty());
    assert!(last["decision_seconds"].as_f64().unwrap() >= 0.0);
    let text = run_ok(flotilla_testkit::flotilla().args(["autoscale", "plan", "--demand", demand]));
    assert!(text.contains("gpu-6") && text.contains("left unused"), "{text}");
    // A bad demand names what is wrong.
    let dir = fresh_dir("plan-bad");
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"node_types": [{"name": "a", "resources": {"CPU": -2}}]}"#).unwrap();
    let o = flotilla_testkit::run(&["autoscale", "plan", "--demand", bad.to_str().unwrap()], &[]);
    assert!(!o.status.success());
    assert!(flotilla_testkit::stderr(&o).contains("node_types[0].resources.CPU"), "{}", flotilla_testkit::stderr(&o));
    // An endless input (its size says 0) is read only up to the cap (issue #35 item 5).
    let o = flotilla_testkit::run(&["autoscale", "plan", "--demand", "/dev/zero"], &[]);
    assert!(!o.status.success());
    assert!(flotilla_testkit::stderr(&o).contains("larger than 128 MiB"), "{}", flotilla_testkit::stderr(&o));
}

/// Issue #40 item 3: with `warm = 2` the pool holds two nodes registered, cordoned and
/// idle (no unit lands on them, none is idle-terminated); a pending unit claims one (an
/// uncordon, not a launch) and runs on it; the pool launches a warm replacement. With a
/// boot of 5 s played by the local provider, it prints how long a pending unit waits on
/// a warm node and on a cold launch (BENCHMARKS.md).
#[test]
fn a_warm_node_takes_a_pending_unit_at_once_and_the_warm_pool_refills() {
    let dir = fresh_dir("pool-warm-files");
    let (pool_path, app) = files(&dir);
    let warm_pool = POOL.replace("min = 1\nmax = 4", "min = 1\nmax = 5\nwarm = 2")
        + "\n[provider]\nkind = \"local\"\nboot_delay = \"5s\"\n";
    std::fs::write(&pool_path, warm_pool).unwrap();
    let (pool_path, app) = (pool_path.display().to_string(), app.display().to_string());
    let up = Up::start("pool-warm", &["--autoscale", "--pool", &pool_path, "--app", &app]);
    let held = |p: &Value| -> Vec<String> {
        p["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|i| i["warm"] == "held" && i["state"] == "running")
            .filter_map(|i| i["id"].as_str().map(str::to_string))
            .collect()
    };
    let warm = wait_for("one unit running and two warm nodes held", Duration::from_secs(90), || {
        let p = pool(&up)?;
        let h = held(&p);
        (running_units(&up) == 1 && h.len() == 2).then_some(h)
    });
    // Held nodes are cordoned in the view and hold nothing, past the idle timeout (3 s).
    std::thread::sleep(Duration::from_secs(5));
    for n in &warm {
        let node = up.node(n).unwrap_or_else(|| panic!("{n} is not in the view"));
        assert_eq!(node["cordoned"], true, "{node:#}");
        assert_eq!(node["status"], "alive", "{node:#}");
    }
    let p = pool(&up).unwrap();
    assert_eq!(held(&p), warm, "neither used nor idle-terminated: {p:#}");

    // A second unit: a warm node takes it.
    let started = std::time::Instant::now();
    run_ok(up.cli().args(["scale", "echo", "--units", "2"]));
    let node = wait_for("the new unit running on a warm node", Duration::from_secs(60), || {
        let units = up.units("echo");
        let on: Vec<String> = units
            .iter()
            .filter(|u| u["state"] == "running")
            .flat_map(|u| u["members"].as_array().cloned().unwrap_or_default())
            .filter_map(|m| m["node_id"].as_str().map(str::to_string))
            .filter(|n| warm.contains(n))
            .collect();
        on.first().cloned()
    });
    eprintln!("pending to running on warm node {node}: {:?}", started.elapsed());
    let p = wait_for("two warm nodes held again", Duration::from_secs(60), || {
        let p = pool(&up)?;
        (held(&p).len() == 2 && !held(&p).contains(&node)).then_some(p)
    });
    let decisions = p["decisions"].as_array().unwrap();
    assert!(
        decisions.iter().any(|d| d["explanation"].as_str().is_some_and(|e| e.contains(&format!("claim warm {node}")))),
        "{decisions:#?}"
    );
    let claimed = up.node(&node).unwrap();
    assert_eq!(claimed["cordoned"], false, "{claimed:#}");

    // Three more units: two take the warm nodes, the third waits for a launch (a boot).
    let warm = held(&p);
    let before: Vec<String> =
        up.units("echo").iter().filter_map(|u| u["unit_id"].as_str().map(str::to_string)).collect();
    let started = std::time::Instant::now();
    run_ok(up.cli().args(["scale", "echo", "--units", "5"]));
    let mut waited: std::collections::BTreeMap<String, (Duration, bool)> = Default::default();
    wait_for("five running units", Duration::from_secs(120), || {
        for u in up.units("echo").iter().filter(|u| u["state"] == "running") {
            let id = u["unit_id"].as_str().unwrap_or_default().to_string();
            if before.contains(&id) || waited.contains_key(&id) {
                continue;
            }
            let on_warm =
                u["members"].as_array().into_iter().flatten().any(|m| warm.iter().any(|w| m["node_id"] == *w));
            waited.insert(id, (started.elapsed(), on_warm));
        }
        (waited.len() == 3).then_some(())
    });
    let on_warm: Vec<Duration> = waited.values().filter(|(_, w)| *w).map(|(d, _)| *d).collect();
    let cold: Vec<Duration> = waited.values().filter(|(_, w)| !*w).map(|(d, _)| *d).collect();
    assert_eq!((on_warm.len(), cold.len()), (2, 1), "two on the warm nodes, one on a launched node: {waited:?}");
    eprintln!("pending to running with a 5 s boot: on warm nodes {on_warm:?}, on a cold launch {cold:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue #40 item 2: a unit left on a node of a type the pool keeps no min of moves,
/// make before break, to a node the pool keeps once one has room, and the node it left
/// idles and is terminated: the pool is back at its min, nothing stranded on a node it
/// pays for. Two apps of one unit each start on the min node (small-a, max 1) and a
/// small-b node; the app on the min node scales to 0; the other's unit moves there.
#[test]
fn a_unit_on_a_node_the_pool_need_not_keep_moves_home_and_the_pool_shrinks_to_its_min() {
    let dir = fresh_dir("pool-consolidate-files");
    let (pool_file, app) = files(&dir);
    std::fs::write(&pool_file, POOL.replace("min = 1\nmax = 4", "min = 1\nmax = 1")).unwrap();
    let spec = std::fs::read_to_string(&app).unwrap().replace("min = 1", "min = 0")
        + "\n[disruption]\nquiet_period = \"1s\"\n";
    std::fs::write(&app, &spec).unwrap();
    let other = dir.join("other.toml");
    std::fs::write(&other, spec.replace("name = \"echo\"", "name = \"other\"")).unwrap();
    let up = Up::start(
        "pool-consolidate",
        &[
            "--autoscale",
            "--pool",
            pool_file.to_str().unwrap(),
            "--app",
            app.to_str().unwrap(),
            "--app",
            other.to_str().unwrap(),
        ],
    );
    let node_of = |app: &str| -> Option<String> {
        let units = up.units(app);
        let running: Vec<&Value> = units.iter().filter(|u| u["state"] == "running").collect();
        let [u] = running.as_slice() else { return None };
        u["members"][0]["node_id"].as_str().map(str::to_string)
    };
    let (home, away) =
        wait_for("one unit on the min node, the other on a small-b node", Duration::from_secs(90), || {
            let (a, b) = (node_of("echo")?, node_of("other")?);
            match (a.starts_with("pool-small-a-"), b.starts_with("pool-small-a-")) {
                (true, false) => Some((("echo", a), ("other", b))),
                (false, true) => Some((("other", b), ("echo", a))),
                _ => None,
            }
        });
    assert!(away.1.starts_with("pool-small-b-"), "{away:?}");
    // The app on the min node goes: the other's unit moves there, and the small-b node
    // it left is terminated.
    run_ok(up.cli().args(["scale", home.0, "--units", "0"]));
    wait_for("the unit moved to the min node", Duration::from_secs(90), || (node_of(away.0)? == home.1).then_some(()));
    wait_for("the small-b node terminated", Duration::from_secs(60), || {
        pool(&up).filter(|p| {
            instances_in(p, "terminated").contains(&away.1) && instances_in(p, "running") == [home.1.clone()]
        })
    });
    let (_, decisions) = http(&up.addr, "GET", &format!("/v1/apps/{}/decisions", away.0), None, "");
    let moves: Vec<&Value> = decisions.as_array().unwrap().iter().filter(|d| d["kind"] == "rebalance").collect();
    assert_eq!(moves.len(), 1, "{decisions:#}");
    assert_eq!(moves[0]["reason"], "consolidate", "{:#}", moves[0]);
    assert_eq!(moves[0]["to_nodes"][0], home.1.as_str());
    let _ = std::fs::remove_dir_all(&dir);
}
