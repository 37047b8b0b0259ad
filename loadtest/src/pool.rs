//! `flotilla-loadtest pool`: the pool autoscaler's pass at many nodes. Simulated nodes
//! register with real shard processes and heartbeat once a second (some flipping health,
//! so the view moves), a real `flotilla control` follows the shards, and this process
//! runs the real `flotilla_pool::autoscaler::Autoscaler` twice over the same cluster:
//!
//! - `http`: nodes from `GET /v1/nodes`, as every pass read them before (the control
//!   plane builds the whole list, this side parses it), with today's decision (a
//!   `before` figure needs the old build: BENCHMARKS.md);
//! - `view`: nodes from a view this process follows (`ViewCluster`), as it runs now.
//!
//! Each pass runs on a thread of its own (a current-thread runtime), so its CPU is that
//! thread's CPU time; the control plane's CPU during the pass, less what it spends when
//! no pass runs, is reported beside it; the view follower's own CPU (on other threads,
//! per second rather than per pass) is not, and is about the control plane's idle rate,
//! which also follows the shards. The apps are this side's: `--queued` units of two 1-CPU
//! members wait. Every node has room for them and all are alike, so the twins rule
//! (`flotilla_pool::reconciler`) leaves out all but a few from the view, where rows share
//! their labels and capacity, and none over HTTP, where none share: nodes that differ
//! more cost more. The provider lists no instances, so no node is the pool's own. Each
//! mode's first decision is reported: both see the same cluster, so they decide alike.
//!
//! Everything started is stopped by pid / process group at the end, pass or fail.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Args;
use flotilla_core::{MemberShape, Resources, UnitShape};
use flotilla_pool::autoscaler::Autoscaler;
use flotilla_pool::cluster::{Cluster, ClusterError, HttpCluster, ReportAnswer, ViewCluster};
use flotilla_pool::config::PoolConfig;
use flotilla_pool::model::{AppRow, NodeRow, Queued};
use flotilla_pool::provider::{BoxFuture, CloudInstance, InstanceProvider, LaunchSpec, ProviderError};
use flotilla_pool::store::PoolStore;
use serde_json::{Value, json};

use crate::common::{flotilla_bin, machine, proc_cpu_seconds};
use crate::heartbeats::Heartbeating;

#[derive(Debug, Args)]
pub struct PoolArgs {
    #[arg(long, default_value_t = 100_000)]
    pub nodes: usize,
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Passes measured in each mode.
    #[arg(long, default_value_t = 10)]
    pub passes: usize,
    /// Units waiting for room (two 1-CPU members each); 0 is a pool at rest.
    #[arg(long, default_value_t = 0)]
    pub queued: u32,
    /// Nodes per second whose heartbeat flips their health class.
    #[arg(long, default_value_t = 50)]
    pub flips_per_second: usize,
    #[arg(long)]
    pub json: bool,
    /// The `flotilla` binary (default: next to this one).
    #[arg(long)]
    pub flotilla: Option<std::path::PathBuf>,
}

const POOL: &str = r#"
name = "loadtest"
max_nodes = 100000
interval = "1s"
[consolidation]
enabled = false
[provider]
kind = "local"
[node_types.cpu-8]
cpu = 8
memory = "32Gi"
max = 1000
"#;

/// A provider with no instances: launches are taken and never listed (they time out
/// long after the run).
struct NoInstances;

impl InstanceProvider for NoInstances {
    fn name(&self) -> &'static str {
        "loadtest"
    }
    fn list(&self) -> BoxFuture<'_, Result<Vec<CloudInstance>, ProviderError>> {
        Box::pin(async { Ok(Vec::new()) })
    }
    fn launch<'a>(&'a self, _: &'a LaunchSpec) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }
    fn terminate<'a>(&'a self, _: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(async { Ok(()) })
    }
}

/// The cluster of `inner` with this run's apps instead of the control plane's (it has
/// no schedulers).
struct WithApps {
    inner: Box<dyn Cluster>,
    apps: Vec<AppRow>,
}

