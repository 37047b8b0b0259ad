use super::basic::{round_down, round_up, split};
use super::*;

const GIB: u64 = 1 << 30;

fn basic_toml(extra: &str) -> String {
    format!(
        r#"
[autoscaling]
policy = "basic"
[autoscaling.basic]
cooldown_period = "2m"
graceful_decommission_timeout = "1h"
scale_up_factor = 0.5
scale_down_factor = 0.5
{extra}
[autoscaling.basic.worker_config]
min_instances = 2
max_instances = 100
"#
    )
}

fn basic_policy(extra: &str) -> Policy {
    match AutoscalingConfig::policy_from_toml(&basic_toml(extra)) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn load(pending: u64, available: u64, allocated: u64) -> Load {
    Load { pending: Res::new(0, pending), available: Res::new(0, available), allocated: Res::new(0, allocated) }
}

fn sig(active: u32, load: Option<Load>) -> Signals<'static> {
    Signals {
        primary: GroupUnits { active, decommissioning: 0 },
        per_unit: Res::new(0, 2 * GIB),
        load,
        ..Default::default()
    }
}

#[test]
fn dataproc_rounding_examples() {
    assert_eq!(round_up(5.0 * 0.5), 3);
    assert_eq!(round_up(0.8 * 0.5), 1);
    assert_eq!(round_down(-5.0 * 0.5), -2);
    assert_eq!(round_down(-0.8 * 0.5), 0);
    assert_eq!(round_down(-1.5 * 0.5), 0);
    assert_eq!(round_up(0.1 * 3.0 * 10.0), 3, "float noise does not add a unit");
}

#[test]
fn basic_scale_up_with_explanation() {
    let p = basic_policy("");
    let mut st = State::new(&p);
    // 5 units × 2 GiB: 8 GiB allocated, 2 GiB available, 12 GiB pending → Δ = (12 − 2) / 2 = 5.
    let d = evaluate(&p, &mut st, &sig(5, Some(load(12 * GIB, 2 * GIB, 8 * GIB))), 1_000);
    assert_eq!(d.action, Action::ScaleUp);
    assert_eq!(d.inputs.get("delta"), Some(3.0), "ROUND_UP(5 × 0.5) = 3");
    assert_eq!(d.desired, Units { primary: 8, secondary: 0 });
    let e = d.explanation();
    assert_eq!(
        e,
        "estimate = current 5 + avg(pending 12 GiB − available 2 GiB) / 2 GiB per unit = 10 (memory); \
         Δ = 10 − 5 = 5; ROUND_UP(5 × 0.50) = 3 → scale up to 8 units (primary 8, secondary 0)"
    );
    let json = serde_json::to_value(&d).unwrap_or_default();
    assert_eq!(json["action"], "scale_up");
    assert_eq!(json["inputs"]["delta"], 3.0);
    assert_eq!(json["explanation"], e);
}

#[test]
fn basic_small_changes_follow_the_documented_rounding() {
    let p = basic_policy("");
    // Δ = 0.8 → ROUND_UP(0.4) = 1.
    let d = evaluate(&p, &mut State::new(&p), &sig(5, Some(load(GIB * 8 / 5, 0, 10 * GIB))), 0);
    assert_eq!((d.action, d.desired.total()), (Action::ScaleUp, 6));
    // Δ = −5 → ROUND_DOWN(−2.5) = −2.
    let d = evaluate(&p, &mut State::new(&p), &sig(10, Some(load(0, 10 * GIB, 10 * GIB))), 0);
    assert_eq!((d.action, d.desired.total()), (Action::ScaleDown, 8));
    assert_eq!(d.graceful_decommission_timeout_ms, Some(3_600_000));
    // Δ = −0.8 and −1.5 → ROUND_DOWN to 0: nothing.
    for available in [GIB * 8 / 5, 3 * GIB] {
        let d = evaluate(&p, &mut State::new(&p), &sig(10, Some(load(0, available, 10 * GIB))), 0);
        assert_eq!((d.action, d.reason), (Action::None, Reason::NoChange));
    }
}

