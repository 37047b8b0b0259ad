//! The node agent: registers its node with the shard that owns its domain, sends one
//! sealed heartbeat a second, and deregisters (drains) before it exits.
//!
//! The same code runs as the `flotilla-agent` binary (the DaemonSet) and as
//! `flotilla agent` (so `flotilla up` can start agents by re-executing itself).

pub mod artifacts;
pub mod catalogue;
pub mod cgroup;
pub mod client;
pub mod config;
pub mod logs;
pub mod nodelabels;
pub mod ports;
pub mod probe;
pub mod runtime;
pub mod shard_requests;

use crate::catalogue as m;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context, anyhow};
use flotilla_core::{Backoff, PROTOCOL_VERSION, shard_for_domain};
use flotilla_proto::seal::{self, Direction, Format, Header, MAGIC_HEARTBEAT, SessionKey};
use flotilla_proto::v1;
use prost::Message;
use rand::Rng;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

pub use client::ShardConnection;
pub use config::{AgentArgs, AgentConfig, Host};

/// The file in the data dir holding the running agent's pid.
pub const PID_FILE: &str = "agent.pid";
/// The Unix socket in the data dir on which the agent takes `drain`.
pub const CONTROL_SOCKET: &str = "agent.sock";

/// Why the agent stops.
enum Stop {
    /// SIGTERM or SIGINT.
    Signal,
    /// `flotilla-agent drain`; the answer is written back on its connection.
    Drain(tokio::net::unix::OwnedWriteHalf),
}

fn unix_nanos() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
}

/// The shard that owns this node's domain: its index and its `--aggregators` entry (one
/// address, or the active process and its standbys, `a|b`).
fn owning_shard(config: &AgentConfig) -> (usize, String) {
    let idx = shard_for_domain(config.labels.domain(), config.aggregators.len());
    (idx, config.aggregators[idx].clone())
}

/// Resolves one shard address to a socket address and the host name TLS checks.
async fn resolve(name: &str) -> anyhow::Result<(SocketAddr, String)> {
    let addr = tokio::net::lookup_host(name)
        .await
        .with_context(|| format!("resolving shard address {name}"))?
        .next()
        .ok_or_else(|| anyhow!("{name} resolves to no address"))?;
    let host = name.rsplit_once(':').map(|(h, _)| h.to_string()).unwrap_or_else(|| name.to_string());
    Ok((addr, host))
}

fn unspecified(for_addr: &SocketAddr) -> SocketAddr {
    match for_addr.ip() {
        IpAddr::V4(_) => SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), 0),
        IpAddr::V6(_) => SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), 0),
    }
}

/// This node's address on the interface whose route reaches `shard`: what peers on the
/// shard's network reach it by (127.0.0.1 when the shard is on loopback). A connected
/// UDP socket picks it; nothing is sent.
pub fn local_address_toward(shard: SocketAddr) -> anyhow::Result<IpAddr> {
    let sock = std::net::UdpSocket::bind(unspecified(&shard))?;
    sock.connect(shard).with_context(|| format!("no route to the shard at {shard}"))?;
    Ok(sock.local_addr()?.ip())
}

