//! A federation on lab hosts: one shard, a control plane, the echo app's scheduler and
//! agents in two failure domains, each process on its own host and address; a `probe`
//! host, never faulted, from which the test asks the API.

use std::time::Duration;

use super::Lab;
use crate::{http, wait_for};
use serde_json::Value;

pub const ECHO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/echo.toml");

/// Agents' CPU: 2 cores each, so 4 echo members (250m) fit many times over.
pub const AGENT_CORES: u64 = 2;

pub struct Fed {
    pub lab: Lab,
    /// The control plane's `host:port`.
    pub control: String,
    /// Each scheduler's host and the `host:port` of its API.
    pub schedulers: Vec<(String, String)>,
    pub token: String,
    /// Agent hosts by domain: `zone-a` holds `a1…`, `zone-b` `b1…`.
    pub agents: Vec<(String, &'static str)>,
    /// The command line of each agent and shard process, by host, and the pid it runs
    /// as now: what [`Fed::kill`] and [`Fed::restart`] act on.
    procs: std::collections::BTreeMap<String, (Vec<String>, u32)>,
}

/// What a scenario needs besides the base (a shard, a control plane, one scheduler on a
/// redb file, two agents per domain).
pub struct Options {
    pub per_domain: usize,
    /// Flags added to the shard's.
    pub shard_flags: &'static [&'static str],
    /// Schedulers for the app (hosts `sched`, `sched2`, …); more than one needs `etcd`.
    pub schedulers: usize,
    /// An etcd on host `etcd` holding the schedulers' state and leases (TTL 2 s).
    pub etcd: bool,
    /// More hosts, for the scenario to start what it needs on.
    pub extra: &'static [&'static str],
    /// A standby for the shard on host `shard2` (needs `etcd`).
    pub standby: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options { per_domain: 2, shard_flags: &[], schedulers: 1, etcd: false, extra: &[], standby: false }
    }
}

/// The schedulers' lease TTL when they run on etcd.
pub const LEASE_TTL: Duration = Duration::from_secs(2);