#[test]
fn basic_min_worker_fraction() {
    // Adding 5 to 100 needs scale_up_min_worker_fraction ≤ 0.05.
    let demand = Some(load(20 * GIB, 0, 200 * GIB)); // Δ = 10 → ROUND_UP(5) = 5
    for (fraction, acts) in [(0.06, false), (0.05, true)] {
        let p = basic_policy(&format!("scale_up_min_worker_fraction = {fraction}"));
        let p = Policy {
            algorithm: match p.algorithm {
                Algorithm::Basic(b) => Algorithm::Basic(BasicPolicy { primary: Group { max: 200, ..b.primary }, ..b }),
                a => a,
            },
            ..p
        };
        let d = evaluate(&p, &mut State::new(&p), &sig(100, demand), 0);
        assert_eq!(d.action == Action::ScaleUp, acts, "fraction {fraction}: {}", d.explanation());
        if !acts {
            assert!(matches!(d.reason, Reason::BelowMinWorkerFraction { .. }));
        }
    }
}

#[test]
fn basic_cooldown_and_averaging() {
    let p = basic_policy("");
    let mut st = State::new(&p);
    let busy = Some(load(12 * GIB, 0, 10 * GIB));
    assert_eq!(evaluate(&p, &mut st, &sig(5, busy), 0).action, Action::ScaleUp);
    // Samples taken during the cooldown count towards the next estimate: 8, 0, 8, 0, 8, 0, then 4
    // GiB pending average to 4 GiB.
    let d = evaluate(&p, &mut st, &sig(11, Some(load(8 * GIB, 0, 22 * GIB))), 60_000);
    assert_eq!(d.reason, Reason::Cooldown { remaining_ms: 60_000 });
    let mut st2 = st.clone();
    for (i, t) in (70_000..120_000).step_by(10_000).enumerate() {
        let pending = if i % 2 == 1 { 8 * GIB } else { 0 };
        evaluate(&p, &mut st2, &sig(11, Some(load(pending, 0, 22 * GIB))), t);
    }
    let d = evaluate(&p, &mut st2, &sig(11, Some(load(4 * GIB, 0, 22 * GIB))), 120_000);
    assert_eq!(d.inputs.get("pending_memory"), Some(4.0 * GIB as f64));
    assert_eq!(d.action, Action::ScaleUp);
    assert_eq!(d.desired.total(), 12, "{}", d.explanation());
}

#[test]
fn basic_no_data_never_scales() {
    let p = basic_policy("");
    let d = evaluate(&p, &mut State::new(&p), &sig(50, None), 0);
    assert_eq!((d.action, d.reason), (Action::None, Reason::NoData { missing: "load" }));
    assert!(d.explanation().contains("no data"));
}

#[test]
fn basic_cancels_an_in_flight_scale_down() {
    let p = basic_policy("");
    let mut s = sig(6, Some(load(12 * GIB, 0, 12 * GIB))); // Δ = 6 → 3
    s.primary.decommissioning = 3;
    let d = evaluate(&p, &mut State::new(&p), &s, 0);
    assert_eq!(d.action, Action::CancelScaleDown, "active 6 + 3 ≥ 6 + 3");
    assert_eq!(d.desired, Units { primary: 9, secondary: 0 });
    s.primary.decommissioning = 4;
    let d = evaluate(&p, &mut State::new(&p), &s, 0);
    assert_eq!((d.action, d.reason), (Action::None, Reason::ScaleDownInProgress));
}

#[test]
fn basic_estimate_from_allocated_and_cpu_wins() {
    let p = basic_policy("estimate_from = \"allocated\"");
    let d = evaluate(&p, &mut State::new(&p), &sig(10, Some(load(50 * GIB, 10 * GIB, 6 * GIB))), 0);
    // avg(allocated 6 GiB) / 2 GiB = 3 → Δ = −7 → ROUND_DOWN(−3.5) = −3.
    assert_eq!(d.desired.total(), 7, "{}", d.explanation());
    let p = basic_policy("");
    let mut s =
        sig(4, Some(Load { pending: Res::new(8000, 0), available: Res::new(0, 0), allocated: Res::new(4000, 0) }));
    s.per_unit = Res::new(1000, 2 * GIB);
    let d = evaluate(&p, &mut State::new(&p), &s, 0);
    assert_eq!(d.inputs.get("estimate"), Some(12.0), "cpu estimate wins: {}", d.explanation());
    assert!(d.explanation().contains("(cpu; memory: 4)"), "{}", d.explanation());
}

