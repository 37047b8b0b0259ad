use super::*;
use crate::spec::AppSpec;
use flotilla_core::latency::bucket;

const ECHO: &str = include_str!("../../../../examples/echo.toml");

fn rollout(extra: &str) -> Rollout {
    let text = format!(
        "{ECHO}\n[rollout]\nstrategy = \"canary\"\nsteps = [\"10%\", \"50%\", \"100%\"]\nstep_interval = \"10s\"\n{extra}\
         [rollout.analysis]\nmax_error_rate = 0.05\nmax_p99_ratio = 1.5\nmin_requests = 100\n"
    );
    AppSpec::parse(&text).unwrap().rollout
}

fn report(router: &str, sides: &[(&str, u64, u64, f64)]) -> v1::TrafficReport {
    let versions = sides
        .iter()
        .map(|&(version, requests, errors, seconds)| {
            let mut latency = vec![0; BUCKETS];
            latency[bucket(seconds)] = requests;
            v1::VersionTraffic { version: version.into(), requests, errors, latency }
        })
        .collect();
    v1::TrafficReport { app: "echo".into(), router: router.into(), versions }
}

fn book(sides: &[(&str, u64, u64, f64)]) -> TrafficBook {
    let mut b = TrafficBook::default();
    b.start(Some("new"));
    assert!(b.add(&report("r1", sides)));
    b
}

fn at_step(step: u32, started: u64) -> CanaryProgress {
    CanaryProgress { step, step_started_unix_ms: Some(started), ..Default::default() }
}

#[test]
fn units_and_share_follow_the_steps() {
    let r = rollout("canary = 2\n");
    assert_eq!((units_for(&r, 0, 10), units_for(&r, 1, 10), units_for(&r, 2, 10)), (2, 5, 10));
    assert_eq!(units_for(&r, 0, 1), 1, "never more than desired");
    let mut p = CanaryProgress::default();
    assert_eq!(share(&r, &p), 0.0, "nothing before the first step's units run");
    p.step_started_unix_ms = Some(1);
    assert_eq!(share(&r, &p), 0.1);
    p = CanaryProgress { step: 1, ..Default::default() };
    assert_eq!(share(&r, &p), 0.1, "the step before's while the units come up");
    assert!(shifting(&r, Some(&p)) && !shifting(&r, Some(&CanaryProgress { promoted: true, ..p })));
}

#[test]
fn a_step_passes_waits_or_fails_on_its_numbers() {
    let r = rollout("");
    let good = book(&[("new", 200, 2, 0.010), ("old", 2000, 10, 0.010)]);
    // Within the step: no verdict yet, unless errors already break it.
    assert_eq!(judge(&r, &at_step(0, 0), &good, 5_000), Verdict::Hold(None));
    assert_eq!(judge(&r, &at_step(0, 0), &good, 10_000), Verdict::Next);
    assert_eq!(judge(&r, &at_step(2, 0), &good, 10_000), Verdict::Promote);
    let manual = rollout("auto_promote = false\n");
    let Verdict::Hold(Some(why)) = judge(&manual, &at_step(2, 0), &good, 10_000) else { panic!() };
    assert!(why.contains("flotilla rollout promote"), "{why}");

    let errors = book(&[("new", 200, 40, 0.010), ("old", 2000, 0, 0.010)]);
    let Verdict::Abort(why) = judge(&r, &at_step(0, 0), &errors, 1_000) else { panic!("fails at once") };
    assert!(why.contains("error rate 20.0%") && why.contains("max_error_rate 5.0%"), "{why}");
    assert!(why.contains("new: 200 requests, 40 errors"), "the numbers: {why}");

    let slow = book(&[("new", 200, 0, 0.030), ("old", 2000, 0, 0.010)]);
    assert_eq!(judge(&r, &at_step(0, 0), &slow, 9_999), Verdict::Hold(None), "latency is judged at the step's end");
    let Verdict::Abort(why) = judge(&r, &at_step(0, 0), &slow, 10_000) else { panic!("3× slower") };
    assert!(why.contains("max_p99_ratio 1.5"), "{why}");

    // Sub-millisecond jitter is not a regression.
    let fast = book(&[("new", 200, 0, 0.0006), ("old", 2000, 0, 0.0002)]);
    assert_eq!(judge(&r, &at_step(0, 0), &fast, 10_000), Verdict::Next);

    let quiet = book(&[("new", 12, 0, 0.010)]);
    let Verdict::Hold(Some(why)) = judge(&r, &at_step(0, 0), &quiet, 60_000) else { panic!("waits, not blind") };
    assert!(why.contains("min_requests: 12 of 100"), "{why}");
    let mut none = TrafficBook::default();
    none.start(Some("new"));
    let Verdict::Hold(Some(why)) = judge(&r, &at_step(0, 0), &none, 60_000) else { panic!() };
    assert!(why.contains("no router has reported"), "{why}");
}

#[test]
fn a_step_without_stable_traffic_is_compared_with_the_step_before() {
    let r = rollout("");
    let all_new = book(&[("new", 500, 0, 0.030)]);
    let mut p = at_step(2, 0);
    assert_eq!(judge(&r, &p, &all_new, 10_000), Verdict::Promote, "nothing to compare with: errors alone");
    p.stable_p99_us = Some(10_000);
    assert!(matches!(judge(&r, &p, &all_new, 10_000), Verdict::Abort(_)));
    // A few stable requests routed before the routers took the split say nothing: the
    // step before's p99 is the reference.
    let stragglers = book(&[("new", 500, 0, 0.030), ("old", 20, 0, 0.030)]);
    assert!(matches!(judge(&r, &p, &stragglers, 10_000), Verdict::Abort(_)), "30 ms against the 10 ms before");
    p.stable_p99_us = Some(30_000);
    let slow_stragglers = book(&[("new", 500, 0, 0.030), ("old", 20, 0, 0.001)]);
    assert_eq!(judge(&r, &p, &slow_stragglers, 10_000), Verdict::Promote);
}

#[test]
fn routers_add_up_and_bad_reports_are_refused() {
    let mut b = TrafficBook::default();
    assert!(!b.add(&report("r1", &[("new", 5, 0, 0.01)])), "no step is counted");
    b.start(Some("new"));
    b.add(&report("r1", &[("new", 5, 1, 0.01), ("old", 50, 0, 0.01), ("older", 5, 0, 0.01)]));
    b.add(&report("r2", &[("new", 5, 1, 0.01)]));
    assert_eq!((b.canary.requests, b.canary.errors, b.stable.requests, b.routers()), (10, 2, 55, 2));
    b.start(Some("new"));
    assert_eq!((b.canary.requests, b.routers()), (0, 0), "each step counts from nothing");

    assert!(validate(&report("r1", &[("new", 5, 1, 0.01)])).is_ok());
    let mut r = report("r1", &[("new", 5, 9, 0.01)]);
    assert!(validate(&r).unwrap_err().contains("9 errors of 5"));
    r = report("r1", &[("new", 5, 0, 0.01)]);
    r.versions[0].latency.pop();
    assert!(validate(&r).unwrap_err().contains("exactly 100"));
    r = report("r1", &[("new", 5, 0, 0.01)]);
    r.versions[0].latency[0] += 1;
    assert!(validate(&r).unwrap_err().contains("do not add up"));
    assert!(validate(&report("", &[])).unwrap_err().contains("router"));
    r = report("r1", &[("new", MAX_REPORT_REQUESTS + 1, 0, 0.01)]);
    assert!(validate(&r).unwrap_err().contains("at most"));
}
