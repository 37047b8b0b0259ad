//! App schedulers against a real shard (QUIC registration, gRPC view and commits).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_agent::client::ShardConnection;
use flotilla_aggregator::ShardHandle;
use flotilla_core::{NodeId, Resources};
use flotilla_proto::v1;
use flotilla_scheduler::Write;
use flotilla_scheduler::{AppSpec, MemStore, Scheduler, Store};
use flotilla_scheduler::{CommandError, UnitState};
use flotilla_testkit::shard::{JOIN_TOKEN, LocalShard, registration};
use flotilla_testkit::{TempDir, wait_for_async};
use flotilla_view::ClusterView;

struct Cluster {
    shard: ShardHandle,
    view: Arc<ClusterView>,
    _endpoint: quinn::Endpoint,
    _conn: ShardConnection,
    _dir: TempDir,
}

/// A shard with `nodes` nodes of 1000m over two domains, and a view following it.
async fn cluster(name: &str, nodes: usize) -> Cluster {
    let LocalShard { shard, endpoint, dir } = LocalShard::start(name, |_| {}).await;
    let conn = ShardConnection::connect(&endpoint, shard.addr, "127.0.0.1").await.unwrap();
    for i in 0..nodes {
        let domain = if i % 2 == 0 { "da" } else { "db" };
        conn.register(registration(&format!("n{i}"), JOIN_TOKEN, domain, 1000)).await.unwrap();
    }
    let view = ClusterView::new(1);
    tokio::spawn(flotilla_view::follow_shard(view.clone(), 0, shard.addr.to_string(), Default::default()));
    wait_for_async("the view to show the nodes", Duration::from_secs(5), || {
        (view.slot(0).view.len() >= nodes).then_some(())
    })
    .await;
    Cluster { shard, view, _endpoint: endpoint, _conn: conn, _dir: dir }
}

fn spec(name: &str, units: u32, cpu: &str) -> AppSpec {
    AppSpec::parse(&format!(
        r#"
name = "{name}"
[unit]
workers = 1
[unit.head]
command = "sleep"
cpu = "{cpu}"
memory = "1Mi"
[unit.worker]
command = "sleep"
cpu = "{cpu}"
memory = "1Mi"
[units]
min = 0
max = 20
initial = {units}
"#
    ))
    .unwrap()
}

fn capacity(_: &NodeId) -> Option<Resources> {
    Some(Resources::new(1000, 1 << 30, 0))
}