/// Runs the agent until it is told to stop; always tries to drain first.
pub async fn run(config: AgentConfig) -> anyhow::Result<()> {
    let incarnation = unix_nanos();
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data dir {}", config.data_dir.display()))?;
    let files = StateFiles::spawn(config.data_dir.clone());
    files.set(PID_FILE, std::process::id().to_string());
    // /readyz: ready once registered with the shard that owns this node's domain.
    let ready = flotilla_obs::health::readiness().flag("agent", "not registered with its shard yet");
    let metrics_addr = flotilla_obs::serve_metrics(config.metrics.unwrap_or(([127, 0, 0, 1], 0).into())).await?;
    files.set("metrics.addr", metrics_addr.to_string());
    let (stop_tx, mut stop_rx) = mpsc::channel::<Stop>(4);
    if let Err(e) = spawn_control_socket(&config.data_dir, stop_tx.clone()) {
        // Not worth dying for (a full disk may refuse the socket's inode): SIGTERM drains too.
        tracing::warn!(error = %format!("{e:#}"), "no control socket: `flotilla-agent drain` cannot reach this agent");
    }
    spawn_signals(stop_tx)?;

    let (shard, entry) = owning_shard(&config);
    let alternates = flotilla_core::shard_alternates(&entry).len();
    let mut alternate = 0;
    let (mut addr, mut host) = resolve(flotilla_core::shard_alternate(&entry, alternate)).await?;
    let span = tracing::info_span!("agent", node = %config.node_id, incarnation, shard);
    let _g = span.enter();
    tracing::info!(%addr, capacity = ?config.capacity, labels = ?config.labels, "agent starting");
    let endpoint = client::client_endpoint(&config.ca, unspecified(&addr))?;
    let mut probe = probe::HealthProbe::new(config.preemption_notice_file.clone(), config.test_health_file.clone());
    // Jittered, so the agents of a restarted shard do not all come back at once.
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(10)).with_jitter(0.5);
    let sent = metrics::counter!(m::HEARTBEATS_SENT.name);
    // The version of the assignment set this agent holds (reported in heartbeats).
    let assignments = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut rt_config = config.runtime.clone();
    rt_config.advertise_host = match &config.advertise_host {
        Some(host) => host.clone(),
        None => local_address_toward(addr)?.to_string(),
    };
    tracing::info!(advertise = %rt_config.advertise_host, "members are reached at this host");
    let tokens: Vec<String> = match config.join_token_file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
        Some(text) => artifacts::tokens_in(&text),
        None => vec![config.join_token.clone()],
    };
    let mut rt = runtime::Runtime::new(rt_config.clone());
    let arts = match artifacts::start(
        &config.artifacts,
        config.node_id.as_str(),
        &config.data_dir,
        &rt_config.advertise_host,
        &tokens,
    ) {
        Ok(a) => {
            if let Some(file) = &config.join_token_file {
                artifacts::follow_keys(a.clone(), file.clone(), tokens.clone());
            }
            rt = rt.with_artifacts(a.clone());
            Some(a)
        }
        // Members without artifacts run all the same; those with fail saying why.
        Err(e) => {
            tracing::error!(error = %format!("{e:#}"), "no artifact cache: members that need artifacts fail");
            None
        }
    };
    let rt = rt;
    let answers = std::sync::Arc::new(shard_requests::Answers {
        logs: rt.logs(),
        node_id: config.node_id.to_string(),
        readers: std::sync::Arc::new(tokio::sync::Semaphore::new(shard_requests::MAX_READERS)),
        artifacts: arts,
    });
    let (runtime, workloads) = spawn_runtime(rt);

    loop {
        // Register (again), with jittered back-off while the shard is away.
        let registered = tokio::select! {
            r = register(&endpoint, addr, &host, &config, incarnation, &mut probe, (workloads.borrow().1.clone(), assignments.load(std::sync::atomic::Ordering::Relaxed))) => r,
            stop = stop_rx.recv() => return finish(stop, None, &config, &runtime).await,
        };
        let (conn, session) = match registered {
            Ok(x) => {
                backoff.reset();
                ready.ready();
                metrics::counter!(m::REGISTRATIONS.name, "result" => "ok").increment(1);
                x
            }
            Err(e) => {
                metrics::counter!(m::REGISTRATIONS.name, "result" => "error").increment(1);
                if e.is_fatal() {
                    return Err(anyhow::Error::from(e).context("the shard refused this agent"));
                }
                let wait = backoff.next_wait();
                ready.not_ready(format!("registering with shard {shard} at {addr}: {e}"));
                tracing::warn!(error = %e, retry_in = ?wait, %addr, "registration failed");
                if alternates > 1 {
                    // The shard's standby may serve now: the next try goes to the next address.
                    alternate += 1;
                    next_alternate(&entry, alternate, &mut addr, &mut host).await;
                }
                tokio::select! {
                    _ = tokio::time::sleep(wait) => continue,
                    stop = stop_rx.recv() => return finish(stop, None, &config, &runtime).await,
                }
            }
        };
        tracing::info!(session = session.session_id, "registered");
        let receiver = tokio::spawn(receive_assignments(
            conn.clone(),
            files.clone(),
            assignments.clone(),
            runtime.clone(),
            config.node_id.to_string(),
        ));
        let shard_server = tokio::spawn(shard_requests::serve(conn.conn.clone(), answers.clone()));
        // Whatever runs now is reported to the (possibly new) shard at once.
        let mut reports = workloads.clone();
        reports.mark_changed();
        let mut reporter =
            tokio::spawn(report_workloads(conn.clone(), reports, config.node_id.to_string(), session.session_id));
        let key: SessionKey = session.key.as_slice().try_into().map_err(|_| anyhow!("session key is not 32 bytes"))?;
        let hb_port = u16::try_from(session.heartbeat_port).map_err(|_| anyhow!("bad heartbeat port"))?;
        let sock = tokio::net::UdpSocket::bind(unspecified(&addr)).await?;
        sock.connect(SocketAddr::new(addr.ip(), hb_port)).await?;
        let interval_ms = u64::from(session.heartbeat_interval_ms).clamp(100, 60_000);
        let mut tick = tokio::time::interval(Duration::from_millis(interval_ms).min(config.heartbeat_interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut seq = 0u64;
        let (mut out, mut scratch, mut buf) = (Vec::new(), Vec::new(), vec![0u8; 2048]);
        let reason = loop {
            tokio::select! {
                _ = tick.tick() => {
                    seq += 1;
                    let body = v1::HeartbeatBody {
                        health: Some((&probe.sample()).into()),
                        assignment_version: assignments.load(std::sync::atomic::Ordering::Relaxed),
                        sent_at_unix_ms: unix_nanos() / 1_000_000,
                    };
                    let h = Header { magic: MAGIC_HEARTBEAT, format: Format::Mac, session_id: session.session_id, seq, incarnation, node_id: config.node_id.as_str() };
                    if seal::seal(&key, &h, &body.encode_to_vec(), &mut out).is_ok() {
                        // A refused send shows up as ConnectionRefused on the next receive.
                        if sock.send(&out).await.is_ok() { sent.increment(1); }
                    }
                }
                r = sock.recv(&mut buf) => match r {
                    Ok(n) => if let Some(action) = open_reply(&key, &buf[..n], &mut scratch) {
                        metrics::counter!(m::HEARTBEAT_REPLIES.name, "action" => action.as_str_name()).increment(1);
                        if action == v1::HeartbeatAction::Reregister { break "the shard asked to register again"; }
                    },
                    Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break "the shard is not listening",
                    Err(e) => tracing::debug!(error = %e, "heartbeat socket"),
                },
                _ = &mut reporter => break "the workload runtime stopped",
                _ = conn.conn.closed() => break "the QUIC connection closed",
                stop = stop_rx.recv() => return finish(stop, Some((&conn, session.session_id)), &config, &runtime).await,
            }
        };
        receiver.abort();
        shard_server.abort();
        reporter.abort();
        ready.not_ready(format!("re-registering with shard {shard}: {reason}"));
        tracing::warn!(reason, "re-registering");
        if alternates > 1 && matches!(conn.conn.close_reason(), Some(quinn::ConnectionError::TimedOut)) {
            // The shard went silent (its host cut off, say): its standby may serve by now,
            // and a waiting one refuses at once, so trying it first costs a round trip.
            alternate += 1;
            next_alternate(&entry, alternate, &mut addr, &mut host).await;
        }
        let wait = Duration::from_millis(rand::rng().random_range(100..1000));
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            stop = stop_rx.recv() => return finish(stop, Some((&conn, session.session_id)), &config, &runtime).await,
        }
    }
}

