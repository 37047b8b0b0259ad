//! The metric families a router exports (its part of the catalogue, docs/metrics.md), and
//! the labels it puts on them. An endpoint's address (`ip:port`) churns with every
//! replacement, so per-endpoint series are labelled by `app` and `node` (the node the
//! endpoint runs on) instead: bounded by the cluster's size.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use flotilla_obs::{Family, buckets};

use crate::Balancer;
use crate::service::CallReport;

pub const ENDPOINT_WEIGHT: Family = Family::gauge(
    "flotilla_route_endpoint_weight",
    "Route weight the router gives an app's endpoints on a node, summed over them (each 0 to 1; 0 sends nothing).",
    &["app", "node"],
);
pub const ENDPOINTS: Family =
    Family::gauge("flotilla_route_endpoints", "Endpoints with a positive weight in the router's table.", &[]);
pub const TABLE_VERSION: Family =
    Family::gauge("flotilla_route_table_version", "Version of the newest route table the router applied.", &[]);
/// The same family a scheduler exports: both count changed route entries of an app.
pub const ROUTE_WEIGHT_CHANGES: Family = Family::counter(
    "flotilla_route_weight_changes_total",
    "Route entries whose weight changed, in the tables a scheduler publishes or a router applies.",
    &["app"],
);
pub const STREAM_RECONNECTS: Family = Family::counter(
    "flotilla_route_stream_reconnects_total",
    "Times the router's route table stream broke and was opened again (stale routes serve meanwhile).",
    &[],
);
pub const REQUESTS: Family = Family::counter(
    "flotilla_route_requests_total",
    "Requests the router forwarded, by the node of the endpoint and result (ok or error).",
    &["app", "node", "result"],
);
pub const REQUEST_SECONDS: Family = Family::histogram(
    "flotilla_route_request_seconds",
    "Time from forwarding a request to its answer, by the node of the endpoint, in seconds.",
    &["app", "node"],
    buckets::SECONDS,
);
pub const EJECTIONS: Family = Family::counter(
    "flotilla_route_ejections_total",
    "Endpoints ejected after consecutive failures, by node.",
    &["app", "node"],
);
pub const PROBES: Family = Family::counter(
    "flotilla_route_probes_total",
    "Requests sent to an endpoint at the latency floor (over 3x the median latency, each plus 2 ms) only to learn whether it recovered; at most 5 a second each.",
    &["app", "node"],
);
pub const UNROUTABLE: Family = Family::counter(
    "flotilla_route_unroutable_total",
    "Requests answered 503 because no endpoint could take them.",
    &[],
);
pub const GENERAL_PATH: Family = Family::counter(
    "flotilla_route_general_path_connections_total",
    "Client connections the proxy handed from byte forwarding to its general HTTP/1 path, by the first request it could not forward as bytes (chunked or large upload, Connection, Upgrade or Expect header, HTTP/1.0, ...).",
    &["reason"],
);

pub const CLIENT_CONNECTIONS: Family =
    Family::gauge("flotilla_route_client_connections", "Client connections the proxy holds now (every thread).", &[]);
pub const CLIENTS_CLOSED: Family = Family::counter(
    "flotilla_route_client_connections_closed_total",
    "Client connections the proxy closed itself, by reason: header_timeout (no whole request head in time), idle_timeout (no request in time on a kept-alive connection), evicted (the idlest, to make room at a cap or out of file descriptors), write_stalled (a client that read nothing of an answer for --client-write-timeout).",
    &["reason"],
);
pub const CLIENTS_REFUSED: Family = Family::counter(
    "flotilla_route_client_connections_refused_total",
    "Client connections refused at once, by reason: full (at --max-client-connections with none idle) or source_full (at --max-client-connections-per-source with none of that source idle).",
    &["reason"],
);
pub const ACCEPT_ERRORS: Family = Family::counter(
    "flotilla_route_accept_errors_total",
    "Failed accepts of client connections, by kind: fds (out of file descriptors; the proxy closes its idlest connection and pauses) or other.",
    &["kind"],
);
pub const VERSION_REQUESTS: Family = Family::counter(
    "flotilla_route_version_requests_total",
    "Requests the router forwarded, by the version (template fingerprint) of the endpoint's unit and result (ok or error): what a canary is judged on.",
    &["app", "version", "result"],
);
pub const TRAFFIC_REPORTS: Family = Family::counter(
    "flotilla_route_traffic_reports_total",
    "Per-version traffic reports sent to the app's scheduler, by outcome (sent or failed).",
    &["outcome"],
);
pub const SPLIT_SHARE: Family = Family::gauge(
    "flotilla_route_split_share",
    "Share of requests the router sends to the version a canary rollout tests (0 without a split).",
    &["app"],
);

