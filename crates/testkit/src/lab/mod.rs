//! Many hosts on one machine: each host a network namespace with its own 10.77.x.y
//! address on a bridge, running real processes, with faults a test sets per host or
//! between groups of hosts (DESIGN §13, issue #37).
//!
//! Everything lives in namespaces the lab makes. The bridge sits in a "switch" namespace
//! of its own, so the machine's own namespace gains no link, address or rule: nothing
//! outside the lab can be reached from it or disturbed by it. Faults are iptables rules
//! and qdiscs inside a host's namespace, which is the lab's alone, so healing flushes
//! them whole.
//!
//! Clean-up: dropping the [`Lab`] kills its processes and deletes its namespaces (with
//! them every veth and the bridge). A test killed before its drop leaves them behind; the
//! next lab's [`sweep`] removes every lab whose owning process is gone.
//!
//! The test itself stays in the machine's namespace; [`Lab::inside`] runs a closure on a
//! thread that has entered a host's namespace, so the test's HTTP probes travel the lab
//! network like any client's.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

use crate::{Group, TempDir};

mod federation;
mod invariants;
mod soak;

pub use federation::{AGENT_CORES, ECHO, Fed, LEASE_TTL, Options, cli, spawn_scheduler};
pub use invariants::{Report, Watch, placements, running_members, settled, violations};
pub use soak::{SoakReport, soak};

/// What every lab namespace's name starts with: `flab<pid>x<n>-<host>`.
const PREFIX: &str = "flab";

/// Labs made by this process so far, so that each has its own names.
static LABS: AtomicU32 = AtomicU32::new(0);

/// One host of a lab.
#[derive(Clone, Debug)]
pub struct Host {
    pub name: String,
    /// The namespace's name, for `ip netns exec`.
    pub ns: String,
    pub addr: Ipv4Addr,
}

/// Network namespaces on a bridge, the processes started in them, and the faults set.
pub struct Lab {
    id: String,
    hosts: Vec<Host>,
    procs: Group,
    dir: TempDir,
    netem: Option<bool>,
}

/// Runs `ip args`; panics with its stderr if it fails.
fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().unwrap_or_else(|e| panic!("running ip (iproute2): {e}"));
    assert!(out.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
}

/// Runs `program args` inside namespace `ns`; its output, whether or not it succeeded.
fn in_ns(ns: &str, program: &str, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns, program])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program} in {ns}: {e}"))
}

/// Removes every lab namespace whose owning process no longer runs, and the processes
/// left in it: what a killed test could not clean up.
pub fn sweep() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else { return };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(ns) = line.split_whitespace().next() else { continue };
        let Some(owner) = ns.strip_prefix(PREFIX).and_then(|r| r.split('x').next()?.parse::<u32>().ok()) else {
            continue;
        };
        if owner == std::process::id() || Path::new(&format!("/proc/{owner}")).exists() {
            continue;
        }
        remove_ns(ns);
    }
}

/// Moves the calling thread into the network namespace `ns` (a file under /run/netns).
fn enter(ns: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: setns on a namespace file held open; it changes only this thread's network
    // namespace.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
}

/// Kills every process in `ns`, then deletes it.
fn remove_ns(ns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", ns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
            crate::signal(pid, libc::SIGKILL);
        }
    }
    // A killed process holds its namespace until it is reaped; deleting the name is enough.
    let _ = Command::new("ip").args(["netns", "del", ns]).output();
}

