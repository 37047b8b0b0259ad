//! The pool's instance records in redb, so a restarted manager neither leaks nor launches
//! twice: a REQUESTED record is saved *before* the provider's launch call, and the next
//! sync after a restart matches the provider's list to the records by id.
//!
//! One table, `instances`: id → the record as JSON (readable with any redb tool, and
//! tolerant of fields added later).

use std::path::Path;
use std::time::Duration;

use flotilla_core::reopen::{Reopening, Unavailable};
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

use crate::catalogue as m;

use crate::instance::Instance;

const INSTANCES: TableDefinition<&str, &str> = TableDefinition::new("instances");

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("pool store {path}: {detail}")]
    Open { path: String, detail: String },
    /// Another process has the store open (redb locks the file): the autoscaler this one
    /// replaces, still exiting, or a second one for the same pool.
    #[error("pool store {path}: another process has it open")]
    Locked { path: String },
    #[error("pool store: {0}")]
    Db(String),
    /// Failing since an operation failed, until a reopen succeeds.
    #[error("pool store: {0}")]
    Unavailable(String),
    #[error("pool store: record {id}: {detail}")]
    Corrupt { id: String, detail: String },
    #[error("pool store: encoding record {id}: {detail}")]
    Encode { id: String, detail: String },
}

fn db<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

/// Opens the database a store reopens after a failure.
type Opener = Box<dyn Fn() -> Result<Database, StoreError> + Send>;

/// The first wait before a failed store is reopened, doubling up to [`REOPEN_MAX`], as
/// the scheduler's store does: a full disk is not fixed in milliseconds.
const REOPEN_FIRST: Duration = Duration::from_secs(2);
const REOPEN_MAX: Duration = Duration::from_secs(10);

/// The instance records. An operation that fails (a full disk) leaves redb refusing
/// every later write, so the store is closed and reopened with back-off until it takes
/// writes again; meanwhile operations fail fast. The autoscaler launches nothing whose
/// record it could not save, and keeps every record in memory to save once it can.
pub struct PoolStore {
    pool: String,
    open: Opener,
    db: Reopening<Database>,
}

/// Opens (or creates) the file at `path` and makes sure its table exists.
fn open_file(path: &Path) -> Result<Database, StoreError> {
    let open = |detail: String| StoreError::Open { path: path.display().to_string(), detail };
    let db = Database::create(path).map_err(|e| match e {
        redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked { path: path.display().to_string() },
        e => open(e.to_string()),
    })?;
    with_table(db).map_err(|e| open(e.to_string()))
}

/// The instances table exists, committed: the store takes writes.
fn with_table(database: Database) -> Result<Database, StoreError> {
    let w = database.begin_write().map_err(db)?;
    w.open_table(INSTANCES).map_err(db)?;
    w.commit().map_err(db)?;
    Ok(database)
}

impl PoolStore {
    /// Opens (or creates) the store of pool `pool` at `path`.
    pub fn open(pool: &str, path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref().to_path_buf();
        Self::with_opener(pool, Box::new(move || open_file(&path)), REOPEN_FIRST, REOPEN_MAX)
    }

    /// A store in memory: for `flotilla sim`, whose pool lives as long as the run.
    pub fn in_memory(pool: &str) -> Result<Self, StoreError> {
        let open = || {
            let db = Database::builder()
                .create_with_backend(redb::backends::InMemoryBackend::new())
                .map_err(|e| StoreError::Open { path: "memory".into(), detail: e.to_string() })?;
            with_table(db).map_err(|e| StoreError::Open { path: "memory".into(), detail: e.to_string() })
        };
        Self::with_opener(pool, Box::new(open), REOPEN_FIRST, REOPEN_MAX)
    }

    fn with_opener(pool: &str, open: Opener, first: Duration, max: Duration) -> Result<Self, StoreError> {
        let db = open()?;
        metrics::gauge!(m::STORE_HEALTHY.name, "pool" => pool.to_string()).set(1.0);
        Ok(PoolStore { pool: pool.to_string(), open, db: Reopening::new(db, first, max) })
    }

    /// Why the store takes no writes now, while it is failing.
    pub fn failing(&self) -> Option<&str> {
        self.db.failing()
    }

