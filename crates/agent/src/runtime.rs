//! The workload runtime: turns the node's assignment set into child processes, the
//! way Nomad's exec driver or a kubelet does.
//!
//! Each member gets a port from the agent's range (`FLOTILLA_PORT`) and the named ports
//! and blocks its spec asks for (`FLOTILLA_PORT_<NAME>`, see [`crate::ports`]), its own process
//! group, a cgroup with its CPU and memory limits where the agent may create one, and
//! size-capped stdout/stderr files in the data dir. It is `running` once its readiness
//! path answers 2xx (or once started, without one). It is restarted when it exits, with
//! crash-loop back-off; it is stopped with SIGTERM, then SIGKILL after the grace period,
//! when it is no longer assigned. Workloads die with the agent, even a killed one
//! (PR_SET_PDEATHSIG). A member whose workload names one it starts `after` is held back
//! (`waiting`) until the scheduler sends it again with its head's address and ports.

use flotilla_core::LockExt;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flotilla_core::Backoff;
use flotilla_proto::v1::{self, WorkloadState};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use crate::cgroup::{Cgroup, Cgroups, Counters};
use crate::logs::{LineSplitter, LogFile, Logs, safe_name};
use crate::ports::{MemberPorts, PortRequest};

#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    pub data_dir: PathBuf,
    pub node_id: String,
    /// The host others reach this node's members at.
    pub advertise_host: String,
    /// Ports handed to members, inclusive.
    pub ports: (u16, u16),
    pub stop_grace: Duration,
    /// Each log file is rotated (one old file kept) past this size.
    pub log_cap_bytes: u64,
    pub cgroup_root: PathBuf,
    /// Where under each hierarchy workloads' cgroups go (`--cgroup-parent`); `None`: in
    /// the agent's own cgroup.
    pub cgroup_parent: Option<String>,
    /// How often each running member's CPU and memory use is measured (and reported when
    /// it moved enough to matter to an autoscaler).
    pub usage_interval: Duration,
}

/// (app, unit, member, generation)
pub type MemberKey = (String, String, String, u64);

pub fn key_of(a: &v1::Assignment) -> MemberKey {
    (a.app.clone(), a.unit.clone(), a.member.clone(), a.generation)
}

struct Proc {
    child: tokio::process::Child,
    pgid: i32,
    stderr_tail: Arc<Mutex<Vec<u8>>>,
    /// The tasks copying its output into its logs: a stopped member's logs close only
    /// once they have read its last lines (its shutdown message, say).
    pumps: Vec<tokio::task::JoinHandle<()>>,
}

struct Member {
    assignment: v1::Assignment,
    /// Assigned at its first start, kept across restarts, freed with the member.
    ports: Option<MemberPorts>,
    proc: Option<Proc>,
    state: WorkloadState,
    exit_code: i32,
    message: String,
    restarts: u32,
    /// Waits between restarts; reset by a long enough run.
    restart: Backoff,
    next_start: Instant,
    started_at: Instant,
    cgroup: Cgroup,
    /// The last measurement reported, and the CPU time it was computed from.
    usage: Option<v1::WorkloadUsage>,
    cpu_sample: Option<(Instant, u64)>,
}

struct Stopping {
    key: MemberKey,
    proc: Proc,
    kill_at: Instant,
    cgroup: Cgroup,
}

pub struct Runtime {
    cfg: RuntimeConfig,
    cgroups: Cgroups,
    members: BTreeMap<MemberKey, Member>,
    stopping: Vec<Stopping>,
    logs: Arc<Logs>,
    dirty: bool,
    http: reqwest::Client,
    next_usage: Instant,
    /// The cache members' artifacts come from (none: members with artifacts fail).
    artifacts: Option<Arc<flotilla_artifact::Artifacts>>,
}

/// Whether a member's use moved enough to report: 5 % (and at least 1 MiB or 10
/// millicores), so a steady workload costs no reports.
fn moved(old: &v1::WorkloadUsage, new: &v1::WorkloadUsage) -> bool {
    let far = |a: u64, b: u64, floor: u64| a.abs_diff(b) >= floor.max(a.max(b) / 20);
    far(old.memory_bytes, new.memory_bytes, 1 << 20) || far(old.cpu_millis, new.cpu_millis, 10)
}

/// Crash-loop back-off: 0.5 s doubling to 30 s. No jitter: the restarts of one node's
/// members are no thundering herd.
fn restart_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(30))
}

