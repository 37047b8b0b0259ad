//! The local provider: each instance is a `flotilla agent` process on this machine, the
//! way `flotilla up` starts its agents, so the pool can be exercised without a cloud.
//!
//! Per instance it keeps, in [`LocalConfig::dir`]:
//! - `ID.json`: the node type and the port slot (written before the process starts, so
//!   the slot is claimed);
//! - `ID.pid`: the process id (the leader of its own process group);
//! - `ID.log`: the agent's stdout and stderr, and `ID/` its data directory (both kept
//!   after it ends, for post-mortems).
//!
//! An instance is listed while its process is alive **and** `/proc/PID/cmdline` carries its
//! id as an argument: a pid reused by another process is not mistaken for the agent. A
//! new provider over the same directory (a restarted autoscaler) lists the agents the
//! old one started.
//!
//! With `tied_to_parent`, agents get `PR_SET_PDEATHSIG` and die with this process (like
//! `flotilla up`'s). The kernel fires that signal when the *thread* that forked exits, so
//! they are forked from one process-wide thread that never exits. Without it, agents
//! outlive the autoscaler, as cloud VMs outlive a crashed Ray autoscaler, and the next
//! one adopts them.

use std::collections::BTreeSet;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{BoxFuture, CloudInstance, InstanceProvider, LaunchSpec, ProviderError, check_id, observed};

/// Ports each instance hands out (`--port-range`), the way `flotilla up` spaces its agents.
pub const PORTS_PER_INSTANCE: u16 = 50;

#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The binary to run (usually this one, `flotilla`).
    pub program: PathBuf,
    /// Arguments before the per-instance ones, e.g. `--log-format text agent
    /// --aggregators A --join-token-file F --ca C`.
    pub args_before: Vec<String>,
    /// Where the per-instance files live.
    pub dir: PathBuf,
    /// The first port of slot 0; slot `k` gets `port_base + 50k ..= port_base + 50k + 49`.
    pub port_base: u16,
    /// Agents die with this process (PDEATHSIG) instead of outliving it.
    pub tied_to_parent: bool,
    /// How long after SIGTERM a terminated agent gets SIGKILL.
    pub stop_grace: Duration,
    /// A cloud VM's boot, played: each agent starts this long after its launch.
    pub boot_delay: Duration,
}

impl Default for LocalConfig {
    fn default() -> Self {
        LocalConfig {
            program: PathBuf::from("flotilla"),
            args_before: Vec::new(),
            dir: PathBuf::from("pool"),
            port_base: 20_000,
            tied_to_parent: false,
            stop_grace: Duration::from_secs(10),
            boot_delay: Duration::ZERO,
        }
    }
}

/// `ID.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Meta {
    id: String,
    node_type: String,
    slot: u16,
}

pub struct LocalProvider {
    config: LocalConfig,
    /// Serialises launch, list and terminate within this process: a list between a
    /// launch's meta file and its pid file would otherwise clean the launch up.
    lock: tokio::sync::Mutex<()>,
}

impl LocalProvider {
    pub fn new(config: LocalConfig) -> Self {
        LocalProvider { config, lock: tokio::sync::Mutex::new(()) }
    }

    pub fn config(&self) -> &LocalConfig {
        &self.config
    }

    fn path(&self, id: &str, ext: &str) -> PathBuf {
        self.config.dir.join(format!("{id}.{ext}"))
    }

    /// The pid of `id`'s live process, if there is one. The meta file is written before
    /// the agent starts and the pid file after: an autoscaler killed in between leaves a
    /// running agent without a pid file, which is found by its command line and recorded,
    /// so it is listed (not leaked, not launched twice).
    fn live_pid(&self, id: &str) -> Option<i32> {
        let recorded = std::fs::read_to_string(self.path(id, "pid")).ok().and_then(|p| p.trim().parse::<i32>().ok());
        if let Some(pid) = recorded.filter(|p| *p > 0 && runs_with_arg(*p, id)) {
            return Some(pid);
        }
        let pid = find_by_arg(id)?;
        if let Err(e) = write_atomic(&self.path(id, "pid"), pid.to_string().as_bytes()) {
            tracing::warn!(instance = %id, error = %e, "local provider: recording a found agent's pid");
        }
        Some(pid)
    }

