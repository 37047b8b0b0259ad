//! `flotilla`: the one binary. Servers (`up`, `aggregator`, `control`, `agent`) and
//! client commands (`nodes`, `status`, `scale --wait`, …) — see docs/architecture.md
//! §13 for the contract.

mod catalogue;
mod cli;
mod echo;
mod ha;
mod pool;
mod route;
mod secrets;
mod serve;
mod shard_state;
mod sim;
mod up;

use clap::{CommandFactory, Parser, Subcommand};

#[global_allocator]
static ALLOC: flotilla_obs::alloc::Metered = flotilla_obs::alloc::Metered;

#[derive(Parser)]
#[command(name = "flotilla", version, about = "A federated multi-cluster scheduler")]
struct Cli {
    #[command(flatten)]
    log: flotilla_obs::LogArgs,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The embedded all-in-one: shards and control API in this process, agents as children.
    Up(up::UpArgs),
    /// One resource aggregator shard.
    Aggregator(serve::aggregator::AggregatorArgs),
    /// The control plane: follows every shard and serves the HTTP API.
    Control(serve::control::ControlArgs),
    /// The node agent (the same code as `flotilla-agent`).
    Agent(Box<flotilla_agent::config::AgentCommand>),
    /// One app's scheduler as its own process.
    Scheduler(serve::scheduler::SchedulerArgs),
    /// A tiny HTTP workload that answers with its node, unit and role.
    EchoServer(echo::EchoArgs),
    /// List nodes from the control plane.
    Nodes(cli::http::ListArgs),
    /// List apps and their units by state.
    Apps(cli::http::ListArgs),
    /// List an app's units and where their members run.
    Units(cli::apps::UnitsArgs),
    /// An app's route table: serving members and their weights.
    Routes(cli::apps::AppArgs),
    /// Operator actions on a node: cordon, drain, uncordon.
    Node(cli::nodes::NodeArgs),
    /// Set an app's desired number of units.
    Scale(cli::scale::ScaleArgs),
    /// Update a running app from its spec file: changed units roll through (`--plan`: show what would change).
    Apply(cli::apply::ApplyArgs),
    /// The versions of an app's spec, newest first, with who applied each and what it changed.
    History(cli::apps::AppArgs),
    /// Go back to an earlier version of an app's spec (default: the one before the last apply).
    Rollback(cli::versions::RollbackArgs),
    /// A canary rollout: its step and both versions' numbers (`status`), `promote`, `abort`.
    Rollout(cli::rollout::RolloutArgs),
    /// An app's autoscaling decisions, newest first, with the numbers behind each.
    Decisions(cli::apps::AppArgs),
    /// What moving an app's units to better places would do now (`--plan`).
    Rebalance(cli::rebalance::RebalanceArgs),
    /// Named autoscaling policies that many apps share.
    Policy(cli::autoscaling::PolicyArgs),
    /// What consumers need an app to be able to run (its policy sizes the app to it).
    Demand(cli::autoscaling::DemandArgs),
    /// The health-weighted reverse proxy for an app (or a fixed list of backends).
    Route(route::RouteArgs),
    /// What an app's members wrote (stdout, or --stderr), from the nodes they run on.
    Logs(cli::logs::LogsArgs),
    /// The event history: node statuses, unit transitions, rollouts, decisions, operator actions.
    Events(cli::events::EventsArgs),
    /// Artifacts members fetch peer to peer: `push FILE` stores one in the cluster's origin.
    Artifact(cli::artifacts::ArtifactArgs),
    /// Named API tokens with scopes (read, operate, deploy, admin), optionally per app.
    Token(cli::tokens::TokenArgs),
    /// Rotate the agents' join token: add a new one, later retire the old ones.
    JoinToken(secrets::JoinTokenArgs),
    /// Replay a load trace through an autoscaling policy in simulated time.
    Sim(sim::SimArgs),
    /// Pool autoscaling offline: `autoscale plan --demand FILE.json`.
    Autoscale(pool::AutoscaleArgs),
    /// Node pools: instances by type and state, and the last decision.
    Pool(cli::http::ListArgs),
    /// The pool autoscaler as its own process (in `up`, `--autoscale` runs it).
    Autoscaler(pool::AutoscalerArgs),
    /// The cluster at a glance: shards, nodes by status, apps by state, pending demand, pools.
    Status(cli::http::ListArgs),
    /// Print a shell completion script (`flotilla completions bash > /etc/bash_completion.d/flotilla`);
    /// it completes app and node names from the cluster at $FLOTILLA_ADDR.
    Completions { shell: clap_complete::Shell },
}

