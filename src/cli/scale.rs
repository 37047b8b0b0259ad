//! `flotilla scale APP --units N | --min A --max B | --auto [--wait]`.

use clap::Args;
use serde_json::Value;

use super::http::{Body, WriteArgs, print_json};
use super::progress::app_progress;
use super::wait::{WaitArgs, wait_until};

#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("size").required(true).args(["units", "min", "auto"])))]
pub struct ScaleArgs {
    /// The app.
    #[arg(add = clap_complete::engine::ArgValueCandidates::new(super::complete::apps))]
    pub app: String,
    /// The desired number of units (on an autoscaled app: its floor and ceiling).
    #[arg(long)]
    pub units: Option<u32>,
    /// On an autoscaled app: the fewest units its policy may choose (with --max).
    #[arg(long, requires = "max")]
    pub min: Option<u32>,
    /// On an autoscaled app: the most units its policy may choose (with --min).
    #[arg(long, requires = "min")]
    pub max: Option<u32>,
    /// On an autoscaled app: lift the floor and ceiling set before.
    #[arg(long)]
    pub auto: bool,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
}

pub async fn scale(a: ScaleArgs) -> anyhow::Result<()> {
    let body = match (a.units, a.min, a.max) {
        (Some(n), _, _) => serde_json::json!({"units": n}),
        (None, Some(min), Some(max)) => serde_json::json!({"min": min, "max": max}),
        _ => serde_json::json!({"auto": true}),
    };
    let answer = a.write.put(&format!("/v1/apps/{}/scale", a.app), Body::Json(body)).await?;
    if !a.write.json {
        match (answer.get("desired_units"), answer.get("override")) {
            (Some(n), _) => println!("{}: desired units {n}", a.app),
            (None, Some(Value::Null)) => println!("{}: the autoscaling policy decides alone again", a.app),
            (None, Some(o)) => println!("{}: the policy decides within {}..={}", a.app, o["floor"], o["ceiling"]),
            (None, None) => println!("{}: {answer}", a.app),
        }
    }
    if a.wait.wait {
        // Until the app's status shows the new size, its old one may look finished.
        let want: Box<dyn Fn(u64) -> bool + Send + Sync> = match (a.units, a.min, a.max) {
            (Some(n), _, _) => Box::new(move |d| d == u64::from(n)),
            (None, Some(min), Some(max)) => Box::new(move |d| (u64::from(min)..=u64::from(max)).contains(&d)),
            _ => Box::new(|_| true),
        };
        let api = a.write.api()?;
        let what = format!("{} to reach its desired units", a.app);
        let done = wait_until(a.wait.timeout, &what, || app_progress(&api, &a.app, None, &*want)).await?;
        if !a.write.json {
            println!("{done}");
        }
    }
    if a.write.json {
        print_json(&answer)?;
    }
    Ok(())
}
