//! `deploy/prometheus`: the configs and the alert rules through promtool, every alert
//! unit-tested firing and quiet, with a severity and a runbook section, and naming only
//! catalogued metrics.

use std::collections::BTreeMap;

use crate::{catalogue, output_text, promql, promtool_ok, read, root, run_promtool};

fn prometheus_dir() -> std::path::PathBuf {
    root().join("deploy").join("prometheus")
}

/// One rule of a rules file: its name (`alert:` or `record:`) and its keys (`expr`,
/// `for`, `severity`, `summary`, …; labels and annotations flattened), block scalars
/// joined.
#[derive(Debug)]
struct Rule {
    name: String,
    keys: BTreeMap<String, String>,
}

/// The rules of a rules file as this repository writes them: a `- alert:` or `- record:`
/// item per rule, `key: value` lines, `|` block scalars indented below their key.
fn parse_rules(text: &str) -> Vec<Rule> {
    let lines: Vec<&str> = text.lines().collect();
    let indent = |l: &str| l.len() - l.trim_start().len();
    let mut rules: Vec<Rule> = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let trimmed = line.trim_start().trim_start_matches("- ");
        i += 1;
        if trimmed.starts_with('#') {
            continue;
        }
        let Some((key, value)) = trimmed.split_once(':') else { continue };
        let (key, value) = (key.trim(), value.trim());
        if key.contains(' ') || key.is_empty() {
            continue;
        }
        let value = if value == "|" || value == ">" {
            let mut block = Vec::new();
            while i < lines.len() && (lines[i].trim().is_empty() || indent(lines[i]) > indent(line)) {
                block.push(lines[i].trim());
                i += 1;
            }
            block.join("\n").trim().to_string()
        } else {
            value.trim_matches('"').to_string()
        };
        if (key == "alert" || key == "record") && line.trim_start().starts_with("- ") {
            rules.push(Rule { name: value, keys: BTreeMap::new() });
        } else if let Some(rule) = rules.last_mut() {
            rule.keys.insert(key.to_string(), value);
        }
    }
    rules
}

fn alert_rules() -> Vec<Rule> {
    let rules = parse_rules(&read(&prometheus_dir().join("alerts.yml")));
    assert!(rules.len() >= 10, "only {} rules found in alerts.yml", rules.len());
    rules
}

/// GitHub's anchor of a markdown heading: lower case, spaces to dashes, punctuation gone.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

#[test]
fn the_prometheus_config_for_flotilla_up_is_valid() {
    let out = promtool_ok(&prometheus_dir(), &["check", "config", "prometheus.yml"]);
    assert!(out.contains("SUCCESS: 1 rule files found"), "the rules are loaded:\n{out}");
}

/// Debian builds Prometheus without Kubernetes service discovery; there the rest of the
/// file is checked, with a static target where the pod discovery was.
#[test]
fn the_prometheus_config_for_kubernetes_is_valid() {
    let dir = prometheus_dir();
    let out = run_promtool(&dir, &["check", "config", "prometheus-kubernetes.yml"]);
    let text = output_text(&out);
    if out.status.success() {
        return;
    }
    assert!(text.contains("field kubernetes_sd_configs not found"), "promtool check config failed:\n{text}");
    let tmp = flotilla_testkit::TempDir::new("ops-k8s-config");
    let config = read(&dir.join("prometheus-kubernetes.yml"));
    let lines: Vec<&str> = config.lines().collect();
    let mut out_lines = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        i += 1;
        if line.trim() == "kubernetes_sd_configs:" {
            let pad = &line[..line.len() - line.trim_start().len()];
            out_lines.push(format!("{pad}static_configs:"));
            out_lines.push(format!("{pad}  - targets: [\"127.0.0.1:9100\"]"));
            while i < lines.len() && lines[i].len() - lines[i].trim_start().len() > pad.len() {
                i += 1;
            }
        } else {
            out_lines.push(line.to_string());
        }
    }
    std::fs::write(tmp.join("prometheus-kubernetes.yml"), out_lines.join("\n")).unwrap();
    std::fs::copy(dir.join("alerts.yml"), tmp.join("alerts.yml")).unwrap();
    eprintln!("this promtool has no Kubernetes discovery; checking the rest of prometheus-kubernetes.yml");
    promtool_ok(&tmp, &["check", "config", "prometheus-kubernetes.yml"]);
}

