//! Telling a partition from deaths. When most of a failure domain falls silent at once,
//! its nodes are far likelier cut off (a switch, an uplink, the shard's own link) than
//! all dead. Declaring them Dead would have every scheduler replace the domain's work at
//! once, and run it twice when the link comes back. So a node whose domain is mostly
//! silent goes `Unknown` instead of `Dead`: schedulers wait `--unknown-grace` for it and
//! then repair at their limited rate, as Kubernetes' node lifecycle controller stops
//! evicting in a zone past its unhealthy-zone threshold. A node Unknown for the
//! retention period is declared Dead after all, so a domain that never returns is
//! given up.
//!
//! Nodes cut off together do not fall silent together: each was last heard at its own
//! point of the heartbeat cycle, and one whose last heartbeat came late was last heard
//! up to an interval earlier than the rest. With the default timeouts (Suspect after
//! 2 s, Dead after 3 s) it is due to be Dead before its peers are even Suspect, and,
//! Dead, it leaves too few nodes to call the rest a partition. So a node due to be Dead
//! waits for its peers ([`DomainSilence::peers_may_follow`]) when another node of its
//! domain is silent, or when nobody in its domain has been heard for a heartbeat
//! interval (the domain's clock, `NodeLive::domain_heard_ms`): with two or more peers
//! heartbeating, a domain is that quiet only when they are cut off too, or now and then
//! when their heartbeats fall in phase and come late, which costs a lone dead node
//! 2.5 s more before it is Dead.
//!
//! A partition ends when the link comes back, but its nodes do not all come back at that
//! moment: an agent whose QUIC connection timed out meanwhile registers again only at its
//! next try (jittered back-off of up to 15 s). Once most of the domain is heard again the
//! rest are no partition by the count, yet they were cut off, not dead: a node still
//! Unknown gets [`REJOIN_MS`] from the heal to register before it is declared Dead
//! ([`DomainSilence::rejoin_until`]); a node that died during the partition is Dead that
//! much later.
//!
//! Counting costs O(1) per status change: the applier reports each node's published
//! status change ([`DomainSilence::published`]) and each silence it decides before the
//! next publish ([`DomainSilence::fell_silent`]), so nodes that fall silent in the same
//! timer tick already count for each other.

use std::collections::HashMap;

use flotilla_core::NodeStatus;

use crate::liveness::{HEARTBEAT_INTERVAL_MS, is_silent as silent};

/// Domains smaller than this never count as partitioned: one or two silent nodes are
/// judged one by one.
pub const MIN_NODES: u32 = 3;

/// The fraction of a domain's nodes that must be silent (Suspect or Unknown) for it to
/// count as cut off; Kubernetes' `--unhealthy-zone-threshold` default.
pub const DEFAULT_THRESHOLD: f64 = 0.55;

/// How long after its domain was heard again a node still Unknown may take to register:
/// the agents' longest registration back-off (10 s, jittered by half: `flotilla_agent`'s
/// loop) and a handshake, with room; the schedulers allow a restarted shard's agents as
/// long (`flotilla_scheduler::repair::REJOIN_GRACE_MS`).
pub const REJOIN_MS: u64 = 30_000;

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Count {
    /// Nodes not Dead.
    nodes: u32,
    /// Of those, Suspect or Unknown.
    silent: u32,
}

#[derive(Debug)]
pub struct DomainSilence {
    threshold: f64,
    counted: HashMap<String, Count>,
    /// Silences decided since the last publish, by domain.
    pending: HashMap<String, u32>,
    /// When each domain stopped counting as partitioned (Unix ms), until it is again.
    healed: HashMap<String, u64>,
}

impl DomainSilence {
    /// `threshold` above 1 turns the rule off.
    pub fn new(threshold: f64) -> DomainSilence {
        DomainSilence { threshold, counted: HashMap::new(), pending: HashMap::new(), healed: HashMap::new() }
    }

    /// A node's published status went from `from` to `to` (`None`: not in the view) at
    /// `now` (Unix ms).
    pub fn published(&mut self, from: Option<(&str, NodeStatus)>, to: Option<(&str, NodeStatus)>, now: u64) {
        let from = from.filter(|(_, s)| *s != NodeStatus::Dead);
        let to = to.filter(|(_, s)| *s != NodeStatus::Dead);
        // A heal is a silent node heard again that makes its domain no longer count as
        // partitioned; not a silent node going Dead or leaving, which shrinks the count too.
        let heard_again = matches!((from, to), (Some((_, f)), Some((_, t))) if silent(f) && !silent(t));
        let was = to.map(|(domain, _)| self.partitioned_by_count(domain));
        if let Some((domain, s)) = from
            && let Some(c) = self.counted.get_mut(domain)
        {
            c.nodes = c.nodes.saturating_sub(1);
            c.silent = c.silent.saturating_sub(u32::from(silent(s)));
            if c.nodes == 0 {
                self.counted.remove(domain);
                self.healed.remove(domain);
            }
        }
        if let Some((domain, s)) = to {
            let c = self.counted.entry(domain.to_string()).or_default();
            c.nodes += 1;
            c.silent += u32::from(silent(s));
            match (was, self.partitioned_by_count(domain)) {
                (Some(true), false) if heard_again => {
                    self.healed.insert(domain.to_string(), now);
                }
                (_, true) => {
                    self.healed.remove(domain);
                }
                _ => {}
            }
        }
    }

