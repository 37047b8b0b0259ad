//! The `[autoscaling]` TOML table: parsed with serde, then checked by [`AutoscalingConfig::validate`],
//! which reports every problem at once and yields the resolved [`Policy`] the evaluators run on.
//!
//! Durations are written as strings of `<integer><unit>` parts with units `s`, `m`, `h`, `d`
//! (`"10s"`, `"2m"`, `"1h30m"`, `"1d"`), or as a bare integer number of seconds.
//! Field names are those of the originals in snake_case: Dataproc's `basicAlgorithm.yarnConfig`
//! (flattened into `[autoscaling.basic]`), `workerConfig`/`secondaryWorkerConfig`, and MR3's
//! `mr3.auto.scale.*` keys without their prefix, with "hosts"/"containers" read as "units".

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

use super::span::DAY;
pub use super::span::Span;

/// A string-valued setting with a closed set of values. An unknown value still parses (into
/// `Unknown`) so that validation can report it together with every other problem.
macro_rules! choice {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal $(| $alias:literal)*),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
        #[serde(from = "String", into = "String")]
        pub enum $name {
            $($(#[$vm])* $v,)+
            /// A value not listed above; refused by validation.
            Unknown(String),
        }
        impl From<String> for $name {
            fn from(s: String) -> Self {
                match s.as_str() {
                    $($s $(| $alias)* => Self::$v,)+
                    _ => Self::Unknown(s),
                }
            }
        }
        impl From<$name> for String {
            fn from(c: $name) -> String {
                match c {
                    $($name::$v => $s.to_string(),)+
                    $name::Unknown(s) => s,
                }
            }
        }
        impl $name {
            const EXPECTED: &'static [&'static str] = &[$($s),+];
        }
    };
}

choice! {
    /// Which algorithm an app's autoscaler runs.
    PolicyChoice {
        /// Dataproc's `basicAlgorithm`: size from pending and available resources.
        Basic = "basic",
        /// MR3's auto-scaling: keep member utilisation between two thresholds.
        Utilization = "utilization",
    }
}

choice! {
    /// What the `basic` estimate is computed from. Dataproc has no such switch; `all` is its formula.
    EstimateFrom {
        /// Dataproc: estimate = current + avg(pending − available) ÷ per-unit resources.
        All = "all",
        /// Size to what is allocated only, ignoring queued demand: estimate = avg(allocated) ÷ per-unit.
        Allocated = "allocated",
    }
}

choice! {
    /// `mr3.memory.usage.check.scheme`: how the window's samples are accumulated.
    Scheme {
        Average = "average",
        Maximum = "maximum" | "max",
    }
}

choice! {
    /// The resource whose utilisation drives the `utilization` policy (MR3 uses memory).
    Metric {
        Memory = "memory",
        Cpu = "cpu",
    }
}

fn default_interval() -> Span {
    Span::secs(10)
}
fn default_cooldown() -> Span {
    Span::secs(120)
}

/// `[autoscaling]`: an app's own policy or, with `name`, a named policy shared by many apps.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct AutoscalingConfig {
    /// Set for a named policy; apps refer to it by this name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `"basic"` (Dataproc) or `"utilization"` (MR3).
    pub policy: PolicyChoice,
    /// How often signals are sampled and the policy evaluated (MR3's
    /// `mr3.check.memory.usage.event.interval.secs`). Default 10s.
    #[serde(default = "default_interval")]
    pub interval: Span,
    /// Required when `policy = "basic"`; validated whenever present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub basic: Option<BasicConfig>,
    /// Required when `policy = "utilization"`; validated whenever present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub utilization: Option<UtilizationConfig>,
}

