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
