//! Writes the seed corpora, a handful of valid and invalid inputs per target:
//!
//! ```sh
//! cargo run --manifest-path fuzz/Cargo.toml --example make_seeds   # into fuzz/corpus/
//! ```
//!
//! Deterministic (every map holds one entry, so its encoding has one order): running it
//! again rewrites the same files.

use std::path::{Path, PathBuf};

use flotilla_core::PROTOCOL_VERSION;
use flotilla_fuzz::{MASTER, NODE, hb, register_request};
use flotilla_proto::seal::{self, Direction, Header, MAGIC_HEARTBEAT};
use flotilla_proto::v1;
use prost::Message;

const ECHO: &str = include_str!("../../examples/echo.toml");

fn main() -> std::io::Result<()> {
    let root = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus"));
    let mut n = 0;
    for (target, seeds) in [
        ("heartbeat", heartbeat()),
        ("registration", registration()),
        ("commit_request", commit_request()),
        ("app_spec", app_spec()),
        ("control_json", control_json()),
        ("autoscaling", autoscaling()),
    ] {
        let dir = root.join(target);
        std::fs::create_dir_all(&dir)?;
        for (name, bytes) in seeds {
            std::fs::write(dir.join(name), bytes)?;
            n += 1;
        }
    }
    println!("wrote {n} seeds under {}", root.display());
    Ok(())
}

type Seeds = Vec<(&'static str, Vec<u8>)>;

fn health(steal: f32) -> v1::HealthSample {
    v1::HealthSample { cpu_utilisation: 0.25, cpu_steal: steal, load_per_core: 0.5, ..Default::default() }
}

fn beat_body(steal: f32) -> Vec<u8> {
    v1::HeartbeatBody { health: Some(health(steal)), assignment_version: 3, sent_at_unix_ms: 1_700_000_000_000 }
        .encode_to_vec()
}

/// One sealed-mode record (see `flotilla_fuzz::hb`).
fn record(flags: u8, delta: i8, tamper: u8, body: &[u8]) -> Vec<u8> {
    let mut r = vec![flags, delta as u8, tamper, body.len() as u8];
    r.extend_from_slice(body);
    r
}

fn sealed(records: &[Vec<u8>]) -> Vec<u8> {
    let mut v = vec![1u8];
    for r in records {
        v.extend_from_slice(r);
    }
    v
}

fn raw(d: &[u8]) -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend_from_slice(d);
    v
}

fn heartbeat() -> Seeds {
    let body = beat_body(0.01);
    // A session this shard's secret derives but does not hold (the shard restarted).
    let forgotten = |key: &seal::SessionKey| {
        let h = Header { magic: MAGIC_HEARTBEAT, session_id: 7, seq: 1, incarnation: 1, node_id: NODE };
        let mut out = Vec::new();
        seal::seal(key, Direction::ToShard, &h, &body, &mut out).unwrap();
        out
    };
    let mut bad_version = forgotten(&seal::derive_session_key(MASTER, 7, 1, NODE));
    bad_version[2] = 9;
    let mut long_id = forgotten(&seal::derive_session_key(MASTER, 7, 1, NODE));
    long_id[3] = 200;
    let dead = 2 << hb::STATUS_SHIFT;
    let suspect = 1 << hb::STATUS_SHIFT;
    let draining = 3 << hb::STATUS_SHIFT;
    vec![
        ("raw-garbage", raw(b"garbage")),
        ("raw-empty", raw(b"")),
        ("raw-forgotten-session", raw(&forgotten(&seal::derive_session_key(MASTER, 7, 1, NODE)))),
        ("raw-forged", raw(&forgotten(&[7u8; 32]))),
        ("raw-bad-version", raw(&bad_version)),
        ("raw-bad-node-id-length", raw(&long_id)),
        ("raw-oversized", raw(&vec![0u8; seal::MAX_DATAGRAM_LEN + 1])),
        ("sealed-good", sealed(&[record(0, 1, 0, &body)])),
        (
            "sealed-sequence",
            sealed(&[
                record(0, 1, 0, &body),
                record(0, 0, 0, &body),  // replayed
                record(0, -1, 0, &body), // older
                record(0, 5, 0, &beat_body(0.3)),
                record(0, 1, 0, &[]), // an empty body is a default sample
            ]),
        ),
        ("sealed-tampered", sealed(&[record(0, 1, 20, &body), record(0, 1, 0, &body), record(0, 1, 130, &body)])),
        ("sealed-dead-then-more", sealed(&[record(dead, 1, 0, &body), record(0, 1, 0, &body)])),
        ("sealed-suspect-comes-back", sealed(&[record(suspect, 1, 0, &body), record(draining, 1, 0, &body)])),
        (
            "sealed-not-its-own",
            sealed(&[
                record(hb::OTHER_NODE, 1, 0, &body),
                record(hb::OTHER_INCARNATION | hb::DERIVED_KEY, 1, 0, &body),
                record(hb::REPLY_MAGIC, 1, 0, &body),
                record(hb::TO_AGENT, 1, 0, &body),
                record(hb::OTHER_SESSION, 1, 0, &body),
            ]),
        ),
        ("sealed-forgotten", sealed(&[record(hb::OTHER_SESSION | hb::DERIVED_KEY, 1, 0, &body)])),
        (
            "sealed-bad-bodies",
            sealed(&[
                record(0, 1, 0, &[0xff, 0xff, 0xff]),
                record(0, 1, 0, &beat_body(f32::NAN)),
                record(0, 1, 0, &beat_body(7.5)),
                record(0, 1, 0, &body),
            ]),
        ),
    ]
}

