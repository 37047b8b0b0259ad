//! `flotilla rollout status|promote|abort APP`: a canary rollout's step, share and both
//! versions' numbers over the step, and the operator's promote and abort.

use clap::{Args, Subcommand};
use serde_json::Value;

use super::apps::AppArgs;
use super::http::{WriteArgs, get, print_json, token};

#[derive(Debug, Args)]
pub struct RolloutArgs {
    #[command(subcommand)]
    pub action: RolloutAction,
}

#[derive(Debug, Subcommand)]
pub enum RolloutAction {
    /// The app's last rollout; for a canary, its step, share and both versions' numbers.
    Status(AppArgs),
    /// End the canary's traffic shifting now: the rest rolls as a rolling update.
    Promote(ActArgs),
    /// Fail the canary now: the spec goes back to the last one that ran.
    Abort(ActArgs),
}

#[derive(Debug, Args)]
pub struct ActArgs {
    /// The app.
    #[arg(add = clap_complete::engine::ArgValueCandidates::new(super::complete::apps))]
    pub app: String,
    #[command(flatten)]
    pub write: WriteArgs,
}

pub async fn rollout(a: RolloutArgs) -> anyhow::Result<()> {
    let (a, verb) = match a.action {
        RolloutAction::Status(a) => return status(a).await,
        RolloutAction::Promote(a) => (a, "promote"),
        RolloutAction::Abort(a) => (a, "abort"),
    };
    let api = a.write.api()?;
    let path = format!("/v1/apps/{}/rollout/{verb}", a.app);
    let answer = api.write(reqwest::Method::POST, &path, &token(a.write.token.clone())?, None).await?;
    if a.write.json {
        return print_json(&answer);
    }
    let r = &answer["rollout"];
    match verb {
        "promote" => println!("{}: canary of template {} promoted; the rest rolls", a.app, text(&r["template"])),
        _ => println!(
            "{}: canary of template {} aborted: {}; reverting to the last spec that ran",
            a.app,
            text(&r["template"]),
            text(&r["reason"])
        ),
    }
    Ok(())
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or("-")
}

async fn status(a: AppArgs) -> anyhow::Result<()> {
    let v = get(&a.list, &format!("/v1/apps/{}/rollout", a.app)).await?;
    if a.list.json {
        return print_json(&v);
    }
    for line in lines(&a.app, &v) {
        println!("{line}");
    }
    Ok(())
}

/// `rollout status` as text: the record, then a canary's step and both versions.
fn lines(app: &str, v: &Value) -> Vec<String> {
    let r = &v["rollout"];
    if r.is_null() {
        return vec![format!("{app}: no rollout yet")];
    }
    let mut out =
        vec![format!("{app}: rollout of template {} {}", text(&r["template"]), text(&r["state"]).replace('_', " "))];
    if let Some(why) = r["reason"].as_str() {
        out.push(format!("  reason: {why}"));
    }
    let c = &v["canary"];
    if c.is_null() {
        if r.pointer("/canary/promoted") == Some(&Value::Bool(true)) {
            out.push("  canary promoted: the rest rolls as a rolling update".into());
        }
        return out;
    }
    let steps: Vec<&str> = c["steps"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    out.push(format!(
        "  canary step {} of {} ({}), new version's share now {:.1}%, {} router(s) reporting",
        c["step"].as_u64().unwrap_or(0),
        steps.len(),
        steps.join(" → "),
        c["share"].as_f64().unwrap_or(0.0) * 100.0,
        c["routers"].as_u64().unwrap_or(0)
    ));
    for (name, side) in [("new", &c["new"]), ("stable", &c["stable"])] {
        out.push(format!(
            "  {name:<6} {:>8} requests {:>6} errors ({:.2}%)  p99 {}",
            side["requests"].as_u64().unwrap_or(0),
            side["errors"].as_u64().unwrap_or(0),
            side["error_rate"].as_f64().unwrap_or(0.0) * 100.0,
            side["p99_ms"].as_f64().map_or("-".to_string(), |p| format!("{p:.1} ms"))
        ));
    }
    if let Some(w) = c["waiting"].as_str() {
        out.push(format!("  waits: {w}"));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_canary_status_reads_as_its_step_and_both_sides() {
        let v = serde_json::json!({
            "rollout": {"template": "abc", "state": "in_progress", "canary": {"step": 1}},
            "canary": {"step": 2, "steps": ["5%", "25%"], "share": 0.25, "routers": 1, "waiting": null,
                       "new": {"requests": 120, "errors": 3, "error_rate": 0.025, "p99_ms": 12.5},
                       "stable": {"requests": 360, "errors": 0, "error_rate": 0.0, "p99_ms": null}},
        });
        let l = super::lines("echo", &v);
        assert_eq!(l[0], "echo: rollout of template abc in progress");
        assert!(l[1].contains("step 2 of 2 (5% → 25%)") && l[1].contains("25.0%"), "{}", l[1]);
        assert!(l[2].contains("120 requests") && l[2].contains("(2.50%)") && l[2].contains("12.5 ms"), "{}", l[2]);
        assert!(l[3].contains("p99 -"), "{}", l[3]);
        assert_eq!(super::lines("echo", &serde_json::json!({"rollout": null})), vec!["echo: no rollout yet"]);
    }
}
