//! Replays a load trace through a [`Policy`] in simulated time, so that policies and their knobs
//! can be compared on cost and waiting before any app runs them. The policy code is the very code
//! the scheduler runs ([`evaluate`]); only the cluster around it is modelled: units start after
//! `startup_seconds`, drain for the policy's `graceful_decommission_timeout` (`basic`) or the
//! model's `drain_seconds` (`utilization`), and give capacity only while running.
//!
//! # The trace CSV
//!
//! ```text
//! time_s,cpu_millis,memory_bytes[,utilization]
//! 0,4000,17179869184
//! 600,8000,34359738368,0.7
//! ```
//!
//! * `time_s`: seconds from 0 (the first row is at 0), strictly increasing; a row's demand holds
//!   until the next row, and the last row marks the end of the trace (its values hold for the
//!   gap before it). At most one year, at most 1,000,000 rows.
//! * `cpu_millis`, `memory_bytes`: the app's demand at that time, non-negative numbers.
//! * `utilization` (optional column; a field may be empty): members' used ÷ allocated in [0, 1],
//!   fed to the `utilization` policy instead of the share of demand each running unit serves
//!   (left out or empty on a row: that share).
//!
//! Blank lines and lines starting with `#` are skipped. Every refusal names the line.
//!
//! # The `[sim]` table
//!
//! The policy file is an app spec's `[autoscaling]` table plus an optional `[sim]` table:
//! `unit_cpu` (`"1"`, `"500m"`, or a number of cores; default 1), `unit_memory` (`"4Gi"` or a
//! number of bytes; default 4Gi), `startup_seconds` (default 60), `drain_seconds` (default 60;
//! `basic` drains for its own `graceful_decommission_timeout` instead), `initial_units` (default:
//! the policy's minimum: `basic`'s groups' `min_instances`, `utilization`'s `scale_in_min_units`),
//! all running at time 0.

use std::collections::VecDeque;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::config::{Algorithm, AutoscalingConfig, Policy, Problem, Problems, Span};
use super::decision::{Action, Units};
use super::signals::{GroupUnits, Load, MemberUsage, Res, Signals};
use super::{State, basic, evaluate};

mod trace;
pub use trace::{MAX_ROWS, MAX_TRACE_SECONDS, Row, Trace, TraceError};

/// The time series is reduced to about this many points (each the maximum of its steps), so a
/// year of 1 s steps plots as quickly as an hour.
pub const SERIES_POINTS: usize = 4000;

/// Amounts below this (in units' worth) are float noise, not demand.
const EPS: f64 = 1e-9;

/// The cluster around the policy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Model {
    /// Resources of one unit: its capacity, and the policies' `per_unit`.
    pub unit: Res,
    pub startup_ms: u64,
    /// Drain time when the decision carries no `graceful_decommission_timeout`.
    pub drain_ms: u64,
    /// Units running at time 0.
    pub initial_units: u32,
}

/// A number in a spec quantity string (`"500m"`, `"4Gi"`) or a bare number.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
enum Quantity {
    Text(String),
    Number(f64),
}

/// `[sim]`: the model, in the app spec's units.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SimConfig {
    unit_cpu: Option<Quantity>,
    unit_memory: Option<Quantity>,
    startup_seconds: Option<Span>,
    drain_seconds: Option<Span>,
    initial_units: Option<u32>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    autoscaling: AutoscalingConfig,
    #[serde(default)]
    sim: SimConfig,
}

/// Why a policy file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum PolicyFileError {
    /// The parser's message is in the text, not also the error's source: a chain of
    /// causes (`{:#}`) would print it twice.
    #[error("policy file does not parse: {0}")]
    Parse(toml::de::Error),
    #[error("invalid policy file: {0}")]
    Invalid(Problems),
}

