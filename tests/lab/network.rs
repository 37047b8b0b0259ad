//! A lossy network, and the control plane cut off from everything it watches.

use std::time::{Duration, Instant};

use flotilla_testkit::{get_text, http};

use flotilla_testkit::lab::{Fed, Options, Watch, cli, settled};

/// The cumulative buckets `(le, count)` of histogram `name` with `label` on a metrics page.
fn buckets(page: &str, name: &str, label: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{");
    page.lines()
        .filter(|l| l.starts_with(&prefix) && l.contains(label))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// The bucket bound at or under which `q` of the samples between two readings fall.
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> (f64, f64) {
    let count = |b: &[(f64, f64)], le: f64| b.iter().find(|(l, _)| *l == le).map_or(0.0, |(_, c)| *c);
    let total = count(after, f64::INFINITY) - count(before, f64::INFINITY);
    let le = after.iter().find(|(le, c)| c - count(before, *le) >= q * total).map_or(f64::INFINITY, |(le, _)| *le);
    (le, total)
}

/// 10 % of the packets every agent sends and receives are lost (and, where the kernel
/// has netem, they wait 50 ms ± 20 ms): no node is Suspect more than once a minute, and
/// the view reaches the scheduler within 250 ms (p99).
#[test]
fn with_ten_percent_loss_on_every_agent_link_no_node_flaps_and_the_view_keeps_up() {
    let mut fed = Fed::start("loss", Options::default());
    let agents: Vec<String> = fed.agents.iter().map(|(h, _)| h.clone()).collect();
    let sched = fed.schedulers[0].1.clone();
    let lag = |fed: &Fed| {
        let page = fed.lab.inside("probe", || get_text(&sched, "/metrics")).unwrap_or_default();
        buckets(&page, "flotilla_view_lag_seconds", "shard=\"0\"")
    };
    let before = lag(&fed);
    let suspects_before = fed.lab.log("shard.err").matches("to=suspect").count();
    let mut delayed = true;
    for a in &agents {
        fed.lab.loss(a, 0.10);
        delayed &= fed.lab.delay(a, 50, 20);
    }
    if !delayed {
        eprintln!("this kernel has no netem: the 50 ms ± 20 ms delay part is skipped (loss only)");
    }
    let watch = Watch::start(&fed);
    let window = Duration::from_secs(60);
    let started = Instant::now();
    // Work keeps changing the view meanwhile, so there are deltas to time.
    for units in [3, 4, 3, 2] {
        let (status, body) = fed.call("PUT", "/v1/apps/echo/scale", &format!(r#"{{"units": {units}}}"#));
        assert_eq!(status, 200, "{body}");
        std::thread::sleep(window / 4);
    }
    let log = fed.lab.log("shard.err");
    let flaps: Vec<(String, usize)> = agents
        .iter()
        .map(|a| (a.clone(), log.lines().filter(|l| l.contains(&format!("node={a} from=alive to=suspect"))).count()))
        .collect();
    let total = log.matches("to=suspect").count() - suspects_before;
    eprintln!("{:?} of 10 % loss: Suspect transitions {flaps:?} ({total} in all)", started.elapsed());
    assert!(flaps.iter().all(|(_, n)| *n <= 1), "a node flapped more than once a minute: {flaps:?}");
    let (p99, samples) = quantile(&before, &lag(&fed), 0.99);
    eprintln!("view lag at the scheduler: p99 ≤ {p99} s over {samples} deltas");
    assert!(samples >= 10.0, "too few deltas to judge: {samples}");
    assert!(p99 <= 0.25, "view lag p99 {p99} s");
    fed.lab.heal();
    settled(&fed, 2, Duration::from_secs(60));
    watch.finish("10 % loss on every agent link");
}

/// The control plane cut off from the shard, the scheduler and the router: the
/// scheduler still places (asked directly), the router still routes with the table it
/// has, and the control plane says which shard and scheduler it cannot reach.
#[test]
fn with_the_control_plane_cut_off_schedulers_and_routes_keep_working() {
    let mut fed = Fed::start("control-cut", Options { extra: &["router"], ..Options::default() });
    let router = format!("{}:8080", fed.lab.addr("router"));
    let control_url = format!("http://{}", fed.control);
    let pid =
        fed.lab.spawn("router", &["route", "--app", "echo", "--listen", &router, "--addr", &control_url], "router.err");
    let through_router = |fed: &Fed| -> usize {
        fed.lab.inside("probe", || (0..20).filter(|_| get_text(&router, "/").is_some()).count())
    };
    fed.wait("the router serves", Duration::from_secs(30), |f| (through_router(f) == 20).then_some(()));
    let (sched_host, sched) = fed.schedulers[0].clone();
    // Through the scheduler, which the control plane's cut does not blind.
    let watch = Watch::through(&fed, &sched);

    fed.lab.partition(&["control"], &["shard", &sched_host, "router"]);
    // The control plane says what it cannot reach.
    fed.wait("the control plane names the shard and the scheduler it cannot reach", Duration::from_secs(30), |f| {
        let shards = f.get(&f.control, "/v1/shards").1;
        let shard_lost = shards.as_array().is_some_and(|s| s.iter().all(|s| s["connected"] == false));
        let apps = f.get(&f.control, "/v1/apps").1;
        let sched_lost =
            apps.as_array().is_some_and(|a| a.iter().any(|r| r["app"] == "echo" && r["unreachable"] == true));
        (shard_lost && sched_lost).then_some(())
    });
    // The scheduler, asked directly, still places; the router still routes.
    let (status, body) =
        fed.lab.inside("probe", || http(&sched, "PUT", "/v1/apps/echo/scale", Some(&fed.token), r#"{"units": 3}"#));
    assert_eq!(status, 200, "{body}");
    fed.wait("3 units running, asked of the scheduler", Duration::from_secs(40), |f| {
        let units = cli(&f.lab.host("probe").ns, &sched, &["units", "echo"]);
        (units.as_array()?.iter().filter(|u| u["state"] == "running").count() == 3).then_some(())
    });
    assert_eq!(through_router(&fed), 20, "the router keeps routing with the table it has");
    assert!(fed.lab.procs().try_wait(pid).is_none(), "the router runs on");

    fed.lab.heal();
    settled(&fed, 3, Duration::from_secs(60));
    watch.finish("the control plane cut off");
}
