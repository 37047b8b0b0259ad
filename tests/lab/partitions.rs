//! Partitions between agents and their shard.

use std::time::{Duration, Instant};

use serde_json::Value;

use flotilla_testkit::lab::{Fed, Options, Watch, placements, settled};

#[test]
fn a_federation_runs_with_every_process_on_its_own_host() {
    let fed = Fed::start("hosts", Options::default());
    // Members advertise the address their host reaches the shard from (no flag given).
    for u in fed.running() {
        for m in u["members"].as_array().unwrap() {
            let (node, addr) = (m["node_id"].as_str().unwrap(), m["address"].as_str().unwrap());
            assert!(addr.starts_with(&format!("{}:", fed.lab.addr(node))), "{node} serves at {addr}");
        }
    }
    let watch = Watch::start(&fed);
    std::thread::sleep(Duration::from_secs(2));
    watch.finish("steady state");
    settled(&fed, 2, Duration::from_secs(10));
}

/// A domain's hosts cut from their shard for longer than the agents' QUIC idle timeout:
/// its nodes go Unknown, not Dead (most of the domain is silent at once); nothing is
/// replaced within the schedulers' unknown grace; the routes stop sending there; a node
/// cut off 3 s longer than the rest of its domain is not declared Dead meanwhile;
/// after the heal the same units run, once each.
#[test]
fn a_domain_cut_from_its_shard_goes_unknown_and_nothing_is_doubled() {
    let fed = Fed::start("domain-cut", Options { per_domain: 3, ..Options::default() });
    let (status, body) = fed.call("PUT", "/v1/apps/echo/scale", r#"{"units": 6}"#);
    assert_eq!(status, 200, "{body}");
    fed.wait("6 running units", Duration::from_secs(60), |f| (f.running().len() == 6).then_some(()));
    let before = placements(&fed.units());
    let cut = fed.domain("zone-b");
    let on_b = |units: &[Value]| -> usize {
        units
            .iter()
            .filter(|u| {
                u["members"]
                    .as_array()
                    .is_some_and(|ms| ms.iter().any(|m| cut.contains(&m["node_id"].as_str().unwrap_or(""))))
            })
            .count()
    };
    assert!(on_b(&fed.units()) > 0, "zone-b holds units: {before:#?}");

    let watch = Watch::start(&fed);
    let started = Instant::now();
    fed.lab.partition(&cut, &["shard"]);
    fed.wait("zone-b's nodes Unknown", Duration::from_secs(20), |f| {
        cut.iter().all(|h| f.status(h) == "unknown").then_some(())
    });
    eprintln!("zone-b Unknown {:?} after the cut", started.elapsed());
    // The routes send nothing to members on Unknown nodes.
    fed.wait("no route to zone-b", Duration::from_secs(10), |f| {
        let routes = f.cli(&["routes", "echo"]);
        let routes = routes["routes"].as_array()?;
        (!routes.is_empty()
            && routes
                .iter()
                .all(|r| !cut.contains(&r["node_id"].as_str().unwrap_or("")) || r["weight"].as_f64() == Some(0.0)))
        .then_some(())
    });
    // Past the agents' QUIC idle timeout (10 s): they lose their connection too.
    while started.elapsed() < Duration::from_secs(25) {
        for h in &cut {
            let s = fed.status(h);
            assert!(s == "unknown", "{h} is {s} while cut off (not dead)");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert_eq!(placements(&fed.units()), before, "nothing is replaced within the unknown grace");
    // The link comes back, but not every agent at once: one is still in its registration
    // back-off (up to 15 s) when the rest of its domain is heard again. By the count the
    // domain is no partition then; the late node was cut off all the same, and stays
    // Unknown while it may still register (it used to be Dead within a liveness check).
    let (late, early) = cut.split_last().expect("zone-b has hosts");
    fed.lab.reconnect(early, &["shard"]);
    fed.wait("the rest of zone-b Alive again", Duration::from_secs(30), |f| {
        early.iter().all(|h| f.status(h) == "alive").then_some(())
    });
    let heard = Instant::now();
    while heard.elapsed() < Duration::from_secs(3) {
        let s = fed.status(late);
        assert_eq!(s, "unknown", "{late}, still cut off while its domain is back, is {s}");
        std::thread::sleep(Duration::from_millis(500));
    }
    fed.lab.heal();
    let took = settled(&fed, 6, Duration::from_secs(60));
    eprintln!("settled {took:?} after the heal");
    watch.finish("a domain cut from its shard");
    assert_eq!(placements(&fed.units()), before, "the same units and members, on the same nodes");
}

/// One-way partitions. What an agent sends its shard is dropped: its heartbeats stop
/// arriving, it is declared Dead and its units replaced; after the heal it registers
/// again and stops what was replaced. What the shard sends an agent is dropped: its
/// heartbeats still arrive (it stays Alive) until its QUIC connection times out; then
/// it is given up the same way. Either way nothing runs twice once healed.
#[test]
fn one_way_partitions_lose_nothing_and_double_nothing() {
    let fed = Fed::start("one-way", Options::default());
    let (status, body) = fed.call("PUT", "/v1/apps/echo/scale", r#"{"units": 4}"#);
    assert_eq!(status, 200, "{body}");
    fed.wait("4 running units", Duration::from_secs(60), |f| (f.running().len() == 4).then_some(()));
    let watch = Watch::start(&fed);

    // The agent's sends dropped.
    fed.lab.cut(&["a1"], &["shard"]);
    fed.wait("a1 Dead", Duration::from_secs(20), |f| (f.status("a1") == "dead").then_some(()));
    fed.lab.heal();
    settled(&fed, 4, Duration::from_secs(60));
    assert!(
        fed.lab.log("a1.err").contains("re-registering") || fed.lab.log("a1.err").matches("registered").count() > 1
    );

    // The shard's sends dropped: heartbeats still arrive for a while.
    let cut = Instant::now();
    fed.lab.cut(&["shard"], &["a2"]);
    std::thread::sleep(Duration::from_secs(8));
    assert_eq!(fed.status("a2"), "alive", "a2's heartbeats still arrive");
    fed.wait("a2 given up once its connection times out", Duration::from_secs(60), |f| {
        (f.status("a2") == "dead").then_some(())
    });
    eprintln!("a2 dead {:?} after the shard's sends to it were cut", cut.elapsed());
    fed.lab.heal();
    settled(&fed, 4, Duration::from_secs(60));
    watch.finish("one-way partitions");
}
