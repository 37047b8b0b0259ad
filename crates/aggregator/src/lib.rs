//! A resource aggregator shard.
//!
//! - heartbeat path: `ingest` (sealed UDP on port P+1) → [`NodeLive`] atomics;
//! - control path: `quic` (register, drain on UDP port P) → [`Registry`];
//! - view: `applier` batches changes and runs the timing wheel (`liveness`),
//!   publishing versions that `grpc` streams as `WatchView` on TCP port P;
//! - commit path: `ledger_grpc` → [`Ledger`].
//!
//! The adapters (`grpc`, `ledger_grpc`, `quic`) convert with `wire` and answer errors
//! through `flotilla_proto::status`; the logic (`registry`, `ledger`, `applier`) knows
//! nothing of them.

mod admin_grpc;
mod applier;
mod auth;
pub mod catalogue;
mod grpc;
mod ingest;
mod ledger;
mod ledger_grpc;
mod liveness;
pub mod persist;
mod quic;
mod registry;
pub mod silence;
mod slab;
mod stats;
mod tls;
mod wire;

use crate::catalogue as m;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flotilla_core::now_ms;
use flotilla_view::ViewPublisher;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use applier::Push;
pub use auth::{GrpcAuth, GrpcRefusal};
pub use ingest::{Batch, Ingest, receive_batches};
pub use ledger::{Claim, ClaimKey, ClaimReject, Fenced, Ledger, MAX_FENCED_APPS, NodeFacts};
pub use liveness::Timeouts;
pub use persist::{FileState, MemState, ShardState, StateStore};
pub use registry::{Change, NodeLive, RegisterError, Registered, Registry, ReportError, SessionRef};
pub use stats::{HeartbeatDrop, ShardStats};
pub use tls::{TlsMaterial, write_private};
pub use wire::{InvalidRequest, MAX_CLAIMS, assignment_to_wire, claims_from_wire};

pub struct ShardConfig {
    /// `host:port`; port 0 picks a free port P such that UDP P, UDP P+1 and TCP P are free.
    pub listen: SocketAddr,
    pub shard: usize,
    pub shards: usize,
    pub timeouts: Timeouts,
    /// The fraction of a failure domain that must be silent for its silent nodes to go
    /// Unknown rather than Dead (`silence`); above 1, never.
    pub partition_threshold: f64,
    /// Longest a change waits before it is published.
    pub batch_window: Duration,
    /// Deltas kept for resuming subscribers.
    pub ring_capacity: usize,
    /// Session keys derive from it: a shard restarted with the same secret still
    /// authenticates the heartbeats of its sessions.
    pub master_secret: Vec<u8>,
    pub join_tokens: Vec<String>,
    pub tls: TlsMaterial,
    /// After a restart, claims are refused (`shard_recovering`) this long, while agents
    /// come back and the ledger is rebuilt from what they run. Zero for a fresh shard.
    pub recovery_window: Duration,
    /// Bearer tokens the gRPC services accept (none: every caller).
    pub grpc_tokens: Vec<String>,
    /// PEM certificate chain and key: the gRPC port speaks TLS (`https://` for clients).
    pub grpc_tls: Option<GrpcTls>,
    /// gRPC requests one peer address may make per second, in bursts of twice that (0: no
    /// limit).
    pub grpc_rate_limit: u32,
    /// Where cordons, drains and fencing marks are kept across restarts (none: memory only).
    pub state_store: Option<Arc<dyn StateStore>>,
    /// What the store held when the shard started (load it before [`start`]).
    pub initial_state: ShardState,
}

/// A user's certificate for the shard's gRPC port.
#[derive(Clone)]
pub struct GrpcTls {
    pub cert_pem: Vec<u8>,
    pub key_pem: Vec<u8>,
}

/// Concurrent gRPC streams one connection may open (WatchView holds one for good).
pub const MAX_GRPC_STREAMS_PER_CONNECTION: u32 = 256;

