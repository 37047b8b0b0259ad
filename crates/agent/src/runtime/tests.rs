use super::*;
use tokio::io::AsyncWriteExt;

/// As root on a host with cgroups (v1 here, v2 where mounted), a workload runs in
/// its own cgroup with its CPU quota and memory limit.
#[tokio::test]
async fn limits_are_applied_in_a_real_cgroup_as_root() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root, so the agent cannot create cgroups");
        return;
    }
    let mut cfg = config("cgroup");
    cfg.ports = (21301, 21400);
    cfg.cgroup_root = PathBuf::from("/sys/fs/cgroup");
    cfg.node_id = format!("cgtest-{}", std::process::id());
    let mut rt = Runtime::new(cfg.clone());
    if !rt.limits_enforced() {
        eprintln!("skipped: no writable cgroup hierarchy on this host");
        return;
    }
    let mut a = assignment("u1", "sleep", &["30"]);
    a.resources = Some(v1::Resources { cpu_millis: 300, memory_bytes: 64 << 20, ..Default::default() });
    rt.assign(vec![a]);
    rt.tick().await;
    let pid = rt.pids()[0];
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let member = cg.lines().find(|l| l.contains("u1-head-1")).unwrap_or_else(|| panic!("not in its cgroup: {cg}"));
    match &rt.cgroups {
        Cgroups::V1 { cpu, memory } => {
            let quota = std::fs::read_to_string(cpu.join("u1-head-1/cpu.cfs_quota_us")).unwrap();
            assert_eq!(quota.trim(), "30000");
            let mem = std::fs::read_to_string(memory.join("u1-head-1/memory.limit_in_bytes")).unwrap();
            assert_eq!(mem.trim(), (64u64 << 20).to_string());
        }
        Cgroups::V2 { base } => {
            let max = std::fs::read_to_string(base.join("u1-head-1/cpu.max")).unwrap();
            assert_eq!(max.trim(), "30000 100000");
        }
        Cgroups::Unavailable(_) => unreachable!(),
    }
    assert!(!member.is_empty());
    rt.stop_all().await;
    let base_gone = match &rt.cgroups {
        Cgroups::V1 { cpu, .. } => !cpu.exists(),
        Cgroups::V2 { base } => !base.exists(),
        Cgroups::Unavailable(_) => true,
    };
    assert!(base_gone, "the agent's cgroups are removed when it stops");
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
}

/// With a cgroup parent (`--cgroup-parent`, as the DaemonSet gives), a workload's
/// cgroup is under that parent of the hierarchy, not under the agent's own cgroup
/// (whose limits, in a pod, are the agent's).
#[tokio::test]
async fn workloads_go_under_the_cgroup_parent_as_root() {
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root, so the agent cannot create cgroups");
        return;
    }
    let parent = format!("flotilla-parent-{}", std::process::id());
    let mut cfg = config("cgparent");
    cfg.ports = (21701, 21800);
    cfg.cgroup_root = PathBuf::from("/sys/fs/cgroup");
    cfg.cgroup_parent = Some(format!("/{parent}/"));
    cfg.node_id = format!("cgparent-{}", std::process::id());
    let mut rt = Runtime::new(cfg.clone());
    if !rt.limits_enforced() {
        eprintln!("skipped: no writable cgroup hierarchy on this host");
        return;
    }
    let mut a = assignment("u1", "sleep", &["30"]);
    a.resources = Some(v1::Resources { cpu_millis: 200, memory_bytes: 32 << 20, ..Default::default() });
    rt.assign(vec![a]);
    rt.tick().await;
    let pid = rt.pids()[0];
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let want = format!(":/{parent}/flotilla-cgparent-{}/u1-head-1", std::process::id());
    let placed: Vec<&str> = cg.lines().filter(|l| l.ends_with(&want)).collect();
    rt.stop_all().await;
    for dir in [
        cfg.cgroup_root.join(&parent),
        cfg.cgroup_root.join("cpu").join(&parent),
        cfg.cgroup_root.join("memory").join(&parent),
    ] {
        let _ = std::fs::remove_dir(dir);
    }
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
    assert!(!placed.is_empty(), "not under {want}: {cg}\n(the agent's own: {own})");
}

