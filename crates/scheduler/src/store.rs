//! The app's state: spec, desired scale, unit records and the intent of each reserve
//! before it is sent, behind a trait with three backends: memory (tests, simulation),
//! redb (`store_redb.rs`, embedded) and etcd (`store_etcd.rs`). Writes are grouped: one
//! transaction per reconcile pass.

use flotilla_core::LockExt;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

use crate::spec::SpecOrigin;
pub use crate::units::{MemberRecord, NamedPorts, UnitRecord, Units, Usage};

/// Written before a reserve leaves, so a restarted scheduler can release it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Intent {
    pub txn_id: String,
    pub unit_id: String,
    pub shards: Vec<u32>,
    pub created_unix_ms: u64,
}

/// Bounds the operator set with `flotilla scale` on an autoscaled app: the policy's
/// decision is clamped to them, and the record says so.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Override {
    pub floor: u32,
    pub ceiling: u32,
}

/// How the app's last rollout stands (kept in the store, shown by `apps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutState {
    InProgress,
    Complete,
    Failed,
}

/// The app's last rollout: the template it rolls to, since when, and how it ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutRecord {
    /// The template fingerprint units roll to (`units APP --json` shows each unit's).
    pub template: String,
    pub state: RolloutState,
    pub started_unix_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_unix_ms: Option<u64>,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// A canary rollout's step (`crate::canary`); absent for a rolling one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<crate::canary::CanaryProgress>,
}

impl RolloutRecord {
    pub fn started(template: &str, now_ms: u64) -> RolloutRecord {
        RolloutRecord {
            template: template.to_string(),
            state: RolloutState::InProgress,
            started_unix_ms: now_ms,
            finished_unix_ms: None,
            reason: None,
            canary: None,
        }
    }

    /// A rollout with nothing to roll: complete as it starts.
    pub fn nothing_to_roll(template: &str, now_ms: u64) -> RolloutRecord {
        RolloutRecord {
            state: RolloutState::Complete,
            finished_unix_ms: Some(now_ms),
            ..Self::started(template, now_ms)
        }
    }

    /// The record after a pass that found the rollout `failed` (why) or `done`, if it
    /// changed. Only an in-progress rollout of the spec in force moves.
    pub fn advance(&self, fingerprint: &str, failed: Option<&str>, done: bool, now_ms: u64) -> Option<RolloutRecord> {
        if self.state != RolloutState::InProgress || self.template != fingerprint {
            return None;
        }
        match (failed, done) {
            (Some(why), _) => Some(RolloutRecord {
                state: RolloutState::Failed,
                finished_unix_ms: Some(now_ms),
                reason: Some(why.to_string()),
                ..self.clone()
            }),
            (None, true) => {
                Some(RolloutRecord { state: RolloutState::Complete, finished_unix_ms: Some(now_ms), ..self.clone() })
            }
            (None, false) => None,
        }
    }

    /// Did the rollout to `fingerprint` fail (so nothing more rolls to it)?
    pub fn halts(&self, fingerprint: &str) -> bool {
        self.state == RolloutState::Failed && self.template == fingerprint
    }
}

/// Autoscaling decision records kept per app (the newest).
pub const DECISIONS_KEPT: usize = 100;

/// Spec versions kept per app (the newest): `history` lists them, `rollback --to`
/// goes back to any of them.
pub const VERSIONS_KEPT: u64 = 20;

