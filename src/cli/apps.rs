//! `flotilla apps`, `flotilla units APP` and `flotilla routes APP`.

use clap::Args;
use serde_json::Value;

use super::http::{ListArgs, get, print_json};
use super::table::Table;

/// A command about one app.
#[derive(Debug, Args)]
pub struct AppArgs {
    /// The app.
    #[arg(add = clap_complete::engine::ArgValueCandidates::new(super::complete::apps))]
    pub app: String,
    #[command(flatten)]
    pub list: ListArgs,
}

#[derive(Debug, Args)]
pub struct UnitsArgs {
    #[command(flatten)]
    pub app: AppArgs,
    /// Also the units that ended (the newest few are kept, for an hour at most), with
    /// their members stopped. `--json` always lists them.
    #[arg(long)]
    pub all: bool,
}

pub async fn apps(a: ListArgs) -> anyhow::Result<()> {
    let v = get(&a, "/v1/apps").await?;
    if a.json {
        return print_json(&v);
    }
    let mut t = Table::new(&["APP", ">DESIRED", ">MIN", ">MAX", "POLICY", "SPEC", "SCHEDULER", "UNITS BY STATE"]);
    let mut decisions = Vec::new();
    for r in v.as_array().cloned().unwrap_or_default() {
        let n = |p: &str| r.pointer(p).and_then(Value::as_u64).unwrap_or(0).to_string();
        let states = r["units"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        // A standalone scheduler the control plane could not reach: say so, with why.
        let states = match r["unreachable"].as_bool() {
            Some(true) => {
                format!("unreachable: {}", r.pointer("/error/message").and_then(Value::as_str).unwrap_or("?"))
            }
            _ => states,
        };
        let a = &r["autoscaling"];
        let policy = match (a["policy_name"].as_str(), a["policy"].as_str()) {
            (Some(name), _) => name.to_string(),
            (None, Some(p)) => p.to_string(),
            (None, None) if a.is_null() => "-".to_string(),
            (None, None) => "(unknown)".to_string(),
        };
        let app = r["app"].as_str().unwrap_or("-").to_string();
        if let Some(w) = r["waiting"].as_str() {
            decisions.push(format!("{app}: {w}"));
        }
        if r["store"]["healthy"] == Value::Bool(false) {
            let error = r["store"]["error"].as_str().unwrap_or("?");
            decisions.push(format!(
                "{app}: store failing: {error} (changes are refused with store_unavailable; the scheduler reopens it and resumes by itself)"
            ));
        }
        if let Some(d) = a.get("last_decision").filter(|d| !d.is_null()) {
            let action = d["action"].as_str().unwrap_or("-");
            decisions.push(format!("{app}: last decision: {action}: {}", d["explanation"].as_str().unwrap_or("")));
        }
        decisions.extend(rollout_lines(&app, &r));
        let source = r.pointer("/spec/source").and_then(Value::as_str).unwrap_or("-").to_string();
        // The instance serving the app; `(standby)` while it holds no lease.
        let scheduler = match (
            r.pointer("/scheduler/instance").and_then(Value::as_str),
            r.pointer("/scheduler/role").and_then(Value::as_str),
        ) {
            (Some(i), Some("active")) => i.to_string(),
            (Some(i), Some(role)) => {
                if let Some(why) = r.pointer("/scheduler/waiting").and_then(Value::as_str) {
                    decisions.push(format!("{app}: scheduler {i} is a {role}: {why}"));
                }
                format!("{i} ({role})")
            }
            _ => "-".to_string(),
        };
        t.row(vec![app, n("/desired_units"), n("/min_units"), n("/max_units"), policy, source, scheduler, states]);
    }
    t.print();
    for d in decisions {
        println!("{d}");
    }
    Ok(())
}

/// What `apps` says under the table about an app's spec and rollout: a rollout in
/// progress or failed (with why), and why a spec was reverted.
fn rollout_lines(app: &str, r: &Value) -> Vec<String> {
    let mut lines = Vec::new();
    if r.pointer("/spec/source").and_then(Value::as_str) == Some("revert") {
        let why = r.pointer("/spec/reason").and_then(Value::as_str).unwrap_or("");
        lines.push(format!("{app}: spec reverted to the last one that ran: {why}"));
    }
    let template = r.pointer("/rollout/template").and_then(Value::as_str).unwrap_or("-");
    match r.pointer("/rollout/state").and_then(Value::as_str) {
        Some("in_progress") => {
            // The summary's `canary`: set while one shifts traffic.
            let step = r.pointer("/canary/step").and_then(Value::as_u64);
            let share = r.pointer("/canary/share").and_then(Value::as_f64);
            match (step, share) {
                (Some(step), Some(share)) => lines.push(format!(
                    "{app}: canary of template {template} at step {step}, {:.1}% of requests (`flotilla rollout status {app}`)",
                    share * 100.0
                )),
                _ => lines.push(format!("{app}: rollout of template {template} in progress")),
            }
        }
        Some("failed") => {
            let why = r.pointer("/rollout/reason").and_then(Value::as_str).unwrap_or("");
            lines.push(format!("{app}: rollout of template {template} failed: {why}"));
        }
        _ => {}
    }
    lines
}

pub async fn units(a: UnitsArgs) -> anyhow::Result<()> {
    let (all, a) = (a.all, a.app);
    let v = get(&a.list, &format!("/v1/apps/{}/units", a.app)).await?;
    if a.list.json {
        return print_json(&v);
    }
    // The version each unit runs: its template fingerprint (`apps` shows the spec's).
    let mut t = Table::new(&["UNIT", "STATE", "DOMAIN", ">GEN", "VERSION", "MEMBERS"]);
    let mut why = Vec::new();
    let (shown, ended): (Vec<Value>, Vec<Value>) =
        v.as_array().cloned().unwrap_or_default().into_iter().partition(|u| all || u["state"] != "terminated");
    for u in shown {
        let members: Vec<String> = u["members"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| format!("{}@{}", m["member"].as_str().unwrap_or("?"), m["node_id"].as_str().unwrap_or("-")))
            .collect();
        let id = u["unit_id"].as_str().unwrap_or("-").to_string();
        if let Some(r) = u["unplaced_reason"].as_str() {
            why.push(format!("{id}: why: {r}"));
        }
        if let Some(p) = u["pool"].as_str() {
            why.push(format!("{id}: {p}"));
        }
        // A member that waits (start order), or cannot start (no free port): why.
        for m in u["members"].as_array().into_iter().flatten() {
            let state = m["state"].as_str().unwrap_or("");
            if let Some(msg) = m["message"].as_str().filter(|_| matches!(state, "waiting" | "failed" | "fetching")) {
                let member = m["member"].as_str().unwrap_or("?");
                why.push(format!("{id}: {member} {state}: {}", msg.lines().last().unwrap_or(msg)));
            }
        }
        if let Some(n) = u["placement_note"].as_str() {
            why.push(format!("{id}: note: {n}"));
        }
        if let (Some(why_moving), Some(to)) = (u["moving"].as_str(), u["replaced_by"].as_str()) {
            why.push(format!("{id}: moving to {to}: {why_moving}"));
        }
        for m in u["surge"].as_array().into_iter().flatten() {
            let s = |k: &str| m[k].as_str().unwrap_or("-").to_string();
            why.push(format!(
                "{id}: surge: {}@{} {} (replaces its {})",
                s("member"),
                s("node_id"),
                s("state"),
                s("member")
            ));
        }
        t.row(vec![
            id,
            match (u["state"].as_str(), u["ended_unix_ms"].as_u64()) {
                (Some(state), Some(at)) => format!("{state} {}", super::table::ago(at)),
                (state, _) => state.unwrap_or("-").to_string(),
            },
            u["domain"].as_str().unwrap_or("-").to_string(),
            u["generation"].as_u64().unwrap_or(0).to_string(),
            u["template"].as_str().unwrap_or("-").to_string(),
            members.join(" "),
        ]);
    }
    t.print();
    for w in why {
        println!("{w}");
    }
    if !ended.is_empty() {
        println!("{} ended unit(s) not shown (--all shows them)", ended.len());
    }
    Ok(())
}

pub async fn routes(a: AppArgs) -> anyhow::Result<()> {
    let v = get(&a.list, &format!("/v1/apps/{}/routes", a.app)).await?;
    if a.list.json {
        return print_json(&v);
    }
    let mut t = Table::new(&["ENDPOINT", "NODE", "UNIT", "VERSION", ">WEIGHT"]);
    for r in v["routes"].as_array().cloned().unwrap_or_default() {
        t.row(vec![
            r["endpoint"].as_str().unwrap_or("-").to_string(),
            r["node_id"].as_str().unwrap_or("-").to_string(),
            r["unit_id"].as_str().unwrap_or("-").to_string(),
            r["version"].as_str().filter(|v| !v.is_empty()).unwrap_or("-").to_string(),
            format!("{:.2}", r["weight"].as_f64().unwrap_or(0.0)),
        ]);
    }
    t.print();
    if let (Some(version), Some(share)) = (v["split"]["version"].as_str(), v["split"]["share"].as_f64()) {
        println!("canary: {:.1}% of requests to version {version}, the rest to the others", share * 100.0);
    }
    Ok(())
}
