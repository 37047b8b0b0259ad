//! How the loop carries out the control plane's commands (scale, apply, rollback, an
//! override, a consumer's demand) between passes: each is written to the store and
//! published before it is answered.

use crate::catalogue as m;
use std::sync::Arc;

use super::autoscale::Demand;
use super::error::CommandError;
use super::handle::Command;
use super::{Scheduler, save};
use crate::spec::{AppSpec, SpecOrigin};
use crate::store::{Override, RolloutRecord, RolloutState, Write};

impl Scheduler {
    /// Carries out a command of the control plane; its answer goes back on the command's
    /// channel.
    pub fn command(&mut self, cmd: Command) {
        if self.leader.held().is_none() {
            let role = self.leader.role();
            let why = role.waiting.unwrap_or_else(|| "it holds no lease".into());
            let e = CommandError::NotLeader(format!("{} is a standby: {why}", role.instance));
            match cmd {
                Command::Scale(_, r) => drop(r.send(Err(e))),
                Command::Apply(_, r) | Command::Rollback(r) => drop(r.send(Err(e))),
                Command::Override(_, r) => drop(r.send(Err(e))),
                Command::Demand(_, _, r) => drop(r.send(Err(e))),
            }
            return;
        }
        // A change (or the store refusing it) is published before it is answered, so whoever
        // made it reads it back, from any control-plane replica, and `apps` shows a failing
        // store at once.
        match cmd {
            Command::Scale(n, reply) => {
                let r = self.scale(n);
                self.publish();
                let _ = reply.send(r);
            }
            Command::Apply(spec, reply) => {
                let origin = SpecOrigin::new("api", flotilla_core::now_ms());
                let r = self.apply_from(*spec, origin);
                self.publish();
                let _ = reply.send(r);
            }
            Command::Rollback(reply) => {
                let r = self.rollback();
                self.publish();
                let _ = reply.send(r);
            }
            Command::Override(bounds, reply) => {
                let r = self.set_override(bounds);
                self.publish();
                let _ = reply.send(r);
            }
            Command::Demand(requests, ttl_ms, reply) => {
                let r = Demand::new(requests, ttl_ms, flotilla_core::now_ms()).inspect(|d| {
                    tracing::info!(app = %self.spec.name, requests = d.requests.len(), "consumer demand set");
                    self.autoscaler.demand = Some(d.clone());
                });
                let _ = reply.send(r);
            }
        }
    }

    fn scale(&mut self, n: u32) -> Result<u32, CommandError> {
        let (min, max) = (self.spec.units.min, self.spec.units.max);
        if n < min || n > max {
            return Err(CommandError::OutOfRange { app: self.spec.name.clone(), min, max, asked: n });
        }
        if self.spec.is_autoscaled() {
            // An autoscaled app keeps deciding, within a floor and ceiling of n.
            return self.set_override(Some(Override { floor: n, ceiling: n })).map(|_| n);
        }
        save(&*self.store, &self.spec.name, &[Write::DesiredUnits(n)])
            .map_err(|e| CommandError::Store(e.to_string()))?;
        self.stored.desired_units = Some(n);
        tracing::info!(app = %self.spec.name, units = n, "desired units set");
        Ok(n)
    }

    fn set_override(&mut self, bounds: Option<Override>) -> Result<Option<Override>, CommandError> {
        let (min, max) = (self.spec.units.min, self.spec.units.max);
        if let Some(o) = bounds
            && (o.floor > o.ceiling || o.floor < min || o.ceiling > max)
        {
            return Err(CommandError::InvalidOverride(format!(
                "override {}..={} must be within the spec's units {min}..={max}, floor at most ceiling",
                o.floor, o.ceiling
            )));
        }
        self.store
            .write(&self.spec.name, &[Write::Override(bounds)])
            .map_err(|e| CommandError::Store(e.to_string()))?;
        self.stored.override_bounds = bounds;
        // The next pass re-evaluates with the new bounds.
        self.autoscaler.force_evaluation();
        tracing::info!(app = %self.spec.name, ?bounds, "autoscaling override set");
        Ok(bounds)
    }

    /// Applies the previous spec (kept in the store by `apply`).
    fn rollback(&mut self) -> Result<String, CommandError> {
        let no_previous = || CommandError::NoPreviousSpec(self.spec.name.clone());
        let text = self.stored.previous_spec.clone().ok_or_else(no_previous)?;
        // It was valid when applied; a newer build may judge it differently.
        let spec = AppSpec::parse(&text).map_err(|e| CommandError::InvalidSpec(format!("the previous spec: {e}")))?;
        tracing::info!(app = %self.spec.name, "rolling back to the previous spec");
        metrics::counter!(m::SPEC_ROLLBACKS.name, "app" => self.spec.name.clone()).increment(1);
        self.apply_from(spec, SpecOrigin::new("rollback", flotilla_core::now_ms()))
    }

