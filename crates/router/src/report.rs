//! What this router saw of each version, sent every [`INTERVAL`] to the scheduler that
//! serves its routes (`RouteService.ReportTraffic`, on the connection the route stream
//! uses), which judges a canary rollout on it. Deltas since the last report, so the
//! scheduler adds up several routers' numbers and a lost report loses only its interval.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use flotilla_proto::v1;

use crate::balancer::{Balancer, Counts, Endpoint};
use crate::catalogue as m;

/// How often a router reports.
pub const INTERVAL: Duration = Duration::from_secs(2);

/// The counts each endpoint had at the last report. Keyed by the endpoint's address in
/// memory, held by a `Weak` so the address is not reused while the entry lives: an
/// endpoint that left and came back is a new one, counted from 0.
pub struct Reporter {
    router: String,
    app: String,
    last: HashMap<usize, (Weak<Endpoint>, Counts)>,
    /// The balancer's `unserved` at the last report.
    unserved: Counts,
}

impl Reporter {
    pub fn new(app: &str) -> Reporter {
        let router = format!("router-{}-{:08x}", std::process::id(), rand::random::<u32>());
        Reporter { router, app: app.to_string(), last: HashMap::new(), unserved: Counts::default() }
    }

    /// What each version answered since the last call; `None` when nothing did.
    pub fn collect(&mut self, balancer: &Balancer) -> Option<v1::TrafficReport> {
        let mut by: BTreeMap<Arc<str>, Counts> = BTreeMap::new();
        let mut next = HashMap::with_capacity(self.last.len());
        for e in balancer.endpoints().iter() {
            let key = Arc::as_ptr(e) as usize;
            let now = e.traffic.counts();
            let delta = match self.last.get(&key) {
                Some((_, before)) => now.since(before),
                None => now.clone(),
            };
            if delta.requests > 0 {
                by.entry(e.version()).or_default().add(&delta);
            }
            next.insert(key, (Arc::downgrade(e), now));
        }
        self.last = next;
        let unserved = balancer.unserved.counts();
        let delta = unserved.since(&self.unserved);
        self.unserved = unserved;
        if let Some(split) = balancer.split().filter(|_| delta.requests > 0) {
            by.entry(Arc::from(split.version.as_str())).or_default().add(&delta);
        }
        if by.is_empty() {
            return None;
        }
        let versions = by
            .into_iter()
            .map(|(version, c)| {
                let ok = c.requests - c.errors.min(c.requests);
                let count = |result: &'static str, n: u64| {
                    metrics::counter!(m::VERSION_REQUESTS.name, "app" => self.app.clone(), "version" => version.to_string(), "result" => result)
                        .increment(n)
                };
                count("ok", ok);
                count("error", c.errors);
                v1::VersionTraffic { version: version.to_string(), requests: c.requests, errors: c.errors, latency: c.latency }
            })
            .collect();
        Some(v1::TrafficReport { app: self.app.clone(), router: self.router.clone(), versions })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Outcome;
    use std::time::Instant;

    #[test]
    fn reports_are_deltas_per_version_and_a_returning_endpoint_counts_from_zero() {
        let b = Balancer::new(crate::Config { policy: crate::Policy::RoundRobin, ..Default::default() });
        let routes = |addrs: &[(&str, &str)]| -> Vec<(String, f64, Arc<str>)> {
            addrs.iter().map(|(a, v)| (a.to_string(), 1.0, Arc::from(*v))).collect()
        };
        b.update_versions(&routes(&[("a", "old"), ("b", "new")]), None, Instant::now());
        let mut r = Reporter::new("echo");
        assert!(r.collect(&b).is_none(), "nothing answered yet");
        let mut rng = rand::rng();
        for i in 0..10 {
            let p = b.pick(Instant::now(), &mut rng).unwrap();
            let failed = p.endpoint.addr == "b" && i % 4 == 1;
            b.finish(p, if failed { Outcome::Failure } else { Outcome::Success }, Instant::now());
        }
        let report = r.collect(&b).unwrap();
        let got: Vec<(&str, u64, u64)> =
            report.versions.iter().map(|v| (v.version.as_str(), v.requests, v.errors)).collect();
        assert_eq!(got, vec![("new", 5, 3), ("old", 5, 0)]);
        assert!(report.versions.iter().all(|v| v.latency.iter().sum::<u64>() == v.requests));
        assert!(r.collect(&b).is_none(), "deltas: nothing new");
        // "b" leaves and comes back: a new endpoint, counted from zero.
        b.update_versions(&routes(&[("a", "old")]), None, Instant::now());
        b.update_versions(&routes(&[("a", "old"), ("b", "new")]), None, Instant::now());
        let p = loop {
            let p = b.pick(Instant::now(), &mut rng).unwrap();
            if p.endpoint.addr == "b" {
                break p;
            }
            b.finish(p, Outcome::Success, Instant::now());
        };
        b.finish(p, Outcome::Success, Instant::now());
        let report = r.collect(&b).unwrap();
        let new = report.versions.iter().find(|v| v.version == "new").unwrap();
        assert_eq!((new.requests, new.errors), (1, 0));
    }
}
