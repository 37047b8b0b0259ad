//! The pool's instance records in redb, so a restarted manager neither leaks nor launches
//! twice: a REQUESTED record is saved *before* the provider's launch call, and the next
//! sync after a restart matches the provider's list to the records by id.
//!
//! One table, `instances`: id → the record as JSON (readable with any redb tool, and
//! tolerant of fields added later).

use std::path::Path;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};

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
    #[error("pool store: record {id}: {detail}")]
    Corrupt { id: String, detail: String },
    #[error("pool store: encoding record {id}: {detail}")]
    Encode { id: String, detail: String },
}

fn db<E: std::fmt::Display>(e: E) -> StoreError {
    StoreError::Db(e.to_string())
}

pub struct PoolStore {
    db: Database,
}

impl PoolStore {
    /// Opens (or creates) the store at `path` and makes sure its table exists.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let open = |detail: String| StoreError::Open { path: path.display().to_string(), detail };
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => StoreError::Locked { path: path.display().to_string() },
            e => open(e.to_string()),
        })?;
        let w = db.begin_write().map_err(|e| open(e.to_string()))?;
        w.open_table(INSTANCES).map_err(|e| open(e.to_string()))?;
        w.commit().map_err(|e| open(e.to_string()))?;
        Ok(PoolStore { db })
    }

    /// Every record. A record that does not parse is an error, not silently dropped: it
    /// may be an instance that would otherwise leak.
    pub fn load(&self) -> Result<Vec<Instance>, StoreError> {
        let r = self.db.begin_read().map_err(db)?;
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
    }

    /// Inserts or replaces `records`, in one transaction.
    pub fn save(&self, records: &[Instance]) -> Result<(), StoreError> {
        if records.is_empty() {
            return Ok(());
        }
        let w = self.db.begin_write().map_err(db)?;
        {
            let mut t = w.open_table(INSTANCES).map_err(db)?;
            for rec in records {
                let json = serde_json::to_string(rec)
                    .map_err(|e| StoreError::Encode { id: rec.id.clone(), detail: e.to_string() })?;
                t.insert(rec.id.as_str(), json.as_str()).map_err(db)?;
            }
        }
        w.commit().map_err(db)
    }

    /// Deletes the records of `ids` (unknown ids are fine), in one transaction.
    pub fn remove(&self, ids: &[String]) -> Result<(), StoreError> {
        if ids.is_empty() {
            return Ok(());
        }
        let w = self.db.begin_write().map_err(db)?;
        {
            let mut t = w.open_table(INSTANCES).map_err(db)?;
            for id in ids {
                t.remove(id.as_str()).map_err(db)?;
            }
        }
        w.commit().map_err(db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::instance::{InstanceState, Instances, Timeouts};

    #[test]
    fn records_survive_a_reopen() -> Result<(), Box<dyn std::error::Error>> {
        let dir = std::env::temp_dir().join(format!("flotilla-pool-store-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("pool.redb");
        let _ = std::fs::remove_file(&path);

        let mut im = Instances::new(["cpu".to_string()], 7);
        let ids = im.queue("cpu", 3, 1_000, "demand");
        im.begin_launch(&ids[0], 2_000)?;
        {
            let store = PoolStore::open(&path)?;
            assert!(store.load()?.is_empty());
            let all: Vec<_> = im.iter().cloned().collect();
            store.save(&all)?;
            store.remove(&[ids[2].clone(), "nope".to_string()])?;
        }
        let store = PoolStore::open(&path)?;
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
        let dir = std::env::temp_dir().join(format!("flotilla-pool-store-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join("pool.redb");
        let _ = std::fs::remove_file(&path);
        let store = PoolStore::open(&path)?;
        let w = store.db.begin_write()?;
        w.open_table(INSTANCES)?.insert("x", "not json")?;
        w.commit()?;
        assert!(matches!(store.load(), Err(StoreError::Corrupt { .. })));
        drop(store);
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
