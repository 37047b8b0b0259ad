//! `flotilla-loadtest`: measures Flotilla against the targets of docs/architecture.md §14. With
//! `--json`, the last line of stdout is one compact JSON object.

mod apps;
mod autoscale;
mod canary;
mod common;
mod dashboard;
mod failover;
mod heartbeats;
mod lab;
mod p2p;
mod policies;
mod pool;
mod routing;
mod runner;
mod schedule;
mod soak;
mod takeover;

use clap::{Parser, Subcommand};

/// The allocator of the `flotilla` binary: the schedulers, routers and agents this
/// process hosts are measured as they run in the product.
#[global_allocator]
static ALLOC: flotilla_obs::alloc::Metered = flotilla_obs::alloc::Metered;

#[derive(Parser)]
#[command(name = "flotilla-loadtest", version, about = "Flotilla load tests")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Heartbeat ingest: simulated agents against real shard processes.
    Heartbeats(heartbeats::HeartbeatArgs),
    /// Optimistic placement by many app schedulers, against a one-lock baseline.
    Schedule(schedule::ScheduleArgs),
    /// Many apps in one `flotilla scheduler --apps-dir`: idle CPU, memory per app, scale latency.
    Apps(apps::AppsArgs),
    /// Route removal and replacement times when real agents are killed or drained.
    Failover(failover::FailoverArgs),
    /// Scheduler takeover on etcd: kill -9 the active one, time the standby's first commit.
    Takeover(takeover::TakeoverArgs),
    /// Tail latency through `flotilla route` with slow backends, against round robin.
    Routing(routing::RoutingArgs),
    /// Progressive delivery under load: a failing, a slow and a good version rolled out as canaries.
    Canary(canary::CanaryArgs),
    /// Real agents and an app under churn, with the invariants checked all along.
    Soak(soak::SoakArgs),
    /// Lab hosts (network namespaces, as root) under mixed faults: `lab --soak`.
    Lab(lab::LabArgs),
    /// One artifact to many lab hosts: Flotilla's swarm, HTTP from the origin, BitTorrent.
    P2p(p2p::P2pArgs),
    /// One autoscaling evaluation for each of many apps (both policies).
    Policies(policies::PoliciesArgs),
    /// One pool scale-up decision for a seeded demand, against Ray 2.60's own scheduler.
    Autoscale(autoscale::AutoscaleArgs),
    /// The dashboard at many nodes: first paint, live update latency, browser memory.
    Dashboard(dashboard::DashboardArgs),
    /// The pool autoscaler's pass at many nodes: nodes over HTTP against from the view.
    Pool(pool::PoolArgs),
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Cmd::Heartbeats(a) => heartbeats::run(a).await,
        Cmd::Schedule(a) => schedule::run_schedule(a).await,
        Cmd::Apps(a) => apps::run(a).await,
        Cmd::Failover(a) => failover::run(a).await,
        Cmd::Takeover(a) => takeover::run(a).await,
        Cmd::Routing(a) => routing::run(a).await,
        Cmd::Canary(a) => canary::run(a).await,
        Cmd::Soak(a) => soak::run(a).await,
        Cmd::Lab(a) => lab::run(a),
        Cmd::P2p(a) => p2p::run(a),
        Cmd::Policies(a) => policies::run(a),
        Cmd::Autoscale(a) => autoscale::run(a),
        Cmd::Dashboard(a) => dashboard::run(a).await,
        Cmd::Pool(a) => pool::run(a).await,
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
