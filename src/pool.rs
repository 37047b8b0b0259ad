//! Pool autoscaling from the command line: `flotilla autoscale plan` (one packing
//! decision, offline), `flotilla pool` (instances by type and state), and the pool
//! autoscaler itself (in `flotilla up --autoscale`, or `flotilla autoscaler`).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use flotilla_obs::LogFormat;
use flotilla_pool::autoscaler::Autoscaler;
use flotilla_pool::cluster::{HttpCluster, ViewCluster};
use flotilla_pool::config::{PoolConfig, ProviderConfig};
use flotilla_pool::demand::DemandFile;
use flotilla_pool::provider::InstanceProvider;
use flotilla_pool::provider::exec::{ExecConfig, ExecProvider};
use flotilla_pool::provider::local::{LocalConfig, LocalProvider};
use flotilla_pool::store::{PoolStore, StoreError};
use flotilla_view::ClusterView;
use serde_json::Value;

use crate::cli::http::ListArgs;

/// The largest demand file `plan` reads (as `sim` its trace).
const MAX_DEMAND_BYTES: u64 = 128 << 20;

#[derive(Debug, Args)]
pub struct AutoscaleArgs {
    #[command(subcommand)]
    pub cmd: AutoscaleCmd,
}

#[derive(Debug, Subcommand)]
pub enum AutoscaleCmd {
    /// One Ray-v2-style packing decision, offline: which nodes to launch for a demand.
    Plan(PlanArgs),
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The demand: Ray autoscaler v2's scheduling request as JSON (examples/demand.json).
    #[arg(long)]
    pub demand: PathBuf,
    /// Print one compact JSON object as the last line of stdout.
    #[arg(long)]
    pub json: bool,
}

pub fn autoscale(a: AutoscaleArgs) -> anyhow::Result<()> {
    match a.cmd {
        AutoscaleCmd::Plan(p) => plan(p),
    }
}

fn plan(a: PlanArgs) -> anyhow::Result<()> {
    let text = crate::cli::read_capped(&a.demand, MAX_DEMAND_BYTES, "demand")?;
    let file = DemandFile::parse(&text).with_context(|| format!("{} is not a valid demand", a.demand.display()))?;
    let r = file.plan();
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    println!("launch {} node(s), decided in {:.3} ms", r.nodes_total, r.decision_seconds * 1e3);
    if !r.nodes_by_type.is_empty() {
        let mut table = crate::cli::table::Table::new(&["TYPE", ">COUNT", "WHY"]);
        for (t, n) in &r.nodes_by_type {
            let why = r.reasons.get(t).map(|w| w.join(", ")).unwrap_or_default();
            table.row(vec![t.clone(), n.to_string(), why]);
        }
        print!("{}", table.render("  "));
        let fmt = |name: &str, v: f64| {
            if name == "memory" { format!("{name} {:.1}Gi", v / (1u64 << 30) as f64) } else { format!("{name} {v}") }
        };
        let launched: Vec<String> = r.launched.iter().map(|(k, v)| fmt(k, *v)).collect();
        println!("launched capacity: {}", launched.join(", "));
        let waste: Vec<String> = r.waste.iter().map(|(k, v)| format!("{k} {:.0}%", v * 100.0)).collect();
        println!("left unused: {}", waste.join(", "));
    }
    for t in &r.terminate {
        println!("terminate {} ({}): {}", t.node_id, t.node_type, t.detail);
    }
    if !r.infeasible.is_empty() {
        println!("infeasible:");
        for i in &r.infeasible {
            println!("  {} × {}: {}", i.request, i.count, i.reason);
        }
    }
    Ok(())
}

/// Decisions `flotilla pool` shows per pool, newest first.
const DECISIONS_SHOWN: usize = 20;