impl Cluster for WithApps {
    fn nodes(&self) -> BoxFuture<'_, Result<Vec<NodeRow>, ClusterError>> {
        self.inner.nodes()
    }
    fn apps(&self) -> BoxFuture<'_, Result<Vec<AppRow>, ClusterError>> {
        let apps = self.apps.clone();
        Box::pin(async move { Ok(apps) })
    }
    fn drain<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ClusterError>> {
        self.inner.drain(node)
    }
    fn set_cordon<'a>(&'a self, node: &'a str, cordoned: bool) -> BoxFuture<'a, Result<(), ClusterError>> {
        self.inner.set_cordon(node, cordoned)
    }
    fn report<'a>(&'a self, pool: &'a str, report: &'a Value) -> BoxFuture<'a, Result<ReportAnswer, ClusterError>> {
        self.inner.report(pool, report)
    }
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec for the call to fill.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// One pass measured: its thread's CPU, its wall time, the control plane's CPU meanwhile.
struct Measured {
    cpu_ms: f64,
    wall_ms: f64,
    control_ms: f64,
}

/// `passes` passes of an autoscaler over `cluster`, each on this thread, and what the
/// first of them decided.
fn measure(
    cluster: Box<dyn Cluster>,
    apps: Vec<AppRow>,
    store: PoolStore,
    passes: usize,
    control_pid: u32,
    control_idle_rate: f64,
) -> anyhow::Result<(Vec<Measured>, Value)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let cfg = PoolConfig::parse(POOL).map_err(|e| anyhow!("the loadtest's pool: {e}"))?;
    let cluster = Arc::new(WithApps { inner: cluster, apps });
    let mut scaler = Autoscaler::new(cfg, Arc::new(NoInstances), cluster, store)?;
    let mut out = Vec::with_capacity(passes);
    // One pass unmeasured: the first builds what later ones reuse (connections).
    rt.block_on(scaler.pass()).context("the first pass")?;
    let first = &scaler.report()["decisions"][0];
    let placed_on = first["packing"]["placed_on_existing"].as_array().map_or(0, Vec::len);
    let decided = json!({"launch": first["launch"], "infeasible": first["infeasible"], "placed_on_nodes": placed_on});
    for _ in 0..passes {
        let control0 = proc_cpu_seconds(control_pid).unwrap_or(0.0);
        let (cpu0, t0) = (thread_cpu(), Instant::now());
        rt.block_on(scaler.pass()).context("a pass")?;
        let (cpu, wall) = ((thread_cpu() - cpu0).as_secs_f64(), t0.elapsed().as_secs_f64());
        let control = proc_cpu_seconds(control_pid).unwrap_or(0.0) - control0 - control_idle_rate * wall;
        out.push(Measured { cpu_ms: cpu * 1e3, wall_ms: wall * 1e3, control_ms: control.max(0.0) * 1e3 });
    }
    Ok((out, decided))
}

fn summary(m: &[Measured]) -> Value {
    let pick = |f: fn(&Measured) -> f64| {
        let mut v: Vec<f64> = m.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        let r = |x: f64| (x * 10.0).round() / 10.0;
        json!({"p50": r(v.get(v.len() / 2).copied().unwrap_or(0.0)), "max": r(v.last().copied().unwrap_or(0.0))})
    };
    // /proc counts the control plane's CPU in 10 ms ticks: its mean over the passes.
    let mean = |f: fn(&Measured) -> f64| (m.iter().map(f).sum::<f64>() / m.len().max(1) as f64 * 10.0).round() / 10.0;
    json!({
        "pass_cpu_ms": pick(|m| m.cpu_ms),
        "pass_wall_ms": pick(|m| m.wall_ms),
        "control_cpu_ms_mean": mean(|m| m.control_ms),
        "total_cpu_ms_mean": mean(|m| m.cpu_ms + m.control_ms),
    })
}