    /// Until when a node of `domain` still Unknown waits to register before it may be
    /// declared Dead: [`REJOIN_MS`] after the domain stopped counting as partitioned, if
    /// that is after `now`.
    pub fn rejoin_until(&self, domain: &str, now: u64) -> Option<u64> {
        let until = self.healed.get(domain)?.saturating_add(REJOIN_MS);
        (now < until).then_some(until)
    }

    /// A node of `domain` was just made Suspect or Unknown, not yet published.
    pub fn fell_silent(&mut self, domain: &str) {
        *self.pending.entry(domain.to_string()).or_default() += 1;
    }

    /// A version was published: what was pending is in the counts now.
    pub fn flushed(&mut self) {
        self.pending.clear();
    }

    /// Whether another node of `domain` besides the one asking (silent itself) is
    /// silent: a partition may be starting.
    fn others_silent(&self, domain: &str) -> bool {
        let Some(c) = self.counted.get(domain) else { return false };
        c.silent + self.pending.get(domain).copied().unwrap_or(0) >= 2
    }

    /// Whether a node of `domain` due to be Dead should first wait for its peers
    /// (`liveness::wait_for_peers`): another node of the domain is silent (`silent`:
    /// whether the asking node is), or the domain, of `MIN_NODES` or more, has heard
    /// from none of its nodes for `quiet_ms`, a heartbeat interval or more.
    pub fn peers_may_follow(&self, domain: &str, silent: bool, quiet_ms: u64) -> bool {
        let Some(c) = self.counted.get(domain) else { return false };
        (silent && self.others_silent(domain)) || (c.nodes >= MIN_NODES && quiet_ms >= HEARTBEAT_INTERVAL_MS)
    }

    /// Whether `domain` is mostly silent: its silent nodes should go Unknown, not Dead.
    pub fn partitioned(&self, domain: &str) -> bool {
        self.mostly_silent(domain, self.pending.get(domain).copied().unwrap_or(0))
    }

    /// [`DomainSilence::partitioned`] by the published statuses alone: while a version is
    /// being published, the silences pending for it are counted there already.
    fn partitioned_by_count(&self, domain: &str) -> bool {
        self.mostly_silent(domain, 0)
    }

