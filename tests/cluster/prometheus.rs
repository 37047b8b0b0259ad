//! A real Prometheus (Debian's `prometheus` package) scraping a running `flotilla up`,
//! its agents and a route proxy every second, with the alert rules of
//! `deploy/prometheus/alerts.yml` loaded: after two scrapes its HTTP API answers for the
//! core series, and every alert rule is loaded and evaluates without error.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use flotilla_testkit::{Group, TempDir, Up, free_port, get_text, signal, wait_for, who};
use serde_json::Value;

use crate::common::{ECHO, running};

/// `prometheus`, from PATH or /usr/bin; a missing one fails the test with how to get it.
fn prometheus_bin() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|d| d.join("prometheus"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("prometheus not found: install the Debian package `prometheus`"))
}

/// One sample of a query's answer: its labels and its value.
type Sample = (Value, f64);

/// A Prometheus server in a process group of its own, killed on drop.
struct Prometheus {
    child: Child,
    addr: String,
    log: PathBuf,
}

impl Prometheus {
    fn start(config: &Path, dir: &Path) -> Prometheus {
        use std::os::unix::process::CommandExt;
        let addr = format!("127.0.0.1:{}", free_port());
        let log = dir.join("prometheus.log");
        let child = Command::new(prometheus_bin())
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .process_group(0)
            .spawn()
            .expect("starting prometheus");
        Prometheus { child, addr, log }
    }

    /// GET `path` of the HTTP API: its `data`, if it answered with success.
    fn api(&self, path: &str) -> Option<Value> {
        let body = get_text(&self.addr, path)?;
        let v: Value = match serde_json::from_str(&body) {
            Ok(v) => v,
            Err(_) => serde_json::from_str(&dechunk(&body)?).ok()?,
        };
        (v["status"] == "success").then(|| v["data"].clone())
    }

    /// An instant query's samples: (labels, value).
    fn query(&self, promql: &str) -> Vec<Sample> {
        let Some(data) = self.api(&format!("/api/v1/query?query={}", encode(promql))) else { return vec![] };
        data["result"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| Some((s["metric"].clone(), s["value"][1].as_str()?.parse().ok()?)))
            .collect()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        signal(-(self.child.id() as i32), libc::SIGKILL);
        let _ = self.child.wait();
    }
}

/// The body of a `Transfer-Encoding: chunked` answer (Prometheus chunks the larger
/// ones), as the raw client of the testkit leaves it.
fn dechunk(raw: &str) -> Option<String> {
    let (mut raw, mut body) = (raw.as_bytes(), Vec::new());
    loop {
        let line = raw.iter().position(|b| *b == b'\n').map_or(raw, |end| &raw[..end]);
        let size = usize::from_str_radix(std::str::from_utf8(line).ok()?.trim(), 16).ok()?;
        if size == 0 {
            return String::from_utf8(body).ok();
        }
        let start = line.len() + 1;
        body.extend_from_slice(raw.get(start..start + size)?);
        raw = raw.get(start + size..)?.strip_prefix(b"\r\n")?;
    }
}

/// Percent-encoding for a query string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn yaml_list(items: &[String]) -> String {
    format!("[{}]", items.iter().map(|i| format!("\"{i}\"")).collect::<Vec<_>>().join(", "))
}

