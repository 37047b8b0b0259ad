//! Leadership on one key: put-if-absent in a transaction, bound to an etcd lease that a
//! background task keeps alive. The holder's fencing token is the key's create revision:
//! etcd's revision counter only grows, so whoever takes the key later holds a larger
//! token than every holder before, and a shard (or the store's own transactions) can
//! refuse a deposed holder by comparing numbers.
//!
//! The holder knows it lost the key *before* etcd expires it: the lease is good until
//! `sent + TTL`, where `sent` is when the last answered keep-alive left this process,
//! which is no later than when etcd received it (and etcd expires a lease TTL after the
//! last keep-alive it received). A process paused past that point (SIGSTOP, a long GC
//! pause, a VM freeze) finds [`Lease::is_held`] false as soon as it runs again, whatever
//! its tasks did not get to observe yet, because the check reads the monotonic clock.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, EventType, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions};
use tokio::sync::{oneshot, watch};

use crate::{EtcdError, within};

/// What to campaign for.
#[derive(Debug, Clone)]
pub struct Campaign {
    /// The key one holder owns (`PREFIX/apps/APP/leader`).
    pub key: String,
    /// What the key holds while this process owns it: who it is (shown to standbys).
    pub value: String,
    /// The lease's time to live. etcd rounds it up to whole seconds and to its own
    /// minimum (about 2 s with default election settings); the granted TTL is used.
    pub ttl: Duration,
    /// How long one etcd request may take before it counts as failed.
    pub request_timeout: Duration,
}

impl Campaign {
    /// The TTL in whole seconds etcd takes, at least 1.
    pub fn ttl_secs(&self) -> i64 {
        ttl_secs(self.ttl)
    }
}

/// Whole seconds, rounded up, at least 1: etcd lease TTLs are integers.
pub fn ttl_secs(ttl: Duration) -> i64 {
    let s = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(s.max(1)).unwrap_or(i64::MAX)
}

/// How often the holder renews: three times per TTL, so two lost renewals in a row
/// still leave it holding.
pub fn keep_alive_interval(ttl: Duration) -> Duration {
    (ttl / 3).max(Duration::from_millis(100))
}

/// The state a holder shares with whoever acts on its behalf; cheap to clone and
/// readable from synchronous code (the store's thread, a reconcile pass).
#[derive(Clone, Debug)]
pub struct Lease {
    inner: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    key: String,
    token: u64,
    lease_id: i64,
    state: Mutex<State>,
    lost: watch::Sender<Option<String>>,
}

#[derive(Debug)]
struct State {
    /// The lease counts as held until then (`sent + TTL` of the last answered keep-alive).
    valid_until: Instant,
    lost: Option<String>,
}

impl Lease {
    /// A lease that was never granted by etcd: held until `lose` is called. For the
    /// embedded store (a file lock stands in for the etcd lease) and for tests.
    pub fn local(key: &str, token: u64) -> Lease {
        Lease::new(key, token, 0, Instant::now() + Duration::from_secs(100 * 365 * 24 * 3600))
    }

    fn new(key: &str, token: u64, lease_id: i64, valid_until: Instant) -> Lease {
        let (lost, _) = watch::channel(None);
        Lease {
            inner: Arc::new(Shared {
                key: key.to_string(),
                token,
                lease_id,
                state: Mutex::new(State { valid_until, lost: None }),
                lost,
            }),
        }
    }

    /// The fencing token: the key's create revision, larger than every earlier holder's.
    pub fn token(&self) -> u64 {
        self.inner.token
    }

    /// The key held.
    pub fn key(&self) -> &str {
        &self.inner.key
    }

    /// The etcd lease id (0 for a local lease).
    pub fn lease_id(&self) -> i64 {
        self.inner.lease_id
    }

    /// Whether this process may still act as the holder: not lost, and the last
    /// answered keep-alive still covers now. Check it right before every action.
    pub fn is_held(&self) -> bool {
        let s = self.state();
        s.lost.is_none() && Instant::now() < s.valid_until
    }

    /// Why the lease is not held (`None` while it is). A lease that merely ran out
    /// (the process was paused) says so, even before the keep-alive task noticed.
    pub fn lost_reason(&self) -> Option<String> {
        let s = self.state();
        if let Some(r) = &s.lost {
            return Some(r.clone());
        }
        (Instant::now() >= s.valid_until).then(|| "no keep-alive was answered within the lease TTL".to_string())
    }

