//! Rollouts that cannot get stuck, and the applied spec as the truth (issue #20, items 1,
//! 6 and 9): a replacement that never runs fails at the progress deadline while the old
//! units keep serving; a newer apply supersedes an in-flight rollout at once;
//! `auto_revert` goes back to the last spec that ran; an applied spec survives a restart
//! of `up` with the same `--app` file; a revert leaves the units that already match alone.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::{Duration, Instant};

use flotilla_testkit::{TempDir, Up, get_text, http, metric, metrics_page, run_ok, wait_for};
use serde_json::Value;

use crate::common::{ECHO, running};

fn echo() -> String {
    std::fs::read_to_string(ECHO).unwrap()
}

/// echo.toml whose head cannot start, with `rollout` settings appended.
fn broken(rollout: &str) -> String {
    let spec = echo().replacen("command = \"flotilla\"", "command = \"/nonexistent/bin\"", 1);
    format!("{spec}\n[rollout]\n{rollout}\n")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

/// `apps --json`'s row for echo.
fn echo_app(up: &Up) -> Value {
    let out = run_ok(up.cli().args(["apps", "--json"]));
    let apps: Value = serde_json::from_str(&out).unwrap();
    apps.as_array().unwrap().iter().find(|a| a["app"] == "echo").cloned().unwrap()
}

fn ids(units: &[Value]) -> BTreeSet<String> {
    units.iter().map(|u| u["unit_id"].as_str().unwrap().to_string()).collect()
}

/// Active units (not terminated, failed, draining or stopping).
fn active(up: &Up) -> Vec<Value> {
    up.units("echo")
        .into_iter()
        .filter(|u| !matches!(u["state"].as_str(), Some("terminated" | "failed" | "draining" | "stopping")))
        .collect()
}

/// Whether a unit was lost to its node (a starved agent's heartbeats on a loaded
/// machine), which replaces it whatever the spec: unit names are then compared no more.
fn lost_a_node(up: &Up) -> bool {
    up.units("echo").iter().any(|u| u["unplaced_reason"].as_str().is_some_and(|r| r.starts_with("head lost")))
}

/// The active units are `before`, unless a node was lost meanwhile; in any case none was
/// rolled for its template more than `rolled` times in all.
fn left_alone(up: &Up, before: &BTreeSet<String>, rolled: f64) {
    let page = metrics_page(&up.addr);
    let n = metric(&page, "flotilla_units_replaced_total", "why=\"its template changed\"").unwrap_or(0.0);
    assert_eq!(n, rolled, "units rolled for their template");
    if !lost_a_node(up) {
        assert_eq!(ids(&active(up)), *before, "{:?}", up.units("echo"));
    }
}

fn start(name: &str, app: &str) -> (Up, BTreeSet<String>) {
    let up = Up::start(name, &["--agents", "4", "--shards", "1", "--app", app]);
    let before = wait_for("2 running units", Duration::from_secs(30), || {
        let r = running(&up);
        (r.len() == 2).then(|| ids(&r))
    });
    (up, before)
}

#[test]
fn a_replacement_that_never_runs_fails_at_the_deadline_and_the_old_units_keep_serving() {
    let dir = TempDir::new("rollout-deadline-specs");
    let (up, before) = start("rollout-deadline", ECHO);
    let template = echo_app(&up)["spec"]["template"].as_str().unwrap().to_string();
    let bad = write(dir.path(), "bad.toml", &broken("progress_deadline = \"5s\""));
    let out = run_ok(up.cli().args(["apply", &bad]));
    assert!(out.contains("1 unit(s) will roll") || out.contains("2 unit(s) will roll"), "{out}");

    // The old units serve throughout; the replacement fails at the deadline.
    let t0 = Instant::now();
    let failed = loop {
        let serving = running(&up).len() >= 2 || lost_a_node(&up);
        assert!(serving, "the old units keep serving: {:?}", up.units("echo"));
        let app = echo_app(&up);
        if app["rollout"]["state"] == "failed" {
            break app;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "the rollout fails at its deadline: {app}");
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("rollout failed after {:?}", t0.elapsed());
    assert!(t0.elapsed() >= Duration::from_secs(4), "not before the deadline");
    let reason = failed["rollout"]["reason"].as_str().unwrap();
    assert!(reason.contains("progress deadline of 5s") && reason.contains("head"), "{reason}");
    assert_ne!(failed["rollout"]["template"], template.as_str());
    assert_eq!(failed["spec"]["source"], "api");

    // `units` says why the replacement ended; it holds nothing any more; the old units run.
    let units = up.units("echo");
    let released: Vec<&Value> = units.iter().filter(|u| u["template"] == failed["rollout"]["template"]).collect();
    assert!(!released.is_empty(), "{units:?}");
    for u in &released {
        assert_eq!(u["state"], "terminated", "{u}");
        assert!(u["unplaced_reason"].as_str().unwrap().contains("progress deadline"), "{u}");
    }
    left_alone(&up, &before, 1.0);
    let text = run_ok(up.cli().args(["apps"]));
    assert!(text.contains("SPEC") && text.contains("failed: rollout failed"), "{text}");
    let page = metrics_page(&up.addr);
    assert_eq!(metric(&page, "flotilla_rollouts_failed_total", "app=\"echo\""), Some(1.0), "counted once");

    // Nothing more rolls to the failed template.
    std::thread::sleep(Duration::from_secs(2));
    left_alone(&up, &before, 1.0);

    // Re-applying the good spec proceeds at once.
    let t1 = Instant::now();
    let out = run_ok(up.cli().args(["apply", ECHO, "--wait", "--timeout", "20s"]));
    assert!(out.contains("no unit's template changed"), "{out}");
    assert!(t1.elapsed() < Duration::from_secs(10), "{:?}", t1.elapsed());
    assert_eq!(echo_app(&up)["rollout"]["state"], "complete");
    left_alone(&up, &before, 1.0);
}

#[test]
fn a_newer_apply_supersedes_a_rollout_in_flight_at_once() {
    let dir = TempDir::new("rollout-supersede-specs");
    let (up, before) = start("rollout-supersede", ECHO);
    // The default deadline (5m): only the newer apply can end this rollout in time.
    let bad = write(dir.path(), "bad.toml", &broken("max_unavailable = 1"));
    run_ok(up.cli().args(["apply", &bad]));
    let stuck = wait_for("a replacement coming up", Duration::from_secs(20), || {
        let units = up.units("echo");
        units.into_iter().find(|u| {
            !before.contains(u["unit_id"].as_str().unwrap())
                && u["members"].as_array().is_some_and(|m| m.iter().any(|m| m["state"] == "failed"))
        })
    });

    // A good spec with another template: the stuck replacement is released at once and
    // the units roll to the new template.
    let good = write(dir.path(), "good.toml", &echo().replacen("memory = \"64Mi\"", "memory = \"80Mi\"", 1));
    let t0 = Instant::now();
    let out = run_ok(up.cli().args(["apply", &good, "--wait", "--timeout", "45s"]));
    eprintln!("superseded and rolled in {:?}: {out}", t0.elapsed());
    let units = up.units("echo");
    let r = units.iter().find(|u| u["unit_id"] == stuck["unit_id"]).unwrap();
    assert_eq!(r["state"], "terminated", "{r}");
    assert!(r["unplaced_reason"].as_str().unwrap().starts_with("superseded"), "{r}");
    let app = echo_app(&up);
    assert_eq!(app["rollout"]["state"], "complete", "{app}");
    let now = running(&up);
    assert_eq!(now.len(), 2);
    assert!(now.iter().all(|u| u["template"] == app["spec"]["template"]), "{now:?}");
    assert!(ids(&now).is_disjoint(&before), "every unit rolled");
    let page = metrics_page(&up.addr);
    assert_eq!(metric(&page, "flotilla_rollouts_superseded_total", "app=\"echo\""), Some(1.0));
    let failed = metric(&page, "flotilla_rollouts_failed_total", "app=\"echo\"").unwrap_or(0.0);
    assert_eq!(failed, 0.0, "superseded is not failed");
}

#[test]
fn auto_revert_goes_back_to_the_last_spec_that_ran() {
    let dir = TempDir::new("rollout-revert-specs");
    let (up, before) = start("rollout-revert", ECHO);
    let good_template = echo_app(&up)["spec"]["template"].as_str().unwrap().to_string();
    let bad = write(dir.path(), "bad.toml", &broken("progress_deadline = \"5s\"\nauto_revert = true"));

    // `apply --wait` gives up as soon as the app reverted.
    let t0 = Instant::now();
    let out = up.cli().args(["apply", &bad, "--wait", "--timeout", "40s"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("reverted to the last spec that ran"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());

    let app = echo_app(&up);
    assert_eq!(app["spec"]["source"], "revert", "{app}");
    assert_eq!(app["spec"]["template"], good_template.as_str());
    assert!(app["spec"]["reason"].as_str().unwrap().contains("progress deadline"), "{app}");
    let spec = get_text(&up.addr, "/v1/apps/echo/spec").unwrap();
    assert!(!spec.contains("/nonexistent/bin"), "{spec}");
    let text = run_ok(up.cli().args(["apps"]));
    assert!(text.contains("revert") && text.contains("spec reverted"), "{text}");
    // The units that ran the good spec were never touched.
    std::thread::sleep(Duration::from_secs(2));
    left_alone(&up, &before, 1.0);
    let page = metrics_page(&up.addr);
    assert_eq!(metric(&page, "flotilla_rollouts_reverted_total", "app=\"echo\""), Some(1.0));
}

#[test]
fn an_applied_spec_survives_a_restart_with_the_same_app_file_and_a_changed_file_applies() {
    let dir = TempDir::new("rollout-restart-specs");
    let file = write(dir.path(), "echo.toml", &echo());
    let (mut up, _) = start("rollout-restart", &file);
    assert_eq!(echo_app(&up)["spec"]["source"], "file");

    // Applied through the API: a template change rolls through.
    let applied = write(dir.path(), "applied.toml", &echo().replacen("memory = \"64Mi\"", "memory = \"72Mi\"", 1));
    run_ok(up.cli().args(["apply", &applied, "--wait", "--timeout", "40s"]));
    let api_template = echo_app(&up)["spec"]["template"].as_str().unwrap().to_string();

    // Restarted with the same file: the applied spec stays in force.
    assert!(up.restart(), "up stops cleanly");
    let app = wait_for("the app after the restart", Duration::from_secs(20), || {
        let out = up.cli().args(["apps", "--json"]).output().ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v.as_array()?.iter().find(|a| a["app"] == "echo").cloned()
    });
    assert_eq!(app["spec"]["source"], "api", "{app}");
    assert_eq!(app["spec"]["template"], api_template.as_str());
    let spec = get_text(&up.addr, "/v1/apps/echo/spec").unwrap();
    assert!(spec.contains("72Mi"), "{spec}");
    let text = run_ok(up.cli().args(["apps"]));
    assert!(text.contains(" api "), "{text}");
    // Units (replaced, as the restart took their agents) come back on the applied template.
    wait_for("2 units running the applied template", Duration::from_secs(30), || {
        let r = running(&up);
        (r.len() == 2 && r.iter().all(|u| u["template"] == api_template.as_str())).then_some(())
    });
    let units = active(&up);
    assert!(units.iter().all(|u| u["template"] == api_template.as_str()), "nothing on the file's template: {units:?}");

    // A changed file at restart applies.
    std::fs::write(&file, echo().replacen("memory = \"64Mi\"", "memory = \"88Mi\"", 1)).unwrap();
    assert!(up.restart(), "up stops cleanly");
    let app = wait_for("the app after the second restart", Duration::from_secs(20), || {
        let out = up.cli().args(["apps", "--json"]).output().ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v.as_array()?.iter().find(|a| a["app"] == "echo").cloned()
    });
    assert_eq!(app["spec"]["source"], "file", "{app}");
    assert_ne!(app["spec"]["template"], api_template.as_str());
    assert!(get_text(&up.addr, "/v1/apps/echo/spec").unwrap().contains("88Mi"));
}

/// Issue #34 items 2 and 3: an apply after a finished rollout said "no unit's template
/// changed" (the replacements it had made were not counted) and then rolled them all the
/// same; ended units showed their members running, and piled up.
#[test]
fn applies_say_what_they_roll_and_ended_units_show_stopped_members_and_do_not_pile_up() {
    let dir = TempDir::new("rollout-again-specs");
    let (up, _) = start("rollout-again", ECHO);
    let replaced = |up: &Up| {
        let page = metrics_page(&up.addr);
        metric(&page, "flotilla_units_replaced_total", "why=\"its template changed\"").unwrap_or(0.0)
    };
    for (i, memory) in ["72Mi", "88Mi"].into_iter().enumerate() {
        let spec = write(
            dir.path(),
            &format!("{memory}.toml"),
            &echo().replacen("memory = \"64Mi\"", &format!("memory = \"{memory}\""), 1),
        );
        let out = run_ok(up.cli().args(["apply", &spec, "--wait", "--timeout", "45s"]));
        assert!(out.contains("2 unit(s) will roll"), "{memory}: {out}");
        if !lost_a_node(&up) {
            assert_eq!(replaced(&up), 2.0 * (i as f64 + 1.0), "{memory}: what it said is what happened");
        }
    }
    let (status, body) = http(&up.addr, "POST", "/v1/apps/echo/rollback", Some(&up.token()), "");
    assert_eq!(status, 200, "{body}");
    assert!(body["result"].as_str().is_some_and(|r| r.starts_with("2 unit(s) will roll")), "{body}");
    let out = run_ok(up.cli().args(["apply", ECHO, "--wait", "--timeout", "45s"]));
    assert!(out.contains("2 unit(s) will roll"), "{out}");

    // Item 3: twelve units ended in six rollouts. The newest ten are kept; each shows its
    // members stopped, never running at the address of a live unit; `units` lists them
    // only with --all.
    for memory in ["96Mi", "104Mi"] {
        let spec = write(
            dir.path(),
            &format!("{memory}.toml"),
            &echo().replacen("memory = \"64Mi\"", &format!("memory = \"{memory}\""), 1),
        );
        run_ok(up.cli().args(["apply", &spec, "--wait", "--timeout", "45s"]));
    }
    let ended = wait_for("the ended units settled", Duration::from_secs(60), || {
        let ended: Vec<Value> = up.units("echo").into_iter().filter(|u| u["state"] == "terminated").collect();
        (ended.len() == 10 && ended.iter().all(|u| !u["ended_unix_ms"].is_null())).then_some(ended)
    });
    for u in &ended {
        for m in u["members"].as_array().unwrap() {
            assert!(matches!(m["state"].as_str(), Some("stopped" | "failed" | "exited")), "{u}");
            assert!(m["address"].is_null() && m["usage"].is_null(), "{u}");
        }
        assert!(u["placement_note"].is_null(), "{u}");
    }
    let table = run_ok(up.cli().args(["units", "echo"]));
    assert!(
        !table.contains("terminated") && table.contains("10 ended unit(s) not shown (--all shows them)"),
        "{table}"
    );
    let all = run_ok(up.cli().args(["units", "echo", "--all"]));
    assert_eq!(all.matches("terminated").count(), 10, "{all}");
    assert!(all.contains(" ago"), "{all}");
}

#[test]
fn reverting_from_an_unplaceable_spec_leaves_the_matching_units_alone() {
    let dir = TempDir::new("rollout-unplaceable-specs");
    let (up, before) = start("rollout-unplaceable", ECHO);
    let huge = write(dir.path(), "huge.toml", &echo().replacen("cpu = \"250m\"", "cpu = \"4000\"", 1));
    run_ok(up.cli().args(["apply", &huge]));
    let queued = wait_for("a replacement that cannot be placed", Duration::from_secs(20), || {
        up.units("echo").into_iter().find(|u| u["state"] == "queued" && !u["unplaced_reason"].is_null())
    });
    let (status, body) = http(&up.addr, "POST", "/v1/apps/echo/rollback", Some(&up.token()), "");
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"], "no unit's template changed", "{body}");
    wait_for("the queued replacement gone", Duration::from_secs(10), || {
        let units = up.units("echo");
        let r = units.iter().find(|u| u["unit_id"] == queued["unit_id"])?;
        (r["state"] == "terminated").then_some(())
    });
    // For a few passes: the same two units run, and nothing new is queued or started.
    for _ in 0..10 {
        left_alone(&up, &before, 1.0);
        std::thread::sleep(Duration::from_millis(300));
    }
    assert_eq!(echo_app(&up)["spec"]["source"], "rollback");
}
