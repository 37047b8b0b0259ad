//! `flotilla status`: the cluster at a glance, like `ray status`: shards, nodes by
//! status with what is allocated of what they offer, apps by unit state, pending demand
//! and the pool autoscalers' instances.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::http::{Api, ListArgs, print_json};
use super::nodes::node_status;
use super::table::Table;

/// The overview as one JSON document (`status --json`; the text is drawn from it).
pub async fn overview(api: &Api) -> anyhow::Result<Value> {
    let (shards, nodes, apps, pools) =
        tokio::try_join!(api.get("/v1/shards"), api.get("/v1/nodes"), api.get("/v1/apps"), api.get("/v1/pools"))?;
    let shards: Vec<Value> = shards
        .as_array()
        .into_iter()
        .flatten()
        .map(|s| {
            let state = if s["connected"] == true { "serving" } else { "unreachable" };
            json!({"shard": s["shard"], "address": s["address"], "state": state, "nodes": s["nodes"],
                   "version": s["version"]})
        })
        .collect();
    let nodes = nodes.as_array().cloned().unwrap_or_default();
    let mut by_status: BTreeMap<String, u64> = BTreeMap::new();
    let (mut allocated, mut allocatable) = ([0u64; 2], [0u64; 2]);
    for n in &nodes {
        *by_status.entry(node_status(n)).or_default() += 1;
        // What live nodes offer; a dead or unknown one offers nothing now.
        if matches!(n["status"].as_str(), Some("alive" | "suspect" | "draining")) {
            for (i, k) in ["cpu_millis", "memory_bytes"].iter().enumerate() {
                allocated[i] += n["allocated"][k].as_u64().unwrap_or(0);
                allocatable[i] += n["capacity"][k].as_u64().unwrap_or(0);
            }
        }
    }
    let mut app_rows = Vec::new();
    let mut pending = Vec::new();
    for a in apps.as_array().into_iter().flatten() {
        let st = |k: &str| a["units"][k].as_u64().unwrap_or(0);
        let starting = st("placing") + st("allocated") + st("starting") + st("degraded");
        let name = a["app"].clone();
        app_rows.push(json!({
            "app": name, "desired": a["desired_units"], "running": st("running"), "starting": starting,
            "queued": st("queued"), "stopping": st("draining") + st("stopping"), "failed": st("failed"),
        }));
        let demand = a.pointer("/autoscaling/demand").filter(|d| !d.is_null()).cloned();
        if st("queued") > 0 || demand.is_some() {
            pending.push(json!({"app": name, "queued_units": st("queued"), "queued": a["queued"],
                                "unit_shape": a["unit_shape"], "demand": demand}));
        }
    }
    let pools: Vec<Value> = pools
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let mut by_state: BTreeMap<String, u64> = BTreeMap::new();
            for i in p["instances"].as_array().into_iter().flatten() {
                *by_state.entry(i["state"].as_str().unwrap_or("unknown").to_string()).or_default() += 1;
            }
            json!({"pool": p["pool"], "provider": p["provider"], "stale": p["stale"], "instances": by_state,
                   "store_failing": p["store_failing"]})
        })
        .collect();
    Ok(json!({
        "control_plane": api.base,
        "shards": shards,
        "nodes": {
            "total": nodes.len(),
            "by_status": by_status,
            "allocated": {"cpu_millis": allocated[0], "memory_bytes": allocated[1]},
            "allocatable": {"cpu_millis": allocatable[0], "memory_bytes": allocatable[1]},
        },
        "apps": app_rows,
        "pending": pending,
        "pools": pools,
    }))
}

pub async fn status(a: ListArgs) -> anyhow::Result<()> {
    let api = Api::new(&a.addr, a.ca.as_deref())?;
    let v = overview(&api).await?;
    if a.json {
        return print_json(&v);
    }
    let s = |v: &Value| match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".into(),
        other => other.to_string(),
    };
    println!("control plane {}", api.base);
    println!("\nShards");
    let mut t = Table::new(&[">SHARD", "ADDRESS", "STATE", ">NODES", "VERSION"]);
    for sh in v["shards"].as_array().into_iter().flatten() {
        let version = format!("{}.{}", s(&sh["version"]["epoch"]), s(&sh["version"]["seq"]));
        t.row(vec![s(&sh["shard"]), s(&sh["address"]), s(&sh["state"]), s(&sh["nodes"]), version]);
    }
    print!("{}", t.render("  "));
    let n = &v["nodes"];
    println!("\nNodes: {}", n["total"]);
    let by: Vec<String> = n["by_status"].as_object().into_iter().flatten().map(|(k, c)| format!("{c} {k}")).collect();
    if !by.is_empty() {
        println!("  {}", by.join(", "));
    }
    let gib = |b: &Value| b.as_u64().unwrap_or(0) as f64 / (1u64 << 30) as f64;
    println!(
        "  allocated: {}m/{}m CPU, {:.1}/{:.1}Gi memory",
        s(&n["allocated"]["cpu_millis"]),
        s(&n["allocatable"]["cpu_millis"]),
        gib(&n["allocated"]["memory_bytes"]),
        gib(&n["allocatable"]["memory_bytes"]),
    );
    let apps = v["apps"].as_array().cloned().unwrap_or_default();
    println!("\nApps: {}", apps.len());
    if !apps.is_empty() {
        let mut t = Table::new(&["APP", ">DESIRED", ">RUNNING", ">STARTING", ">QUEUED", ">STOPPING", ">FAILED"]);
        for a in &apps {
            let cols = ["app", "desired", "running", "starting", "queued", "stopping", "failed"];
            t.row(cols.iter().map(|k| s(&a[*k])).collect());
        }
        print!("{}", t.render("  "));
    }
    let pending = v["pending"].as_array().cloned().unwrap_or_default();
    println!("\nPending demand:{}", if pending.is_empty() { " none" } else { "" });
    for p in &pending {
        let shape = &p["unit_shape"];
        let mut line = format!("  {}: {} unit(s) queued", s(&p["app"]), s(&p["queued_units"]));
        if let Some(members) = shape["members"].as_array() {
            // Each member as its template asks (its first option).
            let sum =
                |k: &str| members.iter().map(|m| m["options"][0]["resources"][k].as_u64().unwrap_or(0)).sum::<u64>();
            line.push_str(&format!(" of {}m CPU, {:.2}Gi each", sum("cpu_millis"), gib(&json!(sum("memory_bytes")))));
        }
        if let Some(reqs) = p.pointer("/demand/requests").and_then(Value::as_array) {
            let total: u64 = reqs.iter().map(|r| r["count"].as_u64().unwrap_or(0)).sum();
            line.push_str(&format!("; consumers ask for {total} request(s)"));
        }
        println!("{line}");
    }
    let pools = v["pools"].as_array().cloned().unwrap_or_default();
    if !pools.is_empty() {
        println!("\nPools");
        for p in &pools {
            let states: Vec<String> =
                p["instances"].as_object().into_iter().flatten().map(|(k, c)| format!("{c} {k}")).collect();
            let stale = if p["stale"] == true { " (stale)" } else { "" };
            let states = if states.is_empty() { "no instances".to_string() } else { states.join(", ") };
            let store = p["store_failing"].as_str().map(|e| format!(" (store failing: {e})")).unwrap_or_default();
            println!("  {} (provider {}){stale}{store}: {states}", s(&p["pool"]), s(&p["provider"]));
        }
    }
    Ok(())
}
