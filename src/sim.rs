//! `flotilla sim`: replays a load trace through an autoscaling policy in simulated time, so a
//! policy can be tried and compared on a laptop before an app runs it
//! (`flotilla_autoscale::sim`); or, with `--pool`, a demand trace through the pool
//! autoscaler (`flotilla_pool::sim`). This file reads the files, prints and plots.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use flotilla_autoscale::{Sample, SimReport, Trace, policy_file_from_toml, simulate};
use plotters::prelude::*;

/// A million rows of CSV is well under this; reading stops here rather than filling memory.
const MAX_TRACE_BYTES: u64 = 128 << 20;
const MAX_POLICY_BYTES: u64 = 1 << 20;

#[derive(clap::Args)]
pub struct SimArgs {
    /// The load trace: CSV with the header `time_s,cpu_millis,memory_bytes[,utilization]`.
    #[arg(long, required_unless_present = "pool", requires = "policy", conflicts_with = "pool")]
    trace: Option<PathBuf>,
    /// The policy: an `[autoscaling]` table as in an app spec, plus an optional `[sim]` table.
    #[arg(long, requires = "trace")]
    policy: Option<PathBuf>,
    /// A pool file (as `up --autoscale --pool` takes): simulate the pool autoscaler over
    /// `--demand` instead of an app's policy.
    #[arg(long, requires = "demand")]
    pool: Option<PathBuf>,
    /// The pool's demand: CSV with the header `time_s,app,units,cpu,memory`.
    #[arg(long, requires = "pool")]
    demand: Option<PathBuf>,
    /// With `--pool`: seconds from a launch to the node registered (default: the local
    /// provider's `boot_delay`, else 60).
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=3600))]
    boot_seconds: Option<u64>,
    /// With `--pool`: seconds from a unit placed to running.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(0..=3600))]
    start_seconds: u64,
    /// With `--pool`: the apps' `disruption.quiet_period` in seconds (no unit moves sooner
    /// after it was placed).
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    quiet_seconds: u64,
    /// End with one compact JSON line of the results instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw demand, capacity and pending over time to this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
}

pub fn run(a: SimArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    if let (Some(pool), Some(demand)) = (&a.pool, &a.demand) {
        return run_pool(&a, pool, demand, started);
    }
    let (Some(trace_file), Some(policy_file)) = (&a.trace, &a.policy) else {
        anyhow::bail!("give --trace and --policy (an app's policy), or --pool and --demand (a pool)");
    };
    let policy_text = crate::cli::read_capped(policy_file, MAX_POLICY_BYTES, "policy file")?;
    let (policy, model) = policy_file_from_toml(&policy_text).with_context(|| format!("{}", policy_file.display()))?;
    let trace_text = crate::cli::read_capped(trace_file, MAX_TRACE_BYTES, "trace")?;
    let trace = Trace::parse_csv(&trace_text).with_context(|| format!("{}", trace_file.display()))?;
    let report = simulate(&policy, &model, &trace);
    let wall_seconds = started.elapsed().as_secs_f64();
    if let Some(out) = &a.plot {
        plot(out, &report, trace_file).with_context(|| format!("plotting to {}", out.display()))?;
    }
    if a.json {
        print_json(&report, wall_seconds)?;
    } else {
        println!("{report}");
        println!("wall            {wall_seconds:.3}s (parse and simulate)");
    }
    Ok(())
}

/// A report as one compact JSON line, with the command's own wall time added.
fn print_json(report: &impl serde::Serialize, wall_seconds: f64) -> anyhow::Result<()> {
    let mut v = serde_json::to_value(report)?;
    if let Some(o) = v.as_object_mut() {
        o.insert("wall_seconds".into(), wall_seconds.into());
    }
    println!("{v}");
    Ok(())
}

/// The pool simulation: every run as a table row (or JSON), and the configured run's
/// nodes against the demand as an SVG.
fn run_pool(a: &SimArgs, pool_file: &Path, demand_file: &Path, started: Instant) -> anyhow::Result<()> {
    use flotilla_pool::config::{PoolConfig, ProviderConfig};
    use flotilla_pool::sim::{Demand, Timing};
    let pool_text = crate::cli::read_capped(pool_file, MAX_POLICY_BYTES, "pool file")?;
    let cfg = PoolConfig::parse(&pool_text).with_context(|| format!("{}", pool_file.display()))?;
    let demand_text = crate::cli::read_capped(demand_file, MAX_TRACE_BYTES, "demand")?;
    let demand = Demand::parse_csv(&demand_text).with_context(|| format!("{}", demand_file.display()))?;
    let boot = match (&a.boot_seconds, &cfg.provider) {
        (Some(s), _) => *s,
        (None, ProviderConfig::Local { boot_delay: Some(b) }) => b.as_secs(),
        _ => 60,
    };
    let timing = Timing { boot_ms: boot * 1000, start_ms: a.start_seconds * 1000, quiet_ms: a.quiet_seconds * 1000 };
    anyhow::ensure!(flotilla_pool::sim::install_clock(), "simulated time could not be installed");
    // The autoscaler's logs are the real one's; a simulation prints its summary only.
    let report = tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
        flotilla_pool::sim::simulate(&cfg, &demand, timing)
    })?;
    let wall_seconds = started.elapsed().as_secs_f64();
    if let Some(out) = &a.plot {
        plot_pool(out, &report, demand_file).with_context(|| format!("plotting to {}", out.display()))?;
    }
    if a.json {
        return print_json(&report, wall_seconds);
    }
    let on_off = |b: bool| if b { "on" } else { "off" };
    let mut t = crate::cli::table::Table::new(&[
        "CONSOLIDATION",
        "WARM",
        ">NODE-HOURS",
        ">COST",
        ">MOVED",
        ">WAIT P50/P99 (S)",
        ">END NODES",
        ">END COST/H",
        ">CHEAPEST/H",
    ]);
    for r in &report.runs {
        t.row(vec![
            on_off(r.consolidation).into(),
            on_off(r.warm).into(),
            format!("{:.1}", r.node_hours),
            format!("{:.2}", r.cost),
            r.units_moved.to_string(),
            format!("{:.0} / {:.0}", r.pending_p50_s, r.pending_p99_s),
            r.final_nodes.to_string(),
            format!("{:.3}", r.final_cost_per_hour),
            r.optimal_cost_per_hour.map_or_else(|| "-".into(), |o| format!("{o:.3}")),
        ]);
    }
    print!("{}", t.render(""));
    println!("CHEAPEST/H: the cheapest pool for the units the trace ends with (and its warm nodes), exact");
    let failed: u64 = report.runs.iter().map(|r| r.failed_passes).sum();
    if failed > 0 {
        println!("{failed} pool passes failed");
    }
    println!("simulated {:.1} h in {wall_seconds:.3}s", report.simulated_seconds as f64 / 3600.0);
    Ok(())
}

