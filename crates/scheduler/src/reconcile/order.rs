//! Start order: a member whose template says `after = "head"` is claimed with its unit
//! (so the unit is placed all at once) but held back by its agent (`waiting`). Once the
//! member it waits for runs, the scheduler claims it again under the same key with the
//! head's address and ports in its env and without `after`; the shard updates the
//! entry in place and its agent starts it. Wherever the head runs, the worker learns
//! where: the head's agent reported its address and named ports through the view.

use std::collections::{BTreeMap, HashMap};

use flotilla_core::now_ms;
use flotilla_core::ports::port_env_suffix;
use flotilla_proto::v1;

use super::ledgers::{Ledgers, claim_key, workload};
use crate::lifecycle::UnitState;
use crate::spec::AppSpec;
use crate::store::{MemberRecord, UnitRecord, Units};

/// How long a release is given to show in the view before it is sent again.
const RESEND_AFTER_MS: u64 = 3_000;

/// A held member that may start now: the claim that releases it, for its shard.
#[derive(Debug, Clone, PartialEq)]
pub struct Release {
    pub unit_id: String,
    pub member: String,
    pub shard: usize,
    pub claim: v1::Claim,
}

/// The variables that tell a member where its head is: `FLOTILLA_HEAD_ADDR` (the
/// head's host), `FLOTILLA_HEAD_PORT` (its main port), `FLOTILLA_HEAD_PORT_<NAME>` for
/// each named port and `_<NAME>_MIN` / `_MAX` for each block. None until the head
/// reports an address.
pub fn head_env(head: &MemberRecord) -> Option<BTreeMap<String, String>> {
    let (host, port) = head.address.as_deref()?.rsplit_once(':')?;
    let mut env = BTreeMap::from([
        ("FLOTILLA_HEAD_ADDR".to_string(), host.to_string()),
        ("FLOTILLA_HEAD_PORT".to_string(), port.to_string()),
    ]);
    for (name, p) in &head.ports.named {
        env.insert(format!("FLOTILLA_HEAD_PORT_{}", port_env_suffix(name)), p.to_string());
    }
    for (name, (a, b)) in &head.ports.ranges {
        env.insert(format!("FLOTILLA_HEAD_PORT_{}_MIN", port_env_suffix(name)), a.to_string());
        env.insert(format!("FLOTILLA_HEAD_PORT_{}_MAX", port_env_suffix(name)), b.to_string());
    }
    Some(env)
}

/// The members of `units` that wait (their agents report them `waiting`) for a member
/// that is running now, each with the claim that starts it. Pure.
pub fn releases<'a>(spec: &AppSpec, units: impl IntoIterator<Item = &'a UnitRecord>) -> Vec<Release> {
    let templates = spec.members();
    let mut out = Vec::new();
    for unit in units {
        if !matches!(unit.state, UnitState::Allocated | UnitState::Starting | UnitState::Running | UnitState::Degraded)
        {
            continue;
        }
        // A worker replaced alone (its replacement in `surge`) waits for the head too.
        for m in unit.members.iter().chain(&unit.surge).filter(|m| m.state.as_deref() == Some("waiting")) {
            let Some((_, role, t)) = templates.iter().find(|(name, _, _)| *name == m.member) else { continue };
            let Some(after) = t.after.as_deref() else { continue };
            let Some(env) = unit
                .members
                .iter()
                .find(|h| h.member == after && h.state.as_deref() == Some("running"))
                .and_then(head_env)
            else {
                continue;
            };
            let (Some(node), Some(shard)) = (&m.node_id, m.shard) else { continue };
            let t = t.alternative(m.alternative);
            let mut w = workload(spec, role, &t);
            w.after.clear();
            for (k, v) in env {
                // A variable the spec sets itself stays the spec's.
                w.env.entry(k).or_insert(v);
            }
            out.push(Release {
                unit_id: unit.unit_id.clone(),
                member: m.member.clone(),
                shard: shard as usize,
                claim: v1::Claim {
                    key: Some(claim_key(&spec.name, &unit.unit_id, &m.member, m.key_generation(unit.generation))),
                    node_id: node.clone(),
                    incarnation: m.incarnation,
                    resources: Some((&t.resources()).into()),
                    allow_low_priority: spec.allows_low_priority(&t, unit.secondary),
                    group: unit.unit_id.clone(),
                    workload: Some(w),
                },
            });
        }
    }
    out
}

/// The held members this scheduler released, so a release still in flight is not sent
/// again within `RESEND_AFTER_MS`.
#[derive(Default)]
pub(super) struct Held {
    /// When each (unit, member) was last released.
    released: HashMap<(String, String), u64>,
}

