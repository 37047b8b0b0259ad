//! `flotilla-loadtest schedule`: K app schedulers (tasks sharing one decoded view, as
//! they would share a host) place units against shard processes holding N simulated
//! nodes, competing for the same nodes so conflicts are real. The same workload then
//! runs through a pessimistic baseline: one global lock around plan + commit.

use flotilla_core::LockExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use clap::Args;
use flotilla_scheduler::UnitState;
use flotilla_scheduler::{AppHandle, AppSpec, MemStore, Scheduler, Store};
use flotilla_view::ClusterView;
use hdrhistogram::Histogram;

use crate::common::{Data, EtcdProc, ShardProc, flotilla_bin, machine, proc_cpu_seconds, register_nodes};

#[derive(Debug, Args)]
pub struct ScheduleArgs {
    #[arg(long, default_value_t = 100_000)]
    pub nodes: usize,
    #[arg(long, default_value_t = 16)]
    pub schedulers: usize,
    /// Units to place in each run (one member each), split over the schedulers.
    #[arg(long, default_value_t = 20_000)]
    pub placements: usize,
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Cores of each simulated node.
    #[arg(long, default_value_t = 8)]
    pub node_cores: u64,
    /// CPU of each placement (one member per unit), as in an app spec.
    #[arg(long, default_value = "100m")]
    pub unit_cpu: String,
    /// Give up on a run after this long (`120s`, `5m`; a bare number is seconds).
    #[arg(long, default_value = "120s", value_parser = flotilla_agent::config::parse_duration)]
    pub timeout: Duration,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub flotilla: Option<PathBuf>,
    /// The schedulers' stores, one optimistic run each, in this order: `mem`, `redb`
    /// (a file per scheduler), `etcd` (an etcd this loadtest starts, `etcd` on the PATH;
    /// a client and thread per scheduler, as separate processes would have). The first
    /// one's figures are the headline; the lock baseline runs with it too. A store named
    /// twice is run twice, and `placements_per_second_by_store` is its mean.
    #[arg(long, value_delimiter = ',', default_value = "mem")]
    pub store: Vec<StoreKind>,
    /// Runs etcd on these CPUs only, e.g. `--etcd-cpus 1` under `taskset -c 0
    /// flotilla-loadtest …`: the schedulers then have the same CPU with either store, and
    /// etcd's own work (on its own machines in production) is not charged to them.
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u16).range(0..1024))]
    pub etcd_cpus: Vec<u16>,
}

/// A scheduler store the loadtest can run with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum StoreKind {
    Mem,
    Redb,
    Etcd,
}

impl StoreKind {
    fn name(self) -> &'static str {
        match self {
            StoreKind::Mem => "mem",
            StoreKind::Redb => "redb",
            StoreKind::Etcd => "etcd",
        }
    }
}

/// Where the stores of one run live.
struct Stores {
    kind: StoreKind,
    dir: PathBuf,
    etcd: Option<flotilla_etcd::Endpoints>,
}

impl Stores {
    fn open(&self, i: usize) -> anyhow::Result<Arc<dyn Store>> {
        Ok(match self.kind {
            StoreKind::Mem => Arc::new(MemStore::default()),
            StoreKind::Redb => Arc::new(flotilla_scheduler::RedbStore::open(&self.dir.join(format!("s{i}.redb")))?),
            StoreKind::Etcd => {
                let e = self.etcd.as_ref().ok_or_else(|| anyhow::anyhow!("no etcd started"))?;
                Arc::new(flotilla_scheduler::EtcdStore::open(e, "/loadtest", flotilla_etcd::REQUEST_TIMEOUT)?)
            }
        })
    }
}

struct Run {
    committed: usize,
    seconds: f64,
    accepted: u64,
    rejected: u64,
    commit_us: Histogram<u64>,
    decision_us: Histogram<u64>,
}

fn spec(name: &str, units: u32, cpu: &str) -> anyhow::Result<AppSpec> {
    Ok(AppSpec::parse(&crate::common::sleep_app_spec(name, units, units, cpu))?)
}