#[test]
fn the_alert_rules_are_valid() {
    let rules = alert_rules();
    let out = promtool_ok(&prometheus_dir(), &["check", "rules", "alerts.yml"]);
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", rules.len())),
        "every rule parsed here is checked:\n{out}"
    );
}

/// `promtool test rules alerts_test.yml` passes, and it shows every alert both firing
/// (with its labels and annotations) and staying quiet.
#[test]
fn every_alert_is_unit_tested_firing_and_quiet() {
    let dir = prometheus_dir();
    let tests = read(&dir.join("alerts_test.yml"));
    let mut fires = BTreeMap::<String, usize>::new();
    let mut quiet = BTreeMap::<String, usize>::new();
    let lines: Vec<&str> = tests.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(name) = line.strip_prefix("alertname:") else { continue };
        let name = name.trim().to_string();
        match lines.get(i + 1).copied() {
            Some("exp_alerts: []") => *quiet.entry(name).or_default() += 1,
            Some("exp_alerts:") => {
                let expected = lines.get(i + 2).copied().unwrap_or("");
                assert!(expected.starts_with("- exp_labels:"), "{name}: a firing case names its labels");
                assert!(lines.get(i + 3).is_some_and(|l| *l == "exp_annotations:"), "{name}: and its annotations");
                *fires.entry(name).or_default() += 1;
            }
            other => panic!("{name}: exp_alerts expected after alertname, found {other:?}"),
        }
    }
    for rule in alert_rules() {
        assert!(fires.contains_key(&rule.name), "{} is never shown firing in alerts_test.yml", rule.name);
        assert!(quiet.contains_key(&rule.name), "{} is never shown quiet in alerts_test.yml", rule.name);
    }
    let out = promtool_ok(&dir, &["test", "rules", "alerts_test.yml"]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_has_a_severity_a_summary_and_a_runbook_section() {
    let runbooks = read(&root().join("docs").join("runbooks.md"));
    let anchors: Vec<String> = runbooks.lines().filter_map(|l| l.strip_prefix("## ")).map(anchor).collect();
    for rule in alert_rules() {
        let key = |k: &str| rule.keys.get(k).map(String::as_str).unwrap_or("");
        assert!(["critical", "warning"].contains(&key("severity")), "{}: severity {:?}", rule.name, key("severity"));
        assert!(!key("summary").is_empty() && !key("description").is_empty(), "{}: summary and description", rule.name);
        let url = key("runbook_url");
        let Some(section) = url.strip_prefix("docs/runbooks.md#") else {
            panic!("{}: runbook_url {url:?} is not a section of docs/runbooks.md", rule.name)
        };
        assert_eq!(section, rule.name.to_lowercase(), "{}: the runbook section is named after the alert", rule.name);
        assert!(anchors.iter().any(|a| a == section), "docs/runbooks.md has no section `## {}`", rule.name);
        let body = runbooks.split(&format!("## {}\n", rule.name)).nth(1).unwrap_or("");
        let body = body.split("\n## ").next().unwrap_or("");
        for part in ["**Means.**", "**Check.**", "**Fix.**"] {
            assert!(body.contains(part), "the runbook of {} lacks {part}", rule.name);
        }
    }
}

#[test]
fn every_alert_names_catalogued_metrics() {
    let catalogue = catalogue();
    for rule in alert_rules() {
        let expr = rule.keys.get("expr").unwrap_or_else(|| panic!("{} has no expr", rule.name));
        let names = promql::metric_names(expr);
        assert!(!names.is_empty(), "{}: no metric found in {expr}", rule.name);
        let missing = catalogue.missing(&names);
        assert!(missing.is_empty(), "{} queries metrics docs/metrics.md does not list: {missing:?}", rule.name);
    }
}

#[test]
fn the_rules_parser_reads_block_and_inline_values() {
    let rules = parse_rules(
        "groups:\n  - name: g\n    rules:\n      - alert: A\n        # a comment: here\n        expr: |\n          sum(x)\n          > 1\n        labels:\n          severity: critical\n      - alert: B\n        expr: y == 0\n        annotations:\n          summary: \"s: {{ $labels.a }}\"\n",
    );
    assert_eq!(rules.len(), 2);
    assert_eq!(rules[0].name, "A");
    assert_eq!(rules[0].keys["expr"], "sum(x)\n> 1");
    assert_eq!(rules[0].keys["severity"], "critical");
    assert_eq!(rules[1].keys["expr"], "y == 0");
    assert_eq!(rules[1].keys["summary"], "s: {{ $labels.a }}");
}
