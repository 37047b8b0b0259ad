//! Operator actions on this shard's nodes over gRPC (`NodeAdminService`): cordon and
//! drain, warming artifacts, and a member's logs, relayed from its agent over the agent's own QUIC
//! connection (agents open no port: the shard opens a stream on the connection the
//! node registered over).

use crate::catalogue as m;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use flotilla_proto::status::status;
use flotilla_proto::{MAX_CONTROL_MESSAGE, frame, v1};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::Stream;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

use crate::persist::Persister;
use crate::registry::Registry;
use crate::wire;

/// Open agent connections by their number (see `quic::connection_number`); a node's
/// session names the one it registered over.
pub type AgentLinks = dashmap::DashMap<u32, quinn::Connection>;

/// How long an agent may take to accept a request and answer its first frame.
const AGENT_ANSWER: Duration = Duration::from_secs(10);

pub struct AdminGrpc {
    pub registry: Arc<Registry>,
    /// Keeps cordons and drains across restarts.
    pub persister: Arc<Persister>,
    pub agents: Arc<AgentLinks>,
}

fn counted(result: &'static str, s: Status) -> Status {
    metrics::counter!(m::LOG_RELAYS.name, "result" => result).increment(1);
    s
}

/// The status for an agent's refusal, by its stable code.
fn refused(e: v1::ErrorReply) -> Status {
    let s = match e.code.as_str() {
        "no_member" => Status::not_found(e.message),
        "busy" => Status::resource_exhausted(e.message),
        _ => Status::invalid_argument(e.message),
    };
    // Known codes only, so the label stays bounded.
    let code = ["no_member", "busy"].into_iter().find(|c| *c == e.code).unwrap_or("invalid");
    counted(code, s)
}

impl AdminGrpc {
    /// The connection `node`'s agent registered over, while it is open.
    fn agent_of(&self, node: &flotilla_core::NodeId) -> Option<quinn::Connection> {
        self.registry.with_node(node, |l| l.owner).and_then(|o| self.agents.get(&o).map(|c| c.value().clone()))
    }
}

/// Opens a stream to an agent, sends `req` (a `LogRequest` or a `ShardRequest`, see
/// agent.proto) and reads its first answer frame (within [`AGENT_ANSWER`]); the stream
/// stays open for more. An error says what went wrong.
async fn ask<T: Message + Default>(
    conn: &quinn::Connection,
    req: impl Message,
) -> Result<(quinn::RecvStream, T), (&'static str, String)> {
    let opened = tokio::time::timeout(AGENT_ANSWER, async {
        let (mut send, mut recv) = conn.open_bi().await.map_err(|e| e.to_string())?;
        send.write_all(&req.encode_to_vec()).await.map_err(|e| e.to_string())?;
        send.finish().map_err(|e| e.to_string())?;
        let first = frame::read::<T, _>(&mut recv, MAX_CONTROL_MESSAGE).await.map_err(|e| e.to_string())?;
        Ok::<_, String>((recv, first))
    })
    .await;
    match opened {
        Err(_) => Err(("did not answer", format!("nothing in {AGENT_ANSWER:?}"))),
        Ok(Err(e)) => Err(("failed", e)),
        Ok(Ok((_, None))) => Err(("failed", "it ended the stream without an answer".into())),
        Ok(Ok((recv, Some(first)))) => Ok((recv, first)),
    }
}

#[tonic::async_trait]
impl v1::node_admin_service_server::NodeAdminService for AdminGrpc {
    #[tracing::instrument(skip_all, fields(node = %request.get_ref().node_id, cordoned = request.get_ref().cordoned, drain = request.get_ref().drain))]
    async fn set_cordon(&self, request: Request<v1::CordonRequest>) -> Result<Response<v1::CordonResponse>, Status> {
        let req = request.into_inner();
        let node = wire::node_id_from_wire("node_id", &req.node_id).map_err(|e| status(&e))?;
        let found = self.registry.set_cordon(&node, req.cordoned || req.drain, req.drain);
        if found {
            tracing::info!("node cordon changed");
            metrics::counter!(m::CORDON_CHANGES.name).increment(1);
            // Answered once it is kept: a cordon the operator saw succeed survives a restart.
            self.persister.save().await.map_err(|e| {
                Status::unavailable(format!("the cordon is set but could not be persisted ({e:#}); retry"))
            })?;
        }
        Ok(Response::new(v1::CordonResponse { found }))
    }

