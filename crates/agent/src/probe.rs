//! What the agent reads from the machine: capacity (cores, memory, GPUs) and a health
//! sample every second (CPU utilisation and steal from /proc/stat, load per core,
//! memory pressure, cgroup CPU throttling on v1 or v2). Parsers are pure functions.

use std::path::{Path, PathBuf};

use flotilla_core::HealthSample;

/// Cumulative CPU jiffies from the first line of /proc/stat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CpuTimes {
    pub total: u64,
    pub idle: u64,
    pub steal: u64,
}

pub fn parse_proc_stat(text: &str) -> Option<CpuTimes> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    if v.len() < 4 {
        return None;
    }
    // user nice system idle iowait irq softirq steal (guest time is already in user).
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some(CpuTimes { total, idle, steal: v.get(7).copied().unwrap_or(0) })
}

/// The 1-minute load average.
pub fn parse_loadavg(text: &str) -> Option<f32> {
    text.split_whitespace().next()?.parse().ok()
}

/// `MemTotal` and `MemAvailable`, in bytes.
pub fn parse_meminfo(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        let l = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = l.split_whitespace().nth(1)?.parse().ok()?;
        Some(kib * 1024)
    };
    Some((field("MemTotal:")?, field("MemAvailable:")?))
}

/// `some avg10` from /proc/pressure/memory, as a fraction.
pub fn parse_psi_some_avg10(text: &str) -> Option<f32> {
    let line = text.lines().find(|l| l.starts_with("some"))?;
    let v = line.split_whitespace().find_map(|w| w.strip_prefix("avg10="))?;
    v.parse::<f32>().ok().map(|p| (p / 100.0).clamp(0.0, 1.0))
}

/// `(nr_periods, nr_throttled)` from a cgroup `cpu.stat` (the same keys in v1 and v2).
pub fn parse_cpu_stat(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| -> Option<u64> {
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.trim().parse().ok()))
    };
    Some((field("nr_periods ")?, field("nr_throttled ")?))
}

/// The `cpu.stat` of the cgroup this process is in, for v2 or for v1's cpu controller.
pub fn own_cgroup_cpu_stat(proc_self_cgroup: &str, root: &Path) -> Option<PathBuf> {
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let rel = path.trim_start_matches('/');
        if id == "0" && controllers.is_empty() {
            let p = root.join(rel).join("cpu.stat");
            if p.exists() {
                return Some(p);
            }
        } else if controllers.split(',').any(|c| c == "cpu") {
            for dir in [controllers, "cpu", "cpu,cpuacct"] {
                let p = root.join(dir).join(rel).join("cpu.stat");
                if p.exists() {
                    return Some(p);
                }
            }
        }
    }
    None
}

/// Memory pressure in [0, 1]: PSI where the kernel has it, else how far used memory
/// is past 80% of the total.
pub fn memory_pressure(psi: Option<f32>, meminfo: Option<(u64, u64)>) -> f32 {
    if let Some(p) = psi {
        return p;
    }
    match meminfo {
        Some((total, avail)) if total > 0 => {
            let used = 1.0 - avail as f32 / total as f32;
            ((used - 0.8) / 0.2).clamp(0.0, 1.0)
        }
        _ => 0.0,
    }
}

/// Applies `key=value,...` overrides (the test health file) to a sample.
pub fn apply_overrides(s: &mut HealthSample, text: &str) -> Result<(), String> {
    for pair in text.split([',', '\n']).map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').ok_or_else(|| format!("{pair:?} is not key=value"))?;
        let v: f32 = v.trim().parse().map_err(|_| format!("{pair:?}: not a number"))?;
        let (field, max) = match k.trim() {
            "cpu_steal" => (&mut s.cpu_steal, 1.0),
            "cpu_utilisation" => (&mut s.cpu_utilisation, 1.0),
            "memory_pressure" => (&mut s.memory_pressure, 1.0),
            "load_per_core" => (&mut s.load_per_core, 10_000.0),
            other => {
                return Err(format!("{other:?} is not cpu_steal, cpu_utilisation, memory_pressure or load_per_core"));
            }
        };
        if !(v.is_finite() && (0.0..=max).contains(&v)) {
            return Err(format!("{pair:?}: must be within 0..={max}"));
        }
        *field = v;
    }
    Ok(())
}

