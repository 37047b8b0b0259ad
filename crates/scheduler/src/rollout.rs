//! Make-before-break replacement of placed units. A unit whose node is leaving (an
//! operator's `flotilla node drain`, or a cloud's preemption notice) or whose template
//! changed (`flotilla apply`) first gets a replacement unit; only once the replacement
//! is Running does the old unit drain (out of the routes at once, stopped after the
//! drain timeout). Pure decisions over the unit records and the view; the reconcile
//! loop carries them out.
//!
//! - Leaving nodes are urgent (a preemption notice gives tens of seconds): every
//!   affected unit is replaced at once.
//! - Template changes roll at most `rollout.max_unavailable` units at a time, oldest
//!   first, counting every replacement still coming up.
//! - Nothing new starts while the app is above its desired size: scale-in decides first,
//!   so a replacement is never the unit scale-in removes next.
//! - A rollout cannot get stuck (Kubernetes' progress deadline, Nomad's
//!   `progress_deadline`): a replacement not Running with every member running within
//!   `rollout.progress_deadline` of being queued is released and the rollout fails; no
//!   more units roll to that template until the next apply.
//! - A canary rollout (`crate::canary`) holds: at most `hold` units have a replacement
//!   of the new template, replaced whole, and an old unit whose replacement runs is not
//!   drained until promotion: both serve, each side its share of the requests.
//! - A newer spec supersedes an in-flight rollout at once: replacements of another
//!   template are released, running or not, and the units they were to replace roll
//!   to the new one (or stay, if they already match it: a rollback keeps them).

use std::collections::{BTreeMap, HashSet};

use crate::lifecycle::UnitState;
use crate::nodes::NodeLookup;
use crate::store::{UnitRecord, Units};

mod members;
pub use members::Roll;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct RolloutPlan {
    /// Old units whose replacement is Running: drain them now.
    pub drain: Vec<String>,
    /// Old units whose replacement is gone (failed, scaled in, or released now): they
    /// count again.
    pub orphaned: Vec<String>,
    /// Units that get a replacement now, and why.
    pub replace: Vec<(String, String)>,
    /// Replacements coming up that are released now, and why (superseded by a newer
    /// spec, not needed any more, or past the progress deadline).
    pub release: Vec<(String, String)>,
    /// Why the rollout failed in this pass (a replacement missed the progress deadline).
    pub failed: Option<String>,
    /// Workers on leaving nodes whose unit's head stays: each is replaced alone, make
    /// before break (unit, members, why). The unit keeps its id and its head serves on.
    pub replace_members: Vec<(String, Vec<String>, String)>,
    /// Members of groups whose template changed, in units whose frame holds: each is
    /// replaced alone, make before break, as on a leaving node (unit, members).
    pub roll_members: Vec<(String, Vec<String>)>,
    /// Members coming up in a unit's surge that are released now (unit, member, why):
    /// superseded by another spec, or past the progress deadline.
    pub release_surge: Vec<(String, String, String)>,
    /// Units whose members all run the spec's templates now: they take its fingerprint.
    pub adopt: Vec<String>,
}

/// What a rollout is rolling to and how it stands.
pub struct Target<'a> {
    /// The template fingerprint of the spec in force.
    pub fingerprint: &'a str,
    /// Its frame and its groups' templates (`crate::spec::Fingerprints`).
    pub frame: &'a str,
    pub roles: &'a BTreeMap<String, String>,
    pub desired: u32,
    pub max_unavailable: u32,
    pub progress_deadline_ms: u64,
    pub now_ms: u64,
    /// The rollout to this template failed: no more units roll to it (units on leaving
    /// nodes are still replaced).
    pub halted: bool,
    /// A canary shifting traffic: how many units may have a replacement of this template
    /// now, their old units kept serving (`None`: a rolling update, or a promoted canary).
    pub hold: Option<u32>,
}

