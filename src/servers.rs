//! `flotilla aggregator` and `flotilla control`: one server each.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use flotilla_aggregator::Registry;
use flotilla_aggregator::{ShardConfig, Timeouts, TlsMaterial};
use flotilla_proto::dial::Dialer;

use crate::secrets::DataDir;

/// How a process serves its HTTP API, and whom it trusts when it calls another's.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Serve the HTTP API over HTTPS with this certificate chain (PEM); with --tls-key.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Requests per second one peer address may make to the HTTP API, in bursts of up to
    /// twice that; 0 turns the limit off.
    #[arg(long, default_value_t = 200)]
    pub rate_limit: u32,
    /// PEM file with the CA certificate(s) to trust when calling another process's HTTPS API
    /// (a standalone scheduler's, or the control plane's).
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<PathBuf>,
}

impl HttpArgs {
    pub fn options(&self) -> anyhow::Result<flotilla_control::HttpOptions> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => {
                let m = TlsMaterial::load(cert, key)?;
                Some(
                    flotilla_control::tls_config(m.certs, m.key)
                        .with_context(|| format!("--tls-cert {} with --tls-key {}", cert.display(), key.display()))?,
                )
            }
            (None, None) => None,
            _ => bail!("--tls-cert and --tls-key go together"),
        };
        Ok(flotilla_control::HttpOptions { tls, rate_limit: self.rate_limit })
    }

    pub fn client(&self) -> anyhow::Result<reqwest::Client> {
        crate::client::http_client(self.ca.as_deref())
    }
}

/// How a process reaches the shards' gRPC services (commit, watch, admin).
#[derive(Debug, Clone, Args)]
pub struct ShardClientArgs {
    /// File whose first line is the shards' gRPC bearer token (default: DATA/grpc-token
    /// when it exists; DATA is $FLOTILLA_DATA, else ./.flotilla).
    #[arg(long)]
    pub grpc_token_file: Option<PathBuf>,
    /// PEM file with the CA that signs the shards' gRPC certificates: speak TLS to them.
    #[arg(long, env = "FLOTILLA_GRPC_CA")]
    pub grpc_ca: Option<PathBuf>,
}

impl ShardClientArgs {
    /// The dialer of a server (control plane, scheduler): it carries the first token of
    /// the token file, and follows the file (every 10 s and on SIGHUP) so a rotation
    /// needs no restart.
    pub fn dialer(&self) -> anyhow::Result<Dialer> {
        let file = self.grpc_token_file.clone().or_else(|| {
            let default = crate::client::data_dir().join("grpc-token");
            default.exists().then_some(default)
        });
        let mut dialer = Dialer::network().on_io_thread();
        if let Some(file) = file {
            let tokens = crate::secrets::read_tokens(&file)?;
            let token = tokens.first().ok_or_else(|| anyhow::anyhow!("{} holds no token", file.display()))?;
            dialer = dialer.with_token(token).with_context(|| format!("the token in {}", file.display()))?;
            reload_tokens(grpc_caller_token_file(file, tokens, dialer.clone()))?;
        }
        if let Some(ca) = &self.grpc_ca {
            dialer = dialer.with_ca(std::fs::read(ca).with_context(|| format!("reading --grpc-ca {}", ca.display()))?);
        }
        Ok(dialer)
    }
}

/// How often the join-token file is read again (SIGHUP reads it at once).
const TOKEN_RELOAD: Duration = Duration::from_secs(10);

/// Makes a new token list the accepted one.
pub type ApplyTokens = Box<dyn Fn(&[String]) + Send>;

/// A token-list file that a running process follows: shards accept its tokens, callers
/// send the first.
pub struct TokenFile {
    /// `join`, `grpc` or `api`, for the logs.
    pub name: &'static str,
    /// How many tokens are accepted now (shards' `flotilla_NAME_tokens`; none for a
    /// caller), and the reads of the file (`flotilla_NAME_token(s)_reloaded_total{result}`).
    pub metrics: (Option<flotilla_obs::Family>, flotilla_obs::Family),
    pub path: PathBuf,
    /// What is accepted now.
    pub current: Vec<String>,
    pub apply: ApplyTokens,
}

