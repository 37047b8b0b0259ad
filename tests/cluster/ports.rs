//! Named ports and start order with real agents: a head with named ports and a block of
//! ports, and a worker that starts after it on another node and learns where it is.

use std::time::{Duration, Instant};

use flotilla_testkit::{TempDir, Up, http, run_ok, signal, wait_for};
use serde_json::Value;

/// A unit that cannot share a node: in `up`'s domain-b (node-2: 8 cores, node-4: 4
/// cores; domain-a's only high-priority node, node-1, has 4), the 5-core head fits
/// node-2 alone and the 3.5-core worker then fits node-4 alone. The head is slow to be
/// ready (3 s), so start order shows.
const SPEC: &str = r#"
name = "ray"
[unit]
workers = 1
[unit.head]
command = "flotilla"
args = ["echo-server", "--ready-after", "3s"]
cpu = "5"
memory = "64Mi"
serves_http = true
readiness_path = "/healthz"
ports = ["gcs", "serve"]
port_ranges = { worker_ports = 5 }
[unit.worker]
command = "flotilla"
args = ["echo-server"]
cpu = "3500m"
memory = "64Mi"
readiness_path = "/healthz"
after = "head"
[units]
min = 1
max = 1
initial = 1
[routing]
roles = ["head"]
port = "serve"
"#;

fn env_of(addr: &str) -> Value {
    let (code, v) = http(addr, "GET", "/env", None, "");
    assert_eq!(code, 200, "GET /env on {addr}: {v}");
    v
}

/// The member `name` of `unit` (null while the unit is not placed).
fn member<'a>(unit: &'a Value, name: &str) -> &'a Value {
    unit["members"].as_array().and_then(|ms| ms.iter().find(|m| m["member"] == name)).unwrap_or(&Value::Null)
}

