//! `flotilla-loadtest routing`: open-loop HTTP load through a real `flotilla route` process
//! over capacity-limited backends, some of them slow. Three phases, each with a fresh proxy:
//! all backends healthy (the baseline), `--slow` backends `--slow-factor`× slower with the
//! flotilla balancer, and the same with plain round robin.
//!
//! - Open loop: request i is due at `start + i / rate` and its latency is measured from
//!   that moment, so queueing anywhere (including in this generator) is not hidden.
//! - A backend serves `--slots` requests at a time, each taking `--service-ms` (× the slow
//!   factor); the rest wait in its queue. Healthy capacity is
//!   `backends × slots × 1000 / service_ms`; the default rate is 60 % of it.
//! - The first `--warmup-s` seconds of each phase are sent but not measured.
//! - When `haproxy` is installed, a fourth phase runs HAProxy with `balance leastconn` over
//!   the same slow backends (docs/architecture.md §14 asks flotilla to beat it in the same run).

use flotilla_core::LockExt;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::common::{flotilla_bin, machine, pct_ms, proc_cpu_seconds};

#[derive(Debug, Args)]
pub struct RoutingArgs {
    #[arg(long, default_value_t = 10)]
    pub backends: usize,
    /// How many of them are slow.
    #[arg(long, default_value_t = 2)]
    pub slow: usize,
    #[arg(long, default_value_t = 5.0)]
    pub slow_factor: f64,
    /// Requests per second (default: 60 % of the healthy capacity).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Concurrent requests each backend serves; the rest queue.
    #[arg(long, default_value_t = 2)]
    pub slots: usize,
    /// Service time of a healthy backend.
    #[arg(long, default_value_t = 10.0)]
    pub service_ms: f64,
    /// Length of each phase.
    #[arg(long, default_value_t = 15)]
    pub seconds: u64,
    #[arg(long, default_value_t = 3)]
    pub warmup_s: u64,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub flotilla: Option<PathBuf>,
    /// The HAProxy binary for the leastconn comparison (default: `haproxy` on PATH, skipped
    /// when there is none).
    #[arg(long)]
    pub haproxy: Option<PathBuf>,
}