/// The join tokens of `registries`, followed in DATA/join-token.
pub fn join_token_file(data: &DataDir, registries: Vec<Arc<Registry>>) -> TokenFile {
    TokenFile {
        name: "join",
        metrics: (Some(crate::catalogue::JOIN_TOKENS), crate::catalogue::JOIN_TOKENS_RELOADED),
        path: data.dir.join("join-token"),
        current: data.join_tokens.clone(),
        apply: Box::new(move |t| registries.iter().for_each(|r| r.set_join_tokens(t.to_vec()))),
    }
}

/// The gRPC tokens of `auths` (the shards' token checks), followed in DATA/grpc-token;
/// `callers` (the dialers of schedulers and a control plane in the same process) send
/// the first.
pub fn grpc_token_file(data: &DataDir, auths: Vec<flotilla_aggregator::GrpcAuth>, callers: Vec<Dialer>) -> TokenFile {
    TokenFile {
        name: "grpc",
        metrics: (Some(crate::catalogue::GRPC_TOKENS), crate::catalogue::GRPC_TOKENS_RELOADED),
        path: data.dir.join("grpc-token"),
        current: data.grpc_tokens.clone(),
        apply: Box::new(move |t| {
            auths.iter().for_each(|a| a.set_tokens(t.to_vec()));
            callers.iter().for_each(|d| send_first(d, t));
        }),
    }
}

/// A caller's gRPC token file (`--grpc-token-file`, else DATA/grpc-token): its calls carry
/// the first token. Put the new token first in every shard's file and in this one, then
/// retire the old: calls never carry a token no shard accepts.
pub fn grpc_caller_token_file(path: PathBuf, current: Vec<String>, dialer: Dialer) -> TokenFile {
    TokenFile {
        name: "grpc",
        metrics: (None, crate::catalogue::GRPC_TOKENS_RELOADED),
        path,
        current,
        apply: Box::new(move |t| send_first(&dialer, t)),
    }
}

fn send_first(dialer: &Dialer, tokens: &[String]) {
    if let Some(first) = tokens.first()
        && let Err(e) = dialer.set_token(first)
    {
        tracing::error!(error = %e, "keeping the gRPC token sent now");
    }
}

/// The API token of a control plane or scheduler (mutating calls need it), followed in
/// `path`: its first line is the token.
pub fn api_token_file(path: PathBuf, token: flotilla_core::SharedToken) -> TokenFile {
    TokenFile {
        name: "api",
        metrics: (None, crate::catalogue::API_TOKEN_RELOADED),
        path,
        current: token.get().map(|t| t.to_string()).into_iter().collect(),
        apply: Box::new(move |t| token.set(t.first().cloned())),
    }
}

/// Reads the file again on SIGHUP and every 10 s, and applies the tokens when they
/// changed. A file that cannot be read, or holds no token, changes nothing (it is logged
/// and counted).
pub fn reload_tokens(file: TokenFile) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // Installed before returning, so a SIGHUP from now on never kills the process.
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let TokenFile { name, path, mut current, apply, metrics: (gauge, reloads) } = file;
    let accepted = move |n: usize| {
        if let Some(g) = gauge {
            metrics::gauge!(g.name).set(n as f64);
        }
    };
    accepted(current.len());
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(TOKEN_RELOAD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        loop {
            let why = tokio::select! {
                _ = tick.tick() => "timer",
                _ = hup.recv() => "SIGHUP",
            };
            let _span = tracing::info_span!("tokens_reload", file = %path.display(), why).entered();
            let result = match crate::secrets::read_tokens(&path) {
                Ok(tokens) if tokens.is_empty() => {
                    tracing::error!(kept = current.len(), "the file holds no token: keeping the ones accepted now");
                    "error"
                }
                Ok(tokens) if tokens == current => "unchanged",
                Ok(tokens) => {
                    apply(&tokens);
                    tracing::info!(before = current.len(), now = tokens.len(), "{name} tokens reloaded");
                    accepted(tokens.len());
                    current = tokens;
                    "changed"
                }
                Err(e) => {
                    tracing::error!(error = %format!("{e:#}"), kept = current.len(), "cannot read the tokens: keeping the ones accepted now");
                    "error"
                }
            };
            metrics::counter!(reloads.name, "result" => result).increment(1);
        }
    });
    Ok(())
}

/// The one duration syntax of every flag (`1500ms`, `2s`, `5m`), shared with the agent.
pub use flotilla_agent::config::parse_duration;

