//! Secrets and TLS material in the data dir: created once, reused afterwards.

use std::path::{Path, PathBuf};

use anyhow::Context;
use flotilla_aggregator::tls::{TlsMaterial, write_private};

/// A random token of 32 hex characters... times two.
pub fn random_token() -> String {
    let bytes: [u8; 32] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads the secret in `path`, creating it with a random token if absent.
pub fn ensure_token(path: &Path) -> anyhow::Result<String> {
    if let Ok(t) = std::fs::read_to_string(path) {
        let t = t.trim().to_string();
        if !t.is_empty() {
            return Ok(t);
        }
    }
    let t = random_token();
    write_private(path, t.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(t)
}

/// Everything `up` and a standalone shard need from the data dir.
pub struct DataDir {
    pub dir: PathBuf,
    pub join_token: String,
    pub api_token: String,
    pub shard_secret: String,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

impl DataDir {
    pub fn prepare(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating data dir {}", dir.display()))?;
        let (tls_cert, tls_key) = TlsMaterial::ensure_in(dir)?;
        Ok(DataDir {
            dir: dir.to_path_buf(),
            join_token: ensure_token(&dir.join("join-token"))?,
            api_token: ensure_token(&dir.join("api-token"))?,
            shard_secret: ensure_token(&dir.join("shard-secret"))?,
            tls_cert,
            tls_key,
        })
    }
}
