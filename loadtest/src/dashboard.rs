//! `flotilla-loadtest dashboard`: the dashboard at many nodes. Simulated nodes register
//! with real shard processes and heartbeat once a second (some flipping health, so the
//! stream carries live deltas), as in `heartbeats`; a real `flotilla control` follows the
//! shards; then `loadtest/dashboard_perf.py` (Playwright for Python, Debian's Chromium)
//! opens the federation page and measures first meaningful paint, how long live updates
//! take to be drawn, and the browser's memory. The control process's RSS and CPU and the
//! snapshot's size on the wire are measured here.
//!
//! Everything started (shards, control, the Python driver and its Chromium) is stopped by
//! pid / process group at the end, pass or fail; the run is bounded in time.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use clap::Args;
use serde_json::{Value, json};

use crate::common::{Data, ShardProc, flotilla_bin, machine, proc_cpu_seconds, proc_rss_bytes};
use crate::heartbeats::Heartbeating;

#[derive(Debug, Args)]
pub struct DashboardArgs {
    #[arg(long, default_value_t = 100_000)]
    pub nodes: usize,
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    /// How long the browser watches the live stream after its first paint.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Nodes per second whose heartbeat flips their health class (the live deltas).
    #[arg(long, default_value_t = 50)]
    pub flips_per_second: usize,
    #[arg(long)]
    pub json: bool,
    /// The Python with Playwright installed.
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// The Chromium Playwright drives (never Playwright's own download).
    #[arg(long, default_value = "/usr/bin/chromium")]
    pub chromium: PathBuf,
    /// The browser script (default: loadtest/dashboard_perf.py of this source tree).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Server side only: no browser (for the smoke test).
    #[arg(long)]
    pub no_browser: bool,
    /// The `flotilla` binary (default: next to this one).
    #[arg(long)]
    pub flotilla: Option<PathBuf>,
    /// The browser opens a second control plane, started after the server-side reads
    /// and following every shard, that has never built a snapshot: the first dashboard
    /// after a start (or after more than a chunk of changes) waits for the build.
    #[arg(long)]
    pub cold: bool,
}

/// A child in its own process group: SIGTERM, then SIGKILL to the whole group, on drop.
/// Descendants that made groups of their own (Chromium does) are remembered whenever
/// [`GroupProc::watch`] runs and at drop (from /proc), and killed too.
pub(crate) struct GroupProc {
    child: Child,
    /// (pid, start time) of every descendant seen, so a reused pid is never hit.
    seen: Vec<(u32, u64)>,
}

impl GroupProc {
    fn new(child: Child) -> GroupProc {
        GroupProc { child, seen: Vec::new() }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Remembers the descendants alive now.
    fn watch(&mut self) {
        for d in descendants_of(self.child.id()) {
            if !self.seen.contains(&d) {
                self.seen.push(d);
            }
        }
    }
}

impl Drop for GroupProc {
    fn drop(&mut self) {
        self.watch();
        let pid = self.child.id() as i32;
        // SAFETY: signals to the process group we started and to its descendants.
        unsafe {
            libc::kill(-pid, libc::SIGTERM);
        }
        for _ in 0..60 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe {
            libc::kill(-pid, libc::SIGKILL);
        }
        for &(d, start) in &self.seen {
            if proc_stat(d).is_some_and(|(_, s)| s == start) {
                unsafe {
                    libc::kill(d as i32, libc::SIGKILL);
                }
            }
        }
        let _ = self.child.wait();
    }
}

/// A process's parent pid and start time (clock ticks since boot), from /proc.
fn proc_stat(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After "(comm)": state (index 0), ppid (1), ... starttime (field 22, index 19).
    let f: Vec<&str> = stat.rsplit(')').next()?.split_whitespace().collect();
    Some((f.get(1)?.parse().ok()?, f.get(19)?.parse().ok()?))
}

/// Every process whose parent chain leads to `root`, with its start time (empty
/// without /proc).
fn descendants_of(root: u32) -> Vec<(u32, u64)> {
    let mut all: Vec<(u32, u32, u64)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if let Some((ppid, start)) = proc_stat(pid) {
                all.push((pid, ppid, start));
            }
        }
    }
    let mut out: Vec<(u32, u64)> = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for &(c, pp, start) in &all {
            if pp == p && !out.iter().any(|(o, _)| *o == c) {
                out.push((c, start));
                frontier.push(c);
            }
        }
    }
    out
}

/// `flotilla control --print-addrs` following the shards; its address.
pub(crate) fn spawn_control(bin: &Path, data: &Data, shards: &[ShardProc]) -> anyhow::Result<(GroupProc, String)> {
    use std::os::unix::process::CommandExt;
    let aggregators: Vec<&str> = shards.iter().map(|s| s.addr.as_str()).collect();
    let mut child = Command::new(bin)
        .args(["control", "--listen", "127.0.0.1:0", "--print-addrs", "--rate-limit", "0"])
        .arg("--aggregators")
        .arg(aggregators.join(","))
        .arg("--grpc-token-file")
        .arg(data.dir.join("grpc-token"))
        .arg("--api-token-file")
        .arg(data.dir.join("api-token"))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {} control", bin.display()))?;
    let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let proc = GroupProc::new(child);
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    let v: Value = serde_json::from_str(&line).with_context(|| format!("control printed {line:?}"))?;
    let addr = v["addr"].as_str().ok_or_else(|| anyhow!("no addr in {line}"))?.to_string();
    Ok((proc, addr))
}

