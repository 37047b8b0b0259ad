//! `flotilla nodes` and `flotilla node cordon|uncordon|drain [--wait]`.

use std::path::PathBuf;

use clap::Args;
use serde_json::Value;

use super::http::{Api, DEFAULT_ADDR, ListArgs, Refused, get, print_json, token};
use super::table::Table;
use super::wait::{WaitArgs, wait_until};

fn gib(bytes: u64) -> String {
    format!("{:.1}Gi", bytes as f64 / (1u64 << 30) as f64)
}

/// A node's STATUS as kubectl shows `Ready,SchedulingDisabled`: its liveness, then
/// `preempting` when its cloud gave notice, and `cordoned` or `draining` when an
/// operator set them.
pub fn node_status(r: &Value) -> String {
    let base = r["status"].as_str().unwrap_or("unknown");
    let drain = r["drain_requested"] == true;
    let preempting =
        if r.pointer("/health/preemption_notice") == Some(&Value::Bool(true)) { ",preempting" } else { "" };
    let extra = if drain && base != "draining" {
        ",draining"
    } else if r["cordoned"] == true && !drain {
        ",cordoned"
    } else {
        ""
    };
    format!("{base}{preempting}{extra}")
}

/// `used/total` of one resource of a node row, CPU in millicores, memory in GiB.
fn allocation(r: &Value, key: &str) -> String {
    let n = |p: &str| r.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let (used, total) = (n(&format!("/allocated/{key}")), n(&format!("/capacity/{key}")));
    if key == "cpu_millis" {
        format!("{used}m/{total}m")
    } else {
        format!("{:.1}/{}", used as f64 / (1u64 << 30) as f64, gib(total))
    }
}

pub async fn nodes(a: ListArgs) -> anyhow::Result<()> {
    let v = get(&a, "/v1/nodes").await?;
    if a.json {
        return print_json(&v);
    }
    let rows = v.as_array().cloned().unwrap_or_default();
    let mut t = Table::new(&["NODE", "STATUS", ">SHARD", "DOMAIN", "PRIO", ">CPU", ">MEMORY", ">MEMBERS", ">HEALTH"]);
    for r in &rows {
        let s = |p: &str| r.pointer(p).and_then(Value::as_str).unwrap_or("-").to_string();
        t.row(vec![
            s("/node_id"),
            node_status(r),
            r["shard"].as_u64().unwrap_or(0).to_string(),
            r.pointer("/labels/domain").and_then(Value::as_str).unwrap_or("default").to_string(),
            s("/labels/priority"),
            allocation(r, "cpu_millis"),
            allocation(r, "memory_bytes"),
            r["workloads"].as_u64().map(|n| n.to_string()).unwrap_or_else(|| "-".into()),
            format!("{:.2}", r.pointer("/health/score").and_then(Value::as_f64).unwrap_or(0.0)),
        ]);
    }
    t.print();
    println!("{} nodes", rows.len());
    // A drain that waits says why, under the table (one request per draining node).
    for r in rows.iter().filter(|r| r["drain_requested"] == true) {
        let Some(id) = r["node_id"].as_str() else { continue };
        if let Ok(v) = get(&a, &format!("/v1/nodes/{id}")).await {
            for line in drain_waiting(&v) {
                println!("{id}: {line}");
            }
        }
    }
    Ok(())
}

#[derive(Debug, Args)]
pub struct NodeArgs {
    #[command(subcommand)]
    pub action: NodeAction,
    /// The control plane's address (`http://` is assumed when it has no scheme).
    #[arg(long, env = "FLOTILLA_ADDR", default_value = DEFAULT_ADDR, global = true)]
    pub addr: String,
    /// The API token (default: $FLOTILLA_TOKEN, else $FLOTILLA_DATA/api-token).
    #[arg(long, env = "FLOTILLA_TOKEN", hide_env_values = true, global = true)]
    pub token: Option<String>,
    /// PEM file with the CA certificate(s) that signed an HTTPS control plane's certificate.
    #[arg(long, env = "FLOTILLA_CA", global = true)]
    pub ca: Option<PathBuf>,
    /// Print the control plane's answer as JSON.
    #[arg(long, global = true)]
    pub json: bool,
}

use clap_complete::engine::ArgValueCandidates;

