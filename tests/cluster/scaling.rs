//! Replacing a failed unit, scaling through the API and the CLI, and rolling a new spec.

use std::time::{Duration, Instant};

use flotilla_testkit::{Up, http, run_ok, signal, wait_for};

use crate::common::{ECHO, running};

#[test]
fn failover_and_scaling_through_the_api_and_the_cli() {
    let up = Up::start("scale", &["--agents", "8", "--shards", "2", "--app", ECHO]);
    wait_for("2 running units", Duration::from_secs(30), || (running(&up).len() == 2).then_some(()));
    let token = up.token();

    // kill -9 of the agent holding a unit's head: the unit is replaced, the old one ends Terminated.
    let victim = running(&up)[0].clone();
    let head_node = victim["members"].as_array().unwrap().iter().find(|m| m["role"] == "head").unwrap()["node_id"]
        .as_str()
        .unwrap()
        .to_string();
    let killed_at = Instant::now();
    signal(up.agent_pid(&head_node), libc::SIGKILL);
    wait_for("a replacement unit running and the old one terminated", Duration::from_secs(30), || {
        let units = up.units("echo");
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
    let out = up.cli().args(["scale", "echo", "--units", "3"]).env("FLOTILLA_DATA", &up.data).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_for("3 running units", Duration::from_secs(30), || (running(&up).len() == 3).then_some(()));
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units": 1}"#);
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["desired_units"], 1);
    wait_for("1 running unit", Duration::from_secs(30), || {
        let units = up.units("echo");
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
    let out = up.cli().args(["scale", "echo", "--units", "0"]).env("FLOTILLA_TOKEN", &token).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("1..=6"));
}

#[test]
fn a_rolling_apply_replaces_units_one_at_a_time() {
    let up = Up::start("apply", &["--agents", "4", "--shards", "2", "--app", ECHO]);
    let before: Vec<String> = wait_for("2 running units", Duration::from_secs(30), || {
        let r = running(&up);
        (r.len() == 2).then(|| r.iter().map(|u| u["unit_id"].as_str().unwrap().to_string()).collect())
    });
    let token = up.token();
    let original = std::fs::read_to_string(ECHO).unwrap();

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
    let apply = || run_ok(up.cli().arg("apply").arg(&file).env("FLOTILLA_TOKEN", &token));
    assert!(apply().contains("no unit's template changed"));

    // A changed template rolls through: one unit at a time, the replacement Running
    // before the old one drains, so two units serve throughout.
    std::fs::write(&file, original.replace("memory = \"64Mi\"", "memory = \"80Mi\"")).unwrap();
    let out = apply();
    assert!(out.contains("2 unit(s) will roll, 1 at a time"), "{out}");
    let t0 = Instant::now();
    loop {
        let units = up.units("echo");
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
