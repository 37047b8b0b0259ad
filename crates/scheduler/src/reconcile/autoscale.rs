//! Autoscale: every `interval` the app's policy (its own, or the named one it uses) reads
//! the app's signals and decides its desired units per group. `flotilla_autoscale` decides;
//! this samples the signals, applies the decision within the operator's override, and
//! records it (store, log, metrics).

use crate::catalogue as m;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use arc_swap::ArcSwap;
use flotilla_core::Resources;
use serde::Serialize;

use super::error::CommandError;
use crate::lifecycle::UnitState;
use crate::rollout::counts_toward_desired;
use crate::spec::AppSpec;
use crate::store::{DECISIONS_KEPT, Stored, UnitRecord, Units, Write};
use flotilla_autoscale::{Action, GroupUnits, Load, MemberUsage, Policy, Res, Signals, State, evaluate};

/// Named autoscaling policies by name. The embedded control plane and its schedulers
/// share one book; a standalone scheduler's book is refreshed from its control plane.
pub type PolicyBook = Arc<ArcSwap<BTreeMap<String, Policy>>>;

/// Most entries in one demand request, and most units one entry may ask for.
pub const MAX_DEMAND_ENTRIES: usize = 256;
pub const MAX_DEMAND_COUNT: u32 = 10_000;
/// Longest a demand may stand without being renewed.
pub const MAX_DEMAND_TTL_MS: u64 = 86_400_000;

/// What a consumer asks the app to be able to run, like Ray's `request_resources`:
/// replaced by every call, gone after its TTL.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Demand {
    pub requests: Vec<DemandRequest>,
    pub expires_unix_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, serde::Deserialize)]
pub struct DemandRequest {
    pub resources: Resources,
    pub count: u32,
}

impl Demand {
    /// A demand standing `ttl_ms` from `now`, or every problem with it.
    pub fn new(requests: Vec<DemandRequest>, ttl_ms: u64, now: u64) -> Result<Demand, CommandError> {
        let mut problems = Vec::new();
        if requests.len() > MAX_DEMAND_ENTRIES {
            problems.push(format!("requests: {} entries (at most {MAX_DEMAND_ENTRIES})", requests.len()));
        }
        for (i, r) in requests.iter().enumerate() {
            if r.count > MAX_DEMAND_COUNT {
                problems.push(format!("requests[{i}].count: {} (at most {MAX_DEMAND_COUNT})", r.count));
            }
            if r.resources.is_zero() {
                problems.push(format!("requests[{i}].resources: asks for nothing"));
            }
            for name in r.resources.custom.keys() {
                problems.push(format!(
                    "requests[{i}].resources: {name:?} is not a resource (cpu_millis, memory_bytes, gpu)"
                ));
            }
            if let Err(e) = (Resources { custom: Default::default(), ..r.resources.clone() }).validate_node_capacity() {
                problems.push(format!("requests[{i}].resources: {e}"));
            }
        }
        if !(1_000..=MAX_DEMAND_TTL_MS).contains(&ttl_ms) {
            problems.push(format!("ttl_seconds: {} (1..=86400)", ttl_ms / 1000));
        }
        if !problems.is_empty() {
            return Err(CommandError::InvalidDemand(problems.join("; ")));
        }
        Ok(Demand { requests, expires_unix_ms: now.saturating_add(ttl_ms) })
    }

    /// The total asked for, in the two resources policies size by.
    fn total(&self) -> Res {
        self.requests.iter().fold(Res::default(), |acc, r| {
            let n = u64::from(r.count);
            Res::new(
                acc.cpu_millis.saturating_add(r.resources.cpu_millis.saturating_mul(n)),
                acc.memory_bytes.saturating_add(r.resources.memory_bytes.saturating_mul(n)),
            )
        })
    }
}

