//! The long run (`flotilla-loadtest lab --soak`): a federation on 17 lab hosts (a shard
//! and its standby, etcd, two schedulers, the control plane, ten agents in two domains)
//! under a seeded mix of partitions (agents from the shard, a shard's host from all, a
//! scheduler from etcd), one-way cuts, loss, agent kills, scaling, applies and drains, with the invariants watched throughout and convergence timed after the
//! last heal.

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::{Fed, Options, Watch, settled};

/// What one soak did and saw.
#[derive(Debug)]
pub struct SoakReport {
    pub hosts: usize,
    pub seconds: f64,
    /// Faults and churn, each one operation.
    pub operations: u64,
    pub partitions: u64,
    pub kills: u64,
    pub samples: u64,
    pub violations: Vec<String>,
    /// From the last heal to every promise holding again.
    pub converged_seconds: f64,
}

impl SoakReport {
    pub fn to_json(&self, seed: u64) -> Value {
        json!({
            "seed": seed, "hosts": self.hosts, "seconds": self.seconds, "operations": self.operations,
            "partitions": self.partitions, "kills": self.kills, "samples": self.samples,
            "violations": self.violations.len(), "violation_list": self.violations,
            "converged_seconds": self.converged_seconds,
        })
    }
}

/// splitmix64: a seed gives the same run of choices everywhere, with no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// In `lo..=hi`.
    fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.next() as usize % items.len()]
    }
}

/// Runs the soak for `minutes` with `seed`; `log` hears each operation.
pub fn soak(minutes: f64, seed: u64, mut log: impl FnMut(&str)) -> SoakReport {
    let options = Options { per_domain: 5, schedulers: 2, etcd: true, standby: true, ..Options::default() };
    let mut fed = Fed::start("soak", options);
    let hosts = fed.lab.hosts().len();
    let agents: Vec<String> = fed.agents.iter().map(|(h, _)| h.clone()).collect();
    let mut rng = Rng(seed);
    let mut report = SoakReport {
        hosts,
        seconds: 0.0,
        operations: 0,
        partitions: 0,
        kills: 0,
        samples: 0,
        violations: Vec::new(),
        converged_seconds: 0.0,
    };
    let watch = Watch::start(&fed);
    let started = Instant::now();
    let end = started + Duration::from_secs_f64(minutes * 60.0);
    // At most one fault at a time, healed when its time is up; killed agents and drained
    // nodes come back with the heal.
    let mut heal_at: Option<Instant> = None;
    let (mut killed, mut drained): (Vec<String>, Vec<String>) = (Vec::new(), Vec::new());
    let (mut units, mut memory) = (2u64, 64u64);
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(rng.between(2000, 5000)));
        if heal_at.is_some_and(|t| Instant::now() >= t) {
            heal(&mut fed, &mut killed, &mut drained);
            heal_at = None;
            log("heal");
            continue;
        }
        report.operations += 1;
        let fault = heal_at.is_none() && rng.between(0, 1) == 0;
        if fault {
            let a = rng.pick(&agents).clone();
            let what = match rng.between(0, 6) {
                0 => {
                    let mut group: Vec<&str> =
                        agents.iter().filter(|_| rng.between(0, 2) == 0).map(String::as_str).collect();
                    if group.is_empty() {
                        group.push(&a);
                    }
                    fed.lab.partition(&group, &["shard", "shard2"]);
                    report.partitions += 1;
                    format!("partition {group:?} from the shard")
                }
                1 => {
                    if rng.between(0, 1) == 0 {
                        fed.lab.cut(&[&a], &["shard", "shard2"]);
                        format!("cut {a} -> shard")
                    } else {
                        fed.lab.cut(&["shard", "shard2"], &[&a]);
                        format!("cut shard -> {a}")
                    }
                }
                2 => {
                    let p = rng.between(5, 20) as f64 / 100.0;
                    fed.lab.loss(&a, p);
                    format!("{:.0} % loss at {a}", p * 100.0)
                }
                3 => {
                    fed.kill(&a);
                    killed.push(a.clone());
                    report.kills += 1;
                    format!("kill {a}'s agent")
                }
                4 => {
                    // The shard's host (either process: the active one or the standby)
                    // cut from every other host.
                    let host = *rng.pick(&["shard", "shard2"]);
                    let others: Vec<String> =
                        fed.lab.hosts().iter().map(|h| h.name.clone()).filter(|h| h != host && h != "probe").collect();
                    let others: Vec<&str> = others.iter().map(String::as_str).collect();
                    fed.lab.partition(&[host], &others);
                    report.partitions += 1;
                    format!("isolate {host}'s host")
                }
                5 => {
                    let host = *rng.pick(&["sched", "sched2"]);
                    fed.lab.partition(&[host], &["etcd"]);
                    report.partitions += 1;
                    format!("cut {host} from etcd")
                }
                _ => {
                    let (status, _) = fed.call("POST", &format!("/v1/nodes/{a}/drain"), "");
                    drained.push(a.clone());
                    format!("drain {a} ({status})")
                }
            };
            heal_at = Some(Instant::now() + Duration::from_millis(rng.between(3000, 15_000)));
            log(&what);
        } else if rng.between(0, 2) == 0 {
            memory = if memory == 64 { 72 } else { 64 };
            let spec = std::fs::read_to_string(super::ECHO).unwrap_or_default().replacen(
                "memory = \"64Mi\"",
                &format!("memory = \"{memory}Mi\""),
                1,
            );
            let (status, _) = fed.call("PUT", "/v1/apps/echo/spec", &spec);
            log(&format!("apply memory {memory}Mi ({status})"));
        } else {
            units = rng.between(1, 6);
            let (status, _) = fed.call("PUT", "/v1/apps/echo/scale", &format!(r#"{{"units": {units}}}"#));
            log(&format!("scale to {units} ({status})"));
        }
    }
    heal(&mut fed, &mut killed, &mut drained);
    log("last heal");
    report.seconds = started.elapsed().as_secs_f64();
    let (status, _) = fed.call("PUT", "/v1/apps/echo/scale", &format!(r#"{{"units": {units}}}"#));
    log(&format!("scale to {units} once more ({status})"));
    let converged = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        settled(&fed, units as usize, Duration::from_secs(180))
    }));
    match converged {
        Ok(d) => report.converged_seconds = d.as_secs_f64(),
        Err(e) => {
            let why = e.downcast_ref::<String>().cloned().unwrap_or_else(|| "did not settle".into());
            report.violations.push(format!("after the last heal: {why}"));
            report.converged_seconds = f64::NAN;
            schedulers_say(&fed, &mut log);
        }
    }
    let seen = watch.stop();
    report.samples = seen.checks;
    report.violations.extend(seen.violations);
    report
}

