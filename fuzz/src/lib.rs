//! The bodies of the fuzz targets (`fuzz_targets/NAME.rs` calls `NAME`), in a library so
//! that `examples/make_seeds.rs` writes its seeds against the same constants and input
//! formats. Each target hands the bytes to the project's real decoder and validation
//! (never a copy), then checks what must hold of the result: a panic is a finding.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use flotilla_aggregator::{
    Change, HeartbeatDrop, Ingest, Ledger, NodeFacts, Registered, Registry, ShardStats, claims_from_wire,
};
use flotilla_core::{MAX_LABELS, NodeId, NodeStatus, PROTOCOL_VERSION, Resources, ServiceError};
use flotilla_proto::seal::{self, Direction, Format, Header, MAGIC_HEARTBEAT, MAGIC_REPLY};
use flotilla_proto::{convert, heartbeat_body, v1};
use prost::Message;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

/// The shard's master secret in every target (session keys derive from it).
pub const MASTER: &[u8] = b"fuzz-master-secret";
/// The join token the fuzzed shard accepts.
pub const JOIN_TOKEN: &str = "fuzz-join-token";
/// The control API's bearer token.
pub const API_TOKEN: &str = "fuzz-api-token";
/// The node every heartbeat input speaks for (registered before the input is read).
pub const NODE: &str = "n1";

fn registry() -> (Arc<Registry>, UnboundedReceiver<Change>) {
    let (tx, rx) = unbounded_channel();
    (Arc::new(Registry::new(0, 1, MASTER.to_vec(), vec![JOIN_TOKEN.into()], tx)), rx)
}

/// A registration the fuzzed shard accepts: `node`, incarnation 1, the default domain.
pub fn register_request(node: &str) -> v1::RegisterRequest {
    v1::RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        join_token: JOIN_TOKEN.into(),
        node_id: node.into(),
        incarnation: 1,
        labels: [("zone".to_string(), "z1".to_string())].into_iter().collect(),
        capacity: Some(v1::Resources { cpu_millis: 4000, memory_bytes: 8 << 30, ..Default::default() }),
        assignments: vec![],
        health: None,
        assignment_version: 0,
        cordoned: false,
    }
}

// ---- heartbeat -------------------------------------------------------------------

/// Heartbeat input, first byte even: the rest is one datagram as it arrives on the UDP
/// port (every byte the attacker's). Odd: the rest is a list of records
/// `[flags, seq_delta as i8, tamper, body_len, body...]`, each sealed into a datagram for
/// the registered session (so the body decoder and the liveness path are reached) and
/// handed to `Ingest::handle` in order, 100 ms apart.
pub mod hb {
    /// Sealed as the shard's reply ("FR"), then relabelled "FH": a reply sent back.
    pub const REFLECTED: u8 = 1 << 0;
    /// A session id the shard does not hold.
    pub const OTHER_SESSION: u8 = 1 << 1;
    /// Sealed with the key the master secret derives for the header's fields rather than
    /// the session's key (the same key for the real session; for another session, the
    /// key a restarted shard recognises).
    pub const DERIVED_KEY: u8 = 1 << 2;
    pub const OTHER_INCARNATION: u8 = 1 << 3;
    /// Speaks for node "n2" over n1's session.
    pub const OTHER_NODE: u8 = 1 << 4;
    /// Sealed in the older, encrypting format (`Format::Aead`) instead of the tagged one.
    pub const AEAD: u8 = 1 << 5;
    /// Bits 6-7: the node's status is moved first to 1 Suspect, 2 Dead, 3 Draining.
    pub const STATUS_SHIFT: u8 = 6;
    /// `tamper` 1..=127 flips the lowest bit of byte `(tamper - 1) % len`; 128..=255 cuts
    /// `tamper - 127` bytes off the end.
    pub const TAMPER_CUT: u8 = 128;
}

pub fn heartbeat(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else { return };
    let (registry, _changes) = registry();
    let live = registry.register(register_request(NODE), 0).expect("the fixed registration is valid");
    let mut ingest = Ingest::new(registry.clone(), Arc::new(ShardStats::new(0)));
    if mode % 2 == 0 {
        raw_datagram(&mut ingest, rest);
    } else {
        sealed_records(&mut ingest, &registry, &live, rest);
    }
}

