//! The endpoint choice (docs/architecture.md §10): weighted power of two choices on peak-EWMA latency.
//!
//! Two endpoints are sampled with probability proportional to their effective weight (the
//! route weight the scheduler publishes, ramped up during slow start) times a speed factor
//! `(median latency / their latency)^4`, floored at 1 %, and the request goes to the one with
//! the lower cost:
//!
//! ```text
//! cost = peak_ewma_rtt × (in_flight + 1) × (1 + ERROR_PENALTY × error_ewma) / effective_weight
//! ```
//!
//! - Peak EWMA jumps to a slower sample at once and decays toward faster ones (τ = `decay`),
//!   so a node that turns slow loses traffic within a request or two.
//! - `in_flight` makes queueing visible before any response comes back.
//! - Errors are penalised on top of latency: a node that fails fast must not look healthy.
//! - Passive outlier ejection: `eject_after` consecutive failures take an endpoint out for
//!   `base_ejection × 2^(n-1)` (capped), never more than half of the endpoints at once; it
//!   comes back in slow start.
//! - Slow start: a new (or returning) endpoint's weight ramps linearly over `slow_start`
//!   from 10 %, so it is not flooded while its caches are cold.
//!
//! Uniform two-choice sampling alone is not enough: with 2 of 10 endpoints 5× slower it still
//! offers a slow endpoint as a candidate in a third of the picks, and it wins whenever the
//! healthy candidate happens to be busy; every such request lands in the tail. Measured with
//! `flotilla-loadtest routing`: plain weighted P2C sent 3.9 % of requests to the slow
//! endpoints (p99 2.5× the all-healthy run), the speed factor 0.4 % (p99 1.08×).
//!
//! The balancer is a plain data structure: callers pass the time, so tests are exact.

use flotilla_core::LockExt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use rand::Rng;

/// How much a full error rate multiplies the cost.
const ERROR_PENALTY: f64 = 20.0;
/// Decay of the error EWMA.
const ERROR_DECAY: Duration = Duration::from_secs(5);
/// Least share of its weight an endpoint slower than the median keeps when candidates are
/// drawn (so it is still probed and can show that it recovered).
const LATENCY_FLOOR: f64 = 0.01;
/// Weight at the start of slow start, as a fraction of the full weight.
const SLOW_START_FLOOR: f64 = 0.1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Weighted P2C on peak-EWMA latency (the default).
    PeakEwma,
    /// Plain round robin over the endpoints with a weight above 0 (for comparison).
    RoundRobin,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub policy: Policy,
    /// Latency assumed for an endpoint before its first response.
    pub default_rtt: Duration,
    /// Time constant of the latency EWMA.
    pub decay: Duration,
    pub eject_after: u32,
    pub base_ejection: Duration,
    pub max_ejection: Duration,
    pub slow_start: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::PeakEwma,
            default_rtt: Duration::from_millis(30),
            decay: Duration::from_secs(10),
            eject_after: 5,
            base_ejection: Duration::from_secs(1),
            max_ejection: Duration::from_secs(30),
            slow_start: Duration::from_secs(10),
        }
    }
}

/// What the balancer knows about one endpoint.
#[derive(Debug)]
pub struct Endpoint {
    pub addr: String,
    /// The route weight (the scheduler's prior; 1.0 for a fixed backend list).
    weight: Mutex<f64>,
    in_flight: AtomicU32,
    stats: Mutex<Stats>,
}

#[derive(Debug, Clone)]
struct Stats {
    rtt_ewma_s: f64,
    rtt_at: Instant,
    error_ewma: f64,
    error_at: Instant,
    consecutive_failures: u32,
    ejections: u32,
    ejected_until: Option<Instant>,
    /// Since when the endpoint serves (added, or back from an ejection): slow start.
    serving_since: Instant,
}

/// How a request ended, for the endpoint's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
}

impl Endpoint {
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn weight(&self) -> f64 {
        *self.weight.lock_or_recover()
    }

    pub fn rtt_ewma(&self) -> Duration {
        Duration::from_secs_f64(self.stats.lock_or_recover().rtt_ewma_s)
    }

    fn ejected(&self, now: Instant) -> bool {
        self.stats.lock_or_recover().ejected_until.is_some_and(|t| now < t)
    }