/// Shard settings shared by `up` and `aggregator`: liveness, batching, request rates.
#[derive(Debug, Clone, Args)]
pub struct LivenessArgs {
    /// Silence after which a node is Suspect.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub suspect_after: Duration,
    /// Silence after which a node is Dead.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub dead_after: Duration,
    /// How long a Dead node stays in the view.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub dead_retention: Duration,
    /// Longest wait before a change is published as a new view version (at most 50ms).
    #[arg(long, default_value = "20ms", value_parser = parse_duration)]
    pub batch_window: Duration,
    /// gRPC requests (commits, watches, releases) one peer address may make to a shard
    /// per second, in bursts of twice that; 0 turns the limit off.
    #[arg(long, default_value_t = 10_000)]
    pub grpc_rate_limit: u32,
}

impl LivenessArgs {
    pub fn timeouts(&self) -> anyhow::Result<Timeouts> {
        if self.suspect_after.is_zero() || self.dead_after <= self.suspect_after {
            bail!(
                "--dead-after ({:?}) must be longer than --suspect-after ({:?}), both above 0",
                self.dead_after,
                self.suspect_after
            );
        }
        if self.batch_window > Duration::from_millis(50) {
            bail!("--batch-window must be at most 50ms");
        }
        Ok(Timeouts {
            suspect_after_ms: self.suspect_after.as_millis() as u64,
            dead_after_ms: self.dead_after.as_millis() as u64,
            retention_ms: self.dead_retention.as_millis() as u64,
        })
    }

    pub fn shard_config(
        &self,
        listen: SocketAddr,
        shard: usize,
        shards: usize,
        data: &DataDir,
    ) -> anyhow::Result<ShardConfig> {
        let tls = TlsMaterial::load(&data.tls_cert, &data.tls_key)?;
        let mut c = ShardConfig::new(
            listen,
            shard,
            shards,
            data.shard_secret.as_bytes().to_vec(),
            data.join_tokens.clone(),
            tls,
        );
        c.grpc_tokens = data.grpc_tokens.clone();
        c.grpc_rate_limit = self.grpc_rate_limit;
        c.timeouts = self.timeouts()?;
        c.batch_window = self.batch_window;
        Ok(c)
    }
}

#[derive(Debug, Args)]
pub struct AggregatorArgs {
    /// `host:port`: QUIC on UDP P, heartbeats on UDP P+1, gRPC on TCP P.
    #[arg(long)]
    pub listen: SocketAddr,
    #[arg(long, default_value_t = 0)]
    pub shard: usize,
    #[arg(long, default_value_t = 1)]
    pub shards: usize,
    #[command(flatten)]
    pub liveness: LivenessArgs,
    /// Serve /metrics here.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics: SocketAddr,
    /// The shard's writable state (the marker that it ran, which makes a restart wait
    /// for its agents to come back; `shard-I-of-N.state.json`, its cordons, drains and
    /// fencing marks). Also where its secrets are, created when absent, unless --secrets
    /// names another dir.
    #[arg(long, default_value = "./.flotilla")]
    pub data: PathBuf,
    /// A dir the shard only reads its secrets from (shard-secret, join-token, grpc-token,
    /// tls.crt, tls.key; never written, so a read-only Kubernetes Secret mount works;
    /// the token files are still followed for rotation). Default: the data dir, where
    /// missing secrets are generated.
    #[arg(long, env = "FLOTILLA_SECRETS")]
    pub secrets: Option<PathBuf>,
    /// Print the bound addresses as one JSON line on stdout (for scripts and tests).
    #[arg(long)]
    pub print_addrs: bool,
    /// When this shard ran before with this data dir (a restart), refuse claims this long
    /// while agents come back and the ledger is rebuilt from what they run.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub recovery_window: Duration,
    /// Serve gRPC over TLS with this certificate chain (PEM); with --grpc-tls-key.
    /// Callers then need --grpc-ca. (Tokens are in DATA/grpc-token either way.)
    #[arg(long, requires = "grpc_tls_key")]
    pub grpc_tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --grpc-tls-cert.
    #[arg(long, requires = "grpc_tls_cert")]
    pub grpc_tls_key: Option<PathBuf>,
    /// Keep cordons, drains and fencing marks in etcd (`etcd://HOST:PORT,…`) instead of
    /// the data dir, and serve the shard index only while holding its lease there
    /// (`PREFIX/shards/I-of-N/leader`): a second process with the same --shard waits and
    /// takes over when the holder dies.
    #[arg(long)]
    pub store: Option<String>,
    /// The etcd key prefix (the schedulers' `--store-prefix`).
    #[arg(long, default_value = flotilla_etcd::DEFAULT_PREFIX)]
    pub store_prefix: String,
    /// This process is a standby for its shard index: it waits for the lease in etcd
    /// (needs --store) and, once it holds it, starts Recovering and rebuilds the ledger
    /// from the agents, which fail over to it (`--aggregators A1|A2,…`).
    #[arg(long, requires = "store")]
    pub standby: bool,
    /// The shard lease's time to live: how long a dead holder keeps its index.
    #[arg(long, default_value = "3s", value_parser = parse_duration)]
    pub lease_ttl: Duration,
}

