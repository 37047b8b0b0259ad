//! The loop of one app's scheduler: what wakes a pass (a change of the view that concerns
//! the app, a command, a lease taken, the tick) and which steps it runs ([`Steps`]).

use std::time::Duration;

use flotilla_core::now_ms;
use futures_util::FutureExt;

use super::watched::{self, Concern};
use super::{Scheduler, Steps, m};

impl Scheduler {
    /// Runs until the process stops: a pass on every view change that concerns the app
    /// (at most every 50 ms; [`watched`]), on every command and lease taken, and when the
    /// tick is due ([`super::due`]). A quiet app's timer runs only the timers' steps
    /// ([`Steps::Timers`]) when none of its nodes changed since the last pass.
    pub async fn run(mut self) {
        // Wakes the loop for changes of the nodes the last pass depended on ([`watched`]).
        let mut interest = self.cluster.interest();
        let mut leases = self.leader.taken();
        let ignored = metrics::counter!(m::VIEW_CHANGES_IGNORED.name);
        let routes_only = metrics::counter!(m::VIEW_CHANGES_ROUTES_ONLY.name);
        // The same failure pass after pass (a store that stays down) is logged once.
        let mut last_error = String::new();
        let mut trigger = ("start", Steps::All);
        let mut watched = watched::Watched::everything();
        loop {
            // The runtime's clock, not the wall's: the tick below is a deadline on it, and
            // a simulation (`crates/faults`) runs that clock ahead of the wall.
            let (started, started_ms) = (tokio::time::Instant::now(), now_ms());
            // Taken before the pass reads the view: a change during the pass is compared
            // against what was there before it, so it is never taken as seen.
            let seen = self.cluster.slots();
            let (cause, steps) = trigger;
            let steps = self.can_run(steps);
            metrics::counter!(m::RECONCILE_PASSES.name, "cause" => cause).increment(1);
            match self.pass(steps).await {
                Err(e) => {
                    let e = format!("{e:#}");
                    if e != last_error {
                        tracing::warn!(app = %self.spec.name, error = %e, "reconcile failed");
                        last_error = e;
                    } else {
                        tracing::debug!(app = %self.spec.name, error = %e, "reconcile failed again");
                    }
                }
                Ok(()) => last_error.clear(),
            }
            // A timers' pass that wrote nothing left the units as they were, and the view
            // of their nodes as the last pass saw it: what they depend on and their route
            // table stand.
            if steps != Steps::Timers || self.wrote {
                // A failed pass (a store refusing writes) is tried again by the tick, not
                // by every view change: the store reopens on its own back-off.
                watched = if self.tracking.started {
                    watched::Watched::of(self.stored.units.values(), &seen)
                } else {
                    watched::Watched::everything()
                };
                watched.register(&mut interest);
                self.publish_routes();
            }
            drop(seen);
            metrics::histogram!(m::RECONCILE_SECONDS.name).record(started.elapsed().as_secs_f64());
            // Counted from the pass's start; a pass that took a second or more still leaves
            // the runtime a breath.
            let (due, paced) = self.next_pass(started_ms);
            let next = (started + Duration::from_millis(due.saturating_sub(started_ms)))
                .max(tokio::time::Instant::now() + BREATH);
            let tick = tokio::time::sleep_until(next);
            tokio::pin!(tick);
            // Weights drifting on their own between passes move in the last table.
            let reweigh_at =
                |s: &Self| s.out.weights.next_change_ms().map(|at| tokio::time::Instant::now() + until(at).max(BREATH));
            let mut reweigh = reweigh_at(&self);
            let reweighing = tokio::time::sleep_until(reweigh.unwrap_or(next));
            tokio::pin!(reweighing);
            trigger = loop {
                tokio::select! {
                    _ = &mut tick => {
                        if paced != "timer" {
                            break (paced, Steps::All);
                        }
                        // A change of the app's nodes that came with the timer needs every
                        // step. Every change since the last look woke `interest` (one
                        // permit, kept until taken), so without one nothing changed.
                        let woken = interest.changed().now_or_never().is_some();
                        if woken {
                            match watched.concern(&self.cluster) {
                                Concern::Pass => break ("view", Steps::All),
                                Concern::Routes => {
                                    routes_only.increment(1);
                                    self.publish_routes();
                                }
                                Concern::Nothing => ignored.increment(1),
                            }
                        }
                        break ("timer", Steps::Timers);
                    }
                    _ = &mut reweighing, if reweigh.is_some_and(|at| at < next) => {
                        self.reweigh_routes();
                        reweigh = reweigh_at(&self);
                        reweighing.as_mut().reset(reweigh.unwrap_or(next));
                    }
                    () = interest.changed() => {
                        match watched.concern(&self.cluster) {
                            Concern::Nothing => {
                                ignored.increment(1);
                                continue;
                            }
                            // A health score: the weights move, and nothing else would.
                            Concern::Routes => {
                                routes_only.increment(1);
                                self.publish_routes();
                                reweigh = reweigh_at(&self);
                                reweighing.as_mut().reset(reweigh.unwrap_or(next));
                                continue;
                            }
                            Concern::Pass => {}
                        }
                        // Routes follow the view at once (a node that stops being Alive
                        // gets weight 0 in this batch); the reconcile pass may wait a little.
                        self.publish_routes();
                        tokio::time::sleep(BREATH).await;
                        let again = interest.changed().now_or_never().is_some();
                        break ("view", if again { Steps::All } else { Steps::Woken });
                    }
                    Some(cmd) = self.commands.recv() => {
                        self.command(cmd);
                        break ("command", Steps::All);
                    }
                    Ok(()) = leases.changed() => break ("lease", Steps::All),
                }
            };
        }
    }

    /// `steps`, or every step when only the whole pass is right: no lease, another one
    /// than the state was loaded under (it reloads), not started yet, or writes the store
    /// refused.
    pub(super) fn can_run(&self, steps: Steps) -> Steps {
        let same_lease = self.leader.held().is_some_and(|l| l.token() == self.token);
        match same_lease && self.tracking.started && self.unsaved.is_empty() {
            true => steps,
            false => Steps::All,
        }
    }
}

/// The least time between two passes, and between a view change and its pass.
const BREATH: Duration = Duration::from_millis(50);

/// From now until `at_ms` (Unix ms) on the runtime's clock.
fn until(at_ms: u64) -> Duration {
    Duration::from_millis(at_ms.saturating_sub(now_ms()))
}
