//! `flotilla-loadtest soak --minutes M`: `flotilla up` with real agents and the echo app
//! under churn, with the invariants checked all along.
//!
//! Churn, one operation every `--every` (seeded; the seed is printed): `kill -9` of an
//! agent (up brings it back as a new incarnation), a PreStop drain of an agent (same),
//! an operator `node drain` later undone by `uncordon`, a scale to a random size, and an
//! `apply` of a changed template (a rolling update).
//!
//! Invariants, checked every second:
//! - no node is allocated beyond its capacity (CPU or memory);
//! - on every Alive node, the allocation its shard's ledger publishes equals what the
//!   scheduler's units hold there: a mismatch may last while a commit or a release is in
//!   flight, but one that lasts longer than `SETTLE` is a violation (lost or doubled);
//! - no unit has two heads, and no member is placed on two nodes;
//! - after the churn stops, the app converges within `SETTLE` to its desired Running units.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use crate::common::{UpProc, flotilla_bin, machine};

const ECHO: &str = include_str!("../../examples/echo.toml");
/// How long a ledger/unit mismatch may last (a commit or release in flight, a node's
/// replacement after a loss) before it counts as a violation.
const SETTLE: Duration = Duration::from_secs(20);

#[derive(Debug, Args)]
pub struct SoakArgs {
    #[arg(long, default_value_t = 10)]
    pub minutes: u64,
    #[arg(long, default_value_t = 8)]
    pub agents: usize,
    /// Time between two churn operations (`3s`, `500ms`).
    #[arg(long, default_value = "3s", value_parser = flotilla_agent::config::parse_duration)]
    pub every: Duration,
    /// Deprecated spelling of --every, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "every")]
    pub every_ms: Option<u64>,
    /// Seed of the churn (random when absent; printed either way).
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub flotilla: Option<PathBuf>,
}

async fn get(client: &reqwest::Client, url: &str) -> Option<Value> {
    let r = client.get(url).timeout(Duration::from_secs(5)).send().await.ok()?;
    if !r.status().is_success() {
        return None;
    }
    r.json().await.ok()
}

/// Violations visible in one look at the nodes and units; mismatches are returned apart
/// (by node), as they may be transient.
fn check(nodes: &[Value], units: &[Value]) -> (Vec<String>, HashMap<String, String>) {
    let mut violations = Vec::new();
    let mut mismatches = HashMap::new();
    let n = |v: &Value, p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let holding: Vec<&Value> =
        units.iter().filter(|u| !matches!(u["state"].as_str(), Some("terminated" | "queued" | "placing"))).collect();
    let mut placed: HashMap<(String, String), String> = HashMap::new();
    for u in &holding {
        let members = u["members"].as_array().cloned().unwrap_or_default();
        if members.iter().filter(|m| m["role"] == "head").count() > 1 {
            violations.push(format!("{} has two heads", u["unit_id"]));
        }
        for m in members {
            let (Some(node), Some(member)) = (m["node_id"].as_str(), m["member"].as_str()) else { continue };
            let key = (u["unit_id"].as_str().unwrap_or("").to_string(), member.to_string());
            if let Some(other) = placed.insert(key.clone(), node.to_string()) {
                violations.push(format!("{key:?} is placed on {other} and {node}"));
            }
        }
    }
    for node in nodes {
        let id = node["node_id"].as_str().unwrap_or("");
        for r in ["cpu_millis", "memory_bytes"] {
            let (used, cap) = (n(node, &format!("/allocated/{r}")), n(node, &format!("/capacity/{r}")));
            if used > cap {
                violations.push(format!("{id}: {r} allocated {used} above capacity {cap}"));
            }
        }
        if node["status"] != "alive" {
            continue;
        }
        let held: u64 = holding
            .iter()
            .flat_map(|u| u["members"].as_array().cloned().unwrap_or_default())
            .filter(|m| m["node_id"] == id)
            .count() as u64
            * 250;
        let allocated = n(node, "/allocated/cpu_millis");
        if allocated != held {
            mismatches.insert(id.to_string(), format!("{id}: ledger {allocated}m, units {held}m"));
        }
    }
    (violations, mismatches)
}

