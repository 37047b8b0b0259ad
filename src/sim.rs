//! `flotilla sim`: replays a load trace through an autoscaling policy in simulated time, so a
//! policy can be tried and compared on a laptop before an app runs it. The simulation is
//! `flotilla_autoscale::sim`; this file reads the files, prints and plots.

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
    #[arg(long)]
    trace: PathBuf,
    /// The policy: an `[autoscaling]` table as in an app spec, plus an optional `[sim]` table.
    #[arg(long)]
    policy: PathBuf,
    /// End with one compact JSON line of the results instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw demand, capacity and pending over time to this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
}

pub fn run(a: SimArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let policy_text = crate::cli::read_capped(&a.policy, MAX_POLICY_BYTES, "policy file")?;
    let (policy, model) = policy_file_from_toml(&policy_text).with_context(|| format!("{}", a.policy.display()))?;
    let trace_text = crate::cli::read_capped(&a.trace, MAX_TRACE_BYTES, "trace")?;
    let trace = Trace::parse_csv(&trace_text).with_context(|| format!("{}", a.trace.display()))?;
    let report = simulate(&policy, &model, &trace);
    let wall_seconds = started.elapsed().as_secs_f64();
    if let Some(out) = &a.plot {
        plot(out, &report, &a.trace).with_context(|| format!("plotting to {}", out.display()))?;
    }
    if a.json {
        let mut v = serde_json::to_value(&report)?;
        if let Some(o) = v.as_object_mut() {
            o.insert("wall_seconds".into(), wall_seconds.into());
        }
        println!("{v}");
    } else {
        println!("{report}");
        println!("wall            {wall_seconds:.3}s (parse and simulate)");
    }
    Ok(())
}

/// Picks one plotted value out of a sample.
type Value = fn(&Sample) -> f64;

/// Labels are written as SVG `<text>` (plotters' SVG backend without a font feature), so no
/// font file is needed to draw them.
fn plot(out: &Path, r: &SimReport, trace: &Path) -> anyhow::Result<()> {
    let hours = r.simulated_seconds > 2.0 * 3600.0;
    let (per, unit) = if hours { (3600.0, "hours") } else { (60.0, "minutes") };
    let x = |p: &Sample| p.at_s / per;
    let x_end = (r.simulated_seconds / per).max(f64::MIN_POSITIVE);
    let y_max = r.series.iter().map(|p| p.demand.max(p.units).max(p.pending)).fold(1.0, f64::max) * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1200, 500)).into_drawing_area();
        root.fill(&WHITE)?;
        let name = trace.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        let mut chart = ChartBuilder::on(&root)
            .caption(format!("{name}: {} policy", r.policy), ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..x_end, 0.0..y_max)?;
        chart.configure_mesh().x_desc(format!("time ({unit})")).y_desc("units").draw()?;
        let series: [(&str, RGBColor, Value); 4] = [
            ("demand", BLUE, |p| p.demand),
            ("running capacity", RGBColor(0, 150, 0), |p| p.capacity),
            ("units paid (incl. starting, draining)", RGBColor(150, 150, 150), |p| p.units),
            ("pending", RED, |p| p.pending),
        ];
        for (label, color, value) in series {
            chart
                .draw_series(LineSeries::new(r.series.iter().map(|p| (x(p), value(p))), color.stroke_width(2)))?
                .label(label)
                .legend(move |(lx, ly)| PathElement::new(vec![(lx, ly), (lx + 20, ly)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
        root.present()?;
    }
    std::fs::write(out, svg)?;
    Ok(())
}
