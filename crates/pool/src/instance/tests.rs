use super::*;
use proptest::prelude::*;

const T: Timeouts = Timeouts {
    request_ms: 60_000,
    agent_start_ms: 120_000,
    drain_ms: 120_000,
    terminate_ms: 60_000,
    max_launch_attempts: 3,
    retention_ms: 3_600_000,
};

fn manager() -> Instances {
    Instances::new(["cpu".to_string(), "gpu".to_string()], 42)
}

fn listed(ids: &[&str]) -> Vec<CloudInstance> {
    ids.iter().map(|id| CloudInstance { id: id.to_string(), node_type: "cpu".into() }).collect()
}

fn seen(id: &str, n: NodeSeen) -> HashMap<String, NodeSeen> {
    HashMap::from([(id.to_string(), n)])
}

const ALIVE: NodeSeen = NodeSeen { alive: true, dead: false, draining: false, allocated_nothing: false };

fn state(im: &Instances, id: &str) -> InstanceState {
    im.get(id).map(|i| i.state).unwrap_or(Queued)
}

fn one_queued(im: &mut Instances) -> String {
    im.queue("cpu", 1, 0, "test").remove(0)
}

#[test]
fn the_table_accepts_exactly_its_transitions() {
    for &(from, to) in TRANSITIONS {
        let mut i = Instance::new("x".into(), "cpu".into(), from, 0, "t".into());
        assert_eq!(i.transition(to, 1, "t"), Ok(()), "{from} → {to}");
        assert_eq!(i.state, to);
    }
    for (from, to) in [
        (Queued, Running),
        (Queued, Allocated),
        (Requested, Running),
        (Running, Queued),
        (Running, Drained),
        (Terminated, Queued),
        (Terminated, Terminating),
        (AllocationFailed, Queued),
        (Terminating, Running),
        (Drained, Running),
        (AgentStartFailed, Running),
        (Running, Running),
    ] {
        let mut i = Instance::new("x".into(), "cpu".into(), from, 0, "t".into());
        assert!(matches!(i.transition(to, 1, "t"), Err(TransitionError::Illegal { .. })), "{from} → {to}");
        assert_eq!(i.state, from, "a refused transition changes nothing");
    }
}

#[test]
fn every_state_is_reachable_and_only_the_terminal_ones_are_dead_ends() {
    let mut reached = BTreeSet::from([Queued]);
    loop {
        let before = reached.len();
        for &(f, t) in TRANSITIONS {
            if reached.contains(&f) {
                reached.insert(t);
            }
        }
        if reached.len() == before {
            break;
        }
    }
    assert_eq!(reached.len(), InstanceState::ALL.len(), "{reached:?}");
    for s in InstanceState::ALL {
        let has_exit = TRANSITIONS.iter().any(|&(f, _)| f == s);
        assert_eq!(!has_exit, s.is_terminal(), "{s}");
        // The serde name is as_str().
        assert_eq!(serde_json::to_string(&s).ok(), Some(format!("\"{}\"", s.as_str())));
    }
}

#[test]
fn history_is_bounded() {
    let mut i = Instance::new("x".into(), "cpu".into(), Running, 0, "t".into());
    for n in 0..20 {
        let to = if n % 2 == 0 { DrainRequested } else { Running };
        assert_eq!(i.transition(to, n, "flap"), Ok(()));
    }
    assert_eq!(i.history.len(), HISTORY_LEN);
    assert_eq!(i.history.last(), Some(&(Running, 19)));
}

#[test]
fn ids_are_fresh_and_deterministic() {
    let mut a = manager();
    let mut b = manager();
    let ia = a.queue("cpu", 50, 0, "t");
    assert_eq!(ia, b.queue("cpu", 50, 0, "t"));
    assert_eq!(ia.iter().collect::<BTreeSet<_>>().len(), 50);
    assert!(ia.iter().all(|id| id.starts_with("pool-cpu-") && id.len() == "pool-cpu-".len() + 8));
}

