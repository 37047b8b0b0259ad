//! `flotilla up`: shards and the control API in this process, agents as child
//! processes (this binary re-executed as `flotilla agent`), each in its own process
//! group. Ctrl-C or SIGTERM drains and stops every agent before `up` exits.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use flotilla_obs::LogFormat;

use crate::secrets::DataDir;
use crate::serve::args::{HttpArgs, LivenessArgs, OriginUrlArgs};
use crate::serve::shutdown_signal;

#[derive(Debug, Args)]
pub struct UpArgs {
    /// Local agents to start (each a distinct node); default 4, or 0 with --autoscale
    /// (the pool starts each node type's min). From the ninth on, each offers one fake
    /// GPU, labelled `gpu_model` `a100` (ninth and tenth, one per domain), `l4`
    /// (eleventh and twelfth), and so on.
    #[arg(long)]
    pub agents: Option<usize>,
    /// Run the pool autoscaler: the pool grows when units are pending and shrinks when
    /// nodes sit idle (Ray autoscaler v2's model; provider `local` by default).
    #[arg(long)]
    pub autoscale: bool,
    /// The pool file for --autoscale; the built-in demo pool (examples/pool.toml) when absent.
    #[arg(long, requires = "autoscale")]
    pub pool: Option<PathBuf>,
    /// Aggregator shards to run in this process.
    #[arg(long, default_value_t = 2)]
    pub shards: usize,
    #[arg(long, default_value = "./.flotilla")]
    pub data: PathBuf,
    /// The control API's address.
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Restart an agent that dies (by default a killed agent stays dead: that is a node loss).
    #[arg(long)]
    pub restart_agents: bool,
    /// With --restart-agents: wait this long first, so the loss is seen as one (a node
    /// that dies and is replaced by a new one later).
    #[arg(long, default_value = "0s", value_parser = crate::cli::http::parse_duration)]
    pub restart_delay: Duration,
    /// An app spec (TOML) to schedule in this process; repeatable.
    #[arg(long = "app")]
    pub apps: Vec<PathBuf>,
    #[command(flatten)]
    pub origin: OriginUrlArgs,
    #[command(flatten)]
    pub liveness: LivenessArgs,
    #[command(flatten)]
    pub http: HttpArgs,
}

/// One local agent: the shape of a node of the demo pool.
struct AgentSpec {
    node_id: String,
    args: Vec<String>,
}

/// Distinct nodes of different sizes, over two domains and three zones, every third
/// one low priority; from the ninth on, each with one fake GPU (`--gpus 1`) of a model
/// specs can select (`gpu_model`: a pair of a100, one per domain, then a pair of l4,
/// …), so small clusters stay CPU-only.
/// They log in `log_format`, like `up` itself.
fn agent_specs(n: usize, aggregators: &str, control: &str, data: &DataDir, log_format: LogFormat) -> Vec<AgentSpec> {
    (0..n)
        .map(|i| {
            let node_id = format!("node-{}", i + 1);
            let domain = ["domain-a", "domain-b"][i % 2];
            let priority = if i % 3 == 2 { "low" } else { "high" };
            let (cores, mem_gib) = [(4, 8u64), (8, 16), (16, 32)][i % 3];
            let mut args: Vec<String> = vec![
                "--log-format".into(),
                log_format.as_arg().into(),
                "agent".into(),
                "--aggregators".into(),
                aggregators.into(),
                "--node-id".into(),
                node_id.clone(),
                "--label".into(),
                format!("domain={domain}"),
                "--label".into(),
                format!("zone=zone-{}", i % 3),
                "--label".into(),
                format!("priority={priority}"),
                "--cores".into(),
                cores.to_string(),
                "--memory".into(),
                (mem_gib << 30).to_string(),
                "--join-token-file".into(),
                data.dir.join("join-token").display().to_string(),
                "--ca".into(),
                data.tls_cert.display().to_string(),
                "--control-plane".into(),
                control.to_string(),
                "--data".into(),
                data.dir.join("agents").join(&node_id).display().to_string(),
                // Local agents share a host: each hands out its own ports.
                "--port-range".into(),
                format!("{}-{}", 20_000 + i * 50, 20_000 + i * 50 + 49),
                "--stop-grace".into(),
                "2s".into(),
                // `touch` it to play a cloud's preemption notice.
                "--preemption-notice-file".into(),
                data.dir.join("agents").join(&node_id).join("preemption-notice").display().to_string(),
                // Write e.g. `cpu_steal=0.8` to it to degrade the node on purpose.
                "--test-health-file".into(),
                data.dir.join("agents").join(&node_id).join("test-health").display().to_string(),
            ];
            if i >= FIRST_GPU_AGENT {
                // A pair per model, so each domain has one of each.
                let model = ["a100", "l4"][(i - FIRST_GPU_AGENT) / 2 % 2];
                args.extend(["--gpus".into(), "1".into(), "--gpu-model".into(), model.into()]);
            }
            AgentSpec { node_id, args }
        })
        .collect()
}

