//! `[rollout]`: how `flotilla apply` rolls a changed template through the running units.
//! `strategy = "rolling"` replaces them `max_unavailable` at a time; `"canary"` has the new
//! template take a growing share of the requests in steps, judged at each step on its own
//! numbers against the stable version's (`[rollout.analysis]`), and promoted or rolled
//! back by itself (`crate::canary`). The canary fields are left out of the canonical spec
//! at their defaults, so a spec written before canaries existed keeps its fingerprint.

use flotilla_autoscale::Span;
use flotilla_core::MAX_UNITS;
use serde::{Deserialize, Serialize};

use super::disruption::percent;

/// How `flotilla apply` rolls a changed unit template through the running units. Each
/// old unit keeps serving until its replacement is Running, then drains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rollout {
    /// Units being replaced at once (replacement not yet Running).
    #[serde(default = "one")]
    pub max_unavailable: u32,
    /// How long a replacement may take to be Running (every member running) before it is
    /// failed and released and the rollout is marked failed, so a spec that never comes
    /// up cannot hold the app's rollout slot for good (Kubernetes'
    /// `progressDeadlineSeconds`, Nomad's `progress_deadline`). Default 5m.
    #[serde(default = "default_progress_deadline")]
    pub progress_deadline: Span,
    /// When a rollout fails, go back to the last spec that ran (Nomad's `auto_revert`).
    /// A canary that fails its analysis always goes back.
    #[serde(default)]
    pub auto_revert: bool,
    /// `rolling` (default) or `canary` (`crate::canary`; the fields below).
    #[serde(default, skip_serializing_if = "is_rolling")]
    pub strategy: Strategy,
    /// Units of the new template that come up first, beside the old ones.
    #[serde(default = "default_canary", skip_serializing_if = "is_default_canary")]
    pub canary: u32,
    /// The new version's share of the requests at each step (`"5%"`), increasing.
    #[serde(default = "default_steps", skip_serializing_if = "is_default_steps")]
    pub steps: Vec<String>,
    /// How long each step runs before it is judged.
    #[serde(default = "default_step_interval", skip_serializing_if = "is_default_step_interval")]
    pub step_interval: Span,
    /// Promote once the last step passes; `false` waits there for `flotilla rollout promote`.
    #[serde(default = "yes", skip_serializing_if = "is_true")]
    pub auto_promote: bool,
    #[serde(default, skip_serializing_if = "Analysis::is_default")]
    pub analysis: Analysis,
}

fn one() -> u32 {
    1
}

fn default_progress_deadline() -> Span {
    Span::secs(300)
}

/// Bounds of `rollout.progress_deadline`.
const MIN_PROGRESS_DEADLINE_SECS: u64 = 1;
const MAX_PROGRESS_DEADLINE_SECS: u64 = 86_400;

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            max_unavailable: 1,
            progress_deadline: default_progress_deadline(),
            auto_revert: false,
            strategy: Strategy::Rolling,
            canary: default_canary(),
            steps: default_steps(),
            step_interval: default_step_interval(),
            auto_promote: true,
            analysis: Analysis::default(),
        }
    }
}

/// Most steps a canary may have.
pub const MAX_STEPS: usize = 20;
/// Bounds of `rollout.step_interval`.
const MIN_STEP_SECS: u64 = 1;
const MAX_STEP_SECS: u64 = 86_400;
/// Most `min_requests`.
const MAX_MIN_REQUESTS: u64 = 1_000_000_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Strategy {
    /// Units roll `max_unavailable` at a time; the routes weigh old and new alike.
    #[default]
    Rolling,
    /// `canary` units of the new template first, then traffic shifts by `steps`.
    Canary,
}

/// Thresholds on the new version against the stable one over each step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Analysis {
    /// Most errors (5xx answers and requests no answer came back for) per request.
    #[serde(default = "default_max_error_rate")]
    pub max_error_rate: f64,
    /// Most new p99 ÷ stable p99.
    #[serde(default = "default_max_p99_ratio")]
    pub max_p99_ratio: f64,
    /// Requests to the new version a step needs before it is judged: with fewer it
    /// waits, rather than promoting blind.
    #[serde(default = "default_min_requests")]
    pub min_requests: u64,
}

