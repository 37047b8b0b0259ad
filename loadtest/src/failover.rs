//! `flotilla-loadtest failover`: real agents under `flotilla up` running the echo app;
//! each trial kills (kill -9) or drains (the PreStop hook) the node holding a unit's
//! head, and times how long its endpoint takes to leave the route table and how long
//! until a replacement unit is Running. Agents are restarted by `up` (new incarnations),
//! so trials can go on.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::anyhow;
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::Value;

use crate::common::{UpProc, flotilla_bin, machine, pct_ms, until};

const ECHO: &str = include_str!("../../examples/echo.toml");

#[derive(Debug, Args)]
pub struct FailoverArgs {
    #[arg(long, default_value_t = 10)]
    pub trials: usize,
    #[arg(long, default_value_t = 8)]
    pub agents: usize,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub flotilla: Option<PathBuf>,
}

async fn get(client: &reqwest::Client, url: &str) -> Option<Value> {
    client.get(url).timeout(Duration::from_secs(2)).send().await.ok()?.json().await.ok()
}

/// Running units and the (endpoint, node, unit) of every route with weight > 0.
async fn state(client: &reqwest::Client, addr: &str) -> (Vec<Value>, Vec<(String, String, String)>) {
    let units = get(client, &format!("{addr}/v1/apps/echo/units"))
        .await
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    let running = units.into_iter().filter(|u| u["state"] == "running").collect();
    let routes = get(client, &format!("{addr}/v1/apps/echo/routes"))
        .await
        .and_then(|v| v["routes"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r["weight"].as_f64().unwrap_or(0.0) > 0.0)
        .filter_map(|r| {
            Some((
                r["endpoint"].as_str()?.to_string(),
                r["node_id"].as_str()?.to_string(),
                r["unit_id"].as_str()?.to_string(),
            ))
        })
        .collect();
    (running, routes)
}

pub async fn run(a: FailoverArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=200).contains(&a.trials), "--trials must be within 1..=200");
    anyhow::ensure!((4..=64).contains(&a.agents), "--agents must be within 4..=64");
    let bin = flotilla_bin(a.flotilla.clone())?;
    let dir = std::env::temp_dir().join(format!("flotilla-loadtest-failover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let spec = dir.join("echo.toml");
    std::fs::write(&spec, ECHO)?;
    println!("machine: {}", machine());
    println!(
        "flotilla up --agents {} --shards 2 --app echo --restart-agents --restart-delay 6s (suspect after 2s, dead after 3s)",
        a.agents
    );
    let up = UpProc::start(&bin, &dir, a.agents, &["--restart-delay", "6s"], Some(&spec))?;
    let client = reqwest::Client::new();
    let addr = up.addr().await?;
    until("two routes", Duration::from_secs(60), async || (state(&client, &addr).await.1.len() == 2).then_some(()))
        .await?;

    let mut route_kill = Histogram::<u64>::new(3)?;
    let mut route_drain = Histogram::<u64>::new(3)?;
    let mut replaced = Histogram::<u64>::new(3)?;
    for trial in 0..a.trials {
        let kill = trial % 2 == 0;
        let (running, routes) = state(&client, &addr).await;
        let (_, node, unit) = routes.first().cloned().ok_or_else(|| anyhow!("no route to take away"))?;
        let desired = running.len();
        let t0 = Instant::now();
        // The drain command answers after the agent's drain delay; time from when it starts.
        let mut drain = None;
        if kill {
            let pid: i32 = std::fs::read_to_string(dir.join("agents").join(format!("{node}.pid")))?.trim().parse()?;
            // SAFETY: kill(2) of an agent process that `up` started for us.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        } else {
            let data = dir.join("agents").join(&node);
            drain =
                Some(Command::new(&bin).args(["agent", "drain", "--data"]).arg(data).stdout(Stdio::null()).spawn()?);
        }
        let gone = until("the endpoint out of the routes", Duration::from_secs(30), async || {
            (!state(&client, &addr).await.1.iter().any(|(_, _, u)| *u == unit)).then(|| t0.elapsed())
        })
        .await?;
        let back = until("a replacement running and routed", Duration::from_secs(60), async || {
            let (running, routes) = state(&client, &addr).await;
            let others = running.iter().filter(|u| u["unit_id"] != unit.as_str()).count();
            let served = routes.iter().filter(|(_, _, u)| *u != unit).count();
            (others >= desired && served >= desired).then(|| t0.elapsed())
        })
        .await?;
        if let Some(mut d) = drain {
            anyhow::ensure!(d.wait()?.success(), "flotilla agent drain failed");
        }
        let ms = |d: Duration| (d.as_micros() as u64).max(1);
        if kill {
            route_kill.record(ms(gone))?
        } else {
            route_drain.record(ms(gone))?
        };
        replaced.record(ms(back))?;
        println!(
            "trial {trial}: {} {node}: out of routes after {:.0} ms, replacement running after {:.0} ms",
            if kill { "kill -9" } else { "drain" },
            gone.as_secs_f64() * 1000.0,
            back.as_secs_f64() * 1000.0
        );
        // Let `up` bring the node back (as a new incarnation) before the next trial.
        tokio::time::sleep(Duration::from_millis(6500)).await;
    }
    drop(up);
    let result = serde_json::json!({
        "scenario": "failover",
        "trials": a.trials,
        "agents": a.agents,
        "route_removal_drain_p50_ms": pct_ms(&route_drain, 0.5),
        "route_removal_drain_p99_ms": pct_ms(&route_drain, 0.99),
        "route_removal_kill_p50_ms": pct_ms(&route_kill, 0.5),
        "route_removal_kill_p99_ms": pct_ms(&route_kill, 0.99),
        "replacement_running_p50_ms": pct_ms(&replaced, 0.5),
        "replacement_running_p99_ms": pct_ms(&replaced, 0.99),
    });
    if a.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    Ok(())
}
