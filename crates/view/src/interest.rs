//! Who is woken by which change of the view. A reader that depends on a few nodes (an
//! app's scheduler, on the nodes its members are on) registers them, and a delta wakes
//! only the readers registered for a node it touches; a snapshot or a change of which
//! shards are connected wakes every reader. With one channel that woke every reader, a
//! process hosting a thousand apps woke each of them for every delta of every shard
//! (some fifteen thousand wake-ups a second) to find the change was not theirs
//! (BENCHMARKS.md, "A thousand apps in one scheduler process").
//!
//! A wake-up is a hint, never the truth: the reader compares what it saw with the view.
//! A change while the reader is busy is kept (one permit), so none is missed.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use flotilla_core::{LockExt, NodeId};
use tokio::sync::Notify;

#[derive(Default)]
pub(crate) struct Registry {
    next_id: u64,
    readers: HashMap<u64, Arc<Notify>>,
    /// Readers woken by every change.
    everything: HashSet<u64>,
    /// Readers by (shard, node).
    by_node: HashMap<(u32, NodeId), Vec<u64>>,
}

/// What a stored slot changed.
pub(crate) enum Changed<'a> {
    /// Anything (a snapshot, connectivity): every reader is woken.
    All,
    /// These nodes of the shard.
    Nodes(u32, &'a [&'a NodeId]),
}

impl Registry {
    pub(crate) fn wake(&self, changed: Changed<'_>) {
        match changed {
            Changed::All => self.readers.values().for_each(|n| n.notify_one()),
            Changed::Nodes(shard, nodes) => {
                let by_node = nodes.iter().filter_map(|id| self.by_node.get(&(shard, (*id).clone()))).flatten();
                for id in self.everything.iter().chain(by_node) {
                    if let Some(n) = self.readers.get(id) {
                        n.notify_one();
                    }
                }
            }
        }
    }

    fn unwatch(&mut self, id: u64, keys: &[(u32, NodeId)]) {
        for key in keys {
            if let Some(ids) = self.by_node.get_mut(key) {
                ids.retain(|i| *i != id);
                if ids.is_empty() {
                    self.by_node.remove(key);
                }
            }
        }
    }
}

/// One reader's registration; dropped, it is forgotten.
pub struct Interest {
    id: u64,
    registry: Arc<Mutex<Registry>>,
    notify: Arc<Notify>,
    /// The nodes registered, sorted; `None` while every change wakes the reader.
    nodes: Option<Vec<(u32, NodeId)>>,
}

impl Interest {
    /// A reader woken by every change until it names its nodes.
    pub(crate) fn new(registry: Arc<Mutex<Registry>>) -> Interest {
        let notify = Arc::new(Notify::new());
        let id = {
            let mut r = registry.lock_or_recover();
            r.next_id += 1;
            let id = r.next_id;
            r.readers.insert(id, notify.clone());
            r.everything.insert(id);
            id
        };
        Interest { id, registry, notify, nodes: None }
    }

    /// Wakes the reader for changes of these nodes (by shard index) only, and for
    /// snapshots and connectivity.
    pub fn watch<'a>(&mut self, nodes: impl IntoIterator<Item = (usize, &'a NodeId)>) {
        let mut keys: Vec<(u32, NodeId)> = nodes.into_iter().map(|(s, id)| (s as u32, id.clone())).collect();
        keys.sort_unstable();
        keys.dedup();
        if self.nodes.as_ref() == Some(&keys) {
            return;
        }
        let mut r = self.registry.lock_or_recover();
        let old = self.nodes.take().unwrap_or_default();
        let gone: Vec<(u32, NodeId)> = old.iter().filter(|k| keys.binary_search(k).is_err()).cloned().collect();
        r.unwatch(self.id, &gone);
        for key in keys.iter().filter(|k| old.binary_search(k).is_err()) {
            r.by_node.entry(key.clone()).or_default().push(self.id);
        }
        r.everything.remove(&self.id);
        self.nodes = Some(keys);
    }

    /// Wakes the reader for every change.
    pub fn everything(&mut self) {
        if self.nodes.is_none() {
            return;
        }
        let mut r = self.registry.lock_or_recover();
        r.unwatch(self.id, &self.nodes.take().unwrap_or_default());
        r.everything.insert(self.id);
    }

    /// Completes once a change the reader registered for happened since the last call
    /// completed (at once if one happened meanwhile).
    pub async fn changed(&self) {
        self.notify.notified().await
    }
}

impl Drop for Interest {
    fn drop(&mut self) {
        let mut r = self.registry.lock_or_recover();
        r.unwatch(self.id, &self.nodes.take().unwrap_or_default());
        r.everything.remove(&self.id);
        r.readers.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn id(s: &str) -> NodeId {
        NodeId::new(s).expect("a valid id")
    }

    /// Whether `i` was woken (consumes the wake-up).
    async fn woken(i: &Interest) -> bool {
        tokio::time::timeout(Duration::from_millis(20), i.changed()).await.is_ok()
    }

    #[tokio::test]
    async fn a_delta_wakes_only_the_readers_of_its_nodes() {
        let registry = Arc::new(Mutex::new(Registry::default()));
        let (n1, n2, n3) = (id("n1"), id("n2"), id("n3"));
        let mut a = Interest::new(registry.clone());
        let mut b = Interest::new(registry.clone());
        let all = Interest::new(registry.clone());
        a.watch([(0, &n1), (0, &n2), (0, &n1)]);
        b.watch([(0, &n2), (1, &n3)]);

        registry.lock_or_recover().wake(Changed::Nodes(0, &[&n1]));
        assert!(woken(&a).await);
        assert!(!woken(&b).await, "not b's node");
        assert!(woken(&all).await, "a reader that named no nodes hears everything");

        registry.lock_or_recover().wake(Changed::Nodes(0, &[&n3]));
        assert!(!woken(&b).await, "n3 of another shard");
        registry.lock_or_recover().wake(Changed::Nodes(1, &[&n3]));
        assert!(woken(&b).await);

        registry.lock_or_recover().wake(Changed::All);
        assert!(woken(&a).await && woken(&b).await && woken(&all).await);

        // A change while the reader is busy is kept for its next wait.
        b.watch([(0, &n1)]);
        registry.lock_or_recover().wake(Changed::Nodes(0, &[&n2]));
        assert!(woken(&a).await);
        assert!(!woken(&b).await, "b no longer watches n2");
        registry.lock_or_recover().wake(Changed::Nodes(0, &[&n1]));
        assert!(woken(&b).await);

        b.everything();
        registry.lock_or_recover().wake(Changed::Nodes(0, &[&n3]));
        assert!(woken(&b).await);
        drop(a);
        let r = registry.lock_or_recover();
        assert_eq!(r.readers.len(), 2);
        assert!(!r.by_node.contains_key(&(0, n2.clone())), "a's registration is gone with it");
    }
}