/// Parses a policy file (`[autoscaling]` as in an app spec, plus `[sim]`) and validates both
/// tables, reporting every problem of either at once.
pub fn policy_file_from_toml(doc: &str) -> Result<(Policy, Model), PolicyFileError> {
    let file: PolicyFile = toml::from_str(doc).map_err(PolicyFileError::Parse)?;
    let policy = file.autoscaling.validate();
    let mut problems = match &policy {
        Ok(_) => Vec::new(),
        Err(p) => p.0.clone(),
    };
    let mut push = |field: &str, message: String| problems.push(Problem { field: format!("sim.{field}"), message });
    let s = file.sim;
    let quantity = |q: Option<Quantity>, default: &str, parse: fn(&str) -> Result<u64, String>| match q {
        None => parse(default),
        Some(Quantity::Text(t)) => parse(&t),
        Some(Quantity::Number(x)) if x.is_finite() && x >= 0.0 => parse(&x.to_string()),
        Some(Quantity::Number(x)) => Err(format!("{x} is not a non-negative number")),
    };
    let mut unit = Res::default();
    for (field, q, default, parse, slot) in [
        (
            "unit_cpu",
            s.unit_cpu,
            "1",
            flotilla_core::quantity::cpu_millis as fn(&str) -> Result<u64, String>,
            &mut unit.cpu_millis,
        ),
        ("unit_memory", s.unit_memory, "4Gi", flotilla_core::quantity::memory_bytes, &mut unit.memory_bytes),
    ] {
        match quantity(q, default, parse) {
            Ok(0) => push(field, "must be more than 0".into()),
            Ok(v) => *slot = v,
            Err(e) => push(field, e),
        }
    }
    let day = Span::secs(86_400);
    let startup = s.startup_seconds.unwrap_or(Span::secs(60));
    let drain = s.drain_seconds.unwrap_or(Span::secs(60));
    for (field, span) in [("startup_seconds", startup), ("drain_seconds", drain)] {
        if span > day {
            push(field, format!("{span} is not within [0s, 1d]"));
        }
    }
    let mut initial_units = 0;
    if let Ok(p) = &policy {
        let (lo, hi) = bounds(p);
        let keep = match &p.algorithm {
            Algorithm::Basic(_) => lo,
            Algorithm::Utilization(u) => u.scale_in_min_units,
        };
        initial_units = s.initial_units.unwrap_or(keep);
        if !(lo..=hi).contains(&initial_units) {
            push("initial_units", format!("{initial_units} is not within the policy's bounds [{lo}, {hi}]"));
        }
        if hi > flotilla_core::MAX_UNITS {
            // An app's spec allows no more, and the simulation holds one member per running unit.
            let (field, what) = match &p.algorithm {
                Algorithm::Basic(_) => {
                    ("autoscaling.basic.worker_config.max_instances", " (with the secondary group's)")
                }
                Algorithm::Utilization(_) => ("autoscaling.utilization.max_units", ""),
            };
            problems.push(Problem {
                field: field.into(),
                message: format!("{hi} units{what} is more than an app may have ({})", flotilla_core::MAX_UNITS),
            });
        }
    }
    match policy {
        Ok(policy) if problems.is_empty() => {
            Ok((policy, Model { unit, startup_ms: startup.as_ms(), drain_ms: drain.as_ms(), initial_units }))
        }
        _ => Err(PolicyFileError::Invalid(Problems(problems))),
    }
}

/// The fewest and most units the policy keeps.
fn bounds(p: &Policy) -> (u32, u32) {
    match &p.algorithm {
        Algorithm::Basic(b) => {
            (b.primary.min.saturating_add(b.secondary.min), b.primary.max.saturating_add(b.secondary.max))
        }
        Algorithm::Utilization(u) => (0, u.max_units),
    }
}

/// One point of the plotted series: the maximum of each value over the steps it covers, in
/// units' worth (demand and pending) or units.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Sample {
    pub at_s: f64,
    pub demand: f64,
    /// Running units.
    pub capacity: f64,
    pub pending: f64,
    /// Running, starting and draining units: what is paid for.
    pub units: f64,
}

/// What a simulation measured. Deterministic: the same policy, model and trace give the same
/// report (no clock, no randomness).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimReport {
    /// `"basic"` or `"utilization"`.
    pub policy: &'static str,
    pub simulated_seconds: f64,
    pub steps: u64,
    /// Σ (running + starting + draining units) × time: the bill.
    pub unit_hours: f64,
    /// Σ pending demand (in units' worth) × time.
    pub pending_demand_seconds: f64,
    /// How long demand waits before it is served, weighted by amount; demand served at once waits
    /// 0. Pending demand is a FIFO served oldest-first as capacity appears (or demand falls).
    pub pending_p50_seconds: f64,
    pub pending_p99_seconds: f64,
    pub pending_max_seconds: f64,
    /// Share of the arriving demand that waited at all.
    pub waited_fraction: f64,
    /// Demand still pending when the trace ended (its wait counts up to the end only).
    pub pending_at_end: f64,
    /// Decisions that changed the size (scale-ups, scale-downs, cancelled scale-downs).
    pub actions: u64,
    pub scale_ups: u64,
    pub scale_downs: u64,
    /// Time with running capacity idle by more than one unit.
    pub over_target_seconds: f64,
    /// Time with demand unserved.
    pub under_target_seconds: f64,
    pub peak_units: u32,
    pub final_units: u32,
    /// The plotted series, about [`SERIES_POINTS`] points.
    #[serde(skip)]
    pub series: Vec<Sample>,
}