#[test]
fn weights_split_and_bounds() {
    let g = |min, max, weight| Group { min, max, weight };
    let cur = Units { primary: 2, secondary: 0 };
    assert_eq!(split(12, cur, g(2, 10, 2), g(0, 10, 1)), Units { primary: 8, secondary: 4 });
    // Primary at its max: the secondary takes the change.
    assert_eq!(
        split(12, Units { primary: 5, secondary: 0 }, g(2, 5, 1), g(0, 10, 1)),
        Units { primary: 5, secondary: 7 }
    );
    // Weight only on primary: secondary weight 0, unused until primary is full.
    let p = basic_policy("[autoscaling.basic.secondary_worker_config]\nmax_instances = 50");
    let Algorithm::Basic(b) = &p.algorithm else { unreachable!() };
    assert_eq!((b.primary.weight, b.secondary.weight), (1, 1), "no weight anywhere: equal");
    let p = basic_policy("[autoscaling.basic.secondary_worker_config]\nmax_instances = 50\nweight = 3");
    let Algorithm::Basic(b) = &p.algorithm else { unreachable!() };
    assert_eq!((b.primary.weight, b.secondary.weight), (0, 3), "weight on one group only: 0 on the other");
    // Out of bounds (max lowered to 4 while 6 run): corrected even with no load change.
    let p = basic_policy("").clone();
    let Algorithm::Basic(b) = p.algorithm else { unreachable!() };
    let p = Policy { algorithm: Algorithm::Basic(BasicPolicy { primary: Group { max: 4, ..b.primary }, ..b }), ..p };
    let d = evaluate(&p, &mut State::new(&p), &sig(6, Some(load(0, 0, 12 * GIB))), 0);
    assert_eq!((d.action, d.desired.total()), (Action::ScaleDown, 4), "{}", d.explanation());
}

#[test]
fn mr3_utilization_example_is_50_percent() {
    // 10 units with 32 GB allocated each, 40 tasks of 4 GB running: 40 × 4 / (10 × 32) = 50 %.
    let members: Vec<MemberUsage> =
        (0..10).map(|_| MemberUsage { used: Res::new(0, 4 * 4 * GIB), allocated: Res::new(0, 32 * GIB) }).collect();
    let p = util_policy("");
    let s = Signals {
        primary: GroupUnits { active: 10, decommissioning: 0 },
        per_unit: Res::new(0, 32 * GIB),
        members: Some(&members),
        ..Default::default()
    };
    let d = evaluate(&p, &mut State::new(&p), &s, 0);
    assert_eq!(d.inputs.get("utilization_percent"), Some(50.0));
    assert_eq!(d.reason, Reason::WithinThresholds, "50 % is between 40 % and 80 %: {}", d.explanation());
}

fn util_policy(extra: &str) -> Policy {
    let doc = format!(
        "[autoscaling]\npolicy = \"utilization\"\n[autoscaling.utilization]\nscale_in_threshold_percent = 40\nmax_units = 40\n{extra}"
    );
    match AutoscalingConfig::policy_from_toml(&doc) {
        Ok(p) => p,
        Err(e) => panic!("{e}"),
    }
}

fn util_sig(members: &[MemberUsage], decommissioning: u32) -> Signals<'_> {
    Signals {
        primary: GroupUnits { active: members.len() as u32, decommissioning },
        per_unit: Res::new(0, 10 * GIB),
        members: Some(members),
        ..Default::default()
    }
}

fn members(n: u32, used_total: u64) -> Vec<MemberUsage> {
    (0..n)
        .map(|_| MemberUsage { used: Res::new(0, used_total / u64::from(n)), allocated: Res::new(0, 10 * GIB) })
        .collect()
}

