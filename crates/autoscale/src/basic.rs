//! `basic`: Dataproc's `basicAlgorithm`.
//!
//! Per evaluation: sample the load; if the last action is a `cooldown_period` ago, average the
//! samples of the last cooldown period and, for memory and CPU separately (the larger wins),
//! estimate = current + avg(pending − available) ÷ per-unit resources (or avg(allocated) ÷
//! per-unit with `estimate_from = "allocated"`). Δ = estimate − current; a scale-up adds
//! ROUND_UP(Δ × scale_up_factor), a scale-down removes ROUND_DOWN(Δ × scale_down_factor), both
//! rounding away from / toward zero as in Dataproc's examples; changes smaller than the min worker
//! fraction of the current size are skipped; the result is clamped to the groups' bounds and split
//! between them by weight. While units decommission, a Δ at least as large as the number
//! decommissioning cancels that scale-down; any smaller change waits for it.

use super::config::{BasicPolicy, EstimateFrom, Group};
use super::decision::{Action, Decision, Reason, Units};
use super::signals::Signals;
use super::window::Window;

/// Absorbs float noise so that e.g. 3.0000000001 rounds up to 3, not 4.
const EPS: f64 = 1e-9;

/// Dataproc's ROUND_UP for a scale-up: ROUND_UP(5 × 0.5) = 3, ROUND_UP(0.8 × 0.5) = 1.
pub fn round_up(x: f64) -> i64 {
    (x - EPS).ceil() as i64
}

/// Dataproc's ROUND_DOWN for a scale-down, toward zero: ROUND_DOWN(−5 × 0.5) = −2,
/// ROUND_DOWN(−0.8 × 0.5) = 0, ROUND_DOWN(−1.5 × 0.5) = 0.
pub fn round_down(x: f64) -> i64 {
    let t = (x - EPS).trunc() as i64;
    if t == 0 { 0 } else { t }
}

/// What `basic` remembers between evaluations.
#[derive(Clone, Debug, PartialEq)]
pub struct BasicState {
    /// Load samples of the last cooldown period: pending, available, allocated for memory, then CPU.
    samples: Window<6>,
    last_action_ms: Option<u64>,
}

impl BasicState {
    pub fn new(policy: &BasicPolicy) -> Self {
        BasicState { samples: Window::new(policy.cooldown_ms), last_action_ms: None }
    }
    pub fn last_action_ms(&self) -> Option<u64> {
        self.last_action_ms
    }
}

