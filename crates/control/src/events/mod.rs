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
use bytes::Bytes;
use flotilla_core::{NodeId, NodeStatus};
use flotilla_view::{NodeRecord, ShardSlot};
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::apps::{route_rows, unit_rows};
use crate::{ControlError, ControlState};

/// Shortest time between two ticks of the hub.
pub const TICK: Duration = Duration::from_millis(250);
/// How often an idle stream carries a `ping`.
pub const PING: Duration = Duration::from_secs(15);
/// Most browsers (streams) one control plane serves at once.
pub const MAX_SUBSCRIBERS: usize = 256;
/// Most rows in one `nodes` message.
pub const SNAPSHOT_CHUNK: usize = 5_000;
/// How often standalone schedulers' apps are fetched.
pub const REMOTE_EVERY: Duration = Duration::from_secs(2);
/// The federation summary is re-sent at least this often (its shards'
/// `updated_ms_ago` age even when nothing else changes).
pub const FEDERATION_REFRESH: Duration = Duration::from_secs(5);
/// Decisions an `app` message carries (newest first).
pub const DECISIONS_SHOWN: usize = 20;
/// Frames the broadcast holds for a slow subscriber before it must start over.
const BROADCAST_CAPACITY: usize = 1024;
/// Frames queued per subscriber connection.
const SUBSCRIBER_QUEUE: usize = 64;

/// One SSE message, serialised once and shared by every subscriber.
type Frame = Bytes;

