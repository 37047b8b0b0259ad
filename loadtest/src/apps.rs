//! `flotilla-loadtest apps`: one `flotilla scheduler --apps-dir` process hosting many apps,
//! against shard processes whose simulated nodes heartbeat every second, a few of them
//! flipping health class each second so the view keeps changing as a real one does, and
//! run what they are assigned ([`crate::runner`]), so the apps settle with every unit
//! Running. Reports what hosting an app costs while nothing happens to it (the process's
//! CPU and memory per app), and how soon one app's `scale` is committed while the others
//! idle. With `--control`, the process registers its apps with a real `flotilla control`,
//! and what listing them there costs is measured too (`GET /v1/apps`, which the pool
//! autoscaler reads every pass).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use serde_json::Value;

use crate::common::{
    Data, ShardProc, flotilla_bin, machine, pct_ms, proc_cpu_seconds, proc_rss_bytes, proc_threads, sum_metric,
};

#[derive(Debug, Args)]
pub struct AppsArgs {
    /// Apps hosted by the one scheduler process.
    #[arg(long, default_value_t = 1000)]
    pub apps: usize,
    /// Units of each app at the start (one member each); a scale doubles one app's.
    #[arg(long, default_value_t = 10)]
    pub units: u32,
    #[arg(long, default_value_t = 2000)]
    pub nodes: usize,
    #[arg(long, default_value_t = 16)]
    pub node_cores: u64,
    /// CPU of each unit, as in an app spec.
    #[arg(long, default_value = "100m")]
    pub unit_cpu: String,
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// Nodes a second whose health class flips (each one a change in the view).
    #[arg(long, default_value_t = 20)]
    pub flips: usize,
    /// How long the idle process is measured.
    #[arg(long, default_value_t = 20)]
    pub idle_seconds: u64,
    /// Scale trials, each on a different app, one at a time.
    #[arg(long, default_value_t = 50)]
    pub scales: usize,
    /// Give up on the start (every app's units committed) after this long.
    #[arg(long, default_value = "300s", value_parser = flotilla_agent::config::parse_duration)]
    pub timeout: Duration,
    /// Register the apps with a `flotilla control` following the shards, and time this
    /// many `GET /v1/apps` there once every app is listed.
    #[arg(long, default_value_t = 0)]
    pub control_lists: usize,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub flotilla: Option<PathBuf>,
}

/// The `flotilla scheduler --apps-dir` process, killed on drop.
struct Hosting {
    child: Child,
    api: String,
    token: String,
}

