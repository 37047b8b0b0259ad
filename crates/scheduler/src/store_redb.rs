//! The embedded store: an app's state in one redb file, a table per kind of record
//! (meta, units, intents, decisions, versions), keys `APP/…`.

use crate::catalogue as m;
use flotilla_core::LockExt;
use flotilla_core::reopen::{Reopening, Unavailable};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use redb::{Database, ReadableDatabase, TableDefinition};

use crate::store::{DECISIONS_KEPT, Intent, SpecVersion, Store, StoreError, Stored, UnitRecord, VERSIONS_KEPT, Write};

const META: TableDefinition<&str, &str> = TableDefinition::new("meta");
const UNITS: TableDefinition<&str, &str> = TableDefinition::new("units");
const INTENTS: TableDefinition<&str, &str> = TableDefinition::new("intents");
const DECISIONS: TableDefinition<&str, &str> = TableDefinition::new("decisions");
const VERSIONS: TableDefinition<&str, &str> = TableDefinition::new("versions");

/// A decision's (or version's) key: sequence numbers zero-padded, so keys sort by age.
fn decision_key(app: &str, seq: u64) -> String {
    format!("{app}/{seq:020}")
}

/// The embedded store: one redb file.
///
/// A write that fails (a full disk) leaves redb refusing every later one ("Previous I/O
/// error occurred. Please close and re-open the database."), so the store marks itself
/// failing, and the next writes close and reopen the file with back-off (2 s doubling
/// to 10 s) until a reopen succeeds, then carry on. Meanwhile writes fail fast with an
/// error saying the store is unavailable; callers keep what they could not write (the
/// scheduler retries the failed pass) or refuse the request (`scale`, `apply`: 503).
pub struct RedbStore {
    path: std::path::PathBuf,
    db: Mutex<Reopening<Database>>,
    /// Whether a write failed since the last reopen: read without the lock, which a
    /// commit of another app in the process may hold through its fsync.
    failed: AtomicBool,
}

/// The first wait before a failed store is reopened, doubling up to [`REOPEN_MAX`]. Not
/// shorter: a full disk is not fixed in milliseconds, and each reopen costs a commit.
const REOPEN_FIRST: std::time::Duration = std::time::Duration::from_secs(2);
const REOPEN_MAX: std::time::Duration = std::time::Duration::from_secs(10);

fn err(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// Opens (creating, or repairing after a crash) the file and its tables; the tables'
/// commit proves the store takes writes.
fn open_db(path: &Path) -> Result<Database, StoreError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| StoreError(format!("creating {}: {e}", dir.display())))?;
    }
    let at = |e: &dyn std::fmt::Display| StoreError(format!("{}: {e}", path.display()));
    let db = Database::create(path).map_err(|e| at(&e))?;
    let w = db.begin_write().map_err(|e| at(&e))?;
    {
        w.open_table(META).map_err(|e| at(&e))?;
        w.open_table(UNITS).map_err(|e| at(&e))?;
        w.open_table(INTENTS).map_err(|e| at(&e))?;
        w.open_table(DECISIONS).map_err(|e| at(&e))?;
        w.open_table(VERSIONS).map_err(|e| at(&e))?;
    }
    w.commit().map_err(|e| at(&e))?;
    Ok(db)
}

impl RedbStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let db = open_db(path)?;
        metrics::gauge!(m::STORE_HEALTHY.name).set(1.0);
        Ok(RedbStore {
            path: path.to_path_buf(),
            db: Mutex::new(Reopening::new(db, REOPEN_FIRST, REOPEN_MAX)),
            failed: AtomicBool::new(false),
        })
    }

    /// Notes a failure: the first one of a period is logged, every one counted.
    fn fail(&self, db: &mut Reopening<Database>, op: &'static str, e: &StoreError) {
        metrics::counter!(m::STORE_ERRORS.name, "op" => op).increment(1);
        metrics::gauge!(m::STORE_HEALTHY.name).set(0.0);
        self.failed.store(true, Ordering::Relaxed);
        if db.fail(e.0.clone()) {
            tracing::warn!(path = %self.path.display(), error = %e.0, "the store failed; reopening it with back-off until it takes writes again");
        }
    }

    /// The database, reopened first while failing once the back-off allows.
    fn healthy<'a>(&self, db: &'a mut Reopening<Database>) -> Result<&'a Database, StoreError> {
        match db.get(|| open_db(&self.path)) {
            Ok((d, reopened)) => {
                if let Some(failed_for_ms) = reopened {
                    metrics::counter!(m::STORE_REOPENS.name, "result" => "ok").increment(1);
                    metrics::gauge!(m::STORE_HEALTHY.name).set(1.0);
                    self.failed.store(false, Ordering::Relaxed);
                    tracing::info!(path = %self.path.display(), failed_for_ms, "the store was reopened and takes writes again");
                }
                Ok(d)
            }
            Err(e) => {
                if let Unavailable::ReopenFailed(_) = e {
                    metrics::counter!(m::STORE_REOPENS.name, "result" => "error").increment(1);
                    metrics::counter!(m::STORE_ERRORS.name, "op" => "reopen").increment(1);
                }
                Err(StoreError(e.to_string()))
            }
        }
    }
}