/// Points `addr` and `host` at alternate number `alternate` (modulo their count) of the
/// shard's `--aggregators` entry; keeps them if it does not resolve.
async fn next_alternate(entry: &str, alternate: usize, addr: &mut SocketAddr, host: &mut String) {
    let next = flotilla_core::shard_alternate(entry, alternate);
    match resolve(next).await {
        Ok((a, h)) => (*addr, *host) = (a, h),
        Err(e) => tracing::warn!(error = %format!("{e:#}"), next, "shard alternate does not resolve"),
    }
}

/// Reports what this node runs to its shard whenever it changes. On a task of its own:
/// a report the shard does not answer (a one-way partition, a busy shard) must never
/// hold up a heartbeat. A failed report is sent again, with the newest list, a second
/// later. Returns when the runtime stops.
async fn report_workloads(
    conn: ShardConnection,
    mut workloads: tokio::sync::watch::Receiver<RuntimeView>,
    node_id: String,
    session_id: u64,
) {
    while workloads.changed().await.is_ok() {
        let list = workloads.borrow_and_update().0.clone();
        let report = v1::ReportWorkloads { node_id: node_id.clone(), session_id, workloads: list };
        let req = v1::AgentRequest { request: Some(v1::agent_request::Request::Workloads(report)) };
        let failed = match tokio::time::timeout(Duration::from_secs(3), conn.request(req)).await {
            Ok(Ok(_)) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(_) => Some("no answer in 3 s".to_string()),
        };
        if let Some(error) = failed {
            tracing::warn!(%error, "workload report failed; will resend");
            workloads.mark_changed();
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// How often a state file that could not be written is tried again.
const STATE_RETRY: Duration = Duration::from_secs(5);

/// The agent's state files in its data dir (agent.pid, metrics.addr, assignments.json),
/// written atomically by a task of their own. A write that fails (a full disk) is kept
/// and tried again every [`STATE_RETRY`] until it succeeds or a newer content replaces
/// it; the agent never stops for it. One warning when a file starts failing, one note
/// when it is written again.
#[derive(Clone)]
struct StateFiles {
    tx: mpsc::UnboundedSender<(&'static str, String)>,
}

impl StateFiles {
    fn spawn(dir: PathBuf) -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<(&'static str, String)>();
        tokio::spawn(async move {
            let mut pending: std::collections::BTreeMap<&'static str, String> = Default::default();
            let mut failing: std::collections::BTreeSet<&'static str> = Default::default();
            loop {
                if pending.is_empty() {
                    match rx.recv().await {
                        Some((name, text)) => pending.insert(name, text),
                        None => return,
                    };
                } else {
                    tokio::select! {
                        msg = rx.recv() => match msg {
                            Some((name, text)) => { pending.insert(name, text); }
                            None => return,
                        },
                        _ = tokio::time::sleep(STATE_RETRY) => {}
                    }
                }
                // Newer contents that arrived meanwhile replace what is pending.
                while let Ok((name, text)) = rx.try_recv() {
                    pending.insert(name, text);
                }
                pending.retain(|name, text| {
                    let path = dir.join(name);
                    match flotilla_obs::fsutil::write_atomic(&path, text.as_bytes(), 0o644) {
                        Ok(()) => {
                            if failing.remove(name) {
                                tracing::info!(path = %path.display(), "state file written again");
                            }
                            false
                        }
                        Err(e) => {
                            metrics::counter!(m::FILE_WRITE_ERRORS.name, "file" => *name).increment(1);
                            if failing.insert(name) {
                                tracing::warn!(error = %e, retry_every = ?STATE_RETRY, "state file not written; will retry");
                            }
                            true
                        }
                    }
                });
            }
        });
        StateFiles { tx }
    }

    /// Sets the content of `name`; written at once, or later if it cannot be now.
    fn set(&self, name: &'static str, text: String) {
        let _ = self.tx.send((name, text));
    }
}

/// The file in the data dir holding the assignments this node was last given.
pub const ASSIGNMENTS_FILE: &str = "assignments.json";

#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    OtherNode,
    Stale,
}

/// Whether a push is for this node and newer than what it holds.
fn admit(push: &v1::AssignmentPush, node_id: &str, held: u64) -> Result<(), Refusal> {
    if push.node_id != node_id {
        return Err(Refusal::OtherNode);
    }
    if push.assignment_version <= held {
        return Err(Refusal::Stale);
    }
    Ok(())
}

/// Takes assignment pushes from the shard and keeps the newest set (the workload
/// runtime acts on it).
async fn receive_assignments(
    conn: ShardConnection,
    files: StateFiles,
    version: std::sync::Arc<std::sync::atomic::AtomicU64>,
    runtime: mpsc::Sender<RuntimeCmd>,
    node_id: String,
) {
    use std::sync::atomic::Ordering;
    let gauge = metrics::gauge!(m::ASSIGNMENTS.name);
    while let Ok(mut stream) = conn.conn.accept_uni().await {
        let Ok(bytes) = stream.read_to_end(flotilla_proto::MAX_CONTROL_MESSAGE).await else { continue };
        let Ok(push) = v1::AssignmentPush::decode(bytes.as_slice()) else {
            tracing::warn!("undecodable assignment push");
            continue;
        };
        match admit(&push, &node_id, version.load(Ordering::Relaxed)) {
            Ok(()) => {}
            Err(Refusal::Stale) => continue, // an older push arriving late
            Err(Refusal::OtherNode) => {
                metrics::counter!(m::ASSIGNMENTS_REFUSED.name).increment(1);
                tracing::warn!(for_node = %push.node_id, "refused assignments meant for another node");
                continue;
            }
        }
        version.store(push.assignment_version, Ordering::Relaxed);
        gauge.set(push.assignments.len() as f64);
        tracing::info!(version = push.assignment_version, members = push.assignments.len(), "assignments received");
        let rows: Vec<serde_json::Value> = push
            .assignments
            .iter()
            .map(|a| {
                let w = a.workload.clone().unwrap_or_default();
                serde_json::json!({
                    "app": a.app, "unit": a.unit, "member": a.member, "generation": a.generation,
                    "role": w.role, "command": w.command, "args": w.args,
                    "cpu_millis": a.resources.as_ref().map(|r| r.cpu_millis).unwrap_or(0),
                    "memory_bytes": a.resources.as_ref().map(|r| r.memory_bytes).unwrap_or(0),
                })
            })
            .collect();
        let doc = serde_json::json!({"assignment_version": push.assignment_version, "assignments": rows});
        files.set(ASSIGNMENTS_FILE, doc.to_string());
        if runtime.send(RuntimeCmd::Assign(push.assignments)).await.is_err() {
            return;
        }
    }
}

/// In the data dir once the node has registered (`--cordoned` applies before that only).
const REGISTERED_ONCE: &str = "registered-once";

async fn register(
    endpoint: &quinn::Endpoint,
    addr: SocketAddr,
    host: &str,
    config: &AgentConfig,
    incarnation: u64,
    probe: &mut probe::HealthProbe,
    running: (Vec<v1::Assignment>, u64),
) -> Result<(ShardConnection, v1::Session), client::ShardError> {
    let conn = ShardConnection::connect(endpoint, addr, host).await?;
    let req = v1::RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        join_token: config.current_join_token(),
        node_id: config.node_id.to_string(),
        incarnation,
        labels: config.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        capacity: Some((&config.capacity).into()),
        assignments: running.0,
        health: Some((&probe.sample()).into()),
        assignment_version: running.1,
        cordoned: config.cordoned && !config.data_dir.join(REGISTERED_ONCE).exists(),
    };
    let session = conn.register(req).await?;
    if config.cordoned {
        // `--cordoned` is for the node's first registration only: a warm node its pool
        // claimed (uncordoned) must not come back cordoned after a shard restart or an
        // agent restart. Best effort: without the mark it is cordoned again, and its pool
        // or an operator uncordons it.
        if let Err(e) = std::fs::write(config.data_dir.join(REGISTERED_ONCE), b"") {
            tracing::warn!(error = %e, "cannot record the first registration");
        }
    }
    Ok((conn, session))
}

fn open_reply(key: &SessionKey, datagram: &[u8], scratch: &mut Vec<u8>) -> Option<v1::HeartbeatAction> {
    let h = seal::parse_header(datagram).ok()?;
    if h.magic != seal::MAGIC_REPLY {
        return None;
    }
    let body = seal::open(key, Direction::ToAgent, datagram, &h, scratch).ok()?;
    let reply = v1::HeartbeatReply::decode(body).ok()?;
    v1::HeartbeatAction::try_from(reply.action).ok()
}

/// Commands to the workload runtime task.
#[derive(Debug)]
pub enum RuntimeCmd {
    Assign(Vec<v1::Assignment>),
    /// The node is draining: keep every workload as it is (schedulers releasing them must
    /// not stop them before routers dropped the node) until `StopAll`.
    Freeze,
    StopAll(tokio::sync::oneshot::Sender<()>),
}

/// What the runtime reports: member statuses and the assignments it runs.
type RuntimeView = (Vec<v1::WorkloadStatus>, Vec<v1::Assignment>);

/// Runs the workload runtime in its own task, so members keep being supervised while
/// the agent registers again or backs off.
fn spawn_runtime(mut rt: runtime::Runtime) -> (mpsc::Sender<RuntimeCmd>, tokio::sync::watch::Receiver<RuntimeView>) {
    let (tx, mut rx) = mpsc::channel(16);
    let (view_tx, view_rx) = tokio::sync::watch::channel((Vec::new(), Vec::new()));
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_millis(200));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut frozen = false;
        loop {
            tokio::select! {
                _ = tick.tick() => rt.tick().await,
                cmd = rx.recv() => match cmd {
                    Some(RuntimeCmd::Assign(list)) if !frozen => rt.assign(list),
                    Some(RuntimeCmd::Assign(_)) => tracing::debug!("draining: assignments held until the workloads stop"),
                    Some(RuntimeCmd::Freeze) => frozen = true,
                    Some(RuntimeCmd::StopAll(done)) => {
                        rt.stop_all().await;
                        let _ = done.send(());
                        return;
                    }
                    None => {
                        rt.stop_all().await;
                        return;
                    }
                },
            }
            if rt.take_dirty() {
                let _ = view_tx.send((rt.statuses(), rt.assignments()));
            }
        }
    });
    (tx, view_rx)
}

