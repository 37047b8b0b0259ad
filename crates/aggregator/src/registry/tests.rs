use super::*;
use tokio::sync::mpsc::unbounded_channel;

pub(crate) fn request(node: &str, incarnation: u64, domain: &str) -> v1::RegisterRequest {
    v1::RegisterRequest {
        protocol_version: PROTOCOL_VERSION,
        join_token: "tok".into(),
        node_id: node.into(),
        incarnation,
        labels: [("domain".to_string(), domain.to_string())].into_iter().collect(),
        capacity: Some(v1::Resources { cpu_millis: 4000, memory_bytes: 1 << 33, ..Default::default() }),
        assignments: vec![],
        health: None,
        assignment_version: 0,
        cordoned: false,
    }
}

fn registry() -> Registry {
    Registry::new(0, 1, b"master".to_vec(), vec!["tok".into()], unbounded_channel().0)
}

#[test]
fn register_validates_credentials_and_input() {
    let r = registry();
    let mut bad = request("n1", 1, "a");
    bad.join_token = "nope".into();
    assert_eq!(r.register(bad, 0).err(), Some(RegisterError::JoinToken));
    let mut bad = request("n1", 1, "a");
    bad.protocol_version = 99;
    assert_eq!(r.register(bad, 0).err(), Some(RegisterError::ProtocolVersion(99)));
    assert!(matches!(r.register(request("bad id", 1, "a"), 0), Err(RegisterError::NodeId(_))));
    let mut bad = request("n1", 1, "a");
    bad.labels.insert("k".into(), "v".repeat(500));
    assert!(matches!(r.register(bad, 0), Err(RegisterError::Invalid(_))));
    let mut bad = request("n1", 1, "a");
    bad.capacity = Some(v1::Resources { cpu_millis: u64::MAX, ..Default::default() });
    assert!(matches!(r.register(bad, 0), Err(RegisterError::Invalid(_))));
    let mut bad = request("n1", 1, "a");
    bad.assignments = vec![v1::Assignment { app: "echo".into(), member: "m1".into(), ..Default::default() }];
    let err = r.register(bad, 0).err().unwrap();
    assert_eq!(err.to_string(), "assignments: claims[0]: key.unit: must be 1..=128 bytes without control characters");
    assert_eq!((err.kind(), err.code()), (ErrorKind::InvalidInput, "invalid"));
    assert!(r.is_empty());
}

#[test]
fn a_wrong_credential_is_unauthenticated_and_closes_the_connection() {
    let e = RegisterError::JoinToken;
    assert_eq!((e.kind(), e.code(), e.closes_connection()), (ErrorKind::Unauthenticated, "join_token", true));
    let e = RegisterError::StaleIncarnation(1, 2);
    assert_eq!((e.kind(), e.code(), e.closes_connection()), (ErrorKind::Conflict, "stale_incarnation", false));
}

#[test]
fn newer_incarnations_replace_and_older_ones_are_refused() {
    let r = registry();
    let a = r.register(request("n1", 5, "a"), 0).unwrap();
    let b = r.register(request("n1", 6, "a"), 0).unwrap();
    assert_eq!(r.len(), 1);
    assert!(!r.is_current(a.session_id), "the old session is gone");
    assert!(r.is_current(b.session_id));
    assert_eq!(r.register(request("n1", 5, "a"), 0).err(), Some(RegisterError::StaleIncarnation(5, 6)));
    // The same incarnation re-registers (after a lost connection) with a new session.
    let c = r.register(request("n1", 6, "a"), 0).unwrap();
    assert_ne!(c.session_id, b.session_id);
    assert!(!r.is_current(b.session_id));
    assert_eq!(r.len(), 1);
}

#[test]
fn nodes_of_another_shards_domain_are_refused() {
    let (tx, _rx) = unbounded_channel();
    let r = Registry::new(0, 4, b"m".to_vec(), vec!["tok".into()], tx);
    let foreign = (0..100).map(|i| format!("d{i}")).find(|d| shard_for_domain(d, 4) != 0).unwrap();
    assert!(matches!(r.register(request("n", 1, &foreign), 0), Err(RegisterError::WrongShard { .. })));
}

#[test]
fn join_tokens_rotate_at_run_time() {
    let r = registry();
    let with = |node: &str, token: &str| {
        let mut req = request(node, 1, "a");
        req.join_token = token.into();
        req
    };
    assert!(r.register(with("n1", "tok"), 0).is_ok());
    assert_eq!(r.register(with("n2", "new"), 0).err(), Some(RegisterError::JoinToken));
    // Rotated: the new token first, the old one still accepted.
    r.set_join_tokens(vec!["new".into(), "tok".into()]);
    assert!(r.register(with("n2", "new"), 0).is_ok());
    assert!(r.register(with("n3", "tok"), 0).is_ok());
    // Retired: only the new one.
    r.set_join_tokens(vec!["new".into()]);
    assert_eq!(r.join_tokens().as_slice(), ["new".to_string()]);
    assert_eq!(r.register(with("n4", "tok"), 0).err(), Some(RegisterError::JoinToken));
    assert!(r.register(with("n4", "new"), 0).is_ok());
    // Sessions opened with the retired token stay.
    assert_eq!(r.len(), 4);
    assert!(r.node(&NodeId::new("n1").unwrap()).is_some());
    // A prefix or an empty token never matches.
    assert_eq!(r.register(with("n5", "ne"), 0).err(), Some(RegisterError::JoinToken));
    assert_eq!(r.register(with("n5", ""), 0).err(), Some(RegisterError::JoinToken));
}

