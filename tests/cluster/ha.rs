//! Schedulers on etcd (a real one, started by the test): one active per app, standbys
//! that take over when its lease lapses, a paused one that wakes up deposed, and etcd
//! itself going away for 10 s.

use std::time::{Duration, Instant};

use flotilla_testkit::{Etcd, Group, Up, free_port, get_text, http, metric, signal, wait_for};
use serde_json::Value;

use crate::common::{ECHO, ledgers_match_units, running};

/// The lease TTL the tests give schedulers: short, so takeovers are quick.
const TTL_S: u64 = 2;

/// A cluster (`flotilla up`: 4 agents, 2 shards, no app), an etcd, and the shards'
/// addresses for standalone schedulers.
struct Ha {
    up: Up,
    etcd: Etcd,
    shards: String,
    procs: Group,
}

/// A standalone scheduler: its pid and API address.
struct Sched {
    pid: u32,
    api: String,
}

impl Ha {
    fn start(name: &str) -> Ha {
        let up = Up::start(name, &["--agents", "4", "--shards", "2"]);
        wait_for("4 alive nodes", Duration::from_secs(30), || (up.nodes().len() == 4).then_some(()));
        let etcd = Etcd::start(name);
        let (_, shards) = http(&up.addr, "GET", "/v1/shards", None, "");
        let shards: Vec<String> =
            shards.as_array().unwrap().iter().map(|s| s["address"].as_str().unwrap().to_string()).collect();
        Ha { up, etcd, shards: shards.join(","), procs: Group::new() }
    }

    /// Starts `flotilla scheduler` for the echo app on the etcd store as `instance`.
    fn scheduler(&mut self, instance: &str) -> Sched {
        let api = format!("127.0.0.1:{}", free_port());
        let ttl = format!("{TTL_S}s");
        let data = self.up.data.to_str().unwrap().to_string();
        let args = [
            "scheduler",
            "--app",
            ECHO,
            "--aggregators",
            &self.shards,
            "--control",
            &self.up.addr,
            "--store",
            &self.etcd.endpoint(),
            "--store-prefix",
            "/ha-test",
            "--lease-ttl",
            &ttl,
            "--instance",
            instance,
            "--listen",
            &api,
        ];
        let log = self.up.data.join(format!("{instance}.err"));
        let pid = self.procs.spawn_with_env(&args, &log, &[("FLOTILLA_DATA", data.as_str())]);
        Sched { pid, api }
    }

    /// The echo app's row in the control plane's `apps`.
    fn app(&self) -> Option<Value> {
        let (status, v) = http(&self.up.addr, "GET", "/v1/apps/echo", None, "");
        (status == 200).then_some(v)
    }

    /// The instance the control plane says is active.
    fn active(&self) -> Option<String> {
        let v = self.app()?;
        (v["scheduler"]["role"] == "active").then(|| v["scheduler"]["instance"].as_str().unwrap_or("").to_string())
    }
}

fn leader_gauge(s: &Sched) -> Option<f64> {
    metric(&get_text(&s.api, "/metrics")?, "flotilla_scheduler_leader", "app=\"echo\"")
}

fn unit_summary(up: &Up) -> Vec<(Value, Value)> {
    up.units("echo").iter().map(|u| (u["unit_id"].clone(), u["state"].clone())).collect()
}