/// One applied spec: every change of the spec in force is a new version, numbered from
/// 1 per app, whatever made it (a file at start, the API, a rollback, a revert).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SpecVersion {
    pub version: u64,
    /// The spec as stored (TOML).
    pub spec: String,
    /// Where it came from, when, and who applied it.
    pub origin: SpecOrigin,
    /// Its template fingerprint: units started from it carry the same.
    pub template: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Stored {
    pub spec: Option<String>,
    /// The spec before the last one applied (`POST /v1/apps/{app}/rollback` re-applies it).
    pub previous_spec: Option<String>,
    pub desired_units: Option<u32>,
    /// Of the desired units, how many are in the secondary group (autoscaling).
    pub desired_secondary: Option<u32>,
    pub override_bounds: Option<Override>,
    pub next_generation: u64,
    pub units: Units,
    pub intents: BTreeMap<String, Intent>,
    /// The last autoscaling decisions (JSON records), oldest first, by sequence number.
    pub decisions: BTreeMap<u64, String>,
    /// Where the spec in force came from.
    pub spec_origin: Option<SpecOrigin>,
    /// The fingerprint of the last spec applied from a file at start (`--app`): the
    /// file applies again only when it changed.
    pub file_fingerprint: Option<String>,
    /// The last spec whose units all ran (`auto_revert` goes back to it).
    pub good_spec: Option<String>,
    /// The app's last rollout.
    pub rollout: Option<RolloutRecord>,
    /// The last [`VERSIONS_KEPT`] specs put in force, by version; the newest is the one
    /// in force (a store written before versions existed has none until the next apply,
    /// or the scheduler's start, records it).
    pub versions: BTreeMap<u64, SpecVersion>,
    /// The last fencing token a scheduler of this app took with the embedded store (its
    /// next run takes one more); with etcd the lease key's create revision is the token.
    pub fencing_token: u64,
}

#[derive(Debug, Clone, PartialEq)]
#[allow(
    clippy::large_enum_variant,
    reason = "a pass's writes live for one pass, and most of them are units: boxing each would cost more"
)]
pub enum Write {
    Spec(String),
    /// The spec the app had before its current one.
    PreviousSpec(String),
    DesiredUnits(u32),
    DesiredSecondary(u32),
    Override(Option<Override>),
    /// An autoscaling decision record (JSON) under its sequence number; the one
    /// `DECISIONS_KEPT` older is dropped.
    Decision(u64, String),
    NextGeneration(u64),
    /// Shared with the scheduler's own record (`Units`): writing a unit copies nothing.
    Unit(Arc<UnitRecord>),
    DeleteUnit(String),
    Intent(Intent),
    DeleteIntent(String),
    SpecOrigin(SpecOrigin),
    FileFingerprint(String),
    GoodSpec(String),
    Rollout(RolloutRecord),
    /// A spec put in force; the version [`VERSIONS_KEPT`] older is dropped.
    Version(SpecVersion),
    /// The fencing token a scheduler took on becoming active (the embedded store's
    /// stand-in for a lease's revision).
    FencingToken(u64),
}

#[derive(Debug, thiserror::Error)]
#[error("store: {0}")]
pub struct StoreError(pub String);

pub trait Store: Send + Sync {
    fn load(&self, app: &str) -> Result<Stored, StoreError>;
    /// Applies every write in one transaction. Called at least once a second (with an
    /// empty batch when nothing changed), which lets a failing store recover.
    fn write(&self, app: &str, batch: &[Write]) -> Result<(), StoreError>;
    /// Why the store does not take writes now (since a write failed, until it was
    /// reopened), for `apps`; `None` while it is healthy.
    fn failing(&self) -> Option<String> {
        None
    }
    /// Whether writing `batch` may block the thread (disk or network I/O). A pass's empty
    /// batch on a healthy embedded store does not, and is then written without handing
    /// the worker's other tasks over (see `reconcile::save`).
    fn write_blocks(&self, _batch: &[Write]) -> bool {
        true
    }
}

