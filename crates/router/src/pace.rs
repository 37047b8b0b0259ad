//! Pacing a consumer by an app's serving capacity (Astra's auto-throttle): a batch client
//! that sends at a rate proportional to what the app can serve slows down when
//! low-priority capacity is taken back, and speeds up when units come, without waiting
//! for errors to tell it.

use std::sync::Arc;
use std::time::Duration;

use flotilla_core::Backoff;
use flotilla_proto::v1::{self, route_service_client::RouteServiceClient};
use tokio::sync::watch;

use crate::follow::{Upstream, locate};

/// How fast a consumer may go: `per_weight` requests per second for each unit of route
/// weight the app serves with (a healthy member on a reference node weighs 1), never
/// below `floor` (a consumer that stops entirely cannot tell when to start again) nor
/// above `ceiling`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Pace {
    pub per_weight: f64,
    pub floor: f64,
    pub ceiling: f64,
}

impl Pace {
    /// Requests per second for `capacity`. Only `priorities` count (`["high"]` for a
    /// consumer that must not lean on preemptible capacity; empty for all).
    pub fn rate(&self, capacity: &v1::Capacity, priorities: &[&str]) -> f64 {
        let weight: f64 = capacity
            .by_priority
            .iter()
            .filter(|p| priorities.is_empty() || priorities.contains(&p.priority.as_str()))
            .map(|p| p.weight)
            .sum();
        (weight * self.per_weight).clamp(self.floor, self.ceiling.max(self.floor))
    }
}

/// Follows `app`'s capacity (`WatchCapacity`, found through the control plane as routes
/// are) until the process stops; the receiver holds the latest. A broken stream keeps
/// the last capacity while it reconnects.
pub fn follow_capacity(control: String, app: String, upstream: Upstream) -> watch::Receiver<Arc<v1::Capacity>> {
    let (tx, rx) = watch::channel(Arc::new(v1::Capacity { app: app.clone(), ..Default::default() }));
    tokio::spawn(async move {
        let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5)).with_jitter(0.5);
        loop {
            let once = async {
                let url = locate(&upstream.http, &control, &app).await?;
                let mut client = RouteServiceClient::new(upstream.dialer.connect(&url, None).await?);
                let req = v1::WatchRoutesRequest { app: app.clone() };
                let mut stream = client.watch_capacity(req).await?.into_inner();
                while let Some(c) = stream.message().await? {
                    backoff.reset();
                    if tx.send(Arc::new(c)).is_err() {
                        return Ok(());
                    }
                }
                anyhow::Ok(())
            };
            if let Err(e) = once.await {
                tracing::warn!(%app, error = %format!("{e:#}"), "following capacity; retrying");
            }
            if tx.is_closed() {
                return;
            }
            tokio::time::sleep(backoff.next_wait()).await;
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn capacity(high: f64, low: f64) -> v1::Capacity {
        let p = |priority: &str, weight| v1::PriorityCapacity { priority: priority.into(), weight, resources: None };
        v1::Capacity {
            app: "a".into(),
            version: 1,
            total_weight: high + low,
            by_priority: vec![p("high", high), p("low", low)],
        }
    }

    #[test]
    fn the_rate_follows_the_weight_within_its_bounds() {
        let pace = Pace { per_weight: 10.0, floor: 1.0, ceiling: 100.0 };
        assert_eq!(pace.rate(&capacity(2.0, 1.0), &[]), 30.0);
        assert_eq!(pace.rate(&capacity(2.0, 1.0), &["high"]), 20.0, "preemptible capacity left out");
        assert_eq!(pace.rate(&capacity(0.0, 0.0), &[]), 1.0, "never stops");
        assert_eq!(pace.rate(&capacity(50.0, 0.0), &[]), 100.0, "never past the ceiling");
    }
}
