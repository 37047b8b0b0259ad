//! Client commands: they find the control plane at `$FLOTILLA_ADDR` (`https://` when it
//! serves HTTPS, trusting the CA in `--ca` / `$FLOTILLA_CA`).

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Print one JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
    /// The control plane's address.
    #[arg(long, env = "FLOTILLA_ADDR", default_value = "http://127.0.0.1:7700")]
    pub addr: String,
    /// PEM file with the CA certificate(s) that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
}

/// An HTTP client that also trusts the certificates in `ca` (PEM) for HTTPS. Without
/// `ca` it trusts no certificate authority at all: plain HTTP only.
pub fn http_client(ca: Option<&Path>) -> anyhow::Result<reqwest::Client> {
    let mut b = reqwest::Client::builder();
    if let Some(ca) = ca {
        let pem = std::fs::read(ca).with_context(|| format!("reading the CA file {}", ca.display()))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .with_context(|| format!("parsing the CA file {}", ca.display()))?;
        if certs.is_empty() {
            bail!("the CA file {} holds no PEM certificate", ca.display());
        }
        for c in certs {
            b = b.add_root_certificate(c);
        }
    }
    b.build().context("building the HTTP client")
}

pub async fn get(a: &ListArgs, path: &str) -> anyhow::Result<Value> {
    let url = format!("{}{path}", a.addr.trim_end_matches('/'));
    send(http_client(a.ca.as_deref())?.get(&url), &a.addr).await.with_context(|| url.clone())
}

/// Sends a request to the control plane; its JSON answer, or its error message.
async fn send(req: reqwest::RequestBuilder, addr: &str) -> anyhow::Result<Value> {
    let hint = if addr.starts_with("https://") {
        " (set FLOTILLA_ADDR; for HTTPS, --ca or $FLOTILLA_CA names the CA that signed its certificate)"
    } else {
        " (set FLOTILLA_ADDR)"
    };
    let resp = req.send().await.with_context(|| format!("reaching the control plane at {addr}{hint}"))?;
    let status = resp.status();
    let body: Value = resp.json().await.unwrap_or(Value::Null);
    if !status.is_success() {
        let msg = body.pointer("/error/message").and_then(Value::as_str).unwrap_or("no message");
        bail!("{status}: {msg}");
    }
    Ok(body)
}
fn gib(bytes: u64) -> String {
    format!("{:.1}Gi", bytes as f64 / (1u64 << 30) as f64)
}

pub async fn nodes(a: ListArgs) -> anyhow::Result<()> {
    let v = get(&a, "/v1/nodes").await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let rows = v.as_array().cloned().unwrap_or_default();
    println!(
        "{:<20} {:<9} {:>5} {:<12} {:<6} {:>9} {:>10} {:>6}",
        "NODE", "STATUS", "SHARD", "DOMAIN", "PRIO", "CPU", "MEMORY", "HEALTH"
    );
    for r in &rows {
        let s = |p: &str| r.pointer(p).and_then(Value::as_str).unwrap_or("-").to_string();
        let n = |p: &str| r.pointer(p).and_then(Value::as_u64).unwrap_or(0);
        println!(
            "{:<20} {:<9} {:>5} {:<12} {:<6} {:>9} {:>10} {:>6.2}",
            s("/node_id"),
            s("/status"),
            n("/shard"),
            r.pointer("/labels/domain").and_then(Value::as_str).unwrap_or("default"),
            r.pointer("/labels/priority").and_then(Value::as_str).unwrap_or("-"),
            format!("{}m", n("/capacity/cpu_millis")),
            gib(n("/capacity/memory_bytes")),
            r.pointer("/health/score").and_then(Value::as_f64).unwrap_or(0.0),
        );
    }
    println!("{} nodes", rows.len());
    Ok(())
}

/// The token given on the command line or in `$FLOTILLA_TOKEN`, else the one in the data dir.
fn token(given: Option<String>) -> anyhow::Result<String> {
    match given {
        Some(t) => Ok(t),
        None => token_from_data(),
    }
}

/// `$FLOTILLA_DATA`, else `./.flotilla`.
pub fn data_dir() -> std::path::PathBuf {
    std::env::var_os("FLOTILLA_DATA").map(Into::into).unwrap_or_else(|| "./.flotilla".into())
}