/// Units of both groups in one lifecycle state.
type PerGroup = [u32; 2];

/// Units started or draining together, in time order.
#[derive(Clone, Copy, Debug)]
struct Batch {
    until_ms: u64,
    group: usize,
    count: u32,
}

/// Demand waiting for capacity, oldest first, and the weighted waits of what was served.
struct Waits {
    queue: VecDeque<(u64, f64)>,
    histogram: hdrhistogram::Histogram<u64>,
    arrived: f64,
    waited: f64,
}

impl Waits {
    /// Amounts are recorded in thousandths of a unit, waits in whole seconds: a wait is a whole
    /// number of steps, and a step is whole seconds, so values under 2048 s are kept exactly.
    fn record(&mut self, wait_ms: u64, amount: f64) {
        let weight = (amount * 1000.0).round() as u64;
        if weight > 0 {
            // Auto-resizing histograms only refuse values past u64's range; none here.
            let _ = self.histogram.record_n(wait_ms.saturating_add(500) / 1000, weight);
        }
    }
    fn push(&mut self, now_ms: u64, amount: f64) {
        self.queue.push_back((now_ms, amount));
        self.waited += amount;
    }
    fn serve(&mut self, now_ms: u64, mut amount: f64) {
        while amount > EPS {
            let Some(front) = self.queue.front_mut() else { break };
            let take = front.1.min(amount);
            let wait = now_ms - front.0;
            front.1 -= take;
            amount -= take;
            if front.1 <= EPS {
                self.queue.pop_front();
            }
            self.record(wait, take);
        }
    }
    fn quantile_s(&self, q: f64) -> f64 {
        if self.histogram.is_empty() {
            return 0.0;
        }
        let h = &self.histogram;
        h.lowest_equivalent(h.value_at_quantile(q)) as f64
    }
}

/// `x` in units' worth: the larger of its CPU and memory, each divided by a unit's.
fn in_units(x: Res, unit: Res) -> f64 {
    let part = |a: u64, per: u64| if per == 0 { 0.0 } else { a as f64 / per as f64 };
    part(x.cpu_millis, unit.cpu_millis).max(part(x.memory_bytes, unit.memory_bytes))
}

fn scale(unit: Res, n: u32) -> Res {
    Res::new(unit.cpu_millis.saturating_mul(n.into()), unit.memory_bytes.saturating_mul(n.into()))
}

