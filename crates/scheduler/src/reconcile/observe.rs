//! Sync: what the agents report about the members (through the view) moves the units
//! along; what no unit accounts for is released; on start, what a previous run was
//! placing is replaced.

use crate::catalogue as m;
use crate::nodes::Nodes;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use flotilla_core::now_ms;
use flotilla_proto::v1;
use flotilla_view::{NodeRecord, ShardSlot};

use super::ledgers::{Ledgers, claim_key, workload_state};
use crate::lifecycle::UnitState;
use crate::repair::{MISSING, MISSING_AFTER_MS, node_of, runs_nowhere};
use crate::spec::AppSpec;
use crate::store::{MemberRecord, NamedPorts, UnitRecord, Units, Usage, Write};

/// A member's named ports and message as its agent reports them (ports outside `u16` are
/// dropped: no agent assigns them).
fn reported_ports(w: &v1::WorkloadStatus) -> (NamedPorts, Option<String>) {
    let port = |p: u32| u16::try_from(p).ok();
    let ports = NamedPorts {
        named: w.ports.iter().filter_map(|(k, p)| Some((k.clone(), port(*p)?))).collect(),
        ranges: w.port_ranges.iter().filter_map(|(k, r)| Some((k.clone(), (port(r.first)?, port(r.last)?)))).collect(),
    };
    (ports, (!w.message.is_empty()).then(|| w.message.clone()))
}

/// Takes a member's named ports and message as its agent reports them.
fn take_reported_ports(m: &mut MemberRecord, w: &v1::WorkloadStatus) {
    (m.ports, m.message) = reported_ports(w);
}

/// Whether what the agent reports of a member's ports or message differs from its record.
fn ports_differ(m: &MemberRecord, w: &v1::WorkloadStatus) -> bool {
    let message = (!w.message.is_empty()).then_some(w.message.as_str());
    // The common case, nothing named, without building the maps.
    if m.message.as_deref() != message {
        return true;
    }
    if w.ports.is_empty() && w.port_ranges.is_empty() {
        return !m.ports.named.is_empty() || !m.ports.ranges.is_empty();
    }
    reported_ports(w).0 != m.ports
}

/// How often the view is swept for members no unit accounts for.
const SWEEP_EVERY_MS: u64 = 5_000;

/// What the sync step remembers between passes: since when members have been missing
/// or unheard, and when the next orphan sweep is due.
pub(super) struct Tracking {
    /// Whether the first pass (adopt) ran since this scheduler started or took over.
    pub(super) started: bool,
    /// When the next orphan sweep is due (Unix ms).
    next_sweep_ms: u64,
    /// Each shard's stamp of the app's workloads (`flotilla_view::AppNodes::stamp`; `None`
    /// while unheard) when a sweep last found nothing, until a unit may have changed
    /// ([`Tracking::forget_sweep`]): a sweep due with the same stamps would find nothing
    /// again.
    swept: Option<Vec<Option<u64>>>,
    /// Since when each (unit, member) has been absent from the live node it is placed on.
    absent_since: HashMap<(String, String), u64>,
    /// Since when each unit has had members whose shard cannot be heard (see `heal`).
    pub(super) unknown_since: HashMap<String, u64>,
    /// How long Unknown members are waited for before they count as lost.
    pub(super) unknown_grace_ms: u64,
    /// Members of placed units whose node did not report them in the last pass.
    unreported: usize,
}

impl Default for Tracking {
    fn default() -> Self {
        Tracking {
            started: false,
            next_sweep_ms: 0,
            swept: None,
            absent_since: HashMap::new(),
            unknown_since: HashMap::new(),
            unknown_grace_ms: 60_000,
            unreported: 0,
        }
    }
}

impl Tracking {
    /// Forgets what this run saw, as a restart would (the scheduler took the lease again).
    pub(super) fn restart(&mut self) {
        *self = Tracking { unknown_grace_ms: self.unknown_grace_ms, ..Tracking::default() };
    }

    /// When the next orphan sweep is due (Unix ms).
    pub(super) fn next_sweep_ms(&self) -> u64 {
        self.next_sweep_ms
    }

    /// Every placed member was reported by its node in the last pass, and no grace
    /// (missing, unknown) is counting.
    pub(super) fn settled(&self) -> bool {
        self.unreported == 0 && self.absent_since.is_empty() && self.unknown_since.is_empty()
    }

