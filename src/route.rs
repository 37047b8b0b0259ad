//! `flotilla route`: the health-weighted reverse proxy. With `--app` it follows the app's
//! route table (WatchRoutes, found through the control plane); with `--backends` it
//! balances over a fixed list.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use flotilla_router::catalogue::{self, Labels};
use flotilla_router::clients::ClientLimits;
use flotilla_router::{Balancer, Config, Policy};

#[derive(Debug, Args)]
pub struct RouteArgs {
    /// Route to this app's serving members, with the weights its scheduler publishes.
    #[arg(long, conflicts_with = "backends", required_unless_present = "backends")]
    pub app: Option<String>,
    /// Route over a fixed list instead (`host:port,...`), all with weight 1.
    #[arg(long, value_delimiter = ',')]
    pub backends: Vec<String>,
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// Serve /metrics here.
    #[arg(long, default_value = "127.0.0.1:0")]
    pub metrics: SocketAddr,
    /// The control plane (with --app).
    #[arg(long, env = "FLOTILLA_ADDR", default_value = "http://127.0.0.1:7700")]
    pub addr: String,
    /// PEM file with the CA to trust when the control plane (or the app's scheduler)
    /// serves HTTPS.
    #[arg(long, env = "FLOTILLA_CA")]
    pub ca: Option<std::path::PathBuf>,
    /// A token with the operate scope, for the per-version traffic reports a canary is
    /// judged on (default: $FLOTILLA_TOKEN, else $FLOTILLA_DATA/api-token; without one,
    /// an API that checks tokens refuses the reports and a canary waits for them).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// `p2c` (weighted power of two choices on latency and load, the default) or
    /// `round-robin` (for comparison). `peak-ewma`, its name while latency was a peak EWMA,
    /// is still accepted.
    #[arg(long, default_value = "p2c")]
    pub policy: String,
    /// A new endpoint's weight ramps up over this long.
    #[arg(long, default_value = "10s", value_parser = crate::cli::http::parse_duration)]
    pub slow_start: Duration,
    /// A request taking longer fails (and counts against its endpoint).
    #[arg(long, default_value = "30s", value_parser = crate::cli::http::parse_duration)]
    pub timeout: Duration,
    /// Print the bound addresses as one JSON line on stdout (for scripts and tests).
    #[arg(long)]
    pub print_addrs: bool,
    /// Proxy threads, each with its own listener and connection pool (default: one per
    /// core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=256))]
    pub threads: Option<u16>,
    /// A client connection that has not sent a whole request this long after its first
    /// byte is answered 408 and closed (HAProxy's `timeout http-request`).
    #[arg(long, default_value = "10s", value_parser = crate::cli::http::parse_duration)]
    pub client_header_timeout: Duration,
    /// A kept-alive client connection with no new request this long is closed.
    #[arg(long, default_value = "60s", value_parser = crate::cli::http::parse_duration)]
    pub client_idle_timeout: Duration,
    /// A client that reads nothing of an answer for this long is cut.
    #[arg(long, default_value = "30s", value_parser = crate::cli::http::parse_duration)]
    pub client_write_timeout: Duration,
    /// Most client connections at once (default: half the open-file limit, less a margin);
    /// at the cap a new one closes the idlest.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub max_client_connections: Option<u32>,
    /// Most client connections from one source address (default: half the cap).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=10_000_000))]
    pub max_client_connections_per_source: Option<u32>,
}

impl RouteArgs {
    fn client_limits(&self) -> anyhow::Result<ClientLimits> {
        for (flag, d) in [
            ("--client-header-timeout", self.client_header_timeout),
            ("--client-idle-timeout", self.client_idle_timeout),
            ("--client-write-timeout", self.client_write_timeout),
        ] {
            if d.is_zero() {
                bail!("{flag}: must be more than 0");
            }
        }
        let defaults = ClientLimits::default();
        let max = self.max_client_connections.map_or(defaults.max_connections, |m| m as usize);
        Ok(ClientLimits {
            header_timeout: self.client_header_timeout,
            idle_timeout: self.client_idle_timeout,
            max_connections: max,
            max_per_source: self.max_client_connections_per_source.map_or((max / 2).max(1), |m| m as usize),
            write_timeout: self.client_write_timeout,
        })
    }
}

pub async fn run(a: RouteArgs) -> anyhow::Result<()> {
    let policy = match a.policy.as_str() {
        "p2c" | "peak-ewma" => Policy::P2c,
        "round-robin" => Policy::RoundRobin,
        p => bail!("--policy: {p:?} is not p2c or round-robin"),
    };
    for b in &a.backends {
        if b.parse::<SocketAddr>().is_err() && !b.contains(':') {
            bail!("--backends: {b:?} is not host:port");
        }
    }
    let limits = a.client_limits()?;
    let balancer = Arc::new(Balancer::new(Config { policy, slow_start: a.slow_start, ..Config::default() }));
    // Series are labelled by app and node, never by endpoint address (it churns); with a
    // fixed list the app is "backends" and each backend is its own node.
    let labels = Labels::new(a.app.as_deref().unwrap_or("backends"));
    labels.export_weights(balancer.clone());
    if a.app.is_some() {
        let mut dialer = flotilla_proto::dial::Dialer::network();
        if let Some(token) = a.token.clone().or_else(|| crate::cli::http::token_from_data().ok()) {
            dialer = dialer.with_token(&token).map_err(|_| anyhow::anyhow!("--token: not a valid header value"))?;
        }
        if let Some(ca) = &a.ca {
            dialer = dialer.with_ca(std::fs::read(ca).with_context(|| format!("reading --ca {}", ca.display()))?);
        }
        let upstream =
            flotilla_router::follow::Upstream { http: crate::cli::http::http_client(a.ca.as_deref())?, dialer };
        tokio::spawn(flotilla_router::follow::follow_app(a.addr.clone(), labels.clone(), balancer.clone(), upstream));
    } else {
        let routes: Vec<(String, f64)> = a.backends.iter().map(|b| (b.clone(), 1.0)).collect();
        balancer.update(&routes, Instant::now());
        labels.set_nodes(a.backends.iter().map(|b| (b.as_str(), b.as_str())));
        metrics::gauge!(catalogue::ENDPOINTS.name).set(routes.len() as f64);
    }
    // /readyz: ready once there is somewhere to route to (a table with an endpoint).
    let table = balancer.clone();
    flotilla_obs::health::readiness().check("router", move || {
        if table.endpoints().is_empty() { Err("no route table with an endpoint yet".to_string()) } else { Ok(()) }
    });
    let metrics = flotilla_obs::serve_metrics(a.metrics).await?;
    let listener = flotilla_router::proxy::listen(a.listen).with_context(|| format!("binding {}", a.listen))?;
    let threads = a.threads.map_or_else(|| std::thread::available_parallelism().map_or(1, usize::from), usize::from);
    let listen = listener.local_addr()?;
    if a.print_addrs {
        println!("{}", serde_json::json!({"listen": listen.to_string(), "metrics": metrics.to_string()}));
    }
    tracing::info!(%listen, %metrics, ?policy, app = ?a.app, max_client_connections = limits.max_connections, "routing");
    tokio::select! {
        r = flotilla_router::proxy::serve_per_core(listener, threads, balancer, a.timeout, labels, limits) => Ok(r?),
        _ = crate::serve::shutdown_signal() => Ok(()),
    }
}
