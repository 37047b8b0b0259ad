//! `flotilla logs APP [UNIT[/MEMBER]] [-f] [--tail N] [--since 10m] [--stderr]`: what
//! members wrote, as `nomad alloc logs` and `kubectl logs` show it. One member's lines
//! come as they are; several members' (a unit, or the whole app) interleave, each line
//! after its `unit/member |` prefix, in time order (as they come, with `-f`).

use anyhow::Context;
use clap::Args;
use serde_json::Value;
use tokio::sync::mpsc;

use super::http::{Api, ListArgs};

#[derive(Debug, Args)]
pub struct LogsArgs {
    /// The app.
    pub app: String,
    /// A unit (every member of it) or UNIT/MEMBER; without it, every placed member of
    /// the app.
    pub target: Option<String>,
    /// Keep printing lines as they are written.
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only the last N lines of each member (at most 100,000).
    #[arg(long)]
    pub tail: Option<u32>,
    /// Only lines this recent (`10m`, `1h`) or since this RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// The members' stderr instead of their stdout.
    #[arg(long)]
    pub stderr: bool,
    /// Each line after the time it was written.
    #[arg(long)]
    pub timestamps: bool,
    #[command(flatten)]
    pub list: ListArgs,
}

fn enc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

impl LogsArgs {
    fn path(&self, unit: &str, member: &str, timestamps: bool) -> String {
        let mut q = vec![format!("stream={}", if self.stderr { "stderr" } else { "stdout" })];
        if let Some(t) = self.tail {
            q.push(format!("tail={t}"));
        }
        if let Some(s) = &self.since {
            q.push(format!("since={}", enc(s)));
        }
        if self.follow {
            q.push("follow=true".into());
        }
        if timestamps {
            q.push("timestamps=true".into());
        }
        format!("/v1/apps/{}/units/{}/members/{}/logs?{}", enc(&self.app), enc(unit), enc(member), q.join("&"))
    }
}

/// The (unit, member) pairs to read: those placed on a node (members and surge members)
/// of units not ended (a failed unit's members still hold their nodes and their logs).
fn members(units: &Value, unit: Option<&str>) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = units
        .as_array()
        .into_iter()
        .flatten()
        .filter(|u| unit.is_none_or(|want| u["unit_id"] == want))
        .filter(|u| u["state"] != "terminated")
        .flat_map(|u| {
            let id = u["unit_id"].as_str().unwrap_or_default().to_string();
            ["members", "surge"]
                .into_iter()
                .flat_map(|k| u[k].as_array().cloned().unwrap_or_default())
                .filter(|m| m["node_id"].is_string())
                .filter_map(move |m| Some((id.clone(), m["member"].as_str()?.to_string())))
        })
        .collect();
    // A surge member shares its name with the member it replaces: read it once.
    out.sort();
    out.dedup();
    out
}

/// Members followed at once: each holds a stream through the control plane, which
/// allows an address this many, and one of its agent's readers.
const MAX_FOLLOWED: usize = flotilla_control::logs::MAX_FOLLOWS_PER_PEER;
/// Members whose history is read at once.
const READ_AT_ONCE: usize = 8;

/// Reads one member's answer line by line into `out`, each with its prefix.
async fn pump(api: Api, path: String, prefix: String, out: mpsc::Sender<(String, String)>) -> anyhow::Result<()> {
    let mut resp = api.open(&path).await.with_context(|| prefix.clone())?;
    let mut pending = Vec::new();
    while let Some(chunk) = resp.chunk().await.with_context(|| format!("{prefix}: reading the logs"))? {
        pending.extend_from_slice(&chunk);
        while let Some(i) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=i).collect();
            let text = String::from_utf8_lossy(&line[..line.len() - 1]).into_owned();
            if out.send((prefix.clone(), text)).await.is_err() {
                return Ok(());
            }
        }
    }
    Ok(())
}

/// A line that starts with its RFC 3339 time: the time, and the rest.
fn split_time(line: &str) -> (u64, &str) {
    match line.split_once(' ') {
        Some((t, rest)) => flotilla_core::parse_rfc3339(t).map_or((0, line), |ms| (ms, rest)),
        None => (0, line),
    }
}