/// `flotilla pool`: each pool's instances by type and state, and its last decisions.
pub async fn pool(a: ListArgs) -> anyhow::Result<()> {
    let v = crate::cli::http::get(&a, "/v1/pools").await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let pools = v.as_array().cloned().unwrap_or_default();
    if pools.is_empty() {
        println!("no pool autoscaler has reported (start one with `flotilla up --autoscale`)");
    }
    for p in &pools {
        let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
        let stale = if p["stale"].as_bool() == Some(true) { " (stale: its autoscaler stopped reporting)" } else { "" };
        println!("pool {} (provider {}){stale}", s(p, "pool"), s(p, "provider"));
        if let Some(e) = p["store_failing"].as_str() {
            println!("  its store takes no writes, so it launches nothing until a reopen succeeds: {e}");
        }
        let mut types = crate::cli::table::Table::new(&["TYPE", ">MIN", ">MAX", ">WARM", "STATES", "UNAVAILABLE"]);
        for t in p["node_types"].as_array().into_iter().flatten() {
            let name = s(t, "name");
            let states = p["by_type"][&name]
                .as_object()
                .map(|m| m.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(" "))
                .unwrap_or_default();
            let n = |k: &str| t[k].as_u64().map(|v| v.to_string()).unwrap_or_else(|| "-".into());
            let warm = match (t["warm"].as_u64(), t["warm_held"].as_u64()) {
                (Some(w), Some(h)) if w > 0 => format!("{h}/{w}"),
                _ => "-".into(),
            };
            let unavailable = p["unavailable"][&name]["reason"].as_str().unwrap_or("-").to_string();
            types.row(vec![name, n("min"), n("max"), warm, states, unavailable]);
        }
        print!("{}", types.render("  "));
        let mut instances = crate::cli::table::Table::new(&["INSTANCE", "TYPE", "STATE", "WARM", "REASON"]);
        for i in p["instances"].as_array().into_iter().flatten() {
            // A node being emptied says so (it is cordoned, its units moving off).
            let state = match i["consolidating_since_ms"].as_u64() {
                Some(since) => format!("{} (consolidating since {})", s(i, "state"), crate::cli::table::ago(since)),
                None => s(i, "state"),
            };
            instances.row(vec![s(i, "id"), s(i, "node_type"), state, s(i, "warm"), s(i, "reason")]);
        }
        print!("{}", instances.render("  "));
        // The newest 20, with their reasons: a terminate is not hidden by the quiet
        // passes after it (a run of those is one row).
        let mut decisions = crate::cli::table::Table::new(&["AT", "DECISION"]);
        for d in p["decisions"].as_array().into_iter().flatten().take(DECISIONS_SHOWN) {
            let at = d["at_ms"].as_u64().map_or_else(|| "-".into(), crate::cli::table::when);
            let repeated = match (d["repeated"].as_u64(), d["since_ms"].as_u64()) {
                (Some(n), Some(since)) => format!(" (×{n} since {})", crate::cli::table::ago(since)),
                _ => String::new(),
            };
            decisions.row(vec![at, format!("{}{repeated}", s(d, "explanation"))]);
        }
        print!("{}", decisions.render("  "));
    }
    Ok(())
}

/// What the local provider's agents need to join the cluster.
pub struct AgentJoin {
    pub aggregators: String,
    pub join_token_file: PathBuf,
    pub ca: PathBuf,
    pub log_format: LogFormat,
    /// The control plane's URL (the artifact origin and tracker the agents use).
    pub control_plane: String,
}

/// The provider a pool file names. Local agents are tied to this process when `tied`
/// (`up`: they stop with it), else they outlive it as cloud VMs outlive a crashed
/// autoscaler.
pub fn provider(
    cfg: &PoolConfig,
    data: &Path,
    join: &AgentJoin,
    tied: bool,
) -> anyhow::Result<Arc<dyn InstanceProvider>> {
    Ok(match &cfg.provider {
        ProviderConfig::Local { boot_delay } => Arc::new(LocalProvider::new(LocalConfig {
            program: std::env::current_exe().context("finding this binary")?,
            args_before: vec![
                "--log-format".into(),
                join.log_format.as_arg().into(),
                "agent".into(),
                "--aggregators".into(),
                join.aggregators.clone(),
                "--join-token-file".into(),
                join.join_token_file.display().to_string(),
                "--ca".into(),
                join.ca.display().to_string(),
                "--control-plane".into(),
                join.control_plane.clone(),
                "--stop-grace".into(),
                "2s".into(),
            ],
            dir: data.join("pool").join(&cfg.name),
            port_base: 30_000,
            tied_to_parent: tied,
            stop_grace: std::time::Duration::from_secs(10),
            boot_delay: std::time::Duration::from_secs(boot_delay.map_or(0, |d| d.as_secs())),
        })),
        ProviderConfig::Exec { launch, terminate, list, timeout, env } => {
            let mut env = env.clone();
            env.insert("FLOTILLA_AGGREGATORS".into(), join.aggregators.clone());
            env.insert("FLOTILLA_JOIN_TOKEN_FILE".into(), join.join_token_file.display().to_string());
            env.insert("FLOTILLA_CA".into(), join.ca.display().to_string());
            env.insert("FLOTILLA_CONTROL_PLANE".into(), join.control_plane.clone());
            env.insert("FLOTILLA_POOL_DIR".into(), data.join("pool").join(&cfg.name).display().to_string());
            if let Ok(exe) = std::env::current_exe() {
                env.entry("FLOTILLA_BIN".into()).or_insert(exe.display().to_string());
            }
            Arc::new(ExecProvider::new(ExecConfig {
                launch: launch.clone(),
                terminate: terminate.clone(),
                list: list.clone(),
                timeout: std::time::Duration::from_secs(timeout.as_secs()),
                env,
            })?)
        }
    })
}

