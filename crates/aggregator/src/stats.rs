//! The shard's own counters. Kept as atomics (tests read them directly) and mirrored
//! into Prometheus metrics labelled by shard.

use crate::catalogue as m;
use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_proto::seal::DatagramError;
use metrics::Counter;

/// Why a heartbeat was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatDrop {
    Datagram(DatagramError),
    /// Sequence number not above the last one seen: an old or replayed datagram.
    Replayed,
    /// No such session and the seal does not verify under a derived key either.
    UnknownSession,
    /// A session speaking for a node id or incarnation that is not its own.
    WrongNode,
    /// The node was declared dead; it must register again.
    DeadNode,
    /// The sealed session is valid but this shard forgot it (it restarted): re-register.
    Forgotten,
    /// A datagram of 0 bytes: no agent sends one, so a probe or a flood.
    Empty,
}

impl HeartbeatDrop {
    pub const ALL: [HeartbeatDrop; REASONS] = [
        HeartbeatDrop::Datagram(DatagramError::Truncated),
        HeartbeatDrop::Datagram(DatagramError::Oversized),
        HeartbeatDrop::Datagram(DatagramError::BadMagic),
        HeartbeatDrop::Datagram(DatagramError::BadVersion),
        HeartbeatDrop::Datagram(DatagramError::BadNodeId),
        HeartbeatDrop::Datagram(DatagramError::BadSeal),
        HeartbeatDrop::Datagram(DatagramError::BadBody),
        HeartbeatDrop::Replayed,
        HeartbeatDrop::UnknownSession,
        HeartbeatDrop::WrongNode,
        HeartbeatDrop::DeadNode,
        HeartbeatDrop::Forgotten,
        HeartbeatDrop::Empty,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            HeartbeatDrop::Datagram(e) => e.as_str(),
            HeartbeatDrop::Replayed => "replayed",
            HeartbeatDrop::UnknownSession => "unknown_session",
            HeartbeatDrop::WrongNode => "wrong_node",
            HeartbeatDrop::DeadNode => "dead_node",
            HeartbeatDrop::Forgotten => "forgotten_session",
            HeartbeatDrop::Empty => "empty",
        }
    }

    fn index(self) -> usize {
        match self {
            HeartbeatDrop::Datagram(e) => e as usize,
            HeartbeatDrop::Replayed => 7,
            HeartbeatDrop::UnknownSession => 8,
            HeartbeatDrop::WrongNode => 9,
            HeartbeatDrop::DeadNode => 10,
            HeartbeatDrop::Forgotten => 11,
            HeartbeatDrop::Empty => 12,
        }
    }
}

const REASONS: usize = 13;

pub struct ShardStats {
    accepted: AtomicU64,
    /// Of those, in the encrypted format (older agents).
    encrypted: AtomicU64,
    rejected: [AtomicU64; REASONS],
    accepted_metric: Counter,
    encrypted_metric: Counter,
    rejected_metric: Vec<Counter>,
    pub registrations: AtomicU64,
    pub registrations_rejected: AtomicU64,
}

impl ShardStats {
    pub fn new(shard: usize) -> Self {
        let s = shard.to_string();
        let mut rejected_metric = vec![Counter::noop(); REASONS];
        for r in HeartbeatDrop::ALL {
            rejected_metric[r.index()] =
                metrics::counter!(m::HEARTBEATS_REJECTED.name, "shard" => s.clone(), "reason" => r.as_str());
        }
        ShardStats {
            accepted: AtomicU64::new(0),
            encrypted: AtomicU64::new(0),
            rejected: Default::default(),
            accepted_metric: metrics::counter!(m::HEARTBEATS_RECEIVED.name, "shard" => s.clone()),
            encrypted_metric: metrics::counter!(m::HEARTBEATS_ENCRYPTED.name, "shard" => s),
            rejected_metric,
            registrations: AtomicU64::new(0),
            registrations_rejected: AtomicU64::new(0),
        }
    }

    /// `n` accepted heartbeats, `encrypted` of them in the older format.
    pub fn accept(&self, n: u64, encrypted: u64) {
        self.accepted.fetch_add(n, Ordering::Relaxed);
        self.accepted_metric.increment(n);
        if encrypted > 0 {
            self.encrypted.fetch_add(encrypted, Ordering::Relaxed);
            self.encrypted_metric.increment(encrypted);
        }
    }

    pub fn reject(&self, r: HeartbeatDrop) {
        self.rejected[r.index()].fetch_add(1, Ordering::Relaxed);
        self.rejected_metric[r.index()].increment(1);
    }

    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    pub fn accepted_encrypted(&self) -> u64 {
        self.encrypted.load(Ordering::Relaxed)
    }

    pub fn rejected(&self, r: HeartbeatDrop) -> u64 {
        self.rejected[r.index()].load(Ordering::Relaxed)
    }
}
