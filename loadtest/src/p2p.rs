//! `flotilla-loadtest p2p`: one artifact to every host of a lab (network namespaces, as
//! root), each host's link shaped with htb to `--rate-mbit` both ways, the origin's too.
//! Three ways, in the same run: Flotilla's swarm (`flotilla artifact fetch` on each
//! host, the control plane as origin and tracker), every host reading the origin over
//! HTTP, and BitTorrent (Debian's aria2 and opentracker, seeded from the origin host).
//!
//! `makespan_seconds` is when the last host holds a verified copy; `ratio_to_limit` is
//! that over S ÷ R, the time one host needs at its own line rate; `origin_copies` is the
//! origin's egress over S. With `--fault`, one host serves corrupted pieces, or is
//! killed mid-transfer and started again, or the origin cuts reads off: every host must
//! still end verified.

mod torrent;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail, ensure};
use clap::{Args, ValueEnum};
use flotilla_artifact::Digest;
use flotilla_testkit::Lab;
use rand::{RngCore, SeedableRng};
use serde_json::{Value, json};

use crate::common::machine;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Fault {
    /// One host flips a byte of every piece it sends (it is banned by the others).
    CorruptPeer,
    /// One host is killed mid-transfer and started again (it resumes).
    KillPeer,
    /// The origin cuts 5 % of its reads off partway.
    DropOrigin,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Baselines {
    All,
    None,
    Http,
    Bittorrent,
}

#[derive(Debug, Args)]
pub struct P2pArgs {
    #[arg(long, default_value_t = 16)]
    pub hosts: usize,
    /// The artifact's size in MB (10^6 bytes), random bytes.
    #[arg(long, default_value_t = 128)]
    pub size_mb: u64,
    /// Every host's line rate (and the origin's), each way.
    #[arg(long, default_value_t = 100)]
    pub rate_mbit: u32,
    #[arg(long, value_enum, default_value_t = Baselines::All)]
    pub baselines: Baselines,
    #[arg(long, value_enum)]
    pub fault: Option<Fault>,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Give up on a distribution after this long.
    #[arg(long, default_value_t = 900)]
    pub timeout_seconds: u64,
    #[arg(long)]
    pub json: bool,
    /// Copy every process's log here at the end (the lab's own dir goes with it).
    #[arg(long)]
    pub logs: Option<PathBuf>,
    /// A flag for every swarm host's `flotilla artifact fetch` (repeatable; e.g.
    /// `--fetch-arg=--artifact-max-uploads=4`), to measure the agent's settings.
    #[arg(long, allow_hyphen_values = true)]
    pub fetch_arg: Vec<String>,
}

const ORIGIN: &str = "origin";
const API_TOKEN: &str = "p2p-api-token";
const JOIN_TOKEN: &str = "p2p-join-token";

/// One distribution's outcome.
struct Run {
    /// Seconds from the start until each host held a verified copy.
    done: Vec<f64>,
    verified: usize,
    origin_bytes: Option<f64>,
    /// The machine's CPUs busy over the run (0..1): where the time goes on 2 cores.
    cpu_busy: f64,
}

/// (busy, total) jiffies of every CPU so far, from /proc/stat.
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let nums: Vec<u64> =
        stat.lines().next().unwrap_or("").split_whitespace().skip(1).filter_map(|n| n.parse().ok()).collect();
    let total: u64 = nums.iter().sum();
    let idle = nums.get(3).copied().unwrap_or(0) + nums.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

fn busy_since(before: (u64, u64)) -> f64 {
    let now = cpu_jiffies();
    (now.0 - before.0) as f64 / ((now.1 - before.1).max(1)) as f64
}

impl Run {
    fn makespan(&self) -> f64 {
        self.done.iter().copied().fold(0.0, f64::max)
    }

    fn quantile(&self, q: f64) -> f64 {
        let mut d = self.done.clone();
        d.sort_by(f64::total_cmp);
        d.get(((d.len() as f64 * q).ceil() as usize).saturating_sub(1)).copied().unwrap_or(0.0)
    }
}

pub fn run(a: P2pArgs) -> anyhow::Result<()> {
    // SAFETY: geteuid has no memory effects.
    ensure!(unsafe { libc::geteuid() } == 0, "the lab makes network namespaces: run it as root");
    ensure!((2..=200).contains(&a.hosts), "--hosts: 2..=200");
    ensure!((1..=16_384).contains(&a.size_mb), "--size-mb: 1..=16384");
    ensure!((1..=10_000).contains(&a.rate_mbit), "--rate-mbit: 1..=10000");
    let names: Vec<String> =
        std::iter::once(ORIGIN.to_string()).chain((1..=a.hosts).map(|i| format!("h{i}"))).collect();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut lab = Lab::new("p2p", &refs);
    for n in &names {
        lab.shape(n, a.rate_mbit);
    }
    let dir = lab.dir().to_path_buf();
    let size = a.size_mb * 1_000_000;
    let mut data = vec![0u8; size as usize];
    rand::rngs::StdRng::seed_from_u64(a.seed).fill_bytes(&mut data);
    let digest = Digest::of(&data);
    let file = dir.join("artifact.bin");
    std::fs::write(&file, &data)?;
    drop(data);
    std::fs::write(dir.join("api-token"), API_TOKEN)?;
    std::fs::write(dir.join("join-token"), JOIN_TOKEN)?;
    let origin = lab.addr(ORIGIN);
    let api = format!("http://{origin}:7700");
    eprintln!("p2p: {} hosts, {} MB at {} Mbit/s ({})", a.hosts, a.size_mb, a.rate_mbit, machine());

    let drop = if a.fault == Some(Fault::DropOrigin) { "0.05" } else { "0" };
    let (api_tok, join_tok, arts) = (path(&dir, "api-token"), path(&dir, "join-token"), path(&dir, "origin-artifacts"));
    lab.spawn(
        ORIGIN,
        &[
            "control",
            "--listen",
            &format!("{origin}:7700"),
            "--aggregators",
            "127.0.0.1:9",
            "--api-token-file",
            &api_tok,
            "--artifacts-dir",
            &arts,
            "--join-token-file",
            &join_tok,
            "--test-origin-drop",
            drop,
        ],
        "control.log",
    );
    let push_at = Instant::now();
    let pushed = loop {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &lab.host(ORIGIN).ns])
            .arg(flotilla_testkit::bin("flotilla"))
            .args(["artifact", "push", "--addr", &api, "--token", API_TOKEN])
            .arg(&file)
            .output()?;
        if out.status.success() {
            break String::from_utf8_lossy(&out.stdout).trim().to_string();
        }
        ensure!(push_at.elapsed() < Duration::from_secs(30), "push: {}", String::from_utf8_lossy(&out.stderr));
        std::thread::sleep(Duration::from_millis(200));
    };
    ensure!(pushed == format!("flotilla://{digest}"), "pushed as {pushed}");

    let timeout = Duration::from_secs(a.timeout_seconds);
    let swarm = fetch_run(&mut lab, &a, &api, &digest, timeout, true)?;
    eprintln!(
        "p2p: swarm makespan {:.1} s, {}/{} verified, CPUs {:.0} % busy",
        swarm.makespan(),
        swarm.verified,
        a.hosts,
        swarm.cpu_busy * 100.0
    );
    let http = match a.baselines {
        Baselines::All | Baselines::Http => {
            let r = fetch_run(&mut lab, &a, &api, &digest, timeout, false)?;
            eprintln!("p2p: HTTP makespan {:.1} s", r.makespan());
            Some(r)
        }
        _ => None,
    };
    let bt = match a.baselines {
        Baselines::All | Baselines::Bittorrent => Some(bittorrent_run(&mut lab, &a, &file, &digest, timeout)?),
        _ => None,
    };
    let limit = (size * 8) as f64 / (f64::from(a.rate_mbit) * 1e6);
    let copies = |r: &Run| r.origin_bytes.map(|b| b / size as f64);
    let report = json!({
        "hosts": a.hosts,
        "size_mb": a.size_mb,
        "rate_mbit": a.rate_mbit,
        "fault": a.fault.map(|f| format!("{f:?}")),
        "limit_seconds": limit,
        "makespan_seconds": swarm.makespan(),
        "ratio_to_limit": swarm.makespan() / limit,
        "origin_copies": copies(&swarm),
        "verified_hosts": swarm.verified,
        "p50_seconds": swarm.quantile(0.5),
        "p99_seconds": swarm.quantile(0.99),
        "cpu_busy": swarm.cpu_busy,
        "http_cpu_busy": http.as_ref().map(|r| r.cpu_busy),
        "bittorrent_cpu_busy": bt.as_ref().map(|r| r.cpu_busy),
        "http_makespan_seconds": http.as_ref().map(Run::makespan),
        "http_verified_hosts": http.as_ref().map(|r| r.verified),
        "bittorrent_makespan_seconds": bt.as_ref().map(Run::makespan),
        "bittorrent_verified_hosts": bt.as_ref().map(|r| r.verified),
        "bittorrent_p50_seconds": bt.as_ref().map(|r| r.quantile(0.5)),
        "machine": machine(),
    });
    println!(
        "p2p {} hosts, {} MB at {} Mbit/s: makespan {:.1} s ({:.2}x the {:.1} s line-rate limit), origin {:.2} copies, p50 {:.1} s, {} verified; http {}; bittorrent {}",
        a.hosts,
        a.size_mb,
        a.rate_mbit,
        swarm.makespan(),
        swarm.makespan() / limit,
        limit,
        copies(&swarm).unwrap_or(f64::NAN),
        swarm.quantile(0.5),
        swarm.verified,
        http.as_ref().map_or("skipped".into(), |r| format!("{:.1} s", r.makespan())),
        bt.as_ref().map_or("skipped".into(), |r| format!("{:.1} s", r.makespan())),
    );
    if a.json {
        println!("{report}");
    }
    if let Some(to) = &a.logs {
        std::fs::create_dir_all(to)?;
        for e in std::fs::read_dir(lab.dir())?.flatten().filter(|e| e.file_name().to_string_lossy().ends_with(".log")) {
            std::fs::copy(e.path(), to.join(e.file_name()))?;
        }
    }
    ensure!(swarm.verified == a.hosts, "{} of {} hosts verified", swarm.verified, a.hosts);
    Ok(())
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

