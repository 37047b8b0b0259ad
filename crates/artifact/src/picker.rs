//! Which piece to ask for next, and from whom: rarest first (so the swarm's last copy of
//! a piece is spread before it is lost, and no piece becomes the one everybody waits
//! for), then an endgame that asks a second peer for pieces still in flight, so one slow
//! peer does not hold back the last percent. Pure; the fetcher owns the sockets.

use std::collections::{BTreeMap, HashMap, HashSet};

use rand::Rng;

use crate::bitfield::Bitfield;

/// A piece is asked of at most this many peers at once (in the endgame).
const MAX_DUPLICATES: usize = 2;

#[derive(Debug, Clone)]
pub struct Picker {
    have: Bitfield,
    /// How many known peers hold each piece.
    avail: Vec<u32>,
    peers: BTreeMap<String, Bitfield>,
    /// Who each piece is asked of now.
    inflight: HashMap<u32, Vec<String>>,
    load: HashMap<String, usize>,
    /// Peers that answered busy: not asked for a moment, but what they hold is kept.
    resting: HashSet<String>,
}

impl Picker {
    pub fn new(have: Bitfield) -> Picker {
        let avail = vec![0; have.len() as usize];
        Picker {
            have,
            avail,
            peers: BTreeMap::new(),
            inflight: HashMap::new(),
            load: HashMap::new(),
            resting: HashSet::new(),
        }
    }

    pub fn have(&self) -> &Bitfield {
        &self.have
    }

    pub fn is_complete(&self) -> bool {
        self.have.is_full()
    }

    /// What peers hold now (a tracker's answer). Peers not named keep what was known of
    /// them, so one sampled answer does not forget the rest.
    pub fn learn(&mut self, node: &str, have: Bitfield) {
        if have.len() != self.have.len() {
            return;
        }
        if let Some(old) = self.peers.get(node) {
            old.ones().for_each(|i| self.avail[i as usize] = self.avail[i as usize].saturating_sub(1));
        }
        have.ones().for_each(|i| self.avail[i as usize] += 1);
        self.peers.insert(node.to_string(), have);
    }

    /// One piece a peer now holds (its HAVE), between tracker answers.
    pub fn learn_one(&mut self, node: &str, piece: u32) {
        if piece >= self.have.len() {
            return;
        }
        let bits = self.peers.entry(node.to_string()).or_insert_with(|| Bitfield::new(self.have.len()));
        if !bits.get(piece) {
            bits.set(piece);
            self.avail[piece as usize] += 1;
        }
    }

    /// A peer that went away or was banned: nothing more is asked of it.
    pub fn forget(&mut self, node: &str) {
        if let Some(old) = self.peers.remove(node) {
            old.ones().for_each(|i| self.avail[i as usize] = self.avail[i as usize].saturating_sub(1));
        }
    }

    /// A peer that answered busy is not asked again until [`Picker::wake`].
    pub fn rest(&mut self, node: &str) {
        self.resting.insert(node.to_string());
    }

    pub fn wake(&mut self, node: &str) {
        self.resting.remove(node);
    }

    /// Peers known to hold anything this node lacks.
    pub fn useful_peers(&self) -> impl Iterator<Item = &str> {
        self.peers.iter().filter(|(_, b)| b.ones().any(|i| !self.have.get(i))).map(|(n, _)| n.as_str())
    }

    /// The next (piece, peer) to ask, counting it as in flight; `None` when every peer
    /// that could help has `max_per_peer` requests out, or no peer holds what is missing.
    pub fn next(&mut self, max_per_peer: usize, rng: &mut impl Rng) -> Option<(u32, String)> {
        let resting = &self.resting;
        let free = |peer: &str, load: &HashMap<String, usize>| {
            load.get(peer).copied().unwrap_or(0) < max_per_peer && !resting.contains(peer)
        };
        // Rarest first among pieces nobody is asked for yet.
        let mut best: Option<(u32, u32)> = None;
        let mut ties = 0u32;
        for i in 0..self.have.len() {
            let a = self.avail[i as usize];
            if a == 0 || self.have.get(i) || self.inflight.contains_key(&i) {
                continue;
            }
            if !self.peers.iter().any(|(n, b)| b.get(i) && free(n, &self.load)) {
                continue;
            }
            match best {
                Some((_, ba)) if a > ba => {}
                Some((_, ba)) if a == ba => {
                    // Reservoir sampling: an even chance among the rarest.
                    ties += 1;
                    if rng.random_range(0..ties) == 0 {
                        best = Some((i, a));
                    }
                }
                _ => {
                    best = Some((i, a));
                    ties = 1;
                }
            }
        }
        let piece = match best {
            Some((i, _)) => i,
            // Endgame: every missing piece is in flight; ask a second peer for one. (Not
            // before: a piece no known peer holds yet is coming, and duplicates cost.)
            None if (0..self.have.len()).any(|i| !self.have.get(i) && !self.inflight.contains_key(&i)) => return None,
            None => {
                let mut asked: Vec<(&u32, &Vec<String>)> =
                    self.inflight.iter().filter(|(_, who)| who.len() < MAX_DUPLICATES).collect();
                // (A claimed piece has no one in `who`: the origin is its first asker.)
                asked.sort_by_key(|(i, who)| (who.len(), **i));
                let pick = asked.into_iter().find(|(i, who)| {
                    self.peers.iter().any(|(n, b)| b.get(**i) && !who.contains(n) && free(n, &self.load))
                })?;
                *pick.0
            }
        };
        let already = self.inflight.get(&piece).cloned().unwrap_or_default();
        let mut holders: Vec<&String> = self
            .peers
            .iter()
            .filter(|(n, b)| b.get(piece) && !already.contains(n) && free(n, &self.load))
            .map(|(n, _)| n)
            .collect();
        // The least loaded holder, at random among equals.
        let least = holders.iter().map(|n| self.load.get(*n).copied().unwrap_or(0)).min()?;
        holders.retain(|n| self.load.get(*n).copied().unwrap_or(0) == least);
        let peer = holders[rng.random_range(0..holders.len())].clone();
        *self.load.entry(peer.clone()).or_default() += 1;
        self.inflight.entry(piece).or_default().push(peer.clone());
        Some((piece, peer))
    }

