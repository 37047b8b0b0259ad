//! The record of one evaluation: what was done or why nothing was, with the inputs and the
//! formula filled in. Built without allocating (the explanation is rendered on demand and when
//! serialized), so evaluating many apps stays cheap.

use serde::Serialize;
use serde::ser::SerializeMap;
use std::fmt::Write as _;
use std::sync::Arc;

/// Units per group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Units {
    pub primary: u32,
    pub secondary: u32,
}

impl Units {
    pub const fn total(self) -> u32 {
        self.primary.saturating_add(self.secondary)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Action {
    None,
    ScaleUp,
    ScaleDown,
    /// Dataproc: an in-flight scale-down is undone because the estimate wants those units back.
    CancelScaleDown,
}

/// The `utilization` policy's state (MR3's STABLE, SCALE_OUT, SCALE_IN).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Phase {
    Stable,
    ScaleOut,
    ScaleIn,
}

/// Why the decision is what it is.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Reason {
    /// The action was taken.
    Scaled,
    /// A signal is missing; a policy never scales on missing data.
    NoData { missing: &'static str },
    /// `basic`: the last action is less than `cooldown_period` ago.
    Cooldown { remaining_ms: u64 },
    /// `basic`: Δ × factor rounds to no unit.
    NoChange,
    /// `basic`: |Δ| is below `scale_{up,down}_min_worker_fraction` × current units.
    BelowMinWorkerFraction { threshold: f64 },
    /// The change is fully absorbed by the groups' min/max bounds.
    AtBounds,
    /// `basic`: units are decommissioning and Δ is not large enough to cancel that.
    ScaleDownInProgress,
    /// `utilization`: no sample in the window yet.
    CollectingSamples,
    /// `utilization`: between the scale-in and scale-out thresholds.
    WithinThresholds,
    /// `utilization`: within `scale_out_grace_period` of the last scale-out.
    ScaleOutGracePeriod { remaining_ms: u64 },
    /// `utilization`: within `scale_in_grace_period` of the last scale-in.
    ScaleInGracePeriod { remaining_ms: u64 },
    /// `utilization`: units are still decommissioning; no unit is added meanwhile.
    ScaleInInProgress,
    /// `utilization`: within `scale_in_delay_after_scale_out` of leaving SCALE_OUT.
    ScaleInDelayAfterScaleOut { remaining_ms: u64 },
    /// `utilization`: a scale-in would go below `scale_in_min_units`, or remove nothing.
    AtMinUnits,
    /// `utilization`: no unit runs and nothing is pending.
    NoPendingDemand,
}

const MAX_INPUTS: usize = 20;

/// Named numbers the decision was computed from; serialized as a JSON object.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Inputs {
    len: usize,
    items: [(&'static str, f64); MAX_INPUTS],
}

impl Default for Inputs {
    fn default() -> Self {
        Inputs { len: 0, items: [("", 0.0); MAX_INPUTS] }
    }
}

impl Inputs {
    /// Sets `name` (a fixed set per policy, well under the capacity).
    pub(crate) fn set(&mut self, name: &'static str, value: f64) {
        if let Some(item) = self.items[..self.len].iter_mut().find(|(n, _)| *n == name) {
            item.1 = value;
        } else if self.len < MAX_INPUTS {
            self.items[self.len] = (name, value);
            self.len += 1;
        } else {
            debug_assert!(false, "too many decision inputs");
        }
    }
    pub fn get(&self, name: &str) -> Option<f64> {
        self.iter().find(|(n, _)| *n == name).map(|(_, v)| v)
    }
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, f64)> + '_ {
        self.items[..self.len].iter().copied()
    }
}

impl Serialize for Inputs {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.len))?;
        for (k, v) in self.iter() {
            m.serialize_entry(k, &rounded(v))?;
        }
        m.end()
    }
}

/// `v` without floating-point dust (`1596.9999999999982` is `1597`): three decimals are
/// more than any input means (percentages, units, bytes), and whole numbers past 10¹²
/// (bytes) are rounded whole.
fn rounded(v: f64) -> f64 {
    if !v.is_finite() || v.abs() >= 1e12 { v.round() } else { (v * 1000.0).round() / 1000.0 }
}

/// One evaluation's outcome. `desired` equals `current` unless `action` is not `none`.
#[derive(Clone, Debug, PartialEq)]
pub struct Decision {
    pub at_ms: u64,
    /// `"basic"` or `"utilization"`.
    pub policy: &'static str,
    /// The named policy's name, if the app uses one.
    pub policy_name: Option<Arc<str>>,
    pub action: Action,
    pub reason: Reason,
    pub inputs: Inputs,
    pub current: Units,
    pub desired: Units,
    /// `basic` scale-downs: how long removed units may drain (`graceful_decommission_timeout`).
    pub graceful_decommission_timeout_ms: Option<u64>,
    /// `utilization`: the state after this evaluation.
    pub phase: Option<Phase>,
}