pub async fn logs(a: LogsArgs) -> anyhow::Result<()> {
    let api = Api::new(&a.list.addr, a.list.ca.as_deref())?;
    if let Some((unit, member)) = a.target.as_deref().and_then(|t| t.split_once('/')) {
        // One member: its lines as they are.
        let (tx, mut rx) = mpsc::channel(256);
        let reading = tokio::spawn(pump(api, a.path(unit, member, a.timestamps), String::new(), tx));
        while let Some((_, line)) = rx.recv().await {
            println!("{line}");
        }
        return reading.await?;
    }
    let units = api.get(&format!("/v1/apps/{}/units", enc(&a.app))).await?;
    let targets = members(&units, a.target.as_deref());
    if targets.is_empty() {
        let what = a.target.as_deref().map_or(format!("app {}", a.app), |u| format!("unit {u} of app {}", a.app));
        anyhow::bail!("{what} has no member placed on a node: no logs to show");
    }
    if a.follow && targets.len() > MAX_FOLLOWED {
        anyhow::bail!(
            "{} members: -f follows at most {MAX_FOLLOWED} at once; name a unit (flotilla logs {} UNIT -f)",
            targets.len(),
            a.app
        );
    }
    let (tx, mut rx) = mpsc::channel(1024);
    let mut readers = tokio::task::JoinSet::new();
    let at_once = std::sync::Arc::new(tokio::sync::Semaphore::new(if a.follow { MAX_FOLLOWED } else { READ_AT_ONCE }));
    for (unit, member) in &targets {
        // Times come along to order the members' lines; printed only when asked for.
        let (path, prefix) = (a.path(unit, member, true), format!("{unit}/{member}"));
        let (api, tx, at_once) = (api.clone(), tx.clone(), at_once.clone());
        readers.spawn(async move {
            let _turn = at_once.acquire_owned().await?;
            let r = pump(api, path, prefix, tx).await;
            // Said at once, not when the others end (with -f, never).
            if let Err(e) = &r {
                eprintln!("{e:#}");
            }
            r
        });
    }
    drop(tx);
    let show = |prefix: &str, line: &str| {
        let (_, text) = split_time(line);
        if a.timestamps { format!("{prefix} | {line}") } else { format!("{prefix} | {text}") }
    };
    let width = targets.iter().map(|(u, m)| u.len() + m.len() + 1).max().unwrap_or(0);
    let pad = |p: &str| format!("{p:width$}");
    if a.follow {
        while let Some((prefix, line)) = rx.recv().await {
            println!("{}", show(&pad(&prefix), &line));
        }
    } else {
        let mut all = Vec::new();
        while let Some((prefix, line)) = rx.recv().await {
            all.push((split_time(&line).0, prefix, line));
        }
        // Stable: one member's lines of the same millisecond keep their order.
        all.sort_by_key(|(t, _, _)| *t);
        for (_, prefix, line) in all {
            println!("{}", show(&pad(&prefix), &line));
        }
    }
    let mut failed = 0;
    while let Some(r) = readers.join_next().await {
        failed += usize::from(r?.is_err());
    }
    if failed > 0 {
        anyhow::bail!("the logs of {failed} of {} members could not be read (said above)", targets.len());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_members_read_are_the_placed_ones_of_live_units() {
        let units = json!([
            {"unit_id": "u1", "state": "running", "members": [{"member": "head", "node_id": "n1"}, {"member": "worker-0", "node_id": null}]},
            {"unit_id": "u2", "state": "terminated", "members": [{"member": "head", "node_id": "n2"}]},
            {"unit_id": "u3", "state": "starting", "members": [{"member": "head", "node_id": "n3"}]},
        ]);
        assert_eq!(members(&units, None), vec![("u1".into(), "head".into()), ("u3".into(), "head".into())]);
        let failed = json!([{"unit_id": "u4", "state": "failed", "members": [{"member": "head", "node_id": "n1"}],
                             "surge": [{"member": "worker-0", "node_id": "n2"}]}]);
        assert_eq!(members(&failed, None), vec![("u4".into(), "head".into()), ("u4".into(), "worker-0".into())]);
        assert_eq!(members(&units, Some("u3")), vec![("u3".to_string(), "head".to_string())]);
        assert!(members(&units, Some("u9")).is_empty());
    }

    #[test]
    fn lines_are_ordered_by_their_time_and_paths_are_encoded() {
        assert_eq!(split_time("2000-02-29T00:00:00.123Z hi there"), (951_782_400_123, "hi there"));
        assert_eq!(split_time("no time here"), (0, "no time here"));
        assert_eq!(enc("a b/c"), "a%20b%2Fc");
    }
}