fn raw_datagram(ingest: &mut Ingest, d: &[u8]) {
    let mut scratch = Vec::new();
    if let Ok(h) = seal::parse_header(d) {
        assert!(d.len() <= seal::MAX_DATAGRAM_LEN && h.len() + seal::TAG_LEN <= d.len(), "header past the datagram");
        assert_eq!(h.node_id.as_bytes(), &d[seal::HEADER_FIXED_LEN..h.len()]);
        let key = seal::derive_session_key(MASTER, h.session_id, h.incarnation, h.node_id);
        for dir in [Direction::ToShard, Direction::ToAgent] {
            if let Ok(plain) = seal::open(&key, dir, d, &h, &mut scratch) {
                check_body_decoders(plain);
                if let Ok(body) = v1::HeartbeatBody::decode(plain) {
                    let _ = convert::health(body.health);
                }
                let _ = v1::HeartbeatReply::decode(plain);
            }
        }
    }
    let mut reply = Vec::new();
    let r = ingest.handle(d, 1_000, &mut reply);
    // The registered session's id is random: no datagram of the input can speak for it.
    assert_ne!(r, Ok(()), "an unauthenticated datagram was accepted");
    if !reply.is_empty() {
        assert_eq!(r, Err(HeartbeatDrop::Forgotten), "only a forgotten session is answered");
        let h = seal::parse_header(d).expect("it was answered, so its header parsed");
        let key = seal::derive_session_key(MASTER, h.session_id, h.incarnation, h.node_id);
        check_reply(&reply, &key, &h);
    }
}

/// The shard's own body reader answers as prost does, to the bit, wherever it answers.
fn check_body_decoders(body: &[u8]) {
    let bits = |b: &v1::HeartbeatBody| {
        let health = b.health.map(|h| {
            let floats = [h.cpu_utilisation, h.cpu_steal, h.load_per_core, h.memory_pressure, h.workload_latency_ms];
            (floats.map(f32::to_bits), h.preemption_notice)
        });
        (health, b.assignment_version, b.sent_at_unix_ms)
    };
    if let Some(fast) = heartbeat_body::fast(body) {
        let prost = v1::HeartbeatBody::decode(body).ok();
        assert_eq!(Some(bits(&fast)), prost.as_ref().map(bits), "the fast body reader and prost differ");
    }
}

/// A reply must be a sealed "FR" datagram for the heartbeat's session and sequence,
/// asking the agent to register again.
fn check_reply(reply: &[u8], key: &seal::SessionKey, to: &Header<'_>) {
    let h = seal::parse_header(reply).expect("a reply parses");
    assert_eq!((h.magic, h.session_id, h.seq, h.incarnation), (MAGIC_REPLY, to.session_id, to.seq, to.incarnation));
    assert_eq!(h.format, to.format, "a reply is sealed as the heartbeat was");
    let mut scratch = Vec::new();
    let body = seal::open(key, Direction::ToAgent, reply, &h, &mut scratch).expect("a reply opens with the key");
    let r = v1::HeartbeatReply::decode(body).expect("a reply body decodes");
    assert_eq!(r.action, v1::HeartbeatAction::Reregister as i32);
}

