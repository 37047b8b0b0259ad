//! A deposed scheduler: the case fencing exists for. The scheduler is paused (crashed,
//! its node lost so the next one must commit and release), a new one starts with a
//! higher fencing token, and once the new one has spoken to a shard (its release or
//! commit raised the app's mark there), the old one wakes up and sends, on a new
//! connection, what it still believes: commits of every member it knew (some since
//! released by the new one) plus a unit of its own, and a release of everything the
//! shard holds for the app. Every one of those must come back `fenced` and change
//! nothing; anything else is a violation.

use std::sync::Arc;
use std::time::Duration;

use flotilla_core::LockExt;
use flotilla_proto::dial::{BoxIo, Dialer};
use flotilla_proto::status::RemoteError;
use flotilla_proto::v1::{self, ledger_service_client::LedgerServiceClient};
use flotilla_scheduler::{Store, UnitRecord};

use crate::{GRPC_PORT, SHARDS, Shared, World};

pub const HOST: &str = "deposed";
/// Tries per shard before the deposed scheduler gives up (the shard stayed down).
const ATTEMPTS: u32 = 40;

/// The old scheduler, paused: what it knew and its token.
pub struct Pending {
    pub token: u64,
    pub units: Vec<UnitRecord>,
    fired: [bool; SHARDS],
    until: Duration,
}

/// One shard's worth of stale requests.
pub struct Job {
    shard: usize,
    token: u64,
    claims: Vec<v1::Claim>,
    keys: Vec<v1::ClaimKey>,
    attempts: u32,
}

/// What the deposed scheduler's requests got.
#[derive(Default, Debug)]
pub struct Report {
    /// Shards that refused a deposed scheduler's commit and release.
    pub fenced: u32,
    pub violations: Vec<String>,
}

/// Pauses the scheduler now (the caller crashes it): remembers what it knew.
pub fn depose(w: &mut World, until: Duration) {
    let units = w.store.load("sim").map(|s| s.units.values().cloned().collect()).unwrap_or_default();
    w.deposed = Some(Pending { token: u64::from(w.scheduler_starts), units, fired: [false; SHARDS], until });
}

/// Called every step: once a newer scheduler raised a shard's mark for the app, the
/// deposed one's requests for that shard are sent.
pub fn arm(w: &mut World, now: Duration) {
    let Some(p) = &mut w.deposed else { return };
    let mut jobs = Vec::new();
    for shard in 0..SHARDS {
        let Some(ledger) = &w.ledgers[shard] else { continue };
        if p.fired[shard] {
            continue;
        }
        let ledger = ledger.lock_or_recover();
        if ledger.mark("sim") <= p.token {
            continue;
        }
        p.fired[shard] = true;
        let agents: Vec<_> = w.agents.iter().filter(|a| a.shard == shard).collect();
        let incarnation = |node: &str| agents.iter().find(|a| a.node.as_str() == node).map(|a| a.incarnation);
        let mut claims = Vec::new();
        let mut keys = Vec::new();
        for u in &p.units {
            for m in u.members.iter().chain(&u.surge) {
                let (Some(node), Some(s)) = (&m.node_id, m.shard) else { continue };
                if s as usize != shard {
                    continue;
                }
                let key = key(&u.app, &u.unit_id, &m.member, m.key_generation(u.generation));
                if keys.contains(&key) {
                    continue;
                }
                keys.push(key.clone());
                claims.push(claim(key, node, incarnation(node).unwrap_or(m.incarnation)));
            }
        }
        // A unit of its own, on a node with room, as it would place one.
        if let Some(a) = agents.iter().find(|a| a.up) {
            let key = key("sim", &format!("sim-deposed-{}", p.token), "head", 1);
            claims.push(claim(key, a.node.as_str(), a.incarnation));
        }
        // And a release of everything the shard holds for the app, the new scheduler's too.
        for a in &agents {
            if let Some(book) = ledger.book(&a.node) {
                for k in book.entries.keys().filter(|k| k.app == "sim") {
                    let k = key(&k.app, &k.unit, &k.member, k.generation);
                    if !keys.contains(&k) {
                        keys.push(k);
                    }
                }
            }
        }
        jobs.push(Job { shard, token: p.token, claims, keys, attempts: 0 });
    }
    if p.fired.iter().all(|f| *f) || now >= p.until {
        w.deposed = None;
    }
    w.deposed_jobs.extend(jobs);
}