/// The first of `up`'s agents (0-based) that offers a fake GPU.
const FIRST_GPU_AGENT: usize = 8;

/// How long the app schedulers wait for `up`'s own agents to register.
const AGENTS_WAIT: Duration = Duration::from_secs(10);
/// The largest artifact `flotilla artifact push` stores in `up`'s origin.
const DEFAULT_ARTIFACT_MAX: u64 = 64 << 30;

/// Waits (at most `limit`) until `n` nodes are Alive in the view, so the first units are
/// placed over every local node rather than packed on the first to register (node
/// spread holds only over the nodes a placement sees).
async fn wait_for_agents(cluster: &flotilla_view::ClusterView, n: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let alive: usize = cluster
            .slots()
            .iter()
            .map(|s| s.view.nodes.values().filter(|r| r.status == flotilla_core::NodeStatus::Alive).count())
            .sum();
        if alive >= n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(agents = n, "not every local agent registered in time; the app schedulers start anyway");
}

struct Agent {
    spec: AgentSpec,
    child: Option<Child>,
    pid_file: PathBuf,
    /// Whether `pid_file` names the running child; written again on the next tick when
    /// it could not be (a full disk), so operators and tests can always find the agent.
    pid_written: bool,
    /// When a dead agent is due to be started again (with --restart-agents).
    restart_at: Option<Instant>,
}

impl Agent {
    /// Writes the pid file of the running child if it is not written yet; a failure
    /// (a full disk) is logged once and retried on the next tick.
    fn write_pid(&mut self) {
        let Some(child) = &self.child else { return };
        if self.pid_written {
            return;
        }
        match flotilla_obs::fsutil::write_atomic(&self.pid_file, child.id().to_string().as_bytes(), 0o644) {
            Ok(()) => self.pid_written = true,
            Err(e) => tracing::warn!(node = %self.spec.node_id, error = %e, "cannot write the agent's pid file yet"),
        }
    }
}

/// Starts an agent in its own process group, its output appended to its log file (every
/// incarnation's, for whoever looks into a restart).
fn spawn(spec: &AgentSpec, dir: &Path) -> anyhow::Result<Child> {
    let exe = std::env::current_exe().context("finding this binary")?;
    let log_path = dir.join(format!("{}.log", spec.node_id));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .with_context(|| format!("opening {}", log_path.display()))?;
    let mut cmd = Command::new(exe);
    cmd.args(&spec.args).stdin(Stdio::null()).stdout(log.try_clone()?).stderr(log).process_group(0);
    // SAFETY: prctl is async-signal-safe; it only asks the kernel to SIGTERM the child
    // when this process dies, so no agent outlives `up` even if `up` is killed.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.spawn().with_context(|| format!("starting agent {}", spec.node_id))
}

fn signal_group(pid: u32, sig: i32) {
    // SAFETY: plain kill(2) on the agent's own process group (its pid, by process_group(0)).
    unsafe {
        libc::kill(-(pid as i32), sig);
    }
}

