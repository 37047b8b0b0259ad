//! Schedulers on etcd, with the active one cut from etcd (but not from its shard or the
//! control plane): it is deposed, its standby takes over, and it rejoins as a standby.

use std::time::{Duration, Instant};

use flotilla_testkit::{get_text, metric};

use flotilla_testkit::lab::{Fed, LEASE_TTL, Options, Watch, settled};

/// The role (`active`, `standby`) scheduler `api` gives itself for the echo app.
fn role(fed: &Fed, api: &str) -> String {
    let (_, app) = fed.get(api, "/v1/apps/echo");
    app["scheduler"]["role"].as_str().unwrap_or("").to_string()
}

fn counter(fed: &Fed, addr: &str, name: &str) -> f64 {
    let page = fed.lab.inside("probe", || get_text(addr, "/metrics")).unwrap_or_default();
    metric(&page, name, "app=\"echo\"").unwrap_or(0.0)
}

#[test]
fn the_active_scheduler_cut_from_etcd_is_deposed_and_the_standby_takes_over() {
    let fed = Fed::start("sched-etcd", Options { schedulers: 2, etcd: true, ..Options::default() });
    let (active, standby) = fed.wait("one active scheduler and one standby", Duration::from_secs(30), |f| {
        let roles: Vec<String> = f.schedulers.iter().map(|(_, api)| role(f, api)).collect();
        match (roles[0].as_str(), roles[1].as_str()) {
            // A scheduler that has never been active does not serve the app yet.
            ("active", "standby" | "") => Some((f.schedulers[0].clone(), f.schedulers[1].clone())),
            ("standby" | "", "active") => Some((f.schedulers[1].clone(), f.schedulers[0].clone())),
            _ => None,
        }
    });
    let watch = Watch::start(&fed);
    let cut = Instant::now();
    fed.lab.partition(&[&active.0], &["etcd"]);
    fed.wait("the standby active", Duration::from_secs(30), |f| (role(f, &standby.1) == "active").then_some(()));
    let took = cut.elapsed();
    eprintln!("{} took over {took:?} after {} was cut from etcd (TTL {LEASE_TTL:?})", standby.0, active.0);
    // The promise is TTL + 2 s; the slack is for a loaded 2-core machine.
    assert!(took < LEASE_TTL + Duration::from_secs(2) + Duration::from_secs(6), "took {took:?}");
    fed.wait("the cut-off scheduler stands down", Duration::from_secs(20), |f| {
        (role(f, &active.1) != "active").then_some(())
    });
    // The control plane forwards to the new one: a scale goes through while the old
    // one, still reaching the shard and the control plane, acts on nothing.
    fed.wait("the control plane forwards to the new scheduler", Duration::from_secs(20), |f| {
        let apps = f.cli(&["apps"]);
        (apps[0]["scheduler"]["instance"] == standby.0.as_str()).then_some(())
    });
    let (status, body) = fed.call("PUT", "/v1/apps/echo/scale", r#"{"units": 3}"#);
    assert_eq!(status, 200, "{body}");
    let (status, body) = fed.lab.inside("probe", || {
        flotilla_testkit::http(&active.1, "PUT", "/v1/apps/echo/scale", Some(&fed.token), r#"{"units": 1}"#)
    });
    assert_eq!((status, body["error"]["code"].as_str()), (503, Some("not_leader")), "{body}");
    fed.wait("3 running units", Duration::from_secs(40), |f| (f.running().len() == 3).then_some(()));

    fed.lab.heal();
    fed.wait("the old scheduler back as a standby", Duration::from_secs(30), |f| {
        (role(f, &active.1) == "standby").then_some(())
    });
    settled(&fed, 3, Duration::from_secs(60));
    watch.finish("the active scheduler cut from etcd");
    assert_eq!(role(&fed, &standby.1), "active", "the new scheduler stays active");
    fed.wait("the old one counted its loss", Duration::from_secs(10), |f| {
        (counter(f, &active.1, "flotilla_scheduler_lease_losses_total") == 1.0).then_some(())
    });
    assert!(fed.lab.log(&format!("{}.err", active.0)).contains("lost the lease"));
    eprintln!(
        "writes the old scheduler's store refused as fenced: {}",
        counter(&fed, &active.1, "flotilla_store_fenced_total")
    );
}
