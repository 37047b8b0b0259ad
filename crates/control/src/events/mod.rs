//! `GET /v1/events`: the dashboard's live stream (server-sent events).
//!
//! One [`Hub`] per control plane does the work once for every browser: at most every
//! [`TICK`] it compares what it last published with the current state by pointer
//! (each shard's view `Arc` and, inside a changed view, the node map with imbl's
//! `diff`, which skips the subtrees the two versions share; each app's status,
//! decisions, routes and capacity `Arc`s; each pool's version) and serialises what
//! changed once, as ready-made SSE frames on a broadcast channel. A new subscriber
//! first gets a snapshot (`snapshot_begin`, the nodes in chunks of at most
//! [`SNAPSHOT_CHUNK`] rows, the federation summary, every app, every pool,
//! `snapshot_end`), then the broadcast; one that falls behind the broadcast gets a
//! fresh snapshot instead of an error. Every [`PING`] a `ping` keeps proxies from
//! closing an idle stream.
//!
//! Apps of standalone schedulers are fetched over HTTP at most every
//! [`REMOTE_EVERY`] by a task of their own, so a slow scheduler never delays a tick.

use crate::catalogue as m;
use flotilla_core::LockExt;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use flotilla_core::NodeId;
use flotilla_view::ShardSlot;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::{ControlError, ControlState};

mod columns;
mod federation;
mod rows;

pub use columns::{CORDONED, DRAIN_REQUESTED, PREEMPTING, SNAPSHOT_CHUNK};
use columns::{node_frames, snapshot_chunks};
pub use federation::{Counts, DomainSummary, Res};
pub use rows::local_app_of;
pub use rows::{DECISIONS_SHOWN, Frame, NodeChanges, UnitsByDomain, frame, node_changes, priority_of, status_of};
use rows::{count_local, count_remote, fetch_apps, local_app};

/// Shortest time between two ticks of the hub.
pub const TICK: Duration = Duration::from_millis(250);
/// How often an idle stream carries a `ping`.
pub const PING: Duration = Duration::from_secs(15);
/// Most browsers (streams) one control plane serves at once.
pub const MAX_SUBSCRIBERS: usize = 256;
/// Most streams from one address, so one client cannot take every place.
pub const MAX_PER_PEER: usize = 16;
/// A subscriber that takes no frame for this long (its queue full: it does not read)
/// is dropped; its place goes to others, and a browser that was only slow reconnects
/// and starts over with a snapshot.
pub const STALL: Duration = Duration::from_secs(10);
/// How often standalone schedulers' apps are fetched.
pub const REMOTE_EVERY: Duration = Duration::from_secs(2);
/// The federation summary is re-sent at least this often (its shards'
/// `updated_ms_ago` age even when nothing else changes).
pub const FEDERATION_REFRESH: Duration = Duration::from_secs(5);
/// Frames the broadcast holds for a slow subscriber before it must start over.
const BROADCAST_CAPACITY: usize = 1024;
/// Frames queued per subscriber connection.
const SUBSCRIBER_QUEUE: usize = 64;

/// Counts `n` messages of `event` sent (a broadcast one counts once, whatever the
/// number of subscribers).
fn count(event: &'static str, n: usize) {
    metrics::counter!(m::EVENTS_MESSAGES.name, "event" => event).increment(n as u64);
}

/// What an app was made of when last sent: its status, decisions, routes and capacity
/// (or a standalone scheduler's last fetched payload). Held, not just their addresses,
/// so a freed one's address cannot be reused by its successor and hide a change.
enum AppKey {
    Local(
        Arc<flotilla_scheduler::AppStatus>,
        Arc<Vec<Arc<Value>>>,
        Arc<flotilla_proto::v1::RouteTable>,
        Arc<flotilla_proto::v1::Capacity>,
    ),
    Remote(Arc<Value>),
}

