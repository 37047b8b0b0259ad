//! `flotilla events [--app A] [--node N] [--since 1h] [--type T] [-f]`: the event
//! history (node status changes, unit transitions, rollouts, decisions, operator
//! actions), oldest first, as `kubectl get events` shows it.

use std::time::Duration;

use clap::Args;

use super::http::{Api, ListArgs, print_json};
use super::table::{Table, when};

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this app's events.
    #[arg(long)]
    pub app: Option<String>,
    /// Only this node's events.
    #[arg(long)]
    pub node: Option<String>,
    /// Only events this recent (`10m`, `1h`, `7d`).
    #[arg(long)]
    pub since: Option<String>,
    /// Only events of this type (node, unit, rollout, autoscaling, rebalance, pool, scale, apply,
    /// rollback, node_action, policy, pool_bounds, pool_floor, token).
    #[arg(long = "type")]
    pub kind: Option<String>,
    /// How many (the newest), at most 1,000.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,
    /// Keep printing new events as they are recorded.
    #[arg(long, short = 'f')]
    pub follow: bool,
    #[command(flatten)]
    pub list: ListArgs,
}

impl EventsArgs {
    fn query(&self, after: Option<u64>) -> String {
        let enc = |s: &str| s.replace('%', "%25").replace('&', "%26").replace('=', "%3D").replace(' ', "%20");
        let mut q = vec![format!("limit={}", self.limit)];
        for (k, v) in [("app", &self.app), ("node", &self.node), ("since", &self.since), ("type", &self.kind)] {
            if let Some(v) = v {
                q.push(format!("{k}={}", enc(v)));
            }
        }
        if let Some(a) = after {
            q.push(format!("after={a}"));
        }
        format!("/v1/events/history?{}", q.join("&"))
    }
}

fn rows(v: &serde_json::Value) -> Vec<Vec<String>> {
    let s = |e: &serde_json::Value, k: &str| e[k].as_str().unwrap_or("-").to_string();
    v["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let at = e["at_unix_ms"].as_u64().map_or("-".into(), when);
            vec![e["seq"].to_string(), at, s(e, "type"), s(e, "message"), s(e, "by")]
        })
        .collect()
}

pub async fn events(a: EventsArgs) -> anyhow::Result<()> {
    let api = Api::new(&a.list.addr, a.list.ca.as_deref())?;
    let first = api.get(&a.query(None)).await?;
    if a.list.json && !a.follow {
        return print_json(&first);
    }
    let header = ["SEQ", "AT", "TYPE", "EVENT", "BY"];
    let mut t = Table::new(&header);
    let mut after = first["next_after"].as_u64();
    if a.list.json {
        for e in first["events"].as_array().into_iter().flatten() {
            println!("{e}");
        }
    } else {
        for r in rows(&first) {
            t.row(r);
        }
        t.print();
    }
    if !a.follow {
        return Ok(());
    }
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let v = api.get(&a.query(after)).await?;
        after = v["next_after"].as_u64().or(after);
        if a.list.json {
            for e in v["events"].as_array().into_iter().flatten() {
                println!("{e}");
            }
        } else {
            let mut t = Table::new(&header);
            for r in rows(&v) {
                t.row(r);
            }
            // New rows under the first table, without a header each time.
            print!("{}", t.render("").lines().skip(1).map(|l| format!("{l}\n")).collect::<String>());
        }
    }
}