    /// Runs `op` on the database, reopened first while failing once the back-off allows;
    /// a failure of `op` marks the store failing.
    fn with_db<T>(
        &mut self,
        name: &'static str,
        op: impl FnOnce(&Database) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let pool = self.pool.clone();
        let db = match self.db.get(&self.open) {
            Ok((db, reopened)) => {
                if let Some(failed_for_ms) = reopened {
                    metrics::counter!(m::STORE_REOPENS.name, "pool" => pool.clone(), "result" => "ok").increment(1);
                    metrics::gauge!(m::STORE_HEALTHY.name, "pool" => pool.clone()).set(1.0);
                    tracing::info!(%pool, failed_for_ms, "the pool store was reopened and takes writes again");
                }
                db
            }
            Err(e) => {
                if let Unavailable::ReopenFailed(_) = e {
                    metrics::counter!(m::STORE_REOPENS.name, "pool" => pool.clone(), "result" => "error").increment(1);
                    metrics::counter!(m::STORE_ERRORS.name, "pool" => pool, "op" => "reopen").increment(1);
                }
                return Err(StoreError::Unavailable(e.to_string()));
            }
        };
        let r = op(db);
        if let Err(e) = &r
            && !matches!(e, StoreError::Corrupt { .. } | StoreError::Encode { .. })
        {
            metrics::counter!(m::STORE_ERRORS.name, "pool" => pool.clone(), "op" => name).increment(1);
            metrics::gauge!(m::STORE_HEALTHY.name, "pool" => pool.clone()).set(0.0);
            if self.db.fail(e.to_string()) {
                tracing::warn!(%pool, error = %e, "the pool store failed; reopening it with back-off until it takes writes again");
            }
        }
        r
    }

    /// Every record. A record that does not parse is an error, not silently dropped: it
    /// may be an instance that would otherwise leak.
    pub fn load(&mut self) -> Result<Vec<Instance>, StoreError> {
        self.with_db("load", |d| {
            let r = d.begin_read().map_err(db)?;
            let t = r.open_table(INSTANCES).map_err(db)?;
            let mut out = Vec::new();
            for row in t.iter().map_err(db)? {
                let (k, v) = row.map_err(db)?;
                let id = k.value().to_string();
                let rec: Instance = serde_json::from_str(v.value())
                    .map_err(|e| StoreError::Corrupt { id: id.clone(), detail: e.to_string() })?;
                if rec.id != id {
                    return Err(StoreError::Corrupt { id, detail: format!("holds the record of {:?}", rec.id) });
                }
                out.push(rec);
            }
            Ok(out)
        })
    }

    /// Inserts or replaces `records`, in one transaction.
    pub fn save(&mut self, records: &[Instance]) -> Result<(), StoreError> {
        if records.is_empty() && self.failing().is_none() {
            return Ok(());
        }
        self.with_db("save", |d| {
            let w = d.begin_write().map_err(db)?;
            {
                let mut t = w.open_table(INSTANCES).map_err(db)?;
                for rec in records {
                    let json = serde_json::to_string(rec)
                        .map_err(|e| StoreError::Encode { id: rec.id.clone(), detail: e.to_string() })?;
                    t.insert(rec.id.as_str(), json.as_str()).map_err(db)?;
                }
            }
            w.commit().map_err(db)
        })
    }

    /// Deletes the records of `ids` (unknown ids are fine), in one transaction.
    pub fn remove(&mut self, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        self.with_db("remove", |d| {
            let w = d.begin_write().map_err(db)?;
            {
                let mut t = w.open_table(INSTANCES).map_err(db)?;
                for id in ids {
                    t.remove(id.as_str()).map_err(db)?;
                }
            }
            w.commit().map_err(db)
        })
    }
}

