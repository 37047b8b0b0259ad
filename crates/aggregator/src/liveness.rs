//! Failure detection as pure logic: what a node's status becomes at a given time,
//! and a timing wheel that holds one deadline per node in ~100 ms buckets, so the
//! timer only ever looks at nodes whose deadline has come (never an O(nodes) scan).

use flotilla_core::NodeStatus;

/// How long silence may last before each transition, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    pub suspect_after_ms: u64,
    pub dead_after_ms: u64,
    /// How long a Dead node stays in the view before it is forgotten.
    pub retention_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts { suspect_after_ms: 2000, dead_after_ms: 3000, retention_ms: 60_000 }
    }
}

/// What the timer does with a node whose deadline has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing changes; look again at `check_at`.
    Keep { check_at: u64 },
    /// Move to `to` and look again at `check_at`.
    Transition { to: NodeStatus, check_at: u64 },
    /// Forget the node.
    Remove,
}

/// The heartbeat interval the shard gives agents at registration.
pub const HEARTBEAT_INTERVAL_MS: u64 = 1000;

/// How much longer a node whose link loses heartbeats may be silent before it is
/// Suspect (and Dead): two and a half of the agents' 1 s heartbeats. Without it, one
/// lost datagram and a little jitter make a node Suspect (and drop it from the routes)
/// every few seconds on a link that loses 10 %; with it, that takes four in a row.
pub const LOSSY_GRACE_MS: u64 = 2500;

/// A node due to be Dead while its domain may be going silent with it waits this much
/// longer (once), so that peers going silent with it, whose own deadlines come later
/// (their loss grace, heartbeat jitter), show whether this is a partition (`silence`).
pub const PEER_WAIT_MS: u64 = LOSSY_GRACE_MS;

/// `record_loss`'s count, in 1/256ths of a heartbeat, from which a link is lossy: a loss
/// in the last minute or so (a quarter of it is left after 88 heartbeats).
const LOSSY_FROM: u16 = 64;

/// The decaying count of a node's lost heartbeats after one arrives with `lost` missing
/// before it: each arrival keeps 63/64 of the count. A run of lost heartbeats counts as
/// one loss, so a link that lost many at once (an outage, a partition) is lossy for
/// about as long as one that lost one: a minute or so.
pub fn record_loss(count: u16, lost: u64) -> u16 {
    let kept = count - count.div_ceil(64);
    kept.saturating_add(256 * lost.min(1) as u16)
}

/// When a node due to be Dead while peers are silent too is looked at again
/// (`PEER_WAIT_MS` past its deadline), or `None` once that has passed.
pub fn wait_for_peers(last_seen: u64, grace_ms: u64, now: u64, t: &Timeouts) -> Option<Verdict> {
    let again = last_seen.saturating_add(grace_ms).saturating_add(t.dead_after_ms).saturating_add(PEER_WAIT_MS);
    (now < again).then_some(Verdict::Keep { check_at: again })
}

/// The extra silence a node with `loss` (`record_loss`'s count) is allowed.
pub fn loss_grace_ms(loss: u16) -> u64 {
    if loss >= LOSSY_FROM { LOSSY_GRACE_MS } else { 0 }
}

/// The status a node should have at `now`, given when it was last heard from, allowing
/// `grace_ms` more silence than the timeouts (`loss_grace_ms`).
pub fn evaluate(
    status: NodeStatus,
    last_seen: u64,
    status_since: u64,
    now: u64,
    t: &Timeouts,
    grace_ms: u64,
) -> Verdict {
    let last_seen = last_seen.saturating_add(grace_ms);
    let suspect_at = last_seen.saturating_add(t.suspect_after_ms);
    let dead_at = last_seen.saturating_add(t.dead_after_ms);
    let dead = Verdict::Transition { to: NodeStatus::Dead, check_at: now.saturating_add(t.retention_ms) };
    match status {
        NodeStatus::Alive | NodeStatus::Unknown => {
            if now >= dead_at {
                dead
            } else if now >= suspect_at {
                Verdict::Transition { to: NodeStatus::Suspect, check_at: dead_at }
            } else {
                Verdict::Keep { check_at: suspect_at }
            }
        }
        NodeStatus::Suspect => {
            if now >= dead_at {
                dead
            } else if now < suspect_at {
                Verdict::Keep { check_at: suspect_at }
            } else {
                Verdict::Keep { check_at: dead_at }
            }
        }
        // A draining node stays Draining while it heartbeats; once it is gone it is Dead.
        NodeStatus::Draining => {
            if now >= dead_at {
                dead
            } else {
                Verdict::Keep { check_at: dead_at }
            }
        }
        NodeStatus::Dead => {
            let forget_at = status_since.saturating_add(t.retention_ms);
            if now >= forget_at { Verdict::Remove } else { Verdict::Keep { check_at: forget_at } }
        }
    }
}

/// Whether `status` is a node not heard from lately.
pub fn is_silent(status: NodeStatus) -> bool {
    matches!(status, NodeStatus::Suspect | NodeStatus::Unknown)
}