impl Held {
    /// Starts the held members of `units` whose head is running (see the module doc).
    /// What the shard refuses (the node restarted) is left to repair; an unknown outcome
    /// is sent again, harmlessly (the same key and workload change nothing twice).
    pub(super) async fn start_waiting(&mut self, spec: &AppSpec, units: &Units, ledgers: &mut Ledgers) {
        let now = now_ms();
        let due: Vec<Release> = releases(spec, units.values())
            .into_iter()
            .filter(|r| {
                self.released
                    .get(&(r.unit_id.clone(), r.member.clone()))
                    .is_none_or(|at| now.saturating_sub(*at) >= RESEND_AFTER_MS)
            })
            .collect();
        self.released.retain(|_, at| now.saturating_sub(*at) < RESEND_AFTER_MS * 10);
        let mut by_shard: BTreeMap<usize, Vec<Release>> = BTreeMap::new();
        for r in due {
            by_shard.entry(r.shard).or_default().push(r);
        }
        for (shard, list) in by_shard {
            for r in &list {
                tracing::info!(unit = %r.unit_id, member = %r.member, "its head runs: starting the member that waits for it");
                self.released.insert((r.unit_id.clone(), r.member.clone()), now);
            }
            let claims = list.into_iter().map(|r| r.claim).collect();
            let txn_id = ledgers.txn_id(&format!("{}-start", spec.name));
            match ledgers.commit(shard, txn_id, claims).await {
                Ok(resp) => {
                    for r in resp.results.iter().filter(|r| !r.accepted) {
                        let member = r.key.as_ref().map(|k| format!("{}/{}", k.unit, k.member)).unwrap_or_default();
                        tracing::warn!(%member, detail = %r.detail, "the shard refused to start a waiting member");
                    }
                }
                Err(e) => tracing::warn!(error = %e, "starting waiting members; will retry"),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NamedPorts;
    use crate::testing::unit;

    const SPEC: &str = r#"
name = "ray"
[unit]
workers = 2
[unit.head]
command = "ray"
cpu = "1"
memory = "1Gi"
serves_http = true
ports = ["gcs", "serve"]
port_ranges = { worker_ports = 10 }
[unit.worker]
command = "ray"
cpu = "1"
memory = "1Gi"
after = "head"
[unit.worker.env]
FLOTILLA_HEAD_PORT = "set-by-the-spec"
[units]
min = 1
max = 2
initial = 1
[routing]
roles = ["head"]
port = "serve"
"#;

    #[test]
    fn the_head_s_address_and_named_ports_become_variables() {
        let mut head = unit("u1", 1, UnitState::Running, &[("head", "n1")]).members.remove(0);
        head.address = Some("10.0.0.7:41005".into());
        head.ports = NamedPorts {
            named: [("gcs".to_string(), 41001), ("dashboard-agent".to_string(), 41002)].into(),
            ranges: [("worker_ports".to_string(), (41010, 41019))].into(),
        };
        let env = head_env(&head).unwrap();
        assert_eq!(env["FLOTILLA_HEAD_ADDR"], "10.0.0.7");
        assert_eq!(env["FLOTILLA_HEAD_PORT"], "41005");
        assert_eq!(env["FLOTILLA_HEAD_PORT_GCS"], "41001");
        assert_eq!(env["FLOTILLA_HEAD_PORT_DASHBOARD_AGENT"], "41002");
        assert_eq!(env["FLOTILLA_HEAD_PORT_WORKER_PORTS_MIN"], "41010");
        assert_eq!(env["FLOTILLA_HEAD_PORT_WORKER_PORTS_MAX"], "41019");
        head.address = None;
        assert!(head_env(&head).is_none(), "no address yet: nothing to tell");
    }

    /// A waiting worker is released only once its head runs, with the head's address,
    /// under its own key and node; a worker not (or no longer) waiting is left alone.
    #[test]
    fn waiting_members_start_once_their_head_runs() {
        let spec = AppSpec::parse(SPEC).unwrap();
        let mut u = unit("u1", 4, UnitState::Starting, &[("head", "n1"), ("worker-0", "n2"), ("worker-1", "n3")]);
        u.app = "ray".into();
        u.members[0].state = Some("starting".into());
        u.members[0].address = Some("10.0.0.1:41005".into());
        u.members[0].ports.named.insert("gcs".into(), 41001);
        u.members[1].state = Some("waiting".into());
        u.members[2].state = Some("running".into());
        assert!(releases(&spec, [&u]).is_empty(), "the head is not running yet");
        u.members[0].state = Some("running".into());
        let r = releases(&spec, [&u]);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_eq!((r[0].unit_id.as_str(), r[0].member.as_str(), r[0].shard), ("u1", "worker-0", 0));
        let c = &r[0].claim;
        assert_eq!(c.key, Some(claim_key("ray", "u1", "worker-0", 4)), "the key it holds: updated in place");
        assert_eq!(c.node_id, "n2");
        let w = c.workload.as_ref().unwrap();
        assert!(w.after.is_empty(), "released");
        assert_eq!(w.env["FLOTILLA_HEAD_ADDR"], "10.0.0.1");
        assert_eq!(w.env["FLOTILLA_HEAD_PORT_GCS"], "41001");
        assert_eq!(w.env["FLOTILLA_HEAD_PORT"], "set-by-the-spec", "the spec's own variable wins");
        u.state = UnitState::Failed;
        assert!(releases(&spec, [&u]).is_empty(), "a failed unit starts nothing");
    }

    /// The claims that place a unit carry each member's named ports, the routing port as
    /// the routed member's main port, and `after` on the workers.
    #[test]
    fn placing_claims_carry_ports_and_start_order() {
        let spec = AppSpec::parse(SPEC).unwrap();
        let (_, role, t) = &spec.members()[0];
        let head = workload(&spec, role, t);
        assert_eq!(
            (head.ports.clone(), head.main_port.as_str(), head.after.as_str()),
            (vec!["gcs".into(), "serve".into()], "serve", "")
        );
        assert_eq!(head.port_ranges["worker_ports"], 10);
        let (_, role, t) = &spec.members()[1];
        let worker = workload(&spec, role, t);
        assert_eq!((worker.main_port.as_str(), worker.after.as_str()), ("", "head"));
    }
}
