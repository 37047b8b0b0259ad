//! `flotilla scheduler`: one app's scheduler as its own process (`--app`), or every app
//! of a directory in one process (`--apps-dir`), registered with a control plane when
//! given one.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;

use super::args::{HttpArgs, ShardClientArgs};
use super::shutdown_signal;
use super::tokens::{api_token_file, reload_tokens};
use crate::cli::http::parse_duration;

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
    #[arg(long, required_unless_present = "apps_dir", conflicts_with = "apps_dir")]
    pub app: Option<PathBuf>,
    /// Hosts every app of this directory (one spec per `*.toml` file) in this process.
    /// Each app is still its own scheduler, with its own lease, store keys and reconcile
    /// loop; they share the view, the shard connections, the store and the API, so a
    /// thousand services need one process, not a thousand. Files are read at start.
    #[arg(long)]
    pub apps_dir: Option<PathBuf>,
    /// Shard addresses (`host:port`) in shard-index order.
    #[arg(long, value_delimiter = ',', required = true, value_parser = crate::serve::args::parse_shard_address)]
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
    /// Named tokens with scopes, the control plane's (default: DATA/tokens.toml): calls it
    /// forwards with one of them are accepted here too.
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// How long members on an unreachable shard's nodes (Unknown) are waited for before
    /// they count as lost and are replaced.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub unknown_grace: Duration,
    #[command(flatten)]
    pub http: HttpArgs,
    #[command(flatten)]
    pub shards: ShardClientArgs,
}

/// The most apps one process hosts: each costs a reconcile loop, a lease and its status
/// (~0.4 MiB and ~0.15 ms of CPU a second idle, BENCHMARKS.md).
pub const MAX_APPS: usize = 10_000;

/// Reads every `*.toml` of `dir` as an app spec (in name order), refusing two files that
/// name the same app, an empty directory or more than [`MAX_APPS`].
pub fn load_apps_dir(dir: &std::path::Path) -> anyhow::Result<Vec<flotilla_scheduler::AppSpec>> {
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).with_context(|| format!("reading --apps-dir {}", dir.display()))? {
        let path = entry.with_context(|| format!("reading --apps-dir {}", dir.display()))?.path();
        if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
            paths.push(path);
        }
    }
    anyhow::ensure!(!paths.is_empty(), "--apps-dir {}: no app spec (*.toml) in it", dir.display());
    anyhow::ensure!(
        paths.len() <= MAX_APPS,
        "--apps-dir {}: {} specs, more than one process hosts ({MAX_APPS})",
        dir.display(),
        paths.len()
    );
    paths.sort();
    let mut named: std::collections::HashMap<String, PathBuf> = std::collections::HashMap::new();
    let mut specs = Vec::with_capacity(paths.len());
    for path in paths {
        let spec = load_spec(&path)?;
        if let Some(first) = named.insert(spec.name.clone(), path.clone()) {
            anyhow::bail!("{} and {} both name the app {:?}", first.display(), path.display(), spec.name);
        }
        specs.push(spec);
    }
    Ok(specs)
}

