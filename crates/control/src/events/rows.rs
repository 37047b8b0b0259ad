//! What the event stream says, as pure builders: the SSE frame, the compact node row,
//! which nodes changed between two states of the cluster, the federation summary and
//! each app's message. The hub (`mod.rs`) decides when to send them.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use flotilla_core::{NodeId, NodeStatus};
use flotilla_view::{NodeRecord, ShardSlot};
use serde::Serialize;
use serde_json::{Value, json};

use crate::ControlError;
use crate::apps::{route_rows, unit_rows};

/// Most rows in one `nodes` message.
pub const SNAPSHOT_CHUNK: usize = 5_000;
/// Decisions an `app` message carries (newest first).
pub const DECISIONS_SHOWN: usize = 20;

/// One SSE message, serialised once and shared by every subscriber.
pub type Frame = Bytes;

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

/// The compact node row of the stream: `[node_id, status, shard, domain, priority,
/// health_score, cpu_cap_millis, cpu_alloc_millis, mem_cap_bytes, mem_alloc_bytes,
/// gpu_cap, gpu_alloc, cordoned, drain_requested, incarnation, preempting]`; preempting
/// is the cloud's preemption notice (the node goes soon; its units are being replaced).
#[allow(clippy::type_complexity)]
pub fn compact_row(
    r: &NodeRecord,
    connected: bool,
) -> (&str, &'static str, u32, &str, &str, f32, u64, u64, u64, u64, u32, u32, bool, bool, u64, bool) {
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
        r.health.preemption_notice(),
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
pub(super) fn local_app(
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
pub(super) fn count_local(status: &flotilla_scheduler::AppStatus, into: &mut UnitsByDomain) {
    use flotilla_scheduler::UnitState::{Failed, Terminated};
    for u in status.units.iter().filter(|u| !matches!(u.state, Terminated | Failed)) {
        if let Some(d) = &u.domain {
            *into.entry((d.clone(), u.members.first().and_then(|m| m.shard))).or_default() += 1;
        }
    }
}

/// Live units of a standalone scheduler's `units` rows by domain (their shard unknown).
pub(super) fn count_remote(units: &Value, into: &mut UnitsByDomain) {
    for u in units.as_array().into_iter().flatten() {
        let live = !matches!(u.get("state").and_then(Value::as_str), Some("terminated" | "failed"));
        if let (true, Some(d)) = (live, u.get("domain").and_then(Value::as_str)) {
            *into.entry((d.to_string(), None)).or_default() += 1;
        }
    }
}

/// The five reads of an app from its standalone scheduler, as one `app` payload.
pub(super) async fn fetch_app(http: &reqwest::Client, app: &str, url: &str) -> Result<Value, ControlError> {
    let get = |path: &'static str| {
        let path = format!("/v1/apps/{app}{path}");
        async move { crate::forward::remote(http, url, &path).await }
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
pub(super) fn unreachable_app(app: &str, url: &str, e: &ControlError) -> Value {
    json!({"app": app, "summary": crate::forward::unreachable_row(app, url, e), "units": [],
           "routes": {"app": app, "routes": []}, "decisions": [], "capacity": null})
}

/// `nodes` messages of at most [`SNAPSHOT_CHUNK`] rows; the removed ids go in the last.
pub(super) fn node_frames(rows: &[(Arc<NodeRecord>, bool)], removed: Vec<&str>) -> Vec<Frame> {
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
pub(super) fn snapshot_chunks(slots: &[Arc<ShardSlot>]) -> Vec<Frame> {
    let rows: Vec<(Arc<NodeRecord>, bool)> =
        slots.iter().flat_map(|s| s.view.nodes.values().map(|r| (r.clone(), s.connected))).collect();
    if rows.is_empty() {
        return Vec::new();
    }
    node_frames(&rows, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::{Labels, Resources};
    use flotilla_view::ShardView;

    fn node(id: &str, domain: &str, health_millis: u16) -> Arc<NodeRecord> {
        let mut r = NodeRecord::blank(NodeId::new(id).unwrap());
        let mut l = Labels::new();
        l.insert("domain", domain).unwrap();
        r.labels = Arc::new(l);
        r.health_millis = health_millis;
        r.capacity = Resources::new(4000, 8 << 30, 1).into();
        r.allocated = Resources::new(1000, 1 << 30, 0).into();
        Arc::new(r)
    }

    fn slot(shard: u32, seq: u64, nodes: &[Arc<NodeRecord>], connected: bool) -> Arc<ShardSlot> {
        let mut v = ShardView::empty(shard, 1);
        v.version.seq = seq;
        for n in nodes {
            v.insert(n.clone());
        }
        Arc::new(ShardSlot { updated_unix_ms: 1_000, ..ShardSlot::of(Arc::new(v), connected) })
    }

    /// The ids of the rows and of the removed nodes, each sorted (the view is in hash order).
    fn ids(c: &NodeChanges) -> (Vec<&str>, Vec<&str>) {
        let mut rows: Vec<&str> = c.rows.iter().map(|(r, _)| r.node_id.as_str()).collect();
        let mut removed: Vec<&str> = c.removed.iter().map(NodeId::as_str).collect();
        rows.sort_unstable();
        removed.sort_unstable();
        (rows, removed)
    }

    #[test]
    fn only_what_changed_is_sent() {
        let (a, b, c) = (node("a", "x", 1000), node("b", "x", 1000), node("c", "y", 1000));
        let v1 = slot(0, 1, &[a.clone(), b.clone(), c.clone()], true);
        // From nothing: every row.
        assert_eq!(ids(&node_changes(&[], std::slice::from_ref(&v1))), (vec!["a", "b", "c"], vec![]));
        // The same slot: nothing.
        assert_eq!(node_changes(std::slice::from_ref(&v1), std::slice::from_ref(&v1)), NodeChanges::default());
        // b changed, c left, d joined; a is the same Arc.
        let b2 = node("b", "x", 400);
        let d = node("d", "y", 1000);
        let v2 = slot(0, 2, &[a.clone(), b2.clone(), d.clone()], true);
        let got = node_changes(std::slice::from_ref(&v1), std::slice::from_ref(&v2));
        assert_eq!(ids(&got), (vec!["b", "d"], vec!["c"]));
        assert!(got.rows.iter().any(|(r, _)| Arc::ptr_eq(r, &b2)));
        // The shard's stream dropped: every row again, Unknown.
        let v3 = slot(0, 2, &[a, b2, d], false);
        let got = node_changes(std::slice::from_ref(&v2), std::slice::from_ref(&v3));
        assert_eq!(ids(&got), (vec!["a", "b", "d"], vec![]));
        assert!(got.rows.iter().all(|(r, connected)| !connected && status_of(r, *connected) == NodeStatus::Unknown));
    }

    #[test]
    fn a_node_that_moves_shards_is_a_row_not_a_removal() {
        let n = node("m", "x", 1000);
        let mut moved = n.as_ref().clone();
        moved.shard = 1;
        let before = [slot(0, 1, &[n], true), slot(1, 1, &[], true)];
        let after = [slot(0, 2, &[], true), slot(1, 2, &[Arc::new(moved)], true)];
        let got = node_changes(&before, &after);
        assert_eq!(ids(&got), (vec!["m"], vec![]));
    }

    #[test]
    fn the_federation_summary_counts_by_domain_status_priority_and_health() {
        let mut low = node("l", "x", 950).as_ref().clone();
        let mut l = low.labels.as_ref().clone();
        l.insert("priority", "low").unwrap();
        low.labels = Arc::new(l);
        low.status = NodeStatus::Suspect;
        let slots = [
            slot(0, 3, &[node("a", "x", 1000), node("b", "x", 50), Arc::new(low)], true),
            slot(1, 7, &[node("c", "y", 500)], false),
        ];
        let units = UnitsByDomain::from([(("x".into(), Some(0)), 2), (("y".into(), None), 1)]);
        let v = federation(&slots, &["s0:1".into(), "s1:1".into()], &units, 3_500);
        let x = &v["domains"][0];
        assert_eq!((x["domain"].as_str(), x["shard"].as_u64()), (Some("x"), Some(0)));
        assert_eq!(x["nodes"], json!({"alive": 2, "suspect": 1}));
        assert_eq!(x["priority"], json!({"high": 2, "low": 1}));
        assert_eq!(x["health"], json!([1, 0, 0, 0, 0, 0, 0, 0, 0, 2]));
        assert_eq!(x["units"], 2);
        assert_eq!(x["capacity"], json!({"cpu_millis": 12000, "memory_bytes": 3u64 * (8 << 30), "gpu": 3}));
        assert_eq!(x["allocated"]["cpu_millis"], 3000);
        // A shard that cannot be heard: its nodes are Unknown; units of unknown shard
        // land in the domain's lowest shard.
        let y = &v["domains"][1];
        assert_eq!((y["nodes"].clone(), y["units"].clone()), (json!({"unknown": 1}), json!(1)));
        assert_eq!(y["health"][5], 1);
        assert_eq!(
            v["shards"][1],
            json!({"shard": 1, "address": "s1:1", "connected": false, "epoch": 1, "seq": 7, "nodes": 1,
                   "updated_ms_ago": 2500})
        );
    }

    #[test]
    fn frames_are_sse_and_rows_compact() {
        let f = frame("ping", &json!({}));
        assert_eq!(&f[..], b"event: ping\ndata: {}\n\n");
        let n = node("a", "x", 1000);
        let row = serde_json::to_value(compact_row(&n, true)).unwrap();
        assert_eq!(
            row,
            json!([
                "a",
                "alive",
                0,
                "x",
                "high",
                1.0,
                4000,
                1000,
                8u64 << 30,
                1u64 << 30,
                1,
                0,
                false,
                false,
                1,
                false
            ])
        );
        // A node its cloud gave notice is `preempting` (issue #34 item 6), alive still.
        let mut noticed = node("b", "x", 1000);
        Arc::make_mut(&mut noticed).health =
            flotilla_core::HealthSample { preemption_notice: true, ..Default::default() }.into();
        let row = serde_json::to_value(compact_row(&noticed, true)).unwrap();
        assert_eq!((&row[1], &row[15]), (&json!("alive"), &json!(true)));
        let rows: Vec<_> = (0..SNAPSHOT_CHUNK + 1).map(|i| (node(&format!("n{i}"), "x", 1000), true)).collect();
        let frames = node_frames(&rows, vec!["gone"]);
        assert_eq!(frames.len(), 2);
        let last = std::str::from_utf8(&frames[1]).unwrap();
        assert!(last.contains("\"removed\":[\"gone\"]"), "{last}");
        assert!(std::str::from_utf8(&frames[0]).unwrap().contains("\"removed\":[]"));
    }
}