/// Holds the shard index's lease in etcd before the shard serves: waits while another
/// process holds it (a standby), counting a takeover when it had to wait.
async fn shard_lease(a: &AggregatorArgs, client: &flotilla_etcd::Client) -> flotilla_etcd::Leadership {
    use flotilla_aggregator::catalogue as am;
    let shard = a.shard.to_string();
    let active = metrics::gauge!(am::SHARD_ACTIVE.name, "shard" => shard.clone());
    active.set(0.0);
    let campaign = flotilla_etcd::Campaign {
        key: flotilla_etcd::key(&a.store_prefix, &format!("shards/{}-of-{}/leader", a.shard, a.shards)),
        value: format!("{} pid {}", a.listen, std::process::id()),
        ttl: a.lease_ttl,
        request_timeout: flotilla_etcd::REQUEST_TIMEOUT,
    };
    let mut waited = false;
    let lease = flotilla_etcd::campaign(client, &campaign, |w| {
        waited = true;
        match w {
            flotilla_etcd::Waiting::Held(h) => {
                tracing::info!(holder = %h.value, key = %campaign.key, "standby: another process serves this shard")
            }
            flotilla_etcd::Waiting::Unreachable(e) => tracing::warn!(error = %e, "standby: etcd unreachable"),
        }
    })
    .await;
    if waited {
        metrics::counter!(am::SHARD_TAKEOVERS.name, "shard" => shard).increment(1);
    }
    active.set(1.0);
    tracing::info!(token = lease.token(), key = %campaign.key, "holding the shard's lease: serving");
    lease
}

