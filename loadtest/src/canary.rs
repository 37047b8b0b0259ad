//! `flotilla-loadtest canary`: progressive delivery under the routing loadtest's traffic.
//! Real agents under `flotilla up` run an echo app (`--units` heads, each answering after
//! `--delay-ms`), a real `flotilla route --app echo` fronts it, and an open-loop generator
//! sends `--rate` requests a second through it the whole time. Phases:
//!
//! 1. **baseline**: no rollout (the p99 the good version is compared with);
//! 2. **bad**: a version that answers 20 % of its requests with 500 is applied as a canary
//!    (steps 5 %, 25 %, 50 %, 100 %): the time from its first step to the revert, and the
//!    share of all requests that failed from the apply to the revert;
//! 3. **slow**: a version 3× slower: rolled back on `max_p99_ratio`;
//! 4. **good**: a version that changes nothing the client sees, promoted through every
//!    step: its p99 over the whole rollout against the baseline's.
//!
//! Latency is measured from each request's due time (open loop), so queueing anywhere is
//! not hidden.

use flotilla_core::LockExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use bytes::Bytes;
use clap::Args;
use hdrhistogram::Histogram;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

use crate::common::{UpProc, flotilla_bin, machine, pct_ms, until};

#[derive(Debug, Args)]
pub struct CanaryArgs {
    /// Requests per second through the proxy, the whole run.
    #[arg(long, default_value_t = 4000.0)]
    pub rate: f64,
    #[arg(long, default_value_t = 4)]
    pub units: u32,
    #[arg(long, default_value_t = 4)]
    pub agents: usize,
    /// Each answer's delay in the stable version (the slow one's is 3×).
    #[arg(long, default_value_t = 5)]
    pub delay_ms: u64,
    /// The canary's `step_interval`, in seconds.
    #[arg(long, default_value_t = 10)]
    pub step_interval_s: u64,
    /// The analysis' `min_requests`.
    #[arg(long, default_value_t = 200)]
    pub min_requests: u64,
    /// The analysis' `max_p99_ratio`.
    #[arg(long, default_value_t = 1.5)]
    pub max_p99_ratio: f64,
    /// Length of the baseline phase, in seconds.
    #[arg(long, default_value_t = 30)]
    pub baseline_s: u64,
    #[arg(long)]
    pub json: bool,
    #[arg(long)]
    pub flotilla: Option<PathBuf>,
}

/// Phases requests are counted under (their index); `IDLE` is not counted.
const IDLE: usize = 0;
const PHASES: [&str; 5] = ["idle", "baseline", "bad", "slow", "good"];

/// What the generator measured per phase.
struct Tally {
    latency_us: Vec<std::sync::Mutex<Histogram<u64>>>,
    errors: Vec<AtomicU64>,
    sent: Vec<AtomicU64>,
}

impl Tally {
    fn new() -> anyhow::Result<Tally> {
        let mut latency_us = Vec::new();
        for _ in PHASES {
            latency_us.push(std::sync::Mutex::new(Histogram::new_with_bounds(1, 120_000_000, 3)?));
        }
        Ok(Tally {
            latency_us,
            errors: PHASES.iter().map(|_| AtomicU64::new(0)).collect(),
            sent: PHASES.iter().map(|_| AtomicU64::new(0)).collect(),
        })
    }

    fn p(&self, phase: usize, q: f64) -> f64 {
        pct_ms(&self.latency_us[phase].lock_or_recover(), q)
    }

    fn failed_share(&self, phase: usize) -> f64 {
        self.errors[phase].load(Ordering::Relaxed) as f64 / self.sent[phase].load(Ordering::Relaxed).max(1) as f64
    }
}