/// Takes a health sample per call, from deltas since the previous call.
pub struct HealthProbe {
    cores: f32,
    prev_cpu: Option<CpuTimes>,
    cgroup_stat: Option<PathBuf>,
    prev_throttle: Option<(u64, u64)>,
    preemption_notice_file: Option<PathBuf>,
    test_health_file: Option<PathBuf>,
}

impl HealthProbe {
    /// `preemption_notice_file`: the sample carries a preemption notice while it exists.
    /// `test_health_file`: while it exists, its values replace the measured ones.
    pub fn new(preemption_notice_file: Option<PathBuf>, test_health_file: Option<PathBuf>) -> Self {
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1) as f32;
        let cgroup_stat = std::fs::read_to_string("/proc/self/cgroup")
            .ok()
            .and_then(|t| own_cgroup_cpu_stat(&t, Path::new("/sys/fs/cgroup")));
        HealthProbe {
            cores,
            prev_cpu: None,
            cgroup_stat,
            prev_throttle: None,
            preemption_notice_file,
            test_health_file,
        }
    }

    pub fn sample(&mut self) -> HealthSample {
        let read = |p: &str| std::fs::read_to_string(p).ok();
        let mut s = HealthSample::default();
        if let Some(cur) = read("/proc/stat").as_deref().and_then(parse_proc_stat) {
            if let Some(prev) = self.prev_cpu {
                let total = cur.total.saturating_sub(prev.total);
                if total > 0 {
                    s.cpu_utilisation = 1.0 - cur.idle.saturating_sub(prev.idle) as f32 / total as f32;
                    s.cpu_steal = cur.steal.saturating_sub(prev.steal) as f32 / total as f32;
                }
            }
            self.prev_cpu = Some(cur);
        }
        if let Some(stat) = self.cgroup_stat.as_ref().and_then(|p| std::fs::read_to_string(p).ok())
            && let Some(cur) = parse_cpu_stat(&stat)
        {
            if let Some(prev) = self.prev_throttle {
                let periods = cur.0.saturating_sub(prev.0);
                if periods > 0 {
                    let throttled = cur.1.saturating_sub(prev.1) as f32 / periods as f32;
                    s.cpu_steal = s.cpu_steal.max(throttled);
                }
            }
            self.prev_throttle = Some(cur);
        }
        if let Some(l) = read("/proc/loadavg").as_deref().and_then(parse_loadavg) {
            s.load_per_core = l / self.cores;
        }
        let psi = read("/proc/pressure/memory").as_deref().and_then(parse_psi_some_avg10);
        let mem = read("/proc/meminfo").as_deref().and_then(parse_meminfo);
        s.memory_pressure = memory_pressure(psi, mem);
        s.preemption_notice = self.preemption_notice_file.as_deref().is_some_and(Path::exists);
        if let Some(text) = self.test_health_file.as_ref().and_then(|p| std::fs::read_to_string(p).ok()) {
            match apply_overrides(&mut s, &text) {
                Ok(()) => tracing::debug!(?s, "health sample overridden by the test health file"),
                Err(e) => tracing::warn!(error = %e, "ignoring the test health file"),
            }
        }
        s.cpu_utilisation = s.cpu_utilisation.clamp(0.0, 1.0);
        s.cpu_steal = s.cpu_steal.clamp(0.0, 1.0);
        s.load_per_core = s.load_per_core.clamp(0.0, 10_000.0);
        s
    }
}

/// Online CPUs of this machine.
pub fn detect_cores() -> u64 {
    std::thread::available_parallelism().map(|n| n.get() as u64).unwrap_or(1)
}

/// Total memory in bytes from /proc/meminfo.
pub fn detect_memory() -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo").ok().as_deref().and_then(parse_meminfo).map(|(t, _)| t)
}