    /// Puts `spec` in force, recording where it came from: the one it replaces becomes
    /// the previous, and a rollout to its template starts (superseding one in flight,
    /// whose replacements the next pass releases).
    pub(super) fn apply_from(&mut self, spec: AppSpec, origin: SpecOrigin) -> Result<String, CommandError> {
        if spec.name != self.spec.name {
            return Err(CommandError::WrongApp { app: self.spec.name.clone(), got: spec.name });
        }
        spec.validate().map_err(|e| CommandError::InvalidSpec(e.to_string()))?;
        let text = toml::to_string(&spec).map_err(|e| CommandError::InvalidSpec(e.to_string()))?;
        // The spec being replaced becomes the previous one, unless nothing changed.
        let previous = self.stored.spec.clone().filter(|old| *old != text);
        let fingerprint = spec.template_fingerprint();
        let stale = crate::rollout::will_roll(&self.stored.units, &fingerprint);
        let now = origin.at_unix_ms;
        let rollout = if stale == 0 {
            RolloutRecord::nothing_to_roll(&fingerprint, now)
        } else {
            RolloutRecord::started(&fingerprint, now)
        };
        let superseded = self.stored.rollout.as_ref().is_some_and(|r| r.state == RolloutState::InProgress);
        let mut writes =
            vec![Write::Spec(text.clone()), Write::SpecOrigin(origin.clone()), Write::Rollout(rollout.clone())];
        writes.extend(previous.clone().map(Write::PreviousSpec));
        save(&*self.store, &self.spec.name, &writes).map_err(|e| CommandError::Store(e.to_string()))?;
        if previous.is_some() {
            self.stored.previous_spec = previous;
        }
        if superseded {
            metrics::counter!(m::ROLLOUTS_SUPERSEDED.name, "app" => self.spec.name.clone()).increment(1);
        }
        self.spec_text = Arc::from(text.as_str());
        self.stored.spec = Some(text);
        self.stored.spec_origin = Some(origin);
        self.stored.rollout = Some(rollout);
        let message = if stale == 0 {
            "no unit's template changed".to_string()
        } else {
            format!("{stale} unit(s) will roll, {} at a time", spec.rollout.max_unavailable)
        };
        tracing::info!(app = %spec.name, %fingerprint, stale, superseded, "spec applied");
        metrics::counter!(m::SPEC_APPLIED.name, "app" => spec.name.clone()).increment(1);
        self.spec = spec;
        self.fingerprint = fingerprint;
        self.planning.forget_classes();
        self.autoscaler.own = self.spec.own_policy();
        self.autoscaler.force_evaluation();
        Ok(message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::handle::Reply;
    use crate::store::{MemStore, Store};

    fn spec(cpu: &str) -> AppSpec {
        AppSpec::parse(&format!(
            "name = \"echo\"\n[unit]\nworkers = 0\n[unit.head]\ncommand = \"sleep\"\ncpu = \"{cpu}\"\n\
             memory = \"1Mi\"\n[units]\nmin = 0\nmax = 4\ninitial = 0\n"
        ))
        .unwrap()
    }

    fn run(s: &mut Scheduler, cmd: impl FnOnce(Reply<String>) -> Command) -> Result<String, CommandError> {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        s.command(cmd(tx));
        rx.try_recv().unwrap()
    }

    #[test]
    fn a_rollback_reapplies_the_previous_spec_and_is_refused_without_one() {
        let store: Arc<dyn Store> = Arc::new(MemStore::default());
        let cluster = flotilla_view::ClusterView::new(0);
        let (mut s, h) = Scheduler::new(spec("100m"), cluster.clone(), vec![], store.clone()).unwrap();
        assert!(!h.status().has_previous_spec);
        assert!(h.status().spec_toml.contains("100m") || h.status().spec_toml.contains("cpu"));
        let e = run(&mut s, Command::Rollback).unwrap_err();
        assert_eq!(e, CommandError::NoPreviousSpec("echo".into()));
        assert_eq!(flotilla_core::ServiceError::code(&e), "no_previous_spec");

        run(&mut s, |tx| Command::Apply(Box::new(spec("200m")), tx)).unwrap();
        s.publish();
        let first = store.load("echo").unwrap();
        assert!(h.status().has_previous_spec);
        assert_eq!(first.previous_spec.as_deref(), Some(toml::to_string(&spec("100m")).unwrap().as_str()));
        assert_eq!(&*h.status().spec_toml, toml::to_string(&spec("200m")).unwrap());

        // Back to 100m; the 200m spec is now the previous one (a second rollback redoes it).
        run(&mut s, Command::Rollback).unwrap();
        s.publish();
        assert_eq!(&*h.status().spec_toml, toml::to_string(&spec("100m")).unwrap());
        let stored = store.load("echo").unwrap();
        assert_eq!(stored.previous_spec.as_deref(), Some(toml::to_string(&spec("200m")).unwrap().as_str()));

        // Restarting with another spec than the stored one keeps the stored one as previous.
        drop(s);
        let (_s, h2) = Scheduler::new(spec("300m"), cluster, vec![], store.clone()).unwrap();
        assert!(h2.status().has_previous_spec);
        assert_eq!(store.load("echo").unwrap().previous_spec, Some(toml::to_string(&spec("100m")).unwrap()));
    }

    #[test]
    fn an_applied_spec_survives_a_restart_with_the_same_file_and_a_changed_file_applies() {
        let store: Arc<dyn Store> = Arc::new(MemStore::default());
        let cluster = flotilla_view::ClusterView::new(0);
        let text = |cpu: &str| toml::to_string(&spec(cpu)).unwrap();
        let (mut s, h) = Scheduler::new(spec("100m"), cluster.clone(), vec![], store.clone()).unwrap();
        assert_eq!(h.status().spec_origin.as_ref().map(|o| o.source.as_str()), Some("file"));
        run(&mut s, |tx| Command::Apply(Box::new(spec("200m")), tx)).unwrap();
        drop(s);

        // The same file: the applied spec stays in force, and says it came from the API.
        let (s, h) = Scheduler::new(spec("100m"), cluster.clone(), vec![], store.clone()).unwrap();
        assert_eq!(&*h.status().spec_toml, text("200m"));
        assert_eq!(h.status().spec_origin.as_ref().map(|o| o.source.as_str()), Some("api"));
        assert_eq!(h.status().template, spec("200m").template_fingerprint());
        drop(s);

        // A changed file applies; the spec it replaces becomes the previous.
        let (_s, h) = Scheduler::new(spec("300m"), cluster, vec![], store.clone()).unwrap();
        assert_eq!(&*h.status().spec_toml, text("300m"));
        assert_eq!(h.status().spec_origin.as_ref().map(|o| o.source.as_str()), Some("file"));
        let stored = store.load("echo").unwrap();
        assert_eq!(stored.previous_spec, Some(text("200m")));
        assert_eq!(stored.file_fingerprint, Some(spec("300m").fingerprint()));
    }

    /// A store that refuses every write while `down` is set, as a full disk does.
    #[derive(Default)]
    struct Flaky {
        mem: MemStore,
        down: std::sync::atomic::AtomicBool,
    }

    impl Store for Flaky {
        fn load(&self, app: &str) -> Result<crate::store::Stored, crate::store::StoreError> {
            self.mem.load(app)
        }
        fn write(&self, app: &str, batch: &[crate::store::Write]) -> Result<(), crate::store::StoreError> {
            if self.down.load(std::sync::atomic::Ordering::Relaxed) {
                return Err(crate::store::StoreError("No space left on device (os error 28)".into()));
            }
            self.mem.write(app, batch)
        }
        fn failing(&self) -> Option<String> {
            self.down.load(std::sync::atomic::Ordering::Relaxed).then(|| "No space left on device".into())
        }
    }

    #[tokio::test]
    async fn a_pass_the_store_refused_is_written_once_it_is_back_and_commands_answer_store_unavailable() {
        use std::sync::atomic::Ordering::Relaxed;
        let flaky = Arc::new(Flaky::default());
        let store: Arc<dyn Store> = flaky.clone();
        let cluster = flotilla_view::ClusterView::new(0);
        let (mut s, h) = Scheduler::new(spec("100m"), cluster, vec![], store.clone()).unwrap();
        flaky.down.store(true, Relaxed);
        // Scaling is refused, and says why; nothing changes.
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        s.command(Command::Scale(2, tx));
        let e = rx.try_recv().unwrap().unwrap_err();
        assert_eq!(flotilla_core::ServiceError::code(&e), crate::STORE_UNAVAILABLE);
        assert_eq!(flotilla_core::ServiceError::kind(&e), flotilla_core::ErrorKind::StoreUnavailable);
        assert_eq!(s.desired(), 0);
        // A pass that queues units (initial 0: set the desired count directly) fails to
        // write them; the scheduler keeps them and says the store is failing.
        s.stored.desired_units = Some(2);
        assert!(s.reconcile().await.is_err());
        assert_eq!(s.stored.units.len(), 2);
        assert!(store.load("echo").unwrap().units.is_empty());
        assert!(h.status().store_error.as_deref().is_some_and(|e| e.contains("No space left")));
        // Nothing more happens while it is down: the next pass fails before acting.
        assert!(s.reconcile().await.is_err());
        assert_eq!(s.stored.units.len(), 2, "no unit queued twice");
        // The store is back: the refused writes land first, then the pass runs.
        flaky.down.store(false, Relaxed);
        s.reconcile().await.unwrap();
        let stored = store.load("echo").unwrap();
        assert_eq!(stored.units.keys().collect::<Vec<_>>(), s.stored.units.keys().collect::<Vec<_>>());
        assert_eq!(stored.next_generation, s.stored.next_generation);
        assert_eq!(h.status().store_error, None);
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        s.command(Command::Scale(3, tx));
        assert_eq!(rx.try_recv().unwrap(), Ok(3));
        assert_eq!(store.load("echo").unwrap().desired_units, Some(3));
    }
}
