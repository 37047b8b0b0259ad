//! The endpoint choice (docs/architecture.md §10): weighted power of two choices on a
//! windowed-median latency.
//!
//! Two endpoints are sampled with probability proportional to their effective weight (the
//! route weight the scheduler publishes, ramped up during slow start) times a speed factor
//! `((median + R) / (latency + R))^4`, floored at 1 %, and the request goes to the one with
//! the lower cost:
//!
//! ```text
//! cost = (latency + R) × (in_flight + 1) × (1 + ERROR_PENALTY × error_ewma) / effective_weight
//! ```
//!
//! - `latency` is the median of the endpoint's last five answers. A node that turns slow
//!   loses traffic after three slow answers; one or two stray slow answers (a page fault, a
//!   busy host) change nothing. It replaced a peak EWMA (as in Finagle and Linkerd), which
//!   took any single slow answer at once and kept it for seconds: between two backends that
//!   answer in well under a millisecond, one such answer outweighed a 2.5× route-weight
//!   difference and sent the lighter one 80 % of the traffic.
//! - An estimate that no answer has refreshed fades toward the median endpoint's (τ =
//!   `decay`), so an endpoint that lost every comparison since is tried again in time.
//! - `R` (`LATENCY_RESOLUTION`, 2 ms) is how much latency difference counts. Differences
//!   well below it are the proxy's own scheduling noise: between backends answering in
//!   0.3 ms and 0.8 ms the route weights decide, while 10 ms against 50 ms is still a 4×
//!   difference.
//! - `in_flight` makes queueing visible before any response comes back.
//! - Errors are penalised on top of latency: a node that fails fast must not look healthy.
//! - An endpoint at the 1 % floor (≥ 3.16× the median by that ratio) serves only **probes**:
//!   when drawn, it takes the request if its last probe is `PROBE_INTERVAL` old, and
//!   otherwise the other candidate does. The cost assumes one request at a time, so without
//!   this an idle slow endpoint beats a healthy one that is serving several at once. Its
//!   traffic is then bounded by time, not by the request rate, and a recovered endpoint is
//!   back after three probes.
//! - Until its first answer an endpoint is assumed as fast as the median endpoint (the
//!   configured `default_rtt` when none has answered); the first answer replaces that.
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
//! endpoints (p99 2.5× the all-healthy run), the speed factor 0.4–1.4 % (the p99 flipped
//! between the healthy and the slow latency from run to run), probes only 0.5 %.
//!
//! **Versions.** While a canary rollout shifts traffic the table carries a split: a share
//! of the requests goes to the endpoints of the new version and the rest to the others,
//! each request's side drawn first, then P2C inside that side (the median is the side's
//! own: a slow new version is judged on its latency, not starved by the old one's). A side
//! with nothing that may take traffic leaves the request to the other (for the new
//! version's side, counted as its error: `unserved`). Every answer is
//! also counted per endpoint (`traffic`) for the reports the canary is judged on.
//!
//! The balancer is a plain data structure: callers pass the time, so tests are exact.

use flotilla_core::LockExt;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, ArcSwapOption};
use rand::Rng;

mod traffic;
pub use traffic::{Counts, Traffic};

/// How much a full error rate multiplies the cost.
const ERROR_PENALTY: f64 = 20.0;
/// Decay of the error EWMA.
const ERROR_DECAY: Duration = Duration::from_secs(5);
/// Latency difference that counts (see the module doc): added to every latency before two
/// are compared.
pub const LATENCY_RESOLUTION: Duration = Duration::from_millis(2);
/// Least share of its weight an endpoint slower than the median keeps when candidates are
/// drawn; an endpoint at this floor serves only probes.
const LATENCY_FLOOR: f64 = 0.01;
/// Least time between two probes of an endpoint at the latency floor.
pub const PROBE_INTERVAL: Duration = Duration::from_millis(200);
/// Answers an endpoint's latency estimate is the median of.
const WINDOW: usize = 5;
/// Weight at the start of slow start, as a fraction of the full weight.
const SLOW_START_FLOOR: f64 = 0.1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Weighted P2C on the latency estimate (the default).
    P2c,
    /// Plain round robin over the endpoints with a weight above 0 (for comparison).
    RoundRobin,
}