/// How often a member waiting for its artifacts looks again.
const FETCH_POLL: Duration = Duration::from_millis(500);

/// A run this long resets the back-off.
const HEALTHY_RUN: Duration = Duration::from_secs(10);

fn signal_group(pgid: i32, sig: i32) {
    if pgid > 1 {
        // SAFETY: kill(2) on a process group this runtime created.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

/// How long a partial line (a prompt, a progress bar) waits for its end before it is
/// written as it is.
const PARTIAL_LINE_WAIT: Duration = Duration::from_millis(500);

/// Copies a child's output to its log, line by line; keeps its last bytes in `tail`.
///
/// The child's pipe is always drained: a log file that cannot be written (a full disk)
/// costs the lines, never the workload, which would otherwise block on a full pipe or
/// die of EPIPE (see [`LogFile::append`]).
async fn pump(mut from: impl AsyncRead + Unpin, log: Arc<LogFile>, tail: Option<Arc<Mutex<Vec<u8>>>>) {
    let mut split = LineSplitter::default();
    let mut buf = vec![0u8; 8192];
    loop {
        let read = if split.is_empty() {
            from.read(&mut buf).await.map(Some)
        } else {
            match tokio::time::timeout(PARTIAL_LINE_WAIT, from.read(&mut buf)).await {
                Ok(r) => r.map(Some),
                Err(_) => Ok(None),
            }
        };
        let (now, mut lines) = (flotilla_core::now_ms(), Vec::new());
        let ended = match read {
            Ok(Some(0)) | Err(_) => {
                split.flush(now, &mut lines);
                true
            }
            Ok(Some(n)) => {
                if let Some(t) = &tail {
                    let mut t = t.lock_or_recover();
                    t.extend_from_slice(&buf[..n]);
                    let excess = t.len().saturating_sub(2048);
                    t.drain(..excess);
                }
                split.push(&buf[..n], now, &mut lines);
                false
            }
            Ok(None) => {
                split.flush(now, &mut lines);
                false
            }
        };
        if !lines.is_empty() {
            let log = log.clone();
            let _ = tokio::task::spawn_blocking(move || log.append(lines)).await;
        }
        if ended {
            return;
        }
    }
}

impl Runtime {
    pub fn new(cfg: RuntimeConfig) -> Self {
        let cgroups = Cgroups::detect_under(&cfg.cgroup_root, cfg.cgroup_parent.as_deref(), &safe_name(&cfg.node_id));
        match &cgroups {
            Cgroups::Unavailable(why) => tracing::warn!(%why, "workload CPU and memory limits are NOT enforced"),
            c => tracing::info!(cgroups = ?c, "workload limits enforced with cgroups"),
        }
        let http = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().unwrap_or_default();
        let logs = Arc::new(Logs::new(cfg.data_dir.join("workloads"), cfg.log_cap_bytes));
        Runtime {
            cfg,
            cgroups,
            members: BTreeMap::new(),
            stopping: Vec::new(),
            logs,
            dirty: false,
            http,
            next_usage: Instant::now(),
            artifacts: None,
        }
    }

    pub fn with_artifacts(mut self, artifacts: Arc<flotilla_artifact::Artifacts>) -> Self {
        self.artifacts = Some(artifacts);
        self
    }

    /// Whether `key`'s artifacts are in its working directory; if not, the member shows
    /// `fetching` (asked again soon) or fails with why.
    fn artifacts_placed(&mut self, key: &MemberKey, cwd: &std::path::Path) -> bool {
        let Some(m) = self.members.get(key) else { return false };
        let list = m.assignment.workload.as_ref().map(|w| w.artifacts.clone()).unwrap_or_default();
        if list.is_empty() {
            return true;
        }
        let prepared = match &self.artifacts {
            Some(arts) => crate::artifacts::prepare(arts, &list, cwd),
            None => crate::artifacts::Prepared::Failed("this agent keeps no artifacts".into()),
        };
        match prepared {
            crate::artifacts::Prepared::Ready => true,
            crate::artifacts::Prepared::Fetching(msg) => {
                if let Some(m) = self.members.get_mut(key) {
                    if m.state != WorkloadState::Fetching || m.message != msg {
                        self.dirty = true;
                    }
                    m.state = WorkloadState::Fetching;
                    m.message = msg;
                    m.next_start = Instant::now() + FETCH_POLL;
                }
                false
            }
            crate::artifacts::Prepared::Failed(why) => {
                self.fail(key, why);
                false
            }
        }
    }

    /// The members' logs, for whoever serves them.
    pub fn logs(&self) -> Arc<Logs> {
        self.logs.clone()
    }

    pub fn limits_enforced(&self) -> bool {
        self.cgroups.enforced()
    }

    /// The assignments this node runs now (reported when it registers again).
    pub fn assignments(&self) -> Vec<v1::Assignment> {
        self.members.values().map(|m| m.assignment.clone()).collect()
    }

    /// Applies a new assignment set: new members start, removed ones stop, changed ones restart.
    pub fn assign(&mut self, list: Vec<v1::Assignment>) {
        if let Some(arts) = &self.artifacts {
            arts.pin(crate::artifacts::in_use(&list));
        }
        let wanted: BTreeMap<MemberKey, v1::Assignment> = list.into_iter().map(|a| (key_of(&a), a)).collect();
        let gone: Vec<MemberKey> = self
            .members
            .iter()
            .filter(|(k, m)| wanted.get(*k).is_none_or(|a| *a != m.assignment))
            .map(|(k, _)| k.clone())
            .collect();
        for k in gone {
            if let Some(m) = self.members.remove(&k) {
                tracing::info!(unit = %k.1, member = %k.2, "stopping unassigned member");
                self.stop(k, m);
            }
        }
        // Of the wanted, those not yet assigned are added below: their units stay too.
        let mut units = self.units_here();
        units.extend(wanted.keys().map(|k| (k.0.clone(), k.1.clone())));
        self.logs.keep_only(&units);
        let now = Instant::now();
        for (k, a) in wanted {
            self.members.entry(k).or_insert_with(|| {
                self.dirty = true;
                Member {
                    assignment: a,
                    ports: None,
                    proc: None,
                    state: WorkloadState::Starting,
                    exit_code: 0,
                    message: String::new(),
                    restarts: 0,
                    restart: restart_backoff(),
                    next_start: now,
                    started_at: now,
                    cgroup: Cgroup::default(),
                    usage: None,
                    cpu_sample: None,
                }
            });
        }
    }

    /// The units with a member assigned or still stopping here: a unit's logs go once it
    /// has neither.
    fn units_here(&self) -> BTreeSet<(String, String)> {
        let keys = self.members.keys().chain(self.stopping.iter().map(|s| &s.key));
        keys.map(|k| (k.0.clone(), k.1.clone())).collect()
    }

    /// Stops an unassigned member: SIGTERM now, SIGKILL after the grace period. Its log
    /// followers see its last lines and end once it is gone ([`Runtime::tick`]).
    fn stop(&mut self, key: MemberKey, mut m: Member) {
        self.dirty = true;
        if let Some(p) = m.proc.take() {
            signal_group(p.pgid, libc::SIGTERM);
            let kill_at = Instant::now() + self.cfg.stop_grace;
            self.stopping.push(Stopping { key, proc: p, kill_at, cgroup: m.cgroup });
        } else {
            m.cgroup.remove();
            self.logs.stopped(&key.0, &key.1, &key.2, key.3);
        }
    }

    /// The member's ports: those it holds, else new ones from the range.
    fn ports_for(&self, key: &MemberKey) -> Result<MemberPorts, String> {
        let Some(m) = self.members.get(key) else { return Err("not assigned".into()) };
        if let Some(p) = &m.ports {
            return Ok(p.clone());
        }
        let used: BTreeSet<u16> =
            self.members.values().filter_map(|m| m.ports.as_ref()).flat_map(|p| p.all()).collect();
        let w = m.assignment.workload.clone().unwrap_or_default();
        let req = PortRequest { named: &w.ports, ranges: &w.port_ranges, main: &w.main_port };
        crate::ports::assign(self.cfg.ports, &used, req, &|p| std::net::TcpListener::bind(("0.0.0.0", p)).is_ok())
    }

    /// The head of `key`'s unit on this node, when it has its ports: its address and
    /// ports for a member the scheduler did not give them to (one that does not wait).
    fn local_head_env(&self, key: &MemberKey) -> Vec<(String, String)> {
        let head = self.members.iter().find(|(k, m)| {
            k.1 == key.1 && k.3 == key.3 && m.assignment.workload.as_ref().is_some_and(|w| w.role == "head")
        });
        match head.and_then(|(_, m)| m.ports.as_ref()) {
            Some(p) => {
                let mut env = vec![("FLOTILLA_HEAD_ADDR".to_string(), self.cfg.advertise_host.clone())];
                env.extend(p.env("FLOTILLA_HEAD_PORT"));
                env
            }
            None => Vec::new(),
        }
    }

    fn address(&self, port: u16) -> String {
        format!("{}:{port}", self.cfg.advertise_host)
    }

    fn start(&mut self, key: &MemberKey) {
        let after = self.members.get(key).and_then(|m| m.assignment.workload.as_ref()).map(|w| w.after.clone());
        if let Some(after) = after.filter(|a| !a.is_empty()) {
            // Start order: held until the scheduler sends the workload without `after`
            // (a changed assignment, so a new member), once `after` is running.
            if let Some(m) = self.members.get_mut(key)
                && m.state != WorkloadState::Waiting
            {
                tracing::info!(unit = %key.1, member = %key.2, %after, "member waits for its start");
                m.state = WorkloadState::Waiting;
                m.message = format!("waits for {after} to be running");
                m.next_start = Instant::now() + Duration::from_secs(u64::from(u32::MAX));
                self.dirty = true;
            }
            return;
        }
        let dir = self.logs.member_dir(&key.0, &key.1, &key.2, key.3);
        if let Err(e) = std::fs::create_dir_all(&dir) {
            // A full disk may refuse even a dir: the member runs in the data dir and its
            // output goes nowhere, rather than not running at all.
            tracing::warn!(dir = %dir.display(), error = %e, "cannot create the member's dir; its output is dropped");
        }
        let cwd = if dir.is_dir() { dir } else { self.cfg.data_dir.clone() };
        let has_artifacts =
            self.members.get(key).and_then(|m| m.assignment.workload.as_ref()).is_some_and(|w| !w.artifacts.is_empty());
        if has_artifacts && cwd == self.cfg.data_dir {
            // Never place artifacts in the agent's own dir (a `dest` could name its cache).
            self.fail(key, "cannot create the member's directory for its artifacts".into());
            return;
        }
        if !self.artifacts_placed(key, &cwd) {
            return;
        }
        let ports = match self.ports_for(key) {
            Ok(p) => p,
            Err(why) => {
                self.fail(key, why);
                return;
            }
        };
        let port = ports.main;
        let head_env = self.local_head_env(key);
        let (cfg, cgroups) = (self.cfg.clone(), self.cgroups.clone());
        let Some(m) = self.members.get_mut(key) else { return };
        m.ports = Some(ports.clone());
        let w = m.assignment.workload.clone().unwrap_or_default();
        let program = if w.command == "flotilla" {
            // The agent's own binary: `flotilla echo-server` works without a PATH entry.
            std::env::current_exe().unwrap_or_else(|_| PathBuf::from("flotilla"))
        } else {
            PathBuf::from(&w.command)
        };
        let logs = self.logs.start(&key.0, &key.1, &key.2, key.3);
        let mut cmd = tokio::process::Command::new(&program);
        cmd.args(&w.args)
            .envs(&w.env)
            .env("FLOTILLA_APP", &key.0)
            .env("FLOTILLA_UNIT", &key.1)
            .env("FLOTILLA_MEMBER", &key.2)
            .env("FLOTILLA_ROLE", &w.role)
            .env("FLOTILLA_NODE_ID", &cfg.node_id)
            .envs(ports.env("FLOTILLA_PORT"))
            .current_dir(&cwd)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .process_group(0)
            .kill_on_drop(false);
        // The head's address and ports: the scheduler's (in `env`, for a member that
        // waited for its head) win; else the head's on this node, if it runs here.
        if !w.env.contains_key("FLOTILLA_HEAD_ADDR") {
            cmd.envs(head_env);
        }
        // SAFETY: prctl is async-signal-safe. The workload is killed when the agent's
        // thread that started it dies, so a killed agent leaves no workload behind.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(mut child) => {
                let pid = child.id().unwrap_or(0);
                let r = m.assignment.resources.clone().unwrap_or_default();
                let name = safe_name(&format!("{}-{}-{}", key.1, key.2, key.3));
                match cgroups.create(&name, r.cpu_millis, r.memory_bytes).and_then(|cg| cg.attach(pid).map(|()| cg)) {
                    Ok(cg) => m.cgroup = cg,
                    Err(e) => tracing::warn!(error = %e, "could not put the workload in its cgroup"),
                }
                let tail = Arc::new(Mutex::new(Vec::new()));
                let mut pumps = Vec::new();
                if let Some(out) = child.stdout.take() {
                    pumps.push(tokio::spawn(pump(out, logs.stdout.clone(), None)));
                }
                if let Some(err) = child.stderr.take() {
                    pumps.push(tokio::spawn(pump(err, logs.stderr.clone(), Some(tail.clone()))));
                }
                tracing::info!(unit = %key.1, member = %key.2, pid, port, "member started");
                m.proc = Some(Proc { child, pgid: pid as i32, stderr_tail: tail, pumps });
                m.state = WorkloadState::Starting;
                m.started_at = Instant::now();
                m.message.clear();
                self.dirty = true;
            }
            Err(e) => {
                let why = format!("cannot start {}: {e}", program.display());
                self.fail(key, why);
            }
        }
    }

    fn fail(&mut self, key: &MemberKey, why: String) {
        if let Some(m) = self.members.get_mut(key) {
            tracing::warn!(unit = %key.1, member = %key.2, %why, "member failed");
            m.state = WorkloadState::Failed;
            m.exit_code = -1;
            m.message = why;
            m.next_start = Instant::now() + m.restart.next_wait();
            self.dirty = true;
        }
    }

    /// Starts due members, notices exits, checks readiness and finishes stops.
    pub async fn tick(&mut self) {
        let now = Instant::now();
        let keys: Vec<MemberKey> = self.members.keys().cloned().collect();
        for k in keys {
            let Some(m) = self.members.get_mut(&k) else { continue };
            match m.proc.as_mut() {
                None if now >= m.next_start => self.start(&k),
                None => {}
                Some(p) => {
                    if let Ok(Some(status)) = p.child.try_wait() {
                        let tail = String::from_utf8_lossy(&p.stderr_tail.lock_or_recover()).to_string();
                        let code = status.code().unwrap_or(-1);
                        let ran = now.duration_since(m.started_at);
                        if ran >= HEALTHY_RUN {
                            m.restart.reset();
                        }
                        m.next_start = now + m.restart.next_wait();
                        m.state = WorkloadState::Exited;
                        m.exit_code = code;
                        m.message = tail
                            .lines()
                            .rev()
                            .take(5)
                            .collect::<Vec<_>>()
                            .into_iter()
                            .rev()
                            .collect::<Vec<_>>()
                            .join("\n");
                        let policy = m.assignment.workload.as_ref().map(|w| w.restart.as_str()).unwrap_or("");
                        let again = match policy {
                            "never" => false,
                            "on-failure" => code != 0,
                            _ => true,
                        };
                        if again {
                            m.restarts += 1;
                        } else {
                            m.next_start = now + Duration::from_secs(u64::from(u32::MAX));
                            // Nothing more will come: its followers end (its files stay).
                            self.logs.stopped(&k.0, &k.1, &k.2, k.3);
                        }
                        m.proc = None;
                        m.cgroup.remove();
                        tracing::warn!(unit = %k.1, member = %k.2, code, restart_in = ?m.next_start - now, "member exited");
                        self.dirty = true;
                    } else if m.state == WorkloadState::Starting {
                        let path = m.assignment.workload.as_ref().map(|w| w.readiness_path.clone()).unwrap_or_default();
                        let ready = if path.is_empty() {
                            true
                        } else {
                            let port = m.ports.as_ref().map_or(0, |p| p.main);
                            let url = format!("http://127.0.0.1:{port}{path}");
                            self.http.get(url).send().await.is_ok_and(|r| r.status().is_success())
                        };
                        if ready && let Some(m) = self.members.get_mut(&k) {
                            m.state = WorkloadState::Running;
                            tracing::info!(unit = %k.1, member = %k.2, "member ready");
                            self.dirty = true;
                        }
                    }
                }
            }
        }
        if now >= self.next_usage {
            self.next_usage = now + self.cfg.usage_interval;
            self.measure_usage(now);
        }
        let mut still = Vec::new();
        let mut stopped = Vec::new();
        for mut s in self.stopping.drain(..) {
            // Gone, and its output read to the end (or the grace is over: a descendant
            // may hold the pipe open).
            let drained = s.proc.pumps.iter().all(tokio::task::JoinHandle::is_finished) || now >= s.kill_at;
            match s.proc.child.try_wait() {
                Ok(Some(_)) | Err(_) if drained => {
                    s.cgroup.remove();
                    stopped.push(s.key);
                }
                Ok(Some(_)) | Err(_) => still.push(s),
                Ok(None) => {
                    if now >= s.kill_at {
                        signal_group(s.proc.pgid, libc::SIGKILL);
                    }
                    still.push(s);
                }
            }
        }
        self.stopping = still;
        if !stopped.is_empty() {
            for k in stopped.iter().filter(|k| !self.members.contains_key(*k)) {
                self.logs.stopped(&k.0, &k.1, &k.2, k.3);
            }
            self.logs.keep_only(&self.units_here());
        }
    }

    /// Measures every running member; a member whose use moved enough is reported.
    fn measure_usage(&mut self, now: Instant) {
        for m in self.members.values_mut() {
            let Some(pid) = m.proc.as_ref().and_then(|p| p.child.id()) else {
                // Not running (restarting, exited): no data, so nothing scales on it.
                m.cpu_sample = None;
                self.dirty |= m.usage.take().is_some();
                continue;
            };
            let Counters { cpu_ns, memory_bytes } = m.cgroup.counters(Some(pid));
            // CPU is a rate: it needs two samples of the cumulative time.
            let cpu_millis = match (cpu_ns, m.cpu_sample) {
                (Some(ns), Some((then, before))) if now > then => {
                    let elapsed = now.duration_since(then).as_nanos().max(1) as u64;
                    Some(ns.saturating_sub(before).saturating_mul(1000) / elapsed)
                }
                _ => None,
            };
            m.cpu_sample = cpu_ns.map(|ns| (now, ns));
            let (Some(cpu_millis), Some(memory_bytes)) = (cpu_millis, memory_bytes) else { continue };
            let fresh = v1::WorkloadUsage { cpu_millis, memory_bytes };
            if m.usage.as_ref().is_none_or(|old| moved(old, &fresh)) {
                m.usage = Some(fresh);
                self.dirty = true;
            }
        }
    }

    /// True once after any member's state changed.
    pub fn take_dirty(&mut self) -> bool {
        std::mem::take(&mut self.dirty)
    }

    pub fn statuses(&self) -> Vec<v1::WorkloadStatus> {
        self.members
            .iter()
            .map(|(k, m)| v1::WorkloadStatus {
                app: k.0.clone(),
                unit: k.1.clone(),
                member: k.2.clone(),
                generation: k.3,
                state: m.state as i32,
                address: m.ports.as_ref().map(|p| self.address(p.main)).unwrap_or_default(),
                ports: m
                    .ports
                    .as_ref()
                    .map(|p| p.named.iter().map(|(k, v)| (k.clone(), u32::from(*v))).collect())
                    .unwrap_or_default(),
                port_ranges: m
                    .ports
                    .as_ref()
                    .map(|p| {
                        p.ranges
                            .iter()
                            .map(|(k, (a, b))| (k.clone(), v1::PortRange { first: u32::from(*a), last: u32::from(*b) }))
                            .collect()
                    })
                    .unwrap_or_default(),
                exit_code: m.exit_code,
                message: m.message.chars().take(1024).collect(),
                restarts: m.restarts,
                usage: m.usage,
            })
            .collect()
    }

    /// Stops every member: SIGTERM, then SIGKILL after the grace period.
    pub async fn stop_all(&mut self) {
        let keys: Vec<MemberKey> = self.members.keys().cloned().collect();
        for k in keys {
            if let Some(m) = self.members.remove(&k) {
                self.stop(k, m);
            }
        }
        let deadline = Instant::now() + self.cfg.stop_grace + Duration::from_secs(1);
        while !self.stopping.is_empty() && Instant::now() < deadline {
            self.tick().await;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for s in &self.stopping {
            signal_group(s.proc.pgid, libc::SIGKILL);
        }
        for mut s in self.stopping.drain(..) {
            let _ = s.proc.child.wait().await;
            s.cgroup.remove();
        }
        self.cgroups.remove_base();
    }

    /// Pids of running members (tests check they are gone).
    pub fn pids(&self) -> Vec<u32> {
        self.members.values().filter_map(|m| m.proc.as_ref().and_then(|p| p.child.id())).collect()
    }
}

#[cfg(test)]
mod tests;
