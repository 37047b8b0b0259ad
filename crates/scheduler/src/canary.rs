//! Progressive delivery (`[rollout] strategy = "canary"`): the new template's units come
//! up beside the old ones, take a growing share of the requests step by step, and each
//! step is judged on their own numbers against the stable version's. Pure: the routers'
//! reports go into a [`TrafficBook`], [`judge`] says what happens next; the reconcile
//! loop (`reconcile/canary.rs`) carries it out.
//!
//! - **Units.** Step `k` with share `s` runs `max(canary, ⌈s × desired⌉)` units of the new
//!   version (at most `desired`), each a replacement of an old unit that keeps serving
//!   until promotion (`crate::rollout` holds their drains). The stable side keeps its
//!   whole capacity, so a rollback is only a release.
//! - **Traffic.** The route table's split sends `s` of the requests to the new version
//!   once the step's units run (the step before's share until then), the rest to the
//!   others; routers choose by weight inside each side.
//! - **Judging.** Once the new version has `min_requests` in the step, an error rate
//!   above `max_error_rate` fails the step at once. At `step_interval` the p99s are
//!   compared, each plus [`LATENCY_RESOLUTION`] (jitter between two sub-millisecond
//!   versions is not a regression); with fewer than `min_requests` the step waits and
//!   says so. A step whose stable side had fewer than `min_requests` (a 100 % step) is
//!   compared with the stable p99 of the step before.
//! - **End.** The last step passed promotes (or waits for `flotilla rollout promote` with
//!   `auto_promote = false`): held units drain and the rest roll as a rolling update
//!   does. A failed step, or `flotilla rollout abort`, reverts the spec: the new units
//!   are released and the split goes away, so all traffic is back on the stable units.

use std::collections::BTreeSet;

use flotilla_core::latency::{BUCKETS, Counts};
use flotilla_proto::v1;
use serde::{Deserialize, Serialize};

use crate::spec::rollout::shares;
use crate::spec::{Rollout, Strategy};

/// Added to both p99s before they are compared, in milliseconds.
pub const LATENCY_RESOLUTION: f64 = 1.0;
/// Most versions one report may carry, and most distinct routers a step remembers.
pub const MAX_REPORT_VERSIONS: usize = 64;
const MAX_ROUTERS: usize = 4096;
/// Most requests one report may count for a version: 2 s at 500 million a second.
pub const MAX_REPORT_REQUESTS: u64 = 1_000_000_000;

/// Where a canary rollout stands; kept in the rollout record (`store::RolloutRecord`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CanaryProgress {
    /// The step in force (index into `rollout.steps`).
    pub step: u32,
    /// When its units all ran and its share went to the routes; `None` while they come up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started_unix_ms: Option<u64>,
    /// Promoted: the rest rolls as a rolling update.
    #[serde(default)]
    pub promoted: bool,
    /// Why the rollout waits, if it does (`min_requests` not met, units coming up, a
    /// manual promote).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// The stable side's p99 in the last step that had stable traffic, in microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_p99_us: Option<u64>,
}

/// One side's numbers over the step in force.
pub type Window = Counts;

/// What the routers reported over the step in force, by side: the new version (the
/// template the rollout rolls to) and every other (stable). Reports while no canary step
/// runs are dropped.
#[derive(Debug, Default)]
pub struct TrafficBook {
    version: Option<String>,
    pub canary: Window,
    pub stable: Window,
    routers: BTreeSet<String>,
}