impl Lab {
    /// Hosts `names` (host i at 10.77.i/250.i%250+1), each with loopback and `eth0` up,
    /// on one bridge. Needs root; sweeps stale labs first.
    pub fn new(name: &str, names: &[&str]) -> Lab {
        // SAFETY: geteuid has no memory effects.
        assert_eq!(unsafe { libc::geteuid() }, 0, "the lab makes network namespaces: run the test as root");
        sweep();
        let id = format!("{PREFIX}{}x{}", std::process::id(), LABS.fetch_add(1, Ordering::Relaxed));
        let mut lab =
            Lab { id, hosts: Vec::new(), procs: Group::new(), dir: TempDir::new(&format!("lab-{name}")), netem: None };
        let switch = lab.switch();
        ip(&["netns", "add", &switch]);
        ip(&["-n", &switch, "link", "set", "lo", "up"]);
        ip(&["-n", &switch, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &switch, "link", "set", "br0", "up"]);
        for (i, host) in names.iter().enumerate() {
            assert!(host.len() <= 24 && !host.contains(['/', ' ']), "host name {host:?}");
            let ns = format!("{}-{host}", lab.id);
            let addr = Ipv4Addr::new(10, 77, (i / 250) as u8, (i % 250 + 1) as u8);
            let port = format!("p{i}");
            ip(&["netns", "add", &ns]);
            // Known to the lab (and so removed on drop) before anything else can fail.
            lab.hosts.push(Host { name: host.to_string(), ns: ns.clone(), addr });
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&["-n", &switch, "link", "add", &port, "type", "veth", "peer", "name", "eth0", "netns", &ns]);
            ip(&["-n", &switch, "link", "set", &port, "master", "br0"]);
            ip(&["-n", &switch, "link", "set", &port, "up"]);
            ip(&["-n", &ns, "addr", "add", &format!("{addr}/16"), "dev", "eth0"]);
            ip(&["-n", &ns, "link", "set", "eth0", "up"]);
        }
        lab
    }

    fn switch(&self) -> String {
        format!("{}-switch", self.id)
    }

    /// Where the test keeps the lab's files (data dirs, logs); removed on drop.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn host(&self, name: &str) -> &Host {
        self.hosts.iter().find(|h| h.name == name).unwrap_or_else(|| panic!("no lab host {name:?}"))
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The address of host `name`.
    pub fn addr(&self, name: &str) -> Ipv4Addr {
        self.host(name).addr
    }

    /// Starts `flotilla args` on host `host`, its stderr in `<dir>/<log>`; its pid.
    pub fn spawn(&mut self, host: &str, args: &[&str], log: &str) -> u32 {
        let program = crate::bin("flotilla");
        self.spawn_program(host, &program, args, log)
    }

    /// Starts any program on host `host` (etcd, say), its stderr in `<dir>/<log>`.
    pub fn spawn_program(&mut self, host: &str, program: &Path, args: &[&str], log: &str) -> u32 {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.host(host).ns]).arg(program).args(args);
        // Killed with the thread that started it: a test or soak stopped by a signal or
        // a timeout leaves no host running (the next lab's sweep removes the namespaces).
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let log = self.dir.join(log);
        self.procs.spawn_command(cmd, &log)
    }

    /// The processes started so far (to read `--print-addrs`, wait, or kill one).
    pub fn procs(&mut self) -> &mut Group {
        &mut self.procs
    }

    /// The stderr a process wrote to `<dir>/<log>`.
    pub fn log(&self, log: &str) -> String {
        std::fs::read_to_string(self.dir.join(log)).unwrap_or_default()
    }

    /// The last lines of every process's stderr, for a failed test's output.
    fn print_logs(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.path()) else { return };
        let mut logs: Vec<PathBuf> =
            entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "err")).collect();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            eprintln!("--- {} (last 25 of {} lines)", log.display(), lines.len());
            for l in &lines[lines.len().saturating_sub(25)..] {
                eprintln!("{l}");
            }
        }
    }

    /// Runs `f` on a thread inside host `host`'s namespace: its sockets are that host's.
    pub fn inside<T: Send>(&self, host: &str, f: impl FnOnce() -> T + Send) -> T {
        let ns = self.ns_file(host);
        std::thread::scope(|s| {
            s.spawn(|| {
                enter(&ns);
                f()
            })
            .join()
            .unwrap_or_else(|p| std::panic::resume_unwind(p))
        })
    }

    fn ns_file(&self, host: &str) -> std::fs::File {
        let path = PathBuf::from("/run/netns").join(&self.host(host).ns);
        std::fs::File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }

    /// The pids of the processes running in host `host` (those the lab started and
    /// their children).
    pub fn pids(&self, host: &str) -> Vec<i32> {
        let out = Command::new("ip").args(["netns", "pids", &self.host(host).ns]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect()
    }

    /// Adds iptables `rules` (each `CHAIN args…`, e.g. `INPUT -s 10.77.0.2 -j DROP`) in
    /// host `host`, in one `iptables-restore`.
    fn add_rules(&self, host: &str, rules: &[String]) {
        self.change_rules(host, 'A', rules);
    }

    /// Appends (`op` 'A') or deletes ('D') filter rules in `host`, in one transaction.
    fn change_rules(&self, host: &str, op: char, rules: &[String]) {
        use std::io::Write;
        if rules.is_empty() {
            return;
        }
        let mut script = String::from("*filter\n");
        for r in rules {
            script.push_str(&format!("-{op} {r}\n"));
        }
        script.push_str("COMMIT\n");
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.host(host).ns, "iptables-restore", "--noflush"])
            .stdin(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("running iptables-restore (Debian's iptables): {e}"));
        child.stdin.take().unwrap().write_all(script.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "iptables-restore in {host}: {}\n{script}", String::from_utf8_lossy(&out.stderr));
    }

    /// Nothing passes between group `a` and group `b`, either way.
    pub fn partition(&self, a: &[&str], b: &[&str]) {
        self.cut(a, b);
        self.cut(b, a);
    }

    /// What hosts `from` send to hosts `to` is dropped (on arrival); the reverse passes.
    pub fn cut(&self, from: &[&str], to: &[&str]) {
        for t in to {
            self.add_rules(t, &self.drops_from(from));
        }
    }

    /// Undoes [`Lab::partition`] of `a` and `b` alone, leaving every other rule in place
    /// (where [`Lab::heal`] would open everything for a moment).
    pub fn reconnect(&self, a: &[&str], b: &[&str]) {
        for (from, to) in [(a, b), (b, a)] {
            for t in to {
                self.change_rules(t, 'D', &self.drops_from(from));
            }
        }
    }

    fn drops_from(&self, from: &[&str]) -> Vec<String> {
        from.iter().map(|f| format!("INPUT -s {} -j DROP", self.addr(f))).collect()
    }

    /// Drops `fraction` of the packets host `host` sends and of those it receives.
    pub fn loss(&self, host: &str, fraction: f64) {
        assert!((0.0..=1.0).contains(&fraction), "loss {fraction}");
        // On the lab link only: an agent and its own members talk over loopback.
        let rules = ["INPUT -i eth0", "OUTPUT -o eth0"]
            .map(|chain| format!("{chain} -m statistic --mode random --probability {fraction:.4} -j DROP"));
        self.add_rules(host, &rules);
    }

    /// Limits what host `host` sends to `kbit` kilobits per second (tbf).
    pub fn rate(&self, host: &str, kbit: u32) {
        let rate = format!("{kbit}kbit");
        let out = in_ns(
            &self.host(host).ns,
            "tc",
            &["qdisc", "replace", "dev", "eth0", "root", "tbf", "rate", &rate, "burst", "32kbit", "latency", "400ms"],
        );
        assert!(out.status.success(), "tc tbf in {host}: {}", String::from_utf8_lossy(&out.stderr));
    }

    /// Shapes host `host`'s link to `mbit` megabits a second each way (htb on its `eth0`
    /// for what it sends, on its bridge port for what it receives): a host's line rate.
    pub fn shape(&self, host: &str, mbit: u32) {
        let i = self.hosts.iter().position(|h| h.name == host).unwrap_or_else(|| panic!("no lab host {host:?}"));
        let rate = format!("{mbit}mbit");
        for (ns, dev) in [(self.host(host).ns.clone(), "eth0".to_string()), (self.switch(), format!("p{i}"))] {
            for cmd in [
                vec!["qdisc", "replace", "dev", &dev, "root", "handle", "1:", "htb", "default", "10"],
                vec![
                    "class", "replace", "dev", &dev, "parent", "1:", "classid", "1:10", "htb", "rate", &rate, "ceil",
                    &rate,
                ],
            ] {
                let out = in_ns(&ns, "tc", &cmd);
                assert!(out.status.success(), "tc {} in {ns}: {}", cmd.join(" "), String::from_utf8_lossy(&out.stderr));
            }
        }
    }

    /// Whether this kernel has netem (many do not): delay is possible only then.
    pub fn has_netem(&mut self) -> bool {
        if let Some(known) = self.netem {
            return known;
        }
        let ns = self.switch();
        let ok = in_ns(&ns, "tc", &["qdisc", "add", "dev", "lo", "root", "netem", "delay", "1ms"]).status.success();
        let _ = in_ns(&ns, "tc", &["qdisc", "del", "dev", "lo", "root"]);
        self.netem = Some(ok);
        ok
    }

    /// Delays what host `host` sends by `ms` ± `jitter_ms` (netem); false, and nothing
    /// set, where the kernel has no netem.
    pub fn delay(&mut self, host: &str, ms: u32, jitter_ms: u32) -> bool {
        if !self.has_netem() {
            return false;
        }
        let (d, j) = (format!("{ms}ms"), format!("{jitter_ms}ms"));
        let out =
            in_ns(&self.host(host).ns, "tc", &["qdisc", "replace", "dev", "eth0", "root", "netem", "delay", &d, &j]);
        assert!(out.status.success(), "tc netem in {host}: {}", String::from_utf8_lossy(&out.stderr));
        true
    }

    /// Removes every fault: each host's rules and qdiscs.
    pub fn heal(&self) {
        for h in &self.hosts {
            let out = in_ns(&h.ns, "iptables", &["-F"]);
            assert!(out.status.success(), "iptables -F in {}: {}", h.name, String::from_utf8_lossy(&out.stderr));
            let _ = in_ns(&h.ns, "tc", &["qdisc", "del", "dev", "eth0", "root"]);
        }
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        drop(std::mem::take(&mut self.procs));
        if std::thread::panicking() {
            self.print_logs();
        }
        for h in &self.hosts {
            remove_ns(&h.ns);
        }
        remove_ns(&self.switch());
    }
}