#[test]
fn mr3_states_grace_delay_and_scale_in_in_progress() {
    let p = util_policy("");
    let mut st = State::new(&p);
    // 10 units, 90 % used → ⌊10 × 90 / 80⌋ + 1 = 12 units.
    let m = members(10, 90 * GIB);
    let d = evaluate(&p, &mut st, &util_sig(&m, 0), 0);
    assert_eq!(
        (d.action, d.desired.total(), d.phase),
        (Action::ScaleUp, 12, Some(Phase::ScaleOut)),
        "{}",
        d.explanation()
    );
    assert_eq!(
        d.explanation(),
        "utilization = average over the window of used ÷ allocated = 90% (last sample 90 GiB ÷ 100 GiB); \
         thresholds: in ≤ 40%, out ≥ 80%; add ⌊10 × 90% ÷ 80%⌋ + 1 − 10 = 2 → scale up to 12 units (primary 12, secondary 0)"
    );
    // Still hot inside the grace period: not repeated (and this 90 % sample stays in the window).
    let d = evaluate(&p, &mut st, &util_sig(&m, 0), 100_000);
    assert!(matches!(d.reason, Reason::ScaleOutGracePeriod { .. }));
    // Load drops; after the grace period the state is STABLE, then scale-in waits the delay.
    let low = members(12, 12 * GIB);
    evaluate(&p, &mut st, &util_sig(&low, 0), 290_000);
    let d = evaluate(&p, &mut st, &util_sig(&low, 0), 300_000);
    assert_eq!(d.phase, Some(Phase::Stable));
    assert!(matches!(d.reason, Reason::ScaleInDelayAfterScaleOut { .. }), "{}", d.explanation());
    let d = evaluate(&p, &mut st, &util_sig(&low, 0), 360_000);
    // avg(90, 10, 10, 10) = 30 % on 12 units → ⌈12 × 30 / 40⌉ = 9 units.
    assert_eq!(d.inputs.get("utilization_percent"), Some(30.0));
    assert_eq!(
        (d.action, d.desired.total(), d.phase),
        (Action::ScaleDown, 9, Some(Phase::ScaleIn)),
        "{}",
        d.explanation()
    );
    assert!(
        d.explanation().contains("remove 12 − ⌈12 × 30% ÷ 40%⌉ = 3 → scale down to 9 units"),
        "{}",
        d.explanation()
    );
    // While units decommission, even a hot cluster gets no new unit.
    let hot = members(3, 30 * GIB);
    let d = evaluate(&p, &mut st, &util_sig(&hot, 9), 700_000);
    assert_eq!(d.reason, Reason::ScaleInInProgress);
    let d = evaluate(&p, &mut st, &util_sig(&hot, 0), 710_000);
    assert_eq!(d.action, Action::ScaleUp);
}

#[test]
fn mr3_window_scheme_idle_head_and_no_data() {
    let p = util_policy("scheme = \"maximum\"");
    let mut st = State::new(&p);
    let idle = members(4, 0);
    let some = members(4, 20 * GIB); // 50 %
    for t in 0..30 {
        evaluate(&p, &mut st, &util_sig(&idle, 0), t * 10_000);
    }
    let d = evaluate(&p, &mut st, &util_sig(&some, 0), 300_000);
    assert_eq!(d.inputs.get("utilization_percent"), Some(50.0), "idle head dropped");
    let p2 = util_policy("");
    let mut st2 = State::new(&p2);
    for t in 0..30 {
        evaluate(&p2, &mut st2, &util_sig(&idle, 0), t * 10_000);
    }
    evaluate(&p2, &mut st2, &util_sig(&some, 0), 300_000);
    let d = evaluate(&p2, &mut st2, &util_sig(&members(4, 0), 0), 310_000);
    assert_eq!(d.inputs.get("utilization_percent"), Some(25.0), "average after the idle head");
    // No running unit: the sample is skipped. No data: nothing happens, and nothing scales in.
    let d = evaluate(&p2, &mut st2, &Signals { members: None, ..util_sig(&idle, 0) }, 320_000);
    assert_eq!((d.action, d.reason), (Action::None, Reason::NoData { missing: "members" }));
}

#[test]
fn mr3_initial_units_from_zero() {
    let p = util_policy("scale_out_initial_units = 3");
    let none: [MemberUsage; 0] = [];
    let mut s = util_sig(&none, 0);
    s.load = Some(load(25 * GIB, 0, 0));
    let d = evaluate(&p, &mut State::new(&p), &s, 0);
    assert_eq!(d.desired.total(), 3);
    let p = util_policy("");
    let d = evaluate(&p, &mut State::new(&p), &s, 0);
    assert_eq!(d.desired.total(), 3, "⌈25 GiB / 10 GiB⌉");
    s.load = None;
    assert_eq!(evaluate(&p, &mut State::new(&p), &s, 0).reason, Reason::NoPendingDemand);
}

