//! The nodes each app has workloads on, kept up to date with the view delta by delta, so
//! a scheduler that looks for what its app runs (the orphan sweep) reads its app's few
//! nodes rather than every node of the view. Read through every node, that sweep was
//! the largest cost of a thousand settled apps in one process (BENCHMARKS.md, "A
//! thousand apps in one scheduler process"), and it grows with the cluster.
//!
//! Each app's entry carries a stamp that changes whenever which workloads of the app the
//! shard's nodes run changes (a node, a unit, a member or a generation), not when only
//! what their agents report about them does: a sweep that found nothing can tell that
//! it would find nothing again without reading a node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_core::NodeId;
use imbl::{OrdMap, OrdSet};

use crate::record::{Delta, NodeRecord, ShardView};

#[derive(Debug, Clone, Default)]
pub struct AppNodes {
    nodes: OrdMap<Arc<str>, Ran>,
}

/// Where one app's workloads run on the shard.
#[derive(Debug, Clone)]
struct Ran {
    nodes: OrdSet<NodeId>,
    stamp: u64,
}

/// Stamps are drawn from one counter for the whole process, so an index rebuilt from a
/// snapshot never repeats a stamp the one it replaces gave.
fn next_stamp() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A workload as the index tells them apart: `(app, unit, member, generation)`.
type Workload<'a> = (&'a str, &'a str, &'a str, u64);

/// The workloads `record` runs, sorted (so by app first).
fn ran_on(record: Option<&Arc<NodeRecord>>) -> Vec<Workload<'_>> {
    let mut ran: Vec<_> = record.map_or(Vec::new(), |r| {
        r.workloads.iter().map(|w| (w.app.as_str(), w.unit.as_str(), w.member.as_str(), w.generation)).collect()
    });
    ran.sort_unstable();
    ran
}

/// `app`'s workloads among `ran` (sorted, so they are contiguous).
fn of_app<'r, 'a>(ran: &'r [Workload<'a>], app: &str) -> &'r [Workload<'a>] {
    let start = ran.partition_point(|w| w.0 < app);
    let len = ran[start..].partition_point(|w| w.0 == app);
    &ran[start..start + len]
}

impl AppNodes {
    /// The index of a whole view (on a snapshot).
    pub fn of(view: &ShardView) -> Self {
        let mut out = AppNodes::default();
        for r in view.nodes.values() {
            let mut apps: Vec<&str> = r.workloads.iter().map(|w| w.app.as_str()).collect();
            apps.sort_unstable();
            apps.dedup();
            for app in apps {
                out.add(app, &r.node_id);
            }
        }
        out
    }

    /// Applies `delta`; `replaced`: the records it replaced, in its order
    /// ([`ShardView::apply_replacing`]).
    pub fn apply(&mut self, delta: &Delta, replaced: &[Option<Arc<NodeRecord>>]) {
        let upserts = delta.upserts.iter().map(|r| (&r.node_id, Some(r)));
        let removals = delta.removed.iter().map(|id| (id, None));
        for ((id, is), was) in upserts.chain(removals).zip(replaced) {
            let runs_nothing = |r: Option<&Arc<NodeRecord>>| r.is_none_or(|r| r.workloads.is_empty());
            // A node that runs nothing before and after (a commit's new allocation on an
            // empty node) needs no sorting to tell.
            if runs_nothing(was.as_ref()) && runs_nothing(is) {
                continue;
            }
            let (was, is) = (ran_on(was.as_ref()), ran_on(is));
            // Most upserts are heartbeats' health and usage: the same workloads.
            if was == is {
                continue;
            }
            let mut apps: Vec<&str> = was.iter().chain(&is).map(|w| w.0).collect();
            apps.sort_unstable();
            apps.dedup();
            for app in apps {
                let (was, is) = (of_app(&was, app), of_app(&is, app));
                match (was.is_empty(), is.is_empty()) {
                    (false, true) => self.remove(app, id),
                    (true, false) => self.add(app, id),
                    _ if was != is => self.touch(app),
                    _ => {}
                }
            }
        }
    }

    fn add(&mut self, app: &str, id: &NodeId) {
        let key: Arc<str> = self.nodes.get_key_value(app).map_or_else(|| app.into(), |(k, _)| k.clone());
        let ran = self.nodes.entry(key).or_insert_with(|| Ran { nodes: OrdSet::new(), stamp: 0 });
        ran.nodes.insert(id.clone());
        ran.stamp = next_stamp();
    }

    fn remove(&mut self, app: &str, id: &NodeId) {
        let Some(ran) = self.nodes.get_mut(app) else { return };
        ran.nodes.remove(id);
        ran.stamp = next_stamp();
        if ran.nodes.is_empty() {
            self.nodes.remove(app);
        }
    }

    fn touch(&mut self, app: &str) {
        if let Some(ran) = self.nodes.get_mut(app) {
            ran.stamp = next_stamp();
        }
    }

    /// The nodes with workloads of `app`.
    pub fn get(&self, app: &str) -> impl Iterator<Item = &NodeId> {
        self.nodes.get(app).into_iter().flat_map(|ran| ran.nodes.iter())
    }

