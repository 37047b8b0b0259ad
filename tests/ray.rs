//! Ray Serve for real (issue #18, item 5): `flotilla up` with `examples/ray-serve.toml`
//! and `ray` from PyPI (`.ci/run` installs the pinned version). Two units, each a Ray
//! head serving a Serve app and two worker groups (a CPU worker, a GPU worker on an
//! a100 node) whose members join it from other nodes (`ray status`
//! against each head); traffic through `flotilla route --app ray-serve` all along while
//! a worker's agent is killed (the worker alone is replaced and rejoins), a head's node
//! is drained (the unit moves make before break) and a head's agent is killed (the unit
//! is replaced and the routes move). It prints the figures BENCHMARKS.md records, and
//! asserts that no Ray process outlives its member or the test.
//!
//! Skipped, saying so, only where `ray` is not installed.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_testkit::{Group, Up, http, run_ok, wait_for};
use serde_json::Value;

const SPEC: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/ray-serve.toml");
const APP: &str = "ray-serve";

fn ray_installed() -> bool {
    Command::new("ray").arg("--version").output().is_ok_and(|o| o.status.success())
}

fn member<'a>(unit: &'a Value, role: &str) -> &'a Value {
    unit["members"].as_array().and_then(|ms| ms.iter().find(|m| m["role"] == role)).unwrap_or(&Value::Null)
}

fn node_of(unit: &Value, role: &str) -> String {
    member(unit, role)["node_id"].as_str().unwrap_or_default().to_string()
}

fn gcs_of(unit: &Value) -> String {
    format!("127.0.0.1:{}", member(unit, "head")["ports"]["gcs"])
}

/// The Ray temp dir of a member (the example names it by the node manager port).
fn temp_dir_of(m: &Value) -> String {
    format!("/tmp/fray-{}", m["ports"]["node_manager"])
}

fn running(up: &Up) -> Vec<Value> {
    up.units(APP).into_iter().filter(|u| u["state"] == "running").collect()
}