pub async fn aggregator(a: AggregatorArgs) -> anyhow::Result<()> {
    if a.shards == 0 || a.shard >= a.shards {
        bail!("--shard {} must be below --shards {}", a.shard, a.shards);
    }
    std::fs::create_dir_all(&a.data).with_context(|| format!("creating the data dir {}", a.data.display()))?;
    let data = match &a.secrets {
        Some(dir) if dir != &a.data => DataDir::read_only(dir)?,
        _ => DataDir::prepare(&a.data)?,
    };
    // The marker that this shard ran with this data dir: written (and so checked to be
    // writable) before anything is served, so a data dir that cannot take it fails here.
    let ran_before = a.data.join(format!("shard-{}-of-{}.ran", a.shard, a.shards));
    // With etcd, nothing is served before this process holds the shard's lease; a
    // standby that takes over always recovers (the index's agents ran with another).
    let (etcd, lease) = match &a.store {
        Some(store) => {
            let endpoints = flotilla_etcd::Endpoints::parse(store).context("--store")?;
            flotilla_etcd::check_prefix(&a.store_prefix).context("--store-prefix")?;
            let client = flotilla_etcd::connect(&endpoints, flotilla_etcd::REQUEST_TIMEOUT).await?;
            let lease = shard_lease(&a, &client).await;
            (Some(client), Some(lease))
        }
        None => (None, None),
    };
    let restarted = ran_before.exists() || a.standby;
    flotilla_obs::fsutil::write_atomic(&ran_before, format!("{}\n", std::process::id()).as_bytes(), 0o644)
        .context("--data must be writable")?;
    // /readyz: ready once the shard serves (its listeners bound, its tasks running).
    let ready = flotilla_obs::health::readiness().flag("shard", "starting");
    let metrics = flotilla_obs::serve_metrics(a.metrics).await?;
    let mut config = a.liveness.shard_config(a.listen, a.shard, a.shards, &data)?;
    if restarted {
        config.recovery_window = a.recovery_window;
    }
    // Cordons, drains and fencing marks: kept across restarts (etcd, else the data dir).
    let (state, loaded) = crate::shard_state::open(etcd, &a.store_prefix, &a.data, a.shard, a.shards).await?;
    config.initial_state = loaded;
    config.state_store = Some(state);
    if let (Some(cert), Some(key)) = (&a.grpc_tls_cert, &a.grpc_tls_key) {
        let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        config.grpc_tls = Some(flotilla_aggregator::GrpcTls { cert_pem: read(cert)?, key_pem: read(key)? });
    }
    let mut shard = flotilla_aggregator::start(config).await?;
    reload_tokens(join_token_file(&data, vec![shard.registry.clone()]))?;
    reload_tokens(grpc_token_file(&data, vec![shard.grpc_auth.clone()], Vec::new()))?;
    ready.ready();
    if a.print_addrs {
        println!(
            "{}",
            serde_json::json!({"addr": shard.addr.to_string(), "heartbeat": shard.heartbeat_addr.to_string(), "metrics": metrics.to_string(), "pid": std::process::id()})
        );
    }
    let lost = async {
        match &lease {
            Some(l) => l.lease().lost().await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = shutdown_signal() => {}
        _ = shard.wait() => bail!("the shard stopped"),
        reason = lost => {
            // Another process may serve the index now: stop at once, never serve beside it.
            shard.shutdown().await;
            bail!("lost the shard's lease in etcd ({reason}): stopped serving");
        }
    }
    shard.shutdown().await;
    if let Some(l) = lease {
        l.resign().await;
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct ControlArgs {
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Shard addresses (`host:port`) in shard-index order.
    #[arg(long, value_delimiter = ',', required = true)]
    pub aggregators: Vec<String>,
    /// File with the API token for mutating calls.
    #[arg(long)]
    pub api_token_file: Option<PathBuf>,
    /// Where named autoscaling policies are kept (without it, in memory only).
    #[arg(long)]
    pub policies_dir: Option<PathBuf>,
    /// Where pool floors (`PUT /v1/pools/{pool}/constraints`) are kept (without it, in
    /// memory only).
    #[arg(long)]
    pub pools_dir: Option<PathBuf>,
    /// Share scheduler registrations, named policies and pool floors, bounds and reports
    /// with every other control process on the same etcd (`etcd://HOST:PORT,…`), so any
    /// number of replicas behind one address give the same answers.
    #[arg(long)]
    pub store: Option<String>,
    /// The etcd key prefix (the schedulers' `--store-prefix`).
    #[arg(long, default_value = flotilla_etcd::DEFAULT_PREFIX)]
    pub store_prefix: String,
    /// Print the bound address as one JSON line on stdout (for scripts and tests).
    #[arg(long)]
    pub print_addrs: bool,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub shards: ShardClientArgs,
}

pub async fn control(a: ControlArgs) -> anyhow::Result<()> {
    let api_token = flotilla_core::SharedToken::default();
    if let Some(f) = &a.api_token_file {
        let tokens = crate::secrets::read_tokens(f)?;
        let first = tokens.first().ok_or_else(|| anyhow::anyhow!("{} holds no token", f.display()))?;
        api_token.set(Some(first.clone()));
        reload_tokens(api_token_file(f.clone(), api_token.clone()))?;
    }
    let replicas = match &a.store {
        Some(store) => {
            let endpoints = flotilla_etcd::Endpoints::parse(store).context("--store")?;
            flotilla_etcd::check_prefix(&a.store_prefix).context("--store-prefix")?;
            let client = flotilla_etcd::connect(&endpoints, flotilla_etcd::REQUEST_TIMEOUT).await?;
            Some(Arc::new(flotilla_control::replicas::Replicas::new(client, &a.store_prefix)))
        }
        None => None,
    };
    let cluster = flotilla_view::ClusterView::new(a.aggregators.len());
    let dialer = a.shards.dialer()?;
    flotilla_control::follow_all(&cluster, &a.aggregators, &dialer);
    let state = Arc::new(flotilla_control::ControlState {
        cluster,
        shards: a.aggregators.clone(),
        api_token,
        apps: Default::default(),
        http: a.http.client()?,
        dialer,
        policies: match a.policies_dir {
            Some(dir) => flotilla_control::Policies::open(dir)?,
            None => Default::default(),
        },
        pools: match &a.pools_dir {
            Some(dir) => flotilla_control::Pools::open(dir.clone())?,
            None => Default::default(),
        },
        replicas,
    });
    if let Some(replicas) = &state.replicas {
        tokio::spawn(replicas.clone().mirror(state.clone()));
    }
    let options = a.http.options()?;
    let listener = tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("binding {}", a.listen))?;
    if a.print_addrs {
        let scheme = if a.http.tls_cert.is_some() { "https" } else { "http" };
        println!(
            "{}",
            serde_json::json!({"addr": listener.local_addr()?.to_string(), "url": format!("{scheme}://{}", listener.local_addr()?), "pid": std::process::id()})
        );
    }
    flotilla_control::serve(listener, state, options, async {
        shutdown_signal().await;
    })
    .await
}

/// Reads and validates an app spec, naming the file in every error.
pub fn load_spec(path: &std::path::Path) -> anyhow::Result<flotilla_scheduler::AppSpec> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    flotilla_scheduler::AppSpec::parse(&text).with_context(|| {
        metrics::counter!(crate::catalogue::APP_SPECS_REJECTED.name).increment(1);
        format!("{}", path.display())
    })
}

#[derive(Debug, Args)]
pub struct SchedulerArgs {
    /// The app spec (TOML).
    #[arg(long)]
    pub app: PathBuf,
    /// Shard addresses (`host:port`) in shard-index order.
    #[arg(long, value_delimiter = ',', required = true)]
    pub aggregators: Vec<String>,
    /// Register with this control plane, which then forwards requests about the app here.
    #[arg(long)]
    pub control: Option<String>,
    /// Where the app's state lives: `redb:PATH` (embedded; a second scheduler on the same
    /// file waits for the first to exit), or `etcd://HOST:PORT[,HOST:PORT]...` (any number
    /// of schedulers per app: one active, the others standbys that take over when its
    /// lease lapses).
    #[arg(long, default_value = "redb:./.flotilla/scheduler.redb")]
    pub store: String,
    /// The etcd key prefix the app's state and lease live under.
    #[arg(long, default_value = flotilla_etcd::DEFAULT_PREFIX)]
    pub store_prefix: String,
    /// How long the active scheduler's etcd lease outlives its last keep-alive: a standby
    /// takes over this long after the active one dies (etcd rounds up to whole seconds).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub lease_ttl: Duration,
    /// This process's name in `apps` and in the lease (default `HOST:PID`).
    #[arg(long)]
    pub instance: Option<String>,
    /// This scheduler's own API (and /metrics).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// The URL the control plane forwards this app's requests to (default: the bound
    /// --listen address, which is useless to others when it is 0.0.0.0: in Kubernetes,
    /// the pod's IP or a Service).
    #[arg(long, env = "FLOTILLA_ADVERTISE_URL")]
    pub advertise_url: Option<String>,
    /// API token for registering with the control plane (default: $FLOTILLA_TOKEN, else DATA/api-token).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// How long members on an unreachable shard's nodes (Unknown) are waited for before
    /// they count as lost and are replaced.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub unknown_grace: Duration,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub shards: ShardClientArgs,
}

/// `flotilla scheduler`: one app's scheduler as its own process.
pub async fn scheduler(a: SchedulerArgs) -> anyhow::Result<()> {
    let spec = load_spec(&a.app)?;
    let backend = crate::ha::Backend::parse(&a.store)?;
    flotilla_etcd::check_prefix(&a.store_prefix).context("--store-prefix")?;
    anyhow::ensure!(a.lease_ttl >= Duration::from_secs(1), "--lease-ttl must be at least 1s");
    let leader =
        flotilla_scheduler::Leader::standby(&a.instance.clone().unwrap_or_else(flotilla_scheduler::default_instance));
    let cluster = flotilla_view::ClusterView::new(a.aggregators.len());
    // /readyz: ready once the store is open (above) and a view of every shard arrived.
    let seen = cluster.clone();
    flotilla_obs::health::readiness().check("scheduler", move || {
        match seen.slots().iter().position(|s| s.updated_unix_ms == 0) {
            Some(shard) => Err(format!("no view of shard {shard} yet")),
            None => Ok(()),
        }
    });
    let dialer = a.shards.dialer()?;
    flotilla_control::follow_all(&cluster, &a.aggregators, &dialer);
    let app = spec.name.clone();
    // Its own API takes mutating calls with the same token it registers with: the flag's,
    // else DATA/api-token's, followed for rotation.
    let token = flotilla_core::SharedToken::new(a.token.clone().or_else(|| crate::client::token_from_data().ok()));
    if a.token.is_none() && token.get().is_some() {
        reload_tokens(api_token_file(crate::client::data_dir().join("api-token"), token.clone()))?;
    }
    let state = Arc::new(flotilla_control::ControlState {
        cluster,
        shards: a.aggregators.clone(),
        api_token: token.clone(),
        apps: Default::default(),
        http: a.http.client()?,
        dialer,
        policies: Default::default(),
        pools: Default::default(),
        replicas: None,
    });
    let options = a.http.options()?;
    let listener = tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("binding {}", a.listen))?;
    let url = match a.advertise_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => format!("{}://{}", options.scheme(), listener.local_addr()?),
    };
    tracing::info!(%app, %url, instance = %leader.instance(), "scheduler API");
    // The app's scheduler starts once this process holds the app's lease (at once
    // unless another scheduler holds it); the API answers meanwhile.
    let held = crate::ha::Held::default();
    let parts = crate::ha::Parts {
        spec,
        cluster: state.cluster.clone(),
        aggregators: a.aggregators.clone(),
        dialer: state.dialer.clone(),
        unknown_grace: a.unknown_grace,
        state: state.clone(),
        leader: leader.clone(),
    };
    let opts = crate::ha::LeaseOptions { prefix: a.store_prefix.clone(), ttl: a.lease_ttl };
    let (failed_tx, failed) = tokio::sync::oneshot::channel();
    let campaign = tokio::spawn({
        let held = held.clone();
        async move {
            if let Err(e) = crate::ha::run(backend, opts, parts, held).await {
                let _ = failed_tx.send(e);
            }
        }
    });
    if let Some(control) = a.control {
        tokio::spawn(follow_policies(state.clone(), control.clone()));
        tokio::spawn(register_with_control(state.http.clone(), control, token, app, url, leader));
    }
    let failure = Arc::new(std::sync::Mutex::new(None));
    let served = flotilla_control::serve(listener, state, options, {
        let failure = failure.clone();
        async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                Ok(e) = failed => *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e),
            }
        }
    })
    .await;
    // Give the lease up at once: a standby takes over without waiting for the TTL.
    campaign.abort();
    crate::ha::resign(&held).await;
    if let Some(e) = failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    served
}

