//! Leadership against a real etcd (testkit starts `/usr/bin/etcd` on free ports).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::time::{Duration, Instant};

use flotilla_etcd::{Campaign, Endpoints, REQUEST_TIMEOUT, Waiting, campaign, connect, try_acquire};
use flotilla_testkit::Etcd;

fn campaign_for(who: &str, key: &str) -> Campaign {
    Campaign { key: key.into(), value: who.into(), ttl: Duration::from_secs(2), request_timeout: REQUEST_TIMEOUT }
}

async fn client(etcd: &Etcd) -> flotilla_etcd::Client {
    connect(&Endpoints::parse(&etcd.endpoint()).unwrap(), REQUEST_TIMEOUT).await.unwrap()
}

#[tokio::test]
async fn one_holder_at_a_time_and_tokens_only_grow() {
    let etcd = Etcd::start("lease-one");
    let c = client(&etcd).await;
    let key = "/t/apps/echo/leader";
    // A long TTL: keep-alives must hold it, and the hand-over below cannot be the TTL.
    let long = Campaign { ttl: Duration::from_secs(30), ..campaign_for("a", key) };
    let a = try_acquire(&c, &long).await.unwrap().expect("a takes the free key");
    let held = try_acquire(&c, &campaign_for("b", key)).await.unwrap().err().expect("b finds it held");
    assert_eq!(held.value, "a");
    assert_eq!(held.token, a.token());
    assert!(a.lease().is_held());
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(a.lease().is_held(), "{:?}", a.lease().lost_reason());
    let first = a.token();
    // A standby waits; resigning hands over at once, with a larger token.
    let waiting = tokio::spawn({
        let c = c.clone();
        async move {
            let mut waits = Vec::new();
            let l = campaign(&c, &campaign_for("b", key), |w| waits.push(w.clone())).await;
            (l, waits)
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let lease_a = a.lease().clone();
    a.resign().await;
    assert!(!lease_a.is_held());
    // Well within a's 30 s TTL: resigning revoked the lease.
    let (b, waits) = tokio::time::timeout(Duration::from_secs(15), waiting).await.unwrap().unwrap();
    assert!(b.token() > first, "{} > {first}", b.token());
    assert!(matches!(&waits[0], Waiting::Held(h) if h.value == "a"), "{waits:?}");
    b.resign().await;
}

#[tokio::test]
async fn a_silent_holder_loses_within_the_ttl_and_a_standby_takes_over() {
    let etcd = Etcd::start("lease-silent");
    let c = client(&etcd).await;
    let key = "/t/apps/silent/leader";
    let a = try_acquire(&c, &campaign_for("a", key)).await.unwrap().unwrap();
    let lease_a = a.lease().clone();
    // The holder stops renewing (as a paused process does): dropping the handle stops
    // the keep-alive without revoking.
    let stopped = Instant::now();
    drop(a);
    // b's lease is long: nothing but the deletion below may depose it, even on a machine
    // too starved to renew a 2 s lease in time (CI once saw it expire first).
    let long = Campaign { ttl: Duration::from_secs(30), ..campaign_for("b", key) };
    let b = tokio::time::timeout(Duration::from_secs(15), campaign(&c, &long, |_| {})).await.unwrap();
    assert!(!lease_a.is_held(), "the old holder's clock says it lost before the standby got in");
    assert!(stopped.elapsed() >= Duration::from_secs(1), "the key lapsed with its lease, not earlier");
    assert!(b.token() > lease_a.token());
    // Deleting the key by hand deposes the holder.
    etcd.ctl(&["del", key]);
    let why = tokio::time::timeout(Duration::from_secs(15), b.lease().lost()).await.unwrap();
    assert!(why.contains("deleted"), "{why}");
    assert!(!b.lease().is_held());
}

#[tokio::test]
async fn a_holder_cut_off_from_etcd_gives_up_before_its_lease_could_lapse() {
    let mut etcd = Etcd::start("lease-cut");
    let c = client(&etcd).await;
    let a = try_acquire(&c, &campaign_for("a", "/t/cut")).await.unwrap().unwrap();
    let killed = Instant::now();
    etcd.kill();
    // Every keep-alive answered left before the kill, so one TTL later the holder's
    // clock says it no longer holds, whatever its task is doing.
    tokio::time::sleep_until((killed + Duration::from_millis(2050)).into()).await;
    assert!(!a.lease().is_held());
    let why = tokio::time::timeout(Duration::from_secs(10), a.lease().lost()).await.unwrap();
    assert!(why.contains("TTL") || why.contains("expired"), "{why}");
    // With etcd back, a campaign works again (the old key lapses with its lease).
    etcd.restart();
    let b = tokio::time::timeout(Duration::from_secs(20), campaign(&c, &campaign_for("b", "/t/cut"), |_| {}))
        .await
        .unwrap();
    assert!(b.token() > a.token());
}