    /// A piece being read from the origin: not asked of peers too (but for the endgame).
    pub fn claim(&mut self, piece: u32) {
        self.inflight.entry(piece).or_default();
    }

    /// A claimed piece whose origin read failed: peers may be asked for it again.
    pub fn unclaim(&mut self, piece: u32) {
        if self.inflight.get(&piece).is_some_and(Vec::is_empty) {
            self.inflight.remove(&piece);
        }
    }

    /// A piece this node read another way (the origin), or after a restart.
    pub fn got(&mut self, piece: u32) {
        self.have.set(piece);
        // Requests still out for it count against their peers until they answer.
        self.inflight.remove(&piece);
    }

    /// The answer to a request `next` handed out: `ok` (the piece arrived and verified)
    /// or not. Returns the other peers still asked for the piece (the caller may cancel).
    pub fn finished(&mut self, piece: u32, peer: &str, ok: bool) -> Vec<String> {
        if let Some(l) = self.load.get_mut(peer) {
            *l = l.saturating_sub(1);
        }
        let Some(who) = self.inflight.get_mut(&piece) else { return Vec::new() };
        who.retain(|n| n != peer);
        if ok {
            self.have.set(piece);
            // The others' loads go when their answers come (each answer calls this).
            return self.inflight.remove(&piece).unwrap_or_default();
        }
        if who.is_empty() {
            self.inflight.remove(&piece);
        }
        Vec::new()
    }

    pub fn in_flight(&self) -> usize {
        self.load.values().sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    fn bits(len: u32, on: &[u32]) -> Bitfield {
        let mut b = Bitfield::new(len);
        on.iter().for_each(|i| b.set(*i));
        b
    }

    #[test]
    fn the_rarest_piece_goes_first_to_the_least_loaded_holder() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut p = Picker::new(Bitfield::new(4));
        p.learn("a", bits(4, &[0, 1, 2]));
        p.learn("b", bits(4, &[0, 1]));
        p.learn("c", bits(4, &[0]));
        assert_eq!(p.next(4, &mut rng), Some((2, "a".into())), "piece 2: one holder");
        let (piece, peer) = p.next(4, &mut rng).unwrap();
        assert_eq!((piece, peer.as_str()), (1, "b"), "piece 1 (two holders), from b: a is busy");
        assert_eq!(p.next(4, &mut rng), Some((0, "c".into())));
        assert!(p.useful_peers().count() == 3);
        assert_eq!(p.finished(2, "a", true), Vec::<String>::new());
        assert!(p.have().get(2) && p.in_flight() == 2);

        // A busy peer rests, and keeps what it holds for when it wakes.
        let mut p = Picker::new(Bitfield::new(2));
        p.learn("a", bits(2, &[0, 1]));
        p.rest("a");
        assert_eq!(p.next(4, &mut rng), None);
        p.wake("a");
        assert!(p.next(4, &mut rng).is_some());
    }

    #[test]
    fn the_endgame_asks_a_second_peer_and_a_failure_frees_the_piece() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let mut p = Picker::new(bits(2, &[0]));
        p.learn("a", bits(2, &[0, 1]));
        p.learn("b", bits(2, &[1]));
        let first = p.next(1, &mut rng).unwrap();
        let second = p.next(1, &mut rng).unwrap();
        assert_eq!((first.0, second.0), (1, 1), "the last piece, asked twice");
        assert_ne!(first.1, second.1);
        assert_eq!(p.next(1, &mut rng), None, "both peers are at their limit");
        assert_eq!(p.finished(1, &first.1, true), vec![second.1.clone()], "the other request is moot");
        assert!(p.is_complete() && p.in_flight() == 1, "until its answer comes");
        p.finished(1, &second.1, true);
        assert_eq!(p.in_flight(), 0);

        // A piece read from the origin is not asked of peers until the endgame.
        let mut p = Picker::new(Bitfield::new(2));
        p.learn("a", bits(2, &[0, 1]));
        p.claim(0);
        assert_eq!(p.next(1, &mut rng), Some((1, "a".into())));
        p.finished(1, "a", true);
        assert_eq!(p.next(1, &mut rng), Some((0, "a".into())), "the endgame asks a peer for it too");
        p.got(0);
        p.finished(0, "a", true);
        assert!(p.is_complete() && p.in_flight() == 0);

        let mut p = Picker::new(Bitfield::new(1));
        p.learn("a", bits(1, &[0]));
        assert_eq!(p.next(1, &mut rng), Some((0, "a".into())));
        p.finished(0, "a", false);
        p.forget("a");
        assert_eq!(p.next(1, &mut rng), None, "a banned peer is not asked again");
        p.learn_one("b", 0);
        p.learn_one("b", 5);
        assert_eq!(p.next(1, &mut rng), Some((0, "b".into())), "a HAVE is enough to be asked");
    }
}
