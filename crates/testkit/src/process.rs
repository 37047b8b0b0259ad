use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};

use serde_json::Value;

/// Sends `sig` to `pid` (a process group if negative).
pub fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) has no memory effects; tests signal only processes they started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Whether `pid` runs: a zombie, reaped or not, does not.
pub fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')),
        Err(_) => false,
    }
}

/// A TCP port free on loopback a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `flotilla` processes a test started, each in a process group of its own (so that
/// whatever it starts goes with it) and with its stderr in a file; every group is killed
/// on drop, so a failing test leaves nothing running.
#[derive(Default)]
pub struct Group {
    children: Vec<(Child, PathBuf)>,
}

impl Group {
    pub fn new() -> Group {
        Group::default()
    }

    /// Starts `flotilla args`, its stderr to `log`; its pid.
    pub fn spawn(&mut self, args: &[&str], log: &Path) -> u32 {
        self.spawn_with_env(args, log, &[])
    }

    pub fn spawn_with_env(&mut self, args: &[&str], log: &Path, env: &[(&str, &str)]) -> u32 {
        let mut cmd = crate::flotilla();
        cmd.args(args).envs(env.iter().copied());
        self.spawn_command(cmd, log)
    }

    /// Starts `cmd` (stdout piped for [`Group::addrs`], stderr to `log`); its pid.
    pub fn spawn_command(&mut self, mut cmd: Command, log: &Path) -> u32 {
        use std::os::unix::process::CommandExt;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        self.children.push((child, log.to_path_buf()));
        pid
    }

    /// The JSON line a `--print-addrs` server writes first. A server that exits first
    /// panics the test with its stderr, which says why.
    pub fn addrs(&mut self, pid: u32) -> Value {
        use std::io::BufRead;
        let (child, log) = self.children.iter_mut().find(|(c, _)| c.id() == pid).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        serde_json::from_str(&line).unwrap_or_else(|e| {
            let log = std::fs::read_to_string(log).unwrap_or_default();
            panic!("{e} in {line:?}; its stderr:\n{log}")
        })
    }

    /// How `pid` exited, if it has.
    pub fn try_wait(&mut self, pid: u32) -> Option<ExitStatus> {
        self.children.iter_mut().find(|(c, _)| c.id() == pid)?.0.try_wait().ok().flatten()
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        for (c, _) in &mut self.children {
            signal(-(c.id() as i32), libc::SIGKILL);
            let _ = c.wait();
        }
    }
}
