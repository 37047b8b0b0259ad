//! What every scenario needs: shard processes, /proc readings, /metrics scraping.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, anyhow};
use serde_json::Value;

/// The `flotilla` binary next to this one, unless given.
pub fn flotilla_bin(given: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p);
    }
    let me = std::env::current_exe()?;
    let p = me.with_file_name("flotilla");
    anyhow::ensure!(p.exists(), "{} not found; build it (cargo build --release) or pass --flotilla", p.display());
    Ok(p)
}

/// A fresh data dir with a join token, a gRPC token, a shard secret and TLS material.
pub struct Data {
    pub dir: PathBuf,
    pub join_token: String,
    pub grpc_token: String,
    pub ca: PathBuf,
}

impl Data {
    pub fn create(tag: &str) -> anyhow::Result<Data> {
        let dir = std::env::temp_dir().join(format!("flotilla-loadtest-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let (ca, _) = flotilla_aggregator::TlsMaterial::ensure_in(&dir, &[])?;
        let join_token = format!("{:032x}", rand::random::<u128>());
        std::fs::write(dir.join("join-token"), &join_token)?;
        std::fs::write(dir.join("api-token"), format!("{:032x}", rand::random::<u128>()))?;
        std::fs::write(dir.join("shard-secret"), format!("{:064x}", rand::random::<u128>()))?;
        let grpc_token = format!("{:032x}", rand::random::<u128>());
        std::fs::write(dir.join("grpc-token"), &grpc_token)?;
        Ok(Data { dir, join_token, grpc_token, ca })
    }

    /// Reaches the shards' gRPC with this data dir's token.
    pub fn dialer(&self) -> anyhow::Result<flotilla_proto::dial::Dialer> {
        Ok(flotilla_proto::dial::Dialer::network().on_io_thread().with_token(&self.grpc_token)?)
    }
}

impl Drop for Data {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A shard process; killed on drop.
pub struct ShardProc {
    pub child: Child,
    pub addr: String,
    pub heartbeat: std::net::SocketAddr,
    pub metrics: String,
}

impl ShardProc {
    pub fn spawn(bin: &Path, data: &Path, shard: usize, shards: usize, extra: &[String]) -> anyhow::Result<ShardProc> {
        let mut child = Command::new(bin)
            .args(["aggregator", "--listen", "127.0.0.1:0", "--print-addrs", "--metrics", "127.0.0.1:0"])
            .args(["--shard", &shard.to_string(), "--shards", &shards.to_string()])
            .arg("--data")
            .arg(data)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("no stdout"))?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let v: Value = serde_json::from_str(&line).with_context(|| format!("shard {shard} printed {line:?}"))?;
        let s = |k: &str| v[k].as_str().map(str::to_string).ok_or_else(|| anyhow!("no {k} in {line}"));
        Ok(ShardProc { addr: s("addr")?, heartbeat: s("heartbeat")?.parse()?, metrics: s("metrics")?, child })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn cpu_seconds(&self) -> f64 {
        proc_cpu_seconds(self.pid()).unwrap_or(0.0)
    }

    /// CPU seconds of the shard's heartbeat receive thread (`flotilla_aggregator::ingest`).
    pub fn ingest_cpu_seconds(&self) -> Option<f64> {
        proc_thread_cpu_seconds(self.pid(), "heartbeats")
    }

    pub fn rss_bytes(&self) -> u64 {
        proc_rss_bytes(self.pid()).unwrap_or(0)
    }

    /// Sums every sample of a metric family (all label sets) on the shard's /metrics.
    pub async fn metric(&self, name: &str) -> anyhow::Result<f64> {
        let text = reqwest::get(format!("http://{}/metrics", self.metrics)).await?.text().await?;
        Ok(sum_metric(&text, name))
    }
}

impl Drop for ShardProc {
    fn drop(&mut self) {
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        for _ in 0..40 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn sum_metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(' ') || r.starts_with('{')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// utime + stime of a process, in seconds.
pub fn proc_cpu_seconds(pid: u32) -> Option<f64> {
    stat_cpu_seconds(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// CPU seconds (user and system) of `pid`'s thread named `name`, if it runs one.
pub fn proc_thread_cpu_seconds(pid: u32, name: &str) -> Option<f64> {
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if comm.trim_end() == name {
            return stat_cpu_seconds(&std::fs::read_to_string(task.path().join("stat")).ok()?);
        }
    }
    None
}

/// utime + stime of a process's or thread's `stat` line, in seconds.
fn stat_cpu_seconds(stat: &str) -> Option<f64> {
    let rest = stat.rsplit(')').next()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3 (index 0 here); utime 14 and stime 15 (indexes 11, 12).
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(ticks / hz.max(1.0))
}

pub fn proc_rss_bytes(pid: u32) -> Option<u64> {
    Some(proc_status(pid, "VmRSS:")? * 1024)
}

/// The threads the process runs now.
pub fn proc_threads(pid: u32) -> Option<u64> {
    proc_status(pid, "Threads:")
}

/// The number after `field` in `/proc/PID/status`.
fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// Percentile in milliseconds from a histogram of microseconds.
pub fn pct_ms(h: &hdrhistogram::Histogram<u64>, q: f64) -> f64 {
    if h.is_empty() { 0.0 } else { h.value_at_quantile(q) as f64 / 1000.0 }
}

pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    format!("{} cores, {cpu}", std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// A simulated node: registered over real QUIC, heartbeats sealed with its session key.
pub struct SimNode {
    pub id: String,
    pub shard: usize,
    pub session_id: u64,
    pub incarnation: u64,
    pub key: flotilla_proto::seal::SessionKey,
}

pub fn node_index(id: &str) -> Option<usize> {
    id.strip_prefix("sim-")?.parse().ok()
}

/// Four domains per shard, so nodes spread evenly whatever the hash does.
pub fn domains_per_shard(shards: usize) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); shards];
    let mut k = 0;
    while out.iter().any(|d| d.len() < 4) {
        let d = format!("sim-domain-{k}");
        let s = flotilla_core::shard_for_domain(&d, shards);
        if out[s].len() < 4 {
            out[s].push(d);
        }
        k += 1;
    }
    out
}

/// Simulated nodes and the QUIC connection of each shard they registered over: the shard
/// pushes their assignments on it, and takes their workload reports only through it.
pub struct Registered {
    pub nodes: Vec<SimNode>,
    /// By shard. Dropping them closes the connections (heartbeats go on regardless).
    pub links: Vec<Link>,
}

/// A shard's QUIC connection, with the endpoint that drives it.
pub type Link = (quinn::Endpoint, flotilla_agent::client::ShardConnection);

/// Registers `n` simulated nodes of `cpu_millis` each over one QUIC connection per shard.
pub async fn register_nodes(
    shards: &[ShardProc],
    data: &Data,
    n: usize,
    cpu_millis: u64,
) -> anyhow::Result<Registered> {
    use flotilla_agent::client::{ShardConnection, client_endpoint};
    use flotilla_proto::v1;
    use std::sync::Arc;
    let domains = domains_per_shard(shards.len());
    let mut tasks = tokio::task::JoinSet::new();
    let mut links = Vec::new();
    const WORKERS: usize = 64;
    for (s, shard) in shards.iter().enumerate() {
        let endpoint = client_endpoint(&data.ca, "127.0.0.1:0".parse()?)?;
        let conn = ShardConnection::connect(&endpoint, shard.addr.parse()?, "127.0.0.1").await?;
        links.push((endpoint.clone(), conn.clone()));
        let mine: Vec<usize> = (0..n).filter(|i| i % shards.len() == s).collect();
        let mine = Arc::new(mine);
        for w in 0..WORKERS {
            let (conn, mine, token, doms) = (conn.clone(), mine.clone(), data.join_token.clone(), domains[s].clone());
            tasks.spawn(async move {
                let mut out = Vec::new();
                for &i in mine.iter().skip(w).step_by(WORKERS) {
                    let id = format!("sim-{i:07}");
                    let incarnation = 1_000 + i as u64;
                    let req = v1::RegisterRequest {
                        protocol_version: flotilla_core::PROTOCOL_VERSION,
                        join_token: token.clone(),
                        node_id: id.clone(),
                        incarnation,
                        labels: [("domain".to_string(), doms[i % doms.len()].clone())].into_iter().collect(),
                        capacity: Some(v1::Resources { cpu_millis, memory_bytes: 32 << 30, ..Default::default() }),
                        assignments: vec![],
                        health: None,
                        assignment_version: 0,
                        cordoned: false,
                    };
                    let sess = conn.register(req).await.with_context(|| format!("registering {id}"))?;
                    let key: flotilla_proto::seal::SessionKey =
                        sess.key.as_slice().try_into().map_err(|_| anyhow!("bad key"))?;
                    out.push(SimNode { id, shard: s, session_id: sess.session_id, incarnation, key });
                }
                anyhow::Ok(out)
            });
        }
    }
    let mut nodes: Vec<SimNode> = Vec::with_capacity(n);
    while let Some(r) = tasks.join_next().await {
        nodes.extend(r??);
    }
    nodes.sort_by_key(|n| node_index(&n.id));
    Ok(Registered { nodes, links })
}

/// `flotilla up --shards 2 --restart-agents` with real agents and an app (or none), in its own
/// process group; stopped (SIGTERM, then SIGKILL to the group) and its data dir removed
/// on drop.
pub struct UpProc {
    child: Child,
    pub dir: PathBuf,
}

impl UpProc {
    pub fn start(bin: &Path, dir: &Path, agents: usize, extra: &[&str], app: Option<&Path>) -> anyhow::Result<UpProc> {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(bin);
        cmd.args(["up", "--shards", "2", "--listen", "127.0.0.1:0", "--restart-agents"])
            .args(["--agents", &agents.to_string()])
            .args(extra)
            .arg("--data")
            .arg(dir);
        if let Some(app) = app {
            cmd.arg("--app").arg(app);
        }
        let child = cmd
            // Warnings only, unless the caller asks for more.
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("up.out"))?)
            .stderr(std::fs::File::create(dir.join("up.err"))?)
            .process_group(0)
            .spawn()
            .context("starting flotilla up")?;
        Ok(UpProc { child, dir: dir.to_path_buf() })
    }

    /// The control API's address, once `up` wrote it.
    pub async fn addr(&self) -> anyhow::Result<String> {
        let file = self.dir.join("control.addr");
        for _ in 0..300 {
            if let Ok(a) = std::fs::read_to_string(&file) {
                return Ok(a);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(anyhow!("flotilla up did not start (see {})", self.dir.join("up.err").display()))
    }
}

impl Drop for UpProc {
    fn drop(&mut self) {
        // SAFETY: signals to the process (group) we started.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        for _ in 0..200 {
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        unsafe {
            libc::kill(-(self.child.id() as i32), libc::SIGKILL);
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Polls `f` every 10 ms until it gives a value, or fails naming `what` after `limit`.
pub async fn until<T>(what: &str, limit: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> anyhow::Result<T> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return Ok(v);
        }
        anyhow::ensure!(std::time::Instant::now() < deadline, "{what}: timed out after {limit:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// An etcd for the run (Debian's `etcd-server`, `etcd` on the PATH): free loopback ports,
/// a data dir under the run's, killed on drop.
pub struct EtcdProc {
    child: Child,
    pub endpoints: flotilla_etcd::Endpoints,
}

impl EtcdProc {
    /// Starts etcd and waits until it answers. With `cpus`, etcd runs on those CPUs only
    /// (as production etcd runs on machines of its own; run the loadtest itself under
    /// `taskset` on the others).
    pub async fn start(dir: &Path, cpus: &[usize]) -> anyhow::Result<EtcdProc> {
        use std::os::unix::process::CommandExt;
        let port = || -> anyhow::Result<u16> { Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port()) };
        let (client, peer) = (format!("http://127.0.0.1:{}", port()?), format!("http://127.0.0.1:{}", port()?));
        let mut cmd = Command::new("etcd");
        if !cpus.is_empty() {
            // SAFETY: a zeroed cpu_set_t is the empty set; CPU_SET takes indices below
            // CPU_SETSIZE (checked by the caller's parser).
            let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            for &c in cpus {
                unsafe { libc::CPU_SET(c, &mut set) };
            }
            // SAFETY: sched_setaffinity is async-signal-safe; it runs in the child before exec.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = cmd
            .args(["--name", "lt", "--data-dir"])
            .arg(dir.join("etcd"))
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("lt={peer}")])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("etcd.log"))?)
            .spawn()
            .map_err(|e| anyhow!("starting etcd (Debian's etcd-server): {e}"))?;
        let endpoints = flotilla_etcd::Endpoints::parse(&client.replace("http://", "etcd://"))?;
        let etcd = EtcdProc { child, endpoints };
        let client = flotilla_etcd::connect(&etcd.endpoints, flotilla_etcd::REQUEST_TIMEOUT).await?;
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while client.clone().status().await.is_err() {
            anyhow::ensure!(std::time::Instant::now() < deadline, "etcd did not answer within 20 s");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(etcd)
    }
}

impl Drop for EtcdProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The spec of a loadtest app: `units` one-member units of `cpu` that run `sleep`, on
/// low-priority nodes too, scalable up to `max`.
pub fn sleep_app_spec(name: &str, units: u32, max: u32, cpu: &str) -> String {
    format!(
        r#"name = "{name}"
[unit.head]
command = "sleep"
cpu = "{cpu}"
memory = "16Mi"
[constraints]
allow_low_priority = true
[units]
min = 0
max = {max}
initial = {units}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_summed_over_labels() {
        let t = "# TYPE x counter\nx_total{a=\"1\"} 2\nx_total{a=\"2\"} 3.5\nx_total_other 9\nx_total 1\n";
        assert_eq!(sum_metric(t, "x_total"), 6.5);
    }

    #[test]
    fn reads_own_process() {
        assert!(proc_cpu_seconds(std::process::id()).is_some());
        assert!(proc_rss_bytes(std::process::id()).unwrap() > 0);
    }
}