/// The autoscaler's memory between passes (not persisted but its decisions).
pub(super) struct Autoscaler {
    pub(super) book: PolicyBook,
    /// The spec's own `[autoscaling]`, validated once per spec.
    pub(super) own: Option<Policy>,
    state: Option<State>,
    next_eval_ms: u64,
    pub(super) demand: Option<Demand>,
    /// The last decision records, newest last (mirrors the store).
    pub(super) decisions: VecDeque<Arc<serde_json::Value>>,
    next_seq: u64,
    /// Of units being removed by the last scale-down: how long they drain.
    pub(super) drain_ms: Option<u64>,
}

impl Autoscaler {
    /// The next pass evaluates, whatever the interval (a new spec or override).
    pub(super) fn force_evaluation(&mut self) {
        self.next_eval_ms = 0;
    }

    pub(super) fn new(spec: &crate::spec::AppSpec, stored: &BTreeMap<u64, String>) -> Self {
        let decisions = stored.values().filter_map(|j| serde_json::from_str(j).ok().map(Arc::new)).collect();
        Autoscaler {
            book: Default::default(),
            own: spec.own_policy(),
            state: None,
            next_eval_ms: 0,
            demand: None,
            decisions,
            next_seq: stored.keys().next_back().map_or(1, |s| s + 1),
            drain_ms: None,
        }
    }
}

/// The app's signals, as `gather` finds them.
struct Gathered {
    primary: GroupUnits,
    secondary: GroupUnits,
    per_unit: Res,
    load: Option<Load>,
    members: Option<Vec<MemberUsage>>,
}

impl Autoscaler {
    /// The policy the app follows now: its own, or the named one (absent while the
    /// control plane does not know the name: then nothing is decided).
    pub(super) fn policy(&self, spec: &AppSpec) -> Option<Policy> {
        match &spec.autoscaling_policy {
            Some(name) => self.book.load().get(name).cloned(),
            None => self.own.clone(),
        }
    }

    /// When the policy is next evaluated; `None` while the app follows none.
    pub(super) fn next_due_ms(&self, spec: &AppSpec) -> Option<u64> {
        let follows = match &spec.autoscaling_policy {
            Some(name) => self.book.load().contains_key(name),
            None => self.own.is_some(),
        };
        follows.then_some(self.next_eval_ms)
    }

