//! Control-plane replicas on a real etcd: two `flotilla control` processes give the same
//! answers whichever of them was told.

use std::time::Duration;

use flotilla_testkit::{Group, Up, http, wait_for};

use crate::common::ECHO;

const POLICY: &str =
    "[autoscaling]\nname = \"shared\"\npolicy = \"utilization\"\n[autoscaling.utilization]\nmax_units = 10\n";

#[test]
fn two_control_replicas_on_etcd_give_the_same_answers() {
    let mut etcd = flotilla_testkit::Etcd::start("replicas");
    let up = Up::start("replicas", &["--agents", "2", "--shards", "1"]);
    wait_for("2 alive nodes", Duration::from_secs(20), || (up.nodes().len() == 2).then_some(()));
    let (_, shards) = http(&up.addr, "GET", "/v1/shards", None, "");
    let shard = shards[0]["address"].as_str().unwrap().to_string();
    let token_file = up.data.join("api-token");
    let token = up.token();
    let mut procs = Group::new();
    let mut replica = |name: &str| {
        let args = [
            "control",
            "--listen",
            "127.0.0.1:0",
            "--print-addrs",
            "--aggregators",
            &shard,
            "--api-token-file",
            token_file.to_str().unwrap(),
            "--store",
            &etcd.endpoint(),
            "--store-prefix",
            "/replicas-test",
        ];
        let pid = procs.spawn(&args, &up.data.join(format!("{name}.err")));
        let addrs = procs.addrs(pid);
        (addrs["addr"].as_str().unwrap().to_string(), addrs["url"].as_str().unwrap().to_string())
    };
    let ((a, a_url), (b, _)) = (replica("control-a"), replica("control-b"));

    // A scheduler registers with replica A only; B finds it through etcd and forwards to it.
    let store = format!("redb:{}", up.data.join("replicas.redb").display());
    let data = up.data.to_str().unwrap().to_string();
    procs.spawn_with_env(
        &["scheduler", "--app", ECHO, "--aggregators", &shard, "--control", &a_url, "--store", &store],
        &up.data.join("scheduler.err"),
        &[("FLOTILLA_DATA", data.as_str())],
    );
    for replica in [&a, &b] {
        wait_for("the app's units through each replica", Duration::from_secs(30), || {
            let (status, units) = http(replica, "GET", "/v1/apps/echo/units", None, "");
            (status == 200 && units.as_array().is_some_and(|u| u.len() == 2)).then_some(())
        });
    }
    let (status, body) = http(&b, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units": 3}"#);
    assert_eq!(status, 200, "replica B forwards a scale to the scheduler registered with A: {body}");
    let (_, app) = http(&a, "GET", "/v1/apps/echo", None, "");
    assert_eq!(app["desired_units"], 3, "{app}");

    // A process registering 150 apps in one call through A (two etcd transactions): B
    // lists every one, asking the process once (gone by then: all listed unreachable).
    let names: Vec<String> = (0..150).map(|i| format!("bulk-{i:03}")).collect();
    let listing: Vec<serde_json::Value> =
        names.iter().map(|n| serde_json::json!({"app": n, "scheduler": {"instance": "p"}})).collect();
    let process = flotilla_testkit::answer_then_vanish(&serde_json::Value::from(listing).to_string(), 1);
    let body = serde_json::json!({"apps": names, "url": process}).to_string();
    let (status, answer) = http(&a, "POST", "/v1/schedulers", Some(&token), &body);
    assert_eq!((status, answer["registered"].as_u64()), (200, Some(150)), "{answer}");
    wait_for("B lists the 150 apps registered through A", Duration::from_secs(10), || {
        let (_, rows) = http(&b, "GET", "/v1/apps", None, "");
        let bulk = rows.as_array()?.iter().filter(|r| r["scheduler_url"] == process.as_str()).count();
        (bulk == 150).then_some(())
    });

    // A policy applied through B, a pool floor and a node type's bounds set through A: both show them.
    let (status, body) = http(&b, "PUT", "/v1/policies/shared", Some(&token), POLICY);
    assert_eq!(status, 200, "{body}");
    let floor = r#"{"resource_requests": [{"resources": {"cpu": 2}, "count": 1}]}"#;
    let (status, body) = http(&a, "PUT", "/v1/pools/gpu/constraints", Some(&token), floor);
    assert_eq!(status, 200, "{body}");
    let (status, body) = http(&a, "PUT", "/v1/pools/gpu/node_types/a100", Some(&token), r#"{"min": 0, "max": 4}"#);
    assert_eq!(status, 200, "{body}");
    for replica in [&a, &b] {
        wait_for("the policy and the pool on each replica", Duration::from_secs(10), || {
            let (_, policies) = http(replica, "GET", "/v1/policies", None, "");
            let (_, pool) = http(replica, "GET", "/v1/pools/gpu", None, "");
            let policy = policies.as_array()?.iter().any(|p| p["name"] == "shared");
            let floor = pool["constraints"]["resource_requests"].as_array().is_some_and(|r| r.len() == 1);
            (policy && floor && pool["bounds"]["a100"]["max"] == 4).then_some(())
        });
    }

    // Registration is soft state in etcd: the replicas keep answering with etcd gone,
    // and refuse changes they cannot share (503) rather than keep them to themselves.
    etcd.kill();
    let (status, _) = http(&b, "GET", "/v1/apps/echo/units", None, "");
    assert_eq!(status, 200, "a replica serves its last copy while etcd is down");
    let (status, body) = http(&a, "PUT", "/v1/policies/shared", Some(&token), POLICY);
    assert_eq!(status, 503, "a change that cannot be shared is refused: {body}");
}