/// A capacity-limited backend: `slots` at a time, each for `service × factor`.
struct Backend {
    addr: SocketAddr,
    /// Slow factor × 1000.
    factor_milli: Arc<AtomicU64>,
    served: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn backend(slots: usize, service: Duration) -> anyhow::Result<Backend> {
    // The accept queue a real server asks for (nginx and HAProxy ask for more than the
    // default 128), so a burst of connections from the proxy under test is not dropped
    // here and charged to the proxy as a 1 s SYN retransmit.
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind("127.0.0.1:0".parse()?)?;
    let listener = socket.listen(4096)?;
    let addr = listener.local_addr()?;
    let factor_milli = Arc::new(AtomicU64::new(1000));
    let served = Arc::new(AtomicU64::new(0));
    let sem = Arc::new(tokio::sync::Semaphore::new(slots));
    let (f, s) = (factor_milli.clone(), served.clone());
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            let (sem, f, s) = (sem.clone(), f.clone(), s.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |_req| {
                    let (sem, f, s) = (sem.clone(), f.clone(), s.clone());
                    async move {
                        let _permit = sem.acquire().await;
                        let factor = f.load(Ordering::Relaxed) as f64 / 1000.0;
                        tokio::time::sleep(service.mul_f64(factor)).await;
                        s.fetch_add(1, Ordering::Relaxed);
                        Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from_static(b"ok"))))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    Ok(Backend { addr, factor_milli, served, task })
}

/// A `flotilla route` process; killed on drop.
struct Proxy {
    child: Child,
    listen: String,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn proxy(bin: &std::path::Path, backends: &[Backend], policy: &str) -> anyhow::Result<Proxy> {
    use std::io::BufRead;
    let list: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    let mut child = Command::new(bin)
        .args(["route", "--listen", "127.0.0.1:0", "--print-addrs", "--policy", policy, "--backends"])
        .arg(list.join(","))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting flotilla route")?;
    let mut line = String::new();
    let out = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    std::io::BufReader::new(out).read_line(&mut line)?;
    let v: serde_json::Value = serde_json::from_str(&line).with_context(|| format!("flotilla route said {line:?}"))?;
    let listen = v["listen"].as_str().ok_or_else(|| anyhow!("no listen address in {line:?}"))?.to_string();
    Ok(Proxy { child, listen })
}

fn find_haproxy(given: Option<PathBuf>) -> Option<PathBuf> {
    given.or_else(|| {
        std::env::var_os("PATH")?.to_str()?.split(':').map(|d| PathBuf::from(d).join("haproxy")).find(|p| p.exists())
    })
}

/// HAProxy in the foreground with `balance leastconn` over `backends`.
fn haproxy(bin: &std::path::Path, backends: &[Backend], dir: &std::path::Path) -> anyhow::Result<Proxy> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut cfg = format!(
        "global\n  maxconn 8000\ndefaults\n  mode http\n  timeout connect 2s\n  timeout client 60s\n  \
         timeout server 60s\nfrontend fe\n  bind 127.0.0.1:{port}\n  default_backend be\nbackend be\n  balance leastconn\n"
    );
    for (i, b) in backends.iter().enumerate() {
        cfg.push_str(&format!("  server b{i} {}\n", b.addr));
    }
    let path = dir.join("haproxy.cfg");
    std::fs::write(&path, cfg)?;
    let child = Command::new(bin)
        .arg("-db")
        .arg("-f")
        .arg(&path)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting haproxy")?;
    let listen = format!("127.0.0.1:{port}");
    let proxy = Proxy { child, listen };
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&proxy.listen).is_err() {
        anyhow::ensure!(Instant::now() < deadline, "haproxy did not listen on {}", proxy.listen);
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(proxy)
}

struct Phase {
    latency_us: Histogram<u64>,
    errors: u64,
    sent: u64,
    slow_share: f64,
    /// CPU (user + system) the proxy process used during the phase, from /proc.
    cpu_seconds: f64,
    /// Connections the kernel dropped from a full accept queue during the phase (any
    /// listener on the machine: `TcpExtListenOverflows`), the cause of 1 s SYN retransmits.
    listen_overflows: u64,
}

impl Phase {
    fn cpu_per_1000(&self) -> f64 {
        self.cpu_seconds * 1000.0 / self.sent.max(1) as f64
    }
}

/// `TcpExtListenOverflows` from /proc/net/netstat (0 where it cannot be read).
fn listen_overflows() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/net/netstat") else { return 0 };
    let mut lines = text.lines();
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if !names.starts_with("TcpExt:") {
            continue;
        }
        let found = names.split_whitespace().zip(values.split_whitespace()).find(|(n, _)| *n == "ListenOverflows");
        return found.and_then(|(_, v)| v.parse().ok()).unwrap_or(0);
    }
    0
}

