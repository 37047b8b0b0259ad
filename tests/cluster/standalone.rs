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