/// A store on a file that fails writes on demand, as a full disk does, for the tests of
/// the store and of the autoscaler that uses it.
#[cfg(test)]
pub(crate) mod testing {
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// The store at `path`, and the switch that fills its disk. Reopens wait no time.
    pub fn flaky(path: &Path) -> Result<(PoolStore, Arc<AtomicBool>), StoreError> {
        let full = Arc::new(AtomicBool::new(false));
        let (p, f) = (path.to_path_buf(), full.clone());
        let opener: Opener = Box::new(move || {
            let file =
                std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&p).map_err(db)?;
            let backend = Flaky { file: redb::backends::FileBackend::new(file).map_err(db)?, full: f.clone() };
            with_table(redb::Builder::new().create_with_backend(backend).map_err(db)?)
        });
        Ok((PoolStore::with_opener("test", opener, Duration::ZERO, Duration::ZERO)?, full))
    }

    /// A file whose writes fail while `full` is set, as on a full disk.
    #[derive(Debug)]
    struct Flaky {
        file: redb::backends::FileBackend,
        full: Arc<AtomicBool>,
    }

    impl redb::StorageBackend for Flaky {
        fn len(&self) -> Result<u64, std::io::Error> {
            self.file.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
            self.file.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
            self.refuse()?;
            self.file.set_len(len)
        }
        fn sync_data(&self) -> Result<(), std::io::Error> {
            self.refuse()?;
            self.file.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
            self.refuse()?;
            self.file.write(offset, data)
        }
    }

    impl Flaky {
        fn refuse(&self) -> Result<(), std::io::Error> {
            match self.full.load(std::sync::atomic::Ordering::SeqCst) {
                true => Err(std::io::Error::from_raw_os_error(28)), // ENOSPC
                false => Ok(()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::{InstanceState, Instances, Timeouts};

    /// A dir of this test process's own and a store path in it, no file there yet.
    fn fresh_store(name: &str) -> std::io::Result<(std::path::PathBuf, std::path::PathBuf)> {
        let dir = std::env::temp_dir().join(format!("flotilla-pool-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("pool.redb");
        let _ = std::fs::remove_file(&path);
        Ok((dir, path))
    }

    #[test]
    fn records_survive_a_reopen() -> Result<(), Box<dyn std::error::Error>> {
        let (dir, path) = fresh_store("store")?;

        let mut im = Instances::new(["cpu".to_string()], 7);
        let ids = im.queue("cpu", 3, 1_000, "demand");
        im.begin_launch(&ids[0], 2_000)?;
        {
            let mut store = PoolStore::open("test", &path)?;
            assert!(store.load()?.is_empty());
            let all: Vec<_> = im.iter().cloned().collect();
            store.save(&all)?;
            store.remove(&[ids[2].clone(), "nope".to_string()])?;
        }
        let mut store = PoolStore::open("test", &path)?;
        let mut loaded = store.load()?;
        loaded.sort_by(|a, b| a.id.cmp(&b.id));
        let mut want: Vec<_> = im.iter().filter(|i| i.id != ids[2]).cloned().collect();
        want.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(loaded, want);
        let requested = loaded.iter().find(|i| i.id == ids[0]).ok_or("missing")?;
        assert_eq!(requested.state, InstanceState::Requested);
        assert_eq!(requested.launch_attempts, 1);

        // A restarted manager picks them up and does not launch the REQUESTED one again.
        let mut im2 = Instances::new(["cpu".to_string()], 8);
        im2.restore(loaded);
        assert_eq!(im2.to_launch(10, 10.0, 3_000), vec![ids[1].clone()]);
        let changes = im2.observe(
            &[crate::provider::CloudInstance { id: ids[0].clone(), node_type: "cpu".into() }],
            &Default::default(),
            3_000,
            &Timeouts::default(),
        );
        assert_eq!(im2.get(&ids[0]).map(|i| i.state), Some(InstanceState::AgentStarting), "{changes:?}");
        assert_eq!(im2.len(), 2, "matched by id, not adopted as a second record");

        // Upsert replaces.
        let rec = im2.get(&ids[0]).cloned().ok_or("missing")?;
        store.save(std::slice::from_ref(&rec))?;
        assert!(store.load()?.contains(&rec));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    #[test]
    fn a_corrupt_record_is_an_error() -> Result<(), Box<dyn std::error::Error>> {
        let (dir, path) = fresh_store("store-bad")?;
        let mut store = PoolStore::open("test", &path)?;
        let w = store.db.get(|| Err("healthy"))?.0.begin_write()?;
        w.open_table(INSTANCES)?.insert("x", "not json")?;
        w.commit()?;
        assert!(matches!(store.load(), Err(StoreError::Corrupt { .. })));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }

    /// Issue #34 item 7: a write the disk refuses leaves redb refusing every later one;
    /// the store reports itself failing, fails fast, reopens once the back-off allows,
    /// and takes writes again once the disk does, the records it took before intact.
    #[test]
    fn a_failed_store_reopens_and_takes_writes_again() -> Result<(), Box<dyn std::error::Error>> {
        use std::sync::atomic::Ordering;
        let (dir, path) = fresh_store("store-flaky")?;
        let (mut store, full) = testing::flaky(&path)?;
        let mut im = Instances::new(["cpu".to_string()], 7);
        let ids = im.queue("cpu", 2, 1_000, "demand");
        let first: Vec<_> = im.iter().filter(|i| i.id == ids[0]).cloned().collect();
        store.save(&first)?;

        full.store(true, Ordering::SeqCst);
        let all: Vec<_> = im.iter().cloned().collect();
        assert!(store.save(&all).is_err(), "the disk refuses the write");
        assert!(
            store.failing().is_some_and(|e| e.contains("28") || e.to_lowercase().contains("space")),
            "{:?}",
            store.failing()
        );
        let again = store.save(&all).unwrap_err().to_string();
        assert!(again.contains("reopening failed"), "the reopen fails while the disk is full: {again}");

        full.store(false, Ordering::SeqCst);
        store.save(&all)?;
        assert_eq!(store.failing(), None);
        let mut loaded = store.load()?;
        loaded.sort_by(|a, b| a.id.cmp(&b.id));
        let mut want = all.clone();
        want.sort_by(|a, b| a.id.cmp(&b.id));
        assert_eq!(loaded, want, "the record saved before the failure and the ones after");
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
