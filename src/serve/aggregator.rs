//! `flotilla aggregator`: one resource aggregator shard.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;

use super::args::LivenessArgs;
use super::shutdown_signal;
use super::tokens::{grpc_token_file, join_token_file, reload_tokens};
use crate::cli::http::parse_duration;
use crate::secrets::DataDir;
use flotilla_aggregator::TlsMaterial;

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

/// While a shard process waits for the lease, it answers QUIC at its address by refusing
/// every connection (`Incoming::refuse`, before any handshake): an agent trying it gets a
/// refusal in one round trip and moves to the next address at once, instead of spending
/// its connect timeout on a silent port. Nothing when the port is chosen at start (0), or
/// when it cannot be bound (then the agents wait out their timeout, as before).
fn refuse_while_waiting(listen: SocketAddr, data: &DataDir) -> Option<(quinn::Endpoint, tokio::task::JoinHandle<()>)> {
    if listen.port() == 0 {
        return None;
    }
    let config = TlsMaterial::load(&data.tls_cert, &data.tls_key).and_then(TlsMaterial::quic_server_config);
    let endpoint = match config.map(|c| quinn::Endpoint::server(c, listen)) {
        Ok(Ok(e)) => e,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, %listen, "standby: cannot listen to refuse agents; they will time out instead");
            return None;
        }
        Err(e) => {
            tracing::warn!(error = %format!("{e:#}"), "standby: no TLS for the refusing listener");
            return None;
        }
    };
    let accepting = endpoint.clone();
    let task = tokio::spawn(async move {
        while let Some(incoming) = accepting.accept().await {
            incoming.refuse();
        }
    });
    Some((endpoint, task))
}

/// Closes the refusing listener and waits (up to 2 s) until its port is free for the
/// shard itself.
async fn hand_over(refusing: Option<(quinn::Endpoint, tokio::task::JoinHandle<()>)>, listen: SocketAddr) {
    let Some((endpoint, task)) = refusing else { return };
    task.abort();
    endpoint.close(0u32.into(), b"serving");
    endpoint.wait_idle().await;
    drop(endpoint);
    for _ in 0..40 {
        if std::net::UdpSocket::bind(listen).is_ok() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tracing::warn!(%listen, "the refusing listener's port is still busy; starting the shard anyway");
}

pub async fn aggregator(a: AggregatorArgs) -> anyhow::Result<()> {
    if a.shards == 0 || a.shard >= a.shards {
        bail!("--shard {} must be below --shards {}", a.shard, a.shards);
    }
    std::fs::create_dir_all(&a.data).with_context(|| format!("creating the data dir {}", a.data.display()))?;
    let data = match &a.secrets {
        Some(dir) if dir != &a.data => DataDir::read_only(dir)?,
        _ => {
            // Agents verify the shard by the address they dial: the one it listens on.
            let host = a.listen.ip().to_string();
            let hosts: &[&str] = if a.listen.ip().is_unspecified() { &[] } else { &[&host] };
            DataDir::prepare(&a.data, hosts)?
        }
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
            let refusing = refuse_while_waiting(a.listen, &data);
            let lease = shard_lease(&a, &client).await;
            hand_over(refusing, a.listen).await;
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
    let fenced = etcd.zip(lease.as_ref().map(|l| l.lease().clone()));
    let (state, loaded) = crate::shard_state::open(fenced, &a.store_prefix, &a.data, a.shard, a.shards).await?;
    config.initial_state = loaded;
    config.state_store = Some(state);
    if let (Some(cert), Some(key)) = (&a.grpc_tls_cert, &a.grpc_tls_key) {
        let read = |p: &PathBuf| std::fs::read(p).with_context(|| format!("reading {}", p.display()));
        config.grpc_tls = Some(flotilla_aggregator::GrpcTls { cert_pem: read(cert)?, key_pem: read(key)? });
    }
    let mut shard = flotilla_aggregator::start(config).await?;
    reload_tokens(join_token_file(&data, vec![shard.registry.clone()], None))?;
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
