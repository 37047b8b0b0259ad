//! The commit path over gRPC: thin adapters. Requests decode
//! through [`crate::wire`] (sizes, counts, names); the ledger decides; the applier folds
//! accepted claims into the next view version, which the answer names. A commit is
//! answered at the decision, naming the version that will show it (see
//! [`LedgerGrpc::announce`]); the rarer calls wait for the fold. A request that does not
//! decode is answered through `flotilla_proto::status`, the one error mapping.
//!
//! Fencing: every request's token is checked against the app's mark under the ledger's
//! lock, together with the change it guards. A stale Commit or Reserve gets every claim
//! back as `REJECT_REASON_FENCED`, a stale Confirm `CONFIRM_STATUS_FENCED`, a stale
//! Release the status FAILED_PRECONDITION with code `fenced`; none changes anything.
//! A request that raised a mark is answered only once the marks are persisted.

use crate::catalogue as m;
use flotilla_core::LockExt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_core::{NodeId, ServiceError, now_ms};
use flotilla_proto::status::status;
use flotilla_proto::v1::{self, ledger_service_server::LedgerService};
use flotilla_view::ViewPublisher;
use tokio::sync::oneshot;
use tonic::{Request, Response, Status};

use crate::ledger::{ClaimReject, ConfirmStatus, Fenced, Ledger, NodeFacts, Outcome};
use crate::persist::Persister;
use crate::registry::{Change, Registry};
use crate::wire::{self, InvalidRequest};

pub struct LedgerGrpc {
    pub ledger: Arc<Mutex<Ledger>>,
    pub publisher: Arc<ViewPublisher>,
    pub registry: Arc<Registry>,
    /// Until then every node counts as Unknown for claims (`shard_recovering`).
    pub recovering_until_ms: u64,
    /// Keeps the fencing marks across restarts.
    pub persister: Arc<Persister>,
}

impl LedgerGrpc {
    pub fn into_server(self) -> v1::ledger_service_server::LedgerServiceServer<Self> {
        v1::ledger_service_server::LedgerServiceServer::new(self)
            .max_decoding_message_size(flotilla_proto::MAX_GRPC_MESSAGE)
    }

    /// Facts about a node from the current view (lock-free).
    fn facts(&self) -> impl Fn(&NodeId) -> Option<NodeFacts> + use<> {
        let view = self.publisher.load();
        let recovering = now_ms() < self.recovering_until_ms;
        move |id: &NodeId| {
            view.get(id).map(|r| NodeFacts {
                status: if recovering { flotilla_core::NodeStatus::Unknown } else { r.status },
                incarnation: r.incarnation.0,
                capacity: (*r.capacity).clone(),
                low_priority: r.labels.get("priority") == Some("low"),
                cordoned: r.cordoned,
            })
        }
    }

    /// Hands `changed` to the applier and names the version that will show it. Called
    /// under the ledger's lock, which the applier's flush takes before it absorbs the
    /// changes sent to it and holds until it has published: a change sent here is in the
    /// flush after the version published now, so that version's successor shows it (a
    /// later one, only if that flush found nothing to change, when the claims were
    /// released again within it). The scheduler keeps the resources pending until its
    /// view reaches the version, so a commit need not wait for the fold (a batch window
    /// and more, which was most of a commit's latency).
    fn announce(&self, changed: Vec<NodeId>) -> v1::ViewVersion {
        let now = self.publisher.load().version;
        if changed.is_empty() {
            return now.into();
        }
        self.registry.emit(Change::Ledger(changed, None));
        flotilla_view::Version { seq: now.seq + 1, ..now }.into()
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

    /// After a request raised a fencing mark: the marks are saved before the answer, or
    /// a restarted shard would take the deposed scheduler's claims again.
    async fn persist_marks(&self, raised: bool) -> Result<(), Status> {
        if !raised {
            return Ok(());
        }
        self.persister
            .save()
            .await
            .map_err(|e| Status::unavailable(format!("the shard could not persist its fencing marks ({e:#}); retry")))
    }
}

/// A refusal for a stale fencing token: counted and logged.
fn fenced(op: &'static str, txn: &str, f: &Fenced) {
    metrics::counter!(m::LEDGER_FENCED.name, "op" => op).increment(1);
    tracing::warn!(op, txn, error = %f, "fenced: a deposed scheduler's request was refused");
}

/// Every claim refused as fenced.
fn all_fenced(claims: &[crate::ledger::Claim]) -> Outcome {
    claims.iter().map(|c| (c.key.clone(), Err(ClaimReject::Fenced))).collect()
}

/// A request that does not decode: counted, and answered through the one mapping.
fn refuse(e: InvalidRequest) -> Status {
    metrics::counter!(m::COMMIT_REQUESTS_REJECTED.name, "reason" => e.code()).increment(1);
    status(&e)
}

/// Counts the claims' verdicts: one registry lookup per verdict, not per claim.
fn count(out: &Outcome) {
    let mut by_label: Vec<(&'static str, u64)> = Vec::new();
    for (_, r) in out {
        let label = match r {
            Ok(()) => "accepted",
            Err(e) => e.as_str(),
        };
        match by_label.iter_mut().find(|(l, _)| *l == label) {
            Some((_, n)) => *n += 1,
            None => by_label.push((label, 1)),
        }
    }
    for (label, n) in by_label {
        metrics::counter!(m::CLAIMS.name, "result" => label).increment(n);
    }
}

/// The ledger, once its lock is free: how long that took is the part of a request's time
/// that other requests and the applier's flush cost it.
fn lock(l: &Mutex<Ledger>) -> std::sync::MutexGuard<'_, Ledger> {
    let started = Instant::now();
    let guard = l.lock_or_recover();
    metrics::histogram!(m::LEDGER_LOCK_WAIT_SECONDS.name).record(started.elapsed().as_secs_f64());
    guard
}

#[tonic::async_trait]
impl LedgerService for LedgerGrpc {
    #[tracing::instrument(skip_all, fields(txn = %request.get_ref().txn_id, claims = request.get_ref().claims.len()))]
    async fn commit(&self, request: Request<v1::CommitRequest>) -> Result<Response<v1::CommitResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let claims = wire::claims_from_wire(&req.txn_id, req.claims).map_err(refuse)?;
        let facts = self.facts();
        let (out, applied_in, raised) = {
            let mut ledger = lock(&self.ledger);
            match ledger.fence(req.fencing_token, claims.iter().map(|c| c.key.app.as_str())) {
                Ok(raised) => {
                    let (out, changed) = ledger.commit(&req.txn_id, &claims, &facts);
                    (out, self.announce(changed), raised)
                }
                Err(f) => {
                    fenced("commit", &req.txn_id, &f);
                    (all_fenced(&claims), self.announce(Vec::new()), false)
                }
            }
        };
        self.persist_marks(raised).await?;
        count(&out);
        metrics::histogram!(m::SHARD_COMMIT_SECONDS.name).record(started.elapsed().as_secs_f64());
        Ok(Response::new(v1::CommitResponse { results: wire::results_to_wire(&out), applied_in: Some(applied_in) }))
    }

