use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{fresh_dir, signal, wait_for};

/// A running `flotilla up`, the cluster a test drives: its control API's address, its
/// data dir (tokens, agents' dirs and pid files, logs) and its CLI. On drop every agent's
/// process group and `up`'s own are killed and the data dir removed, so a failing test
/// leaves nothing running. Without a child ([`Up::attach`]), the API of processes a test
/// started itself.
pub struct Up {
    child: Option<Child>,
    pub data: PathBuf,
    pub addr: String,
    /// The arguments and environment `up` was started with (for [`Up::restart`]).
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Up {
    /// `flotilla up --listen 127.0.0.1:0` with `extra` flags, in a fresh data dir named
    /// after `name`; returns once its control API's address is written.
    pub fn start(name: &str, extra: &[&str]) -> Up {
        Up::start_with_env(name, extra, &[])
    }

    /// [`Up::start`] with `env` set for `up` and the agents it starts (`FLOTILLA_…`
    /// settings that have no flag on `up`).
    pub fn start_with_env(name: &str, extra: &[&str], env: &[(&str, &str)]) -> Up {
        let data = fresh_dir(name);
        let mut args = vec!["up", "--listen", "127.0.0.1:0", "--data", data.to_str().unwrap()];
        args.extend_from_slice(extra);
        let args: Vec<String> = args.into_iter().map(str::to_string).collect();
        let env: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let (child, addr) = Self::spawn(&data, &args, &env);
        Up { child: Some(child), data, addr, args, env }
    }

    /// Stops `up` (SIGTERM, as [`Up::stop`]) and starts it again with the same arguments
    /// and data dir, as an operator restarting it would; returns whether it had exited
    /// cleanly.
    pub fn restart(&mut self) -> bool {
        let clean = self.stop();
        if let Some(mut child) = self.child.take() {
            signal(-(child.id() as i32), libc::SIGKILL);
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.data.join("control.addr"));
        let (child, addr) = Self::spawn(&self.data, &self.args, &self.env);
        self.child = Some(child);
        self.addr = addr;
        clean
    }

    fn spawn(data: &Path, args: &[String], env: &[(String, String)]) -> (Child, String) {
        use std::os::unix::process::CommandExt;
        let log = |name: &str| std::fs::OpenOptions::new().create(true).append(true).open(data.join(name)).unwrap();
        let child = crate::flotilla()
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log("up.out"))
            .stderr(log("up.err"))
            .process_group(0)
            .spawn()
            .unwrap();
        let addr_file = data.join("control.addr");
        let addr = wait_for("control address", Duration::from_secs(30), || std::fs::read_to_string(&addr_file).ok());
        (child, addr)
    }

    pub fn attach(data: &Path, addr: &str) -> Up {
        Up { child: None, data: data.to_path_buf(), addr: addr.to_string(), args: Vec::new(), env: Vec::new() }
    }

    /// A `flotilla` command aimed at this cluster's API, with its data dir (and so its
    /// API token).
    pub fn cli(&self) -> Command {
        let mut cmd = crate::flotilla();
        cmd.env("FLOTILLA_ADDR", &self.addr).env("FLOTILLA_DATA", &self.data);
        cmd
    }

    /// The pid of the `up` this started (to signal it); `None` when attached.
    pub fn pid(&self) -> Option<i32> {
        self.child.as_ref().map(|c| c.id() as i32)
    }

    /// The API token `up` wrote into its data dir.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.data.join("api-token")).unwrap().trim().to_string()
    }

    /// The data dir of agent `node` (its assignments, drain socket, test health file).
    pub fn agent_dir(&self, node: &str) -> PathBuf {
        self.data.join("agents").join(node)
    }

    /// `flotilla nodes --json`; empty while the API does not answer.
    pub fn nodes(&self) -> Vec<Value> {
        json_array(self.cli().args(["nodes", "--json"]))
    }

    pub fn node(&self, id: &str) -> Option<Value> {
        self.nodes().into_iter().find(|n| n["node_id"] == id)
    }

    /// `flotilla units APP --json`; empty while no scheduler answers.
    pub fn units(&self, app: &str) -> Vec<Value> {
        json_array(self.cli().args(["units", app, "--json"]))
    }

    pub fn agent_pid(&self, id: &str) -> i32 {
        std::fs::read_to_string(self.data.join("agents").join(format!("{id}.pid"))).unwrap().trim().parse().unwrap()
    }

    /// Every agent's pid: `up`'s own agents, and those pool providers launched
    /// (`DATA/pool/POOL/ID.pid`).
    pub fn agent_pids(&self) -> Vec<i32> {
        let mut dirs = vec![self.data.join("agents")];
        if let Ok(pools) = std::fs::read_dir(self.data.join("pool")) {
            dirs.extend(pools.filter_map(|e| Some(e.ok()?.path())).filter(|p| p.is_dir()));
        }
        dirs.iter()
            .filter_map(|d| std::fs::read_dir(d).ok())
            .flatten()
            .filter_map(|e| {
                let p = e.ok()?.path();
                (p.extension()? == "pid").then(|| std::fs::read_to_string(&p).ok()?.trim().parse().ok())?
            })
            .collect()
    }

    /// SIGTERM, as Ctrl-C would; returns whether `up` exited cleanly.
    pub fn stop(&mut self) -> bool {
        let Some(child) = self.child.as_mut() else { return false };
        signal(child.id() as i32, libc::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(st)) = child.try_wait() {
                return st.success();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

fn json_array(cmd: &mut Command) -> Vec<Value> {
    let Ok(out) = cmd.output() else { return vec![] };
    if !out.status.success() {
        return vec![];
    }
    serde_json::from_slice::<Value>(&out.stdout).ok().and_then(|v| v.as_array().cloned()).unwrap_or_default()
}

impl Drop for Up {
    fn drop(&mut self) {
        for pid in self.agent_pids() {
            signal(-pid, libc::SIGKILL);
        }
        if let Some(child) = self.child.as_mut() {
            signal(-(child.id() as i32), libc::SIGKILL);
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