    /// A receiver that changes to `Some(reason)` when the lease is lost.
    pub fn subscribe(&self) -> watch::Receiver<Option<String>> {
        self.inner.lost.subscribe()
    }

    /// Waits until the lease is lost (as the keep-alive task or [`Lease::lose`] learns
    /// it); the reason.
    pub async fn lost(&self) -> String {
        let mut rx = self.subscribe();
        loop {
            if let Some(r) = rx.borrow_and_update().clone() {
                return r;
            }
            if rx.changed().await.is_err() {
                return "the lease's keep-alive stopped".into();
            }
        }
    }

    /// Marks the lease lost (idempotent: the first reason stays).
    pub fn lose(&self, reason: &str) {
        let mut s = self.state();
        if s.lost.is_none() {
            s.lost = Some(reason.to_string());
            drop(s);
            self.inner.lost.send_replace(Some(reason.to_string()));
        }
    }

    fn extend(&self, until: Instant) {
        let mut s = self.state();
        if s.lost.is_none() && until > s.valid_until {
            s.valid_until = until;
        }
    }

    fn expired(&self) -> bool {
        Instant::now() >= self.state().valid_until
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Who holds the key now (when a campaign found it taken).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The holder's value (who it is).
    pub value: String,
    /// The holder's fencing token.
    pub token: u64,
    /// The store revision the answer was read at: a standby watches from the next one.
    pub read_at: i64,
}

/// A held lease and the task keeping it alive. Dropping it stops the keep-alive (the
/// lease then expires within its TTL); [`Leadership::resign`] gives it up at once.
pub struct Leadership {
    lease: Lease,
    client: Client,
    request_timeout: Duration,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Leadership {
    /// The shared state, for whoever acts on this holder's behalf.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The fencing token.
    pub fn token(&self) -> u64 {
        self.lease.token()
    }

    /// Gives the key up: stops the keep-alive and revokes the lease, which deletes the
    /// key, so a standby takes over at once instead of after the TTL.
    pub async fn resign(mut self) {
        self.lease.lose("resigned");
        self.halt().await;
        let id = self.lease.lease_id();
        match within(self.request_timeout, "revoking the lease", self.client.lease_revoke(id)).await {
            Ok(_) => tracing::info!(key = %self.lease.key(), token = self.lease.token(), "resigned the lease"),
            Err(e) => {
                tracing::warn!(key = %self.lease.key(), error = %e, "could not revoke the lease; it expires within its TTL")
            }
        }
    }

    async fn halt(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

/// One attempt: grants a lease and puts the key bound to it if the key does not exist.
/// `Ok(Err(holder))` when someone else holds it (the granted lease is revoked again).
pub async fn try_acquire(client: &Client, c: &Campaign) -> Result<Result<Leadership, Holder>, EtcdError> {
    let mut client = client.clone();
    let t = c.request_timeout;
    let sent = Instant::now();
    let grant = within(t, "granting a lease", client.lease_grant(c.ttl_secs(), None)).await?;
    let lease_id = grant.id();
    let ttl = Duration::from_secs(u64::try_from(grant.ttl().max(1)).unwrap_or(1));
    let txn = Txn::new()
        .when([Compare::create_revision(c.key.as_str(), CompareOp::Equal, 0)])
        .and_then([
            TxnOp::put(c.key.as_str(), c.value.as_str(), Some(PutOptions::new().with_lease(lease_id))),
            TxnOp::get(c.key.as_str(), None),
        ])
        .or_else([TxnOp::get(c.key.as_str(), None)]);
    let answer = match within(t, "the campaign transaction", client.txn(txn)).await {
        Ok(a) => a,
        Err(e) => {
            revoke_quietly(&client, lease_id, t);
            return Err(e);
        }
    };
    let read_at = answer.header().map_or(0, |h| h.revision());
    let kv = answer.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().map(|kv| (kv.value().to_vec(), kv.create_revision(), kv.lease())),
        _ => None,
    });
    if !answer.succeeded() {
        revoke_quietly(&client, lease_id, t);
        let (value, token, _) = kv.unwrap_or_default();
        let value = String::from_utf8_lossy(&value).into_owned();
        return Ok(Err(Holder { value, token: u64::try_from(token).unwrap_or(0), read_at }));
    }
    let token = match kv {
        Some((_, rev, lease)) if lease == lease_id && rev > 0 => rev,
        _ => {
            // The key vanished between the put and the get of one transaction: cannot
            // happen in etcd; refuse rather than guess a token.
            revoke_quietly(&client, lease_id, t);
            return Err(EtcdError::Other(format!("{}: the campaign's put did not read back", c.key)));
        }
    };
    let lease = Lease::new(&c.key, u64::try_from(token).unwrap_or(0), lease_id, sent + ttl);
    let keeper = match within(t, "opening the keep-alive stream", client.lease_keep_alive(lease_id)).await {
        Ok(k) => k,
        Err(e) => {
            revoke_quietly(&client, lease_id, t);
            return Err(e);
        }
    };
    let (stop_tx, stop_rx) = oneshot::channel();
    let task = tokio::spawn(keep_alive(client.clone(), lease.clone(), ttl, t, keeper, stop_rx, read_at));
    tracing::info!(key = %c.key, token, lease = lease_id, ttl_s = ttl.as_secs(), "acquired the lease");
    Ok(Ok(Leadership { lease, client, request_timeout: t, stop: Some(stop_tx), task: Some(task) }))
}

fn revoke_quietly(client: &Client, lease_id: i64, t: Duration) {
    let mut client = client.clone();
    tokio::spawn(async move {
        let _ = within(t, "revoking a lease", client.lease_revoke(lease_id)).await;
    });
}

/// Keeps the lease alive, and watches the key: a deleted key (an operator's `etcdctl
/// del`, a revoked lease) is a lost lease too.
async fn keep_alive(
    mut client: Client,
    lease: Lease,
    ttl: Duration,
    t: Duration,
    keeper: (etcd_client::LeaseKeeper, etcd_client::LeaseKeepAliveStream),
    mut stop: oneshot::Receiver<()>,
    acquired_at: i64,
) {
    let interval = keep_alive_interval(ttl);
    let (mut keeper, mut stream) = keeper;
    let mut key_watch = open_watch(&mut client, lease.key(), acquired_at + 1, t).await;
    loop {
        let sent = Instant::now();
        let mut answered = false;
        if keeper.keep_alive().await.is_ok() {
            match tokio::time::timeout(interval, stream.message()).await {
                Ok(Ok(Some(r))) if r.ttl() > 0 => {
                    lease.extend(sent + Duration::from_secs(u64::try_from(r.ttl()).unwrap_or(0)));
                    answered = true;
                }
                Ok(Ok(Some(_))) => {
                    lease.lose("etcd says the lease expired");
                }
                Ok(Ok(None) | Err(_)) | Err(_) => {}
            }
        }
        if !answered && lease.is_held() {
            tracing::debug!(key = %lease.key(), "a keep-alive went unanswered; reopening the stream");
            if let Ok(k) = within(t, "reopening the keep-alive stream", client.lease_keep_alive(lease.lease_id())).await
            {
                (keeper, stream) = k;
            }
        }
        if lease.expired() {
            lease.lose("no keep-alive was answered within the lease TTL");
        }
        if !lease.is_held() {
            let reason = lease.lost_reason().unwrap_or_default();
            tracing::warn!(key = %lease.key(), token = lease.token(), reason = %reason, "lost the lease");
            // Best effort: if etcd still has the lease, free the key for a standby now.
            let _ = within(t, "revoking a lost lease", client.lease_revoke(lease.lease_id())).await;
            return;
        }
        let next = tokio::time::Instant::from_std(sent + interval);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                _ = tokio::time::sleep_until(next) => break,
                gone = key_gone(&mut key_watch, lease.token()) => {
                    if gone {
                        lease.lose("the lease key was deleted or taken over");
                    } else {
                        key_watch = None; // the watch broke; keep-alives still guard the lease
                    }
                    if !lease.is_held() { break; }
                }
            }
        }
    }
}