fn agent(r: v1::agent_request::Request) -> Vec<u8> {
    v1::AgentRequest { request: Some(r) }.encode_to_vec()
}

fn workload(command: &str) -> v1::Workload {
    v1::Workload {
        role: "head".into(),
        command: command.into(),
        args: vec!["echo-server".into()],
        env: [("PORT".to_string(), "8080".to_string())].into_iter().collect(),
        readiness_path: "/healthz".into(),
        restart: "always".into(),
    }
}

fn assignment(unit: &str, cpu: u64) -> v1::Assignment {
    v1::Assignment {
        app: "echo".into(),
        unit: unit.into(),
        member: "head".into(),
        generation: 1,
        resources: Some(v1::Resources { cpu_millis: cpu, memory_bytes: 64 << 20, ..Default::default() }),
        workload: Some(workload("flotilla")),
    }
}

fn registration() -> Seeds {
    use v1::agent_request::Request;
    let reg = |f: &dyn Fn(&mut v1::RegisterRequest)| {
        let mut r = register_request("node-1");
        // One label per map: prost encodes a map in its (random) iteration order.
        r.labels = [("domain".to_string(), "rack-a".to_string())].into_iter().collect();
        r.health = Some(health(0.02));
        f(&mut r);
        agent(Request::Register(r))
    };
    let status = |member: &str, message: String| v1::WorkloadStatus {
        app: "echo".into(),
        unit: "u1".into(),
        member: member.into(),
        generation: 1,
        state: v1::WorkloadState::Running as i32,
        address: "127.0.0.1:8080".into(),
        exit_code: 0,
        message,
        ..Default::default()
    };
    vec![
        ("register-valid", reg(&|_| {})),
        (
            "register-with-assignments",
            reg(&|r| {
                r.assignments = vec![assignment("u1", 1000), assignment("u2", 2500), assignment("u3", 1000)];
                r.assignment_version = 4;
            }),
        ),
        ("register-bad-token", reg(&|r| r.join_token = "nope".into())),
        ("register-bad-protocol", reg(&|r| r.protocol_version = PROTOCOL_VERSION + 1)),
        ("register-bad-node-id", reg(&|r| r.node_id = "bad id".into())),
        ("register-huge-capacity", reg(&|r| r.capacity.as_mut().unwrap().cpu_millis = u64::MAX)),
        ("register-no-capacity", reg(&|r| r.capacity = None)),
        ("register-bad-label", reg(&|r| r.labels = [("k=".to_string(), "v".repeat(200))].into_iter().collect())),
        ("register-bad-health", reg(&|r| r.health = Some(health(f32::NAN)))),
        ("register-bad-assignment", reg(&|r| r.assignments = vec![assignment("", 100)])),
        (
            "workloads-report",
            agent(Request::Workloads(v1::ReportWorkloads {
                node_id: "node-1".into(),
                session_id: 1,
                workloads: vec![status("head", "é".repeat(600)), status("worker-0", "exited".into())],
            })),
        ),
        (
            "workloads-bad-names",
            agent(Request::Workloads(v1::ReportWorkloads {
                node_id: NODE.into(),
                session_id: 1,
                workloads: vec![status("", String::new())],
            })),
        ),
        ("drain-own", agent(Request::Drain(v1::DrainRequest { node_id: NODE.into(), session_id: 1 }))),
        ("drain-other", agent(Request::Drain(v1::DrainRequest { node_id: "n2".into(), session_id: 1 }))),
        ("empty-request", Vec::new()),
        ("garbage", vec![0xff; 12]),
    ]
}

