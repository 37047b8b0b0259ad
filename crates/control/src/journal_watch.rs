//! What becomes an event without anyone recording it: node status changes, unit
//! transitions (with why), rollouts and autoscaling decisions of the apps scheduled in
//! this process. Once a second the state is compared with what was last seen, by
//! pointer first (a shard's view, an app's status: unchanged ones cost nothing; changed
//! node maps are diffed as the dashboard stream diffs them), and what changed is
//! recorded in one write. What was there at start is taken as seen, not as news.
//! Operator actions are recorded by their handlers, with the token's name.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_core::{NodeId, NodeStatus};
use flotilla_scheduler::{AppStatus, UnitState};
use flotilla_view::ShardSlot;
use serde_json::Value;

use crate::ControlState;
use crate::events::{node_changes, status_of};
use crate::journal::NewEvent;

/// How often the state is compared.
pub const EVERY: Duration = Duration::from_secs(1);

/// An app's status and its decisions (newest first), as its handle gives them.
pub type AppNow = (Arc<AppStatus>, Arc<Vec<Arc<Value>>>);

/// What one app looked like when last compared.
struct AppSeen {
    status: Arc<AppStatus>,
    units: HashMap<String, UnitState>,
    rollout: Option<(String, &'static str)>,
    newest_decision: Option<Arc<Value>>,
}

/// What the watcher last saw.
pub struct Seen {
    slots: Vec<Arc<ShardSlot>>,
    nodes: HashMap<NodeId, NodeStatus>,
    apps: HashMap<String, AppSeen>,
    /// When the watcher started (Unix ms): units made before are not news.
    since_unix_ms: u64,
    /// Every shard has been heard once: from then on a node new to the view joined
    /// (before, it was only not heard of yet, and a restart would record every node).
    warm: bool,
}

fn rollout_key(s: &AppStatus) -> Option<(String, &'static str)> {
    let r = s.rollout.as_ref()?;
    let state = match r.state {
        flotilla_scheduler::RolloutState::InProgress => "in progress",
        flotilla_scheduler::RolloutState::Complete => "complete",
        flotilla_scheduler::RolloutState::Failed => "failed",
    };
    Some((r.template.clone(), state))
}

impl Seen {
    pub fn new(since_unix_ms: u64) -> Seen {
        Seen { slots: Vec::new(), nodes: HashMap::new(), apps: HashMap::new(), since_unix_ms, warm: false }
    }