fn sealed_records(ingest: &mut Ingest, registry: &Registry, live: &Registered, mut rest: &[u8]) {
    // (status, last sequence, last seen) of the session, which stays held throughout.
    let state = || {
        registry
            .with_session(live.session_id, |l| {
                (l.status(), l.last_seq.load(Ordering::Acquire), l.last_seen_ms.load(Ordering::Acquire))
            })
            .expect("the fixed session stays held")
    };
    let mut seq = 0u64;
    let mut now = 1_000u64;
    let mut dgram = Vec::new();
    let mut reply = Vec::new();
    while let [flags, delta, tamper, len, tail @ ..] = rest {
        let (flags, tamper) = (*flags, *tamper);
        let (body, tail) = tail.split_at(usize::from(*len).min(tail.len()));
        rest = tail;
        now += 100;
        seq = seq.wrapping_add_signed(i64::from(*delta as i8));
        let header = Header {
            magic: if flags & hb::REFLECTED != 0 { MAGIC_REPLY } else { MAGIC_HEARTBEAT },
            format: if flags & hb::AEAD != 0 { Format::Aead } else { Format::Mac },
            session_id: if flags & hb::OTHER_SESSION != 0 { live.session_id ^ 0x5a5a } else { live.session_id },
            seq,
            incarnation: live.incarnation + u64::from(flags & hb::OTHER_INCARNATION != 0),
            node_id: if flags & hb::OTHER_NODE != 0 { "n2" } else { NODE },
        };
        let key = if flags & hb::DERIVED_KEY != 0 {
            seal::derive_session_key(MASTER, header.session_id, header.incarnation, header.node_id)
        } else {
            live.key
        };
        check_body_decoders(body);
        if seal::seal(&key, &header, body, &mut dgram).is_err() {
            continue; // larger than a datagram may be
        }
        if flags & hb::REFLECTED != 0 {
            dgram[..2].copy_from_slice(&MAGIC_HEARTBEAT);
        }
        match tamper {
            0 => {}
            1..hb::TAMPER_CUT => {
                let i = usize::from(tamper - 1) % dgram.len();
                dgram[i] ^= 1;
            }
            _ => dgram.truncate(dgram.len().saturating_sub(usize::from(tamper - 127))),
        }
        let target = match flags >> hb::STATUS_SHIFT {
            1 => Some(NodeStatus::Suspect),
            2 => Some(NodeStatus::Dead),
            3 => Some(NodeStatus::Draining),
            _ => None,
        };
        if let Some(to) = target {
            registry.with_session(live.session_id, |l| l.transition(l.status(), to, now));
        }
        let (status, last_seq, _) = state();
        reply.clear();
        let r = ingest.handle(&dgram, now, &mut reply);
        let authentic =
            tamper == 0 && flags & (hb::REFLECTED | hb::OTHER_SESSION | hb::OTHER_INCARNATION | hb::OTHER_NODE) == 0;
        match r {
            Ok(()) => {
                assert!(authentic, "accepted a datagram that is not the session's own: flags {flags:#x}");
                assert!(seq > last_seq, "accepted sequence {seq} after {last_seq}");
                let (status, last, seen) = state();
                assert_eq!((last, seen), (seq, now));
                assert!(matches!(status, NodeStatus::Alive | NodeStatus::Draining), "{status:?}");
                assert!(reply.is_empty());
            }
            Err(HeartbeatDrop::DeadNode) => {
                assert!(authentic && status == NodeStatus::Dead, "{status:?}, flags {flags:#x}");
                check_reply(&reply, &live.key, &header);
            }
            Err(HeartbeatDrop::Forgotten) => {
                assert!(flags & hb::OTHER_SESSION != 0 && flags & hb::DERIVED_KEY != 0 && tamper == 0);
                check_reply(&reply, &key, &header);
            }
            Err(_) => assert!(reply.is_empty(), "{r:?} was answered"),
        }
        // Only an authenticated, newer datagram moves the sequence.
        if !matches!(r, Ok(()) | Err(HeartbeatDrop::DeadNode)) {
            assert_eq!(state().1, last_seq, "{r:?} moved the sequence");
        }
    }
}

// ---- registration ----------------------------------------------------------------

/// Registration input: one `AgentRequest` as a QUIC control stream carries it (a
/// registration, a workload report or a drain), handled by a fresh shard's registry.
pub fn registration(data: &[u8]) {
    use v1::agent_request::Request;
    let Ok(req) = v1::AgentRequest::decode(data) else { return };
    let (registry, mut changes) = registry();
    let now = 1_000;
    match req.request {
        None => {}
        Some(Request::Register(r)) => register_and_check(&registry, &mut changes, r, now),
        Some(Request::Workloads(w)) => {
            let node = if NodeId::new(&w.node_id).is_ok() { w.node_id.as_str() } else { NODE };
            let live = registry.register(register_request(node), now).expect("the fixed registration is valid");
            // As sent (the session id is the agent's claim), then over the owning connection.
            let _ = registry.report_workloads(w.session_id, &w.node_id, w.workloads.clone());
            if registry.report_workloads(live.session_id, &w.node_id, w.workloads).is_ok() {
                let kept = registry.workloads(&live.node_id);
                assert!(kept.len() <= Registry::MAX_REPORTED_WORKLOADS);
                for s in kept.iter() {
                    assert!([&s.app, &s.unit, &s.member].iter().all(|n| (1..=128).contains(&n.len())));
                    assert!(s.address.len() <= 256 && s.message.len() <= 1024, "an unbounded workload report");
                }
            }
        }
        Some(Request::Drain(d)) => {
            let live = registry.register(register_request(NODE), now).expect("the fixed registration is valid");
            let _ = registry.drain(d.session_id, &d.node_id, now);
            let r = registry.drain(live.session_id, &d.node_id, now);
            assert_eq!(r.is_some(), d.node_id == NODE, "a session drains its own node only");
            if r.is_some() {
                assert_eq!(registry.with_session(live.session_id, |l| l.status()), Some(NodeStatus::Draining));
            }
        }
    }
}