    /// Route weight × slow-start ramp; 0 while ejected.
    fn effective_weight(&self, now: Instant, slow_start: Duration) -> f64 {
        let w = self.weight();
        let s = self.stats.lock_or_recover();
        if s.ejected_until.is_some_and(|t| now < t) {
            return 0.0;
        }
        let age = now.saturating_duration_since(s.serving_since).as_secs_f64();
        let ramp =
            if slow_start.is_zero() { 1.0 } else { (age / slow_start.as_secs_f64()).clamp(SLOW_START_FLOOR, 1.0) };
        w * ramp
    }

    fn cost(&self, now: Instant, slow_start: Duration) -> f64 {
        let weight = self.effective_weight(now, slow_start);
        let s = self.stats.lock_or_recover();
        let errors = decayed(s.error_ewma, now.saturating_duration_since(s.error_at), ERROR_DECAY);
        let load = f64::from(self.in_flight()) + 1.0;
        s.rtt_ewma_s * load * (1.0 + ERROR_PENALTY * errors) / weight.max(1e-9)
    }
}

fn decayed(value: f64, elapsed: Duration, tau: Duration) -> f64 {
    value * (-elapsed.as_secs_f64() / tau.as_secs_f64().max(1e-9)).exp()
}

/// The endpoint set and the choice between them. Cheap to share: the set is swapped
/// atomically; each endpoint keeps its own small statistics.
pub struct Balancer {
    config: Config,
    endpoints: ArcSwap<Vec<Arc<Endpoint>>>,
    next: AtomicU32,
}

/// A request in flight on an endpoint; report how it ended with [`Pick::finish`].
/// Dropped unfinished (the caller gave up), it counts as neither success nor failure.
pub struct Pick {
    pub endpoint: Arc<Endpoint>,
    started: Instant,
    done: bool,
}