/// Does this unit count toward the app's desired number of units? A unit being replaced
/// does not: its replacement does.
pub fn counts_toward_desired(u: &UnitRecord) -> bool {
    u.state.is_active() && u.replaced_by.is_none()
}

/// Has a replacement made it: Running, and every member's agent says running (a
/// crash-looping member has not).
pub fn progressing(u: &UnitRecord) -> bool {
    u.state == UnitState::Running && u.members.iter().all(|m| m.state.as_deref().is_none_or(|s| s == "running"))
}

/// Is every unit on `fingerprint` and running: nothing replaced or coming up, every
/// placed unit that counts of this template and progressing, and at least one of them?
/// An in-progress rollout is then complete, and the spec is one that ran.
pub fn settled(units: &Units, fingerprint: &str) -> bool {
    let mut any = false;
    for u in units.values().filter(|u| u.state.is_active()) {
        if u.replaced_by.is_some() {
            return false;
        }
        if matches!(u.state, UnitState::Queued | UnitState::Placing) {
            continue;
        }
        if u.template.as_deref().is_some_and(|t| t != fingerprint) || !progressing(u) {
            return false;
        }
        any = true;
    }
    any
}

/// Why a member's node is about to go away, if it is.
fn node_leaving(node: Option<&str>, shard: Option<u32>, nodes: &(impl NodeLookup + ?Sized)) -> Option<&'static str> {
    let rec = nodes.record(shard?, node?)?;
    if rec.drain_requested {
        Some("its node is being drained")
    } else if rec.health.preemption_notice() {
        Some("its node has a preemption notice")
    } else {
        None
    }
}

/// Why the unit must be replaced whole: its head's node is leaving. (A worker's leaving
/// node replaces only that worker: see [`members_leaving`].)
fn unit_leaving(u: &UnitRecord, nodes: &(impl NodeLookup + ?Sized)) -> Option<&'static str> {
    u.members.iter().filter(|m| m.role == "head").find_map(|m| node_leaving(m.node_id.as_deref(), m.shard, nodes))
}

/// The members of `u` (not its head) on leaving nodes that have no replacement coming
/// up yet, and why the first one leaves.
pub fn members_leaving(u: &UnitRecord, nodes: &(impl NodeLookup + ?Sized)) -> Option<(Vec<String>, &'static str)> {
    let mut why = None;
    let members: Vec<String> = u
        .members
        .iter()
        .filter(|m| m.role != "head" && !u.surge.iter().any(|s| s.member == m.member))
        .filter_map(|m| {
            let w = node_leaving(m.node_id.as_deref(), m.shard, nodes)?;
            why.get_or_insert(w);
            Some(m.member.clone())
        })
        .collect();
    Some((members, why?))
}

/// Members coming up in `u`'s surge that now run: each takes its member's place (and the
/// member it replaces is released).
pub fn surge_ready(u: &UnitRecord) -> Vec<String> {
    u.surge.iter().filter(|m| m.state.as_deref() == Some("running")).map(|m| m.member.clone()).collect()
}

/// Why replacement `r` has not made it: its state, and each member's that is not running.
fn not_progressing(r: &UnitRecord) -> String {
    let members: Vec<String> = r
        .members
        .iter()
        .filter(|m| m.state.as_deref() != Some("running"))
        .map(|m| format!("{} {}", m.member, m.state.as_deref().unwrap_or("not started")))
        .collect();
    if members.is_empty() {
        r.state.as_str().to_string()
    } else {
        format!("{} ({})", r.state.as_str(), members.join(", "))
    }
}

/// The units `victims` of a scale-in were coming up to replace. A unit and its
/// replacement count as one unit (the replacement counts, the old unit does not), so
/// scaling one in removes both: the old unit would otherwise count again, and roll again.
pub fn replaced_by(units: &Units, victims: &[String]) -> Vec<String> {
    units
        .values()
        .filter(|u| u.state.is_active() && u.replaced_by.as_ref().is_some_and(|r| victims.contains(r)))
        .map(|u| u.unit_id.clone())
        .collect()
}