/// Registers (and keeps re-registering, as soft state) with the control plane.
async fn register_with_control(
    client: reqwest::Client,
    control: String,
    token: flotilla_core::SharedToken,
    app: String,
    url: String,
    leader: flotilla_scheduler::Leader,
) {
    // Only the active scheduler registers (at once on taking over, then every 5 s): the
    // control plane forwards the app's requests to whoever registered last.
    let mut last: Option<std::time::Instant> = None;
    loop {
        if leader.held().is_none() {
            last = None;
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        if last.is_some_and(|t| t.elapsed() < Duration::from_secs(5)) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        last = Some(std::time::Instant::now());
        let mut req = client
            .post(format!("{}/v1/schedulers", control.trim_end_matches('/')))
            .json(&serde_json::json!({"app": app, "url": url}));
        if let Some(t) = token.get() {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => {}
            Ok(r) => tracing::warn!(status = %r.status(), "the control plane refused the registration"),
            Err(e) => tracing::warn!(error = %e, "cannot reach the control plane"),
        }
    }
}

/// Keeps a standalone scheduler's named policies those of its control plane (every
/// 10 s), so `flotilla policy apply` reaches it too.
async fn follow_policies(state: Arc<flotilla_control::ControlState>, control: String) {
    let url = format!("{}/v1/policies", control.trim_end_matches('/'));
    loop {
        let got = async { state.http.get(&url).timeout(Duration::from_secs(5)).send().await?.json().await };
        match got.await {
            Ok(serde_json::Value::Array(rows)) => {
                let files: Vec<String> =
                    rows.iter().filter_map(|r| r.get("toml").and_then(|t| t.as_str()).map(str::to_string)).collect();
                state.policies.replace_all(&files);
            }
            Ok(other) => tracing::warn!(answer = %other, "the control plane's policies are not a list"),
            Err(e) => tracing::warn!(error = %e, "cannot read the control plane's policies"),
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("2 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("x").is_err());
    }
}