#[derive(Debug, Clone)]
pub struct Config {
    pub policy: Policy,
    /// Latency assumed for every endpoint while none has answered yet.
    pub default_rtt: Duration,
    /// Time constant with which a latency estimate no answer refreshed fades toward the
    /// median endpoint's.
    pub decay: Duration,
    pub eject_after: u32,
    pub base_ejection: Duration,
    pub max_ejection: Duration,
    pub slow_start: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::P2c,
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
    in_flight: AtomicU32,
    /// When the next probe may go, in nanoseconds since the balancer's epoch (see
    /// [`PROBE_INTERVAL`]); claimed by compare-and-swap, so two threads never both probe.
    probe_at_ns: AtomicU64,
    state: Mutex<State>,
    /// Every answer, for the per-version reports (`crate::report`).
    pub traffic: Traffic,
}

/// The share of requests the endpoints of one version get (the route table's split).
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    pub version: String,
    /// 0..=1.
    pub share: f64,
}

#[derive(Debug, Clone)]
struct State {
    /// The route weight (the scheduler's prior; 1.0 for a fixed backend list).
    weight: f64,
    latency: Latency,
    error_ewma: f64,
    error_at: Instant,
    consecutive_failures: u32,
    ejections: u32,
    ejected_until: Option<Instant>,
    /// Since when the endpoint serves (added, or back from an ejection): slow start.
    serving_since: Instant,
    /// The version its unit runs (the route's template fingerprint; empty if unknown).
    version: Arc<str>,
}

/// The latency estimate (see the module doc): the median of the last [`WINDOW`] answers, in
/// seconds.
#[derive(Debug, Clone, Copy)]
struct Latency {
    recent: [f64; WINDOW],
    /// Answers in `recent` (up to `WINDOW`), and where the next one goes.
    len: u8,
    next: u8,
    estimate: f64,
    at: Instant,
}

impl Latency {
    fn new(now: Instant) -> Self {
        Latency { recent: [0.0; WINDOW], len: 0, next: 0, estimate: 0.0, at: now }
    }

    /// `None` before the first answer.
    fn estimate(&self) -> Option<f64> {
        (self.len > 0).then_some(self.estimate)
    }

    fn observe(&mut self, seconds: f64, now: Instant) {
        self.recent[usize::from(self.next)] = seconds;
        self.next = (self.next + 1) % WINDOW as u8;
        self.len = (self.len + 1).min(WINDOW as u8);
        let mut sorted = self.recent;
        let known = &mut sorted[..usize::from(self.len)];
        known.sort_unstable_by(f64::total_cmp);
        // The lower median: of two answers, the faster.
        self.estimate = known[(known.len() - 1) / 2];
        self.at = now;
    }
}

/// How a request ended, for the endpoint's statistics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Success,
    Failure,
}

/// One endpoint as a pick sees it (read under one lock).
struct Seen {
    /// The estimate in seconds, `None` before the first answer.
    estimate: Option<f64>,
    /// When the estimate was last sampled.
    estimate_at: Instant,
    /// The latency a pick compares: the estimate faded toward the median, or the median.
    latency: f64,
    /// Route weight × slow start; 0 while ejected.
    weight: f64,
    /// `1 + ERROR_PENALTY × error_ewma`, decayed to now.
    penalty: f64,
    /// Candidate weight: `weight × speed`.
    draw: f64,
    floored: bool,
    /// Of the split's version.
    split_side: bool,
}

impl State {
    fn effective_weight(&self, now: Instant, slow_start: Duration) -> f64 {
        if self.ejected_until.is_some_and(|t| now < t) {
            return 0.0;
        }
        let age = now.saturating_duration_since(self.serving_since).as_secs_f64();
        let ramp =
            if slow_start.is_zero() { 1.0 } else { (age / slow_start.as_secs_f64()).clamp(SLOW_START_FLOOR, 1.0) };
        self.weight * ramp
    }
}

