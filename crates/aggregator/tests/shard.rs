//! A real shard in this process, spoken to over real QUIC, UDP and gRPC on loopback.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_aggregator::HeartbeatDrop;
use flotilla_aggregator::TlsMaterial;
use flotilla_proto::seal::{self, DatagramError, Format, Header, MAGIC_HEARTBEAT, SessionKey};
use flotilla_proto::v1::{self, view_service_client::ViewServiceClient, view_update::Update};
use flotilla_testkit::shard::{LocalShard, registration};
use flotilla_testkit::wait_for_async;
use prost::Message;

async fn fixture(name: &str, ring: usize) -> LocalShard {
    LocalShard::start(name, |c| c.ring_capacity = ring).await
}

fn register_req(node: &str, token: &str) -> v1::RegisterRequest {
    v1::RegisterRequest { incarnation: 7, ..registration(node, token, "d", 2000) }
}

#[tokio::test]
async fn wrong_credentials_close_the_connection_with_a_reason() {
    let f = fixture("creds", 64).await;
    let conn = f.connect().await;
    let err = conn.register(register_req("n1", "wrong")).await.unwrap_err().to_string();
    assert!(err.contains("join token is not valid"), "{err}");
    assert!(conn.conn.close_reason().is_some(), "the connection is closed");

    let conn = f.connect().await;
    let mut req = register_req("n1", "join");
    req.protocol_version = 99;
    let err = conn.register(req).await.unwrap_err().to_string();
    assert!(err.contains("protocol version 99"), "{err}");

    // Bad input that is not a credential gets an error and keeps the connection.
    let conn = f.connect().await;
    let mut req = register_req("n1", "join");
    req.labels.insert("bad key!".into(), "v".into());
    let err = conn.register(req).await.unwrap_err().to_string();
    assert!(err.contains("label key") && err.contains("(invalid)"), "the reply carries the error's code: {err}");
    assert!(conn.register(register_req("n1", "join")).await.is_ok());
    assert_eq!(f.shard.stats.registrations_rejected.load(std::sync::atomic::Ordering::Relaxed), 3);
    f.shard.shutdown().await;
}

#[tokio::test]
async fn drain_only_through_the_owning_connection() {
    let f = fixture("drain", 64).await;
    let a = f.connect().await;
    let s = a.register(register_req("n1", "join")).await.unwrap();
    let b = f.connect().await;
    assert!(b.drain("n1", s.session_id).await.is_err(), "another connection cannot drain n1");
    assert!(a.drain("n2", s.session_id).await.is_err(), "a session cannot drain another node");
    let ack = a.drain("n1", s.session_id).await.unwrap();
    assert_eq!(ack.status, v1::NodeStatus::Draining as i32);
    wait_for_async("n1 to show as Draining", Duration::from_secs(5), || {
        let view = f.shard.publisher.load();
        view.nodes.values().next().is_some_and(|n| n.status == flotilla_core::NodeStatus::Draining).then_some(())
    })
    .await;
    f.shard.shutdown().await;
}

fn beat(s: &v1::Session, node: &str, seq: u64) -> Vec<u8> {
    let key: SessionKey = s.key.as_slice().try_into().unwrap();
    let body = v1::HeartbeatBody::default().encode_to_vec();
    let h = Header {
        magic: MAGIC_HEARTBEAT,
        format: Format::Mac,
        session_id: s.session_id,
        seq,
        incarnation: s.incarnation,
        node_id: node,
    };
    let mut out = Vec::new();
    seal::seal(&key, &h, &body, &mut out).unwrap();
    out
}

