//! The shard's ledger: the one authority on what runs where on its nodes.
//!
//! Pure logic (no I/O, time passed in). Entries are keyed by (app, unit, member,
//! generation), so a replayed claim finds its own entry and allocates nothing twice;
//! a node's `allocated` is always the sum of its entries and never exceeds its capacity.
//!
//! Fencing: the ledger remembers, per app, the highest fencing token (the scheduler's
//! lease epoch) any request carried, and [`Ledger::fence`] refuses a lower one, so a
//! deposed scheduler that wakes up from a pause can neither place nor release anything.
//! The marks are part of the shard's persisted state (`crate::persist`).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use flotilla_core::{ErrorKind, NodeId, NodeStatus, Resources, ServiceError};
use flotilla_proto::v1;

/// The hasher of the maps every claim visits several times (its key, its node): SipHash
/// was a twentieth of a shard's commit CPU. Seeded per process, and only schedulers
/// holding the shard's token choose the keys.
type Fast = foldhash::fast::RandomState;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClaimKey {
    pub app: String,
    pub unit: String,
    pub member: String,
    pub generation: u64,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    pub key: ClaimKey,
    pub node: NodeId,
    pub incarnation: u64,
    pub resources: Resources,
    pub allow_low_priority: bool,
    /// Claims sharing a non-empty group are accepted together or not at all.
    pub group: String,
    pub workload: v1::Workload,
}

/// Why the ledger refused one claim (a verdict in the answer, not a failed request: the
/// request's other claims are judged on their own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClaimReject {
    NoFit,
    NodeNotAlive(NodeStatus),
    IncarnationMismatch,
    UnknownNode,
    Recovering,
    Priority,
    Group,
    AlreadyPlaced,
    Cordoned,
    /// The request's fencing token is older than the app's mark.
    Fenced,
}

impl ClaimReject {
    /// Its stable name: the claim result's detail and the `flotilla_claims_total` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimReject::NoFit => "no_fit",
            ClaimReject::NodeNotAlive(_) => "node_not_alive",
            ClaimReject::IncarnationMismatch => "incarnation_mismatch",
            ClaimReject::UnknownNode => "unknown_node",
            ClaimReject::Recovering => "shard_recovering",
            ClaimReject::Priority => "priority",
            ClaimReject::Group => "group",
            ClaimReject::AlreadyPlaced => "already_placed",
            ClaimReject::Cordoned => "cordoned",
            ClaimReject::Fenced => "fenced",
        }
    }
}

/// What the shard's view says about a node when a claim arrives.
#[derive(Debug, Clone)]
pub struct NodeFacts {
    pub status: NodeStatus,
    pub incarnation: u64,
    pub capacity: Resources,
    pub low_priority: bool,
    pub cordoned: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    pub claim: Claim,
    /// Set while the entry is a reservation that still needs a confirm.
    pub reserved_until_ms: Option<u64>,
}

#[derive(Debug, Default, Clone)]
pub struct NodeBook {
    pub incarnation: u64,
    pub allocated: Resources,
    pub entries: Entries,
    /// Bumped on every change to the node's assignment set.
    pub version: u64,
}

/// A node's entries, sorted by key: a vector of boxed entries (8 bytes a slot, the key read
/// from the entry). A `BTreeMap` kept keys and 480-byte entries inline in 6 KB nodes, so
/// every insert shifted and split whole entries and every node that held anything paid
/// for a full leaf; in the roomy schedule loadtest this took a shard's commit from 19-24
/// to 7-9 ms and its peak RSS from 228 to 152 MB (BENCHMARKS.md, issue #19 item 1).
#[derive(Debug, Default, Clone)]
#[allow(clippy::vec_box, reason = "an insert shifts 8-byte pointers, not 480-byte entries")]
pub struct Entries(Vec<Box<Entry>>);

impl Entries {
    fn find(&self, key: &ClaimKey) -> Result<usize, usize> {
        self.0.binary_search_by(|e| e.claim.key.cmp(key))
    }

    pub fn get(&self, key: &ClaimKey) -> Option<&Entry> {
        self.find(key).ok().map(|i| &*self.0[i])
    }

    pub fn get_mut(&mut self, key: &ClaimKey) -> Option<&mut Entry> {
        self.find(key).ok().map(|i| &mut *self.0[i])
    }

    pub fn contains_key(&self, key: &ClaimKey) -> bool {
        self.find(key).is_ok()
    }

    /// Adds `entry`, or replaces the one with its key.
    pub fn insert(&mut self, entry: Entry) {
        match self.find(&entry.claim.key) {
            Ok(i) => *self.0[i] = entry,
            Err(i) => self.0.insert(i, Box::new(entry)),
        }
    }

    pub fn remove(&mut self, key: &ClaimKey) -> Option<Entry> {
        self.find(key).ok().map(|i| *self.0.remove(i))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// In key order.
    pub fn values(&self) -> impl Iterator<Item = &Entry> {
        self.0.iter().map(|e| &**e)
    }

    pub fn keys(&self) -> impl Iterator<Item = &ClaimKey> {
        self.values().map(|e| &e.claim.key)
    }
}

pub type Outcome = Vec<(ClaimKey, Result<(), ClaimReject>)>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmStatus {
    Confirmed,
    Expired,
    UnknownReservation,
    /// The token is older than the mark of the reservation's app: nothing changed.
    Fenced,
}

/// Apps whose fencing marks one shard remembers. Past this, an app not yet known that
/// brings a non-zero token is refused (forgetting a mark would let a deposed scheduler
/// back in); a shard serving that many apps is far past its design.
pub const MAX_FENCED_APPS: usize = 65_536;

/// Why [`Ledger::fence`] refused a request: the whole request is refused and nothing
/// in it is applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Fenced {
    #[error(
        "fenced: app {app:?} sent fencing token {token}, but this shard has seen {mark}: a newer scheduler holds the app's lease"
    )]
    Stale { app: String, token: u64, mark: u64 },
    #[error("fenced: this shard already remembers fencing marks for {MAX_FENCED_APPS} apps")]
    TooManyApps,
}