/// `event: NAME` and `data: JSON` (compact JSON has no newline), then a blank line.
pub fn frame(event: &'static str, data: &impl Serialize) -> Frame {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(b"event: ");
    out.extend_from_slice(event.as_bytes());
    out.extend_from_slice(b"\ndata: ");
    if serde_json::to_writer(&mut out, data).is_err() {
        // Only a map with non-string keys fails, which none of ours has.
        out.extend_from_slice(b"null");
    }
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// Counts `n` messages of `event` sent (a broadcast one counts once, whatever the
/// number of subscribers).
fn count(event: &'static str, n: usize) {
    metrics::counter!(m::EVENTS_MESSAGES.name, "event" => event).increment(n as u64);
}

/// The compact node row of the stream: `[node_id, status, shard, domain, priority,
/// health_score, cpu_cap_millis, cpu_alloc_millis, mem_cap_bytes, mem_alloc_bytes,
/// gpu_cap, gpu_alloc, cordoned, drain_requested, incarnation]`.
#[allow(clippy::type_complexity)]
pub fn compact_row(
    r: &NodeRecord,
    connected: bool,
) -> (&str, &'static str, u32, &str, &str, f32, u64, u64, u64, u64, u32, u32, bool, bool, u64) {
    (
        r.node_id.as_str(),
        status_of(r, connected).as_str(),
        r.shard,
        r.labels.domain(),
        priority_of(r),
        r.health_score(),
        r.capacity.cpu_millis,
        r.allocated.cpu_millis,
        r.capacity.memory_bytes,
        r.allocated.memory_bytes,
        r.capacity.gpu,
        r.allocated.gpu,
        r.cordoned,
        r.drain_requested,
        r.incarnation.0,
    )
}

/// A node whose shard cannot be heard is Unknown (as in `GET /v1/nodes`).
pub fn status_of(r: &NodeRecord, connected: bool) -> NodeStatus {
    if connected { r.status } else { NodeStatus::Unknown }
}

/// The node's `priority` label, `high` when unset.
pub fn priority_of(r: &NodeRecord) -> &str {
    r.labels.get("priority").unwrap_or("high")
}

/// What changed in the nodes between two states of the cluster.
#[derive(Debug, Default, PartialEq)]
pub struct NodeChanges {
    /// Added or changed nodes, with whether their shard is heard.
    pub rows: Vec<(Arc<NodeRecord>, bool)>,
    pub removed: Vec<NodeId>,
}

/// The node rows to send after `prev` (what was last published; shorter or empty at
/// first) became `cur`. A shard whose slot is the same `Arc` is skipped; a shard whose
/// connection flipped resends every row (their status shows it); otherwise the view's
/// node maps are diffed. A node that moved between shards is a row, never removed.
pub fn node_changes(prev: &[Arc<ShardSlot>], cur: &[Arc<ShardSlot>]) -> NodeChanges {
    let mut out = NodeChanges::default();
    for (i, c) in cur.iter().enumerate() {
        let p = prev.get(i);
        if p.is_some_and(|p| Arc::ptr_eq(p, c)) {
            continue;
        }
        match p {
            Some(p) if p.connected == c.connected => {
                if Arc::ptr_eq(&p.view, &c.view) {
                    continue;
                }
                for d in p.view.nodes.diff(&c.view.nodes) {
                    match d {
                        imbl::ordmap::DiffItem::Add(_, r) | imbl::ordmap::DiffItem::Update { new: (_, r), .. } => {
                            out.rows.push((r.clone(), c.connected))
                        }
                        imbl::ordmap::DiffItem::Remove(k, _) => out.removed.push(k.id().clone()),
                    }
                }
            }
            _ => {
                out.rows.extend(c.view.nodes.values().map(|r| (r.clone(), c.connected)));
                if let Some(p) = p {
                    out.removed
                        .extend(p.view.nodes.keys().map(|k| k.id()).filter(|id| c.view.get(id).is_none()).cloned());
                }
            }
        }
    }
    // Shards that went away (never, in practice: the shard list is fixed).
    for p in prev.iter().skip(cur.len()) {
        out.removed.extend(p.view.nodes.keys().map(|k| k.id().clone()));
    }
    if !out.removed.is_empty() && !out.rows.is_empty() {
        let moved: std::collections::HashSet<&NodeId> = out.rows.iter().map(|(r, _)| &r.node_id).collect();
        let removed = std::mem::take(&mut out.removed);
        out.removed = removed.into_iter().filter(|id| !moved.contains(id)).collect();
    }
    out
}

/// `{"cpu_millis","memory_bytes","gpu"}`, summed.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq)]
pub struct Res {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub gpu: u64,
}

impl Res {
    fn add(&mut self, r: &flotilla_core::Resources) {
        self.cpu_millis = self.cpu_millis.saturating_add(r.cpu_millis);
        self.memory_bytes = self.memory_bytes.saturating_add(r.memory_bytes);
        self.gpu = self.gpu.saturating_add(u64::from(r.gpu));
    }
}

/// One failure domain on one shard, as the federation summary shows it.
#[derive(Debug, Default, Serialize, PartialEq)]
pub struct DomainSummary {
    pub domain: String,
    pub shard: u32,
    /// Node counts by status.
    pub nodes: BTreeMap<&'static str, u64>,
    /// Node counts by `priority` label (`high` and `low` always present).
    pub priority: BTreeMap<String, u64>,
    /// Node counts by health score: 0–0.1, 0.1–0.2, … 0.9–1.0 (1.0 in the last).
    pub health: [u64; 10],
    /// Live units of every app placed in the domain (on this shard).
    pub units: u64,
    /// Of every node in the view, whatever its status.
    pub capacity: Res,
    pub allocated: Res,
}

/// Live units by (domain, shard of their first member, when known).
pub type UnitsByDomain = BTreeMap<(String, Option<u32>), u64>;

/// The `federation` message: every (domain, shard) and every shard, from the slots
/// (`now_ms` ages the shards' views). Units whose shard is unknown count in their
/// domain's lowest shard.
pub fn federation(slots: &[Arc<ShardSlot>], addresses: &[String], units: &UnitsByDomain, now_ms: u64) -> Value {
    let mut domains: BTreeMap<(String, u32), DomainSummary> = BTreeMap::new();
    for slot in slots {
        for r in slot.view.nodes.values() {
            let d = domains.entry((r.labels.domain().to_string(), slot.view.shard)).or_insert_with(|| DomainSummary {
                domain: r.labels.domain().to_string(),
                shard: slot.view.shard,
                priority: [("high".to_string(), 0), ("low".to_string(), 0)].into(),
                ..Default::default()
            });
            *d.nodes.entry(status_of(r, slot.connected).as_str()).or_default() += 1;
            *d.priority.entry(priority_of(r).to_string()).or_default() += 1;
            let bucket = ((r.health_score() * 10.0) as usize).min(9);
            d.health[bucket] += 1;
            d.capacity.add(&r.capacity);
            d.allocated.add(&r.allocated);
        }
    }
    let mut lowest: BTreeMap<&str, u32> = BTreeMap::new();
    for (d, s) in domains.keys() {
        lowest.entry(d.as_str()).or_insert(*s);
    }
    let mut placed: BTreeMap<(String, u32), u64> = BTreeMap::new();
    for ((d, s), n) in units {
        let shard = s.or_else(|| lowest.get(d.as_str()).copied());
        if let Some(shard) = shard {
            *placed.entry((d.clone(), shard)).or_default() += n;
        }
    }
    for (k, d) in domains.iter_mut() {
        d.units = placed.get(k).copied().unwrap_or(0);
    }
    let shards: Vec<Value> = slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let ago = (s.updated_unix_ms > 0).then(|| now_ms.saturating_sub(s.updated_unix_ms));
            json!({
                "shard": i,
                "address": addresses.get(i),
                "connected": s.connected,
                "epoch": s.view.version.epoch,
                "seq": s.view.version.seq,
                "nodes": s.view.len(),
                "updated_ms_ago": ago,
            })
        })
        .collect();
    json!({"domains": domains.into_values().collect::<Vec<_>>(), "shards": shards})
}

