//! A canary rollout carried out (`crate::canary` decides): each pass starts the step whose
//! units run, judges the step in force on the routers' numbers, and moves the rollout
//! record on (next step, promoted, or failed and reverted). Operators promote and abort
//! through [`Command::Promote`](super::Command) and `Abort`.

use crate::catalogue as m;
use flotilla_core::LockExt;
use flotilla_proto::v1;

use super::Scheduler;
use super::error::CommandError;
use crate::canary::{self, CanaryProgress, Verdict};
use crate::rollout::progressing;
use crate::store::{RolloutRecord, RolloutState, Write};

impl Scheduler {
    /// The canary of the spec in force while it shifts traffic (not promoted, not ended).
    fn canary(&self) -> Option<&CanaryProgress> {
        let r = self.stored.rollout.as_ref()?;
        if r.state != RolloutState::InProgress || r.template != self.fingerprints.template {
            return None;
        }
        r.canary.as_ref().filter(|p| canary::shifting(&self.spec.rollout, Some(p)))
    }

    /// A canary of the spec in force that was never promoted, and whether it failed (a
    /// failed one that could not be reverted still holds: its new units take no traffic
    /// and its old units do not drain, unjudged).
    fn unpromoted(&self) -> Option<(&CanaryProgress, bool)> {
        let r = self.stored.rollout.as_ref().filter(|r| r.template == self.fingerprints.template)?;
        let p = r.canary.as_ref().filter(|p| !p.promoted)?;
        match r.state {
            RolloutState::InProgress => Some((p, false)),
            RolloutState::Failed => Some((p, true)),
            RolloutState::Complete => None,
        }
    }

    /// How many units may have a replacement of the spec's template now (`None`: no
    /// canary holds the rollout).
    pub(super) fn canary_hold(&self) -> Option<u32> {
        match self.unpromoted()? {
            (p, false) => Some(canary::units_for(&self.spec.rollout, p.step, self.desired())),
            (_, true) => Some(0),
        }
    }

    /// The route table's split between the new version and the others.
    pub(super) fn canary_split(&self) -> Option<v1::VersionSplit> {
        let share = match self.unpromoted()? {
            (p, false) => canary::share(&self.spec.rollout, p),
            (_, true) => 0.0,
        };
        Some(v1::VersionSplit { version: self.fingerprints.template.clone(), share })
    }

    pub(super) fn canary_status(&self) -> Option<canary::CanaryStatus> {
        let p = self.canary()?;
        Some(canary::status(&self.spec.rollout, p, &self.out.traffic.lock_or_recover()))
    }

    /// Units whose replacement of the spec's template runs.
    fn new_version_running(&self) -> u32 {
        let units = &self.stored.units;
        let replacement = |id: &String| units.get(id).filter(|r| r.state.is_active());
        units
            .values()
            .filter(|u| u.state.is_active())
            .filter_map(|u| u.replaced_by.as_ref().and_then(replacement))
            .filter(|r| r.template.as_deref() == Some(self.fingerprints.template.as_str()) && progressing(r))
            .count() as u32
    }

    /// Moves a canary on after the pass's rollout plan; `Some(why)` when its step failed
    /// (the caller fails the rollout and reverts the spec).
    pub(super) fn follow_canary(&mut self, now: u64, writes: &mut Vec<Write>) -> Option<String> {
        let Some(p) = self.canary().cloned() else {
            self.out.traffic.lock_or_recover().start(None);
            metrics::gauge!(m::ROLLOUT_STEP.name, "app" => self.spec.name.clone()).set(0.0);
            metrics::gauge!(m::ROLLOUT_SHARE.name, "app" => self.spec.name.clone()).set(0.0);
            return None;
        };
        let template = self.fingerprints.template.clone();
        let rollout = self.spec.rollout.clone();
        let mut next = p.clone();
        let mut failed = None;
        if p.step_started_unix_ms.is_none() {
            let want = canary::units_for(&rollout, p.step, self.desired());
            let running = self.new_version_running();
            if running >= want {
                tracing::info!(app = %self.spec.name, step = p.step + 1, units = running, "canary step starts");
                next.step_started_unix_ms = Some(now);
                next.waiting = None;
                self.out.traffic.lock_or_recover().start(Some(&template));
            } else {
                next.waiting = Some(format!("step {}: {running} of {want} units of the new version run", p.step + 1));
            }
        } else {
            let mut book = self.out.traffic.lock_or_recover();
            if book.version() != Some(template.as_str()) {
                // A scheduler that restarted (or took over) mid-step: the step counts
                // again from now, its numbers having been in the old process.
                book.start(Some(&template));
                next.step_started_unix_ms = Some(now);
            }
            let verdict = canary::judge(&rollout, &next, &book, now);
            let numbers = canary::numbers(&book);
            let stable_p99 = canary::stable_p99(&rollout.analysis, &book.stable);
            match verdict {
                Verdict::Hold(waiting) => next.waiting = waiting,
                Verdict::Next => {
                    next.step += 1;
                    next.step_started_unix_ms = None;
                    next.waiting = None;
                    next.stable_p99_us = stable_p99.map(|ms| (ms * 1000.0) as u64).or(p.stable_p99_us);
                    book.start(None);
                }
                Verdict::Promote => {
                    next.promoted = true;
                    next.waiting = None;
                    book.start(None);
                }
                Verdict::Abort(why) => {
                    book.start(None);
                    failed = Some(why);
                }
            }
            drop(book);
            let action = match (&failed, next.promoted, next.step != p.step) {
                (Some(_), _, _) => Some("aborted"),
                (None, true, _) => Some("promoted"),
                (None, false, true) => Some("passed"),
                _ => None,
            };
            if let Some(action) = action {
                let why = failed.clone().unwrap_or_else(|| format!("step {} passed ({numbers})", p.step + 1));
                self.canary_decision(action, p.step, &why, now, writes);
            }
        }
        let share = if failed.is_some() || next.promoted { 0.0 } else { canary::share(&rollout, &next) };
        let step = if failed.is_some() || next.promoted { 0.0 } else { f64::from(next.step + 1) };
        metrics::gauge!(m::ROLLOUT_STEP.name, "app" => self.spec.name.clone()).set(step);
        metrics::gauge!(m::ROLLOUT_SHARE.name, "app" => self.spec.name.clone()).set(share);
        // Why it waits changes with every report: kept in memory, not written each time.
        let quiet = |c: &CanaryProgress| CanaryProgress { waiting: None, ..c.clone() };
        if failed.is_none() && quiet(&next) != quiet(&p) {
            self.set_canary(next, writes);
        } else if let Some(c) = self.stored.rollout.as_mut().and_then(|r| r.canary.as_mut()) {
            c.waiting = next.waiting;
        }
        failed
    }