#[test]
fn config_round_trips_and_parses_durations() {
    let p = basic_toml("");
    let cfg = AutoscalingConfig::from_toml(&p).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.interval, Span::secs(10));
    let back = toml::to_string(&cfg).unwrap_or_default();
    assert!(back.contains("cooldown_period = \"2m\""), "{back}");
    assert_eq!("1h30m".parse::<Span>(), Ok(Span::secs(5400)));
    assert_eq!("1d".parse::<Span>(), Ok(Span::secs(86_400)));
    assert_eq!("90".parse::<Span>(), Ok(Span::secs(90)));
    assert!("2x".parse::<Span>().is_err() && "m".parse::<Span>().is_err() && "5".repeat(30).parse::<Span>().is_err());
    // The flags' grammar (issue #35 item 8): milliseconds and fractions parse, and a
    // policy says it counts whole seconds rather than reject the syntax.
    assert_eq!("1.5m".parse::<Span>(), Ok(Span::secs(90)));
    assert_eq!("2000ms".parse::<Span>(), Ok(Span::secs(2)));
    assert!("1ms".parse::<Span>().is_err_and(|e| e.contains("whole seconds")));
    let e = AutoscalingConfig::from_toml(&p.replace("scale_up_factor", "scale_up_facter"));
    assert!(e.is_err_and(|e| e.to_string().contains("scale_up_facter")));
    let named = "[autoscaling]\nname = \"batch\"\npolicy = \"utilization\"\ninterval = 5\n[autoscaling.utilization]\nmax_units = 8";
    let pol = AutoscalingConfig::policy_from_toml(named).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((pol.name.as_deref(), pol.interval_ms), (Some("batch"), 5000));
}

#[test]
fn validation_names_every_problem() {
    let doc = r#"
[autoscaling]
policy = "basic"
[autoscaling.basic]
cooldown_period = "10s"
graceful_decommission_timeout = "1h"
scale_up_factor = 1.5
scale_down_factor = 0.5
[autoscaling.basic.worker_config]
min_instances = 5
max_instances = 3
[autoscaling.utilization]
scheme = "median"
max_units = 10
"#;
    let Err(ConfigError::Invalid(Problems(ps))) = AutoscalingConfig::policy_from_toml(doc) else {
        panic!("expected problems")
    };
    let text: Vec<String> = ps.iter().map(ToString::to_string).collect();
    assert_eq!(
        text,
        [
            "autoscaling.basic.cooldown_period: 10s is not within [2m, 1d] (allow_short_cooldown_for_tests lowers the minimum)",
            "autoscaling.basic.scale_up_factor: 1.5 is not within [0.0, 1.0]",
            "autoscaling.basic.worker_config.min_instances: 5 is greater than max_instances 3",
            "autoscaling.utilization.scheme: \"median\" is not one of average, maximum",
        ]
    );
    let ok = doc
        .replace("\"10s\"", "\"10s\"\nallow_short_cooldown_for_tests = true")
        .replace("1.5", "1.0")
        .replace("min_instances = 5", "min_instances = 2")
        .replace("median", "max");
    assert!(AutoscalingConfig::policy_from_toml(&ok).is_ok());
    let more = "[autoscaling]\npolicy = \"fancy\"\ninterval = \"0s\"\n[autoscaling.utilization]\nscale_out_threshold_percent = 120\nscale_in_threshold_percent = 0\nscale_in_grace_period = \"2d\"\nscale_in_min_units = 3\n";
    let Err(ConfigError::Invalid(Problems(ps))) = AutoscalingConfig::policy_from_toml(more) else { panic!() };
    let fields: Vec<&str> = ps.iter().map(|p| p.field.as_str()).collect();
    assert_eq!(
        fields,
        [
            "autoscaling.policy",
            "autoscaling.interval",
            "autoscaling.utilization.scale_out_threshold_percent",
            "autoscaling.utilization.scale_in_threshold_percent",
            "autoscaling.utilization.scale_in_grace_period",
            "autoscaling.utilization.max_units",
        ]
    );
    let weight = basic_toml("").replace("max_instances = 100", "max_instances = 100\nweight = -1");
    let Err(ConfigError::Invalid(Problems(ps))) = AutoscalingConfig::policy_from_toml(&weight) else { panic!() };
    assert_eq!(ps[0].to_string(), "autoscaling.basic.worker_config.weight: -1 is negative");
}