impl Hosting {
    /// Registered with the control plane at `control`, when given.
    fn spawn(
        bin: &Path,
        data: &Data,
        dir: &Path,
        shards: &[ShardProc],
        control: Option<&str>,
    ) -> anyhow::Result<Hosting> {
        use std::os::unix::process::CommandExt;
        let listen = format!("127.0.0.1:{}", std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
        let aggregators = shards.iter().map(|s| s.addr.as_str()).collect::<Vec<_>>().join(",");
        // The data dir's API token, which the control plane is started with too.
        let token = std::fs::read_to_string(data.dir.join("api-token"))?.trim().to_string();
        let child = Command::new(bin)
            .args(["scheduler", "--apps-dir"])
            .arg(dir)
            .args(["--aggregators", &aggregators, "--listen", &listen])
            .args(control.map(|c| ["--control", c]).into_iter().flatten())
            .arg("--store")
            .arg(format!("redb:{}", data.dir.join("apps.redb").display()))
            .env("FLOTILLA_DATA", &data.dir)
            .env("FLOTILLA_TOKEN", &token)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(data.dir.join("scheduler.err"))?)
            .process_group(0)
            .spawn()
            .context("starting flotilla scheduler --apps-dir")?;
        Ok(Hosting { child, api: format!("http://{listen}"), token })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Hosting {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Units of `row` (of `GET /v1/apps`) in any of `states`.
fn in_states(row: &Value, states: &[&str]) -> u64 {
    states.iter().map(|s| row["units"][*s].as_u64().unwrap_or(0)).sum()
}

/// Units committed to nodes, whether or not their members run yet.
const COMMITTED: [&str; 3] = ["allocated", "starting", "running"];

/// Every app's units in `states`, from `GET /v1/apps` (`None` while it does not answer).
async fn units_in(client: &reqwest::Client, h: &Hosting, states: &[&str]) -> Option<Vec<u64>> {
    let rows: Value = client
        .get(format!("{}/v1/apps", h.api))
        .timeout(Duration::from_secs(10))
        .send()
        .await
        .ok()?
        .json()
        .await
        .ok()?;
    Some(rows.as_array()?.iter().map(|r| in_states(r, states)).collect())
}

async fn app_committed(client: &reqwest::Client, h: &Hosting, app: &str) -> Option<u64> {
    let url = format!("{}/v1/apps/{app}", h.api);
    let row: Value = client.get(url).timeout(Duration::from_secs(5)).send().await.ok()?.json().await.ok()?;
    Some(in_states(&row, &COMMITTED))
}

async fn metrics(client: &reqwest::Client, h: &Hosting) -> anyhow::Result<String> {
    Ok(client.get(format!("{}/metrics", h.api)).timeout(Duration::from_secs(5)).send().await?.text().await?)
}

pub async fn run(a: AppsArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=10_000).contains(&a.apps), "--apps must be within 1..=10000");
    anyhow::ensure!((1..=500).contains(&a.units), "--units must be within 1..=500");
    anyhow::ensure!((1..=2_000_000).contains(&a.nodes), "--nodes must be within 1..=2000000");
    anyhow::ensure!((1..=4096).contains(&a.node_cores), "--node-cores must be within 1..=4096");
    anyhow::ensure!((1..=64).contains(&a.shards), "--shards must be within 1..=64");
    anyhow::ensure!((1..=600).contains(&a.idle_seconds), "--idle-seconds must be within 1..=600");
    anyhow::ensure!(a.scales <= a.apps, "--scales must be at most --apps (one app each)");
    let bin = flotilla_bin(a.flotilla.clone())?;
    let data = Data::create("apps")?;
    println!("machine: {}", machine());
    // The nodes heartbeat, but registration of many takes a while: nothing goes Suspect.
    let liveness = ["--suspect-after", "1h", "--dead-after", "2h"].map(String::from);
    let mut shards = Vec::new();
    for i in 0..a.shards {
        shards.push(ShardProc::spawn(&bin, &data.dir, i, a.shards, &liveness)?);
    }
    let crate::common::Registered { nodes, links } =
        crate::common::register_nodes(&shards, &data, a.nodes, a.node_cores * 1000).await?;
    println!("registered {} nodes of {} cores; {} flip health class each second", nodes.len(), a.node_cores, a.flips);
    let ran = Arc::new(crate::runner::Counts::default());
    let runners = crate::runner::spawn(&nodes, &links, ran.clone());
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let dests = Mutex::new(shards.iter().map(|s| s.heartbeat).collect::<Vec<_>>());
        let (stop, flips) = (stop.clone(), a.flips);
        std::thread::spawn(move || {
            let (sent, bytes) = (AtomicU64::new(0), AtomicU64::new(0));
            let pending = crate::heartbeats::Pending::default();
            crate::heartbeats::send_loop(&nodes, &dests, 4, flips, &stop, &sent, &pending, &bytes);
        })
    };
    let r = measure(&a, &bin, &data, &shards, &ran).await;
    stop.store(true, Ordering::Relaxed);
    let _ = sender.join();
    runners.iter().for_each(|r| r.abort());
    drop(links);
    r
}