impl Decision {
    pub(crate) fn new(at_ms: u64, policy: &'static str, current: Units) -> Self {
        Decision {
            at_ms,
            policy,
            policy_name: None,
            action: Action::None,
            reason: Reason::Scaled,
            inputs: Inputs::default(),
            current,
            desired: current,
            graceful_decommission_timeout_ms: None,
            phase: None,
        }
    }

    pub(crate) fn none(mut self, reason: Reason) -> Self {
        self.action = Action::None;
        self.reason = reason;
        self.desired = self.current;
        self
    }

    pub(crate) fn act(mut self, action: Action, desired: Units) -> Self {
        self.action = action;
        self.reason = Reason::Scaled;
        self.desired = desired;
        self
    }

    fn input(&self, name: &str) -> f64 {
        self.inputs.get(name).unwrap_or(f64::NAN)
    }

    /// The formula with the numbers put in, then what was done or why nothing was.
    pub fn explanation(&self) -> String {
        let mut s = String::new();
        let _ = match self.policy {
            "basic" => self.explain_basic(&mut s),
            _ => self.explain_utilization(&mut s),
        };
        let _ = self.explain_outcome(&mut s);
        if let Some(pending) = self.inputs.get("demand_not_counted") {
            let amount = if self.input("metric_cpu") > 0.0 { millicores(pending) } else { gib(pending) };
            let _ = write!(
                s,
                "; a consumer's demand ({amount} past capacity) is not counted while units run: \
                 utilization sizes by what members use"
            );
        }
        s
    }

    fn explain_basic(&self, s: &mut String) -> std::fmt::Result {
        if self.inputs.get("estimate").is_none() {
            return Ok(());
        }
        let memory = self.input("estimate_memory").is_nan()
            || self.input("estimate_memory") >= self.input("estimate_cpu").max(f64::NEG_INFINITY);
        let (dim, other, unit): (&str, &str, fn(f64) -> String) =
            if memory { ("memory", "cpu", gib) } else { ("cpu", "memory", millicores) };
        let v = |k: &str| self.input(&format!("{k}_{dim}"));
        if self.input("estimate_from_allocated") > 0.0 {
            write!(s, "estimate = avg(allocated {}) / {} per unit", unit(v("allocated")), unit(v("per_unit")))?;
        } else {
            write!(
                s,
                "estimate = current {} + avg(pending {} − available {}) / {} per unit",
                self.current.total(),
                unit(v("pending")),
                unit(v("available")),
                unit(v("per_unit"))
            )?;
        }
        write!(s, " = {} ({dim}", num(self.input("estimate")))?;
        let o = self.input(&format!("estimate_{other}"));
        if !o.is_nan() {
            write!(s, "; {other}: {}", num(o))?;
        }
        let exact = self.input("delta_exact");
        write!(s, "); Δ = {} − {} = {}", num(self.input("estimate")), self.current.total(), num(exact))?;
        let f = self.input("factor");
        let delta = self.input("delta");
        if exact > 0.0 {
            write!(s, "; ROUND_UP({} × {}) = {}", num(exact), num(f), num(delta))
        } else if exact < 0.0 {
            write!(s, "; ROUND_DOWN({} × {}) = {}", num(exact), num(f), num(delta))
        } else {
            Ok(())
        }
    }

    fn explain_utilization(&self, s: &mut String) -> std::fmt::Result {
        let unit: fn(f64) -> String = if self.input("metric_cpu") > 0.0 { millicores } else { gib };
        let u = self.input("utilization_percent");
        if !u.is_nan() {
            let scheme = if self.input("scheme_maximum") > 0.0 { "maximum" } else { "average" };
            write!(
                s,
                "utilization = {scheme} over the window of used ÷ allocated = {}% (last sample {} ÷ {}); \
                 thresholds: in ≤ {}%, out ≥ {}%",
                num(u),
                unit(self.input("sample_used")),
                unit(self.input("sample_allocated")),
                num(self.input("scale_in_threshold_percent")),
                num(self.input("scale_out_threshold_percent")),
            )?;
        }
        let k = self.input("change_formula_units");
        if k.is_nan() || self.action == Action::None {
            return Ok(());
        }
        if !s.is_empty() {
            s.push_str("; ");
        }
        let n = self.current.total();
        let configured = self.input("change_configured") > 0.0;
        match (self.action, configured, n) {
            (Action::ScaleUp, true, 0) => write!(s, "add scale_out_initial_units = {}", num(k)),
            (Action::ScaleUp, false, 0) => write!(
                s,
                "add ⌈pending {} ÷ {} per unit⌉ = {}",
                unit(self.input("pending")),
                unit(self.input("per_unit")),
                num(k)
            ),
            (Action::ScaleUp, true, _) => write!(s, "add scale_out_increment_units = {}", num(k)),
            (Action::ScaleUp, false, _) => write!(
                s,
                "add ⌊{n} × {}% ÷ {}%⌋ + 1 − {n} = {}",
                num(u),
                num(self.input("scale_out_threshold_percent")),
                num(k)
            ),
            (_, true, _) => write!(s, "remove scale_in_decrement_units = {}", num(-k)),
            (_, false, _) => write!(
                s,
                "remove {n} − ⌈{n} × {}% ÷ {}%⌉ = {}",
                num(u),
                num(self.input("scale_in_threshold_percent")),
                num(-k)
            ),
        }?;
        let done = f64::from(self.desired.total()) - f64::from(n);
        if done != k {
            write!(s, ", bounded to {}", num(done))?;
        }
        Ok(())
    }

