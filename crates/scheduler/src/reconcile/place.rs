//! Place and commit: queued units are planned against the view, written ahead as
//! Placing, committed grouped by shard, and settled by the ledgers' verdicts. What was
//! rejected stays queued for the next attempt against a fresher view.

use crate::catalogue as m;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::Ordering;
use std::time::Instant;

use flotilla_core::now_ms;
use flotilla_proto::v1;
use flotilla_view::Version;

use super::handle::Stats;
use super::ledgers::{CommitError, claims, member_records};
use super::{Scheduler, save};
use crate::lifecycle::UnitState;
use crate::planner::{NodeMap, Placement, PlanInput, place_unit};
use crate::store::{StoreError, Write};

/// Units planned between two yields to the runtime (a few milliseconds of work).
pub(super) const PLAN_CHUNK: usize = 64;

/// Placements of one pass, by the shard that must accept them.
type ByShard = BTreeMap<usize, Vec<(String, Placement)>>;

impl Scheduler {
    /// Plans every unit in `ids`, commits them grouped by shard, and returns the ids
    /// still queued (rejected or unplaceable).
    pub(super) async fn place_and_commit(&mut self, ids: &[String], writes: &mut Vec<Write>) -> Vec<String> {
        let (mut by_shard, mut still) = self.plan(ids).await;
        if by_shard.is_empty() {
            return still;
        }
        if let Err(e) = self.write_ahead(&by_shard, writes) {
            tracing::warn!(error = %e, "cannot record the units being placed; committing nothing");
            for (id, _) in by_shard.into_values().flatten() {
                if let Some(mut u) = self.stored.units.get_mut(&id) {
                    u.state = UnitState::Queued;
                }
                still.push(id);
            }
            return still;
        }
        // Shown Placing before any claim lands: a pool autoscaler that sees a node's
        // new allocation must not still count the unit as queued demand. The whole
        // status, not only these units: the pass may have changed others (a replacement
        // now Running, the unit it replaces draining), and a status showing the new
        // units beside the old states of those says the rollout broke its own limits.
        self.publish();
        let mut batches = Vec::with_capacity(by_shard.len());
        for (&shard, units) in &by_shard {
            let claims = units.iter().flat_map(|(id, p)| self.claims_of(id, p)).collect();
            let txn_id = self.ledgers.txn_id(&format!("{}-{}", self.spec.name, now_ms()));
            batches.push((shard, txn_id, claims));
        }
        for (shard, took, result) in self.ledgers.commit_all(batches).await {
            let units = by_shard.remove(&shard).unwrap_or_default();
            metrics::histogram!(m::SCHEDULER_COMMIT_SECONDS.name).record(took.as_secs_f64());
            Stats::record(&self.out.stats.commit_us, took);
            match result {
                Ok(resp) => still.extend(self.settle(shard, units, resp, writes)),
                Err(e @ CommitError::Unknown { .. }) => self.fail_unknown(shard, units, &e, writes),
                Err(e @ CommitError::Refused { .. }) => {
                    tracing::warn!(error = %e, "commit failed; will retry");
                    for (id, _) in units {
                        if let Some(mut unit) = self.stored.units.get_mut(&id) {
                            unit.state = UnitState::Queued;
                            unit.unplaced_reason = Some(e.to_string());
                        }
                        still.push(id);
                    }
                }
            }
        }
        still
    }

