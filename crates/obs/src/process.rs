//! The standard `process_*` metrics (the names every Prometheus client library uses),
//! read from `/proc/self` at scrape time. Linux only: elsewhere nothing is rendered.

use crate::catalogue::Family;

pub const CPU_SECONDS: Family =
    Family::counter("process_cpu_seconds_total", "Total user and system CPU time spent, in seconds.", &[]);
pub const RESIDENT_MEMORY: Family =
    Family::gauge("process_resident_memory_bytes", "Resident memory size of the process, in bytes.", &[]);
pub const VIRTUAL_MEMORY: Family =
    Family::gauge("process_virtual_memory_bytes", "Virtual memory size of the process, in bytes.", &[]);
pub const OPEN_FDS: Family = Family::gauge("process_open_fds", "Number of open file descriptors.", &[]);
pub const MAX_FDS: Family =
    Family::gauge("process_max_fds", "Maximum number of open file descriptors (the soft limit).", &[]);
pub const START_TIME: Family =
    Family::gauge("process_start_time_seconds", "Start time of the process since the Unix epoch, in seconds.", &[]);
pub const THREADS: Family = Family::gauge("process_threads", "Number of OS threads in the process.", &[]);

/// The process families, in the order they are rendered.
pub const FAMILIES: &[Family] = &[CPU_SECONDS, RESIDENT_MEMORY, VIRTUAL_MEMORY, OPEN_FDS, MAX_FDS, START_TIME, THREADS];

/// Appends the process metrics to `out` (nothing when `/proc` cannot be read).
pub fn render(out: &mut String) {
    #[cfg(target_os = "linux")]
    if let Some(s) = linux::sample() {
        for (family, value) in FAMILIES.iter().zip([
            s.cpu_seconds,
            s.resident_bytes,
            s.virtual_bytes,
            s.open_fds,
            s.max_fds,
            s.start_time_seconds,
            s.threads,
        ]) {
            if let Some(v) = value {
                family.write_header(out);
                family.write_sample(out, &[], v);
                out.push('\n');
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = out;
}

/// The soft limit on open file descriptors (`None`: unlimited or unknown).
pub fn open_file_limit() -> Option<u64> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes only into `lim`, which outlives the call.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } == 0;
    (ok && lim.rlim_cur != libc::RLIM_INFINITY).then_some(lim.rlim_cur)
}

#[cfg(target_os = "linux")]
mod linux {
    /// One reading; a value that could not be read is left out.
    #[derive(Debug, Default)]
    pub struct Sample {
        pub cpu_seconds: Option<f64>,
        pub resident_bytes: Option<f64>,
        pub virtual_bytes: Option<f64>,
        pub open_fds: Option<f64>,
        pub max_fds: Option<f64>,
        pub start_time_seconds: Option<f64>,
        pub threads: Option<f64>,
    }

    pub fn sample() -> Option<Sample> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // SAFETY: sysconf has no preconditions.
        let (ticks, page) = unsafe { (libc::sysconf(libc::_SC_CLK_TCK), libc::sysconf(libc::_SC_PAGESIZE)) };
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| boot_time(&s));
        let mut s = parse_stat(&stat, ticks as f64, page as f64, boot)?;
        s.open_fds = std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count() as f64);
        s.max_fds = super::open_file_limit().map(|l| l as f64);
        Some(s)
    }

    /// `btime` of `/proc/stat`: the boot time, in seconds since the epoch.
    pub fn boot_time(proc_stat: &str) -> Option<f64> {
        proc_stat.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse().ok())
    }

    /// Reads `/proc/self/stat` (see proc(5)): the command name in parentheses may hold
    /// spaces, so fields are counted after its closing parenthesis.
    pub fn parse_stat(stat: &str, ticks: f64, page: f64, boot: Option<f64>) -> Option<Sample> {
        let rest = &stat[stat.rfind(')')? + 1..];
        // Field 3 (state) is rest[0]; field N is rest[N - 3].
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<f64>().ok());
        if ticks <= 0.0 {
            return None;
        }
        Some(Sample {
            cpu_seconds: Some((num(14)? + num(15)?) / ticks),
            threads: num(20),
            start_time_seconds: boot.and_then(|b| Some(b + num(22)? / ticks)),
            virtual_bytes: num(23),
            resident_bytes: num(24).map(|p| p * page),
            ..Sample::default()
        })
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        #[test]
        fn stat_fields_are_counted_after_the_command_name() {
            // A command name with spaces and a parenthesis, as proc(5) allows.
            let stat = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 7 0 \
                        1000 123456789 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
            let s = parse_stat(stat, 100.0, 4096.0, Some(1_700_000_000.0)).expect("parses");
            assert_eq!(s.cpu_seconds, Some(3.0));
            assert_eq!(s.threads, Some(7.0));
            assert_eq!(s.start_time_seconds, Some(1_700_000_010.0));
            assert_eq!(s.virtual_bytes, Some(123456789.0));
            assert_eq!(s.resident_bytes, Some(300.0 * 4096.0));
            assert_eq!(boot_time("cpu 1 2 3\nbtime 1700000000\nprocesses 9\n"), Some(1_700_000_000.0));
        }

        #[test]
        fn this_process_is_read() {
            let s = sample().expect("/proc/self is readable on Linux");
            assert!(s.threads.is_some_and(|t| t >= 1.0), "{s:?}");
            assert!(s.open_fds.is_some_and(|n| n >= 1.0), "{s:?}");
            assert!(s.resident_bytes.is_some_and(|b| b > 0.0), "{s:?}");
            assert!(s.start_time_seconds.is_some_and(|t| t > 1.0e9), "{s:?}");
        }
    }
}
