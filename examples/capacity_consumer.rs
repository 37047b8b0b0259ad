//! A batch consumer that paces itself by an app's serving capacity: it follows the app's
//! `WatchCapacity` stream and sends at `--per-weight` requests per second per unit of
//! route weight, so it slows down when (low-priority) capacity is taken back and speeds
//! up as units come.
//!
//! ```sh
//! cargo run --release -- up --app examples/echo.toml &
//! cargo run --release -- route --app echo --listen 127.0.0.1:8080 &
//! cargo run --example capacity_consumer -- --app echo --target http://127.0.0.1:8080/
//! cargo run --release -- scale echo --units 4        # the consumer speeds up
//! ```

use std::time::{Duration, Instant};

use clap::Parser;
use flotilla_router::{Pace, follow::Upstream, follow_capacity};

#[derive(Parser)]
struct Args {
    /// The app whose capacity sets the pace.
    #[arg(long)]
    app: String,
    /// The control plane.
    #[arg(long, env = "FLOTILLA_ADDR", default_value = "http://127.0.0.1:7700")]
    control: String,
    /// Requests per second per unit of route weight.
    #[arg(long, default_value_t = 20.0)]
    per_weight: f64,
    /// Where to send (e.g. `flotilla route` in front of the app); without it, requests are only counted.
    #[arg(long)]
    target: Option<String>,
    /// Only capacity on high-priority nodes counts.
    #[arg(long)]
    high_only: bool,
    /// Stop after this many seconds (0: run until stopped).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let pace = Pace { per_weight: a.per_weight, floor: 0.5, ceiling: 10_000.0 };
    let upstream = Upstream { http: reqwest::Client::new(), dialer: flotilla_proto::dial::Dialer::network() };
    let capacity = follow_capacity(a.control.clone(), a.app.clone(), upstream);
    let priorities: &[&str] = if a.high_only { &["high"] } else { &[] };
    let http = reqwest::Client::builder().timeout(Duration::from_secs(5)).build()?;
    let started = Instant::now();
    let (mut window, mut sent, mut failed) = (Instant::now(), 0u64, 0u64);
    loop {
        let rate = pace.rate(&capacity.borrow(), priorities);
        tokio::time::sleep(Duration::from_secs_f64(1.0 / rate)).await;
        sent += 1;
        if let Some(t) = &a.target
            && !http.get(t).send().await.is_ok_and(|r| r.status().is_success())
        {
            failed += 1;
        }
        if window.elapsed() >= Duration::from_secs(1) {
            let c = capacity.borrow().clone();
            println!(
                "{{\"rate\": {rate:.1}, \"sent_per_second\": {:.1}, \"failed\": {failed}, \"total_weight\": {:.2}}}",
                sent as f64 / window.elapsed().as_secs_f64(),
                c.total_weight
            );
            (window, sent, failed) = (Instant::now(), 0, 0);
        }
        if a.seconds > 0 && started.elapsed() >= Duration::from_secs(a.seconds) {
            return Ok(());
        }
    }
}