fn register_and_check(
    registry: &Arc<Registry>,
    changes: &mut UnboundedReceiver<Change>,
    r: v1::RegisterRequest,
    now: u64,
) {
    let (node_id, incarnation) = (r.node_id.clone(), r.incarnation);
    let (protocol, token) = (r.protocol_version, r.join_token.clone());
    let live = match registry.register(r, now) {
        Ok(live) => live,
        Err(e) => {
            let _ = (e.to_string(), e.code(), e.closes_connection());
            return;
        }
    };
    assert_eq!((protocol, token.as_str()), (PROTOCOL_VERSION, JOIN_TOKEN), "registered without credentials");
    assert_eq!((live.node_id.as_str(), live.incarnation), (node_id.as_str(), incarnation));
    assert_eq!(live.key, seal::derive_session_key(MASTER, live.session_id, incarnation, &node_id));
    assert!(registry.is_current(live.session_id));
    let Ok(Change::Registered(told, d)) = changes.try_recv() else { panic!("the applier was not told") };
    assert_eq!((told.session_id, &told.node_id), (live.session_id, &live.node_id));
    d.capacity.validate_node_capacity().expect("an accepted capacity is sane");
    assert!(d.labels.len() <= MAX_LABELS);
    // What the applier does with it on a restarted shard: adopt what the agent runs.
    let capacity = (*d.capacity).clone();
    let running = d.running.len();
    let mut ledger = Ledger::new();
    let (adopted, left_out) = ledger.adopt(&live.node_id, incarnation, &capacity, d.running, d.running_version);
    assert_eq!(adopted + left_out, running);
    let cap = |n: &NodeId| (*n == live.node_id).then(|| capacity.clone());
    ledger.check_invariant(&cap).unwrap_or_else(|e| panic!("ledger invariant after adopt: {e}"));
    // The session it got authenticates its heartbeats.
    let body = v1::HeartbeatBody::default().encode_to_vec();
    let header = Header {
        magic: MAGIC_HEARTBEAT,
        format: Format::Mac,
        session_id: live.session_id,
        seq: 1,
        incarnation,
        node_id: live.node_id.as_str(),
    };
    let mut dgram = Vec::new();
    seal::seal(&live.key, &header, &body, &mut dgram).expect("a valid node id seals");
    let mut ingest = Ingest::new(registry.clone(), Arc::new(ShardStats::new(0)));
    assert_eq!(ingest.handle(&dgram, now + 1, &mut Vec::new()), Ok(()), "the new session's heartbeat");
}

// ---- commit request --------------------------------------------------------------

/// The nodes the fuzzed ledger knows: `n0`..`n7`, each with its own reason to refuse.
pub fn node_facts(id: &NodeId) -> Option<NodeFacts> {
    let i: u8 = id.as_str().strip_prefix('n')?.parse().ok()?;
    (i < 8).then(|| NodeFacts {
        status: match i {
            3 => NodeStatus::Suspect,
            4 => NodeStatus::Unknown,
            6 => NodeStatus::Draining,
            _ => NodeStatus::Alive,
        },
        incarnation: if i == 7 { 2 } else { 1 },
        capacity: Resources {
            cpu_millis: 4000,
            memory_bytes: 8 << 30,
            gpu: u32::from(i == 1) * 2,
            custom: if i == 0 { [("fpga".to_string(), 2)].into_iter().collect() } else { Default::default() },
        },
        low_priority: i == 2,
        cordoned: i == 5,
    })
}

