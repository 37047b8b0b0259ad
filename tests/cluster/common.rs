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
