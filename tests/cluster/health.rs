//! `/healthz` and `/readyz` of every process, as Kubernetes probes see them: a shard,
//! an agent, the control plane, a scheduler and a router, each started as its own
//! process. An agent whose shard is not there yet is alive but not ready (503 with a
//! one-line JSON reason), and becomes ready once the shard starts and takes it.

use std::path::Path;
use std::time::Duration;

use flotilla_testkit::{Group, Pki, TempDir, free_port, wait_for};
use serde_json::Value;

use crate::common::ECHO;

/// GET `path`: the status and the body, or `None` while nothing answers.
fn probe(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, out.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

/// Waits until `addr` answers `/healthz` with 200 and `/readyz` with `ready`; the
/// `/readyz` body.
pub fn wait_probes(what: &str, addr: &str, ready: u16) -> String {
    wait_for(&format!("{what}: /healthz 200 and /readyz {ready}"), Duration::from_secs(30), || {
        let (live, _) = probe(addr, "/healthz")?;
        let (status, body) = probe(addr, "/readyz")?;
        (live == 200 && status == ready).then_some(body)
    })
}

/// A shard's secrets as an operator brings them: tokens and a certificate for 127.0.0.1
/// signed by their own CA (written to `ca.crt` beside them, for the agents).
pub fn write_secrets(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let pki = Pki::new();
    for (name, text) in [
        ("shard-secret", "0123456789abcdef0123456789abcdef".to_string()),
        ("join-token", "join-token-for-tests\n".to_string()),
        ("grpc-token", "grpc-token-for-tests\n".to_string()),
        ("tls.crt", pki.cert_pem.clone()),
        ("tls.key", pki.key_pem.clone()),
        ("ca.crt", pki.ca_pem.clone()),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
    }
}

/// The one JSON line of a not-ready `/readyz`.
/// Starts agent `n1` (data under `dir/agent`, log in `dir/agent.err`) joining the shard at
/// `shard_addr` with the join token and CA in `secrets`; its metrics address.
pub fn spawn_agent(procs: &mut Group, shard_addr: &str, secrets: &Path, dir: &Path) -> String {
    let s = |name: &str| secrets.join(name).display().to_string();
    let agent_metrics = format!("127.0.0.1:{}", free_port());
    let agent_data = dir.join("agent").display().to_string();
    procs.spawn(
        &[
            "agent",
            "--aggregators",
            shard_addr,
            "--node-id",
            "n1",
            "--join-token-file",
            &s("join-token"),
            "--ca",
            &s("ca.crt"),
            "--data",
            &agent_data,
            "--metrics",
            &agent_metrics,
        ],
        &dir.join("agent.err"),
    );
    agent_metrics
}

fn reason(body: &str) -> String {
    assert_eq!(body.trim_end().lines().count(), 1, "one line: {body:?}");
    let v: Value = serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("{e}: {body:?}"));
    assert_eq!(v["ready"], false, "{v}");
    v["reason"].as_str().unwrap_or_else(|| panic!("no reason in {v}")).to_string()
}

#[test]
fn every_process_answers_healthz_and_readyz() {
    let dir = TempDir::new("health");
    let secrets = dir.join("secrets");
    write_secrets(&secrets);
    let s = |name: &str| secrets.join(name).display().to_string();
    let mut procs = Group::new();
    let shard_port = free_port();
    let shard_addr = format!("127.0.0.1:{shard_port}");

    // An agent started before its shard: alive, not ready, and it says why.
    let agent_metrics = spawn_agent(&mut procs, &shard_addr, &secrets, &dir);
    let why = reason(&wait_probes("the agent without its shard", &agent_metrics, 503));
    assert!(why.starts_with("agent: "), "{why}");

    // A router following an app through a control plane that is not there: not ready.
    let router = procs.spawn(
        &["route", "--app", "echo", "--addr", "http://127.0.0.1:1", "--listen", "127.0.0.1:0", "--print-addrs"],
        &dir.join("route-app.err"),
    );
    let router_metrics = procs.addrs(router)["metrics"].as_str().unwrap().to_string();
    let why = reason(&wait_probes("a router without a route table", &router_metrics, 503));
    assert!(why.starts_with("router: "), "{why}");

    // The shard: ready once serving; then the agent registers and is ready too.
    let data = dir.join("shard-data").display().to_string();
    let shard = procs.spawn(
        &[
            "aggregator",
            "--listen",
            &shard_addr,
            "--data",
            &data,
            "--secrets",
            &secrets.display().to_string(),
            "--print-addrs",
        ],
        &dir.join("shard.err"),
    );
    let shard_metrics = procs.addrs(shard)["metrics"].as_str().unwrap().to_string();
    assert_eq!(wait_probes("the shard", &shard_metrics, 200).trim(), r#"{"ready":true}"#);
    wait_probes("the agent registered with its shard", &agent_metrics, 200);

    // The control plane serves them on its API port.
    let control = procs.spawn(
        &[
            "control",
            "--listen",
            "127.0.0.1:0",
            "--aggregators",
            &shard_addr,
            "--grpc-token-file",
            &s("grpc-token"),
            "--print-addrs",
        ],
        &dir.join("control.err"),
    );
    let control_addr = procs.addrs(control)["addr"].as_str().unwrap().to_string();
    wait_probes("the control plane", &control_addr, 200);

    // A scheduler: ready once its store is open and it holds the shard's view. It
    // registers with the control plane at the URL it advertises (in Kubernetes its pod
    // IP), not at its bound address.
    let scheduler_port = free_port();
    let scheduler_addr = format!("127.0.0.1:{scheduler_port}");
    let advertised = format!("http://localhost:{scheduler_port}");
    let control_url = format!("http://{control_addr}");
    let store = format!("redb:{}", dir.join("echo.redb").display());
    procs.spawn_with_env(
        &[
            "scheduler",
            "--app",
            ECHO,
            "--aggregators",
            &shard_addr,
            "--store",
            &store,
            "--listen",
            &scheduler_addr,
            "--control",
            &control_url,
            "--advertise-url",
            &advertised,
            "--grpc-token-file",
            &s("grpc-token"),
        ],
        &dir.join("scheduler.err"),
        &[("FLOTILLA_TOKEN", "api-token-for-tests")],
    );
    wait_probes("the scheduler", &scheduler_addr, 200);
    wait_for("the control plane names the advertised scheduler URL", Duration::from_secs(30), || {
        let (status, app) = flotilla_testkit::http(&control_addr, "GET", "/v1/apps/echo", None, "");
        (status == 200 && app["scheduler_url"] == advertised.as_str()).then_some(())
    });

    // A router over fixed backends has its table from the start.
    let fixed = procs.spawn(
        &["route", "--backends", "127.0.0.1:9", "--listen", "127.0.0.1:0", "--print-addrs"],
        &dir.join("route-fixed.err"),
    );
    let fixed_metrics = procs.addrs(fixed)["metrics"].as_str().unwrap().to_string();
    wait_probes("a router over fixed backends", &fixed_metrics, 200);

    // /metrics still answers beside them.
    assert!(probe(&shard_metrics, "/metrics").is_some_and(|(s, _)| s == 200));
    drop(procs);
}