/// Sends `rate` requests per second to `target` for `seconds`, open loop.
async fn run_phase(target: &str, rate: f64, seconds: u64, warmup_s: u64, backends: &[Backend], slow: usize) -> Phase {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let uri: hyper::Uri = format!("http://{target}/").parse().unwrap_or_default();
    let hist = Arc::new(std::sync::Mutex::new(Histogram::<u64>::new_with_bounds(1, 120_000_000, 3).ok()));
    let errors = Arc::new(AtomicU64::new(0));
    let served_before: Vec<u64> = backends.iter().map(|b| b.served.load(Ordering::Relaxed)).collect();
    let start = Instant::now() + Duration::from_millis(20);
    let measure_from = start + Duration::from_secs(warmup_s);
    let total = (rate * seconds as f64) as u64;
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut tasks = tokio::task::JoinSet::new();
    let mut i = 0u64;
    while i < total {
        let due = start + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        // Everything due by now goes out now, each timed from its own due time.
        let now = Instant::now();
        while i < total && start + interval.mul_f64(i as f64) <= now {
            let intended = start + interval.mul_f64(i as f64);
            let (client, uri, hist, errors) = (client.clone(), uri.clone(), hist.clone(), errors.clone());
            tasks.spawn(async move {
                let req = hyper::Request::get(uri).body(Empty::new());
                let ok = match req {
                    Ok(req) => match tokio::time::timeout(Duration::from_secs(30), client.request(req)).await {
                        Ok(Ok(resp)) => resp.status().is_success() && resp.into_body().collect().await.is_ok(),
                        _ => false,
                    },
                    Err(_) => false,
                };
                if !ok {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
                if intended >= measure_from {
                    let us = intended.elapsed().as_micros() as u64;
                    if let Some(h) = hist.lock_or_recover().as_mut() {
                        let _ = h.record(us.clamp(1, 120_000_000));
                    }
                }
            });
            i += 1;
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
    let served: Vec<u64> =
        backends.iter().zip(&served_before).map(|(b, before)| b.served.load(Ordering::Relaxed) - before).collect();
    let all: u64 = served.iter().sum();
    let slow_served: u64 = served.iter().take(slow).sum();
    let latency_us = hist
        .lock_or_recover()
        .take()
        .unwrap_or_else(|| Histogram::new(3).unwrap_or_else(|_| unreachable!("3 significant figures is valid")));
    Phase {
        latency_us,
        errors: errors.load(Ordering::Relaxed),
        sent: total,
        slow_share: slow_served as f64 / all.max(1) as f64,
        cpu_seconds: 0.0,
        listen_overflows: 0,
    }
}

pub async fn run(a: RoutingArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=200).contains(&a.backends), "--backends must be within 1..=200");
    anyhow::ensure!(a.slow < a.backends, "--slow must be below --backends");
    anyhow::ensure!(a.slow_factor >= 1.0 && a.slow_factor <= 1000.0, "--slow-factor must be within 1..=1000");
    anyhow::ensure!((1..=1000).contains(&a.slots), "--slots must be within 1..=1000");
    anyhow::ensure!(a.service_ms > 0.0 && a.service_ms <= 10_000.0, "--service-ms must be within (0, 10000]");
    anyhow::ensure!(a.seconds > a.warmup_s && a.seconds <= 3600, "--seconds must be above --warmup-s, at most 3600");
    let bin = flotilla_bin(a.flotilla.clone())?;
    let service = Duration::from_secs_f64(a.service_ms / 1000.0);
    let capacity = a.backends as f64 * a.slots as f64 * 1000.0 / a.service_ms;
    let rate = a.rate.unwrap_or(capacity * 0.6);
    anyhow::ensure!(rate > 0.0 && rate <= 50_000.0, "--rate must be within (0, 50000]");
    println!(
        "routing: {} backends ({} slots, {} ms each; {} of them {}x slow), healthy capacity {capacity:.0} req/s, \
         rate {rate:.0} req/s (60% of healthy capacity unless --rate), {} s per phase ({} s warm-up)",
        a.backends, a.slots, a.service_ms, a.slow, a.slow_factor, a.seconds, a.warmup_s
    );
    println!("machine: {}", machine());
    let mut backends = Vec::new();
    for _ in 0..a.backends {
        backends.push(backend(a.slots, service).await?);
    }
    let set_slow = |on: bool| {
        for b in backends.iter().take(a.slow) {
            let f = if on { (a.slow_factor * 1000.0) as u64 } else { 1000 };
            b.factor_milli.store(f, Ordering::Relaxed);
        }
    };
    let haproxy_bin = find_haproxy(a.haproxy.clone());
    let dir = std::env::temp_dir().join(format!("flotilla-loadtest-routing-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let mut phases = vec![("healthy", "p2c", false), ("flotilla", "p2c", true), ("round_robin", "round-robin", true)];
    match &haproxy_bin {
        Some(_) => phases.push(("haproxy_leastconn", "haproxy", true)),
        None => println!("haproxy is not installed: the leastconn comparison is skipped (--haproxy PATH)"),
    }
    let mut results = Vec::new();
    for (name, policy, slow) in phases {
        set_slow(slow);
        let p = match (policy, &haproxy_bin) {
            ("haproxy", Some(h)) => haproxy(h, &backends, &dir)?,
            _ => proxy(&bin, &backends, policy)?,
        };
        let cpu_before = proc_cpu_seconds(p.child.id()).unwrap_or(0.0);
        let overflows_before = listen_overflows();
        let mut phase = run_phase(&p.listen, rate, a.seconds, a.warmup_s, &backends, a.slow).await;
        phase.cpu_seconds = proc_cpu_seconds(p.child.id()).unwrap_or(0.0) - cpu_before;
        phase.listen_overflows = listen_overflows().saturating_sub(overflows_before);
        drop(p);
        println!(
            "{name:<12} p50 {:>8.2} ms  p99 {:>8.2} ms  p99.9 {:>8.2} ms  errors {}/{}  share served by slow backends {:.1}%  \
             proxy CPU {:.3} s per 1000 requests  listen overflows {}",
            pct_ms(&phase.latency_us, 0.5),
            pct_ms(&phase.latency_us, 0.99),
            pct_ms(&phase.latency_us, 0.999),
            phase.errors,
            phase.sent,
            phase.slow_share * 100.0,
            phase.cpu_per_1000(),
            phase.listen_overflows,
        );
        results.push((name, phase));
    }
    let get = |n: &str| results.iter().find(|(name, _)| *name == n).map(|(_, p)| p);
    let (Some(h), Some(f), Some(rr)) = (get("healthy"), get("flotilla"), get("round_robin")) else {
        anyhow::bail!("a phase is missing");
    };
    let _ = std::fs::remove_dir_all(&dir);
    let ratio = pct_ms(&f.latency_us, 0.99) / pct_ms(&h.latency_us, 0.99).max(1e-9);
    println!("flotilla p99 / all-healthy p99 = {ratio:.2} (target <= 1.3)");
    let hap = get("haproxy_leastconn");
    let hap_p = |q: f64| hap.map(|p| (pct_ms(&p.latency_us, q) * 1000.0).round() / 1000.0);
    if a.json {
        let r = |x: f64| (x * 1000.0).round() / 1000.0;
        println!(
            "{}",
            serde_json::json!({
                "rate": r(rate),
                "backends": a.backends,
                "slow": a.slow,
                "slow_factor": a.slow_factor,
                "healthy_p50_ms": r(pct_ms(&h.latency_us, 0.5)),
                "healthy_p99_ms": r(pct_ms(&h.latency_us, 0.99)),
                "healthy_p999_ms": r(pct_ms(&h.latency_us, 0.999)),
                "flotilla_p50_ms": r(pct_ms(&f.latency_us, 0.5)),
                "flotilla_p99_ms": r(pct_ms(&f.latency_us, 0.99)),
                "flotilla_p999_ms": r(pct_ms(&f.latency_us, 0.999)),
                "round_robin_p50_ms": r(pct_ms(&rr.latency_us, 0.5)),
                "round_robin_p99_ms": r(pct_ms(&rr.latency_us, 0.99)),
                "round_robin_p999_ms": r(pct_ms(&rr.latency_us, 0.999)),
                "flotilla_vs_healthy_p99": r(ratio),
                "haproxy_leastconn_p50_ms": hap_p(0.5),
                "haproxy_leastconn_p99_ms": hap_p(0.99),
                "haproxy_leastconn_p999_ms": hap_p(0.999),
                "flotilla_cpu_seconds_per_1000": r(f.cpu_per_1000()),
                "haproxy_cpu_seconds_per_1000": hap.map(|p| r(p.cpu_per_1000())),
                "flotilla_listen_overflows": f.listen_overflows,
                "haproxy_listen_overflows": hap.map(|p| p.listen_overflows),
                "flotilla_slow_share": r(f.slow_share),
                "round_robin_slow_share": r(rr.slow_share),
                "errors": h.errors + f.errors + rr.errors + hap.map(|p| p.errors).unwrap_or(0),
            })
        );
    }
    Ok(())
}