/// Sends `rate` requests a second to `target` until `stop`, each counted under the phase
/// in force when it was due.
async fn generate(target: String, rate: f64, phase: Arc<AtomicUsize>, tally: Arc<Tally>, stop: Arc<AtomicUsize>) {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(4096)
        .build(hyper_util::client::legacy::connect::HttpConnector::new());
    let uri: hyper::Uri = format!("http://{target}/").parse().unwrap_or_default();
    let start = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let mut tasks = tokio::task::JoinSet::new();
    let mut i = 0u64;
    while stop.load(Ordering::Relaxed) == 0 {
        tokio::time::sleep_until((start + interval.mul_f64(i as f64)).into()).await;
        let now = Instant::now();
        while start + interval.mul_f64(i as f64) <= now {
            let intended = start + interval.mul_f64(i as f64);
            let p = phase.load(Ordering::Relaxed);
            let (client, uri, tally) = (client.clone(), uri.clone(), tally.clone());
            tasks.spawn(async move {
                let ok = match hyper::Request::get(uri).body(Empty::new()) {
                    Ok(req) => match tokio::time::timeout(Duration::from_secs(30), client.request(req)).await {
                        Ok(Ok(resp)) => resp.status().is_success() && resp.into_body().collect().await.is_ok(),
                        _ => false,
                    },
                    Err(_) => false,
                };
                if p == IDLE {
                    return;
                }
                tally.sent[p].fetch_add(1, Ordering::Relaxed);
                if !ok {
                    tally.errors[p].fetch_add(1, Ordering::Relaxed);
                }
                let us = intended.elapsed().as_micros() as u64;
                let _ = tally.latency_us[p].lock_or_recover().record(us.clamp(1, 120_000_000));
            });
            i += 1;
        }
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// The app's spec: one head per unit running `echo-server` answering after `delay_ms`
/// with `args`, rolled as a canary.
fn spec(a: &CanaryArgs, delay_ms: u64, args: &str, memory: &str) -> String {
    format!(
        "name = \"echo\"\n\n[unit.head]\ncommand = \"flotilla\"\nargs = [\"echo-server\", \"--delay\", \"{delay_ms}ms\"{args}]\n\
         cpu = \"250m\"\nmemory = \"{memory}\"\nserves_http = true\nreadiness_path = \"/healthz\"\n\n\
         [constraints]\nallow_low_priority = true\n\n[units]\nmin = 1\nmax = {}\ninitial = {}\n\n\
         [routing]\nroles = [\"head\"]\n\n[rollout]\nstrategy = \"canary\"\nsteps = [\"5%\", \"25%\", \"50%\", \"100%\"]\n\
         step_interval = \"{}s\"\nprogress_deadline = \"2m\"\n\n\
         [rollout.analysis]\nmax_error_rate = 0.05\nmax_p99_ratio = {}\nmin_requests = {}\n",
        a.units * 2,
        a.units,
        a.step_interval_s,
        a.max_p99_ratio,
        a.min_requests
    )
}

/// `flotilla route --app echo`; killed on drop.
struct Proxy(Child);

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn proxy(bin: &Path, addr: &str, data: &Path) -> anyhow::Result<(Proxy, String)> {
    use std::io::BufRead;
    let mut child = Command::new(bin)
        .args(["route", "--app", "echo", "--listen", "127.0.0.1:0", "--print-addrs"])
        .env("FLOTILLA_ADDR", addr)
        // Its traffic reports carry the cluster's API token (DATA/api-token).
        .env("FLOTILLA_DATA", data)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("starting flotilla route")?;
    let out = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
    let proxy = Proxy(child);
    let mut line = String::new();
    std::io::BufReader::new(out).read_line(&mut line)?;
    let v: Value = serde_json::from_str(&line).with_context(|| format!("flotilla route said {line:?}"))?;
    let listen = v["listen"].as_str().ok_or_else(|| anyhow!("no listen address in {line:?}"))?.to_string();
    Ok((proxy, listen))
}

struct Api {
    http: reqwest::Client,
    addr: String,
    token: String,
}

impl Api {
    async fn get(&self, path: &str) -> Option<Value> {
        let resp = self.http.get(format!("{}{path}", self.addr)).timeout(Duration::from_secs(5)).send().await.ok()?;
        resp.json().await.ok()
    }

    async fn apply(&self, spec: String) -> anyhow::Result<()> {
        let resp = self
            .http
            .put(format!("{}/v1/apps/echo/spec", self.addr))
            .bearer_auth(&self.token)
            .header("content-type", "text/plain")
            .body(spec)
            .send()
            .await?;
        anyhow::ensure!(
            resp.status().is_success(),
            "apply: {} {}",
            resp.status(),
            resp.text().await.unwrap_or_default()
        );
        Ok(())
    }

    async fn running(&self) -> usize {
        let units = self.get("/v1/apps/echo/units").await.and_then(|v| v.as_array().cloned()).unwrap_or_default();
        units.iter().filter(|u| u["state"] == "running").count()
    }
}

/// How one rollout went: seconds from the apply (and from its first step) to its end.
struct Outcome {
    seconds: f64,
    from_first_step_s: Option<f64>,
    end: String,
}

/// Applies `spec` and waits until its canary is reverted or complete.
async fn roll(api: &Api, spec: String, limit: Duration) -> anyhow::Result<Outcome> {
    let before = api.get("/v1/apps/echo").await.ok_or_else(|| anyhow!("no app"))?;
    let t0 = Instant::now();
    api.apply(spec).await?;
    let mut first_step: Option<Instant> = None;
    loop {
        anyhow::ensure!(t0.elapsed() < limit, "the rollout did not end within {limit:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let Some(r) = api.get("/v1/apps/echo/rollout").await else { continue };
        if first_step.is_none() && r["canary"]["step_started_unix_ms"].is_u64() {
            first_step = Some(Instant::now());
        }
        let Some(app) = api.get("/v1/apps/echo").await else { continue };
        let reverted = app["spec"]["source"] == "revert" && app["spec"]["at_unix_ms"] != before["spec"]["at_unix_ms"];
        let complete = app["rollout"]["state"] == "complete" && app["spec"]["source"] == "api";
        // Failed without a revert: a replacement that never ran (the progress deadline).
        let failed = app["rollout"]["state"] == "failed";
        if reverted || complete || failed {
            let end = match (reverted, complete) {
                (true, _) => app["spec"]["reason"].as_str().unwrap_or("reverted").to_string(),
                (_, true) => "promoted".into(),
                _ => format!("failed: {}", app["rollout"]["reason"].as_str().unwrap_or("")),
            };
            return Ok(Outcome {
                seconds: t0.elapsed().as_secs_f64(),
                from_first_step_s: first_step.map(|t| t.elapsed().as_secs_f64()),
                end,
            });
        }
    }
}

pub async fn run(a: CanaryArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.rate > 0.0 && a.rate <= 50_000.0, "--rate must be within (0, 50000]");
    anyhow::ensure!((1..=32).contains(&a.units), "--units must be within 1..=32");
    anyhow::ensure!((1..=64).contains(&a.agents), "--agents must be within 1..=64");
    anyhow::ensure!((1..=1000).contains(&a.delay_ms), "--delay-ms must be within 1..=1000");
    anyhow::ensure!((1..=600).contains(&a.step_interval_s), "--step-interval-s must be within 1..=600");
    anyhow::ensure!((5..=3600).contains(&a.baseline_s), "--baseline-s must be within 5..=3600");
    anyhow::ensure!((1..=1_000_000).contains(&a.min_requests), "--min-requests must be within 1..=1000000");
    anyhow::ensure!(a.max_p99_ratio > 1.0 && a.max_p99_ratio <= 100.0, "--max-p99-ratio must be within (1, 100]");
    let bin = flotilla_bin(a.flotilla.clone())?;
    let dir = std::env::temp_dir().join(format!("flotilla-loadtest-canary-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let app = dir.join("echo.toml");
    std::fs::write(&app, spec(&a, a.delay_ms, "", "64Mi"))?;
    println!("machine: {}", machine());
    println!(
        "canary: {} units of echo-server (--delay {} ms) on {} agents behind flotilla route, {} req/s open loop; \
         steps 5%, 25%, 50%, 100% every {} s; max_error_rate 5%, max_p99_ratio {}, min_requests {}",
        a.units, a.delay_ms, a.agents, a.rate, a.step_interval_s, a.max_p99_ratio, a.min_requests
    );
    let up = UpProc::start(&bin, &dir, a.agents, &[], Some(&app))?;
    let addr = up.addr().await?;
    let token = std::fs::read_to_string(dir.join("api-token"))?.trim().to_string();
    let api = Api { http: reqwest::Client::new(), addr: addr.clone(), token };
    until("every unit running", Duration::from_secs(90), async || {
        (api.running().await == a.units as usize).then_some(())
    })
    .await?;
    let (_proxy, listen) = proxy(&bin, &addr, &dir)?;
    until("the proxy routing", Duration::from_secs(30), async || {
        tokio::net::TcpStream::connect(&listen).await.ok().map(|_| ())
    })
    .await?;

    let phase = Arc::new(AtomicUsize::new(IDLE));
    let stop = Arc::new(AtomicUsize::new(0));
    let tally = Arc::new(Tally::new()?);
    let load = tokio::spawn(generate(listen.clone(), a.rate, phase.clone(), tally.clone(), stop.clone()));
    tokio::time::sleep(Duration::from_secs(5)).await;
    phase.store(1, Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(a.baseline_s)).await;

    let limit = Duration::from_secs(a.step_interval_s * 8 + 180);
    let mut outcomes = Vec::new();
    let (delay, bad) = (a.delay_ms, ", \"--error-rate\", \"0.2\"");
    for (p, delay, args, memory) in [(2, delay, bad, "64Mi"), (3, delay * 3, "", "64Mi"), (4, delay, "", "72Mi")] {
        phase.store(p, Ordering::Relaxed);
        let o = roll(&api, spec(&a, delay, args, memory), limit).await?;
        phase.store(IDLE, Ordering::Relaxed);
        println!(
            "{:<5} ended after {:>6.1} s ({} s from its first step): {}; p50 {:.2} ms, p99 {:.2} ms, {:.3} % of {} requests failed",
            PHASES[p],
            o.seconds,
            o.from_first_step_s.map_or("-".into(), |s| format!("{s:.1}")),
            o.end,
            tally.p(p, 0.5),
            tally.p(p, 0.99),
            tally.failed_share(p) * 100.0,
            tally.sent[p].load(Ordering::Relaxed)
        );
        outcomes.push((p, o));
        // The released units leave the routes before the next version starts.
        until("the units settle", Duration::from_secs(60), async || {
            (api.running().await == a.units as usize).then_some(())
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
    }
    stop.store(1, Ordering::Relaxed);
    let _ = load.await;
    let base_p99 = tally.p(1, 0.99);
    println!(
        "baseline p50 {:.2} ms, p99 {:.2} ms, {:.3} % failed; good-version p99 / baseline p99 = {:.2} (target <= 1.2)",
        tally.p(1, 0.5),
        base_p99,
        tally.failed_share(1) * 100.0,
        tally.p(4, 0.99) / base_p99.max(1e-9)
    );
    if a.json {
        let r = |x: f64| (x * 1000.0).round() / 1000.0;
        let mut out = json!({
            "rate": a.rate, "units": a.units, "step_interval_s": a.step_interval_s,
            "baseline_p50_ms": r(tally.p(1, 0.5)), "baseline_p99_ms": r(base_p99),
            "good_vs_baseline_p99": r(tally.p(4, 0.99) / base_p99.max(1e-9)),
        });
        for (p, o) in &outcomes {
            let name = PHASES[*p];
            out[name] = json!({
                "seconds": r(o.seconds),
                "from_first_step_s": o.from_first_step_s.map(r),
                "end": o.end,
                "p50_ms": r(tally.p(*p, 0.5)),
                "p99_ms": r(tally.p(*p, 0.99)),
                "failed_share": (tally.failed_share(*p) * 1e5).round() / 1e5,
                "requests": tally.sent[*p].load(Ordering::Relaxed),
            });
        }
        println!("{out}");
    }
    Ok(())
}
