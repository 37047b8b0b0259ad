use flotilla_core::LockExt;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use flotilla_core::NodeId;
use tokio::sync::broadcast;

use crate::record::{Delta, NodeRecord, ShardView, Version};

/// The single writer of a shard's view. Readers call [`ViewPublisher::load`] and
/// never wait; only [`ViewPublisher::publish`] (one applier task) writes.
pub struct ViewPublisher {
    current: ArcSwap<ShardView>,
    /// Recent deltas, oldest first. Locked only by publish and by a new subscriber,
    /// never by readers of the view.
    ring: Mutex<Ring>,
    ring_capacity: usize,
    tx: broadcast::Sender<Arc<Delta>>,
}

/// The ring holds at most this many records (upserts and removals) while a quarter of
/// the view is fewer.
const RING_MIN_RECORDS: usize = 4096;

/// Recent deltas and how many records they hold together. The ring is bounded in
/// records as well as in versions: replaying deltas that hold more than a quarter of the
/// view saves a subscriber little over a snapshot, and a registration storm's deltas
/// would otherwise keep a pointer per node (and every record replaced since) alive for
/// as long as the shard takes to publish `ring_capacity` more versions, which in a quiet
/// cluster is hours.
#[derive(Default)]
struct Ring {
    deltas: VecDeque<Arc<Delta>>,
    records: usize,
}

fn records_in(d: &Delta) -> usize {
    d.upserts.len() + d.removed.len()
}

/// Where a new subscriber starts.
pub enum Start {
    /// Replay these deltas (possibly none) on top of the version the subscriber has.
    Deltas(Vec<Arc<Delta>>),
    /// The subscriber's version is unknown or too old: send the whole view.
    Snapshot(Arc<ShardView>),
}

pub struct Subscription {
    pub start: Start,
    /// Every delta published after `start`, in order.
    pub rx: broadcast::Receiver<Arc<Delta>>,
}

impl ViewPublisher {
    pub fn new(shard: u32, epoch: u64, ring_capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(ring_capacity.max(16));
        ViewPublisher {
            current: ArcSwap::from_pointee(ShardView::empty(shard, epoch)),
            ring: Mutex::new(Ring::default()),
            ring_capacity: ring_capacity.max(1),
            tx,
        }
    }

    /// The current view; lock-free.
    pub fn load(&self) -> Arc<ShardView> {
        self.current.load_full()
    }

    /// Builds and publishes the next version from `upserts` and `removed`. Returns
    /// `None` (and publishes nothing) when there is nothing to change. Only one task
    /// may call this.
    pub fn publish(&self, upserts: Vec<Arc<NodeRecord>>, removed: Vec<NodeId>) -> Option<Arc<Delta>> {
        if upserts.is_empty() && removed.is_empty() {
            return None;
        }
        let cur = self.current.load_full();
        let to = Version { epoch: cur.version.epoch, seq: cur.version.seq + 1 };
        let published_unix_ms = flotilla_core::now_ms();
        let delta = Delta { shard: cur.shard, from: cur.version, to, upserts, removed, published_unix_ms };
        let Some(next) = cur.apply(&delta) else {
            unreachable!("a delta built from the current version applies to it")
        };
        let delta = Arc::new(delta);
        let budget = RING_MIN_RECORDS.max(next.len() / 4);
        let mut ring = self.ring.lock_or_recover();
        self.current.store(Arc::new(next));
        ring.records += records_in(&delta);
        ring.deltas.push_back(delta.clone());
        // The newest delta always stays: a subscriber one version behind resumes.
        while ring.deltas.len() > self.ring_capacity || (ring.records > budget && ring.deltas.len() > 1) {
            if let Some(old) = ring.deltas.pop_front() {
                ring.records -= records_in(&old);
            }
        }
        // No receivers is fine: nobody is watching.
        let _ = self.tx.send(delta.clone());
        Some(delta)
    }

    /// Subscribes, resuming after `from` when the ring still holds every delta since
    /// then, otherwise starting with a snapshot. No delta is lost or repeated between
    /// `start` and `rx`.
    pub fn subscribe(&self, from: Option<Version>) -> Subscription {
        let ring = self.ring.lock_or_recover();
        let rx = self.tx.subscribe();
        let current = self.current.load_full();
        let start = match from {
            Some(v) if v == current.version => Start::Deltas(Vec::new()),
            Some(v) if v.epoch == current.version.epoch => match ring.deltas.iter().position(|d| d.from == v) {
                Some(i) => Start::Deltas(ring.deltas.iter().skip(i).cloned().collect()),
                None => Start::Snapshot(current),
            },
            _ => Start::Snapshot(current),
        };
        Subscription { start, rx }
    }