/// `[autoscaling.basic]`: Dataproc's `basicAlgorithm` with its `yarnConfig` flattened in.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BasicConfig {
    /// `cooldownPeriod`: time between scaling actions, and the span the signals are averaged
    /// over. Bounds [2m, 1d], default 2m.
    #[serde(default = "default_cooldown")]
    pub cooldown_period: Span,
    /// Lets `cooldown_period` go below Dataproc's 2m minimum (down to 1s); for tests only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_short_cooldown_for_tests: bool,
    /// `gracefulDecommissionTimeout`: how long a removed unit may drain before it is stopped.
    /// Required; bounds [0s, 1d].
    pub graceful_decommission_timeout: Option<Span>,
    /// `scaleUpFactor`: fraction of the estimated shortfall to add. Required; bounds [0.0, 1.0].
    pub scale_up_factor: Option<f64>,
    /// `scaleDownFactor`: fraction of the estimated surplus to remove; 0 never removes.
    /// Required; bounds [0.0, 1.0].
    pub scale_down_factor: Option<f64>,
    /// `scaleUpMinWorkerFraction`: a scale-up smaller than this fraction of the current size is
    /// skipped (0.1 on 20 units needs at least 2). Bounds [0.0, 1.0], default 0.
    #[serde(default)]
    pub scale_up_min_worker_fraction: f64,
    /// `scaleDownMinWorkerFraction`: the same for scale-down. Bounds [0.0, 1.0], default 0.
    #[serde(default)]
    pub scale_down_min_worker_fraction: f64,
    /// `"all"` (Dataproc's formula, default) or `"allocated"`.
    #[serde(default = "default_estimate_from")]
    pub estimate_from: EstimateFrom,
    /// `workerConfig`: the primary group (high-priority placement). Required.
    pub worker_config: Option<GroupConfig>,
    /// `secondaryWorkerConfig`: the secondary group (low-priority placement). Default: unused (max 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secondary_worker_config: Option<GroupConfig>,
}

fn default_estimate_from() -> EstimateFrom {
    EstimateFrom::All
}

/// Dataproc's `InstanceGroupAutoscalingPolicyConfig`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GroupConfig {
    /// `minInstances`: default 2 for the primary group (as Dataproc), 0 for the secondary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_instances: Option<u32>,
    /// `maxInstances`: required for the primary group; default 0 for the secondary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_instances: Option<u32>,
    /// `weight`: a hint for splitting a change between the groups (2 vs 1 ≈ two primary units per
    /// secondary one). Unset on both: equal; set on one only: the other gets 0. Must be ≥ 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i64>,
}

/// `[autoscaling.utilization]`: MR3's auto-scaling keys without the `mr3.auto.scale.` prefix.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UtilizationConfig {
    /// `"memory"` (MR3, default) or `"cpu"`.
    #[serde(default = "default_metric")]
    pub metric: Metric,
    /// `mr3.memory.usage.check.scheme`: `"average"` (default) or `"maximum"`.
    #[serde(default = "default_scheme")]
    pub scheme: Scheme,
    /// `mr3.memory.usage.check.window.length.secs`: default 10m; at least `interval`, at most 1d.
    #[serde(default = "default_window")]
    pub window: Span,
    /// `mr3.auto.scale.out.threshold.percent`: utilisation at or above which units are added.
    /// Default 80; in (0, 100].
    #[serde(default = "default_out")]
    pub scale_out_threshold_percent: f64,
    /// `mr3.auto.scale.out.grace.period.secs`: no further scale-out this long after one. Default 5m.
    #[serde(default = "default_grace")]
    pub scale_out_grace_period: Span,
    /// `mr3.auto.scale.in.delay.after.scale.out.secs`: no scale-in until this long after leaving
    /// SCALE_OUT. Default 1m.
    #[serde(default = "default_delay")]
    pub scale_in_delay_after_scale_out: Span,
    /// `mr3.auto.scale.in.threshold.percent`: utilisation at or below which units are removed.
    /// Default 50; in (0, 100] and below the scale-out threshold.
    #[serde(default = "default_in")]
    pub scale_in_threshold_percent: f64,
    /// `mr3.auto.scale.in.min.hosts`: a scale-in never leaves fewer units. Default 1.
    #[serde(default = "default_min_units")]
    pub scale_in_min_units: u32,
    /// `mr3.auto.scale.in.grace.period.secs`: nothing else happens this long after a scale-in. Default 5m.
    #[serde(default = "default_grace")]
    pub scale_in_grace_period: Span,
    /// `mr3.auto.scale.out.num.initial.containers`: units to start when there are none; 0 (default):
    /// computed from the pending demand.
    #[serde(default)]
    pub scale_out_initial_units: u32,
    /// `mr3.auto.scale.out.num.increment.containers`: units per scale-out; 0 (default): computed
    /// from the distance to the scale-out threshold.
    #[serde(default)]
    pub scale_out_increment_units: u32,
    /// `mr3.auto.scale.in.num.decrement.hosts`: units per scale-in; 0 (default): computed from the
    /// distance to the scale-in threshold.
    #[serde(default)]
    pub scale_in_decrement_units: u32,
    /// Upper bound on units. Required: Flotilla's stand-in for MR3's total resource limits
    /// (`mr3.k8s.worker.total.max.memory.gb` / `.cpu.cores`).
    pub max_units: Option<u32>,
}

