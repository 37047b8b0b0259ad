//! Simulated nodes that run what they are assigned: each assignment push a shard sends
//! is answered with a workload report that shows every member running, as a real agent's
//! would once its members passed their readiness checks. Units then settle into Running,
//! the state most of a real cluster's units are in, and a run can idle for as long as it
//! likes (members that are never reported count as missing once the shards' rejoin grace
//! is over, and are replaced).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_agent::client::ShardConnection;
use flotilla_proto::v1;
use prost::Message;

use crate::common::{Link, SimNode};

/// What the runners did, for the run's report.
#[derive(Default)]
pub struct Counts {
    pub pushes: AtomicU64,
    pub reports: AtomicU64,
    pub failed_reports: AtomicU64,
}

/// Starts one runner per shard connection; they stop when the connections close (the
/// returned handles abort them).
pub fn spawn(nodes: &[SimNode], links: &[Link], counts: Arc<Counts>) -> Vec<tokio::task::JoinHandle<()>> {
    let sessions: Arc<HashMap<String, u64>> = Arc::new(nodes.iter().map(|n| (n.id.clone(), n.session_id)).collect());
    links.iter().map(|(_, link)| tokio::spawn(run(link.clone(), sessions.clone(), counts.clone()))).collect()
}

/// What a runner knows of one node: the newest assignment set pushed to it, and a lock
/// held while it reports, so a node's reports leave one at a time, each with the newest
/// set (a real agent's reporter does the same).
#[derive(Default)]
struct Node {
    newest: std::sync::Mutex<(u64, Vec<v1::Assignment>)>,
    reporting: tokio::sync::Mutex<()>,
}

async fn run(link: ShardConnection, sessions: Arc<HashMap<String, u64>>, counts: Arc<Counts>) {
    let nodes: Arc<std::sync::Mutex<HashMap<String, Arc<Node>>>> = Arc::default();
    while let Ok(mut stream) = link.conn.accept_uni().await {
        let (link, sessions, counts, nodes) = (link.clone(), sessions.clone(), counts.clone(), nodes.clone());
        tokio::spawn(async move {
            let Ok(bytes) = stream.read_to_end(flotilla_proto::MAX_CONTROL_MESSAGE).await else { return };
            let Ok(push) = v1::AssignmentPush::decode(bytes.as_slice()) else { return };
            let Some(&session_id) = sessions.get(&push.node_id) else { return };
            counts.pushes.fetch_add(1, Ordering::Relaxed);
            let node = lock(&nodes).entry(push.node_id.clone()).or_default().clone();
            {
                // Pushes travel on streams of their own and may arrive out of order.
                let mut newest = lock(&node.newest);
                if newest.0 > push.assignment_version {
                    return;
                }
                *newest = (push.assignment_version, push.assignments);
            }
            let _one_at_a_time = node.reporting.lock().await;
            let workloads = lock(&node.newest).1.iter().map(|a| running(&push.node_id, a)).collect();
            let report = v1::ReportWorkloads { node_id: push.node_id, session_id, workloads };
            let req = v1::AgentRequest { request: Some(v1::agent_request::Request::Workloads(report)) };
            match link.request(req).await {
                Ok(_) => counts.reports.fetch_add(1, Ordering::Relaxed),
                Err(_) => counts.failed_reports.fetch_add(1, Ordering::Relaxed),
            };
        });
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    flotilla_core::LockExt::lock_or_recover(m)
}

/// Member `a` running on `node`, at an address of its own.
fn running(node: &str, a: &v1::Assignment) -> v1::WorkloadStatus {
    v1::WorkloadStatus {
        app: a.app.clone(),
        unit: a.unit.clone(),
        member: a.member.clone(),
        generation: a.generation,
        state: v1::WorkloadState::Running as i32,
        address: format!("{}.{node}.sim:{}", a.member, 10_000 + a.generation % 50_000),
        ..Default::default()
    }
}