    fn set_canary(&mut self, progress: CanaryProgress, writes: &mut Vec<Write>) {
        if let Some(r) = self.stored.rollout.as_mut() {
            r.canary = Some(progress);
            writes.push(Write::Rollout(r.clone()));
        }
    }

    /// A decision record (`flotilla decisions`, the events) of a canary's step.
    fn canary_decision(&mut self, action: &'static str, step: u32, why: &str, now: u64, writes: &mut Vec<Write>) {
        metrics::counter!(m::CANARY_VERDICTS.name, "app" => self.spec.name.clone(), "verdict" => action).increment(1);
        tracing::info!(app = %self.spec.name, step = step + 1, action, %why, "canary");
        let record = serde_json::json!({
            "kind": "rollout",
            "policy": "canary",
            "action": action,
            "at": now,
            "app": self.spec.name,
            "template": self.fingerprints.template,
            "step": step + 1,
            "explanation": format!("canary {action}: {why}"),
        });
        self.autoscaler.record(record, writes);
    }

    /// `flotilla rollout promote`: the canary in force ends its traffic shifting now and
    /// the rest rolls as a rolling update.
    pub(super) fn promote(&mut self, by: Option<String>) -> Result<RolloutRecord, CommandError> {
        let Some(p) = self.canary().cloned() else {
            return Err(CommandError::NoCanary(self.spec.name.clone()));
        };
        let now = flotilla_core::now_ms();
        let mut writes = Vec::new();
        let who = by.map(|b| format!(" by {b}")).unwrap_or_default();
        self.canary_decision("promoted", p.step, &format!("promoted{who} at step {}", p.step + 1), now, &mut writes);
        self.set_canary(CanaryProgress { promoted: true, waiting: None, ..p }, &mut writes);
        self.out.traffic.lock_or_recover().start(None);
        super::save(&*self.store, &self.spec.name, &writes).map_err(|e| CommandError::Store(e.to_string()))?;
        self.stored.rollout.clone().ok_or_else(|| CommandError::NoCanary(self.spec.name.clone()))
    }

    /// `flotilla rollout abort`: fails the canary in force and reverts to the last spec
    /// that ran, as a failed step does.
    pub(super) fn abort(&mut self, by: Option<String>) -> Result<RolloutRecord, CommandError> {
        let Some(p) = self.canary().cloned() else {
            return Err(CommandError::NoCanary(self.spec.name.clone()));
        };
        let now = flotilla_core::now_ms();
        let mut writes = Vec::new();
        let who = by.map(|b| format!(" by {b}")).unwrap_or_default();
        let why = format!("rollout aborted{who} at step {}", p.step + 1);
        let failed =
            self.stored.rollout.as_ref().and_then(|r| r.advance(&self.fingerprints.template, Some(&why), false, now));
        self.canary_decision("aborted", p.step, &why, now, &mut writes);
        self.out.traffic.lock_or_recover().start(None);
        self.follow_rollout(Some(why), true, now, &mut writes);
        super::save(&*self.store, &self.spec.name, &writes).map_err(|e| CommandError::Store(e.to_string()))?;
        failed.ok_or_else(|| CommandError::NoCanary(self.spec.name.clone()))
    }
}
