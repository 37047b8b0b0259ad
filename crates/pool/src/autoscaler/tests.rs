use std::collections::BTreeMap;
use std::sync::Mutex;

use flotilla_core::Resources;
use flotilla_core::{MemberShape, UnitShape};

use super::*;
use crate::model::{AppRow, NodeRow, Queued};
use crate::provider::{BoxFuture, CloudInstance};
use crate::warm::Warm;

#[derive(Default)]
struct FakeProvider {
    running: Mutex<BTreeMap<String, String>>,
    launches: Mutex<Vec<String>>,
    /// Refuse every launch.
    refuse: std::sync::atomic::AtomicBool,
    /// Refuse the launches of this type (a spot type with no capacity).
    refuse_type: Mutex<Option<String>>,
    /// Instances launched cordoned (a warm pool's) and not uncordoned since.
    cordoned: Mutex<std::collections::BTreeSet<String>>,
}

impl InstanceProvider for FakeProvider {
    fn name(&self) -> &'static str {
        "fake"
    }
    fn list(&self) -> BoxFuture<'_, Result<Vec<CloudInstance>, ProviderError>> {
        let l = self
            .running
            .lock()
            .unwrap()
            .iter()
            .map(|(id, t)| CloudInstance { id: id.clone(), node_type: t.clone() })
            .collect();
        Box::pin(async move { Ok(l) })
    }
    fn launch<'a>(&'a self, spec: &'a LaunchSpec) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.launches.lock().unwrap().push(spec.id.clone());
        let refused = self.refuse_type.lock().unwrap().as_deref() == Some(spec.node_type.as_str());
        if refused || self.refuse.load(std::sync::atomic::Ordering::SeqCst) {
            let e = ProviderError::Exit { command: "launch".into(), status: "1".into(), stderr: "quota".into() };
            return Box::pin(async move { Err(e) });
        }
        self.running.lock().unwrap().insert(spec.id.clone(), spec.node_type.clone());
        if spec.cordoned {
            self.cordoned.lock().unwrap().insert(spec.id.clone());
        }
        Box::pin(async { Ok(()) })
    }
    fn terminate<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<(), ProviderError>> {
        self.running.lock().unwrap().remove(id);
        Box::pin(async { Ok(()) })
    }
}

/// A control plane whose nodes are the provider's instances, all Alive and idle.
struct FakeCluster {
    provider: Arc<FakeProvider>,
    apps: Mutex<Vec<AppRow>>,
    drains: Mutex<Vec<String>>,
    uncordons: Mutex<Vec<String>>,
    bounds: Mutex<BTreeMap<String, TypeBounds>>,
    /// What each node holds (millicores, members); the rest hold nothing.
    held: Mutex<BTreeMap<String, (u64, usize)>>,
}

impl FakeCluster {
    /// The echo app with `queued` units waiting, each two 1-CPU members.
    fn with_echo(provider: &Arc<FakeProvider>, queued: u32) -> Arc<Self> {
        let member = Resources::new(1000, 1 << 30, 0);
        Arc::new(FakeCluster {
            provider: provider.clone(),
            apps: Mutex::new(vec![AppRow {
                app: "echo".into(),
                queued: Queued { primary: queued, secondary: 0 },
                unit_shape: UnitShape {
                    members: vec![MemberShape::plain("head", member.clone()), MemberShape::plain("worker", member)],
                    ..Default::default()
                },
            }]),
            drains: Mutex::new(vec![]),
            uncordons: Mutex::new(vec![]),
            bounds: Mutex::new(BTreeMap::new()),
            held: Mutex::new(BTreeMap::new()),
        })
    }
}