/// The verdict for a node due to go Dead while most of its domain is silent (a likely
/// partition, `crate::silence`): Unknown, looked at again every `suspect_after`, and
/// Dead only once it has been Unknown for the retention period.
pub fn cut_off(status: NodeStatus, status_since: u64, now: u64, t: &Timeouts) -> Verdict {
    let again = now.saturating_add(t.suspect_after_ms);
    match status {
        NodeStatus::Unknown if now >= status_since.saturating_add(t.retention_ms) => {
            Verdict::Transition { to: NodeStatus::Dead, check_at: now.saturating_add(t.retention_ms) }
        }
        NodeStatus::Unknown => Verdict::Keep { check_at: again },
        // Leaving on purpose: its silence is no partition.
        NodeStatus::Draining | NodeStatus::Dead => {
            Verdict::Transition { to: NodeStatus::Dead, check_at: now.saturating_add(t.retention_ms) }
        }
        NodeStatus::Alive | NodeStatus::Suspect => Verdict::Transition { to: NodeStatus::Unknown, check_at: again },
    }
}

/// A hashed timing wheel of session ids. Each node has at most one entry; an entry
/// beyond one turn of the wheel simply waits for a later turn.
pub struct Wheel {
    slot_ms: u64,
    /// The tick (`ms / slot_ms`) deadlines count from, so one fits in 32 bits.
    origin: u64,
    slots: Vec<Vec<Entry>>,
    /// Start of the oldest slot that may still hold due entries.
    cursor_ms: u64,
}

/// One scheduled session: 12 bytes, not the 16 of `(u64, u64)`, since a shard holds
/// one per node (BENCHMARKS.md, issue #19). The deadline is in whole ticks from the
/// wheel's origin, rounded up: an entry never fires before its deadline, and 32 bits
/// of 100 ms ticks last 13 years.
#[derive(Clone, Copy)]
#[repr(C, packed(4))]
struct Entry {
    session: u64,
    due_tick: u32,
}

impl Wheel {
    pub fn new(slot_ms: u64, slots: usize, now_ms: u64) -> Self {
        let slot_ms = slot_ms.max(1);
        Wheel {
            slot_ms,
            origin: now_ms / slot_ms,
            slots: vec![Vec::new(); slots.max(1)],
            cursor_ms: now_ms - now_ms % slot_ms,
        }
    }

    fn index(&self, t: u64) -> usize {
        ((t / self.slot_ms) % self.slots.len() as u64) as usize
    }

    pub fn schedule(&mut self, session: u64, deadline_ms: u64) {
        // Never schedule into a slot that has already been passed this turn.
        let at = deadline_ms.max(self.cursor_ms);
        let i = self.index(at);
        let tick = deadline_ms.div_ceil(self.slot_ms).saturating_sub(self.origin);
        self.slots[i].push(Entry { session, due_tick: u32::try_from(tick).unwrap_or(u32::MAX) });
    }

    /// Removes and returns every session whose deadline is at or before `now_ms`.
    pub fn expire(&mut self, now_ms: u64, out: &mut Vec<u64>) {
        let turns = self.slots.len() as u64;
        let now_tick = (now_ms / self.slot_ms).saturating_sub(self.origin);
        let mut t = self.cursor_ms;
        let mut visited = 0;
        while t <= now_ms && visited < turns {
            let i = self.index(t);
            let slot = &mut self.slots[i];
            let mut k = 0;
            while k < slot.len() {
                if u64::from(slot[k].due_tick) <= now_tick {
                    out.push(slot.swap_remove(k).session);
                } else {
                    k += 1;
                }
            }
            t += self.slot_ms;
            visited += 1;
        }
        // The current slot is visited again next time: it may hold entries due later in it.
        // After a long pause (more than a turn) every slot was visited once, which is enough.
        self.cursor_ms = now_ms - now_ms % self.slot_ms;
    }

    /// Entries still scheduled (the tests' view of the wheel).
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.slots.iter().map(Vec::len).sum()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use NodeStatus::*;

    const T: Timeouts = Timeouts { suspect_after_ms: 2000, dead_after_ms: 3000, retention_ms: 10_000 };

    #[test]
    fn alive_goes_suspect_then_dead_then_away() {
        assert_eq!(evaluate(Alive, 1000, 0, 2999, &T, 0), Verdict::Keep { check_at: 3000 });
        assert_eq!(evaluate(Alive, 1000, 0, 3000, &T, 0), Verdict::Transition { to: Suspect, check_at: 4000 });
        assert_eq!(evaluate(Suspect, 1000, 3000, 4000, &T, 0), Verdict::Transition { to: Dead, check_at: 14_000 });
        assert_eq!(evaluate(Dead, 1000, 4000, 13_999, &T, 0), Verdict::Keep { check_at: 14_000 });
        assert_eq!(evaluate(Dead, 1000, 4000, 14_000, &T, 0), Verdict::Remove);
    }