pub fn load_pool(path: Option<&Path>) -> anyhow::Result<PoolConfig> {
    let Some(path) = path else {
        return PoolConfig::parse(DEMO_POOL).context("the built-in demo pool (examples/pool.toml)");
    };
    let text = crate::cli::read_capped(path, 1 << 20, "pool file")?;
    PoolConfig::parse(&text).with_context(|| format!("{}", path.display()))
}

/// The demo pool (examples/pool.toml: local agents), built in so `up --autoscale` works
/// from any directory.
const DEMO_POOL: &str = include_str!("../examples/pool.toml");

/// What `--pool` names, for messages.
pub fn pool_source(path: Option<&Path>) -> String {
    path.map_or_else(|| "the built-in demo pool (examples/pool.toml)".to_string(), |p| p.display().to_string())
}

/// How long a pool autoscaler waits for another process to let go of its store: the
/// autoscaler it replaces may still be exiting.
const STORE_WAIT: Duration = Duration::from_secs(30);

/// Opens the pool's store, retrying with back-off (100 ms doubling to 2 s) for up to
/// `wait` while another process has it open.
async fn open_store(pool: &str, path: &Path, wait: Duration) -> anyhow::Result<PoolStore> {
    let deadline = tokio::time::Instant::now() + wait;
    let mut pause = Duration::from_millis(100);
    loop {
        match PoolStore::open(pool, path) {
            Err(StoreError::Locked { .. }) if tokio::time::Instant::now() < deadline => {
                tracing::info!(path = %path.display(), retry_in = ?pause, "another process has the pool store open; waiting for it");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e @ StoreError::Locked { .. }) => {
                return Err(anyhow::anyhow!(
                    "{e} after {} s: is another pool autoscaler running for this pool? Stop it first",
                    wait.as_secs()
                ));
            }
            r => return Ok(r?),
        }
    }
}

/// A pool autoscaler for `cfg`, resuming from `DATA/pool/NAME.redb`: nodes read from
/// `view`, the rest asked of the control plane.
pub async fn autoscaler(
    cfg: PoolConfig,
    data: &Path,
    provider: Arc<dyn InstanceProvider>,
    view: Arc<ClusterView>,
    control: &str,
    http: reqwest::Client,
    token: Option<String>,
) -> anyhow::Result<Autoscaler> {
    let dir = data.join("pool");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let store = open_store(&cfg.name, &dir.join(format!("{}.redb", cfg.name)), STORE_WAIT).await?;
    let cluster = Arc::new(ViewCluster::new(view, HttpCluster::new(http, control, token)));
    Ok(Autoscaler::new(cfg, provider, cluster, store)?)
}

#[derive(Debug, Args)]
pub struct AutoscalerArgs {
    /// The pool file (examples/pool.toml documents it); the built-in demo pool, that file, when absent.
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// The control plane (`http://` is assumed when it has no scheme).
    #[arg(long, env = "FLOTILLA_ADDR", default_value = "http://127.0.0.1:7700")]
    pub control: String,
    /// The data dir of the cluster (join token, CA, API token); the pool's records are
    /// kept in DATA/pool/.
    #[arg(long, env = "FLOTILLA_DATA", default_value = "./.flotilla")]
    pub data: PathBuf,
    /// PEM file with the CA that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
    /// How it follows the shards' view, where it reads the nodes (the token file
    /// defaults to DATA/grpc-token when it exists).
    #[command(flatten)]
    pub shards: crate::serve::args::ShardClientArgs,
    /// Serve /metrics (and /healthz, /readyz) here.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics: std::net::SocketAddr,
}

