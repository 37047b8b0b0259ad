//! A shard standby on a real etcd: the active shard process is killed (-9); the standby,
//! waiting on the shard's lease, serves within the lease TTL, recovers its ledger from the
//! agents (which fail over to it through `--aggregators A|B`), the nodes come back Alive,
//! and no unit is replaced.

use std::time::{Duration, Instant};

use flotilla_testkit::{Agent, Group, Up, free_port, fresh_dir, signal, wait_for};

use crate::common::{ECHO, running};

/// A free port P whose P+1 looks free too (a shard binds UDP P, UDP P+1 and TCP P).
fn free_pair() -> u16 {
    loop {
        let p = free_port();
        if p < u16::MAX && std::net::UdpSocket::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

#[test]
fn a_standby_shard_takes_over_when_the_active_one_is_killed() {
    let etcd = flotilla_testkit::Etcd::start("standby");
    let dir = fresh_dir("shardstandby");
    let d = dir.to_str().unwrap().to_string();
    let mut procs = Group::new();
    let (a, b) = (format!("127.0.0.1:{}", free_pair()), format!("127.0.0.1:{}", free_pair()));
    let etcd_endpoint = etcd.endpoint();
    let shard = |procs: &mut Group, listen: &str, standby: bool, log: &str| {
        let mut args = vec![
            "aggregator",
            "--listen",
            listen,
            "--shard",
            "0",
            "--shards",
            "1",
            "--data",
            &d,
            "--print-addrs",
            "--store",
            &etcd_endpoint,
            "--lease-ttl",
            "2s",
            "--recovery-window",
            "3s",
        ];
        if standby {
            args.push("--standby");
        }
        procs.spawn(&args, &dir.join(log))
    };
    let active = shard(&mut procs, &a, false, "active.err");
    assert_eq!(procs.addrs(active)["addr"], a.as_str());
    let standby = shard(&mut procs, &b, true, "standby.err");
    let aggregators = format!("{a}|{b}");
    for n in 0..3 {
        let node = format!("node-{n}");
        let ports = format!("{}-{}", 32_000 + n * 50, 32_049 + n * 50);
        Agent::new(&aggregators, &node, &dir.join("agents").join(&node))
            .secrets_of(&dir)
            .domain("zone-0")
            .capacity(4, 8 << 30)
            .arg("--port-range", &ports)
            .spawn(&mut procs, &dir.join(format!("{node}.err")));
    }
    let api = format!("http://127.0.0.1:{}", free_port());
    let store = format!("redb:{d}/scheduler.redb");
    let grpc_token = format!("{d}/grpc-token");
    let args = [
        "scheduler",
        "--app",
        ECHO,
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
    procs.spawn(&args, &dir.join("scheduler.err"));
    let up = Up::attach(&dir, &api);
    let members = |up: &Up| {
        let mut v: Vec<String> = running(up)
            .iter()
            .flat_map(|u| {
                let (id, generation) = (u["unit_id"].clone(), u["generation"].clone());
                u["members"].as_array().cloned().unwrap_or_default().into_iter().map(move |m| {
                    format!("{id} gen {generation}: {} on {} gen {}", m["member"], m["node_id"], m["generation"])
                })
            })
            .collect();
        v.sort();
        v
    };
    let before = wait_for("2 running units on 3 alive nodes", Duration::from_secs(60), || {
        let nodes = up.nodes();
        let alive = nodes.len() == 3 && nodes.iter().all(|n| n["status"] == "alive");
        (alive && running(&up).len() == 2).then(|| members(&up))
    });
    assert!(procs.try_wait(standby).is_none(), "the standby waits");
    // Waiting, it refuses QUIC at once: an agent trying it moves on in a round trip, not
    // after its 5 s connect timeout.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    wait_for("the waiting standby to refuse connections at once", Duration::from_secs(20), || {
        rt.block_on(async {
            let ep =
                flotilla_agent::client::client_endpoint(&dir.join("tls.crt"), "127.0.0.1:0".parse().unwrap()).ok()?;
            let tried = flotilla_agent::ShardConnection::connect(&ep, b.parse().unwrap(), "127.0.0.1");
            matches!(tokio::time::timeout(Duration::from_millis(1500), tried).await, Ok(Err(_))).then_some(())
        })
    });

    let killed = Instant::now();
    signal(active as i32, libc::SIGKILL);
    // The standby prints its addresses once it holds the lease and serves.
    assert_eq!(procs.addrs(standby)["addr"], b.as_str());
    let serving = killed.elapsed();
    wait_for("the nodes Alive again, through the standby", Duration::from_secs(60), || {
        let nodes = up.nodes();
        (nodes.len() == 3 && nodes.iter().all(|n| n["status"] == "alive")).then_some(())
    });
    let alive = killed.elapsed();
    // Generous slack: lease TTL (2 s) + etcd's own timing + the recovery window (3 s).
    assert!(serving < Duration::from_secs(30), "the standby served after {serving:?}");
    eprintln!("shard takeover: standby serving {serving:?} after the kill, nodes Alive after {alive:?}");
    // Nothing was replaced: the same units, members, nodes and generations.
    std::thread::sleep(Duration::from_secs(3));
    let after = wait_for("2 running units", Duration::from_secs(30), || {
        let m = members(&up);
        (running(&up).len() == 2).then_some(m)
    });
    assert_eq!(before, after, "a unit or member was replaced");
    let text = std::fs::read_to_string(dir.join("standby.err")).unwrap_or_default();
    assert!(text.contains("holding the shard's lease"), "{text}");
    drop(up);
    drop(procs);
    drop(etcd);
}