/// Deregisters (drains), stops every workload, and answers whoever asked.
async fn finish(
    stop: Option<Stop>,
    conn: Option<(&ShardConnection, u64)>,
    config: &AgentConfig,
    runtime: &mpsc::Sender<RuntimeCmd>,
) -> anyhow::Result<()> {
    let _ = runtime.send(RuntimeCmd::Freeze).await;
    let outcome = match conn {
        Some((c, sid)) => {
            match tokio::time::timeout(Duration::from_secs(3), c.drain(config.node_id.as_str(), sid)).await {
                Ok(Ok(ack)) => {
                    let status = v1::NodeStatus::try_from(ack.status).map(|s| s.as_str_name()).unwrap_or("?");
                    // The node is Draining in the view now: routes drop it while its
                    // workloads still serve, and only then do they stop.
                    tokio::time::sleep(config.drain_delay).await;
                    format!("ok {} {status}", config.node_id)
                }
                Ok(Err(e)) => format!("error {e}"),
                Err(_) => "error the shard did not answer the drain in 3 s".into(),
            }
        }
        None => "error not registered; nothing to drain".into(),
    };
    let (done, stopped) = tokio::sync::oneshot::channel();
    if runtime.send(RuntimeCmd::StopAll(done)).await.is_ok() {
        let _ = stopped.await;
    }
    tracing::info!(%outcome, "agent stopping");
    if let Some(Stop::Drain(mut w)) = stop {
        let _ = w.write_all(format!("{outcome}\n").as_bytes()).await;
        let _ = w.shutdown().await;
    }
    let _ = std::fs::remove_file(config.data_dir.join(CONTROL_SOCKET));
    let _ = std::fs::remove_file(config.data_dir.join(PID_FILE));
    Ok(())
}