impl ServiceError for Fenced {
    fn kind(&self) -> ErrorKind {
        ErrorKind::Conflict
    }

    /// The one code a scheduler acts on: it lost its lease and must stop.
    fn code(&self) -> &'static str {
        "fenced"
    }
}

/// Transactions remembered for exact replays.
const TXN_MEMORY: usize = 65_536;

#[derive(Default)]
pub struct Ledger {
    nodes: HashMap<NodeId, NodeBook, Fast>,
    placed: HashMap<ClaimKey, NodeId, Fast>,
    txns: HashMap<String, Outcome>,
    txn_order: VecDeque<String>,
    reservations: HashMap<String, (Vec<ClaimKey>, u64)>,
    confirmed: HashSet<String>,
    /// Keys released while this ledger did not hold them (a restarted shard, before the
    /// agent came back): `adopt` must not bring them back. Bounded, oldest out first.
    tombstones: HashSet<ClaimKey, Fast>,
    tomb_order: VecDeque<ClaimKey>,
    /// The highest fencing token seen per app (absent: none above 0 yet).
    marks: HashMap<String, u64>,
}

impl Ledger {
    pub fn new() -> Self {
        Ledger::default()
    }

    pub fn book(&self, node: &NodeId) -> Option<&NodeBook> {
        self.nodes.get(node)
    }

    pub fn allocated(&self, node: &NodeId) -> Resources {
        self.nodes.get(node).map(|b| b.allocated.clone()).unwrap_or_default()
    }

    /// The members a node must run: confirmed entries only.
    pub fn assignments(&self, node: &NodeId) -> (u64, Vec<&Claim>) {
        match self.nodes.get(node) {
            Some(b) => {
                (b.version, b.entries.values().filter(|e| e.reserved_until_ms.is_none()).map(|e| &e.claim).collect())
            }
            None => (0, Vec::new()),
        }
    }

    pub fn placement(&self, key: &ClaimKey) -> Option<&NodeId> {
        self.placed.get(key)
    }