/// Runs `trace` through `policy` every `policy.interval`. O(steps + rows); each step allocates
/// nothing once the queues have grown to their working size.
pub fn simulate(policy: &Policy, model: &Model, trace: &Trace) -> SimReport {
    let step_ms = policy.interval_ms.max(1);
    // A trace built by hand may lack rows; without demand there is nothing to step through.
    let steps = if trace.rows.is_empty() { 0 } else { trace.end_ms.div_ceil(step_ms) };
    let mut state = State::new(policy);
    let (lo, hi) = bounds(policy);
    let initial = model.initial_units.clamp(lo, hi);
    let mut running: PerGroup = match &policy.algorithm {
        Algorithm::Basic(b) => {
            let u = basic::split(initial, Units::default(), b.primary, b.secondary);
            [u.primary, u.secondary]
        }
        Algorithm::Utilization(_) => [initial, 0],
    };
    let mut starting: PerGroup = [0; 2];
    let mut draining: PerGroup = [0; 2];
    let mut starts: VecDeque<Batch> = VecDeque::new();
    let mut drains: VecDeque<Batch> = VecDeque::new();
    let mut members: Vec<MemberUsage> = Vec::new();
    let mut waits = Waits {
        queue: VecDeque::new(),
        histogram: hdrhistogram::Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant digits is valid")),
        arrived: 0.0,
        waited: 0.0,
    };
    let per_point = (steps as usize).div_ceil(SERIES_POINTS).max(1) as u64;
    let mut series = Vec::with_capacity((steps / per_point + 1) as usize);
    let mut report = SimReport {
        policy: match policy.algorithm {
            Algorithm::Basic(_) => "basic",
            Algorithm::Utilization(_) => "utilization",
        },
        simulated_seconds: trace.end_ms as f64 / 1000.0,
        steps,
        unit_hours: 0.0,
        pending_demand_seconds: 0.0,
        pending_p50_seconds: 0.0,
        pending_p99_seconds: 0.0,
        pending_max_seconds: 0.0,
        waited_fraction: 0.0,
        pending_at_end: 0.0,
        actions: 0,
        scale_ups: 0,
        scale_downs: 0,
        over_target_seconds: 0.0,
        under_target_seconds: 0.0,
        peak_units: 0,
        final_units: 0,
        series: Vec::new(),
    };
    let (mut row, mut prev_demand, mut prev_pending) = (0usize, 0.0f64, 0.0f64);
    let mut point = Sample::default();
    for i in 0..steps {
        let now = i * step_ms;
        let dt_s = (trace.end_ms.min(now + step_ms) - now) as f64 / 1000.0;
        while starts.front().is_some_and(|b| b.until_ms <= now) {
            if let Some(b) = starts.pop_front() {
                starting[b.group] -= b.count;
                running[b.group] += b.count;
            }
        }
        while drains.front().is_some_and(|b| b.until_ms <= now) {
            if let Some(b) = drains.pop_front() {
                draining[b.group] -= b.count;
            }
        }
        while row + 1 < trace.rows.len() && trace.rows[row + 1].at_ms <= now {
            row += 1;
        }
        let r = trace.rows[row];

        // Serve what the running units can; the rest waits.
        let n_running = running[0] + running[1];
        let capacity = scale(model.unit, n_running);
        let allocated =
            Res::new(r.demand.cpu_millis.min(capacity.cpu_millis), r.demand.memory_bytes.min(capacity.memory_bytes));
        let pending =
            Res::new(r.demand.cpu_millis - allocated.cpu_millis, r.demand.memory_bytes - allocated.memory_bytes);
        let starting_res = scale(model.unit, starting[0] + starting[1]);
        let available = Res::new(
            (capacity.cpu_millis - allocated.cpu_millis).saturating_add(starting_res.cpu_millis),
            (capacity.memory_bytes - allocated.memory_bytes).saturating_add(starting_res.memory_bytes),
        );
        let demand_u = in_units(r.demand, model.unit);
        let pending_u = in_units(pending, model.unit);

        let arrived = (demand_u - prev_demand).max(0.0);
        let queued = (pending_u - prev_pending).max(0.0);
        waits.arrived += arrived;
        waits.record(0, (arrived - queued).max(0.0));
        if queued > 0.0 {
            waits.push(now, queued);
        }
        waits.serve(now, prev_pending - pending_u);
        (prev_demand, prev_pending) = (demand_u, pending_u);

        members.clear();
        if n_running > 0 {
            let used = match r.utilization {
                Some(u) => Res::new(
                    (model.unit.cpu_millis as f64 * u).round() as u64,
                    (model.unit.memory_bytes as f64 * u).round() as u64,
                ),
                None => {
                    Res::new(allocated.cpu_millis / u64::from(n_running), allocated.memory_bytes / u64::from(n_running))
                }
            };
            members.extend((0..n_running).map(|_| MemberUsage { used, allocated: model.unit }));
        }
        let group = |g: usize| GroupUnits { active: running[g] + starting[g], decommissioning: draining[g] };
        let signals = Signals {
            primary: group(0),
            secondary: group(1),
            per_unit: model.unit,
            load: Some(Load { pending, available, allocated }),
            members: Some(&members),
        };
        let d = evaluate(policy, &mut state, &signals, now);
        if d.action != Action::None {
            report.actions += 1;
            if d.action == Action::ScaleDown {
                report.scale_downs += 1;
            } else {
                report.scale_ups += 1;
            }
            let drain_until = now + d.graceful_decommission_timeout_ms.unwrap_or(model.drain_ms);
            for (g, want) in [d.desired.primary, d.desired.secondary].into_iter().enumerate() {
                let active = running[g] + starting[g];
                if want > active {
                    // Draining units are still there: take them back before starting new ones.
                    let mut add = want - active;
                    while add > 0 {
                        let Some(pos) = drains.iter().rposition(|b| b.group == g) else { break };
                        let take = drains[pos].count.min(add);
                        drains[pos].count -= take;
                        if drains[pos].count == 0 {
                            drains.remove(pos);
                        }
                        draining[g] -= take;
                        running[g] += take;
                        add -= take;
                    }
                    if add > 0 {
                        starting[g] += add;
                        starts.push_back(Batch { until_ms: now + model.startup_ms, group: g, count: add });
                    }
                } else if want < active {
                    // Units not yet started are cancelled (newest first); running ones drain.
                    let mut remove = active - want;
                    while remove > 0 {
                        let Some(pos) = starts.iter().rposition(|b| b.group == g) else { break };
                        let take = starts[pos].count.min(remove);
                        starts[pos].count -= take;
                        if starts[pos].count == 0 {
                            starts.remove(pos);
                        }
                        starting[g] -= take;
                        remove -= take;
                    }
                    if remove > 0 {
                        running[g] -= remove;
                        draining[g] += remove;
                        let at = drains.partition_point(|b| b.until_ms <= drain_until);
                        drains.insert(at, Batch { until_ms: drain_until, group: g, count: remove });
                    }
                }
            }
        }

        let total = running[0] + running[1] + starting[0] + starting[1] + draining[0] + draining[1];
        report.peak_units = report.peak_units.max(total);
        report.unit_hours += f64::from(total) * dt_s / 3600.0;
        report.pending_demand_seconds += pending_u * dt_s;
        if pending_u > EPS {
            report.under_target_seconds += dt_s;
        } else if f64::from(n_running) - demand_u > 1.0 + EPS {
            report.over_target_seconds += dt_s;
        }

        if i % per_point == 0 {
            if i > 0 {
                series.push(point);
            }
            point = Sample { at_s: now as f64 / 1000.0, ..Sample::default() };
        }
        point.demand = point.demand.max(demand_u);
        point.capacity = point.capacity.max(f64::from(n_running));
        point.pending = point.pending.max(pending_u);
        point.units = point.units.max(f64::from(total));
    }
    if steps > 0 {
        series.push(point);
    }
    // Demand still waiting at the end has waited at least this long.
    let end = trace.end_ms;
    report.pending_at_end = waits.queue.iter().fold(0.0, |sum, q| sum + q.1);
    while let Some((at, amount)) = waits.queue.pop_front() {
        waits.record(end.saturating_sub(at), amount);
    }
    report.pending_p50_seconds = waits.quantile_s(0.5);
    report.pending_p99_seconds = waits.quantile_s(0.99);
    report.pending_max_seconds = waits.quantile_s(1.0);
    report.waited_fraction = if waits.arrived > EPS { (waits.waited / waits.arrived).min(1.0) } else { 0.0 };
    report.final_units = running[0] + running[1] + starting[0] + starting[1] + draining[0] + draining[1];
    report.series = series;
    report
}

impl fmt::Display for SimReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let secs = |s: f64| Span::secs(s.round() as u64);
        writeln!(f, "policy          {}", self.policy)?;
        writeln!(f, "simulated       {} ({} steps)", secs(self.simulated_seconds), self.steps)?;
        writeln!(
            f,
            "unit-hours      {:.2} (peak {} units, {} at the end)",
            self.unit_hours, self.peak_units, self.final_units
        )?;
        writeln!(f, "pending         {:.1} unit-seconds", self.pending_demand_seconds)?;
        writeln!(
            f,
            "pending time    p50 {:.0}s, p99 {:.0}s, max {:.0}s ({:.1}% of demand waited)",
            self.pending_p50_seconds,
            self.pending_p99_seconds,
            self.pending_max_seconds,
            self.waited_fraction * 100.0
        )?;
        writeln!(f, "actions         {} ({} up, {} down)", self.actions, self.scale_ups, self.scale_downs)?;
        writeln!(f, "over target     {} (capacity idle by more than one unit)", secs(self.over_target_seconds))?;
        write!(f, "under target    {} (demand unserved)", secs(self.under_target_seconds))
    }
}

#[cfg(test)]
mod tests;
