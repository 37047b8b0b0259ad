//! A scheduler run on its own, registered with the control plane, which forwards to it.

use std::process::Stdio;
use std::time::Duration;

use flotilla_testkit::{Group, Up, get_text, http, metric, signal, wait_for};

use crate::common::{ECHO, running};

#[test]
fn a_standalone_scheduler_registers_and_the_control_plane_forwards_to_it() {
    let up = Up::start("standalone", &["--agents", "4", "--shards", "2"]);
    wait_for("4 alive nodes", Duration::from_secs(20), || (up.nodes().len() == 4).then_some(()));
    let (_, shards) = http(&up.addr, "GET", "/v1/shards", None, "");
    let addrs: Vec<String> =
        shards.as_array().unwrap().iter().map(|s| s["address"].as_str().unwrap().to_string()).collect();
    // A named token made before the scheduler starts: it reads the same tokens file.
    let out = flotilla_testkit::run_ok(up.cli().args(["token", "create", "ci", "--scope", "deploy"]));
    let ci = out.lines().last().unwrap().trim().to_string();
    let store = format!("redb:{}", up.data.join("standalone.redb").display());
    let mut scheduler = flotilla_testkit::flotilla()
        .args(["scheduler", "--app", ECHO, "--aggregators", &addrs.join(","), "--control", &up.addr, "--store", &store])
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
    let token = up.token();
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&token), r#"{"units": 3}"#);
    assert_eq!(status, 200, "scale is forwarded: {body}");
    wait_for("3 running units", Duration::from_secs(30), || (running(&up).len() == 3).then_some(()));
    // A router asks the control plane where the app is scheduled and follows its routes there.
    let mut procs = Group::new();
    let route = procs.spawn_with_env(
        &["route", "--app", "echo", "--listen", "127.0.0.1:0", "--print-addrs"],
        &up.data.join("route.err"),
        &[("FLOTILLA_ADDR", up.addr.as_str())],
    );
    let metrics = procs.addrs(route)["metrics"].as_str().unwrap().to_string();
    wait_for("the router follows the standalone scheduler's 3 routes", Duration::from_secs(20), || {
        metric(&get_text(&metrics, "/metrics")?, "flotilla_route_endpoints", "").filter(|n| *n == 3.0)
    });
    // Versions, plans and rollbacks are forwarded too, with the caller's token (the
    // scheduler records its name, and answers 409 itself).
    let spec = std::fs::read_to_string(ECHO).unwrap().replacen("memory = \"64Mi\"", "memory = \"72Mi\"", 1);
    let (status, body) = http(&up.addr, "POST", "/v1/apps/echo/plan", Some(&token), &spec);
    assert_eq!((status, body["in_force"].as_u64()), (200, Some(1)), "{body}");
    assert_eq!(body["changes"][0]["path"], "unit.head.memory", "{body}");
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/spec?check_version=1", Some(&ci), &spec);
    assert_eq!((status, body["version"].as_u64()), (200, Some(2)), "a named token is accepted there too: {body}");
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/scale", Some(&ci), r#"{"units": 3}"#);
    assert_eq!((status, body["error"]["code"].as_str()), (403, Some("forbidden")), "{body}");
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo/spec?check_version=1", Some(&token), &spec);
    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("version_conflict")), "{body}");
    let (status, body) = http(&up.addr, "POST", "/v1/apps/echo/rollback", Some(&token), r#"{"to": 1}"#);
    assert_eq!((status, body["version"].as_u64()), (200, Some(3)), "{body}");
    let (_, v) = http(&up.addr, "GET", "/v1/apps/echo/versions", None, "");
    let sources: Vec<(&str, Option<&str>)> =
        v["versions"].as_array().unwrap().iter().map(|r| (r["source"].as_str().unwrap(), r["by"].as_str())).collect();
    assert_eq!(sources, vec![("rollback", Some("api-token")), ("api", Some("ci")), ("file", None)], "{v}");
    assert!(get_text(&up.addr, "/v1/apps/echo/versions/2").unwrap().contains("72Mi"));
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

/// Issue #35 item 3: a scheduler that cannot reach its shards says so: a bad list is
/// refused at start; unreachable shards are logged (once a streak), named with their
/// error in `apps`, counted, and the scheduler is not ready.
#[test]
fn a_scheduler_that_cannot_reach_its_shards_says_so() {
    let dir = flotilla_testkit::TempDir::new("unreachable-shards");
    let store = format!("redb:{}", dir.join("echo.redb").display());
    let out = flotilla_testkit::flotilla()
        .args(["scheduler", "--app", ECHO, "--aggregators", "127.0.0.1:1,", "--store", &store])
        .output()
        .unwrap();
    let err = flotilla_testkit::stderr(&out);
    assert!(!out.status.success() && err.contains("an empty shard address"), "{err}");

    let api = format!("127.0.0.1:{}", flotilla_testkit::free_port());
    let log = dir.join("scheduler.err");
    let mut procs = Group::new();
    let args = ["scheduler", "--app", ECHO, "--aggregators", "127.0.0.1:1,127.0.0.1:2", "--store", &store];
    procs.spawn_with_env(&[&args[..], &["--listen", &api]].concat(), &log, &[("FLOTILLA_DATA", dir.to_str().unwrap())]);
    let addr = format!("http://{api}");
    let apps = wait_for("the scheduler says what it waits for", Duration::from_secs(20), || {
        std::net::TcpStream::connect(&api).ok()?;
        let (status, body) = http(&api, "GET", "/v1/apps", None, "");
        (status == 200 && body[0]["waiting"].as_str().is_some_and(|w| w.contains("127.0.0.1:2"))).then_some(body)
    });
    let waiting = apps[0]["waiting"].as_str().unwrap();
    assert!(waiting.contains("shard 0 (127.0.0.1:1: ") && waiting.contains("nothing is placed"), "{waiting}");
    let text = String::from_utf8(flotilla_testkit::flotilla().args(["apps", "--addr", &addr]).output().unwrap().stdout)
        .unwrap();
    assert!(text.contains("echo: no view of every shard yet"), "{text}");
    let (status, _) = http(&api, "GET", "/readyz", None, "");
    assert_eq!(status, 503, "not ready");
    // The units it wants exist, queued, saying why.
    let (status, units) = http(&api, "GET", "/v1/apps/echo/units", None, "");
    assert_eq!(status, 200);
    let units = units.as_array().cloned().unwrap_or_default();
    assert_eq!(units.len(), 2, "{units:?}");
    for u in &units {
        assert_eq!(u["state"], "queued", "{u}");
        assert!(u["unplaced_reason"].as_str().is_some_and(|r| r.contains("no view of every shard")), "{u}");
    }
    assert!(
        metric(&get_text(&api, "/metrics").unwrap_or_default(), "flotilla_view_follow_failures_total", "shard=\"1\"")
            .is_some_and(|n| n >= 1.0)
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(logged.contains("cannot follow the shard's view"), "{logged}");
}

/// Issue #42 item 3: one process hosts a directory of apps, each its own scheduler
/// registered with the control plane, scaled on its own; a bad directory is refused
/// before anything starts.
#[test]
fn one_scheduler_process_hosts_a_directory_of_apps() {
    let up = Up::start("apps-dir", &["--agents", "4", "--shards", "2"]);
    wait_for("4 alive nodes", Duration::from_secs(20), || (up.nodes().len() == 4).then_some(()));
    let (_, shards) = http(&up.addr, "GET", "/v1/shards", None, "");
    let addrs: Vec<String> =
        shards.as_array().unwrap().iter().map(|s| s["address"].as_str().unwrap().to_string()).collect();
    let echo = std::fs::read_to_string(ECHO).unwrap();
    let named = |name: &str| {
        echo.replacen("name = \"echo\"", &format!("name = \"{name}\""), 1).replacen("initial = 2", "initial = 1", 1)
    };
    let refused = |dir: &std::path::Path| {
        let out = flotilla_testkit::flotilla()
            .args(["scheduler", "--apps-dir", dir.to_str().unwrap(), "--aggregators", &addrs.join(",")])
            .args(["--store", &format!("redb:{}", dir.join("s.redb").display())])
            .env("FLOTILLA_DATA", &up.data)
            .output()
            .unwrap();
        assert!(!out.status.success());
        flotilla_testkit::stderr(&out)
    };
    let bad = up.data.join("bad-apps");
    std::fs::create_dir_all(&bad).unwrap();
    assert!(refused(&bad).contains("no app spec (*.toml)"));
    std::fs::write(bad.join("one.toml"), named("twin")).unwrap();
    std::fs::write(bad.join("two.toml"), named("twin")).unwrap();
    let err = refused(&bad);
    assert!(err.contains("one.toml") && err.contains("two.toml") && err.contains("\"twin\""), "{err}");

    let dir = up.data.join("apps");
    std::fs::create_dir_all(&dir).unwrap();
    let apps = ["echo-a", "echo-b", "echo-c"];
    for name in apps {
        std::fs::write(dir.join(format!("{name}.toml")), named(name)).unwrap();
    }
    std::fs::write(dir.join("README"), "not a spec").unwrap();
    let store = format!("redb:{}", up.data.join("apps.redb").display());
    // In a group: killed if the test fails before it stops the scheduler itself.
    let mut procs = Group::new();
    let data = up.data.to_str().unwrap();
    let pid = procs.spawn_with_env(
        &["scheduler", "--apps-dir", dir.to_str().unwrap(), "--aggregators", &addrs.join(","), "--control", &up.addr]
            .into_iter()
            .chain(["--store", &store])
            .collect::<Vec<_>>(),
        &up.data.join("scheduler.err"),
        &[("FLOTILLA_DATA", data)],
    );
    // Running units of each app, as the control plane shows them.
    let per_app = |up: &Up| -> std::collections::BTreeMap<&str, usize> {
        apps.iter().map(|a| (*a, up.units(a).iter().filter(|u| u["state"] == "running").count())).collect()
    };
    // Every app registers and runs through the control plane, which keeps no state.
    wait_for("each app runs its unit", Duration::from_secs(40), || {
        per_app(&up).values().all(|c| *c == 1).then_some(())
    });
    // One process, one ask: listing the apps through the control plane asks the
    // process once for all three (its own `/metrics` counts what it served).
    let (_, row) = http(&up.addr, "GET", "/v1/apps/echo-a", None, "");
    let url = row["scheduler_url"].as_str().unwrap().to_string();
    let at = url.trim_start_matches("http://").to_string();
    let served = |route: &str| {
        metric(&get_text(&at, "/metrics").unwrap(), "flotilla_api_requests_total", &format!("route=\"{route}\""))
            .unwrap_or(0.0)
    };
    let (lists, each) = (served("/v1/apps"), served("/v1/apps/{app}"));
    let (_, rows) = http(&up.addr, "GET", "/v1/apps", None, "");
    let listed: Vec<(&str, &str)> = rows
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["unreachable"].is_null())
        .map(|r| (r["app"].as_str().unwrap(), r["scheduler_url"].as_str().unwrap_or("")))
        .collect();
    assert_eq!(listed, apps.map(|a| (a, url.as_str())), "{rows}");
    assert!(served("/v1/apps") > lists, "the process was asked for its list");
    assert_eq!(served("/v1/apps/{app}"), each, "and not app by app");
    // The pool autoscaler's view: each app's demand and unit shape, asked in that view.
    let (_, demand) = http(&up.addr, "GET", "/v1/apps?view=demand", None, "");
    let rows = demand.as_array().unwrap();
    assert_eq!(rows.iter().map(|r| r["app"].as_str().unwrap()).collect::<Vec<_>>(), apps, "{demand}");
    for r in rows {
        assert_eq!(r["queued"]["primary"], 0, "{r}");
        assert!(r["unit_shape"]["members"].as_array().is_some_and(|m| !m.is_empty()), "{r}");
        assert!(r.get("spec").is_none() && r.get("unreachable").is_none(), "only the demand: {r}");
    }
    assert_eq!(served("/v1/apps/{app}"), each);
    let token = up.token();
    let (status, body) = http(&up.addr, "PUT", "/v1/apps/echo-b/scale", Some(&token), r#"{"units": 2}"#);
    assert_eq!(status, 200, "scale is forwarded to the process hosting echo-b: {body}");
    let n = wait_for("echo-b alone runs 2 units", Duration::from_secs(30), || {
        let n = per_app(&up);
        (n["echo-b"] == 2).then_some(n)
    });
    assert_eq!((n["echo-a"], n["echo-c"]), (1, 1), "the others are untouched: {n:?}");
    signal(pid as i32, libc::SIGTERM);
    let exited = wait_for("the scheduler exits", Duration::from_secs(10), || procs.try_wait(pid));
    assert!(exited.success(), "{exited:?}");
}