    /// Moves `units` along with what their members' agents report: Allocated → Starting
    /// once a member started, Starting → Running once every member is ready. A unit is
    /// copied only when something it shows changed (`Units`: the last status shares it).
    pub(super) fn observe(&mut self, units: &mut Units, slots: &Nodes, now: u64, writes: &mut Vec<Write>) {
        let mut absent = HashMap::new();
        self.unreported = 0;
        let mut updated = Vec::new();
        for unit in units.values() {
            if !matches!(
                unit.state,
                UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded
            ) {
                continue;
            }
            // The unit as this pass changes it, copied at its first change.
            let mut copy: Option<UnitRecord> = None;
            let mut changed = false;
            let mut all_running = !unit.members.is_empty();
            let mut any_reported = false;
            for (i, m) in unit.members.iter().enumerate() {
                let generation = m.key_generation(unit.generation);
                let node = node_of(m, slots);
                let status = reported(&unit.unit_id, m, generation, node);
                let (state, address) = match status {
                    Some(w) => (Some(workload_state(w)), (!w.address.is_empty()).then_some(w.address.as_str())),
                    // A live node that does not run the member although it should: after
                    // the grace the member is missing (a shard that restarted before the
                    // agent took the push forgot it), and repair replaces it.
                    None if runs_nowhere(&unit.unit_id, generation, m, node, now) => {
                        let key = (unit.unit_id.clone(), m.member.clone());
                        let since = self.absent_since.get(&key).copied().unwrap_or(now);
                        absent.insert(key, since);
                        let state = match now.saturating_sub(since) >= MISSING_AFTER_MS {
                            true => Some(MISSING),
                            false => m.state.as_deref(),
                        };
                        (state, m.address.as_deref())
                    }
                    None => (m.state.as_deref(), m.address.as_deref()),
                };
                let usage = status
                    .and_then(|w| w.usage)
                    .map(|u| Usage { cpu_millis: u.cpu_millis, memory_bytes: u.memory_bytes });
                any_reported |= status.is_some();
                self.unreported += usize::from(status.is_none());
                all_running &= state == Some("running");
                let moved = m.state.as_deref() != state || m.address.as_deref() != address;
                let ports = status.filter(|w| ports_differ(m, w));
                // Usage changes all the time: it is kept, not a reason to write the record.
                if moved || ports.is_some() || m.usage != usage {
                    let m = &mut copy.get_or_insert_with(|| unit.clone()).members[i];
                    m.usage = usage;
                    if let Some(w) = ports {
                        take_reported_ports(m, w);
                    }
                    m.state = state.map(str::to_string);
                    m.address = address.map(str::to_string);
                    changed |= moved || ports.is_some();
                }
            }
            // Members coming up to replace one (make before break): their state as
            // reported; they take their member's place in `roll` once running.
            for (i, m) in unit.surge.iter().enumerate() {
                let status = reported(&unit.unit_id, m, m.key_generation(unit.generation), node_of(m, slots));
                let state = status.map(workload_state).or(m.state.as_deref());
                let address = status.filter(|w| !w.address.is_empty()).map(|w| w.address.as_str());
                let ports = status.filter(|w| ports_differ(m, w));
                let moved = m.state.as_deref() != state || (address.is_some() && m.address.as_deref() != address);
                if moved || ports.is_some() {
                    let m = &mut copy.get_or_insert_with(|| unit.clone()).surge[i];
                    if let Some(w) = ports {
                        take_reported_ports(m, w);
                    }
                    m.state = state.map(str::to_string);
                    if let Some(a) = address {
                        m.address = Some(a.to_string());
                    }
                    changed = true;
                }
            }
            let next = match unit.state {
                UnitState::Allocated if all_running || any_reported => Some(UnitState::Starting),
                UnitState::Starting | UnitState::Degraded if all_running => Some(UnitState::Running),
                _ => None,
            };
            if let Some(to) = next
                && let Ok(to) = unit.state.to(to)
            {
                tracing::info!(unit = %unit.unit_id, from = unit.state.as_str(), to = to.as_str(), "unit state");
                copy.get_or_insert_with(|| unit.clone()).state = to;
                changed = true;
            }
            if let Some(u) = copy {
                updated.push((u, changed));
            }
        }
        for (u, changed) in updated {
            let u = Arc::new(u);
            if changed {
                writes.push(Write::Unit(u.clone()));
            }
            units.insert(u);
        }
        self.absent_since = absent;
    }

    /// The units may have changed since the last sweep: the next one reads the nodes.
    pub(super) fn forget_sweep(&mut self) {
        self.swept = None;
    }

