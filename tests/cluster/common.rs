//! What the topics share about the echo app (examples/echo.toml): 250m per member, one
//! head and one worker per unit.

use flotilla_testkit::Up;
use serde_json::Value;

pub const ECHO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/echo.toml");

pub fn running(up: &Up) -> Vec<Value> {
    up.units("echo").into_iter().filter(|u| u["state"] == "running").collect()
}

pub fn statuses(up: &Up) -> Vec<String> {
    up.nodes().iter().map(|n| n["status"].as_str().unwrap_or("").to_string()).collect()
}

/// Whether any member of `unit` runs on `node`.
pub fn on_node(unit: &Value, node: &str) -> bool {
    unit["members"].as_array().is_some_and(|ms| ms.iter().any(|m| m["node_id"] == node))
}

pub fn head_of(unit: &Value) -> Value {
    unit["members"].as_array().unwrap().iter().find(|m| m["role"] == "head").unwrap().clone()
}

/// The pid of the echo workload answering at `addr`.
pub fn workload_pid(addr: &str) -> i32 {
    flotilla_testkit::who(addr).unwrap()["pid"].as_i64().unwrap() as i32
}

/// No unit twice, no member twice, and every node's allocated CPU (as its shard's
/// ledger publishes it) equals what the units hold there (250m per echo member).
pub fn ledgers_match_units(up: &Up) -> Result<(), String> {
    let (nodes, units) = (up.nodes(), up.units("echo"));
    if nodes.len() != 4 || nodes.iter().any(|n| n["status"] != "alive") {
        return Err(format!("not every node is alive: {:?}", statuses(up)));
    }
    let mut ids: Vec<&str> = units.iter().filter_map(|u| u["unit_id"].as_str()).collect();
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("a unit listed twice: {ids:?}"));
    }
    for n in &nodes {
        let id = n["node_id"].as_str().unwrap_or("");
        let allocated = n["allocated"]["cpu_millis"].as_u64().unwrap_or(0);
        let held = units
            .iter()
            .filter(|u| !matches!(u["state"].as_str(), Some("terminated" | "queued" | "placing")))
            .flat_map(|u| u["members"].as_array().cloned().unwrap_or_default())
            .filter(|m| m["node_id"] == id)
            .count() as u64;
        if allocated != held * 250 {
            return Err(format!("{id}: the ledger holds {allocated}m, the units {}m", held * 250));
        }
    }
    Ok(())
}