/// GPUs reported by `nvidia-smi`, with the model of the first: `(count, model)`.
pub fn detect_gpus() -> Option<(u32, String)> {
    let out = std::process::Command::new("nvidia-smi")
        .args(["--query-gpu=name", "--format=csv,noheader"])
        .stderr(std::process::Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    parse_nvidia_smi(&String::from_utf8_lossy(&out.stdout))
}

pub fn parse_nvidia_smi(text: &str) -> Option<(u32, String)> {
    let names: Vec<&str> = text.lines().map(str::trim).filter(|l| !l.is_empty()).collect();
    let first = names.first()?;
    let model: String = first
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c.to_ascii_lowercase() } else { '-' })
        .take(flotilla_core::MAX_LABEL_VALUE_LEN)
        .collect();
    Some((names.len() as u32, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat() {
        let t = "cpu  100 0 50 800 50 0 0 25 0 0\ncpu0 1 2 3 4\n";
        assert_eq!(parse_proc_stat(t), Some(CpuTimes { total: 1025, idle: 850, steal: 25 }));
        assert_eq!(parse_proc_stat("intr 1 2 3"), None);
    }

    #[test]
    fn loadavg_meminfo_psi() {
        assert_eq!(parse_loadavg("1.50 0.80 0.30 2/345 6789"), Some(1.5));
        let m = "MemTotal:       1000 kB\nMemFree:         10 kB\nMemAvailable:     100 kB\n";
        assert_eq!(parse_meminfo(m), Some((1_024_000, 102_400)));
        let p = "some avg10=12.50 avg60=1.00 avg300=0.00 total=1\nfull avg10=1.00 avg60=0 avg300=0 total=0\n";
        assert_eq!(parse_psi_some_avg10(p), Some(0.125));
        assert_eq!(memory_pressure(Some(0.2), Some((100, 1))), 0.2);
        assert!((memory_pressure(None, Some((100, 10))) - 0.5).abs() < 1e-5);
        assert_eq!(memory_pressure(None, Some((100, 90))), 0.0);
    }

    #[test]
    fn cgroup_cpu_stat() {
        let v2 = "usage_usec 10\nnr_periods 200\nnr_throttled 50\nthrottled_usec 9\n";
        assert_eq!(parse_cpu_stat(v2), Some((200, 50)));
        assert_eq!(parse_cpu_stat("usage_usec 1"), None);
    }

    #[test]
    fn cgroup_paths_for_v1_and_v2() {
        let dir = std::env::temp_dir().join(format!("flotilla-cg-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("cpu,cpuacct/kubepods/pod1")).unwrap();
        std::fs::write(dir.join("cpu,cpuacct/kubepods/pod1/cpu.stat"), "nr_periods 1\nnr_throttled 0\n").unwrap();
        let v1 = "12:memory:/kubepods/pod1\n4:cpu,cpuacct:/kubepods/pod1\n";
        assert_eq!(own_cgroup_cpu_stat(v1, &dir), Some(dir.join("cpu,cpuacct/kubepods/pod1/cpu.stat")));
        std::fs::create_dir_all(dir.join("system.slice/a")).unwrap();
        std::fs::write(dir.join("system.slice/a/cpu.stat"), "nr_periods 1\nnr_throttled 0\n").unwrap();
        assert_eq!(own_cgroup_cpu_stat("0::/system.slice/a\n", &dir), Some(dir.join("system.slice/a/cpu.stat")));
        assert_eq!(own_cgroup_cpu_stat("0::/nowhere\n", &dir), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn nvidia_smi_output() {
        assert_eq!(
            parse_nvidia_smi("NVIDIA A100-SXM4-80GB\nNVIDIA A100-SXM4-80GB\n"),
            Some((2, "nvidia-a100-sxm4-80gb".into()))
        );
        assert_eq!(parse_nvidia_smi(""), None);
    }

    #[test]
    fn test_health_overrides_are_checked() {
        let mut s = HealthSample::default();
        apply_overrides(&mut s, "cpu_steal=0.5, load_per_core=3\nmemory_pressure=0.25").unwrap();
        assert_eq!((s.cpu_steal, s.load_per_core, s.memory_pressure), (0.5, 3.0, 0.25));
        assert!(apply_overrides(&mut s, "cpu_steal=2").unwrap_err().contains("0..=1"));
        assert!(apply_overrides(&mut s, "speed=1").unwrap_err().contains("speed"));
        assert!(apply_overrides(&mut s, "cpu_steal").is_err());
    }

    #[test]
    fn live_sample_is_in_range() {
        let notice = std::env::temp_dir().join(format!("flotilla-preemption-{}", std::process::id()));
        let _ = std::fs::remove_file(&notice);
        let mut p = HealthProbe::new(Some(notice.clone()), None);
        let _ = p.sample();
        let s = p.sample();
        assert!((0.0..=1.0).contains(&s.cpu_utilisation));
        assert!((0.0..=1.0).contains(&s.cpu_steal));
        assert!((0.0..=1.0).contains(&s.memory_pressure));
        assert!(!s.preemption_notice);
        std::fs::write(&notice, "").unwrap();
        assert!(p.sample().preemption_notice, "the notice shows while the file exists");
        std::fs::remove_file(&notice).unwrap();
    }
}
