//! Writes the seed corpora, a handful of valid and invalid inputs per target:
//!
//! ```sh
//! cargo run --manifest-path fuzz/Cargo.toml --example make_seeds   # into fuzz/corpus/
//! ```
//!
//! Deterministic (every map holds one entry, so its encoding has one order): running it
//! again rewrites the same files.

use std::path::{Path, PathBuf};

use flotilla_artifact::manifest::{MIN_PIECE, Manifest};
use flotilla_artifact::wire::{Hello, Request, Status};
use flotilla_artifact::{Bitfield, Digest};
use flotilla_core::PROTOCOL_VERSION;
use flotilla_fuzz::{BITFIELD_EXPLICIT_LEN, MANIFEST_RESERVED, MASTER, NODE, hb, register_request};
use flotilla_proto::seal::{self, Format, Header, MAGIC_HEARTBEAT};
use flotilla_proto::v1;
use prost::Message;

const ECHO: &str = include_str!("../../examples/echo.toml");
const POOL: &str = include_str!("../../examples/pool.toml");

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
        ("pool", pool()),
        ("artifact_wire", artifact_wire()),
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
        let h = Header {
            magic: MAGIC_HEARTBEAT,
            format: Format::Mac,
            session_id: 7,
            seq: 1,
            incarnation: 1,
            node_id: NODE,
        };
        let mut out = Vec::new();
        seal::seal(key, &h, &body, &mut out).unwrap();
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
                record(hb::REFLECTED, 1, 0, &body),
                record(hb::REFLECTED | hb::AEAD, 1, 0, &body),
                record(hb::OTHER_SESSION, 1, 0, &body),
            ]),
        ),
        (
            "sealed-older-format",
            sealed(&[
                record(hb::AEAD, 1, 0, &body),
                record(hb::AEAD, 1, 20, &body),
                record(dead | hb::AEAD, 1, 0, &body),
                record(hb::OTHER_SESSION | hb::DERIVED_KEY | hb::AEAD, 1, 0, &body),
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
        ..Default::default()
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
    // Bit 5: a pool call, bit 0 which, bit 1 an invalid pool name.
    let (constraints, report, bad_pool) = (1u8 << 5, 1u8 << 5 | 1, 1u8 << 1);
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
        ("pool-constraints", control(constraints, FLOOR)),
        ("pool-constraints-empty", control(constraints, br#"{"resource_requests": []}"#)),
        (
            "pool-constraints-too-many",
            control(constraints, br#"{"resource_requests": [{"resources": {"cpu_millis": 1000}, "count": 100001}]}"#),
        ),
        ("pool-constraints-unknown-field", control(constraints, br#"{"resource_requests": [], "min": 1}"#)),
        ("pool-constraints-bad-pool", control(constraints | bad_pool, FLOOR)),
        ("pool-constraints-no-token", control(constraints | none, FLOOR)),
        ("pool-constraints-no-content-type", control(constraints | no_json, FLOOR)),
        (
            "pool-report",
            control(report, br#"{"instances": [{"id": "pool-a-1", "state": "running"}], "decisions": []}"#),
        ),
        ("pool-report-no-instances", control(report, br#"{"decisions": []}"#)),
        ("pool-report-wrong-token", control(report | wrong, br#"{"instances": []}"#)),
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

/// A floor as `PUT /v1/pools/{pool}/constraints` takes it.
const FLOOR: &[u8] =
    br#"{"resource_requests": [{"resources": {"cpu_millis": 2000, "memory_bytes": 4294967296}, "count": 3}]}"#;

fn pool() -> Seeds {
    // Selector % 4: 0 a pool file, 1 a demand file, 2 constraints, 3 a provider's list
    // output (see `flotilla_fuzz::pool`).
    let with = |selector: u8, text: &str| [&[selector][..], text.as_bytes()].concat();
    let small = r#"name = "default"
interval = "1s"
idle_timeout = "3s"
[timeouts]
request = "30s"
[node_types.small-a]
cpu = 1
memory = "1Gi"
labels = { domain = "domain-a", priority = "high" }
min = 1
max = 4
[node_types.gpu]
cpu = "500m"
memory = 1073741824
gpu = 2
custom = { fpga = 1 }
max = 2
cost = 0.5
"#;
    let exec = r#"interval = "1s"
[provider]
kind = "exec"
launch = ["bash", "local-exec.sh", "launch"]
terminate = ["bash", "local-exec.sh", "terminate"]
list = ["bash", "local-exec.sh", "list"]
timeout = "10s"
env = { FLOTILLA_STOP_GRACE = "2" }
[node_types.a]
cpu = 2
memory = "2Gi"
min = 1
max = 3
"#;
    let every_problem = r#"name = "bad name"
max_nodes = 1
upscaling_speed = -1
max_concurrent_launches = 0
interval = "0s"
[provider]
kind = "exec"
launch = []
terminate = [""]
list = ["x"]
[node_types.a]
cpu = "-4"
memory = "8Gi"
max = 1
[node_types.b]
cpu = 4
memory = "1Ei"
min = 3
max = 2
labels = { priority = "medium" }
"#;
    let demand = r#"{
  "node_types": [
    {"name": "gpu2-tpu1", "resources": {"GPU": 2, "TPU": 1}, "max_workers": 4},
    {"name": "gpu6", "resources": {"GPU": 6}, "max_workers": 4, "cost": 3.0},
    {"name": "cpu16", "resources": {"CPU": 16, "memory": 68719476736}, "min_workers": 1, "idle_timeout_s": 60,
     "labels": {"zone": "z1"}}
  ],
  "max_total_workers": 20,
  "current_instances": [{"node_type": "cpu16", "count": 2, "available": {"CPU": 4}, "idle_s": 120},
                        {"node_type": "gpu6", "idle_s": 3}],
  "resource_requests": [{"resources": {"GPU": 2}, "count": 1}, {"resources": {"CPU": 0.5, "memory": 1e9}, "count": 40}],
  "gang_requests": [{"id": "pg", "strategy": "STRICT_SPREAD", "bundles": [{"CPU": 4}, {"CPU": 4}]},
                    {"id": "packed", "strategy": "STRICT_PACK", "bundles": [{"CPU": 8}, {"CPU": 8}]},
                    {"strategy": "PACK", "bundles": [{"GPU": 1}, {"CPU": 1}]},
                    {"id": "huge", "strategy": "SPREAD", "bundles": [{"CPU": 64}]}],
  "cluster_resource_constraints": [{"resource_requests": [{"resources": {"CPU": 4}, "count": 8}]}]
}"#;
    vec![
        ("pool-example", with(0, POOL)),
        ("pool-small", with(0, small)),
        ("pool-exec", with(0, exec)),
        ("pool-every-problem", with(0, every_problem)),
        ("pool-min-past-max-nodes", with(0, &format!("max_nodes = 0\n{small}"))),
        ("pool-unknown-field", with(0, &small.replace("[node_types.gpu]", "[node_types.gpu]\nspot = true"))),
        ("pool-empty", with(0, "")),
        ("pool-not-utf8", vec![0, b'n', 0xff]),
        ("demand", with(1, demand)),
        (
            "demand-huge-counts",
            with(
                1,
                r#"{"node_types": [{"name": "a", "resources": {"CPU": 1}, "min_workers": 10000000},
                    {"name": "b", "resources": {"CPU": 0.001, "x": 1}}],
                    "resource_requests": [{"resources": {"CPU": 0.001}, "count": 10000000}]}"#,
            ),
        ),
        (
            "demand-many-instances",
            with(
                1,
                r#"{"node_types": [{"name": "a", "resources": {"CPU": 1}}], "current_instances": [{"node_type": "a", "count": 1000000}]}"#,
            ),
        ),
        (
            "demand-over-max",
            with(
                1,
                r#"{"node_types": [{"name": "a", "resources": {"CPU": 2}, "max_workers": 1, "idle_timeout_s": 0}],
                    "max_total_workers": 1,
                    "current_instances": [{"node_type": "a", "count": 3, "idle_s": 10}]}"#,
            ),
        ),
        ("demand-bad", with(1, r#"{"node_types": [{"name": "a", "resources": {"CPU": -1}}]}"#)),
        ("demand-not-json", with(1, "not json")),
        ("constraints", with(2, std::str::from_utf8(FLOOR).unwrap())),
        (
            "constraints-custom",
            with(2, r#"{"resource_requests": [{"resources": {"cpu_millis": 100, "gpu": 1, "custom": {"fpga": 2}}}]}"#),
        ),
        (
            "constraints-too-many",
            with(2, r#"{"resource_requests": [{"resources": {"cpu_millis": 1}, "count": 100001}]}"#),
        ),
        (
            "constraints-huge",
            with(2, r#"{"resource_requests": [{"resources": {"memory_bytes": 18446744073709551615}}]}"#),
        ),
        ("constraints-unknown-field", with(2, r#"{"resource_requests": [], "min": 1}"#)),
        (
            "list",
            with(3, r#"[{"id": "pool-a-1", "node_type": "a", "zone": "z1"}, {"id": "pool-b.2", "node_type": "b"}]"#),
        ),
        ("list-empty", with(3, "[]")),
        ("list-bad-id", with(3, r#"[{"id": "../etc", "node_type": "a"}]"#)),
        ("list-no-type", with(3, r#"[{"id": "pool-a-1"}]"#)),
        ("list-not-json", with(3, "instances: none")),
    ]
}

fn artifact_wire() -> Seeds {
    // Every input is read as each frame (see `flotilla_fuzz::artifact_wire`); a seed is
    // named for the one it is.
    let manifest = |size: u64| {
        let count = size.div_ceil(u64::from(MIN_PIECE)) as u32;
        let pieces = (0..count).map(|i| Digest::of(&i.to_be_bytes())).collect();
        Manifest { size, piece_size: MIN_PIECE, pieces }.encode()
    };
    let three = manifest(2 * u64::from(MIN_PIECE) + 5);
    let with = |mut b: Vec<u8>, at: usize, bytes: &[u8]| {
        b[at..at + bytes.len()].copy_from_slice(bytes);
        b
    };
    let answer = |s: Status, body: &[u8]| [&s.encode()[..], body].concat();
    let hello = |node: &str| Hello { key_id: *b"key-0001", node: node.into(), mac: [0xa5; 32] }.encode();
    let mut bits = Bitfield::new(70);
    [0, 9, 63, 64, 69].iter().for_each(|i| bits.set(*i));
    let fitted = |low: u8, hex: &str| [&[low][..], hex.as_bytes()].concat();
    let explicit = |len: u32, hex: &str| [&[BITFIELD_EXPLICIT_LEN][..], &len.to_be_bytes(), hex.as_bytes()].concat();
    vec![
        ("manifest-empty", manifest(0)),
        ("manifest-three-pieces", three.clone()),
        ("manifest-reserved-set", with(three.clone(), MANIFEST_RESERVED.start, &[1, 2, 3])),
        ("manifest-short", three[..23].to_vec()),
        ("manifest-bad-magic", with(three.clone(), 0, b"FLAX")),
        ("manifest-bad-version", with(three.clone(), 4, &[2])),
        ("manifest-bad-piece-size", with(three.clone(), 16, &(MIN_PIECE + 1).to_be_bytes())),
        ("manifest-bad-count", with(three.clone(), 20, &4u32.to_be_bytes())),
        ("manifest-too-long", [&three[..], &[0]].concat()),
        ("manifest-huge-size", with(three.clone(), 8, &u64::MAX.to_be_bytes())),
        ("answer-manifest", answer(Status::Ok(three.len() as u32), &three)),
        ("answer-piece", answer(Status::Ok(16), &[7; 16])),
        ("answer-missing", answer(Status::Missing, &[])),
        ("answer-busy", answer(Status::Busy, &[])),
        ("answer-too-big", vec![0, 0xff, 0xff, 0xff, 0xff]),
        ("answer-bad-status", vec![9, 0, 0, 0, 0]),
        ("request-manifest", Request::Manifest(Digest::of(b"artifact")).encode().to_vec()),
        ("request-piece", Request::Piece(Digest::of(b"artifact"), 77).encode().to_vec()),
        ("request-bad-kind", with(Request::Piece(Digest::of(b"artifact"), 1).encode().to_vec(), 0, &[0])),
        ("hello", hello("node-7")),
        ("hello-longest-node", hello(&"n".repeat(253))),
        ("hello-not-utf8", with(hello("node-7"), 9, &[0xff])),
        ("hello-empty-node", [&b"key-0001"[..], &[0], &[0xa5; 32]].concat()),
        ("hello-short", hello("node-7")[..20].to_vec()),
        ("bitfield", explicit(70, &bits.to_hex())),
        ("bitfield-fitted", fitted(3, "ff1f")),
        ("bitfield-upper-case", fitted(0, "A5fF")),
        ("bitfield-past-the-last", fitted(3, "ffff")),
        ("bitfield-not-hex", fitted(0, "zz")),
        ("bitfield-wrong-length", explicit(80, &bits.to_hex())),
        ("bitfield-huge-length", explicit(u32::MAX, "00")),
        ("bitfield-empty", explicit(0, "")),
    ]
}