#[test]
fn a_standby_takes_over_a_killed_scheduler_mid_scale_and_places_nothing_twice() {
    let mut ha = Ha::start("ha-kill");
    let a = ha.scheduler("a");
    wait_for("a active with 2 running units", Duration::from_secs(40), || {
        (ha.active().as_deref() == Some("a") && running(&ha.up).len() == 2).then_some(())
    });
    let b = ha.scheduler("b");
    wait_for("b up as a standby", Duration::from_secs(20), || (leader_gauge(&b)? == 0.0).then_some(()));
    let token_a = ha.app().unwrap()["scheduler"]["fencing_token"].as_u64().unwrap();

    // Scale 2 → 6 and kill -9 the active scheduler while it places.
    let (status, body) = http(&ha.up.addr, "PUT", "/v1/apps/echo/scale", Some(&ha.up.token()), r#"{"units": 6}"#);
    assert_eq!(status, 200, "{body}");
    signal(-(a.pid as i32), libc::SIGKILL);
    let killed = Instant::now();

    // The standby holds the lease within the TTL (+1 s, + slack for a loaded machine)
    // and the control plane follows it.
    wait_for("b active", Duration::from_secs(TTL_S + 1 + 12), || (leader_gauge(&b)? == 1.0).then_some(()));
    let took_over = killed.elapsed();
    wait_for("the control plane forwards to b", Duration::from_secs(20), || {
        (ha.active().as_deref() == Some("b")).then_some(())
    });
    let app = ha.app().unwrap();
    assert!(app["scheduler"]["fencing_token"].as_u64().unwrap() > token_a, "the token grew: {app}");

    // It adopts what a placed, finishes the scale, and nothing is held twice.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (live, ledgers) = (running(&ha.up).len(), ledgers_match_units(&ha.up));
        let active = ha.up.units("echo").iter().filter(|u| u["state"] != "terminated").count();
        if live == 6 && ledgers.is_ok() && active == 6 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 60 s: {live} running, {ledgers:?}\nunits: {:?}",
            unit_summary(&ha.up)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // And it stays so (nothing placed late by anyone).
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(running(&ha.up).len(), 6);
    ledgers_match_units(&ha.up).unwrap();
    let text = get_text(&b.api, "/metrics").unwrap_or_default();
    // At least this one takeover (a machine starved past the 2 s TTL can make it lose and
    // win the lease again; what matters is above: nothing placed twice).
    let takeovers = metric(&text, "flotilla_scheduler_takeovers_total", "app=\"echo\"");
    assert!(takeovers.is_some_and(|n| n >= 1.0), "{takeovers:?}");
    eprintln!("takeover after kill -9: {took_over:?}");
}

#[test]
fn a_paused_scheduler_wakes_up_deposed_and_acts_on_nothing() {
    let mut ha = Ha::start("ha-pause");
    let a = ha.scheduler("a");
    wait_for("a active with 2 running units", Duration::from_secs(40), || {
        (ha.active().as_deref() == Some("a") && running(&ha.up).len() == 2).then_some(())
    });
    let b = ha.scheduler("b");
    wait_for("b up as a standby", Duration::from_secs(20), || (leader_gauge(&b)? == 0.0).then_some(()));
    let before: Vec<Value> = running(&ha.up).iter().map(|u| u["unit_id"].clone()).collect();

    // Pause a past its lease: b takes over.
    signal(a.pid as i32, libc::SIGSTOP);
    wait_for("b active", Duration::from_secs(TTL_S + 1 + 12), || (leader_gauge(&b)? == 1.0).then_some(()));
    wait_for("the control plane forwards to b", Duration::from_secs(20), || {
        (ha.active().as_deref() == Some("b")).then_some(())
    });
    // b scales while a is frozen: a's last state is now stale.
    let (status, body) = http(&ha.up.addr, "PUT", "/v1/apps/echo/scale", Some(&ha.up.token()), r#"{"units": 3}"#);
    assert_eq!(status, 200, "{body}");
    wait_for("3 running under b", Duration::from_secs(40), || (running(&ha.up).len() == 3).then_some(()));

    // Wake a: it finds its lease gone before doing anything, and stays a standby.
    signal(a.pid as i32, libc::SIGCONT);
    wait_for("a says it is a standby", Duration::from_secs(20), || {
        let (_, v) = http(&a.api, "GET", "/v1/apps/echo", None, "");
        (v["scheduler"]["role"] == "standby" && leader_gauge(&a)? == 0.0).then_some(())
    });
    // Nothing a did after waking changed anything: b's units all run, a's old ones
    // too, and the ledgers equal them; a sent no commit or release (it counts those it
    // held back) and wrote nothing (a write would have been fenced).
    std::thread::sleep(Duration::from_secs(4));
    let now: Vec<Value> = running(&ha.up).iter().map(|u| u["unit_id"].clone()).collect();
    assert_eq!(now.len(), 3, "{:?}", unit_summary(&ha.up));
    assert!(before.iter().all(|id| now.contains(id)), "nothing a held was released: {before:?} {now:?}");
    ledgers_match_units(&ha.up).unwrap();
    assert_eq!(ha.active().as_deref(), Some("b"));
    let text = get_text(&a.api, "/metrics").unwrap_or_default();
    assert_eq!(metric(&text, "flotilla_scheduler_lease_losses_total", "app=\"echo\""), Some(1.0), "a counted its loss");
    let a_log = std::fs::read_to_string(ha.up.data.join("a.err")).unwrap_or_default();
    assert!(a_log.contains("lost the lease"), "{a_log}");
    // a's API refuses changes, naming why.
    let (status, body) = http(&a.api, "PUT", "/v1/apps/echo/scale", Some(&ha.up.token()), r#"{"units": 1}"#);
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["error"]["code"].as_str(), Some("not_leader"), "{body}");
}

#[test]
fn with_etcd_gone_for_10_s_units_keep_serving_nothing_new_is_placed_and_then_it_resumes() {
    let mut ha = Ha::start("ha-etcd-down");
    let a = ha.scheduler("a");
    wait_for("a active with 2 running units", Duration::from_secs(40), || {
        (ha.active().as_deref() == Some("a") && running(&ha.up).len() == 2).then_some(())
    });
    let addrs: Vec<String> = running(&ha.up)
        .iter()
        .flat_map(|u| u["members"].as_array().cloned().unwrap_or_default())
        .filter_map(|m| m["address"].as_str().map(str::to_string))
        .collect();
    assert_eq!(addrs.len(), 4);

    ha.etcd.kill();
    let down = Instant::now();
    // `apps` says so: the store fails, the scheduler holds no lease.
    let app = wait_for("apps to show the store failing", Duration::from_secs(10), || {
        let v = ha.app()?;
        (v["store"]["healthy"] == false && v["scheduler"]["role"] == "standby").then_some(v)
    });
    assert!(app["store"]["error"].as_str().is_some(), "{app}");
    let table = ha.up.cli().arg("apps").output().unwrap();
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("store failing") && table.contains("standby"), "{table}");
    // Nothing new is placed: a scale is refused (the control plane passes the
    // scheduler's `not_leader` on), not half done.
    let (status, body) = http(&ha.up.addr, "PUT", "/v1/apps/echo/scale", Some(&ha.up.token()), r#"{"units": 3}"#);
    // README promises `not_leader` or `store_unavailable`: a 503, the code kept.
    assert_eq!(status, 503, "{body}");
    assert!(matches!(body["error"]["code"].as_str(), Some("not_leader" | "store_unavailable")), "{body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| m.contains("not the app's active one")), "{body}");
    // What runs keeps serving.
    while down.elapsed() < Duration::from_secs(10) {
        for addr in &addrs {
            assert!(flotilla_testkit::who(addr).is_some(), "{addr} stopped serving while etcd was down");
        }
        assert_eq!(running(&ha.up).len(), 2);
        std::thread::sleep(Duration::from_millis(500));
    }
    ha.etcd.restart();
    // It takes the lease again, the store is healthy, and changes work.
    wait_for("a active again with a healthy store", Duration::from_secs(40), || {
        let v = ha.app()?;
        (v["scheduler"]["role"] == "active" && v["store"]["healthy"] == true).then_some(())
    });
    let (status, body) = http(&ha.up.addr, "PUT", "/v1/apps/echo/scale", Some(&ha.up.token()), r#"{"units": 3}"#);
    assert_eq!(status, 200, "{body}");
    wait_for("3 running units, ledgers equal", Duration::from_secs(40), || {
        (running(&ha.up).len() == 3 && ledgers_match_units(&ha.up).is_ok()).then_some(())
    });
    let text = get_text(&a.api, "/metrics").unwrap_or_default();
    assert_eq!(metric(&text, "flotilla_scheduler_takeovers_total", "app=\"echo\""), Some(2.0));
}