impl AppKey {
    fn same(&self, other: &AppKey) -> bool {
        match (self, other) {
            (AppKey::Local(a, b, c, d), AppKey::Local(e, f, g, h)) => {
                Arc::ptr_eq(a, e) && Arc::ptr_eq(b, f) && Arc::ptr_eq(c, g) && Arc::ptr_eq(d, h)
            }
            (AppKey::Remote(a), AppKey::Remote(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

struct AppSeen {
    key: AppKey,
    frame: Frame,
    units: UnitsByDomain,
}

/// What the hub last published: the state every new snapshot is made of.
#[derive(Default)]
struct Published {
    slots: Vec<Arc<ShardSlot>>,
    federation: Option<(Frame, Instant)>,
    /// The federation summary's totals, as of `slots`.
    counts: Counts,
    apps: BTreeMap<String, AppSeen>,
    pools: BTreeMap<String, (u64, Frame)>,
    /// The node chunks of the last snapshot built, and the slots it was built from.
    snapshot_nodes: Option<Built>,
}

/// A snapshot's node chunks and the slots they show. Later snapshots send them again,
/// followed by the changes since (`snapshot_nodes`): building them takes tens of
/// milliseconds of CPU at 100,000 nodes (sorting the ids, a column entry per node, the
/// JSON), and a new dashboard waits for them before its first paint, while the view
/// changes every tick. Keeping `slots` keeps the nodes that changed since alive too, at
/// most [`CATCH_UP_MOST`] past the next snapshot.
#[derive(Clone)]
struct Built {
    slots: Vec<Arc<ShardSlot>>,
    frames: Arc<Vec<Frame>>,
}

/// The shared producer of the stream (see the module doc).
pub struct Hub {
    control: Arc<ControlState>,
    published: Mutex<Published>,
    tx: broadcast::Sender<Frame>,
    subscribers: AtomicUsize,
    /// Streams by client address.
    per_peer: Mutex<std::collections::HashMap<std::net::IpAddr, usize>>,
    started: AtomicBool,
    /// Standalone schedulers' apps as last fetched, by name.
    remote: Mutex<BTreeMap<String, Arc<Value>>>,
    fetching: AtomicBool,
}

/// A subscriber's place (and its address's); gives them back when its stream ends.
struct Admitted(Arc<Hub>, Option<std::net::IpAddr>);

impl Drop for Admitted {
    fn drop(&mut self) {
        let n = self.0.subscribers.fetch_sub(1, Ordering::SeqCst) - 1;
        metrics::gauge!(m::EVENTS_SUBSCRIBERS.name).set(n as f64);
        if let Some(peer) = self.1 {
            let mut per_peer = self.0.per_peer.lock_or_recover();
            if let Some(k) = per_peer.get_mut(&peer) {
                *k -= 1;
                if *k == 0 {
                    per_peer.remove(&peer);
                }
            }
        }
    }
}

impl Hub {
    /// The hub; inside a runtime it also keeps a snapshot build ready ([`keep_built`]).
    pub fn new(control: Arc<ControlState>) -> Arc<Hub> {
        let hub = Arc::new(Hub {
            control,
            published: Mutex::new(Published::default()),
            tx: broadcast::channel(BROADCAST_CAPACITY).0,
            subscribers: AtomicUsize::new(0),
            per_peer: Mutex::new(std::collections::HashMap::new()),
            started: AtomicBool::new(false),
            remote: Mutex::new(BTreeMap::new()),
            fetching: AtomicBool::new(false),
        });
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(keep_built(Arc::downgrade(&hub)));
        }
        hub
    }

    fn admit(self: &Arc<Self>, peer: Option<std::net::IpAddr>) -> Result<Admitted, ControlError> {
        if let Some(ip) = peer {
            let mut per_peer = self.per_peer.lock_or_recover();
            let k = per_peer.entry(ip).or_default();
            if *k >= MAX_PER_PEER {
                crate::limits::rejected("too_many_subscribers_from_peer");
                return Err(ControlError::TooManySubscribers { max: MAX_PER_PEER, from_one_address: true });
            }
            *k += 1;
        }
        let n = self.subscribers.fetch_add(1, Ordering::SeqCst);
        let admitted = Admitted(self.clone(), peer);
        if n >= MAX_SUBSCRIBERS {
            crate::limits::rejected("too_many_subscribers");
            return Err(ControlError::TooManySubscribers { max: MAX_SUBSCRIBERS, from_one_address: false });
        }
        metrics::gauge!(m::EVENTS_SUBSCRIBERS.name).set((n + 1) as f64);
        if !self.started.swap(true, Ordering::SeqCst) {
            tokio::spawn(run(Arc::downgrade(self)));
        }
        Ok(admitted)
    }

    /// Broadcasts one message to every subscriber.
    fn send(&self, event: &'static str, f: Frame) {
        count(event, 1);
        let _ = self.tx.send(f);
    }

    /// Brings `p` up to date, broadcasting what changed. Node rows are serialised only
    /// when someone listens; the rest is kept for snapshots either way.
    fn tick_locked(&self, p: &mut Published) {
        let listening = self.tx.receiver_count() > 0;
        let slots = self.control.cluster.slots();
        let nodes_changed = slots.len() != p.slots.len() || slots.iter().zip(&p.slots).any(|(a, b)| !Arc::ptr_eq(a, b));
        if nodes_changed {
            if listening {
                let c = node_changes(&p.slots, &slots);
                for f in node_frames(&c.rows, c.removed.iter().map(NodeId::as_str).collect()) {
                    self.send("nodes", f);
                }
            }
            p.counts.update(&slots);
            p.slots = slots.clone();
        }

        // Apps.
        let mut units_changed = false;
        let mut seen = std::collections::BTreeSet::new();
        let remote = self.remote.lock_or_recover().clone();
        for (name, endpoint) in self.control.apps.endpoints() {
            let key = match &endpoint {
                Ok(h) => {
                    let routes = h.routes().borrow().clone();
                    let capacity = h.capacity().borrow().clone();
                    AppKey::Local(h.status(), h.decisions(), routes, capacity)
                }
                Err(_) => match remote.get(&name) {
                    Some(v) => AppKey::Remote(v.clone()),
                    // Not fetched yet: it shows once it is.
                    None => continue,
                },
            };
            seen.insert(name.clone());
            if p.apps.get(&name).is_some_and(|a| a.key.same(&key)) {
                continue;
            }
            let mut units = UnitsByDomain::new();
            let f = match &key {
                AppKey::Local(status, decisions, routes, capacity) => {
                    count_local(status, &mut units);
                    frame("app", &local_app(&name, status, decisions, routes, capacity))
                }
                AppKey::Remote(v) => {
                    count_remote(&v["units"], &mut units);
                    frame("app", v.as_ref())
                }
            };
            let same = p.apps.get(&name).is_some_and(|a| a.frame == f);
            units_changed |= p.apps.get(&name).is_none_or(|a| a.units != units);
            if !same {
                self.send("app", f.clone());
            }
            p.apps.insert(name, AppSeen { key, frame: f, units });
        }
        let gone: Vec<String> = p.apps.keys().filter(|n| !seen.contains(*n)).cloned().collect();
        for name in gone {
            p.apps.remove(&name);
            units_changed = true;
            self.send("app_removed", frame("app_removed", &json!({"app": name})));
        }

        // Federation: when the view or the units changed, and every FEDERATION_REFRESH.
        let due = p.federation.as_ref().is_none_or(|(_, at)| at.elapsed() >= FEDERATION_REFRESH);
        if nodes_changed || units_changed || due {
            let mut units = UnitsByDomain::new();
            for a in p.apps.values() {
                for (k, n) in &a.units {
                    *units.entry(k.clone()).or_default() += n;
                }
            }
            let v = p.counts.summary(&self.control.shards, &units, flotilla_core::now_ms());
            let f = frame("federation", &v);
            if p.federation.as_ref().is_none_or(|(old, _)| *old != f) {
                self.send("federation", f.clone());
            }
            p.federation = Some((f, Instant::now()));
        }

        // Pools.
        let versions = self.control.pools.versions();
        for (name, version) in &versions {
            if p.pools.get(name).is_some_and(|(v, _)| v == version) {
                continue;
            }
            if let Some(row) = self.control.pools.row_of(name) {
                let f = frame("pool", &row);
                self.send("pool", f.clone());
                p.pools.insert(name.clone(), (*version, f));
            }
        }
    }

    /// Subscribes: the snapshot that the broadcast continues from comes on the second
    /// receiver, each frame as soon as it is built (the page applies the first node
    /// chunks while the rest are built), and the receiver closes after `snapshot_end`.
    async fn snapshot(self: &Arc<Self>) -> (broadcast::Receiver<Frame>, mpsc::Receiver<Frame>) {
        let (rx, slots, cached, rest) = {
            let mut p = self.published.lock_or_recover();
            self.tick_locked(&mut p);
            let rx = self.tx.subscribe();
            let mut rest: Vec<Frame> = p.federation.iter().map(|(f, _)| f.clone()).collect();
            rest.extend(p.apps.values().map(|a| a.frame.clone()));
            rest.extend(p.pools.values().map(|(_, f)| f.clone()));
            count("federation", usize::from(p.federation.is_some()));
            count("app", p.apps.len());
            count("pool", p.pools.len());
            (rx, p.slots.clone(), p.snapshot_nodes.clone(), rest)
        };
        let (tx, frames) = mpsc::channel(SNAPSHOT_AHEAD);
        let hub = Arc::clone(self);
        // Up to 100,000 rows: off the async workers. A subscriber that goes stops it.
        tokio::task::spawn_blocking(move || {
            let mut send = |f: Frame| tx.blocking_send(f).is_ok();
            let total: usize = slots.iter().map(|s| s.view.len()).sum();
            if !send(frame("snapshot_begin", &json!({"nodes_total": total, "ui": crate::ui::BUILD}))) {
                return;
            }
            let Some((sent, built)) = snapshot_nodes(cached, &slots, &mut send) else { return };
            if let Some(b) = built {
                hub.published.lock_or_recover().snapshot_nodes = Some(b);
            }
            if rest.into_iter().all(&mut send) && send(frame("snapshot_end", &json!({}))) {
                count("snapshot_begin", 1);
                count("nodes", sent);
                count("snapshot_end", 1);
                metrics::counter!(m::EVENTS_SNAPSHOTS.name).increment(1);
            }
        });
        (rx, frames)
    }

    /// Fetches every standalone scheduler's apps (one fetch round at a time): one
    /// request per scheduler process for all the apps registered at its URL.
    fn fetch_remote(self: &Arc<Self>) {
        let mut by_url: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for (app, e) in self.control.apps.endpoints() {
            if let Err(url) = e {
                by_url.entry(url).or_default().push(app);
            }
        }
        if by_url.is_empty() {
            self.remote.lock_or_recover().clear();
            return;
        }
        if self.fetching.swap(true, Ordering::SeqCst) {
            return;
        }
        let hub = self.clone();
        tokio::spawn(async move {
            // Every process at once: one that does not answer delays no other.
            let fetches: Vec<_> = by_url
                .into_iter()
                .map(|(url, apps)| {
                    let http = hub.control.http.clone();
                    tokio::spawn(async move { fetch_apps(&http, &url, apps).await })
                })
                .collect();
            let mut fetched = BTreeMap::new();
            for fetch in fetches {
                for (app, v) in fetch.await.unwrap_or_default() {
                    // Unchanged: keep the old Arc, so the tick sees no change.
                    let old = hub.remote.lock_or_recover().get(&app).cloned();
                    let v = match old {
                        Some(o) if *o == v => o,
                        _ => Arc::new(v),
                    };
                    fetched.insert(app, v);
                }
            }
            *hub.remote.lock_or_recover() = fetched;
            hub.fetching.store(false, Ordering::SeqCst);
        });
    }
}

/// The hub's loop: a tick every [`TICK`] while anyone listens; ends with the hub.
async fn run(hub: Weak<Hub>) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut fetched_at: Option<Instant> = None;
    loop {
        tick.tick().await;
        let Some(hub) = hub.upgrade() else { return };
        if hub.subscribers.load(Ordering::SeqCst) == 0 {
            continue;
        }
        if fetched_at.is_none_or(|at| at.elapsed() >= REMOTE_EVERY) {
            fetched_at = Some(Instant::now());
            hub.fetch_remote();
        }
        let started = Instant::now();
        hub.tick_locked(&mut hub.published.lock_or_recover());
        metrics::histogram!(m::EVENTS_TICK_SECONDS.name).record(started.elapsed().as_secs_f64());
    }
}

/// Most node changes sent after the last build's chunks rather than building anew: as many
/// as one chunk holds.
const CATCH_UP_MOST: usize = columns::SNAPSHOT_CHUNK;

/// How often [`keep_built`] looks.
const KEEP_BUILT_EVERY: Duration = Duration::from_secs(5);

/// Builds a snapshot's node chunks in the background when there are none or the changes
/// since outgrow half of [`CATCH_UP_MOST`], so that a dashboard opened at any time gets
/// a resend and a short catch-up rather than waiting for a build. At 100,000 nodes a
/// build is ~40 ms of CPU, at most one every [`KEEP_BUILT_EVERY`] (under 1 % of a core),
/// and only as often as that many nodes change.
async fn keep_built(hub: Weak<Hub>) {
    let mut every = tokio::time::interval(KEEP_BUILT_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(h) = hub.upgrade() else { return };
        let slots = h.control.cluster.slots();
        let cached = h.published.lock_or_recover().snapshot_nodes.clone();
        drop(h);
        let hub = hub.clone();
        let _ = tokio::task::spawn_blocking(move || {
            let stale = match &cached {
                None => slots.iter().any(|s| !s.view.is_empty()),
                Some(b) => {
                    let c = node_changes(&b.slots, &slots);
                    c.rows.len() + c.removed.len() > CATCH_UP_MOST / 2
                }
            };
            if let (true, Some(h)) = (stale, hub.upgrade())
                && let Some(b) = build(&slots, |_| true)
            {
                h.published.lock_or_recover().snapshot_nodes = Some(b);
            }
        })
        .await;
    }
}

/// Snapshot frames built ahead of what the subscriber's queue took.
const SNAPSHOT_AHEAD: usize = 4;

/// Sends the node chunks of a snapshot of `slots`: `cached`'s and the changes since when
/// those are few, else built anew, each as it is built. How many it sent, and what it
/// built (to be kept); None when `send` refused one (the subscriber went).
fn snapshot_nodes(
    cached: Option<Built>,
    slots: &[Arc<ShardSlot>],
    send: &mut impl FnMut(Frame) -> bool,
) -> Option<(usize, Option<Built>)> {
    if let Some(b) = cached {
        let c = node_changes(&b.slots, slots);
        if c.rows.len() + c.removed.len() <= CATCH_UP_MOST {
            let changes = node_frames(&c.rows, c.removed.iter().map(NodeId::as_str).collect());
            let sent = b.frames.len() + changes.len();
            return b.frames.iter().cloned().chain(changes).all(send).then_some((sent, None));
        }
    }
    let b = build(slots, |f| send(f.clone()))?;
    Some((b.frames.len(), Some(b)))
}

/// Builds the node chunks of `slots`, handing each to `each` as it is made; None once
/// `each` says stop.
fn build(slots: &[Arc<ShardSlot>], each: impl FnMut(&Frame) -> bool) -> Option<Built> {
    metrics::counter!(m::EVENTS_SNAPSHOT_BUILDS.name).increment(1);
    let frames = snapshot_chunks(slots, each)?;
    Some(Built { slots: slots.to_vec(), frames: Arc::new(frames) })
}

/// One browser's stream: its snapshot, then the broadcast, pings in between; a fresh
/// snapshot when it fell behind. Ends when the browser goes.
async fn feed(hub: Arc<Hub>, out: mpsc::Sender<Result<Frame, Infallible>>, _admitted: Admitted) {
    let ping = frame("ping", &json!({}));
    'snapshot: loop {
        let (mut rx, mut snapshot) = hub.snapshot().await;
        let mut ended = false;
        while let Some(f) = snapshot.recv().await {
            ended = f.starts_with(b"event: snapshot_end");
            if !deliver(&out, f, STALL).await {
                return;
            }
        }
        if !ended {
            // Its builder failed: end the stream, and the browser reconnects.
            return;
        }
        let mut pings = tokio::time::interval_at(tokio::time::Instant::now() + PING, PING);
        loop {
            let f = tokio::select! {
                r = rx.recv() => match r {
                    Ok(f) => f,
                    Err(broadcast::error::RecvError::Lagged(n)) => {
                        tracing::debug!(missed = n, "an events subscriber fell behind; sending a new snapshot");
                        metrics::counter!(m::EVENTS_LAGGED.name).increment(1);
                        continue 'snapshot;
                    }
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = pings.tick() => {
                    count("ping", 1);
                    ping.clone()
                }
                _ = out.closed() => return,
            };
            if !deliver(&out, f, STALL).await {
                return;
            }
        }
    }
}

/// Queues `f` for the subscriber; false when it is gone, or took nothing for `stall`
/// (then it is dropped, and counted).
async fn deliver(out: &mpsc::Sender<Result<Frame, Infallible>>, f: Frame, stall: Duration) -> bool {
    match tokio::time::timeout(stall, out.send(Ok(f))).await {
        Ok(sent) => sent.is_ok(),
        Err(_) => {
            tracing::debug!(?stall, "an events subscriber read nothing; dropping it");
            metrics::counter!(m::EVENTS_STALLED.name).increment(1);
            false
        }
    }
}

pub fn routes(hub: Arc<Hub>) -> axum::Router {
    axum::Router::new().route("/v1/events", axum::routing::get(events)).with_state(hub)
}

/// `GET /v1/events`: the stream (`text/event-stream`). At most [`MAX_SUBSCRIBERS`] at
/// once and [`MAX_PER_PEER`] from one address; more are refused (429) and counted.
#[tracing::instrument(name = "events", skip_all)]
#[utoipa::path(get, path = "/v1/events", tag = "nodes",
    responses((status = 200, description = "the dashboard's stream: `snapshot_begin`, `nodes`, `federation`, `app`, `pool`, `snapshot_end`, then the changes and `ping`", content_type = "text/event-stream", body = String),
              (status = 429, description = "`too_many_subscribers`", body = crate::answers::ErrorBody)))]
pub(crate) async fn events(State(hub): State<Arc<Hub>>, req: axum::extract::Request) -> Result<Response, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/events").increment(1);
    let peer = req.extensions().get::<axum::extract::ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip());
    let admitted = hub.admit(peer)?;
    let (tx, rx) = mpsc::channel(SUBSCRIBER_QUEUE);
    tokio::spawn(feed(hub, tx, admitted));
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    Ok((
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
            (header::HeaderName::from_static("x-accel-buffering"), "no"),
        ],
        body,
    )
        .into_response())
}