/// The meta key and value of the spec origin, file fingerprint, good spec and rollout
/// writes.
fn rollout_key(app: &str, w: &Write) -> Result<(String, String), StoreError> {
    Ok(match w {
        Write::SpecOrigin(o) => (format!("{app}/spec_origin"), serde_json::to_string(o).map_err(err)?),
        Write::FileFingerprint(f) => (format!("{app}/file_fingerprint"), f.clone()),
        Write::GoodSpec(t) => (format!("{app}/good_spec"), t.clone()),
        Write::Rollout(r) => (format!("{app}/rollout"), serde_json::to_string(r).map_err(err)?),
        Write::FencingToken(t) => (format!("{app}/fencing_token"), t.to_string()),
        _ => return Err(StoreError("not a rollout key".into())),
    })
}

/// Reads what `rollout_key` wrote.
fn load_rollout_keys(meta: &redb::ReadOnlyTable<&str, &str>, app: &str, s: &mut Stored) -> Result<(), StoreError> {
    if let Some(v) = meta.get(format!("{app}/spec_origin").as_str()).map_err(err)? {
        s.spec_origin = serde_json::from_str(v.value()).ok();
    }
    if let Some(v) = meta.get(format!("{app}/file_fingerprint").as_str()).map_err(err)? {
        s.file_fingerprint = Some(v.value().to_string());
    }
    if let Some(v) = meta.get(format!("{app}/good_spec").as_str()).map_err(err)? {
        s.good_spec = Some(v.value().to_string());
    }
    if let Some(v) = meta.get(format!("{app}/rollout").as_str()).map_err(err)? {
        s.rollout = serde_json::from_str(v.value()).ok();
    }
    if let Some(v) = meta.get(format!("{app}/fencing_token").as_str()).map_err(err)? {
        s.fencing_token = v.value().parse().unwrap_or(0);
    }
    Ok(())
}

/// Keys are `app/…`; `app` is a validated name without '/'.
fn prefix_range(app: &str) -> (String, String) {
    (format!("{app}/"), format!("{app}0")) // '0' follows '/' in ASCII
}

impl Store for RedbStore {
    fn failing(&self) -> Option<String> {
        if !self.failed.load(Ordering::Relaxed) {
            return None;
        }
        self.db.lock_or_recover().failing().map(str::to_string)
    }

    fn write_blocks(&self, batch: &[Write]) -> bool {
        !batch.is_empty() || self.failed.load(Ordering::Relaxed)
    }

    fn load(&self, app: &str) -> Result<Stored, StoreError> {
        let mut db = self.db.lock_or_recover();
        let r = self.healthy(&mut db)?.begin_read().map_err(err)?;
        let mut s = Stored::default();
        let (lo, hi) = prefix_range(app);
        let meta = r.open_table(META).map_err(err)?;
        if let Some(v) = meta.get(format!("{app}/spec").as_str()).map_err(err)? {
            s.spec = Some(v.value().to_string());
        }
        if let Some(v) = meta.get(format!("{app}/previous_spec").as_str()).map_err(err)? {
            s.previous_spec = Some(v.value().to_string());
        }
        if let Some(v) = meta.get(format!("{app}/desired").as_str()).map_err(err)? {
            s.desired_units = v.value().parse().ok();
        }
        if let Some(v) = meta.get(format!("{app}/desired_secondary").as_str()).map_err(err)? {
            s.desired_secondary = v.value().parse().ok();
        }
        if let Some(v) = meta.get(format!("{app}/override").as_str()).map_err(err)? {
            s.override_bounds = serde_json::from_str(v.value()).map_err(err)?;
        }
        if let Some(v) = meta.get(format!("{app}/next_generation").as_str()).map_err(err)? {
            s.next_generation = v.value().parse().unwrap_or(0);
        }
        load_rollout_keys(&meta, app, &mut s)?;
        let units = r.open_table(UNITS).map_err(err)?;
        for row in units.range(lo.as_str()..hi.as_str()).map_err(err)? {
            let (_, v) = row.map_err(err)?;
            let u: UnitRecord = serde_json::from_str(v.value()).map_err(err)?;
            s.units.insert(u);
        }
        let intents = r.open_table(INTENTS).map_err(err)?;
        for row in intents.range(lo.as_str()..hi.as_str()).map_err(err)? {
            let (_, v) = row.map_err(err)?;
            let i: Intent = serde_json::from_str(v.value()).map_err(err)?;
            s.intents.insert(i.txn_id.clone(), i);
        }
        let decisions = r.open_table(DECISIONS).map_err(err)?;
        for row in decisions.range(lo.as_str()..hi.as_str()).map_err(err)? {
            let (k, v) = row.map_err(err)?;
            if let Some(seq) = k.value().rsplit('/').next().and_then(|n| n.parse().ok()) {
                s.decisions.insert(seq, v.value().to_string());
            }
        }
        let versions = r.open_table(VERSIONS).map_err(err)?;
        for row in versions.range(lo.as_str()..hi.as_str()).map_err(err)? {
            let (_, v) = row.map_err(err)?;
            let v: SpecVersion = serde_json::from_str(v.value()).map_err(err)?;
            s.versions.insert(v.version, v);
        }
        Ok(s)
    }