    pub fn subscriber_count(&self) -> usize {
        self.tx.receiver_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::{NodeStatus, Resources};

    pub(crate) fn rec(id: &str, status: NodeStatus) -> Arc<NodeRecord> {
        Arc::new(NodeRecord {
            status,
            capacity: Arc::new(Resources::new(1000, 1 << 30, 0)),
            ..NodeRecord::blank(NodeId::new(id).unwrap())
        })
    }

    #[test]
    fn empty_changes_publish_nothing() {
        let p = ViewPublisher::new(0, 1, 8);
        assert!(p.publish(vec![], vec![]).is_none());
        assert_eq!(p.load().version, Version { epoch: 1, seq: 0 });
    }

    #[test]
    fn resume_from_a_recent_version_replays_the_ring() {
        let p = ViewPublisher::new(0, 1, 4);
        for i in 0..3 {
            p.publish(vec![rec(&format!("n{i}"), NodeStatus::Alive)], vec![]);
        }
        let sub = p.subscribe(Some(Version { epoch: 1, seq: 1 }));
        let Start::Deltas(ds) = sub.start else { panic!("expected deltas") };
        assert_eq!(ds.iter().map(|d| d.to.seq).collect::<Vec<_>>(), vec![2, 3]);
        // Applying them to the subscriber's copy yields the current view.
        let mut mine = ShardView::empty(0, 1);
        mine.insert(rec("n0", NodeStatus::Alive));
        mine.version.seq = 1;
        for d in &ds {
            mine = mine.apply(d).unwrap();
        }
        assert_eq!(mine.nodes, p.load().nodes);
        let up_to_date = p.subscribe(Some(Version { epoch: 1, seq: 3 }));
        assert!(matches!(up_to_date.start, Start::Deltas(ref d) if d.is_empty()));
    }

    #[test]
    fn too_old_or_foreign_versions_get_a_snapshot() {
        let p = ViewPublisher::new(0, 7, 2);
        for i in 0..5 {
            p.publish(vec![rec(&format!("n{i}"), NodeStatus::Alive)], vec![]);
        }
        for from in [Some(Version { epoch: 7, seq: 1 }), Some(Version { epoch: 6, seq: 5 }), None] {
            let sub = p.subscribe(from);
            let Start::Snapshot(s) = sub.start else { panic!("expected a snapshot for {from:?}") };
            assert_eq!(s.len(), 5);
            assert_eq!(s.version.seq, 5);
        }
    }

    #[test]
    fn the_ring_keeps_no_more_records_than_a_quarter_of_the_view() {
        let p = ViewPublisher::new(0, 1, 1024);
        let storm: Vec<_> = (0..RING_MIN_RECORDS + 10).map(|i| rec(&format!("n{i}"), NodeStatus::Alive)).collect();
        p.publish(storm, vec![]);
        assert!(
            matches!(p.subscribe(Some(Version { epoch: 1, seq: 0 })).start, Start::Deltas(ref d) if d.len() == 1),
            "the newest delta stays however large"
        );
        p.publish(vec![rec("n0", NodeStatus::Suspect)], vec![]);
        p.publish(vec![rec("n1", NodeStatus::Suspect)], vec![]);
        // The storm's delta is gone (it held the old n0 and n1): resuming before it takes a
        // snapshot, resuming after it replays the two small deltas.
        assert!(matches!(p.subscribe(Some(Version { epoch: 1, seq: 0 })).start, Start::Snapshot(_)));
        let Start::Deltas(ds) = p.subscribe(Some(Version { epoch: 1, seq: 1 })).start else {
            panic!("expected deltas")
        };
        assert_eq!(ds.iter().map(|d| d.to.seq).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(p.ring.lock_or_recover().records, 2);
    }

    #[test]
    fn deltas_after_subscribing_arrive_in_order() {
        let p = ViewPublisher::new(0, 1, 8);
        let mut sub = p.subscribe(None);
        p.publish(vec![rec("a", NodeStatus::Alive)], vec![]);
        p.publish(vec![rec("a", NodeStatus::Suspect)], vec![]);
        p.publish(vec![], vec![NodeId::new("a").unwrap()]);
        let seqs: Vec<u64> = (0..3).map(|_| sub.rx.try_recv().unwrap().to.seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(p.load().is_empty());
    }

    /// Readers holding and reading views never hold the applier back: the applier
    /// publishes while every reader keeps an old version alive and keeps loading.
    #[test]
    fn readers_never_block_the_applier() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let p = Arc::new(ViewPublisher::new(0, 1, 64));
        for i in 0..1000 {
            p.publish(vec![rec(&format!("n{i:04}"), NodeStatus::Alive)], vec![]);
        }
        let stop = Arc::new(AtomicBool::new(false));
        let reads = Arc::new(AtomicU64::new(0));
        let readers: Vec<_> = (0..4)
            .map(|_| {
                let (p, stop, reads) = (p.clone(), stop.clone(), reads.clone());
                std::thread::spawn(move || {
                    let pinned = p.load(); // an old version kept alive for the whole run
                    let mut last = pinned.version;
                    while !stop.load(Ordering::Relaxed) {
                        let v = p.load();
                        assert!(v.version >= last, "versions never go back");
                        last = v.version;
                        let alive = v.nodes.values().filter(|r| r.status == NodeStatus::Alive).count();
                        assert!(alive <= v.len());
                        reads.fetch_add(1, Ordering::Relaxed);
                    }
                    assert_eq!(pinned.len(), 1000, "a pinned version never changes");
                })
            })
            .collect();
        let start = p.load().version.seq;
        for i in 0..500 {
            let st = if i % 2 == 0 { NodeStatus::Suspect } else { NodeStatus::Alive };
            p.publish(vec![rec(&format!("n{:04}", i % 1000), st)], vec![]);
        }
        assert_eq!(p.load().version.seq, start + 500, "every publish went through while readers ran");
        stop.store(true, Ordering::Relaxed);
        for r in readers {
            r.join().unwrap();
        }
        assert!(reads.load(Ordering::Relaxed) > 0);
    }
}