fn default_metric() -> Metric {
    Metric::Memory
}
fn default_scheme() -> Scheme {
    Scheme::Average
}
fn default_window() -> Span {
    Span::secs(600)
}
fn default_out() -> f64 {
    80.0
}
fn default_in() -> f64 {
    50.0
}
fn default_grace() -> Span {
    Span::secs(300)
}
fn default_delay() -> Span {
    Span::secs(60)
}
fn default_min_units() -> u32 {
    1
}

/// One problem with a configuration, naming its field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

/// Every problem found by one validation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
pub struct Problems(pub Vec<Problem>);

impl fmt::Display for Problems {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, p) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{p}")?;
        }
        Ok(())
    }
}

/// Why a configuration could not be turned into a [`Policy`].
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("autoscaling config does not parse: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("invalid autoscaling config: {0}")]
    Invalid(#[from] Problems),
}

/// A validated policy, ready to evaluate. Built only by [`AutoscalingConfig::validate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Policy {
    /// The named policy's name; `None` for an app's own.
    pub name: Option<Arc<str>>,
    pub interval_ms: u64,
    pub algorithm: Algorithm,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Algorithm {
    Basic(BasicPolicy),
    Utilization(UtilizationPolicy),
}

impl Algorithm {
    /// The name a spec gives it (`policy = "..."`).
    pub fn name(&self) -> &'static str {
        match self {
            Algorithm::Basic(_) => "basic",
            Algorithm::Utilization(_) => "utilization",
        }
    }
}

/// Bounds and weight of one group of units, resolved.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Group {
    pub min: u32,
    pub max: u32,
    pub weight: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BasicPolicy {
    pub cooldown_ms: u64,
    pub graceful_decommission_timeout_ms: u64,
    pub scale_up_factor: f64,
    pub scale_down_factor: f64,
    pub scale_up_min_worker_fraction: f64,
    pub scale_down_min_worker_fraction: f64,
    pub estimate_from: EstimateFrom,
    pub primary: Group,
    pub secondary: Group,
}

#[derive(Clone, Debug, PartialEq)]
pub struct UtilizationPolicy {
    pub metric: Metric,
    pub scheme: Scheme,
    pub window_ms: u64,
    pub scale_out_threshold_percent: f64,
    pub scale_out_grace_period_ms: u64,
    pub scale_in_delay_after_scale_out_ms: u64,
    pub scale_in_threshold_percent: f64,
    pub scale_in_min_units: u32,
    pub scale_in_grace_period_ms: u64,
    pub scale_out_initial_units: u32,
    pub scale_out_increment_units: u32,
    pub scale_in_decrement_units: u32,
    pub max_units: u32,
}

/// A TOML document holding only the `[autoscaling]` table (an app's policy or a named one).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    autoscaling: AutoscalingConfig,
}

impl AutoscalingConfig {
    /// Parses a document whose only table is `[autoscaling]`; unknown fields are refused.
    pub fn from_toml(doc: &str) -> Result<Self, toml::de::Error> {
        toml::from_str::<Document>(doc).map(|d| d.autoscaling)
    }

    /// Parses and validates in one step.
    pub fn policy_from_toml(doc: &str) -> Result<Policy, ConfigError> {
        Ok(Self::from_toml(doc)?.validate()?)
    }