#[test]
fn back_off_doubles_and_caps() {
    let mut b = restart_backoff();
    let waits: Vec<Duration> = (0..8).map(|_| b.next_wait()).collect();
    assert_eq!(waits[0], Duration::from_millis(500));
    assert_eq!(waits[1], Duration::from_secs(1));
    assert_eq!(waits[3], Duration::from_secs(4));
    assert_eq!(waits[7], Duration::from_secs(30));
    b.reset();
    assert_eq!(b.next_wait(), Duration::from_millis(500), "a healthy run starts the back-off over");
}

fn config(name: &str) -> RuntimeConfig {
    let dir = std::env::temp_dir().join(format!("flotilla-rt-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    RuntimeConfig {
        data_dir: dir,
        node_id: "n1".into(),
        advertise_host: "127.0.0.1".into(),
        ports: (0, 0),
        stop_grace: Duration::from_millis(300),
        log_cap_bytes: 64,
        cgroup_root: PathBuf::from("/nonexistent"),
        cgroup_parent: None,
        usage_interval: Duration::from_millis(100),
    }
}

fn assignment(unit: &str, cmd: &str, args: &[&str]) -> v1::Assignment {
    v1::Assignment {
        app: "a".into(),
        unit: unit.into(),
        member: "head".into(),
        generation: 1,
        resources: None,
        workload: Some(v1::Workload {
            role: "head".into(),
            command: cmd.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
            env: Default::default(),
            readiness_path: String::new(),
            restart: String::new(),
            ..Default::default()
        }),
    }
}

/// Each member's use is measured and reported: from its cgroup as root, else /proc.
#[tokio::test]
async fn members_report_what_they_use() {
    let mut cfg = config("usage");
    cfg.ports = (21501, 21600);
    cfg.cgroup_root = PathBuf::from("/sys/fs/cgroup");
    cfg.node_id = format!("usage-{}", std::process::id());
    let mut rt = Runtime::new(cfg.clone());
    let mut hog = assignment("mem", "sh", &["-c", "x=$(head -c 60000000 /dev/zero | tr '\\0' a); sleep 30"]);
    hog.resources = Some(v1::Resources { cpu_millis: 1000, memory_bytes: 512 << 20, ..Default::default() });
    let mut spin = assignment("cpu", "sh", &["-c", "while :; do :; done"]);
    spin.resources = Some(v1::Resources { cpu_millis: 1000, memory_bytes: 64 << 20, ..Default::default() });
    rt.assign(vec![hog, spin]);
    let usage = |rt: &Runtime, unit: &str| rt.statuses().into_iter().find(|s| s.unit == unit).and_then(|s| s.usage);
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end
        && !(usage(&rt, "mem").is_some_and(|u| u.memory_bytes >= 50 << 20)
            && usage(&rt, "cpu").is_some_and(|u| u.cpu_millis >= 50))
    {
        rt.tick().await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (mem, cpu) = (usage(&rt, "mem"), usage(&rt, "cpu"));
    rt.stop_all().await;
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
    assert!(mem.is_some_and(|u| u.memory_bytes >= 50 << 20), "the memory hog's use: {mem:?}");
    assert!(cpu.is_some_and(|u| u.cpu_millis >= 50), "the spinner's use: {cpu:?}");
}

#[test]
fn only_a_real_change_in_use_is_reported() {
    let u = |cpu_millis, mib: u64| v1::WorkloadUsage { cpu_millis, memory_bytes: mib << 20 };
    assert!(!moved(&u(100, 100), &u(104, 103)), "jitter");
    assert!(moved(&u(100, 100), &u(100, 110)), "10 % more memory");
    assert!(moved(&u(100, 100), &u(200, 100)), "twice the CPU");
    assert!(!moved(&u(0, 0), &u(5, 0)), "5 millicores of nothing");
}

#[tokio::test]
async fn restart_policies() {
    let mut cfg = config("policy");
    cfg.ports = (21401, 21500);
    let mut rt = Runtime::new(cfg.clone());
    let with = |unit: &str, code: i32, policy: &str| {
        let mut a = assignment(unit, "sh", &["-c", &format!("exit {code}")]);
        a.workload.as_mut().unwrap().restart = policy.into();
        a
    };
    rt.assign(vec![with("never", 1, "never"), with("okdone", 0, "on-failure"), with("retry", 2, "on-failure")]);
    settle(&mut rt, 1500).await;
    let by_unit: BTreeMap<String, v1::WorkloadStatus> =
        rt.statuses().into_iter().map(|s| (s.unit.clone(), s)).collect();
    assert_eq!(by_unit["never"].restarts, 0);
    assert_eq!(by_unit["never"].state, WorkloadState::Exited as i32);
    assert_eq!(by_unit["okdone"].restarts, 0, "a clean exit is not restarted on-failure");
    assert!(by_unit["retry"].restarts >= 1, "a failure is");
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
}

async fn settle(rt: &mut Runtime, ms: u64) {
    let end = Instant::now() + Duration::from_millis(ms);
    while Instant::now() < end {
        rt.tick().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_missing_command_fails_with_a_reason_and_backs_off() {
    let mut cfg = config("missing");
    cfg.ports = (21000, 21100);
    let mut rt = Runtime::new(cfg);
    rt.assign(vec![assignment("u1", "/no/such/binary", &[])]);
    settle(&mut rt, 1200).await;
    let s = &rt.statuses()[0];
    assert_eq!(s.state, WorkloadState::Failed as i32);
    assert!(s.message.contains("/no/such/binary"), "{}", s.message);
    assert!(rt.members.values().next().unwrap().restart.failures() <= 3, "no busy loop");
}

#[tokio::test]
async fn a_crash_loop_is_reported_with_its_exit_code_and_backs_off() {
    let mut cfg = config("crash");
    cfg.ports = (21101, 21200);
    let mut rt = Runtime::new(cfg.clone());
    rt.assign(vec![assignment("u1", "sh", &["-c", "echo boom-$FLOTILLA_UNIT >&2; exit 3"])]);
    settle(&mut rt, 2500).await;
    let s = rt.statuses()[0].clone();
    assert_eq!(s.exit_code, 3);
    assert!(s.message.contains("boom-u1"), "the tail of stderr: {:?}", s.message);
    // Restarted, and backed off (0.5 s doubling: 2 in 2.5 s, fewer on a loaded machine;
    // without back-off it would be dozens).
    assert!(s.restarts >= 1 && s.restarts <= 4, "backed off: {} restarts in 2.5 s", s.restarts);
    let logs = rt.logs().get("a", "u1", "head").expect("the member's logs");
    let mut lines = Vec::new();
    logs.stderr.snapshot(false).history(Default::default(), |c| {
        lines.extend(c.into_iter().map(|l| l.text));
        true
    });
    assert!(
        lines.len() >= 2 && lines.iter().all(|l| l == "boom-u1"),
        "every run's lines, kept across restarts: {lines:?}"
    );
    let dir = rt.logs().member_dir("a", "u1", "head", 1);
    assert!(std::fs::metadata(dir.join("stderr.log")).unwrap().len() <= 64, "logs are capped");
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
}

/// Named ports reach the process as `FLOTILLA_PORT_<NAME>` and are reported; a
/// worker that starts `after` the head waits (not started, `waiting` with a reason)
/// until its workload comes again without `after`; a worker that does not wait gets
/// its head's address and ports from the head on the same node.
#[tokio::test]
async fn named_ports_start_order_and_the_head_s_env() {
    let mut cfg = config("named");
    cfg.ports = (21801, 21900);
    let mut rt = Runtime::new(cfg.clone());
    let dump = |name: &str| format!("env > {}/{name}.env; sleep 30", cfg.data_dir.display());
    std::fs::create_dir_all(&cfg.data_dir).unwrap();
    let mut head = assignment("u1", "sh", &["-c", &dump("head")]);
    let w = head.workload.as_mut().unwrap();
    w.ports = vec!["gcs".into(), "serve".into()];
    w.port_ranges = [("worker_ports".to_string(), 5)].into();
    w.main_port = "serve".into();
    let worker = |name: &str, after: &str| {
        let mut a = assignment("u1", "sh", &["-c", &dump(name)]);
        a.member = name.into();
        let w = a.workload.as_mut().unwrap();
        w.role = "worker".into();
        w.after = after.into();
        a
    };
    rt.assign(vec![head.clone(), worker("worker-0", "head"), worker("worker-1", "")]);
    settle(&mut rt, 400).await;
    let by: BTreeMap<String, v1::WorkloadStatus> = rt.statuses().into_iter().map(|s| (s.member.clone(), s)).collect();
    assert_eq!(by["worker-0"].state, WorkloadState::Waiting as i32);
    assert!(by["worker-0"].message.contains("waits for head"), "{:?}", by["worker-0"]);
    assert!(by["worker-0"].address.is_empty(), "no ports while it waits");
    assert_eq!(rt.pids().len(), 2, "the waiting worker is not started");
    let h = &by["head"];
    let (gcs, serve) = (h.ports["gcs"], h.ports["serve"]);
    assert_eq!(h.address, format!("127.0.0.1:{serve}"), "the named serving port is its address");
    let block = &h.port_ranges["worker_ports"];
    assert_eq!(block.last - block.first, 4);
    let read = |name: &str| {
        let text = std::fs::read_to_string(cfg.data_dir.join(format!("{name}.env"))).unwrap_or_default();
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>()
    };
    let env = read("head");
    assert_eq!(env["FLOTILLA_PORT"], serve.to_string());
    assert_eq!(env["FLOTILLA_PORT_GCS"], gcs.to_string());
    assert_eq!(env["FLOTILLA_PORT_WORKER_PORTS_MIN"], block.first.to_string());
    assert_eq!(env["FLOTILLA_PORT_WORKER_PORTS_MAX"], block.last.to_string());
    let env = read("worker-1");
    assert_eq!(env["FLOTILLA_HEAD_ADDR"], "127.0.0.1");
    assert_eq!(env["FLOTILLA_HEAD_PORT_GCS"], gcs.to_string());
    assert_eq!(env["FLOTILLA_HEAD_PORT"], serve.to_string());
    // Released as the scheduler does: without `after`, the head's address in env.
    let mut released = worker("worker-0", "");
    released.workload.as_mut().unwrap().env =
        [("FLOTILLA_HEAD_ADDR".to_string(), "10.1.2.3".to_string()), ("FLOTILLA_HEAD_PORT_GCS".into(), "7".into())]
            .into();
    rt.assign(vec![head, released, worker("worker-1", "")]);
    settle(&mut rt, 400).await;
    assert_eq!(rt.pids().len(), 3, "released, it starts");
    let env = read("worker-0");
    assert_eq!((env["FLOTILLA_HEAD_ADDR"].as_str(), env["FLOTILLA_HEAD_PORT_GCS"].as_str()), ("10.1.2.3", "7"));
    rt.stop_all().await;
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
}

#[tokio::test]
async fn an_exhausted_port_range_is_a_clear_failure() {
    let hold = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let port = hold.local_addr().unwrap().port();
    let mut cfg = config("ports");
    cfg.ports = (port, port);
    let mut rt = Runtime::new(cfg);
    rt.assign(vec![assignment("u1", "sleep", &["5"])]);
    rt.tick().await;
    assert!(rt.statuses()[0].message.contains("no free port"), "{:?}", rt.statuses()[0]);
}

#[tokio::test]
async fn unassigned_members_get_sigterm_then_sigkill() {
    let mut cfg = config("stop");
    cfg.ports = (21201, 21300);
    let mut rt = Runtime::new(cfg);
    // Ignores SIGTERM: only the SIGKILL after the grace period ends it.
    rt.assign(vec![assignment("u1", "sh", &["-c", "trap '' TERM; while true; do sleep 0.05; done"])]);
    settle(&mut rt, 300).await;
    let pid = rt.pids()[0];
    assert_eq!(rt.statuses()[0].state, WorkloadState::Running as i32);
    rt.assign(vec![]);
    let t = Instant::now();
    while std::path::Path::new(&format!("/proc/{pid}")).exists() && t.elapsed() < Duration::from_secs(5) {
        rt.tick().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(t.elapsed() >= Duration::from_millis(250), "the grace period was honoured");
    assert!(rt.stopping.is_empty() || !std::path::Path::new(&format!("/proc/{pid}/status")).exists());
}

/// A log file every write to which fails (/dev/full: ENOSPC, as a full disk) still
/// has its pipe drained to the end, so the workload never blocks or gets EPIPE; the
/// tail for `units` is kept.
#[tokio::test]
async fn output_that_cannot_be_written_is_drained_and_dropped() {
    let (mut child_side, agent_side) = tokio::io::duplex(4096);
    let tail = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::new(LogFile::new(PathBuf::from("/dev/full"), 1 << 20));
    let pumping = tokio::spawn(pump(agent_side, log, Some(tail.clone())));
    let writer = async move {
        for i in 0..256 {
            child_side.write_all(format!("line {i:04} {}\n", "x".repeat(1000)).as_bytes()).await.unwrap();
        }
    };
    tokio::time::timeout(Duration::from_secs(10), writer).await.expect("the workload's writes never block");
    tokio::time::timeout(Duration::from_secs(10), pumping).await.unwrap().unwrap();
    let tail = String::from_utf8_lossy(&tail.lock_or_recover()).to_string();
    assert!(tail.contains("line 0255"), "{tail}");
}

/// A member told to stop still writes as it shuts down: its followers get those lines
/// and end once it is gone, and its unit's logs stay until then (never made again by a
/// late line).
#[tokio::test]
async fn a_stopping_members_last_lines_reach_its_followers_and_its_logs_go_after_it() {
    let mut cfg = config("stoplogs");
    cfg.ports = (21301, 21400);
    let mut rt = Runtime::new(cfg.clone());
    let script = "trap 'echo bye; exit 0' TERM; echo hi; while true; do sleep 0.05; done";
    rt.assign(vec![assignment("u1", "sh", &["-c", script])]);
    let t = Instant::now();
    let logs = loop {
        rt.tick().await;
        if let Some(l) = rt.logs().get("a", "u1", "head")
            && std::fs::read_to_string(rt.logs().member_dir("a", "u1", "head", 1).join("stdout.log"))
                .is_ok_and(|s| s.contains(" hi"))
        {
            break l;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "the member never wrote");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let mut live = logs.stdout.snapshot(true).live.unwrap();
    let dir = rt.logs().member_dir("a", "u1", "head", 1);
    rt.assign(vec![]);
    assert!(dir.exists(), "a stopping member's logs stay");
    let t = Instant::now();
    while !rt.stopping.is_empty() && t.elapsed() < Duration::from_secs(5) {
        rt.tick().await;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(rt.stopping.is_empty());
    let mut seen = Vec::new();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), live.recv()).await.expect("followers end") {
            Ok(l) => seen.push(l.text.clone()),
            Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(seen, vec!["bye".to_string()], "its shutdown line, then the end");
    assert!(!dir.exists() && rt.logs().get("a", "u1", "head").is_none(), "its unit's logs went with it");
    let _ = std::fs::remove_dir_all(&cfg.data_dir);
}