/// Every family a router exports.
pub const FAMILIES: &[Family] = &[
    ENDPOINT_WEIGHT,
    ENDPOINTS,
    TABLE_VERSION,
    ROUTE_WEIGHT_CHANGES,
    STREAM_RECONNECTS,
    REQUESTS,
    REQUEST_SECONDS,
    EJECTIONS,
    PROBES,
    UNROUTABLE,
    GENERAL_PATH,
    CLIENT_CONNECTIONS,
    CLIENTS_CLOSED,
    CLIENTS_REFUSED,
    ACCEPT_ERRORS,
    VERSION_REQUESTS,
    TRAFFIC_REPORTS,
    SPLIT_SHARE,
];

/// The labels of a router's series: its app and the node of each endpoint, as the route
/// table says (with a fixed `--backends` list, each backend is its own "node").
///
/// Each node's series handles are resolved once, when the table names the node, so a
/// request's accounting is a map read and three atomic adds, not a registry lookup with
/// freshly allocated label strings.
pub struct Labels {
    app: String,
    nodes: RwLock<HashMap<String, Arc<Series>>>,
    /// The series of calls whose endpoint left the table before they finished.
    unknown: Arc<Series>,
}

/// One node's series.
struct Series {
    node: String,
    ok: metrics::Counter,
    error: metrics::Counter,
    seconds: metrics::Histogram,
    ejections: metrics::Counter,
    probes: metrics::Counter,
}

impl Series {
    fn new(app: &str, node: &str) -> Series {
        let (app, node) = (app.to_string(), node.to_string());
        let requests = |result: &'static str| metrics::counter!(REQUESTS.name, "app" => app.clone(), "node" => node.clone(), "result" => result);
        Series {
            ok: requests("ok"),
            error: requests("error"),
            seconds: metrics::histogram!(REQUEST_SECONDS.name, "app" => app.clone(), "node" => node.clone()),
            ejections: metrics::counter!(EJECTIONS.name, "app" => app.clone(), "node" => node.clone()),
            probes: metrics::counter!(PROBES.name, "app" => app, "node" => node.clone()),
            node,
        }
    }
}

impl Labels {
    pub fn new(app: impl Into<String>) -> Arc<Labels> {
        let app = app.into();
        let unknown = Arc::new(Series::new(&app, "unknown"));
        Arc::new(Labels { app, nodes: RwLock::default(), unknown })
    }