impl ShardConfig {
    pub fn new(
        listen: SocketAddr,
        shard: usize,
        shards: usize,
        master_secret: Vec<u8>,
        join_tokens: Vec<String>,
        tls: TlsMaterial,
    ) -> Self {
        ShardConfig {
            listen,
            shard,
            shards,
            recovery_window: Duration::ZERO,
            timeouts: Timeouts::default(),
            partition_threshold: silence::DEFAULT_THRESHOLD,
            batch_window: Duration::from_millis(20),
            ring_capacity: 1024,
            master_secret,
            join_tokens,
            tls,
            grpc_tokens: Vec::new(),
            grpc_tls: None,
            grpc_rate_limit: 0,
            state_store: None,
            initial_state: ShardState::default(),
        }
    }
}

/// A running shard. Dropping it does not stop it; call [`ShardHandle::shutdown`].
pub struct ShardHandle {
    /// The shard's `host:port`: QUIC on UDP, gRPC on TCP.
    pub addr: SocketAddr,
    pub heartbeat_addr: SocketAddr,
    pub epoch: u64,
    pub publisher: Arc<ViewPublisher>,
    pub registry: Arc<Registry>,
    pub stats: Arc<ShardStats>,
    pub ledger: Arc<std::sync::Mutex<Ledger>>,
    pub grpc_auth: GrpcAuth,
    shutdown: watch::Sender<bool>,
    endpoint: quinn::Endpoint,
    tasks: JoinSet<()>,
}

impl ShardHandle {
    /// Stops every task; open `WatchView` streams get one second to finish.
    pub async fn shutdown(mut self) {
        let _ = self.shutdown.send(true);
        self.endpoint.close(0u32.into(), b"shard shutting down");
        let drained =
            tokio::time::timeout(Duration::from_secs(1), async { while self.tasks.join_next().await.is_some() {} })
                .await;
        if drained.is_err() {
            self.tasks.abort_all();
            while self.tasks.join_next().await.is_some() {}
        }
    }

    /// Waits until the shard stops on its own (it does not, unless a task fails).
    pub async fn wait(&mut self) {
        while self.tasks.join_next().await.is_some() {}
    }
}

/// The heartbeat socket bound at `addr` as [`receive_batches`] reads it: the shard's
/// receive buffer (8 MiB), blocking reads that wake to look at the stop flag.
pub fn heartbeat_socket(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let sock = UdpSocket::bind(addr)?;
    grow_receive_buffer(&sock, 8 << 20);
    sock.set_nonblocking(false)?;
    sock.set_read_timeout(Some(ingest::STOP_POLL))?;
    Ok(sock)
}

/// A larger socket buffer absorbs bursts of heartbeats between two receive batches.
/// Best effort: SO_RCVBUFFORCE works as root, SO_RCVBUF up to the system's limit otherwise.
fn grow_receive_buffer(sock: &UdpSocket, bytes: i32) {
    use std::os::fd::AsRawFd;
    for opt in [libc::SO_RCVBUFFORCE, libc::SO_RCVBUF] {
        // SAFETY: setsockopt with a valid fd and a pointer to an i32 of the right size.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                opt,
                &bytes as *const i32 as *const libc::c_void,
                std::mem::size_of::<i32>() as libc::socklen_t,
            )
        };
        if r == 0 {
            return;
        }
    }
}

/// Binds the three sockets of a shard at one port.
fn bind_triple(listen: SocketAddr) -> anyhow::Result<(UdpSocket, UdpSocket, TcpListener)> {
    let attempt = |addr: SocketAddr| -> std::io::Result<(UdpSocket, UdpSocket, TcpListener)> {
        let quic = UdpSocket::bind(addr)?;
        let port = quic.local_addr()?.port();
        let hb_port = port.checked_add(1).ok_or_else(|| std::io::Error::other("port P+1 overflows"))?;
        let hb = heartbeat_socket(SocketAddr::new(addr.ip(), hb_port))?;
        let tcp = TcpListener::bind(SocketAddr::new(addr.ip(), port))?;
        Ok((quic, hb, tcp))
    };
    if listen.port() != 0 {
        return attempt(listen).with_context(|| format!("binding UDP {listen}, UDP port+1 and TCP {listen}"));
    }
    let mut last = None;
    for _ in 0..64 {
        match attempt(listen) {
            Ok(t) => return Ok(t),
            Err(e) => last = Some(e),
        }
    }
    Err(anyhow::anyhow!("no free port triple on {}: {:?}", listen.ip(), last))
}

