//! End-to-end tests with real processes over loopback: `flotilla up` with real agent
//! child processes. They share one test binary and run one at a time (see
//! .config/nextest.toml), because on 2 cores parallel clusters starve each other's
//! heartbeats.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_flotilla");

fn temp_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("flotilla-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A running `flotilla up`; stopped (and every process it started killed) on drop.
/// Without a child, the API of processes a test started itself.
struct Up {
    child: Option<Child>,
    data: PathBuf,
    addr: String,
}

impl Up {
    fn start(name: &str, extra: &[&str]) -> Up {
        let data = temp_dir(name);
        let mut args = vec!["up", "--listen", "127.0.0.1:0", "--data", data.to_str().unwrap()];
        args.extend_from_slice(extra);
        let child = Command::new(BIN)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(data.join("up.out")).unwrap())
            .stderr(std::fs::File::create(data.join("up.err")).unwrap())
            .spawn()
            .unwrap();
        let addr_file = data.join("control.addr");
        let addr = wait_for("control address", Duration::from_secs(30), || std::fs::read_to_string(&addr_file).ok());
        Up { child: Some(child), data, addr }
    }

    fn attach(data: &Path, addr: &str) -> Up {
        Up { child: None, data: data.to_path_buf(), addr: addr.to_string() }
    }

    fn nodes(&self) -> Vec<Value> {
        let out = Command::new(BIN).args(["nodes", "--json"]).env("FLOTILLA_ADDR", &self.addr).output().unwrap();
        if !out.status.success() {
            return vec![];
        }
        serde_json::from_slice::<Value>(&out.stdout).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default()
    }

    fn node(&self, id: &str) -> Option<Value> {
        self.nodes().into_iter().find(|n| n["node_id"] == id)
    }

    fn agent_pid(&self, id: &str) -> i32 {
        std::fs::read_to_string(self.data.join("agents").join(format!("{id}.pid"))).unwrap().trim().parse().unwrap()
    }

    fn agent_pids(&self) -> Vec<i32> {
        let Ok(dir) = std::fs::read_dir(self.data.join("agents")) else { return vec![] };
        dir.filter_map(|e| {
            let p = e.ok()?.path();
            (p.extension()? == "pid").then(|| std::fs::read_to_string(&p).ok()?.trim().parse().ok())?
        })
        .collect()
    }

    /// SIGTERM, as Ctrl-C would; returns whether `up` exited cleanly.
    fn stop(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else { return false };
        signal(child.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = child.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        for pid in self.agent_pids() {
            signal(-pid, libc::SIGKILL);
        }
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

fn signal(pid: i32, sig: i32) {
    unsafe {
        libc::kill(pid, sig);
    }
}

fn alive(pid: i32) -> bool {
    // Reaped or not, a zombie is not running: check /proc state.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

fn wait_for<T>(what: &str, limit: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn statuses(up: &Up) -> Vec<String> {
    up.nodes().iter().map(|n| n["status"].as_str().unwrap_or("").to_string()).collect()
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).to_string()
}

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
    let data = up.data.join("agents").join("node-4");
    let t = Instant::now();
    let answer = run_ok(Command::new(BIN).args(["agent", "drain", "--data", data.to_str().unwrap()]));
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
    let out = Command::new(BIN)
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
    let dir = temp_dir("nodrain");
    let out = Command::new(BIN).args(["agent", "drain", "--data", dir.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no agent is running"));
    let _ = std::fs::remove_dir_all(Path::new(&dir));
}

#[test]
fn up_with_an_app_places_its_units_and_pushes_assignments() {
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml");
    let up = Up::start("app", &["--agents", "6", "--shards", "2", "--app", spec]);
    let units = wait_for("2 running echo units", Duration::from_secs(30), || {
        let units = echo_units(&up);
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
            let text = std::fs::read_to_string(up.data.join("agents").join(node).join("assignments.json")).ok()?;
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
            let who = http_get(m["address"].as_str().unwrap()).expect("the member answers");
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
        let p = http_get(&addr)?["pid"].as_i64()? as i32;
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

    let apps = run_ok(Command::new(BIN).args(["apps", "--json"]).env("FLOTILLA_ADDR", &up.addr));
    assert!(apps.contains("\"echo\""), "{apps}");
    let missing = Command::new(BIN).args(["units", "nope"]).env("FLOTILLA_ADDR", &up.addr).output().unwrap();
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

fn echo_units(up: &Up) -> Vec<Value> {
    let Ok(out) = Command::new(BIN).args(["units", "echo", "--json"]).env("FLOTILLA_ADDR", &up.addr).output() else {
        return vec![];
    };
    serde_json::from_slice::<Value>(&out.stdout).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default()
}

/// A GET to `host:port` over a plain socket; the JSON body, if any.
fn http_get(addr: &str) -> Option<Value> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /who HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    serde_json::from_str(out.split("\r\n\r\n").nth(1)?).ok()
}

#[test]
fn a_bad_app_spec_is_refused_with_every_problem() {
    let dir = temp_dir("badspec");
    let spec = dir.join("bad.toml");
    std::fs::write(&spec, "name = \"Bad\"\n[unit.head]\ncommand = \"\"\ncpu = \"x\"\nmemory = \"1Mi\"\n[units]\nmin = 2\nmax = 1\ninitial = 1\n").unwrap();
    let out = Command::new(BIN)
        .args(["up", "--agents", "0", "--listen", "127.0.0.1:0", "--data"])
        .arg(&dir)
        .arg("--app")
        .arg(&spec)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    for needle in ["bad.toml", "name:", "unit.head.command", "unit.head.cpu", "units.min"] {
        assert!(err.contains(needle), "{needle} missing from {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn echo_server_answers_with_its_identity_on_flotilla_port() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut child = Command::new(BIN)
        .arg("echo-server")
        .env("FLOTILLA_PORT", port.to_string())
        .env("FLOTILLA_NODE_ID", "node-7")
        .env("FLOTILLA_UNIT", "echo-3")
        .env("FLOTILLA_ROLE", "head")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let v = wait_for("echo-server", Duration::from_secs(10), || http_get(&format!("127.0.0.1:{port}")));
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(v["node"], "node-7");
    assert_eq!(v["unit"], "echo-3");
    assert_eq!(v["role"], "head");
}

/// A raw HTTP/1.1 request; returns the status code and the JSON body (if any).
fn http(addr: &str, method: &str, path: &str, token: Option<&str>, body: &str) -> (u16, Value) {
    use std::io::{Read, Write};
    let host = addr.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(host).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n{auth}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let status = out.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let json = out.split("\r\n\r\n").nth(1).and_then(|b| serde_json::from_str(b).ok()).unwrap_or(Value::Null);
    (status, json)
}

fn running(up: &Up) -> Vec<Value> {
    echo_units(up).into_iter().filter(|u| u["state"] == "running").collect()
}

#[test]
fn failover_and_scaling_through_the_api_and_the_cli() {
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml");
    let up = Up::start("scale", &["--agents", "8", "--shards", "2", "--app", spec]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let token = std::fs::read_to_string(up.data.join("api-token")).unwrap().trim().to_string();

    // kill -9 of the agent holding a unit's head: the unit is replaced, the old one ends Terminated.
    let victim = running(&up)[0].clone();
    let head_node = victim["members"].as_array().unwrap().iter().find(|m| m["role"] == "head").unwrap()["node_id"]
        .as_str()
        .unwrap()
        .to_string();
    let killed_at = Instant::now();
    signal(up.agent_pid(&head_node), libc::SIGKILL);
    wait_for("a replacement unit running and the old one terminated", Duration::from_secs(30), || {
        let units = echo_units(&up);
        let old = units.iter().find(|u| u["unit_id"] == victim["unit_id"])?;
        let live = units.iter().filter(|u| u["state"] == "running").count();
        (old["state"] == "terminated" && live == 2).then_some(())
    });
    eprintln!("head lost -> replacement running after {:?}", killed_at.elapsed());
    for u in running(&up) {
        for m in u["members"].as_array().unwrap() {
            assert_ne!(m["node_id"], head_node.as_str(), "nothing runs on the dead node");
        }
    }

    // Scale up with the CLI (token from the data dir), down with the API.
    let out = Command::new(BIN)
        .args(["scale", "echo", "--units", "3"])
        .env("FLOTILLA_ADDR", &up.addr)
        .env("FLOTILLA_DATA", &up.data)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_for("3 running units", Duration::from_secs(30), || (running(&up).len() == 3).then_some(()));
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units": 1}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["desired_units"], 1);
    wait_for("1 running unit", Duration::from_secs(30), || {
        let units = echo_units(&up);
        let live = units.iter().filter(|u| u["state"] == "running").count();
        let leaving = units.iter().filter(|u| matches!(u["state"].as_str(), Some("draining" | "stopping"))).count();
        (live == 1 && leaving == 0).then_some(())
    });

    // Bad requests are refused with clear errors.
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units": 9}"#);
    assert_eq!(status, 422);
    assert!(body["error"]["message"].as_str().unwrap().contains("1..=6"), "{body}");
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units": "many"}"#);
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "bad_request");
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", None, r#"{"units": 2}"#);
    assert_eq!(status, 401, "{body}");
    let (status, _) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some("wrong"), r#"{"units": 2}"#);
    assert_eq!(status, 401);
    let (status, _) = http(&up.addr, "PUT", "/v1/apps/nope/scale", Some(&token), r#"{"units": 2}"#);
    assert_eq!(status, 404);
    let out = Command::new(BIN)
        .args(["scale", "echo", "--units", "0"])
        .env("FLOTILLA_ADDR", &up.addr)
        .env("FLOTILLA_TOKEN", &token)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("1..=6"));
}

#[test]
fn a_cordoned_node_gets_nothing_new() {
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml");
    let up = Up::start("cordon", &["--agents", "4", "--shards", "2", "--app", spec]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let token = std::fs::read_to_string(up.data.join("api-token")).unwrap().trim().to_string();
    let node_cmd = |verb: &str, node: &str| {
        Command::new(BIN)
            .args(["node", verb, node])
            .env("FLOTILLA_ADDR", &up.addr)
            .env("FLOTILLA_TOKEN", &token)
            .output()
            .unwrap()
    };
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
        let units = echo_units(&up);
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

#[test]
fn a_standalone_scheduler_registers_and_the_control_plane_forwards_to_it() {
    let up = Up::start("standalone", &["--agents", "4", "--shards", "2"]);
    wait_for("4 alive nodes", Duration::from_secs(20), || (up.nodes().len() == 4).then_some(()));
    let (_, shards) = http(&up.addr, "GET", "/v1/shards", None, "");
    let addrs: Vec<String> =
        shards.as_array().unwrap().iter().map(|s| s["address"].as_str().unwrap().to_string()).collect();
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml");
    let store = format!("redb:{}", up.data.join("standalone.redb").display());
    let mut scheduler = Command::new(BIN)
        .args(["scheduler", "--app", spec, "--aggregators", &addrs.join(","), "--control", &up.addr, "--store", &store])
        .env("FLOTILLA_DATA", &up.data)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(up.data.join("scheduler.err")).unwrap())
        .spawn()
        .unwrap();
    // Asked through the control plane, which keeps no state: the scheduler answers.
    let units = wait_for("2 units running via the standalone scheduler", Duration::from_secs(30), || {
        let r = running(&up);
        (r.len() == 2).then_some(r)
    });
    assert!(units.iter().all(|u| u["app"] == "echo"));
    let token = std::fs::read_to_string(up.data.join("api-token")).unwrap().trim().to_string();
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units": 3}"#);
    assert_eq!(status, 200, "scale is forwarded: {body}");
    wait_for("3 running units", Duration::from_secs(30), || (running(&up).len() == 3).then_some(()));
    // A router asks the control plane where the app is scheduled and follows its routes there.
    let mut procs = Group(Vec::new(), Vec::new());
    let route = procs.spawn_with_env(
        &["route", "--app", "echo", "--listen", "127.0.0.1:0", "--print-addrs"],
        &up.data.join("route.err"),
        &[("FLOTILLA_ADDR", up.addr.as_str())],
    );
    let metrics = procs.addrs(route)["metrics"].as_str().unwrap().to_string();
    wait_for("the router follows the standalone scheduler's 3 routes", Duration::from_secs(20), || {
        metric(&get_text(&metrics, "/metrics")?, "flotilla_route_endpoints", "").filter(|n| *n == 3.0)
    });
    let (status, _) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some("wrong"), r#"{"units": 2}"#);
    assert_eq!(status, 401, "the control plane checks the token before forwarding");
    let (status, _) = http(&up.addr, "POST", "/v1/schedulers", None, r#"{"app": "x", "url": "http://127.0.0.1:1"}"#);
    assert_eq!(status, 401, "registering needs the token");
    // Stopping while the router still watches its routes: the scheduler exits anyway.
    signal(scheduler.id() as i32, libc::SIGTERM);
    let exited = wait_for("the scheduler exits", Duration::from_secs(10), || scheduler.try_wait().ok().flatten());
    assert!(exited.success(), "{exited:?}");
    drop(procs);
}

#[test]
fn a_drained_node_leaves_the_routes_before_its_workloads_exit() {
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml");
    let up = Up::start("drainroutes", &["--agents", "4", "--shards", "2", "--app", spec]);
    let unit = wait_for("2 running units with routes", Duration::from_secs(30), || {
        let (_, r) = http(&up.addr, "GET", "/v1/apps/echo/routes", None, "");
        let routes = r["routes"].as_array()?.clone();
        (routes.len() == 2 && running(&up).len() == 2).then(|| running(&up)[0].clone())
    });
    let head = unit["members"].as_array().unwrap().iter().find(|m| m["role"] == "head").unwrap().clone();
    let (node, addr) = (head["node_id"].as_str().unwrap().to_string(), head["address"].as_str().unwrap().to_string());
    let pid = http_get(&addr).unwrap()["pid"].as_i64().unwrap() as i32;
    let data = up.data.join("agents").join(&node);
    let drain =
        std::thread::spawn(move || Command::new(BIN).args(["agent", "drain", "--data"]).arg(data).output().unwrap());
    let t0 = Instant::now();
    let mut out_of_routes = None;
    let mut exited = None;
    while t0.elapsed() < Duration::from_secs(15) && (out_of_routes.is_none() || exited.is_none()) {
        if out_of_routes.is_none() {
            let (_, r) = http(&up.addr, "GET", "/v1/apps/echo/routes", None, "");
            let serving = r["routes"].as_array().is_some_and(|rs| {
                rs.iter().any(|x| x["endpoint"] == addr.as_str() && x["weight"].as_f64() > Some(0.0))
            });
            if !serving {
                out_of_routes = Some(t0.elapsed());
            }
        }
        if exited.is_none() && !alive(pid) {
            exited = Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(drain.join().unwrap().status.success());
    let (out_of_routes, exited) = (out_of_routes.expect("left the routes"), exited.expect("the workload stopped"));
    eprintln!("out of routes after {out_of_routes:?}, workload exited after {exited:?}");
    assert!(out_of_routes < exited, "routes first ({out_of_routes:?}), then the workload ({exited:?})");
}

/// The members of `unit` that run on `node`.
fn on_node(unit: &Value, node: &str) -> bool {
    unit["members"].as_array().is_some_and(|ms| ms.iter().any(|m| m["node_id"] == node))
}

fn head_of(unit: &Value) -> Value {
    unit["members"].as_array().unwrap().iter().find(|m| m["role"] == "head").unwrap().clone()
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
            (u["unit_id"].as_str().unwrap().to_string(), http_get(&addr).unwrap()["pid"].as_i64().unwrap() as i32)
        })
        .collect();
    leave();
    let t0 = Instant::now();
    let mut replaced_at: std::collections::HashMap<String, Duration> = Default::default();
    let mut exited_at: std::collections::HashMap<String, Duration> = Default::default();
    while t0.elapsed() < Duration::from_secs(40) && exited_at.len() < pids.len() {
        let units = echo_units(up);
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
        let units = echo_units(up);
        let old_done =
            pids.iter().all(|(id, _)| units.iter().any(|u| u["unit_id"] == id.as_str() && u["state"] == "terminated"));
        let live = running(up);
        (old_done && live.len() == 2 && !live.iter().any(|u| on_node(u, node))).then_some(())
    });
}

#[test]
fn node_drain_and_preemption_notices_replace_units_before_stopping_them() {
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml");
    let up = Up::start("nodedrain", &["--agents", "6", "--shards", "2", "--app", spec]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let token = std::fs::read_to_string(up.data.join("api-token")).unwrap().trim().to_string();

    // An operator drain.
    let node = head_of(&running(&up)[0])["node_id"].as_str().unwrap().to_string();
    leave_node_make_before_break(&up, &node, || {
        let out = run_ok(
            Command::new(BIN)
                .args(["node", "drain", &node])
                .env("FLOTILLA_ADDR", &up.addr)
                .env("FLOTILLA_TOKEN", &token),
        );
        assert!(out.contains("draining"), "{out}");
    });
    let n = up.node(&node).unwrap();
    assert_eq!((n["cordoned"].clone(), n["drain_requested"].clone()), (Value::Bool(true), Value::Bool(true)));
    assert_eq!(n["status"], "alive", "the node itself stays");

    // A cloud's preemption notice on another node.
    let other = head_of(&running(&up)[0])["node_id"].as_str().unwrap().to_string();
    assert_ne!(other, node);
    let notice = up.data.join("agents").join(&other).join("preemption-notice");
    leave_node_make_before_break(&up, &other, || std::fs::write(&notice, "").unwrap());
    assert_eq!(up.node(&other).unwrap()["health"]["preemption_notice"], true);

    let (status, _) = http(&up.addr, "POST", &format!("/v1/nodes/{node}/drain"), None, "");
    assert_eq!(status, 401, "draining needs the token");
}

#[test]
fn a_rolling_apply_replaces_units_one_at_a_time() {
    let spec_path = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml");
    let up = Up::start("apply", &["--agents", "4", "--shards", "2", "--app", spec_path]);
    let before: Vec<String> = wait_for("2 running units", Duration::from_secs(30), || {
        let r = running(&up);
        (r.len() == 2).then(|| r.iter().map(|u| u["unit_id"].as_str().unwrap().to_string()).collect())
    });
    let token = std::fs::read_to_string(up.data.join("api-token")).unwrap().trim().to_string();
    let original = std::fs::read_to_string(spec_path).unwrap();

    // Refused: no token, another app's name, an invalid spec (every problem named).
    let (status, _) = http(&up.addr, "PUT", "/v1/apps/echo/spec", None, &original);
    assert_eq!(status, 401);
    let (status, body) = http(
        &up.addr,
        "PUT",
        "/v1/apps/echo/spec",
        Some(&token),
        &original.replace("name = \"echo\"", "name = \"other\""),
    );
    assert_eq!(status, 422, "{body}");
    let bad = original.replace("cpu = \"250m\"", "cpu = \"lots\"");
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/spec", Some(&token), &bad);
    assert_eq!(status, 422);
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("unit.head.cpu") && msg.contains("unit.worker.cpu"), "{msg}");

    // The same spec again changes nothing.
    let file = up.data.join("echo-v2.toml");
    std::fs::write(&file, &original).unwrap();
    let apply = || {
        run_ok(Command::new(BIN).arg("apply").arg(&file).env("FLOTILLA_ADDR", &up.addr).env("FLOTILLA_TOKEN", &token))
    };
    assert!(apply().contains("no unit's template changed"));

    // A changed template rolls through: one unit at a time, the replacement Running
    // before the old one drains, so two units serve throughout.
    std::fs::write(&file, original.replace("memory = \"64Mi\"", "memory = \"80Mi\"")).unwrap();
    let out = apply();
    assert!(out.contains("2 unit(s) will roll, 1 at a time"), "{out}");
    let t0 = Instant::now();
    loop {
        let units = echo_units(&up);
        let coming_up = units
            .iter()
            .filter(|u| matches!(u["state"].as_str(), Some("queued" | "placing" | "allocated" | "starting")))
            .count();
        let serving = units.iter().filter(|u| u["state"] == "running").count();
        assert!(coming_up <= 1, "max_unavailable = 1: {units:?}");
        assert!(serving >= 2, "two units serve throughout: {units:?}");
        let old_done =
            before.iter().all(|id| units.iter().any(|u| u["unit_id"] == id.as_str() && u["state"] == "terminated"));
        if old_done && serving == 2 && coming_up == 0 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "the rollout finishes: {units:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let templates: std::collections::HashSet<String> =
        running(&up).iter().map(|u| u["template"].as_str().unwrap().to_string()).collect();
    assert_eq!(templates.len(), 1, "every running unit has the new template");
    eprintln!("rollout of 2 units took {:?}", t0.elapsed());
}

/// Processes a test started, each in its own process group (and where its stderr goes);
/// all killed on drop.
struct Group(Vec<Child>, Vec<PathBuf>);

impl Group {
    fn spawn(&mut self, args: &[&str], log: &Path) -> u32 {
        self.spawn_with_env(args, log, &[])
    }

    fn spawn_with_env(&mut self, args: &[&str], log: &Path, env: &[(&str, &str)]) -> u32 {
        use std::os::unix::process::CommandExt;
        let child = Command::new(BIN)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        self.0.push(child);
        self.1.push(log.to_path_buf());
        pid
    }

    /// The JSON line a `--print-addrs` server writes first.
    fn addrs(&mut self, pid: u32) -> Value {
        use std::io::BufRead;
        let i = self.0.iter().position(|c| c.id() == pid).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(self.0[i].stdout.take().unwrap()).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| {
            let log = std::fs::read_to_string(&self.1[i]).unwrap_or_default();
            panic!("{e} in {line:?}; its stderr:\n{log}")
        })
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for c in &mut self.0 {
            signal(-(c.id() as i32), libc::SIGKILL);
            let _ = c.wait();
        }
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Two shard processes, four agents (two in a failure domain of each shard) and a
/// standalone scheduler for the echo app, all started by the test.
struct Standalone {
    procs: Group,
    dir: PathBuf,
    shard_addrs: Vec<String>,
    shard_pids: Vec<u32>,
    domains: Vec<String>,
    api: String,
}

impl Standalone {
    fn start(name: &str, max_units_per_domain: u32, scheduler_flags: &[&str]) -> Standalone {
        let dir = temp_dir(name);
        let d = dir.to_str().unwrap().to_string();
        let mut procs = Group(Vec::new(), Vec::new());
        // The first shard creates the secrets both use.
        let (mut shard_addrs, mut shard_pids) = (Vec::new(), Vec::new());
        for i in 0..2 {
            let pid = Self::spawn_shard(&mut procs, &dir, i, "127.0.0.1:0");
            shard_addrs.push(procs.addrs(pid)["addr"].as_str().unwrap().to_string());
            shard_pids.push(pid);
        }
        let aggregators = shard_addrs.join(",");
        let domains: Vec<String> = (0..2)
            .map(|s| (0..).map(|i| format!("zone-{i}")).find(|z| flotilla_core::shard_for_domain(z, 2) == s).unwrap())
            .collect();
        for n in 0..4 {
            let node = format!("node-{n}");
            let (domain, ports) = (&domains[n % 2], format!("{}-{}", 31_000 + n * 50, 31_049 + n * 50));
            let data = dir.join("agents").join(&node);
            let args = [
                "agent",
                "--aggregators",
                &aggregators,
                "--node-id",
                &node,
                "--label",
                &format!("domain={domain}"),
                "--cores",
                "4",
                "--memory",
                "8589934592",
                "--join-token-file",
                &format!("{d}/join-token"),
                "--ca",
                &format!("{d}/tls.crt"),
                "--data",
                data.to_str().unwrap(),
                "--port-range",
                &ports,
            ];
            procs.spawn(&args, &dir.join(format!("{node}.err")));
        }
        let spec = dir.join("echo.toml");
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml")).unwrap();
        let text = text.replace("max_units_per_domain = 3", &format!("max_units_per_domain = {max_units_per_domain}"));
        std::fs::write(&spec, text).unwrap();
        let api = format!("http://127.0.0.1:{}", free_port());
        let store = format!("redb:{d}/scheduler.redb");
        let grpc_token = format!("{d}/grpc-token");
        let mut args = vec![
            "scheduler",
            "--app",
            spec.to_str().unwrap(),
            "--aggregators",
            &aggregators,
            "--store",
            &store,
            "--listen",
            api.trim_start_matches("http://"),
            "--token",
            "t",
            "--grpc-token-file",
            &grpc_token,
        ];
        args.extend_from_slice(scheduler_flags);
        procs.spawn(&args, &dir.join("scheduler.err"));
        Standalone { procs, dir, shard_addrs, shard_pids, domains, api }
    }

    fn spawn_shard(procs: &mut Group, dir: &Path, i: usize, listen: &str) -> u32 {
        let d = dir.to_str().unwrap();
        procs.spawn(
            &[
                "aggregator",
                "--listen",
                listen,
                "--shard",
                &i.to_string(),
                "--shards",
                "2",
                "--data",
                d,
                "--print-addrs",
            ],
            &dir.join(format!("shard-{i}.err")),
        )
    }
}

#[test]
fn a_killed_shard_leaves_its_nodes_unknown_and_nothing_is_replaced_until_the_grace_expires() {
    // One unit per domain, so one on each shard.
    let Standalone { procs, dir, shard_pids, domains, api, .. } =
        Standalone::start("shardkill", 1, &["--unknown-grace", "15s"]);
    let up = Up::attach(&dir, &api);
    let units = wait_for("2 running units", Duration::from_secs(40), || {
        let r = running(&up);
        (r.len() == 2).then_some(r)
    });
    // The unit on shard 1's domain.
    let victim = units.iter().find(|u| u["domain"] == domains[1].as_str()).unwrap().clone();
    let victim_id = victim["unit_id"].as_str().unwrap().to_string();

    let killed = Instant::now();
    signal(shard_pids[1] as i32, libc::SIGKILL);
    wait_for("shard 1's nodes Unknown", Duration::from_secs(10), || {
        let nodes = up.nodes();
        let unknown = nodes.iter().filter(|n| n["shard"] == 1 && n["status"] == "unknown").count();
        (unknown == 2).then_some(())
    });
    // Well past the shard's dead-after (3 s), still inside the grace: nothing is replaced.
    while killed.elapsed() < Duration::from_secs(8) {
        let units = echo_units(&up);
        assert_eq!(units.len(), 2, "no replacement is queued while the shard is unknown: {units:?}");
        let v = units.iter().find(|u| u["unit_id"] == victim_id.as_str()).unwrap();
        assert_eq!(v["state"], "running", "the unit stays: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Once the grace expires, its members count as lost.
    wait_for("the unit on the lost shard failed after the grace", Duration::from_secs(30), || {
        let units = echo_units(&up);
        let v = units.iter().find(|u| u["unit_id"] == victim_id.as_str())?;
        matches!(v["state"].as_str(), Some("failed" | "terminated")).then_some(())
    });
    let waited = killed.elapsed();
    assert!(waited >= Duration::from_secs(15), "not before the grace: {waited:?}");
    drop(procs);
}

/// The value of `name{...label...}` in a Prometheus text page.
fn metric(text: &str, name: &str, label: &str) -> Option<f64> {
    text.lines().filter(|l| l.starts_with(name) && l.contains(label)).find_map(|l| l.rsplit(' ').next()?.parse().ok())
}

fn get_text(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.starts_with("HTTP/1.1 200").then(|| out.split("\r\n\r\n").nth(1).unwrap_or("").to_string())
}

#[test]
fn the_route_proxy_follows_the_weights_and_drops_a_draining_node_before_its_workload_exits() {
    let spec = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml");
    let up = Up::start("route", &["--agents", "4", "--shards", "2", "--app", spec]);
    let routes = || -> Vec<Value> {
        let (_, r) = http(&up.addr, "GET", "/v1/apps/echo/routes", None, "");
        r["routes"].as_array().cloned().unwrap_or_default()
    };
    wait_for("2 routes with weight", Duration::from_secs(30), || {
        (routes().iter().filter(|r| r["weight"].as_f64() > Some(0.0)).count() == 2 && running(&up).len() == 2)
            .then_some(())
    });
    let mut procs = Group(Vec::new(), Vec::new());
    let log = up.data.join("route.err");
    let pid = procs.spawn_with_env(
        &["route", "--app", "echo", "--listen", "127.0.0.1:0", "--print-addrs"],
        &log,
        &[("FLOTILLA_ADDR", up.addr.as_str())],
    );
    let addrs = procs.addrs(pid);
    let (proxy, metrics) =
        (addrs["listen"].as_str().unwrap().to_string(), addrs["metrics"].as_str().unwrap().to_string());
    wait_for("the proxy follows both endpoints", Duration::from_secs(20), || {
        metric(&get_text(&metrics, "/metrics")?, "flotilla_route_endpoints", "").filter(|n| *n == 2.0)
    });
    let through = |n: usize| -> Vec<String> {
        (0..n).filter_map(|_| http_get(&proxy).and_then(|v| v["unit"].as_str().map(str::to_string))).collect()
    };
    let answered = through(40);
    assert_eq!(answered.len(), 40, "every request answered through the proxy");

    // Degrade one head's node (the agent's explicit test health file): its weight drops,
    // smoothly and not below the floor, and the proxy sends it less.
    let units = running(&up);
    let (sick, healthy) = (&units[0], &units[1]);
    let sick_head = head_of(sick);
    let sick_endpoint = sick_head["address"].as_str().unwrap().to_string();
    let test_health = up.data.join("agents").join(sick_head["node_id"].as_str().unwrap()).join("test-health");
    std::fs::write(&test_health, "cpu_steal=0.4").unwrap();
    // Relative to the healthy head: on a busy machine the real load lowers both nodes'
    // health alike, and only the difference steers traffic.
    let healthy_endpoint = head_of(healthy)["address"].as_str().unwrap().to_string();
    let (w, healthy_w) = wait_for("the degraded member's weight drops", Duration::from_secs(30), || {
        let table = routes();
        let weight = |e: &str| table.iter().find(|r| r["endpoint"] == e)?["weight"].as_f64();
        let (w, h) = (weight(&sick_endpoint)?, weight(&healthy_endpoint)?);
        (w < 0.5 * h).then_some((w, h))
    });
    assert!(w >= 0.1, "never below the floor: {w}");
    wait_for("the proxy has the new weight", Duration::from_secs(10), || {
        let text = get_text(&metrics, "/metrics")?;
        metric(&text, "flotilla_route_endpoint_weight", &sick_endpoint).filter(|x| *x < 0.5 * healthy_w)
    });
    let answered = through(100);
    let to_sick = answered.iter().filter(|u| *u == sick["unit_id"].as_str().unwrap()).count();
    assert!(to_sick < 25, "the degraded member got {to_sick} of 100");
    std::fs::remove_file(&test_health).unwrap();

    // Drain the other head's node while traffic flows: the proxy drops the endpoint before
    // its workload exits, and no request fails.
    let head = head_of(healthy);
    let (node, endpoint) =
        (head["node_id"].as_str().unwrap().to_string(), head["address"].as_str().unwrap().to_string());
    let workload = http_get(&endpoint).unwrap()["pid"].as_i64().unwrap() as i32;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (stop, proxy) = (stop.clone(), proxy.clone());
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if http_get(&proxy).is_some_and(|v| v["unit"].is_string()) { ok += 1 } else { failed += 1 }
            }
            (ok, failed)
        })
    };
    let data = up.data.join("agents").join(&node);
    let drain =
        std::thread::spawn(move || Command::new(BIN).args(["agent", "drain", "--data"]).arg(data).output().unwrap());
    let t0 = Instant::now();
    let (mut dropped, mut exited) = (None, None);
    while t0.elapsed() < Duration::from_secs(15) && (dropped.is_none() || exited.is_none()) {
        if dropped.is_none()
            && get_text(&metrics, "/metrics")
                .and_then(|t| metric(&t, "flotilla_route_endpoint_weight", &endpoint))
                .is_some_and(|w| w == 0.0)
        {
            dropped = Some(t0.elapsed());
        }
        if exited.is_none() && !alive(workload) {
            exited = Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(drain.join().unwrap().status.success());
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = traffic.join().unwrap();
    let (dropped, exited) = (dropped.expect("the proxy dropped the endpoint"), exited.expect("the workload exited"));
    eprintln!(
        "proxy dropped the endpoint after {dropped:?}, workload exited after {exited:?}; {ok} ok, {failed} failed"
    );
    assert!(dropped < exited, "out of the proxy ({dropped:?}) before the workload exits ({exited:?})");
    assert_eq!(failed, 0, "no request failed during the drain ({ok} answered)");
}

/// Every node's allocated CPU, as its shard publishes it, equals what the scheduler's
/// units hold there (250m per member of the echo app): nothing lost, nothing doubled.
fn ledgers_match_units(up: &Up) -> Result<(), String> {
    let (nodes, units) = (up.nodes(), echo_units(up));
    if nodes.len() != 4 || nodes.iter().any(|n| n["status"] != "alive") {
        return Err(format!("not every node is alive: {:?}", statuses(up)));
    }
    for n in &nodes {
        let id = n["node_id"].as_str().unwrap_or("");
        let allocated = n["allocated"]["cpu_millis"].as_u64().unwrap_or(0);
        let held = units
            .iter()
            .filter(|u| !matches!(u["state"].as_str(), Some("terminated" | "queued" | "placing")))
            .flat_map(|u| u["members"].as_array().cloned().unwrap_or_default())
            .filter(|m| m["node_id"] == id)
            .count() as u64;
        if allocated != held * 250 {
            return Err(format!("{id}: the ledger holds {allocated}m, the units {}m", held * 250));
        }
    }
    Ok(())
}

#[test]
fn a_restarted_shard_rebuilds_its_ledger_from_its_agents_with_nothing_lost_or_doubled() {
    let Standalone { mut procs, dir, shard_addrs, shard_pids, api, .. } = Standalone::start("shardrestart", 3, &[]);
    let up = Up::attach(&dir, &api);
    let before: Vec<String> = wait_for("2 running units", Duration::from_secs(40), || {
        let r = running(&up);
        (r.len() == 2).then(|| r.iter().map(|u| u["unit_id"].as_str().unwrap().to_string()).collect())
    });
    wait_for("the ledgers match the units", Duration::from_secs(10), || ledgers_match_units(&up).ok());

    // Scale up, and kill -9 shard 1 while those placements are under way.
    let (status, body) = http(&api, "PUT", "/v1/apps/echo/scale", Some("t"), r#"{"units": 5}"#);
    assert_eq!(status, 200, "{body}");
    signal(shard_pids[1] as i32, libc::SIGKILL);
    // Back on the same address, with the same data dir: it recovers.
    let pid = Standalone::spawn_shard(&mut procs, &dir, 1, &shard_addrs[1]);
    assert_eq!(procs.addrs(pid)["addr"], shard_addrs[1].as_str());

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (live, ledgers) = (running(&up).len(), ledgers_match_units(&up));
        if live == 5 && ledgers.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 60 s: {live} running, {ledgers:?}\nunits: {:?}\nnodes: {:?}",
            echo_units(&up)
                .iter()
                .map(|u| (u["unit_id"].clone(), u["state"].clone(), u["unplaced_reason"].clone()))
                .collect::<Vec<_>>(),
            up.nodes()
                .iter()
                .map(|n| (n["node_id"].clone(), n["status"].clone(), n["allocated"]["cpu_millis"].clone()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let units = echo_units(&up);
    for id in &before {
        let u = units.iter().find(|u| u["unit_id"] == id.as_str()).unwrap();
        assert_eq!(u["state"], "running", "a unit on the restarted shard was kept, not replaced: {u}");
    }
    let text = std::fs::read_to_string(dir.join("shard-1.err")).unwrap();
    assert!(
        text.contains("ledger rebuilt from what the agent runs"),
        "the restarted shard adopted its agents' members"
    );

    // New claims after the recovery window: placed once, counted once.
    let (status, _) = http(&api, "PUT", "/v1/apps/echo/scale", Some("t"), r#"{"units": 6}"#);
    assert_eq!(status, 200);
    wait_for("6 running units and ledgers that match them", Duration::from_secs(40), || {
        (running(&up).len() == 6 && ledgers_match_units(&up).is_ok()).then_some(())
    });
    drop(up);
    drop(procs);
}