/// Polls until `f` says the view holds `n` nodes, or fails after `within`.
async fn until_nodes(what: &str, n: usize, within: Duration, f: impl Fn() -> usize) -> anyhow::Result<()> {
    let deadline = Instant::now() + within;
    loop {
        let seen = f();
        if seen >= n {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "{what} shows {seen} of {n} nodes after {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub async fn run(a: PoolArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.nodes >= 1 && a.nodes <= 1_000_000, "--nodes must be within 1..=1000000");
    anyhow::ensure!(a.shards >= 1 && a.shards <= 64, "--shards must be within 1..=64");
    anyhow::ensure!(a.passes >= 1 && a.passes <= 1000, "--passes must be within 1..=1000");
    anyhow::ensure!(a.queued <= 100_000, "--queued must be at most 100000");
    let bin = flotilla_bin(a.flotilla.clone())?;
    println!("machine: {}", machine());
    let sim = Heartbeating::start(&bin, "pool", a.nodes, a.shards, a.flips_per_second).await?;
    let (data, shards) = (&sim.data, &sim.shards);

    let (control, addr) = crate::dashboard::spawn_control(&bin, data, shards)?;
    let base = format!("http://{addr}");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    let total = {
        let (http, base) = (http.clone(), base.clone());
        move || {
            let (http, base) = (http.clone(), base.clone());
            async move {
                let r = http.get(format!("{base}/v1/nodes?limit=1")).send().await.ok()?;
                r.headers().get("x-total-count")?.to_str().ok()?.parse::<usize>().ok()
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let seen = total().await.unwrap_or(0);
        if seen >= a.nodes {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the control plane shows {seen} of {} nodes", a.nodes);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let view = flotilla_view::ClusterView::new(a.shards);
    let dialer = data.dialer()?;
    for (i, s) in shards.iter().enumerate() {
        tokio::spawn(flotilla_view::follow_shard(view.clone(), i, s.addr.clone(), dialer.clone()));
    }
    let counted = view.clone();
    until_nodes("the view", a.nodes, Duration::from_secs(120), move || {
        counted.slots().iter().map(|s| s.view.len()).sum()
    })
    .await?;

    // What the control plane spends with no pass running (following the shards).
    let c0 = proc_cpu_seconds(control.pid()).unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_rate = (proc_cpu_seconds(control.pid()).unwrap_or(0.0) - c0) / 3.0;

    let member = Resources::new(1000, 1 << 30, 0);
    let apps = vec![AppRow {
        app: "loadtest".into(),
        queued: Queued { primary: a.queued, secondary: 0 },
        unit_shape: UnitShape {
            members: vec![MemberShape::plain("head", member.clone()), MemberShape::plain("worker", member)],
            ..Default::default()
        },
    }];
    let token = std::fs::read_to_string(data.dir.join("api-token")).ok().map(|t| t.trim().to_string());
    let (passes, pid) = (a.passes, control.pid());
    let mut figures = serde_json::Map::new();
    for mode in ["http", "view"] {
        let api = HttpCluster::new(reqwest::Client::new(), &base, token.clone());
        let cluster: Box<dyn Cluster> = match mode {
            "http" => Box::new(api),
            _ => Box::new(ViewCluster::new(view.clone(), api)),
        };
        let store = PoolStore::open("loadtest", data.dir.join(format!("pool-{mode}.redb")))?;
        let apps = apps.clone();
        let (m, decided) =
            tokio::task::spawn_blocking(move || measure(cluster, apps, store, passes, pid, idle_rate)).await??;
        let mut s = summary(&m);
        s["first_decision"] = decided;
        println!(
            "{mode}: pass CPU p50 {} ms (max {}), control plane CPU per pass {} ms, wall p50 {} ms",
            s["pass_cpu_ms"]["p50"], s["pass_cpu_ms"]["max"], s["control_cpu_ms_mean"], s["pass_wall_ms"]["p50"]
        );
        figures.insert(mode.to_string(), s);
    }
    drop(control);
    if a.json {
        let out = json!({
            "scenario": "pool",
            "nodes": a.nodes,
            "shards": a.shards,
            "queued_units": a.queued,
            "passes": a.passes,
            "control_idle_cpu_cores": (idle_rate * 1000.0).round() / 1000.0,
            "modes": figures,
            "machine": machine(),
        });
        println!("{out}");
    }
    Ok(())
}
