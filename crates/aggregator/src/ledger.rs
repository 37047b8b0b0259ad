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
mod tests;