/// The API token from `$FLOTILLA_DATA/api-token` (default data dir `./.flotilla`).
pub fn token_from_data() -> anyhow::Result<String> {
    let path = data_dir().join("api-token");
    Ok(std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?.trim().to_string())
}

#[derive(Debug, Args)]
pub struct UnitsArgs {
    /// The app.
    pub app: String,
    #[command(flatten)]
    pub list: ListArgs,
}

pub async fn apps(a: ListArgs) -> anyhow::Result<()> {
    let v = get(&a, "/v1/apps").await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{:<24} {:>8} {:>5} {:>5}  {:<14} UNITS BY STATE", "APP", "DESIRED", "MIN", "MAX", "POLICY");
    for r in v.as_array().cloned().unwrap_or_default() {
        let n = |p: &str| r.pointer(p).and_then(Value::as_u64).unwrap_or(0);
        let states = r["units"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        let a = &r["autoscaling"];
        let policy = match (a["policy_name"].as_str(), a["policy"].as_str()) {
            (Some(name), _) => name.to_string(),
            (None, Some(p)) => p.to_string(),
            (None, None) if a.is_null() => "-".to_string(),
            (None, None) => "(unknown)".to_string(),
        };
        println!(
            "{:<24} {:>8} {:>5} {:>5}  {:<14} {}",
            r["app"].as_str().unwrap_or("-"),
            n("/desired_units"),
            n("/min_units"),
            n("/max_units"),
            policy,
            states
        );
        if let Some(d) = a.get("last_decision").filter(|d| !d.is_null()) {
            let action = d["action"].as_str().unwrap_or("-");
            println!("{:<24} last decision: {action}: {}", "", d["explanation"].as_str().unwrap_or(""));
        }
    }
    Ok(())
}

pub async fn units(a: UnitsArgs) -> anyhow::Result<()> {
    let v = get(&a.list, &format!("/v1/apps/{}/units", a.app)).await?;
    if a.list.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{:<16} {:<10} {:<12} {:>4}  MEMBERS", "UNIT", "STATE", "DOMAIN", "GEN");
    for u in v.as_array().cloned().unwrap_or_default() {
        let members: Vec<String> = u["members"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|m| format!("{}@{}", m["member"].as_str().unwrap_or("?"), m["node_id"].as_str().unwrap_or("-")))
            .collect();
        println!(
            "{:<16} {:<10} {:<12} {:>4}  {}",
            u["unit_id"].as_str().unwrap_or("-"),
            u["state"].as_str().unwrap_or("-"),
            u["domain"].as_str().unwrap_or("-"),
            u["generation"].as_u64().unwrap_or(0),
            members.join(" ")
        );
        if let Some(r) = u["unplaced_reason"].as_str() {
            println!("{:<16} why: {r}", "");
        }
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    pub action: NodeAction,
    #[arg(long, env = "FLOTILLA_ADDR", default_value = "http://127.0.0.1:7700", global = true)]
    pub addr: String,
    /// The API token (default: $FLOTILLA_TOKEN, else $FLOTILLA_DATA/api-token).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// PEM file with the CA certificate(s) that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA", global = true)]
    pub ca: Option<PathBuf>,
}

#[derive(Debug, clap::Subcommand)]
pub enum NodeAction {
    /// No new placements on NODE; what runs there stays.
    Cordon { node: String },
    /// Cordon NODE, replace the members it runs elsewhere first, then stop them.
    Drain { node: String },
    /// Allow placements on NODE again (ends a drain too).
    Uncordon { node: String },
}

pub async fn node(a: NodeArgs) -> anyhow::Result<()> {
    let token = token(a.token)?;
    let (verb, node) = match &a.action {
        NodeAction::Cordon { node } => ("cordon", node),
        NodeAction::Drain { node } => ("drain", node),
        NodeAction::Uncordon { node } => ("uncordon", node),
    };
    let url = format!("{}/v1/nodes/{node}/{verb}", a.addr.trim_end_matches('/'));
    let body = send(http_client(a.ca.as_deref())?.post(&url).bearer_auth(token), &a.addr).await?;
    let state = match (body["cordoned"] == true, body["drain_requested"] == true) {
        (_, true) => "draining: its members move elsewhere, then stop",
        (true, false) => "cordoned",
        (false, _) => "uncordoned",
    };
    println!("{node}: {state}");
    Ok(())
}

/// Where a mutating command sends its request, and with which token.
#[derive(Debug, Args)]
pub struct WriteArgs {
    #[arg(long, env = "FLOTILLA_ADDR", default_value = "http://127.0.0.1:7700")]
    pub addr: String,
    /// The API token (default: $FLOTILLA_TOKEN, else $FLOTILLA_DATA/api-token).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM file with the CA certificate(s) that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
}

impl WriteArgs {
    /// `PUT path` with the token and `body` (JSON or TOML text); the control plane's answer.
    pub async fn put(self, path: &str, body: Body) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.addr.trim_end_matches('/'));
        let req = http_client(self.ca.as_deref())?.put(&url).bearer_auth(token(self.token)?);
        let req = match body {
            Body::Json(v) => req.json(&v),
            Body::Text(t) => req.body(t),
        };
        send(req, &self.addr).await
    }
}

