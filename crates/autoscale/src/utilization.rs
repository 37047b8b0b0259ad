//! `utilization`: MR3's auto-scaling.
//!
//! Every `interval`, utilisation = Σ used ÷ Σ allocated (memory, or CPU by `metric`) over the
//! members is sampled; samples taken while no unit runs are skipped. Over the last `window` the
//! samples are accumulated by `average` or `maximum`, after dropping the idle head of the window
//! (samples with nothing in use before the first busy one), so work arriving after a long idle
//! spell scales out quickly. States, as MR3's:
//!
//! * STABLE: utilisation ≥ `scale_out_threshold_percent` → add units, enter SCALE_OUT;
//!   utilisation ≤ `scale_in_threshold_percent`, at least `scale_in_delay_after_scale_out` after
//!   leaving SCALE_OUT → remove units (never below `scale_in_min_units`), enter SCALE_IN.
//! * SCALE_OUT: nothing for `scale_out_grace_period`; then another scale-out if still above the
//!   threshold, else back to STABLE.
//! * SCALE_IN: nothing for `scale_in_grace_period`, and no unit is added while any decommissions.
//!
//! A zero increment/decrement is computed from the distance to the threshold: a scale-out to
//! ⌊n × U ÷ out⌋ + 1 units (just below the scale-out threshold), a scale-in to ⌈n × U ÷ in⌉ units
//! (just at the scale-in threshold). Flotilla additions: a scale-in never removes so many units that
//! the projected utilisation reaches the scale-out threshold (so a constant load cannot
//! oscillate); the window restarts after each action, its samples describing the old size; units
//! are added to the primary group and removed from the secondary group first.

use super::config::{Metric, Scheme, UtilizationPolicy};
use super::decision::{Action, Decision, Phase, Reason, Units};
use super::signals::{Res, Signals};
use super::window::Window;

/// Absorbs float noise at exact threshold boundaries (40 % of 2 units is 0.8 units, not 0.79999…).
const EPS: f64 = 1e-9;

/// What `utilization` remembers between evaluations.
#[derive(Clone, Debug, PartialEq)]
pub struct UtilizationState {
    /// Utilisation samples (percent) of the window.
    samples: Window<1>,
    phase: Phase,
    /// When the current phase began (the action's time for SCALE_OUT and SCALE_IN).
    since_ms: u64,
    left_scale_out_ms: Option<u64>,
}

impl UtilizationState {
    pub fn new(policy: &UtilizationPolicy) -> Self {
        UtilizationState {
            samples: Window::new(policy.window_ms),
            phase: Phase::Stable,
            since_ms: 0,
            left_scale_out_ms: None,
        }
    }
    pub fn phase(&self) -> Phase {
        self.phase
    }
}

fn pick(m: &Metric, r: Res) -> u64 {
    match m {
        Metric::Cpu => r.cpu_millis,
        _ => r.memory_bytes,
    }
}

/// Utilisation over the window: the average or maximum of the samples after the idle head.
fn accumulate(p: &UtilizationPolicy, w: &Window<1>, now_ms: u64) -> Option<f64> {
    let busy = |b: &&super::window::Bucket<1>| b.max[0] > 0.0;
    let any_busy = w.live(now_ms).any(|b| busy(&b));
    let (mut n, mut sum, mut max) = (0u32, 0.0, f64::NEG_INFINITY);
    for b in w.live(now_ms).skip_while(|b| any_busy && !busy(b)) {
        n += b.n;
        sum += b.sum[0];
        max = max.max(b.max[0]);
    }
    (n > 0).then(|| if p.scheme == Scheme::Maximum { max } else { sum / f64::from(n) })
}

pub fn evaluate(p: &UtilizationPolicy, st: &mut UtilizationState, s: &Signals, now_ms: u64) -> Decision {
    let current = Units { primary: s.primary.active, secondary: s.secondary.active };
    let n = current.total();
    let mut d = Decision::new(now_ms, "utilization", current);
    d.inputs.set("decommissioning", f64::from(s.decommissioning()));
    d.inputs.set("scale_out_threshold_percent", p.scale_out_threshold_percent);
    d.inputs.set("scale_in_threshold_percent", p.scale_in_threshold_percent);
    d.inputs.set("metric_cpu", f64::from(u8::from(p.metric == Metric::Cpu)));
    let d = step(p, st, s, now_ms, n, d);
    Decision { phase: Some(st.phase), ..d }
}

