//! `flotilla apply FILE [--wait]`: a new spec for a running app.

use anyhow::Context;
use clap::Args;

use super::http::{Body, WriteArgs, print_json};
use super::progress::app_progress;
use super::wait::{WaitArgs, wait_until};

#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// The app's spec (TOML); the app it names is updated.
    pub file: std::path::PathBuf,
    #[command(flatten)]
    pub write: WriteArgs,
    #[command(flatten)]
    pub wait: WaitArgs,
}

/// Checks the spec here (every problem at once), then hands it to the app's scheduler,
/// which rolls changed units through, `rollout.max_unavailable` at a time.
pub async fn apply(a: ApplyArgs) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file.display()))?;
    let spec = flotilla_scheduler::AppSpec::parse(&text).with_context(|| a.file.display().to_string())?;
    let body = a.write.put(&format!("/v1/apps/{}/spec", spec.name), Body::Text(text)).await?;
    if !a.write.json {
        println!("{}: {}", spec.name, body["result"].as_str().unwrap_or("applied"));
    }
    if a.wait.wait {
        // The scheduler marks each unit with the fingerprint of the template it was
        // started from; the rollout is over when every unit has this one and runs.
        let fingerprint = spec.template_fingerprint();
        let api = a.write.api()?;
        let what = format!("the rollout of {}", spec.name);
        let any = |_: u64| true;
        let done =
            wait_until(a.wait.timeout, &what, || app_progress(&api, &spec.name, Some(&fingerprint), &any)).await?;
        if !a.write.json {
            println!("{done}");
        }
    }
    if a.write.json {
        print_json(&body)?;
    }
    Ok(())
}
