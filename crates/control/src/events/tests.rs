use super::*;
use flotilla_core::{Labels, Resources};
use flotilla_view::{Domains, ShardView};

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
    let domains = Domains::of(&v);
    Arc::new(ShardSlot { view: Arc::new(v), connected, domains, updated_unix_ms: 1_000 })
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
        json!(["a", "alive", 0, "x", "high", 1.0, 4000, 1000, 8u64 << 30, 1u64 << 30, 1, 0, false, false, 1])
    );
    let rows: Vec<_> = (0..SNAPSHOT_CHUNK + 1).map(|i| (node(&format!("n{i}"), "x", 1000), true)).collect();
    let frames = node_frames(&rows, vec!["gone"]);
    assert_eq!(frames.len(), 2);
    let last = std::str::from_utf8(&frames[1]).unwrap();
    assert!(last.contains("\"removed\":[\"gone\"]"), "{last}");
    assert!(std::str::from_utf8(&frames[0]).unwrap().contains("\"removed\":[]"));
}
