//! The promises every scenario checks: continuously while it runs ([`Watch`]: no node
//! over capacity, no unit or member placed twice) and once it has healed ([`settled`]:
//! the ledger holds exactly what the app's units hold, and no member runs twice on the
//! hosts themselves).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use super::federation::{Fed, cli};

/// What a [`Watch`] saw.
#[derive(Debug, Default)]
pub struct Report {
    /// Samples taken (each one read of the nodes and units).
    pub checks: u64,
    pub violations: Vec<String>,
}

/// A thread on the probe host sampling the control plane every 250 ms.
pub struct Watch {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Report>>,
}

/// Units that hold entries in the ledger (or are about to).
fn holding(u: &Value) -> bool {
    !matches!(u["state"].as_str(), Some("terminated" | "queued"))
}

impl Drop for Watch {
    /// A test that panics mid-scenario stops the watcher too.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// What is wrong with one sample of `nodes` and `units`.
pub fn violations(nodes: &[Value], units: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    for n in nodes {
        for r in ["cpu_millis", "memory_bytes"] {
            let (held, cap) = (n["allocated"][r].as_u64().unwrap_or(0), n["capacity"][r].as_u64().unwrap_or(0));
            if held > cap {
                out.push(format!("{} over capacity: {r} {held} > {cap}", n["node_id"]));
            }
        }
    }
    let mut ids = BTreeMap::<&str, usize>::new();
    for u in units {
        *ids.entry(u["unit_id"].as_str().unwrap_or("")).or_default() += 1;
    }
    out.extend(ids.iter().filter(|(_, n)| **n > 1).map(|(id, n)| format!("unit {id} listed {n} times")));
    for u in units.iter().filter(|u| holding(u)) {
        let mut members = BTreeMap::<&str, Vec<&str>>::new();
        for m in u["members"].as_array().into_iter().flatten() {
            if let Some(node) = m["node_id"].as_str().filter(|n| !n.is_empty()) {
                members.entry(m["member"].as_str().unwrap_or("")).or_default().push(node);
            }
        }
        for (m, on) in members.iter().filter(|(_, on)| on.len() > 1) {
            out.push(format!("{} member {m} placed on {on:?}", u["unit_id"]));
        }
    }
    out
}

impl Watch {
    /// Watches through the control plane.
    pub fn start(fed: &Fed) -> Watch {
        Watch::through(fed, &fed.control)
    }

    /// Watches through the API at `api` (a scheduler's serves nodes and units too).
    pub fn through(fed: &Fed, api: &str) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, control, ns) = (stop.clone(), api.to_string(), fed.lab.host("probe").ns.clone());
        let handle = std::thread::spawn(move || {
            let mut report = Report::default();
            while !flag.load(Ordering::Relaxed) {
                let (nodes, units) = (cli(&ns, &control, &["nodes"]), cli(&ns, &control, &["units", "echo"]));
                if let (Some(nodes), Some(units)) = (nodes.as_array(), units.as_array()) {
                    report.checks += 1;
                    let seen = violations(nodes, units);
                    for v in seen {
                        if !report.violations.contains(&v) {
                            report.violations.push(v);
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
            report
        });
        Watch { stop, handle: Some(handle) }
    }

    /// Stops the watcher; what it saw.
    pub fn stop(mut self) -> Report {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.take().map(|h| h.join().unwrap()).unwrap_or_default()
    }

    /// Stops the watcher; what it saw. Panics if it saw a violation or too few samples.
    pub fn finish(self, what: &str) -> Report {
        let report = self.stop();
        eprintln!("{what}: {} samples of nodes and units, {} violations", report.checks, report.violations.len());
        assert!(report.checks >= 4, "{what}: the watcher could not read the control plane");
        assert!(report.violations.is_empty(), "{what}: {:#?}", report.violations);
        report
    }
}

/// Each live unit's members as `id gen G: member on node` lines, sorted: what must not
/// change when nothing is replaced.
pub fn placements(units: &[Value]) -> Vec<String> {
    let mut out: Vec<String> = units
        .iter()
        .filter(|u| u["state"] != "terminated")
        .flat_map(|u| {
            let (id, generation) = (u["unit_id"].clone(), u["generation"].clone());
            u["members"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .map(move |m| format!("{id} gen {generation}: {} on {}", m["member"], m["node_id"]))
        })
        .collect();
    out.sort();
    out
}

/// The members running on the agent hosts themselves: (app, unit, member) → hosts, read
/// from each process's environment.
pub fn running_members(fed: &Fed) -> BTreeMap<(String, String, String), Vec<String>> {
    let mut out = BTreeMap::<_, Vec<String>>::new();
    for (host, _) in &fed.agents {
        for pid in fed.lab.pids(host) {
            let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
            let vars: BTreeMap<&str, &str> =
                env.split(|b| *b == 0).filter_map(|kv| std::str::from_utf8(kv).ok()?.split_once('=')).collect();
            if let (Some(a), Some(u), Some(m)) =
                (vars.get("FLOTILLA_APP"), vars.get("FLOTILLA_UNIT"), vars.get("FLOTILLA_MEMBER"))
            {
                out.entry((a.to_string(), u.to_string(), m.to_string())).or_default().push(host.clone());
            }
        }
    }
    out
}

/// Once healed: `desired` units running, every node Alive, the ledger holding exactly
/// what the units hold (250m per echo member) and every member running on exactly one
/// host. Waits up to `limit` for it; the time it took.
pub fn settled(fed: &Fed, desired: usize, limit: Duration) -> Duration {
    let started = std::time::Instant::now();
    loop {
        let why = match unsettled(fed, desired) {
            None => return started.elapsed(),
            Some(why) => why,
        };
        assert!(started.elapsed() < limit, "not settled {limit:?} after the heal: {why}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// What keeps the federation from being settled, if anything.
fn unsettled(f: &Fed, desired: usize) -> Option<String> {
    let (nodes, units) = (f.nodes(), f.units());
    let statuses: Vec<String> = nodes.iter().map(|n| format!("{} {}", n["node_id"], n["status"])).collect();
    if nodes.len() != f.agents.len() || nodes.iter().any(|n| n["status"] != "alive") {
        return Some(format!("nodes: {statuses:?}"));
    }
    let states: Vec<String> = units.iter().map(|u| format!("{} {}", u["unit_id"], u["state"])).collect();
    let running: Vec<&Value> = units.iter().filter(|u| u["state"] == "running").collect();
    if running.len() != desired || units.iter().any(|u| holding(u) && u["state"] != "running") {
        return Some(format!("units: {states:?}"));
    }
    for n in &nodes {
        let id = n["node_id"].as_str().unwrap_or("");
        let held = running
            .iter()
            .flat_map(|u| u["members"].as_array().cloned().unwrap_or_default())
            .filter(|m| m["node_id"] == id)
            .count() as u64;
        let allocated = n["allocated"]["cpu_millis"].as_u64().unwrap_or(0);
        if allocated != held * 250 {
            return Some(format!("{id}: the ledger holds {allocated}m, the units {}m", held * 250));
        }
    }
    let on_hosts = running_members(f);
    let expected = running.iter().map(|u| u["members"].as_array().map_or(0, Vec::len)).sum::<usize>();
    if on_hosts.len() != expected || on_hosts.values().any(|h| h.len() != 1) {
        return Some(format!("{expected} members placed, on the hosts: {on_hosts:?}"));
    }
    None
}