fn default_max_error_rate() -> f64 {
    0.05
}

fn default_max_p99_ratio() -> f64 {
    1.5
}

fn default_min_requests() -> u64 {
    100
}

impl Default for Analysis {
    fn default() -> Self {
        Analysis {
            max_error_rate: default_max_error_rate(),
            max_p99_ratio: default_max_p99_ratio(),
            min_requests: default_min_requests(),
        }
    }
}

impl Analysis {
    pub fn is_default(&self) -> bool {
        *self == Analysis::default()
    }
}

fn is_rolling(s: &Strategy) -> bool {
    *s == Strategy::Rolling
}

fn default_canary() -> u32 {
    1
}

fn is_default_canary(n: &u32) -> bool {
    *n == default_canary()
}

fn default_steps() -> Vec<String> {
    ["5%", "25%", "50%", "100%"].map(String::from).to_vec()
}

fn is_default_steps(s: &[String]) -> bool {
    s == default_steps().as_slice()
}

fn default_step_interval() -> Span {
    Span::secs(60)
}

fn is_default_step_interval(s: &Span) -> bool {
    *s == default_step_interval()
}

fn yes() -> bool {
    true
}

fn is_true(b: &bool) -> bool {
    *b
}

/// The steps as fractions of 1, or what is wrong with them.
pub fn shares(steps: &[String]) -> Result<Vec<f64>, String> {
    if steps.is_empty() || steps.len() > MAX_STEPS {
        return Err(format!("{} steps (1..={MAX_STEPS})", steps.len()));
    }
    let mut out: Vec<f64> = Vec::with_capacity(steps.len());
    for s in steps {
        let v = percent(s)?;
        if v <= 0.0 {
            return Err(format!("{s:?}: a step sends the new version some traffic (above 0%)"));
        }
        if out.last().is_some_and(|&last| v <= last) {
            return Err(format!("{s:?} does not increase on the step before it"));
        }
        out.push(v);
    }
    Ok(out)
}

impl Rollout {
    /// Every bad field, named (`max_units`: the app's `units.max`; `routed`: whether a
    /// routed role serves HTTP, so a canary has traffic to be judged on; asked only of one).
    pub(super) fn validate(&self, max_units: u32, routed: impl FnOnce() -> bool, e: &mut Vec<String>) {
        if !(1..=MAX_UNITS).contains(&self.max_unavailable) {
            e.push(format!("rollout.max_unavailable: {} (1..={MAX_UNITS})", self.max_unavailable));
        }
        let deadline = self.progress_deadline.as_secs();
        if !(MIN_PROGRESS_DEADLINE_SECS..=MAX_PROGRESS_DEADLINE_SECS).contains(&deadline) {
            e.push(format!(
                "rollout.progress_deadline: {} (at least {MIN_PROGRESS_DEADLINE_SECS}s, at most a day)",
                self.progress_deadline
            ));
        }
        if self.strategy == Strategy::Canary {
            canary(self, max_units, routed, e);
        }
    }
}

/// The canary fields' problems.
fn canary(r: &Rollout, max_units: u32, routed: impl FnOnce() -> bool, e: &mut Vec<String>) {
    if r.canary == 0 || r.canary > max_units {
        e.push(format!("rollout.canary: {} (1..=units.max, {max_units})", r.canary));
    }
    if let Err(why) = shares(&r.steps) {
        e.push(format!("rollout.steps: {why}"));
    }
    let secs = r.step_interval.as_secs();
    if !(MIN_STEP_SECS..=MAX_STEP_SECS).contains(&secs) {
        e.push(format!("rollout.step_interval: {} (at least {MIN_STEP_SECS}s, at most a day)", r.step_interval));
    }
    let a = &r.analysis;
    if !(a.max_error_rate.is_finite() && (0.0..=1.0).contains(&a.max_error_rate)) {
        e.push(format!("rollout.analysis.max_error_rate: {} (0 to 1)", a.max_error_rate));
    }
    if !(a.max_p99_ratio.is_finite() && a.max_p99_ratio > 0.0 && a.max_p99_ratio <= 1000.0) {
        e.push(format!("rollout.analysis.max_p99_ratio: {} (above 0, at most 1000)", a.max_p99_ratio));
    }
    if !(1..=MAX_MIN_REQUESTS).contains(&a.min_requests) {
        e.push(format!("rollout.analysis.min_requests: {} (1..={MAX_MIN_REQUESTS})", a.min_requests));
    }
    if !routed() {
        e.push(
            "rollout.strategy: a canary is judged on its traffic, and no routed role (routing.roles) serves HTTP"
                .into(),
        );
    }
}