    /// The name of the algorithm the app follows now (`basic`, `utilization`).
    pub(super) fn policy_algorithm(&self, spec: &AppSpec) -> Option<&'static str> {
        match &spec.autoscaling_policy {
            Some(name) => self.book.load().get(name).map(|p| p.algorithm.name()),
            None => self.own.as_ref().map(|p| p.algorithm.name()),
        }
    }

    /// Evaluates the policy once its interval has passed, and applies its decision to the
    /// desired units in `stored` (and, cancelling a scale-down, to its draining units).
    pub(super) fn step(&mut self, spec: &AppSpec, stored: &mut Stored, now: u64, writes: &mut Vec<Write>) {
        if now < self.next_eval_ms {
            return;
        }
        let Some(policy) = self.policy(spec) else {
            self.state = None;
            return;
        };
        self.next_eval_ms = now + policy.interval_ms;
        if self.demand.as_ref().is_some_and(|d| d.expires_unix_ms <= now) {
            tracing::info!(app = %spec.name, "consumer demand expired");
            self.demand = None;
        }
        let g = gather(spec, &stored.units, self.demand.as_ref());
        let signals = Signals {
            primary: g.primary,
            secondary: g.secondary,
            per_unit: g.per_unit,
            load: g.load,
            members: g.members.as_deref(),
        };
        let state = self.state.get_or_insert_with(|| State::new(&policy));
        let decision = evaluate(&policy, state, &signals, now);
        let (primary, secondary) = (decision.desired.primary, decision.desired.secondary);
        let wanted = primary.saturating_add(secondary);
        let over = stored.override_bounds;
        let (min, max) = (spec.units.min, spec.units.max);
        let total = match over {
            Some(o) => wanted.clamp(o.floor, o.ceiling),
            None => wanted,
        }
        .clamp(min, max);
        let secondary = secondary.min(total);
        let changed = stored.desired_units != Some(total) || stored.desired_secondary.unwrap_or(0) != secondary;
        if changed {
            stored.desired_units = Some(total);
            stored.desired_secondary = Some(secondary);
            writes.push(Write::DesiredUnits(total));
            writes.push(Write::DesiredSecondary(secondary));
        }
        match decision.action {
            Action::ScaleDown => self.drain_ms = decision.graceful_decommission_timeout_ms,
            Action::CancelScaleDown => cancel_scale_down(&mut stored.units, writes),
            _ => {}
        }

        let mut record = serde_json::to_value(&decision).unwrap_or_default();
        if let Some(obj) = record.as_object_mut() {
            obj.insert("at".into(), now.into());
            obj.insert("app".into(), spec.name.clone().into());
            obj.insert("applied_units".into(), total.into());
            if let Some(o) = over {
                obj.insert("override".into(), serde_json::json!({"floor": o.floor, "ceiling": o.ceiling}));
            }
            if total != wanted {
                let why = match over {
                    Some(o) if wanted < o.floor || wanted > o.ceiling => {
                        format!("the operator's override {}..={} holds the app at {total}", o.floor, o.ceiling)
                    }
                    _ => format!("the spec's units {min}..={max} hold the app at {total}"),
                };
                let text = obj.get("explanation").and_then(|e| e.as_str()).unwrap_or_default().to_string();
                obj.insert("explanation".into(), format!("{text}; {why}").into());
            }
        }
        let action = record.get("action").and_then(|a| a.as_str()).unwrap_or("none").to_string();
        let json = record.to_string();
        tracing::info!(app = %spec.name, policy = decision.policy, action = %action, desired = total, decision = %json, "autoscaler decision");
        metrics::counter!(m::AUTOSCALER_DECISIONS.name, "app" => spec.name.clone(), "policy" => decision.policy, "action" => action)
            .increment(1);
        metrics::gauge!(m::AUTOSCALER_DESIRED_UNITS.name, "app" => spec.name.clone()).set(f64::from(total));
        if let Some(e) = decision.inputs.get("estimate") {
            metrics::gauge!(m::AUTOSCALER_ESTIMATED_UNITS.name, "app" => spec.name.clone()).set(e);
        }
        self.keep(json, record, writes);
    }

    /// Records a rebalance move among the decisions (`reconcile::rebalance`).
    pub(super) fn record(&mut self, record: serde_json::Value, writes: &mut Vec<Write>) {
        self.keep(record.to_string(), record, writes);
    }

    /// Keeps decision `record` (`json` its text) in the store and the newest kept.
    fn keep(&mut self, json: String, record: serde_json::Value, writes: &mut Vec<Write>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        writes.push(Write::Decision(seq, json));
        self.decisions.push_back(Arc::new(record));
        while self.decisions.len() > DECISIONS_KEPT {
            self.decisions.pop_front();
        }
    }
}

/// Units draining because of a scale-down go back to serving (their members never
/// stopped): Dataproc cancels a scale-down the estimate no longer wants.
fn cancel_scale_down(units: &mut Units, writes: &mut Vec<Write>) {
    let draining = |u: &UnitRecord| {
        u.state == UnitState::Draining && u.replaced_by.is_none() && u.state.can_become(UnitState::Running)
    };
    units.update_matching(draining, |u| {
        tracing::info!(unit = %u.unit_id, "scale-down cancelled: the unit serves again");
        u.state = UnitState::Running;
        u.draining_since_unix_ms = None;
        u.drain_timeout_ms = None;
        writes.push(Write::Unit(u.shared()));
    });
}