/// The `app` message of an in-process scheduler's app, from what `key` holds.
fn local_app(
    app: &str,
    status: &flotilla_scheduler::AppStatus,
    decisions: &[Arc<Value>],
    routes: &flotilla_proto::v1::RouteTable,
    capacity: &flotilla_proto::v1::Capacity,
) -> Value {
    json!({
        "app": app,
        "summary": crate::apps::summary(status),
        "units": unit_rows(status),
        "routes": route_rows(routes),
        "decisions": decisions.iter().take(DECISIONS_SHOWN).map(|d| d.as_ref()).collect::<Vec<_>>(),
        "capacity": crate::capacity_row(capacity),
    })
}

/// Live units of an app's status by domain and shard.
fn count_local(status: &flotilla_scheduler::AppStatus, into: &mut UnitsByDomain) {
    use flotilla_scheduler::UnitState::{Failed, Terminated};
    for u in status.units.iter().filter(|u| !matches!(u.state, Terminated | Failed)) {
        if let Some(d) = &u.domain {
            *into.entry((d.clone(), u.members.first().and_then(|m| m.shard))).or_default() += 1;
        }
    }
}

/// Live units of a standalone scheduler's `units` rows by domain (their shard unknown).
fn count_remote(units: &Value, into: &mut UnitsByDomain) {
    for u in units.as_array().into_iter().flatten() {
        let live = !matches!(u.get("state").and_then(Value::as_str), Some("terminated" | "failed"));
        if let (true, Some(d)) = (live, u.get("domain").and_then(Value::as_str)) {
            *into.entry((d.to_string(), None)).or_default() += 1;
        }
    }
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
    apps: BTreeMap<String, AppSeen>,
    pools: BTreeMap<String, (u64, Frame)>,
    /// The node chunks of a snapshot of `slots`, once a subscriber built them.
    snapshot_nodes: Option<Arc<Vec<Frame>>>,
}

/// The shared producer of the stream (see the module doc).
pub struct Hub {
    control: Arc<ControlState>,
    published: Mutex<Published>,
    tx: broadcast::Sender<Frame>,
    subscribers: AtomicUsize,
    started: AtomicBool,
    /// Standalone schedulers' apps as last fetched, by name.
    remote: Mutex<BTreeMap<String, Arc<Value>>>,
    fetching: AtomicBool,
}

/// A subscriber's place; gives it back when its stream ends.
struct Admitted(Arc<Hub>);

impl Drop for Admitted {
    fn drop(&mut self) {
        let n = self.0.subscribers.fetch_sub(1, Ordering::SeqCst) - 1;
        metrics::gauge!(m::EVENTS_SUBSCRIBERS.name).set(n as f64);
    }
}

