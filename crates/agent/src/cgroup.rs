//! One cgroup per workload, with CPU and memory limits from its resources: cgroup v2
//! (`cpu.max`, `memory.max`) or v1 (`cpu.cfs_quota_us`, `memory.limit_in_bytes`),
//! whichever the host mounts, under the agent's own cgroup, or under a parent given with
//! `--cgroup-parent` (so that, in a Kubernetes pod, workloads do not count against the
//! agent pod's own limits: the host's hierarchy is mounted and a parent outside the pod's
//! cgroup named). Without a writable
//! hierarchy (not root, or a read-only mount) limits are not enforced, and the agent
//! says so once.
//!
//! The same directories tell what a workload uses: CPU time (v2 `cpu.stat` `usage_usec`,
//! v1 `cpuacct.usage` where cpuacct shares the cpu hierarchy) and its working set (memory
//! in use less inactive file cache, as the kubelet counts it). Without them, `/proc`.

use std::path::{Path, PathBuf};

const PERIOD_US: u64 = 100_000;

#[derive(Debug, Clone)]
pub enum Cgroups {
    V2 { base: PathBuf },
    V1 { cpu: PathBuf, memory: PathBuf },
    Unavailable(String),
}

/// A workload's cgroup directories (one per v1 controller, one in v2).
#[derive(Debug, Clone, Default)]
pub struct Cgroup {
    pub dirs: Vec<PathBuf>,
}

/// cpu.cfs_quota_us / the first field of cpu.max for `cpu_millis` (at least 1 ms per period).
pub fn quota_us(cpu_millis: u64) -> u64 {
    (cpu_millis * PERIOD_US / 1000).max(1000)
}

/// The agent's own path in a controller's hierarchy, from /proc/self/cgroup.
fn own_path(proc_self_cgroup: &str, controller: Option<&str>) -> Option<String> {
    proc_self_cgroup.lines().find_map(|l| {
        let mut p = l.splitn(3, ':');
        let (id, ctrls, path) = (p.next()?, p.next()?, p.next()?);
        let hit = match controller {
            None => id == "0" && ctrls.is_empty(),
            Some(c) => ctrls.split(',').any(|x| x == c),
        };
        hit.then(|| path.trim_start_matches('/').to_string())
    })
}

fn writable_dir(dir: &Path) -> bool {
    std::fs::create_dir_all(dir).is_ok()
}

impl Cgroups {
    /// Finds a writable hierarchy for this agent under `root` (normally /sys/fs/cgroup),
    /// nested in the agent's own cgroup.
    pub fn detect(root: &Path, agent: &str) -> Cgroups {
        Self::detect_under(root, None, agent)
    }

    /// As [`Cgroups::detect`], but with `parent` (a path relative to the root of each
    /// hierarchy, e.g. `flotilla`) in place of the agent's own cgroup when given.
    pub fn detect_under(root: &Path, parent: Option<&str>, agent: &str) -> Cgroups {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let parent = parent.map(|p| p.trim_matches('/').to_string());
        let under =
            |controller: Option<&str>| parent.clone().unwrap_or_else(|| own_path(&own, controller).unwrap_or_default());
        if root.join("cgroup.controllers").exists() {
            let base = root.join(under(None)).join(format!("flotilla-{agent}"));
            if writable_dir(&base) {
                // Let children use the cpu and memory controllers, from the root down
                // (best effort: the root and a systemd slice usually have them already).
                let mut dir = root.to_path_buf();
                for part in base.strip_prefix(root).map(|p| p.components().collect::<Vec<_>>()).unwrap_or_default() {
                    let _ = std::fs::write(dir.join("cgroup.subtree_control"), "+cpu +memory");
                    dir.push(part);
                }
                let _ = std::fs::write(base.join("cgroup.subtree_control"), "+cpu +memory");
                return Cgroups::V2 { base };
            }
            return Cgroups::Unavailable(format!("{} is not writable", base.display()));
        }
        let (cpu_root, mem_root) = (root.join("cpu"), root.join("memory"));
        if cpu_root.join("cpu.cfs_quota_us").exists() && mem_root.join("memory.limit_in_bytes").exists() {
            let cpu = cpu_root.join(under(Some("cpu"))).join(format!("flotilla-{agent}"));
            let memory = mem_root.join(under(Some("memory"))).join(format!("flotilla-{agent}"));
            if writable_dir(&cpu) && writable_dir(&memory) {
                return Cgroups::V1 { cpu, memory };
            }
            return Cgroups::Unavailable(format!("{} is not writable (run the agent as root)", cpu.display()));
        }
        Cgroups::Unavailable(format!("no cgroup v2 or v1 cpu+memory hierarchy under {}", root.display()))
    }