#[test]
fn the_happy_path_through_observe() {
    let mut im = manager();
    let id = one_queued(&mut im);
    assert_eq!(im.to_launch(10, 1.0, 0), vec![id.clone()]);
    im.begin_launch(&id, 1_000).ok();
    assert_eq!(state(&im, &id), Requested);

    // Not listed yet: patience.
    assert!(im.observe(&[], &HashMap::new(), 2_000, &T).is_empty());
    im.observe(&listed(&[&id]), &HashMap::new(), 3_000, &T);
    assert_eq!(state(&im, &id), AgentStarting);
    let ch = im.observe(&listed(&[&id]), &seen(&id, ALIVE), 4_000, &T);
    assert_eq!(state(&im, &id), Running, "{ch:?}");

    im.request_drain(&id, 5_000, Cause::Idle, "idle for 60 s").ok();
    assert_eq!(state(&im, &id), DrainRequested);
    // Why it drains is a field, kept through the store's JSON, not a prefix of its reason.
    let rec = im.get(&id).unwrap();
    assert_eq!((rec.drain_cause, rec.reason.as_deref()), (Some(Cause::Idle), Some("idle: idle for 60 s")));
    let stored: Instance = serde_json::from_str(&serde_json::to_string(rec).unwrap()).unwrap();
    assert_eq!(stored.drain_cause, Some(Cause::Idle));
    let draining = NodeSeen { draining: true, ..ALIVE };
    im.observe(&listed(&[&id]), &seen(&id, draining), 6_000, &T);
    assert_eq!(state(&im, &id), Draining);
    let ch = im.observe(&listed(&[&id]), &seen(&id, NodeSeen { allocated_nothing: true, ..draining }), 7_000, &T);
    assert_eq!(state(&im, &id), Terminating, "drained, then terminated: {ch:?}");
    assert_eq!(im.get(&id).unwrap().drain_cause, None, "only while DRAIN_REQUESTED");
    assert!(ch.iter().any(|c| matches!(c, Change::Transition { to: Drained, .. })));
    assert!(ch.iter().any(|c| matches!(c, Change::Transition { to: Terminating, .. })));

    im.observe(&listed(&[&id]), &HashMap::new(), 8_000, &T);
    assert_eq!(state(&im, &id), Terminating, "still listed: still terminating");
    im.observe(&[], &HashMap::new(), 9_000, &T);
    assert_eq!(state(&im, &id), Terminated);
    let path: Vec<InstanceState> = im.get(&id).map(|i| i.history.iter().map(|h| h.0).collect()).unwrap_or_default();
    assert_eq!(path[..5], [Queued, Requested, Allocated, AgentStarting, Running]);
    assert_eq!(path.len(), HISTORY_LEN, "history keeps the last {HISTORY_LEN}");

    // Kept for a while, then pruned.
    assert!(im.prune(9_000 + T.retention_ms - 1, &T).is_empty());
    assert_eq!(im.prune(9_000 + T.retention_ms, &T), vec![id]);
    assert!(im.is_empty());
}

#[test]
fn a_quick_agent_skips_agent_starting() {
    let mut im = manager();
    let id = one_queued(&mut im);
    im.begin_launch(&id, 0).ok();
    im.observe(&listed(&[&id]), &seen(&id, ALIVE), 1_000, &T);
    assert_eq!(state(&im, &id), Running);
}

#[test]
fn a_launch_is_retried_three_times_then_fails() {
    let mut im = manager();
    let id = one_queued(&mut im);
    let mut now = 0;
    for attempt in 1..=3 {
        assert_eq!(im.to_launch(10, 1.0, now), vec![id.clone()]);
        im.begin_launch(&id, now).ok();
        assert_eq!(im.get(&id).map(|i| i.launch_attempts), Some(attempt));
        now += T.request_ms - 1;
        im.observe(&[], &HashMap::new(), now, &T);
        assert_eq!(state(&im, &id), Requested, "not yet timed out");
        now += 1;
        im.observe(&[], &HashMap::new(), now, &T);
        let want = if attempt < 3 { Queued } else { AllocationFailed };
        assert_eq!(state(&im, &id), want, "attempt {attempt}");
    }
    assert!(im.to_launch(10, 1.0, now).is_empty());

    // A launch that lands after the record gave up is a leak to terminate.
    let ch = im.observe(&listed(&[&id]), &HashMap::new(), now + 1, &T);
    assert_eq!(ch, vec![Change::Leaked { id: id.clone(), node_type: "cpu".into(), state: AllocationFailed }]);
    assert_eq!(state(&im, &id), AllocationFailed);
}

#[test]
fn a_refused_launch_is_queued_again_then_fails() {
    let mut im = manager();
    let id = one_queued(&mut im);
    for attempt in 1..=3 {
        im.begin_launch(&id, attempt).ok();
        im.launch_failed(&id, attempt, "quota", &T).ok();
    }
    assert_eq!(state(&im, &id), AllocationFailed);
}