    /// A stamp of which workloads of `app` the shard's nodes run (`None` while none):
    /// equal stamps, in this process, mean the same workloads on the same nodes.
    pub fn stamp(&self, app: &str) -> Option<u64> {
        self.nodes.get(app).map(|ran| ran.stamp)
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

    /// Random deltas (a node upserted twice, or upserted and removed, in one delta
    /// included): after each, the index equals a rebuild of the view.
    #[test]
    fn random_deltas_leave_the_index_a_rebuild_would_build() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let apps = ["web", "batch", "api"];
        let mut view = ShardView::empty(0, 1);
        let mut index = AppNodes::of(&view);
        for seq in 1..=2_000u64 {
            let (mut upserts, mut removed) = (Vec::new(), Vec::new());
            for _ in 0..=next(6) {
                let id = format!("n{}", next(60));
                if next(4) == 0 {
                    removed.push(NodeId::new(&id).expect("a valid id"));
                } else {
                    let ran: Vec<&str> = (0..next(4)).map(|_| apps[next(3) as usize]).collect();
                    upserts.push(rec(&id, &ran));
                }
            }
            let delta = Delta {
                shard: 0,
                from: view.version,
                to: Version { epoch: 1, seq },
                upserts,
                removed,
                published_unix_ms: 0,
            };
            let (after, replaced) = view.apply_replacing(&delta).expect("in order");
            index.apply(&delta, &replaced);
            view = after;
            let rebuilt = AppNodes::of(&view);
            for app in apps {
                assert_eq!(nodes_of(&index, app), nodes_of(&rebuilt, app), "{app} after delta {seq}");
            }
            assert_eq!(index.nodes.len(), rebuilt.nodes.len(), "after delta {seq}");
        }
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
            let (next, replaced) = view.apply_replacing(&delta).expect("in order");
            index.apply(&delta, &replaced);
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

    #[test]
    fn an_apps_stamp_moves_with_which_workloads_run_not_with_their_reports() {
        let wl = |app: &str, unit: &str, generation: u64, state: v1::WorkloadState| v1::WorkloadStatus {
            app: app.into(),
            unit: unit.into(),
            member: "head".into(),
            generation,
            state: state as i32,
            ..Default::default()
        };
        let node = |id: &str, workloads: Vec<v1::WorkloadStatus>| {
            Arc::new(NodeRecord {
                workloads: Arc::new(workloads),
                ..NodeRecord::blank(NodeId::new(id).expect("an id"))
            })
        };
        let starting = v1::WorkloadState::Starting;
        let running = v1::WorkloadState::Running;
        let mut view = ShardView::empty(0, 1);
        view.insert(node("n1", vec![wl("web", "w1", 1, starting), wl("batch", "b1", 1, running)]));
        view.insert(node("n2", vec![wl("web", "w2", 1, running)]));
        let mut index = AppNodes::of(&view);
        let stamps = |index: &AppNodes| (index.stamp("web"), index.stamp("batch"));
        let mut seq = 0;
        let mut step = |index: &mut AppNodes, upserts: Vec<Arc<NodeRecord>>, removed: &[&str]| {
            seq += 1;
            let delta = Delta {
                shard: 0,
                from: view.version,
                to: Version { epoch: 1, seq },
                upserts,
                removed: removed.iter().map(|id| NodeId::new(id).expect("an id")).collect(),
                published_unix_ms: 0,
            };
            let (next, replaced) = view.apply_replacing(&delta).expect("in order");
            index.apply(&delta, &replaced);
            view = next;
        };
        let first = stamps(&index);
        assert!(first.0.is_some() && first.1.is_some() && first.0 != first.1, "{first:?}");
        assert_eq!(index.stamp("api"), None, "an app that runs nowhere");

        // w1 reported running, and n2's health moves: the same workloads.
        step(&mut index, vec![node("n1", vec![wl("web", "w1", 1, running), wl("batch", "b1", 1, running)])], &[]);
        step(&mut index, vec![node("n2", vec![wl("web", "w2", 1, running)])], &[]);
        assert_eq!(stamps(&index), first, "reports and health alone");

        // w1 placed again under a new generation: web's stamp moves, batch's stays.
        step(&mut index, vec![node("n1", vec![wl("web", "w1", 2, starting), wl("batch", "b1", 1, running)])], &[]);
        let second = stamps(&index);
        assert!(second.0 != first.0 && second.1 == first.1, "{first:?} then {second:?}");

        // n2 leaves the view: web runs on fewer nodes.
        step(&mut index, vec![], &["n2"]);
        let third = stamps(&index);
        assert!(third.0 != second.0 && third.1 == second.1, "{second:?} then {third:?}");
        assert_eq!(nodes_of(&index, "web"), ["n1"]);

        // A snapshot rebuilds the index: no stamp it gives repeats an earlier one.
        let rebuilt = stamps(&AppNodes::of(&view));
        assert!(rebuilt.0 != third.0 && rebuilt.1 != third.1, "{third:?} then {rebuilt:?}");
    }
}
