//! Shell completion. `flotilla completions SHELL` prints a small script that asks the
//! binary itself for candidates at each TAB (clap_complete's dynamic completion), so
//! app and node names come from the cluster at `$FLOTILLA_ADDR` when its API answers,
//! and subcommands and flags from the binary that runs: a script installed once never
//! goes stale after an upgrade.

use std::time::Duration;

use clap_complete::engine::CompletionCandidate;
use clap_complete::env::{EnvCompleter, Shells};
use serde_json::Value;

/// The variable the script sets when it asks for candidates.
pub const VAR: &str = "COMPLETE";

/// How long a TAB waits for the API: past this it offers no names rather than hang.
const API_WAIT: Duration = Duration::from_millis(800);

/// Prints the registration script for `shell`.
pub fn script(shell: clap_complete::Shell, out: &mut dyn std::io::Write) -> anyhow::Result<()> {
    let name = shell.to_string();
    let shells = Shells::builtins();
    let completer: &dyn EnvCompleter =
        shells.completer(&name).ok_or_else(|| anyhow::anyhow!("no dynamic completion for {name}"))?;
    completer.write_registration(VAR, "flotilla", "flotilla", "flotilla", out)?;
    Ok(())
}

/// The apps the control plane knows.
pub fn apps() -> Vec<CompletionCandidate> {
    names("/v1/apps", "app", None)
}

/// The nodes in the view, with their status as help.
pub fn nodes() -> Vec<CompletionCandidate> {
    names("/v1/nodes", "node_id", Some("status"))
}

/// The `key` of each row of the API's list at `path`, `help` beside it; none when the
/// API does not answer in time (completion must never hang or print errors).
fn names(path: &str, key: &str, help: Option<&str>) -> Vec<CompletionCandidate> {
    let rows = fetch(path).unwrap_or_default();
    rows.iter()
        .filter_map(|r| {
            let name = r.get(key)?.as_str()?;
            let c = CompletionCandidate::new(name);
            Some(match help.and_then(|h| r.get(h)).and_then(Value::as_str) {
                Some(h) => c.help(Some(h.to_string().into())),
                None => c,
            })
        })
        .collect()
}

fn fetch(path: &str) -> Option<Vec<Value>> {
    let addr = std::env::var("FLOTILLA_ADDR").unwrap_or_else(|_| super::http::DEFAULT_ADDR.to_string());
    let base = super::http::base_url(&addr).ok()?;
    let ca = std::env::var_os("FLOTILLA_CA").map(std::path::PathBuf::from);
    let client = super::http::http_client(ca.as_deref()).ok()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
    let ask = async {
        let v: Value = client.get(format!("{base}{path}")).send().await.ok()?.json().await.ok()?;
        v.as_array().cloned()
    };
    rt.block_on(async { tokio::time::timeout(API_WAIT, ask).await.ok().flatten() })
}
