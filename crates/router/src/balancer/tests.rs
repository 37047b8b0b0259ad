use super::*;
use rand::SeedableRng;

fn config() -> Config {
    Config { slow_start: Duration::ZERO, ..Config::default() }
}

/// Drives `n` sequential-ish requests through the balancer against endpoints whose
/// latency and outcome `serve` decides; `concurrency` requests are kept in flight.
fn drive(
    b: &Balancer,
    n: usize,
    concurrency: usize,
    mut serve: impl FnMut(&str) -> (Duration, Outcome),
) -> std::collections::HashMap<String, usize> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut now = Instant::now();
    let mut counts = std::collections::HashMap::new();
    let mut in_flight: Vec<(Instant, Pick, Outcome)> = Vec::new();
    for _ in 0..n {
        while in_flight.len() >= concurrency {
            in_flight.sort_by_key(|(t, _, _)| *t);
            let (t, p, o) = in_flight.remove(0);
            now = now.max(t);
            b.finish(p, o, now);
        }
        let p = b.pick(now, &mut rng).expect("an endpoint");
        let (lat, outcome) = serve(&p.endpoint.addr);
        *counts.entry(p.endpoint.addr.clone()).or_insert(0) += 1;
        in_flight.push((now + lat, p, outcome));
        now += Duration::from_micros(500);
    }
    counts
}

/// Open-loop requests, one every `every`, each finished when its latency has passed:
/// per endpoint, the requests served (and of them, probes). `serve` gets the endpoint
/// and the request's number.
fn open_loop(
    b: &Balancer,
    n: usize,
    every: Duration,
    serve: impl Fn(&str, usize) -> Duration,
) -> std::collections::HashMap<String, (usize, usize)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut now = Instant::now();
    let mut counts = std::collections::HashMap::new();
    let mut in_flight: std::collections::BTreeMap<(Instant, usize), Pick> = Default::default();
    for i in 0..n {
        while let Some(entry) = in_flight.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let ((t, _), p) = entry.remove_entry();
            b.finish(p, Outcome::Success, t);
        }
        let p = b.pick(now, &mut rng).expect("an endpoint");
        let c = counts.entry(p.endpoint.addr.clone()).or_insert((0, 0));
        c.0 += 1;
        c.1 += usize::from(p.probe);
        in_flight.insert((now + serve(&p.endpoint.addr, i), i), p);
        now += every;
    }
    counts
}

fn ten() -> Vec<(String, f64)> {
    (0..10).map(|i| (format!("e{i}"), 1.0)).collect()
}

#[test]
fn a_slow_endpoint_gets_less_traffic() {
    let b = Balancer::new(config());
    b.update(&ten(), Instant::now());
    let counts = drive(&b, 20_000, 8, |a| {
        (if a == "e0" { Duration::from_millis(50) } else { Duration::from_millis(10) }, Outcome::Success)
    });
    let slow = counts.get("e0").copied().unwrap_or(0);
    let fair = 20_000 / 10;
    assert!(slow * 5 < fair, "the 5x slow endpoint got {slow} of 20000 (fair share {fair})");
}

#[test]
fn the_first_answer_replaces_the_assumed_latency() {
    let b = Balancer::new(config());
    b.update(&[("e0".into(), 1.0)], Instant::now());
    assert_eq!(b.endpoints()[0].latency(), None);
    let now = Instant::now();
    let p = b.pick(now, &mut rand::rngs::StdRng::seed_from_u64(1)).expect("an endpoint");
    b.finish(p, Outcome::Success, now + Duration::from_millis(4));
    assert_eq!(b.endpoints()[0].latency(), Some(Duration::from_millis(4)));
}

