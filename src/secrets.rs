//! Secrets and TLS material in the data dir: created once, reused afterwards. The
//! join-token and grpc-token files may hold several tokens, one per line, newest first:
//! all are accepted while clients move to the newest (`flotilla join-token rotate`, then
//! `retire`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use flotilla_aggregator::{TlsMaterial, write_private};

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
    write_private(path, t.as_bytes())?;
    Ok(t)
}

/// The tokens in a token-list file, newest first: one per line, blank lines ignored.
pub fn parse_tokens(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty()).map(str::to_string).collect()
}

/// The tokens in `path`; an error names the file.
pub fn read_tokens(path: &Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(parse_tokens(&text))
}

/// Replaces a token-list file at once (readers see the old list or the new one).
fn write_tokens(path: &Path, tokens: &[String]) -> anyhow::Result<()> {
    let text: String = tokens.iter().map(|t| format!("{t}\n")).collect();
    Ok(write_private(path, text.as_bytes())?)
}

/// The tokens in `path`, creating the file with one random token if it has none.
pub fn ensure_tokens(path: &Path) -> anyhow::Result<Vec<String>> {
    if path.exists() {
        let tokens = read_tokens(path)?;
        if !tokens.is_empty() {
            return Ok(tokens);
        }
    }
    let tokens = vec![random_token()];
    write_tokens(path, &tokens)?;
    Ok(tokens)
}

/// Puts a new random token first in `path`, keeping the others; returns it.
pub fn rotate_token(path: &Path) -> anyhow::Result<(String, Vec<String>)> {
    let mut tokens = if path.exists() { read_tokens(path)? } else { Vec::new() };
    let new = random_token();
    tokens.insert(0, new.clone());
    write_tokens(path, &tokens)?;
    Ok((new, tokens))
}

/// Keeps only the newest token in `path`; returns how many were retired.
pub fn retire_tokens(path: &Path) -> anyhow::Result<usize> {
    let tokens = read_tokens(path)?;
    let Some(newest) = tokens.first() else { bail!("{} holds no join token", path.display()) };
    write_tokens(path, std::slice::from_ref(newest))?;
    Ok(tokens.len() - 1)
}

#[derive(Debug, Args)]
pub struct JoinTokenArgs {
    #[command(subcommand)]
    pub action: JoinTokenAction,
    /// The data dir whose `join-token` file the shards read.
    #[arg(long, env = "FLOTILLA_DATA", default_value = "./.flotilla", global = true)]
    pub data: PathBuf,
    /// Print what changed as one JSON object (`rotate`: the new token too).
    #[arg(long, global = true)]
    pub json: bool,
}

#[derive(Debug, Subcommand)]
pub enum JoinTokenAction {
    /// Add a new token at the top of DATA/join-token and print it; the old ones stay
    /// accepted until `retire`.
    Rotate,
    /// Keep only the newest token: agents with an older one can no longer register.
    Retire,
}

/// `flotilla join-token rotate|retire`. Running shards read the file again within 10 s,
/// or at once on SIGHUP.
pub fn join_token(a: JoinTokenArgs) -> anyhow::Result<()> {
    let path = a.data.join("join-token");
    match a.action {
        JoinTokenAction::Rotate => {
            let (new, all) = rotate_token(&path)?;
            if a.json {
                let v = serde_json::json!({"file": path, "new_token": new, "accepted": all.len()});
                println!("{v}");
                return Ok(());
            }
            println!("{new}");
            eprintln!(
                "{}: {} token(s) accepted, the new one first. Give agents the new token, then run \
                 `flotilla join-token retire`. Running shards read the file within 10 s (or on SIGHUP).",
                path.display(),
                all.len()
            );
        }
        JoinTokenAction::Retire => {
            let retired = retire_tokens(&path)?;
            if a.json {
                println!("{}", serde_json::json!({"file": path, "retired": retired, "accepted": 1}));
                return Ok(());
            }
            eprintln!(
                "{}: kept the newest token, retired {retired}. Running shards refuse the old ones within 10 s \
                 (or on SIGHUP); sessions already open stay.",
                path.display()
            );
        }
    }
    Ok(())
}