fn plot_pool(out: &Path, r: &flotilla_pool::sim::PoolSimReport, demand: &Path) -> anyhow::Result<()> {
    use flotilla_pool::sim::Point;
    let Some(first) = r.runs.first() else { return Ok(()) };
    let (per, unit) = if r.simulated_seconds > 2 * 3600 { (3600.0, "hours") } else { (60.0, "minutes") };
    let line = |label: String, color: RGBColor, series: &[Point], value: fn(&Point) -> f64| Line {
        label,
        color,
        points: series.iter().map(|p| (p.at_s as f64 / per, value(p))).collect(),
    };
    let mut lines = vec![
        line("units wanted".into(), BLUE, &first.series, |p| f64::from(p.demand)),
        line("units running".into(), RGBColor(0, 150, 0), &first.series, |p| p.running as f64),
        line("nodes paid".into(), RED, &first.series, |p| p.nodes as f64),
    ];
    if let Some(o) = r.runs.iter().find(|o| o.consolidation != first.consolidation && o.warm == first.warm) {
        let label = format!("nodes paid, consolidation {}", if o.consolidation { "on" } else { "off" });
        lines.push(line(label, RGBColor(150, 150, 150), &o.series, |p| p.nodes as f64));
    }
    let name = demand.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let chart = Chart {
        title: format!("{name}: pool autoscaler"),
        x_desc: format!("time ({unit})"),
        x_end: r.simulated_seconds as f64 / per,
        y_desc: "units, nodes",
        legend: SeriesLabelPosition::UpperRight,
    };
    draw(out, &chart, &lines)
}

/// Picks one plotted value out of a sample.
type Value = fn(&Sample) -> f64;

fn plot(out: &Path, r: &SimReport, trace: &Path) -> anyhow::Result<()> {
    let (per, unit) = if r.simulated_seconds > 2.0 * 3600.0 { (3600.0, "hours") } else { (60.0, "minutes") };
    let series: [(&str, RGBColor, Value); 4] = [
        ("demand", BLUE, |p| p.demand),
        ("running capacity", RGBColor(0, 150, 0), |p| p.capacity),
        ("units paid (incl. starting, draining)", RGBColor(150, 150, 150), |p| p.units),
        ("pending", RED, |p| p.pending),
    ];
    let lines: Vec<Line> = series
        .into_iter()
        .map(|(label, color, value)| Line {
            label: label.into(),
            color,
            points: r.series.iter().map(|p| (p.at_s / per, value(p))).collect(),
        })
        .collect();
    let name = trace.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let chart = Chart {
        title: format!("{name}: {} policy", r.policy),
        x_desc: format!("time ({unit})"),
        x_end: r.simulated_seconds / per,
        y_desc: "units",
        legend: SeriesLabelPosition::UpperLeft,
    };
    draw(out, &chart, &lines)
}

struct Chart {
    title: String,
    x_desc: String,
    x_end: f64,
    y_desc: &'static str,
    legend: SeriesLabelPosition,
}

struct Line {
    label: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// Labels are written as SVG `<text>` (plotters' SVG backend without a font feature), so no
/// font file is needed to draw them.
fn draw(out: &Path, c: &Chart, lines: &[Line]) -> anyhow::Result<()> {
    let y_max = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1)).fold(1.0, f64::max) * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 500)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&c.title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..c.x_end.max(f64::MIN_POSITIVE), 0.0..y_max)?;
        chart.configure_mesh().x_desc(&c.x_desc).y_desc(c.y_desc).draw()?;
        for l in lines {
            let color = l.color;
            chart
                .draw_series(LineSeries::new(l.points.iter().copied(), color.stroke_width(2)))?
                .label(l.label.as_str())
                .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(c.legend.clone())
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    std::fs::write(out, svg)?;
    Ok(())
}
