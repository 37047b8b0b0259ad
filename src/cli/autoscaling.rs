//! Client commands for autoscaling: an app's decisions, named policies, and consumer
//! demand.

use anyhow::Context;
use clap::{Args, Subcommand};
use serde_json::{Value, json};

use super::apps::AppArgs;
use super::http::{Body, ListArgs, WriteArgs, get, parse_duration, print_json};
use super::table::Table;

/// `flotilla decisions APP`: the app's autoscaling decisions, newest first, each with the
/// formula its policy computed.
pub async fn decisions(a: AppArgs) -> anyhow::Result<()> {
    let v = get(&a.list, &format!("/v1/apps/{}/decisions", a.app)).await?;
    if a.list.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let rows = v.as_array().cloned().unwrap_or_default();
    let mut t = Table::new(&["AT", "POLICY", "ACTION", ">UNITS", "EXPLANATION"]);
    for d in &rows {
        t.row(vec![
            d["at"].as_u64().map_or_else(|| "-".into(), super::table::when),
            d["policy"].as_str().unwrap_or("-").to_string(),
            d["action"].as_str().unwrap_or("-").to_string(),
            d["applied_units"].as_u64().unwrap_or(0).to_string(),
            d["explanation"].as_str().unwrap_or("").to_string(),
        ]);
    }
    t.print();
    println!("{} decisions", rows.len());
    Ok(())
}

#[derive(Debug, Args)]
pub struct PolicyArgs {
    #[command(subcommand)]
    pub action: PolicyAction,
}

#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// Create or replace the named policy a file defines (`[autoscaling]` with `name`).
    Apply {
        file: std::path::PathBuf,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// The named policies.
    List(ListArgs),
}

pub async fn policy(a: PolicyArgs) -> anyhow::Result<()> {
    match a.action {
        PolicyAction::Apply { file, write } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("reading {}", file.display()))?;
            // Checked here first, every problem named, as the control plane checks it.
            let (policy, _model) =
                flotilla_autoscale::policy_file_from_toml(&text).with_context(|| file.display().to_string())?;
            let name = policy
                .name
                .with_context(|| format!("{}: autoscaling.name: a named policy needs a name", file.display()))?
                .to_string();
            let answer = write.put(&format!("/v1/policies/{name}"), Body::Text(text)).await?;
            if write.json {
                return print_json(&answer);
            }
            println!("policy {name}: applied (apps that name it follow it from their next evaluation)");
        }
        PolicyAction::List(l) => {
            let v = get(&l, "/v1/policies").await?;
            if l.json {
                println!("{}", serde_json::to_string_pretty(&v)?);
                return Ok(());
            }
            let mut t = Table::new(&["NAME", "POLICY", ">INTERVAL"]);
            for p in v.as_array().cloned().unwrap_or_default() {
                t.row(vec![
                    p["name"].as_str().unwrap_or("-").to_string(),
                    p["policy"].as_str().unwrap_or("-").to_string(),
                    format!("{}s", p["interval_ms"].as_u64().unwrap_or(0) / 1000),
                ]);
            }
            t.print();
        }
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct DemandArgs {
    /// The app.
    #[arg(add = clap_complete::engine::ArgValueCandidates::new(super::complete::apps))]
    pub app: String,
    /// CPU of one request, as in a spec (`500m`, `2`). With neither --cpu nor --memory,
    /// the command shows the demand that stands.
    #[arg(long)]
    pub cpu: Option<String>,
    /// Memory of one request, as in a spec (`512Mi`, `2Gi`).
    #[arg(long)]
    pub memory: Option<String>,
    /// How many such requests.
    #[arg(long, default_value_t = 1)]
    pub count: u32,
    /// How long the demand stands unless renewed (`300s`, `5m`; a bare number is seconds).
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub ttl: std::time::Duration,
    /// Withdraws the demand that stands.
    #[arg(long, conflicts_with_all = ["cpu", "memory"])]
    pub clear: bool,
    #[command(flatten)]
    pub write: WriteArgs,
}

/// `flotilla demand APP`: what consumers need the app to run. It replaces the last
/// demand; `--clear` (or `--count 0`) withdraws it; without a size it shows it.
pub async fn demand(a: DemandArgs) -> anyhow::Result<()> {
    if a.cpu.is_none() && a.memory.is_none() && !a.clear && a.count != 0 {
        return show_demand(&a).await;
    }
    let quantity = |v: &Option<String>| v.as_deref().unwrap_or("0").to_string();
    let cpu_millis =
        flotilla_core::quantity::cpu_millis(&quantity(&a.cpu)).map_err(|e| anyhow::anyhow!("--cpu: {e}"))?;
    let memory_bytes =
        flotilla_core::quantity::memory_bytes(&quantity(&a.memory)).map_err(|e| anyhow::anyhow!("--memory: {e}"))?;
    let requests: Vec<Value> = if a.count == 0 || a.clear {
        Vec::new()
    } else {
        vec![json!({"resources": {"cpu_millis": cpu_millis, "memory_bytes": memory_bytes}, "count": a.count})]
    };
    let cleared = requests.is_empty();
    let body = json!({"requests": requests, "ttl_seconds": a.ttl.as_secs()});
    let answer = a.write.put(&format!("/v1/apps/{}/demand", a.app), Body::Json(body)).await?;
    if a.write.json {
        return print_json(&answer);
    }
    match answer["demand"]["expires_unix_ms"].as_u64() {
        Some(until) if !cleared => println!("{}: demand set, until {}", a.app, super::table::when(until)),
        _ => println!("{}: demand withdrawn", a.app),
    }
    Ok(())
}

/// The demand that stands on the app, from its status.
async fn show_demand(a: &DemandArgs) -> anyhow::Result<()> {
    let app = a.write.api()?.get(&format!("/v1/apps/{}", a.app)).await?;
    let demand = &app["autoscaling"]["demand"];
    if a.write.json {
        return print_json(demand);
    }
    let requests = demand["requests"].as_array().cloned().unwrap_or_default();
    let Some(until) = demand["expires_unix_ms"].as_u64().filter(|_| !requests.is_empty()) else {
        println!("{}: no demand stands", a.app);
        return Ok(());
    };
    let mut t = Table::new(&[">COUNT", ">CPU", ">MEMORY"]);
    for r in &requests {
        let n = |k: &str| r["resources"][k].as_u64().unwrap_or(0);
        t.row(vec![
            r["count"].as_u64().unwrap_or(0).to_string(),
            format!("{}m", n("cpu_millis")),
            format!("{:.0}Mi", n("memory_bytes") as f64 / f64::from(1u32 << 20)),
        ]);
    }
    t.print();
    println!("until {}", super::table::when(until));
    Ok(())
}