/// `flotilla scheduler`: one app's scheduler, or a directory's, as one process.
pub async fn scheduler(a: SchedulerArgs) -> anyhow::Result<()> {
    let specs = match (&a.app, &a.apps_dir) {
        (Some(path), _) => vec![load_spec(path)?],
        (None, Some(dir)) => load_apps_dir(dir)?,
        // clap requires one of the two.
        (None, None) => anyhow::bail!("--app or --apps-dir is needed"),
    };
    // One app alone ends the process when it cannot start, as before; an app of a
    // directory is tried again without taking the others down.
    let alone = a.apps_dir.is_none();
    let backend = crate::ha::Backend::parse(&a.store)?;
    flotilla_etcd::check_prefix(&a.store_prefix).context("--store-prefix")?;
    anyhow::ensure!(a.lease_ttl >= Duration::from_secs(1), "--lease-ttl must be at least 1s");
    let instance = a.instance.clone().unwrap_or_else(flotilla_scheduler::default_instance);
    // One lease holder per app: each app is taken over on its own.
    let leaders: Vec<_> = specs.iter().map(|_| flotilla_scheduler::Leader::standby(&instance)).collect();
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
    // Its own API takes mutating calls with the same token it registers with: the flag's,
    // else DATA/api-token's, followed for rotation.
    let token = flotilla_core::SharedToken::new(a.token.clone().or_else(|| crate::cli::http::token_from_data().ok()));
    if a.token.is_none() && token.get().is_some() {
        reload_tokens(api_token_file(crate::cli::http::data_dir().join("api-token"), token.clone()))?;
    }
    // The named tokens the control plane accepts, so its forwarded calls are too.
    let tokens_file = a.tokens_file.clone().unwrap_or_else(|| crate::cli::http::data_dir().join("tokens.toml"));
    let tokens = Arc::new(flotilla_control::tokens::Tokens::open(Some(tokens_file)).map_err(anyhow::Error::msg)?);
    super::tokens::follow_token_book(tokens.clone())?;
    let state = Arc::new(flotilla_control::ControlState {
        cluster,
        shards: a.aggregators.clone(),
        api_token: token.clone(),
        tokens,
        journal: Default::default(),
        series: Default::default(),
        apps: Default::default(),
        scheduler_networks: Default::default(),
        http: a.http.client()?,
        dialer,
        policies: Default::default(),
        pools: Default::default(),
        replicas: None,
        artifacts: None,
    });
    let mut options = a.http.options()?;
    if let Some(u) = &a.advertise_url {
        options.allowed_hosts.add_url_host(u);
    }
    let listener = tokio::net::TcpListener::bind(a.listen).await.with_context(|| format!("binding {}", a.listen))?;
    let url = match a.advertise_url {
        Some(u) => u.trim_end_matches('/').to_string(),
        None => format!("{}://{}", options.scheme(), listener.local_addr()?),
    };
    tracing::info!(apps = specs.len(), %url, %instance, "scheduler API");
    // Each app's scheduler starts once this process holds the app's lease (at once
    // unless another scheduler holds it); the API answers meanwhile.
    let (failed_tx, mut failed) = tokio::sync::mpsc::channel(1);
    let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
    let held: Vec<crate::ha::Held> = specs.iter().map(|_| crate::ha::Held::default()).collect();
    let campaigns = tokio::spawn({
        let (state, aggregators, prefix) = (state.clone(), a.aggregators.clone(), a.store_prefix.clone());
        let (leaders, grace, ttl, each) = (leaders.clone(), a.unknown_grace, a.lease_ttl, held.clone());
        async move {
            let opts = crate::ha::LeaseOptions { prefix: prefix.clone(), ttl };
            let opened = match crate::ha::Opened::open(backend, &opts, &leaders).await {
                Ok(o) => Arc::new(o),
                Err(e) => {
                    let _ = failed_tx.send(e).await;
                    return;
                }
            };
            let mut tasks = tokio::task::JoinSet::new();
            let channels = flotilla_scheduler::ShardChannels::new(aggregators.len());
            for ((spec, leader), held) in specs.into_iter().zip(leaders).zip(each) {
                let parts = crate::ha::Parts {
                    spec,
                    cluster: state.cluster.clone(),
                    aggregators: aggregators.clone(),
                    dialer: state.dialer.clone(),
                    channels: channels.clone(),
                    unknown_grace: grace,
                    state: state.clone(),
                    leader,
                };
                let (opened, opts) = (opened.clone(), crate::ha::LeaseOptions { prefix: prefix.clone(), ttl });
                tasks.spawn(async move {
                    let mut wait = Duration::from_secs(1);
                    loop {
                        match crate::ha::run(&opened, &opts, &parts, &held).await {
                            Err(e) if !alone => {
                                let app = parts.spec.name.clone();
                                tracing::warn!(%app, error = %format!("{e:#}"), ?wait, "the app's scheduler cannot start; trying again");
                                metrics::counter!(crate::catalogue::APP_START_FAILURES.name, "app" => app).increment(1);
                                parts.leader.set_waiting(format!("cannot start: {e:#}"));
                                tokio::time::sleep(wait).await;
                                wait = (wait * 2).min(Duration::from_secs(60));
                            }
                            done => return done,
                        }
                    }
                });
            }
            while let Some(done) = tasks.join_next().await {
                let e = match done {
                    Ok(Ok(())) => continue,
                    Ok(Err(e)) => e,
                    Err(e) => anyhow::anyhow!("an app's scheduler task ended: {e}"),
                };
                let _ = failed_tx.send(e).await;
                return;
            }
        }
    });
    if let Some(control) = a.control {
        tokio::spawn(follow_policies(state.clone(), control.clone()));
        let led = names.into_iter().zip(leaders.iter().cloned()).collect();
        tokio::spawn(register_with_control(state.http.clone(), control.clone(), token.clone(), led, url.clone()));
    }
    let failure = Arc::new(std::sync::Mutex::new(None));
    let served = flotilla_control::serve(listener, state, options, {
        let failure = failure.clone();
        async move {
            tokio::select! {
                _ = shutdown_signal() => {}
                Some(e) = failed.recv() => *failure.lock().unwrap_or_else(|p| p.into_inner()) = Some(e),
            }
        }
    })
    .await;
    // Give the leases up at once, all together: standbys take over without waiting for
    // the TTL. The campaigns end first, so none holds a lease taken after this looked.
    campaigns.abort();
    let _ = campaigns.await;
    let mut resigning = tokio::task::JoinSet::new();
    for h in held {
        resigning.spawn(async move { crate::ha::resign(&h).await });
    }
    if tokio::time::timeout(Duration::from_secs(5), resigning.join_all()).await.is_err() {
        tracing::warn!("some leases were not given up within 5 s: their standbys wait out the TTL");
    }
    if let Some(e) = failure.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    served
}

