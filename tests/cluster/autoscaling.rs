//! Autoscaling with real agents: the echo app under MR3's utilization policy grows when
//! its members hold memory and shrinks when they let go; a Dataproc `basic` policy, named
//! and shared, follows consumer demand. Each step shows in the decision records.

use std::time::Duration;

use flotilla_testkit::{Up, fresh_dir, http, metric, metrics_page, run_ok, wait_for};
use serde_json::Value;

const AUTOSCALED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo-autoscaled.toml");

fn live(up: &Up, app: &str) -> Vec<Value> {
    up.units(app).into_iter().filter(|u| u["state"] == "running").collect()
}

fn decisions(up: &Up, app: &str) -> Vec<Value> {
    let (status, body) = http(&up.addr, "GET", &format!("/v1/apps/{app}/decisions"), None, "");
    assert_eq!(status, 200, "{body}");
    body.as_array().cloned().unwrap_or_default()
}

/// Every member of the running units holds `mib` MiB.
fn load(up: &Up, app: &str, mib: u32) {
    for u in live(up, app) {
        for m in u["members"].as_array().unwrap() {
            let addr = m["address"].as_str().unwrap();
            let (status, body) = http(addr, "PUT", &format!("/load?memory_mib={mib}"), None, "");
            assert_eq!(status, 200, "{addr}: {body}");
        }
    }
}

#[test]
fn the_utilization_policy_grows_the_app_under_load_and_shrinks_it_after() {
    // The shipped example, with its periods shortened to seconds.
    let spec = std::fs::read_to_string(AUTOSCALED)
        .unwrap()
        .replace("interval = \"5s\"", "interval = \"1s\"")
        .replace("window = \"30s\"", "window = \"3s\"")
        .replace("\"30s\"", "\"2s\"");
    let dir = fresh_dir("autoscaled-spec");
    let path = dir.join("echo-auto.toml");
    std::fs::write(&path, spec).unwrap();
    let up = Up::start("autoscale-util", &["--agents", "6", "--app", path.to_str().unwrap()]);
    wait_for("one running unit", Duration::from_secs(30), || (live(&up, "echo-auto").len() == 1).then_some(()));
    // The agents measure what each member uses; it shows in the unit rows.
    wait_for("usage reported", Duration::from_secs(30), || {
        let u = up.units("echo-auto");
        u.iter().any(|u| u["members"][0]["usage"]["memory_bytes"].as_u64().is_some_and(|m| m > 0)).then_some(())
    });

    load(&up, "echo-auto", 200);
    wait_for("the app grows under load", Duration::from_secs(60), || (live(&up, "echo-auto").len() >= 2).then_some(()));
    let up_record = wait_for("a scale_up record", Duration::from_secs(10), || {
        decisions(&up, "echo-auto").into_iter().find(|d| d["action"] == "scale_up")
    });
    assert_eq!(up_record["policy"], "utilization");
    assert!(up_record["explanation"].as_str().unwrap().contains("utilization"), "{up_record}");
    assert!(up_record["inputs"]["utilization_percent"].as_f64().unwrap() >= 70.0, "{up_record}");

    load(&up, "echo-auto", 0);
    wait_for("the app shrinks back once the load stops", Duration::from_secs(90), || {
        let units = up.units("echo-auto");
        let active = units.iter().filter(|u| !matches!(u["state"].as_str(), Some("terminated" | "failed"))).count();
        (active == 1 && live(&up, "echo-auto").len() == 1).then_some(())
    });
    let all = decisions(&up, "echo-auto");
    let down = all.iter().find(|d| d["action"] == "scale_down").expect("a scale_down record");
    assert!(down["at"].as_u64() > up_record["at"].as_u64(), "newest first: {all:?}");
    assert!(all.windows(2).all(|w| w[0]["at"].as_u64() >= w[1]["at"].as_u64()), "newest first");

    // The CLI, the apps listing and the metrics say the same.
    let out = run_ok(up.cli().args(["decisions", "echo-auto"]));
    assert!(out.contains("scale_down") && out.contains("scale_up"), "{out}");
    let apps = run_ok(up.cli().args(["apps"]));
    assert!(apps.contains("utilization") && apps.contains("last decision"), "{apps}");
    let page = metrics_page(&up.addr);
    let n = metric(&page, "flotilla_autoscaler_decisions_total", "action=\"scale_up\"").unwrap_or(0.0);
    assert!(n >= 1.0, "flotilla_autoscaler_decisions_total{{action=\"scale_up\"}} = {n}");
    let _ = std::fs::remove_dir_all(&dir);
}