fn claim(unit: &str, member: &str, node: &str, cpu: u64, group: &str) -> v1::Claim {
    v1::Claim {
        key: Some(v1::ClaimKey { app: "echo".into(), unit: unit.into(), member: member.into(), generation: 1 }),
        node_id: node.into(),
        incarnation: 1,
        resources: Some(v1::Resources { cpu_millis: cpu, memory_bytes: 64 << 20, ..Default::default() }),
        allow_low_priority: false,
        group: group.into(),
        workload: Some(workload("flotilla")),
    }
}

fn commit(txn: &str, claims: Vec<v1::Claim>) -> Vec<u8> {
    v1::CommitRequest { txn_id: txn.into(), fencing_token: 0, claims }.encode_to_vec()
}

fn commit_request() -> Seeds {
    let with = |mut c: v1::Claim, f: &dyn Fn(&mut v1::Claim)| {
        f(&mut c);
        c
    };
    vec![
        ("commit-one", commit("t1", vec![claim("u1", "head", "n0", 250, "")])),
        (
            "commit-unit",
            commit("t2", vec![claim("u1", "head", "n0", 2000, "u1"), claim("u1", "worker-0", "n1", 2000, "u1")]),
        ),
        (
            "commit-unit-no-fit",
            commit("t3", vec![claim("u1", "head", "n0", 3000, "u1"), claim("u1", "worker-0", "n0", 2000, "u1")]),
        ),
        (
            "commit-every-reason",
            commit(
                "t4",
                vec![
                    claim("u1", "head", "n2", 100, ""),  // low priority
                    claim("u2", "head", "n3", 100, ""),  // suspect
                    claim("u3", "head", "n4", 100, ""),  // recovering
                    claim("u4", "head", "n5", 100, ""),  // cordoned
                    claim("u5", "head", "n6", 100, ""),  // draining
                    claim("u6", "head", "n7", 100, ""),  // incarnation 2
                    claim("u7", "head", "n9", 100, ""),  // unknown
                    claim("u8", "head", "n0", 5000, ""), // no fit
                ],
            ),
        ),
        (
            "commit-duplicate-keys",
            commit("t5", vec![claim("u1", "head", "n0", 100, ""), claim("u1", "head", "n1", 100, "")]),
        ),
        (
            "commit-custom-and-gpu",
            commit(
                "t6",
                vec![
                    with(claim("u1", "head", "n0", 100, ""), &|c| {
                        c.resources.as_mut().unwrap().custom.insert("fpga".into(), 2);
                    }),
                    with(claim("u2", "head", "n1", 100, ""), &|c| c.resources.as_mut().unwrap().gpu = 2),
                ],
            ),
        ),
        ("invalid-empty-txn", commit("", vec![claim("u1", "head", "n0", 100, "")])),
        ("invalid-no-claims", commit("t7", vec![])),
        ("invalid-node-id", commit("t8", vec![claim("u1", "head", "n 0", 100, "")])),
        (
            "invalid-huge-resources",
            commit(
                "t9",
                vec![with(claim("u1", "head", "n0", 100, ""), &|c| {
                    c.resources.as_mut().unwrap().memory_bytes = u64::MAX
                })],
            ),
        ),
        (
            "invalid-workload",
            commit(
                "t10",
                vec![with(claim("u1", "head", "n0", 100, ""), &|c| {
                    c.workload.as_mut().unwrap().args = vec!["a".into(); 300]
                })],
            ),
        ),
        ("invalid-no-key", commit("t11", vec![with(claim("u1", "head", "n0", 100, ""), &|c| c.key = None)])),
        ("invalid-long-group", commit("t12", vec![claim("u1", "head", "n0", 100, &"g".repeat(200))])),
        ("garbage", vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]),
    ]
}