impl Endpoint {
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }

    pub fn weight(&self) -> f64 {
        self.state.lock_or_recover().weight
    }

    /// The version its unit runs (empty if the table did not say).
    pub fn version(&self) -> Arc<str> {
        self.state.lock_or_recover().version.clone()
    }

    /// The latency estimate, `None` before the first answer.
    pub fn latency(&self) -> Option<Duration> {
        self.state.lock_or_recover().latency.estimate().map(Duration::from_secs_f64)
    }

    fn ejected(&self, now: Instant) -> bool {
        self.state.lock_or_recover().ejected_until.is_some_and(|t| now < t)
    }

    /// Route weight × slow-start ramp; 0 while ejected.
    #[cfg(test)]
    fn effective_weight(&self, now: Instant, slow_start: Duration) -> f64 {
        self.state.lock_or_recover().effective_weight(now, slow_start)
    }

    fn seen(&self, now: Instant, slow_start: Duration, split: Option<&Split>) -> Seen {
        let s = self.state.lock_or_recover();
        let errors = decayed(s.error_ewma, now.saturating_duration_since(s.error_at), ERROR_DECAY);
        Seen {
            estimate: s.latency.estimate(),
            estimate_at: s.latency.at,
            latency: 0.0,
            weight: s.effective_weight(now, slow_start),
            penalty: 1.0 + ERROR_PENALTY * errors,
            draw: 0.0,
            floored: false,
            split_side: split.is_some_and(|x| *s.version == *x.version),
        }
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
    split: ArcSwapOption<Split>,
    /// Requests drawn for the split's version that none of its endpoints could take (all
    /// ejected or at weight 0), sent to the other side instead: reported as the version's
    /// errors, so a version failing badly enough to be ejected is judged on it rather
    /// than starved of requests.
    pub unserved: Traffic,
    next: AtomicU32,
    /// The origin of the endpoints' probe clocks.
    epoch: Instant,
}