fn spawn_signals(tx: mpsc::Sender<Stop>) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let _ = tx.send(Stop::Signal).await;
    });
    Ok(())
}

fn spawn_control_socket(data: &Path, tx: mpsc::Sender<Stop>) -> anyhow::Result<()> {
    let path = data.join(CONTROL_SOCKET);
    let _ = std::fs::remove_file(&path);
    let listener =
        tokio::net::UnixListener::bind(&path).with_context(|| format!("binding control socket {}", path.display()))?;
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let tx = tx.clone();
            tokio::spawn(async move {
                let (r, mut w) = stream.into_split();
                let mut line = String::new();
                let mut r = tokio::io::BufReader::new(r).take_limited();
                if r.read_line(&mut line).await.is_err() {
                    return;
                }
                if line.trim() == "drain" {
                    // The agent answers on `w` once the shard acknowledged the drain.
                    let _ = tx.send(Stop::Drain(w)).await;
                } else {
                    let answer = format!("error unknown command {:?}; the only command is drain\n", line.trim());
                    let _ = w.write_all(answer.as_bytes()).await;
                }
            });
        }
    });
    Ok(())
}

/// Reads at most 256 bytes of a command line.
trait TakeLimited: Sized {
    fn take_limited(self) -> tokio::io::Take<Self>;
}