#[tokio::test]
async fn bad_heartbeats_over_udp_are_dropped_and_counted() {
    let f = fixture("udp", 64).await;
    let conn = f.connect().await;
    let s1 = conn.register(register_req("n1", "join")).await.unwrap();
    let s2 = conn.register(register_req("n2", "join")).await.unwrap();
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let to = f.shard.heartbeat_addr;
    let good = beat(&s1, "n1", 1);
    sock.send_to(&good, to).await.unwrap();
    sock.send_to(&good, to).await.unwrap(); // replayed
    let mut forged = beat(&s1, "n1", 2);
    let last = forged.len() - 1;
    forged[last] ^= 0xff;
    sock.send_to(&forged, to).await.unwrap();
    sock.send_to(&beat(&s1, "n2", 3), to).await.unwrap(); // n1's session speaking for n2
    sock.send_to(b"not a heartbeat at all, not even close, and long enough to be parsed", to).await.unwrap();
    sock.send_to(&vec![0u8; 4000], to).await.unwrap();
    sock.send_to(&beat(&s2, "n2", 1), to).await.unwrap();
    let st = &f.shard.stats;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let seen = st.accepted()
            + [
                HeartbeatDrop::Replayed,
                HeartbeatDrop::Datagram(DatagramError::BadSeal),
                HeartbeatDrop::WrongNode,
                HeartbeatDrop::Datagram(DatagramError::BadMagic),
                HeartbeatDrop::Datagram(DatagramError::Oversized),
            ]
            .iter()
            .map(|r| st.rejected(*r))
            .sum::<u64>();
        if seen >= 7 {
            break;
        }
        assert!(Instant::now() < deadline, "only {seen} of 7 datagrams accounted for");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(st.accepted(), 2);
    assert_eq!(st.rejected(HeartbeatDrop::Replayed), 1);
    assert_eq!(st.rejected(HeartbeatDrop::Datagram(DatagramError::BadSeal)), 1);
    assert_eq!(st.rejected(HeartbeatDrop::WrongNode), 1);
    assert_eq!(st.rejected(HeartbeatDrop::Datagram(DatagramError::BadMagic)), 1);
    assert_eq!(st.rejected(HeartbeatDrop::Datagram(DatagramError::Oversized)), 1);
    f.shard.shutdown().await;
}

async fn watch(f: &LocalShard, from: Option<v1::ViewVersion>) -> tonic::Streaming<v1::ViewUpdate> {
    let mut c = ViewServiceClient::connect(format!("http://{}", f.shard.addr)).await.unwrap();
    c.watch_view(v1::WatchViewRequest { from_version: from }).await.unwrap().into_inner()
}

#[tokio::test]
async fn watch_view_resumes_from_recent_versions_and_snapshots_old_ones() {
    let f = fixture("watch", 4).await;
    let conn = f.connect().await;
    for i in 0..3 {
        conn.register(register_req(&format!("n{i}"), "join")).await.unwrap();
        f.wait_version(i + 1).await;
    }
    let epoch = f.shard.epoch;
    // From seq 1: the two deltas after it, no snapshot.
    let mut s = watch(&f, Some(v1::ViewVersion { epoch, seq: 1 })).await;
    for want in [2, 3] {
        match s.message().await.unwrap().unwrap().update {
            Some(Update::Delta(d)) => assert_eq!(d.to.unwrap().seq, want),
            other => panic!("expected a delta, got {other:?}"),
        }
    }
    // Then live deltas as they happen.
    conn.register(register_req("n3", "join")).await.unwrap();
    match s.message().await.unwrap().unwrap().update {
        Some(Update::Delta(d)) => {
            assert_eq!(d.to.unwrap().seq, 4);
            assert_eq!(d.upserts[0].node_id, "n3");
        }
        other => panic!("expected a live delta, got {other:?}"),
    }
    // Up to date: told so, with nothing to replay.
    let mut s = watch(&f, Some(v1::ViewVersion { epoch, seq: 4 })).await;
    assert!(s.message().await.unwrap().unwrap().update.is_none());

    // Push the ring (4 deltas) past seq 1.
    for i in 4..8 {
        conn.register(register_req(&format!("n{i}"), "join")).await.unwrap();
        f.wait_version(i + 1).await;
    }
    for from in [Some(v1::ViewVersion { epoch, seq: 1 }), Some(v1::ViewVersion { epoch: epoch - 1, seq: 8 }), None] {
        let mut s = watch(&f, from).await;
        match s.message().await.unwrap().unwrap().update {
            Some(Update::Snapshot(c)) => {
                assert!(c.last);
                assert_eq!(c.nodes.len(), 8);
                assert_eq!(c.version.unwrap().seq, 8);
            }
            other => panic!("expected a snapshot for {from:?}, got {other:?}"),
        }
    }
    f.shard.shutdown().await;
}