impl Hub {
    pub fn new(control: Arc<ControlState>) -> Arc<Hub> {
        Arc::new(Hub {
            control,
            published: Mutex::new(Published::default()),
            tx: broadcast::channel(BROADCAST_CAPACITY).0,
            subscribers: AtomicUsize::new(0),
            started: AtomicBool::new(false),
            remote: Mutex::new(BTreeMap::new()),
            fetching: AtomicBool::new(false),
        })
    }

    fn admit(self: &Arc<Self>) -> Result<Admitted, ControlError> {
        let n = self.subscribers.fetch_add(1, Ordering::SeqCst);
        let admitted = Admitted(self.clone());
        if n >= MAX_SUBSCRIBERS {
            crate::limits::rejected("too_many_subscribers");
            return Err(ControlError::TooManySubscribers { max: MAX_SUBSCRIBERS });
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
            p.slots = slots.clone();
            p.snapshot_nodes = None;
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
            let v = federation(&p.slots, &self.control.shards, &units, flotilla_core::now_ms());
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

    /// Subscribes, and returns the snapshot that the broadcast continues from.
    async fn snapshot(self: &Arc<Self>) -> (broadcast::Receiver<Frame>, Vec<Frame>) {
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
        let nodes = match cached {
            Some(n) => n,
            None => {
                // Up to 100,000 rows: off the async workers.
                let s = slots.clone();
                let built = tokio::task::spawn_blocking(move || Arc::new(snapshot_chunks(&s))).await;
                let built = built.unwrap_or_else(|_| Arc::new(snapshot_chunks(&slots)));
                let mut p = self.published.lock_or_recover();
                let same = p.slots.len() == slots.len() && p.slots.iter().zip(&slots).all(|(a, b)| Arc::ptr_eq(a, b));
                if same {
                    p.snapshot_nodes = Some(built.clone());
                }
                built
            }
        };
        let total: usize = slots.iter().map(|s| s.view.len()).sum();
        let mut out = Vec::with_capacity(nodes.len() + rest.len() + 2);
        out.push(frame("snapshot_begin", &json!({"nodes_total": total})));
        out.extend(nodes.iter().cloned());
        out.extend(rest);
        out.push(frame("snapshot_end", &json!({})));
        count("snapshot_begin", 1);
        count("nodes", nodes.len());
        count("snapshot_end", 1);
        metrics::counter!(m::EVENTS_SNAPSHOTS.name).increment(1);
        (rx, out)
    }

    /// Fetches every standalone scheduler's app (one fetch round at a time).
    fn fetch_remote(self: &Arc<Self>) {
        let remotes: Vec<(String, String)> =
            self.control.apps.endpoints().into_iter().filter_map(|(n, e)| e.err().map(|u| (n, u))).collect();
        if remotes.is_empty() {
            self.remote.lock_or_recover().clear();
            return;
        }
        if self.fetching.swap(true, Ordering::SeqCst) {
            return;
        }
        let hub = self.clone();
        tokio::spawn(async move {
            // Every scheduler at once: one that does not answer delays no other.
            let fetches: Vec<_> = remotes
                .into_iter()
                .map(|(app, url)| {
                    let http = hub.control.http.clone();
                    let name = app.clone();
                    (app, tokio::spawn(async move { fetch_app(&http, &name, &url).await.map_err(|e| (url, e)) }))
                })
                .collect();
            let mut fetched = BTreeMap::new();
            for (app, fetch) in fetches {
                let v = match fetch.await {
                    Ok(Ok(v)) => v,
                    // Shown as unreachable (with the error), not dropped or left stale.
                    Ok(Err((url, e))) => {
                        tracing::debug!(app, error = %e, "fetching a standalone scheduler's app for the stream");
                        unreachable_app(&app, &url, &e)
                    }
                    Err(_) => continue,
                };
                // Unchanged: keep the old Arc, so the tick sees no change.
                let old = hub.remote.lock_or_recover().get(&app).cloned();
                let v = match old {
                    Some(o) if *o == v => o,
                    _ => Arc::new(v),
                };
                fetched.insert(app, v);
            }
            *hub.remote.lock_or_recover() = fetched;
            hub.fetching.store(false, Ordering::SeqCst);
        });
    }
}

/// The five reads of an app from its standalone scheduler, as one `app` payload.
async fn fetch_app(http: &reqwest::Client, app: &str, url: &str) -> Result<Value, ControlError> {
    let get = |path: &'static str| {
        let path = format!("/v1/apps/{app}{path}");
        async move { crate::apps::remote(http, url, &path).await }
    };
    let (summary, units, routes, decisions, capacity) =
        tokio::join!(get(""), get("/units"), get("/routes"), get("/decisions"), get("/capacity"));
    let (mut summary, units, routes, decisions, capacity) = (summary?, units?, routes?, decisions?, capacity?);
    if summary.get("scheduler_url").is_none_or(Value::is_null) {
        summary["scheduler_url"] = json!(url);
    }
    let decisions: Vec<Value> = decisions.as_array().into_iter().flatten().take(DECISIONS_SHOWN).cloned().collect();
    Ok(json!({"app": app, "summary": summary, "units": units, "routes": routes, "decisions": decisions,
              "capacity": capacity}))
}

/// The `app` payload of an app whose standalone scheduler did not answer: its summary is
/// the unreachable row of `GET /v1/apps`, and it has no units, routes or decisions.
fn unreachable_app(app: &str, url: &str, e: &ControlError) -> Value {
    json!({"app": app, "summary": crate::apps::unreachable_row(app, url, e), "units": [],
           "routes": {"app": app, "routes": []}, "decisions": [], "capacity": null})
}

/// `nodes` messages of at most [`SNAPSHOT_CHUNK`] rows; the removed ids go in the last.
fn node_frames(rows: &[(Arc<NodeRecord>, bool)], removed: Vec<&str>) -> Vec<Frame> {
    if rows.is_empty() && removed.is_empty() {
        return Vec::new();
    }
    let chunks: Vec<&[(Arc<NodeRecord>, bool)]> =
        if rows.is_empty() { vec![&[]] } else { rows.chunks(SNAPSHOT_CHUNK).collect() };
    let last = chunks.len() - 1;
    let empty: Vec<&str> = Vec::new();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            // Serialised straight from the rows, with no serde_json::Value in between (at
            // 100,000 nodes the snapshot's first byte went from ~400 to ~100 ms); keys in
            // the order json! wrote them.
            #[derive(Serialize)]
            struct Nodes<'a, R> {
                removed: &'a [&'a str],
                rows: Vec<R>,
            }
            let rows: Vec<_> = c.iter().map(|(r, connected)| compact_row(r, *connected)).collect();
            frame("nodes", &Nodes { removed: if i == last { &removed } else { &empty }, rows })
        })
        .collect()
}

