//! The artifact lab's small case through the real command (`flotilla-loadtest p2p`): one
//! artifact to four shaped hosts by Flotilla's swarm, by HTTP from the origin and by
//! BitTorrent (aria2 and opentracker); then the same with a corrupted peer, a peer killed
//! mid-transfer and an origin that cuts reads off. Every host ends with a verified copy,
//! and the swarm reads the origin about once. (Speed is BENCHMARKS.md's, not asserted.)

fn p2p(extra: &[&str]) -> serde_json::Value {
    let out = std::process::Command::new(flotilla_testkit::bin("flotilla-loadtest"))
        .args(["p2p", "--hosts", "4", "--size-mb", "16", "--rate-mbit", "200", "--timeout-seconds", "240", "--json"])
        .args(extra)
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "p2p {extra:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    eprintln!("{stderr}{stdout}");
    serde_json::from_str(stdout.lines().last().unwrap_or("{}")).unwrap()
}

#[test]
fn every_host_gets_a_verified_copy_by_the_swarm_by_http_and_by_bittorrent() {
    let r = p2p(&[]);
    assert_eq!(r["verified_hosts"], 4, "{r}");
    assert_eq!(r["http_verified_hosts"], 4, "{r}");
    assert_eq!(r["bittorrent_verified_hosts"], 4, "{r}");
    let copies = r["origin_copies"].as_f64().unwrap();
    assert!(copies < 1.6, "the swarm read the origin {copies} times: {r}");
    for key in ["makespan_seconds", "ratio_to_limit", "http_makespan_seconds", "bittorrent_makespan_seconds"] {
        assert!(r[key].as_f64().is_some_and(|v| v.is_finite() && v > 0.0), "{key}: {r}");
    }
}

#[test]
fn a_corrupted_peer_a_killed_peer_and_a_dropping_origin_still_end_verified() {
    for fault in ["corrupt-peer", "kill-peer", "drop-origin"] {
        let r = p2p(&["--baselines", "none", "--fault", fault]);
        assert_eq!(r["verified_hosts"], 4, "{fault}: {r}");
    }
}
