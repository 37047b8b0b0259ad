//! `flotilla apply FILE [--plan] [--check-version V] [--wait]`: a new spec for a
//! running app, or what it would do.

use anyhow::Context;
use clap::Args;

use super::http::{Body, WriteArgs, print_json, token};
use super::progress::app_progress;
use super::wait::{WaitArgs, wait_until};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The app's spec (TOML); the app it names is updated.
    pub file: std::path::PathBuf,
    /// Change nothing: show what applying it would do (the settings that change, the
    /// units that would roll and in which order, units created or stopped, what would
    /// not fit and why).
    #[arg(long, conflicts_with_all = ["check_version", "wait"])]
    pub plan: bool,
    /// Apply only if the spec in force is still this version (`flotilla history` and
    /// `--plan` show it); otherwise refuse, so a change made since is never overwritten
    /// unseen.
    #[arg(long, value_name = "VERSION")]
    pub check_version: Option<u64>,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
}

/// Checks the spec here (every problem at once), then hands it to the app's scheduler,
/// which rolls changed units through, `rollout.max_unavailable` at a time.
pub async fn apply(a: ApplyArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let spec = flotilla_scheduler::AppSpec::parse(&text).with_context(|| a.file.display().to_string())?;
    if a.plan {
        let api = a.write.api()?;
        let path = format!("/v1/apps/{}/plan", spec.name);
        let plan =
            api.write(reqwest::Method::POST, &path, &token(a.write.token.clone())?, Some(Body::Text(text))).await?;
        if a.write.json {
            return print_json(&plan);
        }
        print!("{}", render_plan(&plan));
        return Ok(());
    }
    let query = a.check_version.map(|v| format!("?check_version={v}")).unwrap_or_default();
    let body = a.write.put(&format!("/v1/apps/{}/spec{query}", spec.name), Body::Text(text)).await?;
    if !a.write.json {
        println!("{}: {}", spec.name, super::versions::applied_line(&body));
    }
    if a.wait.wait {
        // The scheduler marks each unit with the fingerprint of the template it was
        // started from; the rollout is over when every unit has this one and runs.
        let fingerprint = spec.template_fingerprint();
        let api = a.write.api()?;
        let what = format!("the rollout of {}", spec.name);
        let any = |_: u64| true;
        let done =
            wait_until(a.wait.timeout, &what, || app_progress(&api, &spec.name, Some(&fingerprint), &any)).await?;
        if !a.write.json {
            println!("{done}");
        }
    }
    if a.write.json {
        print_json(&body)?;
    }
    Ok(())
}

/// `apply --plan`'s answer as a reader wants it: the changes, then what happens to units.
fn render_plan(p: &serde_json::Value) -> String {
    let list = |k: &str| p[k].as_array().cloned().unwrap_or_default();
    let app = p["app"].as_str().unwrap_or("?");
    let mut out = format!("{app}: against version {} in force\n", p["in_force"]);
    let changes = list("changes");
    if changes.is_empty() {
        out.push_str("no setting changes\n");
    } else {
        out.push_str("changes:\n");
        for c in changes {
            let (path, before, after) = (c["path"].as_str().unwrap_or("?"), c["before"].as_str(), c["after"].as_str());
            out.push_str(&match (before, after) {
                (Some(b), Some(a)) => format!("  {path}: {b} → {a}\n"),
                (None, Some(a)) => format!("  + {path} = {a}\n"),
                (Some(b), None) => format!("  - {path} = {b}\n"),
                (None, None) => format!("  {path}\n"),
            });
        }
    }
    let roll = list("roll");
    if roll.is_empty() {
        out.push_str("no unit rolls\n");
    }
    for (i, batch) in roll.iter().enumerate() {
        let ids: Vec<&str> = batch.as_array().into_iter().flatten().filter_map(|u| u.as_str()).collect();
        out.push_str(&format!("roll, step {}: {}\n", i + 1, ids.join(", ")));
    }
    if let Some(n) = p["create"].as_u64().filter(|n| *n > 0) {
        out.push_str(&format!("create: {n} unit(s)\n"));
    }
    let stop: Vec<String> = list("stop").iter().filter_map(|u| u.as_str().map(str::to_string)).collect();
    if !stop.is_empty() {
        out.push_str(&format!("stop: {}\n", stop.join(", ")));
    }
    if let (Some(n), Some(fit)) = (p["to_place"].as_u64().filter(|n| *n > 0), p["fit"].as_u64()) {
        out.push_str(&format!("first step places {n} unit(s): {fit} fit now\n"));
        for c in list("cannot_place") {
            out.push_str(&format!("  {} cannot: {}\n", c["units"], c["reason"].as_str().unwrap_or("?")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_plan_reads_as_changes_then_steps() {
        let p = serde_json::json!({
            "app": "echo", "in_force": 3,
            "changes": [{"path": "unit.head.cpu", "before": "\"100m\"", "after": "\"200m\""},
                        {"path": "unit.head.env.A", "after": "\"1\""}],
            "roll": [["echo-1", "echo-2"], ["echo-3"]], "create": 1, "stop": [],
            "to_place": 3, "fit": 2, "cannot_place": [{"units": 1, "reason": "no domain can hold the unit (2 tried)"}],
        });
        assert_eq!(
            super::render_plan(&p),
            "echo: against version 3 in force\nchanges:\n  unit.head.cpu: \"100m\" → \"200m\"\n  + unit.head.env.A = \"1\"\n\
             roll, step 1: echo-1, echo-2\nroll, step 2: echo-3\ncreate: 1 unit(s)\n\
             first step places 3 unit(s): 2 fit now\n  1 cannot: no domain can hold the unit (2 tried)\n"
        );
    }
}