async fn run(
    prefix: &str,
    a: &ScheduleArgs,
    cluster: &Arc<ClusterView>,
    addrs: &[String],
    dialer: &flotilla_proto::dial::Dialer,
    pessimistic: bool,
    stores: &Stores,
) -> anyhow::Result<Run> {
    let k = a.schedulers;
    let lock = Arc::new(tokio::sync::Mutex::new(()));
    let mut handles: Vec<AppHandle> = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    let deadline = Instant::now() + a.timeout;
    let started = Instant::now();
    for i in 0..k {
        let units = (a.placements / k + usize::from(i < a.placements % k)) as u32;
        let store = stores.open(i)?;
        let (s, h) = Scheduler::new(
            spec(&format!("{prefix}-{i}"), units, &a.unit_cpu)?,
            cluster.clone(),
            addrs.to_vec(),
            store,
        )?;
        let mut s = s.with_dialer(dialer.clone());
        let (lock, handle) = (lock.clone(), h.clone());
        handles.push(h);
        tasks.spawn(async move {
            loop {
                let r = if pessimistic {
                    let _g = lock.lock().await;
                    s.reconcile().await
                } else {
                    s.reconcile().await
                };
                r?;
                let st = handle.status();
                if st.units.len() == units as usize && st.units.iter().all(|u| u.state == UnitState::Allocated) {
                    return anyhow::Ok(());
                }
                if Instant::now() > deadline {
                    return Ok(());
                }
                tokio::task::yield_now().await;
            }
        });
    }
    while let Some(r) = tasks.join_next().await {
        r??;
    }
    let seconds = started.elapsed().as_secs_f64();
    let mut out = Run {
        committed: 0,
        seconds,
        accepted: 0,
        rejected: 0,
        commit_us: Histogram::new(3)?,
        decision_us: Histogram::new(3)?,
    };
    for h in &handles {
        out.committed += h.status().units.iter().filter(|u| u.state == UnitState::Allocated).count();
        let st = h.stats();
        out.accepted += st.claims_accepted.load(Ordering::Relaxed);
        out.rejected += st.claims_rejected.load(Ordering::Relaxed);
        out.commit_us.add(&*st.commit_us.lock_or_recover())?;
        out.decision_us.add(&*st.decision_us.lock_or_recover())?;
    }
    Ok(out)
}