/// `flotilla autoscaler`: the pool autoscaler as its own process. Its local agents
/// outlive it: killed and restarted, it finds them by their ids.
pub async fn run_standalone(a: AutoscalerArgs, log_format: LogFormat) -> anyhow::Result<()> {
    let cfg = load_pool(a.pool.as_deref())?;
    let control = crate::cli::http::base_url(&a.control)?;
    let a = AutoscalerArgs { control: control.clone(), ..a };
    let http = crate::cli::http::http_client(a.ca.as_deref())?;
    let token = std::fs::read_to_string(a.data.join("api-token")).ok().map(|t| t.trim().to_string());
    let shards: Value = http
        .get(format!("{}/v1/shards", a.control.trim_end_matches('/')))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .with_context(|| format!("reaching the control plane at {}", a.control))?
        .json()
        .await?;
    let aggregators: Vec<String> = shards
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.get("address").and_then(Value::as_str).map(String::from))
        .collect();
    anyhow::ensure!(!aggregators.is_empty(), "the control plane at {} lists no shards", a.control);
    let join = AgentJoin {
        aggregators: aggregators.join(","),
        join_token_file: a.data.join("join-token"),
        ca: a.data.join("tls.crt"),
        log_format,
        control_plane: control.clone(),
    };
    let provider = provider(&cfg, &a.data, &join, false)?;
    let mut shards = a.shards.clone();
    if shards.grpc_token_file.is_none() {
        shards.grpc_token_file = Some(a.data.join("grpc-token")).filter(|f| f.exists());
    }
    let view = ClusterView::new(aggregators.len());
    flotilla_control::follow_all(&view, &aggregators, &shards.dialer()?);
    // /readyz: ready once a view of every shard arrived (a pass waits for it).
    let seen = view.clone();
    flotilla_obs::health::readiness().check("view", move || {
        match seen.slots().iter().position(|s| s.updated_unix_ms == 0) {
            Some(shard) => Err(format!("no view of shard {shard} yet")),
            None => Ok(()),
        }
    });
    let metrics = flotilla_obs::serve_metrics(a.metrics).await?;
    // The first pass waits for the view (a while, not for ever: a pass without it says why).
    let waited = tokio::time::Instant::now();
    while view.slots().iter().any(|s| s.updated_unix_ms == 0) && waited.elapsed() < Duration::from_secs(10) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let scaler = autoscaler(cfg, &a.data, provider, view, &a.control, http, token).await?;
    println!("pool autoscaler running against {}; /metrics on {metrics}", a.control);
    scaler.run(crate::serve::shutdown_signal()).await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_pool_file_the_demo_pool_is_built_in() {
        let built_in = load_pool(None).unwrap();
        let file = load_pool(Some(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/pool.toml")))).unwrap();
        assert_eq!(format!("{built_in:?}"), format!("{file:?}"));
    }

    /// The examples agree: `examples/ray-serve.toml`'s units on `examples/pool.toml`'s
    /// types. Two queued units: each one's head and CPU worker on CPU nodes, the first
    /// GPU worker on the a100 type (its max is 1), the second on the l4 type (the
    /// group's alternative).
    #[test]
    fn the_ray_serve_example_packs_onto_the_example_pools_types() {
        use flotilla_pool::model::{AppRow, Observation, Queued};
        let cfg = load_pool(None).unwrap();
        let spec = flotilla_scheduler::AppSpec::parse(include_str!("../examples/ray-serve.toml")).unwrap();
        let apps = [AppRow {
            app: "ray-serve".into(),
            queued: Queued { primary: 2, secondary: 0 },
            unit_shape: spec.unit_shape(),
        }];
        let obs = Observation {
            nodes: &[],
            apps: &apps,
            instances: &[],
            floor: &Default::default(),
            idle: &Default::default(),
            unavailable: &Default::default(),
            now_ms: 0,
        };
        let (plan, record) = flotilla_pool::reconciler::decide(&cfg, &obs, &mut Default::default());
        assert_eq!((plan.launch.get("gpu-a100"), plan.launch.get("gpu-l4")), (Some(&1), Some(&1)), "{record}");
        assert!(record["infeasible"].as_array().is_none_or(Vec::is_empty), "{record}");
        let cpu: u32 = plan.launch.iter().filter(|(t, _)| !t.starts_with("gpu")).map(|(_, n)| n).sum();
        assert!(cpu >= 4, "two heads and two CPU workers, each on its own node: {record}");
    }

    #[tokio::test]
    async fn a_store_another_process_holds_is_waited_for_and_refused_with_why_past_the_wait() {
        let dir = flotilla_testkit::TempDir::new("pool-store-wait");
        let path = dir.path().join("p.redb");
        let held = PoolStore::open("demo", &path).unwrap();
        let err = open_store("demo", &path, Duration::from_millis(300)).await.err().unwrap();
        assert!(err.to_string().contains("another process has it open"), "{err}");
        assert!(err.to_string().contains("Stop it first"), "{err}");
        // The old autoscaler exits while the new one waits: the new one opens it.
        let exits = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            drop(held);
        });
        let store = open_store("demo", &path, Duration::from_secs(20)).await;
        assert!(store.is_ok(), "{:?}", store.err());
        exits.await.unwrap();
    }
}