pub enum Body {
    Json(Value),
    Text(String),
}

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("size").required(true).args(["units", "min", "auto"])))]
pub struct ScaleArgs {
    /// The app.
    pub app: String,
    /// The desired number of units (on an autoscaled app: its floor and ceiling).
    #[arg(long)]
    pub units: Option<u32>,
    /// On an autoscaled app: the fewest units its policy may choose (with --max).
    #[arg(long, requires = "max")]
    pub min: Option<u32>,
    /// On an autoscaled app: the most units its policy may choose (with --min).
    #[arg(long, requires = "min")]
    pub max: Option<u32>,
    /// On an autoscaled app: lift the floor and ceiling set before.
    #[arg(long)]
    pub auto: bool,
    #[command(flatten)]
    pub write: WriteArgs,
}

pub async fn scale(a: ScaleArgs) -> anyhow::Result<()> {
    let body = match (a.units, a.min, a.max) {
        (Some(n), _, _) => serde_json::json!({"units": n}),
        (None, Some(min), Some(max)) => serde_json::json!({"min": min, "max": max}),
        _ => serde_json::json!({"auto": true}),
    };
    let answer = a.write.put(&format!("/v1/apps/{}/scale", a.app), Body::Json(body)).await?;
    match (answer.get("desired_units"), answer.get("override")) {
        (Some(n), _) => println!("{}: desired units {n}", a.app),
        (None, Some(Value::Null)) => println!("{}: the autoscaling policy decides alone again", a.app),
        (None, Some(o)) => println!("{}: the policy decides within {}..={}", a.app, o["floor"], o["ceiling"]),
        (None, None) => println!("{}: {answer}", a.app),
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The app's spec (TOML); the app it names is updated.
    pub file: std::path::PathBuf,
    #[command(flatten)]
    pub write: WriteArgs,
}

/// Checks the spec here (every problem at once), then hands it to the app's scheduler,
/// which rolls changed units through, `rollout.max_unavailable` at a time.
pub async fn apply(a: ApplyArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let spec = flotilla_scheduler::AppSpec::parse(&text).with_context(|| a.file.display().to_string())?;
    let body = a.write.put(&format!("/v1/apps/{}/spec", spec.name), Body::Text(text)).await?;
    println!("{}: {}", spec.name, body["result"].as_str().unwrap_or("applied"));
    Ok(())
}

pub async fn routes(a: UnitsArgs) -> anyhow::Result<()> {
    let v = get(&a.list, &format!("/v1/apps/{}/routes", a.app)).await?;
    if a.list.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{:<24} {:<12} {:<16} {:>6}", "ENDPOINT", "NODE", "UNIT", "WEIGHT");
    for r in v["routes"].as_array().cloned().unwrap_or_default() {
        println!(
            "{:<24} {:<12} {:<16} {:>6.2}",
            r["endpoint"].as_str().unwrap_or("-"),
            r["node_id"].as_str().unwrap_or("-"),
            r["unit_id"].as_str().unwrap_or("-"),
            r["weight"].as_f64().unwrap_or(0.0)
        );
    }
    Ok(())
}
