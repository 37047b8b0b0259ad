//! `deploy/grafana/flotilla.json`: a dashboard Grafana imports (schema, a Prometheus
//! data source variable, rows), whose every query parses (promtool) and names only
//! catalogued metrics.

use serde_json::Value;

use crate::{catalogue, promql, promtool_ok, read, root};

fn dashboard() -> Value {
    let path = root().join("deploy").join("grafana").join("flotilla.json");
    serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// Every panel, those inside collapsed rows included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut all = Vec::new();
    for p in d["panels"].as_array().into_iter().flatten() {
        all.push(p);
        all.extend(p["panels"].as_array().into_iter().flatten());
    }
    all
}

/// Every query: (where, PromQL) for each panel target and each query variable
/// (`label_values(METRIC, LABEL)` reads METRIC).
fn queries(d: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in panels(d) {
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().unwrap_or_else(|| panic!("panel {:?} has a target without expr", p["title"]));
            out.push((
                format!("panel {} {:?} {}", p["id"], p["title"].as_str().unwrap_or(""), t["refId"]),
                expr.into(),
            ));
        }
    }
    for v in d["templating"]["list"].as_array().into_iter().flatten().filter(|v| v["type"] == "query") {
        let q = v["query"]["query"].as_str().or(v["query"].as_str()).unwrap_or("");
        let inner = q.strip_prefix("label_values(").and_then(|r| r.strip_suffix(')')).unwrap_or(q);
        let metric = inner.rsplit_once(',').map(|(m, _)| m).unwrap_or(inner).trim();
        out.push((format!("variable {}", v["name"]), metric.to_string()));
    }
    out
}

/// Grafana's interval variables, as Prometheus would see them.
fn as_promql(expr: &str) -> String {
    expr.replace("$__rate_interval", "5m").replace("$__interval", "1m").replace("$__range", "1h")
}

#[test]
fn the_dashboard_is_a_grafana_dashboard_over_a_prometheus_variable() {
    let d = dashboard();
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion {}", d["schemaVersion"]);
    assert!(d["uid"].is_string() && d["title"].is_string());
    let vars = d["templating"]["list"].as_array().expect("templating variables");
    assert!(
        vars.iter().any(|v| v["name"] == "datasource" && v["type"] == "datasource" && v["query"] == "prometheus"),
        "a `datasource` variable of type prometheus"
    );
    let all = panels(&d);
    let rows: Vec<&str> = all.iter().filter(|p| p["type"] == "row").filter_map(|p| p["title"].as_str()).collect();
    for topic in ["Nodes", "View", "Placements", "Units", "Autoscaling", "Routing", "Processes"] {
        assert!(rows.iter().any(|r| r.contains(topic)), "no row about {topic}: {rows:?}");
    }
    let rect = |p: &Value| {
        let g = &p["gridPos"];
        [&g["x"], &g["y"], &g["w"], &g["h"]].map(|v| v.as_u64().unwrap_or(0))
    };
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            let ([ax, ay, aw, ah], [bx, by, bw, bh]) = (rect(a), rect(b));
            let overlap = ax < bx + bw && bx < ax + aw && ay < by + bh && by < ay + ah;
            assert!(!overlap, "panels {:?} and {:?} overlap", a["title"], b["title"]);
        }
    }
    let mut ids = std::collections::HashSet::new();
    for p in &all {
        assert!(ids.insert(p["id"].as_u64().expect("panel id")), "panel id {} twice", p["id"]);
        let pos = &p["gridPos"];
        let (x, w) = (pos["x"].as_u64().unwrap_or(99), pos["w"].as_u64().unwrap_or(99));
        assert!(x + w <= 24 && pos["h"].as_u64().is_some(), "panel {:?} out of the grid", p["title"]);
        if p["type"] != "row" {
            assert_eq!(p["datasource"]["uid"], "${datasource}", "panel {:?} uses the variable", p["title"]);
            assert!(p["targets"].as_array().is_some_and(|t| !t.is_empty()), "panel {:?} has queries", p["title"]);
        }
    }
}

#[test]
fn every_dashboard_query_names_catalogued_metrics() {
    let catalogue = catalogue();
    let d = dashboard();
    let mut problems = Vec::new();
    for (place, expr) in queries(&d) {
        let names = promql::metric_names(&expr);
        if names.is_empty() {
            problems.push(format!("{place}: no metric in {expr}"));
        }
        let missing = catalogue.missing(&names);
        if !missing.is_empty() {
            problems.push(format!("{place}: {missing:?} not in docs/metrics.md"));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// Each query as a recording rule through `promtool check rules`: a typo in PromQL fails
/// here, not on an operator's screen.
#[test]
fn every_dashboard_query_parses() {
    let d = dashboard();
    let tmp = flotilla_testkit::TempDir::new("ops-dashboard-rules");
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    let queries: Vec<_> = queries(&d).into_iter().filter(|(place, _)| place.starts_with("panel")).collect();
    for (i, (place, expr)) in queries.iter().enumerate() {
        // A JSON string is a YAML double-quoted scalar.
        let quoted = serde_json::to_string(&as_promql(expr)).unwrap();
        rules.push_str(&format!("      # {place}\n      - record: dashboard:query_{i}\n        expr: {quoted}\n"));
    }
    std::fs::write(tmp.join("dashboard.yml"), &rules).unwrap();
    let out = promtool_ok(&tmp, &["check", "rules", "dashboard.yml"]);
    assert!(out.contains(&format!("SUCCESS: {} rules found", queries.len())), "{out}");
}