    /// Every meta file in the directory (unreadable ones are skipped with a warning).
    fn metas(&self) -> Result<Vec<Meta>, ProviderError> {
        let entries = match std::fs::read_dir(&self.config.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err(format!("reading {}", self.config.dir.display()), e)),
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let parsed = std::fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Meta>(&b).map_err(|e| e.to_string()));
            match parsed {
                Ok(m)
                    if check_id(&m.id).is_ok() && path.file_stem().and_then(|s| s.to_str()) == Some(m.id.as_str()) =>
                {
                    out.push(m)
                }
                Ok(_) => {
                    tracing::warn!(file = %path.display(), "local provider: meta file does not match its name; skipped")
                }
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "local provider: unreadable meta file; skipped")
                }
            }
        }
        Ok(out)
    }

    /// Forget an instance whose process is gone (frees its port slot).
    fn forget(&self, id: &str) {
        for ext in ["pid", "json"] {
            let _ = std::fs::remove_file(self.path(id, ext));
        }
    }

    fn list_now(&self) -> Result<Vec<CloudInstance>, ProviderError> {
        let mut out = Vec::new();
        for m in self.metas()? {
            if self.live_pid(&m.id).is_some() {
                out.push(CloudInstance { id: m.id, node_type: m.node_type });
            } else {
                tracing::debug!(instance = %m.id, "local provider: process gone; forgetting it");
                self.forget(&m.id);
            }
        }
        out.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(out)
    }

    async fn launch_now(&self, spec: &LaunchSpec) -> Result<Option<i32>, ProviderError> {
        check_id(&spec.id)?;
        if spec.resources.cpu_millis == 0 {
            return Err(ProviderError::BadSpec { id: spec.id.clone(), detail: "no CPU".into() });
        }
        if self.live_pid(&spec.id).is_some() {
            return Ok(None); // already launched: the id is the idempotency key
        }
        std::fs::create_dir_all(&self.config.dir)
            .map_err(|e| io_err(format!("creating {}", self.config.dir.display()), e))?;
        // Slots of the live instances are taken; the lowest free one is ours.
        let mut taken = BTreeSet::new();
        for m in self.metas()? {
            if m.id != spec.id && self.live_pid(&m.id).is_some() {
                taken.insert(m.slot);
            }
        }
        let slot = (0..u16::MAX).find(|s| !taken.contains(s)).unwrap_or(u16::MAX);
        let first = u32::from(self.config.port_base) + u32::from(slot) * u32::from(PORTS_PER_INSTANCE);
        let last = first + u32::from(PORTS_PER_INSTANCE) - 1;
        if first == 0 || last > u32::from(u16::MAX) {
            return Err(ProviderError::Config(format!(
                "no port range left for slot {slot} from port base {}",
                self.config.port_base
            )));
        }
        let meta = Meta { id: spec.id.clone(), node_type: spec.node_type.clone(), slot };
        let json = serde_json::to_vec(&meta).map_err(|e| ProviderError::Config(e.to_string()))?;
        write_atomic(&self.path(&spec.id, "json"), &json)?;

        let mut args = self.config.args_before.clone();
        args.extend(agent_args(spec, &self.config.dir, first, last));
        let log_path = self.path(&spec.id, "log");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| io_err(format!("opening {}", log_path.display()), e))?;
        let log2 = log.try_clone().map_err(|e| io_err(format!("opening {}", log_path.display()), e))?;
        let mut cmd = if self.config.boot_delay.is_zero() {
            Command::new(&self.config.program)
        } else {
            // `sh` sleeps, then becomes the agent (same pid, the id on its command line
            // all along, so it is listed from the launch on, as a booting VM is).
            let mut c = Command::new("sh");
            c.args(["-c", "sleep \"$0\" && exec \"$@\""])
                .arg(format!("{:.3}", self.config.boot_delay.as_secs_f64()))
                .arg(&self.config.program);
            c
        };
        // The type's cache is in its `--resource artifact-cache`: one the pool process
        // inherited would disagree with it.
        cmd.args(&args)
            .env_remove("FLOTILLA_ARTIFACT_CACHE")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            .process_group(0);
        let pid = match spawn_on_keeper(cmd, self.config.tied_to_parent).await {
            Ok(pid) => pid,
            Err(e) => {
                self.forget(&spec.id);
                return Err(ProviderError::Spawn { command: self.config.program.display().to_string(), source: e });
            }
        };
        if let Err(e) = write_atomic(&self.path(&spec.id, "pid"), pid.to_string().as_bytes()) {
            // Without its pid file nothing could find it again: do not leave it running.
            signal_group(pid, libc::SIGKILL);
            self.forget(&spec.id);
            return Err(e);
        }
        Ok(Some(pid))
    }
}

