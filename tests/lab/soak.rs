//! The mixed-fault soak, two minutes of it, through the real command
//! (`flotilla-loadtest lab --soak`): partitions, one-way cuts, loss, an isolated shard
//! host, a scheduler cut from etcd, agent kills, scaling, applies and drains on 17 hosts,
//! with no violation and a converged federation after the last heal.

#[test]
fn two_minutes_of_mixed_faults_violate_nothing_and_converge() {
    let out = std::process::Command::new(flotilla_testkit::bin("flotilla-loadtest"))
        .args(["lab", "--soak", "--minutes", "2", "--seed", "1", "--json"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the soak failed ({}):\n{stdout}\n{stderr}", out.status);
    eprintln!("{stderr}{stdout}");
    let report: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("{}")).unwrap();
    assert_eq!(report["violations"], 0, "{report}");
    assert!(report["hosts"].as_u64().unwrap() >= 16, "{report}");
    assert!(report["operations"].as_u64().unwrap() >= 10, "{report}");
    assert!(report["partitions"].as_u64().is_some(), "{report}");
    assert!(report["converged_seconds"].as_f64().is_some_and(f64::is_finite), "{report}");
}
