//! `flotilla-loadtest takeover`: two `flotilla scheduler` processes for the echo app on a
//! real etcd, beside `flotilla up` (agents and shards, no app of its own). Each trial
//! kill -9s the active scheduler and, from that instant, asks the control plane to scale
//! 2 → 3 units until it accepts; it times the standby holding the lease, the scale being
//! accepted (the control plane forwards to whichever scheduler registered last) and the
//! standby's first committed placement. The killed instance then comes back as the new
//! standby and the app is scaled back to 2, so every trial starts alike.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::Value;

use crate::common::{EtcdProc, UpProc, flotilla_bin, machine, pct_ms, sum_metric, until};

const ECHO: &str = include_str!("../../examples/echo.toml");

#[derive(Debug, Args)]
pub struct TakeoverArgs {
    #[arg(long, default_value_t = 10)]
    pub trials: usize,
    /// The schedulers' `--lease-ttl` in seconds (the product's default is 5).
    #[arg(long, default_value_t = 5)]
    pub lease_ttl: u64,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub flotilla: Option<PathBuf>,
}

/// One `flotilla scheduler` process, killed on drop.
struct Sched {
    child: Child,
    instance: &'static str,
    api: String,
}

impl Sched {
    fn spawn(bin: &Path, ctx: &Ctx, instance: &'static str) -> anyhow::Result<Sched> {
        use std::os::unix::process::CommandExt;
        let listen = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
        let child = Command::new(bin)
            .args(["scheduler", "--app"])
            .arg(&ctx.spec)
            .args(["--aggregators", &ctx.shards, "--control", &ctx.control, "--store", &ctx.store])
            .args(["--store-prefix", "/takeover", "--lease-ttl", &format!("{}s", ctx.ttl)])
            .args(["--instance", instance, "--listen", &listen])
            .env("FLOTILLA_DATA", &ctx.data)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(ctx.data.join(format!("scheduler-{instance}.err")))?)
            .process_group(0)
            .spawn()
            .context("starting flotilla scheduler")?;
        Ok(Sched { child, instance, api: format!("http://{listen}") })
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Sched {
    fn drop(&mut self) {
        self.kill();
    }
}

/// What every scheduler is started with.
struct Ctx {
    spec: PathBuf,
    data: PathBuf,
    shards: String,
    control: String,
    store: String,
    ttl: u64,
}

/// The scheduler's `flotilla_scheduler_leader` gauge and committed placements.
async fn scheduler_metrics(client: &reqwest::Client, s: &Sched) -> Option<(f64, f64)> {
    let text = client.get(format!("{}/metrics", s.api)).timeout(Duration::from_secs(1)).send().await.ok()?;
    let text = text.text().await.ok()?;
    let leader = text.lines().find(|l| l.starts_with("flotilla_scheduler_leader{"))?;
    let leader = leader.rsplit(' ').next()?.parse().ok()?;
    let committed = text
        .lines()
        .filter(|l| l.starts_with("flotilla_placements_total{") && l.contains("result=\"committed\""))
        .collect::<Vec<_>>()
        .join("\n");
    Some((leader, sum_metric(&committed, "flotilla_placements_total")))
}

async fn running(client: &reqwest::Client, control: &str) -> usize {
    let units = async {
        client
            .get(format!("{control}/v1/apps/echo/units"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .ok()?
            .json::<Value>()
            .await
            .ok()
    };
    units.await.and_then(|v| v.as_array().map(|a| a.iter().filter(|u| u["state"] == "running").count())).unwrap_or(0)
}

/// `PUT /v1/apps/echo/scale`: whether the control plane (and the scheduler behind it) accepted.
async fn scale(client: &reqwest::Client, control: &str, token: &str, units: u32) -> bool {
    let req = client
        .put(format!("{control}/v1/apps/echo/scale"))
        .bearer_auth(token)
        .json(&serde_json::json!({ "units": units }))
        .timeout(Duration::from_secs(1));
    req.send().await.is_ok_and(|r| r.status().is_success())
}

pub async fn run(a: TakeoverArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=200).contains(&a.trials), "--trials must be within 1..=200");
    anyhow::ensure!((1..=60).contains(&a.lease_ttl), "--lease-ttl must be within 1..=60 (seconds)");
    let bin = flotilla_bin(a.flotilla.clone())?;
    let dir = std::env::temp_dir().join(format!("flotilla-loadtest-takeover-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    println!("machine: {}", machine());
    println!(
        "flotilla up --agents 4 --shards 2; two `flotilla scheduler --store etcd://… --lease-ttl {}s`",
        a.lease_ttl
    );
    let up = UpProc::start(&bin, &dir, 4, &[], None)?;
    let etcd = EtcdProc::start(&dir, &[]).await?;
    let client = reqwest::Client::new();
    let control = up.addr().await?;
    let token = until("the API token", Duration::from_secs(30), async || {
        std::fs::read_to_string(dir.join("api-token")).ok().map(|t| t.trim().to_string())
    })
    .await?;
    let shards = until("the shards", Duration::from_secs(30), async || {
        let v: Value = client.get(format!("{control}/v1/shards")).send().await.ok()?.json().await.ok()?;
        let addrs: Vec<&str> = v.as_array()?.iter().filter_map(|s| s["address"].as_str()).collect();
        (addrs.len() == 2).then(|| addrs.join(","))
    })
    .await?;
    let spec = dir.join("echo.toml");
    std::fs::write(&spec, ECHO)?;
    let ctx = Ctx {
        spec,
        data: dir.clone(),
        shards,
        control: control.clone(),
        store: etcd.endpoints.to_string(),
        ttl: a.lease_ttl,
    };

    let mut active = Sched::spawn(&bin, &ctx, "a")?;
    until("a active with 2 running units", Duration::from_secs(60), async || {
        let leads = scheduler_metrics(&client, &active).await?.0 == 1.0;
        (leads && running(&client, &control).await == 2).then_some(())
    })
    .await?;
    let mut standby = Sched::spawn(&bin, &ctx, "b")?;
    until("b waiting as a standby", Duration::from_secs(30), async || {
        (scheduler_metrics(&client, &standby).await?.0 == 0.0).then_some(())
    })
    .await?;

    let (mut to_active, mut to_scaled, mut to_commit) =
        (Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?, Histogram::<u64>::new(3)?);
    for trial in 0..a.trials {
        let (_, committed_before) = scheduler_metrics(&client, &standby)
            .await
            .ok_or_else(|| anyhow!("the standby's /metrics did not answer"))?;
        active.kill();
        let t0 = Instant::now();
        let (mut lease, mut scaled) = (None, None);
        let commit = until("the standby's first commit", Duration::from_secs(60), async || {
            if scaled.is_none() && scale(&client, &control, &token, 3).await {
                scaled = Some(t0.elapsed());
            }
            let (leader, committed) = scheduler_metrics(&client, &standby).await?;
            if leader == 1.0 && lease.is_none() {
                lease = Some(t0.elapsed());
            }
            (committed > committed_before).then(|| t0.elapsed())
        })
        .await?;
        let lease = lease.unwrap_or(commit);
        let scaled = scaled.ok_or_else(|| anyhow!("the standby committed before any scale was accepted"))?;
        let us = |d: Duration| (d.as_micros() as u64).max(1);
        to_active.record(us(lease))?;
        to_scaled.record(us(scaled))?;
        to_commit.record(us(commit))?;
        println!(
            "trial {trial}: kill -9 {} → {} active after {:.0} ms, scale accepted after {:.0} ms, first commit after {:.0} ms",
            active.instance,
            standby.instance,
            lease.as_secs_f64() * 1000.0,
            scaled.as_secs_f64() * 1000.0,
            commit.as_secs_f64() * 1000.0
        );

        // The killed instance returns as the standby; the app goes back to 2 units.
        let instance = active.instance;
        drop(std::mem::replace(&mut active, Sched::spawn(&bin, &ctx, instance)?));
        std::mem::swap(&mut active, &mut standby);
        until("3 running units", Duration::from_secs(60), async || {
            (running(&client, &control).await == 3).then_some(())
        })
        .await?;
        until("the new standby waiting", Duration::from_secs(30), async || {
            (scheduler_metrics(&client, &standby).await?.0 == 0.0).then_some(())
        })
        .await?;
        until("scale back to 2 accepted", Duration::from_secs(30), async || {
            scale(&client, &control, &token, 2).await.then_some(())
        })
        .await?;
        until("2 running units", Duration::from_secs(60), async || {
            (running(&client, &control).await == 2).then_some(())
        })
        .await?;
    }
    drop((active, standby, etcd, up));
    let result = serde_json::json!({
        "scenario": "takeover",
        "trials": a.trials,
        "lease_ttl_s": a.lease_ttl,
        "active_p50_ms": pct_ms(&to_active, 0.5),
        "active_p99_ms": pct_ms(&to_active, 0.99),
        "scale_accepted_p50_ms": pct_ms(&to_scaled, 0.5),
        "scale_accepted_p99_ms": pct_ms(&to_scaled, 0.99),
        "first_commit_p50_ms": pct_ms(&to_commit, 0.5),
        "first_commit_p99_ms": pct_ms(&to_commit, 0.99),
    });
    if a.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    Ok(())
}