/// What each scheduler says of the app when the federation does not settle: its role and
/// lease, whether it waits (and why), its store's health, and its units' members with
/// their nodes and states: which scheduler is stuck, and on what, is in the log.
fn schedulers_say(fed: &Fed, log: &mut impl FnMut(&str)) {
    for (host, addr) in &fed.schedulers {
        let get = |path: &str| fed.lab.inside("probe", || crate::http(addr, "GET", path, Some(&fed.token), "")).1;
        let app = get("/v1/apps/echo");
        log(&format!(
            "scheduler on {host}: scheduler {} waiting {} store {}",
            app["scheduler"], app["waiting"], app["store"]
        ));
        for u in get("/v1/apps/echo/units").as_array().into_iter().flatten() {
            let members: Vec<String> = u["members"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| format!("{} on {} {}", m["member"], m["node_id"], m["state"]))
                .collect();
            log(&format!("  {} {}: {}", u["unit_id"], u["state"], members.join(", ")));
        }
    }
}

/// Removes every fault, starts killed agents (and shard processes that stopped, having
/// lost their lease) again, and lets drained nodes take work.
fn heal(fed: &mut Fed, killed: &mut Vec<String>, drained: &mut Vec<String>) {
    fed.lab.heal();
    for a in killed.drain(..) {
        fed.restart(&a);
    }
    for shard in ["shard", "shard2"] {
        if fed.exited(shard) {
            fed.restart(shard);
        }
    }
    for a in drained.drain(..) {
        let _ = fed.call("POST", &format!("/v1/nodes/{a}/uncordon"), "");
    }
}