impl Fed {
    /// Hosts `probe`, `shard`, `control`, the schedulers' and the agents' (and `etcd`),
    /// all started, the echo app's 2 units running.
    pub fn start(name: &str, o: Options) -> Fed {
        let mut hosts: Vec<String> = ["probe", "shard", "control"].map(String::from).to_vec();
        let sched_hosts: Vec<String> =
            (0..o.schedulers).map(|i| if i == 0 { "sched".to_string() } else { format!("sched{}", i + 1) }).collect();
        hosts.extend(sched_hosts.iter().cloned());
        if o.etcd {
            hosts.push("etcd".into());
        }
        if o.standby {
            hosts.push("shard2".into());
        }
        let mut agents = Vec::new();
        for (prefix, domain) in [("a", "zone-a"), ("b", "zone-b")] {
            for i in 1..=o.per_domain {
                agents.push((format!("{prefix}{i}"), domain));
            }
        }
        hosts.extend(agents.iter().map(|(h, _)| h.clone()));
        hosts.extend(o.extra.iter().map(|h| h.to_string()));
        let names: Vec<&str> = hosts.iter().map(String::as_str).collect();
        let mut lab = Lab::new(name, &names);
        let secrets = lab.dir().join("shard");
        let d = secrets.display().to_string();
        let store = o.etcd.then(|| start_etcd(&mut lab));
        let shard_hosts: &[&str] = if o.standby { &["shard", "shard2"] } else { &["shard"] };
        if o.standby {
            // One TLS pair for both processes of the shard, naming both addresses (what an
            // operator's certificate for the shard's hosts would do).
            let names: Vec<String> = shard_hosts.iter().map(|h| lab.addr(h).to_string()).collect();
            let names: Vec<&str> = names.iter().map(String::as_str).collect();
            let (_, cert, key) = flotilla_aggregator::TlsMaterial::self_signed(&names).unwrap();
            std::fs::create_dir_all(&secrets).unwrap();
            std::fs::write(secrets.join("tls.crt"), cert).unwrap();
            std::fs::write(secrets.join("tls.key"), key).unwrap();
        }
        let mut procs = std::collections::BTreeMap::new();
        let mut shard_addrs = Vec::new();
        for (i, host) in shard_hosts.iter().enumerate() {
            let listen = format!("{}:7000", lab.addr(host));
            let metrics = format!("{}:9100", lab.addr(host));
            // The first process makes the secrets in its data dir; the others read them.
            let data = if i == 0 { d.clone() } else { lab.dir().join(host).display().to_string() };
            #[rustfmt::skip]
            let mut args: Vec<&str> = vec![
                "aggregator", "--listen", &listen, "--shard", "0", "--shards", "1", "--data", &data,
                "--metrics", &metrics, "--print-addrs",
            ];
            if i > 0 {
                args.extend(["--secrets", &d]);
            }
            if let Some(store) = &store {
                args.extend(["--store", store, "--lease-ttl", "2s", "--recovery-window", "3s"]);
            }
            if i > 0 {
                args.push("--standby");
            }
            args.extend_from_slice(o.shard_flags);
            let pid = lab.spawn(host, &args, &format!("{host}.err"));
            procs.insert(host.to_string(), (args.iter().map(|a| a.to_string()).collect(), pid));
            if i == 0 {
                lab.procs().addrs(pid);
            }
            shard_addrs.push(listen);
        }
        // Clients name the shard's processes in turn (`a|b`).
        let shard = shard_addrs.join("|");
        let token = std::fs::read_to_string(secrets.join("api-token")).unwrap().trim().to_string();

        let control = format!("{}:7700", lab.addr("control"));
        let (api_token, grpc_token) = (format!("{d}/api-token"), format!("{d}/grpc-token"));
        #[rustfmt::skip]
        let args = [
            "control", "--listen", &control, "--aggregators", &shard, "--api-token-file", &api_token,
            "--grpc-token-file", &grpc_token, "--print-addrs",
        ];
        let control_pid = lab.spawn("control", &args, "control.err");
        lab.procs().addrs(control_pid);

        for (host, domain) in &agents {
            let data = lab.dir().join("agents").join(host).display().to_string();
            let (join, ca) = (format!("{d}/join-token"), format!("{d}/tls.crt"));
            let label = format!("domain={domain}");
            let cores = AGENT_CORES.to_string();
            #[rustfmt::skip]
            let args = [
                "agent", "--aggregators", &shard, "--node-id", host, "--data", &data,
                "--join-token-file", &join, "--ca", &ca, "--label", &label,
                "--cores", &cores, "--memory", "4294967296",
            ];
            let pid = lab.spawn(host, &args, &format!("{host}.err"));
            procs.insert(host.clone(), (args.map(String::from).to_vec(), pid));
        }

        let mut schedulers = Vec::new();
        for host in &sched_hosts {
            let store =
                store.clone().unwrap_or_else(|| format!("redb:{}", lab.dir().join(format!("{host}.redb")).display()));
            spawn_scheduler(&mut lab, host, &shard, &control, &d, &store);
            schedulers.push((host.clone(), format!("{}:7800", lab.addr(host))));
        }
        let fed = Fed { lab, control, schedulers, token, agents, procs };
        let n = fed.agents.len();
        fed.wait(&format!("{n} alive nodes and 2 running units"), Duration::from_secs(60), |f| {
            let alive = f.nodes().iter().filter(|n| n["status"] == "alive").count();
            (alive == n && f.running().len() == 2).then_some(())
        });
        fed
    }

    /// Kills host `host`'s agent or shard process (SIGKILL; an agent's members die with
    /// it): a node or a shard process lost.
    pub fn kill(&mut self, host: &str) {
        let (_, pid) = &self.procs[host];
        crate::signal(*pid as i32, libc::SIGKILL);
    }

    /// Starts host `host`'s agent or shard process again, with the same flags (an agent
    /// comes back as a new incarnation of its node).
    pub fn restart(&mut self, host: &str) {
        let args = self.procs[host].0.clone();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let pid = self.lab.spawn(host, &args, &format!("{host}.err"));
        if let Some(p) = self.procs.get_mut(host) {
            p.1 = pid;
        }
    }

    /// Whether host `host`'s agent or shard process has exited (a shard that lost its
    /// lease stops).
    pub fn exited(&mut self, host: &str) -> bool {
        let pid = self.procs[host].1;
        self.lab.procs().try_wait(pid).is_some()
    }

