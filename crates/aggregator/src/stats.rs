//! The shard's own counters. Kept as atomics (tests read them directly) and mirrored
//! into Prometheus metrics labelled by shard.

use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_proto::seal::DatagramError;
use metrics::Counter;

/// Why a heartbeat was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reject {
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
}

impl Reject {
    pub const ALL: [Reject; REASONS] = [
        Reject::Datagram(DatagramError::Truncated),
        Reject::Datagram(DatagramError::Oversized),
        Reject::Datagram(DatagramError::BadMagic),
        Reject::Datagram(DatagramError::BadVersion),
        Reject::Datagram(DatagramError::BadNodeId),
        Reject::Datagram(DatagramError::BadSeal),
        Reject::Datagram(DatagramError::BadBody),
        Reject::Replayed,
        Reject::UnknownSession,
        Reject::WrongNode,
        Reject::DeadNode,
        Reject::Forgotten,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reject::Datagram(e) => e.as_str(),
            Reject::Replayed => "replayed",
            Reject::UnknownSession => "unknown_session",
            Reject::WrongNode => "wrong_node",
            Reject::DeadNode => "dead_node",
            Reject::Forgotten => "forgotten_session",
        }
    }

    fn index(self) -> usize {
        match self {
            Reject::Datagram(e) => e as usize,
            Reject::Replayed => 7,
            Reject::UnknownSession => 8,
            Reject::WrongNode => 9,
            Reject::DeadNode => 10,
            Reject::Forgotten => 11,
        }
    }
}

const REASONS: usize = 12;

pub struct ShardStats {
    accepted: AtomicU64,
    rejected: [AtomicU64; REASONS],
    accepted_metric: Counter,
    rejected_metric: Vec<Counter>,
    pub registrations: AtomicU64,
    pub registrations_rejected: AtomicU64,
}

impl ShardStats {
    pub fn new(shard: usize) -> Self {
        let s = shard.to_string();
        let mut rejected_metric = vec![Counter::noop(); REASONS];
        for r in Reject::ALL {
            rejected_metric[r.index()] =
                metrics::counter!("flotilla_heartbeats_rejected_total", "shard" => s.clone(), "reason" => r.as_str());
        }
        ShardStats {
            accepted: AtomicU64::new(0),
            rejected: Default::default(),
            accepted_metric: metrics::counter!("flotilla_heartbeats_received_total", "shard" => s),
            rejected_metric,
            registrations: AtomicU64::new(0),
            registrations_rejected: AtomicU64::new(0),
        }
    }

    pub fn accept(&self, n: u64) {
        self.accepted.fetch_add(n, Ordering::Relaxed);
        self.accepted_metric.increment(n);
    }

    pub fn reject(&self, r: Reject) {
        self.rejected[r.index()].fetch_add(1, Ordering::Relaxed);
        self.rejected_metric[r.index()].increment(1);
    }

    pub fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    pub fn rejected(&self, r: Reject) -> u64 {
        self.rejected[r.index()].load(Ordering::Relaxed)
    }
}