impl Cluster for FakeCluster {
    fn nodes(&self) -> BoxFuture<'_, Result<Vec<NodeRow>, ClusterError>> {
        let drains = self.drains.lock().unwrap().clone();
        let warm = self.provider.cordoned.lock().unwrap().clone();
        let held = self.held.lock().unwrap().clone();
        let rows = self
            .provider
            .running
            .lock()
            .unwrap()
            .keys()
            .map(|id| NodeRow {
                node_id: flotilla_core::NodeId::new(id).unwrap(),
                status: flotilla_core::NodeStatus::Alive,
                labels: Default::default(),
                capacity: Arc::new(Resources::new(2000, 4 << 30, 0)),
                allocated: Arc::new(Resources::new(held.get(id).map_or(0, |h| h.0), 0, 0)),
                cordoned: drains.contains(id) || warm.contains(id),
                drain_requested: drains.contains(id),
                workloads: held.get(id).map_or(0, |h| h.1),
            })
            .collect();
        Box::pin(async move { Ok(rows) })
    }
    fn apps(&self) -> BoxFuture<'_, Result<Vec<AppRow>, ClusterError>> {
        let a = self.apps.lock().unwrap().clone();
        Box::pin(async move { Ok(a) })
    }
    fn drain<'a>(&'a self, node: &'a str) -> BoxFuture<'a, Result<(), ClusterError>> {
        self.drains.lock().unwrap().push(node.to_string());
        Box::pin(async { Ok(()) })
    }
    fn set_cordon<'a>(&'a self, node: &'a str, cordoned: bool) -> BoxFuture<'a, Result<(), ClusterError>> {
        if cordoned {
            self.provider.cordoned.lock().unwrap().insert(node.to_string());
        } else {
            self.uncordons.lock().unwrap().push(node.to_string());
            self.provider.cordoned.lock().unwrap().remove(node);
        }
        Box::pin(async { Ok(()) })
    }
    fn report<'a>(&'a self, _: &'a str, r: &'a Value) -> BoxFuture<'a, Result<ReportAnswer, ClusterError>> {
        assert!(r["instances"].is_array());
        let bounds = self.bounds.lock().unwrap().clone();
        Box::pin(async move { Ok(ReportAnswer { constraints: Constraints::default(), bounds }) })
    }
}

const POOL: &str = r#"
    max_concurrent_launches = 10
    upscaling_speed = 10.0
    idle_timeout = "1s"
    [node_types.t]
    cpu = 2
    memory = "4Gi"
    max = 5
"#;

/// An empty dir of this test process's own.
fn fresh_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-pool-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn scaler(dir: &std::path::Path, p: &Arc<FakeProvider>, c: &Arc<FakeCluster>) -> Autoscaler {
    let store = PoolStore::open("test", dir.join("pool.redb")).unwrap();
    Autoscaler::new(PoolConfig::parse(POOL).unwrap(), p.clone(), c.clone(), store).unwrap()
}