    /// Releases what agents run for this app that no unit record accounts for: a commit
    /// that timed out but landed, or a member a restarted shard took back from its agent
    /// after it had been released. Runs every `SWEEP_EVERY_MS`, between two passes'
    /// commits, so nothing it sees is still in flight.
    pub(super) async fn sweep_orphans(
        &mut self,
        app: &str,
        units: &Units,
        ledgers: &mut Ledgers,
        slots: &[Arc<ShardSlot>],
        phase_ms: u64,
    ) {
        let now = now_ms();
        if now < self.next_sweep_ms {
            return;
        }
        self.next_sweep_ms = super::due::next_beat(now, SWEEP_EVERY_MS, phase_ms);
        let stamps: Vec<Option<u64>> = slots.iter().map(|s| s.connected.then(|| s.apps.stamp(app)).flatten()).collect();
        if self.swept.as_ref() == Some(&stamps) {
            metrics::counter!(m::ORPHAN_SWEEPS.name, "result" => "unchanged").increment(1);
            return;
        }
        metrics::counter!(m::ORPHAN_SWEEPS.name, "result" => "read").increment(1);
        let mut orphans: BTreeMap<usize, Vec<v1::ClaimKey>> = BTreeMap::new();
        for (shard, slot) in slots.iter().enumerate().filter(|(_, s)| s.connected) {
            // The nodes the app has workloads on, not every node (`flotilla_view::AppNodes`).
            for rec in slot.apps.get(app).filter_map(|id| slot.view.get(id)) {
                for w in rec.workloads.iter().filter(|w| w.app == app) {
                    let owned = units.get(&w.unit).is_some_and(|u| {
                        u.state != UnitState::Terminated
                            && ((u.state == UnitState::Placing && u.generation == w.generation)
                                || u.members.iter().chain(&u.surge).any(|m| {
                                    m.member == w.member
                                        && m.key_generation(u.generation) == w.generation
                                        && m.node_id.as_deref() == Some(rec.node_id.as_str())
                                }))
                    });
                    if !owned {
                        orphans.entry(shard).or_default().push(claim_key(&w.app, &w.unit, &w.member, w.generation));
                    }
                }
            }
        }
        self.swept = orphans.is_empty().then_some(stamps);
        for (shard, keys) in orphans {
            tracing::warn!(shard, orphans = keys.len(), "releasing members no unit accounts for");
            metrics::counter!(m::ORPHANS_RELEASED.name, "app" => app.to_string()).increment(keys.len() as u64);
            let tag = format!("{app}-sweep");
            if let Err(e) = ledgers.release_keys(shard, &tag, keys).await {
                tracing::warn!(error = %e, "releasing orphans; will retry");
                self.next_sweep_ms = now;
            }
        }
    }
}

/// On start: a unit a previous run was placing (written Placing before its commit
/// left) may hold ledger entries that run somewhere, or will once a late commit lands.
/// It is never placed again under the same keys, which could run a member twice: it
/// ends, a replacement with a new id is queued, and what it holds is released, now
/// (best effort) and by the orphan sweep after.
pub(super) async fn adopt(spec: &AppSpec, units: &mut Units, ledgers: &mut Ledgers, writes: &mut Vec<Write>) {
    let unsure: Vec<UnitRecord> = units.values().filter(|u| u.state == UnitState::Placing).cloned().collect();
    if unsure.is_empty() {
        return;
    }
    let keys: Vec<v1::ClaimKey> = unsure
        .iter()
        .flat_map(|u| {
            spec.members().into_iter().map(move |(member, _, _)| claim_key(&u.app, &u.unit_id, &member, u.generation))
        })
        .collect();
    let tag = format!("{}-adopt", spec.name);
    for shard in 0..ledgers.shards() {
        if let Err(e) = ledgers.release_keys(shard, &tag, keys.clone()).await {
            tracing::warn!(error = %e, "releasing what a previous run was placing; the orphan sweep retries");
        }
    }
    for u in unsure {
        if let Some(mut rec) = units.get_mut(&u.unit_id) {
            if let Ok(to) = rec.state.to(UnitState::Terminated) {
                rec.state = to;
            }
            rec.members.clear();
            rec.unplaced_reason = Some("a previous run was placing it when it stopped; replaced".into());
            writes.push(Write::Unit(rec.shared()));
        }
    }
    tracing::info!(units = keys.len(), "replacing the units a previous run was placing");
}

