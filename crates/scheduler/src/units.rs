//! The app's units by id, as the scheduler keeps them between passes.
//!
//! Two things a pass used to rebuild from every unit are kept as the units change
//! instead (BENCHMARKS.md, "Item 1 on the AMD guest"):
//!
//! - each record sits behind an `Arc` shared with the last published status, so
//!   publishing a pass copies pointers, and a record is copied only when a step changes
//!   it ([`Units::get_mut`]);
//! - the spread counts ([`Counts`]: active units per node and per domain), updated when a
//!   unit changes, so planning reads them instead of walking every unit per attempt.
//!
//! Every change goes through [`Units::insert`], [`Units::remove`], [`Units::get_mut`]
//! (whose guard counts the unit again when dropped) or [`Units::update_matching`], which
//! is what keeps the counts exact.

use std::collections::{BTreeMap, HashMap};
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use flotilla_core::NodeId;

use crate::planner::NodeMap;
use crate::store::UnitRecord;

/// The app's units by id, with their spread counts.
#[derive(Debug, Clone, Default)]
pub struct Units {
    by_id: BTreeMap<String, Arc<UnitRecord>>,
    counts: Counts,
}

/// Active units of the app on each node (a unit counts once on every node where one of
/// its members, or a member coming up to replace one, is placed) and in each domain: what
/// `spread` limits and prefers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Counts {
    pub per_node: NodeMap<u32>,
    pub per_domain: HashMap<String, u32>,
}

impl Counts {
    /// Counts `u` in (`add`) or out.
    fn count(&mut self, u: &UnitRecord, add: bool) {
        if !u.state.is_active() {
            return;
        }
        if let Some(d) = &u.domain {
            bump(&mut self.per_domain, d.as_str(), add, |d| Some(d.to_string()));
        }
        let nodes = || u.members.iter().chain(&u.surge).filter_map(|m| m.node_id.as_deref());
        for (i, n) in nodes().enumerate() {
            if !nodes().take(i).any(|earlier| earlier == n) {
                bump(&mut self.per_node, n, add, |n| NodeId::new(n).ok());
            }
        }
    }

    /// The counts without unit `u` (a unit placed again is not in its own way).
    pub fn without(&self, u: &UnitRecord) -> Counts {
        let mut c = self.clone();
        c.count(u, false);
        c
    }
}

/// Adds one to `key`'s count, or takes one away (a count that reaches 0 leaves the map).
fn bump<K, S>(map: &mut HashMap<K, u32, S>, key: &str, add: bool, owned: impl FnOnce(&str) -> Option<K>)
where
    K: std::borrow::Borrow<str> + std::hash::Hash + Eq,
    S: std::hash::BuildHasher,
{
    match (map.get_mut(key), add) {
        (Some(n), true) => *n += 1,
        (Some(n), false) if *n > 1 => *n -= 1,
        (Some(_), false) => {
            map.remove(key);
        }
        (None, true) => {
            if let Some(k) = owned(key) {
                map.insert(k, 1);
            }
        }
        (None, false) => {}
    }
}

/// A unit being changed; counted again when dropped.
pub struct UnitMut<'a> {
    unit: &'a mut Arc<UnitRecord>,
    counts: &'a mut Counts,
}

impl UnitMut<'_> {
    /// The record as changed so far, shared (a write of it copies nothing; a change
    /// after this copies the record first, so the write keeps what it was given).
    pub fn shared(&self) -> Arc<UnitRecord> {
        self.unit.clone()
    }
}

impl Deref for UnitMut<'_> {
    type Target = UnitRecord;

    fn deref(&self) -> &UnitRecord {
        self.unit
    }
}

impl DerefMut for UnitMut<'_> {
    fn deref_mut(&mut self) -> &mut UnitRecord {
        Arc::make_mut(self.unit)
    }
}

impl Drop for UnitMut<'_> {
    fn drop(&mut self) {
        self.counts.count(self.unit, true);
    }
}

impl Units {
    pub fn get(&self, id: &str) -> Option<&UnitRecord> {
        self.by_id.get(id).map(|u| &**u)
    }

    /// The unit as shared: a write of it copies nothing.
    pub fn get_shared(&self, id: &str) -> Option<&Arc<UnitRecord>> {
        self.by_id.get(id)
    }