/// How many units a rollout to `fingerprint` will replace, from `units` as they stand:
/// what an apply says before it happens. The units that roll are the placed ones of
/// another template; a unit with a replacement of this template coming up (or being
/// committed: it is placed under the spec in force) is replaced already, and one with a
/// replacement of another template rolls after that replacement is released (see
/// [`plan`]). Queued and placing units take the template in force when they are placed,
/// and never roll. When the app is above its desired size, scale-in goes first and may
/// remove some of these units (a unit and its replacement together: [`replaced_by`])
/// instead: fewer roll, never more.
pub fn will_roll(units: &Units, fingerprint: &str) -> usize {
    rolling(units, fingerprint).len()
}

/// The units [`will_roll`] counts, oldest first: the order they roll in.
pub fn rolling<'a>(units: &'a Units, fingerprint: &str) -> Vec<&'a UnitRecord> {
    let stale = |u: &UnitRecord| u.template.as_deref().is_some_and(|t| t != fingerprint);
    let placed = |u: &UnitRecord| {
        matches!(u.state, UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded)
    };
    let replacement = |u: &UnitRecord| {
        u.state.is_active().then_some(())?;
        units.get(u.replaced_by.as_deref()?).filter(|r| r.state.is_active())
    };
    let coming_up: HashSet<&str> = units.values().filter_map(replacement).map(|r| r.unit_id.as_str()).collect();
    let mut rolls: Vec<&UnitRecord> = units
        .values()
        .filter(|u| placed(u) && !coming_up.contains(u.unit_id.as_str()))
        .filter(|u| match replacement(u) {
            Some(r) if r.state == UnitState::Placing || !stale(r) => false,
            _ => stale(u),
        })
        .collect();
    rolls.sort_by_key(|u| u.generation);
    rolls
}