    /// Plans each unit against the view and what this scheduler committed but the view
    /// does not show yet. Planned units become Placing; the rest say why not.
    ///
    /// Yields to the runtime every [`PLAN_CHUNK`] units: planning a full pass takes tens
    /// of milliseconds, and the schedulers, API and view followers sharing the process
    /// would otherwise wait that long for their turn (a commit answered meanwhile is
    /// late by as much: it set the commit p99 in the loadtest). Each chunk plans against
    /// the view as it is then, so what others committed meanwhile is not claimed again.
    async fn plan(&mut self, ids: &[String]) -> (ByShard, Vec<String>) {
        let mut slots = self.cluster.slots();
        let requests = [false, true].map(|secondary| super::planning::member_requests(&self.spec, secondary));
        let mut pending = self.planning.pending_by_node();
        let mut per_domain = self.units_per_domain();
        let mut per_node = self.units_per_node(None);
        // Make-before-break replacements may pass the spread maxima by the units leaving.
        // replacement id → the domain of the unit it replaces
        let replacing: HashMap<&str, Option<&str>> = self
            .stored
            .units
            .values()
            .filter(|u| u.state.is_active())
            .filter_map(|u| Some((u.replaced_by.as_deref()?, u.domain.as_deref())))
            .collect();
        let leaving = replacing.len() as u32;
        let replacements: Vec<Option<Option<String>>> =
            ids.iter().map(|id| replacing.get(id.as_str()).map(|d| d.map(str::to_string))).collect();
        let mut by_shard = ByShard::new();
        let mut still = Vec::new();
        for (n, (id, replacement)) in ids.iter().zip(replacements).enumerate() {
            if n > 0 && n % PLAN_CHUNK == 0 {
                tokio::task::yield_now().await;
                slots = self.cluster.slots();
            }
            let started = Instant::now();
            let secondary = self.stored.units.get(id).is_some_and(|u| u.secondary);
            let input = PlanInput {
                surge: if replacement.is_some() { leaving } else { 0 },
                prefer_domain: replacement.as_ref().and_then(|d| d.as_deref()),
                ..self.spread_input(PlanInput::new(&slots, &per_domain, &per_node, &pending))
            };
            let (classes, rng) = self.planning.planner(secondary);
            let requests = &requests[usize::from(secondary)];
            let plan = place_unit(&input, requests, classes, rng);
            metrics::histogram!(m::PLAN_SECONDS.name).record(started.elapsed().as_secs_f64());
            Stats::record(&self.out.stats.decision_us, started.elapsed());
            let Some(unit) = self.stored.units.get(id) else { continue };
            match plan {
                Err(why) => {
                    // A pass that only hit the class cache examined nothing new: keep the
                    // reason the last real examination gave.
                    if why.domains_tried > 0 || unit.unplaced_reason.is_none() {
                        let reason = why.to_string();
                        if unit.unplaced_reason.as_deref() != Some(reason.as_str()) {
                            tracing::info!(unit = %id, %reason, "unit cannot be placed yet");
                            if let Some(mut u) = self.stored.units.get_mut(id) {
                                u.unplaced_reason = Some(reason);
                            }
                        }
                    }
                    still.push(id.clone());
                }
                Ok(p) => {
                    super::planning::hold(&p, requests, &mut pending, &mut per_node, &mut per_domain);
                    if let Some(mut unit) = self.stored.units.get_mut(id) {
                        unit.state = UnitState::Placing;
                    }
                    by_shard.entry(p.shard).or_default().push((id.clone(), p));
                }
            }
        }
        (by_shard, still)
    }

    /// Write ahead: a scheduler that dies with a commit in flight must find its units
    /// Placing when it restarts (adopt releases what they may hold) and must never reuse
    /// their ids for other units.
    fn write_ahead(&mut self, by_shard: &ByShard, writes: &mut Vec<Write>) -> Result<(), StoreError> {
        for (id, _) in by_shard.values().flatten() {
            if let Some(u) = self.stored.units.get_shared(id) {
                writes.push(Write::Unit(u.clone()));
            }
        }
        let batch = std::mem::take(writes);
        self.wrote = true;
        // Not written: the pass keeps the batch (it is retried with the pass's other writes).
        save(&*self.store, &self.spec.name, &batch).inspect_err(|_| *writes = batch)
    }

    /// Applies a shard's verdicts: a unit all of whose claims were accepted is Allocated,
    /// any other goes back to the queue. Returns the ids queued again.
    fn settle(
        &mut self,
        shard: usize,
        units: Vec<(String, Placement)>,
        resp: v1::CommitResponse,
        writes: &mut Vec<Write>,
    ) -> Vec<String> {
        let shown_in: Version = resp.applied_in.unwrap_or_default().into();
        self.count_verdicts(&resp);
        let verdicts: HashMap<(&str, &str), (bool, &str)> = resp
            .results
            .iter()
            .filter_map(|r| {
                let k = r.key.as_ref()?;
                Some(((k.unit.as_str(), k.member.as_str()), (r.accepted, r.detail.as_str())))
            })
            .collect();
        let mut requeued = Vec::new();
        for (id, p) in units {
            let rejected: Vec<String> = p
                .members
                .iter()
                .filter_map(|m| match verdicts.get(&(id.as_str(), m.member.as_str())) {
                    Some((true, _)) => None,
                    Some((false, why)) => Some(format!("{} on {}: {why}", m.member, m.node)),
                    None => Some(format!("{}: no answer", m.member)),
                })
                .collect();
            let Some(mut unit) = self.stored.units.get_mut(&id) else { continue };
            if !rejected.is_empty() {
                metrics::counter!(m::PLACEMENTS.name, "result" => "conflict").increment(1);
                unit.state = UnitState::Queued;
                unit.unplaced_reason = Some(format!("commit rejected: {}", rejected.join("; ")));
                requeued.push(id);
                continue;
            }
            metrics::counter!(m::PLACEMENTS.name, "result" => "committed").increment(1);
            unit.state = UnitState::Allocated;
            unit.domain = Some(p.domain.clone());
            unit.unplaced_reason = None;
            if let Some(note) = &p.note {
                tracing::info!(unit = %id, %note, "unit placed where spread could not be honoured");
            }
            unit.placement_note = p.note.clone();
            unit.members = member_records(&self.spec, &self.fingerprints.roles, &p, shard);
            // It runs the spec in force, whatever was in force when it was queued.
            unit.template = Some(self.fingerprints.template.clone());
            unit.frame = Some(self.fingerprints.frame.clone());
            super::planning::count_placed(&self.spec, &p);
            for (m, (_, _, t)) in p.members.iter().zip(self.spec.members()) {
                self.planning.committed(shard, shown_in, m.node.clone(), t.alternative(m.alternative).resources());
            }
            tracing::info!(unit = %id, domain = %p.domain, "unit allocated");
            writes.push(Write::Unit(unit.shared()));
        }
        requeued
    }

