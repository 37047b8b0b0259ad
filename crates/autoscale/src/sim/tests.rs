//! The simulation on small traces: capacity follows demand, runs repeat, bad input is named.
use super::*;

const GI: u64 = 1 << 30;

fn basic_policy() -> &'static str {
    r#"
[autoscaling]
policy = "basic"
interval = "10s"
[autoscaling.basic]
cooldown_period = "2m"
graceful_decommission_timeout = "1m"
scale_up_factor = 1.0
scale_down_factor = 1.0
[autoscaling.basic.worker_config]
min_instances = 2
max_instances = 40
[sim]
unit_cpu = "1"
unit_memory = "4Gi"
startup_seconds = 60
initial_units = 2
"#
}

/// 2 units' worth for 30 minutes, 10 for an hour, 2 for 30 minutes.
fn step_trace() -> Trace {
    let row = |s: u64, u: u64| Row { at_ms: s * 1000, demand: Res::new(u * 1000, u * 4 * GI), utilization: None };
    let rows = vec![row(0, 2), row(1800, 10), row(5400, 2), row(7200, 2)];
    Trace { end_ms: 7_200_000, rows }
}

#[test]
fn capacity_follows_a_step_after_startup_and_pending_clears() {
    let (policy, model) = policy_file_from_toml(basic_policy()).expect("valid");
    let r = simulate(&policy, &model, &step_trace());
    assert_eq!(r.steps, 720);
    assert!(r.actions >= 2, "{r:#?}");
    let at = |s: f64| r.series.iter().rev().find(|p| p.at_s <= s).copied().expect("a point");
    // Before the step: 2 units serve 2 units' worth; nothing pending.
    assert_eq!(at(1790.0).capacity, 2.0);
    assert_eq!(at(1790.0).pending, 0.0);
    // Right after it: demand waits while units start (≥ 60 s).
    assert!(at(1810.0).pending > 0.0);
    assert!(at(1810.0).units > 2.0, "scaled up at once: {:?}", at(1810.0));
    // Some minutes later capacity has caught up and the demand is served.
    let later = at(2400.0);
    assert!(later.capacity >= 10.0 && later.pending == 0.0, "{later:?}");
    // After the drop the app is scaled back down.
    assert!(at(7100.0).capacity < 10.0, "{:?}", at(7100.0));
    assert!(r.pending_p99_seconds >= 60.0, "waited at least the startup: {r:#?}");
    assert!(r.under_target_seconds >= 60.0 && r.under_target_seconds < 600.0, "{r:#?}");
    assert!(r.over_target_seconds > 0.0, "idle while scaling down: {r:#?}");
    assert!(r.waited_fraction > 0.0 && r.waited_fraction <= 1.0);
    assert_eq!(r.pending_at_end, 0.0);
    // 2 units for 2 h is the floor; 10 for an hour on top is the ceiling-ish.
    assert!(r.unit_hours > 4.0 && r.unit_hours < 16.0, "{}", r.unit_hours);
}

#[test]
fn utilization_policy_follows_the_step_too() {
    let doc = r#"
[autoscaling]
policy = "utilization"
interval = "10s"
[autoscaling.utilization]
metric = "cpu"
window = "1m"
scale_out_threshold_percent = 80.0
scale_in_threshold_percent = 50.0
scale_out_grace_period = "1m"
scale_in_grace_period = "1m"
scale_in_min_units = 2
max_units = 40
[sim]
startup_seconds = "30s"
drain_seconds = 0
"#;
    let (policy, model) = policy_file_from_toml(doc).expect("valid");
    assert_eq!(model.initial_units, 2);
    assert_eq!(model.unit, Res::new(1000, 4 * GI));
    let r = simulate(&policy, &model, &step_trace());
    let at = |s: f64| r.series.iter().rev().find(|p| p.at_s <= s).copied().expect("a point");
    assert!(at(1700.0).capacity >= 2.0 && at(1700.0).pending == 0.0, "{:?}", at(1700.0));
    assert!(at(3600.0).capacity >= 10.0 && at(3600.0).pending == 0.0, "{:?}", at(3600.0));
    assert!(r.under_target_seconds > 0.0);
}

#[test]
fn the_same_inputs_give_the_same_report() {
    let (policy, model) = policy_file_from_toml(basic_policy()).expect("valid");
    let a = simulate(&policy, &model, &step_trace());
    let b = simulate(&policy, &model, &step_trace());
    assert_eq!(a, b);
}

