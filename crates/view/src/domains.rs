//! Each failure domain's nodes, as their records, kept up to date with the view delta
//! by delta, so every scheduler in a process shares one index and none rebuilds it per
//! placement.
//!
//! The planner scans a domain from a random place, and a candidate costs an indexed
//! read here rather than a keyed search of the view: that search was a fifth of a
//! scheduler's CPU in the contended placement loadtest (BENCHMARKS.md, issue #19).
//! Keeping records rather than ids costs one persistent-vector write per upserted node,
//! beside the one the follower already makes in the view itself.

use std::collections::BTreeMap;
use std::sync::Arc;

use flotilla_core::NodeId;
use imbl::shared_ptr::DefaultSharedPtr;
use imbl::{GenericHashMap, OrdMap, Vector};

use crate::record::{Delta, NodeRecord, ShardView};

/// Each node's domain and its index in that domain's vector.
type Positions = GenericHashMap<NodeId, (Arc<str>, u32), foldhash::fast::FixedState, DefaultSharedPtr>;

#[derive(Debug, Clone, Default)]
pub struct Domains {
    nodes: OrdMap<Arc<str>, Vector<Arc<NodeRecord>>>,
    /// Changes only when membership does (a node joining, leaving or moving).
    at: Positions,
}

impl Domains {
    /// The index of a whole view (on a snapshot).
    pub fn of(view: &ShardView) -> Self {
        let mut m: BTreeMap<&str, Vec<Arc<NodeRecord>>> = BTreeMap::new();
        for r in view.nodes.values() {
            m.entry(r.labels.domain()).or_default().push(r.clone());
        }
        let mut out = Domains::default();
        for (domain, mut records) in m {
            // In id order, as nodes that join later are appended: the view iterates in hash order.
            records.sort_unstable_by(|a, b| a.node_id.cmp(&b.node_id));
            let domain: Arc<str> = domain.into();
            for (i, r) in records.iter().enumerate() {
                out.at.insert(r.node_id.clone(), (domain.clone(), i as u32));
            }
            out.nodes.insert(domain, records.into_iter().collect());
        }
        out
    }

    /// Applies `delta`: an upserted node's record replaces the one in its place, a new
    /// node goes at the end of its domain, and a node leaving a domain (removed or moved)
    /// has its place taken by that domain's last node.
    pub fn apply(&mut self, delta: &Delta) {
        for id in &delta.removed {
            self.remove(id);
        }
        for r in &delta.upserts {
            let domain = r.labels.domain();
            match self.at.get(&r.node_id) {
                Some((d, i)) if &**d == domain => {
                    let i = *i as usize;
                    if let Some(v) = self.nodes.get_mut(domain) {
                        v.set(i, r.clone());
                    }
                    continue;
                }
                Some(_) => self.remove(&r.node_id),
                None => {}
            }
            let d: Arc<str> = self.nodes.get_key_value(domain).map_or_else(|| domain.into(), |(k, _)| k.clone());
            let v = self.nodes.entry(d.clone()).or_default();
            self.at.insert(r.node_id.clone(), (d, v.len() as u32));
            v.push_back(r.clone());
        }
    }

    fn remove(&mut self, id: &NodeId) {
        let Some((domain, i)) = self.at.remove(id) else { return };
        let Some(v) = self.nodes.get_mut(&domain) else { return };
        let Some(last) = v.pop_back() else { return };
        if (i as usize) < v.len() {
            self.at.insert(last.node_id.clone(), (domain.clone(), i));
            v.set(i as usize, last);
        }
        if v.is_empty() {
            self.nodes.remove(&domain);
        }
    }

    /// Each domain and its nodes' records, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &Vector<Arc<NodeRecord>>)> {
        self.nodes.iter().map(|(d, v)| (&**d, v))
    }

    pub fn get(&self, domain: &str) -> Option<&Vector<Arc<NodeRecord>>> {
        self.nodes.get(domain)
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{NodeRecord, Version};
    use flotilla_core::{Labels, Resources};

    fn rec(id: &str, domain: &str) -> Arc<NodeRecord> {
        busy(id, domain, 0)
    }

    fn busy(id: &str, domain: &str, cpu: u64) -> Arc<NodeRecord> {
        let mut l = Labels::new();
        l.insert("domain", domain).unwrap();
        let allocated = Resources::new(cpu, 0, 0).into();
        Arc::new(NodeRecord { labels: Arc::new(l), allocated, ..NodeRecord::blank(NodeId::new(id).unwrap()) })
    }

    /// Each domain's (id, allocated CPU) pairs, sorted.
    fn sorted(d: &Domains) -> Vec<(String, Vec<(String, u64)>)> {
        d.iter()
            .map(|(k, v)| {
                let mut ids: Vec<(String, u64)> =
                    v.iter().map(|n| (n.node_id.to_string(), n.allocated.cpu_millis)).collect();
                ids.sort();
                (k.to_string(), ids)
            })
            .collect()
    }

    #[test]
    fn incremental_updates_match_a_rebuild() {
        let mut view = ShardView::empty(0, 1);
        let mut domains = Domains::default();
        let steps: Vec<(Vec<Arc<NodeRecord>>, Vec<&str>)> = vec![
            (vec![rec("a", "x"), rec("b", "x"), rec("c", "y")], vec![]),
            (vec![rec("b", "y")], vec![]),    // moved
            (vec![rec("a", "x")], vec!["c"]), // unchanged + removed
            (vec![], vec!["a"]),              // domain x empties
            (vec![rec("d", "z"), rec("b", "y")], vec![]),
            (vec![rec("e", "z"), rec("f", "z"), rec("g", "z")], vec![]),
            (vec![busy("f", "z", 500)], vec!["d"]), // updated in place; z's last node takes d's place
            (vec![busy("e", "y", 250), busy("g", "z", 100)], vec![]),
        ];
        for (i, (upserts, removed)) in steps.into_iter().enumerate() {
            let d = Delta {
                shard: 0,
                from: view.version,
                to: Version { epoch: 1, seq: i as u64 + 1 },
                upserts,
                removed: removed.into_iter().map(|s| NodeId::new(s).unwrap()).collect(),
                published_unix_ms: 0,
            };
            domains.apply(&d);
            view = view.apply(&d).unwrap();
            assert_eq!(sorted(&domains), sorted(&Domains::of(&view)), "after step {i}");
            for (domain, v) in domains.iter() {
                for (k, r) in v.iter().enumerate() {
                    assert_eq!(domains.at.get(&r.node_id), Some(&(domain.into(), k as u32)), "after step {i}");
                }
            }
            assert_eq!(domains.at.len(), view.nodes.len(), "after step {i}");
        }
        assert!(domains.get("x").is_none(), "an empty domain disappears");
    }
}
