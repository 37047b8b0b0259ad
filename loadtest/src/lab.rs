//! `flotilla-loadtest lab --soak`: the long mixed-fault run on lab hosts (network
//! namespaces, `flotilla_testkit::lab::soak`), as root. Each operation is printed to
//! stderr as it happens; the summary (and with `--json` one object on the last line)
//! names hosts, operations, partitions, violations and the seconds to converge after the
//! last heal. A run with a violation exits non-zero after printing them.

use clap::Args;

use crate::common::machine;

#[derive(Debug, Args)]
pub struct LabArgs {
    /// Mix partitions, loss, kills and churn for `--minutes` (the only lab run so far).
    #[arg(long)]
    pub soak: bool,
    #[arg(long, default_value_t = 10.0)]
    pub minutes: f64,
    /// Picks the operations, their targets and their timing: the same seed, the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: LabArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.soak, "say --soak: the mixed-fault soak is the lab run this command has");
    anyhow::ensure!(a.minutes > 0.0 && a.minutes <= 24.0 * 60.0, "--minutes must be above 0 and at most a day");
    // SAFETY: geteuid has no memory effects.
    anyhow::ensure!(unsafe { libc::geteuid() } == 0, "the lab makes network namespaces: run it as root");
    let started = std::time::Instant::now();
    let report = flotilla_testkit::lab::soak(a.minutes, a.seed, |op| {
        eprintln!("[{:7.1}s] {op}", started.elapsed().as_secs_f64());
    });
    println!(
        "lab soak (seed {}, {}): {} hosts, {:.0} s, {} operations ({} partitions, {} agent kills), {} samples, {} violations, converged {:.1} s after the last heal",
        a.seed,
        machine(),
        report.hosts,
        report.seconds,
        report.operations,
        report.partitions,
        report.kills,
        report.samples,
        report.violations.len(),
        report.converged_seconds
    );
    for v in &report.violations {
        println!("  violation: {v}");
    }
    if a.json {
        println!("{}", report.to_json(a.seed));
    }
    anyhow::ensure!(report.violations.is_empty(), "{} violations", report.violations.len());
    Ok(())
}
