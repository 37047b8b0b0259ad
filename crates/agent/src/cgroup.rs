//! One cgroup per workload, with CPU and memory limits from its resources: cgroup v2
//! (`cpu.max`, `memory.max`) or v1 (`cpu.cfs_quota_us`, `memory.limit_in_bytes`),
//! whichever the host mounts, under the agent's own cgroup. Without a writable
//! hierarchy (not root, or a read-only mount) limits are not enforced, and the agent
//! says so once.

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
    /// Finds a writable hierarchy for this agent under `root` (normally /sys/fs/cgroup).
    pub fn detect(root: &Path, agent: &str) -> Cgroups {
        let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        if root.join("cgroup.controllers").exists() {
            let base = root.join(own_path(&own, None).unwrap_or_default()).join(format!("flotilla-{agent}"));
            if writable_dir(&base) {
                // Let children use the cpu and memory controllers (best effort).
                let _ = std::fs::write(base.parent().unwrap_or(root).join("cgroup.subtree_control"), "+cpu +memory");
                let _ = std::fs::write(base.join("cgroup.subtree_control"), "+cpu +memory");
                return Cgroups::V2 { base };
            }
            return Cgroups::Unavailable(format!("{} is not writable", base.display()));
        }
        let (cpu_root, mem_root) = (root.join("cpu"), root.join("memory"));
        if cpu_root.join("cpu.cfs_quota_us").exists() && mem_root.join("memory.limit_in_bytes").exists() {
            let cpu = cpu_root.join(own_path(&own, Some("cpu")).unwrap_or_default()).join(format!("flotilla-{agent}"));
            let memory =
                mem_root.join(own_path(&own, Some("memory")).unwrap_or_default()).join(format!("flotilla-{agent}"));
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

impl Cgroup {
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
