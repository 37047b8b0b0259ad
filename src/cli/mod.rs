//! Client commands: each talks to the control plane's HTTP API ([`http`]) and prints a
//! table, or one JSON document with `--json`; the actions (`scale`, `apply`,
//! `rollback`, `node drain`) take `--wait` too ([`wait`]).

pub mod apply;
pub mod apps;
pub mod artifacts;
pub mod autoscaling;
pub mod complete;
pub mod events;
pub mod http;
pub mod logs;
pub mod nodes;
pub mod progress;
pub mod rebalance;
pub mod rollout;
pub mod scale;
pub mod status;
pub mod table;
pub mod tokens;
pub mod versions;
pub mod wait;

use anyhow::Context;

/// A text file the command line names, read only up to `limit` bytes: a larger one (or
/// `/dev/zero`, whose size says 0) is refused, never read whole into memory.
pub fn read_capped(path: &std::path::Path, limit: u64, what: &str) -> anyhow::Result<String> {
    use std::io::Read;
    let file = std::fs::File::open(path).with_context(|| format!("opening the {what} {}", path.display()))?;
    let mut text = String::new();
    file.take(limit + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("reading the {what} {} (UTF-8 text expected)", path.display()))?;
    if text.len() as u64 > limit {
        anyhow::bail!("the {what} {} is larger than {} MiB", path.display(), limit >> 20);
    }
    Ok(text)
}
