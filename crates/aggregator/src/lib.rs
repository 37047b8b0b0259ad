//! A resource aggregator shard.
//!
//! - heartbeat path: [`ingest`] (sealed UDP on port P+1) → [`registry::NodeLive`] atomics;
//! - control path: [`quic`] (register, drain on UDP port P) → [`registry::Registry`];
//! - view: [`applier`] batches changes and runs the timing wheel ([`liveness`]),
//!   publishing versions that [`grpc`] streams as `WatchView` on TCP port P.

pub mod applier;
pub mod grpc;
pub mod ingest;
pub mod ledger;
pub mod ledger_grpc;
pub mod liveness;
pub mod quic;
pub mod registry;
pub mod stats;
pub mod tls;

use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use flotilla_view::ViewPublisher;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use liveness::Timeouts;
pub use tls::TlsMaterial;

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

pub struct ShardConfig {
    /// `host:port`; port 0 picks a free port P such that UDP P, UDP P+1 and TCP P are free.
    pub listen: SocketAddr,
    pub shard: usize,
    pub shards: usize,
    pub timeouts: Timeouts,
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
}

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
            batch_window: Duration::from_millis(20),
            ring_capacity: 1024,
            master_secret,
            join_tokens,
            tls,
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
    pub registry: Arc<registry::Registry>,
    pub stats: Arc<stats::ShardStats>,
    pub ledger: Arc<std::sync::Mutex<ledger::Ledger>>,
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
        let hb = UdpSocket::bind(SocketAddr::new(addr.ip(), hb_port))?;
        grow_receive_buffer(&hb, 8 << 20);
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

/// Starts a shard on the current tokio runtime.
pub async fn start(config: ShardConfig) -> anyhow::Result<ShardHandle> {
    let (quic_sock, hb_sock, tcp) = bind_triple(config.listen)?;
    let addr = quic_sock.local_addr()?;
    let heartbeat_addr = hb_sock.local_addr()?;
    let epoch = now_ms().max(1);
    let (shutdown, shutdown_rx) = watch::channel(false);
    let (changes_tx, changes_rx) = tokio::sync::mpsc::unbounded_channel();
    let registry = Arc::new(registry::Registry::new(
        config.shard,
        config.shards,
        config.master_secret,
        config.join_tokens,
        changes_tx,
    ));
    let stats = Arc::new(stats::ShardStats::new(config.shard));
    let publisher = Arc::new(ViewPublisher::new(config.shard as u32, epoch, config.ring_capacity));
    let mut tasks = JoinSet::new();
    let ledger = Arc::new(std::sync::Mutex::new(ledger::Ledger::new()));
    let (push_tx, push_rx) = tokio::sync::mpsc::unbounded_channel();

    let applier = applier::Applier::new(
        registry.clone(),
        ledger.clone(),
        push_tx,
        publisher.clone(),
        config.timeouts,
        config.batch_window,
    );
    tasks.spawn(applier.run(changes_rx, shutdown_rx.clone()));

    let ingest = ingest::Ingest::new(registry.clone(), stats.clone());
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
        registry: registry.clone(),
        stats: stats.clone(),
        heartbeat_port: heartbeat_addr.port(),
        epoch,
        agents: dashmap::DashMap::new(),
        ledger: ledger.clone(),
    });
    tasks.spawn(quic::serve(endpoint.clone(), ctx.clone()));
    tasks.spawn(quic::push_assignments(push_rx, ctx));

    tcp.set_nonblocking(true)?;
    let tcp = tokio::net::TcpListener::from_std(tcp)?;
    let svc = grpc::ViewGrpc::new(publisher.clone(), config.shard, shutdown_rx.clone()).into_server();
    let v1_admin = flotilla_proto::v1::node_admin_service_server::NodeAdminServiceServer::new(ledger_grpc::AdminGrpc {
        registry: registry.clone(),
    });
    let recovering_until_ms = now_ms() + config.recovery_window.as_millis() as u64;
    if !config.recovery_window.is_zero() {
        tracing::info!(window = ?config.recovery_window, "recovering: claims wait while agents report what they run");
        metrics::gauge!("flotilla_shard_recovering").set(1.0);
        let window = config.recovery_window;
        tokio::spawn(async move {
            tokio::time::sleep(window).await;
            tracing::info!("recovery window over: taking claims");
            metrics::gauge!("flotilla_shard_recovering").set(0.0);
        });
    }
    let ledger_svc = ledger_grpc::LedgerGrpc {
        ledger: ledger.clone(),
        publisher: publisher.clone(),
        registry: registry.clone(),
        recovering_until_ms,
    }
    .into_server();
    let mut rx = shutdown_rx;
    tasks.spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(tcp);
        let r = tonic::transport::Server::builder()
            .add_service(svc)
            .add_service(ledger_svc)
            .add_service(v1_admin)
            .serve_with_incoming_shutdown(incoming, async move {
                let _ = rx.changed().await;
            })
            .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "gRPC server stopped");
        }
    });
    tracing::info!(shard = config.shard, %addr, heartbeats = %heartbeat_addr, epoch, "shard started");
    Ok(ShardHandle { addr, heartbeat_addr, epoch, publisher, registry, stats, ledger, shutdown, endpoint, tasks })
}