/// A shard's state and its one writer, without sockets: [`start`] puts it on the network;
/// the deterministic simulation drives the same parts over simulated links.
pub struct ShardCore {
    pub shard: usize,
    pub epoch: u64,
    pub publisher: Arc<ViewPublisher>,
    pub registry: Arc<Registry>,
    pub stats: Arc<ShardStats>,
    pub ledger: Arc<std::sync::Mutex<Ledger>>,
    /// Until then claims are refused (`shard_recovering`).
    pub recovering_until_ms: u64,
    /// The gRPC token check; `set_tokens` rotates them while the shard runs.
    pub grpc_auth: GrpcAuth,
    grpc_tls: Option<GrpcTls>,
    /// Saves cordons, drains and fencing marks after each change.
    pub persister: Arc<persist::Persister>,
    /// The agents' QUIC connections (none in a simulation), for pushes and log requests.
    pub agents: Arc<admin_grpc::AgentLinks>,
}

impl ShardCore {
    /// Builds the state and spawns the applier into `tasks`. Nodes whose assignment set
    /// changed come out of the returned receiver, for whoever delivers pushes.
    pub fn spawn(
        config: &ShardConfig,
        shutdown: watch::Receiver<bool>,
        tasks: &mut JoinSet<()>,
    ) -> (ShardCore, tokio::sync::mpsc::UnboundedReceiver<Push>) {
        let epoch = now_ms().max(1);
        let (changes_tx, changes_rx) = tokio::sync::mpsc::unbounded_channel();
        let registry = Arc::new(Registry::new(
            config.shard,
            config.shards,
            config.master_secret.clone(),
            config.join_tokens.clone(),
            changes_tx,
        ));
        let stats = Arc::new(ShardStats::new(config.shard));
        let publisher = Arc::new(ViewPublisher::new(config.shard as u32, epoch, config.ring_capacity));
        let mut book = Ledger::new();
        config.initial_state.apply(&registry, &mut book);
        if !config.initial_state.cordons.is_empty() || !config.initial_state.fencing.is_empty() {
            tracing::info!(
                cordons = config.initial_state.cordons.len(),
                fencing_marks = config.initial_state.fencing.len(),
                "restored the persisted shard state"
            );
        }
        let ledger = Arc::new(std::sync::Mutex::new(book));
        let persister = Arc::new(persist::Persister::new(config.state_store.clone(), registry.clone(), ledger.clone()));
        let (push_tx, push_rx) = tokio::sync::mpsc::unbounded_channel();
        let applier = applier::Applier::new(
            registry.clone(),
            ledger.clone(),
            push_tx,
            publisher.clone(),
            config.timeouts,
            config.batch_window,
            config.partition_threshold,
        );
        tasks.spawn(applier.run(changes_rx, shutdown.clone()));
        let recovering_until_ms = now_ms() + config.recovery_window.as_millis() as u64;
        if !config.recovery_window.is_zero() {
            tracing::info!(window = ?config.recovery_window, "recovering: claims wait while agents report what they run");
            let recovering = metrics::gauge!(m::SHARD_RECOVERING.name, "shard" => config.shard.to_string());
            recovering.set(1.0);
            let window = config.recovery_window;
            tasks.spawn(async move {
                tokio::time::sleep(window).await;
                tracing::info!("recovery window over: taking claims");
                recovering.set(0.0);
            });
        }
        let core = ShardCore {
            shard: config.shard,
            epoch,
            publisher,
            registry,
            stats,
            ledger,
            recovering_until_ms,
            grpc_auth: GrpcAuth::new(config.grpc_tokens.clone(), config.grpc_rate_limit),
            grpc_tls: config.grpc_tls.clone(),
            persister,
            agents: Arc::default(),
        };
        (core, push_rx)
    }

