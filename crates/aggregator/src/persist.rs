//! The little a shard keeps across restarts besides its master secret: operator
//! cordons and drains, and the fencing mark of every app. The ledger itself is not kept
//! (a restarted shard rebuilds it from its agents), but without these a restart would
//! forget an operator's drain and would let a deposed scheduler's stale claims back in.
//!
//! One small JSON document, written whole after every change (cordons and mark rises are
//! rare) to a [`StateStore`]: a file in the shard's data dir, replaced atomically (temp
//! file, fsync, rename), or, when the shard runs on etcd, a key there. It is bounded and
//! validated when loaded, and a bad one stops the shard with a clear error rather than
//! being half-read.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use anyhow::{Context, bail};
use flotilla_core::{LockExt, NodeId};
use serde::{Deserialize, Serialize};

use crate::ledger::{Ledger, MAX_FENCED_APPS};
use crate::registry::Registry;

/// The largest state document accepted (about 100,000 cordons and every fencing mark).
pub const MAX_STATE_BYTES: usize = 16 << 20;
/// Cordoned nodes one shard keeps.
pub const MAX_CORDONS: usize = 200_000;
const VERSION: u32 = 1;

/// What survives a shard restart.
#[derive(Debug, Default, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShardState {
    pub version: u32,
    /// Cordoned node → whether a drain was asked for too.
    #[serde(default)]
    pub cordons: BTreeMap<String, bool>,
    /// App → the highest fencing token seen for it.
    #[serde(default)]
    pub fencing: BTreeMap<String, u64>,
}

impl ShardState {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut s = self.clone();
        s.version = VERSION;
        // A map of strings and numbers always serialises.
        serde_json::to_vec_pretty(&s).unwrap_or_default()
    }

    /// Parses and validates a document; the error names what is wrong.
    pub fn from_bytes(bytes: &[u8]) -> anyhow::Result<ShardState> {
        if bytes.len() > MAX_STATE_BYTES {
            bail!("{} bytes, more than the {MAX_STATE_BYTES} allowed", bytes.len());
        }
        let s: ShardState = serde_json::from_slice(bytes).context("not a shard state document (JSON)")?;
        if s.version != VERSION {
            bail!("version {} (this shard reads version {VERSION})", s.version);
        }
        if s.cordons.len() > MAX_CORDONS {
            bail!("{} cordons, more than {MAX_CORDONS}", s.cordons.len());
        }
        if s.fencing.len() > MAX_FENCED_APPS {
            bail!("{} fencing marks, more than {MAX_FENCED_APPS}", s.fencing.len());
        }
        for node in s.cordons.keys() {
            NodeId::new(node).map_err(|e| anyhow::anyhow!("cordons: node {node:?}: {e}"))?;
        }
        for app in s.fencing.keys() {
            crate::wire::name("fencing app", app).map_err(|e| anyhow::anyhow!("fencing: app {app:?}: {e}"))?;
        }
        Ok(s)
    }

    /// Puts the state into a starting shard's registry and ledger.
    pub fn apply(&self, registry: &Registry, ledger: &mut Ledger) {
        for (node, drain) in &self.cordons {
            if let Ok(node) = NodeId::new(node) {
                registry.restore_cordon(node, *drain);
            }
        }
        ledger.restore_marks(self.fencing.iter().map(|(a, t)| (a.clone(), *t)));
    }

    /// The state of a running shard.
    pub fn of(registry: &Registry, ledger: &Ledger) -> ShardState {
        ShardState {
            version: VERSION,
            cordons: registry.cordons().into_iter().map(|(n, d)| (n.to_string(), d)).collect(),
            fencing: ledger.marks(),
        }
    }
}

/// A save in flight.
pub type SaveFuture = Pin<Box<dyn Future<Output = anyhow::Result<()>> + Send>>;

/// Where a shard's state is kept. `save` replaces the whole document; once it returned
/// Ok, a restart loads that document (or a later one).
pub trait StateStore: Send + Sync + 'static {
    fn save(&self, bytes: Vec<u8>) -> SaveFuture;
    /// Where, for logs and errors.
    fn describe(&self) -> String;
}

/// The state as a file in the shard's data dir.
pub struct FileState {
    path: PathBuf,
}

