//! The tracker: which nodes hold which pieces of an artifact, and who may read which
//! piece from the origin. It lives in the control plane (see docs/architecture.md): one
//! swarm per artifact across every domain and shard, so the origin is read about once.
//!
//! Soft state only: agents announce every second or two while they fetch and every
//! half minute while they hold a copy; a node that stops announcing drops out after
//! [`PEER_TTL`]. An announce costs O(pieces ÷ 64) plus the sample it answers with, never
//! O(peers): holder counts are kept up to date as bitfields change.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::IteratorRandom;

use crate::bitfield::Bitfield;
use crate::digest::Digest;

/// A node not heard from for this long is out of its swarms.
pub const PEER_TTL: Duration = Duration::from_secs(90);
/// How long a node may hold the right to read a piece from the origin before another
/// node is given it.
pub const ORIGIN_LEASE: Duration = Duration::from_secs(20);
/// Peers named in one answer, at most.
pub const MAX_ANSWER: usize = 48;
/// Swarms and peers per swarm kept, at most: the rest are refused, not grown into.
pub const MAX_SWARMS: usize = 4096;
pub const MAX_PEERS: usize = 200_000;
/// Origin pieces one announce may ask for.
pub const MAX_ORIGIN_ASK: u32 = 64;

#[derive(Debug, Clone)]
pub struct Announce {
    pub node: String,
    /// `host:port` where it takes peer connections; `None` behind NAT (it only dials).
    pub addr: Option<String>,
    pub have: Bitfield,
    /// How many more pieces it would read from the origin now.
    pub want_origin: u32,
    /// It is leaving the swarm (deleted the artifact, or is shutting down).
    pub stopped: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerInfo {
    pub node: String,
    pub addr: Option<String>,
    pub have: Bitfield,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    pub peers: Vec<PeerInfo>,
    /// Pieces this node may read from the origin: held by no peer, leased to no one else
    /// (its own leases are renewed, so a piece whose read failed is asked for again).
    pub origin: Vec<u32>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TrackerError {
    #[error("the tracker follows {MAX_SWARMS} artifacts already")]
    TooManySwarms,
    #[error("the swarm of {0} has {MAX_PEERS} peers already")]
    TooManyPeers(Digest),
    #[error("a bitfield of {got} pieces for an artifact of {want}")]
    Pieces { got: u32, want: u32 },
}

struct Peer {
    node: String,
    addr: Option<String>,
    have: Bitfield,
    seen: Instant,
}

struct Swarm {
    pieces: u32,
    index: HashMap<String, usize>,
    peers: Vec<Peer>,
    /// How many live peers hold each piece.
    holders: Vec<u32>,
    leases: HashMap<u32, (String, Instant)>,
}

impl Swarm {
    fn new(pieces: u32) -> Swarm {
        Swarm {
            pieces,
            index: HashMap::new(),
            peers: Vec::new(),
            holders: vec![0; pieces as usize],
            leases: HashMap::new(),
        }
    }

    fn count(&mut self, have: &Bitfield, add: bool) {
        for i in have.ones() {
            let h = &mut self.holders[i as usize];
            *h = if add { h.saturating_add(1) } else { h.saturating_sub(1) };
        }
    }

    fn remove(&mut self, node: &str) {
        let Some(i) = self.index.remove(node) else { return };
        let gone = self.peers.swap_remove(i);
        self.count(&gone.have, false);
        if let Some(moved) = self.peers.get(i) {
            self.index.insert(moved.node.clone(), i);
        }
    }
}

#[derive(Default)]
pub struct Tracker {
    swarms: HashMap<Digest, Swarm>,
}

impl Tracker {
    /// Takes `a`'s news and answers with peers to ask and the origin pieces it may read.
    pub fn announce(
        &mut self,
        digest: Digest,
        a: Announce,
        now: Instant,
        rng: &mut impl Rng,
    ) -> Result<Answer, TrackerError> {
        let pieces = a.have.len();
        if !self.swarms.contains_key(&digest) {
            if a.stopped {
                return Ok(Answer::default());
            }
            if self.swarms.len() >= MAX_SWARMS {
                return Err(TrackerError::TooManySwarms);
            }
            self.swarms.insert(digest, Swarm::new(pieces));
        }
        let Some(s) = self.swarms.get_mut(&digest) else { return Ok(Answer::default()) };
        if s.pieces != pieces {
            return Err(TrackerError::Pieces { got: pieces, want: s.pieces });
        }
        s.remove(&a.node);
        if a.stopped {
            s.leases.retain(|_, (n, _)| *n != a.node);
            if s.peers.is_empty() {
                self.swarms.remove(&digest);
            }
            return Ok(Answer::default());
        }
        if s.peers.len() >= MAX_PEERS {
            return Err(TrackerError::TooManyPeers(digest));
        }
        s.count(&a.have, true);
        s.leases.retain(|p, (n, until)| *until > now && !(*n == a.node && a.have.get(*p)));
        let others = s.peers.iter().filter(|p| now.duration_since(p.seen) < PEER_TTL);
        let peers = others
            .choose_multiple(rng, MAX_ANSWER)
            .into_iter()
            .map(|p| PeerInfo { node: p.node.clone(), addr: p.addr.clone(), have: p.have.clone() })
            .collect();
        let mut origin = Vec::new();
        let ask = a.want_origin.min(MAX_ORIGIN_ASK) as usize;
        if ask > 0 {
            // Start at a random piece, so nodes asking at once are handed different ones.
            let start = rng.random_range(0..pieces.max(1));
            for p in (start..pieces).chain(0..start) {
                if origin.len() >= ask {
                    break;
                }
                if s.holders[p as usize] == 0 && s.leases.get(&p).is_none_or(|(n, _)| *n == a.node) {
                    s.leases.insert(p, (a.node.clone(), now + ORIGIN_LEASE));
                    origin.push(p);
                }
            }
        }
        s.index.insert(a.node.clone(), s.peers.len());
        s.peers.push(Peer { node: a.node, addr: a.addr, have: a.have, seen: now });
        Ok(Answer { peers, origin })
    }

    /// Who holds `digest`, for a node that does not know its piece count yet (an HTTP
    /// artifact's manifest comes from a peer that holds the whole).
    pub fn peek(&self, digest: Digest, rng: &mut impl Rng) -> Answer {
        let Some(s) = self.swarms.get(&digest) else { return Answer::default() };
        let peers = s
            .peers
            .iter()
            .choose_multiple(rng, MAX_ANSWER)
            .into_iter()
            .map(|p| PeerInfo { node: p.node.clone(), addr: p.addr.clone(), have: p.have.clone() })
            .collect();
        Answer { peers, origin: Vec::new() }
    }

    /// Drops nodes not heard from within [`PEER_TTL`] (and empty swarms); run every few
    /// seconds, not per announce.
    pub fn sweep(&mut self, now: Instant) {
        self.swarms.retain(|_, s| {
            let stale: Vec<String> =
                s.peers.iter().filter(|p| now.duration_since(p.seen) >= PEER_TTL).map(|p| p.node.clone()).collect();
            stale.iter().for_each(|n| s.remove(n));
            s.leases.retain(|_, (_, until)| *until > now);
            !s.peers.is_empty()
        });
    }

    /// (swarms, peers) followed now, for the metrics.
    pub fn size(&self) -> (usize, usize) {
        (self.swarms.len(), self.swarms.values().map(|s| s.peers.len()).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn ann(node: &str, have: &[u32], want_origin: u32) -> Announce {
        let mut b = Bitfield::new(8);
        have.iter().for_each(|i| b.set(*i));
        Announce { node: node.into(), addr: Some(format!("{node}:1")), have: b, want_origin, stopped: false }
    }

    #[test]
    fn each_piece_is_leased_from_the_origin_to_one_node_until_someone_holds_it() {
        let (mut t, d, mut rng, now) =
            (Tracker::default(), Digest([1; 32]), rand::rngs::StdRng::seed_from_u64(1), Instant::now());
        let a = t.announce(d, ann("a", &[], 5), now, &mut rng).unwrap();
        let b = t.announce(d, ann("b", &[], 5), now, &mut rng).unwrap();
        assert_eq!((a.origin.len(), b.origin.len()), (5, 3), "8 pieces, each leased once");
        assert!(a.origin.iter().all(|p| !b.origin.contains(p)));
        assert_eq!(b.peers.len(), 1, "b is told of a");
        // a got its pieces: they are no origin pieces any more, for anyone.
        let c = t.announce(d, ann("a", &a.origin, 8), now, &mut rng).unwrap();
        assert!(c.origin.is_empty(), "the rest are leased to b: {c:?}");
        // b's lease runs out without b holding its pieces: they go to whoever asks.
        let later = now + ORIGIN_LEASE + Duration::from_secs(1);
        let c = t.announce(d, ann("c", &[], 8), later, &mut rng).unwrap();
        assert_eq!(c.origin.len(), 3);
        assert_eq!(c.peers.len(), 2);
    }

    #[test]
    fn silent_and_stopped_nodes_leave_and_bad_announces_are_refused() {
        let (mut t, d, mut rng, now) =
            (Tracker::default(), Digest([2; 32]), rand::rngs::StdRng::seed_from_u64(2), Instant::now());
        t.announce(d, ann("a", &[0, 1], 0), now, &mut rng).unwrap();
        t.announce(d, ann("b", &[0], 0), now, &mut rng).unwrap();
        assert_eq!(t.size(), (1, 2));
        t.announce(d, Announce { stopped: true, ..ann("b", &[], 0) }, now, &mut rng).unwrap();
        assert_eq!(t.size(), (1, 1));
        t.sweep(now + PEER_TTL);
        assert_eq!(t.size(), (0, 0), "a went silent");
        t.announce(d, ann("a", &[], 0), now, &mut rng).unwrap();
        let wrong = Announce { have: Bitfield::new(9), ..ann("b", &[], 0) };
        assert_eq!(t.announce(d, wrong, now, &mut rng).unwrap_err(), TrackerError::Pieces { got: 9, want: 8 });
        // Holder counts follow a node's news: pieces only a departed node held go back to the origin.
        t.announce(d, ann("a", &[0, 1, 2, 3, 4, 5, 6, 7], 0), now, &mut rng).unwrap();
        t.announce(d, Announce { stopped: true, ..ann("a", &[], 0) }, now, &mut rng).unwrap();
        assert_eq!(t.announce(d, ann("z", &[], 8), now, &mut rng).unwrap().origin.len(), 8);
    }
}