fn main() -> std::process::ExitCode {
    // A shell asking for completions (`COMPLETE=bash flotilla -- …`): answer and exit.
    clap_complete::CompleteEnv::with_factory(Cli::command).var(cli::complete::VAR).complete();
    let cli = Cli::parse_from(flotilla_obs::args());
    let log_format = cli.log.format();
    flotilla_obs::init_tracing(log_format);
    // Before any component registers its metrics: HELP text and buckets for every family.
    catalogue::install();
    let result = match cli.cmd {
        Cmd::Agent(a) => flotilla_agent::main_with(*a),
        Cmd::JoinToken(a) => secrets::join_token(a),
        Cmd::Sim(a) => sim::run(a),
        Cmd::Autoscale(a) => pool::autoscale(a),
        Cmd::Completions { shell } => cli::complete::script(shell, &mut std::io::stdout()),
        other => {
            tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(anyhow::Error::from).and_then(
                |rt| {
                    rt.block_on(async move {
                        match other {
                            Cmd::Up(a) => up::run(a, log_format).await,
                            Cmd::Aggregator(a) => serve::aggregator::aggregator(a).await,
                            Cmd::Control(a) => serve::control::control(a).await,
                            Cmd::Scheduler(a) => serve::scheduler::scheduler(a).await,
                            Cmd::EchoServer(a) => echo::run(a).await,
                            Cmd::Nodes(a) => cli::nodes::nodes(a).await,
                            Cmd::Apps(a) => cli::apps::apps(a).await,
                            Cmd::Units(a) => cli::apps::units(a).await,
                            Cmd::Scale(a) => cli::scale::scale(a).await,
                            Cmd::Apply(a) => cli::apply::apply(a).await,
                            Cmd::History(a) => cli::versions::history(a).await,
                            Cmd::Rollback(a) => cli::versions::rollback(a).await,
                            Cmd::Rollout(a) => cli::rollout::rollout(a).await,
                            Cmd::Decisions(a) => cli::autoscaling::decisions(a).await,
                            Cmd::Rebalance(a) => cli::rebalance::rebalance(a).await,
                            Cmd::Policy(a) => cli::autoscaling::policy(a).await,
                            Cmd::Demand(a) => cli::autoscaling::demand(a).await,
                            Cmd::Route(a) => route::run(a).await,
                            Cmd::Node(a) => cli::nodes::node(a).await,
                            Cmd::Routes(a) => cli::apps::routes(a).await,
                            Cmd::Pool(a) => pool::pool(a).await,
                            Cmd::Autoscaler(a) => pool::run_standalone(a, log_format).await,
                            Cmd::Status(a) => cli::status::status(a).await,
                            Cmd::Token(a) => cli::tokens::token_command(a).await,
                            Cmd::Artifact(a) => cli::artifacts::artifact(a).await,
                            Cmd::Events(a) => cli::events::events(a).await,
                            Cmd::Logs(a) => cli::logs::logs(a).await,
                            Cmd::Agent(_)
                            | Cmd::JoinToken(_)
                            | Cmd::Sim(_)
                            | Cmd::Autoscale(_)
                            | Cmd::Completions { .. } => Ok(()),
                        }
                    })
                },
            )
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Not eprintln!: it panics when stderr cannot be written (a full disk).
            let _ = std::io::Write::write_fmt(&mut std::io::stderr(), format_args!("error: {e:#}\n"));
            std::process::ExitCode::FAILURE
        }
    }
}