pub async fn run(a: UpArgs, log_format: LogFormat) -> anyhow::Result<()> {
    anyhow::ensure!(a.shards >= 1 && a.shards <= 64, "--shards must be within 1..=64");
    let n_agents = a.agents.unwrap_or(if a.autoscale { 0 } else { 4 });
    anyhow::ensure!(n_agents <= 1000, "--agents must be at most 1000");
    // Read before anything starts, so a bad pool file stops `up` at once.
    let pool = if a.autoscale { Some(crate::pool::load_pool(a.pool.as_deref())?) } else { None };
    // From here a SIGTERM or Ctrl-C stops `up` cleanly, even during its start.
    let stop = shutdown_signal();
    let data = DataDir::prepare(&a.data, &[])?;
    let agents_dir = data.dir.join("agents");
    flotilla_obs::fsutil::create_dir_all(&agents_dir)?;

    let mut shards = Vec::new();
    for i in 0..a.shards {
        let mut config = a.liveness.shard_config(([127, 0, 0, 1], 0).into(), i, a.shards, &data)?;
        // Cordons, drains and fencing marks outlive a restart of `up`, as a standalone
        // shard's do (`DATA/shard-I-of-N.state.json`).
        let (state, loaded) = crate::shard_state::open(None, "", &data.dir, i, a.shards).await?;
        config.initial_state = loaded;
        config.state_store = Some(state);
        shards.push(flotilla_aggregator::start(config).await?);
    }
    let addrs: Vec<String> = shards.iter().map(|s| s.addr.to_string()).collect();
    let token = data.grpc_tokens.first().map(String::as_str).unwrap_or_default();
    let dialer = flotilla_proto::dial::Dialer::network().on_io_thread().with_token(token)?;
    // Shards, schedulers and the control plane follow the token files: no restart rotates.
    use crate::serve::tokens::{api_token_file, grpc_token_file, join_token_file, reload_tokens};
    let remote = a.origin.remote()?;
    let origin =
        flotilla_control::artifacts::Origin::open(data.dir.join("artifacts"), DEFAULT_ARTIFACT_MAX, None, 0.0, remote)?;
    reload_tokens(join_token_file(&data, shards.iter().map(|s| s.registry.clone()).collect(), Some(origin.clone())))?;
    let auths = shards.iter().map(|s| s.grpc_auth.clone()).collect();
    reload_tokens(grpc_token_file(&data, auths, vec![dialer.clone()]))?;
    let api_token = flotilla_core::SharedToken::new(Some(data.api_token.clone()));
    reload_tokens(api_token_file(data.dir.join("api-token"), api_token.clone()))?;
    let tokens = Arc::new(
        flotilla_control::tokens::Tokens::open(Some(data.dir.join("tokens.toml"))).map_err(anyhow::Error::msg)?,
    );
    crate::serve::tokens::follow_token_book(tokens.clone())?;

    let cluster = flotilla_view::ClusterView::new(a.shards);
    flotilla_control::follow_all(&cluster, &addrs, &dialer);
    let state = Arc::new(flotilla_control::ControlState {
        cluster: cluster.clone(),
        shards: addrs.clone(),
        api_token,
        tokens,
        journal: Arc::new(
            flotilla_control::journal::Journal::open(&data.dir.join("events.redb"), Default::default())
                .map_err(anyhow::Error::msg)?,
        ),
        series: Arc::new(
            flotilla_control::series::Series::open(&data.dir.join("history.redb")).map_err(anyhow::Error::msg)?,
        ),
        apps: Default::default(),
        scheduler_networks: Default::default(),
        http: a.http.client()?,
        dialer: dialer.clone(),
        policies: flotilla_control::Policies::open(data.dir.join("policies"))?,
        pools: flotilla_control::Pools::open(data.dir.join("pools"))?,
        replicas: None,
        artifacts: Some(origin),
    });
    flotilla_control::record_events(state.clone());
    let options = a.http.options()?;
    let scheme = options.scheme();
    // Started once the local agents registered (see `wait_for_agents`).
    let mut schedulers = Vec::new();
    if !a.apps.is_empty() {
        let store: Arc<dyn flotilla_scheduler::Store> =
            Arc::new(flotilla_scheduler::RedbStore::open(&data.dir.join("state.redb"))?);
        let channels = flotilla_scheduler::ShardChannels::new(addrs.len());
        for path in &a.apps {
            let spec = crate::serve::scheduler::load_spec(path)?;
            let (scheduler, handle) =
                flotilla_scheduler::Scheduler::new(spec, cluster.clone(), addrs.clone(), store.clone())?;
            state.apps.add_local(handle);
            schedulers.push(
                scheduler
                    .with_dialer(dialer.clone())
                    .with_channels(channels.clone())
                    .with_policies(state.policies.book()),
            );
        }
    }
    let listener = tokio::net::TcpListener::bind(a.listen)
        .await
        .with_context(|| format!("binding the control API on {} (is another `flotilla up` running?)", a.listen))?;
    let listen = listener.local_addr()?;
    // For scripts and tests that started us on port 0.
    flotilla_obs::fsutil::write_atomic(
        &data.dir.join("control.addr"),
        format!("{scheme}://{listen}").as_bytes(),
        0o644,
    )?;
    let (stop_api, api_stopped) = tokio::sync::oneshot::channel::<()>();
    let api = tokio::spawn(flotilla_control::serve(listener, state, options, async {
        let _ = api_stopped.await;
    }));

    let joined = addrs.join(",");
    // For scripts and tests that add agents of their own (`--aggregators $(cat …)`).
    flotilla_obs::fsutil::write_atomic(&data.dir.join("aggregators"), joined.as_bytes(), 0o644)?;
    let (stop_pool, pool_stopped) = tokio::sync::oneshot::channel::<()>();
    let pool_task = match pool {
        Some(cfg) => {
            let join = crate::pool::AgentJoin {
                aggregators: joined.clone(),
                join_token_file: data.dir.join("join-token"),
                ca: data.tls_cert.clone(),
                log_format,
                control_plane: format!("{scheme}://{listen}"),
            };
            let provider = crate::pool::provider(&cfg, &data.dir, &join, true)?;
            let url = format!("{scheme}://{listen}");
            let scaler = crate::pool::autoscaler(
                cfg,
                &data.dir,
                provider.clone(),
                cluster.clone(),
                &url,
                a.http.client()?,
                Some(data.api_token.clone()),
            )
            .await?;
            println!("  pool autoscaler: {} (flotilla pool)", crate::pool::pool_source(a.pool.as_deref()));
            Some((
                tokio::spawn(scaler.run(async {
                    let _ = pool_stopped.await;
                })),
                provider,
            ))
        }
        None => None,
    };
    let mut agents: Vec<Agent> = Vec::new();
    for spec in agent_specs(n_agents, &joined, &format!("{scheme}://{listen}"), &data, log_format) {
        let child = spawn(&spec, &agents_dir)?;
        let pid_file = agents_dir.join(format!("{}.pid", spec.node_id));
        let mut agent = Agent { spec, child: Some(child), pid_file, pid_written: false, restart_at: None };
        agent.write_pid();
        agents.push(agent);
    }
    if !schedulers.is_empty() {
        wait_for_agents(&cluster, n_agents, AGENTS_WAIT).await;
    }
    let schedulers: Vec<_> = schedulers.into_iter().map(|s| tokio::spawn(s.run())).collect();
    println!("flotilla is up: {} shard(s) at {joined}, {n_agents} agent(s)", a.shards);
    println!("  control API and /metrics: {scheme}://{listen}");
    println!("  export FLOTILLA_ADDR={scheme}://{listen} FLOTILLA_DATA={}", data.dir.display());
    if let Some(cert) = &a.http.tls_cert {
        println!("  HTTPS with {}: clients need FLOTILLA_CA=<the CA that signed it>", cert.display());
    }
    println!("  try: flotilla nodes");

    let mut poll = tokio::time::interval(Duration::from_millis(500));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            _ = &mut stop => break,
            _ = poll.tick() => {}
        }
        for agent in &mut agents {
            if let Some(child) = agent.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                tracing::warn!(node = %agent.spec.node_id, %status, "agent exited");
                agent.child = None;
                agent.pid_written = false;
                let _ = std::fs::remove_file(&agent.pid_file);
                if a.restart_agents {
                    agent.restart_at = Some(Instant::now() + a.restart_delay);
                }
            }
            if agent.restart_at.is_some_and(|t| Instant::now() >= t) {
                match spawn(&agent.spec, &agents_dir) {
                    Ok(c) => {
                        agent.child = Some(c);
                        agent.restart_at = None;
                    }
                    // A full disk or a lack of processes passes: try again after the delay.
                    Err(e) => {
                        tracing::error!(node = %agent.spec.node_id, error = %format!("{e:#}"), "restarting agent; retrying");
                        agent.restart_at = Some(Instant::now() + a.restart_delay);
                    }
                }
            }
            agent.write_pid();
        }
    }

    // The schedulers stop first: the agents' drains below are `up` going away, not
    // nodes to replace units from (they would queue a replacement for every unit, kept
    // in the store for the next start). Stopping one mid-pass is a crash it recovers
    // from at the next start, as from kill -9.
    for s in &schedulers {
        s.abort();
    }
    for s in schedulers {
        let _ = s.await;
    }
    if let Some((task, provider)) = pool_task {
        let _ = stop_pool.send(());
        let _ = task.await;
        // The pool's agents stop with `up`, as the static ones do.
        match provider.list().await {
            Ok(instances) => {
                println!("stopping: {} pool instance(s)", instances.len());
                for i in instances {
                    if let Err(e) = provider.terminate(&i.id).await {
                        tracing::warn!(instance = %i.id, error = %e, "stopping a pool instance");
                    }
                }
            }
            Err(e) => tracing::warn!(error = %e, "listing the pool's instances to stop them"),
        }
    }
    println!("stopping: draining {} agent(s)", agents.iter().filter(|a| a.child.is_some()).count());
    for agent in &agents {
        if let Some(c) = &agent.child {
            signal_group(c.id(), libc::SIGTERM);
        }
    }
    // Agents drain, then give their workloads 2 s between SIGTERM and SIGKILL.
    let deadline = Instant::now() + Duration::from_secs(10);
    for agent in &mut agents {
        if let Some(child) = agent.child.as_mut() {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            if matches!(child.try_wait(), Ok(None)) {
                tracing::warn!(node = %agent.spec.node_id, "agent did not stop in time; killing it");
            }
            // The whole group, so nothing the agent started survives it.
            signal_group(child.id(), libc::SIGKILL);
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&agent.pid_file);
    }
    let _ = stop_api.send(());
    let _ = api.await;
    for s in shards {
        s.shutdown().await;
    }
    println!("stopped");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn agents_log_in_the_format_up_was_given() {
        let dir = PathBuf::from("/nonexistent/flotilla-up-test");
        let data = DataDir {
            dir: dir.clone(),
            join_tokens: vec![],
            api_token: String::new(),
            grpc_tokens: vec![],
            shard_secret: String::new(),
            tls_cert: dir.join("tls.crt"),
            tls_key: dir.join("tls.key"),
        };
        for format in [LogFormat::Text, LogFormat::Json] {
            let spec = agent_specs(1, "127.0.0.1:7000", "http://127.0.0.1:7700", &data, format).remove(0);
            // The child's command line, as `flotilla` itself will parse it.
            let cli = crate::Cli::try_parse_from(std::iter::once("flotilla".to_string()).chain(spec.args))
                .unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(cli.log.format(), format);
            assert!(matches!(cli.cmd, crate::Cmd::Agent(_)));
        }
    }
}