    /// Removes the agent's own directories (once every workload's is gone).
    pub fn remove_base(&self) {
        match self {
            Cgroups::V2 { base } => {
                let _ = std::fs::remove_dir(base);
            }
            Cgroups::V1 { cpu, memory } => {
                let _ = std::fs::remove_dir(cpu);
                let _ = std::fs::remove_dir(memory);
            }
            Cgroups::Unavailable(_) => {}
        }
    }

    pub fn enforced(&self) -> bool {
        !matches!(self, Cgroups::Unavailable(_))
    }

    /// Creates a workload's cgroup with its limits.
    pub fn create(&self, name: &str, cpu_millis: u64, memory_bytes: u64) -> std::io::Result<Cgroup> {
        let w = |dir: &Path, file: &str, value: String| std::fs::write(dir.join(file), value);
        match self {
            Cgroups::V2 { base } => {
                let dir = base.join(name);
                std::fs::create_dir_all(&dir)?;
                if cpu_millis > 0 {
                    w(&dir, "cpu.max", format!("{} {PERIOD_US}", quota_us(cpu_millis)))?;
                }
                if memory_bytes > 0 {
                    w(&dir, "memory.max", memory_bytes.to_string())?;
                }
                Ok(Cgroup { dirs: vec![dir] })
            }
            Cgroups::V1 { cpu, memory } => {
                let (c, m) = (cpu.join(name), memory.join(name));
                std::fs::create_dir_all(&c)?;
                std::fs::create_dir_all(&m)?;
                if cpu_millis > 0 {
                    w(&c, "cpu.cfs_period_us", PERIOD_US.to_string())?;
                    w(&c, "cpu.cfs_quota_us", quota_us(cpu_millis).to_string())?;
                }
                if memory_bytes > 0 {
                    w(&m, "memory.limit_in_bytes", memory_bytes.to_string())?;
                }
                Ok(Cgroup { dirs: vec![c, m] })
            }
            Cgroups::Unavailable(_) => Ok(Cgroup::default()),
        }
    }
}

/// What a workload has used: CPU time so far (cumulative) and memory in use now. Either
/// may be unknown.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    pub cpu_ns: Option<u64>,
    pub memory_bytes: Option<u64>,
}

impl Counters {
    fn or(self, other: impl FnOnce() -> Counters) -> Counters {
        if self.cpu_ns.is_some() && self.memory_bytes.is_some() {
            return self;
        }
        let o = other();
        Counters { cpu_ns: self.cpu_ns.or(o.cpu_ns), memory_bytes: self.memory_bytes.or(o.memory_bytes) }
    }
}

/// `key value` lines (cpu.stat, memory.stat): the value of `key`.
fn stat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// Memory in use less inactive file cache (the kubelet's working set).
fn working_set(usage: u64, memory_stat: &str, inactive_key: &str) -> u64 {
    usage.saturating_sub(stat_value(memory_stat, inactive_key).unwrap_or(0))
}