    fn explain_outcome(&self, s: &mut String) -> std::fmt::Result {
        if !s.is_empty() {
            s.push_str(" → ");
        }
        let d = self.desired;
        match (self.action, self.reason) {
            (Action::None, r) => {
                write!(s, "no change ({} units): ", self.current.total()).and_then(|_| reason(s, r, self))
            }
            (Action::CancelScaleDown, _) => write!(
                s,
                "cancel the in-flight scale-down: Δ {} ≥ {} decommissioning → {} units (primary {}, secondary {})",
                num(self.input("delta")),
                num(self.input("decommissioning")),
                d.total(),
                d.primary,
                d.secondary
            ),
            (a, _) => {
                write!(
                    s,
                    "{} to {} units (primary {}, secondary {})",
                    if a == Action::ScaleUp { "scale up" } else { "scale down" },
                    d.total(),
                    d.primary,
                    d.secondary
                )
            }
        }
    }
}

fn reason(s: &mut String, r: Reason, d: &Decision) -> std::fmt::Result {
    match r {
        Reason::Scaled => Ok(()),
        Reason::NoData { missing } => {
            write!(s, "no data: the {missing} signal is missing, and missing data never scales")
        }
        Reason::Cooldown { remaining_ms } => write!(s, "cooldown: {} left", secs(remaining_ms)),
        Reason::NoChange => s.write_str("the rounded change is 0 units"),
        Reason::BelowMinWorkerFraction { threshold } => write!(
            s,
            "|Δ| {} is below the min worker fraction × {} units = {}",
            num(d.input("delta").abs()),
            d.current.total(),
            num(threshold)
        ),
        Reason::AtBounds => s.write_str("the change is absorbed by the groups' min/max bounds"),
        Reason::ScaleDownInProgress => write!(
            s,
            "a scale-down is in flight ({} decommissioning) and Δ {} does not cancel it",
            num(d.input("decommissioning")),
            num(d.input("delta"))
        ),
        Reason::CollectingSamples => s.write_str("no utilization sample in the window yet"),
        Reason::WithinThresholds => s.write_str("utilization is between the thresholds"),
        Reason::ScaleOutGracePeriod { remaining_ms } => {
            write!(s, "SCALE_OUT grace period: {} left", secs(remaining_ms))
        }
        Reason::ScaleInGracePeriod { remaining_ms } => write!(s, "SCALE_IN grace period: {} left", secs(remaining_ms)),
        Reason::ScaleInInProgress => {
            write!(s, "a scale-in is in progress ({} units decommissioning)", num(d.input("decommissioning")))
        }
        Reason::ScaleInDelayAfterScaleOut { remaining_ms } => {
            write!(s, "scale-in delay after scale-out: {} left", secs(remaining_ms))
        }
        Reason::AtMinUnits => {
            s.write_str("a scale-in would remove no unit (scale_in_min_units or the scale-out threshold)")
        }
        Reason::NoPendingDemand => s.write_str("no unit runs and nothing is pending"),
    }
}

fn num(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 { format!("{x:.0}") } else { format!("{x:.2}") }
}

fn gib(bytes: f64) -> String {
    format!("{} GiB", num(bytes / (1u64 << 30) as f64))
}

fn millicores(m: f64) -> String {
    format!("{}m CPU", num(m))
}

fn secs(ms: u64) -> String {
    format!("{}s", ms.div_ceil(1000))
}

impl Serialize for Decision {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        #[derive(Serialize)]
        struct Out<'a> {
            at_ms: u64,
            policy: &'static str,
            #[serde(skip_serializing_if = "Option::is_none")]
            policy_name: Option<&'a str>,
            action: Action,
            reason: Reason,
            inputs: &'a Inputs,
            explanation: String,
            current: Units,
            desired: Units,
            #[serde(skip_serializing_if = "Option::is_none")]
            graceful_decommission_timeout_ms: Option<u64>,
            #[serde(skip_serializing_if = "Option::is_none")]
            phase: Option<Phase>,
        }
        Out {
            at_ms: self.at_ms,
            policy: self.policy,
            policy_name: self.policy_name.as_deref(),
            action: self.action,
            reason: self.reason,
            inputs: &self.inputs,
            explanation: self.explanation(),
            current: self.current,
            desired: self.desired,
            graceful_decommission_timeout_ms: self.graceful_decommission_timeout_ms,
            phase: self.phase,
        }
        .serialize(s)
    }
}
