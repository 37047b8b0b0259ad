//! The commit path over gRPC: a thin adapter over [`Ledger`]. Requests are validated
//! here (sizes, counts, names); the ledger decides; the applier folds accepted claims
//! into the next view version, which the answer names.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_core::{NodeId, Resources};
use flotilla_proto::v1::{self, ledger_service_server::LedgerService};
use flotilla_view::ViewPublisher;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::ledger::{Claim, ClaimKey, ConfirmStatus, Ledger, NodeFacts, Outcome, Reject};
use crate::registry::{Change, Registry};

/// Most claims in one request.
pub const MAX_CLAIMS: usize = 4096;
/// Longest app, unit, member or transaction name, in bytes.
pub const MAX_NAME: usize = 128;
/// Longest reservation.
pub const MAX_TTL_MS: u32 = 600_000;

pub struct LedgerGrpc {
    pub ledger: Arc<Mutex<Ledger>>,
    pub publisher: Arc<ViewPublisher>,
    pub registry: Arc<Registry>,
    /// Until then every node counts as Unknown for claims (`shard_recovering`).
    pub recovering_until_ms: u64,
}

impl LedgerGrpc {
    pub fn into_server(self) -> v1::ledger_service_server::LedgerServiceServer<Self> {
        v1::ledger_service_server::LedgerServiceServer::new(self)
            .max_decoding_message_size(flotilla_proto::MAX_GRPC_MESSAGE)
    }

    /// Facts about a node from the current view (lock-free).
    fn facts(&self) -> impl Fn(&NodeId) -> Option<NodeFacts> + use<> {
        let view = self.publisher.load();
        let recovering = crate::now_ms() < self.recovering_until_ms;
        move |id: &NodeId| {
            view.get(id).map(|r| NodeFacts {
                status: if recovering { flotilla_core::NodeStatus::Unknown } else { r.status },
                incarnation: r.incarnation.0,
                capacity: r.capacity.clone(),
                low_priority: r.labels.get("priority") == Some("low"),
                cordoned: r.cordoned,
            })
        }
    }

    /// Waits until the applier has published the version showing `changed`.
    async fn fold(&self, changed: Vec<NodeId>) -> Option<v1::ViewVersion> {
        if changed.is_empty() {
            return Some(self.publisher.load().version.into());
        }
        let (tx, rx) = oneshot::channel();
        self.registry.emit(Change::Ledger(changed, Some(tx)));
        tokio::time::timeout(Duration::from_secs(2), rx).await.ok()?.ok().map(Into::into)
    }
}

fn invalid(field: &str, why: impl std::fmt::Display) -> Status {
    metrics::counter!("flotilla_commit_requests_rejected_total", "reason" => "invalid").increment(1);
    Status::invalid_argument(format!("{field}: {why}"))
}

fn name(field: &str, s: &str) -> Result<(), Status> {
    if s.is_empty() || s.len() > MAX_NAME || s.chars().any(char::is_control) {
        return Err(invalid(field, format!("must be 1..={MAX_NAME} bytes without control characters")));
    }
    Ok(())
}

fn key_from_wire(k: Option<v1::ClaimKey>) -> Result<ClaimKey, Status> {
    let k = k.ok_or_else(|| invalid("key", "missing"))?;
    name("key.app", &k.app)?;
    name("key.unit", &k.unit)?;
    name("key.member", &k.member)?;
    Ok(ClaimKey { app: k.app, unit: k.unit, member: k.member, generation: k.generation })
}

fn key_to_wire(k: &ClaimKey) -> v1::ClaimKey {
    v1::ClaimKey { app: k.app.clone(), unit: k.unit.clone(), member: k.member.clone(), generation: k.generation }
}