    /// Counts accepted and conflicting claims, and Omega's conflict fraction (conflicts
    /// per successful claim, since start).
    fn count_verdicts(&self, resp: &v1::CommitResponse) {
        let accepted = resp.results.iter().filter(|r| r.accepted).count() as u64;
        let rejected = resp.results.len() as u64 - accepted;
        let ok = self.out.stats.claims_accepted.fetch_add(accepted, Ordering::Relaxed) + accepted;
        let conflicts = self.out.stats.claims_rejected.fetch_add(rejected, Ordering::Relaxed) + rejected;
        metrics::counter!(m::SCHEDULER_CLAIMS.name, "result" => "accepted").increment(accepted);
        metrics::counter!(m::SCHEDULER_CLAIMS.name, "result" => "conflict").increment(rejected);
        metrics::gauge!(m::SCHEDULER_CONFLICT_RATIO.name, "app" => self.spec.name.clone())
            .set(conflicts as f64 / ok.max(1) as f64);
    }

    /// The claims may hold on the shard: placing the units again elsewhere under the same
    /// keys could run a member twice. They fail instead (their release is retried until
    /// it goes through) and replacements with new ids are queued.
    fn fail_unknown(
        &mut self,
        shard: usize,
        units: Vec<(String, Placement)>,
        e: &CommitError,
        writes: &mut Vec<Write>,
    ) {
        tracing::warn!(error = %e, "commit outcome unknown: failing its units");
        for (id, p) in units {
            if let Some(mut unit) = self.stored.units.get_mut(&id) {
                metrics::counter!(m::PLACEMENTS.name, "result" => "unknown").increment(1);
                unit.state = UnitState::Failed;
                unit.domain = Some(p.domain.clone());
                unit.members = member_records(&self.spec, &self.fingerprints.roles, &p, shard);
                unit.unplaced_reason = Some(format!("commit outcome unknown: {e}"));
                writes.push(Write::Unit(unit.shared()));
            }
        }
    }

    fn claims_of(&self, unit_id: &str, p: &Placement) -> Vec<v1::Claim> {
        let unit = self.stored.units.get(unit_id);
        let generation = unit.map_or(0, |u| u.generation);
        claims(&self.spec, unit_id, &|_| generation, unit.is_some_and(|u| u.secondary), p)
    }

    /// Active units of the app on each node (a unit counts once on every node where one
    /// of its members, or a member coming up to replace one, is placed), leaving out
    /// unit `except`: for node spread.
    pub(super) fn units_per_node(&self, except: Option<&str>) -> NodeMap<u32> {
        let counts = self.stored.units.counts();
        match except.and_then(|id| self.stored.units.get(id)) {
            Some(u) => counts.without(u).per_node,
            None => counts.per_node.clone(),
        }
    }

    /// `input` with the app's spread: the maxima, the node preference and `spread.members`.
    pub(super) fn spread_input<'a>(&self, input: PlanInput<'a>) -> PlanInput<'a> {
        let spread = &self.spec.spread;
        PlanInput {
            max_units_per_domain: spread.max_units_per_domain,
            max_units_per_node: spread.max_units_per_node,
            prefer_spread: spread.spreads_over_nodes(self.spec.serves()),
            members: spread.members,
            ..input
        }
    }

    /// Active units of the app in each domain, for the spread limit.
    pub(super) fn units_per_domain(&self) -> HashMap<String, u32> {
        self.stored.units.counts().per_domain.clone()
    }
}