/// What one read of the stream's snapshot found.
struct Snapshot {
    nodes_total: u64,
    bytes: u64,
    nodes_messages: u64,
    /// Nodes in the `nodes` messages (each message's `id` column).
    nodes_sent: u64,
    first_byte: Duration,
    whole: Duration,
}

/// Reads `GET /v1/events` up to the end of its snapshot, counting bytes.
async fn read_snapshot(client: &reqwest::Client, addr: &str) -> anyhow::Result<Snapshot> {
    let t0 = Instant::now();
    let mut resp = client.get(format!("http://{addr}/v1/events")).send().await?.error_for_status()?;
    let mut first_byte = None;
    let (mut bytes, mut buf) = (0u64, Vec::<u8>::new());
    let mut nodes_total = None;
    let mut nodes_messages = 0;
    let mut nodes_sent = 0;
    while let Some(chunk) = resp.chunk().await? {
        first_byte.get_or_insert_with(|| t0.elapsed());
        bytes += chunk.len() as u64;
        buf.extend_from_slice(&chunk);
        // Whole messages end with a blank line.
        while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
            let msg: Vec<u8> = buf.drain(..end + 2).collect();
            let text = String::from_utf8_lossy(&msg);
            let event = text.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or("");
            let data = || -> Value {
                let data = text.lines().find_map(|l| l.strip_prefix("data: ")).unwrap_or("{}");
                serde_json::from_str(data).unwrap_or(Value::Null)
            };
            match event {
                "snapshot_begin" => nodes_total = data()["nodes_total"].as_u64(),
                "nodes" => {
                    nodes_messages += 1;
                    nodes_sent += data()["id"].as_array().map_or(0, |ids| ids.len() as u64);
                }
                "snapshot_end" => {
                    return Ok(Snapshot {
                        nodes_total: nodes_total.unwrap_or(0),
                        bytes,
                        nodes_messages,
                        nodes_sent,
                        first_byte: first_byte.unwrap_or_default(),
                        whole: t0.elapsed(),
                    });
                }
                _ => {}
            }
        }
    }
    Err(anyhow!("the events stream ended before snapshot_end"))
}