    fn write(&self, app: &str, batch: &[Write]) -> Result<(), StoreError> {
        if !self.write_blocks(batch) {
            // Nothing to write and nothing to reopen.
            return Ok(());
        }
        let mut db = self.db.lock_or_recover();
        let healthy = self.healthy(&mut db)?;
        if batch.is_empty() {
            return Ok(());
        }
        let r = write_batch(healthy, app, batch);
        if let Err(e) = &r {
            self.fail(&mut db, "write", e);
        }
        r
    }
}

fn write_batch(db: &Database, app: &str, batch: &[Write]) -> Result<(), StoreError> {
    let w = db.begin_write().map_err(err)?;
    {
        let mut meta = w.open_table(META).map_err(err)?;
        let mut units = w.open_table(UNITS).map_err(err)?;
        let mut intents = w.open_table(INTENTS).map_err(err)?;
        let mut decisions = w.open_table(DECISIONS).map_err(err)?;
        let mut versions = w.open_table(VERSIONS).map_err(err)?;
        for op in batch {
            match op {
                Write::Spec(t) => {
                    meta.insert(format!("{app}/spec").as_str(), t.as_str()).map_err(err)?;
                }
                Write::PreviousSpec(t) => {
                    meta.insert(format!("{app}/previous_spec").as_str(), t.as_str()).map_err(err)?;
                }
                Write::DesiredUnits(n) => {
                    meta.insert(format!("{app}/desired").as_str(), n.to_string().as_str()).map_err(err)?;
                }
                Write::DesiredSecondary(n) => {
                    meta.insert(format!("{app}/desired_secondary").as_str(), n.to_string().as_str()).map_err(err)?;
                }
                Write::Override(o) => {
                    let v = serde_json::to_string(o).map_err(err)?;
                    meta.insert(format!("{app}/override").as_str(), v.as_str()).map_err(err)?;
                }
                Write::Decision(seq, json) => {
                    decisions.insert(decision_key(app, *seq).as_str(), json.as_str()).map_err(err)?;
                    let old = decision_key(app, seq.wrapping_sub(DECISIONS_KEPT as u64));
                    decisions.remove(old.as_str()).map_err(err)?;
                }
                Write::Version(v) => {
                    let text = serde_json::to_string(v).map_err(err)?;
                    versions.insert(decision_key(app, v.version).as_str(), text.as_str()).map_err(err)?;
                    let old = decision_key(app, v.version.wrapping_sub(VERSIONS_KEPT));
                    versions.remove(old.as_str()).map_err(err)?;
                }
                Write::NextGeneration(g) => {
                    meta.insert(format!("{app}/next_generation").as_str(), g.to_string().as_str()).map_err(err)?;
                }
                Write::Unit(u) => {
                    let v = serde_json::to_string(u).map_err(err)?;
                    units.insert(format!("{app}/{}", u.unit_id).as_str(), v.as_str()).map_err(err)?;
                }
                Write::DeleteUnit(id) => {
                    units.remove(format!("{app}/{id}").as_str()).map_err(err)?;
                }
                Write::Intent(i) => {
                    let v = serde_json::to_string(i).map_err(err)?;
                    intents.insert(format!("{app}/{}", i.txn_id).as_str(), v.as_str()).map_err(err)?;
                }
                Write::DeleteIntent(id) => {
                    intents.remove(format!("{app}/{id}").as_str()).map_err(err)?;
                }
                Write::SpecOrigin(_)
                | Write::FileFingerprint(_)
                | Write::GoodSpec(_)
                | Write::Rollout(_)
                | Write::FencingToken(_) => {
                    let (key, value) = rollout_key(app, op)?;
                    meta.insert(key.as_str(), value.as_str()).map_err(err)?;
                }
            }
        }
    }
    w.commit().map_err(err)?;
    metrics::counter!(m::STORE_WRITES.name).increment(1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::tests::exercise;

    #[test]
    fn redb_store_survives_a_reopen() {
        let dir = std::env::temp_dir().join(format!("flotilla-redb-{}", std::process::id()));
        let path = dir.join("state.redb");
        let _ = std::fs::remove_dir_all(&dir);
        exercise(&RedbStore::open(&path).unwrap());
        let again = RedbStore::open(&path).unwrap();
        assert_eq!(again.load("echo").unwrap().units.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
