//! What must hold in every run: safety at every check, convergence at the end.

use flotilla_core::LockExt;
use std::collections::{BTreeMap, BTreeSet};

use flotilla_aggregator::ClaimKey;
use flotilla_core::NodeId;
use flotilla_scheduler::Store;
use flotilla_scheduler::Stored;
use flotilla_scheduler::UnitState;

use crate::World;
use crate::agents::capacity_of;

/// Every allocation the running shards hold: key → (shard, node).
fn allocations(w: &World) -> Result<BTreeMap<ClaimKey, (usize, NodeId)>, String> {
    let mut all = BTreeMap::new();
    for (shard, ledger) in w.ledgers.iter().enumerate() {
        let Some(ledger) = ledger else { continue };
        let ledger = ledger.lock_or_recover();
        ledger.check_invariant(&|n| capacity_of(&w.agents, n)).map_err(|e| format!("shard {shard}'s ledger: {e}"))?;
        for agent in w.agents.iter().filter(|a| a.shard == shard) {
            let Some(book) = ledger.book(&agent.node) else { continue };
            for key in book.entries.keys() {
                if let Some((s, n)) = all.insert(key.clone(), (shard, agent.node.clone())) {
                    return Err(format!("{key:?} is allocated on {n} (shard {s}) and on {}", agent.node));
                }
            }
        }
    }
    Ok(all)
}

/// How many allocations the running shards' ledgers hold.
pub fn allocation_count(w: &World) -> usize {
    w.ledgers
        .iter()
        .flatten()
        .map(|l| {
            let l = l.lock_or_recover();
            w.agents.iter().filter_map(|a| l.book(&a.node)).map(|b| b.entries.len()).sum::<usize>()
        })
        .sum()
}

fn stored(w: &World) -> Result<Stored, String> {
    w.store.load("sim").map_err(|e| format!("store: {e}"))
}

fn desired(s: &Stored) -> usize {
    s.desired_units.unwrap_or(4) as usize
}

/// Safety: checked every 100 ms of simulated time.
pub fn always(w: &World) -> Result<(), String> {
    if let Some(v) = w.deposed_report.violations.first() {
        return Err(format!("fencing: {v}"));
    }
    let all = allocations(w)?;
    let mut heads: BTreeMap<&str, usize> = BTreeMap::new();
    for key in all.keys().filter(|k| k.member == "head") {
        let n = heads.entry(key.unit.as_str()).or_default();
        *n += 1;
        if *n > 1 {
            return Err(format!("unit {} has two live heads", key.unit));
        }
    }
    let s = stored(w)?;
    let counted = s.units.values().filter(|u| flotilla_scheduler::counts_toward_desired(u)).count();
    if counted > desired(&s) {
        return Err(format!("the scheduler counts {counted} units, {} desired", desired(&s)));
    }
    Ok(())
}

/// Liveness: after the faults healed and the system settled, every desired unit runs,
/// and every allocation belongs to one of them (the rest was released).
pub fn converged(w: &World) -> Result<(), String> {
    if let Some(down) = w.ledgers.iter().position(Option::is_none) {
        return Err(format!("shard {down} is not running"));
    }
    let all = allocations(w)?;
    let s = stored(w)?;
    let live: Vec<_> = s.units.values().filter(|u| u.state.is_active()).collect();
    let running = live.iter().filter(|u| u.state == UnitState::Running).count();
    if live.len() != desired(&s) || running != live.len() {
        let states: Vec<String> = live.iter().map(|u| format!("{} {:?}", u.unit_id, u.state)).collect();
        return Err(format!("{} units desired, active: [{}]", desired(&s), states.join(", ")));
    }
    let mut expected = BTreeSet::new();
    for u in &live {
        for m in &u.members {
            let key = ClaimKey {
                app: u.app.clone(),
                unit: u.unit_id.clone(),
                member: m.member.clone(),
                generation: m.key_generation(u.generation),
            };
            let at = all.get(&key).map(|(_, n)| n.as_str());
            if at != m.node_id.as_deref() {
                return Err(format!("{key:?}: the store says {:?}, the ledger {at:?}", m.node_id));
            }
            expected.insert(key);
        }
    }
    if let Some((leak, (shard, node))) = all.iter().find(|(k, _)| !expected.contains(*k)) {
        return Err(format!("{leak:?} is still allocated on {node} (shard {shard}) but belongs to no live unit"));
    }
    for a in w.agents.iter().filter(|a| a.up) {
        let runs: BTreeSet<(&str, &str)> = a.running.iter().map(|r| (r.unit.as_str(), r.member.as_str())).collect();
        let holds: BTreeSet<(&str, &str)> =
            all.iter().filter(|(_, (_, n))| n == &a.node).map(|(k, _)| (k.unit.as_str(), k.member.as_str())).collect();
        if runs != holds {
            return Err(format!("{} runs {runs:?} but its ledger holds {holds:?}", a.node));
        }
    }
    Ok(())
}