#[tokio::test]
async fn competing_schedulers_never_overbook() {
    let c = cluster("compete", 4).await;
    let addrs = vec![c.shard.addr.to_string()];
    let mut handles = Vec::new();
    let mut tasks = Vec::new();
    // 4 apps × 3 units × 600m = 7,200m of demand for 4,000m.
    for app in ["a", "b", "c", "d"] {
        let store: Arc<dyn Store> = Arc::new(MemStore::default());
        let (mut s, h) = Scheduler::new(spec(app, 3, "300m"), c.view.clone(), addrs.clone(), store).unwrap();
        handles.push(h);
        tasks.push(tokio::spawn(async move {
            for _ in 0..20 {
                s.reconcile().await.unwrap();
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    check_units(&c.shard, &handles);
    c.shard.shutdown().await;
}

fn check_units(shard: &ShardHandle, handles: &[flotilla_scheduler::AppHandle]) {
    let ledger = shard.ledger.lock().unwrap();
    ledger.check_invariant(&capacity).unwrap();
    let mut allocated_units = 0;
    for h in handles {
        for u in &h.status().units {
            if u.state == UnitState::Allocated {
                allocated_units += 1;
                for m in &u.members {
                    let node = NodeId::new(m.node_id.as_deref().unwrap()).unwrap();
                    let key = flotilla_aggregator::ClaimKey {
                        app: u.app.clone(),
                        unit: u.unit_id.clone(),
                        member: m.member.clone(),
                        generation: u.generation,
                    };
                    assert_eq!(ledger.placement(&key), Some(&node), "the ledger agrees with the unit record");
                }
                let domains: std::collections::BTreeSet<_> = u
                    .members
                    .iter()
                    .map(|m| m.node_id.as_deref().unwrap().to_string())
                    .map(|n| n[1..].parse::<usize>().unwrap() % 2)
                    .collect();
                assert_eq!(domains.len(), 1, "a unit stays in one domain");
            } else {
                assert_eq!(u.state, UnitState::Queued);
                assert!(u.unplaced_reason.is_some(), "an unplaced unit says why");
            }
        }
    }
    // 600m per unit on 1000m nodes: at most one unit's worth per node pair... and never more than capacity.
    assert!(allocated_units >= 3, "the cluster is used ({allocated_units} units)");
    assert!(allocated_units * 600 <= 4000);
}

#[tokio::test]
async fn a_restarted_scheduler_adopts_its_units_and_cleans_up_half_commits() {
    let c = cluster("restart", 4).await;
    let addrs = vec![c.shard.addr.to_string()];
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let (mut s, h) = Scheduler::new(spec("echo", 2, "100m"), c.view.clone(), addrs.clone(), store.clone()).unwrap();
    s.reconcile().await.unwrap();
    let before: Vec<_> = h.status().units.iter().map(|u| (u.unit_id.clone(), u.state, u.members.clone())).collect();
    assert!(before.iter().all(|(_, st, _)| *st == UnitState::Allocated), "{before:?}");
    drop(s);

    // A third unit was being committed when the scheduler died: the shard holds its
    // members and the store says Placing (written before the commit left).
    let mut lost = h.status().units[0].as_ref().clone();
    lost.unit_id = "echo-9".into();
    lost.generation = 9;
    lost.state = UnitState::Placing;
    lost.members.clear();
    store.write("echo", &[Write::Unit(lost.into()), Write::DesiredUnits(3), Write::NextGeneration(10)]).unwrap();
    let orphan = |member: &str| v1::Claim {
        key: Some(v1::ClaimKey { app: "echo".into(), unit: "echo-9".into(), member: member.into(), generation: 9 }),
        node_id: "n3".into(),
        incarnation: 1,
        resources: Some(v1::Resources { cpu_millis: 100, memory_bytes: 1 << 20, ..Default::default() }),
        allow_low_priority: false,
        group: "echo-9".into(),
        workload: None,
    };
    let mut client =
        v1::ledger_service_client::LedgerServiceClient::connect(format!("http://{}", c.shard.addr)).await.unwrap();
    let r = client
        .commit(v1::CommitRequest {
            txn_id: "lost".into(),
            fencing_token: 1,
            claims: vec![orphan("head"), orphan("worker-0")],
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.results.iter().all(|x| x.accepted));

    let (mut s2, h2) = Scheduler::new(spec("echo", 2, "100m"), c.view.clone(), addrs, store.clone()).unwrap();
    for _ in 0..3 {
        s2.reconcile().await.unwrap();
    }
    let after = h2.status();
    let active: Vec<_> = after.units.iter().filter(|u| u.state.is_active()).collect();
    assert_eq!(active.len(), 3, "no duplicate units: {:?}", after.units);
    for (id, _, members) in &before {
        let u = after.units.iter().find(|u| &u.unit_id == id).unwrap();
        assert_eq!(u.state, UnitState::Allocated);
        assert_eq!(&u.members, members, "adopted as they were");
    }
    // The half-committed unit is never placed again under its keys (a late commit could
    // run a member twice): it ends, and a replacement with a new id takes its place.
    assert_eq!(after.units.iter().find(|u| u.unit_id == "echo-9").unwrap().state, UnitState::Terminated);
    assert_eq!(after.units.iter().find(|u| u.unit_id == "echo-10").unwrap().state, UnitState::Allocated);
    let total = {
        let ledger = c.shard.ledger.lock().unwrap();
        ledger.check_invariant(&capacity).unwrap();
        let key = |member: &str| flotilla_aggregator::ClaimKey {
            app: "echo".into(),
            unit: "echo-9".into(),
            member: member.into(),
            generation: 9,
        };
        assert!(ledger.placement(&key("head")).is_none() && ledger.placement(&key("worker-0")).is_none());
        (0..4).map(|i| ledger.allocated(&NodeId::new(&format!("n{i}")).unwrap()).cpu_millis).sum::<u64>()
    };
    assert_eq!(total, 600, "three units of two 100m members, each held once");
    c.shard.shutdown().await;
}

/// Registers one more node over its own connection, so the test can drain it.
async fn node(c: &Cluster, id: &str, domain: &str, cpu: u64) -> (ShardConnection, u64) {
    let conn = ShardConnection::connect(&c._endpoint, c.shard.addr, "127.0.0.1").await.unwrap();
    let s = conn.register(registration(id, JOIN_TOKEN, domain, cpu)).await.unwrap();
    (conn, s.session_id)
}

async fn settle(s: &mut Scheduler, c: &Cluster, passes: usize) {
    for _ in 0..passes {
        s.reconcile().await.unwrap();
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    let _ = c;
}

#[tokio::test]
async fn a_lost_worker_is_replaced_in_place_and_a_lost_head_replaces_the_unit() {
    // No nodes from the fixture: four 1000m nodes in one domain, registered one by one.
    let c = cluster("repair", 0).await;
    let mut conns = Vec::new();
    for i in 0..4 {
        conns.push(node(&c, &format!("r{i}"), "dr", 1000).await);
    }
    wait_for_async("the view to show the 4 nodes", Duration::from_secs(5), || {
        (c.view.slot(0).view.len() >= 4).then_some(())
    })
    .await;
    // Head and worker need 600m each: they land on different nodes.
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let (mut s, h) =
        Scheduler::new(spec("rep", 1, "600m"), c.view.clone(), vec![c.shard.addr.to_string()], store).unwrap();
    settle(&mut s, &c, 3).await;
    let unit = h.status().units[0].clone();
    assert_eq!(unit.state, UnitState::Allocated);
    let node_of = |u: &flotilla_scheduler::UnitRecord, member: &str| {
        u.members.iter().find(|m| m.member == member).and_then(|m| m.node_id.clone()).unwrap()
    };
    let (head, worker) = (node_of(&unit, "head"), node_of(&unit, "worker-0"));
    assert_ne!(head, worker);

    // The worker's node drains (PreStop): only the worker moves; the unit keeps its id.
    let (conn, sid) = &conns[worker[1..].parse::<usize>().unwrap()];
    conn.drain(&worker, *sid).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        settle(&mut s, &c, 1).await;
        let u = h.status().units.iter().find(|u| u.unit_id == unit.unit_id).cloned().unwrap();
        let w = u.members.iter().find(|m| m.member == "worker-0").and_then(|m| m.node_id.clone());
        if w.is_some_and(|w| w != worker) {
            assert_eq!(node_of(&u, "head"), head, "the head did not move");
            assert_eq!(u.state, UnitState::Degraded, "degraded until the new worker runs");
            // Under a ledger key of its own: releasing the lost worker's key (which its
            // node may still list, so the orphan sweep releases it) never stops it.
            let g = u.members.iter().find(|m| m.member == "worker-0").and_then(|m| m.generation);
            assert!(g.is_some_and(|g| g > unit.generation), "a fresh generation for the replacement: {u:?}");
            assert_eq!(u.generation_of("worker-0"), g.unwrap_or_default());
            assert_eq!(u.generation_of("head"), unit.generation, "the head keeps the unit's");
            break;
        }
        assert!(Instant::now() < deadline, "the worker was never replaced: {u:?}");
    }
    assert_eq!(h.status().units.len(), 1, "same unit, no replacement unit");

    // The head's node drains: the unit fails and a new unit (next generation) replaces it.
    let (conn, sid) = &conns[head[1..].parse::<usize>().unwrap()];
    conn.drain(&head, *sid).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        settle(&mut s, &c, 1).await;
        let st = h.status();
        let old = st.units.iter().find(|u| u.unit_id == unit.unit_id).unwrap();
        let new = st.units.iter().find(|u| u.unit_id != unit.unit_id);
        if old.state == UnitState::Terminated && new.is_some_and(|n| n.state == UnitState::Allocated) {
            assert!(new.unwrap().generation > unit.generation);
            assert!(old.unplaced_reason.as_deref().unwrap_or("").contains("head lost"));
            break;
        }
        assert!(Instant::now() < deadline, "no replacement unit: {:?}", st.units);
    }
    // The failed unit's survivors were released: only the new unit holds resources.
    let total = {
        let ledger = c.shard.ledger.lock().unwrap();
        ledger.check_invariant(&capacity).unwrap();
        (0..4).map(|i| ledger.allocated(&NodeId::new(&format!("r{i}")).unwrap()).cpu_millis).sum::<u64>()
    };
    assert_eq!(total, 1200);
    c.shard.shutdown().await;
}

#[tokio::test]
async fn scaling_in_drains_the_youngest_then_terminates_them() {
    let c = cluster("scalein", 4).await;
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let mut sp = spec("sc", 3, "100m");
    sp.units.drain_timeout_ms = 100;
    let (mut s, h) = Scheduler::new(sp, c.view.clone(), vec![c.shard.addr.to_string()], store.clone()).unwrap();
    settle(&mut s, &c, 3).await;
    assert_eq!(h.status().units.iter().filter(|u| u.state == UnitState::Allocated).count(), 3);
    let scale = |s: &mut Scheduler, n: u32| {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        s.command(flotilla_scheduler::Command::Scale(n, tx));
        rx.try_recv().unwrap()
    };
    let refused = scale(&mut s, 21).unwrap_err();
    assert!(
        matches!(refused, CommandError::OutOfRange { max: 20, asked: 21, .. }),
        "out of range is refused: {refused}"
    );
    assert_eq!(scale(&mut s, 1), Ok(1));
    assert_eq!(store.load("sc").unwrap().desired_units, Some(1), "persisted");
    s.reconcile().await.unwrap();
    let st = h.status();
    let draining: Vec<_> = st.units.iter().filter(|u| u.state == UnitState::Draining).map(|u| u.generation).collect();
    assert_eq!(draining.len(), 2, "{:?}", st.units);
    assert!(draining.iter().all(|g| *g > 1), "the youngest go first");
    tokio::time::sleep(Duration::from_millis(150)).await;
    settle(&mut s, &c, 3).await;
    let st = h.status();
    assert_eq!(st.units.iter().filter(|u| u.state == UnitState::Terminated).count(), 2, "{:?}", st.units);
    assert_eq!(st.units.iter().filter(|u| u.state == UnitState::Allocated).count(), 1);
    let total: u64 = {
        let ledger = c.shard.ledger.lock().unwrap();
        (0..4).map(|i| ledger.allocated(&NodeId::new(&format!("n{i}")).unwrap()).cpu_millis).sum()
    };
    assert_eq!(total, 200, "the drained units' members were released");
    c.shard.shutdown().await;
}

/// Runs passes until `done` holds (or panics after `secs`).
async fn until(s: &mut Scheduler, secs: u64, what: &str, done: impl Fn(&Scheduler) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done(s) {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        s.reconcile().await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_basic_policy_follows_consumer_demand_and_the_operators_override() {
    let c = cluster("autoscale", 4).await;
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let mut sp = spec("auto", 1, "100m");
    sp.autoscaling = Some(
        flotilla_autoscale::AutoscalingConfig::from_toml(
            r#"
            [autoscaling]
            policy = "basic"
            interval = "1s"
            [autoscaling.basic]
            cooldown_period = "1s"
            allow_short_cooldown_for_tests = true
            graceful_decommission_timeout = "0s"
            scale_up_factor = 1.0
            scale_down_factor = 1.0
            [autoscaling.basic.worker_config]
            min_instances = 1
            max_instances = 6
            "#,
        )
        .unwrap(),
    );
    sp.validate().unwrap();
    let (mut s, h) = Scheduler::new(sp.clone(), c.view.clone(), vec![c.shard.addr.to_string()], store.clone()).unwrap();
    settle(&mut s, &c, 3).await;
    let command = |s: &mut Scheduler, cmd: fn(_) -> flotilla_scheduler::Command| {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        s.command(cmd(tx));
        rx.try_recv().unwrap()
    };

    // Four units' worth of demand (a unit is a head and a worker of 100m and 1Mi each).
    let per_unit = Resources::new(200, 2 << 20, 0);
    let demanded = command(&mut s, |tx| {
        let req = flotilla_scheduler::DemandRequest { resources: Resources::new(200, 2 << 20, 0), count: 4 };
        flotilla_scheduler::Command::Demand(vec![req], 60_000, tx)
    });
    assert_eq!(demanded.unwrap().requests[0].resources, per_unit);
    until(&mut s, 15, "the app grows to the demand", |_| {
        h.status().units.iter().filter(|u| u.state == UnitState::Allocated).count() == 4
    })
    .await;
    let decisions = h.decisions();
    let up = decisions.iter().find(|d| d["action"] == "scale_up").expect("a scale_up record");
    for field in ["at", "policy", "action", "inputs", "explanation"] {
        assert!(up.get(field).is_some(), "{field} in {up}");
    }
    assert!(up["explanation"].as_str().unwrap().contains("ROUND_UP"), "{up}");
    assert_eq!(h.status().autoscaling.as_ref().unwrap().policy, Some("basic"));

    // The operator pins it at 2: the policy still decides, within the override.
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    s.command(flotilla_scheduler::Command::Scale(2, tx));
    assert_eq!(rx.try_recv().unwrap(), Ok(2));
    until(&mut s, 15, "the override holds the app at 2", |_| {
        h.status().units.iter().filter(|u| u.state.is_active()).count() == 2
    })
    .await;
    let last = h.decisions()[0].clone();
    assert_eq!(last["override"]["ceiling"], 2, "{last}");
    assert!(last["explanation"].as_str().unwrap().contains("override"), "{last}");

    // A bad demand is refused with every problem named, and nothing changes.
    let refused = command(&mut s, |tx| {
        let req = flotilla_scheduler::DemandRequest { resources: Resources::default(), count: 100_000 };
        flotilla_scheduler::Command::Demand(vec![req], 0, tx)
    })
    .unwrap_err();
    assert!(matches!(refused, CommandError::InvalidDemand(_)), "{refused}");

    // The records survive a restart.
    let before = h.decisions().len();
    drop(s);
    let (_s2, h2) = Scheduler::new(sp, c.view.clone(), vec![c.shard.addr.to_string()], store).unwrap();
    assert_eq!(h2.decisions().len(), before);
    assert_eq!(h2.decisions()[0], h.decisions()[0]);
    c.shard.shutdown().await;
}

#[tokio::test]
async fn a_burst_of_queued_units_starts_with_a_small_pass_and_doubles() {
    let c = cluster("burst", 40).await;
    let spec = AppSpec::parse(
        r#"
name = "burst"
[unit]
workers = 0
[unit.head]
command = "sleep"
cpu = "10m"
memory = "1Mi"
[units]
min = 0
max = 1000
initial = 700
"#,
    )
    .unwrap();
    let store: Arc<dyn Store> = Arc::new(MemStore::default());
    let (mut s, h) = Scheduler::new(spec, c.view.clone(), vec![c.shard.addr.to_string()], store).unwrap();
    let placed = || h.status().units.iter().filter(|u| u.state != UnitState::Queued).count();
    // 256 in the first pass; the second may take 512, which is the other 444.
    for expected in [256, 700] {
        s.reconcile().await.unwrap();
        assert_eq!(placed(), expected);
    }
    c.shard.shutdown().await;
}