/// A request in flight on an endpoint; report how it ended with [`Balancer::finish`].
/// Dropped unfinished (the caller gave up), it counts as neither success nor failure.
pub struct Pick {
    pub endpoint: Arc<Endpoint>,
    /// The endpoint is at the latency floor and got this request only as a probe.
    pub probe: bool,
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
        Balancer {
            config,
            endpoints: ArcSwap::from_pointee(Vec::new()),
            split: ArcSwapOption::empty(),
            unserved: Traffic::default(),
            next: AtomicU32::new(0),
            epoch: Instant::now(),
        }
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
        let routes: Vec<(String, f64, Arc<str>)> = routes.iter().map(|(a, w)| (a.clone(), *w, "".into())).collect();
        self.update_versions(&routes, None, now)
    }

    /// [`Balancer::update`] with each endpoint's version and the table's split between
    /// versions (`None`: weights alone decide).
    pub fn update_versions(&self, routes: &[(String, f64, Arc<str>)], split: Option<Split>, now: Instant) -> usize {
        let old = self.endpoints.load_full();
        let mut changed = 0;
        let mut next = Vec::with_capacity(routes.len());
        for (addr, weight, version) in routes {
            let weight = if weight.is_finite() { weight.max(0.0) } else { 0.0 };
            match old.iter().find(|e| &e.addr == addr) {
                Some(e) => {
                    let mut s = e.state.lock_or_recover();
                    if s.weight != weight {
                        s.weight = weight;
                        changed += 1;
                    }
                    if s.version != *version {
                        s.version = version.clone();
                    }
                    drop(s);
                    next.push(e.clone());
                }
                None => {
                    changed += 1;
                    next.push(Arc::new(Endpoint {
                        addr: addr.clone(),
                        in_flight: AtomicU32::new(0),
                        probe_at_ns: AtomicU64::new(0),
                        state: Mutex::new(State {
                            weight,
                            latency: Latency::new(now),
                            error_ewma: 0.0,
                            error_at: now,
                            consecutive_failures: 0,
                            ejections: 0,
                            ejected_until: None,
                            serving_since: now,
                            version: version.clone(),
                        }),
                        traffic: Traffic::default(),
                    }));
                }
            }
        }
        changed += old.iter().filter(|e| !routes.iter().any(|(a, _, _)| a == &e.addr)).count();
        self.endpoints.store(Arc::new(next));
        let split = split.filter(|s| s.share.is_finite()).map(|s| Split { share: s.share.clamp(0.0, 1.0), ..s });
        if self.split.load().as_deref() != split.as_ref() {
            self.split.store(split.map(Arc::new));
        }
        changed
    }

    /// The split between versions in force.
    pub fn split(&self) -> Option<Arc<Split>> {
        self.split.load_full()
    }

    /// Chooses an endpoint for one request, or `None` when no endpoint may take traffic.
    pub fn pick(&self, now: Instant, rng: &mut impl Rng) -> Option<Pick> {
        let eps = self.endpoints.load();
        let split = self.split.load();
        // Which side of a split this request goes to (`None`: no split).
        let side = split.as_deref().map(|s| rng.random::<f64>() < s.share);
        let mut probe = false;
        let chosen = match self.config.policy {
            Policy::RoundRobin => {
                let all: Vec<&Arc<Endpoint>> = eps.iter().filter(|e| e.weight() > 0.0 && !e.ejected(now)).collect();
                let on_side =
                    |e: &Endpoint, side: bool| split.as_deref().is_some_and(|x| *e.version() == *x.version) == side;
                let sided: Vec<&Arc<Endpoint>> = match side {
                    Some(side) => all.iter().copied().filter(|e| on_side(e, side)).collect(),
                    None => Vec::new(),
                };
                if side == Some(true) && sided.is_empty() {
                    self.unserved.count(0.0, true);
                }
                let live = if sided.is_empty() { all } else { sided };
                if live.is_empty() {
                    return None;
                }
                let i = self.next.fetch_add(1, Ordering::Relaxed) as usize % live.len();
                live[i].clone()
            }
            Policy::P2c => {
                let mut seen: Vec<Seen> =
                    eps.iter().map(|e| e.seen(now, self.config.slow_start, split.as_deref())).collect();
                let served = side.filter(|&side| seen.iter().any(|s| s.split_side == side && s.weight > 0.0));
                if side == Some(true) && served.is_none() {
                    self.unserved.count(0.0, true);
                }
                let side = served;
                if let Some(side) = side {
                    // The other side's endpoints are not candidates for this request.
                    for s in seen.iter_mut().filter(|s| s.split_side != side) {
                        s.weight = 0.0;
                    }
                }
                let median = self.median(&seen, side);
                let r = LATENCY_RESOLUTION.as_secs_f64();
                let decay = self.config.decay.as_secs_f64().max(1e-9);
                let mut total = 0.0;
                for s in seen.iter_mut() {
                    // An estimate nobody has refreshed fades toward the median: a slow one
                    // that lost every comparison since is tried again in time.
                    let age = now.saturating_duration_since(s.estimate_at).as_secs_f64();
                    s.latency = match s.estimate {
                        Some(l) if l > median => median + (l - median) * (-age / decay).exp(),
                        Some(l) => l,
                        None => median,
                    };
                    let speed = ((median + r) / (s.latency + r)).powi(4);
                    s.floored = speed <= LATENCY_FLOOR;
                    s.draw = s.weight * speed.clamp(LATENCY_FLOOR, 1.0);
                    total += s.draw;
                }
                if total <= 0.0 {
                    return None;
                }
                let a = sample(&seen, None, total, rng);
                let b = if seen.iter().filter(|s| s.draw > 0.0).count() > 1 {
                    sample(&seen, Some(a), total - seen[a].draw, rng)
                } else {
                    a
                };
                let cost = |i: usize| {
                    let s = &seen[i];
                    let load = f64::from(eps[i].in_flight()) + 1.0;
                    (s.latency + r) * load * s.penalty / s.weight.max(1e-9)
                };
                let pick = match (seen[a].floored, seen[b].floored) {
                    (true, false) | (false, true) => {
                        let (slow, other) = if seen[a].floored { (a, b) } else { (b, a) };
                        probe = self.probe_due(&eps[slow], now);
                        if probe { slow } else { other }
                    }
                    _ if cost(b) < cost(a) => b,
                    _ => a,
                };
                eps[pick].clone()
            }
        };
        chosen.in_flight.fetch_add(1, Ordering::Relaxed);
        Some(Pick { endpoint: chosen, probe, started: now, done: false })
    }

    /// The (lower) median latency of the endpoints that have answered; `default_rtt` if none
    /// has. The lower one, so that of two endpoints the faster is the reference.
    /// Of one side of a split only, when the request goes to that side.
    fn median(&self, seen: &[Seen], side: Option<bool>) -> f64 {
        let mut known: Vec<f64> =
            seen.iter().filter(|s| side.is_none_or(|x| s.split_side == x)).filter_map(|s| s.estimate).collect();
        if known.is_empty() {
            return self.config.default_rtt.as_secs_f64();
        }
        let mid = (known.len() - 1) / 2;
        *known.select_nth_unstable_by(mid, f64::total_cmp).1
    }

    /// Claims `e`'s next probe if it is due: at most one per [`PROBE_INTERVAL`].
    fn probe_due(&self, e: &Endpoint, now: Instant) -> bool {
        let now_ns = u64::try_from(now.saturating_duration_since(self.epoch).as_nanos()).unwrap_or(u64::MAX);
        let at = e.probe_at_ns.load(Ordering::Relaxed);
        let next = now_ns.saturating_add(PROBE_INTERVAL.as_nanos() as u64);
        now_ns >= at && e.probe_at_ns.compare_exchange(at, next, Ordering::Relaxed, Ordering::Relaxed).is_ok()
    }

    /// Records how a picked request ended.
    pub fn finish(&self, mut pick: Pick, outcome: Outcome, now: Instant) -> Finished {
        pick.done = true;
        let e = &pick.endpoint;
        e.in_flight.fetch_sub(1, Ordering::Relaxed);
        let rtt = now.saturating_duration_since(pick.started).as_secs_f64();
        let mut out = Finished::default();
        let live = self.endpoints.load();
        let failed = outcome == Outcome::Failure;
        e.traffic.count(rtt, failed);
        // Only a failure may eject; counting the ejected locks every endpoint, so a success
        // (nearly every request) skips it. Counted before `e` is locked: it is one of them.
        let ejected_now = if failed { live.iter().filter(|x| x.ejected(now)).count() } else { 0 };
        let mut s = e.state.lock_or_recover();
        // A failure never makes an endpoint look faster (one that fails fast would win every
        // comparison on latency); a slow failure, a timeout, still counts as slow.
        if !failed || s.latency.estimate().is_some_and(|est| rtt > est) {
            s.latency.observe(rtt, now);
        }
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

/// Index drawn with probability proportional to `draw` (summing to `total` > 0 over the
/// endpoints other than `except`).
fn sample(seen: &[Seen], except: Option<usize>, total: f64, rng: &mut impl Rng) -> usize {
    let draw = |i: usize| if Some(i) == except { 0.0 } else { seen[i].draw };
    let mut x = rng.random::<f64>() * total;
    for i in 0..seen.len() {
        let w = draw(i);
        if w <= 0.0 {
            continue;
        }
        if x < w {
            return i;
        }
        x -= w;
    }
    (0..seen.len()).rposition(|i| draw(i) > 0.0).unwrap_or(0)
}
#[cfg(test)]
mod tests;
