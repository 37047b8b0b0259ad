//! `flotilla`: the one binary. Servers (`up`, `aggregator`, `control`, `agent`) and
//! client commands (`nodes`, `status`, `scale --wait`, …) — see docs/architecture.md
//! §13 for the contract.

mod autoscaling;
mod catalogue;
mod client;
mod echo;
mod ha;
mod pool;
mod route;
mod secrets;
mod servers;
mod shard_state;
mod sim;
mod status;
mod table;
mod up;
mod wait;

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
    Aggregator(servers::AggregatorArgs),
    /// The control plane: follows every shard and serves the HTTP API.
    Control(servers::ControlArgs),
    /// The node agent (the same code as `flotilla-agent`).
    Agent(Box<flotilla_agent::config::AgentCommand>),
    /// One app's scheduler as its own process.
    Scheduler(servers::SchedulerArgs),
    /// A tiny HTTP workload that answers with its node, unit and role.
    EchoServer(echo::EchoArgs),
    /// List nodes from the control plane.
    Nodes(client::ListArgs),
    /// List apps and their units by state.
    Apps(client::ListArgs),
    /// List an app's units and where their members run.
    Units(client::UnitsArgs),
    /// An app's route table: serving members and their weights.
    Routes(client::UnitsArgs),
    /// Operator actions on a node: cordon, drain, uncordon.
    Node(client::NodeArgs),
    /// Set an app's desired number of units.
    Scale(client::ScaleArgs),
    /// Update a running app from its spec file: changed units roll through.
    Apply(client::ApplyArgs),
    /// An app's autoscaling decisions, newest first, with the numbers behind each.
    Decisions(client::UnitsArgs),
    /// Named autoscaling policies that many apps share.
    Policy(autoscaling::PolicyArgs),
    /// What consumers need an app to be able to run (its policy sizes the app to it).
    Demand(autoscaling::DemandArgs),
    /// The health-weighted reverse proxy for an app (or a fixed list of backends).
    Route(route::RouteArgs),
    /// Rotate the agents' join token: add a new one, later retire the old ones.
    JoinToken(secrets::JoinTokenArgs),
    /// Replay a load trace through an autoscaling policy in simulated time.
    Sim(sim::SimArgs),
    /// Pool autoscaling offline: `autoscale plan --demand FILE.json`.
    Autoscale(pool::AutoscaleArgs),
    /// Node pools: instances by type and state, and the last decision.
    Pool(client::ListArgs),
    /// The pool autoscaler as its own process (in `up`, `--autoscale` runs it).
    Autoscaler(pool::AutoscalerArgs),
    /// The cluster at a glance: shards, nodes by status, apps by state, pending demand, pools.
    Status(client::ListArgs),
    /// Print a shell completion script (`flotilla completions bash > /etc/bash_completion.d/flotilla`).
    Completions { shell: clap_complete::Shell },
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let log_format = cli.log.format();
    flotilla_obs::init_tracing(log_format);
    // Before any component registers its metrics: HELP text and buckets for every family.
    catalogue::install();
    let result = match cli.cmd {
        Cmd::Agent(a) => flotilla_agent::main_with(*a),
        Cmd::JoinToken(a) => secrets::join_token(a),
        Cmd::Sim(a) => sim::run(a),
        Cmd::Autoscale(a) => pool::autoscale(a),
        Cmd::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "flotilla", &mut std::io::stdout());
            Ok(())
        }
        other => {
            tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(anyhow::Error::from).and_then(
                |rt| {
                    rt.block_on(async move {
                        match other {
                            Cmd::Up(a) => up::run(a, log_format).await,
                            Cmd::Aggregator(a) => servers::aggregator(a).await,
                            Cmd::Control(a) => servers::control(a).await,
                            Cmd::Scheduler(a) => servers::scheduler(a).await,
                            Cmd::EchoServer(a) => echo::run(a).await,
                            Cmd::Nodes(a) => client::nodes(a).await,
                            Cmd::Apps(a) => client::apps(a).await,
                            Cmd::Units(a) => client::units(a).await,
                            Cmd::Scale(a) => client::scale(a).await,
                            Cmd::Apply(a) => client::apply(a).await,
                            Cmd::Decisions(a) => autoscaling::decisions(a).await,
                            Cmd::Policy(a) => autoscaling::policy(a).await,
                            Cmd::Demand(a) => autoscaling::demand(a).await,
                            Cmd::Route(a) => route::run(a).await,
                            Cmd::Node(a) => client::node(a).await,
                            Cmd::Routes(a) => client::routes(a).await,
                            Cmd::Pool(a) => pool::pool(a).await,
                            Cmd::Autoscaler(a) => pool::run_standalone(a, log_format).await,
                            Cmd::Status(a) => status::status(a).await,
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