impl<R: tokio::io::AsyncRead> TakeLimited for tokio::io::BufReader<R> {
    fn take_limited(self) -> tokio::io::Take<Self> {
        tokio::io::AsyncReadExt::take(self, 256)
    }
}

/// `flotilla-agent drain`: asks the agent running with data dir `data` to leave now,
/// and prints its answer. Exits non-zero when the drain failed.
pub async fn drain_command(data: &Path) -> anyhow::Result<String> {
    let path: PathBuf = data.join(CONTROL_SOCKET);
    let stream = tokio::net::UnixStream::connect(&path)
        .await
        .with_context(|| format!("no agent is running with data dir {} ({})", data.display(), path.display()))?;
    let (r, mut w) = stream.into_split();
    w.write_all(b"drain\n").await?;
    let mut line = String::new();
    tokio::time::timeout(Duration::from_secs(10), tokio::io::BufReader::new(r).read_line(&mut line))
        .await
        .map_err(|_| anyhow!("the agent did not answer within 10 s"))??;
    let line = line.trim().to_string();
    if line.starts_with("ok") { Ok(line) } else { Err(anyhow!("drain failed: {line}")) }
}

/// Entry point shared by `flotilla agent` and `flotilla-agent`.
pub fn main_with(cmd: config::AgentCommand) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    match cmd.sub {
        Some(config::AgentSub::Drain { data }) => {
            let answer = rt.block_on(drain_command(&data))?;
            println!("{answer}");
            Ok(())
        }
        None => {
            let mut host = Host::detect();
            if cmd.run.node_labels_from_kubernetes {
                let node = cmd.run.node_id.clone().or(host.hostname.clone()).unwrap_or_default();
                host.node_labels = rt
                    .block_on(nodelabels::from_cluster(&node, &host.env))
                    .with_context(|| format!("--node-labels-from-kubernetes: the labels of node {node}"))?;
            }
            let config = cmd
                .run
                .into_config(&host)
                .map_err(|errors| anyhow!("invalid agent configuration:\n  - {}", errors.join("\n  - ")))?;
            rt.block_on(run(config))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushes_for_other_nodes_or_older_versions_are_refused() {
        let push = v1::AssignmentPush { assignment_version: 5, assignments: vec![], node_id: "n1".into() };
        assert_eq!(admit(&push, "n1", 4), Ok(()));
        assert_eq!(admit(&push, "n2", 4), Err(Refusal::OtherNode));
        assert_eq!(admit(&push, "n1", 5), Err(Refusal::Stale));
    }
}