pub fn evaluate(p: &BasicPolicy, st: &mut BasicState, s: &Signals, now_ms: u64) -> Decision {
    let current = Units { primary: s.primary.active, secondary: s.secondary.active };
    let mut d = Decision::new(now_ms, "basic", current);
    let decommissioning = s.decommissioning();
    d.inputs.set("decommissioning", f64::from(decommissioning));
    let Some(load) = s.load else {
        return d.none(Reason::NoData { missing: "load" });
    };
    if st.samples.window_ms() != p.cooldown_ms {
        st.samples.reset(p.cooldown_ms);
    }
    let (pe, av, al) = (load.pending, load.available, load.allocated);
    st.samples.push(
        now_ms,
        [pe.memory_bytes, av.memory_bytes, al.memory_bytes, pe.cpu_millis, av.cpu_millis, al.cpu_millis]
            .map(|x| x as f64),
    );
    if let Some(last) = st.last_action_ms {
        let until = last.saturating_add(p.cooldown_ms);
        if now_ms < until {
            return d.none(Reason::Cooldown { remaining_ms: until - now_ms });
        }
    }
    let Some(avg) = st.samples.average(now_ms) else {
        return d.none(Reason::NoData { missing: "load" });
    };
    let cur = f64::from(current.total());
    let allocated_only = p.estimate_from == EstimateFrom::Allocated;
    let estimate_of = |pending: f64, available: f64, allocated: f64, per_unit: u64| {
        (per_unit > 0).then(|| {
            let per = per_unit as f64;
            if allocated_only { allocated / per } else { cur + (pending - available) / per }
        })
    };
    let mem = estimate_of(avg[0], avg[1], avg[2], s.per_unit.memory_bytes);
    let cpu = estimate_of(avg[3], avg[4], avg[5], s.per_unit.cpu_millis);
    let names = [
        ("pending_memory", "available_memory", "allocated_memory", "per_unit_memory"),
        ("pending_cpu", "available_cpu", "allocated_cpu", "per_unit_cpu"),
    ];
    for (i, (kp, ka, kl, ku)) in names.into_iter().enumerate() {
        d.inputs.set(kp, avg[3 * i]);
        d.inputs.set(ka, avg[3 * i + 1]);
        d.inputs.set(kl, avg[3 * i + 2]);
        d.inputs.set(ku, [s.per_unit.memory_bytes, s.per_unit.cpu_millis][i] as f64);
    }
    if let Some(m) = mem {
        d.inputs.set("estimate_memory", m);
    }
    if let Some(c) = cpu {
        d.inputs.set("estimate_cpu", c);
    }
    d.inputs.set("estimate_from_allocated", f64::from(u8::from(allocated_only)));
    let estimate = match (mem, cpu) {
        (Some(m), Some(c)) => m.max(c),
        (Some(x), None) | (None, Some(x)) => x,
        (None, None) => return d.none(Reason::NoData { missing: "per_unit" }),
    };
    let exact = estimate - cur;
    let (factor, delta) = if exact > 0.0 {
        (p.scale_up_factor, round_up(exact * p.scale_up_factor))
    } else if exact < 0.0 {
        (p.scale_down_factor, round_down(exact * p.scale_down_factor))
    } else {
        (0.0, 0)
    };
    d.inputs.set("estimate", estimate);
    d.inputs.set("delta_exact", exact);
    d.inputs.set("factor", factor);
    d.inputs.set("delta", delta as f64);

    if decommissioning > 0 {
        // Dataproc cancels an in-flight scale-down when active + Δ ≥ active + decommissioning.
        if delta >= i64::from(decommissioning) {
            let back = |g: super::signals::GroupUnits, b: Group| g.active.saturating_add(g.decommissioning).min(b.max);
            let desired = Units { primary: back(s.primary, p.primary), secondary: back(s.secondary, p.secondary) };
            return acted(st, d.act(Action::CancelScaleDown, desired), now_ms, p);
        }
        return d.none(Reason::ScaleDownInProgress);
    }
    // A size outside the bounds (they were just changed) is corrected whatever Δ says.
    let in_bounds = |g: Group, n: u32| (g.min..=g.max).contains(&n);
    let out_of_bounds = !in_bounds(p.primary, current.primary) || !in_bounds(p.secondary, current.secondary);
    if delta == 0 && !out_of_bounds {
        return d.none(Reason::NoChange);
    }
    let fraction = if delta > 0 { p.scale_up_min_worker_fraction } else { p.scale_down_min_worker_fraction };
    let threshold = fraction * cur;
    if !out_of_bounds && (delta.unsigned_abs() as f64) < threshold - EPS {
        return d.none(Reason::BelowMinWorkerFraction { threshold });
    }
    let lo = i64::from(p.primary.min) + i64::from(p.secondary.min);
    let hi = i64::from(p.primary.max) + i64::from(p.secondary.max);
    let total = (i64::from(current.total()) + delta).clamp(lo, hi) as u32;
    let desired = split(total, current, p.primary, p.secondary);
    if desired == current {
        return d.none(Reason::AtBounds);
    }
    let action = if desired.total() > current.total() || (desired.total() == current.total() && delta >= 0) {
        Action::ScaleUp
    } else {
        Action::ScaleDown
    };
    let mut d = d.act(action, desired);
    if action == Action::ScaleDown {
        d.graceful_decommission_timeout_ms = Some(p.graceful_decommission_timeout_ms);
    }
    acted(st, d, now_ms, p)
}

fn acted(st: &mut BasicState, d: Decision, now_ms: u64, p: &BasicPolicy) -> Decision {
    st.last_action_ms = Some(now_ms);
    // The samples describe the old size; the next estimate averages the next cooldown period only.
    st.samples.reset(p.cooldown_ms);
    d
}

/// Splits `total` units between the groups: each within its bounds, both moving in the direction
/// of the change where the bounds allow, and otherwise as close to the weight ratio as possible.
/// When one group is at a bound the other takes the change. Requires
/// `p.min + s.min ≤ total ≤ p.max + s.max`.
pub fn split(total: u32, current: Units, p: Group, s: Group) -> Units {
    let lo = p.min.max(total.saturating_sub(s.max));
    let hi = p.max.min(total.saturating_sub(s.min));
    let (dlo, dhi) = if total >= current.total() {
        (current.primary, total.saturating_sub(current.secondary))
    } else {
        (total.saturating_sub(current.secondary), current.primary)
    };
    let (lo, hi) = if lo.max(dlo) <= hi.min(dhi) { (lo.max(dlo), hi.min(dhi)) } else { (lo, hi) };
    let weights = p.weight.saturating_add(s.weight);
    let ideal =
        if weights == 0 { f64::from(total) / 2.0 } else { f64::from(total) * f64::from(p.weight) / f64::from(weights) };
    let primary = (ideal.round() as u32).clamp(lo, hi.max(lo));
    Units { primary, secondary: total - primary }
}