/// Registers the apps this process leads (and keeps re-registering them, as soft state)
/// with the control plane, all in one call: at once when it takes an app over, then
/// every 4–6 s (jittered, so processes do not call in step). The control plane forwards
/// an app's requests to whoever registered it last, so only the active scheduler does.
async fn register_with_control(
    client: reqwest::Client,
    control: String,
    token: flotilla_core::SharedToken,
    apps: Vec<(String, flotilla_scheduler::Leader)>,
    url: String,
) {
    // Which apps the last registration named, by their place in `apps`.
    let mut registered = vec![false; apps.len()];
    let mut next = std::time::Instant::now();
    loop {
        let held: Vec<bool> = apps.iter().map(|(_, l)| l.is_held()).collect();
        // An app lost and taken back is registered at once again.
        registered.iter_mut().zip(&held).for_each(|(r, h)| *r &= *h);
        let taken_over = held.iter().zip(&registered).any(|(h, r)| *h && !*r);
        if !taken_over && (std::time::Instant::now() < next || !held.contains(&true)) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            continue;
        }
        let led: Vec<&str> = apps.iter().zip(&held).filter(|(_, h)| **h).map(|((a, _), _)| a.as_str()).collect();
        next = std::time::Instant::now() + Duration::from_millis(rand::random_range(4_000..6_000));
        let mut req = client
            .post(format!("{}/v1/schedulers", control.trim_end_matches('/')))
            .json(&serde_json::json!({"apps": led, "url": url}))
            .timeout(Duration::from_secs(10));
        if let Some(t) = token.get() {
            req = req.bearer_auth(t);
        }
        match req.send().await {
            Ok(r) if r.status().is_success() => {
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                for refused in body["refused"].as_array().into_iter().flatten() {
                    let why = refused.pointer("/error/message").and_then(|m| m.as_str()).unwrap_or("");
                    tracing::warn!(app = %refused["app"], %why, "the control plane refused the registration");
                }
            }
            Ok(r) => {
                let status = r.status();
                let body: serde_json::Value = r.json().await.unwrap_or_default();
                let why = body.pointer("/error/message").and_then(|m| m.as_str()).unwrap_or("").to_string();
                tracing::warn!(apps = led.len(), %status, %why, "the control plane refused the registration");
            }
            Err(e) => tracing::warn!(apps = led.len(), error = %e, "cannot reach the control plane"),
        }
        registered = held;
    }
}

/// Keeps a standalone scheduler's named policies those of its control plane (every
/// 10 s), so `flotilla policy apply` reaches it too.
async fn follow_policies(state: Arc<flotilla_control::ControlState>, control: String) {
    let url = format!("{}/v1/policies", control.trim_end_matches('/'));
    loop {
        let mut req = state.http.get(&url).timeout(Duration::from_secs(5));
        // With the token the control plane answers under any name it is reached by.
        if let Some(t) = state.api_token.get() {
            req = req.bearer_auth(t);
        }
        let got = async { req.send().await?.json().await };
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
