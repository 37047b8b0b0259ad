//! Equal label sets and capacities shared between a follower's records, as the shard's
//! registry shares them: a view of 100,000 nodes holds a few dozen of each rather than
//! 100,000 copies, and a reader that walks every node (the pool autoscaler) finds twins
//! by pointer instead of reading each node's labels from cold memory.

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::Arc;

use flotilla_core::{Labels, Resources};

use crate::NodeRecord;

/// Values interned before the sets are first purged.
const FIRST_PURGE: usize = 1024;

#[derive(Default)]
pub(crate) struct Interner {
    labels: HashSet<Arc<Labels>>,
    capacities: HashSet<Arc<Resources>>,
    /// Purge when the sets together hold this many: twice what they held after the last
    /// purge, so a label set no record carries any more is let go within a bounded
    /// number of values and the purges cost O(1) each, amortised.
    purge_at: usize,
}

fn one<T: Hash + Eq>(set: &mut HashSet<Arc<T>>, value: &mut Arc<T>) {
    match set.get(&**value) {
        Some(shared) => *value = shared.clone(),
        None => {
            set.insert(value.clone());
        }
    }
}

impl Interner {
    /// `r` with its labels and capacity shared with equal ones seen before.
    pub fn record(&mut self, r: &mut NodeRecord) {
        one(&mut self.labels, &mut r.labels);
        one(&mut self.capacities, &mut r.capacity);
        let held = self.labels.len() + self.capacities.len();
        if held >= self.purge_at.max(FIRST_PURGE) {
            // Held only here: no record carries it any more.
            self.labels.retain(|l| Arc::strong_count(l) > 1);
            self.capacities.retain(|c| Arc::strong_count(c) > 1);
            self.purge_at = 2 * (self.labels.len() + self.capacities.len());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::NodeId;

    fn record(id: &str, domain: &str) -> NodeRecord {
        let mut r = NodeRecord::blank(NodeId::new(id).unwrap());
        r.labels = Arc::new(Labels::from_map([("domain".into(), domain.into())].into()).unwrap());
        r.capacity = Arc::new(Resources::new(8000, 1 << 30, 0));
        r
    }

    #[test]
    fn equal_labels_and_capacities_are_shared_and_unused_ones_let_go() {
        let mut i = Interner::default();
        let (mut a, mut b, mut c) = (record("a", "d1"), record("b", "d1"), record("c", "d2"));
        for r in [&mut a, &mut b, &mut c] {
            i.record(r);
        }
        assert!(Arc::ptr_eq(&a.labels, &b.labels) && Arc::ptr_eq(&a.capacity, &c.capacity));
        assert!(!Arc::ptr_eq(&a.labels, &c.labels));
        // Many distinct label sets, each dropped as soon as it is interned: the sets stay
        // bounded, and what records still hold stays shared.
        for k in 0..10 * FIRST_PURGE {
            let mut r = record(&format!("n{k}"), &format!("gone-{k}"));
            i.record(&mut r);
        }
        assert!(i.labels.len() <= 2 * FIRST_PURGE, "{} label sets held", i.labels.len());
        let mut d = record("d", "d1");
        i.record(&mut d);
        assert!(Arc::ptr_eq(&a.labels, &d.labels));
    }
}