/// Commit input: one `CommitRequest` as the gRPC `Commit` call receives it, validated
/// by `claims_from_wire` and judged by a fresh ledger.
pub fn commit_request(data: &[u8]) {
    let Ok(req) = v1::CommitRequest::decode(data) else { return };
    let sent = req.claims.len();
    let Ok(claims) = claims_from_wire(&req.txn_id, req.claims) else { return };
    assert_eq!(claims.len(), sent);
    let txn = req.txn_id;
    let cap = |n: &NodeId| node_facts(n).map(|f| f.capacity);
    let invariant = |l: &Ledger, when: &str| {
        l.check_invariant(&cap).unwrap_or_else(|e| panic!("ledger invariant {when}: {e}"));
    };
    let mut ledger = Ledger::new();
    let (out, changed) = ledger.commit(&txn, &claims, &node_facts);
    invariant(&ledger, "after a commit");
    assert_eq!(out.len(), claims.len());
    for (c, (k, r)) in claims.iter().zip(&out) {
        assert_eq!(&c.key, k, "results are in request order");
        if r.is_ok() {
            assert_eq!(ledger.placement(k), Some(&c.node), "an accepted claim is placed where it asked");
        }
    }
    assert!(changed.iter().all(|n| node_facts(n).is_some()), "a node it does not know changed");
    // The same transaction again: the same answer, nothing changes.
    let (again, changed) = ledger.commit(&txn, &claims, &node_facts);
    assert_eq!(again, out, "a replayed transaction got another answer");
    assert!(changed.is_empty());
    // The same claims under a new transaction (a scheduler retrying): what was accepted
    // stays accepted and nothing is allocated twice.
    let unique = claims.iter().map(|c| &c.key).collect::<HashSet<_>>().len() == claims.len();
    assert!(unique, "claims_from_wire let a key through twice");
    let (retried, _) = ledger.commit(&format!("{txn}/retry"), &claims, &node_facts);
    invariant(&ledger, "after a retry");
    for ((k, first), (_, second)) in out.iter().zip(&retried) {
        assert!(first.is_err() || second.is_ok(), "{k:?} was accepted, then refused on retry: {second:?}");
    }
    // Releasing every key frees every node.
    let keys: Vec<_> = claims.iter().map(|c| c.key.clone()).collect();
    ledger.release(&keys);
    invariant(&ledger, "after a release");
    for c in &claims {
        assert!(ledger.allocated(&c.node).is_zero(), "{} keeps an allocation after a release", c.node);
        assert!(ledger.placement(&c.key).is_none());
    }
}

// ---- app spec --------------------------------------------------------------------

/// App spec input: the TOML text `flotilla apply` sends and `load_spec` reads.
pub fn app_spec(data: &[u8]) {
    // Both callers take text (a file read to a string, an HTTP body as a String).
    let Ok(text) = std::str::from_utf8(data) else { return };
    let spec = match flotilla_scheduler::AppSpec::parse(text) {
        Ok(spec) => spec,
        Err(e) => {
            assert!(!e.0.is_empty(), "an error that names no problem");
            let _ = e.to_string();
            return;
        }
    };
    let members = spec.members();
    let in_groups: u32 = spec.unit.groups.values().filter_map(|g| g.count).sum();
    assert_eq!(members.len(), 1 + spec.unit.workers as usize + in_groups as usize);
    for (name, _, t) in &members {
        // Every way to run it: the template and each alternative.
        for k in 0..=t.alternatives.len() as u32 {
            let r = t.alternative(k).resources();
            assert!(!r.is_zero(), "{name}: a member that asks for nothing");
            r.validate_node_capacity().unwrap_or_else(|e| panic!("{name}: a valid spec no node can hold: {e}"));
        }
    }
    let fingerprint = spec.template_fingerprint();
    // What the store and the API hand on is the canonical TOML: it must read back the same.
    let canonical = toml::to_string(&spec).expect("a valid spec serialises");
    let back = flotilla_scheduler::AppSpec::parse(&canonical)
        .unwrap_or_else(|e| panic!("the canonical form of a valid spec is refused: {e}\n{canonical}"));
    assert_eq!(back, spec, "the canonical form reads back differently:\n{canonical}");
    assert_eq!(back.template_fingerprint(), fingerprint);
}

// ---- autoscaling ---------------------------------------------------------------