#[tokio::test]
async fn a_cluster_view_follows_the_shard() {
    let f = fixture("follow", 64).await;
    let cluster = flotilla_view::ClusterView::new(1);
    let task =
        tokio::spawn(flotilla_view::follow_shard(cluster.clone(), 0, f.shard.addr.to_string(), Default::default()));
    let conn = f.connect().await;
    for i in 0..5 {
        conn.register(register_req(&format!("n{i}"), "join")).await.unwrap();
    }
    wait_for_async("the follower to catch up", Duration::from_secs(5), || {
        (cluster.slot(0).view.len() >= 5 && cluster.slot(0).connected).then_some(())
    })
    .await;
    let mine = cluster.slot(0).view.clone();
    let theirs = f.shard.publisher.load();
    assert_eq!(mine.version, theirs.version);
    assert_eq!(mine.nodes, theirs.nodes);
    // The shard goes away: its nodes turn Unknown for this follower.
    f.shard.shutdown().await;
    wait_for_async("the lost shard to be noticed", Duration::from_secs(5), || {
        (!cluster.slot(0).connected).then_some(())
    })
    .await;
    task.abort();
    let _: Arc<flotilla_view::ClusterView> = cluster;
}

#[tokio::test]
async fn silent_nodes_go_suspect_then_dead_then_leave_the_view() {
    let t = flotilla_aggregator::Timeouts { suspect_after_ms: 300, dead_after_ms: 600, retention_ms: 600 };
    let f = LocalShard::start("silence", |c| {
        c.ring_capacity = 64;
        c.timeouts = t;
    })
    .await;
    let conn = f.connect().await;
    conn.register(register_req("quiet", "join")).await.unwrap();
    let start = Instant::now();
    let mut seen = Vec::new();
    while start.elapsed() < Duration::from_secs(10) {
        let view = f.shard.publisher.load();
        let st = view.nodes.values().next().map(|n| n.status);
        if seen.last() != Some(&st) && (st.is_some() || !seen.is_empty()) {
            seen.push(st);
        }
        if st.is_none() && seen.len() > 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    use flotilla_core::NodeStatus::*;
    assert_eq!(seen, vec![Some(Alive), Some(Suspect), Some(Dead), None], "after {:?}", start.elapsed());
    assert!(start.elapsed() >= Duration::from_millis(1100), "not before suspect+dead+retention");
    assert!(f.shard.registry.is_empty(), "the registry forgot it too");
    f.shard.shutdown().await;
}

/// A rack cut off from its shard, whose first node's last heartbeat had come late: that
/// node is due to be Dead before its peers are Suspect. It waits for them (the rack has
/// heard nothing for an interval), and all three go Unknown; none is Dead, so nothing of
/// theirs is replaced while the link is down.
#[tokio::test]
async fn a_rack_cut_off_goes_unknown_though_one_node_fell_silent_first() {
    let f = LocalShard::start("rack", |c| {
        c.ring_capacity = 64;
        c.timeouts = flotilla_aggregator::Timeouts::default();
    })
    .await;
    let conn = f.connect().await;
    let mut sessions = Vec::new();
    for n in ["r1", "r2", "r3"] {
        sessions.push(
            conn.register(v1::RegisterRequest { incarnation: 7, ..registration(n, "join", "rack", 2000) })
                .await
                .unwrap(),
        );
    }
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut seq = 0;
    let mut beat_all = async |from: usize| {
        seq += 1;
        for (i, s) in sessions.iter().enumerate().skip(from) {
            sock.send_to(&beat(s, &format!("r{}", i + 1), seq), f.shard.heartbeat_addr).await.unwrap();
        }
    };
    for _ in 0..4 {
        beat_all(0).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // r1 falls silent; r2 and r3 1.6 s later (default timeouts: Suspect 2 s, Dead 3 s).
    let cut = Instant::now();
    while cut.elapsed() < Duration::from_millis(1600) {
        beat_all(1).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    use flotilla_core::NodeStatus::*;
    let statuses = || {
        let view = f.shard.publisher.load();
        ["r1", "r2", "r3"].map(|n| view.nodes.values().find(|r| r.node_id.as_str() == n).map(|r| r.status))
    };
    while cut.elapsed() < Duration::from_secs(12) {
        let now = statuses();
        assert!(!now.contains(&Some(Dead)), "{now:?} after {:?}", cut.elapsed());
        if now == [Some(Unknown); 3] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(statuses(), [Some(Unknown); 3]);
    f.shard.shutdown().await;
}

fn commit_claim(node: &str, inc: u64, unit: &str, cpu: u64) -> v1::Claim {
    v1::Claim {
        key: Some(v1::ClaimKey { app: "app".into(), unit: unit.into(), member: "head".into(), generation: 1 }),
        node_id: node.into(),
        incarnation: inc,
        resources: Some(v1::Resources { cpu_millis: cpu, memory_bytes: 1 << 20, ..Default::default() }),
        allow_low_priority: false,
        group: String::new(),
        workload: None,
    }
}

#[tokio::test]
async fn commits_are_checked_idempotent_and_shown_in_the_next_version() {
    use flotilla_proto::v1::ledger_service_client::LedgerServiceClient;
    let f = fixture("commit", 64).await;
    let conn = f.connect().await;
    conn.register(register_req("n1", "join")).await.unwrap(); // 2000m, incarnation 7
    f.wait_version(1).await;
    let mut c = LedgerServiceClient::connect(format!("http://{}", f.shard.addr)).await.unwrap();
    let req = v1::CommitRequest {
        txn_id: "t1".into(),
        fencing_token: 1,
        claims: vec![
            commit_claim("n1", 7, "u1", 1500),
            commit_claim("n1", 7, "u2", 1000), // no longer fits
            commit_claim("n1", 6, "u3", 10),   // planned against an old incarnation
            commit_claim("ghost", 1, "u4", 10),
        ],
    };
    let resp = c.commit(req.clone()).await.unwrap().into_inner();
    let reasons: Vec<i32> = resp.results.iter().map(|r| r.reason).collect();
    assert!(resp.results[0].accepted);
    assert_eq!(
        reasons[1..],
        [
            v1::RejectReason::NoFit as i32,
            v1::RejectReason::IncarnationMismatch as i32,
            v1::RejectReason::UnknownNode as i32
        ]
    );
    // The answer comes at the decision and names the version that will show the
    // allocation: the one after the version published when it was decided.
    let shown = resp.applied_in.unwrap();
    let view = wait_for_async("the version the commit named", Duration::from_secs(5), || {
        let view = f.shard.publisher.load();
        (view.version.seq >= shown.seq).then_some(view)
    })
    .await;
    assert_eq!(view.version.epoch, shown.epoch);
    assert_eq!(view.nodes.values().next().unwrap().allocated.cpu_millis, 1500);
    // A replay (same transaction, or the same member in a new one) allocates nothing.
    let again = c.commit(req).await.unwrap().into_inner();
    assert_eq!(again.results.iter().map(|r| r.accepted).collect::<Vec<_>>(), vec![true, false, false, false]);
    let mut fresh =
        v1::CommitRequest { txn_id: "t2".into(), fencing_token: 1, claims: vec![commit_claim("n1", 7, "u1", 1500)] };
    assert!(c.commit(fresh.clone()).await.unwrap().into_inner().results[0].accepted);
    assert_eq!(f.shard.ledger.lock().unwrap().allocated(&flotilla_core::NodeId::new("n1").unwrap()).cpu_millis, 1500);
    // Bad requests are refused with a reason.
    fresh.txn_id = String::new();
    let err = c.commit(fresh.clone()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("txn_id"), "{}", err.message());
    fresh.txn_id = "t3".into();
    fresh.claims[0].node_id = "not a node id".into();
    let err = c.commit(fresh.clone()).await.unwrap_err();
    assert!(err.message().contains("claims[0].node_id"), "{}", err.message());
    fresh.claims = vec![];
    assert_eq!(c.commit(fresh).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    // Release frees it, and the view shows that too.
    let keys = vec![v1::ClaimKey { app: "app".into(), unit: "u1".into(), member: "head".into(), generation: 1 }];
    let r = c.release(v1::ReleaseRequest { txn_id: "t4".into(), fencing_token: 1, keys }).await.unwrap().into_inner();
    assert_eq!(r.released, 1);
    assert_eq!(f.shard.publisher.load().nodes.values().next().unwrap().allocated.cpu_millis, 0);
    f.shard.shutdown().await;
}

#[tokio::test]
async fn reservations_confirm_once_and_expire_never_succeeding_late() {
    use flotilla_proto::v1::ledger_service_client::LedgerServiceClient;
    let f = fixture("reserve", 64).await;
    let conn = f.connect().await;
    conn.register(register_req("n1", "join")).await.unwrap();
    f.wait_version(1).await;
    let mut c = LedgerServiceClient::connect(format!("http://{}", f.shard.addr)).await.unwrap();
    let reserve = |txn: &str, unit: &str, ttl| v1::ReserveRequest {
        txn_id: txn.into(),
        fencing_token: 1,
        claims: vec![commit_claim("n1", 7, unit, 500)],
        ttl_ms: ttl,
    };
    assert!(c.reserve(reserve("r1", "u1", 5000)).await.unwrap().into_inner().results[0].accepted);
    let confirm = |txn: &str| v1::ConfirmRequest { txn_id: txn.into(), fencing_token: 1 };
    assert_eq!(c.confirm(confirm("r1")).await.unwrap().into_inner().status, v1::ConfirmStatus::Confirmed as i32);
    assert!(c.reserve(reserve("r2", "u2", 100)).await.unwrap().into_inner().results[0].accepted);
    tokio::time::sleep(Duration::from_millis(400)).await;
    let st = c.confirm(confirm("r2")).await.unwrap().into_inner().status;
    assert!(
        st == v1::ConfirmStatus::Expired as i32 || st == v1::ConfirmStatus::UnknownReservation as i32,
        "a late confirm is never a success ({st})"
    );
    assert_eq!(
        c.confirm(confirm("never")).await.unwrap().into_inner().status,
        v1::ConfirmStatus::UnknownReservation as i32
    );
    assert_eq!(f.shard.ledger.lock().unwrap().allocated(&flotilla_core::NodeId::new("n1").unwrap()).cpu_millis, 500);
    assert_eq!(c.reserve(reserve("r3", "u3", 0)).await.unwrap_err().code(), tonic::Code::InvalidArgument);
    f.shard.shutdown().await;
}

#[tokio::test]
async fn grpc_needs_tls_and_a_token_when_configured() {
    use flotilla_proto::dial::Dialer;
    use flotilla_proto::v1::ledger_service_client::LedgerServiceClient;
    let metrics = flotilla_obs::metrics_handle();
    let (_, grpc_cert, grpc_key) = TlsMaterial::self_signed(&["127.0.0.1", "localhost"]).unwrap();
    let grpc_tls = flotilla_aggregator::GrpcTls { cert_pem: grpc_cert.clone().into(), key_pem: grpc_key.into() };
    let LocalShard { shard, .. } = LocalShard::start("grpc", |c| {
        c.grpc_tokens = vec!["old-token".into(), "new-token".into()];
        c.grpc_tls = Some(grpc_tls);
    })
    .await;
    let addr = shard.addr.to_string();
    let commit =
        v1::CommitRequest { txn_id: "t1".into(), fencing_token: 1, claims: vec![commit_claim("n1", 7, "u1", 10)] };
    let tls = Dialer::network().with_ca(grpc_cert.into_bytes());

    // Plain text to a TLS port gets no answer.
    let plain = Dialer::network().connect(&addr, Some(Duration::from_secs(2))).await;
    if let Ok(ch) = plain {
        assert!(LedgerServiceClient::new(ch).commit(commit.clone()).await.is_err(), "plain text was answered");
    }

    // TLS without a token, and with a wrong one: refused, saying why.
    let mut c = LedgerServiceClient::new(tls.connect(&addr, None).await.unwrap());
    let e = c.commit(commit.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(e.message().contains("Bearer"), "{}", e.message());
    let mut watch = ViewServiceClient::new(tls.connect(&addr, None).await.unwrap());
    let e = watch.watch_view(v1::WatchViewRequest { from_version: None }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated, "WatchView needs the token too");
    let forged = tls.clone().with_token("guess").unwrap();
    let mut c = LedgerServiceClient::new(forged.connect(&addr, None).await.unwrap());
    let e = c.commit(commit.clone()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    assert!(e.message().contains("not one this shard accepts"), "{}", e.message());

    // Either token of the rotation list is accepted; the ledger answers the claim.
    for token in ["old-token", "new-token"] {
        let dialer = tls.clone().with_token(token).unwrap();
        let mut c = LedgerServiceClient::new(dialer.connect(&addr, None).await.unwrap());
        let r = c.commit(commit.clone()).await.unwrap().into_inner();
        assert_eq!(r.results[0].reason, v1::RejectReason::UnknownNode as i32);
        let mut watch = ViewServiceClient::new(dialer.connect(&addr, None).await.unwrap());
        let mut stream = watch.watch_view(v1::WatchViewRequest { from_version: None }).await.unwrap().into_inner();
        assert!(matches!(stream.message().await.unwrap().unwrap().update, Some(Update::Snapshot(_))));
    }

    // An oversized request is refused whole, and every refusal was counted.
    let dialer = tls.with_token("new-token").unwrap();
    let mut c = LedgerServiceClient::new(dialer.connect(&addr, None).await.unwrap());
    let mut big = commit.clone();
    big.claims = vec![commit_claim("n1", 7, "u1", 10); flotilla_aggregator::MAX_CLAIMS + 1];
    let e = c.commit(big).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("claims"), "{}", e.message());
    let text = metrics.render();
    let count = |reason: &str| {
        let prefix = format!("flotilla_grpc_requests_rejected_total{{reason=\"{reason}\"}} ");
        text.lines().find_map(|l| l.strip_prefix(prefix.as_str())).and_then(|v| v.trim().parse::<f64>().ok())
    };
    assert!(count("unauthenticated") >= Some(2.0), "{text}");
    assert!(count("forged") >= Some(1.0), "{text}");
    assert!(text.contains("flotilla_commit_requests_rejected_total{reason=\"invalid\"}"), "{text}");
    shard.shutdown().await;
}

/// Fencing over real gRPC: a scheduler with a newer token raises the app's mark; every
/// request of the older one is then refused (commit and reserve per claim, confirm by
/// status, release as a FAILED_PRECONDITION `fenced` status) and changes nothing; the
/// mark and an operator's drain survive a restart of the shard from its state file.
#[tokio::test]
async fn stale_fencing_tokens_are_refused_and_the_marks_survive_a_restart() {
    use flotilla_aggregator::{FileState, StateStore};
    use flotilla_proto::v1::ledger_service_client::LedgerServiceClient;
    use flotilla_proto::v1::node_admin_service_client::NodeAdminServiceClient;
    let metrics = flotilla_obs::metrics_handle();
    let dir = flotilla_testkit::TempDir::new("fencing-state");
    let state = dir.join("shard-state.json");
    let with_state = |c: &mut flotilla_aggregator::ShardConfig| {
        let file = FileState::new(&state);
        c.initial_state = file.load().unwrap();
        c.state_store = Some(Arc::new(file) as Arc<dyn StateStore>);
    };
    let f = LocalShard::start("fencing", with_state).await;
    let conn = f.connect().await;
    conn.register(register_req("n1", "join")).await.unwrap();
    f.wait_version(1).await;
    let mut c = LedgerServiceClient::connect(format!("http://{}", f.shard.addr)).await.unwrap();
    let commit = |txn: &str, token, unit: &str| v1::CommitRequest {
        txn_id: txn.into(),
        fencing_token: token,
        claims: vec![commit_claim("n1", 7, unit, 500)],
    };
    // Before any lease, token 0 passes; the old scheduler (5) places u1.
    assert!(c.commit(commit("t0", 0, "u0")).await.unwrap().into_inner().results[0].accepted);
    assert!(c.commit(commit("t1", 5, "u1")).await.unwrap().into_inner().results[0].accepted);
    // The new scheduler (6) releases u1 and places u2.
    let key = |unit: &str| v1::ClaimKey { app: "app".into(), unit: unit.into(), member: "head".into(), generation: 1 };
    let rel = |txn: &str, token, unit: &str| v1::ReleaseRequest {
        txn_id: txn.into(),
        fencing_token: token,
        keys: vec![key(unit)],
    };
    assert_eq!(c.release(rel("t2", 6, "u1")).await.unwrap().into_inner().released, 1);
    assert!(c.commit(commit("t3", 6, "u2")).await.unwrap().into_inner().results[0].accepted);
    // The old one's commit of u1 arrives after the release, on another connection.
    let mut old = LedgerServiceClient::connect(format!("http://{}", f.shard.addr)).await.unwrap();
    let r = old.commit(commit("t4", 5, "u1")).await.unwrap().into_inner();
    assert_eq!((r.results[0].accepted, r.results[0].reason), (false, v1::RejectReason::Fenced as i32));
    assert_eq!(r.results[0].detail, "fenced");
    let r = old.commit(commit("t0", 0, "u0")).await.unwrap().into_inner();
    assert_eq!(r.results[0].reason, v1::RejectReason::Fenced as i32, "no lease is stale once a lease was seen");
    // Its release of what the new one placed releases nothing.
    let e = old.release(rel("t5", 5, "u2")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition);
    assert_eq!(flotilla_proto::status::RemoteError::from(e.clone()).code, "fenced", "{e:?}");
    assert!(e.message().contains("fencing token 5") && e.message().contains("6"), "{}", e.message());
    let n1 = flotilla_core::NodeId::new("n1").unwrap();
    {
        let l = f.shard.ledger.lock().unwrap();
        assert!(
            l.placement(&flotilla_aggregator::ClaimKey {
                app: "app".into(),
                unit: "u2".into(),
                member: "head".into(),
                generation: 1
            })
            .is_some()
        );
        assert_eq!(l.allocated(&n1).cpu_millis, 1000, "u0 and u2; u1 stayed released");
    }
    // A reservation by the new one cannot be confirmed by the old one.
    let reserve = v1::ReserveRequest {
        txn_id: "r1".into(),
        fencing_token: 6,
        claims: vec![commit_claim("n1", 7, "u3", 100)],
        ttl_ms: 60_000,
    };
    assert!(c.reserve(reserve).await.unwrap().into_inner().results[0].accepted);
    let st = old.confirm(v1::ConfirmRequest { txn_id: "r1".into(), fencing_token: 5 }).await.unwrap().into_inner();
    assert_eq!(st.status, v1::ConfirmStatus::Fenced as i32);
    let st = c.confirm(v1::ConfirmRequest { txn_id: "r1".into(), fencing_token: 6 }).await.unwrap().into_inner();
    assert_eq!(st.status, v1::ConfirmStatus::Confirmed as i32);
    // A drain, then a restart from the same state file.
    let mut admin = NodeAdminServiceClient::connect(format!("http://{}", f.shard.addr)).await.unwrap();
    let cordon = v1::CordonRequest { node_id: "n1".into(), cordoned: true, drain: true };
    assert!(admin.set_cordon(cordon).await.unwrap().into_inner().found);
    let text = metrics.render();
    for op in ["commit", "release", "confirm"] {
        assert!(text.contains(&format!("flotilla_ledger_fenced_total{{op=\"{op}\"}}")), "{op}: {text}");
    }
    drop((c, old, admin, conn));
    f.shard.shutdown().await;
    let g = LocalShard::start("fencing-again", with_state).await;
    assert_eq!(g.shard.registry.cordon(&n1), Some(true), "the drain survived the restart");
    assert_eq!(g.shard.ledger.lock().unwrap().mark("app"), 6);
    let mut old = LedgerServiceClient::connect(format!("http://{}", g.shard.addr)).await.unwrap();
    let r = old.commit(commit("t6", 5, "u1")).await.unwrap().into_inner();
    assert_eq!(r.results[0].reason, v1::RejectReason::Fenced as i32, "the restarted shard still fences");
    assert_eq!(old.release(rel("t7", 5, "u2")).await.unwrap_err().code(), tonic::Code::FailedPrecondition);
    g.shard.shutdown().await;
}

/// A scheduler process's channels run on the I/O thread: the connection's tasks (HTTP/2
/// framing, reads, writes) never queue behind the app schedulers on the caller's runtime.
#[test]
fn channels_on_the_io_thread_leave_no_task_on_the_callers_runtime() {
    use flotilla_proto::dial::Dialer;
    use flotilla_proto::v1::ledger_service_client::LedgerServiceClient;
    let server = tokio::runtime::Runtime::new().unwrap();
    let f = server.block_on(fixture("io-thread", 64));
    let addr = f.shard.addr.to_string();
    let caller = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // Tasks a connect and a commit leave alive on the caller's runtime while the client lives.
    let tasks_left = |dialer: Dialer| {
        caller.block_on(async {
            let before = tokio::runtime::Handle::current().metrics().num_alive_tasks();
            let mut c = LedgerServiceClient::new(dialer.connect(&addr, None).await.unwrap());
            let commit = v1::CommitRequest {
                txn_id: "io".into(),
                fencing_token: 1,
                claims: vec![commit_claim("n1", 7, "u1", 10)],
            };
            let r = c.commit(commit).await.unwrap().into_inner();
            assert_eq!(r.results[0].reason, v1::RejectReason::UnknownNode as i32, "the shard answered");
            tokio::runtime::Handle::current().metrics().num_alive_tasks() - before
        })
    };
    assert_eq!(tasks_left(Dialer::network().on_io_thread()), 0);
    assert!(tasks_left(Dialer::network()) > 0, "a plain dialer's connection runs on the caller's runtime");
    server.block_on(f.shard.shutdown());
}
