//! Node ids by failure domain, kept up to date with the view at the cost of the
//! membership changes only (a node joining, leaving or moving), so every scheduler in
//! a process shares one index and none rebuilds it per placement.

use std::collections::BTreeMap;
use std::sync::Arc;

use flotilla_core::NodeId;
use imbl::OrdMap;

use crate::record::{Delta, ShardView};

#[derive(Debug, Clone, Default)]
pub struct Domains(OrdMap<String, Arc<Vec<NodeId>>>);

impl Domains {
    /// The index of a whole view (on a snapshot).
    pub fn of(view: &ShardView) -> Self {
        let mut m: BTreeMap<String, Vec<NodeId>> = BTreeMap::new();
        for r in view.nodes.values() {
            m.entry(r.labels.domain().to_string()).or_default().push(r.node_id.clone());
        }
        // In id order, as nodes that join later are appended: the view iterates in hash order.
        Domains(
            m.into_iter()
                .map(|(k, mut v)| {
                    v.sort_unstable();
                    (k, Arc::new(v))
                })
                .collect(),
        )
    }

    /// The index after `delta`, given the view it applies to.
    pub fn apply(&self, before: &ShardView, delta: &Delta) -> Self {
        let mut adds: BTreeMap<&str, Vec<&NodeId>> = BTreeMap::new();
        let mut removes: BTreeMap<&str, Vec<&NodeId>> = BTreeMap::new();
        for r in &delta.upserts {
            let new = r.labels.domain();
            match before.get(&r.node_id) {
                None => adds.entry(new).or_default().push(&r.node_id),
                Some(p) if p.labels.domain() != new => {
                    removes.entry(p.labels.domain()).or_default().push(&r.node_id);
                    adds.entry(new).or_default().push(&r.node_id);
                }
                Some(_) => {}
            }
        }
        for id in &delta.removed {
            if let Some(p) = before.get(id) {
                removes.entry(p.labels.domain()).or_default().push(id);
            }
        }
        if adds.is_empty() && removes.is_empty() {
            return self.clone();
        }
        let mut out = self.0.clone();
        let touched: std::collections::BTreeSet<&str> = adds.keys().chain(removes.keys()).copied().collect();
        for d in touched {
            let mut ids: Vec<NodeId> = out.get(d).map(|v| v.as_ref().clone()).unwrap_or_default();
            if let Some(r) = removes.get(d) {
                ids.retain(|id| !r.contains(&id));
            }
            if let Some(a) = adds.get(d) {
                ids.extend(a.iter().map(|id| (*id).clone()));
            }
            if ids.is_empty() {
                out.remove(d);
            } else {
                out.insert(d.to_string(), Arc::new(ids));
            }
        }
        Domains(out)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &Arc<Vec<NodeId>>)> {
        self.0.iter()
    }

    pub fn get(&self, domain: &str) -> Option<&Arc<Vec<NodeId>>> {
        self.0.get(domain)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{NodeRecord, Version};
    use flotilla_core::Labels;

    fn rec(id: &str, domain: &str) -> Arc<NodeRecord> {
        let mut l = Labels::new();
        l.insert("domain", domain).unwrap();
        Arc::new(NodeRecord { labels: Arc::new(l), ..NodeRecord::blank(NodeId::new(id).unwrap()) })
    }

    fn sorted(d: &Domains) -> Vec<(String, Vec<String>)> {
        d.iter()
            .map(|(k, v)| {
                let mut ids: Vec<String> = v.iter().map(|n| n.to_string()).collect();
                ids.sort();
                (k.clone(), ids)
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
        ];
        for (i, (upserts, removed)) in steps.into_iter().enumerate() {
            let d = Delta {
                shard: 0,
                from: view.version,
                to: Version { epoch: 1, seq: i as u64 + 1 },
                upserts,
                removed: removed.into_iter().map(|s| NodeId::new(s).unwrap()).collect(),
            };
            domains = domains.apply(&view, &d);
            view = view.apply(&d).unwrap();
            assert_eq!(sorted(&domains), sorted(&Domains::of(&view)), "after step {i}");
        }
        assert!(domains.get("x").is_none(), "an empty domain disappears");
    }
}