#[test]
fn a_late_launch_of_a_requeued_record_is_matched() {
    let mut im = manager();
    let id = one_queued(&mut im);
    im.begin_launch(&id, 0).ok();
    im.observe(&[], &HashMap::new(), T.request_ms, &T);
    assert_eq!(state(&im, &id), Queued);
    im.observe(&listed(&[&id]), &HashMap::new(), T.request_ms + 1, &T);
    assert_eq!(state(&im, &id), AgentStarting);
    assert_eq!(im.len(), 1);
}

#[test]
fn a_lost_instance_is_terminated() {
    for at in [Allocated, AgentStarting, Running, DrainRequested, Draining] {
        let mut im = manager();
        let id = one_queued(&mut im);
        if let Some(i) = im.map.get_mut(&id) {
            i.state = at;
        }
        let ch = im.observe(&[], &seen(&id, ALIVE), 1_000, &T);
        assert_eq!(state(&im, &id), Terminated, "{at}");
        assert!(
            matches!(&ch[..], [Change::Transition { reason, .. }] if reason.contains("preempted or lost")),
            "{ch:?}"
        );
    }
}

#[test]
fn a_dead_node_is_terminated() {
    let mut im = manager();
    let id = one_queued(&mut im);
    im.begin_launch(&id, 0).ok();
    im.observe(&listed(&[&id]), &seen(&id, ALIVE), 1_000, &T);
    let dead = NodeSeen { alive: false, dead: true, ..Default::default() };
    let ch = im.observe(&listed(&[&id]), &seen(&id, dead), 2_000, &T);
    assert_eq!(state(&im, &id), Terminating, "{ch:?}");
}

#[test]
fn a_refused_drain_returns_to_running() {
    let mut im = manager();
    let id = one_queued(&mut im);
    im.begin_launch(&id, 0).ok();
    im.observe(&listed(&[&id]), &seen(&id, ALIVE), 1_000, &T);
    im.request_drain(&id, 2_000, Cause::Idle, "idle for 60 s").ok();
    assert_eq!(im.drain_refused(&id, 2_100, "node busy again").map(|_| state(&im, &id)), Ok(Running));

    // A drain that never shows in the view also lapses.
    im.request_drain(&id, 3_000, Cause::Idle, "idle for 60 s").ok();
    im.observe(&listed(&[&id]), &seen(&id, ALIVE), 3_000 + T.drain_ms - 1, &T);
    assert_eq!(state(&im, &id), DrainRequested);
    im.observe(&listed(&[&id]), &seen(&id, ALIVE), 3_000 + T.drain_ms, &T);
    assert_eq!(state(&im, &id), Running);
}

#[test]
fn a_drain_that_takes_too_long_ends_anyway() {
    let mut im = manager();
    let id = one_queued(&mut im);
    if let Some(i) = im.map.get_mut(&id) {
        i.state = Draining;
        i.since_ms = 0;
    }
    let busy = NodeSeen { draining: true, ..ALIVE };
    im.observe(&listed(&[&id]), &seen(&id, busy), T.drain_ms - 1, &T);
    assert_eq!(state(&im, &id), Draining);
    im.observe(&listed(&[&id]), &seen(&id, busy), T.drain_ms, &T);
    assert_eq!(state(&im, &id), Terminating);
}

#[test]
fn agents_that_never_start_are_terminated() {
    let mut im = manager();
    let id = one_queued(&mut im);
    im.begin_launch(&id, 0).ok();
    im.observe(&listed(&[&id]), &HashMap::new(), 1_000, &T);
    assert_eq!(state(&im, &id), AgentStarting);
    im.observe(&listed(&[&id]), &HashMap::new(), 1_000 + T.agent_start_ms - 1, &T);
    assert_eq!(state(&im, &id), AgentStarting);
    let ch = im.observe(&listed(&[&id]), &HashMap::new(), 1_000 + T.agent_start_ms, &T);
    assert_eq!(state(&im, &id), Terminating);
    assert!(ch.iter().any(|c| matches!(c, Change::Transition { to: AgentStartFailed, .. })));
}

