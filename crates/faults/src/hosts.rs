//! The software of the simulated hosts: shards and the app scheduler, each the real
//! code on turmoil's TCP. A crash drops everything a host's software holds; a bounce
//! starts it again from what survives (the agents, the scheduler's store).

use flotilla_core::LockExt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use flotilla_aggregator::{ShardConfig, ShardCore, TlsMaterial};
use flotilla_proto::dial::{BoxIo, Dialer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::agents::{JOIN_TOKEN, ShardSide};
use crate::{GRPC_PORT, SHARDS, Shared};

pub const SCHEDULER: &str = "scheduler";
/// How long a restarted shard refuses claims while its agents come back.
pub const RECOVERY_WINDOW: Duration = Duration::from_secs(3);
/// How long the scheduler waits for members whose shard is silent.
pub const UNKNOWN_GRACE_MS: u64 = 5_000;
const AGENT_STEP: Duration = Duration::from_millis(100);

pub fn shard_host(shard: usize) -> String {
    format!("shard-{shard}")
}

fn shard_addr(shard: usize) -> String {
    format!("{}:{GRPC_PORT}", shard_host(shard))
}

/// A shard: the real core and gRPC services, and the agents of its domain.
pub async fn shard(shard: usize, world: Shared) -> turmoil::Result {
    let restarted = {
        let mut w = world.borrow_mut();
        w.shard_starts[shard] += 1;
        w.shard_starts[shard] > 1
    };
    let (tls, _, _) = TlsMaterial::self_signed(&["sim"])?;
    let listen = std::net::SocketAddr::from(([0, 0, 0, 0], GRPC_PORT));
    let mut config =
        ShardConfig::new(listen, shard, SHARDS, b"sim-shard-secret".to_vec(), vec![JOIN_TOKEN.to_string()], tls);
    if restarted {
        config.recovery_window = RECOVERY_WINDOW;
    }
    // Cordons and fencing marks survive the crash, as the data dir or etcd keeps them.
    let state = world.borrow().shard_states[shard].clone();
    config.initial_state = state.load().map_err(|e| format!("{e:#}"))?;
    config.state_store = Some(state);
    let (_stop, stop) = tokio::sync::watch::channel(false);
    let mut tasks = tokio::task::JoinSet::new();
    let (core, mut pushes) = ShardCore::spawn(&config, stop.clone(), &mut tasks);
    world.borrow_mut().ledgers[shard] = Some(core.ledger.clone());

    let listener = turmoil::net::TcpListener::bind(listen).await?;
    let (conns, incoming) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            if conns.send(Ok::<_, std::io::Error>(SimStream(s))).await.is_err() {
                return;
            }
        }
    });
    tokio::spawn(core.serve_grpc(tokio_stream::wrappers::ReceiverStream::new(incoming), stop)?);

    let mut ingest = flotilla_aggregator::Ingest::new(core.registry.clone(), core.stats.clone());
    let mut tick = tokio::time::interval(AGENT_STEP);
    loop {
        tick.tick().await;
        let now = flotilla_core::now_ms();
        let mut w = world.borrow_mut();
        while let Ok(push) = pushes.try_recv() {
            let ledger = core.ledger.lock_or_recover();
            if let Some(agent) = w.agents.iter_mut().find(|a| a.node == push.node) {
                agent.take_push(&ledger);
            }
        }
        let mut side = ShardSide { registry: &core.registry, ingest: &mut ingest };
        for agent in w.agents.iter_mut().filter(|a| a.shard == shard) {
            agent.step(&mut side, now);
        }
    }
}

/// The app's scheduler: view followers and the reconcile loop over simulated TCP.
pub async fn scheduler(world: Shared) -> turmoil::Result {
    let (store, seed, token) = {
        let mut w = world.borrow_mut();
        w.scheduler_starts += 1;
        (w.store.clone(), w.seed.wrapping_mul(31).wrapping_add(u64::from(w.scheduler_starts)), w.scheduler_starts)
    };
    let dialer = Dialer::with_transport(Arc::new(|authority: String| {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(authority).await?;
            Ok(Box::new(stream) as BoxIo)
        })
    }));
    let cluster = flotilla_view::ClusterView::new(SHARDS);
    for shard in 0..SHARDS {
        tokio::spawn(flotilla_view::follow_shard(cluster.clone(), shard, shard_addr(shard), dialer.clone()));
    }
    let spec = flotilla_scheduler::AppSpec::parse(crate::SPEC).map_err(|e| e.to_string())?;
    let addrs = (0..SHARDS).map(shard_addr).collect();
    let (scheduler, _handle) = flotilla_scheduler::Scheduler::new(spec, cluster, addrs, store)?;
    let grace = std::time::Duration::from_millis(UNKNOWN_GRACE_MS);
    // Each start holds a newer lease: its fencing token grows.
    let scheduler = scheduler.with_fencing_token(u64::from(token));
    scheduler.with_unknown_grace(grace).with_seed(seed).with_dialer(dialer).run().await;
    Ok(())
}

/// A turmoil stream as tonic's server takes it.
struct SimStream(turmoil::net::TcpStream);

impl tonic::transport::server::Connected for SimStream {
    type ConnectInfo = ();
    fn connect_info(&self) -> Self::ConnectInfo {}
}

impl AsyncRead for SimStream {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for SimStream {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