/// CPU time (user + system, children included) and resident memory of one process, from
/// `/proc/PID/stat` and `/proc/PID/status`.
fn proc_counters(stat: &str, status: &str, ticks_per_second: u64) -> Counters {
    // Fields after the command name (which may hold spaces and parentheses).
    let fields: Vec<&str> =
        stat.rsplit_once(')').map(|(_, rest)| rest.split_whitespace().collect()).unwrap_or_default();
    // utime, stime, cutime, cstime are fields 14..=17 of the line, 12..=15 after the name.
    let ticks: Option<u64> = fields.get(11..15).map(|f| f.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
    let rss_kib =
        status.lines().find_map(|l| l.strip_prefix("VmRSS:")?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok());
    Counters {
        cpu_ns: ticks.map(|t| t.saturating_mul(1_000_000_000) / ticks_per_second.max(1)),
        memory_bytes: rss_kib.map(|k| k << 10),
    }
}

/// What process `pid` has used, from `/proc` (no cgroup to ask).
pub fn process_counters(pid: u32) -> Counters {
    let read = |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    proc_counters(&read("stat"), &read("status"), u64::try_from(hz).unwrap_or(100))
}

impl Cgroup {
    /// What the workload's cgroup says it used, falling back to `/proc` for `pid`.
    pub fn counters(&self, pid: Option<u32>) -> Counters {
        let read = |d: &Path, f: &str| std::fs::read_to_string(d.join(f)).ok();
        let mut c = Counters::default();
        for d in &self.dirs {
            if let Some(usec) = read(d, "cpu.stat").and_then(|t| stat_value(&t, "usage_usec")) {
                c.cpu_ns = Some(usec.saturating_mul(1000));
            } else if let Some(ns) = read(d, "cpuacct.usage").and_then(|t| t.trim().parse().ok()) {
                c.cpu_ns = Some(ns);
            }
            if let Some(current) = read(d, "memory.current").and_then(|t| t.trim().parse().ok()) {
                c.memory_bytes =
                    Some(working_set(current, &read(d, "memory.stat").unwrap_or_default(), "inactive_file"));
            } else if let Some(usage) = read(d, "memory.usage_in_bytes").and_then(|t| t.trim().parse().ok()) {
                let stat = read(d, "memory.stat").unwrap_or_default();
                c.memory_bytes = Some(working_set(usage, &stat, "total_inactive_file"));
            }
        }
        match pid {
            Some(pid) => c.or(|| process_counters(pid)),
            None => c,
        }
    }

    pub fn attach(&self, pid: u32) -> std::io::Result<()> {
        for d in &self.dirs {
            std::fs::write(d.join("cgroup.procs"), pid.to_string())?;
        }
        Ok(())
    }

    /// Removes the directories once their processes are gone (best effort).
    pub fn remove(&self) {
        for d in &self.dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotas() {
        assert_eq!(quota_us(250), 25_000);
        assert_eq!(quota_us(2000), 200_000);
        assert_eq!(quota_us(1), 1000, "the kernel's minimum");
    }

    #[test]
    fn own_paths_for_v1_and_v2() {
        let t = "4:memory:/a/b\n1:cpu:/\n0::/system.slice/x\n";
        assert_eq!(own_path(t, Some("memory")).as_deref(), Some("a/b"));
        assert_eq!(own_path(t, Some("cpu")).as_deref(), Some(""));
        assert_eq!(own_path(t, None).as_deref(), Some("system.slice/x"));
        assert_eq!(own_path(t, Some("pids")), None);
    }

    #[test]
    fn a_fake_v1_hierarchy_gets_limits() {
        let root = std::env::temp_dir().join(format!("flotilla-cgv1-{}", std::process::id()));
        for (c, f) in [("cpu", "cpu.cfs_quota_us"), ("memory", "memory.limit_in_bytes")] {
            std::fs::create_dir_all(root.join(c)).unwrap();
            std::fs::write(root.join(c).join(f), "-1").unwrap();
        }
        let cg = Cgroups::detect(&root, "n1");
        assert!(matches!(cg, Cgroups::V1 { .. }), "{cg:?}");
        let w = cg.create("u1-head", 500, 64 << 20).unwrap();
        let read = |p: &Path| std::fs::read_to_string(p).unwrap();
        assert_eq!(read(&w.dirs[0].join("cpu.cfs_quota_us")), "50000");
        assert_eq!(read(&w.dirs[1].join("memory.limit_in_bytes")), (64u64 << 20).to_string());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_cgroup_parent_replaces_the_agents_own_cgroup() {
        let root = std::env::temp_dir().join(format!("flotilla-cgparent-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("cgroup.controllers"), "cpu memory").unwrap();
        let cg = Cgroups::detect_under(&root, Some("/flotilla.slice/"), "n1");
        let Cgroups::V2 { base } = &cg else { panic!("{cg:?}") };
        assert_eq!(base, &root.join("flotilla.slice").join("flotilla-n1"));
        // The controllers are delegated from the root down to the workloads' parent.
        assert_eq!(std::fs::read_to_string(root.join("cgroup.subtree_control")).unwrap(), "+cpu +memory");
        assert_eq!(
            std::fs::read_to_string(root.join("flotilla.slice").join("cgroup.subtree_control")).unwrap(),
            "+cpu +memory"
        );
        let w = cg.create("u1-head", 500, 64 << 20).unwrap();
        assert!(w.dirs[0].starts_with(root.join("flotilla.slice")), "{:?}", w.dirs);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn usage_from_v1_and_v2_files() {
        let root = std::env::temp_dir().join(format!("flotilla-cgusage-{}", std::process::id()));
        let (v1c, v1m, v2) = (root.join("v1cpu"), root.join("v1mem"), root.join("v2"));
        for d in [&v1c, &v1m, &v2] {
            std::fs::create_dir_all(d).unwrap();
        }
        std::fs::write(v1c.join("cpuacct.usage"), "2500000000\n").unwrap();
        std::fs::write(v1m.join("memory.usage_in_bytes"), "104857600\n").unwrap();
        std::fs::write(v1m.join("memory.stat"), "cache 1\ntotal_inactive_file 4194304\n").unwrap();
        let v1 = Cgroup { dirs: vec![v1c, v1m] }.counters(None);
        assert_eq!(v1, Counters { cpu_ns: Some(2_500_000_000), memory_bytes: Some(96 << 20) });
        std::fs::write(v2.join("cpu.stat"), "usage_usec 1500\nuser_usec 1000\n").unwrap();
        std::fs::write(v2.join("memory.current"), "8388608").unwrap();
        std::fs::write(v2.join("memory.stat"), "anon 1\ninactive_file 1048576\n").unwrap();
        let v2 = Cgroup { dirs: vec![v2] }.counters(None);
        assert_eq!(v2, Counters { cpu_ns: Some(1_500_000), memory_bytes: Some(7 << 20) });
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn usage_from_proc_without_cgroups() {
        let stat = "42 (my (odd) cmd) S 1 42 42 0 -1 4194560 10 0 0 0 150 50 20 30 20 0 1 0 5 1000 200";
        let status = "Name:\tx\nVmRSS:\t   2048 kB\nThreads:\t1\n";
        assert_eq!(
            proc_counters(stat, status, 100),
            Counters { cpu_ns: Some(2_500_000_000), memory_bytes: Some(2 << 20) }
        );
        assert_eq!(proc_counters("garbage", "", 100), Counters::default());
        let me = process_counters(std::process::id());
        assert!(me.cpu_ns.is_some() && me.memory_bytes.is_some_and(|m| m > 0), "{me:?}");
        // A workload without a cgroup is measured through its process.
        assert!(Cgroup::default().counters(Some(std::process::id())).memory_bytes.is_some());
    }

    #[test]
    fn a_fake_v2_hierarchy_gets_limits() {
        let root = std::env::temp_dir().join(format!("flotilla-cgv2-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        std::fs::write(root.join("cgroup.controllers"), "cpu memory").unwrap();
        let cg = Cgroups::detect(&root, "n1");
        let w = cg.create("u1-head", 1500, 1 << 30).unwrap();
        assert_eq!(std::fs::read_to_string(w.dirs[0].join("cpu.max")).unwrap(), "150000 100000");
        assert_eq!(std::fs::read_to_string(w.dirs[0].join("memory.max")).unwrap(), (1u64 << 30).to_string());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