#[test]
fn stray_slow_answers_are_noise_and_three_of_five_a_new_level() {
    let t0 = Instant::now();
    let mut l = Latency::new(t0);
    let ms = |n: u64| t0 + Duration::from_millis(n);
    let level = |l: &Latency| (l.estimate * 1e3).round();
    l.observe(0.010, ms(10));
    assert_eq!(level(&l), 10.0, "the first answer is the estimate");
    for i in 2..=10 {
        l.observe(0.010, ms(i * 10));
    }
    l.observe(0.050, ms(110));
    l.observe(0.010, ms(120));
    l.observe(0.050, ms(130));
    assert_eq!(level(&l), 10.0, "two stray answers in five change nothing");
    l.observe(0.060, ms(140));
    assert_eq!(level(&l), 50.0, "three slow answers of the last five are the new level");
    l.observe(0.010, ms(150));
    assert_eq!(level(&l), 50.0, "one fast answer does not undo it");
    l.observe(0.010, ms(160));
    assert_eq!(level(&l), 10.0, "three fast ones of five do");
}

/// 2 of 10 endpoints 5× slow at 8,000 requests/s for 10 s: about 10 requests in flight
/// on each healthy endpoint, so on cost alone an idle slow one would win every time it
/// is drawn. It serves probes only, at most one per `PROBE_INTERVAL`, and still gets them.
#[test]
fn endpoints_at_the_latency_floor_serve_only_probes() {
    let b = Balancer::new(config());
    b.update(&ten(), Instant::now());
    let counts = open_loop(&b, 80_000, Duration::from_micros(125), |a, _| {
        if a == "e0" || a == "e1" { Duration::from_millis(50) } else { Duration::from_millis(10) }
    });
    for e in ["e0", "e1"] {
        let (served, probes) = counts.get(e).copied().unwrap_or_default();
        // Until three answers show an endpoint is slow it takes its share of the first
        // 150 ms (1,200 requests), about 120.
        assert!(served - probes <= 240, "{e} served {served} requests, only {probes} of them probes");
        assert!(probes <= 10_000 / PROBE_INTERVAL.as_millis() as usize + 1, "{e}: {probes} probes in 10 s");
        assert!(probes >= 10, "{e} was hardly probed: {probes} probes in 10 s");
    }
}

/// e0 is 5× slow for 5 s and then recovers: three probes (0.6 s) show it, and it is back
/// to about its share.
#[test]
fn a_recovered_endpoint_is_back_after_a_probe_or_two() {
    let b = Balancer::new(config());
    b.update(&ten(), Instant::now());
    let every = Duration::from_micros(250);
    // 5 s slow, then 2 s to recover, then 3 s counted.
    let (slow_until, counted_from) = (20_000, 28_000);
    let counted = std::cell::Cell::new(0usize);
    let counts = open_loop(&b, 40_000, every, |a, i| {
        if a == "e0" && i >= counted_from {
            counted.set(counted.get() + 1);
        }
        if a == "e0" && i < slow_until { Duration::from_millis(50) } else { Duration::from_millis(10) }
    });
    let fair = (40_000 - counted_from) / 10;
    assert!(counted.get() * 2 > fair, "e0 got {} of its fair {fair} after recovering ({counts:?})", counted.get());
}

/// Backends answering in a fraction of a millisecond, with the odd slow answer from a
/// busy host: the route weights (1 against 0.4) steer, not the latency noise. With
/// sequential requests P2C always compares the two, so a latency gap beyond the weight
/// ratio would send the light endpoint everything, and here its backend is 3× faster.
#[test]
fn route_weights_steer_sub_millisecond_endpoints_despite_stray_slow_answers() {
    let b = Balancer::new(config());
    let routes = |light: f64| [("heavy".to_string(), 1.0), ("light".to_string(), light)];
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let now = std::cell::Cell::new(Instant::now());
    // One request at a time, as a test client sends them: `n` of them, how many went
    // to the light endpoint in each hundred.
    let mut sequential = |n: usize| {
        let mut windows = vec![0usize; n.div_ceil(100)];
        for i in 0..n {
            let p = b.pick(now.get(), &mut rng).expect("an endpoint");
            let light = p.endpoint.addr == "light";
            // 3 % of answers take 1–6 ms.
            let ms = if rng.random::<f64>() < 0.03 {
                1.0 + 5.0 * rng.random::<f64>()
            } else if light {
                0.15
            } else {
                0.5
            };
            now.set(now.get() + Duration::from_secs_f64(ms / 1000.0));
            b.finish(p, Outcome::Success, now.get());
            now.set(now.get() + Duration::from_micros(50));
            windows[i / 100] += usize::from(light);
        }
        windows
    };
    // Equal weights first, so both have answered.
    b.update(&routes(1.0), now.get());
    let first: usize = sequential(200).iter().sum();
    assert!(first > 0, "the light endpoint answered some of the first 200");
    b.update(&routes(0.4), now.get());
    let windows = sequential(10_000);
    let light: usize = windows.iter().sum();
    let worst = windows.iter().max().copied().unwrap_or(0);
    assert!(light < 1_000, "the light endpoint got {light} of 10000");
    assert!(worst < 25, "a window of 100 requests sent {worst} to the light endpoint ({windows:?})");
}