#[test]
fn a_stuck_terminate_is_retried() {
    let mut im = manager();
    let id = one_queued(&mut im);
    im.begin_launch(&id, 0).ok();
    im.observe(&listed(&[&id]), &seen(&id, ALIVE), 0, &T);
    im.request_terminate(&id, 1_000, "scale in").ok();
    im.observe(&listed(&[&id]), &HashMap::new(), 1_000 + T.terminate_ms, &T);
    assert_eq!(state(&im, &id), TerminationFailed);
    let ch = im.observe(&listed(&[&id]), &HashMap::new(), 1_000 + T.terminate_ms + 1, &T);
    assert_eq!(state(&im, &id), Terminating, "retried: {ch:?}");
    im.terminate_failed(&id, 70_000, "api down").ok();
    assert_eq!(state(&im, &id), TerminationFailed);
    im.observe(&[], &HashMap::new(), 80_000, &T);
    assert_eq!(state(&im, &id), Terminated);
}

#[test]
fn cancelling_a_queued_record_terminates_it() {
    let mut im = manager();
    let id = one_queued(&mut im);
    im.request_terminate(&id, 1, "no longer needed").ok();
    assert_eq!(state(&im, &id), Terminated);
}

#[test]
fn unknown_listed_instances_are_adopted_or_reported() {
    let mut im = manager();
    let cloud = vec![
        CloudInstance { id: "pool-gpu-0000beef".into(), node_type: "gpu".into() },
        CloudInstance { id: "someone-elses".into(), node_type: "tpu".into() },
    ];
    let ch = im.observe(&cloud, &HashMap::new(), 5, &T);
    assert_eq!(state(&im, "pool-gpu-0000beef"), AgentStarting);
    assert!(im.get("someone-elses").is_none());
    assert!(ch.contains(&Change::Adopted { id: "pool-gpu-0000beef".into(), node_type: "gpu".into() }));
    assert!(ch.contains(&Change::UnknownType { id: "someone-elses".into(), node_type: "tpu".into() }));
    assert_eq!(im.live_of_type("gpu").count(), 1);
}

#[test]
fn launches_are_limited_globally_and_by_upscaling_speed() {
    let mut im = manager();
    im.queue("cpu", 20, 0, "demand");
    // Nothing running: the initial five.
    assert_eq!(im.to_launch(10, 1.0, 0).len(), UPSCALING_INITIAL_NODES);
    assert_eq!(im.to_launch(2, 1.0, 0).len(), 2, "the global limit");
    // Eight running: speed 1.0 allows eight pending, 0.5 the floor of five, 10 eighty
    // (capped by the global limit).
    for id in im.queue("cpu", 8, 0, "t") {
        if let Some(i) = im.map.get_mut(&id) {
            i.state = Running;
        }
    }
    assert_eq!(im.to_launch(100, 1.0, 0).len(), 8);
    assert_eq!(im.to_launch(100, 0.5, 0).len(), 5);
    assert_eq!(im.to_launch(10, 10.0, 0).len(), 10);
    // In-flight ones count against both limits.
    let picked = im.to_launch(100, 1.0, 0);
    for id in &picked[..3] {
        im.begin_launch(id, 1).ok();
    }
    assert_eq!(im.to_launch(100, 1.0, 2).len(), 5, "8 allowed pending, 3 in flight");
    assert_eq!(im.to_launch(4, 10.0, 2).len(), 1, "4 concurrent, 3 in flight");
    // A nonsense speed is zero: the floor, never a stall.
    assert_eq!(im.to_launch(100, f64::NAN, 2).len(), 2);
}

#[test]
fn launches_go_oldest_first() {
    let mut im = manager();
    let mut ids = Vec::new();
    for t in (0..6).rev() {
        ids.push((t, im.queue("gpu", 1, t * 10, "t").remove(0)));
    }
    let picked = im.to_launch(100, 1.0, 100);
    assert_eq!(picked.len(), 5);
    let newest = ids.iter().find(|(t, _)| *t == 5).map(|(_, id)| id.clone()).unwrap_or_default();
    assert!(!picked.contains(&newest));
}

#[test]
fn counts_by_type_and_state() {
    let mut im = manager();
    let ids = im.queue("cpu", 2, 0, "t");
    im.queue("gpu", 1, 0, "t");
    im.begin_launch(&ids[0], 1).ok();
    let c = im.by_type_state();
    assert_eq!(c.get(&("cpu".to_string(), Queued)), Some(&1));
    assert_eq!(c.get(&("cpu".to_string(), Requested)), Some(&1));
    assert_eq!(c.get(&("gpu".to_string(), Queued)), Some(&1));
}

