//! How a pass publishes what the world sees ([`super::handle`]): the status the API
//! shows and the unit gauges, each stored only when it changed, and the route table with
//! the capacity it gives.

use std::sync::Arc;

use flotilla_core::now_ms;
use flotilla_proto::v1;

use super::Scheduler;
use super::handle::{AppStatus, AutoscalingStatus};
use crate::catalogue as m;
use crate::lifecycle::UnitState;
use crate::store::UnitRecord;

impl Scheduler {
    /// The kept versions as the last status had them, rebuilt only when an apply changed them.
    fn published_versions(&self) -> Arc<Vec<Arc<crate::store::SpecVersion>>> {
        let old = self.out.status.load().versions.clone();
        let newest = self.stored.versions.keys().next_back().copied();
        if old.len() == self.stored.versions.len() && old.last().map(|v| v.version) == newest {
            return old;
        }
        Arc::new(self.stored.versions.values().map(|v| Arc::new(v.clone())).collect())
    }

    /// Publishes the unit counts by state (metrics) and the status the API shows, each
    /// only when it changed: a store into the status cell costs in proportion to the
    /// threads the process ever ran (`arc_swap`), and an idle app's passes change nothing.
    pub(super) fn publish(&mut self) {
        self.publish_with(false);
    }

    /// As [`Scheduler::publish`]; `units_as_shown`: the units are as the last status
    /// shows them (a timers' pass that wrote nothing), so they are not compared again.
    pub(super) fn publish_with(&mut self, units_as_shown: bool) {
        let mut counts = [0i64; UnitState::ALL.len()];
        for u in self.stored.units.values() {
            counts[UnitState::ALL.iter().position(|s| *s == u.state).unwrap_or(0)] += 1;
        }
        if self.out.counts != Some(counts) {
            for (s, c) in UnitState::ALL.iter().zip(counts) {
                metrics::gauge!(m::UNITS.name, "app" => self.spec.name.clone(), "state" => s.as_str()).set(c as f64);
            }
            self.out.counts = Some(counts);
        }
        let status = AppStatus {
            app: self.spec.name.clone(),
            serving_roles: self.spec.routing.roles.clone(),
            desired_units: self.desired(),
            min_units: self.spec.units.min,
            max_units: self.spec.units.max,
            units: match units_as_shown {
                true => self.out.status.load().units.clone(),
                false => self.stored.units.shared().cloned().collect(),
            },
            unit_shape: self.unit_shape(),
            autoscaling: self.spec.is_autoscaled().then(|| AutoscalingStatus {
                policy: self.autoscaler.policy_algorithm(&self.spec),
                policy_name: self.spec.autoscaling_policy.clone(),
                override_bounds: self.stored.override_bounds,
                demand: self.autoscaler.demand.clone(),
                last_decision: self
                    .autoscaler
                    .decisions
                    .iter()
                    .rev()
                    .find(|d| !matches!(d["kind"].as_str(), Some("rebalance" | "rollout")))
                    .map(|d| d.as_ref().clone()),
            }),
            spec_toml: self.spec_text.clone(),
            has_previous_spec: self.stored.previous_spec.is_some(),
            versions: self.published_versions(),
            spec_origin: self.stored.spec_origin.clone(),
            template: self.fingerprints.template.clone(),
            rollout: self.stored.rollout.clone(),
            canary: self.canary_status(),
            store_error: self.store.failing(),
            waiting: (!self.tracking.started).then(|| self.waiting_for()).flatten(),
            scheduler: self.leader.role(),
        };
        if **self.out.status.load() != status {
            self.out.status.store(Arc::new(status));
        }
        let newest = self.autoscaler.decisions.back();
        if !self.out.decisions.load().first().zip(newest).is_some_and(|(a, b)| Arc::ptr_eq(a, b)) && newest.is_some() {
            self.out.decisions.store(Arc::new(self.autoscaler.decisions.iter().rev().cloned().collect()));
        }
    }

    /// Recomputes the route table and publishes it under a new version if it changed.
    pub fn publish_routes(&mut self) {
        let slots = self.cluster.slots();
        let units: Vec<&UnitRecord> = self.stored.units.values().collect();
        let template =
            |m: &crate::store::MemberRecord| Some(self.spec.template_for(&m.role)?.alternative(m.alternative));
        let routes = self.out.weights.table(
            &units,
            &self.spec.routing.roles,
            &slots,
            &self.spec.routing.performance,
            &template,
            now_ms(),
        );
        let current = self.out.routes.borrow().clone();
        let split = self.canary_split();
        if current.routes != routes || current.split != split {
            self.publish_table(&current, routes, split);
        }
    }

    /// Moves the route weights that drifted since the last table (`routes::Weights::reweigh`)
    /// without computing the table again: nothing else changed, or a pass or a view change
    /// would have computed it.
    pub(super) fn reweigh_routes(&mut self) {
        let current = self.out.routes.borrow().clone();
        if let Some(routes) = self.out.weights.reweigh(&current.routes, now_ms()) {
            self.publish_table(&current, routes, current.split.clone());
        }
    }

    /// Publishes `routes` as the table after `current`, with the capacity they give.
    fn publish_table(&mut self, current: &v1::RouteTable, routes: Vec<v1::Route>, split: Option<v1::VersionSplit>) {
        let changed = routes.iter().filter(|r| !current.routes.contains(r)).count();
        self.out.weight_changes.increment(changed as u64);
        let table = v1::RouteTable { app: self.spec.name.clone(), version: current.version + 1, routes, split };
        let capacity = crate::routes::capacity(&table, &self.out.weights);
        let old = self.out.capacity.borrow().clone();
        if (old.total_weight, &old.by_priority) != (capacity.total_weight, &capacity.by_priority) {
            self.out.capacity_weight.set(capacity.total_weight);
            self.out.capacity.send_replace(Arc::new(capacity));
        }
        self.out.routes.send_replace(Arc::new(table));
    }
}