impl FileState {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileState { path: path.into() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The saved state; a missing file is a shard that never saved any (empty state).
    pub fn load(&self) -> anyhow::Result<ShardState> {
        let bytes = match std::fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(ShardState::default()),
            Err(e) => return Err(e).with_context(|| format!("reading the shard state {}", self.path.display())),
        };
        ShardState::from_bytes(&bytes).with_context(|| {
            format!(
                "the shard state {} is not valid (fix or remove it; it holds cordons and fencing marks)",
                self.path.display()
            )
        })
    }
}

impl StateStore for FileState {
    fn save(&self, bytes: Vec<u8>) -> SaveFuture {
        let path = self.path.clone();
        Box::pin(async move {
            let p = path.clone();
            tokio::task::spawn_blocking(move || flotilla_obs::fsutil::write_atomic(&p, &bytes, 0o600))
                .await
                .context("the state writer panicked")?
                .with_context(|| format!("writing the shard state {}", path.display()))
        })
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }
}

/// The state in memory: for tests and the simulation, where it outlives a shard "crash".
#[derive(Default)]
pub struct MemState {
    bytes: Mutex<Vec<u8>>,
}

impl MemState {
    pub fn load(&self) -> anyhow::Result<ShardState> {
        let b = self.bytes.lock_or_recover().clone();
        if b.is_empty() { Ok(ShardState::default()) } else { ShardState::from_bytes(&b) }
    }
}

impl StateStore for MemState {
    fn save(&self, bytes: Vec<u8>) -> SaveFuture {
        *self.bytes.lock_or_recover() = bytes;
        Box::pin(async { Ok(()) })
    }

    fn describe(&self) -> String {
        "memory".into()
    }
}

/// Saves a running shard's state after a change. Saves are serialised, and each takes
/// its snapshot under the lock, so the last one written is the newest state.
pub struct Persister {
    store: Option<Arc<dyn StateStore>>,
    registry: Arc<Registry>,
    ledger: Arc<Mutex<Ledger>>,
    lock: tokio::sync::Mutex<()>,
}

impl Persister {
    pub fn new(store: Option<Arc<dyn StateStore>>, registry: Arc<Registry>, ledger: Arc<Mutex<Ledger>>) -> Self {
        Persister { store, registry, ledger, lock: tokio::sync::Mutex::new(()) }
    }

    /// Writes the current state (nothing when the shard keeps none).
    pub async fn save(&self) -> anyhow::Result<()> {
        let Some(store) = &self.store else { return Ok(()) };
        let _one = self.lock.lock().await;
        let bytes = {
            let ledger = self.ledger.lock_or_recover();
            ShardState::of(&self.registry, &ledger).to_bytes()
        };
        let result = store.save(bytes).await;
        let label = if result.is_ok() { "ok" } else { "error" };
        metrics::counter!(crate::catalogue::SHARD_STATE_SAVES.name, "result" => label).increment(1);
        if let Err(e) = &result {
            tracing::error!(error = %format!("{e:#}"), store = %store.describe(), "saving the shard state failed");
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_round_trips_and_bad_documents_are_named() {
        let mut s = ShardState::default();
        s.cordons.insert("n1".into(), true);
        s.fencing.insert("app".into(), 42);
        let back = ShardState::from_bytes(&s.to_bytes()).unwrap();
        assert_eq!((back.cordons, back.fencing), (s.cordons.clone(), s.fencing.clone()));
        let err = |b: &[u8]| format!("{:#}", ShardState::from_bytes(b).unwrap_err());
        assert!(err(b"{").contains("not a shard state"));
        assert!(err(br#"{"version":2}"#).contains("version 2"));
        assert!(err(br#"{"version":1,"cordons":{"":true}}"#).contains("cordons"));
        assert!(err(br#"{"version":1,"fencing":{"a\u0001":1}}"#).contains("fencing"));
        assert!(err(br#"{"version":1,"other":1}"#).contains("not a shard state"));
        assert!(err(&vec![b' '; MAX_STATE_BYTES + 1]).contains("more than"));
    }

    #[test]
    fn a_file_state_is_empty_until_saved_and_then_loads_back() {
        let dir = std::env::temp_dir().join(format!("flotilla-persist-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let f = FileState::new(dir.join("state.json"));
        assert_eq!(f.load().unwrap(), ShardState::default());
        let mut s = ShardState::default();
        s.fencing.insert("app".into(), 7);
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f.save(s.to_bytes())).unwrap();
        assert_eq!(f.load().unwrap().fencing, s.fencing);
        std::fs::write(f.path(), b"garbage").unwrap();
        let e = format!("{:#}", f.load().unwrap_err());
        assert!(e.contains("is not valid") && e.contains("state.json"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
