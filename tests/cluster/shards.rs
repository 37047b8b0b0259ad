//! Shards as processes of their own: one killed (its nodes Unknown, nothing replaced
//! within the grace) and one restarted (its ledger rebuilt from its agents).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use flotilla_testkit::{Agent, Group, Up, free_port, fresh_dir, http, signal, wait_for};

use crate::common::{ECHO, ledgers_match_units, running};

/// Two shard processes, four agents (two in a failure domain of each shard) and a
/// standalone scheduler for the echo app, all started by the test.
struct Standalone {
    procs: Group,
    dir: PathBuf,
    shard_addrs: Vec<String>,
    shard_pids: Vec<u32>,
    domains: Vec<String>,
    api: String,
}

impl Standalone {
    fn start(name: &str, max_units_per_domain: u32, scheduler_flags: &[&str]) -> Standalone {
        let dir = fresh_dir(name);
        let d = dir.to_str().unwrap().to_string();
        let mut procs = Group::new();
        // The first shard creates the secrets both use.
        let (mut shard_addrs, mut shard_pids) = (Vec::new(), Vec::new());
        for i in 0..2 {
            let pid = Self::spawn_shard(&mut procs, &dir, i, "127.0.0.1:0");
            shard_addrs.push(procs.addrs(pid)["addr"].as_str().unwrap().to_string());
            shard_pids.push(pid);
        }
        let aggregators = shard_addrs.join(",");
        let domains: Vec<String> = (0..2)
            .map(|s| (0..).map(|i| format!("zone-{i}")).find(|z| flotilla_core::shard_for_domain(z, 2) == s).unwrap())
            .collect();
        for n in 0..4 {
            let node = format!("node-{n}");
            let (domain, ports) = (&domains[n % 2], format!("{}-{}", 31_000 + n * 50, 31_049 + n * 50));
            Agent::new(&aggregators, &node, &dir.join("agents").join(&node))
                .secrets_of(&dir)
                .domain(domain)
                .capacity(4, 8 << 30)
                .arg("--port-range", &ports)
                .spawn(&mut procs, &dir.join(format!("{node}.err")));
        }
        let spec = dir.join("echo.toml");
        let text = std::fs::read_to_string(ECHO).unwrap();
        let text = text.replace("max_units_per_domain = 3", &format!("max_units_per_domain = {max_units_per_domain}"));
        std::fs::write(&spec, text).unwrap();
        let api = format!("http://127.0.0.1:{}", free_port());
        let store = format!("redb:{d}/scheduler.redb");
        let grpc_token = format!("{d}/grpc-token");
        let mut args = vec![
            "scheduler",
            "--app",
            spec.to_str().unwrap(),
            "--aggregators",
            &aggregators,
            "--store",
            &store,
            "--listen",
            api.trim_start_matches("http://"),
            "--token",
            "t",
            "--grpc-token-file",
            &grpc_token,
        ];
        args.extend_from_slice(scheduler_flags);
        procs.spawn(&args, &dir.join("scheduler.err"));
        Standalone { procs, dir, shard_addrs, shard_pids, domains, api }
    }

    fn spawn_shard(procs: &mut Group, dir: &Path, i: usize, listen: &str) -> u32 {
        let d = dir.to_str().unwrap();
        procs.spawn(
            &[
                "aggregator",
                "--listen",
                listen,
                "--shard",
                &i.to_string(),
                "--shards",
                "2",
                "--data",
                d,
                "--print-addrs",
            ],
            &dir.join(format!("shard-{i}.err")),
        )
    }
}