#[tokio::test]
async fn queued_units_launch_nodes_once_across_a_restart_and_idle_ones_go() {
    let dir = fresh_dir("driver");
    let provider = Arc::new(FakeProvider::default());
    let cluster = FakeCluster::with_echo(&provider, 3);
    let mut a = scaler(&dir, &provider, &cluster);
    a.pass().await.unwrap();
    // Each unit (2 × 1 CPU) fills one 2-CPU node.
    assert_eq!(provider.launches.lock().unwrap().len(), 3);
    let record = a.report();
    assert!(record["decisions"][0]["explanation"].as_str().unwrap().contains("launch 3 × t"), "{record}");
    drop(a);

    // A restarted autoscaler finds its instances by id: the pending demand is already
    // covered by the nodes coming up, so nothing is launched twice.
    let mut a = scaler(&dir, &provider, &cluster);
    a.pass().await.unwrap();
    assert_eq!(provider.launches.lock().unwrap().len(), 3, "no double launch after a restart");
    assert_eq!(a.instances().iter().filter(|i| i.state == InstanceState::Running).count(), 3);

    // The units are placed (no longer queued); the nodes idle past the timeout are
    // drained, then terminated once the view shows them drained.
    cluster.apps.lock().unwrap()[0].queued = Queued::default();
    a.pass().await.unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    a.pass().await.unwrap();
    assert_eq!(cluster.drains.lock().unwrap().len(), 3, "every idle node is drained");
    a.pass().await.unwrap();
    a.pass().await.unwrap();
    assert!(provider.running.lock().unwrap().is_empty(), "drained nodes are terminated");
    assert!(a.instances().iter().all(|i| i.state == InstanceState::Terminated));

    // Quiet passes fold into one record.
    let kept = a.report()["decisions"].as_array().unwrap().len();
    for _ in 0..3 {
        a.pass().await.unwrap();
    }
    let report = a.report();
    let decisions = report["decisions"].as_array().unwrap();
    assert!(decisions.len() <= kept + 1, "{report}");
    assert!(decisions[0]["repeated"].as_u64().unwrap() >= 3, "{report}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn operator_bounds_replace_the_files_from_the_next_pass() {
    let dir = fresh_dir("bounds");
    let provider = Arc::new(FakeProvider::default());
    let cluster = FakeCluster::with_echo(&provider, 0);
    let mut a = scaler(&dir, &provider, &cluster);
    a.pass().await.unwrap();
    assert!(provider.launches.lock().unwrap().is_empty(), "no demand, min 0: nothing launched");
    // min 2 for t (and a bound for a type the pool lacks, ignored): taken with the
    // answer to this pass's report, acted on at the next pass.
    *cluster.bounds.lock().unwrap() =
        BTreeMap::from([("t".into(), TypeBounds { min: 2, max: 4 }), ("nope".into(), TypeBounds { min: 1, max: 1 })]);
    a.pass().await.unwrap();
    assert_eq!(a.report()["node_types"][0]["min"], 2);
    assert_eq!(a.report()["node_types"][0]["max"], 4);
    a.pass().await.unwrap();
    assert_eq!(provider.launches.lock().unwrap().len(), 2, "the raised min is held");
    // Lifting the bounds restores the file's.
    *cluster.bounds.lock().unwrap() = BTreeMap::new();
    a.pass().await.unwrap();
    assert_eq!(a.report()["node_types"][0]["min"], 0);
    assert_eq!(a.report()["node_types"][0]["max"], 5);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #34 item 7: while the store refuses writes the pool launches nothing (it
/// could not record the launch), says why in its report, and counts no launch
/// attempt; once the store takes writes again the same instances go out, once.
#[tokio::test]
async fn a_pool_whose_store_fails_launches_nothing_says_why_and_resumes() {
    let dir = fresh_dir("flaky");
    let provider = Arc::new(FakeProvider::default());
    let cluster = FakeCluster::with_echo(&provider, 3);
    let (store, full) = crate::store::testing::flaky(&dir.join("pool.redb")).unwrap();
    let mut a = Autoscaler::new(PoolConfig::parse(POOL).unwrap(), provider.clone(), cluster.clone(), store).unwrap();
    full.store(true, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..2 {
        assert!(matches!(a.pass().await, Err(PassError::Store(_))));
    }
    assert!(provider.launches.lock().unwrap().is_empty(), "nothing launched unrecorded");
    let report = a.report();
    assert!(report["store_failing"].as_str().is_some_and(|e| !e.is_empty()), "{report}");
    assert_eq!(a.instances().iter().filter(|i| i.state == InstanceState::Queued).count(), 3, "{report}");
    assert!(a.instances().iter().all(|i| i.launch_attempts == 0), "the store failed, not the provider");

    full.store(false, std::sync::atomic::Ordering::SeqCst);
    a.pass().await.unwrap();
    assert_eq!(provider.launches.lock().unwrap().len(), 3, "the queued three, not three more");
    assert!(a.report()["store_failing"].is_null());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #35 item 6: a refused launch backs its type off (5 s, doubling): passes
/// within it launch nothing of the type, where every pass retried before.
#[tokio::test]
async fn refused_launches_back_their_type_off() {
    let dir = fresh_dir("refused");
    let provider = Arc::new(FakeProvider::default());
    provider.refuse.store(true, std::sync::atomic::Ordering::SeqCst);
    let cluster = FakeCluster::with_echo(&provider, 3);
    let mut a = scaler(&dir, &provider, &cluster);
    for _ in 0..5 {
        a.pass().await.unwrap();
    }
    assert_eq!(provider.launches.lock().unwrap().len(), 1, "one refused launch, then the back-off");
    let report = a.report();
    let until = report["launch_backoff"]["t"].as_u64().expect("t backs off");
    assert!(until > flotilla_core::now_ms() + 3_000, "{report}");
    // The only type cannot be had: what waited to launch as it is given up, and the
    // demand is reported as nothing the pool can hold now.
    assert_eq!(a.instances().iter().filter(|i| i.state == InstanceState::Queued).count(), 0, "{report}");
    assert!(report["unavailable"]["t"]["reason"].as_str().unwrap().contains("quota"), "{report}");
    assert!(report["decisions"][0]["explanation"].as_str().unwrap().contains("t unavailable"), "{report}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #40 item 4: the cheapest type's launches fail (a spot type with no capacity):
/// it is marked unavailable and the next pass sends the demand to the next cheapest
/// type that can hold it, which launches at once.
#[tokio::test]
async fn a_type_whose_launches_fail_falls_back_to_the_next_cheapest() {
    const TWO: &str = r#"
        max_concurrent_launches = 10
        upscaling_speed = 10.0
        [node_types.spot]
        cpu = 2
        memory = "4Gi"
        max = 5
        cost = 0.05
        [node_types.ondemand]
        cpu = 2
        memory = "4Gi"
        max = 5
        cost = 0.20
    "#;
    let dir = fresh_dir("fallback");
    let provider = Arc::new(FakeProvider::default());
    *provider.refuse_type.lock().unwrap() = Some("spot".into());
    let cluster = FakeCluster::with_echo(&provider, 2);
    let store = PoolStore::open("test", dir.join("pool.redb")).unwrap();
    let mut a = Autoscaler::new(PoolConfig::parse(TWO).unwrap(), provider.clone(), cluster.clone(), store).unwrap();
    a.pass().await.unwrap();
    let first: Vec<String> = provider.launches.lock().unwrap().clone();
    assert!(!first.is_empty() && first.iter().all(|id| id.contains("spot")), "the cheapest first: {first:?}");
    a.pass().await.unwrap();
    let report = a.report();
    a.pass().await.unwrap();
    let ondemand = a.instances().iter().filter(|i| i.node_type == "ondemand" && i.state == InstanceState::Running);
    assert_eq!(ondemand.count(), 2, "both units go to the next cheapest type: {report}");
    assert!(report["unavailable"]["spot"]["reason"].as_str().unwrap().contains("launch failed"), "{report}");
    let why = report["decisions"][0]["explanation"].as_str().unwrap();
    assert!(why.contains("spot unavailable") && why.contains("launch 2 × ondemand"), "{why}");
    assert_eq!(provider.launches.lock().unwrap().iter().filter(|id| id.contains("ondemand")).count(), 2);
    assert!(a.instances().iter().all(|i| i.node_type != "spot" || i.state == InstanceState::Terminated), "{report}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #40 item 3: a type with `warm = 2` keeps two instances launched and cordoned;
/// pending demand claims one (an uncordon, no launch for it) and a warm replacement is
/// launched; the claimed node is an ordinary one once the view shows it uncordoned.
#[tokio::test]
async fn a_warm_pool_is_held_claimed_for_demand_and_refilled() {
    let dir = fresh_dir("warm");
    let provider = Arc::new(FakeProvider::default());
    let cluster = FakeCluster::with_echo(&provider, 0);
    let store = PoolStore::open("test", dir.join("pool.redb")).unwrap();
    let cfg = PoolConfig::parse(&POOL.replace("max = 5", "max = 5\nwarm = 2")).unwrap();
    let mut a = Autoscaler::new(cfg, provider.clone(), cluster.clone(), store).unwrap();
    a.pass().await.unwrap();
    a.pass().await.unwrap();
    let held = |a: &Autoscaler| a.instances().iter().filter(|i| i.warm == Some(Warm::Held)).count();
    assert_eq!(provider.launches.lock().unwrap().len(), 2, "two warm, no more");
    assert_eq!(provider.cordoned.lock().unwrap().len(), 2, "launched cordoned");
    assert_eq!(held(&a), 2);
    assert_eq!(a.report()["node_types"][0]["warm_held"], 2);

    // One unit pending: a warm node takes it.
    cluster.apps.lock().unwrap()[0].queued = Queued { primary: 1, secondary: 0 };
    a.pass().await.unwrap();
    let uncordoned = cluster.uncordons.lock().unwrap().clone();
    assert_eq!(uncordoned.len(), 1, "one claimed");
    let report = a.report();
    let d = &report["decisions"][0];
    assert!(d["launch"].as_object().is_none_or(|l| l.is_empty()), "nothing launched for the demand: {d:#}");
    let why = d["explanation"].as_str().unwrap();
    assert!(
        why.contains(&format!("claim warm {}", uncordoned[0])) && why.contains("launch 1 × t (warm pool)"),
        "{why}"
    );
    assert_eq!(provider.launches.lock().unwrap().len(), 3, "a warm replacement");
    // The unit lands; the claimed node is an ordinary one, two are held again.
    cluster.apps.lock().unwrap()[0].queued = Queued::default();
    a.pass().await.unwrap();
    let claimed = a.instances().get(&uncordoned[0]).unwrap();
    assert_eq!(claimed.warm, None, "settled once seen uncordoned");
    assert_eq!(held(&a), 2);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The consolidation step (issue #40): a node whose member fits on another is cordoned;
/// demand that needs new nodes gives it up at once (uncordoned); started again, the node,
/// once empty, is drained and goes.
#[tokio::test]
async fn a_consolidation_is_cordoned_given_up_for_demand_and_finished_once_empty() {
    let dir = fresh_dir("consolidation");
    let provider = Arc::new(FakeProvider::default());
    let cluster = FakeCluster::with_echo(&provider, 3);
    let cfg = format!(
        "{POOL}\n    min = 1\n    cost = 0.1\n    [consolidation]\n    after = \"0s\"\n    deadline = \"10s\"\n"
    )
    .replace("idle_timeout = \"1s\"", "idle_timeout = \"1h\"");
    let store = PoolStore::open("test", dir.join("pool.redb")).unwrap();
    let mut a = Autoscaler::new(PoolConfig::parse(&cfg).unwrap(), provider.clone(), cluster.clone(), store).unwrap();
    a.pass().await.unwrap();
    a.pass().await.unwrap();
    let nodes: Vec<String> = provider.running.lock().unwrap().keys().cloned().collect();
    assert_eq!(nodes.len(), 3);
    // The units are placed, one 1-CPU member left on each 2-CPU node: any one fits on another.
    cluster.apps.lock().unwrap()[0].queued = Queued::default();
    *cluster.held.lock().unwrap() = nodes.iter().map(|n| (n.clone(), (1000, 1))).collect();
    a.pass().await.unwrap();
    let cordoned = provider.cordoned.lock().unwrap().clone();
    assert_eq!(cordoned.len(), 1, "{}", a.report()["decisions"][0]);
    let first = cordoned.iter().next().unwrap().clone();
    let why = a.report()["decisions"][0]["explanation"].as_str().unwrap().to_string();
    assert!(why.contains(&format!("consolidate {first} (t): its 1 member(s) fit on the other nodes")), "{why}");
    assert!(a.instances().get(&first).unwrap().consolidating_since_ms.is_some());

    // Demand that needs new nodes: the cordoned room is wanted back.
    cluster.apps.lock().unwrap()[0].queued = Queued { primary: 2, secondary: 0 };
    a.pass().await.unwrap();
    assert_eq!(*cluster.uncordons.lock().unwrap(), vec![first.clone()]);
    assert!(provider.cordoned.lock().unwrap().is_empty());
    let why = a.report()["decisions"][0]["explanation"].as_str().unwrap().to_string();
    assert!(why.contains(&format!("consolidation of {first} given up: demand waits for new nodes")), "{why}");

    // The demand placed on the new nodes, the pool still again: it consolidates anew, and
    // once the node's member moved, the node is drained.
    cluster.apps.lock().unwrap()[0].queued = Queued::default();
    let all: Vec<String> = provider.running.lock().unwrap().keys().cloned().collect();
    {
        let mut held = cluster.held.lock().unwrap();
        for n in all.iter().filter(|n| !nodes.contains(n)) {
            held.insert(n.clone(), (2000, 2));
        }
    }
    a.pass().await.unwrap();
    a.pass().await.unwrap();
    let cordoned = provider.cordoned.lock().unwrap().clone();
    assert_eq!(cordoned.len(), 1, "{}", a.report()["decisions"][0]);
    let node = cordoned.iter().next().unwrap().clone();
    let to = nodes.iter().find(|n| **n != node).unwrap().clone();
    {
        let mut held = cluster.held.lock().unwrap();
        held.insert(node.clone(), (0, 0));
        held.insert(to, (2000, 2));
    }
    a.pass().await.unwrap();
    assert!(cluster.drains.lock().unwrap().contains(&node), "the emptied node is drained");
    let why = a.report()["decisions"][0]["explanation"].as_str().unwrap().to_string();
    assert!(why.contains(&format!("terminate {node} (consolidation: its members moved to other nodes)")), "{why}");
    std::fs::remove_dir_all(&dir).unwrap();
}