impl Drop for Pick {
    fn drop(&mut self) {
        if !self.done {
            self.endpoint.in_flight.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// What [`Balancer::finish`] changed, for metrics.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Finished {
    pub ejected_for: Option<Duration>,
}

impl Balancer {
    pub fn new(config: Config) -> Self {
        Balancer { config, endpoints: ArcSwap::from_pointee(Vec::new()), next: AtomicU32::new(0) }
    }

    pub fn config(&self) -> &Config {
        &self.config
    }

    pub fn endpoints(&self) -> Arc<Vec<Arc<Endpoint>>> {
        self.endpoints.load_full()
    }

    /// Replaces the endpoint set with `(addr, weight)` pairs. Endpoints that stay keep
    /// their statistics; new ones start in slow start. Returns how many weights changed.
    pub fn update(&self, routes: &[(String, f64)], now: Instant) -> usize {
        let old = self.endpoints.load_full();
        let mut changed = 0;
        let mut next = Vec::with_capacity(routes.len());
        for (addr, weight) in routes {
            let weight = if weight.is_finite() { weight.max(0.0) } else { 0.0 };
            match old.iter().find(|e| &e.addr == addr) {
                Some(e) => {
                    let mut w = e.weight.lock_or_recover();
                    if *w != weight {
                        *w = weight;
                        changed += 1;
                    }
                    drop(w);
                    next.push(e.clone());
                }
                None => {
                    changed += 1;
                    next.push(Arc::new(Endpoint {
                        addr: addr.clone(),
                        weight: Mutex::new(weight),
                        in_flight: AtomicU32::new(0),
                        stats: Mutex::new(Stats {
                            rtt_ewma_s: self.config.default_rtt.as_secs_f64(),
                            rtt_at: now,
                            error_ewma: 0.0,
                            error_at: now,
                            consecutive_failures: 0,
                            ejections: 0,
                            ejected_until: None,
                            serving_since: now,
                        }),
                    }));
                }
            }
        }
        changed += old.iter().filter(|e| !routes.iter().any(|(a, _)| a == &e.addr)).count();
        self.endpoints.store(Arc::new(next));
        changed
    }

    /// Chooses an endpoint for one request, or `None` when no endpoint may take traffic.
    pub fn pick(&self, now: Instant, rng: &mut impl Rng) -> Option<Pick> {
        let eps = self.endpoints.load();
        let slow = self.config.slow_start;
        let chosen = match self.config.policy {
            Policy::RoundRobin => {
                let live: Vec<&Arc<Endpoint>> = eps.iter().filter(|e| e.weight() > 0.0 && !e.ejected(now)).collect();
                if live.is_empty() {
                    return None;
                }
                let i = self.next.fetch_add(1, Ordering::Relaxed) as usize % live.len();
                live[i].clone()
            }
            Policy::PeakEwma => {
                // Candidates are drawn by weight × (median latency / their latency)^4, floored:
                // a 5× slower endpoint is offered ~100× less often, so it rarely even gets to
                // compete, yet is still probed now and then and can show it recovered.
                let rtts: Vec<f64> = eps.iter().map(|e| e.rtt_ewma().as_secs_f64()).collect();
                let mut scratch = rtts.clone();
                let mid = scratch.len() / 2;
                let median =
                    if scratch.is_empty() { 0.0 } else { *scratch.select_nth_unstable_by(mid, f64::total_cmp).1 };
                let weights: Vec<f64> = eps
                    .iter()
                    .zip(&rtts)
                    .map(|(e, rtt)| {
                        let speed = (median / rtt.max(1e-9)).powi(4).clamp(LATENCY_FLOOR, 1.0);
                        e.effective_weight(now, slow) * speed
                    })
                    .collect();
                let total: f64 = weights.iter().sum();
                if total <= 0.0 {
                    return None;
                }
                let a = sample(&weights, total, rng);
                let b = if weights.iter().filter(|w| **w > 0.0).count() > 1 {
                    // A second, distinct candidate.
                    let without = total - weights[a];
                    let mut w2 = weights.clone();
                    w2[a] = 0.0;
                    sample(&w2, without, rng)
                } else {
                    a
                };
                let (ea, eb) = (&eps[a], &eps[b]);
                if eb.cost(now, slow) < ea.cost(now, slow) { eb.clone() } else { ea.clone() }
            }
        };
        chosen.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Pick { endpoint: chosen, started: now, done: false })
    }

    /// Records how a picked request ended.
    pub fn finish(&self, mut pick: Pick, outcome: Outcome, now: Instant) -> Finished {
        pick.done = true;
        let e = &pick.endpoint;
        e.in_flight.fetch_sub(1, Ordering::Relaxed);
        let rtt = now.saturating_duration_since(pick.started).as_secs_f64();
        let mut out = Finished::default();
        let live = self.endpoints.load();
        let ejected_now = live.iter().filter(|x| x.ejected(now)).count();
        let mut s = e.stats.lock_or_recover();
        // Peak EWMA: a slower sample replaces the estimate at once.
        let prev = s.rtt_ewma_s;
        let w =
            (-now.saturating_duration_since(s.rtt_at).as_secs_f64() / self.config.decay.as_secs_f64().max(1e-9)).exp();
        s.rtt_ewma_s = if rtt > prev { rtt } else { prev * w + rtt * (1.0 - w) };
        s.rtt_at = now;
        let failed = outcome == Outcome::Failure;
        let errors = decayed(s.error_ewma, now.saturating_duration_since(s.error_at), ERROR_DECAY);
        // Each failure adds a fixed share, so a burst of fast failures shows at once.
        s.error_ewma = if failed { errors + (1.0 - errors) * 0.25 } else { errors };
        s.error_at = now;
        if failed {
            s.consecutive_failures += 1;
            let half = live.len() / 2;
            if s.consecutive_failures >= self.config.eject_after && ejected_now < half.max(1) && live.len() > 1 {
                s.ejections += 1;
                let factor = 1u32 << (s.ejections - 1).min(16);
                let d = self.config.base_ejection.saturating_mul(factor).min(self.config.max_ejection);
                s.ejected_until = Some(now + d);
                s.serving_since = now + d;
                s.consecutive_failures = 0;
                out.ejected_for = Some(d);
            }
        } else {
            s.consecutive_failures = 0;
            if s.ejected_until.is_some_and(|t| now >= t) {
                // Healthy again after its ejection: the back-off resets slowly.
                s.ejections = s.ejections.saturating_sub(1);
                s.ejected_until = None;
            }
        }
        out
    }
}

/// Index drawn with probability proportional to `weights` (summing to `total` > 0).
fn sample(weights: &[f64], total: f64, rng: &mut impl Rng) -> usize {
    let mut x = rng.random::<f64>() * total;
    for (i, w) in weights.iter().enumerate() {
        if *w <= 0.0 {
            continue;
        }
        if x < *w {
            return i;
        }
        x -= w;
    }
    weights.iter().rposition(|w| *w > 0.0).unwrap_or(0)
}

#[cfg(test)]
mod tests {
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
        let kept = b.endpoints().iter().find(|e| e.addr == addr).unwrap().rtt_ewma();
        assert_eq!(kept, Duration::from_millis(200), "peak EWMA took the slow sample and kept it");
        assert_eq!(b.update(&[("a".into(), 1.0)], t), 1, "b removed");
        assert_eq!(b.endpoints().len(), 1);
        assert!(b.update(&[], t) == 1 && b.pick(t, &mut rng).is_none());
    }
}