pub fn plan(units: &Units, nodes: &(impl NodeLookup + ?Sized), t: &Target) -> RolloutPlan {
    let mut p = RolloutPlan::default();
    let mut in_flight = 0u32;
    // Units with a replacement of the spec's template (a canary's new version).
    let mut new_version = 0u32;
    for u in units.values().filter(|u| u.state.is_active()) {
        let Some(new) = &u.replaced_by else { continue };
        let Some(r) = units.get(new).filter(|r| r.state.is_active()) else {
            p.orphaned.push(u.unit_id.clone());
            continue;
        };
        // A commit in flight settles first (under the spec in force).
        let settling = r.state == UnitState::Placing;
        if !settling && r.template.as_deref().is_some_and(|tpl| tpl != t.fingerprint) {
            // Running or not: the unit it replaces serves on, and rolls to the spec in
            // force if it must (a rollback mid-rollout keeps the old units it went back
            // to, rather than draining them and rolling their replacements back).
            p.release.push((r.unit_id.clone(), "superseded: another spec was applied since it was queued".to_string()));
            p.orphaned.push(u.unit_id.clone());
            continue;
        }
        let rolling = u.template.as_deref().is_some_and(|tpl| tpl != t.fingerprint);
        if rolling {
            new_version += 1;
        }
        if progressing(r) {
            // A canary's old unit serves on beside its replacement until promotion, unless
            // its node is leaving.
            if !(rolling && t.hold.is_some() && unit_leaving(u, nodes).is_none()) {
                p.drain.push(u.unit_id.clone());
            }
            continue;
        }
        let waited_ms = t.now_ms.saturating_sub(r.created_unix_ms);
        let release = if settling {
            None
        } else if !rolling && u.moving.is_some() && waited_ms >= t.progress_deadline_ms {
            // A move that does not make it is given up; the unit stays where it was.
            Some(format!("move abandoned: {} was not running within the progress deadline", r.unit_id))
        } else if !rolling && u.moving.is_none() && unit_leaving(u, nodes).is_none() {
            Some(format!("not needed: {} already matches the spec in force", u.unit_id))
        } else if rolling && waited_ms >= t.progress_deadline_ms {
            let why = format!(
                "rollout failed: {} (replacing {}) was not running within the progress deadline of {}s: {}",
                r.unit_id,
                u.unit_id,
                t.progress_deadline_ms / 1000,
                not_progressing(r)
            );
            p.failed.get_or_insert_with(|| why.clone());
            Some(why)
        } else {
            None
        };
        match release {
            Some(why) => {
                p.release.push((r.unit_id.clone(), why));
                p.orphaned.push(u.unit_id.clone());
            }
            None => in_flight += 1,
        }
    }
    // Members rolling alone: replacements of another template are released, one past
    // the deadline fails the rollout, a unit with one coming up is in flight.
    let mut members_in_flight: HashSet<&str> = HashSet::new();
    for u in units.values().filter(|u| u.state.is_active() && !u.surge.is_empty()) {
        let (release, coming, failed) = members::surge(u, t);
        if coming {
            members_in_flight.insert(u.unit_id.as_str());
            in_flight += 1;
        }
        if let Some(f) = failed {
            p.failed.get_or_insert(f);
        }
        p.release_surge.extend(release.into_iter().map(|(m, why)| (u.unit_id.clone(), m, why)));
    }
    let released = |u: &UnitRecord| p.release.iter().any(|(id, _)| *id == u.unit_id);
    let counted = units
        .values()
        .filter(|u| (counts_toward_desired(u) && !released(u)) || p.orphaned.contains(&u.unit_id))
        .count();
    if counted > t.desired as usize {
        return p;
    }
    let placed = |u: &&UnitRecord| {
        matches!(u.state, UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded)
            && (u.replaced_by.is_none() || p.orphaned.contains(&u.unit_id))
            && !released(u)
    };
    let mut rolls: Vec<(&UnitRecord, Roll)> = Vec::new();
    for u in units.values().filter(placed) {
        if let Some(why) = unit_leaving(u, nodes) {
            p.replace.push((u.unit_id.clone(), why.to_string()));
        } else if let Some((members, why)) = members_leaving(u, nodes) {
            p.replace_members.push((u.unit_id.clone(), members, why.to_string()));
        } else if u.template.as_deref().is_some_and(|tpl| tpl != t.fingerprint) {
            match members::how(u, t) {
                Roll::Done if u.surge.is_empty() => p.adopt.push(u.unit_id.clone()),
                Roll::Done => {}
                roll => {
                    if let Some(why) = members::stuck(u, t) {
                        p.failed.get_or_insert(why);
                    }
                    rolls.push((u, roll));
                }
            }
        }
    }
    if t.halted || p.failed.is_some() {
        return p;
    }
    rolls.sort_by_key(|(u, _)| u.generation);
    let mut room = t.max_unavailable.saturating_sub(in_flight) as usize;
    if let Some(hold) = t.hold {
        room = room.min(hold.saturating_sub(new_version) as usize);
    }
    for (u, roll) in rolls {
        // A unit with members coming up already rolls its other stale ones too, at no
        // cost in room: it is one unit short either way.
        let in_flight = members_in_flight.contains(u.unit_id.as_str());
        if !in_flight {
            if room == 0 {
                continue;
            }
            room -= 1;
        }
        match roll {
            // A canary's versions are whole units: the routes split by unit.
            Roll::Members(_) if t.hold.is_some() && !in_flight => {
                p.replace.push((u.unit_id.clone(), "its template changed (canary)".to_string()))
            }
            Roll::Members(stale) => {
                let waiting: Vec<String> =
                    stale.into_iter().filter(|m| !u.surge.iter().any(|s| &s.member == m)).collect();
                if !waiting.is_empty() {
                    p.roll_members.push((u.unit_id.clone(), waiting));
                }
            }
            _ if in_flight => {}
            _ => p.replace.push((u.unit_id.clone(), "its template changed".to_string())),
        }
    }
    p
}

#[cfg(test)]
mod tests;