/// The agent flags of one instance (after `args_before`).
fn agent_args(spec: &LaunchSpec, dir: &Path, first_port: u32, last_port: u32) -> Vec<String> {
    let r = &spec.resources;
    let cores = if r.cpu_millis.is_multiple_of(1000) {
        (r.cpu_millis / 1000).to_string()
    } else {
        format!("{:.3}", r.cpu_millis as f64 / 1000.0)
    };
    let mut a = vec![
        "--node-id".to_string(),
        spec.id.clone(),
        "--cores".into(),
        cores,
        "--memory".into(),
        r.memory_bytes.to_string(),
    ];
    if r.gpu > 0 {
        a.extend(["--gpus".into(), r.gpu.to_string()]);
    }
    for (k, v) in &r.custom {
        a.extend(["--resource".into(), format!("{k}={v}")]);
    }
    for (k, v) in &spec.labels {
        a.extend(["--label".into(), format!("{k}={v}")]);
    }
    if spec.cordoned {
        a.push("--cordoned".into());
    }
    a.extend([
        "--data".into(),
        dir.join(&spec.id).display().to_string(),
        "--port-range".into(),
        format!("{first_port}-{last_port}"),
    ]);
    a
}

impl InstanceProvider for LocalProvider {
    fn name(&self) -> &'static str {
        "local"
    }

    fn list(&self) -> BoxFuture<'_, Result<Vec<CloudInstance>, ProviderError>> {
        Box::pin(observed("local", "list", None, async move {
            let _g = self.lock.lock().await;
            self.list_now()
        }))
    }

    fn launch<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(observed("local", "launch", Some(&spec.id), async move {
            let _g = self.lock.lock().await;
            match self.launch_now(spec).await? {
                Some(pid) => tracing::info!(instance = %spec.id, pid, "local agent started"),
                None => tracing::info!(instance = %spec.id, "local agent already running"),
            }
            Ok(())
        }))
    }

    fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        Box::pin(observed("local", "terminate", Some(id), async move {
            check_id(id)?;
            let _g = self.lock.lock().await;
            let Some(pid) = self.live_pid(id) else {
                self.forget(id);
                return Ok(()); // already gone
            };
            signal_group(pid, libc::SIGTERM);
            // Escalate without holding up the caller (or the runtime): the instance leaves
            // `list` once it is gone, which is what the instance manager waits for.
            let grace = self.config.stop_grace;
            let id = id.to_string();
            tokio::spawn(async move {
                let deadline = tokio::time::Instant::now() + grace;
                while tokio::time::Instant::now() < deadline {
                    if !runs_with_arg(pid, &id) {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                if runs_with_arg(pid, &id) {
                    tracing::warn!(instance = %id, pid, "local agent ignored SIGTERM; killing it");
                    signal_group(pid, libc::SIGKILL);
                }
            });
            Ok(())
        }))
    }
}