/// Every node of `slots` as `nodes` messages.
fn snapshot_chunks(slots: &[Arc<ShardSlot>]) -> Vec<Frame> {
    let rows: Vec<(Arc<NodeRecord>, bool)> =
        slots.iter().flat_map(|s| s.view.nodes.values().map(|r| (r.clone(), s.connected))).collect();
    if rows.is_empty() {
        return Vec::new();
    }
    node_frames(&rows, Vec::new())
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

/// One browser's stream: its snapshot, then the broadcast, pings in between; a fresh
/// snapshot when it fell behind. Ends when the browser goes.
async fn feed(hub: Arc<Hub>, out: mpsc::Sender<Result<Frame, Infallible>>, _admitted: Admitted) {
    let ping = frame("ping", &json!({}));
    'snapshot: loop {
        let (mut rx, snapshot) = hub.snapshot().await;
        for f in snapshot {
            if out.send(Ok(f)).await.is_err() {
                return;
            }
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
            if out.send(Ok(f)).await.is_err() {
                return;
            }
        }
    }
}

pub fn routes(hub: Arc<Hub>) -> axum::Router {
    axum::Router::new().route("/v1/events", axum::routing::get(events)).with_state(hub)
}

/// `GET /v1/events`: the stream (`text/event-stream`). At most [`MAX_SUBSCRIBERS`] at
/// once; more are refused (429) and counted.
#[tracing::instrument(name = "events", skip_all)]
async fn events(State(hub): State<Arc<Hub>>) -> Result<Response, ControlError> {
    metrics::counter!(m::API_REQUESTS.name, "route" => "/v1/events").increment(1);
    let admitted = hub.admit()?;
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

#[cfg(test)]
mod tests;