async fn open_watch(client: &mut Client, key: &str, from: i64, t: Duration) -> Option<etcd_client::WatchStream> {
    let opts = WatchOptions::new().with_start_revision(from);
    within(t, "watching the lease key", client.watch(key, Some(opts))).await.ok()
}

/// Resolves `true` when the key was deleted or now belongs to another create revision,
/// `false` when the watch broke; pends forever without a watch.
async fn key_gone(w: &mut Option<etcd_client::WatchStream>, token: u64) -> bool {
    let Some(stream) = w else { return std::future::pending().await };
    loop {
        match stream.message().await {
            Ok(Some(r)) => {
                if r.canceled() {
                    return false;
                }
                for ev in r.events() {
                    match ev.event_type() {
                        EventType::Delete => return true,
                        EventType::Put => {
                            if ev.kv().is_some_and(|kv| u64::try_from(kv.create_revision()).ok() != Some(token)) {
                                return true;
                            }
                        }
                    }
                }
            }
            Ok(None) | Err(_) => return false,
        }
    }
}

/// Waits (at most `limit`) until the key changes after revision `after`: deleted (the
/// holder resigned or its lease expired) or rewritten. A standby then campaigns again.
/// Returns early, without error, on a broken watch: the caller retries anyway.
pub async fn wait_for_change(client: &Client, key: &str, after: i64, limit: Duration, t: Duration) {
    let mut client = client.clone();
    let wait = async {
        let Some(mut stream) = open_watch(&mut client, key, after + 1, t).await else {
            // etcd is unreachable: do not spin.
            tokio::time::sleep(t).await;
            return;
        };
        while let Ok(Some(r)) = stream.message().await {
            if r.canceled() || !r.events().is_empty() {
                return;
            }
        }
    };
    let _ = tokio::time::timeout(limit, wait).await;
}