mod props {
    use super::*;
    use proptest::prelude::*;

    fn basic_with(
        (pmin, pmax): (u32, u32),
        (smin, smax): (u32, u32),
        (up, down): (f64, f64),
        (fu, fd): (f64, f64),
    ) -> Policy {
        let doc = format!(
            r#"
[autoscaling]
policy = "basic"
[autoscaling.basic]
cooldown_period = "2m"
graceful_decommission_timeout = "0s"
scale_up_factor = {up:?}
scale_down_factor = {down:?}
scale_up_min_worker_fraction = {fu:?}
scale_down_min_worker_fraction = {fd:?}
[autoscaling.basic.worker_config]
min_instances = {pmin}
max_instances = {pmax}
weight = 2
[autoscaling.basic.secondary_worker_config]
min_instances = {smin}
max_instances = {smax}
weight = 1
"#
        );
        AutoscalingConfig::policy_from_toml(&doc).unwrap_or_else(|e| panic!("{e}"))
    }

    fn within(p: &Policy, u: Units) -> bool {
        match &p.algorithm {
            Algorithm::Basic(b) => {
                (b.primary.min..=b.primary.max).contains(&u.primary)
                    && (b.secondary.min..=b.secondary.max).contains(&u.secondary)
            }
            Algorithm::Utilization(x) => u.total() <= x.max_units,
        }
    }