fn step(
    p: &UtilizationPolicy,
    st: &mut UtilizationState,
    s: &Signals,
    now_ms: u64,
    n: u32,
    mut d: Decision,
) -> Decision {
    let Some(members) = s.members else {
        return d.none(Reason::NoData { missing: "members" });
    };
    if st.samples.window_ms() != p.window_ms {
        st.samples.reset(p.window_ms);
    }
    let (used, allocated) = members.iter().fold((0u64, 0u64), |(u, a), m| {
        (u.saturating_add(pick(&p.metric, m.used)), a.saturating_add(pick(&p.metric, m.allocated)))
    });
    if allocated > 0 {
        st.samples.push(now_ms, [100.0 * used as f64 / allocated as f64]);
    }
    d.inputs.set("sample_used", used as f64);
    d.inputs.set("sample_allocated", allocated as f64);

    match st.phase {
        Phase::ScaleOut => {
            let until = st.since_ms.saturating_add(p.scale_out_grace_period_ms);
            if now_ms < until {
                return d.none(Reason::ScaleOutGracePeriod { remaining_ms: until - now_ms });
            }
        }
        Phase::ScaleIn => {
            let until = st.since_ms.saturating_add(p.scale_in_grace_period_ms);
            if now_ms < until {
                return d.none(Reason::ScaleInGracePeriod { remaining_ms: until - now_ms });
            }
            enter(st, Phase::Stable, now_ms);
        }
        Phase::Stable => {}
    }
    if s.decommissioning() > 0 {
        leave_scale_out(st, now_ms);
        return d.none(Reason::ScaleInInProgress);
    }

    if n > p.max_units {
        // `max_units` was lowered: shed the excess (secondary first) like a scale-in.
        let remove = n - p.max_units;
        let from_secondary = remove.min(d.current.secondary);
        let desired = Units {
            primary: d.current.primary - (remove - from_secondary),
            secondary: d.current.secondary - from_secondary,
        };
        enter(st, Phase::ScaleIn, now_ms);
        return d.act(Action::ScaleDown, desired);
    }
    if n == 0 {
        // No member to measure: start units for the pending demand, as MR3's initial containers.
        let pending = s.load.map_or(0, |l| pick(&p.metric, l.pending));
        let per_unit = pick(&p.metric, s.per_unit);
        if pending == 0 {
            leave_scale_out(st, now_ms);
            return d.none(Reason::NoPendingDemand);
        }
        let (add, configured) = match p.scale_out_initial_units {
            0 if per_unit > 0 => (pending.div_ceil(per_unit).min(u64::from(u32::MAX)) as u32, false),
            0 => (1, false),
            k => (k, true),
        };
        d.inputs.set("pending", pending as f64);
        d.inputs.set("per_unit", per_unit as f64);
        return scale_out(p, st, d, now_ms, n, add, configured);
    }

    // MR3 sizes a running app by what its members use: a consumer's demand only starts
    // the first units (above). The decision says so rather than drop it silently.
    let pending = s.load.map_or(0, |l| pick(&p.metric, l.pending));
    if pending > 0 {
        d.inputs.set("demand_not_counted", pending as f64);
    }
    let Some(u) = accumulate(p, &st.samples, now_ms) else {
        leave_scale_out(st, now_ms);
        return d.none(Reason::CollectingSamples);
    };
    d.inputs.set("utilization_percent", u);
    d.inputs.set("scheme_maximum", f64::from(u8::from(p.scheme == Scheme::Maximum)));
    let nf = f64::from(n);
    if u >= p.scale_out_threshold_percent {
        let (add, configured) = match p.scale_out_increment_units {
            0 => (
                ((nf * u / p.scale_out_threshold_percent + EPS).floor() as u32).saturating_add(1).saturating_sub(n),
                false,
            ),
            k => (k, true),
        };
        return scale_out(p, st, d, now_ms, n, add.max(1), configured);
    }
    leave_scale_out(st, now_ms);
    if u > p.scale_in_threshold_percent {
        return d.none(Reason::WithinThresholds);
    }
    if let Some(left) = st.left_scale_out_ms {
        let until = left.saturating_add(p.scale_in_delay_after_scale_out_ms);
        if now_ms < until {
            return d.none(Reason::ScaleInDelayAfterScaleOut { remaining_ms: until - now_ms });
        }
    }
    let (wanted, configured) = match p.scale_in_decrement_units {
        0 => (n.saturating_sub((nf * u / p.scale_in_threshold_percent - EPS).ceil() as u32), false),
        k => (k, true),
    };
    // Keep the projected utilisation U × n ÷ (n − k) below the scale-out threshold.
    let keep_below_out = n.saturating_sub((nf * u / p.scale_out_threshold_percent + EPS).floor() as u32 + 1);
    let remove = wanted.min(n.saturating_sub(p.scale_in_min_units)).min(keep_below_out);
    d.inputs.set("change_formula_units", -f64::from(wanted));
    d.inputs.set("change_configured", f64::from(u8::from(configured)));
    if remove == 0 {
        return d.none(Reason::AtMinUnits);
    }
    let from_secondary = remove.min(d.current.secondary);
    let desired = Units {
        primary: d.current.primary - (remove - from_secondary),
        secondary: d.current.secondary - from_secondary,
    };
    enter(st, Phase::ScaleIn, now_ms);
    d.act(Action::ScaleDown, desired)
}

fn scale_out(
    p: &UtilizationPolicy,
    st: &mut UtilizationState,
    mut d: Decision,
    now_ms: u64,
    n: u32,
    add: u32,
    configured: bool,
) -> Decision {
    d.inputs.set("change_formula_units", f64::from(add));
    d.inputs.set("change_configured", f64::from(u8::from(configured)));
    let add = add.min(p.max_units.saturating_sub(n));
    if add == 0 {
        leave_scale_out(st, now_ms);
        return d.none(Reason::AtBounds);
    }
    let desired = Units { primary: d.current.primary + add, secondary: d.current.secondary };
    enter(st, Phase::ScaleOut, now_ms);
    d.act(Action::ScaleUp, desired)
}

fn enter(st: &mut UtilizationState, phase: Phase, now_ms: u64) {
    if phase != Phase::Stable {
        // The samples describe the old size; the next decision measures the new one.
        st.samples.reset(st.samples.window_ms());
    }
    st.phase = phase;
    st.since_ms = now_ms;
}

fn leave_scale_out(st: &mut UtilizationState, now_ms: u64) {
    if st.phase == Phase::ScaleOut {
        st.left_scale_out_ms = Some(now_ms);
        enter(st, Phase::Stable, now_ms);
    }
}