const DEMAND_APP: &str = r#"
name = "batch"
autoscaling_policy = "by-demand"

[unit.head]
command = "flotilla"
args = ["echo-server"]
cpu = "500m"
memory = "64Mi"
serves_http = true
readiness_path = "/healthz"

[units]
min = 1
max = 5
initial = 1
"#;

const BY_DEMAND: &str = r#"
[autoscaling]
name = "by-demand"
policy = "basic"
interval = "1s"

[autoscaling.basic]
cooldown_period = "2s"
allow_short_cooldown_for_tests = true
graceful_decommission_timeout = "0s"
scale_up_factor = 1.0
scale_down_factor = 1.0

[autoscaling.basic.worker_config]
min_instances = 1
max_instances = 5
"#;

#[test]
fn a_named_basic_policy_follows_consumer_demand() {
    let dir = fresh_dir("demand-spec");
    let (app, policy) = (dir.join("batch.toml"), dir.join("by-demand.toml"));
    std::fs::write(&app, DEMAND_APP).unwrap();
    std::fs::write(&policy, BY_DEMAND).unwrap();
    let up = Up::start("autoscale-demand", &["--agents", "6", "--app", app.to_str().unwrap()]);
    let token = up.token();
    wait_for("one running unit", Duration::from_secs(30), || (live(&up, "batch").len() == 1).then_some(()));

    // A bad policy and a bad demand are refused with every problem named; nothing changes.
    let bad = BY_DEMAND.replace("scale_up_factor = 1.0", "scale_up_factor = 1.5").replace("\"2s\"", "\"0s\"");
    let (status, body) = http(&up.addr, "PUT", "/v1/policies/by-demand", Some(&token), &bad);
    assert_eq!(status, 422, "{body}");
    let msg = body["error"]["message"].as_str().unwrap();
    assert!(msg.contains("scale_up_factor") && msg.contains("cooldown_period"), "{msg}");
    let huge =
        r#"{"requests": [{"resources": {"cpu_millis": 500, "unicorns": 1}, "count": 100000}], "ttl_seconds": 60}"#;
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/batch/demand", Some(&token), huge);
    assert_eq!(status, 422, "{body}");
    assert_eq!(body["error"]["code"], "invalid_demand");
    let (status, _) = http(&up.addr, "PUT", "/v1/apps/batch/demand", None, r#"{"requests": [], "ttl_seconds": 60}"#);
    assert_eq!(status, 401);

    // The named policy, then demand for four units' worth.
    run_ok(up.cli().args(["policy", "apply", policy.to_str().unwrap()]).env("FLOTILLA_DATA", &up.data));
    let listed = run_ok(up.cli().args(["policy", "list"]));
    assert!(listed.contains("by-demand") && listed.contains("basic"), "{listed}");
    run_ok(
        up.cli()
            .args(["demand", "batch", "--cpu", "500m", "--memory", "64Mi", "--count", "4", "--ttl", "120"])
            .env("FLOTILLA_DATA", &up.data),
    );
    // `demand APP` shows what stands (issue #34 item 6).
    let shown = run_ok(up.cli().args(["demand", "batch"]));
    assert!(
        shown.contains("500m") && shown.contains("64Mi") && shown.contains("until ") && shown.contains("(in "),
        "{shown}"
    );
    wait_for("the app grows to the demand", Duration::from_secs(60), || (live(&up, "batch").len() == 4).then_some(()));
    let grew = decisions(&up, "batch").into_iter().find(|d| d["action"] == "scale_up").expect("a scale_up record");
    assert_eq!(grew["policy_name"], "by-demand", "{grew}");
    assert!(grew["explanation"].as_str().unwrap().contains("ROUND_UP"), "{grew}");

    // The operator pins it at 2; then lifts the pin, withdraws the demand, and it shrinks.
    run_ok(up.cli().args(["scale", "batch", "--units", "2"]).env("FLOTILLA_DATA", &up.data));
    wait_for("the override holds it at 2", Duration::from_secs(60), || (live(&up, "batch").len() == 2).then_some(()));
    run_ok(up.cli().args(["scale", "batch", "--auto"]).env("FLOTILLA_DATA", &up.data));
    let out = run_ok(up.cli().args(["demand", "batch", "--clear"]).env("FLOTILLA_DATA", &up.data));
    assert!(out.contains("demand withdrawn"), "{out}");
    assert!(run_ok(up.cli().args(["demand", "batch"])).contains("no demand stands"));
    wait_for("the app shrinks to its minimum", Duration::from_secs(60), || {
        let units = up.units("batch");
        let active = units.iter().filter(|u| !matches!(u["state"].as_str(), Some("terminated" | "failed"))).count();
        (active == 1).then_some(())
    });
    let page = metrics_page(&up.addr);
    assert!(metric(&page, "flotilla_api_errors_total", "code=\"invalid_demand\"").unwrap_or(0.0) >= 1.0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The latest `rate` the consumer printed, after draining what it printed since.
fn last_rate(lines: &std::sync::mpsc::Receiver<String>, last: &mut f64) -> f64 {
    for l in lines.try_iter() {
        if let Some(r) = serde_json::from_str::<Value>(&l).ok().and_then(|v| v["rate"].as_f64()) {
            *last = r;
        }
    }
    *last
}

#[test]
fn a_consumer_paces_itself_by_the_apps_capacity() {
    use std::io::BufRead;
    let up = Up::start("capacity", &["--agents", "6", "--app", crate::common::ECHO]);
    wait_for("two running units", Duration::from_secs(30), || (live(&up, "echo").len() == 2).then_some(()));
    let (status, c) = http(&up.addr, "GET", "/v1/apps/echo/capacity", None, "");
    assert_eq!(status, 200, "{c}");
    assert!(c["total_weight"].as_f64().unwrap() > 0.0, "{c}");
    assert!(c["by_priority"]["high"]["cpu_millis"].as_u64().is_some(), "{c}");

    // The example consumer, at 10 requests a second per unit of weight.
    let mut consumer = std::process::Command::new(flotilla_testkit::bin("examples/capacity_consumer"))
        .args(["--app", "echo", "--control", &up.addr, "--per-weight", "10", "--seconds", "120"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let (tx, lines) = std::sync::mpsc::channel();
    let out = consumer.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    // The pace is 10 per unit of route weight, and weights follow node health, which a
    // busy machine lowers: the checks compare the pace with itself, not with a constant.
    let mut rate = 0.0;
    let two = wait_for("the consumer's pace for two units", Duration::from_secs(30), || {
        (last_rate(&lines, &mut rate) >= 1.0).then_some(rate)
    });
    run_ok(up.cli().args(["scale", "echo", "--units", "4"]).env("FLOTILLA_DATA", &up.data));
    wait_for("the consumer speeds up with four units", Duration::from_secs(60), || {
        (last_rate(&lines, &mut rate) >= two * 1.5).then_some(())
    });
    run_ok(up.cli().args(["scale", "echo", "--units", "1"]).env("FLOTILLA_DATA", &up.data));
    wait_for("the consumer slows down with one unit", Duration::from_secs(60), || {
        (last_rate(&lines, &mut rate) <= two * 0.75).then_some(())
    });
    let _ = consumer.kill();
    let _ = consumer.wait();
}