    /// Checks a request's fencing `token` against the mark of every app in `apps`: a
    /// lower token refuses the whole request (nothing is changed); otherwise each mark
    /// rises to `token`. Token 0 means "no lease" and passes only while no higher token
    /// was seen. Returns whether a mark rose (the caller persists the marks before it
    /// answers). Call it under the same lock as the operation it guards, so no request
    /// with a newer token can slip between the check and the change.
    pub fn fence<'a>(&mut self, token: u64, apps: impl IntoIterator<Item = &'a str>) -> Result<bool, Fenced> {
        let apps: BTreeSet<&str> = apps.into_iter().collect();
        let mut new_apps = 0;
        for app in &apps {
            match self.marks.get(*app) {
                Some(&mark) if token < mark => {
                    return Err(Fenced::Stale { app: (*app).to_string(), token, mark });
                }
                None if token > 0 => new_apps += 1,
                _ => {}
            }
        }
        if self.marks.len() + new_apps > MAX_FENCED_APPS {
            return Err(Fenced::TooManyApps);
        }
        let mut raised = false;
        if token > 0 {
            for app in apps {
                let mark = self.marks.entry(app.to_string()).or_default();
                if *mark < token {
                    *mark = token;
                    raised = true;
                }
            }
        }
        Ok(raised)
    }

    /// The highest fencing token seen for `app` (0: none).
    pub fn mark(&self, app: &str) -> u64 {
        self.marks.get(app).copied().unwrap_or(0)
    }

    /// Every app's mark, for the shard's persisted state.
    pub fn marks(&self) -> BTreeMap<String, u64> {
        self.marks.iter().map(|(a, t)| (a.clone(), *t)).collect()
    }

    /// Restores persisted marks (a restarted shard): a mark only ever rises.
    pub fn restore_marks(&mut self, marks: impl IntoIterator<Item = (String, u64)>) {
        for (app, token) in marks {
            let mark = self.marks.entry(app).or_default();
            *mark = (*mark).max(token);
        }
    }

    /// The apps of reservation `txn`'s keys (empty when it is unknown), for fencing a
    /// confirm, which names only the transaction.
    pub fn reservation_apps(&self, txn: &str) -> BTreeSet<String> {
        self.reservations.get(txn).map(|(keys, _)| keys.iter().map(|k| k.app.clone()).collect()).unwrap_or_default()
    }

    /// Commits `claims` (see the module doc); returns each claim's result and the nodes
    /// whose assignment set changed.
    pub fn commit(
        &mut self,
        txn: &str,
        claims: &[Claim],
        facts: &dyn Fn(&NodeId) -> Option<NodeFacts>,
    ) -> (Outcome, Vec<NodeId>) {
        self.apply(txn, claims, None, facts)
    }

    /// Like commit, but the entries hold their resources only until `until_ms` unless confirmed.
    pub fn reserve(
        &mut self,
        txn: &str,
        claims: &[Claim],
        until_ms: u64,
        facts: &dyn Fn(&NodeId) -> Option<NodeFacts>,
    ) -> (Outcome, Vec<NodeId>) {
        self.apply(txn, claims, Some(until_ms), facts)
    }

    fn apply(
        &mut self,
        txn: &str,
        claims: &[Claim],
        reserve_until: Option<u64>,
        facts: &dyn Fn(&NodeId) -> Option<NodeFacts>,
    ) -> (Outcome, Vec<NodeId>) {
        if let Some(prev) = self.txns.get(txn) {
            return (prev.clone(), Vec::new());
        }
        // A new claim on a key supersedes an earlier release of it.
        for c in claims {
            self.tombstones.remove(&c.key);
        }
        // Units of work in request order: a group, or a lone claim.
        let mut order: Vec<Vec<usize>> = Vec::new();
        let mut group_at: HashMap<&str, usize> = HashMap::new();
        for (i, c) in claims.iter().enumerate() {
            if c.group.is_empty() {
                order.push(vec![i]);
            } else if let Some(&g) = group_at.get(c.group.as_str()) {
                order[g].push(i);
            } else {
                group_at.insert(&c.group, order.len());
                order.push(vec![i]);
            }
        }
        let mut results: Vec<Option<Result<(), ClaimReject>>> = vec![None; claims.len()];
        let mut changed = Vec::new();
        let mut changed_set: HashSet<&NodeId, Fast> = HashSet::with_capacity_and_hasher(claims.len(), Fast::default());
        // A key claimed twice in one request is one member: the second claim is a replay.
        let mut in_request: HashMap<&ClaimKey, &NodeId, Fast> =
            HashMap::with_capacity_and_hasher(claims.len(), Fast::default());
        // What the unit being checked adds, by node and by key: a unit is a few members, so
        // these are short vectors, reused from unit to unit.
        let mut extra: Vec<(&NodeId, Resources)> = Vec::new();
        let mut unit_keys: Vec<(&ClaimKey, &NodeId)> = Vec::new();
        let mut verdicts = Vec::new();
        for unit in order {
            // Check the whole unit against the books plus what it adds itself.
            extra.clear();
            unit_keys.clear();
            for &i in &unit {
                let c = &claims[i];
                let earlier =
                    in_request.get(&c.key).or_else(|| unit_keys.iter().find(|(k, _)| *k == &c.key).map(|(_, n)| n));
                let v = match earlier {
                    Some(n) if **n == c.node => Ok(false),
                    Some(_) => Err(ClaimReject::AlreadyPlaced),
                    None => self.check(c, extra.iter().find(|(n, _)| **n == c.node).map(|(_, r)| r), facts),
                };
                if v == Ok(true) {
                    unit_keys.push((&c.key, &c.node));
                    match extra.iter_mut().find(|(n, _)| **n == c.node) {
                        Some((_, sum)) => {
                            if let Ok(more) = sum.checked_add(&c.resources) {
                                *sum = more;
                            }
                        }
                        None => extra.push((&c.node, c.resources.clone())),
                    }
                }
                verdicts.push(v);
            }
            let all_ok = verdicts.iter().all(|v| v.is_ok());
            if all_ok {
                in_request.extend(unit_keys.iter().copied());
            }
            for (&i, v) in unit.iter().zip(verdicts.drain(..)) {
                let c = &claims[i];
                results[i] = Some(match v {
                    Err(r) => Err(r),
                    Ok(_) if !all_ok => Err(ClaimReject::Group),
                    Ok(false) => {
                        // Already held: a replay. One with another workload changes what
                        // the member runs (a held member released with its head's address).
                        if self.update_workload(c) && changed_set.insert(&c.node) {
                            changed.push(c.node.clone());
                        }
                        Ok(())
                    }
                    Ok(true) => {
                        // `check` matched the claim's incarnation with the node's.
                        self.insert(c.clone(), c.incarnation, reserve_until);
                        if changed_set.insert(&c.node) {
                            changed.push(c.node.clone());
                        }
                        Ok(())
                    }
                });
            }
        }
        let outcome: Outcome =
            claims.iter().zip(results).map(|(c, r)| (c.key.clone(), r.unwrap_or(Err(ClaimReject::Group)))).collect();
        if let Some(until) = reserve_until {
            let keys =
                claims.iter().zip(&outcome).filter(|(_, (_, r))| r.is_ok()).map(|(c, _)| c.key.clone()).collect();
            self.reservations.insert(txn.to_string(), (keys, until));
        }
        self.remember(txn, outcome.clone());
        (outcome, changed)
    }

    /// `Ok(true)`: fits and must be added; `Ok(false)`: this exact member is already
    /// held on that node (a replay).
    fn check(
        &self,
        c: &Claim,
        extra: Option<&Resources>,
        facts: &dyn Fn(&NodeId) -> Option<NodeFacts>,
    ) -> Result<bool, ClaimReject> {
        let f = facts(&c.node).ok_or(ClaimReject::UnknownNode)?;
        if let Some(on) = self.placed.get(&c.key) {
            return if *on == c.node && self.nodes.get(on).is_some_and(|b| b.incarnation == c.incarnation) {
                Ok(false)
            } else {
                Err(ClaimReject::AlreadyPlaced)
            };
        }
        match f.status {
            NodeStatus::Alive => {}
            NodeStatus::Unknown => return Err(ClaimReject::Recovering),
            s => return Err(ClaimReject::NodeNotAlive(s)),
        }
        if f.incarnation != c.incarnation {
            return Err(ClaimReject::IncarnationMismatch);
        }
        if f.low_priority && !c.allow_low_priority {
            return Err(ClaimReject::Priority);
        }
        if f.cordoned {
            return Err(ClaimReject::Cordoned);
        }
        let held = match self.nodes.get(&c.node) {
            Some(b) if b.incarnation == f.incarnation => b.allocated.clone(),
            _ => Resources::default(),
        };
        let held = match extra {
            Some(e) => held.checked_add(e).map_err(|_| ClaimReject::NoFit)?,
            None => held,
        };
        let wanted = held.checked_add(&c.resources).map_err(|_| ClaimReject::NoFit)?;
        if wanted.fits_in(&f.capacity) { Ok(true) } else { Err(ClaimReject::NoFit) }
    }

    fn insert(&mut self, claim: Claim, incarnation: u64, reserved_until_ms: Option<u64>) {
        if self.nodes.get(&claim.node).is_some_and(|b| b.incarnation != incarnation) {
            // A restarted node is a new node: what the old one held is gone.
            self.forget_node(&claim.node);
        }
        let book =
            self.nodes.entry(claim.node.clone()).or_insert_with(|| NodeBook { incarnation, ..Default::default() });
        // Cannot overflow: `check` added the same amounts.
        book.allocated = book.allocated.checked_add(&claim.resources).unwrap_or_else(|_| book.allocated.clone());
        book.version += 1;
        self.placed.insert(claim.key.clone(), claim.node.clone());
        book.entries.insert(Entry { claim, reserved_until_ms });
    }

    /// Puts `c`'s workload in the entry its key holds on its node, if it differs: the
    /// scheduler releases a member held back for start order this way (the same key, so
    /// nothing is allocated twice). Returns whether the node's assignment set changed.
    fn update_workload(&mut self, c: &Claim) -> bool {
        let Some(book) = self.nodes.get_mut(&c.node) else { return false };
        let Some(entry) = book.entries.get_mut(&c.key) else { return false };
        if entry.claim.workload == c.workload {
            return false;
        }
        entry.claim.workload = c.workload.clone();
        book.version += 1;
        true
    }

    fn remember(&mut self, txn: &str, outcome: Outcome) {
        if self.txn_order.len() >= TXN_MEMORY
            && let Some(old) = self.txn_order.pop_front()
        {
            self.txns.remove(&old);
            self.confirmed.remove(&old);
        }
        self.txn_order.push_back(txn.to_string());
        self.txns.insert(txn.to_string(), outcome);
    }

    /// Turns a reservation into allocations, unless it expired (or never existed here,
    /// for instance because the shard restarted): never a false success.
    pub fn confirm(&mut self, txn: &str, now_ms: u64) -> (ConfirmStatus, Vec<NodeId>) {
        if self.confirmed.contains(txn) {
            return (ConfirmStatus::Confirmed, Vec::new());
        }
        let Some((keys, until)) = self.reservations.remove(txn) else {
            return (ConfirmStatus::UnknownReservation, Vec::new());
        };
        if now_ms > until {
            let changed = self.release(&keys);
            return (ConfirmStatus::Expired, changed);
        }
        let mut changed = Vec::new();
        for k in &keys {
            if let Some(node) = self.placed.get(k).cloned()
                && let Some(b) = self.nodes.get_mut(&node)
                && let Some(e) = b.entries.get_mut(k)
            {
                e.reserved_until_ms = None;
                b.version += 1;
                if !changed.contains(&node) {
                    changed.push(node);
                }
            }
        }
        self.confirmed.insert(txn.to_string());
        (ConfirmStatus::Confirmed, changed)
    }

    /// Releases reservations whose TTL has passed; returns the nodes that changed.
    pub fn expire(&mut self, now_ms: u64) -> Vec<NodeId> {
        let due: Vec<String> =
            self.reservations.iter().filter(|(_, (_, u))| *u < now_ms).map(|(t, _)| t.clone()).collect();
        let mut changed = Vec::new();
        for t in due {
            if let Some((keys, _)) = self.reservations.remove(&t) {
                for n in self.release(&keys) {
                    if !changed.contains(&n) {
                        changed.push(n);
                    }
                }
            }
        }
        changed
    }

    /// Frees the entries of `keys`; unknown keys are ignored (release is idempotent).
    pub fn release(&mut self, keys: &[ClaimKey]) -> Vec<NodeId> {
        let mut changed = Vec::new();
        for k in keys {
            let Some(node) = self.placed.remove(k) else {
                if self.tombstones.insert(k.clone()) {
                    self.tomb_order.push_back(k.clone());
                    if self.tomb_order.len() > TXN_MEMORY
                        && let Some(old) = self.tomb_order.pop_front()
                    {
                        self.tombstones.remove(&old);
                    }
                }
                continue;
            };
            if let Some(b) = self.nodes.get_mut(&node)
                && let Some(e) = b.entries.remove(k)
            {
                b.allocated = b.allocated.checked_sub(&e.claim.resources).unwrap_or_default();
                b.version += 1;
            }
            if !changed.contains(&node) {
                changed.push(node);
            }
        }
        changed
    }

    /// Rebuilds a node's book from what its agent reports running (a restarted shard
    /// knows nothing else). Only for a node the ledger holds nothing for: once a node has
    /// a book, the ledger is the authority and reports change nothing. An entry whose key
    /// is already placed elsewhere, or that would not fit, is left out (the next push tells
    /// the agent to stop it). The book continues from the agent's `version`, so its next
    /// push is newer than what the agent holds. Returns (adopted, left out).
    pub fn adopt(
        &mut self,
        node: &NodeId,
        incarnation: u64,
        capacity: &Resources,
        claims: Vec<Claim>,
        version: u64,
    ) -> (usize, usize) {
        if self.nodes.contains_key(node) {
            return (0, claims.len());
        }
        let mut book = NodeBook { incarnation, version, ..NodeBook::default() };
        let mut left_out = 0;
        for c in claims {
            let fits = book.allocated.checked_add(&c.resources).ok().filter(|sum| sum.fits_in(capacity));
            match fits {
                Some(sum)
                    if c.node == *node
                        && !self.placed.contains_key(&c.key)
                        && !book.entries.contains_key(&c.key)
                        && !self.tombstones.contains(&c.key) =>
                {
                    book.allocated = sum;
                    self.placed.insert(c.key.clone(), node.clone());
                    book.entries.insert(Entry { claim: c, reserved_until_ms: None });
                }
                _ => left_out += 1,
            }
        }
        let adopted = book.entries.len();
        if left_out > 0 {
            // The agent runs something the book does not hold: push the corrected set.
            book.version += 1;
        }
        self.nodes.insert(node.clone(), book);
        (adopted, left_out)
    }

    /// Drops everything a node held (it was replaced by a new incarnation, or forgotten).
    pub fn forget_node(&mut self, node: &NodeId) {
        if let Some(b) = self.nodes.remove(node) {
            for k in b.entries.keys() {
                self.placed.remove(k);
            }
        }
    }

    /// The invariant every test checks: each node's `allocated` is the sum of its
    /// entries, fits its capacity, and every member is placed exactly once.
    pub fn check_invariant(&self, capacity: &dyn Fn(&NodeId) -> Option<Resources>) -> Result<(), String> {
        let mut seen = HashSet::new();
        for (node, b) in &self.nodes {
            let mut sum = Resources::default();
            for e in b.entries.values() {
                let k = &e.claim.key;
                sum = sum.checked_add(&e.claim.resources).map_err(|e| e.to_string())?;
                if !seen.insert(k.clone()) {
                    return Err(format!("{k:?} is placed twice"));
                }
                if self.placed.get(k) != Some(node) {
                    return Err(format!("{k:?} index disagrees"));
                }
            }
            if sum != b.allocated {
                return Err(format!("{node}: allocated {:?} != sum of entries {:?}", b.allocated, sum));
            }
            if let Some(cap) = capacity(node)
                && !sum.fits_in(&cap)
            {
                return Err(format!("{node}: {sum:?} exceeds capacity {cap:?}"));
            }
        }
        if seen.len() != self.placed.len() {
            return Err("placement index holds keys without entries".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn node(i: usize) -> NodeId {
        NodeId::new(&format!("n{i}")).unwrap()
    }

    fn claim(unit: &str, member: &str, n: usize, cpu: u64, group: &str) -> Claim {
        Claim {
            key: ClaimKey { app: "a".into(), unit: unit.into(), member: member.into(), generation: 1 },
            node: node(n),
            incarnation: 1,
            resources: Resources::new(cpu, 0, 0),
            allow_low_priority: false,
            group: group.into(),
            workload: v1::Workload::default(),
        }
    }

    fn facts(n: &NodeId) -> Option<NodeFacts> {
        let i: usize = n.as_str()[1..].parse().ok()?;
        (i < 4 || i == 5).then(|| NodeFacts {
            status: if i == 3 { NodeStatus::Suspect } else { NodeStatus::Alive },
            incarnation: 1,
            capacity: Resources::new(1000, 0, 0),
            low_priority: i == 2,
            cordoned: i == 5,
        })
    }

    fn cap(n: &NodeId) -> Option<Resources> {
        facts(n).map(|f| f.capacity)
    }

    #[test]
    fn a_restarted_shard_adopts_what_agents_report_once_and_never_twice() {
        let mut l = Ledger::new();
        let c = Resources::new(1000, 0, 0);
        let report = vec![claim("u1", "head", 0, 400, ""), claim("u2", "head", 0, 400, "")];
        assert_eq!(l.adopt(&node(0), 1, &c, report.clone(), 17), (2, 0));
        assert_eq!(l.allocated(&node(0)), Resources::new(800, 0, 0));
        assert_eq!(l.assignments(&node(0)).0, 17, "continues from the agent's version");
        // A second report (a reconnect) changes nothing: the ledger is the authority now.
        assert_eq!(l.adopt(&node(0), 1, &c, report, 17), (0, 2));
        assert_eq!(l.allocated(&node(0)), Resources::new(800, 0, 0));
        // What does not fit, or is placed elsewhere already, is left out; the version moves
        // so the agent is told.
        let report =
            vec![claim("u1", "head", 1, 400, ""), claim("u3", "head", 1, 700, ""), claim("u4", "head", 1, 500, "")];
        assert_eq!(l.adopt(&node(1), 1, &c, report, 3), (1, 2));
        assert_eq!(l.allocated(&node(1)), Resources::new(700, 0, 0));
        assert_eq!(l.assignments(&node(1)).0, 4);
        l.check_invariant(&cap).unwrap();
        // A release that came before the agent did is not undone by its report.
        l.release(&[claim("u9", "head", 3, 100, "").key]);
        assert_eq!(l.adopt(&node(3), 1, &c, vec![claim("u9", "head", 3, 100, "")], 1), (0, 1));
        // Adopted entries are ordinary entries: a replayed commit finds them placed.
        let (out, _) = l.commit("t", &[claim("u1", "head", 2, 100, "")], &facts);
        assert_eq!(out[0].1, Err(ClaimReject::AlreadyPlaced));
    }

    #[test]
    fn a_member_replaced_alone_under_its_own_generation_is_a_second_entry_and_survives_a_restart() {
        // A worker moving off a drained node, make before break: the new claim carries the
        // member's own generation, so the old worker's entry stays until it is released.
        let mut l = Ledger::new();
        let old = claim("u1", "worker-0", 0, 300, "u1");
        let new = Claim { key: ClaimKey { generation: 7, ..old.key.clone() }, node: node(1), ..old.clone() };
        assert!(l.commit("t1", std::slice::from_ref(&old), &facts).0.iter().all(|(_, r)| r.is_ok()));
        let (out, _) = l.commit("t2", std::slice::from_ref(&new), &facts);
        assert_eq!(out[0].1, Ok(()), "not already_placed: another generation is another key");
        assert_eq!((l.placement(&old.key), l.placement(&new.key)), (Some(&node(0)), Some(&node(1))));
        l.release(std::slice::from_ref(&old.key));
        assert_eq!((l.placement(&old.key), l.allocated(&node(0))), (None, Resources::default()));
        // A restarted shard rebuilds the new entry from the agent's report (its generation
        // included), and the old key, released before, never comes back.
        let mut r = Ledger::new();
        let c = Resources::new(1000, 0, 0);
        assert_eq!(r.adopt(&node(1), 1, &c, vec![new.clone()], 2), (1, 0));
        assert_eq!(r.placement(&new.key), Some(&node(1)));
        r.release(std::slice::from_ref(&old.key));
        assert_eq!(r.adopt(&node(0), 1, &c, vec![old], 2), (0, 1), "a tombstone keeps the released key out");
        r.check_invariant(&cap).unwrap();
    }

    #[test]
    fn a_lower_fencing_token_is_refused_and_a_higher_one_raises_the_mark() {
        let mut l = Ledger::new();
        // No lease yet: token 0 passes and records nothing.
        assert_eq!(l.fence(0, ["a"]), Ok(false));
        assert_eq!(l.mark("a"), 0);
        assert_eq!(l.fence(5, ["a"]), Ok(true));
        assert_eq!(l.fence(5, ["a"]), Ok(false), "the same scheduler again");
        assert_eq!(l.fence(4, ["a"]), Err(Fenced::Stale { app: "a".into(), token: 4, mark: 5 }));
        assert!(matches!(l.fence(0, ["a"]), Err(Fenced::Stale { .. })), "no lease, once a lease was seen");
        // Marks are per app; one stale app in a request refuses all of it and raises nothing.
        assert_eq!(l.fence(1, ["b"]), Ok(true));
        assert!(l.fence(3, ["b", "a"]).is_err());
        assert_eq!((l.mark("a"), l.mark("b")), (5, 1));
        assert_eq!(l.fence(9, ["b", "a"]), Ok(true));
        assert_eq!((l.mark("a"), l.mark("b")), (9, 9));
        // What a restarted shard restores only ever raises a mark.
        let mut r = Ledger::new();
        r.restore_marks(l.marks());
        r.restore_marks([("a".to_string(), 2)]);
        assert_eq!(r.mark("a"), 9);
        assert!(r.fence(8, ["a"]).is_err());
    }

    /// The case a deposed scheduler makes: the new one releases a member, then the old
    /// one's commit of that member arrives; and the old one's release of what the new
    /// one holds. Both are refused and nothing changes.
    #[test]
    fn a_deposed_schedulers_commit_and_release_change_nothing() {
        let mut l = Ledger::new();
        let c = claim("u1", "head", 0, 400, "");
        assert_eq!(l.fence(1, ["a"]), Ok(true));
        assert_eq!(l.commit("old-1", std::slice::from_ref(&c), &facts).0[0].1, Ok(()));
        // The new scheduler (token 2) releases it and places another unit.
        assert_eq!(l.fence(2, ["a"]), Ok(true));
        l.release(std::slice::from_ref(&c.key));
        let d = claim("u2", "head", 1, 400, "");
        l.commit("new-1", std::slice::from_ref(&d), &facts);
        // The old one wakes up: its commit and its release are fenced before they apply.
        assert!(l.fence(1, ["a"]).is_err());
        assert_eq!((l.placement(&c.key), l.placement(&d.key)), (None, Some(&node(1))));
        // A reservation names its apps for the confirm that only names the transaction.
        l.reserve("r1", &[claim("u3", "head", 1, 100, "")], 1000, &facts);
        assert_eq!(l.reservation_apps("r1").into_iter().collect::<Vec<_>>(), vec!["a".to_string()]);
        assert!(l.reservation_apps("nope").is_empty());
        l.check_invariant(&cap).unwrap();
    }

    #[test]
    fn the_number_of_fenced_apps_is_bounded() {
        let mut l = Ledger::new();
        l.restore_marks((0..MAX_FENCED_APPS).map(|i| (format!("app{i}"), 1)));
        assert_eq!(l.fence(1, ["app1"]), Ok(false));
        assert_eq!(l.fence(0, ["new"]), Ok(false), "no lease: nothing to remember");
        assert_eq!(l.fence(1, ["new"]), Err(Fenced::TooManyApps));
    }

    #[test]
    fn each_claim_is_checked_on_its_own() {
        let mut l = Ledger::new();
        let cs = [
            claim("u1", "head", 0, 600, ""),
            claim("u2", "head", 0, 600, ""), // does not fit after u1
            claim("u3", "head", 1, 100, ""),
            claim("u4", "head", 2, 100, ""), // low priority not allowed
            claim("u5", "head", 3, 100, ""), // suspect
            claim("u6", "head", 9, 100, ""), // unknown
        ];
        let (out, changed) = l.commit("t1", &cs, &facts);
        let r: Vec<_> = out.iter().map(|(_, r)| *r).collect();
        assert_eq!(
            r,
            vec![
                Ok(()),
                Err(ClaimReject::NoFit),
                Ok(()),
                Err(ClaimReject::Priority),
                Err(ClaimReject::NodeNotAlive(NodeStatus::Suspect)),
                Err(ClaimReject::UnknownNode)
            ]
        );
        assert_eq!(changed, vec![node(0), node(1)]);
        assert_eq!(l.allocated(&node(0)).cpu_millis, 600);
        l.check_invariant(&cap).unwrap();
    }

    #[test]
    fn a_group_is_all_or_nothing() {
        let mut l = Ledger::new();
        let cs = [claim("u1", "head", 0, 500, "u1"), claim("u1", "w0", 1, 500, "u1"), claim("u1", "w1", 0, 600, "u1")];
        let (out, changed) = l.commit("t1", &cs, &facts);
        assert_eq!(out[0].1, Err(ClaimReject::Group));
        assert_eq!(out[1].1, Err(ClaimReject::Group));
        assert_eq!(out[2].1, Err(ClaimReject::NoFit), "head + w1 exceed n0 together");
        assert!(changed.is_empty());
        assert!(l.allocated(&node(0)).is_zero());
        let cs = [claim("u1", "head", 0, 500, "u1"), claim("u1", "w0", 1, 500, "u1")];
        assert!(l.commit("t2", &cs, &facts).0.iter().all(|(_, r)| r.is_ok()));
        l.check_invariant(&cap).unwrap();
    }

    /// Start order: a member held back (`after`) is released by claiming its key again
    /// with the new workload; the node's set changes (its agent is told), the resources
    /// do not, and a plain replay changes nothing.
    #[test]
    fn a_replay_with_a_new_workload_updates_the_member_in_place() {
        let mut l = Ledger::new();
        let mut held = claim("u1", "worker-0", 0, 400, "u1");
        held.workload.after = "head".into();
        l.commit("t1", std::slice::from_ref(&held), &facts);
        let v = l.assignments(&node(0)).0;
        assert!(l.commit("t2", std::slice::from_ref(&held), &facts).1.is_empty(), "same workload: no change");
        let mut released = held.clone();
        released.workload.after.clear();
        released.workload.env.insert("FLOTILLA_HEAD_ADDR".into(), "10.0.0.1".into());
        let (out, changed) = l.commit("t3", &[released.clone()], &facts);
        assert_eq!((out[0].1, changed), (Ok(()), vec![node(0)]));
        let (v2, list) = l.assignments(&node(0));
        assert!(v2 > v);
        assert_eq!(list[0].workload, released.workload);
        assert_eq!(l.allocated(&node(0)).cpu_millis, 400, "nothing allocated twice");
        l.check_invariant(&cap).unwrap();
    }

    #[test]
    fn replays_never_allocate_twice() {
        let mut l = Ledger::new();
        let cs = [claim("u1", "head", 0, 400, "")];
        l.commit("t1", &cs, &facts);
        // The same transaction, and the same member under a new transaction id.
        assert_eq!(l.commit("t1", &cs, &facts).0[0].1, Ok(()));
        assert_eq!(l.commit("t2", &cs, &facts).0[0].1, Ok(()));
        assert_eq!(l.allocated(&node(0)).cpu_millis, 400);
        // The same member on another node is a conflict, not a second placement.
        let elsewhere = [claim("u1", "head", 1, 400, "")];
        assert_eq!(l.commit("t3", &elsewhere, &facts).0[0].1, Err(ClaimReject::AlreadyPlaced));
        l.check_invariant(&cap).unwrap();
    }

    #[test]
    fn a_cordoned_node_takes_nothing_new() {
        let mut l = Ledger::new();
        assert_eq!(l.commit("t1", &[claim("u1", "head", 5, 10, "")], &facts).0[0].1, Err(ClaimReject::Cordoned));
    }

    #[test]
    fn incarnation_mismatch_and_restarted_nodes() {
        let mut l = Ledger::new();
        let mut c = claim("u1", "head", 0, 400, "");
        c.incarnation = 2;
        assert_eq!(l.commit("t1", &[c], &facts).0[0].1, Err(ClaimReject::IncarnationMismatch));
    }

    #[test]
    fn reservations_confirm_or_expire() {
        let mut l = Ledger::new();
        let cs = [claim("u1", "head", 0, 400, "u1"), claim("u1", "w", 1, 400, "u1")];
        l.reserve("r1", &cs, 1000, &facts);
        assert_eq!(l.allocated(&node(0)).cpu_millis, 400, "a reservation holds its resources");
        assert!(l.assignments(&node(0)).1.is_empty(), "but is not pushed to the agent");
        assert_eq!(l.confirm("r1", 500).0, ConfirmStatus::Confirmed);
        assert_eq!(l.confirm("r1", 600).0, ConfirmStatus::Confirmed, "a replayed confirm");
        assert_eq!(l.assignments(&node(0)).1.len(), 1);

        l.reserve("r2", &[claim("u2", "head", 1, 100, "")], 1000, &facts);
        assert_eq!(l.confirm("r2", 1001).0, ConfirmStatus::Expired);
        assert_eq!(l.allocated(&node(1)).cpu_millis, 400);
        assert_eq!(l.confirm("never", 0).0, ConfirmStatus::UnknownReservation);

        l.reserve("r3", &[claim("u3", "head", 1, 100, "")], 1000, &facts);
        assert_eq!(l.expire(2000), vec![node(1)], "a vanished scheduler's reservation expires");
        assert_eq!(l.allocated(&node(1)).cpu_millis, 400);
        assert_eq!(l.confirm("r3", 2001).0, ConfirmStatus::UnknownReservation);
        l.check_invariant(&cap).unwrap();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Commit { txn: u8, claims: Vec<(u8, u8, u8, u16, bool)> },
        Replay { txn: u8 },
        Release { unit: u8, member: u8 },
        Reserve { txn: u8, unit: u8, node: u8, cpu: u16, ttl: u16 },
        Confirm { txn: u8 },
        Tick { ms: u16 },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (any::<u8>(), prop::collection::vec((0u8..8, 0u8..3, 0u8..4, 1u16..700, any::<bool>()), 1..6))
                .prop_map(|(txn, claims)| Op::Commit { txn, claims }),
            any::<u8>().prop_map(|txn| Op::Replay { txn }),
            (0u8..8, 0u8..3).prop_map(|(unit, member)| Op::Release { unit, member }),
            (any::<u8>(), 0u8..8, 0u8..4, 1u16..700, 1u16..500).prop_map(|(txn, unit, node, cpu, ttl)| Op::Reserve {
                txn,
                unit,
                node,
                cpu,
                ttl
            }),
            any::<u8>().prop_map(|txn| Op::Confirm { txn }),
            (1u16..300).prop_map(|ms| Op::Tick { ms }),
        ]
    }

    proptest! {
        /// Random concurrent schedulers (interleaved transactions), random replays and
        /// failures: the ledger invariant holds after every step.
        #[test]
        fn the_ledger_never_overbooks(ops in prop::collection::vec(op(), 1..80)) {
            let mut l = Ledger::new();
            let mut sent: HashMap<u8, Vec<Claim>> = HashMap::new();
            let mut now = 0u64;
            for op in ops {
                match op {
                    Op::Commit { txn, claims } => {
                        let cs: Vec<Claim> = claims.iter().map(|&(u, m, n, cpu, grouped)| {
                            claim(&format!("u{u}"), &format!("m{m}"), n as usize, u64::from(cpu), if grouped { "g" } else { "" })
                        }).collect();
                        let id = format!("c{txn}");
                        let before = l.txns.contains_key(&id);
                        let (out, _) = l.commit(&id, &cs, &facts);
                        if !before {
                            prop_assert_eq!(out.len(), cs.len());
                            sent.insert(txn, cs);
                        }
                    }
                    Op::Replay { txn } => {
                        if let Some(cs) = sent.get(&txn).cloned() {
                            let total: u64 = (0..4).map(|n| l.allocated(&node(n)).cpu_millis).sum();
                            l.commit(&format!("c{txn}"), &cs, &facts);
                            l.commit(&format!("replay-{txn}"), &cs, &facts);
                            let after: u64 = (0..4).map(|n| l.allocated(&node(n)).cpu_millis).sum();
                            prop_assert!(after >= total);
                            // Only claims that were not yet held could add anything.
                        }
                    }
                    Op::Release { unit, member } => {
                        l.release(&[ClaimKey { app: "a".into(), unit: format!("u{unit}"), member: format!("m{member}"), generation: 1 }]);
                    }
                    Op::Reserve { txn, unit, node: n, cpu, ttl } => {
                        let c = claim(&format!("r{unit}"), "head", n as usize, u64::from(cpu), "");
                        l.reserve(&format!("r{txn}"), &[c], now + u64::from(ttl), &facts);
                    }
                    Op::Confirm { txn } => {
                        let st = l.confirm(&format!("r{txn}"), now).0;
                        prop_assert!(matches!(st, ConfirmStatus::Confirmed | ConfirmStatus::Expired | ConfirmStatus::UnknownReservation));
                    }
                    Op::Tick { ms } => {
                        now += u64::from(ms);
                        l.expire(now);
                    }
                }
                if let Err(e) = l.check_invariant(&cap) {
                    return Err(TestCaseError::fail(e));
                }
            }
        }
    }

    /// Many threads committing against one ledger (as the gRPC handlers do, behind
    /// its mutex): capacity is never exceeded and every member lands at most once.
    #[test]
    fn concurrent_schedulers_never_overbook() {
        use std::sync::{Arc, Mutex};
        let l = Arc::new(Mutex::new(Ledger::new()));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let l = l.clone();
                std::thread::spawn(move || {
                    let mut accepted = 0;
                    for i in 0..300 {
                        let n = (i * 7 + t) % 3;
                        let cs = [claim(&format!("u{}", i % 50), &format!("m{t}"), n, 30 + (i as u64 % 40), "")];
                        let mut g = l.lock().unwrap();
                        let (out, _) = g.commit(&format!("t{t}-{i}"), &cs, &facts);
                        accepted += out.iter().filter(|(_, r)| r.is_ok()).count();
                        if i % 11 == 0 {
                            g.release(&[cs[0].key.clone()]);
                        }
                        g.check_invariant(&cap).unwrap();
                    }
                    accepted
                })
            })
            .collect();
        let accepted: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(accepted > 0);
        let g = l.lock().unwrap();
        g.check_invariant(&cap).unwrap();
        for n in 0..3 {
            assert!(g.allocated(&node(n)).cpu_millis <= 1000);
        }
    }
}