    /// Replaces the endpoint-to-node map with the pairs of the table in force.
    pub fn set_nodes<'a>(&self, pairs: impl IntoIterator<Item = (&'a str, &'a str)>) {
        let mut by_node: HashMap<&str, Arc<Series>> = HashMap::new();
        let old = self.nodes.read().unwrap_or_else(|e| e.into_inner()).clone();
        let old_by_node: HashMap<&str, &Arc<Series>> = old.values().map(|s| (s.node.as_str(), s)).collect();
        let mut map = HashMap::new();
        for (addr, node) in pairs {
            let series = match node {
                "" => self.unknown.clone(),
                node => by_node
                    .entry(node)
                    .or_insert_with(|| match old_by_node.get(node) {
                        Some(s) => Arc::clone(s),
                        None => Arc::new(Series::new(&self.app, node)),
                    })
                    .clone(),
            };
            map.insert(addr.to_string(), series);
        }
        *self.nodes.write().unwrap_or_else(|e| e.into_inner()) = map;
    }

    fn series(&self, endpoint: &str) -> Arc<Series> {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        nodes.get(endpoint).cloned().unwrap_or_else(|| self.unknown.clone())
    }

    /// The node of `endpoint`; `unknown` for one that left the table (a request that
    /// finished after its endpoint went).
    pub fn node(&self, endpoint: &str) -> String {
        self.series(endpoint).node.clone()
    }

    pub fn app(&self) -> &str {
        &self.app
    }

    /// Counts one finished call.
    pub fn record(&self, r: CallReport) {
        self.count(&r.endpoint, r.outcome, r.seconds, r.probe, r.ejected_for);
    }

    /// [`Labels::record`] without building a report (the proxy's fast path allocates nothing
    /// per request).
    pub fn count(
        &self,
        endpoint: &str,
        outcome: crate::Outcome,
        seconds: f64,
        probe: bool,
        ejected_for: Option<std::time::Duration>,
    ) {
        let nodes = self.nodes.read().unwrap_or_else(|e| e.into_inner());
        let series = nodes.get(endpoint).unwrap_or(&self.unknown);
        match outcome {
            crate::Outcome::Success => series.ok.increment(1),
            crate::Outcome::Failure => series.error.increment(1),
        }
        series.seconds.record(seconds);
        if probe {
            series.probes.increment(1);
        }
        if let Some(d) = ejected_for {
            tracing::warn!(%endpoint, node = %series.node, seconds = d.as_secs_f64(), "endpoint ejected after consecutive failures");
            series.ejections.increment(1);
        }
    }

    /// Renders `flotilla_route_endpoint_weight` of `balancer`'s endpoints now: read at
    /// scrape time, so the series of a node whose endpoints all left disappears with them.
    pub fn render_weights(&self, balancer: &Balancer, out: &mut String) {
        let mut by_node: std::collections::BTreeMap<String, f64> = Default::default();
        for e in balancer.endpoints().iter() {
            *by_node.entry(self.node(&e.addr)).or_default() += e.weight();
        }
        if by_node.is_empty() {
            return;
        }
        ENDPOINT_WEIGHT.write_header(out);
        for (node, w) in &by_node {
            ENDPOINT_WEIGHT.write_sample(out, &[("app", &self.app), ("node", node)], *w);
        }
        out.push('\n');
    }

    /// Exports the route weights of `balancer` on this process's `/metrics`.
    pub fn export_weights(self: &Arc<Self>, balancer: Arc<Balancer>) {
        let labels = self.clone();
        flotilla_obs::add_collector(move |out| labels.render_weights(&balancer, out));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn weights_are_summed_by_node_and_an_endpoint_that_left_is_gone() {
        let b = Balancer::new(crate::Config::default());
        let labels = Labels::new("echo");
        b.update(
            &[("10.0.0.1:1".into(), 0.5), ("10.0.0.1:2".into(), 0.25), ("10.0.0.2:1".into(), 1.0)],
            Instant::now(),
        );
        labels.set_nodes([("10.0.0.1:1", "n1"), ("10.0.0.1:2", "n1"), ("10.0.0.2:1", "n2")]);
        let mut out = String::new();
        labels.render_weights(&b, &mut out);
        assert!(out.contains("# HELP flotilla_route_endpoint_weight "), "{out}");
        assert!(out.contains("flotilla_route_endpoint_weight{app=\"echo\",node=\"n1\"} 0.75\n"), "{out}");
        assert!(out.contains("flotilla_route_endpoint_weight{app=\"echo\",node=\"n2\"} 1\n"), "{out}");
        assert!(!out.contains("10.0.0."), "no address in a label: {out}");

        b.update(&[("10.0.0.1:1".into(), 0.5)], Instant::now());
        labels.set_nodes([("10.0.0.1:1", "n1")]);
        let mut out = String::new();
        labels.render_weights(&b, &mut out);
        assert!(out.contains("node=\"n1\"} 0.5\n") && !out.contains("n2"), "{out}");
        assert_eq!(labels.node("10.9.9.9:1"), "unknown");
    }
}