#[test]
fn a_real_prometheus_scrapes_the_cluster_and_loads_the_alert_rules() {
    let up = Up::start("prometheus", &["--agents", "2", "--app", ECHO]);
    wait_for("a running echo unit", Duration::from_secs(60), || (!running(&up).is_empty()).then_some(()));
    let agents: Vec<String> = ["node-1", "node-2"]
        .iter()
        .map(|n| {
            let file = up.agent_dir(n).join("metrics.addr");
            wait_for(&format!("{n}'s metrics address"), Duration::from_secs(20), || {
                std::fs::read_to_string(&file).ok().map(|a| a.trim().to_string()).filter(|a| !a.is_empty())
            })
        })
        .collect();

    // The route proxy is a process of its own; some traffic through it gives it series.
    let mut procs = Group::new();
    let route = procs.spawn_with_env(
        &["route", "--app", "echo", "--listen", "127.0.0.1:0", "--print-addrs"],
        &up.data.join("route.err"),
        &[("FLOTILLA_ADDR", up.addr.as_str())],
    );
    let addrs = procs.addrs(route);
    let (proxy, route_metrics) =
        (addrs["listen"].as_str().unwrap().to_string(), addrs["metrics"].as_str().unwrap().to_string());
    wait_for("an answer through the proxy", Duration::from_secs(20), || who(&proxy));
    for _ in 0..20 {
        who(&proxy);
    }

    let dir = TempDir::new("prometheus-server");
    let control = up.addr.trim_start_matches("http://").to_string();
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/prometheus/alerts.yml");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             rule_files:\n  - {}\n\
             scrape_configs:\n\
             \x20 - job_name: flotilla-up\n    static_configs:\n      - targets: {}\n\
             \x20 - job_name: flotilla-agents\n    static_configs:\n      - targets: {}\n\
             \x20 - job_name: flotilla-route\n    static_configs:\n      - targets: {}\n",
            rules.display(),
            yaml_list(&[control]),
            yaml_list(&agents),
            yaml_list(&[route_metrics]),
        ),
    )
    .unwrap();
    let prom = Prometheus::start(&config, &dir);
    let targets = 4;

    // Two scrapes of every target, each of them up.
    wait_for("two successful scrapes of every target", Duration::from_secs(60), || {
        let scraped = prom.query("count_over_time(up[1m]) >= 2 and up == 1");
        (scraped.len() == targets).then_some(())
    });

    // The core series, polled until they hold (the cluster keeps moving) or 20 s pass;
    // every one that never holds is reported.
    let mut problems = Vec::new();
    let mut expect = |what: &str, promql: &str, ok: &dyn Fn(&[Sample]) -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let samples = prom.query(promql);
            if ok(&samples) {
                return;
            }
            if Instant::now() > deadline {
                problems.push(format!("{what}: `{promql}` gave {samples:?}"));
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    let value_of =
        |samples: &[Sample], label: &str, value: &str| samples.iter().find(|(m, _)| m[label] == value).map(|(_, v)| *v);
    expect("both nodes alive", "sum by (status) (flotilla_nodes)", &|s| value_of(s, "status", "alive") == Some(2.0));
    expect("heartbeats arrive", "sum(rate(flotilla_heartbeats_received_total[10s]))", &|s| {
        s.first().is_some_and(|(_, v)| *v > 0.0)
    });
    expect("the agents send heartbeats", "count(rate(flotilla_agent_heartbeats_sent_total[10s]) > 0)", &|s| {
        s.first().is_some_and(|(_, v)| *v == 2.0)
    });
    expect("placements committed", "sum by (result) (flotilla_placements_total)", &|s| {
        value_of(s, "result", "committed").is_some_and(|v| v >= 1.0)
    });
    expect("claims by result", "sum by (result) (flotilla_scheduler_claims_total)", &|s| {
        value_of(s, "result", "accepted").is_some_and(|v| v >= 1.0) && value_of(s, "result", "conflict").is_some()
    });
    expect("units by state", "sum by (state) (flotilla_units{app=\"echo\"})", &|s| {
        value_of(s, "state", "running").is_some_and(|v| v >= 1.0)
    });
    expect("reconcile passes", "sum(rate(flotilla_reconcile_seconds_count[10s]))", &|s| {
        s.first().is_some_and(|(_, v)| *v > 0.0)
    });
    expect("view versions", "max by (shard) (flotilla_view_version)", &|s| s.len() == 2);
    expect("requests through the proxy", "sum by (result) (flotilla_route_requests_total)", &|s| {
        value_of(s, "result", "ok").is_some_and(|v| v >= 10.0)
    });
    // Names and labels of issue #16's renames (flotilla_scheduler_conflict_ratio, the
    // router's app and node labels), and the process metrics every process serves.
    expect("route weights by app and node", "flotilla_route_endpoint_weight{app=\"echo\"} > 0", &|s| {
        !s.is_empty() && s.iter().all(|(m, _)| m["node"].is_string())
    });
    expect("the conflict ratio", "flotilla_scheduler_conflict_ratio{app=\"echo\"}", &|s| s.len() == 1);
    expect("process metrics of every target", "count(process_resident_memory_bytes > 0)", &|s| {
        s.first().is_some_and(|(_, v)| *v == targets as f64)
    });
    expect("build info", "count(flotilla_build_info)", &|s| s.first().is_some_and(|(_, v)| *v >= 1.0));

    // Every alert rule of alerts.yml is loaded and has been evaluated without error.
    let alerts: Vec<String> = std::fs::read_to_string(&rules)
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:").map(|n| n.trim().to_string()))
        .collect();
    let loaded = wait_for("every alert rule evaluated", Duration::from_secs(30), || {
        let data = prom.api("/api/v1/rules?type=alert")?;
        let rules: Vec<Value> = data["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        (rules.len() == alerts.len() && rules.iter().all(|r| r["health"] != "unknown")).then_some(rules)
    });
    for rule in &loaded {
        let name = rule["name"].as_str().unwrap_or("");
        assert!(alerts.iter().any(|a| a == name), "{name} is not in alerts.yml");
        assert_eq!(rule["health"], "ok", "{name}: {}", rule["lastError"]);
        assert!(rule["labels"]["severity"].is_string(), "{name} has a severity");
    }
    // A healthy cluster trips none of the alerts about lost processes and stalls. One
    // scrape that outlasts its 1 s timeout on a busy machine marks the target's series
    // stale and makes an alert pending for an evaluation or two: poll until they hold.
    let rule_states = || -> Option<Vec<Value>> {
        let data = prom.api("/api/v1/rules?type=alert")?;
        Some(
            data["groups"]
                .as_array()?
                .iter()
                .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
                .collect(),
        )
    };
    for name in ["FlotillaSchedulerNotReconciling", "FlotillaTargetDown", "FlotillaRouteNoEndpoints"] {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let rule = rule_states().and_then(|rules| rules.into_iter().find(|r| r["name"] == name));
            if rule.as_ref().is_some_and(|r| r["state"] == "inactive") {
                break;
            }
            if Instant::now() > deadline {
                problems.push(format!("{name} is not inactive on a healthy cluster: {rule:?}"));
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    assert!(problems.is_empty(), "what Prometheus does not show:\n{}\nits log:\n{}", problems.join("\n"), prom.log());
}