#[test]
fn workload_reports_only_for_the_sessions_own_node() {
    let r = registry();
    let a = r.register(request("n1", 1, "a"), 0).unwrap();
    let b = r.register(request("n2", 1, "a"), 0).unwrap();
    let w = v1::WorkloadStatus { app: "echo".into(), unit: "u1".into(), member: "m1".into(), ..Default::default() };
    let err = r.report_workloads(a.session_id, "n2", vec![w.clone()]).unwrap_err();
    assert_eq!(err, ReportError::OtherNode);
    assert_eq!(err.to_string(), "a session reports only for its own node");
    assert!(r.workloads(&b.node_id).is_empty(), "nothing was recorded for n2");
    assert_eq!(r.report_workloads(9, "n1", vec![w.clone()]).unwrap_err(), ReportError::UnknownSession);
    let nameless = v1::WorkloadStatus { member: String::new(), ..w.clone() };
    let err = r.report_workloads(a.session_id, "n1", vec![nameless]).unwrap_err();
    assert!(matches!(err, ReportError::Invalid(_)), "{err}");
    assert_eq!(err.code(), "workloads");
    assert!(r.report_workloads(a.session_id, "n1", vec![w]).is_ok());
    assert_eq!(r.workloads(&a.node_id).len(), 1);
    assert!(r.workloads(&b.node_id).is_empty());
}

/// A shard holds one session per node in its slab (issue #19's 300 bytes a node).
#[test]
fn a_session_stays_at_96_bytes() {
    assert_eq!(std::mem::size_of::<NodeLive>(), 96);
    assert_eq!(std::mem::size_of::<Option<NodeLive>>(), 96, "a slab cell costs nothing over its session");
}

/// A warm pool node registers cordoned; once its pool uncordoned it, a restart of
/// its agent (the same flag) does not cordon it again.
#[test]
fn a_node_registering_cordoned_is_cordoned_once() {
    let r = registry();
    let warm = |inc| v1::RegisterRequest { cordoned: true, ..request("w1", inc, "d") };
    let a = r.register(warm(1), 0).unwrap();
    assert_eq!(r.cordon(&a.node_id), Some(false), "cordoned, no drain");
    assert!(r.set_cordon(&a.node_id, false, false));
    r.register(warm(2), 10).unwrap();
    assert_eq!(r.cordon(&a.node_id), None, "a node the shard knows keeps its cordon");
    let b = r.register(request("n2", 1, "d"), 0).unwrap();
    assert_eq!(r.cordon(&b.node_id), None);
}

#[test]
fn drain_needs_the_matching_node() {
    let r = registry();
    let a = r.register(request("n1", 1, "a"), 0).unwrap();
    assert_eq!(r.drain(a.session_id, "n2", 5), None, "a session cannot drain another node");
    assert_eq!(r.drain(a.session_id, "n1", 5), Some(NodeStatus::Draining));
    assert_eq!(r.with_session(a.session_id, NodeLive::status_since), Some((NodeStatus::Draining, 5)));
}

/// Sessions come and go through the slab: every held node is found by its id and by
/// its session, a forgotten session's id never finds the slot's next occupant, and
/// the index holds exactly the nodes held.
#[test]
fn slots_are_reused_and_the_index_stays_consistent() {
    let (tx, mut rx) = unbounded_channel();
    let r = Registry::new(0, 1, b"m".to_vec(), vec!["tok".into()], tx);
    let mut held = std::collections::HashMap::new();
    for round in 0..4u64 {
        for i in 0..500 {
            let s = r.register_over(request(&format!("n{i}"), round + 1, "a"), 0, 9).unwrap();
            if let Some(old) = held.insert(s.node_id.clone(), s.session_id) {
                assert!(!r.is_current(old), "a newer incarnation replaced the old session");
            }
        }
        // Forget every third node; its slot goes to a node registered later.
        let gone: Vec<_> = held
            .iter()
            .filter(|(n, _)| n.as_str().len() % 3 == (round % 3) as usize)
            .map(|(n, s)| (n.clone(), *s))
            .collect();
        for (n, sid) in gone {
            r.remove(sid);
            r.remove(sid); // twice: the second finds nothing
            assert!(r.node(&n).is_none());
            assert!(!r.is_current(sid));
            held.remove(&n);
        }
        for i in 0..50 {
            let s = r.register(request(&format!("fresh{round}-{i}"), 1, "a"), 0).unwrap();
            held.insert(s.node_id.clone(), s.session_id);
        }
        assert_eq!(r.len(), held.len());
        for (n, &sid) in &held {
            assert_eq!(r.node(n).map(|s| s.session_id), Some(sid), "{n}");
            assert_eq!(r.with_session(sid, |l| l.node_id.clone()).as_ref(), Some(n));
        }
    }
    assert_eq!(r.owner(held[&NodeId::new("n1").unwrap()]), Some(9));
    let removed = std::iter::from_fn(|| rx.try_recv().ok()).filter(|c| matches!(c, Change::Removed(_))).count();
    assert!(removed > 0, "forgotten nodes were announced");
}

#[test]
fn nodes_without_a_report_share_one_empty_list() {
    let r = registry();
    let a = r.register(request("n1", 1, "a"), 0).unwrap();
    let b = r.register(request("n2", 1, "a"), 0).unwrap();
    assert!(Arc::ptr_eq(&r.workloads(&a.node_id), &r.workloads(&b.node_id)));
}
