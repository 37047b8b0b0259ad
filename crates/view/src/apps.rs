//! The nodes each app has workloads on, kept up to date with the view delta by delta, so
//! a scheduler that looks for what its app runs (the orphan sweep) reads its app's few
//! nodes rather than every node of the view. Read through every node, that sweep was
//! the largest cost of a thousand settled apps in one process (BENCHMARKS.md, "A
//! thousand apps in one scheduler process"), and it grows with the cluster.

use std::sync::Arc;

use flotilla_core::NodeId;
use imbl::{OrdMap, OrdSet};

use crate::record::{Delta, NodeRecord, ShardView};

#[derive(Debug, Clone, Default)]
pub struct AppNodes {
    nodes: OrdMap<Arc<str>, OrdSet<NodeId>>,
}

/// The apps `record` has workloads of, each once.
fn apps_of(record: Option<&Arc<NodeRecord>>) -> Vec<&str> {
    let mut apps: Vec<&str> = record.map_or(Vec::new(), |r| r.workloads.iter().map(|w| w.app.as_str()).collect());
    apps.sort_unstable();
    apps.dedup();
    apps
}

impl AppNodes {
    /// The index of a whole view (on a snapshot).
    pub fn of(view: &ShardView) -> Self {
        let mut out = AppNodes::default();
        for r in view.nodes.values() {
            for app in apps_of(Some(r)) {
                out.add(app, &r.node_id);
            }
        }
        out
    }

    /// Applies `delta`, which took the view from `before` to `after`.
    pub fn apply(&mut self, before: &ShardView, after: &ShardView, delta: &Delta) {
        let touched = delta.upserts.iter().map(|r| &r.node_id).chain(&delta.removed);
        for id in touched {
            let (was, is) = (apps_of(before.get(id)), apps_of(after.get(id)));
            for app in was.iter().filter(|a| is.binary_search(a).is_err()) {
                self.remove(app, id);
            }
            for app in is.iter().filter(|a| was.binary_search(a).is_err()) {
                self.add(app, id);
            }
        }
    }

    fn add(&mut self, app: &str, id: &NodeId) {
        let key: Arc<str> = self.nodes.get_key_value(app).map_or_else(|| app.into(), |(k, _)| k.clone());
        self.nodes.entry(key).or_default().insert(id.clone());
    }

    fn remove(&mut self, app: &str, id: &NodeId) {
        let Some(set) = self.nodes.get_mut(app) else { return };
        set.remove(id);
        if set.is_empty() {
            self.nodes.remove(app);
        }
    }

    /// The nodes with workloads of `app`.
    pub fn get(&self, app: &str) -> impl Iterator<Item = &NodeId> {
        self.nodes.get(app).into_iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Version;
    use flotilla_proto::v1;

    fn rec(id: &str, apps: &[&str]) -> Arc<NodeRecord> {
        let workloads = apps.iter().map(|a| v1::WorkloadStatus { app: a.to_string(), ..Default::default() }).collect();
        Arc::new(NodeRecord {
            workloads: Arc::new(workloads),
            ..NodeRecord::blank(NodeId::new(id).expect("a valid id"))
        })
    }

    fn nodes_of(index: &AppNodes, app: &str) -> Vec<String> {
        index.get(app).map(|n| n.as_str().to_string()).collect()
    }

    #[test]
    fn follows_workloads_delta_by_delta_as_a_rebuild_would() {
        let mut view = ShardView::empty(0, 1);
        view.insert(rec("n1", &["web", "web", "batch"]));
        view.insert(rec("n2", &["web"]));
        view.insert(rec("n3", &[]));
        let mut index = AppNodes::of(&view);
        assert_eq!(nodes_of(&index, "web"), ["n1", "n2"]);
        assert_eq!(nodes_of(&index, "batch"), ["n1"]);
        assert_eq!(index.nodes.len(), 2);

        let steps = [
            // web leaves n1, batch comes to n3, n2 leaves the view.
            (vec![rec("n1", &["batch"]), rec("n3", &["batch"])], vec!["n2"]),
            // A node upserted and removed in one delta is gone.
            (vec![rec("n4", &["web"])], vec!["n4"]),
            // A health change alone: nothing moves.
            (vec![rec("n1", &["batch"])], vec![]),
            // The last workload of an app leaves: the app leaves the index.
            (vec![rec("n1", &[]), rec("n3", &["web"])], vec![]),
        ];
        for (seq, (upserts, removed)) in steps.into_iter().enumerate() {
            let delta = Delta {
                shard: 0,
                from: view.version,
                to: Version { epoch: 1, seq: seq as u64 + 1 },
                upserts,
                removed: removed.into_iter().map(|id| NodeId::new(id).expect("a valid id")).collect(),
                published_unix_ms: 0,
            };
            let next = view.apply(&delta).expect("in order");
            index.apply(&view, &next, &delta);
            view = next;
            let rebuilt = AppNodes::of(&view);
            for app in ["web", "batch"] {
                assert_eq!(nodes_of(&index, app), nodes_of(&rebuilt, app), "{app} after delta {seq}");
            }
            assert_eq!(index.nodes.len(), rebuilt.nodes.len(), "after delta {seq}");
        }
        assert_eq!(nodes_of(&index, "web"), ["n3"]);
        assert!(nodes_of(&index, "batch").is_empty());
    }
}