/// Node records and shard slots for the builders' tests.
#[cfg(test)]
mod fixtures {
    use std::sync::Arc;

    use flotilla_core::{Labels, NodeId, Resources};
    use flotilla_view::{NodeRecord, ShardSlot, ShardView};

    /// A node of `domain` with 4 cores, 8 GiB and a GPU, one core and 1 GiB allocated.
    pub fn node(id: &str, domain: &str, health_millis: u16) -> Arc<NodeRecord> {
        let mut r = NodeRecord::blank(NodeId::new(id).unwrap());
        let mut l = Labels::new();
        l.insert("domain", domain).unwrap();
        r.labels = Arc::new(l);
        r.health_millis = health_millis;
        r.capacity = Resources::new(4000, 8 << 30, 1).into();
        r.allocated = Resources::new(1000, 1 << 30, 0).into();
        Arc::new(r)
    }

    /// Shard `shard`'s view at `seq` with `nodes`, last heard at 1,000 ms.
    pub fn slot(shard: u32, seq: u64, nodes: &[Arc<NodeRecord>], connected: bool) -> Arc<ShardSlot> {
        let mut v = ShardView::empty(shard, 1);
        v.version.seq = seq;
        for n in nodes {
            v.insert(n.clone());
        }
        Arc::new(ShardSlot { updated_unix_ms: 1_000, ..ShardSlot::of(Arc::new(v), connected) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The nodes of a `nodes` frame's JSON, by id: its health, or None when removed.
    fn apply(frames: &[Frame], out: &mut BTreeMap<String, Option<f64>>) {
        for f in frames {
            let text = std::str::from_utf8(f).unwrap();
            let v: Value = serde_json::from_str(text.strip_prefix("event: nodes\ndata: ").unwrap().trim_end()).unwrap();
            for (id, h) in v["id"].as_array().unwrap().iter().zip(v["health"].as_array().unwrap()) {
                out.insert(id.as_str().unwrap().to_owned(), h.as_f64());
            }
            for id in v["removed"].as_array().unwrap() {
                out.insert(id.as_str().unwrap().to_owned(), None);
            }
        }
    }

    /// `snapshot_nodes` with a subscriber that takes everything.
    fn nodes_of(cached: Option<Built>, slots: &[Arc<ShardSlot>]) -> (Vec<Frame>, Option<Built>) {
        let mut frames = Vec::new();
        let (sent, built) = snapshot_nodes(cached, slots, &mut |f| {
            frames.push(f);
            true
        })
        .expect("taken");
        assert_eq!(sent, frames.len());
        (frames, built)
    }

    /// Issue #42 item 4: a snapshot resends the last build's chunks with the changes
    /// since, which the page applies to the same nodes a fresh build shows; past
    /// [`CATCH_UP_MOST`] changes it builds anew.
    #[test]
    fn a_snapshot_is_the_last_build_and_the_changes_since_while_they_are_few() {
        use fixtures::{node, slot};
        let first = [node("a", "x", 500), node("b", "x", 500), node("c", "y", 500)];
        let (frames, built) = nodes_of(None, &[slot(0, 1, &first, true)]);
        let built = built.expect("nothing to resend: built");
        assert_eq!(frames.len(), 1);

        // b changed, c left, d joined.
        let now = [node("a", "x", 500), node("b", "x", 900), node("d", "y", 500)];
        let slots = [slot(0, 2, &now, true)];
        let (frames, again) = nodes_of(Some(built.clone()), &slots);
        assert!(again.is_none(), "a few changes: the last build resent");
        assert_eq!(frames.len(), 2, "its chunk, then the changes");
        assert_eq!(frames[0], built.frames[0]);
        let mut caught_up = BTreeMap::new();
        apply(&frames, &mut caught_up);
        caught_up.retain(|_, h| h.is_some());
        let mut fresh = BTreeMap::new();
        apply(&nodes_of(None, &slots).0, &mut fresh);
        assert_eq!(caught_up, fresh);
        assert_eq!(fresh.keys().collect::<Vec<_>>(), ["a", "b", "d"]);

        // More changes than one chunk holds: built anew.
        let many: Vec<_> = (0..=CATCH_UP_MOST).map(|i| node(&format!("n{i:05}"), "x", 500)).collect();
        let many = [slot(0, 3, &many, true)];
        let (frames, again) = nodes_of(Some(built.clone()), &many);
        assert!(again.is_some(), "{} changes: built anew", CATCH_UP_MOST + 4);
        assert_eq!(frames.len(), 2, "two chunks");
        let mut rebuilt = BTreeMap::new();
        apply(&frames, &mut rebuilt);
        assert_eq!(rebuilt.len(), CATCH_UP_MOST + 1);

        // A subscriber that goes after the first chunk stops the build: nothing is kept.
        let mut taken = 0;
        let stopped = snapshot_nodes(Some(built), &many, &mut |_| {
            taken += 1;
            taken < 2
        });
        assert!(stopped.is_none());
        assert_eq!(taken, 2, "the second chunk was refused, and nothing built after it");
    }

    /// Issue #35 item 2: a subscriber that reads nothing is dropped once its queue has
    /// stayed full for the stall time; one that reads is not.
    #[tokio::test]
    async fn a_subscriber_that_reads_nothing_is_dropped_after_the_stall_time() {
        let stall = Duration::from_millis(100);
        let (tx, mut rx) = mpsc::channel(1);
        let f = || frame("ping", &json!({}));
        assert!(deliver(&tx, f(), stall).await, "room in the queue");
        let started = Instant::now();
        assert!(!deliver(&tx, f(), stall).await, "full, and nobody reads");
        assert!(started.elapsed() >= stall);
        // One that reads within the stall time keeps its stream.
        let reader = tokio::spawn(async move {
            tokio::time::sleep(stall / 4).await;
            let first = rx.recv().await;
            (first, rx.recv().await)
        });
        assert!(deliver(&tx, f(), stall).await);
        let (first, second) = reader.await.unwrap();
        assert!(first.is_some() && second.is_some());
    }
}
