//! The control path over QUIC: register, drain (and later, assignment pushes).
//! One request per bidirectional stream; a wrong credential closes the connection
//! with its reason.

use crate::catalogue as m;
use flotilla_core::LockExt;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use flotilla_core::{ErrorKind, ServiceError, now_ms};
use flotilla_proto::{MAX_CONTROL_MESSAGE, v1};
use prost::Message;
use quinn::VarInt;

use crate::applier::Push;
use crate::ledger::Ledger;
use crate::registry::{RegisterError, Registry, ReportError};
use crate::stats::ShardStats;
use crate::wire;

/// Application close codes.
pub const CLOSE_REJECTED: u32 = 1;

pub struct QuicContext {
    pub registry: Arc<Registry>,
    pub stats: Arc<ShardStats>,
    pub heartbeat_port: u16,
    pub epoch: u64,
    /// Open control connections by their number (see [`connection_number`]); a session
    /// remembers the number of the one it registered over, and its pushes travel on it.
    pub agents: Arc<crate::admin_grpc::AgentLinks>,
    pub ledger: Arc<Mutex<Ledger>>,
}

/// Sends each changed node's assignment set to its agent on a unidirectional stream.
/// Changes queued for the same node are coalesced into one push, and the set is built
/// here, off the applier, only for nodes with a connection. Pushes carry a version, so
/// the agent keeps the newest whatever order they arrive in.
pub async fn push_assignments(mut rx: tokio::sync::mpsc::UnboundedReceiver<Push>, ctx: Arc<QuicContext>) {
    let pushed = metrics::counter!(m::ASSIGNMENT_PUSHES.name, "result" => "sent");
    let unreachable = metrics::counter!(m::ASSIGNMENT_PUSHES.name, "result" => "no_connection");
    let mut batch = HashSet::new();
    while let Some(p) = rx.recv().await {
        batch.insert(p.node);
        while let Ok(p) = rx.try_recv() {
            batch.insert(p.node);
        }
        for node in batch.drain() {
            let owner = ctx.registry.with_node(&node, |l| l.owner);
            let Some(conn) = owner.and_then(|o| ctx.agents.get(&o)).map(|c| c.value().clone()) else {
                unreachable.increment(1);
                continue;
            };
            let message = {
                let ledger = ctx.ledger.lock_or_recover();
                let (version, claims) = ledger.assignments(&node);
                v1::AssignmentPush {
                    assignment_version: version,
                    assignments: claims.into_iter().map(wire::assignment_to_wire).collect(),
                    node_id: node.to_string(),
                }
            };
            let (bytes, pushed) = (message.encode_to_vec(), pushed.clone());
            tokio::spawn(async move {
                let r = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                    let mut s = conn.open_uni().await?;
                    s.write_all(&bytes).await?;
                    s.finish()?;
                    anyhow::Ok(())
                })
                .await;
                match r {
                    Ok(Ok(())) => pushed.increment(1),
                    // A connection lost with the push: the agent's next registration
                    // names the version it holds, and gets the set again (`Applier`).
                    Ok(Err(e)) => tracing::debug!(%node, error = %e, "assignment push failed"),
                    Err(_) => tracing::debug!(%node, "assignment push timed out"),
                }
            });
        }
    }
}

pub async fn serve(endpoint: quinn::Endpoint, ctx: Arc<QuicContext>) {
    while let Some(incoming) = endpoint.accept().await {
        let ctx = ctx.clone();
        tokio::spawn(async move {
            match incoming.await {
                Ok(conn) => connection(conn, ctx).await,
                Err(e) => tracing::debug!(error = %e, "QUIC handshake failed"),
            }
        });
    }
}

/// Numbers control connections for the life of the process (0 is "none"). Unlike
/// quinn's `stable_id`, a number is never reused, so a session opened over a closed
/// connection is never owned by a later one.
fn connection_number() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    // Four billion connections would wrap it: the last number is then shared, never 0.
    NEXT.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| Some(n.saturating_add(1))).unwrap_or(u32::MAX)
}

async fn connection(conn: quinn::Connection, ctx: Arc<QuicContext>) {
    // Sessions registered over this connection carry its number: only they may be
    // drained or reported for through it.
    let number = connection_number();
    ctx.agents.insert(number, conn.clone());
    loop {
        let (send, recv) = match conn.accept_bi().await {
            Ok(s) => s,
            Err(_) => break,
        };
        let (ctx, conn) = (ctx.clone(), conn.clone());
        tokio::spawn(async move { stream(send, recv, &conn, number, &ctx).await });
    }
    ctx.agents.remove(&number);
}

/// Why a control request was refused (a registration answers its [`RegisterError`], a
/// workload report its [`ReportError`]).
#[derive(Debug, thiserror::Error)]
enum ControlError {
    #[error("request does not decode: {0}")]
    Malformed(#[from] prost::DecodeError),
    #[error("empty request")]
    Empty,
    #[error("this connection holds no session for that node")]
    NotOwner,
}

impl ServiceError for ControlError {
    fn kind(&self) -> ErrorKind {
        match self {
            ControlError::Malformed(_) | ControlError::Empty => ErrorKind::InvalidInput,
            ControlError::NotOwner => ErrorKind::Unauthenticated,
        }
    }