    /// Agent host names in `domain`.
    pub fn domain(&self, domain: &str) -> Vec<&str> {
        self.agents.iter().filter(|(_, d)| *d == domain).map(|(h, _)| h.as_str()).collect()
    }

    /// `GET path` on `addr`, asked from the probe host.
    pub fn get(&self, addr: &str, path: &str) -> (u16, Value) {
        self.lab.inside("probe", || http(addr, "GET", path, None, ""))
    }

    /// `method path body` on the control plane with the API token, from the probe host.
    pub fn call(&self, method: &str, path: &str, body: &str) -> (u16, Value) {
        self.lab.inside("probe", || http(&self.control, method, path, Some(&self.token), body))
    }

    /// `flotilla ARGS --json` on the probe host against the control plane: its JSON, or
    /// `Null` while it fails.
    pub fn cli(&self, args: &[&str]) -> Value {
        cli(&self.lab.host("probe").ns, &self.control, args)
    }

    pub fn nodes(&self) -> Vec<Value> {
        self.cli(&["nodes"]).as_array().cloned().unwrap_or_default()
    }

    pub fn units(&self) -> Vec<Value> {
        self.cli(&["units", "echo"]).as_array().cloned().unwrap_or_default()
    }

    pub fn running(&self) -> Vec<Value> {
        self.units().into_iter().filter(|u| u["state"] == "running").collect()
    }

    /// [`wait_for`] with the federation at hand; on timeout the panic names `what`.
    pub fn wait<T>(&self, what: &str, limit: Duration, mut f: impl FnMut(&Fed) -> Option<T>) -> T {
        wait_for(what, limit, || f(self))
    }

    /// The status of node `id` as the control plane shows it.
    pub fn status(&self, id: &str) -> String {
        self.nodes()
            .iter()
            .find(|n| n["node_id"] == id)
            .map(|n| n["status"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    }
}

/// `flotilla ARGS --json` in namespace `ns` against the API at `addr`: its JSON, or
/// `Null` while it fails.
pub fn cli(ns: &str, addr: &str, args: &[&str]) -> Value {
    let out = std::process::Command::new("ip")
        .args(["netns", "exec", ns])
        .arg(crate::bin("flotilla"))
        .args(args)
        .arg("--json")
        .env("FLOTILLA_ADDR", format!("http://{addr}"))
        .env_remove("FLOTILLA_TOKEN")
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
}

/// Starts etcd on host `etcd` and waits until it answers; its `--store` URL.
fn start_etcd(lab: &mut Lab) -> String {
    let ip = lab.addr("etcd");
    let (client, peer) = (format!("http://{ip}:2379"), format!("http://{ip}:2380"));
    let data = lab.dir().join("etcd-data").display().to_string();
    let cluster = format!("lab={peer}");
    #[rustfmt::skip]
    let args = [
        "--name", "lab", "--data-dir", &data, "--listen-client-urls", &client, "--advertise-client-urls", &client,
        "--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer, "--initial-cluster", &cluster,
        "--initial-cluster-state", "new",
    ];
    lab.spawn_program("etcd", std::path::Path::new("etcd"), &args, "etcd.err");
    let health = format!("{ip}:2379");
    wait_for("etcd answers", Duration::from_secs(20), || {
        lab.inside("probe", || crate::get_text(&health, "/health")).filter(|b| b.contains("true"))
    });
    format!("etcd://{ip}:2379")
}

/// Starts the echo app's scheduler on `host` (API on port 7800 there, instance named
/// after the host) with `store`; its pid.
pub fn spawn_scheduler(lab: &mut Lab, host: &str, shard: &str, control: &str, secrets: &str, store: &str) -> u32 {
    let listen = format!("{}:7800", lab.addr(host));
    let (grpc_token, api_token) = (format!("{secrets}/grpc-token"), format!("{secrets}/api-token"));
    let token = std::fs::read_to_string(&api_token).unwrap().trim().to_string();
    let control = format!("http://{control}");
    let ttl = format!("{}s", LEASE_TTL.as_secs());
    #[rustfmt::skip]
    let args = [
        "scheduler", "--app", ECHO, "--aggregators", shard, "--control", &control, "--store", store,
        "--listen", &listen, "--token", &token, "--grpc-token-file", &grpc_token, "--instance", host,
        "--lease-ttl", &ttl,
    ];
    lab.spawn(host, &args, &format!("{host}.err"))
}
