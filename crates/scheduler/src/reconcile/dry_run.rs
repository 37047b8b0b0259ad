//! `flotilla apply --plan`: what applying a spec would do, decided by the same rules
//! the loop follows and changing nothing (`nomad job plan`).

use std::collections::HashMap;

use serde::Serialize;

use super::Scheduler;
use super::error::CommandError;
use crate::diff::{Change, spec_diff};
use crate::planner::{ClassCache, PlanInput, place_unit};
use crate::rollout::counts_toward_desired;
use crate::spec::AppSpec;

/// Most units a plan places dry (the rest of a larger first step is not tried).
pub const MAX_TRIED: u32 = 1_000;

/// What `apply` of a spec would do now.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ApplyPlan {
    pub app: String,
    /// The version in force (what `apply --check-version` would name).
    pub in_force: u64,
    /// The settings that would change; empty when the spec is the one in force.
    pub changes: Vec<Change>,
    /// Units that would roll to the new template, in the order they would, in batches
    /// of `rollout.max_unavailable`.
    pub roll: Vec<Vec<String>>,
    /// How many units would be created (the spec's bounds move the desired count up).
    pub create: u32,
    /// Units that would be stopped (the bounds move it down), in scale-in order.
    pub stop: Vec<String>,
    /// The units the first step places (the first batch of replacements and the new
    /// units), against the cluster view as it is now.
    pub to_place: u32,
    /// Of those (the first [`MAX_TRIED`]), how many fit, and why the rest do not (the planner's reasons, one
    /// entry per distinct reason with how many units it stops).
    pub fit: u32,
    pub cannot_place: Vec<CannotPlace>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CannotPlace {
    pub units: u32,
    pub reason: String,
}

impl Scheduler {
    /// Plans `spec` as [`Scheduler::apply_from`] would apply it, against the units
    /// and view of now.
    pub(super) fn plan_apply(&self, spec: &AppSpec) -> Result<ApplyPlan, CommandError> {
        if spec.name != self.spec.name {
            return Err(CommandError::WrongApp { app: self.spec.name.clone(), got: spec.name.clone() });
        }
        spec.validate().map_err(|e| CommandError::InvalidSpec(e.to_string()))?;
        metrics::counter!(crate::catalogue::SPEC_PLANS.name, "app" => spec.name.clone()).increment(1);
        let text = toml::to_string(spec).map_err(|e| CommandError::InvalidSpec(e.to_string()))?;
        let changes = spec_diff(&self.spec_text, &text);
        let fingerprint = spec.template_fingerprint();
        let batch = spec.rollout.max_unavailable.max(1) as usize;
        let roll: Vec<Vec<String>> = crate::rollout::rolling(&self.stored.units, &fingerprint)
            .chunks(batch)
            .map(|c| c.iter().map(|u| u.unit_id.clone()).collect())
            .collect();
        let counted: Vec<_> = self.stored.units.values().filter(|u| counts_toward_desired(u)).collect();
        let desired =
            self.stored.desired_units.unwrap_or(spec.units.initial).clamp(spec.units.min, spec.units.max) as usize;
        let create = desired.saturating_sub(counted.len()) as u32;
        let slots = self.cluster.slots();
        let stop = crate::repair::scale_in_order(&counted, counted.len().saturating_sub(desired), &slots);
        let to_place = roll.first().map_or(0, Vec::len) as u32 + create;
        // A dry placement runs on the scheduler's loop: a huge first step is judged by
        // its first units.
        let (fit, cannot_place) = self.try_placing(spec, to_place.min(MAX_TRIED), &slots);
        Ok(ApplyPlan {
            app: spec.name.clone(),
            in_force: self.version_in_force(),
            changes,
            roll,
            create,
            stop,
            to_place,
            fit,
            cannot_place,
        })
    }

    /// Places `n` units of `spec` one after another against `slots` (each one's
    /// resources held for the next), as the loop's planner would; nothing is claimed.
    fn try_placing(
        &self,
        spec: &AppSpec,
        n: u32,
        slots: &[std::sync::Arc<flotilla_view::ShardSlot>],
    ) -> (u32, Vec<CannotPlace>) {
        let requests = super::planning::member_requests(spec, false);
        let mut pending = self.planning.pending_by_node();
        let mut per_domain = self.units_per_domain();
        let mut per_node = self.units_per_node(None);
        let mut cache = ClassCache::default();
        let mut rng: rand::rngs::StdRng = rand::SeedableRng::seed_from_u64(0);
        let (mut fit, mut reasons) = (0u32, HashMap::<String, u32>::new());
        for _ in 0..n {
            let input = PlanInput {
                max_units_per_domain: spec.spread.max_units_per_domain,
                max_units_per_node: spec.spread.max_units_per_node,
                prefer_spread: spec.spread.spreads_over_nodes(spec.serves()),
                members: spec.spread.members,
                ..PlanInput::new(slots, &per_domain, &per_node, &pending)
            };
            match place_unit(&input, &requests, &mut cache, &mut rng) {
                Ok(p) => {
                    fit += 1;
                    super::planning::hold(&p, &requests, &mut pending, &mut per_node, &mut per_domain);
                }
                Err(why) => *reasons.entry(why.to_string()).or_default() += 1,
            }
        }
        let mut cannot: Vec<CannotPlace> =
            reasons.into_iter().map(|(reason, units)| CannotPlace { units, reason }).collect();
        cannot.sort_by(|a, b| b.units.cmp(&a.units).then_with(|| a.reason.cmp(&b.reason)));
        (fit, cannot)
    }
}
