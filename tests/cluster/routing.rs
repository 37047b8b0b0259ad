//! Route weights, the route proxy, and leaving the routes before a workload exits.

use std::time::{Duration, Instant};

use flotilla_testkit::{Group, Up, alive, flotilla, get_text, http, metric, wait_for, who};
use serde_json::Value;

use crate::common::{ECHO, head_of, running, workload_pid};

#[test]
fn the_route_proxy_follows_the_weights_and_drops_a_draining_node_before_its_workload_exits() {
    let up = Up::start("route", &["--agents", "4", "--shards", "2", "--app", ECHO]);
    let routes = || -> Vec<Value> {
        let (_, r) = http(&up.addr, "GET", "/v1/apps/echo/routes", None, "");
        r["routes"].as_array().cloned().unwrap_or_default()
    };
    wait_for("2 routes with weight", Duration::from_secs(30), || {
        (routes().iter().filter(|r| r["weight"].as_f64() > Some(0.0)).count() == 2 && running(&up).len() == 2)
            .then_some(())
    });
    let mut procs = Group::new();
    let log = up.data.join("route.err");
    let pid = procs.spawn_with_env(
        &["route", "--app", "echo", "--listen", "127.0.0.1:0", "--print-addrs"],
        &log,
        &[("FLOTILLA_ADDR", up.addr.as_str())],
    );
    let addrs = procs.addrs(pid);
    let (proxy, metrics) =
        (addrs["listen"].as_str().unwrap().to_string(), addrs["metrics"].as_str().unwrap().to_string());
    wait_for("the proxy follows both endpoints", Duration::from_secs(20), || {
        metric(&get_text(&metrics, "/metrics")?, "flotilla_route_endpoints", "").filter(|n| *n == 2.0)
    });
    let through = |n: usize| -> Vec<String> {
        (0..n).filter_map(|_| who(&proxy).and_then(|v| v["unit"].as_str().map(str::to_string))).collect()
    };
    let answered = through(40);
    assert_eq!(answered.len(), 40, "every request answered through the proxy");

    // Degrade one head's node (the agent's explicit test health file): its weight drops,
    // smoothly and not below the floor, and the proxy sends it less.
    let units = running(&up);
    let (sick, healthy) = (&units[0], &units[1]);
    let sick_head = head_of(sick);
    let sick_endpoint = sick_head["address"].as_str().unwrap().to_string();
    let test_health = up.agent_dir(sick_head["node_id"].as_str().unwrap()).join("test-health");
    std::fs::write(&test_health, "cpu_steal=0.4").unwrap();
    // Relative to the healthy head: on a busy machine the real load lowers both nodes'
    // health alike, and only the difference steers traffic.
    let healthy_endpoint = head_of(healthy)["address"].as_str().unwrap().to_string();
    let (w, healthy_w) = wait_for("the degraded member's weight drops", Duration::from_secs(30), || {
        let table = routes();
        let weight = |e: &str| table.iter().find(|r| r["endpoint"] == e)?["weight"].as_f64();
        let (w, h) = (weight(&sick_endpoint)?, weight(&healthy_endpoint)?);
        (w < 0.5 * h).then_some((w, h))
    });
    assert!(w >= 0.1, "never below the floor: {w}");
    // The router labels its weights by node (an endpoint's address churns).
    let sick_node = format!("node=\"{}\"", sick_head["node_id"].as_str().unwrap());
    wait_for("the proxy has the new weight", Duration::from_secs(10), || {
        let text = get_text(&metrics, "/metrics")?;
        metric(&text, "flotilla_route_endpoint_weight", &sick_node).filter(|x| *x < 0.5 * healthy_w)
    });
    let answered = through(100);
    let to_sick = answered.iter().filter(|u| *u == sick["unit_id"].as_str().unwrap()).count();
    assert!(to_sick < 25, "the degraded member got {to_sick} of 100");
    std::fs::remove_file(&test_health).unwrap();

    // Drain the other head's node while traffic flows: the proxy drops the endpoint before
    // its workload exits, and no request fails.
    let head = head_of(healthy);
    let (node, endpoint) =
        (head["node_id"].as_str().unwrap().to_string(), head["address"].as_str().unwrap().to_string());
    let workload = workload_pid(&endpoint);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let traffic = {
        let (stop, proxy) = (stop.clone(), proxy.clone());
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0, 0);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if who(&proxy).is_some_and(|v| v["unit"].is_string()) { ok += 1 } else { failed += 1 }
            }
            (ok, failed)
        })
    };
    let data = up.agent_dir(&node);
    let drain = std::thread::spawn(move || flotilla().args(["agent", "drain", "--data"]).arg(data).output().unwrap());
    let t0 = Instant::now();
    let (mut dropped, mut exited) = (None, None);
    while t0.elapsed() < Duration::from_secs(15) && (dropped.is_none() || exited.is_none()) {
        // Out of the table (its series gone) or still in it with weight 0.
        let node_label = format!("node=\"{node}\"");
        if dropped.is_none()
            && get_text(&metrics, "/metrics")
                .is_some_and(|t| metric(&t, "flotilla_route_endpoint_weight", &node_label).is_none_or(|w| w == 0.0))
        {
            dropped = Some(t0.elapsed());
        }
        if exited.is_none() && !alive(workload) {
            exited = Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(drain.join().unwrap().status.success());
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = traffic.join().unwrap();
    let (dropped, exited) = (dropped.expect("the proxy dropped the endpoint"), exited.expect("the workload exited"));
    eprintln!(
        "proxy dropped the endpoint after {dropped:?}, workload exited after {exited:?}; {ok} ok, {failed} failed"
    );
    assert!(dropped < exited, "out of the proxy ({dropped:?}) before the workload exits ({exited:?})");
    assert_eq!(failed, 0, "no request failed during the drain ({ok} answered)");
}

#[test]
fn a_drained_node_leaves_the_routes_before_its_workloads_exit() {
    let up = Up::start("drainroutes", &["--agents", "4", "--shards", "2", "--app", ECHO]);
    let unit = wait_for("2 running units with routes", Duration::from_secs(30), || {
        let (_, r) = http(&up.addr, "GET", "/v1/apps/echo/routes", None, "");
        let routes = r["routes"].as_array()?.clone();
        (routes.len() == 2 && running(&up).len() == 2).then(|| running(&up)[0].clone())
    });
    let head = head_of(&unit);
    let (node, addr) = (head["node_id"].as_str().unwrap().to_string(), head["address"].as_str().unwrap().to_string());
    let pid = workload_pid(&addr);
    let data = up.agent_dir(&node);
    let drain = std::thread::spawn(move || flotilla().args(["agent", "drain", "--data"]).arg(data).output().unwrap());
    let t0 = Instant::now();
    let mut out_of_routes = None;
    let mut exited = None;
    while t0.elapsed() < Duration::from_secs(15) && (out_of_routes.is_none() || exited.is_none()) {
        if out_of_routes.is_none() {
            let (_, r) = http(&up.addr, "GET", "/v1/apps/echo/routes", None, "");
            let serving = r["routes"].as_array().is_some_and(|rs| {
                rs.iter().any(|x| x["endpoint"] == addr.as_str() && x["weight"].as_f64() > Some(0.0))
            });
            if !serving {
                out_of_routes = Some(t0.elapsed());
            }
        }
        if exited.is_none() && !alive(pid) {
            exited = Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(drain.join().unwrap().status.success());
    let (out_of_routes, exited) = (out_of_routes.expect("left the routes"), exited.expect("the workload stopped"));
    eprintln!("out of routes after {out_of_routes:?}, workload exited after {exited:?}");
    assert!(out_of_routes < exited, "routes first ({out_of_routes:?}), then the workload ({exited:?})");
}