/// Validates and converts a request's claims; every claim must be sane before any is judged.
pub fn claims_from_wire(txn: &str, claims: Vec<v1::Claim>) -> Result<Vec<Claim>, Status> {
    name("txn_id", txn)?;
    if claims.is_empty() || claims.len() > MAX_CLAIMS {
        return Err(invalid("claims", format!("{} claims (1..={MAX_CLAIMS})", claims.len())));
    }
    let claims: Vec<Claim> = claims
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            let node = NodeId::new(&c.node_id).map_err(|e| invalid(&format!("claims[{i}].node_id"), e))?;
            let resources: Resources = c.resources.unwrap_or_default().into();
            resources.validate_node_capacity().map_err(|e| invalid(&format!("claims[{i}].resources"), e))?;
            if c.group.len() > MAX_NAME {
                return Err(invalid(&format!("claims[{i}].group"), "too long"));
            }
            let workload = c.workload.unwrap_or_default();
            let size = workload.command.len()
                + workload.args.iter().map(String::len).sum::<usize>()
                + workload.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
            if size > 64 * 1024 || workload.args.len() > 256 || workload.env.len() > 256 {
                return Err(invalid(&format!("claims[{i}].workload"), "larger than 64 KiB, 256 args or 256 variables"));
            }
            Ok(Claim {
                key: key_from_wire(c.key).map_err(|e| invalid(&format!("claims[{i}]"), e.message()))?,
                node,
                incarnation: c.incarnation,
                resources,
                allow_low_priority: c.allow_low_priority,
                group: c.group,
                workload,
            })
        })
        .collect::<Result<_, _>>()?;
    // A key twice in one request would be judged as a replay of itself.
    let mut seen = std::collections::HashMap::with_capacity(claims.len());
    for (i, c) in claims.iter().enumerate() {
        if let Some(first) = seen.insert(&c.key, i) {
            return Err(invalid(&format!("claims[{i}].key"), format!("repeats claims[{first}].key")));
        }
    }
    Ok(claims)
}

fn reason_to_wire(r: Reject) -> v1::RejectReason {
    match r {
        Reject::NoFit => v1::RejectReason::NoFit,
        Reject::NodeNotAlive(_) => v1::RejectReason::NodeNotAlive,
        Reject::IncarnationMismatch => v1::RejectReason::IncarnationMismatch,
        Reject::UnknownNode => v1::RejectReason::UnknownNode,
        Reject::Recovering => v1::RejectReason::ShardRecovering,
        Reject::Priority => v1::RejectReason::Priority,
        Reject::Group => v1::RejectReason::Group,
        Reject::AlreadyPlaced => v1::RejectReason::AlreadyPlaced,
        Reject::Cordoned => v1::RejectReason::Cordoned,
    }
}

fn results_to_wire(out: &Outcome) -> Vec<v1::ClaimResult> {
    out.iter()
        .map(|(k, r)| {
            let label = match r {
                Ok(()) => "accepted",
                Err(e) => e.as_str(),
            };
            metrics::counter!("flotilla_claims_total", "result" => label).increment(1);
            v1::ClaimResult {
                key: Some(key_to_wire(k)),
                accepted: r.is_ok(),
                reason: r.err().map(reason_to_wire).unwrap_or(v1::RejectReason::Unspecified) as i32,
                detail: match r {
                    Err(Reject::NodeNotAlive(s)) => format!("node is {s}"),
                    Err(e) => e.as_str().to_string(),
                    Ok(()) => String::new(),
                },
            }
        })
        .collect()
}

/// The assignment an agent receives for one claim.
pub fn assignment(c: &Claim) -> v1::Assignment {
    v1::Assignment {
        app: c.key.app.clone(),
        unit: c.key.unit.clone(),
        member: c.key.member.clone(),
        generation: c.key.generation,
        resources: Some((&c.resources).into()),
        workload: Some(c.workload.clone()),
    }
}

fn lock(l: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    l.lock().unwrap_or_else(|p| p.into_inner())
}