/// Why a report is refused.
pub fn validate(r: &v1::TrafficReport) -> Result<(), String> {
    if r.router.is_empty() || r.router.len() > 128 {
        return Err(format!("router: {} bytes (1..=128)", r.router.len()));
    }
    if r.versions.len() > MAX_REPORT_VERSIONS {
        return Err(format!("versions: {} (at most {MAX_REPORT_VERSIONS})", r.versions.len()));
    }
    for v in &r.versions {
        if v.version.len() > 64 {
            return Err(format!("versions: a version of {} bytes (at most 64)", v.version.len()));
        }
        if v.latency.len() != BUCKETS {
            return Err(format!("versions[{:?}].latency: {} buckets (exactly {BUCKETS})", v.version, v.latency.len()));
        }
        if v.requests > MAX_REPORT_REQUESTS {
            return Err(format!("versions[{:?}]: {} requests (at most {MAX_REPORT_REQUESTS})", v.version, v.requests));
        }
        if v.errors > v.requests {
            return Err(format!("versions[{:?}]: {} errors of {} requests", v.version, v.errors, v.requests));
        }
        let answered = v.latency.iter().try_fold(0u64, |a, b| a.checked_add(*b));
        if answered != Some(v.requests) {
            return Err(format!("versions[{:?}]: the latency buckets do not add up to its requests", v.version));
        }
    }
    Ok(())
}

impl TrafficBook {
    /// Starts counting a step of the rollout to `version` from nothing (`None`: stops).
    pub fn start(&mut self, version: Option<&str>) {
        *self = TrafficBook { version: version.map(str::to_string), ..Default::default() };
    }

    /// The version being counted, if any.
    pub fn version(&self) -> Option<&str> {
        self.version.as_deref()
    }

    /// Adds a (valid) report; `false` when no step is being counted.
    pub fn add(&mut self, r: &v1::TrafficReport) -> bool {
        let Some(canary) = self.version.as_deref() else { return false };
        for v in &r.versions {
            let side = if v.version == canary { &mut self.canary } else { &mut self.stable };
            side.add(&Counts { requests: v.requests, errors: v.errors, latency: v.latency.clone() });
        }
        if self.routers.len() < MAX_ROUTERS {
            self.routers.insert(r.router.clone());
        }
        true
    }

    /// Distinct routers heard from in this step.
    pub fn routers(&self) -> usize {
        self.routers.len()
    }
}

/// What `apps`, `rollout status` and the dashboard show of a canary shifting traffic.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CanaryStatus {
    /// 1 for the first.
    pub step: u32,
    pub steps: Vec<String>,
    /// The new version's share of the requests now.
    pub share: f64,
    pub step_started_unix_ms: Option<u64>,
    pub step_interval_s: u64,
    pub waiting: Option<String>,
    /// Over the step in force.
    pub new: SideStatus,
    pub stable: SideStatus,
    /// Routers that reported in the step in force.
    pub routers: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SideStatus {
    pub requests: u64,
    pub errors: u64,
    pub error_rate: f64,
    pub p99_ms: Option<f64>,
}

impl SideStatus {
    fn of(w: &Window) -> SideStatus {
        SideStatus { requests: w.requests, errors: w.errors, error_rate: w.error_rate(), p99_ms: w.p99_ms() }
    }
}

pub fn status(r: &Rollout, p: &CanaryProgress, book: &TrafficBook) -> CanaryStatus {
    CanaryStatus {
        step: p.step + 1,
        steps: r.steps.clone(),
        share: share(r, p),
        step_started_unix_ms: p.step_started_unix_ms,
        step_interval_s: r.step_interval.as_secs(),
        waiting: p.waiting.clone(),
        new: SideStatus::of(&book.canary),
        stable: SideStatus::of(&book.stable),
        routers: book.routers(),
    }
}

/// What happens to a canary rollout after a look at its numbers.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// The step runs on (`Some`: and waits, and why).
    Hold(Option<String>),
    /// The step passed: the next one starts.
    Next,
    /// The last step passed: promote.
    Promote,
    /// The step failed: roll back, and why (with the numbers).
    Abort(String),
}

/// Units of the new version step `step` runs: `max(canary, ⌈share × desired⌉)`, at most
/// `desired`.
pub fn units_for(r: &Rollout, step: u32, desired: u32) -> u32 {
    let share = shares(&r.steps).ok().and_then(|s| s.get(step as usize).copied()).unwrap_or(1.0);
    let by_share = (share * f64::from(desired)).ceil() as u32;
    r.canary.max(by_share).min(desired)
}