#[test]
fn a_worker_on_another_node_starts_after_its_head_and_gets_its_address_and_named_ports() {
    let dir = TempDir::new("ports-spec");
    let spec = dir.path().join("ray.toml");
    std::fs::write(&spec, SPEC).unwrap();
    let up = Up::start("ports", &["--agents", "4", "--shards", "1", "--app", spec.to_str().unwrap()]);

    // While the head comes up, the worker waits, and `units` says why.
    let mut saw_waiting = None;
    let started = Instant::now();
    let unit = loop {
        assert!(started.elapsed() < Duration::from_secs(60), "the unit never ran: {:?}", up.units("ray"));
        let units = up.units("ray");
        if let Some(u) = units.first() {
            if u["state"] == "running" {
                break u.clone();
            }
            if saw_waiting.is_none() && member(u, "worker-0")["state"] == "waiting" {
                let text = run_ok(up.cli().args(["units", "ray"]));
                saw_waiting = Some((member(u, "worker-0")["message"].clone(), text));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let (message, text) = saw_waiting.expect("the worker was seen waiting for its head");
    assert_eq!(message, "waits for head to be running");
    assert!(text.contains("worker-0 waiting: waits for head to be running"), "{text}");

    let (head, worker) = (member(&unit, "head"), member(&unit, "worker-0"));
    assert_eq!((head["node_id"].as_str(), worker["node_id"].as_str()), (Some("node-2"), Some("node-4")));

    // The head's named ports, as its agent reported them.
    let head_addr = head["address"].as_str().unwrap();
    let (head_host, head_port) = head_addr.rsplit_once(':').unwrap();
    let (gcs, serve) = (head["ports"]["gcs"].as_u64().unwrap(), head["ports"]["serve"].as_u64().unwrap());
    let block = &head["port_ranges"]["worker_ports"];
    let (lo, hi) = (block["min"].as_u64().unwrap(), block["max"].as_u64().unwrap());
    assert_eq!(hi - lo + 1, 5, "a block of 5: {block}");
    assert_eq!(head_port, serve.to_string(), "the routing port is the head's address");
    assert!(gcs != serve && !(lo..=hi).contains(&gcs) && !(lo..=hi).contains(&serve));

    // The head's process was given them.
    let he = env_of(head_addr);
    assert_eq!(he["env"]["FLOTILLA_PORT"], serve.to_string());
    assert_eq!(he["env"]["FLOTILLA_PORT_SERVE"], serve.to_string());
    assert_eq!(he["env"]["FLOTILLA_PORT_GCS"], gcs.to_string());
    assert_eq!(he["env"]["FLOTILLA_PORT_WORKER_PORTS_MIN"], lo.to_string());
    assert_eq!(he["env"]["FLOTILLA_PORT_WORKER_PORTS_MAX"], hi.to_string());

    // The worker, on another node, was given the head's address and ports.
    let we = env_of(worker["address"].as_str().unwrap());
    assert_eq!(we["env"]["FLOTILLA_HEAD_ADDR"], head_host);
    assert_eq!(we["env"]["FLOTILLA_HEAD_PORT"], serve.to_string());
    assert_eq!(we["env"]["FLOTILLA_HEAD_PORT_GCS"], gcs.to_string());
    assert_eq!(we["env"]["FLOTILLA_HEAD_PORT_SERVE"], serve.to_string());
    assert_eq!(we["env"]["FLOTILLA_HEAD_PORT_WORKER_PORTS_MIN"], lo.to_string());
    assert_eq!(we["env"]["FLOTILLA_HEAD_PORT_WORKER_PORTS_MAX"], hi.to_string());

    // Start order: the worker's process started once the head was ready (3 s after its start).
    let (h0, w0) = (he["started_unix_ms"].as_u64().unwrap(), we["started_unix_ms"].as_u64().unwrap());
    assert!(w0 >= h0 + 3000, "the worker started {} ms after the head", w0 as i64 - h0 as i64);

    // The route points at the head's named serving port.
    let routes = wait_for("the head's route", Duration::from_secs(10), || {
        let (_, r) = http(&up.addr, "GET", "/v1/apps/ray/routes", None, "");
        let routes = r["routes"].as_array().cloned().unwrap_or_default();
        (!routes.is_empty()).then_some(routes)
    });
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert_eq!(routes[0]["endpoint"], format!("{head_host}:{serve}"));
}

/// The spec of an app "big" whose head asks for a block of `block` ports.
fn big(block: u32) -> String {
    SPEC.replace("name = \"ray\"", "name = \"big\"")
        .replace("workers = 1", "workers = 0")
        .replace("port_ranges = { worker_ports = 5 }", &format!("port_ranges = {{ worker_ports = {block} }}"))
        .replace("cpu = \"5\"", "cpu = \"1\"")
}

/// A member asking for more ports than any agent offers (`up`'s agents hand out 50
/// each) is not placed, and `units` says why: the planner counts ports.
#[test]
fn a_member_no_agent_has_the_ports_for_is_not_placed() {
    let dir = TempDir::new("ports-unplaced-spec");
    let spec = dir.path().join("big.toml");
    std::fs::write(&spec, big(60)).unwrap();
    let up = Up::start("ports-unplaced", &["--agents", "2", "--shards", "1", "--app", spec.to_str().unwrap()]);
    let why = wait_for("the unit unplaced for want of ports", Duration::from_secs(30), || {
        let u = up.units("big").into_iter().next()?;
        let why = u["unplaced_reason"].as_str()?.to_string();
        why.contains("lacking free ports").then_some(why)
    });
    assert!(why.contains("2 nodes lacking free ports"), "{why}");
    assert!(run_ok(up.cli().args(["units", "big"])).contains("lacking free ports"));
}

/// Ports the agent counted free but the host holds (another process bound them): the
/// agent refuses the start, and `units` says why.
#[test]
fn an_agent_without_free_ports_refuses_the_start_and_units_says_why() {
    // node-1's range under `up` is 20000-20049: hold every port of it that is free.
    let held: Vec<std::net::TcpListener> =
        (20_000..=20_049).filter_map(|p| std::net::TcpListener::bind(("127.0.0.1", p)).ok()).collect();
    assert!(!held.is_empty());
    let dir = TempDir::new("ports-busy-spec");
    let spec = dir.path().join("big.toml");
    std::fs::write(&spec, big(2)).unwrap();
    let up = Up::start("ports-busy", &["--agents", "1", "--shards", "1", "--app", spec.to_str().unwrap()]);
    let head = wait_for("the head refused for want of ports", Duration::from_secs(30), || {
        let u = up.units("big").into_iter().next()?;
        let head = member(&u, "head").clone();
        (head["state"] == "failed").then_some(head)
    });
    let why = head["message"].as_str().unwrap();
    assert!(why.contains("no free port in the agent's range 20000-20049"), "{why}");
    let text = run_ok(up.cli().args(["units", "big"]));
    assert!(text.contains("head failed: no free port in the agent's range"), "{text}");
    drop(held);
}

/// A lost head replaces the whole unit, as before, and the new unit's worker starts after
/// the new head, with the new head's address and ports. With six agents both domains can
/// hold the unit (head on the 8-core node, worker on the 4-core one of the same domain).
#[test]
fn a_replaced_head_gives_the_new_unit_s_worker_the_new_head_address() {
    let dir = TempDir::new("ports-replace-spec");
    let spec = dir.path().join("ray.toml");
    std::fs::write(&spec, SPEC.replace("\"--ready-after\", \"3s\"", "\"--ready-after\", \"1s\"")).unwrap();
    let up = Up::start("ports-replace", &["--agents", "6", "--shards", "1", "--app", spec.to_str().unwrap()]);
    let running = |not: Option<&str>| {
        wait_for("a running unit", Duration::from_secs(60), || {
            up.units("ray").into_iter().find(|u| u["state"] == "running" && u["unit_id"].as_str() != not)
        })
    };
    let first = running(None);
    let old_head = member(&first, "head").clone();
    let old_id = first["unit_id"].as_str().unwrap().to_string();
    signal(up.agent_pid(old_head["node_id"].as_str().unwrap()), libc::SIGKILL);

    let second = running(Some(&old_id));
    let (head, worker) = (member(&second, "head"), member(&second, "worker-0"));
    assert_ne!(head["node_id"], old_head["node_id"], "the new head runs elsewhere");
    assert_ne!(head["node_id"], worker["node_id"]);
    let head_addr = head["address"].as_str().unwrap();
    assert_ne!(head_addr, old_head["address"].as_str().unwrap(), "a new head address");
    let (host, _) = head_addr.rsplit_once(':').unwrap();
    let we = env_of(worker["address"].as_str().unwrap());
    assert_eq!(we["env"]["FLOTILLA_HEAD_ADDR"], host);
    assert_eq!(we["env"]["FLOTILLA_HEAD_PORT_GCS"], head["ports"]["gcs"].as_u64().unwrap().to_string());
    assert_eq!(we["env"]["FLOTILLA_HEAD_PORT_SERVE"], head["ports"]["serve"].as_u64().unwrap().to_string());
    let old = up.units("ray").into_iter().find(|u| u["unit_id"] == old_id.as_str());
    assert!(old.as_ref().is_none_or(|u| u["state"] != "running"), "the old unit was replaced as a whole: {old:?}");
}
