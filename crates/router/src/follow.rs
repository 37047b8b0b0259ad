//! Keeps a balancer's endpoints equal to an app's route table: finds the scheduler through
//! the control plane, then follows its `WatchRoutes` stream. When the stream breaks, the
//! last table stays in force (stale routes beat none) while it reconnects. On the same
//! connection it reports what each version answered (`crate::report`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_core::Backoff;
use flotilla_proto::dial::Dialer;
use flotilla_proto::v1::{self, route_service_client::RouteServiceClient};

use crate::Balancer;
use crate::balancer::Split;
use crate::catalogue::{self as m, Labels};
use crate::report::{self, Reporter};

/// How the router reaches the control plane and the scheduler serving the routes: the
/// HTTP client and the gRPC dialer, both trusting the CA of an HTTPS control API.
#[derive(Clone)]
pub struct Upstream {
    pub http: reqwest::Client,
    pub dialer: Dialer,
}

/// Where `app`'s route table is served: its standalone scheduler, or the control plane.
pub(crate) async fn locate(http: &reqwest::Client, control: &str, app: &str) -> anyhow::Result<String> {
    let control = control.trim_end_matches('/');
    let resp = http.get(format!("{control}/v1/apps/{app}")).timeout(Duration::from_secs(5)).send().await?;
    anyhow::ensure!(resp.status().is_success(), "the control plane answered {} for app {app}", resp.status());
    let v: serde_json::Value = resp.json().await?;
    Ok(v["scheduler_url"].as_str().unwrap_or(control).to_string())
}

/// Applies one table to the balancer; returns how many endpoints changed. (The weights
/// themselves are read from the balancer at scrape time: [`Labels::export_weights`].)
pub fn apply(balancer: &Balancer, labels: &Labels, table: &v1::RouteTable, now: Instant) -> usize {
    let routes: Vec<(String, f64, Arc<str>)> =
        table.routes.iter().map(|r| (r.endpoint.clone(), r.weight, Arc::from(r.version.as_str()))).collect();
    labels.set_nodes(table.routes.iter().map(|r| (r.endpoint.as_str(), r.node_id.as_str())));
    let split = table.split.as_ref().map(|s| Split { version: s.version.clone(), share: s.share });
    metrics::gauge!(m::SPLIT_SHARE.name, "app" => labels.app().to_string())
        .set(split.as_ref().map_or(0.0, |s| s.share));
    let changed = balancer.update_versions(&routes, split, now);
    metrics::counter!(m::ROUTE_WEIGHT_CHANGES.name, "app" => labels.app().to_string()).increment(changed as u64);
    metrics::gauge!(m::ENDPOINTS.name).set(routes.iter().filter(|r| r.1 > 0.0).count() as f64);
    metrics::gauge!(m::TABLE_VERSION.name).set(table.version as f64);
    changed
}

/// Runs until the process stops. Every stream that delivered a table resets the
/// back-off: a router whose scheduler moved reconnects at once, not after the wait the
/// last bad spell built up (the stale routes serve meanwhile).
pub async fn follow_app(control: String, labels: Arc<Labels>, balancer: Arc<Balancer>, upstream: Upstream) {
    let app = labels.app().to_string();
    // Jittered, so the routers of a restarted scheduler do not all come back at once.
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5)).with_jitter(0.5);
    let mut reporter = Reporter::new(&app);
    loop {
        match watch_once(&control, &labels, &balancer, &upstream, &mut backoff, &mut reporter).await {
            Ok(()) => tracing::warn!(%app, "the route stream ended; reconnecting"),
            Err(e) => tracing::warn!(%app, error = %format!("{e:#}"), "following routes; retrying"),
        }
        metrics::counter!(m::STREAM_RECONNECTS.name).increment(1);
        tokio::time::sleep(backoff.next_wait()).await;
    }
}

async fn watch_once(
    control: &str,
    labels: &Labels,
    balancer: &Balancer,
    upstream: &Upstream,
    backoff: &mut Backoff,
    reporter: &mut Reporter,
) -> anyhow::Result<()> {
    let app = labels.app();
    let url = locate(&upstream.http, control, app).await?;
    let mut client = RouteServiceClient::new(upstream.dialer.connect(&url, None).await?);
    let mut stream = client.watch_routes(v1::WatchRoutesRequest { app: app.to_string() }).await?.into_inner();
    tracing::info!(%app, %url, "following the route table");
    let mut tick = tokio::time::interval(report::INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            table = stream.message() => {
                let Some(table) = table? else { return Ok(()) };
                backoff.reset();
                let changed = apply(balancer, labels, &table, Instant::now());
                tracing::debug!(%app, version = table.version, changed, "route table");
            }
            _ = tick.tick() => {
                // Only while a canary splits the traffic: nothing else reads the numbers.
                let Some(r) = reporter.collect(balancer).filter(|_| balancer.split().is_some()) else { continue };
                // Sent beside the stream, so a table is never held up behind a report. One
                // that does not arrive loses its interval's numbers, nothing else: the
                // scheduler judges on what reached it.
                let (mut client, app) = (client.clone(), app.to_string());
                tokio::spawn(async move {
                    let sent = tokio::time::timeout(report::INTERVAL, client.report_traffic(r)).await;
                    let outcome = if matches!(sent, Ok(Ok(_))) { "sent" } else { "failed" };
                    if let Ok(Err(e)) = &sent {
                        tracing::debug!(%app, error = %e, "reporting traffic");
                    }
                    metrics::counter!(m::TRAFFIC_REPORTS.name, "outcome" => outcome).increment(1);
                });
            }
        }
    }
}
