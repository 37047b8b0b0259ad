//! The deterministic fault simulation over many seeds (docs/architecture.md §15). CI runs 1,000;
//! `FLOTILLA_SIM_SEEDS=N` runs N, `FLOTILLA_SIM_SEED=S` replays one seed.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::time::Instant;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// `FLOTILLA_SIM_LOG=debug` (an env filter) logs a replay in simulated time.
fn log() {
    struct SimTime;
    impl tracing_subscriber::fmt::time::FormatTime for SimTime {
        fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
            write!(w, "{:>8.3}s", turmoil::sim_elapsed().unwrap_or_default().as_secs_f64())
        }
    }
    if let Ok(filter) = std::env::var("FLOTILLA_SIM_LOG") {
        let _ = tracing_subscriber::fmt().with_env_filter(filter).with_timer(SimTime).try_init();
    }
}

#[test]
fn every_seed_keeps_the_invariants() {
    log();
    let seeds: Vec<u64> = match env("FLOTILLA_SIM_SEED") {
        Some(s) => vec![s],
        None => {
            let first = env("FLOTILLA_SIM_FIRST").unwrap_or(0);
            (first..first + env("FLOTILLA_SIM_SEEDS").unwrap_or(1000)).collect()
        }
    };
    let started = Instant::now();
    // Two threads (the machine's cores); each simulation runs on one thread.
    let (even, odd): (Vec<u64>, Vec<u64>) = seeds.iter().partition(|s| *s % 2 == 0);
    let results: Vec<Result<flotilla_faults::Outcome, flotilla_faults::Violation>> = std::thread::scope(|scope| {
        let handles: Vec<_> = [even, odd]
            .into_iter()
            .map(|part| scope.spawn(move || part.into_iter().map(flotilla_faults::run).collect::<Vec<_>>()))
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    if seeds.len() == 1 {
        println!("{results:#?}");
    }
    let failures: Vec<String> = results.iter().filter_map(|r| r.as_ref().err()).map(|v| v.to_string()).collect();
    let checks: u64 = results.iter().filter_map(|r| r.as_ref().ok()).map(|o| o.checks).sum();
    let fenced: u32 = results.iter().filter_map(|r| r.as_ref().ok()).map(|o| o.deposed_fenced).sum();
    println!(
        "{} seeds, {} failed, {checks} invariant checks, {fenced} deposed-scheduler requests fenced, {:.1}s",
        results.len(),
        failures.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(results.len(), seeds.len(), "a simulation thread panicked");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