/// Everything `up` and a standalone shard need from the data dir.
pub struct DataDir {
    pub dir: PathBuf,
    /// Newest first.
    pub join_tokens: Vec<String>,
    pub api_token: String,
    /// Bearer tokens of the shards' gRPC services (commit, watch, admin), newest first.
    pub grpc_tokens: Vec<String>,
    pub shard_secret: String,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

/// The files a shard reads from its secrets dir (`--secrets`), all required when that
/// dir is not the data dir.
pub const SHARD_SECRET_FILES: [&str; 5] = ["shard-secret", "join-token", "grpc-token", "tls.crt", "tls.key"];

impl DataDir {
    /// Reads the secrets in `dir` without writing anything there (a read-only
    /// Kubernetes Secret mount): every file of [`SHARD_SECRET_FILES`] must exist and hold
    /// something; `api-token` is read when present. An error names the file and says
    /// how the dir is meant to be filled.
    pub fn read_only(dir: &Path) -> anyhow::Result<Self> {
        let missing: Vec<String> = SHARD_SECRET_FILES
            .iter()
            .map(|f| dir.join(f))
            .filter(|p| !p.is_file())
            .map(|p| p.display().to_string())
            .collect();
        if !missing.is_empty() {
            bail!(
                "the secrets dir {} lacks {}: create them (deploy/kubernetes/README.md shows how), \
                 or leave --secrets out to have them generated in the data dir",
                dir.display(),
                missing.join(", ")
            );
        }
        let one = |name: &str| -> anyhow::Result<String> {
            let path = dir.join(name);
            let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
            let t = text.trim().to_string();
            if t.is_empty() {
                bail!("{} is empty", path.display());
            }
            Ok(t)
        };
        let list = |name: &str| -> anyhow::Result<Vec<String>> {
            let path = dir.join(name);
            let tokens = read_tokens(&path)?;
            if tokens.is_empty() {
                bail!("{} holds no token", path.display());
            }
            Ok(tokens)
        };
        Ok(DataDir {
            dir: dir.to_path_buf(),
            join_tokens: list("join-token")?,
            api_token: one("api-token").unwrap_or_default(),
            grpc_tokens: list("grpc-token")?,
            shard_secret: one("shard-secret")?,
            tls_cert: dir.join("tls.crt"),
            tls_key: dir.join("tls.key"),
        })
    }

    /// Reads the secrets in `dir`, creating those that are missing (`flotilla up`, and a
    /// shard whose secrets live in its data dir). A TLS pair made here names `hosts` too.
    pub fn prepare(dir: &Path, hosts: &[&str]) -> anyhow::Result<Self> {
        flotilla_obs::fsutil::create_dir_all(dir)?;
        let (tls_cert, tls_key) = TlsMaterial::ensure_in(dir, hosts)?;
        Ok(DataDir {
            dir: dir.to_path_buf(),
            join_tokens: ensure_tokens(&dir.join("join-token"))?,
            api_token: ensure_token(&dir.join("api-token"))?,
            grpc_tokens: ensure_tokens(&dir.join("grpc-token"))?,
            shard_secret: ensure_token(&dir.join("shard-secret"))?,
            tls_cert,
            tls_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_tokens_rotate_and_retire_in_the_file() {
        let dir = std::env::temp_dir().join(format!("flotilla-secrets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("join-token");
        let first = ensure_tokens(&path).unwrap();
        assert_eq!(first.len(), 1);
        assert_eq!(ensure_tokens(&path).unwrap(), first, "kept, not regenerated");
        let (new, all) = rotate_token(&path).unwrap();
        assert_eq!(all, vec![new.clone(), first[0].clone()]);
        assert_eq!(read_tokens(&path).unwrap(), all);
        let (newer, _) = rotate_token(&path).unwrap();
        assert_eq!(read_tokens(&path).unwrap().len(), 3);
        assert_eq!(retire_tokens(&path).unwrap(), 2);
        assert_eq!(read_tokens(&path).unwrap(), vec![newer]);
        assert_eq!(parse_tokens(" a \n\n b\n"), vec!["a", "b"]);
        std::fs::write(&path, "\n").unwrap();
        assert!(retire_tokens(&path).unwrap_err().to_string().contains("holds no join token"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
