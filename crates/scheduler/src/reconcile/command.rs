//! How the loop carries out the control plane's commands (scale, apply, rollback, an
//! override, a consumer's demand) between passes: each is written to the store and
//! published before it is answered.

use crate::catalogue as m;
use std::sync::Arc;

use super::autoscale::Demand;
use super::error::CommandError;
use super::handle::{Applied, ChangeRequest, Command};
use super::{Scheduler, save};
use crate::spec::{AppSpec, SpecOrigin};
use crate::store::{Override, RolloutRecord, RolloutState, SpecVersion, VERSIONS_KEPT, Write};

impl Scheduler {
    /// Carries out a command of the control plane; its answer goes back on the command's
    /// channel.
    pub fn command(&mut self, cmd: Command) {
        if !self.leader.is_held() {
            let role = self.leader.role();
            let why = role.waiting.unwrap_or_else(|| "it holds no lease".into());
            let e = CommandError::NotLeader(format!("{} is a standby: {why}", role.instance));
            match cmd {
                Command::Scale(_, r) => drop(r.send(Err(e))),
                Command::Apply(_, _, r) | Command::Rollback(_, _, r) => drop(r.send(Err(e))),
                Command::Plan(_, r) => drop(r.send(Err(e))),
                Command::Override(_, r) => drop(r.send(Err(e))),
                Command::Demand(_, _, r) => drop(r.send(Err(e))),
                Command::Promote(_, r) | Command::Abort(_, r) => drop(r.send(Err(e))),
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
            Command::Apply(spec, req, reply) => {
                let origin = SpecOrigin { by: req.by, ..SpecOrigin::new("api", flotilla_core::now_ms()) };
                let r = self.apply_from(*spec, origin, req.check_version);
                self.publish();
                let _ = reply.send(r);
            }
            Command::Plan(spec, reply) => {
                let _ = reply.send(self.plan_apply(&spec));
            }
            Command::Rollback(to, req, reply) => {
                let r = self.rollback(to, req);
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
            Command::Promote(req, reply) => {
                let r = self.promote(req.by);
                self.publish();
                let _ = reply.send(r);
            }
            Command::Abort(req, reply) => {
                let r = self.abort(req.by);
                self.publish();
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

    /// Applies version `to`, or without one the previous spec (kept in the store by
    /// `apply`).
    fn rollback(&mut self, to: Option<u64>, req: ChangeRequest) -> Result<Applied, CommandError> {
        let app = self.spec.name.clone();
        let (text, of_version) = match to {
            None => {
                let text =
                    self.stored.previous_spec.clone().ok_or_else(|| CommandError::NoPreviousSpec(app.clone()))?;
                // The newest kept version with that text (none in a store older than versions).
                let of = self.stored.versions.values().rev().find(|v| v.spec == text).map(|v| v.version);
                (text, of)
            }
            Some(n) if n == self.version_in_force() => {
                return Err(CommandError::AlreadyInForce { app, version: n });
            }
            Some(n) => match self.stored.versions.get(&n) {
                Some(v) => (v.spec.clone(), Some(n)),
                None => {
                    let kept = match (self.stored.versions.keys().next(), self.stored.versions.keys().next_back()) {
                        (Some(a), Some(b)) => format!("{a}..={b}"),
                        _ => "none".to_string(),
                    };
                    return Err(CommandError::NoSuchVersion { app, version: n, kept });
                }
            },
        };
        // It was valid when applied; a newer build may judge it differently.
        let spec =
            AppSpec::parse(&text).map_err(|e| CommandError::InvalidSpec(format!("the spec to go back to: {e}")))?;
        tracing::info!(app = %app, ?of_version, "rolling back");
        metrics::counter!(m::SPEC_ROLLBACKS.name, "app" => app).increment(1);
        let origin = SpecOrigin { by: req.by, of_version, ..SpecOrigin::new("rollback", flotilla_core::now_ms()) };
        self.apply_from(spec, origin, req.check_version)
    }

    /// The number of the version in force (0 before the first is recorded).
    pub(super) fn version_in_force(&self) -> u64 {
        self.stored.versions.keys().next_back().copied().unwrap_or(0)
    }

    /// Puts `spec` in force, recording where it came from: the one it replaces becomes
    /// the previous, a changed spec becomes a new version, and a rollout to its template
    /// starts (superseding one in flight, whose replacements the next pass releases). The
    /// same spec again records no version but restarts its rollout (a failed one retries).
    pub(super) fn apply_from(
        &mut self,
        spec: AppSpec,
        origin: SpecOrigin,
        check_version: Option<u64>,
    ) -> Result<Applied, CommandError> {
        if spec.name != self.spec.name {
            return Err(CommandError::WrongApp { app: self.spec.name.clone(), got: spec.name });
        }
        let in_force = self.version_in_force();
        if let Some(expected) = check_version.filter(|v| *v != in_force) {
            metrics::counter!(m::SPEC_VERSION_CONFLICTS.name, "app" => self.spec.name.clone()).increment(1);
            return Err(CommandError::VersionConflict { app: self.spec.name.clone(), in_force, expected });
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
        // A canary tests a new version; going back (a rollback, a revert) goes at once.
        let canary = spec.rollout.strategy == crate::spec::Strategy::Canary
            && stale > 0
            && matches!(origin.source.as_str(), "api" | "file");
        let rollout = RolloutRecord { canary: canary.then(Default::default), ..rollout };
        // The same template again (another setting changed, or a re-apply) while its canary
        // shifts traffic: the canary goes on. A new record would say nothing rolls, and
        // its held units would drain unjudged.
        let rollout = match &self.stored.rollout {
            Some(r)
                if r.state == RolloutState::InProgress
                    && r.template == fingerprint
                    && r.canary.as_ref().is_some_and(|p| !p.promoted) =>
            {
                r.clone()
            }
            _ => rollout,
        };
        let superseded =
            self.stored.rollout.as_ref().is_some_and(|r| r.state == RolloutState::InProgress && *r != rollout);
        let mut writes =
            vec![Write::Spec(text.clone()), Write::SpecOrigin(origin.clone()), Write::Rollout(rollout.clone())];
        writes.extend(previous.clone().map(Write::PreviousSpec));
        let changed = previous.is_some() || in_force == 0;
        let version = if changed { in_force + 1 } else { in_force };
        let record = SpecVersion { version, spec: text.clone(), origin: origin.clone(), template: fingerprint.clone() };
        if changed {
            writes.push(Write::Version(record.clone()));
        }
        save(&*self.store, &self.spec.name, &writes).map_err(|e| CommandError::Store(e.to_string()))?;
        if previous.is_some() {
            self.stored.previous_spec = previous;
        }
        if changed {
            self.stored.versions.insert(version, record);
            self.stored.versions.remove(&version.wrapping_sub(VERSIONS_KEPT));
        }
        if superseded {
            metrics::counter!(m::ROLLOUTS_SUPERSEDED.name, "app" => self.spec.name.clone()).increment(1);
        }
        self.spec_text = Arc::from(text.as_str());
        self.stored.spec = Some(text);
        self.stored.spec_origin = Some(origin);
        self.stored.rollout = Some(rollout);
        let r = &spec.rollout;
        let message = if stale == 0 {
            "no unit's template changed".to_string()
        } else if canary {
            let steps = r.steps.join(" → ");
            format!("{stale} unit(s) will roll as a canary: {} first, then {steps} of the requests", r.canary)
        } else {
            format!("{stale} unit(s) will roll, {} at a time", r.max_unavailable)
        };
        tracing::info!(app = %spec.name, %fingerprint, version, stale, superseded, "spec applied");
        metrics::counter!(m::SPEC_APPLIED.name, "app" => spec.name.clone()).increment(1);
        self.fingerprints = spec.fingerprints();
        self.spec = spec;
        self.planning.forget_classes();
        self.autoscaler.own = self.spec.own_policy();
        self.autoscaler.force_evaluation();
        Ok(Applied { version, new_version: changed, result: message })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::handle::Reply;
    use crate::store::VERSIONS_KEPT;
    use crate::store::{MemStore, Store};

    fn spec(cpu: &str) -> AppSpec {
        AppSpec::parse(&format!(
            "name = \"echo\"\n[unit]\nworkers = 0\n[unit.head]\ncommand = \"sleep\"\ncpu = \"{cpu}\"\n\
             memory = \"1Mi\"\n[units]\nmin = 0\nmax = 4\ninitial = 0\n"
        ))
        .unwrap()
    }

    fn run<T>(s: &mut Scheduler, cmd: impl FnOnce(Reply<T>) -> Command) -> Result<T, CommandError> {
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
        let e = run(&mut s, |tx| Command::Rollback(None, ChangeRequest::default(), tx)).unwrap_err();
        assert_eq!(e, CommandError::NoPreviousSpec("echo".into()));
        assert_eq!(flotilla_core::ServiceError::code(&e), "no_previous_spec");

        run(&mut s, |tx| Command::Apply(Box::new(spec("200m")), ChangeRequest::default(), tx)).unwrap();
        s.publish();
        let first = store.load("echo").unwrap();
        assert!(h.status().has_previous_spec);
        assert_eq!(first.previous_spec.as_deref(), Some(toml::to_string(&spec("100m")).unwrap().as_str()));
        assert_eq!(&*h.status().spec_toml, toml::to_string(&spec("200m")).unwrap());

        // Back to 100m; the 200m spec is now the previous one (a second rollback redoes it).
        run(&mut s, |tx| Command::Rollback(None, ChangeRequest::default(), tx)).unwrap();
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
        run(&mut s, |tx| Command::Apply(Box::new(spec("200m")), ChangeRequest::default(), tx)).unwrap();
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

    fn apply(s: &mut Scheduler, cpu: &str, req: ChangeRequest) -> Result<Applied, CommandError> {
        run(s, |tx| Command::Apply(Box::new(spec(cpu)), req, tx))
    }

    #[test]
    fn every_change_is_a_version_with_its_origin_and_a_rollback_names_the_one_it_went_back_to() {
        let store: Arc<dyn Store> = Arc::new(MemStore::default());
        let cluster = flotilla_view::ClusterView::new(0);
        let (mut s, h) = Scheduler::new(spec("100m"), cluster.clone(), vec![], store.clone()).unwrap();
        let by = |name: &str| ChangeRequest { by: Some(name.into()), check_version: None };
        assert_eq!(apply(&mut s, "200m", by("ci")).unwrap().version, 2);
        // The same spec again is no new version (its rollout restarts).
        let again = apply(&mut s, "200m", by("ci")).unwrap();
        assert_eq!((again.version, again.new_version), (2, false));
        // Optimistic: applies only against the version read.
        let stale = ChangeRequest { by: Some("bob".into()), check_version: Some(1) };
        let e = apply(&mut s, "300m", stale).unwrap_err();
        assert_eq!(e, CommandError::VersionConflict { app: "echo".into(), in_force: 2, expected: 1 });
        assert_eq!(flotilla_core::ServiceError::code(&e), "version_conflict");
        let fresh = ChangeRequest { by: Some("bob".into()), check_version: Some(2) };
        assert_eq!(apply(&mut s, "300m", fresh).unwrap().version, 3);
        // Back to version 1 (the file's), as a new version saying so.
        let r = run(&mut s, |tx| Command::Rollback(Some(1), by("ops"), tx)).unwrap();
        assert_eq!(r.version, 4);
        s.publish();
        assert_eq!(&*h.status().spec_toml, toml::to_string(&spec("100m")).unwrap());
        let versions = h.status().versions.clone();
        let summary: Vec<_> = versions
            .iter()
            .map(|v| (v.version, v.origin.source.as_str(), v.origin.by.as_deref(), v.origin.of_version))
            .collect();
        assert_eq!(
            summary,
            vec![
                (1, "file", None, None),
                (2, "api", Some("ci"), None),
                (3, "api", Some("bob"), None),
                (4, "rollback", Some("ops"), Some(1))
            ]
        );
        assert_eq!(versions[3].template, spec("100m").template_fingerprint());
        // Refusals name what is kept and what is in force.
        let e = run(&mut s, |tx| Command::Rollback(Some(9), by("ops"), tx)).unwrap_err();
        assert_eq!(e.to_string(), "app echo has no version 9 (kept: 1..=4)");
        let e = run(&mut s, |tx| Command::Rollback(Some(4), by("ops"), tx)).unwrap_err();
        assert_eq!(flotilla_core::ServiceError::code(&e), "already_in_force");
        // A plain rollback goes to the previous spec (version 3's), and says so.
        let r = run(&mut s, |tx| Command::Rollback(None, by("ops"), tx)).unwrap();
        assert_eq!(r.version, 5);
        assert_eq!(store.load("echo").unwrap().versions[&5].origin.of_version, Some(3));
        // Versions survive a restart; the oldest go past VERSIONS_KEPT.
        drop(s);
        let (mut s, h) = Scheduler::new(spec("100m"), cluster, vec![], store.clone()).unwrap();
        assert_eq!(h.status().versions.len(), 5);
        for n in 0..VERSIONS_KEPT {
            apply(&mut s, &format!("{}m", 400 + n), ChangeRequest::default()).unwrap();
        }
        let kept = store.load("echo").unwrap().versions;
        assert_eq!(kept.len() as u64, VERSIONS_KEPT);
        assert_eq!(kept.keys().next_back(), Some(&(5 + VERSIONS_KEPT)));
    }

    #[test]
    fn a_store_from_before_versions_gets_its_spec_in_force_as_version_1() {
        let store: Arc<dyn Store> = Arc::new(MemStore::default());
        let cluster = flotilla_view::ClusterView::new(0);
        let text = toml::to_string(&spec("100m")).unwrap();
        store
            .write(
                "echo",
                &[
                    Write::Spec(text.clone()),
                    Write::SpecOrigin(SpecOrigin::new("api", 7)),
                    Write::FileFingerprint(spec("100m").fingerprint()),
                ],
            )
            .unwrap();
        let (_s, h) = Scheduler::new(spec("100m"), cluster, vec![], store.clone()).unwrap();
        let v = &h.status().versions[0];
        assert_eq!((v.version, v.spec.as_str(), v.origin.source.as_str()), (1, text.as_str(), "api"));
        assert_eq!(store.load("echo").unwrap().versions.len(), 1);
    }

    #[test]
    fn a_plan_changes_nothing_and_says_what_changes_and_what_cannot_be_placed() {
        let store: Arc<dyn Store> = Arc::new(MemStore::default());
        let cluster = flotilla_view::ClusterView::new(0);
        let (mut s, h) = Scheduler::new(spec("100m"), cluster, vec![], store.clone()).unwrap();
        let before = store.load("echo").unwrap();
        let mut bigger = spec("200m");
        bigger.units.min = 2;
        bigger.units.initial = 2;
        let p = run(&mut s, |tx| Command::Plan(Box::new(bigger), tx)).unwrap();
        assert_eq!(p.in_force, 1);
        let paths: Vec<&str> = p.changes.iter().map(|c| c.path.as_str()).collect();
        assert_eq!(paths, vec!["unit.head.cpu", "units.initial", "units.min"]);
        assert_eq!((p.create, p.to_place, p.fit), (2, 2, 0));
        assert_eq!(p.cannot_place.len(), 1);
        assert_eq!(p.cannot_place[0].units, 2);
        assert!(p.cannot_place[0].reason.starts_with("no domain can hold the unit"), "{:?}", p.cannot_place);
        assert!(p.stop.is_empty() && p.roll.is_empty());
        assert_eq!(store.load("echo").unwrap(), before, "a plan writes nothing");
        assert_eq!(&*h.status().spec_toml, toml::to_string(&spec("100m")).unwrap());
        // An invalid spec is refused with every problem, as apply refuses it.
        let mut bad = spec("100m");
        bad.units.min = 9;
        bad.name = "Echo".into();
        let e = run(&mut s, |tx| Command::Plan(Box::new(bad), tx)).unwrap_err();
        assert_eq!(flotilla_core::ServiceError::code(&e), "wrong_app");
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