#[test]
fn a_killed_shard_leaves_its_nodes_unknown_and_nothing_is_replaced_until_the_grace_expires() {
    // One unit per domain, so one on each shard.
    let Standalone { procs, dir, shard_pids, domains, api, .. } =
        Standalone::start("shardkill", 1, &["--unknown-grace", "15s"]);
    let up = Up::attach(&dir, &api);
    let units = wait_for("2 running units", Duration::from_secs(40), || {
        let r = running(&up);
        (r.len() == 2).then_some(r)
    });
    // The unit on shard 1's domain.
    let victim = units.iter().find(|u| u["domain"] == domains[1].as_str()).unwrap().clone();
    let victim_id = victim["unit_id"].as_str().unwrap().to_string();

    let killed = Instant::now();
    signal(shard_pids[1] as i32, libc::SIGKILL);
    wait_for("shard 1's nodes Unknown", Duration::from_secs(10), || {
        let nodes = up.nodes();
        let unknown = nodes.iter().filter(|n| n["shard"] == 1 && n["status"] == "unknown").count();
        (unknown == 2).then_some(())
    });
    // Well past the shard's dead-after (3 s), still inside the grace: nothing is replaced.
    while killed.elapsed() < Duration::from_secs(8) {
        let units = up.units("echo");
        assert_eq!(units.len(), 2, "no replacement is queued while the shard is unknown: {units:?}");
        let v = units.iter().find(|u| u["unit_id"] == victim_id.as_str()).unwrap();
        assert_eq!(v["state"], "running", "the unit stays: {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Once the grace expires, its members count as lost.
    wait_for("the unit on the lost shard failed after the grace", Duration::from_secs(30), || {
        let units = up.units("echo");
        let v = units.iter().find(|u| u["unit_id"] == victim_id.as_str())?;
        matches!(v["state"].as_str(), Some("failed" | "terminated")).then_some(())
    });
    let waited = killed.elapsed();
    assert!(waited >= Duration::from_secs(15), "not before the grace: {waited:?}");
    drop(procs);
}

#[test]
fn a_restarted_shard_rebuilds_its_ledger_from_its_agents_with_nothing_lost_or_doubled() {
    let Standalone { mut procs, dir, shard_addrs, shard_pids, api, .. } = Standalone::start("shardrestart", 3, &[]);
    let up = Up::attach(&dir, &api);
    let before: Vec<String> = wait_for("2 running units", Duration::from_secs(40), || {
        let r = running(&up);
        (r.len() == 2).then(|| r.iter().map(|u| u["unit_id"].as_str().unwrap().to_string()).collect())
    });
    wait_for("the ledgers match the units", Duration::from_secs(10), || ledgers_match_units(&up).ok());

    // Whether shard 1's nodes run members now: only then has it something to rebuild.
    let shard_1_nodes: Vec<String> = up
        .nodes()
        .iter()
        .filter(|n| n["shard"] == 1)
        .map(|n| n["node_id"].as_str().unwrap_or_default().to_string())
        .collect();
    let shard_1_ran_members = running(&up).iter().any(|u| {
        u["members"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|m| shard_1_nodes.iter().any(|id| m["node_id"] == id.as_str()))
    });

    // Scale up, and kill -9 shard 1 while those placements are under way.
    let (status, body) = http(&api, "PUT", "/v1/apps/echo/scale", Some("t"), r#"{"units": 5}"#);
    assert_eq!(status, 200, "{body}");
    signal(shard_pids[1] as i32, libc::SIGKILL);
    // Back on the same address, with the same data dir: it recovers.
    let pid = Standalone::spawn_shard(&mut procs, &dir, 1, &shard_addrs[1]);
    assert_eq!(procs.addrs(pid)["addr"], shard_addrs[1].as_str());

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (live, ledgers) = (running(&up).len(), ledgers_match_units(&up));
        if live == 5 && ledgers.is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 60 s: {live} running, {ledgers:?}\nunits: {:?}\nnodes: {:?}",
            up.units("echo")
                .iter()
                .map(|u| (u["unit_id"].clone(), u["state"].clone(), u["unplaced_reason"].clone()))
                .collect::<Vec<_>>(),
            up.nodes()
                .iter()
                .map(|n| (n["node_id"].clone(), n["status"].clone(), n["allocated"]["cpu_millis"].clone()))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let units = up.units("echo");
    for id in &before {
        let u = units.iter().find(|u| u["unit_id"] == id.as_str()).unwrap();
        assert_eq!(u["state"], "running", "a unit on the restarted shard was kept, not replaced: {u}");
    }
    let text = std::fs::read_to_string(dir.join("shard-1.err")).unwrap();
    assert!(
        !shard_1_ran_members || text.contains("ledger rebuilt from what the agent runs"),
        "the restarted shard adopted its agents' members"
    );

    // New claims after the recovery window: placed once, counted once.
    let (status, _) = http(&api, "PUT", "/v1/apps/echo/scale", Some("t"), r#"{"units": 6}"#);
    assert_eq!(status, 200);
    wait_for("6 running units and ledgers that match them", Duration::from_secs(40), || {
        (running(&up).len() == 6 && ledgers_match_units(&up).is_ok()).then_some(())
    });
    drop(up);
    drop(procs);
}

/// Cordons and drains are kept in the shard's data dir: both shards killed (-9) and
/// started again on their addresses, a drained and a cordoned node are still so, and
/// alive again with their agents.
#[test]
fn cordons_and_drains_survive_a_shard_restart() {
    let Standalone { mut procs, dir, shard_addrs, shard_pids, api, .. } = Standalone::start("cordonrestart", 3, &[]);
    let up = Up::attach(&dir, &api);
    wait_for("4 alive nodes", Duration::from_secs(40), || {
        let n = up.nodes();
        (n.len() == 4 && n.iter().all(|n| n["status"] == "alive")).then_some(())
    });
    let shard_of = |node: &str| up.node(node).unwrap()["shard"].as_u64();
    // node-0 and node-1 are in the domains of different shards.
    assert_ne!(shard_of("node-0"), shard_of("node-1"));
    for (node, action) in [("node-0", "drain"), ("node-1", "cordon")] {
        let (status, body) = http(&api, "POST", &format!("/v1/nodes/{node}/{action}"), Some("t"), "");
        assert_eq!(status, 200, "{action} {node}: {body}");
    }
    let held = |up: &Up| {
        let (a, b) = (up.node("node-0")?, up.node("node-1")?);
        let ok = a["cordoned"] == true
            && a["drain_requested"] == true
            && b["cordoned"] == true
            && b["drain_requested"] == false
            && a["status"] == "alive"
            && b["status"] == "alive";
        ok.then_some(())
    };
    wait_for("node-0 drained and node-1 cordoned", Duration::from_secs(20), || held(&up));
    for (i, pid) in shard_pids.iter().enumerate() {
        assert!(dir.join(format!("shard-{i}-of-2.state.json")).exists(), "shard {i} kept its state");
        signal(*pid as i32, libc::SIGKILL);
    }
    for (i, addr) in shard_addrs.iter().enumerate() {
        let pid = Standalone::spawn_shard(&mut procs, &dir, i, addr);
        assert_eq!(procs.addrs(pid)["addr"], addr.as_str());
    }
    // Each restarted shard loaded its one cordon (the view the scheduler still holds from
    // before the kill would show it anyway), then the new views show both again.
    wait_for("both shards restored their cordon", Duration::from_secs(30), || {
        (0..2)
            .all(|i| {
                let text = std::fs::read_to_string(dir.join(format!("shard-{i}.err"))).unwrap_or_default();
                text.lines().any(|l| l.contains("restored the persisted shard state") && l.contains("cordons=1"))
            })
            .then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    wait_for("the drain and the cordon back after the restart, nodes alive", Duration::from_secs(60), || held(&up));
    drop(up);
    drop(procs);
}
