//! `flotilla-loadtest policies`: one autoscaling evaluation for each of N apps (half on
//! `basic`, half on `utilization`), the way one scheduler host evaluates its apps every
//! interval. Reports the time of a whole round (target: 10,000 apps in ≤ 10 ms).

use std::time::Instant;

use clap::Args;
use flotilla_autoscale::{AutoscalingConfig, GroupUnits, Load, MemberUsage, Policy, Res, Signals, State, evaluate};
use hdrhistogram::Histogram;

use crate::common::machine;

#[derive(Debug, Args)]
pub struct PoliciesArgs {
    #[arg(long, default_value_t = 10_000)]
    pub apps: usize,
    /// Rounds of evaluation (each round evaluates every app once, 10 s of policy time apart).
    #[arg(long, default_value_t = 50)]
    pub rounds: u64,
    /// Members per app for the `utilization` policy.
    #[arg(long, default_value_t = 8)]
    pub members: usize,
    #[arg(long)]
    pub json: bool,
}

const GIB: u64 = 1 << 30;

fn policy(doc: &str) -> anyhow::Result<Policy> {
    Ok(AutoscalingConfig::policy_from_toml(doc)?)
}

pub fn run(a: PoliciesArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.apps > 0 && a.apps <= 1_000_000, "--apps must be within 1..=1000000");
    anyhow::ensure!(a.rounds > 0 && a.rounds <= 10_000, "--rounds must be within 1..=10000");
    let basic = policy(
        "[autoscaling]\npolicy = \"basic\"\n[autoscaling.basic]\ngraceful_decommission_timeout = \"1h\"\n\
         scale_up_factor = 0.5\nscale_down_factor = 0.5\n[autoscaling.basic.worker_config]\nmax_instances = 100\n",
    )?;
    let utilization = policy(
        "[autoscaling]\npolicy = \"utilization\"\n[autoscaling.utilization]\nscale_in_threshold_percent = 40\n\
         max_units = 100\n",
    )?;
    let mut apps: Vec<(Policy, State)> = (0..a.apps)
        .map(|i| {
            let p = if i % 2 == 0 { basic.clone() } else { utilization.clone() };
            let s = State::new(&p);
            (p, s)
        })
        .collect();
    let members: Vec<MemberUsage> = (0..a.members)
        .map(|i| MemberUsage { used: Res::new(500, (4 + i as u64 % 4) * GIB), allocated: Res::new(1000, 8 * GIB) })
        .collect();
    let units = GroupUnits { active: a.members as u32, decommissioning: 0 };
    let per_unit = Res::new(1000, 8 * GIB);
    let load = Load {
        pending: Res::new(2000, 16 * GIB),
        available: Res::new(500, 4 * GIB),
        allocated: Res::new(7000, 60 * GIB),
    };
    let basic_signals = Signals { primary: units, per_unit, load: Some(load), ..Default::default() };
    let util_signals = Signals { primary: units, per_unit, members: Some(&members), ..Default::default() };
    let mut rounds = Histogram::<u64>::new(3)?;
    let mut actions = 0u64;
    for round in 0..a.rounds {
        let now = round * 10_000;
        let started = Instant::now();
        for (i, (p, s)) in apps.iter_mut().enumerate() {
            let signals = if i % 2 == 0 { &basic_signals } else { &util_signals };
            let d = std::hint::black_box(evaluate(p, s, signals, now));
            actions += u64::from(d.desired != d.current);
        }
        rounds.record((started.elapsed().as_micros() as u64).max(1))?;
    }
    let ms = |q: f64| rounds.value_at_quantile(q) as f64 / 1000.0;
    println!(
        "{} apps, {} rounds: a round takes p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms ({:.0} ns per evaluation at p50); {} actions",
        a.apps,
        a.rounds,
        ms(0.5),
        ms(0.99),
        rounds.max() as f64 / 1000.0,
        ms(0.5) * 1e6 / a.apps as f64,
        actions
    );
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "apps": a.apps,
                "rounds": a.rounds,
                "round_p50_ms": ms(0.5),
                "round_p99_ms": ms(0.99),
                "round_max_ms": rounds.max() as f64 / 1000.0,
                "actions": actions,
                "machine": machine(),
            })
        );
    }
    Ok(())
}