fn app_spec() -> Seeds {
    let minimal = r#"name = "mini"
[unit.head]
command = "sleep"
args = ["600"]
cpu = "0.5"
memory = "128Mi"
[units]
min = 0
max = 2
initial = 1
"#;
    let full = r#"name = "full-app"
[unit]
workers = 2
[unit.head]
command = "/bin/server"
args = ["--port", "8080"]
env = { RUST_LOG = "info", MODE = "head" }
cpu = "2"
memory = "1Gi"
gpu = 1
serves_http = true
readiness_path = "/ready"
restart = "on-failure"
[unit.worker]
command = "/bin/worker"
cpu = "500m"
memory = "512M"
restart = "never"
[constraints]
labels = { zone = "z1", "gpu_model" = "a100" }
allow_low_priority = false
[spread]
max_units_per_domain = 2
[units]
min = 1
max = 10
initial = 3
drain_timeout_ms = 5000
[rollout]
max_unavailable = 2
[routing]
roles = ["head", "worker"]
[routing.performance]
gpu_model = { a100 = 4.0, t4 = 1.5 }
cores = { "8" = 1.0, "16" = 1.8 }
"#;
    let every_problem = r#"name = "Bad_Name"
[unit]
workers = 2
[unit.head]
command = ""
cpu = "0"
memory = "lots"
readiness_path = "healthz"
[units]
min = 3
max = 2
initial = 5
[spread]
max_units_per_domain = 0
[routing]
roles = ["boss"]
"#;
    vec![
        ("echo.toml", ECHO.into()),
        ("minimal.toml", minimal.into()),
        ("full.toml", full.into()),
        ("every-problem.toml", every_problem.into()),
        ("unknown-field.toml", ECHO.replace("[units]", "[units]\nmaximum = 3").into_bytes()),
        ("huge-memory.toml", minimal.replace("128Mi", "1000Ti").into_bytes()),
        ("huge-cpu.toml", minimal.replace("\"0.5\"", "\"1e30\"").into_bytes()),
        ("huge-gpu.toml", minimal.replace("memory = \"128Mi\"", "memory = \"128Mi\"\ngpu = 100000").into_bytes()),
        ("syntax-error.toml", b"name = \n[unit.head\n".to_vec()),
        ("empty.toml", Vec::new()),
        ("not-utf8.toml", vec![b'n', 0xff, 0xfe]),
    ]
}

fn control(sel: u8, body: &[u8]) -> Vec<u8> {
    let mut v = vec![sel];
    v.extend_from_slice(body);
    v
}

fn control_json() -> Seeds {
    // Selector: bits 0-1 the call, bits 2-3 the credential (0 right, 1 none, 2 wrong),
    // bit 4 without the JSON content type (see `flotilla_fuzz::control_json`).
    let (scale, register, spec, node) = (0u8, 1u8, 2u8, 3u8);
    let (none, wrong, no_json) = (1u8 << 2, 2u8 << 2, 1u8 << 4);
    vec![
        ("scale", control(scale, br#"{"units": 3}"#)),
        ("scale-negative", control(scale, br#"{"units": -1}"#)),
        ("scale-unknown-field", control(scale, br#"{"units": 3, "force": true}"#)),
        ("scale-not-json", control(scale, b"three")),
        ("scale-no-content-type", control(scale | no_json, br#"{"units": 3}"#)),
        ("scale-no-token", control(scale | none, br#"{"units": 3}"#)),
        ("register", control(register, br#"{"app": "echo", "url": "http://127.0.0.1:7801"}"#)),
        ("register-bad-url", control(register, br#"{"app": "echo", "url": "ftp://x"}"#)),
        (
            "register-long-app",
            control(register, format!(r#"{{"app": "{}", "url": "http://h"}}"#, "a".repeat(64)).as_bytes()),
        ),
        ("register-wrong-token", control(register | wrong, br#"{"app": "echo", "url": "http://h"}"#)),
        ("register-missing-url", control(register, br#"{"app": "echo"}"#)),
        ("spec", control(spec, ECHO.as_bytes())),
        ("spec-other-name", control(spec, ECHO.replace("name = \"echo\"", "name = \"other\"").as_bytes())),
        ("spec-invalid", control(spec, b"name = 3")),
        ("spec-not-utf8", control(spec, &[0xff, 0xfe])),
        ("node-cordon", control(node, b"node-1/cordon")),
        ("node-unknown-action", control(node, b"node-1/explode")),
        ("node-bad-id", control(node, b"bad%20id/drain")),
    ]
}

fn autoscaling() -> Seeds {
    let with = |selector: u8, text: &str| [&[selector][..], text.as_bytes()].concat();
    let policy = |name: &str| {
        let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/policies").join(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    vec![
        ("policy-basic", with(0, &policy("basic.toml"))),
        ("policy-utilization", with(0, &policy("utilization.toml"))),
        (
            "policy-bad",
            with(
                0,
                "[autoscaling]\npolicy = \"median\"\ninterval = \"0s\"\n[autoscaling.basic]\nscale_up_factor = 1.5\n",
            ),
        ),
        (
            "trace-step",
            with(
                1,
                "time_s,cpu_millis,memory_bytes,utilization\n0,1000,1073741824,\n60,4000,4294967296,0.9\n120,0,0\n",
            ),
        ),
        ("trace-bad", with(1, "time_s,cpu_millis,memory_bytes\n5,x,1\n")),
        (
            "demand",
            with(
                2,
                r#"{"requests": [{"resources": {"cpu_millis": 500, "memory_bytes": 67108864}, "count": 4}], "ttl_seconds": 60}"#,
            ),
        ),
        (
            "demand-bad",
            with(2, r#"{"requests": [{"resources": {"unicorns": 1}, "count": 4294967295}], "ttl_seconds": 0}"#),
        ),
    ]
}
