//! The balancer as a `tower::Service`: each call goes to the endpoint the balancer picks,
//! through that endpoint's own service, and its latency and outcome feed the balancer.

use flotilla_core::LockExt;
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tower::{Service, ServiceExt};

use crate::balancer::{Balancer, Outcome};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Decides whether a response counts as a failure for the endpoint that gave it.
pub trait Classify<R, E>: Send + Sync {
    fn classify(&self, result: &Result<R, E>) -> Outcome;
}

/// HTTP: transport errors and 5xx answers are failures.
#[derive(Clone, Copy, Default)]
pub struct HttpClassify;

impl<B, E> Classify<http::Response<B>, E> for HttpClassify {
    fn classify(&self, result: &Result<http::Response<B>, E>) -> Outcome {
        match result {
            Ok(r) if !r.status().is_server_error() => Outcome::Success,
            _ => Outcome::Failure,
        }
    }
}

/// No endpoint may take traffic (none known, all weight 0, or all ejected).
#[derive(Debug)]
pub struct NoEndpoint;

impl std::error::Error for NoEndpoint {}

impl std::fmt::Display for NoEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("no endpoint can take the request")
    }
}

/// What the caller learns about each finished call (for metrics and logs).
#[derive(Debug, Clone)]
pub struct CallReport {
    pub endpoint: String,
    pub outcome: Outcome,
    pub seconds: f64,
    pub ejected_for: Option<std::time::Duration>,
    /// The endpoint was at the latency floor and served the call as a probe.
    pub probe: bool,
}

type MakeService<S> = dyn Fn(&str) -> S + Send + Sync;
type Report = dyn Fn(CallReport) + Send + Sync;

/// `tower::Service` over a [`Balancer`]. `make` builds the service for one endpoint
/// address (kept and reused while the endpoint exists).
pub struct Balance<S, C> {
    balancer: Arc<Balancer>,
    make: Arc<MakeService<S>>,
    services: Arc<Mutex<HashMap<String, S>>>,
    classify: Arc<C>,
    report: Option<Arc<Report>>,
}

impl<S, C> Clone for Balance<S, C> {
    fn clone(&self) -> Self {
        Balance {
            balancer: self.balancer.clone(),
            make: self.make.clone(),
            services: self.services.clone(),
            classify: self.classify.clone(),
            report: self.report.clone(),
        }
    }
}

impl<S: Clone, C> Balance<S, C> {
    pub fn new(balancer: Arc<Balancer>, make: impl Fn(&str) -> S + Send + Sync + 'static, classify: C) -> Self {
        Balance {
            balancer,
            make: Arc::new(make),
            services: Default::default(),
            classify: Arc::new(classify),
            report: None,
        }
    }

    /// Called once per finished call.
    pub fn with_report(mut self, report: impl Fn(CallReport) + Send + Sync + 'static) -> Self {
        self.report = Some(Arc::new(report));
        self
    }

    pub fn balancer(&self) -> &Arc<Balancer> {
        &self.balancer
    }

    fn service_for(&self, addr: &str) -> S {
        let mut g = self.services.lock_or_recover();
        if let Some(s) = g.get(addr) {
            return s.clone();
        }
        if g.len() > 4 * self.balancer.endpoints().len() + 16 {
            // Forget services of endpoints that left.
            let live = self.balancer.endpoints();
            g.retain(|a, _| live.iter().any(|e| &e.addr == a));
        }
        g.entry(addr.to_string()).or_insert_with(|| (self.make)(addr)).clone()
    }
}

impl<S, C, Req> Service<Req> for Balance<S, C>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
    S::Error: Into<BoxError>,
    S::Response: Send,
    C: Classify<S::Response, S::Error> + 'static,
    Req: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness is per endpoint; it is awaited once the endpoint is chosen.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let pick = self.balancer.pick(Instant::now(), &mut rand::rng());
        let Some(pick) = pick else { return Box::pin(async { Err(Box::new(NoEndpoint) as BoxError) }) };
        let svc = self.service_for(&pick.endpoint.addr);
        let (balancer, classify, report) = (self.balancer.clone(), self.classify.clone(), self.report.clone());
        Box::pin(async move {
            let started = Instant::now();
            let result = svc.oneshot(req).await;
            let outcome = classify.classify(&result);
            let (endpoint, probe) = (pick.endpoint.addr.clone(), pick.probe);
            let finished = balancer.finish(pick, outcome, Instant::now());
            if let Some(report) = report {
                report(CallReport {
                    endpoint,
                    outcome,
                    seconds: started.elapsed().as_secs_f64(),
                    ejected_for: finished.ejected_for,
                    probe,
                });
            }
            result.map_err(Into::into)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::balancer::Config;

    #[tokio::test]
    async fn calls_go_to_endpoints_and_failures_are_reported() {
        let b = Arc::new(Balancer::new(Config { slow_start: std::time::Duration::ZERO, ..Config::default() }));
        b.update(&[("ok".into(), 1.0), ("bad".into(), 1.0)], Instant::now());
        let reports = Arc::new(Mutex::new(Vec::new()));
        let r2 = reports.clone();
        let svc = Balance::new(
            b,
            |addr: &str| {
                let addr = addr.to_string();
                tower::service_fn(move |_: ()| {
                    let addr = addr.clone();
                    async move {
                        let code = if addr == "bad" { 503 } else { 200 };
                        Ok::<_, std::convert::Infallible>(http::Response::builder().status(code).body(addr).unwrap())
                    }
                })
            },
            HttpClassify,
        )
        .with_report(move |r| r2.lock().unwrap().push(r));
        for _ in 0..50 {
            let resp = svc.clone().oneshot(()).await.unwrap();
            assert!(resp.body() == "ok" || resp.body() == "bad");
        }
        let reports = reports.lock().unwrap();
        assert_eq!(reports.len(), 50);
        assert!(reports.iter().all(|r| (r.endpoint == "bad") == (r.outcome == Outcome::Failure)));
        let bad = reports.iter().filter(|r| r.endpoint == "bad").count();
        assert!(bad < 25, "the failing endpoint is avoided: {bad} of 50");
    }

    #[tokio::test]
    async fn no_endpoint_is_an_error() {
        let b = Arc::new(Balancer::new(Config::default()));
        let svc = Balance::new(
            b,
            |_: &str| tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(http::Response::new(())) }),
            HttpClassify,
        );
        let err = svc.oneshot(()).await.unwrap_err();
        assert!(err.to_string().contains("no endpoint"));
    }
}