fn apply(s: &mut Stored, w: &Write) {
    match w {
        Write::Spec(t) => s.spec = Some(t.clone()),
        Write::PreviousSpec(t) => s.previous_spec = Some(t.clone()),
        Write::DesiredUnits(n) => s.desired_units = Some(*n),
        Write::DesiredSecondary(n) => s.desired_secondary = Some(*n),
        Write::Override(o) => s.override_bounds = *o,
        Write::Decision(seq, json) => {
            s.decisions.insert(*seq, json.clone());
            s.decisions.remove(&seq.wrapping_sub(DECISIONS_KEPT as u64));
        }
        Write::NextGeneration(g) => s.next_generation = *g,
        Write::Unit(u) => s.units.insert(u.clone()),
        Write::DeleteUnit(id) => {
            s.units.remove(id);
        }
        Write::Intent(i) => {
            s.intents.insert(i.txn_id.clone(), i.clone());
        }
        Write::DeleteIntent(id) => {
            s.intents.remove(id);
        }
        Write::SpecOrigin(o) => s.spec_origin = Some(o.clone()),
        Write::FileFingerprint(f) => s.file_fingerprint = Some(f.clone()),
        Write::GoodSpec(t) => s.good_spec = Some(t.clone()),
        Write::Rollout(r) => s.rollout = Some(r.clone()),
        Write::Version(v) => {
            s.versions.insert(v.version, v.clone());
            s.versions.remove(&v.version.wrapping_sub(VERSIONS_KEPT));
        }
        Write::FencingToken(t) => s.fencing_token = *t,
    }
}

/// For tests and the deterministic simulation.
#[derive(Default)]
pub struct MemStore {
    apps: Mutex<BTreeMap<String, Stored>>,
}

impl Store for MemStore {
    fn load(&self, app: &str) -> Result<Stored, StoreError> {
        Ok(self.apps.lock_or_recover().get(app).cloned().unwrap_or_default())
    }

    fn write(&self, app: &str, batch: &[Write]) -> Result<(), StoreError> {
        let mut apps = self.apps.lock_or_recover();
        let s = apps.entry(app.to_string()).or_default();
        for w in batch {
            apply(s, w);
        }
        Ok(())
    }