pub async fn run_schedule(a: ScheduleArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.nodes >= 1 && a.nodes <= 2_000_000, "--nodes must be within 1..=2000000");
    anyhow::ensure!(a.schedulers >= 1 && a.schedulers <= 256, "--schedulers must be within 1..=256");
    anyhow::ensure!(a.shards >= 1 && a.shards <= 64, "--shards must be within 1..=64");
    anyhow::ensure!(
        a.placements >= a.schedulers && a.placements / a.schedulers <= flotilla_core::MAX_UNITS as usize,
        "--placements must give each scheduler 1..={} units",
        flotilla_core::MAX_UNITS
    );
    let bin = flotilla_bin(a.flotilla.clone())?;
    let data = Data::create("sched")?;
    println!("machine: {}", machine());
    // Simulated nodes do not heartbeat here: liveness long enough that all stay Alive.
    let liveness = ["--suspect-after", "1h", "--dead-after", "2h"].map(String::from);
    println!("liveness: {} (nodes stay alive for the run)", liveness.join(" "));
    let mut shards = Vec::new();
    for i in 0..a.shards {
        shards.push(ShardProc::spawn(&bin, &data.dir, i, a.shards, &liveness)?);
    }
    let t = Instant::now();
    anyhow::ensure!((1..=4096).contains(&a.node_cores), "--node-cores must be within 1..=4096");
    let nodes = register_nodes(&shards, &data, a.nodes, a.node_cores * 1000).await?.nodes;
    println!(
        "registered {} nodes of {} cores in {:.1}s; each placement takes {} CPU",
        nodes.len(),
        a.node_cores,
        t.elapsed().as_secs_f64(),
        a.unit_cpu
    );
    let addrs: Vec<String> = shards.iter().map(|s| s.addr.clone()).collect();
    let cluster = ClusterView::new(a.shards);
    let dialer = data.dialer()?;
    for (i, addr) in addrs.iter().enumerate() {
        tokio::spawn(flotilla_view::follow_shard(cluster.clone(), i, addr.to_string(), dialer.clone()));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    while cluster.slots().iter().map(|s| s.view.len()).sum::<usize>() < a.nodes {
        anyhow::ensure!(Instant::now() < deadline, "the view never showed every node");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let per_s = |r: &Run| r.committed as f64 / r.seconds.max(1e-9);
    let etcd = if a.store.contains(&StoreKind::Etcd) {
        Some(EtcdProc::start(&data.dir, &a.etcd_cpus.iter().map(|&c| usize::from(c)).collect::<Vec<_>>()).await?)
    } else {
        None
    };
    // A store may be named more than once (`redb,etcd,redb,etcd`) to even out the order
    // effect: the store that runs later finds the shards and the view warm.
    let mut rates: Vec<(StoreKind, f64)> = Vec::new();
    let mut runs = Vec::new();
    let mut split = None;
    for (n, kind) in a.store.iter().copied().enumerate() {
        let before = CpuSplit::read(&shards).await?;
        let stores = Stores {
            kind,
            dir: data.dir.join(format!("stores-{n}-{}", kind.name())),
            etcd: etcd.as_ref().map(|e| e.endpoints.clone()),
        };
        std::fs::create_dir_all(&stores.dir)?;
        let r = run(&format!("opt{n}"), &a, &cluster, &addrs, &dialer, false, &stores).await?;
        println!("store {}: {} placements in {:.2}s = {:.0}/s", kind.name(), r.committed, r.seconds, per_s(&r));
        rates.push((kind, per_s(&r)));
        if n == 0 {
            split = Some(CpuSplit::read(&shards).await?.since(&before, r.committed));
        }
        runs.push(r);
    }
    let mut by_store = serde_json::Map::new();
    for kind in a.store.iter().copied() {
        let of_kind: Vec<f64> = rates.iter().filter(|(k, _)| *k == kind).map(|(_, r)| *r).collect();
        by_store.insert(
            kind.name().to_string(),
            serde_json::json!((of_kind.iter().sum::<f64>() / of_kind.len() as f64).round()),
        );
    }
    let first = a.store.first().copied().unwrap_or(StoreKind::Mem);
    let stores =
        Stores { kind: first, dir: data.dir.join("stores-lock"), etcd: etcd.as_ref().map(|e| e.endpoints.clone()) };
    std::fs::create_dir_all(&stores.dir)?;
    let base = run("lock", &a, &cluster, &addrs, &dialer, true, &stores).await?;
    let opt = runs.swap_remove(0);
    let ratio = |x: &str, y: &str| {
        let (x, y) = (by_store.get(x)?.as_f64()?, by_store.get(y)?.as_f64()?);
        Some(((x / y.max(1e-9)) * 1000.0).round() / 1000.0)
    };
    let etcd_vs_redb = ratio("etcd", "redb");
    let ms = |h: &Histogram<u64>, q: f64| if h.is_empty() { 0.0 } else { h.value_at_quantile(q) as f64 / 1000.0 };
    let conflict = if opt.accepted > 0 { opt.rejected as f64 / opt.accepted as f64 } else { 0.0 };
    println!(
        "optimistic: {} placements in {:.2}s = {:.0}/s, conflict fraction {:.4}, commit p50 {:.1} ms p99 {:.1} ms, decision p99 {} us",
        opt.committed,
        opt.seconds,
        per_s(&opt),
        conflict,
        ms(&opt.commit_us, 0.5),
        ms(&opt.commit_us, 0.99),
        opt.decision_us.value_at_quantile(0.99)
    );
    let split = split.unwrap_or_default();
    println!(
        "  CPU per placement: {:.1} us in the loadtest process (schedulers, view), {:.1} us in the shards; \
         a commit takes {:.2} ms on its shard on average, {:.2} ms of it waiting for the ledger's lock",
        split.process_us, split.shards_us, split.shard_commit_ms, split.lock_wait_ms
    );
    println!(
        "pessimistic (one lock around plan + commit): {} placements in {:.2}s = {:.0}/s",
        base.committed,
        base.seconds,
        per_s(&base)
    );
    let result = serde_json::json!({
        "scenario": "schedule",
        "nodes": a.nodes,
        "shards": a.shards,
        "schedulers": a.schedulers,
        "placements_requested": a.placements,
        "node_cores": a.node_cores,
        "unit_cpu": a.unit_cpu,
        "placements_committed": opt.committed,
        "placements_per_second": per_s(&opt).round(),
        "conflict_fraction": (conflict * 10_000.0).round() / 10_000.0,
        "claims_rejected": opt.rejected,
        "commit_latency_p50_ms": ms(&opt.commit_us, 0.5),
        "commit_latency_p99_ms": ms(&opt.commit_us, 0.99),
        "decision_p99_us": opt.decision_us.value_at_quantile(0.99),
        "process_cpu_us_per_placement": (split.process_us * 10.0).round() / 10.0,
        "shard_cpu_us_per_placement": (split.shards_us * 10.0).round() / 10.0,
        "shard_commit_mean_ms": (split.shard_commit_ms * 1000.0).round() / 1000.0,
        "shard_lock_wait_mean_ms": (split.lock_wait_ms * 1000.0).round() / 1000.0,
        "baseline_placements_committed": base.committed,
        "baseline_placements_per_second": per_s(&base).round(),
        "speedup_vs_baseline": ((per_s(&opt) / per_s(&base).max(1e-9)) * 100.0).round() / 100.0,
        "store": first.name(),
        "placements_per_second_by_store": by_store,
        "etcd_vs_redb": etcd_vs_redb,
    });
    if a.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    Ok(())
}

/// Where a run's CPU went, and how long its commits took on the shards (as opposed to
/// the scheduler's whole call, which adds its own queueing): cumulative readings, and
/// the difference of two.
#[derive(Debug, Default)]
struct CpuSplit {
    process_us: f64,
    shards_us: f64,
    /// Read as a sum, then reported as a mean.
    shard_commit_ms: f64,
    commits: f64,
    /// The same for the waits for a ledger's lock (a commit's, mostly, in this loadtest).
    lock_wait_ms: f64,
    lock_waits: f64,
}

impl CpuSplit {
    async fn read(shards: &[ShardProc]) -> anyhow::Result<Self> {
        let mut s =
            CpuSplit { process_us: proc_cpu_seconds(std::process::id()).unwrap_or(0.0) * 1e6, ..Default::default() };
        for shard in shards {
            s.shards_us += shard.cpu_seconds() * 1e6;
            s.shard_commit_ms += shard.metric("flotilla_shard_commit_seconds_sum").await? * 1e3;
            s.commits += shard.metric("flotilla_shard_commit_seconds_count").await?;
            s.lock_wait_ms += shard.metric("flotilla_ledger_lock_wait_seconds_sum").await? * 1e3;
            s.lock_waits += shard.metric("flotilla_ledger_lock_wait_seconds_count").await?;
        }
        Ok(s)
    }

    /// Per placement committed, and the mean commit, from `before` to `self`.
    fn since(&self, before: &CpuSplit, placements: usize) -> CpuSplit {
        let n = placements.max(1) as f64;
        let mean = |sum: f64, before: f64, count: f64| if count > 0.0 { (sum - before) / count } else { 0.0 };
        let commits = self.commits - before.commits;
        let lock_waits = self.lock_waits - before.lock_waits;
        CpuSplit {
            process_us: (self.process_us - before.process_us) / n,
            shards_us: (self.shards_us - before.shards_us) / n,
            shard_commit_ms: mean(self.shard_commit_ms, before.shard_commit_ms, commits),
            commits,
            lock_wait_ms: mean(self.lock_wait_ms, before.lock_wait_ms, lock_waits),
            lock_waits,
        }
    }
}