fn arb_node() -> impl Strategy<Value = Option<NodeSeen>> {
    proptest::option::of(
        (any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>()).prop_map(
            |(alive, dead, draining, allocated_nothing)| NodeSeen { alive, dead, draining, allocated_nothing },
        ),
    )
}

#[derive(Debug, Clone)]
enum Op {
    Queue(usize),
    Launch(usize),
    Drain(usize),
    Terminate(usize),
    Observe { listed_mask: u16, extra: u8, nodes: Vec<Option<NodeSeen>>, advance: u64 },
}

fn arb_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (1usize..3).prop_map(Op::Queue),
        (0usize..16).prop_map(Op::Launch),
        (0usize..16).prop_map(Op::Drain),
        (0usize..16).prop_map(Op::Terminate),
        (any::<u16>(), 0u8..4, proptest::collection::vec(arb_node(), 16), 0u64..200_000)
            .prop_map(|(listed_mask, extra, nodes, advance)| Op::Observe { listed_mask, extra, nodes, advance }),
    ]
}

proptest! {
    #[test]
    fn observe_stays_within_the_table(ops in proptest::collection::vec(arb_op(), 1..60)) {
        let mut im = manager();
        let mut now = 0u64;
        for op in ops {
            let ids: Vec<String> = im.map.keys().cloned().collect();
            let pick = |i: usize| ids.get(i % ids.len().max(1)).cloned().unwrap_or_default();
            let before: BTreeMap<String, InstanceState> = im.map.iter().map(|(k, v)| (k.clone(), v.state)).collect();
            let mut cur = before.clone();
            let changes = match op {
                Op::Queue(n) => {
                    cur.extend(im.queue("cpu", n, now, "prop").into_iter().map(|id| (id, Queued)));
                    Vec::new()
                }
                Op::Launch(i) => im.begin_launch(&pick(i), now).into_iter().collect(),
                Op::Drain(i) => im.request_drain(&pick(i), now, Cause::Policy, "prop").into_iter().collect(),
                Op::Terminate(i) => im.request_terminate(&pick(i), now, "prop").into_iter().collect(),
                Op::Observe { listed_mask, extra, nodes, advance } => {
                    now += advance;
                    let mut cloud: Vec<CloudInstance> = ids
                        .iter()
                        .enumerate()
                        .filter(|(i, _)| listed_mask & (1 << (i % 16)) != 0)
                        .map(|(_, id)| CloudInstance { id: id.clone(), node_type: "cpu".into() })
                        .collect();
                    // Strangers, some of them listed twice.
                    for e in 0..extra {
                        let c = CloudInstance { id: format!("stray-{e}"), node_type: ["cpu", "tpu"][e as usize % 2].into() };
                        cloud.push(c.clone());
                        cloud.push(c);
                    }
                    let seen: HashMap<String, NodeSeen> = ids
                        .iter()
                        .zip(nodes)
                        .filter_map(|(id, n)| n.map(|n| (id.clone(), n)))
                        .collect();
                    im.observe(&cloud, &seen, now, &T)
                }
            };
            // Every change is a legal transition, chained from the state before.
            for c in &changes {
                match c {
                    Change::Transition { id, from, to, .. } => {
                        prop_assert!(allowed(*from, *to), "{from} → {to}");
                        prop_assert_eq!(cur.get(id), Some(from));
                        cur.insert(id.clone(), *to);
                    }
                    Change::Adopted { id, .. } => {
                        prop_assert!(!cur.contains_key(id), "adopted twice: {}", id);
                        cur.insert(id.clone(), Allocated);
                    }
                    Change::UnknownType { id, .. } => prop_assert!(!im.map.contains_key(id)),
                    Change::Leaked { id, .. } => prop_assert!(before.get(id).is_some_and(|s| s.is_terminal())),
                }
            }
            let after: BTreeMap<String, InstanceState> = im.map.iter().map(|(k, v)| (k.clone(), v.state)).collect();
            prop_assert_eq!(&cur, &after, "the changes describe every move");
            // One record per id, and it is keyed by its own id.
            for (k, v) in &im.map {
                prop_assert_eq!(k, &v.id);
            }
            // Records never disappear except by prune.
            for id in before.keys() {
                prop_assert!(after.contains_key(id));
            }
        }
    }
}
