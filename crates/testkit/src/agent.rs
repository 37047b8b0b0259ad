//! An agent a test starts itself (`flotilla agent`), its flags built in one place.

use std::path::Path;

use crate::Group;

/// The flags of one `flotilla agent`: the node and where it keeps its state, then what
/// the test asks for.
pub struct Agent {
    args: Vec<String>,
}

impl Agent {
    /// Node `node` joining the shards at `aggregators` (`a,b` for shards, `a|b` for a
    /// shard and its standby), its state in `data`.
    pub fn new(aggregators: &str, node: &str, data: &Path) -> Agent {
        let args = ["agent", "--aggregators", aggregators, "--node-id", node, "--data", &data.display().to_string()]
            .map(String::from)
            .to_vec();
        Agent { args }
    }

    /// Joins with the join token and CA an `up` data dir (or `Pki`) wrote into `dir`:
    /// `join-token` and `tls.crt`.
    pub fn secrets_of(self, dir: &Path) -> Agent {
        let token = dir.join("join-token").display().to_string();
        let ca = dir.join("tls.crt").display().to_string();
        self.arg("--join-token-file", &token).arg("--ca", &ca)
    }

    /// `cores` and `memory_bytes` of capacity.
    pub fn capacity(self, cores: u32, memory_bytes: u64) -> Agent {
        self.arg("--cores", &cores.to_string()).arg("--memory", &memory_bytes.to_string())
    }

    /// In failure domain `domain`.
    pub fn domain(self, domain: &str) -> Agent {
        self.arg("--label", &format!("domain={domain}"))
    }

    /// Any other flag and its value.
    pub fn arg(mut self, flag: &str, value: &str) -> Agent {
        self.args.extend([flag.to_string(), value.to_string()]);
        self
    }

    /// Starts it in `procs`, its stderr in `log`; its PID.
    pub fn spawn(self, procs: &mut Group, log: &Path) -> u32 {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        procs.spawn(&args, log)
    }
}
