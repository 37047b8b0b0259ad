//! `flotilla rebalance APP --plan`: the units that would move to a better place now,
//! where to, and why; or why nothing may move (the app's `[disruption]` budget).

use clap::Args;

use super::apps::AppArgs;
use super::http::get;
use super::table::Table;

#[derive(Debug, Args)]
pub struct RebalanceArgs {
    #[command(flatten)]
    pub app: AppArgs,
    /// Show what would move (rebalancing itself runs in the scheduler, within
    /// `[disruption]`; `rebalance = "off"` stops it).
    #[arg(long, required = true)]
    pub plan: bool,
}

pub async fn rebalance(a: RebalanceArgs) -> anyhow::Result<()> {
    let v = get(&a.app.list, &format!("/v1/apps/{}/rebalance", a.app.app)).await?;
    if a.app.list.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    let moves = v["moves"].as_array().cloned().unwrap_or_default();
    let nodes = |m: &serde_json::Value, k: &str| {
        let list: Vec<&str> = m[k].as_array().into_iter().flatten().filter_map(|n| n.as_str()).collect();
        list.join(",")
    };
    let fit = |f: &serde_json::Value| {
        let n = |k: &str| f[k].as_u64().unwrap_or(0);
        format!("{}/{}/{}/{}", n("poor"), n("domain"), n("node"), n("spare"))
    };
    let mut t = Table::new(&["UNIT", "FROM", "TO", "BEFORE", "AFTER", "STARTED", "WHY"]);
    for m in &moves {
        t.row(vec![
            m["unit"].as_str().unwrap_or("-").to_string(),
            format!("{}:{}", m["from_domain"].as_str().unwrap_or("-"), nodes(m, "from_nodes")),
            format!("{}:{}", m["to_domain"].as_str().unwrap_or("-"), nodes(m, "to_nodes")),
            fit(&m["before"]),
            fit(&m["after"]),
            if m["started"] == true { "yes" } else { "no" }.to_string(),
            m["why"].as_str().unwrap_or("").to_string(),
        ]);
    }
    t.print();
    println!(
        "{} units would move (scores: poor nodes/others in the domain/others on the node/on nodes the pool need not \
         keep, lower is better); rebalance {}",
        moves.len(),
        v["rebalance"].as_str().unwrap_or("on")
    );
    if let Some(why) = v["waiting"].as_str() {
        println!("nothing moves now: {why}");
    }
    Ok(())
}
