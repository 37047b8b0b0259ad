//! `flotilla sim` end to end: the real binary on the shipped traces and policies. Runs twice
//! to show the simulation is deterministic, and checks the plot is a well-formed SVG with its
//! series drawn. Starts no server.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `flotilla sim --json --plot OUT` and returns the last stdout line as JSON.
fn sim(trace: &Path, policy: &Path, out: &Path) -> serde_json::Value {
    let o = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("sim")
        .arg("--trace")
        .arg(trace)
        .arg("--policy")
        .arg(policy)
        .arg("--json")
        .arg("--plot")
        .arg(out)
        .output()
        .expect("run flotilla sim");
    let stdout = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "flotilla sim failed: {}\n{stdout}", String::from_utf8_lossy(&o.stderr));
    let last = stdout.lines().last().expect("a JSON line");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("last line is not JSON ({e}): {last}"))
}

fn check_svg(path: &Path) {
    let svg = std::fs::read_to_string(path).expect("the plot was written");
    let t = svg.trim();
    assert!(t.starts_with("<svg") || t.starts_with("<?xml"), "{}", &t[..t.len().min(80)]);
    assert!(t.ends_with("</svg>"));
    let doc = roxmltree::Document::parse(t).expect("the plot is well-formed XML");
    // Axes and grid are black; each series is a polyline of its own colour.
    let mut colours: Vec<&str> = doc
        .descendants()
        .filter(|n| matches!(n.tag_name().name(), "polyline" | "path"))
        .filter_map(|n| n.attribute("stroke"))
        .filter(|c| !c.eq_ignore_ascii_case("#000000"))
        .collect();
    colours.sort_unstable();
    colours.dedup();
    assert!(colours.len() >= 3, "only {} series drawn: {colours:?}", colours.len());
    let texts = doc.descendants().filter(|n| n.tag_name().name() == "text").count();
    assert!(texts > 0, "labels are written as <text>");
}

#[test]
fn sim_is_deterministic_and_plots_on_the_shipped_traces() {
    let dir = std::env::temp_dir().join(format!("flotilla-sim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    for policy in ["basic", "utilization"] {
        let policy_file = root().join(format!("examples/policies/{policy}.toml"));
        for trace in ["diurnal", "bursty", "step"] {
            let trace_file = root().join(format!("examples/traces/{trace}.csv"));
            let runs: Vec<serde_json::Value> = (0..2)
                .map(|i| {
                    let out = dir.join(format!("{policy}-{trace}-{i}.svg"));
                    let v = sim(&trace_file, &policy_file, &out);
                    check_svg(&out);
                    v
                })
                .collect();
            for key in [
                "unit_hours",
                "pending_p50_seconds",
                "pending_p99_seconds",
                "actions",
                "simulated_seconds",
                "wall_seconds",
                "pending_demand_seconds",
                "over_target_seconds",
                "under_target_seconds",
            ] {
                assert!(runs[0].get(key).is_some_and(|v| v.is_number()), "{key} missing in {}", runs[0]);
            }
            assert_eq!(runs[0]["policy"], policy);
            assert!(runs[0]["actions"].as_u64().is_some_and(|a| a > 0), "{trace} needs scaling: {}", runs[0]);
            let strip = |v: &serde_json::Value| {
                let mut v = v.clone();
                v.as_object_mut().map(|o| o.remove("wall_seconds"));
                v
            };
            assert_eq!(strip(&runs[0]), strip(&runs[1]), "{policy} on {trace} differs between runs");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sim_names_a_bad_trace_line() {
    let dir = std::env::temp_dir().join(format!("flotilla-sim-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let trace = dir.join("bad.csv");
    std::fs::write(&trace, "time_s,cpu_millis,memory_bytes\n0,1000,0\n60,lots,0\n").expect("write");
    let o = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["sim", "--trace"])
        .arg(&trace)
        .arg("--policy")
        .arg(root().join("examples/policies/basic.toml"))
        .output()
        .expect("run flotilla sim");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(stderr.contains("line 3: cpu_millis: \"lots\" is not a number"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}