    /// The unit to change; copied first if the last status still shows it.
    pub fn get_mut(&mut self, id: &str) -> Option<UnitMut<'_>> {
        self.get_mut_if(id, |_| true)
    }

    /// The unit to change if `pick` chooses it; copied only then.
    pub fn get_mut_if(&mut self, id: &str, pick: impl FnOnce(&UnitRecord) -> bool) -> Option<UnitMut<'_>> {
        let u = self.by_id.get_mut(id).filter(|u| pick(u))?;
        self.counts.count(u, false);
        Some(UnitMut { unit: u, counts: &mut self.counts })
    }

    /// Changes each unit `pick` chooses with `change`; only those are copied (changing
    /// every unit would copy every unit the last status shows).
    pub fn update_matching(&mut self, mut pick: impl FnMut(&UnitRecord) -> bool, mut change: impl FnMut(&mut UnitMut)) {
        for u in self.by_id.values_mut().filter(|u| pick(u)) {
            self.counts.count(u, false);
            change(&mut UnitMut { unit: u, counts: &mut self.counts });
        }
    }

    pub fn insert(&mut self, unit: impl Into<Arc<UnitRecord>>) {
        let unit = unit.into();
        self.counts.count(&unit, true);
        if let Some(old) = self.by_id.insert(unit.unit_id.clone(), unit) {
            self.counts.count(&old, false);
        }
    }

    pub fn remove(&mut self, id: &str) -> Option<UnitRecord> {
        let old = self.by_id.remove(id)?;
        self.counts.count(&old, false);
        Some(Arc::unwrap_or_clone(old))
    }

    pub fn contains_key(&self, id: &str) -> bool {
        self.by_id.contains_key(id)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &String> + Clone {
        self.by_id.keys()
    }

    /// In id order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &UnitRecord> + Clone {
        self.by_id.values().map(|u| &**u)
    }

    /// The records as shared, in id order: what a status shows.
    pub fn shared(&self) -> impl Iterator<Item = &Arc<UnitRecord>> {
        self.by_id.values()
    }

    /// The spread counts of the units as they are now.
    pub fn counts(&self) -> &Counts {
        // Every test that plans checks the kept counts against the units.
        debug_assert_eq!(self.counts, self.recounted(), "the spread counts drifted from the units");
        &self.counts
    }

    /// The counts from every unit, as planning built them before they were kept.
    fn recounted(&self) -> Counts {
        let mut c = Counts::default();
        for u in self.values() {
            c.count(u, true);
        }
        c
    }
}

/// The units are equal when their records are; the counts follow from them.
impl PartialEq for Units {
    fn eq(&self, other: &Self) -> bool {
        self.by_id == other.by_id
    }
}

impl Eq for Units {}

impl FromIterator<UnitRecord> for Units {
    fn from_iter<I: IntoIterator<Item = UnitRecord>>(units: I) -> Self {
        let mut all = Units::default();
        for u in units {
            all.insert(u);
        }
        all
    }
}

/// Tests build units as maps by id, as the stores do.
#[cfg(test)]
impl FromIterator<(String, UnitRecord)> for Units {
    fn from_iter<I: IntoIterator<Item = (String, UnitRecord)>>(units: I) -> Self {
        units.into_iter().map(|(_, u)| u).collect()
    }
}

#[cfg(test)]
impl From<BTreeMap<String, UnitRecord>> for Units {
    fn from(units: BTreeMap<String, UnitRecord>) -> Self {
        units.into_values().collect()
    }
}

#[cfg(test)]
impl std::ops::Index<&str> for Units {
    type Output = UnitRecord;

    fn index(&self, id: &str) -> &UnitRecord {
        &self.by_id[id]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lifecycle::UnitState;
    use crate::testing::unit;

    #[test]
    fn the_spread_counts_follow_every_change() {
        let mut units = Units::from_iter([
            unit("a-1", 1, UnitState::Running, &[("head", "n1"), ("w", "n2")]),
            unit("a-2", 2, UnitState::Running, &[("head", "n1"), ("w", "n1")]),
            UnitRecord { domain: None, ..unit("a-3", 3, UnitState::Queued, &[]) },
        ]);
        let per_node = |u: &Units, n: &str| u.counts().per_node.get(n).copied();
        assert_eq!(per_node(&units, "n1"), Some(2), "a unit counts once on a node");
        assert_eq!(units.counts().per_domain.get("d"), Some(&2));

        // A change through the guard is counted when the guard goes.
        if let Some(mut u) = units.get_mut("a-1") {
            u.members[1].node_id = Some("n3".into());
        }
        assert_eq!((per_node(&units, "n2"), per_node(&units, "n3")), (None, Some(1)));
        // A unit that stops being active leaves the counts.
        units.update_matching(|u| u.unit_id == "a-2", |u| u.state = UnitState::Draining);
        assert_eq!(per_node(&units, "n1"), Some(1));
        // Placed: counted where it went.
        if let Some(mut u) = units.get_mut("a-3") {
            *u = UnitRecord { state: UnitState::Allocated, ..unit("a-3", 3, UnitState::Allocated, &[("head", "n4")]) };
        }
        units.insert(unit("a-4", 4, UnitState::Running, &[("head", "n4")]));
        units.insert(unit("a-4", 4, UnitState::Running, &[("head", "n5")]));
        assert_eq!((per_node(&units, "n4"), per_node(&units, "n5")), (Some(1), Some(1)), "replaced, not added");
        units.remove("a-1");
        assert_eq!(units.counts(), &units.recounted());
        assert_eq!(units.counts().without(&units["a-3"]), {
            let mut c = units.recounted();
            c.count(&units["a-3"], false);
            c
        });
        // A unit the status shares is copied when changed; the shared record is not.
        let shown: Vec<_> = units.shared().cloned().collect();
        units.get_mut_if("a-4", |_| false);
        assert!(Arc::ptr_eq(&shown[2], units.shared().nth(2).unwrap_or(&shown[0])), "not chosen: not copied");
        if let Some(mut u) = units.get_mut("a-4") {
            u.unplaced_reason = Some("x".into());
        }
        assert_eq!(shown[2].unplaced_reason, None);
        assert_eq!(units.counts(), &units.recounted());
    }
}