    /// Checks every field against the originals' bounds and returns all problems at once.
    pub fn validate(&self) -> Result<Policy, Problems> {
        let mut v = Check(Vec::new());
        if let Some(name) = self.name.as_deref().filter(|n| !flotilla_core::is_name(n)) {
            v.push("autoscaling.name".into(), format!("{name:?} must be 1-63 of [a-z0-9-], not starting with '-'"));
        }
        v.choice("autoscaling.policy", &self.policy, PolicyChoice::EXPECTED, |c| matches!(c, PolicyChoice::Unknown(_)));
        v.span("autoscaling.interval", self.interval, 1, DAY);
        let basic = self.basic.as_ref().map(|b| basic(&mut v, b));
        let util = self.utilization.as_ref().map(|u| utilization(&mut v, u, self.interval));
        let algorithm = match self.policy {
            PolicyChoice::Basic => basic.map(Algorithm::Basic),
            PolicyChoice::Utilization => util.map(Algorithm::Utilization),
            PolicyChoice::Unknown(_) => None,
        };
        if algorithm.is_none() && !matches!(self.policy, PolicyChoice::Unknown(_)) {
            let table = String::from(self.policy.clone());
            v.push(format!("autoscaling.{table}"), format!("missing: required by policy = {table:?}"));
        }
        match algorithm {
            Some(algorithm) if v.0.is_empty() => {
                Ok(Policy { name: self.name.as_deref().map(Arc::from), interval_ms: self.interval.as_ms(), algorithm })
            }
            _ => Err(Problems(v.0)),
        }
    }
}

fn basic(v: &mut Check, b: &BasicConfig) -> BasicPolicy {
    let p = "autoscaling.basic";
    let min_cooldown = if b.allow_short_cooldown_for_tests { 1 } else { 120 };
    if !(min_cooldown..=DAY).contains(&b.cooldown_period.as_secs()) {
        let hint =
            if b.allow_short_cooldown_for_tests { "" } else { " (allow_short_cooldown_for_tests lowers the minimum)" };
        v.push(
            format!("{p}.cooldown_period"),
            format!("{} is not within [{}, 1d]{hint}", b.cooldown_period, Span::secs(min_cooldown)),
        );
    }
    let timeout = v.required(format!("{p}.graceful_decommission_timeout"), b.graceful_decommission_timeout);
    if let Some(t) = timeout {
        v.span(&format!("{p}.graceful_decommission_timeout"), t, 0, DAY);
    }
    let up = v.required(format!("{p}.scale_up_factor"), b.scale_up_factor);
    let down = v.required(format!("{p}.scale_down_factor"), b.scale_down_factor);
    for (name, x) in [
        ("scale_up_factor", up),
        ("scale_down_factor", down),
        ("scale_up_min_worker_fraction", Some(b.scale_up_min_worker_fraction)),
        ("scale_down_min_worker_fraction", Some(b.scale_down_min_worker_fraction)),
    ] {
        if let Some(x) = x
            && !(0.0..=1.0).contains(&x)
        {
            v.push(format!("{p}.{name}"), format!("{x:?} is not within [0.0, 1.0]"));
        }
    }
    v.choice(&format!("{p}.estimate_from"), &b.estimate_from, EstimateFrom::EXPECTED, |c| {
        matches!(c, EstimateFrom::Unknown(_))
    });
    let primary = match &b.worker_config {
        Some(g) => group(v, &format!("{p}.worker_config"), g, 2, None),
        None => {
            v.push(format!("{p}.worker_config"), "missing: required (the primary group's bounds)".into());
            Group { min: 0, max: 0, weight: 0 }
        }
    };
    let empty = GroupConfig::default();
    let sec_cfg = b.secondary_worker_config.as_ref().unwrap_or(&empty);
    let mut secondary = group(v, &format!("{p}.secondary_worker_config"), sec_cfg, 0, Some(0));
    // Dataproc: no weight anywhere means equal weights; a weight on one group only means 0 on the other.
    let (pw, sw) = match (b.worker_config.as_ref().and_then(|g| g.weight), sec_cfg.weight) {
        (None, None) => (1, 1),
        (Some(_), None) => (primary.weight, 0),
        (None, Some(_)) => (0, secondary.weight),
        (Some(_), Some(_)) => (primary.weight, secondary.weight),
    };
    secondary.weight = sw;
    BasicPolicy {
        cooldown_ms: b.cooldown_period.as_ms(),
        graceful_decommission_timeout_ms: timeout.map_or(0, Span::as_ms),
        scale_up_factor: up.unwrap_or(0.0),
        scale_down_factor: down.unwrap_or(0.0),
        scale_up_min_worker_fraction: b.scale_up_min_worker_fraction,
        scale_down_min_worker_fraction: b.scale_down_min_worker_fraction,
        estimate_from: b.estimate_from.clone(),
        primary: Group { weight: pw, ..primary },
        secondary,
    }
}