    fn write_blocks(&self, _batch: &[Write]) -> bool {
        false
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::lifecycle::UnitState;

    #[test]
    fn a_rollout_record_moves_only_while_in_progress_for_the_spec_in_force() {
        let r = RolloutRecord::started("new", 1);
        assert_eq!(r.advance("new", None, false, 2), None);
        let done = r.advance("new", None, true, 3).unwrap();
        assert_eq!((done.state, done.finished_unix_ms), (RolloutState::Complete, Some(3)));
        let failed = r.advance("new", Some("late"), true, 4).unwrap();
        assert_eq!((failed.state, failed.reason.as_deref()), (RolloutState::Failed, Some("late")));
        assert!(failed.halts("new") && !failed.halts("old") && !r.halts("new"));
        assert_eq!(failed.advance("new", None, true, 5), None, "failed stays failed until the next apply");
        assert_eq!(r.advance("other", None, true, 5), None, "another template's record does not move");
        assert_eq!(RolloutRecord::nothing_to_roll("t", 7).state, RolloutState::Complete);
    }

    pub(crate) fn unit(id: &str) -> UnitRecord {
        UnitRecord {
            unit_id: id.into(),
            app: "echo".into(),
            domain: Some("d".into()),
            generation: 1,
            state: UnitState::Allocated,
            members: vec![MemberRecord {
                member: "head".into(),
                role: "head".into(),
                node_id: Some("n1".into()),
                incarnation: 3,
                shard: Some(0),
                address: None,
                state: None,
                usage: None,
                ports: Default::default(),
                message: None,
                generation: None,
                alternative: 0,
                template: None,
                surged_unix_ms: None,
            }],
            created_unix_ms: 5,
            unplaced_reason: None,
            draining_since_unix_ms: None,
            frame: None,
            roll_waits: None,
            template: None,
            replaced_by: None,
            moving: None,
            moved_unix_ms: None,
            secondary: false,
            drain_timeout_ms: None,
            placement_note: None,
            ended_unix_ms: None,
            surge: Vec::new(),
        }
    }

    /// What every backend must do; run against memory, redb and etcd.
    pub(crate) fn exercise(s: &dyn Store) {
        s.write(
            "echo",
            &[
                Write::Spec("name = \"echo\"".into()),
                Write::PreviousSpec("name = \"old\"".into()),
                Write::DesiredUnits(3),
                Write::NextGeneration(7),
                Write::Unit(unit("echo-1").into()),
                Write::Unit(unit("echo-2").into()),
                Write::Intent(Intent {
                    txn_id: "t1".into(),
                    unit_id: "echo-1".into(),
                    shards: vec![0],
                    created_unix_ms: 1,
                }),
            ],
        )
        .unwrap();
        s.write("echoes", &[Write::Unit(unit("other").into())]).unwrap();
        s.write("echo", &[Write::DeleteUnit("echo-2".into()), Write::DeleteIntent("t1".into())]).unwrap();
        let got = s.load("echo").unwrap();
        assert_eq!(got.spec.as_deref(), Some("name = \"echo\""));
        assert_eq!(got.previous_spec.as_deref(), Some("name = \"old\""));
        assert_eq!(got.desired_units, Some(3));
        assert_eq!(got.next_generation, 7);
        assert_eq!(got.units.keys().collect::<Vec<_>>(), vec!["echo-1"], "apps do not see each other's units");
        assert_eq!(got.units["echo-1"], unit("echo-1"));
        assert!(got.intents.is_empty());
        assert_eq!(s.load("nothing").unwrap(), Stored::default());
        // Decisions: the newest DECISIONS_KEPT survive, in order.
        let n = DECISIONS_KEPT as u64 + 5;
        for seq in 1..=n {
            s.write("echo", &[Write::Decision(seq, format!("{{\"seq\":{seq}}}")), Write::DesiredSecondary(1)]).unwrap();
        }
        let got = s.load("echo").unwrap();
        assert_eq!(got.decisions.len(), DECISIONS_KEPT);
        assert_eq!(got.decisions.keys().next(), Some(&6));
        assert_eq!(got.decisions.get(&n).map(String::as_str), Some(format!("{{\"seq\":{n}}}").as_str()));
        assert_eq!(got.desired_secondary, Some(1));
        let pin = Override { floor: 2, ceiling: 4 };
        s.write("echo", &[Write::Override(Some(pin))]).unwrap();
        assert_eq!(s.load("echo").unwrap().override_bounds, Some(pin));
        s.write("echo", &[Write::Override(None)]).unwrap();
        assert_eq!(s.load("echo").unwrap().override_bounds, None);
        // Where the spec came from, the file's fingerprint, the last good spec, the rollout.
        let origin = SpecOrigin { reason: Some("why".into()), ..SpecOrigin::new("revert", 9) };
        let rollout = RolloutRecord::started("t2", 10);
        s.write(
            "echo",
            &[
                Write::SpecOrigin(origin.clone()),
                Write::FileFingerprint("f1".into()),
                Write::GoodSpec("name = \"good\"".into()),
                Write::Rollout(rollout.clone()),
            ],
        )
        .unwrap();
        let got = s.load("echo").unwrap();
        assert_eq!(got.spec_origin, Some(origin));
        assert_eq!(got.file_fingerprint.as_deref(), Some("f1"));
        assert_eq!(got.good_spec.as_deref(), Some("name = \"good\""));
        assert_eq!(got.rollout, Some(rollout));
        assert_eq!(s.load("echoes").unwrap().rollout, None);
        s.write("echo", &[Write::FencingToken(4)]).unwrap();
        assert_eq!(s.load("echo").unwrap().fencing_token, 4);
        assert_eq!(s.load("echoes").unwrap().fencing_token, 0);
        // Versions: the newest VERSIONS_KEPT survive, by number, with their origin.
        let version = |n: u64| SpecVersion {
            version: n,
            spec: format!("name = \"v{n}\""),
            origin: SpecOrigin { by: Some("ci".into()), ..SpecOrigin::new("api", n) },
            template: format!("t{n}"),
        };
        for n in 1..=VERSIONS_KEPT + 3 {
            s.write("echo", &[Write::Version(version(n))]).unwrap();
        }
        let got = s.load("echo").unwrap();
        assert_eq!(got.versions.len() as u64, VERSIONS_KEPT);
        assert_eq!(got.versions.keys().next(), Some(&4));
        assert_eq!(got.versions.get(&(VERSIONS_KEPT + 3)), Some(&version(VERSIONS_KEPT + 3)));
        assert!(s.load("echoes").unwrap().versions.is_empty());
    }

    #[test]
    fn mem_store() {
        exercise(&MemStore::default());
    }
}
