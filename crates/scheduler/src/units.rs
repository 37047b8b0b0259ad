//! The app's units: their records (as stored and shown) and the map the scheduler keeps
//! them in between passes.
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
use serde::{Deserialize, Serialize};

use crate::lifecycle::UnitState;
use crate::planner::NodeMap;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberRecord {
    pub member: String,
    pub role: String,
    pub node_id: Option<String>,
    pub incarnation: u64,
    pub shard: Option<u32>,
    /// Where the member serves (`host:port`), once the workload runtime reports it.
    pub address: Option<String>,
    /// The workload state its agent last reported (`starting`, `running`, `exited`, `failed`).
    #[serde(default)]
    pub state: Option<String>,
    /// What the member uses, as its agent last measured it (cgroup or /proc); shown by
    /// `units APP --json` and read by the autoscaling policies. Not a reason to write the
    /// record: it changes all the time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Usage>,
    /// The named ports its agent assigned it (the spec's `ports` and `port_ranges`):
    /// shown by `units APP --json`, and passed to members that start after it.
    #[serde(default, skip_serializing_if = "NamedPorts::is_empty")]
    pub ports: NamedPorts,
    /// Why it waits, failed or exited, as its agent last said (`units` shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The generation in this member's ledger key when it is not the unit's: a member
    /// replaced alone, make before break, takes a fresh one from the app's counter, so
    /// its claim never collides with the claim of the member it replaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// Which of its template's alternatives it runs as (0: the template itself; `k`:
    /// `alternatives[k - 1]`), so claims, heals and routes use that build.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub alternative: u32,
    /// Its group's template fingerprint when it was placed (`Fingerprints::roles`): a
    /// rollout that changes only some groups replaces only their members.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// When it was queued to replace the same-named member (in a unit's `surge`): a
    /// rollout's replacement member not running within the progress deadline fails it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub surged_unix_ms: Option<u64>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

impl MemberRecord {
    /// The generation in this member's ledger key (and its agent's reports).
    pub fn key_generation(&self, unit_generation: u64) -> u64 {
        self.generation.unwrap_or(unit_generation)
    }
}

/// A member's named ports and blocks of ports, as its agent reported them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamedPorts {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub named: BTreeMap<String, u16>,
    /// Inclusive (first, last).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub ranges: BTreeMap<String, (u16, u16)>,
}

impl NamedPorts {
    pub fn is_empty(&self) -> bool {
        self.named.is_empty() && self.ranges.is_empty()
    }
}

/// Resources a member uses now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Usage {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnitRecord {
    pub unit_id: String,
    pub app: String,
    pub domain: Option<String>,
    pub generation: u64,
    pub state: UnitState,
    pub members: Vec<MemberRecord>,
    pub created_unix_ms: u64,
    /// Why the last placement attempt failed, as Nomad shows it.
    pub unplaced_reason: Option<String>,
    /// When scale-in chose the unit; its members stop after the drain timeout.
    #[serde(default)]
    pub draining_since_unix_ms: Option<u64>,
    /// The spec's template fingerprint when the unit was queued (`flotilla apply` rolls
    /// units whose fingerprint differs).
    #[serde(default)]
    pub template: Option<String>,
    /// The spec's frame fingerprint when it was placed (`Fingerprints::frame`): while it
    /// holds, a template change rolls the members of the changed groups, not the unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frame: Option<String>,
    /// The template a rollout of some of its members rolls to, and when it first could
    /// not place them: the progress deadline counts from then, so a rollout whose new
    /// members never fit fails like one whose replacement units never run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roll_waits: Option<(String, u64)>,
    /// The unit queued to replace this one (make before break); this one drains once
    /// that one is Running.
    #[serde(default)]
    pub replaced_by: Option<String>,
    /// Why the unit is being moved to a better place (`crate::rebalance`) while its
    /// replacement (`replaced_by`) comes up; unset for a rollout or a leaving node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moving: Option<String>,
    /// When a move of this unit was last started (`crate::rebalance`): it is quiet for
    /// `disruption.quiet_period` from then, whether the move made it or was abandoned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moved_unix_ms: Option<u64>,
    /// In the autoscaling policy's secondary group (Dataproc's secondary workers): placed
    /// on low-priority nodes as well as high-priority ones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub secondary: bool,
    /// How long this unit drains when it was removed by a scale-in that set its own
    /// timeout (`graceful_decommission_timeout`); else the spec's drain timeout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_timeout_ms: Option<u64>,
    /// Why the unit sits where it does when spread could not be honoured (it shares a
    /// node with other units of the app; a surge passed a maximum), or why a drain of
    /// its node waits; `units APP` shows it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement_note: Option<String>,
    /// Members coming up to replace the same-named member, make before break (a worker
    /// on a drained node): each takes its member's place once its agent says it runs,
    /// and only then is the old one released. The unit, its id and its head stay.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub surge: Vec<MemberRecord>,
    /// When the unit was seen Terminated first: its members stopped then, and it is kept
    /// for inspection for a while (`crate::retention`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_unix_ms: Option<u64>,
}

impl UnitRecord {
    /// The generation in the ledger key of `member` (the unit's unless it was replaced
    /// alone).
    pub fn generation_of(&self, member: &str) -> u64 {
        self.members.iter().find(|m| m.member == member).map_or(self.generation, |m| m.key_generation(self.generation))
    }
}

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

    /// The unit to change; copied at its first change while the last status still shares it.
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

    pub fn remove(&mut self, id: &str) {
        if let Some(old) = self.by_id.remove(id) {
            self.counts.count(&old, false);
        }
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