pub async fn run(a: SoakArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=24 * 60).contains(&a.minutes), "--minutes must be within 1..=1440");
    anyhow::ensure!((4..=64).contains(&a.agents), "--agents must be within 4..=64");
    let every = flotilla_agent::config::deprecated_ms(a.every, a.every_ms, "--every-ms", "--every");
    anyhow::ensure!(every >= Duration::from_millis(500), "--every must be at least 500ms");
    let bin = flotilla_bin(a.flotilla.clone())?;
    let seed = a.seed.unwrap_or_else(rand::random);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = std::env::temp_dir().join(format!("flotilla-loadtest-soak-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let spec = dir.join("echo.toml");
    std::fs::write(&spec, ECHO)?;
    println!("machine: {}", machine());
    println!("soak: {} min, {} agents, an operation every {every:?}, seed {seed}", a.minutes, a.agents);
    println!("replay: flotilla-loadtest soak --minutes {} --agents {} --seed {seed}", a.minutes, a.agents);
    let up = UpProc::start(&bin, &dir, a.agents, &["--restart-delay", "4s"], &spec)?;
    let addr = up.addr().await?;
    let token = std::fs::read_to_string(dir.join("api-token"))?.trim().to_string();
    let client = reqwest::Client::new();
    let cli = |args: &[&str]| {
        Command::new(&bin)
            .args(args)
            .env("FLOTILLA_ADDR", &addr)
            .env("FLOTILLA_TOKEN", &token)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };

    let started = Instant::now();
    let churn_for = Duration::from_secs(a.minutes * 60);
    let mut next_op = Instant::now() + Duration::from_secs(10);
    let (mut operations, mut failed_ops) = (0u64, 0u64);
    let mut by_kind: HashMap<&str, u64> = HashMap::new();
    let mut violations: Vec<String> = Vec::new();
    let mut mismatch_since: HashMap<String, Instant> = HashMap::new();
    let mut reported: std::collections::HashSet<String> = Default::default();
    let mut drained: Vec<(String, Instant)> = Vec::new();
    let mut version = 1u32;
    let mut desired = 2u32;
    let mut checks = 0u64;
    loop {
        let now = Instant::now();
        let churning = now.duration_since(started) < churn_for;
        if churning && now >= next_op {
            next_op = now + every;
            let node = format!("node-{}", rng.random_range(1..=a.agents));
            let kind = match rng.random_range(0..10) {
                0..=2 => "kill",
                3..=4 => "prestop",
                5 => "node-drain",
                6..=7 => "scale",
                _ => "apply",
            };
            let ok = match kind {
                "kill" => std::fs::read_to_string(dir.join("agents").join(format!("{node}.pid")))
                    .ok()
                    .and_then(|p| p.trim().parse::<i32>().ok())
                    .map(|pid| {
                        // SAFETY: kill(2) of an agent that `up` started.
                        unsafe { libc::kill(pid, libc::SIGKILL) == 0 }
                    })
                    .unwrap_or(false),
                "prestop" => Command::new(&bin)
                    .args(["agent", "drain", "--data"])
                    .arg(dir.join("agents").join(&node))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .is_ok(),
                "node-drain" => {
                    drained.push((node.clone(), now + Duration::from_secs(15)));
                    cli(&["node", "drain", &node])
                }
                "scale" => {
                    desired = rng.random_range(1..=6);
                    cli(&["scale", "echo", "--units", &desired.to_string()])
                }
                _ => {
                    version += 1;
                    let text = ECHO
                        .replace("serves_http = true", &format!("serves_http = true\nenv = {{ V = \"{version}\" }}"));
                    std::fs::write(&spec, text)?;
                    cli(&["apply", spec.to_str().unwrap_or("")])
                }
            };
            operations += 1;
            *by_kind.entry(kind).or_default() += 1;
            if !ok {
                failed_ops += 1;
            }
        }
        // Operator drains end after a while, so the pool does not shrink for good.
        for (node, _) in drained.iter().filter(|(_, at)| now >= *at) {
            cli(&["node", "uncordon", node]);
        }
        drained.retain(|(_, at)| now < *at);

        let nodes = get(&client, &format!("{addr}/v1/nodes")).await.and_then(|v| v.as_array().cloned());
        let units = get(&client, &format!("{addr}/v1/apps/echo/units")).await.and_then(|v| v.as_array().cloned());
        if let (Some(nodes), Some(units)) = (nodes, units) {
            checks += 1;
            let (now_violations, mismatches) = check(&nodes, &units);
            for v in now_violations {
                if reported.insert(v.clone()) {
                    println!("VIOLATION at {:.0} s: {v}", started.elapsed().as_secs_f64());
                    violations.push(v);
                }
            }
            mismatch_since.retain(|node, _| mismatches.contains_key(node));
            for (node, what) in mismatches {
                let since = *mismatch_since.entry(node).or_insert(now);
                if now.duration_since(since) > SETTLE && reported.insert(what.clone()) {
                    println!("VIOLATION at {:.0} s: for over {SETTLE:?}, {what}", started.elapsed().as_secs_f64());
                    violations.push(what);
                }
            }
            if !churning {
                let live = units.iter().filter(|u| u["state"] == "running").count() as u32;
                if live == desired && mismatch_since.is_empty() {
                    println!(
                        "converged {:.0} s after the churn stopped",
                        (now.duration_since(started) - churn_for).as_secs_f64()
                    );
                    break;
                }
                if now.duration_since(started) > churn_for + SETTLE * 3 {
                    let v = format!("did not converge: {live} running units, {desired} desired");
                    println!("VIOLATION: {v}");
                    violations.push(v);
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    drop(up);
    let result = serde_json::json!({
        "scenario": "soak",
        "minutes": a.minutes,
        "agents": a.agents,
        "seed": seed,
        "operations": operations,
        "operations_by_kind": by_kind,
        "operations_failed": failed_ops,
        "checks": checks,
        "violations": violations.len(),
        "violation_details": violations,
    });
    if a.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    Ok(())
}
