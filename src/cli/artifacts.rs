//! `flotilla artifact push FILE`: stores a file in the cluster's origin and prints the
//! name a spec's `source` uses. `flotilla artifact warm APP`: the app's artifacts fetched
//! on the nodes a scale-up would use, ahead of it. `flotilla artifact fetch`: one node's fetch, with the
//! agent's own cache and swarm, then seeding (the p2p lab runs one per host).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, Subcommand};
use flotilla_artifact::fetch::{Progress, Want};
use flotilla_artifact::{Digest, Source};

use super::http::{Body, WriteArgs, print_json};

#[derive(Debug, Args)]
pub struct ArtifactArgs {
    #[command(subcommand)]
    cmd: ArtifactCmd,
}

#[derive(Debug, Subcommand)]
enum ArtifactCmd {
    /// Store FILE in the cluster's origin; prints its `flotilla://sha256:…` name.
    Push {
        file: PathBuf,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Fetch APP's artifacts into the caches of the nodes a scale-up could use (alive,
    /// uncordoned, matching its constraints), before it comes.
    Warm {
        app: String,
        /// Only these nodes: comma-separated node ids (any of) and key=value labels (all of).
        #[arg(long)]
        nodes: Option<String>,
        #[command(flatten)]
        write: WriteArgs,
    },
    /// Fetch one artifact as an agent does (peers first, the origin for the rest), print
    /// how it went as JSON, then keep serving it to peers until SIGTERM or --seed-for.
    Fetch(FetchArgs),
}

#[derive(Debug, Args)]
pub struct FetchArgs {
    /// flotilla://sha256:HEX, http://… or https://…
    source: String,
    #[arg(long)]
    sha256: String,
    /// The cache's dir.
    #[arg(long)]
    data: PathBuf,
    #[arg(long)]
    node_id: String,
    /// The agents' join token file (one token a line, newest first): the cluster's key.
    #[arg(long)]
    join_token_file: Option<PathBuf>,
    /// The address peers reach this node at (its peer port is bound there).
    #[arg(long, default_value = "127.0.0.1")]
    advertise: String,
    /// Also write the JSON report to this file (atomically) once the fetch is done.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Keep serving for this long after the fetch (default: until SIGTERM).
    #[arg(long, value_parser = super::http::parse_duration)]
    seed_for: Option<Duration>,
    #[command(flatten)]
    agent: flotilla_agent::artifacts::ArtifactArgs,
}

pub async fn artifact(a: ArtifactArgs) -> anyhow::Result<()> {
    match a.cmd {
        ArtifactCmd::Push { file, write } => push(file, write).await,
        ArtifactCmd::Warm { app, nodes, write } => warm(&app, nodes, write).await,
        ArtifactCmd::Fetch(f) => fetch(f).await,
    }
}

async fn warm(app: &str, nodes: Option<String>, write: WriteArgs) -> anyhow::Result<()> {
    let token = super::http::token(write.token.clone())?;
    let body = match nodes {
        Some(n) => serde_json::json!({ "nodes": n }),
        None => serde_json::json!({}),
    };
    let path = format!("/v1/apps/{app}/warm");
    let v = write.api()?.write(reqwest::Method::POST, &path, &token, Some(Body::Json(body))).await?;
    if write.json {
        return print_json(&v);
    }
    let rows = v["nodes"].as_array().cloned().unwrap_or_default();
    let asked = rows.iter().filter(|n| n["error"].is_null()).count();
    println!("{app}: {} artifacts, {asked} of {} nodes asked", v["artifacts"], rows.len());
    for n in &rows {
        let id = n["node_id"].as_str().unwrap_or("?");
        match n["error"].as_str() {
            Some(e) => println!("  {id}: not asked: {e}"),
            None => println!("  {id}: {} ready, {} fetching", n["ready"], n["fetching"]),
        }
        for f in n["failed"].as_array().into_iter().flatten() {
            println!("  {id}: failed: {}", f.as_str().unwrap_or("?"));
        }
    }
    Ok(())
}

async fn push(file: PathBuf, write: WriteArgs) -> anyhow::Result<()> {
    let f = tokio::fs::File::open(&file).await.with_context(|| format!("opening {}", file.display()))?;
    let token = super::http::token(write.token.clone())?;
    let v = write.api()?.write(reqwest::Method::PUT, "/v1/artifacts", &token, Some(Body::File(f))).await?;
    if write.json {
        return print_json(&v);
    }
    println!("{}", v["name"].as_str().unwrap_or_default());
    Ok(())
}

async fn fetch(f: FetchArgs) -> anyhow::Result<()> {
    let problems = f.agent.problems();
    anyhow::ensure!(problems.is_empty(), "{}", problems.join("; "));
    let digest = Digest::parse(&f.sha256).map_err(anyhow::Error::msg)?;
    let source = Source::parse(&f.source).map_err(anyhow::Error::msg)?;
    let tokens = match &f.join_token_file {
        Some(p) => crate::secrets::read_tokens(p)?,
        None => Vec::new(),
    };
    let arts = flotilla_agent::artifacts::start(&f.agent, &f.node_id, &f.data, &f.advertise, &tokens)?;
    let started = Instant::now();
    let want = Want { digest, source, unpack: None };
    loop {
        match arts.want(&want) {
            Progress::Ready { .. } => break,
            Progress::Failed { why, lasting: true } => anyhow::bail!("{why}"),
            _ => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
    let metric = |name: &str, label: &str| -> f64 {
        flotilla_obs::render()
            .lines()
            .find(|l| l.starts_with(name) && l.contains(label))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let report = serde_json::json!({
        "node": f.node_id,
        "seconds": started.elapsed().as_secs_f64(),
        "from_peers": metric(flotilla_artifact::catalogue::BYTES.name, "from=\"peer\""),
        "from_origin": metric(flotilla_artifact::catalogue::BYTES.name, "from=\"origin\""),
    });
    println!("{report}");
    if let Some(path) = &f.report {
        flotilla_obs::fsutil::write_atomic(path, report.to_string().as_bytes(), 0o644)?;
    }
    match f.seed_for {
        Some(d) => tokio::time::sleep(d).await,
        None => crate::serve::shutdown_signal().await,
    }
    arts.close();
    Ok(())
}