    /// The events between what was seen and `slots` and `apps` now (decisions newest
    /// first); `quiet` (the first look) takes everything as seen.
    pub fn compare(&mut self, slots: Vec<Arc<ShardSlot>>, apps: &[AppNow], quiet: bool) -> Vec<NewEvent> {
        let mut out = Vec::new();
        let changes = node_changes(&self.slots, &slots);
        for (r, connected) in &changes.rows {
            let now = status_of(r, *connected);
            let before = self.nodes.insert(r.node_id.clone(), now);
            let id = r.node_id.as_str();
            match before {
                Some(b) if b != now => {
                    out.push(NewEvent::new("node", format!("{id}: {} → {}", b.as_str(), now.as_str())).node(id))
                }
                None if self.warm => {
                    out.push(NewEvent::new("node", format!("{id} joined ({})", now.as_str())).node(id))
                }
                None => {}
                Some(_) => {}
            }
        }
        for id in &changes.removed {
            if let Some(b) = self.nodes.remove(id) {
                out.push(
                    NewEvent::new("node", format!("{id} left the view (it was {})", b.as_str())).node(id.as_str()),
                );
            }
        }
        self.warm |= !slots.is_empty() && slots.iter().all(|s| s.connected);
        self.slots = slots;
        let mut gone: Vec<String> = self.apps.keys().cloned().collect();
        for (status, decisions) in apps {
            gone.retain(|a| *a != status.app);
            let app = status.app.as_str();
            match self.apps.get_mut(app) {
                Some(seen) if Arc::ptr_eq(&seen.status, status) => {}
                Some(seen) => {
                    app_changes(seen, status, &mut out);
                    seen.status = status.clone();
                }
                None => {
                    // Units made since the watcher started are news (an app is first seen
                    // a moment after its scheduler starts); older ones are taken as seen.
                    let units = status
                        .units
                        .iter()
                        .filter(|u| u.created_unix_ms < self.since_unix_ms)
                        .map(|u| (u.unit_id.clone(), u.state))
                        .collect();
                    // Likewise decisions: the newest made before the watcher started is the
                    // last one seen (a restart does not record the kept ones again).
                    let since = self.since_unix_ms;
                    let older = decisions.iter().find(|d| d["at"].as_u64().is_none_or(|at| at < since)).cloned();
                    let mut seen =
                        AppSeen { status: status.clone(), units, rollout: rollout_key(status), newest_decision: older };
                    app_changes(&mut seen, status, &mut out);
                    self.apps.insert(app.to_string(), seen);
                }
            }
            let Some(seen) = self.apps.get_mut(app) else { continue };
            // Decisions newer than the newest seen (they are kept newest first).
            let newest = decisions.first().cloned();
            if !seen.newest_decision.as_ref().zip(newest.as_ref()).is_some_and(|(a, b)| Arc::ptr_eq(a, b)) {
                for d in
                    decisions.iter().take_while(|d| !seen.newest_decision.as_ref().is_some_and(|s| Arc::ptr_eq(s, d)))
                {
                    let what = d["explanation"].as_str().or_else(|| d["action"].as_str()).unwrap_or("a decision");
                    // Rebalance moves share the decision log (`reconcile::rebalance`).
                    let kind = match d["kind"].as_str() {
                        Some("rebalance") => "rebalance",
                        Some("rollout") => "rollout",
                        _ => "autoscaling",
                    };
                    let mut e = NewEvent::new(kind, format!("{app}: {what}")).app(app);
                    if let Some(unit) = d["unit"].as_str() {
                        e = e.unit(unit);
                    }
                    out.push(e);
                }
                seen.newest_decision = newest;
            }
        }
        for app in gone {
            self.apps.remove(&app);
        }
        if quiet {
            out.clear();
        }
        out
    }
}

/// Unit transitions and rollout changes of one app.
fn app_changes(seen: &mut AppSeen, status: &AppStatus, out: &mut Vec<NewEvent>) {
    let app = status.app.as_str();
    let mut units = HashMap::with_capacity(status.units.len());
    for u in &status.units {
        let before = seen.units.get(&u.unit_id).copied();
        units.insert(u.unit_id.clone(), u.state);
        if before == Some(u.state) {
            continue;
        }
        let mut message = match before {
            Some(b) => format!("{}: {} → {}", u.unit_id, b.as_str(), u.state.as_str()),
            None => format!("{}: {}", u.unit_id, u.state.as_str()),
        };
        // Why, where the state has one: a unit that waits, failed or ended says why.
        let why = match u.state {
            UnitState::Queued | UnitState::Failed | UnitState::Terminated => u.unplaced_reason.as_deref(),
            _ => None,
        };
        if let Some(why) = why {
            message.push_str(": ");
            message.push_str(why);
        }
        let mut e = NewEvent::new("unit", message).app(app).unit(&u.unit_id);
        // The node of its first member, so `events --node` finds what ran there.
        if let Some(node) = u.members.first().and_then(|m| m.node_id.as_deref()) {
            e = e.node(node);
        }
        out.push(e);
    }
    seen.units = units;
    let rollout = rollout_key(status);
    if rollout != seen.rollout
        && let Some((template, state)) = &rollout
    {
        let mut message = format!("{app}: rollout to template {template} {state}");
        if let Some(why) = status.rollout.as_ref().and_then(|r| r.reason.as_deref()) {
            message.push_str(": ");
            message.push_str(why);
        }
        out.push(NewEvent::new("rollout", message).app(app));
    }
    seen.rollout = rollout;
}

/// Compares every [`EVERY`] until the process stops.
pub fn spawn(state: Arc<ControlState>) {
    tokio::spawn(async move {
        let mut seen = Seen::new(flotilla_core::now_ms());
        let mut tick = tokio::time::interval(EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut first = true;
        loop {
            tick.tick().await;
            let apps: Vec<_> = state.apps.locals().iter().map(|h| (h.status(), h.decisions())).collect();
            let events = seen.compare(state.cluster.slots(), &apps, first);
            first = false;
            state.journal.record(events);
        }
    });
}
