//! What the event stream says, as pure builders: the SSE frame, which nodes changed
//! between two states of the cluster, the units each app has by domain, and each app's
//! message (the `nodes` message is `columns.rs`, the `federation` message
//! `federation.rs`). The hub (`mod.rs`) decides when to send them.

use std::sync::Arc;

use bytes::Bytes;
use flotilla_core::{NodeId, NodeStatus};
use flotilla_view::{NodeRecord, ShardSlot};
use serde::Serialize;
use serde_json::{Value, json};

use crate::ControlError;
use crate::apps::{route_rows, unit_rows};

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
                        .extend(p.view.nodes.keys().map(|k| k.id()).filter(|id| c.view.get(*id).is_none()).cloned());
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

/// The `app` message of an in-process scheduler's app, as it is now.
pub fn local_app_of(h: &flotilla_scheduler::AppHandle) -> Value {
    let routes = h.routes().borrow().clone();
    let capacity = h.capacity().borrow().clone();
    local_app(&h.app, &h.status(), &h.decisions(), &routes, &capacity)
}

/// Live units by (domain, shard of their first member, when known).
pub type UnitsByDomain = std::collections::BTreeMap<(String, Option<u32>), u64>;

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

/// The `app` messages of `apps` from the scheduler process at `url`: one `GET
/// /v1/apps?view=full` for all of them. A process that lists no `summary` (one from
/// before that query) is asked app by app, five calls each; an app it does not list, or
/// every app when it does not answer, is unreachable.
pub(super) async fn fetch_apps(http: &reqwest::Client, url: &str, apps: Vec<String>) -> Vec<(String, Value)> {
    let listing = match crate::forward::remote(http, url, "/v1/apps?view=full").await {
        Ok(Value::Array(rows)) => rows,
        Ok(_) => Vec::new(),
        Err(e) => {
            tracing::debug!(url, error = %e, "fetching a standalone scheduler's apps for the stream");
            return apps.into_iter().map(|app| (app.clone(), unreachable_app(&app, url, &e))).collect();
        }
    };
    if listing.iter().any(|r| r.get("summary").is_none()) {
        let mut out = Vec::with_capacity(apps.len());
        for app in apps {
            let v = fetch_app(http, &app, url).await.unwrap_or_else(|e| unreachable_app(&app, url, &e));
            out.push((app, v));
        }
        return out;
    }
    let rows = crate::forward::by_app(listing, &apps);
    apps.into_iter()
        .zip(rows)
        .map(|(app, row)| {
            let v = match row {
                Some(mut v) => {
                    if v["summary"].get("scheduler_url").is_none_or(Value::is_null) {
                        v["summary"]["scheduler_url"] = json!(url);
                    }
                    v
                }
                None => unreachable_app(&app, url, &ControlError::NoSuchApp(app.clone())),
            };
            (app, v)
        })
        .collect()
}

/// One app's `app` message from a scheduler that lists no full rows, five calls.
async fn fetch_app(http: &reqwest::Client, app: &str, url: &str) -> Result<Value, ControlError> {
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
fn unreachable_app(app: &str, url: &str, e: &ControlError) -> Value {
    json!({"app": app, "summary": crate::forward::unreachable_row(app, url, e), "units": [],
           "routes": {"app": app, "routes": []}, "decisions": [], "capacity": null})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::fixtures::{node, slot};

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
    fn frames_are_sse() {
        let f = frame("ping", &json!({}));
        assert_eq!(&f[..], b"event: ping\ndata: {}\n\n");
    }
}