/// What the agent of member `m`'s node (`node`: [`node_of`]) reports about it (under
/// `generation`), if it does.
fn reported<'a>(
    unit: &str,
    m: &MemberRecord,
    generation: u64,
    node: Option<(&ShardSlot, Option<&'a Arc<NodeRecord>>)>,
) -> Option<&'a v1::WorkloadStatus> {
    let rec = node?.1?;
    rec.workloads.iter().find(|w| w.unit == unit && w.member == m.member && w.generation == generation)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{node, slots, unit};
    use flotilla_view::NodeRecord;

    /// A view whose node n1 runs unit a-1's head (generation 1), indexed afresh.
    fn view() -> Vec<Arc<ShardSlot>> {
        let head = v1::WorkloadStatus {
            app: "a".into(),
            unit: "a-1".into(),
            member: "head".into(),
            generation: 1,
            ..Default::default()
        };
        slots([NodeRecord { workloads: Arc::new(vec![head]), ..node("n1") }], true)
    }

    #[tokio::test]
    async fn a_sweep_reads_the_nodes_again_once_their_workloads_or_the_units_may_have_changed() {
        let running = Units::from_iter([("a-1".to_string(), unit("a-1", 1, UnitState::Running, &[("head", "n1")]))]);
        let mut ended = running.clone();
        if let Some(mut u) = ended.get_mut("a-1") {
            u.state = UnitState::Terminated;
        }
        // Nothing listens there: releasing an orphan fails, and the sweep is due again at once.
        let mut ledgers = Ledgers::new(vec!["127.0.0.1:1".into()]);
        let (first, mut t) = (view(), Tracking::default());
        let mut sweep = async |t: &mut Tracking, units: &Units, view: &[Arc<ShardSlot>]| {
            t.next_sweep_ms = 0;
            t.sweep_orphans("a", units, &mut ledgers, view, 0).await;
            t.next_sweep_ms > now_ms()
        };

        assert!(
            sweep(&mut t, &running, &first).await && t.swept.is_some(),
            "the head is the unit's: nothing to release"
        );
        // The same workloads: the nodes are not read, so the unit that ended is not seen
        // either. That is why a pass that may change units forgets the sweep.
        assert!(sweep(&mut t, &ended, &first).await && t.swept.is_some(), "not read");
        t.forget_sweep();
        assert!(!sweep(&mut t, &ended, &first).await, "read: the ended unit's head is released (and fails)");
        assert!(t.swept.is_none(), "a sweep that found orphans is not remembered");
        assert!(sweep(&mut t, &running, &first).await && t.swept.is_some());
        // A new view of the same workloads (a snapshot) is read: stamps never repeat.
        assert!(!sweep(&mut t, &ended, &view()).await, "read");
    }

    /// A pass copies only the units whose records it changes: the rest stay shared with
    /// the last status (`Units`), so publishing them is a pointer compare.
    #[test]
    fn observing_copies_only_the_units_it_changes() {
        let status = |state: i32, cpu: u64| v1::WorkloadStatus {
            app: "a".into(),
            unit: "a-1".into(),
            member: "head".into(),
            generation: 1,
            state,
            address: "n1:80".into(),
            usage: Some(v1::WorkloadUsage { cpu_millis: cpu, memory_bytes: 1 }),
            ..Default::default()
        };
        let view = |w: v1::WorkloadStatus| {
            let other = v1::WorkloadStatus { unit: "a-2".into(), ..status(v1::WorkloadState::Running as i32, 0) };
            slots(
                [
                    NodeRecord { workloads: Arc::new(vec![w]), ..node("n1") },
                    NodeRecord { workloads: Arc::new(vec![other.clone()]), ..node("n2") },
                ],
                true,
            )
        };
        let mut units = Units::from_iter([
            unit("a-1", 1, UnitState::Running, &[("head", "n1")]),
            unit("a-2", 2, UnitState::Running, &[("head", "n2")]),
        ]);
        let shown = |units: &Units| units.shared().cloned().collect::<Vec<_>>();
        let (mut t, mut writes) = (Tracking::default(), Vec::new());
        let running = v1::WorkloadState::Running as i32;
        let v = Nodes::new(view(status(running, 5)), &units);
        t.observe(&mut units, &v, 0, &mut writes);
        let before = shown(&units);

        let v = Nodes::new(view(status(running, 5)), &units);
        t.observe(&mut units, &v, 0, &mut writes);
        let same = shown(&units);
        assert!(before.iter().zip(&same).all(|(a, b)| Arc::ptr_eq(a, b)), "nothing changed: nothing copied");

        // Usage is shown, not written; only the unit it belongs to is copied.
        let n = writes.len();
        let v = Nodes::new(view(status(running, 7)), &units);
        t.observe(&mut units, &v, 0, &mut writes);
        let after = shown(&units);
        assert!(!Arc::ptr_eq(&before[0], &after[0]) && Arc::ptr_eq(&before[1], &after[1]));
        assert_eq!(after[0].members[0].usage.map(|u| u.cpu_millis), Some(7));
        assert_eq!(writes.len(), n, "usage alone is not a write");

        // A state the agent reports is a write, and the unit moves.
        let v = Nodes::new(view(status(v1::WorkloadState::Failed as i32, 7)), &units);
        t.observe(&mut units, &v, 0, &mut writes);
        assert_eq!(units["a-1"].members[0].state.as_deref(), Some("failed"));
        assert!(matches!(writes.last(), Some(Write::Unit(u)) if u.unit_id == "a-1"));
        assert_eq!(writes.len(), n + 1);
    }
}
