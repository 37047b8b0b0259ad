//! A pass's live nodes by state. Nodes in the same state (type, free resources, labels,
//! units under per-node limits) take exactly the same requests and score the same, so
//! Ray's "fill every candidate, keep the best" tries one node per state: the first in
//! Ray's node order (its rank), which also breaks ties between states as Ray does. The
//! index is kept as nodes change, so a pass never walks every node for every gang
//! (100,000 gangs on tens of thousands of nodes were quadratic when each gang scanned
//! and copied the whole node list).

use std::collections::{BTreeSet, HashMap};

use super::node::SimNode;
use crate::shape::Shape;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    node_type: Option<usize>,
    free: Shape,
    free_floor: Shape,
    /// Equal label sets share one allocation (see `plan`), so the pointer names them.
    labels: usize,
    units: Vec<(u32, u32)>,
}

impl Key {
    fn of(n: &SimNode) -> Key {
        let mut units = n.units.clone();
        units.sort_unstable();
        Key {
            node_type: n.node_type,
            free: n.free.clone(),
            free_floor: n.free_floor.clone(),
            labels: std::sync::Arc::as_ptr(&n.labels) as usize,
            units,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub(super) struct Classes {
    ids: HashMap<Key, usize>,
    /// Each state's nodes as (rank, index); never empty.
    members: Vec<BTreeSet<(i64, usize)>>,
    keys: Vec<Key>,
}

impl Classes {
    /// Adds node `i` of `rank`, in state `n`.
    pub fn insert(&mut self, i: usize, rank: i64, n: &SimNode) {
        let key = Key::of(n);
        let id = match self.ids.get(&key) {
            Some(id) => *id,
            None => {
                self.ids.insert(key.clone(), self.members.len());
                self.members.push(BTreeSet::new());
                self.keys.push(key);
                self.members.len() - 1
            }
        };
        self.members[id].insert((rank, i));
    }

    /// Removes node `i` of `rank`, in the state `n` it was added in.
    pub fn remove(&mut self, i: usize, rank: i64, n: &SimNode) {
        let Some(&id) = self.ids.get(&Key::of(n)) else { return };
        self.members[id].remove(&(rank, i));
        if self.members[id].is_empty() {
            self.ids.remove(&self.keys[id]);
            self.members.swap_remove(id);
            self.keys.swap_remove(id);
            if let Some(moved) = self.keys.get(id) {
                self.ids.insert(moved.clone(), id);
            }
        }
    }

    /// State `id`'s nodes, first in rank first.
    pub fn members(&self, id: usize) -> impl Iterator<Item = &(i64, usize)> {
        self.members.get(id).into_iter().flatten()
    }

    /// Each state's nodes, first in rank first.
    pub fn iter(&self) -> impl Iterator<Item = (usize, &BTreeSet<(i64, usize)>)> {
        self.members.iter().enumerate()
    }
}