#[test]
fn a_fast_failing_endpoint_gets_less_traffic() {
    let b = Balancer::new(Config { eject_after: u32::MAX, ..config() });
    b.update(&ten(), Instant::now());
    let counts = drive(&b, 20_000, 8, |a| {
        if a == "e0" {
            (Duration::from_micros(100), Outcome::Failure)
        } else {
            (Duration::from_millis(10), Outcome::Success)
        }
    });
    let bad = counts.get("e0").copied().unwrap_or(0);
    assert!(bad * 5 < 20_000 / 10, "the failing endpoint got {bad} of 20000 although it answers 100x faster");
}

#[test]
fn round_robin_ignores_latency() {
    let b = Balancer::new(Config { policy: Policy::RoundRobin, ..config() });
    b.update(&ten(), Instant::now());
    let counts = drive(&b, 10_000, 8, |a| {
        (if a == "e0" { Duration::from_millis(50) } else { Duration::from_millis(10) }, Outcome::Success)
    });
    assert_eq!(counts.get("e0"), Some(&1000));
}

#[test]
fn weight_zero_takes_no_traffic_and_weights_steer_the_rest() {
    let b = Balancer::new(config());
    let mut routes = ten();
    routes[0].1 = 0.0;
    routes[1].1 = 4.0;
    b.update(&routes, Instant::now());
    let counts = drive(&b, 10_000, 1, |_| (Duration::from_millis(10), Outcome::Success));
    assert_eq!(counts.get("e0"), None, "a draining member gets nothing");
    let heavy = counts.get("e1").copied().unwrap_or(0);
    let other = counts.get("e2").copied().unwrap_or(0);
    assert!(heavy > 2 * other, "weight 4 vs 1: {heavy} vs {other}");
}

#[test]
fn consecutive_failures_eject_with_back_off_but_never_more_than_half() {
    // Round robin keeps offering the failing endpoint (P2C would stop choosing it).
    let b = Balancer::new(Config { policy: Policy::RoundRobin, ..config() });
    let t0 = Instant::now();
    b.update(&[("a".into(), 1.0), ("b".into(), 1.0)], t0);
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let eps = b.endpoints();
    let fail = |t: Instant, rng: &mut rand::rngs::StdRng| loop {
        let p = b.pick(t, rng).unwrap();
        if p.endpoint.addr == "a" {
            return b.finish(p, Outcome::Failure, t);
        }
        b.finish(p, Outcome::Success, t);
    };
    for _ in 0..4 {
        assert_eq!(fail(t0, &mut rng).ejected_for, None);
    }
    assert_eq!(fail(t0, &mut rng).ejected_for, Some(Duration::from_secs(1)));
    for _ in 0..100 {
        let p = b.pick(t0, &mut rng).unwrap();
        assert_eq!(p.endpoint.addr, "b", "a is ejected");
    }
    assert!(eps[0].ejected(t0));
    // Back after its ejection (in slow start); failing again doubles the ejection.
    let t1 = t0 + Duration::from_secs(2);
    assert!(!eps[0].ejected(t1));
    for _ in 0..4 {
        fail(t1, &mut rng);
    }
    assert_eq!(fail(t1, &mut rng).ejected_for, Some(Duration::from_secs(2)));
    // With "a" out, "b" failing is never ejected too (at most half).
    for _ in 0..10 {
        let p = b.pick(t1, &mut rng).unwrap();
        assert_eq!(b.finish(p, Outcome::Failure, t1).ejected_for, None);
    }
}