    /// Serves the shard's gRPC services (WatchView, LedgerService, NodeAdmin) on the
    /// connections `incoming` yields, behind the token check (and TLS when configured),
    /// until `shutdown` fires.
    pub fn serve_grpc<I, IO, IE>(
        &self,
        incoming: I,
        mut shutdown: watch::Receiver<bool>,
    ) -> anyhow::Result<impl std::future::Future<Output = Result<(), tonic::transport::Error>> + Send + 'static>
    where
        I: tokio_stream::Stream<Item = Result<IO, IE>> + Send + 'static,
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + tonic::transport::server::Connected + Unpin + Send + 'static,
        IO::ConnectInfo: Clone + Send + Sync + 'static,
        IE: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    {
        let view = grpc::ViewGrpc::new(self.publisher.clone(), self.shard, shutdown.clone()).into_server();
        let admin = flotilla_proto::v1::node_admin_service_server::NodeAdminServiceServer::new(admin_grpc::AdminGrpc {
            registry: self.registry.clone(),
            persister: self.persister.clone(),
            agents: self.agents.clone(),
        });
        let ledger = ledger_grpc::LedgerGrpc {
            ledger: self.ledger.clone(),
            publisher: self.publisher.clone(),
            registry: self.registry.clone(),
            recovering_until_ms: self.recovering_until_ms,
            persister: self.persister.clone(),
        }
        .into_server();
        let mut server = tonic::transport::Server::builder().max_concurrent_streams(MAX_GRPC_STREAMS_PER_CONNECTION);
        if let Some(tls) = &self.grpc_tls {
            let identity = tonic::transport::Identity::from_pem(&tls.cert_pem, &tls.key_pem);
            server = server
                .tls_config(tonic::transport::ServerTlsConfig::new().identity(identity))
                .context("the gRPC TLS certificate or key")?;
        }
        let router = server
            .layer(tonic::service::InterceptorLayer::new(self.grpc_auth.clone()))
            .add_service(view)
            .add_service(ledger)
            .add_service(admin);
        Ok(router.serve_with_incoming_shutdown(incoming, async move {
            let _ = shutdown.changed().await;
        }))
    }
}

/// Starts a shard on the current tokio runtime.
pub async fn start(config: ShardConfig) -> anyhow::Result<ShardHandle> {
    let (quic_sock, hb_sock, tcp) = bind_triple(config.listen)?;
    let addr = quic_sock.local_addr()?;
    let heartbeat_addr = hb_sock.local_addr()?;
    let (shutdown, shutdown_rx) = watch::channel(false);
    let mut tasks = JoinSet::new();
    let (core, push_rx) = ShardCore::spawn(&config, shutdown_rx.clone(), &mut tasks);

    let ingest = Ingest::new(core.registry.clone(), core.stats.clone());
    let rx = shutdown_rx.clone();
    tasks.spawn(async move {
        if let Err(e) = ingest::run(hb_sock, ingest, rx).await {
            tracing::error!(error = %e, "heartbeat ingest stopped");
        }
    });

    let endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(config.tls.quic_server_config()?),
        quic_sock,
        Arc::new(quinn::TokioRuntime),
    )?;
    let ctx = Arc::new(quic::QuicContext {
        registry: core.registry.clone(),
        stats: core.stats.clone(),
        heartbeat_port: heartbeat_addr.port(),
        epoch: core.epoch,
        agents: core.agents.clone(),
        ledger: core.ledger.clone(),
    });
    tasks.spawn(quic::serve(endpoint.clone(), ctx.clone()));
    tasks.spawn(quic::push_assignments(push_rx, ctx));

    tcp.set_nonblocking(true)?;
    let tcp = tokio::net::TcpListener::from_std(tcp)?;
    let serving = core.serve_grpc(tokio_stream::wrappers::TcpListenerStream::new(tcp), shutdown_rx)?;
    tasks.spawn(async move {
        if let Err(e) = serving.await {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    });
    tracing::info!(shard = config.shard, %addr, heartbeats = %heartbeat_addr, epoch = core.epoch, "shard started");
    let ShardCore { epoch, publisher, registry, stats, ledger, grpc_auth, .. } = core;
    Ok(ShardHandle {
        addr,
        heartbeat_addr,
        epoch,
        publisher,
        registry,
        stats,
        ledger,
        grpc_auth,
        shutdown,
        endpoint,
        tasks,
    })
}