/// Alive Ray nodes in the cluster whose GCS is at `gcs`, as `ray status` counts them.
fn ray_nodes(gcs: &str) -> Option<usize> {
    let out = Command::new("timeout").args(["30", "ray", "status", &format!("--address={gcs}")]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let active = text.split("Active:").nth(1)?.split("Pending:").next()?;
    out.status.success().then(|| active.lines().filter(|l| l.trim_start().starts_with("1 node_")).count())
}

/// The node manager ports of the alive Ray nodes in the cluster whose GCS is at `gcs`
/// (`ray.nodes()` from a driver): which members joined it, as `ray status` cannot say
/// (it names nodes by id only, and counts a lost one as active until its health checks
/// fail).
fn ray_node_ports(gcs: &str) -> Option<BTreeSet<u64>> {
    ray_node_ids(gcs).map(|ids| ids.into_keys().collect())
}

/// The alive Ray nodes of that cluster: node manager port → Ray node id (a restarted
/// raylet gets a new id).
fn ray_node_ids(gcs: &str) -> Option<std::collections::BTreeMap<u64, String>> {
    let script = "import json, sys, ray\n\
ray.init(address=sys.argv[1], logging_level='ERROR', log_to_driver=False)\n\
print(json.dumps([[n['NodeManagerPort'], n['NodeID']] for n in ray.nodes() if n['Alive']]))\n";
    let out = Command::new("timeout").args(["60", "python3", "-c", script, gcs]).output().ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let nodes: Vec<(u64, String)> = serde_json::from_str(text.lines().last()?).ok()?;
    out.status.success().then(|| nodes.into_iter().collect())
}

/// The node manager ports of a unit's members (each a Ray node).
fn member_ports(unit: &Value) -> BTreeSet<u64> {
    unit["members"].as_array().into_iter().flatten().filter_map(|m| m["ports"]["node_manager"].as_u64()).collect()
}

/// Pids of Ray's own processes (GCS, raylet, agents, workers) whose command line names
/// one of `dirs` (every one of them carries its session's temp dir).
fn ray_processes(dirs: &BTreeSet<String>) -> Vec<(i32, String)> {
    let Ok(entries) = std::fs::read_dir("/proc") else { return vec![] };
    entries
        .filter_map(|e| {
            let e = e.ok()?;
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            let ray = ["raylet", "gcs_server", "ray::", "ray/dashboard", "ray/_private", "ray/autoscaler", "ray start"]
                .iter()
                .any(|k| cmd.contains(k));
            (ray && dirs.iter().any(|d| cmd.contains(&format!("{d}/")) || cmd.contains(&format!("{d} "))))
                .then_some((pid, cmd.chars().take(120).collect()))
        })
        .collect()
}

/// One request's status through the proxy (0: no answer within 5 s).
fn status(addr: &str) -> u16 {
    let ask = || -> Option<u16> {
        let mut s = std::net::TcpStream::connect(addr).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        s.write_all(b"POST /ray HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.split_whitespace().nth(1)?.parse().ok()
    };
    ask().unwrap_or(0)
}

/// Requests through the proxy, one every 50 ms, each remembered with when it was sent.
struct Load {
    log: Arc<Mutex<Vec<(Instant, u16)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Load {
    fn start(proxy: String) -> Load {
        let (log, stop) = (Arc::new(Mutex::new(Vec::new())), Arc::new(AtomicBool::new(false)));
        let (l, s) = (log.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let at = Instant::now();
                let code = status(&proxy);
                l.lock().unwrap().push((at, code));
                std::thread::sleep(Duration::from_millis(50).saturating_sub(at.elapsed()));
            }
        });
        Load { log, stop, thread: Some(thread) }
    }

    /// Requests sent since `t0`: (answered 200, not).
    fn since(&self, t0: Instant) -> (usize, usize) {
        let log = self.log.lock().unwrap();
        let sent: Vec<_> = log.iter().filter(|(at, _)| *at >= t0).collect();
        let ok = sent.iter().filter(|(_, c)| *c == 200).count();
        (ok, sent.len() - ok)
    }

    /// When the first request sent after `t0` was answered 200.
    fn first_ok_after(&self, t0: Instant) -> Option<Instant> {
        self.log.lock().unwrap().iter().find(|(at, c)| *at >= t0 && *c == 200).map(|(at, _)| *at)
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn endpoints(up: &Up) -> Vec<String> {
    let (_, r) = http(&up.addr, "GET", &format!("/v1/apps/{APP}/routes"), None, "");
    r["routes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["weight"].as_f64() > Some(0.0))
        .filter_map(|x| x["endpoint"].as_str().map(str::to_string))
        .collect()
}

#[test]
fn ray_serve_units_join_their_heads_on_other_nodes_and_survive_a_worker_loss_a_drain_and_a_head_loss() {
    if !ray_installed() {
        eprintln!("skipped: `ray` is not installed (pip install \"ray[serve]==2.60.0\"; .ci/run installs it)");
        return;
    }
    let mut dirs = BTreeSet::new();
    let remember = |dirs: &mut BTreeSet<String>, units: &[Value]| {
        for u in units {
            for m in u["members"].as_array().into_iter().flatten().filter(|m| m["ports"]["node_manager"].is_u64()) {
                dirs.insert(temp_dir_of(m));
            }
        }
    };
    let t_up = Instant::now();
    // Twelve nodes over two domains, the last four with a fake GPU each (an a100 and an
    // l4 in each domain): room for a unit's replacement after two nodes are lost and one drained (one
    // unit per node, a unit's members on distinct nodes).
    let mut up = Up::start("ray", &["--agents", "12", "--shards", "2", "--app", SPEC]);
    // The Serve app's code is an artifact: the heads fetch it (peer to peer) once pushed.
    let app = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/ray-serve/serve_echo.py");
    flotilla_testkit::run_ok(up.cli().args(["artifact", "push", app]));
    let units = wait_for("2 running ray-serve units", Duration::from_secs(240), || {
        let r = running(&up);
        (r.len() == 2).then_some(r)
    });
    remember(&mut dirs, &units);
    for u in &units {
        assert_ne!(node_of(u, "head"), node_of(u, "cpu"), "a unit's worker on another node than its head: {u:#?}");
    }
    let heads: BTreeSet<String> = units.iter().map(|u| node_of(u, "head")).collect();
    assert_eq!(heads.len(), 2, "the two heads on distinct nodes: {units:#?}");
    // Two worker groups: the CPU one off the GPU nodes, the GPU one on an a100 (its
    // template; an a100 in each domain, one per unit).
    let gpu_model = |node: &str| up.node(node).and_then(|n| n["labels"]["gpu_model"].as_str().map(String::from));
    for u in &units {
        assert_eq!((gpu_model(&node_of(u, "head")), gpu_model(&node_of(u, "cpu"))), (None, None), "{u:#?}");
        assert_eq!(gpu_model(&node_of(u, "gpu")).as_deref(), Some("a100"), "{u:#?}");
    }

    // Traffic through the route proxy over both units' Serve ports.
    let mut procs = Group::new();
    let pid = procs.spawn_with_env(
        &["route", "--app", APP, "--listen", "127.0.0.1:0", "--print-addrs"],
        &up.data.join("route.err"),
        &[("FLOTILLA_ADDR", up.addr.as_str())],
    );
    let proxy = procs.addrs(pid)["listen"].as_str().unwrap().to_string();
    wait_for("an answer through the proxy", Duration::from_secs(60), || (status(&proxy) == 200).then_some(()));
    let cold = t_up.elapsed();
    let load = Load::start(proxy.clone());

    // Each worker joined its own head: three alive Ray nodes in each cluster (`ray
    // status`), its head and its two groups' workers (their node manager ports).
    for u in &units {
        let gcs = gcs_of(u);
        wait_for(&format!("3 Ray nodes at {gcs}"), Duration::from_secs(60), || {
            (ray_nodes(&gcs) == Some(3)).then_some(())
        });
        assert_eq!(
            ray_node_ports(&gcs),
            Some(member_ports(u)),
            "the unit's head and workers form its Ray cluster: {u:#?}"
        );
    }

    // 1. A worker's agent killed (-9): the worker alone is replaced on another node and
    // rejoins its head; Serve keeps answering.
    let a = units[0].clone();
    let a_id = a["unit_id"].as_str().unwrap().to_string();
    let (a_worker_node, a_head_node) = (node_of(&a, "cpu"), node_of(&a, "head"));
    let old_worker_dir = BTreeSet::from([temp_dir_of(member(&a, "cpu"))]);
    let t_worker = Instant::now();
    flotilla_testkit::signal(up.agent_pid(&a_worker_node), libc::SIGKILL);
    let a2 = wait_for("the worker replaced on another node", Duration::from_secs(120), || {
        up.units(APP).into_iter().find(|u| {
            u["unit_id"] == a_id.as_str()
                && u["state"] == "running"
                && member(u, "cpu")["state"] == "running"
                && ![a_worker_node.as_str(), a_head_node.as_str(), ""].contains(&node_of(u, "cpu").as_str())
        })
    });
    let worker_running = t_worker.elapsed();
    remember(&mut dirs, std::slice::from_ref(&a2));
    let gcs = gcs_of(&a2);
    wait_for("the new worker joined its head", Duration::from_secs(120), || {
        (ray_node_ports(&gcs) == Some(member_ports(&a2))).then_some(())
    });
    let worker_move = t_worker.elapsed();
    let worker_port = member(&a2, "cpu")["ports"]["node_manager"].as_u64().unwrap_or_default();
    let worker_ray_id = ray_node_ids(&gcs).and_then(|ids| ids.get(&worker_port).cloned());
    wait_for("the lost worker's Ray processes gone", Duration::from_secs(30), || {
        ray_processes(&old_worker_dir).is_empty().then_some(())
    });
    let (ok, lost) = load.since(t_worker);
    println!(
        "worker agent killed: replaced on {} (running in {worker_running:.1?}), in its head's Ray cluster in {worker_move:.1?}; {ok} answered, {lost} not",
        node_of(&a2, "cpu")
    );
    assert!(ok > 0 && lost * 10 <= ok + lost, "Serve keeps answering while a worker is replaced: {ok} ok, {lost} not");

    // 2. A drain of the other unit's head node: the unit is replaced make before break.
    let b = units[1].clone();
    let (b_id, b_head_node) = (b["unit_id"].as_str().unwrap().to_string(), node_of(&b, "head"));
    let t_drain = Instant::now();
    let out = up.cli().args(["node", "drain", &b_head_node, "--wait", "--timeout", "240s"]).output().unwrap();
    assert!(
        out.status.success(),
        "the drain completes: {}\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        run_ok(up.cli().args(["units", APP]))
    );
    let drain_took = t_drain.elapsed();
    let b_new = up
        .units(APP)
        .into_iter()
        .find(|u| u["unit_id"] == b_id.as_str())
        .and_then(|u| u["replaced_by"].as_str().map(str::to_string))
        .expect("the drained unit replaced");
    remember(&mut dirs, &up.units(APP));
    let (ok, lost_drain) = load.since(t_drain);
    println!("head node drained: {b_id} → {b_new} in {drain_took:.1?}; {ok} answered, {lost_drain} not");

    // The replaced worker stayed (its key is its own: releasing the lost worker's, which
    // the dead node still lists, does not stop it), still in its head's cluster.
    let a3 = up.units(APP).into_iter().find(|u| u["unit_id"] == a_id.as_str()).unwrap();
    assert_eq!(
        (node_of(&a3, "cpu"), member_ports(&a3)),
        (node_of(&a2, "cpu"), member_ports(&a2)),
        "the replacement worker was not replaced again"
    );
    let ids = ray_node_ids(&gcs_of(&a3));
    assert_eq!(ids.as_ref().map(|ids| ids.keys().copied().collect()), Some(member_ports(&a3)));
    assert_eq!(
        ids.and_then(|ids| ids.get(&worker_port).cloned()),
        worker_ray_id,
        "the same Ray worker node, never restarted"
    );

    // 3. A head's agent killed (-9): the unit is replaced, the routes move.
    let old_endpoint = member(&a3, "head")["address"].as_str().unwrap().to_string();
    let t_head = Instant::now();
    flotilla_testkit::signal(up.agent_pid(&node_of(&a3, "head")), libc::SIGKILL);
    let a_new = wait_for("the unit replaced and the routes moved", Duration::from_secs(240), || {
        let units = up.units(APP);
        let new = units
            .iter()
            .find(|u| u["state"] == "running" && u["unit_id"] != a_id.as_str() && u["unit_id"] != b_new.as_str())?;
        let addr = member(new, "head")["address"].as_str()?.to_string();
        let e = endpoints(&up);
        (e.contains(&addr) && !e.contains(&old_endpoint)).then(|| new.clone())
    });
    let routes_moved = t_head.elapsed();
    remember(&mut dirs, &up.units(APP));
    let gcs = gcs_of(&a_new);
    let a_new_id = a_new["unit_id"].as_str().unwrap_or_default().to_string();
    wait_for("the new unit's worker joined its head", Duration::from_secs(120), || {
        let u = up.units(APP).into_iter().find(|u| u["unit_id"] == a_new_id.as_str())?;
        let ports = member_ports(&u);
        (member(&u, "cpu")["state"] == "running"
            && member(&u, "gpu")["state"] == "running"
            && ports.len() == 3
            && ray_node_ports(&gcs) == Some(ports))
        .then_some(())
    });
    // Answered by the replacement: a request sent after the routes moved.
    let moved_at = t_head + routes_moved;
    wait_for("an answer after the move", Duration::from_secs(30), || load.first_ok_after(moved_at));
    let (ok, lost_head) = load.since(t_head);
    println!(
        "head agent killed: {} replaced by {} and routes moved in {routes_moved:.1?}; {ok} answered, {lost_head} not (errors during the move)",
        a_id,
        a_new["unit_id"].as_str().unwrap_or("?")
    );
    println!("cold: up → 2 units running → Serve answering through the proxy in {cold:.1?}");
    let (ok_all, lost_all) = load.since(t_up);
    println!("all: {ok_all} answered, {lost_all} not");
    drop(load);

    // Nothing of Ray outlives the cluster.
    drop(procs);
    up.stop();
    let left = wait_for("no Ray process left", Duration::from_secs(60), || {
        let left = ray_processes(&dirs);
        left.is_empty().then_some(left)
    });
    assert!(left.is_empty());
    for d in &dirs {
        let _ = std::fs::remove_dir_all(d);
    }
}