/// Waits (bounded) until the control plane follows every node, without asking for the
/// stream (whose snapshot it would build).
async fn wait_for_view(addr: &str, nodes: usize, within: Duration) -> anyhow::Result<()> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).build()?;
    let deadline = Instant::now() + within;
    loop {
        let shown: usize = match client.get(format!("http://{addr}/v1/shards")).send().await {
            Ok(r) => r
                .json::<Vec<Value>>()
                .await
                .map_or(0, |rows| rows.iter().filter_map(|r| r["nodes"].as_u64()).sum::<u64>() as usize),
            Err(_) => 0,
        };
        if shown >= nodes {
            return Ok(());
        }
        anyhow::ensure!(Instant::now() < deadline, "the second control plane shows {shown} of {nodes} nodes");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits (bounded) until the control plane's snapshot holds every node; returns that read.
async fn wait_for_all(addr: &str, nodes: usize, within: Duration) -> anyhow::Result<Snapshot> {
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build()?;
    let deadline = Instant::now() + within;
    loop {
        match read_snapshot(&client, addr).await {
            Ok(s) if s.nodes_total as usize >= nodes => return Ok(s),
            Ok(s) if Instant::now() > deadline => {
                return Err(anyhow!("the control plane shows {} of {nodes} nodes", s.nodes_total));
            }
            Err(e) if Instant::now() > deadline => return Err(e),
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

/// Runs the browser script (bounded); its last stdout line, parsed.
async fn run_browser(a: &DashboardArgs, addr: &str) -> anyhow::Result<Value> {
    use std::os::unix::process::CommandExt;
    let script = a.script.clone().unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboard_perf.py"));
    anyhow::ensure!(script.exists(), "{} not found (pass --script)", script.display());
    let out_file = std::env::temp_dir().join(format!("flotilla-dashboard-perf-{}.json", std::process::id()));
    let _ = std::fs::remove_file(&out_file);
    let child = Command::new(&a.python)
        .arg(&script)
        .args(["--url", &format!("http://{addr}"), "--nodes", &a.nodes.to_string()])
        .args(["--seconds", &a.seconds.to_string()])
        .arg("--chromium")
        .arg(&a.chromium)
        .arg("--out")
        .arg(&out_file)
        .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {} {}", a.python.display(), script.display()))?;
    let mut proc = GroupProc::new(child);
    let deadline = Instant::now() + Duration::from_secs(a.seconds + 240);
    let status = loop {
        proc.watch();
        if let Some(s) = proc.child.try_wait()? {
            break s;
        }
        anyhow::ensure!(Instant::now() < deadline, "the browser script ran past its time; stopped");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drop(proc);
    anyhow::ensure!(status.success(), "the browser script failed ({status})");
    let text = std::fs::read_to_string(&out_file).with_context(|| format!("reading {}", out_file.display()))?;
    let _ = std::fs::remove_file(&out_file);
    Ok(serde_json::from_str(&text)?)
}

pub async fn run(a: DashboardArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.nodes >= 1 && a.nodes <= 1_000_000, "--nodes must be within 1..=1000000");
    anyhow::ensure!(a.shards >= 1 && a.shards <= 64, "--shards must be within 1..=64");
    anyhow::ensure!(a.seconds >= 1 && a.seconds <= 3600, "--seconds must be within 1..=3600");
    let bin = flotilla_bin(a.flotilla.clone())?;
    println!("machine: {}", machine());
    // Every node heartbeats once a second from here to the end; some flip health.
    let mut cluster = Heartbeating::start(&bin, "dash", a.nodes, a.shards, a.flips_per_second).await?;
    let (data, shards, nodes) = (&cluster.data, &cluster.shards, cluster.nodes);

    let (control, addr) = spawn_control(&bin, data, shards)?;
    let rss_empty = proc_rss_bytes(control.pid()).unwrap_or(0);
    let snap = wait_for_all(&addr, nodes, Duration::from_secs(120)).await?;
    println!(
        "control at {addr}: snapshot of {} nodes, {} bytes in {} nodes messages, first byte {:.0} ms, whole {:.0} ms",
        snap.nodes_total,
        snap.bytes,
        snap.nodes_messages,
        snap.first_byte.as_secs_f64() * 1e3,
        snap.whole.as_secs_f64() * 1e3
    );
    // A second read: the first read's node chunks and the changes since (the usual case
    // for a browser, unless --cold).
    let snap2 = wait_for_all(&addr, nodes, Duration::from_secs(30)).await?;
    let fresh = if a.cold {
        let (c, fresh_addr) = spawn_control(&bin, data, shards)?;
        wait_for_view(&fresh_addr, nodes, Duration::from_secs(120)).await?;
        Some((c, fresh_addr))
    } else {
        None
    };
    let (watched, page_addr) = fresh.as_ref().map_or((&control, addr.as_str()), |(c, a)| (c, a.as_str()));

    let cpu0 = proc_cpu_seconds(watched.pid()).unwrap_or(0.0);
    let t0 = Instant::now();
    let browser = if a.no_browser {
        tokio::time::sleep(Duration::from_secs(a.seconds)).await;
        None
    } else {
        Some(run_browser(&a, page_addr).await?)
    };
    let window = t0.elapsed().as_secs_f64();
    let cpu = proc_cpu_seconds(watched.pid()).unwrap_or(0.0) - cpu0;
    let rss = proc_rss_bytes(watched.pid()).unwrap_or(0);
    cluster.stop();
    drop(fresh);
    drop(control);
    drop(cluster);

    let mb = |b: u64| (b as f64 / (1 << 20) as f64 * 10.0).round() / 10.0;
    let mut result = json!({
        "scenario": "dashboard",
        "nodes": nodes,
        "shards": a.shards,
        "seconds": a.seconds,
        "flips_per_second": a.flips_per_second,
        "cold": a.cold,
        "snapshot_bytes": snap.bytes,
        "snapshot_nodes_messages": snap.nodes_messages,
        "snapshot_nodes": snap.nodes_sent,
        "snapshot_server_first_byte_ms": (snap.first_byte.as_secs_f64() * 1e4).round() / 10.0,
        "snapshot_server_whole_ms": (snap.whole.as_secs_f64() * 1e4).round() / 10.0,
        "snapshot_server_whole_again_ms": (snap2.whole.as_secs_f64() * 1e4).round() / 10.0,
        "control_rss_mb": mb(rss),
        "control_rss_at_start_mb": mb(rss_empty),
        "control_cpu_seconds": (cpu * 100.0).round() / 100.0,
        "control_window_seconds": (window * 10.0).round() / 10.0,
    });
    if let Some(b) = &browser {
        if b["nodes_shown"].as_u64().unwrap_or(0) < nodes as u64 {
            eprintln!("warning: the page showed {} of {} nodes at its first paint", b["nodes_shown"], nodes);
        }
        if b["page_errors"].as_u64().unwrap_or(0) > 0 {
            eprintln!("warning: the page threw {} errors (see above)", b["page_errors"]);
        }
    }
    if let (Some(Value::Object(b)), Some(r)) = (browser, result.as_object_mut()) {
        for (k, v) in b {
            r.entry(k).or_insert(v);
        }
    }
    if a.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        println!("{}", serde_json::to_string_pretty(&result)?);
    }
    Ok(())
}