/// The app's signals from its unit records (which `observe` keeps current) and the
/// consumer demand.
fn gather(spec: &AppSpec, units: &Units, demand: Option<&Demand>) -> Gathered {
    let mut primary = GroupUnits::default();
    let mut secondary = GroupUnits::default();
    for u in units.values() {
        let g = if u.secondary { &mut secondary } else { &mut primary };
        if counts_toward_desired(u) {
            g.active += 1;
        } else if matches!(u.state, UnitState::Draining | UnitState::Stopping) && u.replaced_by.is_none() {
            g.decommissioning += 1;
        }
    }
    let templates = spec.members();
    let member_res = |member: &str, alternative: u32| {
        templates
            .iter()
            .find(|(n, _, _)| n == member)
            .map(|(_, _, t)| t.alternative(alternative).resources())
            .map(|r| Res::new(r.cpu_millis, r.memory_bytes))
            .unwrap_or_default()
    };
    let per_unit = templates.iter().map(|(n, _, _)| member_res(n, 0)).fold(Res::default(), add);
    // Usage of the members of running units: all of it, or "no data".
    let mut members = Some(Vec::new());
    for u in units.values().filter(|u| matches!(u.state, UnitState::Running | UnitState::Degraded)) {
        for m in &u.members {
            match (m.usage, members.as_mut()) {
                (Some(used), Some(list)) => list.push(MemberUsage {
                    used: Res::new(used.cpu_millis, used.memory_bytes),
                    allocated: member_res(&m.member, m.alternative),
                }),
                _ => members = None,
            }
        }
    }
    let active = u64::from(primary.active + secondary.active);
    let capacity = Res::new(per_unit.cpu_millis * active, per_unit.memory_bytes * active);
    let demand = demand.map(Demand::total);
    let used = members.as_ref().map(|l| l.iter().fold(Res::default(), |a, m| add(a, m.used)));
    let load = match (used, demand) {
        (None, None) => None,
        (used, demand) => {
            let (used, demand) = (used.unwrap_or_default(), demand.unwrap_or_default());
            // Demand is work the app must be able to run: it counts as allocated
            // up to the capacity, and what is past the capacity is pending.
            let allocated = Res::new(
                used.cpu_millis.max(demand.cpu_millis).min(capacity.cpu_millis),
                used.memory_bytes.max(demand.memory_bytes).min(capacity.memory_bytes),
            );
            Some(Load {
                pending: Res::new(
                    demand.cpu_millis.saturating_sub(capacity.cpu_millis),
                    demand.memory_bytes.saturating_sub(capacity.memory_bytes),
                ),
                available: Res::new(
                    capacity.cpu_millis - allocated.cpu_millis,
                    capacity.memory_bytes - allocated.memory_bytes,
                ),
                allocated,
            })
        }
    };
    Gathered { primary, secondary, per_unit, load, members }
}

fn add(a: Res, b: Res) -> Res {
    Res::new(a.cpu_millis.saturating_add(b.cpu_millis), a.memory_bytes.saturating_add(b.memory_bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(cpu_millis: u64, count: u32) -> DemandRequest {
        DemandRequest { resources: Resources::new(cpu_millis, 0, 0), count }
    }

    #[test]
    fn a_demand_names_every_problem() {
        let mut odd = req(100, 1);
        odd.resources.custom.insert("unicorns".into(), 1);
        let bad = Demand::new(vec![req(0, 1), req(100, MAX_DEMAND_COUNT + 1), odd], 0, 5).unwrap_err();
        let text = bad.to_string();
        assert!(text.contains("\"unicorns\" is not a resource"), "{text}");
        assert!(text.contains("requests[0].resources"), "{text}");
        assert!(text.contains("requests[1].count"), "{text}");
        assert!(text.contains("ttl_seconds"), "{text}");
    }

    #[test]
    fn a_demand_totals_its_requests_and_expires() {
        let d = Demand::new(vec![req(500, 4), req(250, 2)], 30_000, 1_000).unwrap();
        assert_eq!(d.total(), Res::new(2_500, 0));
        assert_eq!(d.expires_unix_ms, 31_000);
    }
}