/// The share of requests the new version gets now: the step's once it started, the step
/// before's while its units come up (0 before the first).
pub fn share(r: &Rollout, p: &CanaryProgress) -> f64 {
    let Ok(s) = shares(&r.steps) else { return 0.0 };
    let step = p.step as usize;
    match p.step_started_unix_ms {
        Some(_) => s.get(step).copied().unwrap_or(1.0),
        None => step.checked_sub(1).and_then(|i| s.get(i).copied()).unwrap_or(0.0),
    }
}

/// Is `r` a canary rollout still shifting traffic (not promoted)?
pub fn shifting(r: &Rollout, p: Option<&CanaryProgress>) -> bool {
    r.strategy == Strategy::Canary && p.is_some_and(|p| !p.promoted)
}

fn percent(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

/// The numbers of a step, as a decision record and `rollout status` say them.
pub fn numbers(book: &TrafficBook) -> String {
    let side = |w: &Window| {
        format!(
            "{} requests, {} errors ({}), p99 {}",
            w.requests,
            w.errors,
            percent(w.error_rate()),
            w.p99_ms().map_or("-".to_string(), |p| format!("{p:.1} ms"))
        )
    };
    format!("new: {}; stable: {}", side(&book.canary), side(&book.stable))
}

/// The stable side's p99 over a step, when it had `min_requests` to have one: a 100 %
/// step leaves it only the few requests routed before the routers took the new split,
/// whose p99 says nothing.
pub fn stable_p99(a: &crate::spec::Analysis, stable: &Window) -> Option<f64> {
    (stable.requests >= a.min_requests).then(|| stable.p99_ms()).flatten()
}

/// What the step in force comes to, at `now_ms` (its units run: `step_started_unix_ms`
/// is set).
pub fn judge(r: &Rollout, p: &CanaryProgress, book: &TrafficBook, now_ms: u64) -> Verdict {
    let a = &r.analysis;
    let (canary, stable) = (&book.canary, &book.stable);
    let steps = shares(&r.steps).unwrap_or_default();
    let last = p.step as usize + 1 >= steps.len();
    let Some(started) = p.step_started_unix_ms else { return Verdict::Hold(None) };
    if canary.requests >= a.min_requests && canary.error_rate() > a.max_error_rate {
        return Verdict::Abort(format!(
            "step {} failed: the new version's error rate {} is above max_error_rate {} ({})",
            p.step + 1,
            percent(canary.error_rate()),
            percent(a.max_error_rate),
            numbers(book)
        ));
    }
    if now_ms.saturating_sub(started) < r.step_interval.as_ms() {
        return Verdict::Hold(None);
    }
    if canary.requests < a.min_requests {
        return Verdict::Hold(Some(format!(
            "step {} waits for min_requests: {} of {} requests to the new version{}",
            p.step + 1,
            canary.requests,
            a.min_requests,
            if book.routers() == 0 { " (no router has reported)" } else { "" }
        )));
    }
    let stable_p99 = stable_p99(a, stable).or(p.stable_p99_us.map(|us| us as f64 / 1000.0));
    if let (Some(new), Some(old)) = (canary.p99_ms(), stable_p99) {
        let ratio = (new + LATENCY_RESOLUTION) / (old + LATENCY_RESOLUTION);
        if ratio > a.max_p99_ratio {
            return Verdict::Abort(format!(
                "step {} failed: the new version's p99 {new:.1} ms is {ratio:.2}× the stable {old:.1} ms, above max_p99_ratio {} ({})",
                p.step + 1,
                a.max_p99_ratio,
                numbers(book)
            ));
        }
    }
    match (last, r.auto_promote) {
        (false, _) => Verdict::Next,
        (true, true) => Verdict::Promote,
        (true, false) => Verdict::Hold(Some(format!(
            "passed its last step ({}); waits for `flotilla rollout promote`",
            numbers(book)
        ))),
    }
}

#[cfg(test)]
mod tests;