#[derive(Debug, clap::Subcommand)]
pub enum NodeAction {
    /// No new placements on NODE; what runs there stays.
    Cordon {
        #[arg(add = ArgValueCandidates::new(super::complete::nodes))]
        node: String,
    },
    /// Cordon NODE, replace the members it runs elsewhere first, then stop them.
    Drain {
        #[arg(add = ArgValueCandidates::new(super::complete::nodes))]
        node: String,
        #[command(flatten)]
        wait: WaitArgs,
    },
    /// Allow placements on NODE again (ends a drain too).
    Uncordon {
        #[arg(add = ArgValueCandidates::new(super::complete::nodes))]
        node: String,
    },
}

pub async fn node(a: NodeArgs) -> anyhow::Result<()> {
    let api = Api::new(&a.addr, a.ca.as_deref())?;
    let token = token(a.token)?;
    let (verb, node, wait) = match &a.action {
        NodeAction::Cordon { node } => ("cordon", node, None),
        NodeAction::Drain { node, wait } => ("drain", node, Some(wait)),
        NodeAction::Uncordon { node } => ("uncordon", node, None),
    };
    let body = api.write(reqwest::Method::POST, &format!("/v1/nodes/{node}/{verb}"), &token, None).await?;
    let state = match (body["cordoned"] == true, body["drain_requested"] == true) {
        (_, true) => "draining: its members move elsewhere, then stop",
        (true, false) => "cordoned",
        (false, _) => "uncordoned",
    };
    if !a.json {
        println!("{node}: {state}");
    }
    if let Some(w) = wait.filter(|w| w.wait) {
        let done = wait_until(w.timeout, &format!("the drain of {node}"), || drain_progress(&api, node)).await?;
        if !a.json {
            println!("{done}");
        }
    }
    if a.json {
        print_json(&body)?;
    }
    Ok(())
}

/// Where a drain of `node` stands: done when no member runs there and nothing is
/// allocated on it (or the node left the view).
async fn drain_progress(api: &Api, node: &str) -> anyhow::Result<(bool, String)> {
    let v = match api.get(&format!("/v1/nodes/{node}")).await {
        Err(e) if e.downcast_ref::<Refused>().is_some_and(|r| r.status == reqwest::StatusCode::NOT_FOUND) => {
            return Ok((true, format!("{node}: drained (it left the cluster)")));
        }
        other => other?,
    };
    let members: Vec<String> = v["members"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or("?");
            format!("{}/{}/{}", s("app"), s("unit_id"), s("member"))
        })
        .collect();
    let n = |p: &str| v.pointer(p).and_then(Value::as_u64).unwrap_or(0);
    let (cpu, mem, workloads) = (n("/allocated/cpu_millis"), n("/allocated/memory_bytes"), n("/workloads"));
    if members.is_empty() && cpu == 0 && mem == 0 && workloads == 0 {
        return Ok((true, format!("{node}: drained, no member runs there")));
    }
    let mut line = format!("{node}: {}, {} member(s) left", node_status(&v), members.len().max(workloads as usize));
    if !members.is_empty() {
        let shown: Vec<&str> = members.iter().take(3).map(String::as_str).collect();
        let more = if members.len() > 3 { ", …" } else { "" };
        line.push_str(&format!(" ({}{more})", shown.join(", ")));
    }
    line.push_str(&format!(", {cpu}m CPU and {} allocated", gib(mem)));
    for w in drain_waiting(&v) {
        line.push_str(&format!("; {w}"));
    }
    Ok((false, line))
}

/// Why a drain waits, one line per unit, from a `GET /v1/nodes/{node}` answer.
fn drain_waiting(v: &Value) -> Vec<String> {
    v.pointer("/drain/waiting")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|w| {
            let s = |k: &str| w[k].as_str().unwrap_or("?");
            format!("drain waits on {}/{}: {}", s("app"), s("unit_id"), s("reason"))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_node_status_says_cordoned_or_draining_like_kubectl() {
        let row = |s: &str, c: bool, d: bool| json!({"status": s, "cordoned": c, "drain_requested": d});
        assert_eq!(node_status(&row("alive", false, false)), "alive");
        assert_eq!(node_status(&row("alive", true, false)), "alive,cordoned");
        assert_eq!(node_status(&row("alive", true, true)), "alive,draining");
        assert_eq!(node_status(&row("suspect", true, false)), "suspect,cordoned");
        assert_eq!(node_status(&row("draining", true, true)), "draining");
        assert_eq!(node_status(&row("dead", false, false)), "dead");
        let noticed = json!({"status": "alive", "health": {"preemption_notice": true}, "drain_requested": true});
        assert_eq!(node_status(&noticed), "alive,preempting,draining", "its cloud gave notice");
    }
}