async fn measure(
    a: &AppsArgs,
    bin: &Path,
    data: &Data,
    shards: &[ShardProc],
    ran: &crate::runner::Counts,
) -> anyhow::Result<()> {
    let dir = data.dir.join("apps");
    std::fs::create_dir_all(&dir)?;
    let name = |i: usize| format!("app-{i:05}");
    for i in 0..a.apps {
        std::fs::write(
            dir.join(format!("{}.toml", name(i))),
            crate::common::sleep_app_spec(&name(i), a.units, a.units * 2, &a.unit_cpu),
        )?;
    }
    let client = reqwest::Client::new();
    let control = match a.control_lists {
        0 => None,
        _ => Some(crate::dashboard::spawn_control(bin, data, shards)?),
    };
    let control_url = control.as_ref().map(|(_, addr)| format!("http://{addr}"));
    let started = Instant::now();
    let h = Hosting::spawn(bin, data, &dir, shards, control_url.as_deref())?;
    // The most threads seen while the apps start: every thread the process ever ran
    // stays on the list each `ArcSwap` store walks, though idle ones exit after 10 s.
    let mut threads = 0;
    loop {
        threads = threads.max(proc_threads(h.pid()).unwrap_or(0));
        if let Some(rows) = units_in(&client, &h, &["running"]).await
            && rows.len() == a.apps
            && rows.iter().all(|&n| n == u64::from(a.units))
        {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < a.timeout,
            "not every app's units were running within {:?} (see {})",
            a.timeout,
            data.dir.join("scheduler.err").display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let start_seconds = started.elapsed().as_secs_f64();
    println!("{} apps of {} units running {start_seconds:.1}s after the process started", a.apps, a.units);

    // Idle: the apps want nothing; the view keeps changing.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let passes = |t: &str| sum_metric(t, "flotilla_reconcile_seconds_count");
    let placed = |t: &str| {
        let committed: Vec<&str> = t.lines().filter(|l| l.contains("result=\"committed\"")).collect();
        sum_metric(&committed.join("\n"), "flotilla_placements_total")
    };
    let text = metrics(&client, &h).await?;
    let (cpu0, passes0, placed0, t0) =
        (proc_cpu_seconds(h.pid()).unwrap_or(0.0), passes(&text), placed(&text), Instant::now());
    tokio::time::sleep(Duration::from_secs(a.idle_seconds)).await;
    let text = metrics(&client, &h).await?;
    let (cpu1, passes1, wall) = (proc_cpu_seconds(h.pid()).unwrap_or(0.0), passes(&text), t0.elapsed());
    // Nothing happens to the apps: a placement here is a unit replaced for no reason.
    let idle_placements = placed(&text) - placed0;
    anyhow::ensure!(
        idle_placements == 0.0,
        "{idle_placements} units were placed while the apps should idle (see {})",
        data.dir.join("scheduler.err").display()
    );
    let idle_cpu_cores = (cpu1 - cpu0) / wall.as_secs_f64();
    let passes_per_second = (passes1 - passes0) / wall.as_secs_f64();
    let rss = proc_rss_bytes(h.pid()).unwrap_or(0);
    println!(
        "idle: {idle_cpu_cores:.3} cores, {passes_per_second:.0} reconcile passes/s, {threads} threads at most, RSS {:.1} MiB ({:.0} KiB per app)",
        rss as f64 / (1 << 20) as f64,
        rss as f64 / a.apps as f64 / 1024.0
    );

    // One app at a time doubles; the time is to its new units committed.
    let mut scale_ms = Histogram::<u64>::new(3)?;
    let target = u64::from(a.units) * 2;
    for k in 0..a.scales {
        let app = name(k * a.apps / a.scales.max(1));
        let t = Instant::now();
        let r = client
            .put(format!("{}/v1/apps/{app}/scale", h.api))
            .bearer_auth(&h.token)
            .json(&serde_json::json!({ "units": target }))
            .timeout(Duration::from_secs(10))
            .send()
            .await?;
        anyhow::ensure!(
            r.status().is_success(),
            "scaling {app}: {} {}",
            r.status(),
            r.text().await.unwrap_or_default()
        );
        while app_committed(&client, &h, &app).await != Some(target) {
            anyhow::ensure!(t.elapsed() < Duration::from_secs(60), "{app}'s {target} units not committed in 60 s");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        scale_ms.record(t.elapsed().as_micros() as u64)?;
    }
    let round = |x: f64, k: f64| (x * k).round() / k;
    let listing = match (&control, &control_url) {
        (Some((proc, _)), Some(url)) => {
            Some(measure_lists(&client, url, a.apps, a.control_lists, [proc.pid(), h.pid()]).await?)
        }
        _ => None,
    };
    let mut result = serde_json::json!({
        "scenario": "apps",
        "machine": machine(),
        "apps": a.apps,
        "units": a.units,
        "nodes": a.nodes,
        "shards": a.shards,
        "flips_per_second": a.flips,
        "start_seconds": round(start_seconds, 10.0),
        "idle_cpu_cores": round(idle_cpu_cores, 1000.0),
        "idle_reconcile_passes_per_second": passes_per_second.round(),
        "placements_at_start": placed0,
        "idle_placements": idle_placements,
        "rss_bytes": rss,
        "threads_at_start": threads,
        "memory_bytes_per_app": rss / a.apps as u64,
        "scales": scale_ms.len(),
        "scale_to_committed_p50_ms": round(pct_ms(&scale_ms, 0.5), 10.0),
        "scale_to_committed_p99_ms": round(pct_ms(&scale_ms, 0.99), 10.0),
        "assignment_pushes": ran.pushes.load(Ordering::Relaxed),
        "workload_reports": ran.reports.load(Ordering::Relaxed),
        "failed_workload_reports": ran.failed_reports.load(Ordering::Relaxed),
    });
    if let Some(l) = listing {
        result["control_list_apps"] = l;
    }
    if a.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    Ok(())
}

/// Waits until the control plane at `url` lists all `apps` reachable (each registered),
/// then times `lists` sequential `GET /v1/apps` there in each view (`summary`, and
/// `demand`, the pool autoscaler's): the wall time of each, and the CPU of `pids` (the
/// control plane and the scheduler process) per list, less what they spend in the same
/// time without being asked.
async fn measure_lists(
    client: &reqwest::Client,
    url: &str,
    apps: usize,
    lists: usize,
    pids: [u32; 2],
) -> anyhow::Result<Value> {
    let list = async |query: &str| -> Option<Vec<Value>> {
        let r = client.get(format!("{url}/v1/apps{query}")).timeout(Duration::from_secs(30)).send().await.ok()?;
        r.json::<Vec<Value>>().await.ok()
    };
    let t = Instant::now();
    let registered = loop {
        let rows = list("").await.unwrap_or_default();
        let reachable = rows.iter().filter(|r| r["unreachable"].is_null()).count();
        if reachable == apps {
            break t.elapsed();
        }
        anyhow::ensure!(t.elapsed() < Duration::from_secs(120), "the control plane lists {reachable} of {apps} apps");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let cpu = || pids.iter().map(|p| proc_cpu_seconds(*p).unwrap_or(0.0)).sum::<f64>();
    let (c0, t0) = (cpu(), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_rate = (cpu() - c0) / t0.elapsed().as_secs_f64();
    let round = |x: f64| (x * 10.0).round() / 10.0;
    let mut out = serde_json::json!({
        "listed_after_seconds": round(registered.as_secs_f64()),
        "lists": lists,
    });
    for (view, query) in [("summary", ""), ("demand", "?view=demand")] {
        let mut wall_ms = Histogram::<u64>::new(3)?;
        let (c0, t0) = (cpu(), Instant::now());
        for _ in 0..lists {
            let t = Instant::now();
            let rows = list(query).await.unwrap_or_default();
            anyhow::ensure!(rows.len() == apps, "a {view} listing of {} rows, not {apps}", rows.len());
            wall_ms.record(t.elapsed().as_micros() as u64)?;
        }
        let busy = (cpu() - c0 - idle_rate * t0.elapsed().as_secs_f64()).max(0.0);
        let cpu_ms = busy * 1e3 / lists as f64;
        println!(
            "control plane, GET /v1/apps{query}: p50 {:.1} ms, p99 {:.1} ms, {cpu_ms:.1} ms of CPU each",
            pct_ms(&wall_ms, 0.5),
            pct_ms(&wall_ms, 0.99)
        );
        out[view] = serde_json::json!({
            "wall_p50_ms": round(pct_ms(&wall_ms, 0.5)),
            "wall_p99_ms": round(pct_ms(&wall_ms, 0.99)),
            "cpu_ms_per_list": round(cpu_ms),
        });
    }
    Ok(out)
}