    fn code(&self) -> &'static str {
        match self {
            ControlError::Malformed(_) | ControlError::Empty => "malformed",
            ControlError::NotOwner => "not_owner",
        }
    }
}

fn answer(response: v1::agent_response::Response) -> v1::AgentResponse {
    v1::AgentResponse { response: Some(response) }
}

/// A refusal's answer: its stable code and its message.
fn error_reply<E: ServiceError>(e: &E) -> v1::AgentResponse {
    answer(v1::agent_response::Response::Error(v1::ErrorReply { code: e.code().into(), message: e.to_string() }))
}

/// Counts a refused request (other than a registration) and answers it.
fn refuse<E: ServiceError>(e: &E) -> v1::AgentResponse {
    metrics::counter!(m::CONTROL_REQUESTS_REJECTED.name, "reason" => e.code()).increment(1);
    error_reply(e)
}

fn owns(ctx: &QuicContext, number: u32, session_id: u64) -> bool {
    ctx.registry.owner(session_id) == Some(number)
}

async fn stream(
    mut send: quinn::SendStream,
    mut recv: quinn::RecvStream,
    conn: &quinn::Connection,
    number: u32,
    ctx: &QuicContext,
) {
    use v1::agent_request::Request;
    use v1::agent_response::Response;
    let bytes = match recv.read_to_end(MAX_CONTROL_MESSAGE).await {
        Ok(b) => b,
        Err(e) => {
            tracing::debug!(error = %e, "control stream read failed");
            metrics::counter!(m::CONTROL_REQUESTS_REJECTED.name, "reason" => "read").increment(1);
            return;
        }
    };
    let now = now_ms();
    let response = match v1::AgentRequest::decode(bytes.as_slice()) {
        Err(e) => refuse(&ControlError::Malformed(e)),
        Ok(v1::AgentRequest { request: None }) => refuse(&ControlError::Empty),
        Ok(v1::AgentRequest { request: Some(Request::Register(req)) }) => {
            let _g = tracing::info_span!("register", node = %req.node_id, incarnation = req.incarnation).entered();
            match register(ctx, number, req, now) {
                Ok(session) => answer(Response::Session(session)),
                Err(e) if e.closes_connection() => {
                    conn.close(VarInt::from_u32(CLOSE_REJECTED), e.to_string().as_bytes());
                    return;
                }
                Err(e) => error_reply(&e),
            }
        }
        Ok(v1::AgentRequest { request: Some(Request::Workloads(req)) }) => match report(ctx, number, req) {
            Ok(()) => answer(Response::Workloads(v1::WorkloadsAck {})),
            Err(e) => refuse(&e),
        },
        Ok(v1::AgentRequest { request: Some(Request::Drain(req)) }) => {
            let _g = tracing::info_span!("drain", node = %req.node_id).entered();
            match drain(ctx, number, req, now) {
                Ok(ack) => answer(Response::Drain(ack)),
                Err(e) => refuse(&e),
            }
        }
    };
    let _ = send.write_all(&response.encode_to_vec()).await;
    let _ = send.finish();
}

/// Opens a session over this connection; a refusal is counted here.
fn register(ctx: &QuicContext, number: u32, req: v1::RegisterRequest, now: u64) -> Result<v1::Session, RegisterError> {
    use std::sync::atomic::Ordering::Relaxed;
    match ctx.registry.register_over(req, now, number) {
        Ok(live) => {
            ctx.stats.registrations.fetch_add(1, Relaxed);
            metrics::counter!(m::REGISTRATIONS.name, "result" => "accepted").increment(1);
            tracing::debug!(session = live.session_id, "registered");
            Ok(v1::Session {
                session_id: live.session_id,
                incarnation: live.incarnation,
                key: live.key.to_vec(),
                heartbeat_port: u32::from(ctx.heartbeat_port),
                heartbeat_interval_ms: crate::liveness::HEARTBEAT_INTERVAL_MS as u32,
                shard: ctx.registry.shard as u32,
                shard_epoch: ctx.epoch,
            })
        }
        Err(e) => {
            ctx.stats.registrations_rejected.fetch_add(1, Relaxed);
            metrics::counter!(m::REGISTRATIONS.name, "result" => e.code()).increment(1);
            metrics::counter!(m::REGISTRATIONS_REJECTED.name, "reason" => e.code()).increment(1);
            tracing::warn!(error = %e, "registration refused");
            Err(e)
        }
    }
}

/// Takes a workload report for a session this connection registered.
fn report(ctx: &QuicContext, number: u32, req: v1::ReportWorkloads) -> Result<(), ReportError> {
    if !owns(ctx, number, req.session_id) {
        return Err(ReportError::NotOwner);
    }
    ctx.registry.report_workloads(req.session_id, &req.node_id, req.workloads)
}

/// Drains the node of a session this connection registered.
fn drain(ctx: &QuicContext, number: u32, req: v1::DrainRequest, now: u64) -> Result<v1::DrainAck, ControlError> {
    let status = owns(ctx, number, req.session_id)
        .then(|| ctx.registry.drain(req.session_id, &req.node_id, now))
        .flatten()
        .ok_or(ControlError::NotOwner)?;
    tracing::info!(status = %status, "node draining");
    metrics::counter!(m::DRAINS.name).increment(1);
    Ok(v1::DrainAck { status: v1::NodeStatus::from(status) as i32 })
}