#[test]
fn slow_start_ramps_a_new_endpoint() {
    let b = Balancer::new(Config { slow_start: Duration::from_secs(10), ..Config::default() });
    let t0 = Instant::now();
    b.update(&[("old".into(), 1.0)], t0);
    let t1 = t0 + Duration::from_secs(60);
    b.update(&[("old".into(), 1.0), ("new".into(), 1.0)], t1);
    let eps = b.endpoints();
    assert!((eps[1].effective_weight(t1, Duration::from_secs(10)) - SLOW_START_FLOOR).abs() < 1e-9);
    let half = eps[1].effective_weight(t1 + Duration::from_secs(5), Duration::from_secs(10));
    assert!((half - 0.5).abs() < 1e-9, "{half}");
    assert_eq!(eps[1].effective_weight(t1 + Duration::from_secs(20), Duration::from_secs(10)), 1.0);
    assert_eq!(eps[0].effective_weight(t1, Duration::from_secs(10)), 1.0);
}

#[test]
fn updates_keep_statistics_and_count_changes() {
    let b = Balancer::new(config());
    let t = Instant::now();
    assert_eq!(b.update(&[("a".into(), 1.0), ("b".into(), 1.0)], t), 2);
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let p = b.pick(t, &mut rng).unwrap();
    let addr = p.endpoint.addr.clone();
    b.finish(p, Outcome::Success, t + Duration::from_millis(200));
    assert_eq!(b.update(&[("a".into(), 1.0), ("b".into(), 0.5)], t), 1);
    let kept = b.endpoints().iter().find(|e| e.addr == addr).unwrap().latency();
    assert_eq!(kept, Some(Duration::from_millis(200)), "the first answer set the latency, and it was kept");
    assert_eq!(b.update(&[("a".into(), 1.0)], t), 1, "b removed");
    assert_eq!(b.endpoints().len(), 1);
    assert!(b.update(&[], t) == 1 && b.pick(t, &mut rng).is_none());
}

#[test]
fn a_split_sends_its_share_to_the_new_version_whatever_its_latency() {
    let b = Balancer::new(config());
    let v = |a: &str, version: &str| (a.to_string(), 1.0, Arc::<str>::from(version));
    let routes = [v("old-1", "t1"), v("old-2", "t1"), v("old-3", "t1"), v("new-1", "t2")];
    b.update_versions(&routes, Some(Split { version: "t2".into(), share: 0.1 }), Instant::now());
    // The new version is 3× slower: still its 10 %, not starved by the old one's median.
    let counts = drive(&b, 20_000, 4, |addr| {
        (if addr.starts_with("new") { Duration::from_millis(30) } else { Duration::from_millis(10) }, Outcome::Success)
    });
    let new = counts.get("new-1").copied().unwrap_or(0) as f64 / 20_000.0;
    assert!((0.08..0.12).contains(&new), "new version got {new}");
    let olds: Vec<usize> = ["old-1", "old-2", "old-3"].iter().map(|a| counts[*a]).collect();
    assert!(olds.iter().all(|&n| n > 4_000), "the old side shares the rest: {olds:?}");
    let counted: u64 = b.endpoints().iter().map(|e| e.traffic.counts().requests).sum();
    assert!(counted > 19_990, "every finished answer is counted per endpoint: {counted}");
    // Nothing of the new version can take traffic: its side falls back to the other.
    let routes = [v("old-1", "t1"), ("new-1".to_string(), 0.0, Arc::from("t2"))];
    b.update_versions(&routes, Some(Split { version: "t2".into(), share: 1.0 }), Instant::now());
    let counts = drive(&b, 1_000, 1, |_| (Duration::from_millis(1), Outcome::Success));
    assert_eq!(counts.get("old-1"), Some(&1_000));
    let unserved = b.unserved.counts();
    assert_eq!((unserved.requests, unserved.errors), (1_000, 1_000), "counted as the new version's errors");
    // Without a split, weights alone decide.
    b.update_versions(&routes, None, Instant::now());
    assert!(b.split().is_none());
}
