//! A shard's host isolated while its standby, on another host, is reachable.

use std::time::{Duration, Instant};

use flotilla_testkit::lab::{Fed, Options, Watch, placements, settled};

/// The active shard's host cut from every other host (agents, etcd, standby, control
/// plane, scheduler): its lease lapses and it stops; the standby takes the lease and
/// serves; the agents move to it and it rebuilds the ledger from what they run; nothing
/// is replaced meanwhile (the nodes are Unknown to the scheduler, within its grace), and
/// after the heal the same units run, once.
#[test]
fn an_isolated_shard_host_hands_over_to_its_standby_and_nothing_is_replaced() {
    let fed = Fed::start("shard-isolated", Options { etcd: true, standby: true, ..Options::default() });
    let before = placements(&fed.units());
    // The shard's epoch is its start time: the standby's is another.
    let epoch = |f: &Fed| f.get(&f.control, "/v1/shards").1[0]["version"]["epoch"].as_u64();
    let first = epoch(&fed).unwrap();
    let watch = Watch::start(&fed);
    let others: Vec<String> =
        fed.lab.hosts().iter().map(|h| h.name.clone()).filter(|h| h != "shard" && h != "probe").collect();
    let others: Vec<&str> = others.iter().map(String::as_str).collect();
    let cut = Instant::now();
    fed.lab.partition(&["shard"], &others);
    fed.wait("the standby serving", Duration::from_secs(30), |f| {
        f.lab.log("shard2.err").contains("holding the shard's lease").then_some(())
    });
    eprintln!("standby serving {:?} after the cut", cut.elapsed());
    let nodes = fed.agents.len();
    fed.wait("every node Alive through the standby", Duration::from_secs(90), |f| {
        let ns = f.nodes();
        let standby = epoch(f).is_some_and(|e| e != first);
        (standby && ns.len() == nodes && ns.iter().all(|n| n["status"] == "alive")).then_some(())
    });
    eprintln!("every node Alive again {:?} after the cut", cut.elapsed());
    assert_eq!(placements(&fed.units()), before, "nothing was replaced");
    fed.lab.heal();
    settled(&fed, 2, Duration::from_secs(60));
    watch.finish("the active shard's host isolated");
    assert_eq!(placements(&fed.units()), before, "the same units and members, on the same nodes");
}