/// Autoscaling input: `[selector, text...]`. Selector 0: a policy file (`flotilla policy
/// apply`, `flotilla sim --policy`); 1: a load trace (`flotilla sim --trace`); 2: a demand
/// body (`PUT /v1/apps/{app}/demand`).
pub fn autoscaling(data: &[u8]) {
    use flotilla_autoscale::{AutoscalingConfig, Trace, policy_file_from_toml};
    let Some((&selector, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    match selector % 3 {
        0 => {
            match policy_file_from_toml(text) {
                Ok((policy, model)) => {
                    assert!(policy.interval_ms >= 1000, "an interval under a second");
                    assert!(model.unit.cpu_millis > 0 || model.unit.memory_bytes > 0, "a unit of nothing");
                }
                Err(e) => assert!(!e.to_string().is_empty()),
            }
            // A valid `[autoscaling]` table reads back the same from its canonical form.
            if let Ok(config) = AutoscalingConfig::from_toml(text)
                && let Ok(policy) = config.validate()
            {
                let canonical = toml::to_string(&toml::Table::from_iter([(
                    "autoscaling".to_string(),
                    toml::Value::try_from(&config).expect("a config serialises"),
                )]))
                .expect("a table serialises");
                let again = AutoscalingConfig::policy_from_toml(&canonical)
                    .unwrap_or_else(|e| panic!("the canonical form is refused: {e}\n{canonical}"));
                assert_eq!(again, policy, "the canonical form reads back differently:\n{canonical}");
            }
        }
        1 => match Trace::parse_csv(text) {
            Ok(t) => {
                assert!(t.rows.len() >= 2 && t.rows[0].at_ms == 0, "a trace must start at 0 with two rows");
                assert!(t.rows.windows(2).all(|w| w[0].at_ms < w[1].at_ms), "rows out of order");
                assert!(t.end_ms >= t.rows[t.rows.len() - 1].at_ms);
            }
            Err(e) => assert!(e.line > 0 || !e.message.is_empty(), "an error that names nothing"),
        },
        _ => {
            #[derive(serde::Deserialize)]
            struct Body {
                requests: Vec<flotilla_scheduler::DemandRequest>,
                ttl_seconds: u64,
            }
            let Ok(b) = serde_json::from_str::<Body>(text) else { return };
            match flotilla_scheduler::Demand::new(b.requests, b.ttl_seconds.saturating_mul(1000), 0) {
                Ok(d) => {
                    assert!(d.requests.len() <= flotilla_scheduler::MAX_DEMAND_ENTRIES);
                    for r in &d.requests {
                        assert!(r.count <= flotilla_scheduler::MAX_DEMAND_COUNT);
                        assert!(r.resources.custom.is_empty(), "an unknown resource accepted");
                        r.resources.validate_node_capacity().expect("an absurd request accepted");
                    }
                }
                Err(e) => assert!(!e.to_string().is_empty()),
            }
        }
    }
}

// ---- control API (control.rs) ----------------------------------------------------

mod control;
pub use control::control_json;

// ---- artifact wire formats (artifact.rs) ---------------------------------------

mod artifact;
pub use artifact::{BITFIELD_EXPLICIT_LEN, MANIFEST_RESERVED, artifact_wire};

// ---- pool ----------------------------------------------------------------------

/// The most bytes of one pool input: the pool file and a demand file are read whole, so a
/// larger input only measures the parser's speed.
pub const POOL_MAX_INPUT: usize = 64 * 1024;

/// Bounds on a problem the fuzzed packer is given: past them a plan is slow by design
/// (Ray's greedy tries every candidate node per request group), not wrong, so a bigger
/// problem is skipped and a type's `min`/`max` and `max_nodes` are clamped, which bounds
/// how many nodes one plan can launch.
pub mod plan_bounds {
    pub const NODE_TYPES: usize = 32;
    pub const NODES: usize = 256;
    /// Request and floor entries together.
    pub const REQUESTS: usize = 128;
    pub const GANGS: usize = 64;
    pub const BUNDLES: usize = 512;
    /// Most new nodes of one type.
    pub const PER_TYPE: u32 = 32;
    pub const MAX_NODES: u32 = 512;
    /// Most current instances a demand file may expand to before it is even parsed (each
    /// `count` is a node the parser builds).
    pub const INSTANCES: f64 = 4096.0;
}

/// `p` within [`plan_bounds`], or None when it is too big to plan quickly.
pub fn bounded_problem(p: &flotilla_pool::pack::Problem) -> Option<flotilla_pool::pack::Problem> {
    use plan_bounds as b;
    let bundles: usize = p.gangs.iter().map(|g| g.bundles.len()).sum();
    if p.node_types.len() > b::NODE_TYPES
        || p.nodes.len() > b::NODES
        || p.requests.len() + p.floor.len() > b::REQUESTS
        || p.gangs.len() > b::GANGS
        || bundles > b::BUNDLES
    {
        return None;
    }
    let mut p = p.clone();
    for t in &mut p.node_types {
        t.max = t.max.min(b::PER_TYPE);
        t.min = t.min.min(t.max);
    }
    p.max_nodes = p.max_nodes.map(|m| m.min(b::MAX_NODES));
    Some(p)
}

/// What must hold of any plan of `p`: the report's arithmetic, no type (nor the pool)
/// past its max, terminations of nodes that exist, and every refusal explained.
pub fn check_plan(p: &flotilla_pool::pack::Problem, r: &flotilla_pool::demand::PlanReport) {
    use std::collections::HashMap;
    for (name, w) in &r.waste {
        assert!((0.0..=1.0).contains(w), "waste of {name} is {w}: {r:?}");
        assert!(r.launched.contains_key(name), "waste of {name}, which no new node has");
    }
    for (name, v) in &r.launched {
        assert!(v.is_finite() && *v > 0.0, "launched {v} of {name}");
    }
    assert_eq!(r.nodes_total, r.nodes_by_type.values().sum::<u32>(), "{r:?}");
    assert_eq!(r.nodes_total == 0, r.launched.is_empty(), "launched capacity without nodes (or nodes without it)");
    let terminated: HashSet<&str> = r.terminate.iter().map(|t| t.node_id.as_str()).collect();
    assert_eq!(terminated.len(), r.terminate.len(), "a node terminated twice: {:?}", r.terminate);
    for t in &r.terminate {
        let n = p.nodes.iter().find(|n| n.id == t.node_id);
        let n = n.unwrap_or_else(|| panic!("terminating {}, which does not exist", t.node_id));
        assert_eq!(n.node_type.as_deref(), Some(t.node_type.as_str()), "terminating a node the pool does not manage");
        assert!(!t.detail.is_empty());
    }
    let mut live: HashMap<&str, u64> = HashMap::new();
    for n in &p.nodes {
        if let Some(t) = &n.node_type
            && !terminated.contains(n.id.as_str())
        {
            *live.entry(t.as_str()).or_default() += 1;
        }
    }
    for (name, n) in &r.nodes_by_type {
        let t = p.node_types.iter().find(|t| &t.name == name);
        let t = t.unwrap_or_else(|| panic!("launching {n} of {name}, which is no node type"));
        assert!(*n > 0, "an entry for no node of {name}");
        let total = u64::from(*n) + live.get(name.as_str()).copied().unwrap_or(0);
        assert!(total <= u64::from(t.max), "{name}: {n} launched, {total} in all, max {}", t.max);
        assert!(r.reasons.get(name).is_some_and(|v| !v.is_empty()), "{name} launched for no reason: {r:?}");
    }
    if let Some(m) = p.max_nodes {
        let all = u64::from(r.nodes_total) + live.values().sum::<u64>();
        assert!(all <= u64::from(m), "{all} managed nodes, max_nodes {m}");
    }
    for i in &r.infeasible {
        assert!(!i.reason.is_empty() && !i.request.is_empty(), "an unexplained infeasible entry: {i:?}");
        assert!(i.count > 0, "nothing is infeasible: {i:?}");
    }
}

fn plan_and_check(p: &flotilla_pool::pack::Problem) {
    let Some(p) = bounded_problem(p) else { return };
    let plan = flotilla_pool::pack::plan(&p);
    let report = flotilla_pool::demand::report(&p, plan, 0.0);
    check_plan(&p, &report);
    serde_json::to_string(&report).expect("a report serialises");
}

/// The pool file every constraints input is planned against (`examples/pool.toml`).
pub const EXAMPLE_POOL: &str = include_str!("../../examples/pool.toml");

/// Pool input: `[selector, bytes...]`. Selector % 4: 0 a pool file (`--pool`), planned
/// from empty; 1 a demand file (`flotilla autoscale plan`), parsed and planned; 2 the body
/// of `PUT /v1/pools/{pool}/constraints`, validated and planned as the floor of the
/// example pool; 3 an exec provider's `list` output.
pub fn pool(data: &[u8]) {
    use flotilla_pool::config::{MAX_POOL_NODES, PoolConfig};
    use flotilla_pool::model::{self, Constraints, IdleClock, Observation};
    use flotilla_pool::reconciler;
    let Some((&selector, rest)) = data.split_first() else { return };
    if rest.len() > POOL_MAX_INPUT {
        return;
    }
    let empty = |cfg: &PoolConfig, floor: &Constraints| {
        let obs = Observation {
            nodes: &[],
            apps: &[],
            instances: &[],
            floor,
            idle: &IdleClock::default(),
            unavailable: &Default::default(),
            now_ms: 0,
        };
        reconciler::problem(cfg, &obs, true)
    };
    match selector % 4 {
        0 => {
            let Ok(text) = std::str::from_utf8(rest) else { return };
            let cfg = match PoolConfig::parse(text) {
                Ok(cfg) => cfg,
                Err(e) => {
                    assert!(!e.0.is_empty() && e.0.iter().all(|m| !m.is_empty()), "an error naming nothing");
                    return;
                }
            };
            assert!(!cfg.node_types.is_empty());
            assert!((1..=3600).contains(&cfg.interval.as_secs()));
            assert!(cfg.upscaling_speed.is_finite() && cfg.upscaling_speed >= 0.0);
            let mut names = HashSet::new();
            for t in &cfg.node_types {
                assert!(names.insert(&t.name), "{} twice", t.name);
                assert!(t.min <= t.max && t.max <= MAX_POOL_NODES, "{t:?}");
                assert!(!t.resources.is_zero());
                t.resources.validate_node_capacity().expect("an accepted node type is a sane capacity");
                assert!(cfg.node_type(&t.name).is_some());
            }
            if let Some(m) = cfg.max_nodes {
                assert!(cfg.node_types.iter().map(|t| u64::from(t.min)).sum::<u64>() <= u64::from(m));
            }
            let p = empty(&cfg, &Constraints::default());
            assert_eq!(p.node_types.len(), cfg.node_types.len());
            for t in &p.node_types {
                assert!(!t.resources.is_zero(), "{} packs as nothing", t.name);
            }
            plan_and_check(&p);
        }
        1 => {
            let Ok(text) = std::str::from_utf8(rest) else { return };
            // Each current instance is a node the parser builds: a short file can ask for
            // a million; count them first.
            if let Ok(v) = serde_json::from_str::<serde_json::Value>(text) {
                let instances: f64 = v["current_instances"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|i| i.get("count").map_or(Some(1.0), serde_json::Value::as_f64).unwrap_or(0.0))
                    .filter(|c| c.is_finite() && *c > 0.0)
                    .sum();
                if instances > plan_bounds::INSTANCES {
                    return;
                }
            }
            match flotilla_pool::demand::DemandFile::parse(text) {
                Ok(d) => {
                    let p = &d.problem;
                    assert!(p.node_types.len() <= flotilla_pool::demand::MAX_NODE_TYPES);
                    for t in &p.node_types {
                        assert!(t.min <= t.max && !t.resources.is_zero(), "{t:?}");
                    }
                    for n in &p.nodes {
                        assert!(n.available.fits_in(&n.total), "{n:?}");
                    }
                    let Some(bounded) = bounded_problem(p) else { return };
                    // Bounded, the problem is planned through the demand file's own path.
                    let d = flotilla_pool::demand::DemandFile { problem: bounded };
                    let report = d.plan();
                    assert!(report.decision_seconds >= 0.0);
                    check_plan(&d.problem, &report);
                    serde_json::to_string(&report).expect("a report serialises");
                }
                Err(e) => assert!(!e.path.is_empty() && !e.message.is_empty(), "an error naming nothing: {e:?}"),
            }
        }
        2 => {
            let Ok(c) = serde_json::from_slice::<Constraints>(rest) else { return };
            if let Err(e) = c.validate() {
                assert!(!e.is_empty());
                return;
            }
            assert!(c.resource_requests.len() <= model::MAX_FLOOR_REQUESTS);
            for r in &c.resource_requests {
                assert!(r.count <= model::MAX_FLOOR_COUNT);
                r.resources.validate_node_capacity().expect("an accepted floor request is sane");
            }
            // The control plane keeps the floor as JSON and hands it back: the same.
            let text = serde_json::to_string(&c).expect("constraints serialise");
            let back: Constraints = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
            assert_eq!(back, c);
            let cfg = PoolConfig::parse(EXAMPLE_POOL).expect("the example pool is valid");
            let p = empty(&cfg, &c);
            assert_eq!(p.floor.len(), c.resource_requests.len());
            plan_and_check(&p);
        }
        _ => match flotilla_pool::provider::exec::parse_list("list", rest) {
            Ok(items) => {
                for i in &items {
                    assert!(!i.id.is_empty() && i.id.len() <= 128 && i.id != "." && i.id != "..", "{i:?}");
                    assert!(i.id.bytes().all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b)), "{i:?}");
                }
            }
            Err(e) => assert!(e.to_string().starts_with("list: "), "{e}"),
        },
    }
}