    #[test]
    fn in_a_silent_domain_a_node_goes_unknown_and_dead_only_after_retention() {
        assert_eq!(cut_off(Suspect, 3000, 4000, &T), Verdict::Transition { to: Unknown, check_at: 6000 });
        assert_eq!(cut_off(Alive, 0, 5000, &T), Verdict::Transition { to: Unknown, check_at: 7000 });
        assert_eq!(cut_off(Unknown, 4000, 13_999, &T), Verdict::Keep { check_at: 15_999 });
        assert_eq!(cut_off(Unknown, 4000, 14_000, &T), Verdict::Transition { to: Dead, check_at: 24_000 });
        assert_eq!(cut_off(Draining, 0, 5000, &T), Verdict::Transition { to: Dead, check_at: 15_000 });
    }

    #[test]
    fn a_link_that_loses_heartbeats_earns_more_silence_and_forgets_it_in_time() {
        assert_eq!(loss_grace_ms(record_loss(0, 0)), 0);
        let once = record_loss(0, 1);
        assert_eq!(loss_grace_ms(once), LOSSY_GRACE_MS, "one lost heartbeat");
        // A Suspect-after of 2 s becomes 4.5 s, Dead-after 3 s becomes 5.5 s.
        assert_eq!(evaluate(Alive, 1000, 0, 3000, &T, LOSSY_GRACE_MS), Verdict::Keep { check_at: 5500 });
        assert_eq!(
            evaluate(Alive, 1000, 0, 5500, &T, LOSSY_GRACE_MS),
            Verdict::Transition { to: Suspect, check_at: 6500 }
        );
        // Still lossy a minute later; trusted again two minutes later.
        let mut l = once;
        for _ in 0..60 {
            l = record_loss(l, 0);
        }
        assert_eq!(loss_grace_ms(l), LOSSY_GRACE_MS, "{l}");
        for _ in 0..60 {
            l = record_loss(l, 0);
        }
        assert_eq!(loss_grace_ms(l), 0, "{l}");
        // A run of losses counts once; losses at every arrival level off far below u16::MAX.
        assert_eq!(record_loss(0, 1000), 256);
        let worst = (0..10_000).fold(0, |l, _| record_loss(l, 1));
        assert!(worst <= 256 * 64, "{worst}");
    }

    #[test]
    fn a_node_due_dead_beside_silent_peers_is_looked_at_again_once() {
        // Heard at 1000: due Dead at 4000; looked at again at 6500, then no more waiting.
        assert_eq!(wait_for_peers(1000, 0, 4000, &T), Some(Verdict::Keep { check_at: 6500 }));
        assert_eq!(wait_for_peers(1000, 0, 6500, &T), None);
        assert_eq!(wait_for_peers(1000, LOSSY_GRACE_MS, 6500, &T), Some(Verdict::Keep { check_at: 9000 }));
    }

    #[test]
    fn a_late_timer_goes_straight_to_dead() {
        assert_eq!(evaluate(Alive, 0, 0, 5000, &T, 0), Verdict::Transition { to: Dead, check_at: 15_000 });
    }

    #[test]
    fn heartbeats_push_deadlines_back() {
        // Deadline was for last_seen=0 but a heartbeat at 1500 came in meanwhile.
        assert_eq!(evaluate(Alive, 1500, 0, 2000, &T, 0), Verdict::Keep { check_at: 3500 });
        assert_eq!(evaluate(Suspect, 2500, 0, 3000, &T, 0), Verdict::Keep { check_at: 4500 });
    }

    #[test]
    fn draining_stays_until_silent() {
        assert_eq!(evaluate(Draining, 1000, 1000, 3500, &T, 0), Verdict::Keep { check_at: 4000 });
        assert_eq!(evaluate(Draining, 1000, 1000, 4000, &T, 0), Verdict::Transition { to: Dead, check_at: 14_000 });
    }

    #[test]
    fn wheel_fires_each_entry_once_when_due() {
        assert_eq!(std::mem::size_of::<Entry>(), 12);
        let mut w = Wheel::new(100, 16, 0);
        w.schedule(1, 250);
        w.schedule(2, 1000);
        w.schedule(3, 5_000); // beyond one turn (1.6 s)
        let mut out = Vec::new();
        w.expire(200, &mut out);
        assert!(out.is_empty());
        w.expire(300, &mut out);
        assert_eq!(out, vec![1]);
        out.clear();
        for t in (400..=4900).step_by(100) {
            w.expire(t, &mut out);
        }
        assert_eq!(out, vec![2]);
        out.clear();
        w.expire(5000, &mut out);
        assert_eq!(out, vec![3]);
        assert!(w.is_empty());
    }

    #[test]
    fn wheel_catches_up_after_a_long_pause() {
        let mut w = Wheel::new(100, 8, 0);
        for s in 0..20 {
            w.schedule(s, 100 + s * 37);
        }
        let mut out = Vec::new();
        w.expire(10_000, &mut out);
        out.sort();
        assert_eq!(out, (0..20).collect::<Vec<_>>());
        // Scheduling in the past fires at the next expiry.
        w.schedule(99, 50);
        w.expire(10_050, &mut out);
        assert!(out.contains(&99));
    }
}
