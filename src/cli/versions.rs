//! `flotilla history APP` and `flotilla rollback APP [--to N]`: the versions of an
//! app's spec its scheduler keeps, and going back to one of them.

use clap::Args;

use super::apps::AppArgs;
use super::http::{Body, WriteArgs, get, print_json, token};
use super::progress::app_progress;
use super::table::{Table, when};
use super::wait::{WaitArgs, wait_until};

/// `flotilla history APP`: the kept versions, newest first, each with what it changed.
pub async fn history(a: AppArgs) -> anyhow::Result<()> {
    let v = get(&a.list, &format!("/v1/apps/{}/versions", a.app)).await?;
    if a.list.json {
        return print_json(&v);
    }
    let mut t = Table::new(&[">VERSION", "APPLIED", "SOURCE", "BY", "CHANGES"]);
    for row in v["versions"].as_array().cloned().unwrap_or_default() {
        let mut version = row["version"].to_string();
        if row["in_force"] == true {
            version.push('*');
        }
        let mut source = row["source"].as_str().unwrap_or("-").to_string();
        if let Some(of) = row["rollback_of"].as_u64() {
            source = format!("{source} of {of}");
        }
        let changes = match row["changes"].as_array() {
            None => "(the oldest kept)".to_string(),
            Some(c) if c.is_empty() => "none".to_string(),
            Some(c) => summary(c),
        };
        t.row(vec![
            version,
            row["at_unix_ms"].as_u64().map_or("-".into(), when),
            source,
            row["by"].as_str().unwrap_or("-").to_string(),
            changes,
        ]);
    }
    t.print();
    Ok(())
}

/// A version's changes in one cell: the first few paths with their new values, and how
/// many more (`--json` has them all, with the old values).
fn summary(changes: &[serde_json::Value]) -> String {
    const SHOWN: usize = 3;
    let mut parts: Vec<String> = changes
        .iter()
        .take(SHOWN)
        .map(|c| {
            let path = c["path"].as_str().unwrap_or("?");
            match c["after"].as_str() {
                Some(a) => format!("{path}={a}"),
                None => format!("-{path}"),
            }
        })
        .collect();
    if changes.len() > SHOWN {
        parts.push(format!("+{} more", changes.len() - SHOWN));
    }
    parts.join(", ")
}

/// An apply's or rollback's answer in one line: the version in force, then what rolls.
pub fn applied_line(answer: &serde_json::Value) -> String {
    let result = answer["result"].as_str().unwrap_or("applied");
    match (answer["version"].as_u64(), answer["new_version"].as_bool()) {
        (Some(v), Some(false)) => format!("version {v} (unchanged): {result}"),
        (Some(v), _) => format!("version {v}: {result}"),
        _ => result.to_string(),
    }
}

#[derive(Debug, Args)]
pub struct RollbackArgs {
    /// The app.
    #[arg(add = clap_complete::engine::ArgValueCandidates::new(super::complete::apps))]
    pub app: String,
    /// The version to go back to (`flotilla history APP` lists them); default: the spec
    /// before the last apply.
    #[arg(long, value_name = "VERSION")]
    pub to: Option<u64>,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
}

/// `flotilla rollback APP [--to N]`: the old spec becomes a new version and rolls out
/// as an apply does.
pub async fn rollback(a: RollbackArgs) -> anyhow::Result<()> {
    let api = a.write.api()?;
    let body = a.to.map(|n| Body::Json(serde_json::json!({"to": n})));
    let path = format!("/v1/apps/{}/rollback", a.app);
    let answer = api.write(reqwest::Method::POST, &path, &token(a.write.token.clone())?, body).await?;
    if !a.write.json {
        println!("{}: {}", a.app, applied_line(&answer));
    }
    if a.wait.wait {
        let app = api.get(&format!("/v1/apps/{}", a.app)).await?;
        let fingerprint = app["spec"]["template"].as_str().map(str::to_string);
        let what = format!("the rollback of {}", a.app);
        let any = |_: u64| true;
        let done =
            wait_until(a.wait.timeout, &what, || app_progress(&api, &a.app, fingerprint.as_deref(), &any)).await?;
        if !a.write.json {
            println!("{done}");
        }
    }
    if a.write.json {
        print_json(&answer)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_versions_changes_fit_one_cell() {
        let c = serde_json::json!([
            {"path": "a", "before": "1", "after": "2"},
            {"path": "b", "before": "1"},
            {"path": "c", "after": "3"},
            {"path": "d", "after": "4"},
            {"path": "e", "after": "5"},
        ]);
        assert_eq!(super::summary(c.as_array().unwrap()), "a=2, -b, c=3, +2 more");
    }
}
