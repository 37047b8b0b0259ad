//! `flotilla control`: the control plane, following every shard and serving the API.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::Args;

use super::args::{HttpArgs, ShardClientArgs};
use super::shutdown_signal;
use super::tokens::{api_token_file, reload_tokens};

#[derive(Debug, Args)]
pub struct ControlArgs {
    #[arg(long, default_value = "127.0.0.1:7700")]
    pub listen: SocketAddr,
    /// Shard addresses (`host:port`) in shard-index order.
    #[arg(long, value_delimiter = ',', required = true, value_parser = crate::serve::args::parse_shard_address)]
    pub aggregators: Vec<String>,
    /// File with the API token for mutating calls (the `admin` scope, named `api-token`).
    #[arg(long)]
    pub api_token_file: Option<PathBuf>,
    /// Named tokens with scopes (`flotilla token create` writes it; followed for changes).
    #[arg(long)]
    pub tokens_file: Option<PathBuf>,
    /// Where named autoscaling policies are kept (without it, in memory only).
    #[arg(long)]
    pub policies_dir: Option<PathBuf>,
    /// Where the event history is kept (`flotilla events`; without it, in memory only:
    /// 100,000 events or 7 days either way).
    #[arg(long)]
    pub events_db: Option<PathBuf>,
    /// Where the history charts' samples are kept (10 s for 24 h; without it, in memory).
    #[arg(long)]
    pub history_db: Option<PathBuf>,
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
    /// Address ranges (CIDRs, comma-separated) a standalone scheduler's registered URL
    /// may resolve to; any but link-local ones without it.
    #[arg(long, value_delimiter = ',', value_name = "CIDR")]
    pub scheduler_networks: Vec<String>,
    /// Keep the cluster's artifact origin here (`flotilla artifact push`), and track which
    /// agents hold which pieces; without it, `flotilla://` artifacts cannot be fetched.
    #[arg(long)]
    pub artifacts_dir: Option<PathBuf>,
    /// The largest artifact a push may store (`64Gi`, bytes, …).
    #[arg(long, default_value = "64Gi", value_parser = flotilla_core::quantity::memory_bytes)]
    pub artifact_max_bytes: u64,
    /// What every reader of the origin may take together, in bytes a second (`100Mi`);
    /// unset: no limit. Peers carry the rest.
    #[arg(long, value_parser = flotilla_core::quantity::memory_bytes)]
    pub artifact_origin_rate: Option<u64>,
    #[command(flatten)]
    pub origin: super::args::OriginUrlArgs,
    /// FOR TESTS: cut off this fraction of the origin's reads partway (0..1).
    #[arg(long, hide = true, default_value_t = 0.0)]
    pub test_origin_drop: f64,
    /// The agents' join-token file (one token a line, newest first): the tracker takes
    /// announces only from agents that prove they hold one. Followed for rotations.
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
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
    let tokens = Arc::new(flotilla_control::tokens::Tokens::open(a.tokens_file.clone()).map_err(anyhow::Error::msg)?);
    if a.tokens_file.is_some() {
        super::tokens::follow_token_book(tokens.clone())?;
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
    anyhow::ensure!(
        a.artifacts_dir.is_some() || a.origin.artifact_origin_url.is_none(),
        "--artifact-origin-url needs --artifacts-dir (where pushes are taken and manifests made)"
    );
    let artifacts = match &a.artifacts_dir {
        Some(dir) => {
            let origin = flotilla_control::artifacts::Origin::open(
                dir.clone(),
                a.artifact_max_bytes,
                a.artifact_origin_rate,
                a.test_origin_drop.clamp(0.0, 1.0),
                a.origin.remote()?,
            )?;
            match &a.join_token_file {
                Some(f) => {
                    let tokens = crate::secrets::read_tokens(f)?;
                    reload_tokens(super::tokens::tracker_token_file(f.clone(), tokens, origin.clone()))?;
                }
                None => tracing::warn!("no --join-token-file: the tracker refuses agents, which read the origin alone"),
            }
            Some(origin)
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
        tokens,
        journal: Arc::new(match &a.events_db {
            Some(path) => {
                flotilla_control::journal::Journal::open(path, Default::default()).map_err(anyhow::Error::msg)?
            }
            None => Default::default(),
        }),
        series: Arc::new(match &a.history_db {
            Some(path) => flotilla_control::series::Series::open(path).map_err(anyhow::Error::msg)?,
            None => Default::default(),
        }),
        apps: Default::default(),
        scheduler_networks: flotilla_control::SchedulerNetworks::new(&a.scheduler_networks)
            .map_err(anyhow::Error::msg)?,
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
        artifacts,
    });
    flotilla_control::record_events(state.clone());
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
