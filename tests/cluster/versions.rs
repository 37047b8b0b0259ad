//! Versions, plans and rollbacks as an operator uses them (issue #36, items 2 and 3):
//! `apply --plan` says what would change and changes nothing; `apply --check-version`
//! refuses a stale apply; every change is a version with its source and token, kept
//! across restarts of `up`; `rollback --to N` goes back to any of them.

use std::time::Duration;

use flotilla_testkit::{TempDir, Up, get_text, http, run_ok, wait_for};
use serde_json::Value;

use crate::common::{ECHO, running};

fn echo_with(memory: &str) -> String {
    std::fs::read_to_string(ECHO).unwrap().replacen("memory = \"64Mi\"", &format!("memory = \"{memory}\""), 1)
}

fn write(dir: &TempDir, name: &str, text: &str) -> String {
    let p = dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

fn history(up: &Up) -> Value {
    serde_json::from_str(&run_ok(up.cli().args(["history", "echo", "--json"]))).unwrap()
}

/// Waits for `up` to answer again after a restart, with echo's versions.
fn history_after_restart(up: &Up) -> Value {
    wait_for("echo's history after the restart", Duration::from_secs(30), || {
        let out = up.cli().args(["history", "echo", "--json"]).output().ok()?;
        out.status.success().then(|| serde_json::from_slice(&out.stdout).ok()).flatten()
    })
}

#[test]
fn plans_change_nothing_versions_survive_restarts_and_a_rollback_goes_to_any_of_them() {
    let dir = TempDir::new("versions-specs");
    let mut up = Up::start("versions", &["--agents", "4", "--shards", "1", "--app", ECHO]);
    let before: Vec<String> = wait_for("2 running units", Duration::from_secs(30), || {
        let r = running(&up);
        (r.len() == 2).then(|| r.iter().map(|u| u["unit_id"].as_str().unwrap().to_string()).collect())
    });
    let v = history(&up);
    assert_eq!(v["in_force"], 1, "{v}");
    assert_eq!(v["versions"][0]["source"], "file", "{v}");

    // A plan: the changed setting, the units rolling one at a time oldest first, nothing
    // changed meanwhile.
    let bigger = write(&dir, "72Mi.toml", &echo_with("72Mi"));
    let plan = run_ok(up.cli().args(["apply", &bigger, "--plan"]));
    assert!(plan.starts_with("echo: against version 1 in force\n"), "{plan}");
    assert!(plan.contains("unit.head.memory: \"64Mi\" → \"72Mi\""), "{plan}");
    let mut oldest_first = before.clone();
    oldest_first.sort_by_key(|id| id.rsplit('-').next().and_then(|n| n.parse::<u64>().ok()));
    assert!(plan.contains(&format!("roll, step 1: {}\n", oldest_first[0])), "{plan}");
    assert!(plan.contains(&format!("roll, step 2: {}\n", oldest_first[1])), "{plan}");
    assert!(plan.contains("first step places 1 unit(s): 1 fit now"), "{plan}");
    assert!(get_text(&up.addr, "/v1/apps/echo/spec").unwrap().contains("64Mi"), "a plan applies nothing");
    assert_eq!(history(&up)["in_force"], 1);

    // What cannot fit is named with the planner's reason.
    let huge = write(
        &dir,
        "huge.toml",
        &std::fs::read_to_string(ECHO).unwrap().replacen("cpu = \"250m\"", "cpu = \"4000\"", 1),
    );
    let plan: Value = serde_json::from_str(&run_ok(up.cli().args(["apply", &huge, "--plan", "--json"]))).unwrap();
    assert_eq!((plan["to_place"].as_u64(), plan["fit"].as_u64()), (Some(1), Some(0)), "{plan}");
    let reason = plan["cannot_place"][0]["reason"].as_str().unwrap();
    assert!(reason.starts_with("no domain can hold the unit") && reason.contains("nodes"), "{plan}");

    // An invalid spec: every problem, as apply says them; the wrong app, an unknown one.
    let bad = std::fs::read_to_string(ECHO)
        .unwrap()
        .replacen("workers = 1", "workers = 100000", 1)
        .replacen("min = 1", "min = 9", 1);
    let (status, body) = http(&up.addr, "POST", "/v1/apps/echo/plan", Some(&up.token()), &bad);
    assert_eq!(status, 422, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("unit.workers") && message.contains("units.min (9) is above"), "{message}");
    let (status, body) = http(&up.addr, "POST", "/v1/apps/nope/plan", Some(&up.token()), &echo_with("72Mi"));
    assert_eq!(status, 422, "the spec names echo: {body}");
    let (status, _) = http(&up.addr, "POST", "/v1/apps/echo/plan", None, &echo_with("72Mi"));
    assert_eq!(status, 401, "a plan needs the token, as an apply does");

    // Optimistic applies: against version 1, then again against the stale 1.
    let out = run_ok(up.cli().args(["apply", &bigger, "--check-version", "1", "--wait", "--timeout", "60s"]));
    assert!(out.starts_with("echo: version 2: 2 unit(s) will roll"), "{out}");
    let out = up
        .cli()
        .args(["apply", &write(&dir, "88Mi.toml", &echo_with("88Mi")), "--check-version", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("409") && stderr.contains("version 2, not 1"), "{stderr}");
    let out = run_ok(up.cli().args(["apply", &bigger]));
    assert!(out.starts_with("echo: version 2 (unchanged)"), "{out}");

    // Restarted: the versions are still there, with who applied them and what changed.
    assert!(up.restart(), "up stops cleanly");
    let v = history_after_restart(&up);
    assert_eq!(v["in_force"], 2, "{v}");
    let newest = &v["versions"][0];
    assert_eq!((newest["source"].as_str(), newest["by"].as_str()), (Some("api"), Some("api-token")), "{v}");
    let changes = newest["changes"].as_array().unwrap();
    assert_eq!(changes.len(), 1, "{v}");
    assert_eq!(
        (changes[0]["path"].as_str(), changes[0]["after"].as_str()),
        (Some("unit.head.memory"), Some("\"72Mi\""))
    );
    assert!(v["versions"][1]["changes"].is_null(), "the oldest kept has nothing to compare with: {v}");
    let table = run_ok(up.cli().args(["history", "echo"]));
    assert!(
        table.contains("2*") && table.contains("api-token") && table.contains("unit.head.memory=\"72Mi\""),
        "{table}"
    );

    // Back to version 1: a new version saying so, rolled out as an apply is.
    let out = run_ok(up.cli().args(["rollback", "echo", "--to", "1", "--wait", "--timeout", "60s"]));
    assert!(out.starts_with("echo: version 3: 2 unit(s) will roll"), "{out}");
    assert!(get_text(&up.addr, "/v1/apps/echo/spec").unwrap().contains("64Mi"));
    let one = get_text(&up.addr, "/v1/apps/echo/versions/1").unwrap();
    assert!(one.contains("64Mi") && one.contains("name = \"echo\""), "{one}");
    let (status, body) = http(&up.addr, "GET", "/v1/apps/echo/versions/99", None, "");
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("no_such_version")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("kept: 1..=3"), "{body}");
    let (status, body) = http(&up.addr, "GET", "/v1/apps/echo/versions/latest", None, "");
    assert_eq!(status, 400, "{body}");
    let (status, body) = http(&up.addr, "POST", "/v1/apps/echo/rollback", Some(&up.token()), "{\"to\": 3}");
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("already_in_force")), "{body}");
    let (status, body) = http(&up.addr, "POST", "/v1/apps/echo/rollback", Some(&up.token()), "{\"to\": \"one\"}");
    assert_eq!(status, 400, "{body}");
    let (status, body) = http(&up.addr, "GET", "/v1/apps/nope/versions", None, "");
    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("no_such_app")), "{body}");

    assert!(up.restart(), "up stops cleanly");
    let v = history_after_restart(&up);
    assert_eq!(v["in_force"], 3, "{v}");
    let newest = &v["versions"][0];
    assert_eq!((newest["source"].as_str(), newest["rollback_of"].as_u64()), (Some("rollback"), Some(1)), "{v}");
    assert_eq!(newest["changes"][0]["after"], "\"64Mi\"", "{v}");
    let table = run_ok(up.cli().args(["history", "echo"]));
    assert!(table.contains("rollback of 1"), "{table}");
}