#[test]
fn csv_parses_and_names_bad_lines() {
    let t = Trace::parse_csv("time_s,cpu_millis,memory_bytes,utilization\n# c\n0,1000,5\n\n60,2000,6,0.5\n120,0,0,\n")
        .expect("valid");
    assert_eq!(t.rows.len(), 3);
    assert_eq!(t.end_ms, 120_000);
    assert_eq!(t.rows[1].utilization, Some(0.5));
    assert_eq!(t.rows[1].demand, Res::new(2000, 6));
    let bad = |text: &str, line: usize, what: &str| {
        let e = Trace::parse_csv(text).expect_err(text);
        assert_eq!(e.line, line, "{e}");
        assert!(e.to_string().contains(what), "{e} lacks {what:?}");
    };
    let h = "time_s,cpu_millis,memory_bytes\n";
    bad("time,cpu\n0,1\n", 1, "the header must be");
    bad(&format!("{h}0,1,1\n10,abc,1\n"), 3, "cpu_millis: \"abc\" is not a number");
    bad(&format!("{h}0,1,1\n10,1,-4\n"), 3, "memory_bytes: -4 is negative");
    bad(&format!("{h}0,1,1\n20,1,1\n10,1,1\n"), 4, "not after the previous row's 20");
    bad(&format!("{h}0,1,1\n10,1\n"), 3, "expected 3 fields");
    bad(&format!("{h}0,1,1\n10,1,1,0.5\n"), 3, "expected 3 fields");
    bad(&format!("{h}5,1,1\n10,1,1\n"), 2, "the first row must be at 0");
    bad(&format!("{h}0,1,1\n"), 2, "at least two");
    bad("time_s,cpu_millis,memory_bytes,utilization\n0,1,1,1.5\n", 2, "not within [0, 1]");
    bad(&format!("{h}0,1,1\n1e99,1,1\n"), 3, "more than a year");
    bad(&format!("{h}0,1,1\n10,NaN,1\n"), 3, "not a finite number");
    let mut many = String::from(h);
    for i in 0..=MAX_ROWS {
        many.push_str(&format!("{i},1,1\n"));
    }
    bad(&many, MAX_ROWS + 2, "more than 1000000 rows");
}

#[test]
fn policy_file_problems_are_all_named() {
    let doc = r#"
[autoscaling]
policy = "basic"
[autoscaling.basic]
cooldown_period = "30s"
scale_up_factor = 1.0
scale_down_factor = 1.0
[autoscaling.basic.worker_config]
max_instances = 10
[sim]
unit_cpu = "lots"
unit_memory = 0
startup_seconds = "2d"
"#;
    let e = policy_file_from_toml(doc).expect_err("invalid").to_string();
    for field in [
        "autoscaling.basic.cooldown_period",
        "autoscaling.basic.graceful_decommission_timeout",
        "sim.unit_cpu",
        "sim.unit_memory",
        "sim.startup_seconds",
    ] {
        assert!(e.contains(field), "{e} lacks {field}");
    }
    let e = policy_file_from_toml(&basic_policy().replace("initial_units = 2", "initial_units = 99"))
        .expect_err("out of bounds")
        .to_string();
    assert!(e.contains("sim.initial_units: 99 is not within the policy's bounds [2, 40]"), "{e}");
    let e = policy_file_from_toml(&basic_policy().replace("[sim]", "[sim]\nspeed = 1")).expect_err("unknown");
    assert!(e.to_string().contains("speed"), "{e}");
    let e = policy_file_from_toml(&basic_policy().replace("max_instances = 40", "max_instances = 100000"))
        .expect_err("too many units")
        .to_string();
    assert!(
        e.contains("max_instances: 100000 units (with the secondary group's) is more than an app may have (10000)"),
        "{e}"
    );
}

#[test]
fn a_policy_file_that_does_not_parse_says_so_once() {
    let e = policy_file_from_toml("[autoscaling\nbad").expect_err("not TOML");
    assert!(e.to_string().starts_with("policy file does not parse: TOML parse error"), "{e}");
    // `flotilla sim` prints the chain of causes: the parser's message must not be one.
    assert!(std::error::Error::source(&e).is_none(), "{e:?}");
}