fn group(v: &mut Check, field: &str, g: &GroupConfig, default_min: u32, default_max: Option<u32>) -> Group {
    let min = g.min_instances.unwrap_or(default_min);
    let max = match g.max_instances.or(default_max) {
        Some(max) => max,
        None => {
            v.push(format!("{field}.max_instances"), "missing: required".into());
            min
        }
    };
    if min > max {
        let how = if g.min_instances.is_none() { " (its default)" } else { "" };
        v.push(format!("{field}.min_instances"), format!("{min}{how} is greater than max_instances {max}"));
    }
    let weight = g.weight.unwrap_or(1);
    if weight < 0 {
        v.push(format!("{field}.weight"), format!("{weight} is negative"));
    }
    Group { min, max, weight: u32::try_from(weight).unwrap_or(0) }
}

fn utilization(v: &mut Check, u: &UtilizationConfig, interval: Span) -> UtilizationPolicy {
    let p = "autoscaling.utilization";
    v.choice(&format!("{p}.metric"), &u.metric, Metric::EXPECTED, |c| matches!(c, Metric::Unknown(_)));
    v.choice(&format!("{p}.scheme"), &u.scheme, Scheme::EXPECTED, |c| matches!(c, Scheme::Unknown(_)));
    v.span(&format!("{p}.window"), u.window, interval.as_secs().max(1), DAY);
    for (name, x) in [
        ("scale_out_threshold_percent", u.scale_out_threshold_percent),
        ("scale_in_threshold_percent", u.scale_in_threshold_percent),
    ] {
        if !(x > 0.0 && x <= 100.0) {
            v.push(format!("{p}.{name}"), format!("{x:?} is not within (0, 100]"));
        }
    }
    if u.scale_in_threshold_percent >= u.scale_out_threshold_percent {
        v.push(
            format!("{p}.scale_in_threshold_percent"),
            format!(
                "{:?} is not below scale_out_threshold_percent {:?}",
                u.scale_in_threshold_percent, u.scale_out_threshold_percent
            ),
        );
    }
    for (name, s) in [
        ("scale_out_grace_period", u.scale_out_grace_period),
        ("scale_in_delay_after_scale_out", u.scale_in_delay_after_scale_out),
        ("scale_in_grace_period", u.scale_in_grace_period),
    ] {
        v.span(&format!("{p}.{name}"), s, 0, DAY);
    }
    let max_units = v.required(format!("{p}.max_units"), u.max_units).unwrap_or(0);
    if u.max_units.is_some() && u.scale_in_min_units > max_units {
        v.push(
            format!("{p}.scale_in_min_units"),
            format!("{} is greater than max_units {max_units}", u.scale_in_min_units),
        );
    }
    UtilizationPolicy {
        metric: u.metric.clone(),
        scheme: u.scheme.clone(),
        window_ms: u.window.as_ms(),
        scale_out_threshold_percent: u.scale_out_threshold_percent,
        scale_out_grace_period_ms: u.scale_out_grace_period.as_ms(),
        scale_in_delay_after_scale_out_ms: u.scale_in_delay_after_scale_out.as_ms(),
        scale_in_threshold_percent: u.scale_in_threshold_percent,
        scale_in_min_units: u.scale_in_min_units,
        scale_in_grace_period_ms: u.scale_in_grace_period.as_ms(),
        scale_out_initial_units: u.scale_out_initial_units,
        scale_out_increment_units: u.scale_out_increment_units,
        scale_in_decrement_units: u.scale_in_decrement_units,
        max_units,
    }
}

/// Collects problems.
struct Check(Vec<Problem>);

impl Check {
    fn push(&mut self, field: String, message: String) {
        self.0.push(Problem { field, message });
    }
    fn required<T>(&mut self, field: String, x: Option<T>) -> Option<T> {
        if x.is_none() {
            self.push(field, "missing: required".into());
        }
        x
    }
    fn span(&mut self, field: &str, s: Span, min_secs: u64, max_secs: u64) {
        if !(min_secs..=max_secs).contains(&s.as_secs()) {
            self.push(field.into(), format!("{s} is not within [{}, {}]", Span::secs(min_secs), Span::secs(max_secs)));
        }
    }
    fn choice<T: Clone + Into<String>>(&mut self, field: &str, c: &T, expected: &[&str], unknown: impl Fn(&T) -> bool) {
        if unknown(c) {
            let got: String = c.clone().into();
            self.push(field.into(), format!("{got:?} is not one of {}", expected.join(", ")));
        }
    }
}