    proptest! {
        #[test]
        fn basic_stays_in_bounds_and_respects_cooldown(
            pmin in 0u32..5, pspan in 0u32..20, smin in 0u32..3, sspan in 0u32..20,
            up in 0.0f64..=1.0, down in 0.0f64..=1.0, fu in 0.0f64..0.3, fd in 0.0f64..0.3,
            steps in proptest::collection::vec((0u64..40, 0u64..40, 1u64..90), 1..60),
        ) {
            let p = basic_with((pmin, pmin + pspan), (smin, smin + sspan), (up, down), (fu, fd));
            let mut st = State::new(&p);
            let mut units = Units { primary: pmin, secondary: smin };
            let mut last: Option<u64> = None;
            let mut now = 0u64;
            for (pending, free_units, dt) in steps {
                now += dt * 1000;
                let cap = u64::from(units.total()) * 2 * GIB;
                let available = (free_units * GIB).min(cap);
                let s = Signals {
                    primary: GroupUnits { active: units.primary, decommissioning: 0 },
                    secondary: GroupUnits { active: units.secondary, decommissioning: 0 },
                    per_unit: Res::new(0, 2 * GIB),
                    load: Some(load(pending * GIB, available, cap - available)),
                    members: None,
                };
                let d = evaluate(&p, &mut st, &s, now);
                prop_assert!(within(&p, d.desired), "{:?} {}", d.desired, d.explanation());
                if d.action != Action::None {
                    if let Some(l) = last { prop_assert!(now - l >= 120_000, "two actions within a cooldown"); }
                    last = Some(now);
                }
                units = d.desired;
            }
        }

        #[test]
        fn basic_constant_load_converges(demand_units in 0u64..60, start in 2u32..40, up in 0.1f64..=1.0, down in 0.1f64..=1.0) {
            let p = basic_with((2, 50), (0, 0), (up, down), (0.0, 0.0));
            let mut st = State::new(&p);
            let mut units = Units { primary: start, secondary: 0 };
            let (mut directions, mut last_i) = (Vec::new(), 0);
            for i in 0..1000u64 {
                let cap = u64::from(units.total()) * 2 * GIB;
                let used = (demand_units * 2 * GIB).min(cap);
                let pending = demand_units * 2 * GIB - used;
                let s = sig(units.primary, Some(load(pending, cap - used, used)));
                let d = evaluate(&p, &mut st, &s, i * 10_000);
                if d.action != Action::None { directions.push(d.action); last_i = i; }
                units = d.desired;
            }
            let reversals = directions.windows(2).filter(|w| w[0] != w[1]).count();
            prop_assert_eq!(reversals, 0, "{:?}", directions);
            // Scale-ups reach the target (ROUND_UP adds at least one unit); scale-downs stop once
            // ROUND_DOWN(Δ × scale_down_factor) is 0, between the start and the target.
            let (target, end) = (demand_units.clamp(2, 50), u64::from(units.total()));
            if target >= u64::from(start) { prop_assert_eq!(end, target); } else { prop_assert!((target..=u64::from(start)).contains(&end)); }
            prop_assert!(last_i < 900, "still acting at evaluation {}", last_i);
        }

        #[test]
        fn utilization_bounds_grace_and_convergence(
            load_gib in 0u64..400, start in 1u32..30, inc in 0u32..4, dec in 0u32..4, min_units in 0u32..3,
            scheme_max in any::<bool>(),
        ) {
            let p = util_policy(&format!(
                "scale_out_increment_units = {inc}\nscale_in_decrement_units = {dec}\nscale_in_min_units = {min_units}\nscheme = \"{}\"",
                if scheme_max { "maximum" } else { "average" }
            ));
            let Algorithm::Utilization(up) = &p.algorithm else { unreachable!() };
            let mut st = State::new(&p);
            let mut n = start.min(40);
            let mut directions = Vec::new();
            let mut last_up: Option<u64> = None;
            for i in 0..2000u64 {
                let now = i * 10_000;
                let used = (load_gib * GIB).min(u64::from(n) * 10 * GIB);
                let m = members(n, used);
                let d = evaluate(&p, &mut st, &util_sig(&m, 0), now);
                prop_assert!(d.desired.total() <= up.max_units);
                if d.action == Action::ScaleUp {
                    if let Some(l) = last_up { prop_assert!(now - l >= up.scale_out_grace_period_ms); }
                    last_up = Some(now);
                }
                if d.action == Action::ScaleDown {
                    prop_assert!(d.desired.total() >= min_units.min(n));
                }
                if d.action != Action::None { directions.push(d.action); }
                n = d.desired.total();
            }
            let reversals = directions.windows(2).filter(|w| w[0] != w[1]).count();
            prop_assert!(reversals <= 1, "oscillates: {:?}", directions);
            // Converged: the last 100 evaluations did nothing.
            let tail = directions.len();
            let mut st2 = st.clone();
            for i in 2000..2100u64 {
                let used = (load_gib * GIB).min(u64::from(n) * 10 * GIB);
                let m = members(n, used);
                let d = evaluate(&p, &mut st2, &util_sig(&m, 0), i * 10_000);
                prop_assert_eq!(d.action, Action::None, "after {} actions: {}", tail, d.explanation());
            }
        }
    }
}

#[test]
fn utilization_says_it_does_not_count_demand_while_units_run() {
    let p = util_policy("");
    let mut st = State::new(&p);
    let m = members(4, 20 * GIB);
    let with_demand = Signals { load: Some(load(30 * GIB, 0, 40 * GIB)), ..util_sig(&m, 0) };
    let d = evaluate(&p, &mut st, &with_demand, 0);
    assert_eq!(d.inputs.get("demand_not_counted"), Some((30 * GIB) as f64));
    let text = d.explanation();
    assert!(text.ends_with("a consumer's demand (30 GiB past capacity) is not counted while units run: utilization sizes by what members use"), "{text}");
    let d = evaluate(&p, &mut State::new(&p), &util_sig(&m, 0), 0);
    assert!(!d.explanation().contains("demand"), "no demand, no note");
}

#[test]
fn decision_inputs_serialize_without_float_dust() {
    let mut inputs = crate::decision::Inputs::default();
    inputs.set("estimate", 1596.9999999999982);
    inputs.set("utilization_percent", 100.0 / 3.0);
    inputs.set("pending_memory", 3.0 * 1099511627776.0 + 0.4);
    let json = serde_json::to_value(inputs).unwrap();
    assert_eq!(json["estimate"], 1597.0);
    assert_eq!(json["utilization_percent"], 33.333);
    assert_eq!(json["pending_memory"], 3298534883328.0);
}