#[tonic::async_trait]
impl LedgerService for LedgerGrpc {
    #[tracing::instrument(skip_all, fields(txn = %request.get_ref().txn_id, claims = request.get_ref().claims.len()))]
    async fn commit(&self, request: Request<v1::CommitRequest>) -> Result<Response<v1::CommitResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let claims = claims_from_wire(&req.txn_id, req.claims)?;
        let facts = self.facts();
        let (out, changed) = lock(&self.ledger).commit(&req.txn_id, &claims, &facts);
        let applied_in = self.fold(changed).await;
        metrics::histogram!("flotilla_commit_seconds").record(started.elapsed().as_secs_f64());
        Ok(Response::new(v1::CommitResponse { results: results_to_wire(&out), applied_in }))
    }

    #[tracing::instrument(skip_all, fields(txn = %request.get_ref().txn_id))]
    async fn reserve(&self, request: Request<v1::ReserveRequest>) -> Result<Response<v1::ReserveResponse>, Status> {
        let req = request.into_inner();
        if req.ttl_ms == 0 || req.ttl_ms > MAX_TTL_MS {
            return Err(invalid("ttl_ms", format!("must be within 1..={MAX_TTL_MS}")));
        }
        let claims = claims_from_wire(&req.txn_id, req.claims)?;
        let facts = self.facts();
        let until = crate::now_ms() + u64::from(req.ttl_ms);
        let (out, changed) = lock(&self.ledger).reserve(&req.txn_id, &claims, until, &facts);
        self.fold(changed).await;
        Ok(Response::new(v1::ReserveResponse { results: results_to_wire(&out), expires_at_unix_ms: until }))
    }

    #[tracing::instrument(skip_all, fields(txn = %request.get_ref().txn_id))]
    async fn confirm(&self, request: Request<v1::ConfirmRequest>) -> Result<Response<v1::ConfirmResponse>, Status> {
        let req = request.into_inner();
        name("txn_id", &req.txn_id)?;
        let (status, changed) = lock(&self.ledger).confirm(&req.txn_id, crate::now_ms());
        self.fold(changed).await;
        let status = match status {
            ConfirmStatus::Confirmed => v1::ConfirmStatus::Confirmed,
            ConfirmStatus::Expired => v1::ConfirmStatus::Expired,
            ConfirmStatus::UnknownReservation => v1::ConfirmStatus::UnknownReservation,
        };
        Ok(Response::new(v1::ConfirmResponse { status: status as i32 }))
    }

    #[tracing::instrument(skip_all, fields(txn = %request.get_ref().txn_id, keys = request.get_ref().keys.len()))]
    async fn release(&self, request: Request<v1::ReleaseRequest>) -> Result<Response<v1::ReleaseResponse>, Status> {
        let req = request.into_inner();
        name("txn_id", &req.txn_id)?;
        if req.keys.len() > MAX_CLAIMS {
            return Err(invalid("keys", format!("at most {MAX_CLAIMS}")));
        }
        let keys = req.keys.into_iter().map(|k| key_from_wire(Some(k))).collect::<Result<Vec<_>, _>>()?;
        let (released, changed) = {
            let mut ledger = lock(&self.ledger);
            let released = keys.iter().filter(|k| ledger.placement(k).is_some()).count() as u32;
            (released, ledger.release(&keys))
        };
        self.fold(changed).await;
        Ok(Response::new(v1::ReleaseResponse { released }))
    }
}

/// Operator actions on this shard's nodes.
pub struct AdminGrpc {
    pub registry: Arc<Registry>,
}

#[tonic::async_trait]
impl v1::node_admin_service_server::NodeAdminService for AdminGrpc {
    #[tracing::instrument(skip_all, fields(node = %request.get_ref().node_id, cordoned = request.get_ref().cordoned, drain = request.get_ref().drain))]
    async fn set_cordon(&self, request: Request<v1::CordonRequest>) -> Result<Response<v1::CordonResponse>, Status> {
        let req = request.into_inner();
        let node = NodeId::new(&req.node_id).map_err(|e| invalid("node_id", e))?;
        let found = self.registry.set_cordon(&node, req.cordoned || req.drain, req.drain);
        if found {
            tracing::info!("node cordon changed");
            metrics::counter!("flotilla_cordon_changes_total").increment(1);
        }
        Ok(Response::new(v1::CordonResponse { found }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(unit: &str, node: &str) -> v1::Claim {
        v1::Claim {
            key: Some(v1::ClaimKey { app: "a".into(), unit: unit.into(), member: "head".into(), generation: 1 }),
            node_id: node.into(),
            incarnation: 1,
            resources: Some(v1::Resources { cpu_millis: 100, ..Default::default() }),
            ..Default::default()
        }
    }

    #[test]
    fn a_request_naming_a_key_twice_is_refused_whole() {
        assert_eq!(claims_from_wire("t", vec![claim("u1", "n1"), claim("u2", "n1")]).map(|c| c.len()).ok(), Some(2));
        let e = claims_from_wire("t", vec![claim("u1", "n1"), claim("u2", "n1"), claim("u1", "n2")]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert_eq!(e.message(), "claims[2].key: repeats claims[0].key");
        assert!(claims_from_wire("t", vec![]).is_err(), "no claims");
    }
}