fn now_unix() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// Whether `file` holds exactly the artifact.
fn verified(file: &Path, digest: &Digest) -> bool {
    let Ok(mut f) = std::fs::File::open(file) else { return false };
    let mut h = flotilla_artifact::digest::Hasher::default();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match std::io::Read::read(&mut f, &mut buf) {
            Ok(0) => return h.finish() == *digest,
            Ok(n) => h.update(&buf[..n]),
            Err(_) => return false,
        }
    }
}

/// The origin's egress so far, from its metrics (asked from inside the origin host).
fn origin_bytes(lab: &Lab, api: &str) -> Option<f64> {
    let addr = api.trim_start_matches("http://").to_string();
    let page = lab.inside(ORIGIN, || flotilla_testkit::metrics_page(&addr));
    flotilla_testkit::metric(&page, "flotilla_origin_bytes_total", "")
}

/// Waits for `done(i)` (seconds since the start, once host i is done) for every host.
fn wait_all(
    hosts: usize,
    timeout: Duration,
    what: &str,
    mut done: impl FnMut(usize) -> Option<f64>,
) -> anyhow::Result<Vec<f64>> {
    let start = Instant::now();
    let mut out: Vec<Option<f64>> = vec![None; hosts];
    loop {
        for (i, d) in out.iter_mut().enumerate() {
            if d.is_none() {
                *d = done(i);
            }
        }
        if out.iter().all(Option::is_some) {
            return Ok(out.into_iter().flatten().collect());
        }
        if start.elapsed() > timeout {
            bail!("{what}: {} of {hosts} hosts done after {timeout:?}", out.iter().flatten().count());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn fetch_args(
    a: &P2pArgs,
    lab: &Lab,
    dir: &Path,
    i: usize,
    source: &str,
    digest: &Digest,
    swarm: Option<&str>,
) -> Vec<String> {
    let host = format!("h{i}");
    let mut args: Vec<String> = vec![
        "artifact".into(),
        "fetch".into(),
        source.into(),
        "--sha256".into(),
        digest.hex(),
        "--data".into(),
        path(dir, &host),
        "--node-id".into(),
        host.clone(),
        "--advertise".into(),
        lab.addr(&host).to_string(),
        "--report".into(),
        path(dir, &format!("{host}.json")),
        "--peer-port".into(),
        "7800".into(),
    ];
    if let Some(api) = swarm {
        args.extend(["--control-plane".into(), api.into(), "--join-token-file".into(), path(lab.dir(), "join-token")]);
        args.extend(a.fetch_arg.iter().cloned());
    }
    if a.fault == Some(Fault::CorruptPeer) && i == 1 && swarm.is_some() {
        args.push("--test-corrupt-uploads".into());
    }
    args
}

/// Every host runs `flotilla artifact fetch` at once: with the swarm (the agent's cache,
/// tracker and peers: `swarm` true), or reading the whole from the origin over HTTP alone.
fn fetch_run(
    lab: &mut Lab,
    a: &P2pArgs,
    api: &str,
    digest: &Digest,
    timeout: Duration,
    swarm: bool,
) -> anyhow::Result<Run> {
    let (name, source, tracker) = match swarm {
        true => ("swarm", format!("flotilla://{digest}"), Some(api)),
        false => ("http", format!("{api}/v1/artifacts/{digest}"), None),
    };
    let dir = lab.dir().join(name);
    std::fs::create_dir_all(&dir)?;
    let before = origin_bytes(lab, api).unwrap_or(0.0);
    let cpu = cpu_jiffies();
    let t0 = now_unix();
    let (mut pids, mut started) = (Vec::new(), Vec::new());
    for i in 1..=a.hosts {
        let args = fetch_args(a, lab, &dir, i, &source, digest, tracker);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        started.push(now_unix() - t0);
        pids.push(lab.spawn(&format!("h{i}"), &refs, &format!("{name}-h{i}.log")));
    }
    if swarm && a.fault == Some(Fault::KillPeer) {
        // Kill h2 once it holds a third of the pieces, and start it again: it resumes.
        let have = dir.join("h2/artifacts").join(digest.hex()).join("have");
        let pieces = (a.size_mb * 1_000_000).div_ceil(1 << 20) as u32;
        wait_all(1, timeout, "h2 holding a third of the pieces", |_| {
            if have.with_file_name("blob").exists() {
                eprintln!("p2p: h2 was done before it could be killed");
                return Some(0.0);
            }
            let held =
                flotilla_artifact::Bitfield::from_hex(std::fs::read_to_string(&have).ok()?.trim(), pieces).ok()?;
            (held.count() * 3 >= pieces).then_some(0.0)
        })?;
        flotilla_testkit::signal(pids[1] as i32, libc::SIGKILL);
        let _ = std::fs::remove_file(dir.join("h2.json"));
        std::thread::sleep(Duration::from_millis(200));
        let args = fetch_args(a, lab, &dir, 2, &source, digest, tracker);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        started[1] = now_unix() - t0;
        pids[1] = lab.spawn("h2", &refs, &format!("{name}-h2-again.log"));
    }
    let report = |i: usize| std::fs::read_to_string(dir.join(format!("h{i}.json"))).unwrap_or_default();
    let done = wait_all(a.hosts, timeout, name, |i| {
        let r: Value = serde_json::from_str(&report(i + 1)).ok()?;
        Some(started[i] + r["seconds"].as_f64()?)
    })?;
    for i in 1..=a.hosts {
        eprintln!("  {name} h{i}: {}", report(i).trim());
    }
    let origin = origin_bytes(lab, api).map(|b| b - before);
    for p in &pids {
        flotilla_testkit::signal(*p as i32, libc::SIGTERM);
    }
    let verified = (1..=a.hosts)
        .filter(|i| verified(&dir.join(format!("h{i}")).join("artifacts").join(digest.hex()).join("blob"), digest))
        .count();
    Ok(Run { done, verified, origin_bytes: origin, cpu_busy: busy_since(cpu) })
}

/// aria2 on every host, opentracker and an aria2 seeder on the origin host.
fn bittorrent_run(lab: &mut Lab, a: &P2pArgs, file: &Path, digest: &Digest, timeout: Duration) -> anyhow::Result<Run> {
    let dir = lab.dir().join("bt");
    std::fs::create_dir_all(dir.join("seed"))?;
    let origin = lab.addr(ORIGIN);
    let tracker = format!("http://{origin}:6969/announce");
    let data = std::fs::read(file)?;
    let (t, info_hash) = torrent::torrent("artifact.bin", &data, 1 << 20, &tracker);
    drop(data);
    let tfile = dir.join("artifact.torrent");
    std::fs::write(&tfile, t)?;
    std::fs::hard_link(file, dir.join("seed/artifact.bin"))
        .or_else(|_| std::fs::copy(file, dir.join("seed/artifact.bin")).map(|_| ()))?;
    // Debian's opentracker tracks only whitelisted torrents.
    std::fs::write(dir.join("whitelist"), format!("{info_hash}\n"))?;
    let hook = dir.join("done.sh");
    std::fs::write(&hook, "#!/bin/sh\ndate +%s.%N > \"$3.done\"\n")?;
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let ot = which("opentracker")?;
    let aria = which("aria2c")?;
    let ip = origin.to_string();
    // It drops root for `nobody`, then chroots to `-d`: the whitelist is named inside it.
    lab.spawn_program(
        ORIGIN,
        &ot,
        &["-i", &ip, "-p", "6969", "-P", "6969", "-w", "/whitelist", "-d", &path(&dir, ""), "-u", "nobody"],
        "opentracker.log",
    );
    let common = |d: &str| -> Vec<String> {
        [
            &format!("--dir={d}"),
            "--enable-dht=false",
            "--enable-dht6=false",
            "--bt-enable-lpd=false",
            "--enable-peer-exchange=true",
            "--seed-ratio=0.0",
            "--seed-time=600",
            "--bt-tracker-interval=2",
            "--file-allocation=none",
            "--console-log-level=warn",
            "--summary-interval=0",
            "--bt-max-peers=55",
            "--listen-port=6881-6889",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let mut seed = common(&path(&dir, "seed"));
    seed.extend(["--check-integrity=true".into(), "--bt-seed-unverified=true".into(), path(&dir, "artifact.torrent")]);
    let refs: Vec<&str> = seed.iter().map(String::as_str).collect();
    let seeder = lab.spawn_program(ORIGIN, &aria, &refs, "aria2-seed.log");
    // The seeder must be announced before the hosts ask the tracker.
    let scrape = format!("/scrape?info_hash={}", urlencode_hex(&info_hash));
    let announced = Instant::now();
    loop {
        let addr = format!("{origin}:6969");
        // opentracker answers HTTP/1.0, which testkit's client does not take.
        let page = lab.inside(ORIGIN, || http10_get(&addr, &scrape)).unwrap_or_default();
        if page.contains("8:completei1e") {
            break;
        }
        ensure!(
            announced.elapsed() < Duration::from_secs(60),
            "the aria2 seeder never announced: {page:?}\n{}\n{}",
            lab.log("aria2-seed.log"),
            lab.log("opentracker.log")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let cpu = cpu_jiffies();
    let t0 = now_unix();
    let mut pids = vec![seeder];
    for i in 1..=a.hosts {
        let host = format!("h{i}");
        let mut args = common(&path(&dir, &host));
        args.extend([format!("--on-bt-download-complete={}", hook.display()), path(&dir, "artifact.torrent")]);
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        pids.push(lab.spawn_program(&host, &aria, &refs, &format!("aria2-{host}.log")));
    }
    let done = wait_all(a.hosts, timeout, "the BitTorrent baseline", |i| {
        let text = std::fs::read_to_string(dir.join(format!("h{}/artifact.bin.done", i + 1))).ok()?;
        text.trim().parse::<f64>().ok().map(|t| t - t0)
    })?;
    for p in &pids {
        flotilla_testkit::signal(*p as i32, libc::SIGTERM);
    }
    let verified = (1..=a.hosts).filter(|i| verified(&dir.join(format!("h{i}/artifact.bin")), digest)).count();
    eprintln!("p2p: BitTorrent makespan {:.1} s", done.iter().copied().fold(0.0, f64::max));
    Ok(Run { done, verified, origin_bytes: None, cpu_busy: busy_since(cpu) })
}

/// A GET for servers that answer HTTP/1.0 (opentracker); the whole answer, if any.
fn http10_get(addr: &str, target: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(format!("GET {target} HTTP/1.0\r\n\r\n").as_bytes()).ok()?;
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    Some(String::from_utf8_lossy(&out).to_string())
}

fn which(program: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} is not installed (Debian: apt-get install aria2 opentracker)"))
}

/// A hex info hash as the tracker's URL wants it: every byte %-escaped.
fn urlencode_hex(hex: &str) -> String {
    hex.as_bytes().chunks(2).map(|p| format!("%{}", String::from_utf8_lossy(p))).collect()
}