#[cfg(test)]
mod tests {
    use crate::spec::AppSpec;

    const ECHO: &str = include_str!("../../../../examples/echo.toml");

    #[test]
    fn a_canary_rollout_parses_round_trips_and_leaves_old_fingerprints_alone() {
        let s = AppSpec::parse(ECHO).unwrap();
        assert_eq!(s.rollout.strategy, super::Strategy::Rolling);
        assert!(!toml::to_string(&s).unwrap().contains("strategy"), "left out: old fingerprints hold");
        let set = "\n[rollout]\nstrategy = \"canary\"\ncanary = 2\nsteps = [\"10%\", \"50%\"]\nstep_interval = \"30s\"\n\
                   auto_promote = false\n[rollout.analysis]\nmax_error_rate = 0.01\nmax_p99_ratio = 2.0\nmin_requests = 50\n";
        let c = AppSpec::parse(&format!("{ECHO}{set}")).unwrap();
        let r = &c.rollout;
        assert_eq!(
            (r.strategy, r.canary, r.step_interval.as_secs(), r.auto_promote),
            (super::Strategy::Canary, 2, 30, false)
        );
        assert_eq!(super::shares(&r.steps).unwrap(), vec![0.1, 0.5]);
        assert_eq!((r.analysis.max_error_rate, r.analysis.max_p99_ratio, r.analysis.min_requests), (0.01, 2.0, 50));
        assert_eq!(AppSpec::parse(&toml::to_string(&c).unwrap()).unwrap(), c, "round-trips");
        assert_eq!(c.fingerprints(), s.fingerprints(), "the strategy is not the template");
        let defaults = AppSpec::parse(&format!("{ECHO}\n[rollout]\nstrategy = \"canary\"\n")).unwrap();
        assert_eq!(super::shares(&defaults.rollout.steps).unwrap(), vec![0.05, 0.25, 0.5, 1.0]);
    }

    #[test]
    fn bad_canary_fields_are_each_named() {
        let bad = "\n[rollout]\nstrategy = \"canary\"\ncanary = 9\nsteps = [\"50%\", \"25%\"]\nstep_interval = \"0s\"\n\
                   [rollout.analysis]\nmax_error_rate = -0.1\nmax_p99_ratio = nan\nmin_requests = 0\n";
        let err = AppSpec::parse(&format!("{ECHO}{bad}")).unwrap_err().to_string();
        for field in [
            "rollout.canary",
            "rollout.steps: \"25%\" does not increase",
            "rollout.step_interval",
            "rollout.analysis.max_error_rate",
            "rollout.analysis.max_p99_ratio",
            "rollout.analysis.min_requests",
        ] {
            assert!(err.contains(field), "{field}: {err}");
        }
        for (steps, why) in [
            ("[\"5%\", \"150%\"]", "must be from 0% to 100%"),
            ("[\"5\"]", "is not a percentage"),
            ("[\"0%\"]", "above 0%"),
            ("[]", "0 steps"),
        ] {
            let err = AppSpec::parse(&format!("{ECHO}\n[rollout]\nstrategy = \"canary\"\nsteps = {steps}\n"))
                .unwrap_err()
                .to_string();
            assert!(err.contains("rollout.steps") && err.contains(why), "{steps}: {err}");
        }
        let unrouted = ECHO.replace("serves_http = true", "serves_http = false");
        let err = AppSpec::parse(&format!("{unrouted}\n[rollout]\nstrategy = \"canary\"\n")).unwrap_err().to_string();
        assert!(err.contains("no routed role"), "{err}");
        assert!(AppSpec::parse(&format!("{unrouted}\n[rollout]\nmax_unavailable = 2\n")).is_ok(), "rolling needs none");
    }
}