    #[tracing::instrument(skip_all, fields(node = %request.get_ref().node_id, artifacts = request.get_ref().artifacts.len()))]
    async fn warm(&self, request: Request<v1::WarmRequest>) -> Result<Response<v1::WarmReply>, Status> {
        let req = request.into_inner();
        let warmed = |result: &'static str, s: Status| {
            metrics::counter!(m::WARM_RELAYS.name, "result" => result).increment(1);
            s
        };
        let node = wire::node_id_from_wire("node_id", &req.node_id).map_err(|e| warmed("invalid", status(&e)))?;
        let max = flotilla_proto::MAX_WARM_ARTIFACTS;
        if req.artifacts.is_empty()
            || req.artifacts.len() > max
            || !req.artifacts.iter().all(flotilla_proto::artifact_fits)
        {
            return Err(warmed(
                "invalid",
                Status::invalid_argument(format!("artifacts: 1 to {max}, each under 4 KiB")),
            ));
        }
        let conn = self.agent_of(&node).ok_or_else(|| {
            warmed("no_node", Status::unavailable(format!("node {node}'s agent is not connected to this shard")))
        })?;
        match ask::<v1::WarmReply>(&conn, v1::ShardRequest { warm: Some(req) }).await {
            Err((what, e)) => {
                Err(warmed("unavailable", Status::unavailable(format!("node {node}'s agent {what}: {e}"))))
            }
            Ok((_, v1::WarmReply { error: Some(e), .. })) => {
                // A node without a cache cannot warm whatever is asked; anything else the
                // agent refuses is the request's fault.
                let message = format!("node {node}: {}", e.message);
                let s = match e.code.as_str() {
                    "no_cache" => Status::failed_precondition(message),
                    _ => Status::invalid_argument(message),
                };
                Err(warmed("refused", s))
            }
            Ok((_, reply)) => {
                metrics::counter!(m::WARM_RELAYS.name, "result" => "ok").increment(1);
                Ok(Response::new(reply))
            }
        }
    }

    type ReadLogsStream = Pin<Box<dyn Stream<Item = Result<v1::LogChunk, Status>> + Send + 'static>>;

    #[tracing::instrument(skip_all, fields(node = %request.get_ref().node_id, unit = %request.get_ref().unit, member = %request.get_ref().member, follow = request.get_ref().follow))]
    async fn read_logs(&self, request: Request<v1::LogRequest>) -> Result<Response<Self::ReadLogsStream>, Status> {
        let req = request.into_inner();
        let node = wire::node_id_from_wire("node_id", &req.node_id).map_err(|e| counted("invalid", status(&e)))?;
        let conn = self.agent_of(&node).ok_or_else(|| {
            counted("no_node", Status::unavailable(format!("node {node}'s agent is not connected to this shard")))
        })?;
        let unavailable = |what: &str, e: String| {
            counted("unavailable", Status::unavailable(format!("node {node}'s agent {what}: {e}")))
        };
        // The agent answers a refusal, or an empty chunk once it takes the request.
        let opened = ask::<v1::LogChunk>(&conn, req).await;
        let mut recv = match opened {
            Err(e) => return Err(unavailable(e.0, e.1)),
            Ok((_, v1::LogChunk { error: Some(e), .. })) => return Err(refused(e)),
            Ok((recv, _)) => recv,
        };
        metrics::counter!(m::LOG_RELAYS.name, "result" => "ok").increment(1);
        // Bounded: a slow reader holds the agent's stream back (QUIC flow control),
        // never the shard's memory.
        let (tx, rx) = mpsc::channel(8);
        tokio::spawn(async move {
            loop {
                let next = tokio::select! {
                    r = frame::read::<v1::LogChunk, _>(&mut recv, MAX_CONTROL_MESSAGE) => r,
                    _ = tx.closed() => break,
                };
                let item = match next {
                    Ok(Some(c)) => Ok(c),
                    Ok(None) => break,
                    Err(e) => Err(Status::unavailable(format!("the agent's log stream broke: {e}"))),
                };
                let failed = item.is_err();
                if tx.send(item).await.is_err() || failed {
                    break;
                }
            }
            // The reader went away (or the agent finished): the agent stops at once.
            let _ = recv.stop(quinn::VarInt::from_u32(0));
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }
}