fn key(app: &str, unit: &str, member: &str, generation: u64) -> v1::ClaimKey {
    v1::ClaimKey { app: app.into(), unit: unit.into(), member: member.into(), generation }
}

fn claim(key: v1::ClaimKey, node: &str, incarnation: u64) -> v1::Claim {
    v1::Claim {
        key: Some(key),
        node_id: node.into(),
        incarnation,
        resources: Some(v1::Resources { cpu_millis: 1000, memory_bytes: 256 << 20, ..Default::default() }),
        ..Default::default()
    }
}

/// The deposed scheduler's host: sends each job over a fresh connection.
pub async fn host(world: Shared) -> turmoil::Result {
    let dialer = Dialer::with_transport(Arc::new(|authority: String| {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(authority).await?;
            Ok(Box::new(stream) as BoxIo)
        })
    }));
    let mut sent = 0u64;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let job = world.borrow_mut().deposed_jobs.pop();
        let Some(mut job) = job else { continue };
        sent += 1;
        match send(&dialer, &job, sent).await {
            Ok(findings) => {
                let mut w = world.borrow_mut();
                if findings.is_empty() {
                    w.deposed_report.fenced += 1;
                }
                w.deposed_report.violations.extend(findings);
            }
            Err(e) => {
                tracing::debug!(shard = job.shard, error = %e, "deposed scheduler: no answer, trying again");
                job.attempts += 1;
                if job.attempts < ATTEMPTS {
                    world.borrow_mut().deposed_jobs.insert(0, job);
                }
            }
        }
    }
}

/// Sends one job's commit and release; `Err` when the shard could not be asked (it is
/// down), else what went wrong (nothing, when both were fenced).
async fn send(dialer: &Dialer, job: &Job, n: u64) -> Result<Vec<String>, String> {
    let addr = format!("{}:{GRPC_PORT}", crate::hosts::shard_host(job.shard));
    let channel = dialer.connect(&addr, Some(Duration::from_secs(2))).await.map_err(|e| e.to_string())?;
    let mut client = LedgerServiceClient::new(channel);
    let mut findings = Vec::new();
    let who = format!("the deposed scheduler (token {}) on shard {}", job.token, job.shard);
    let commit =
        v1::CommitRequest { txn_id: format!("deposed-{n}"), fencing_token: job.token, claims: job.claims.clone() };
    let answer = client.commit(commit).await.map_err(|s| s.message().to_string())?.into_inner();
    for r in &answer.results {
        if r.accepted || r.reason != v1::RejectReason::Fenced as i32 {
            findings.push(format!("{who}: its claim on {:?} was answered {} ({})", r.key, r.accepted, r.detail));
        }
    }
    if job.keys.is_empty() {
        return Ok(findings);
    }
    let release =
        v1::ReleaseRequest { txn_id: format!("deposed-release-{n}"), fencing_token: job.token, keys: job.keys.clone() };
    match client.release(release).await {
        Ok(r) => findings.push(format!("{who}: its release was accepted ({} released)", r.into_inner().released)),
        Err(s) if s.code() == tonic::Code::FailedPrecondition && RemoteError::from(s.clone()).code == "fenced" => {}
        Err(s) if matches!(s.code(), tonic::Code::Unavailable | tonic::Code::Unknown | tonic::Code::Cancelled) => {
            // The answer was lost: only the commit's verdicts count; the release is retried.
            if findings.is_empty() {
                return Err(s.message().to_string());
            }
        }
        Err(s) => findings.push(format!("{who}: its release failed otherwise: {s:?}")),
    }
    Ok(findings)
}