fn io_err(what: String, source: std::io::Error) -> ProviderError {
    ProviderError::Io { what, source }
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ProviderError> {
    // The error names the path already.
    flotilla_obs::fsutil::write_atomic(path, bytes, 0o644).map_err(|e| io_err("recording an instance".into(), e))
}

/// True when `pid` is a live (not zombie) process with `arg` among its arguments.
/// The process group leader whose command line has `arg` as one argument (an agent is
/// its own group's leader, so its members, which carry other arguments, never match).
fn find_by_arg(arg: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        // SAFETY: getpgid(2) only reads the process table.
        let leader = unsafe { libc::getpgid(pid) } == pid;
        (leader && runs_with_arg(pid, arg)).then_some(pid)
    })
}

pub(crate) fn runs_with_arg(pid: i32, arg: &str) -> bool {
    match std::fs::read(format!("/proc/{pid}/cmdline")) {
        // A zombie's cmdline is empty, so it never matches.
        Ok(cmdline) => cmdline.split(|b| *b == 0).any(|a| a == arg.as_bytes()),
        Err(_) => false,
    }
}

fn signal_group(pid: i32, sig: i32) {
    if pid <= 1 {
        return;
    }
    // SAFETY: kill(2) on the instance's own process group (its pid, by process_group(0)).
    unsafe {
        libc::kill(-pid, sig);
    }
}

struct SpawnRequest {
    cmd: Command,
    tied: bool,
    reply: tokio::sync::oneshot::Sender<std::io::Result<i32>>,
}

/// The one thread that forks agents and reaps them. It never exits: PDEATHSIG fires
/// when the forking thread dies, and tied agents must live as long as this process.
fn keeper() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static KEEPER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    KEEPER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        let spawned = std::thread::Builder::new().name("pool-local-spawner".into()).spawn(move || {
            let mut children: Vec<Child> = Vec::new();
            loop {
                match rx.recv_timeout(Duration::from_millis(500)) {
                    Ok(mut req) => {
                        if req.tied {
                            // SAFETY: prctl is async-signal-safe; it only asks the kernel to
                            // SIGTERM the child when this (never exiting) thread's process dies.
                            unsafe {
                                req.cmd.pre_exec(|| {
                                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                                        return Err(std::io::Error::last_os_error());
                                    }
                                    Ok(())
                                });
                            }
                        }
                        let result = req.cmd.spawn().map(|c| {
                            let pid = c.id() as i32;
                            children.push(c);
                            pid
                        });
                        let _ = req.reply.send(result);
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {}
                    // Unreachable (the sender lives in a static), but never exit anyway.
                    Err(mpsc::RecvTimeoutError::Disconnected) => std::thread::sleep(Duration::from_secs(1)),
                }
                // Reap the ones that ended, so they do not linger as zombies.
                children.retain_mut(|c| matches!(c.try_wait(), Ok(None)));
            }
        });
        if let Err(e) = spawned {
            tracing::error!(error = %e, "local provider: cannot start its spawner thread");
        }
        Mutex::new(tx)
    })
}

/// Forks `cmd` on the keeper thread and returns its pid.
async fn spawn_on_keeper(cmd: Command, tied: bool) -> std::io::Result<i32> {
    let (reply, rx) = tokio::sync::oneshot::channel();
    let sent = match keeper().lock() {
        Ok(tx) => tx.send(SpawnRequest { cmd, tied, reply }).is_ok(),
        Err(_) => false,
    };
    if !sent {
        return Err(std::io::Error::other("the spawner thread is gone"));
    }
    rx.await.map_err(|_| std::io::Error::other("the spawner thread is gone"))?
}