/// Campaigns until this process holds the key: tries, and while another holds it,
/// waits for the key to change (or for one TTL, in case a watch event is missed), then
/// tries again. `on_wait` hears who holds it, or why etcd could not be asked, each time
/// it waits. Cancel-safe: drop the future to stop campaigning.
pub async fn campaign(client: &Client, c: &Campaign, mut on_wait: impl FnMut(&Waiting)) -> Leadership {
    let mut backoff = Duration::from_millis(200);
    loop {
        match try_acquire(client, c).await {
            Ok(Ok(l)) => return l,
            Ok(Err(holder)) => {
                backoff = Duration::from_millis(200);
                on_wait(&Waiting::Held(holder.clone()));
                wait_for_change(client, &c.key, holder.read_at, c.ttl.max(Duration::from_secs(1)), c.request_timeout)
                    .await;
            }
            Err(e) => {
                on_wait(&Waiting::Unreachable(e.to_string()));
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Why a campaign waits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Waiting {
    /// Another process holds the key.
    Held(Holder),
    /// etcd did not answer.
    Unreachable(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_round_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::from_millis(1)), 1);
        assert_eq!(ttl_secs(Duration::ZERO), 1);
        assert_eq!(ttl_secs(Duration::from_secs(5)), 5);
        assert_eq!(ttl_secs(Duration::from_millis(5001)), 6);
        assert_eq!(keep_alive_interval(Duration::from_secs(3)), Duration::from_secs(1));
        assert_eq!(keep_alive_interval(Duration::from_millis(30)), Duration::from_millis(100));
    }

    #[test]
    fn a_lease_runs_out_on_the_clock_and_is_lost_once() {
        let l = Lease::new("k", 7, 1, Instant::now() + Duration::from_millis(50));
        assert!(l.is_held());
        assert_eq!(l.lost_reason(), None);
        std::thread::sleep(Duration::from_millis(60));
        assert!(!l.is_held(), "a paused holder finds its lease gone without any task running");
        assert!(l.lost_reason().unwrap().contains("TTL"));
        l.extend(Instant::now() + Duration::from_secs(5));
        assert!(l.is_held());
        l.lose("first");
        l.lose("second");
        l.extend(Instant::now() + Duration::from_secs(50));
        assert!(!l.is_held(), "a lost lease is never extended again");
        assert_eq!(l.lost_reason().as_deref(), Some("first"));
        assert_eq!(l.subscribe().borrow().as_deref(), Some("first"));
        assert_eq!(l.token(), 7);
    }

    #[test]
    fn a_local_lease_holds_until_lost() {
        let l = Lease::local("file", 3);
        assert!(l.is_held());
        l.lose("shutdown");
        assert!(!l.is_held());
    }
}
