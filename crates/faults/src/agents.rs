//! Simulated node agents. They speak to their shard's real registry and ingest in
//! process (turmoil has no QUIC): register with what they run, send sealed heartbeats
//! once a second, report their workloads, and run whatever the ledger pushes them.

use flotilla_aggregator::Ingest;
use flotilla_aggregator::Ledger;
use flotilla_aggregator::Registry;
use flotilla_core::{NodeId, PROTOCOL_VERSION, Resources, shard_for_domain};
use flotilla_proto::seal::{self, Direction, Format, Header, MAGIC_HEARTBEAT, MAGIC_REPLY, SessionKey};
use flotilla_proto::v1;
use prost::Message;

use crate::{NODES_PER_DOMAIN, SHARDS};

pub const JOIN_TOKEN: &str = "sim-join-token";
const HEARTBEAT_MS: u64 = 1000;

pub struct Agent {
    pub node: NodeId,
    pub domain: String,
    pub shard: usize,
    pub incarnation: u64,
    pub capacity: Resources,
    /// False while the node is lost (its processes are gone with it).
    pub up: bool,
    session: Option<(u64, SessionKey)>,
    seq: u64,
    next_beat_ms: u64,
    /// The assignment set it runs and the version of the push that set it.
    pub running: Vec<v1::Assignment>,
    version: u64,
    report: bool,
}

/// One domain per shard (domains are picked so that each shard owns one), each of
/// `NODES_PER_DOMAIN` nodes with 2 CPUs and 2 GiB.
pub fn nodes() -> Vec<Agent> {
    let mut domains = vec![None; SHARDS];
    for d in (0..).map(|i| format!("zone-{i}")) {
        let s = shard_for_domain(&d, SHARDS);
        if domains[s].is_none() {
            domains[s] = Some(d);
        }
        if domains.iter().all(Option::is_some) {
            break;
        }
    }
    let mut agents = Vec::new();
    for (shard, domain) in domains.into_iter().enumerate() {
        let domain = domain.unwrap_or_default();
        for n in 0..NODES_PER_DOMAIN {
            let id = format!("{domain}-node-{n}");
            agents.push(Agent {
                node: NodeId::new(&id).unwrap_or_else(|e| unreachable!("{id}: {e}")),
                domain: domain.clone(),
                shard,
                incarnation: 1,
                capacity: Resources::new(2000, 2 << 30, 0),
                up: true,
                session: None,
                seq: 0,
                next_beat_ms: 0,
                running: Vec::new(),
                version: 0,
                report: false,
            });
        }
    }
    agents
}

/// What one shard's side of the control path holds.
pub struct ShardSide<'a> {
    pub registry: &'a Registry,
    pub ingest: &'a mut Ingest,
}

impl Agent {
    /// The node is lost: its workloads die with it.
    pub fn lose(&mut self) {
        self.up = false;
        self.session = None;
        self.running.clear();
        self.version = 0;
    }

    /// The node comes back as a new incarnation, running nothing.
    pub fn restart(&mut self) {
        self.lose();
        self.incarnation += 1;
        self.up = true;
    }

    /// One step of the agent's loop against its shard.
    pub fn step(&mut self, side: &mut ShardSide<'_>, now_ms: u64) {
        if !self.up {
            return;
        }
        let Some((session_id, key)) = self.session else {
            self.register(side.registry, now_ms);
            return;
        };
        if now_ms >= self.next_beat_ms {
            self.next_beat_ms = now_ms + HEARTBEAT_MS;
            if self.heartbeat(side.ingest, session_id, &key, now_ms) {
                self.session = None;
                return;
            }
        }
        if self.report {
            let list = self.workloads();
            match side.registry.report_workloads(session_id, self.node.as_str(), list) {
                Ok(()) => self.report = false,
                Err(_) => self.session = None,
            }
        }
    }

    fn register(&mut self, registry: &Registry, now_ms: u64) {
        let mut labels = std::collections::HashMap::new();
        labels.insert("domain".to_string(), self.domain.clone());
        let req = v1::RegisterRequest {
            protocol_version: PROTOCOL_VERSION,
            join_token: JOIN_TOKEN.into(),
            node_id: self.node.to_string(),
            incarnation: self.incarnation,
            labels,
            capacity: Some((&self.capacity).into()),
            assignments: self.running.clone(),
            health: Some(v1::HealthSample::default()),
            assignment_version: self.version,
            cordoned: false,
        };
        match registry.register(req, now_ms) {
            Ok(live) => {
                self.session = Some((live.session_id, live.key));
                self.report = true;
                self.next_beat_ms = now_ms;
            }
            Err(e) => tracing::debug!(node = %self.node, error = %e, "registration refused"),
        }
    }

    /// Sends one sealed heartbeat; true if the shard asks to register again.
    fn heartbeat(&mut self, ingest: &mut Ingest, session_id: u64, key: &SessionKey, now_ms: u64) -> bool {
        self.seq += 1;
        let body = v1::HeartbeatBody {
            health: Some(v1::HealthSample::default()),
            assignment_version: self.version,
            sent_at_unix_ms: now_ms,
        };
        let header = Header {
            magic: MAGIC_HEARTBEAT,
            format: Format::Mac,
            session_id,
            seq: self.seq,
            incarnation: self.incarnation,
            node_id: self.node.as_str(),
        };
        let (mut datagram, mut reply) = (Vec::new(), Vec::new());
        if seal::seal(key, &header, &body.encode_to_vec(), &mut datagram).is_err() {
            return false;
        }
        let _ = ingest.handle(&datagram, now_ms, &mut reply);
        reregister_asked(key, &reply)
    }

    /// Takes the node's current assignment set from the ledger (what a push carries).
    pub fn take_push(&mut self, ledger: &Ledger) {
        if !self.up {
            return;
        }
        let (version, claims) = ledger.assignments(&self.node);
        self.running = claims.into_iter().map(flotilla_aggregator::assignment_to_wire).collect();
        self.version = version;
        self.report = true;
    }

    fn workloads(&self) -> Vec<v1::WorkloadStatus> {
        self.running
            .iter()
            .enumerate()
            .map(|(i, a)| v1::WorkloadStatus {
                app: a.app.clone(),
                unit: a.unit.clone(),
                member: a.member.clone(),
                generation: a.generation,
                state: v1::WorkloadState::Running as i32,
                address: format!("{}:{}", self.node, 20_000 + i),
                ..Default::default()
            })
            .collect()
    }
}

fn reregister_asked(key: &SessionKey, reply: &[u8]) -> bool {
    let Ok(h) = seal::parse_header(reply) else { return false };
    if h.magic != MAGIC_REPLY {
        return false;
    }
    let mut scratch = Vec::new();
    let Ok(body) = seal::open(key, Direction::ToAgent, reply, &h, &mut scratch) else { return false };
    v1::HeartbeatReply::decode(body).is_ok_and(|r| r.action == v1::HeartbeatAction::Reregister as i32)
}

/// Capacity of `node`, for the ledger invariant.
pub fn capacity_of(agents: &[Agent], node: &NodeId) -> Option<Resources> {
    agents.iter().find(|a| &a.node == node).map(|a| a.capacity.clone())
}