    #[tracing::instrument(skip_all, fields(txn = %request.get_ref().txn_id))]
    async fn reserve(&self, request: Request<v1::ReserveRequest>) -> Result<Response<v1::ReserveResponse>, Status> {
        let req = request.into_inner();
        let ttl_ms = wire::ttl_from_wire(req.ttl_ms).map_err(refuse)?;
        let claims = wire::claims_from_wire(&req.txn_id, req.claims).map_err(refuse)?;
        let facts = self.facts();
        let until = now_ms() + ttl_ms;
        let (out, changed, raised) = {
            let mut ledger = lock(&self.ledger);
            match ledger.fence(req.fencing_token, claims.iter().map(|c| c.key.app.as_str())) {
                Ok(raised) => {
                    let (out, changed) = ledger.reserve(&req.txn_id, &claims, until, &facts);
                    (out, changed, raised)
                }
                Err(f) => {
                    fenced("reserve", &req.txn_id, &f);
                    (all_fenced(&claims), Vec::new(), false)
                }
            }
        };
        self.persist_marks(raised).await?;
        self.fold(changed).await;
        count(&out);
        Ok(Response::new(v1::ReserveResponse { results: wire::results_to_wire(&out), expires_at_unix_ms: until }))
    }

    #[tracing::instrument(skip_all, fields(txn = %request.get_ref().txn_id))]
    async fn confirm(&self, request: Request<v1::ConfirmRequest>) -> Result<Response<v1::ConfirmResponse>, Status> {
        let req = request.into_inner();
        wire::txn_from_wire(&req.txn_id).map_err(refuse)?;
        let (confirmed, changed, raised) = {
            let mut ledger = lock(&self.ledger);
            let apps = ledger.reservation_apps(&req.txn_id);
            match ledger.fence(req.fencing_token, apps.iter().map(String::as_str)) {
                Ok(raised) => {
                    let (confirmed, changed) = ledger.confirm(&req.txn_id, now_ms());
                    (confirmed, changed, raised)
                }
                Err(f) => {
                    fenced("confirm", &req.txn_id, &f);
                    (ConfirmStatus::Fenced, Vec::new(), false)
                }
            }
        };
        self.persist_marks(raised).await?;
        self.fold(changed).await;
        Ok(Response::new(v1::ConfirmResponse { status: wire::confirm_status_to_wire(confirmed) as i32 }))
    }

    #[tracing::instrument(skip_all, fields(txn = %request.get_ref().txn_id, keys = request.get_ref().keys.len()))]
    async fn release(&self, request: Request<v1::ReleaseRequest>) -> Result<Response<v1::ReleaseResponse>, Status> {
        let req = request.into_inner();
        wire::txn_from_wire(&req.txn_id).map_err(refuse)?;
        let keys = wire::keys_from_wire(req.keys).map_err(refuse)?;
        let (released, changed, raised) = {
            let mut ledger = lock(&self.ledger);
            let raised = ledger.fence(req.fencing_token, keys.iter().map(|k| k.app.as_str())).map_err(|f| {
                fenced("release", &req.txn_id, &f);
                status(&f)
            })?;
            let released = keys.iter().filter(|k| ledger.placement(k).is_some()).count() as u32;
            (released, ledger.release(&keys), raised)
        };
        self.persist_marks(raised).await?;
        self.fold(changed).await;
        Ok(Response::new(v1::ReleaseResponse { released }))
    }
}
