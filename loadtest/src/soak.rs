//! `flotilla-loadtest soak --minutes M`: `flotilla up` with real agents and the echo app
//! under churn, with the invariants checked all along.
//!
//! Churn, one operation every `--every` (seeded; the seed is printed): `kill -9` of an
//! agent (up brings it back as a new incarnation), a PreStop drain of an agent (same),
//! an operator `node drain` later undone by `uncordon`, a scale to a random size, and an
//! `apply` of a changed template (a rolling update), an `apply` of a template that never
//! runs (a rollout that must fail at its `progress_deadline` and be superseded by the next
//! apply), and a full disk for `FULL_FOR` (as root: the data dir is a tmpfs, filled to the
//! last byte, then freed; agents must live on and the scheduler's store must recover).
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
/// How long a full-disk operation keeps the data dir full.
const FULL_FOR: Duration = Duration::from_secs(8);
/// The size of the data dir's tmpfs: room for 10 minutes of logs at `warn`.
const TMPFS_SIZE: &str = "size=256m";

/// A tmpfs mounted on the data dir for the full-disk operations; unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    /// Mounts one, or says why it could not (not root, no mount permission).
    fn mount(dir: &std::path::Path) -> Result<Tmpfs, String> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", TMPFS_SIZE, "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("running mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Tmpfs(dir.to_path_buf()))
    }

    /// Fills it to the last byte with one file; how many bytes that took.
    fn fill(&self) -> u64 {
        use std::io::Write;
        let Ok(mut f) = std::fs::File::create(self.0.join("filler")) else { return 0 };
        let chunk = vec![0u8; 1 << 20];
        let mut written = 0u64;
        while let Ok(n) = f.write(&chunk) {
            if n == 0 {
                break;
            }
            written += n as u64;
        }
        written
    }

    fn free(&self) {
        let _ = std::fs::remove_file(self.0.join("filler"));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        self.free();
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The echo spec at `version` (an env change rolls every unit); `broken` makes the head's
/// command one that cannot start, with a short progress deadline so the rollout fails.
fn echo_spec(version: u32, broken: bool) -> String {
    let mut text =
        ECHO.replacen("serves_http = true", &format!("serves_http = true\nenv = {{ V = \"{version}\" }}"), 1);
    if broken {
        text = text.replacen("command = \"flotilla\"", "command = \"/nonexistent/bin\"", 1);
        text.push_str("\n[rollout]\nprogress_deadline = \"10s\"\n");
    }
    text
}

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
    /// On a violation, keep the cluster running (until interrupted) for inspection.
    #[arg(long)]
    pub hold_on_failure: bool,
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
    // The data dir apart from the spec file, so a full data dir never stops the soak itself.
    let data = dir.join("data");
    std::fs::create_dir_all(&data)?;
    let tmpfs = match Tmpfs::mount(&data) {
        Ok(t) => Some(t),
        Err(e) => {
            println!("full-disk operations skipped: cannot mount a tmpfs on {}: {e}", data.display());
            None
        }
    };
    let tmpfs_mounted = tmpfs.is_some();
    let up = UpProc::start(&bin, &data, a.agents, &["--restart-delay", "4s"], Some(&spec))?;
    let addr = up.addr().await?;
    let token = std::fs::read_to_string(data.join("api-token"))?.trim().to_string();
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
    let mut full_until: Option<Instant> = None;
    let mut version = 1u32;
    let mut desired = 2u32;
    let mut checks = 0u64;
    let mut settled_spec = false;
    loop {
        let now = Instant::now();
        let churning = now.duration_since(started) < churn_for;
        if churning && now >= next_op {
            next_op = now + every;
            let node = format!("node-{}", rng.random_range(1..=a.agents));
            let kind = match rng.random_range(0..12) {
                0..=2 => "kill",
                3..=4 => "prestop",
                5 => "node-drain",
                6..=7 => "scale",
                8..=9 => "apply",
                10 => "failing-apply",
                _ if tmpfs.is_some() && full_until.is_none() => "full-disk",
                _ => "apply",
            };
            let ok = match kind {
                "kill" => std::fs::read_to_string(data.join("agents").join(format!("{node}.pid")))
                    .ok()
                    .and_then(|p| p.trim().parse::<i32>().ok())
                    .map(|pid| {
                        // SAFETY: kill(2) of an agent that `up` started.
                        unsafe { libc::kill(pid, libc::SIGKILL) == 0 }
                    })
                    .unwrap_or(false),
                "prestop" => Command::new(&bin)
                    .args(["agent", "drain", "--data"])
                    .arg(data.join("agents").join(&node))
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .is_ok(),
                "node-drain" => {
                    drained.push((node.clone(), now + Duration::from_secs(15)));
                    cli(&["node", "drain", &node])
                }
                "scale" => {
                    // A refused scale (503 while the disk is full) leaves the app's count as it was.
                    let n = rng.random_range(1..=6);
                    let ok = cli(&["scale", "echo", "--units", &n.to_string()]);
                    if ok {
                        desired = n;
                    }
                    ok
                }
                "full-disk" => {
                    full_until = Some(now + FULL_FOR);
                    tmpfs.as_ref().is_some_and(|t| t.fill() > 0)
                }
                _ => {
                    version += 1;
                    std::fs::write(&spec, echo_spec(version, kind == "failing-apply"))?;
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
        if full_until.is_some_and(|at| now >= at) {
            if let Some(t) = &tmpfs {
                t.free();
            }
            full_until = None;
        }
        // The churn is over: one good apply, so a failing rollout is not the last word.
        if !churning && !settled_spec {
            settled_spec = true;
            if let Some(t) = &tmpfs {
                t.free();
            }
            version += 1;
            std::fs::write(&spec, echo_spec(version, false))?;
            // A store still reopening after the last full disk answers 503 for a few
            // seconds (its back-off is at most 10 s): retried as an operator would.
            let applied = (0..30).any(|attempt| {
                if attempt > 0 {
                    std::thread::sleep(Duration::from_secs(1));
                }
                cli(&["apply", spec.to_str().unwrap_or("")])
            });
            if !applied {
                violations.push("the last, good apply was refused for 30 s".to_string());
            }
        }

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
                    // What the app and its units say, for whoever replays the seed.
                    match client.get(format!("{addr}/v1/apps/echo")).timeout(Duration::from_secs(5)).send().await {
                        Ok(r) => println!("app: {} {}", r.status(), r.text().await.unwrap_or_default()),
                        Err(e) => println!("app: {e}"),
                    }
                    for u in units.iter().filter(|u| u["state"] != "terminated") {
                        println!("unit {} {} {} {}", u["unit_id"], u["state"], u["unplaced_reason"], u["members"]);
                    }
                    for n in &nodes {
                        println!("node {}", n);
                    }
                    violations.push(v);
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    if a.hold_on_failure && !violations.is_empty() {
        println!("holding the cluster for inspection at {addr} (data {}); interrupt to stop", data.display());
        let _ = tokio::signal::ctrl_c().await;
    }
    // The logs outlive the tmpfs and `up`'s data dir, for whoever replays a seed that failed.
    for log in ["up.err", "up.out"] {
        let _ = std::fs::copy(data.join(log), dir.join(log));
    }
    drop(up);
    drop(tmpfs);
    println!("logs: {}", dir.join("up.err").display());
    let result = serde_json::json!({
        "scenario": "soak",
        "minutes": a.minutes,
        "agents": a.agents,
        "every_ms": every.as_millis() as u64,
        "seed": seed,
        "full_disk": tmpfs_mounted,
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
