//! `flotilla-agent`: the node agent for DaemonSets (the same code as `flotilla agent`).

use clap::Parser;

/// jemalloc, as the `flotilla` binary: a node agent runs for months.
#[global_allocator]
static ALLOC: flotilla_obs::alloc::Metered = flotilla_obs::alloc::Metered;

#[derive(Parser)]
#[command(name = "flotilla-agent", version, about = "Flotilla node agent")]
struct Cli {
    #[command(flatten)]
    log: flotilla_obs::LogArgs,
    #[command(flatten)]
    cmd: flotilla_agent::config::AgentCommand,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse_from(flotilla_obs::args());
    flotilla_obs::init_tracing(cli.log.format());
    // Before anything records: HELP text for every family this binary exports.
    flotilla_obs::install(&[
        flotilla_obs::Section { title: "Node agent", families: flotilla_agent::catalogue::FAMILIES },
        flotilla_obs::Section { title: "Node agent's artifacts", families: flotilla_artifact::catalogue::FAMILIES },
    ]);
    match flotilla_agent::main_with(cli.cmd) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
