//! The consolidation step of a pass: follows the node being emptied (terminates it once
//! its members moved, gives it back at the deadline) and, when none is and the pool has
//! been still for `consolidation.after`, starts the next one `crate::consolidate` picks.

use std::collections::{BTreeSet, HashMap};

use serde_json::Value;

use super::{Autoscaler, Seen};
use crate::catalogue as m;
use crate::instance::{Change, InstanceState};
use crate::model::{Constraints, IdleClock, NodeRow, Observation, Phase};
use crate::pack::{Cause, Plan};

/// What the step did, for the pass's decision record.
#[derive(Default)]
pub(super) struct Step {
    pub why: Vec<String>,
    pub record: Option<Value>,
}

impl Autoscaler {
    pub(super) async fn consolidation(
        &mut self,
        seen: &Seen<'_>,
        plan: &Plan,
        now: u64,
        changes: &mut Vec<Change>,
    ) -> Step {
        let mut step = Step::default();
        let settings = self.cfg.consolidation;
        let rows: HashMap<&str, &NodeRow> = seen.own.iter().map(|n| (n.node_id.as_str(), *n)).collect();
        let busy = !plan.launch.is_empty() || !plan.terminate.is_empty();
        if busy || seen.apps.iter().any(|a| a.queued.primary + a.queued.secondary > 0) {
            self.still_since_ms = now;
        }
        // Kept while the instance is (the count of give-ups in a row doubles the wait).
        let instances = &self.instances;
        self.given_up.retain(|id, _| instances.get(id).is_some());
        let emptying: Vec<(String, u64)> = self
            .instances
            .iter()
            .filter(|i| i.state == InstanceState::Running)
            .filter_map(|i| i.consolidating_since_ms.map(|s| (i.id.clone(), s)))
            .collect();
        // The whole consolidation is given up at once when demand needs new nodes (the
        // cordoned room is wanted: no penalty), or its replacement node failed to come.
        let replacement_failed = self.consolidation_launch.as_deref().is_some_and(|id| {
            self.instances
                .get(id)
                .is_none_or(|i| !matches!(super::phase(i.state), Some(Phase::Pending | Phase::Running)))
        });
        let abandon = if !plan.launch.is_empty() {
            Some(("demand waits for new nodes: the room of the nodes being emptied is needed", false))
        } else if replacement_failed {
            Some(("the node launched for their members did not come", true))
        } else {
            None
        };
        for (id, since) in &emptying {
            let elapsed = now.saturating_sub(*since);
            let row = rows.get(id.as_str());
            let give_up = if let Some((why, penalty)) = abandon {
                Some((why.to_string(), penalty))
            } else if row.is_some_and(|r| r.allocated.is_zero() && r.workloads == 0) {
                let why = "its members moved to other nodes";
                match self.instances.request_drain(id, now, Cause::Consolidation, why) {
                    Ok(c) => changes.push(c),
                    Err(e) => tracing::warn!(instance = %id, error = %e, "terminating a consolidated node"),
                }
                step.why.push(format!("terminate {id} (consolidation: {why})"));
                self.count(&m::CONSOLIDATIONS, "done");
                metrics::counter!(m::TERMINATIONS.name, "pool" => self.cfg.name.clone(),
                    "node_type" => self.instances.get(id).map(|i| i.node_type.clone()).unwrap_or_default(),
                    "cause" => Cause::Consolidation.as_str())
                .increment(1);
                None
            } else if elapsed > settings.deadline.as_millis() as u64 {
                let s = settings.deadline.as_secs();
                Some((format!("its members did not move within consolidation.deadline ({s}s)"), true))
            } else if row.is_some_and(|r| !r.cordoned) && elapsed > 2 * self.cfg.interval.as_millis() as u64 {
                Some(("it was uncordoned".to_string(), true))
            } else {
                if row.is_some_and(|r| !r.cordoned) {
                    // The cordon has not shown in the view yet: ask again (idempotent).
                    self.cordon(id, true).await;
                }
                None
            };
            if let Some((why, penalty)) = give_up {
                self.instances.set_consolidating(id, None);
                if penalty {
                    // Left alone for a deadline, doubling with each give-up in a row.
                    let times = self.given_up.get(id).map_or(0, |(_, n)| *n) + 1;
                    let wait = (settings.deadline.as_millis() as u64).saturating_mul(1 << times.min(6)) / 2;
                    self.given_up.insert(id.clone(), (now + wait, times));
                }
                self.cordon(id, false).await;
                tracing::info!(pool = %self.cfg.name, instance = %id, %why, "consolidation given up");
                step.why.push(format!("consolidation of {id} given up: {why}"));
                self.count(&m::CONSOLIDATIONS, "given_up");
            }
        }
        if emptying.is_empty() {
            self.consolidation_launch = None;
        }
        let still_ms = now.saturating_sub(self.still_since_ms);
        if !settings.enabled || !emptying.is_empty() || busy || still_ms < settings.after.as_millis() as u64 {
            return step;
        }
        let skip: BTreeSet<String> =
            self.given_up.iter().filter(|(_, (until, _))| *until > now).map(|(id, _)| id.clone()).collect();
        let obs = Observation {
            nodes: seen.nodes,
            apps: seen.apps,
            instances: seen.instances,
            floor: &Constraints::default(),
            idle: &IdleClock::default(),
            unavailable: seen.unavailable,
            now_ms: now,
        };
        let Some(c) = crate::consolidate::plan(&self.cfg, &obs, &skip) else { return step };
        tracing::info!(pool = %self.cfg.name, nodes = ?c.nodes, launch = ?c.launch, saving = c.saving_per_hour,
            members = c.members, "consolidating");
        if let Some(t) = &c.launch {
            self.consolidation_launch = self.instances.queue(t, 1, now, &c.explanation).into_iter().next();
            metrics::counter!(m::LAUNCHES.name, "pool" => self.cfg.name.clone(), "node_type" => t.clone()).increment(1);
        }
        for id in &c.nodes {
            self.instances.set_consolidating(id, Some(now));
            self.cordon(id, true).await;
        }
        self.count(&m::CONSOLIDATIONS, "started");
        step.why.push(c.explanation.clone());
        step.record = serde_json::to_value(&c).ok();
        step
    }

    /// `&mut self`: the future holds it across the call, and an `&Autoscaler` is not
    /// `Send` (its store is not `Sync`).
    async fn cordon(&mut self, id: &str, cordoned: bool) {
        if let Err(e) = self.cluster.set_cordon(id, cordoned).await {
            tracing::warn!(instance = %id, cordoned, error = %e, "cordoning a node for consolidation failed; retrying next pass");
        }
    }

    fn count(&self, family: &flotilla_obs::Family, outcome: &'static str) {
        metrics::counter!(family.name, "pool" => self.cfg.name.clone(), "outcome" => outcome).increment(1);
    }
}