    fn mostly_silent(&self, domain: &str, pending: u32) -> bool {
        let Some(c) = self.counted.get(domain) else { return false };
        let silent = c.silent + pending;
        c.nodes >= MIN_NODES && f64::from(silent.min(c.nodes)) >= self.threshold * f64::from(c.nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeStatus::*;

    fn domain(s: &mut DomainSilence, name: &str, statuses: &[NodeStatus]) {
        for st in statuses {
            s.published(None, Some((name, *st)), 0);
        }
    }

    #[test]
    fn a_mostly_silent_domain_is_partitioned_and_a_few_silent_nodes_are_not() {
        let mut s = DomainSilence::new(DEFAULT_THRESHOLD);
        domain(&mut s, "a", &[Alive, Alive, Suspect, Suspect]);
        assert!(!s.partitioned("a"), "2 of 4 is below 55 %");
        s.published(Some(("a", Alive)), Some(("a", Suspect)), 0);
        assert!(s.partitioned("a"), "3 of 4");
        // Heard again: no longer.
        s.published(Some(("a", Suspect)), Some(("a", Alive)), 0);
        s.published(Some(("a", Suspect)), Some(("a", Alive)), 0);
        assert!(!s.partitioned("a"));
        assert!(!s.partitioned("nowhere"));
    }

    #[test]
    fn small_domains_are_judged_node_by_node() {
        let mut s = DomainSilence::new(DEFAULT_THRESHOLD);
        domain(&mut s, "pair", &[Suspect, Suspect]);
        assert!(!s.partitioned("pair"));
        domain(&mut s, "three", &[Suspect, Unknown, Suspect]);
        assert!(s.partitioned("three"));
    }

    #[test]
    fn dead_and_departed_nodes_leave_the_count() {
        let mut s = DomainSilence::new(DEFAULT_THRESHOLD);
        domain(&mut s, "a", &[Alive, Alive, Alive, Suspect]);
        // Two die one by one: the rest are 2 nodes, too few to call a partition.
        s.published(Some(("a", Suspect)), Some(("a", Dead)), 0);
        s.published(Some(("a", Alive)), Some(("a", Dead)), 0);
        assert!(!s.partitioned("a"));
        s.published(Some(("a", Dead)), None, 0);
        s.published(Some(("a", Alive)), None, 0);
        s.published(Some(("a", Alive)), None, 0);
        assert!(s.counted.is_empty(), "{:?}", s.counted);
    }

    #[test]
    fn silences_decided_before_a_publish_count_at_once() {
        let mut s = DomainSilence::new(DEFAULT_THRESHOLD);
        domain(&mut s, "a", &[Alive, Alive, Suspect]);
        assert!(!s.partitioned("a"));
        s.fell_silent("a");
        assert!(s.partitioned("a"), "2 of 3 with the one made Suspect this tick");
        s.flushed();
        assert!(!s.partitioned("a"), "the publish recounts it");
    }

    #[test]
    fn a_node_due_to_be_dead_waits_for_peers_that_are_silent_or_quiet() {
        let mut s = DomainSilence::new(DEFAULT_THRESHOLD);
        domain(&mut s, "a", &[Suspect, Alive, Alive]);
        assert!(!s.peers_may_follow("a", true, 300), "its peers were heard lately: it alone is gone");
        assert!(
            s.peers_may_follow("a", true, HEARTBEAT_INTERVAL_MS),
            "nobody heard for an interval: cut off together?"
        );
        s.published(Some(("a", Alive)), Some(("a", Suspect)), 0);
        assert!(s.peers_may_follow("a", true, 0), "a peer is silent too");
        domain(&mut s, "pair", &[Suspect, Alive]);
        assert!(!s.peers_may_follow("pair", true, 10_000), "too small to tell a partition");
        assert!(!s.peers_may_follow("nowhere", true, 10_000));
    }

    #[test]
    fn a_healed_domains_nodes_still_unknown_wait_to_register_again() {
        let mut s = DomainSilence::new(DEFAULT_THRESHOLD);
        domain(&mut s, "a", &[Unknown, Unknown, Unknown]);
        assert!(s.partitioned("a"));
        assert_eq!(s.rejoin_until("a", 1_000), None, "partitioned: the cut-off rule applies");
        // Two register again at 50 s; the third is still away.
        s.published(Some(("a", Unknown)), Some(("a", Alive)), 50_000);
        assert!(s.partitioned("a"), "2 of 3 silent");
        s.published(Some(("a", Unknown)), Some(("a", Alive)), 50_500);
        assert!(!s.partitioned("a"));
        assert_eq!(s.rejoin_until("a", 51_000), Some(50_500 + REJOIN_MS));
        assert_eq!(s.rejoin_until("a", 50_500 + REJOIN_MS), None, "given up after the window");
        // Cut off again: the window is gone until the next heal.
        s.published(Some(("a", Alive)), Some(("a", Unknown)), 60_000);
        assert!(s.partitioned("a"));
        assert_eq!(s.rejoin_until("a", 60_000), None);
        // A domain that never was partitioned has no window.
        domain(&mut s, "b", &[Alive, Alive, Suspect]);
        assert_eq!(s.rejoin_until("b", 0), None);
        // Nodes of a cut-off domain going Dead after retention are no heal: the rest wait
        // out their own retention.
        domain(&mut s, "c", &[Unknown, Unknown, Unknown]);
        s.published(Some(("c", Unknown)), Some(("c", Dead)), 70_000);
        assert!(!s.partitioned("c"), "2 nodes left: too few to count");
        assert_eq!(s.rejoin_until("c", 70_000), None);
    }

    #[test]
    fn silences_pending_in_the_version_being_published_do_not_hide_a_heal() {
        let mut s = DomainSilence::new(DEFAULT_THRESHOLD);
        domain(&mut s, "a", &[Unknown, Unknown, Unknown, Alive, Alive]);
        assert!(s.partitioned("a"), "3 of 5");
        // One tick: a fourth node falls silent (pending), and two silent ones are heard
        // again; the publish carries all three.
        s.fell_silent("a");
        s.published(Some(("a", Alive)), Some(("a", Suspect)), 1_000);
        s.published(Some(("a", Unknown)), Some(("a", Alive)), 1_000);
        s.published(Some(("a", Unknown)), Some(("a", Alive)), 1_000);
        s.flushed();
        assert!(!s.partitioned("a"), "2 of 5");
        assert_eq!(s.rejoin_until("a", 1_000), Some(1_000 + REJOIN_MS));
    }

    #[test]
    fn a_threshold_above_one_turns_it_off() {
        let mut s = DomainSilence::new(1.1);
        domain(&mut s, "a", &[Suspect, Suspect, Suspect]);
        assert!(!s.partitioned("a"));
    }
}
