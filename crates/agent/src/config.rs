//! The agent's configuration, parsed in one place. Every problem is reported at
//! once, not just the first.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use flotilla_core::{Labels, NodeId, Resources};

#[derive(Debug, Clone, clap::Args)]
pub struct AgentArgs {
    /// Shard addresses (`host:port`), in shard-index order.
    #[arg(long, value_delimiter = ',', required = true, env = "FLOTILLA_AGGREGATORS")]
    pub aggregators: Vec<String>,
    /// This node's id (default: the hostname).
    #[arg(long, env = "FLOTILLA_NODE_ID")]
    pub node_id: Option<String>,
    /// A label `KEY=VALUE`; repeatable. Also read from `FLOTILLA_LABEL_<KEY>` variables
    /// and `FLOTILLA_LABELS=k=v,k2=v2` (so the Kubernetes downward API can feed them).
    #[arg(long = "label")]
    pub labels: Vec<String>,
    /// CPU cores to offer (default: the online CPUs).
    #[arg(long)]
    pub cores: Option<f64>,
    /// Memory to offer in bytes (default: MemTotal).
    #[arg(long)]
    pub memory: Option<u64>,
    /// GPUs to offer (default: what `nvidia-smi` reports, else 0).
    #[arg(long)]
    pub gpus: Option<u32>,
    /// The GPUs' model, offered as the label `gpu_model` that specs select by
    /// (`node_labels = { gpu_model = "l4" }`). Default: the model `nvidia-smi` reports;
    /// the same as `--label gpu_model=MODEL`.
    #[arg(long, env = "FLOTILLA_GPU_MODEL")]
    pub gpu_model: Option<String>,
    /// A custom resource `NAME=QTY`; repeatable.
    #[arg(long = "resource")]
    pub resources: Vec<String>,
    /// Register cordoned, as a warm pool node: ready, holding nothing, taking no
    /// placements until its pool claims it (`flotilla node uncordon`). Only the node's
    /// first registration (its data dir remembers it): once claimed, it stays uncordoned
    /// across shard and agent restarts.
    #[arg(long, env = "FLOTILLA_CORDONED")]
    pub cordoned: bool,
    #[arg(long, env = "FLOTILLA_JOIN_TOKEN", hide_env_values = true)]
    pub join_token: Option<String>,
    /// A file holding join tokens, one per line, newest first (`flotilla join-token
    /// rotate`); the agent uses the first, and reads the file again whenever it registers.
    #[arg(long)]
    pub join_token_file: Option<PathBuf>,
    /// A file of labels, one `key="value"` (or `key=value`) a line, as a Kubernetes
    /// downward-API volume writes a pod's labels or annotations; read at start. The
    /// prefix `flotilla.io/` is dropped (the pod label `flotilla.io/zone` gives `zone`);
    /// other keys are kept whole. Flags and `FLOTILLA_LABEL_*` variables win over the file.
    #[arg(long, env = "FLOTILLA_LABELS_FILE")]
    pub labels_file: Option<PathBuf>,
    /// In a Kubernetes pod: ask the API server once at start for this node's labels and
    /// take the zone, region, instance type and arch (as `zone`, `region`,
    /// `instance_type`, `arch`) and every `flotilla.io/KEY` (as `KEY`). Needs `get` on
    /// nodes for the pod's ServiceAccount. Below the file, variables and flags.
    #[arg(long, env = "FLOTILLA_NODE_LABELS_FROM_KUBERNETES")]
    pub node_labels_from_kubernetes: bool,
    /// CPU kept back for the system and the agent itself (Kubernetes' `system-reserved`):
    /// offered = the node's CPUs (or --cores) minus this. Cores (`0.5`) or millicores (`500m`).
    #[arg(long, default_value = "0")]
    pub reserved_cpu: String,
    /// Memory kept back for the system and the agent itself: offered = MemTotal (or
    /// --memory) minus this. Bytes, or with a suffix: `512Mi`, `1Gi`, `500M`.
    #[arg(long, default_value = "0")]
    pub reserved_memory: String,
    /// Where the cgroup hierarchy is mounted (in a container: the host's, mounted
    /// writable, e.g. /host/sys/fs/cgroup).
    #[arg(long, default_value = "/sys/fs/cgroup")]
    pub cgroup_root: PathBuf,
    /// Put workloads' cgroups under this path of the hierarchy (e.g. `flotilla`) instead of
    /// under the agent's own cgroup, so they do not share the agent pod's limits.
    #[arg(long)]
    pub cgroup_parent: Option<String>,
    /// PEM file with the certificate(s) that sign the shards' TLS certificates
    /// (default: DATA/ca.crt).
    #[arg(long)]
    pub ca: Option<PathBuf>,
    /// The agent's data dir: pid file, control socket, logs.
    #[arg(long, default_value = "./.flotilla-agent")]
    pub data: PathBuf,
    /// Serve /metrics here (default: a free loopback port, written to DATA/metrics.addr).
    #[arg(long)]
    pub metrics: Option<std::net::SocketAddr>,
    /// How often the agent heartbeats (`500ms`, `1s`, …).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// Deprecated spelling of --heartbeat-interval, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "heartbeat_interval")]
    pub heartbeat_interval_ms: Option<u64>,
    /// Ports handed to workloads (`FLOTILLA_PORT`), as FIRST-LAST.
    #[arg(long, default_value = "20000-29999")]
    pub port_range: String,
    /// The host other nodes reach this node's workloads at (default: this node's address
    /// on the interface that reaches its shard).
    #[arg(long, env = "FLOTILLA_ADVERTISE_HOST")]
    pub advertise_host: Option<String>,
    /// Between SIGTERM and SIGKILL when a workload is stopped.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub stop_grace: Duration,
    /// Deprecated spelling of --stop-grace, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "stop_grace")]
    pub stop_grace_ms: Option<u64>,
    /// After a drain is acknowledged, keep the workloads serving this long so routers
    /// take the node out of their tables before anything stops.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub drain_delay: Duration,
    /// Deprecated spelling of --drain-delay, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "drain_delay")]
    pub drain_delay_ms: Option<u64>,
    /// How often each workload's CPU and memory use is measured.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub usage_interval: Duration,
    /// Deprecated spelling of --usage-interval, in milliseconds.
    #[arg(long, hide = true, conflicts_with = "usage_interval")]
    pub usage_interval_ms: Option<u64>,
    /// Size at which a workload's stdout or stderr file is rotated, in bytes (one older
    /// file is kept: a stream takes at most twice this).
    #[arg(long, default_value_t = 16 << 20)]
    pub log_cap_bytes: u64,
    /// While this file exists the node reports a preemption notice, and schedulers move
    /// its members elsewhere before it is taken back. A spot/preemptible termination
    /// handler (or an operator) creates it.
    #[arg(long)]
    pub preemption_notice_file: Option<PathBuf>,
    /// FOR TESTS AND DEMOS: while this file exists, its `key=value,...` pairs
    /// (`cpu_steal`, `load_per_core`, `memory_pressure`, `cpu_utilisation`) replace what
    /// the probe measured, to degrade a node on purpose.
    #[arg(long)]
    pub test_health_file: Option<PathBuf>,
    #[command(flatten)]
    pub artifacts: crate::artifacts::ArtifactArgs,
}

/// Parses `1500ms`, `2s`, `1.5s`, `5m`, `1h30m`, `1d` (a bare number is seconds): the
/// one duration grammar (`flotilla_core::duration`) of every flag, file and policy.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    flotilla_core::duration::parse(s)
}

/// The value of a duration flag, or of its deprecated `-ms` spelling when that was
/// given (with a warning naming the new flag; the old one goes in the next release).
pub fn deprecated_ms(new: Duration, old_ms: Option<u64>, old_flag: &str, new_flag: &str) -> Duration {
    match old_ms {
        Some(ms) => {
            tracing::warn!("{old_flag} is deprecated and will be removed: use {new_flag} {ms}ms");
            Duration::from_millis(ms)
        }
        None => new,
    }
}

#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub aggregators: Vec<String>,
    /// `--advertise-host`; unset, the address toward the shard ([`crate::local_address_toward`]).
    pub advertise_host: Option<String>,
    pub node_id: NodeId,
    pub labels: Labels,
    pub capacity: Resources,
    pub join_token: String,
    /// Where `join_token` came from, read again at each registration (tokens rotate).
    pub join_token_file: Option<PathBuf>,
    pub ca: PathBuf,
    pub data_dir: PathBuf,
    pub metrics: Option<std::net::SocketAddr>,
    pub heartbeat_interval: Duration,
    pub drain_delay: Duration,
    pub preemption_notice_file: Option<PathBuf>,
    pub test_health_file: Option<PathBuf>,
    pub runtime: crate::runtime::RuntimeConfig,
    pub artifacts: crate::artifacts::ArtifactArgs,
    /// `--cordoned`: register as a warm pool node.
    pub cordoned: bool,
}

/// The newest token of a join-token file: its first non-blank line.
pub fn first_join_token(text: &str) -> Option<String> {
    text.lines().map(str::trim).find(|l| !l.is_empty()).map(str::to_string)
}

impl AgentConfig {
    /// The token to register with now: the first of the join-token file as it is
    /// now, else (no file, or it cannot be read) the one read at start.
    pub fn current_join_token(&self) -> String {
        self.join_token_file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|t| first_join_token(&t))
            .unwrap_or_else(|| self.join_token.clone())
    }
}

/// The prefix a label file's keys may carry to say they are meant for Flotilla.
pub const LABEL_PREFIX: &str = "flotilla.io/";

/// The labels in a downward-API style file: `key="value"` or `key=value` lines (blank
/// lines and `#` comments skipped). The prefix `flotilla.io/` is dropped from a key
/// (the pod label `flotilla.io/zone` gives `zone`); other keys are kept whole. A bad
/// line is an error naming its number.
pub fn parse_labels_file(text: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let n = i + 1;
        let (key, value) = line.split_once('=').ok_or_else(|| format!("line {n}: {line:?} is not key=\"value\""))?;
        let key = key.trim();
        let key = key.strip_prefix(LABEL_PREFIX).unwrap_or(key).to_string();
        if key.is_empty() {
            return Err(format!("line {n}: {line:?} has an empty key"));
        }
        let value = value.trim();
        let value = match value.strip_prefix('"') {
            Some(rest) => {
                let inner = rest.strip_suffix('"').ok_or_else(|| format!("line {n}: {line:?}: unterminated quote"))?;
                if inner.contains('"') || inner.contains('\\') {
                    return Err(format!("line {n}: {line:?}: escaped characters are not supported in a label"));
                }
                inner
            }
            None => value,
        };
        out.push((key, value.to_string()));
    }
    Ok(out)
}

/// What the machine looks like; injected so tests do not depend on the host.
pub struct Host {
    pub hostname: Option<String>,
    pub cores: u64,
    pub memory: Option<u64>,
    pub gpus: Option<(u32, String)>,
    pub env: Vec<(String, String)>,
    /// The node's labels as its orchestrator knows them (`--node-labels-from-kubernetes`).
    pub node_labels: Vec<(String, String)>,
}

impl Host {
    pub fn detect() -> Self {
        Host {
            hostname: std::fs::read_to_string("/proc/sys/kernel/hostname").ok().map(|s| s.trim().to_string()),
            cores: crate::probe::detect_cores(),
            memory: crate::probe::detect_memory(),
            gpus: crate::probe::detect_gpus(),
            env: std::env::vars().collect(),
            node_labels: Vec::new(),
        }
    }
}

impl AgentArgs {
    pub fn into_config(self, host: &Host) -> Result<AgentConfig, Vec<String>> {
        let mut errors = Vec::new();
        if self.aggregators.iter().any(|a| a.trim().is_empty()) || self.aggregators.is_empty() {
            errors.push("--aggregators: give at least one shard address host:port".to_string());
        }
        let node_id = match NodeId::new(self.node_id.as_deref().or(host.hostname.as_deref()).unwrap_or("")) {
            Ok(n) => Some(n),
            Err(e) => {
                errors.push(format!("--node-id: {e}"));
                None
            }
        };
        let mut map: BTreeMap<String, String> = host.node_labels.iter().cloned().collect();
        if let Some(file) = &self.labels_file {
            match std::fs::read_to_string(file).map_err(|e| e.to_string()).and_then(|t| parse_labels_file(&t)) {
                Ok(pairs) => map.extend(pairs),
                Err(e) => errors.push(format!("--labels-file {}: {e}", file.display())),
            }
        }
        for (k, v) in &host.env {
            if let Some(key) = k.strip_prefix("FLOTILLA_LABEL_") {
                map.insert(key.to_ascii_lowercase(), v.clone());
            } else if k == "FLOTILLA_LABELS" {
                for pair in v.split(',').filter(|p| !p.trim().is_empty()) {
                    match Labels::parse_pair(pair.trim()) {
                        Ok((k, v)) => {
                            map.insert(k, v);
                        }
                        Err(e) => errors.push(format!("FLOTILLA_LABELS: {e}")),
                    }
                }
            }
        }
        for l in &self.labels {
            match Labels::parse_pair(l) {
                Ok((k, v)) => {
                    map.insert(k, v);
                }
                Err(e) => errors.push(format!("--label: {e}")),
            }
        }
        if let Some(model) = &self.gpu_model {
            match map.get("gpu_model") {
                Some(other) if other != model && self.labels.iter().any(|l| l.starts_with("gpu_model=")) => {
                    errors.push(format!("--gpu-model {model:?} and --label gpu_model={other} disagree: give one"))
                }
                _ => {
                    map.insert("gpu_model".into(), model.clone());
                }
            }
        }
        let mut capacity = Resources::default();
        match self.cores {
            Some(c) if !(c.is_finite() && c > 0.0) => errors.push(format!("--cores: {c} is not a positive number")),
            Some(c) => capacity.cpu_millis = (c * 1000.0).round() as u64,
            None => capacity.cpu_millis = host.cores * 1000,
        }
        match self.memory.or(host.memory) {
            Some(m) => capacity.memory_bytes = m,
            None => errors.push("--memory: /proc/meminfo is unreadable; give the memory in bytes".into()),
        }
        // What the system and the agent keep is not offered (Kubernetes' allocatable).
        match flotilla_core::quantity::cpu_millis(&self.reserved_cpu) {
            Ok(r) if r >= capacity.cpu_millis && capacity.cpu_millis > 0 => errors.push(format!(
                "--reserved-cpu: {} leaves nothing of the {}m offered",
                self.reserved_cpu, capacity.cpu_millis
            )),
            Ok(r) => capacity.cpu_millis -= r.min(capacity.cpu_millis),
            Err(e) => errors.push(format!("--reserved-cpu: {e}")),
        }
        match flotilla_core::quantity::memory_bytes(&self.reserved_memory) {
            Ok(r) if r >= capacity.memory_bytes && capacity.memory_bytes > 0 => errors.push(format!(
                "--reserved-memory: {} leaves nothing of the {} bytes offered",
                self.reserved_memory, capacity.memory_bytes
            )),
            Ok(r) => capacity.memory_bytes -= r.min(capacity.memory_bytes),
            Err(e) => errors.push(format!("--reserved-memory: {e}")),
        }
        capacity.gpu = self.gpus.or(host.gpus.as_ref().map(|g| g.0)).unwrap_or(0);
        if let Some((_, model)) = &host.gpus
            && self.gpus.is_none()
        {
            map.entry("gpu_model".into()).or_insert_with(|| model.clone());
        }
        for r in &self.resources {
            match r.split_once('=').map(|(k, v)| (k, v.parse::<u64>())) {
                Some((k, Ok(q))) => {
                    capacity.custom.insert(k.to_string(), q);
                }
                _ => errors.push(format!("--resource: {r:?} is not NAME=QUANTITY")),
            }
        }
        if let Err(e) = capacity.validate_node_capacity() {
            errors.push(format!("capacity: {e}"));
        }
        let labels = match Labels::from_map(map) {
            Ok(l) => Some(l),
            Err(e) => {
                errors.push(format!("labels: {e}"));
                None
            }
        };
        let join_token = match (&self.join_token, &self.join_token_file) {
            (Some(t), _) => Some(t.trim().to_string()),
            (None, Some(f)) => match std::fs::read_to_string(f) {
                Ok(t) => {
                    let first = first_join_token(&t);
                    if first.is_none() {
                        errors.push(format!("--join-token-file {}: holds no token", f.display()));
                    }
                    first
                }
                Err(e) => {
                    errors.push(format!("--join-token-file {}: {e}", f.display()));
                    None
                }
            },
            (None, None) => {
                errors.push("--join-token or --join-token-file is required".into());
                None
            }
        };
        let heartbeat_interval = deprecated_ms(
            self.heartbeat_interval,
            self.heartbeat_interval_ms,
            "--heartbeat-interval-ms",
            "--heartbeat-interval",
        );
        let stop_grace = deprecated_ms(self.stop_grace, self.stop_grace_ms, "--stop-grace-ms", "--stop-grace");
        let drain_delay = deprecated_ms(self.drain_delay, self.drain_delay_ms, "--drain-delay-ms", "--drain-delay");
        let usage_interval =
            deprecated_ms(self.usage_interval, self.usage_interval_ms, "--usage-interval-ms", "--usage-interval");
        let ms = |d: Duration| d.as_millis();
        if !(100..=60_000).contains(&ms(heartbeat_interval)) {
            errors.push("--heartbeat-interval: must be within 100ms..=60s".into());
        }
        let ca = self.ca.clone().unwrap_or_else(|| self.data.join("ca.crt"));
        let ports =
            match self.port_range.split_once('-').map(|(a, b)| (a.trim().parse::<u16>(), b.trim().parse::<u16>())) {
                Some((Ok(a), Ok(b))) if a > 0 && a <= b => Some((a, b)),
                _ => {
                    errors
                        .push(format!("--port-range: {:?} is not FIRST-LAST with 0 < FIRST <= LAST", self.port_range));
                    None
                }
            };
        // The ports it hands out are a resource the planner counts (named ports); an
        // operator's own `--resource ports=N` wins.
        if let Some((a, b)) = ports
            && capacity.custom.len() < flotilla_core::MAX_CUSTOM_RESOURCES
        {
            capacity.custom.entry(flotilla_core::ports::PORTS_RESOURCE.to_string()).or_insert(u64::from(b - a) + 1);
        }
        // The artifact cache's cap is offered as a resource too (nothing asks for it: the
        // control plane reads it to refuse artifacts no cache could hold). A pool's node
        // type may give it as `--resource artifact-cache=N`: the same setting.
        let cache_key = flotilla_core::ARTIFACT_CACHE_RESOURCE;
        let artifact_cache = match (self.artifacts.artifact_cache, capacity.custom.get(cache_key).copied()) {
            (Some(flag), Some(resource)) if flag != resource => {
                errors
                    .push(format!("--artifact-cache {flag} and --resource {cache_key}={resource} disagree: give one"));
                flag
            }
            (flag, resource) => flag.or(resource).unwrap_or(flotilla_core::DEFAULT_ARTIFACT_CACHE),
        };
        if capacity.custom.len() < flotilla_core::MAX_CUSTOM_RESOURCES || capacity.custom.contains_key(cache_key) {
            capacity.custom.insert(cache_key.to_string(), artifact_cache);
        } else {
            tracing::warn!(
                "{} custom resources already: {cache_key} is not offered, so applies are not checked against this node's cache",
                flotilla_core::MAX_CUSTOM_RESOURCES
            );
        }
        if ms(drain_delay) > 600_000 {
            errors.push("--drain-delay: at most 10m".into());
        }
        if !(1..=3_600_000).contains(&ms(stop_grace)) {
            errors.push("--stop-grace: must be within 1ms..=1h".into());
        }
        if !(100..=600_000).contains(&ms(usage_interval)) {
            errors.push("--usage-interval: must be within 100ms..=10m".into());
        }
        if self.log_cap_bytes < 1024 {
            errors.push("--log-cap-bytes: at least 1024".into());
        }
        if self.advertise_host.as_ref().is_some_and(|h| h.is_empty() || h.len() > 253) {
            errors.push("--advertise-host: a host name or address".into());
        }
        errors.extend(self.artifacts.problems());
        match (errors.is_empty(), node_id, labels, join_token, ports) {
            (true, Some(node_id), Some(labels), Some(join_token), Some(ports)) => Ok(AgentConfig {
                runtime: crate::runtime::RuntimeConfig {
                    data_dir: self.data.clone(),
                    node_id: node_id.to_string(),
                    // Filled in by `run` once the shard's address is known.
                    advertise_host: String::new(),
                    ports,
                    stop_grace,
                    log_cap_bytes: self.log_cap_bytes,
                    cgroup_root: self.cgroup_root.clone(),
                    cgroup_parent: self.cgroup_parent.clone().filter(|p| !p.trim_matches('/').is_empty()),
                    usage_interval,
                },
                aggregators: self.aggregators,
                advertise_host: self.advertise_host,
                node_id,
                labels,
                capacity,
                join_token,
                join_token_file: if self.join_token.is_some() { None } else { self.join_token_file.clone() },
                ca,
                data_dir: self.data,
                metrics: self.metrics,
                heartbeat_interval,
                drain_delay,
                preemption_notice_file: self.preemption_notice_file,
                test_health_file: self.test_health_file,
                artifacts: crate::artifacts::ArtifactArgs { artifact_cache: Some(artifact_cache), ..self.artifacts },
                cordoned: self.cordoned,
            }),
            _ => Err(errors),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: AgentArgs,
    }

    fn host() -> Host {
        Host {
            hostname: Some("box-1".into()),
            cores: 8,
            memory: Some(16 << 30),
            gpus: None,
            env: vec![
                ("FLOTILLA_LABEL_ZONE".into(), "z1".into()),
                ("FLOTILLA_LABELS".into(), "domain=d1,team=ml".into()),
            ],
            node_labels: vec![("zone".into(), "from-node".into()), ("arch".into(), "arm64".into())],
        }
    }

    fn parse(args: &[&str]) -> Result<AgentConfig, Vec<String>> {
        let mut v = vec!["agent", "--aggregators", "127.0.0.1:1", "--join-token", "t"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).unwrap().a.into_config(&host())
    }

    #[test]
    fn defaults_come_from_the_host_and_flags_override() {
        let c = parse(&[]).unwrap();
        assert_eq!(c.node_id.as_str(), "box-1");
        assert_eq!(c.capacity.cpu_millis, 8000);
        assert_eq!(c.labels.get("zone"), Some("z1"));
        assert_eq!(c.labels.domain(), "d1");
        let c = parse(&[
            "--cores",
            "2.5",
            "--memory",
            "1000",
            "--gpus",
            "2",
            "--label",
            "domain=d2",
            "--resource",
            "tpu=4",
        ])
        .unwrap();
        assert_eq!(c.capacity.cpu_millis, 2500);
        assert_eq!(c.capacity.memory_bytes, 1000);
        assert_eq!(c.capacity.gpu, 2);
        assert_eq!(c.capacity.custom.get("tpu"), Some(&4));
        assert_eq!(c.labels.domain(), "d2");
        // The GPU model is a label specs select by, from its flag (the host reports none).
        assert_eq!(parse(&["--gpus", "1", "--gpu-model", "l4"]).unwrap().labels.get("gpu_model"), Some("l4"));
        let errors = parse(&["--gpu-model", "l4", "--label", "gpu_model=a100"]).unwrap_err();
        assert!(errors.iter().any(|e| e.contains("disagree")), "{errors:?}");
    }

    #[test]
    fn the_artifact_cache_cap_is_offered_as_a_resource_set_only_by_its_flag() {
        let offered = |c: AgentConfig| c.capacity.custom.get(flotilla_core::ARTIFACT_CACHE_RESOURCE).copied();
        assert_eq!(offered(parse(&[]).unwrap()), Some(flotilla_core::DEFAULT_ARTIFACT_CACHE));
        assert_eq!(offered(parse(&["--artifact-cache", "1Gi"]).unwrap()), Some(1 << 30));
        // A pool's node type passes it as a resource: the same setting, and the cache's cap.
        let c = parse(&["--resource", "artifact-cache=5000"]).unwrap();
        assert_eq!(c.artifacts.artifact_cache, Some(5000));
        assert_eq!(offered(c), Some(5000));
        let errors = parse(&["--resource", "artifact-cache=5", "--artifact-cache", "1Gi"]).unwrap_err();
        assert!(errors.iter().any(|e| e.contains("disagree: give one")), "{errors:?}");
    }

    #[test]
    fn a_join_token_file_gives_its_newest_token_and_is_read_again() {
        let dir = std::env::temp_dir().join(format!("flotilla-agent-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("join-token");
        std::fs::write(&file, "\n  new-token  \nold-token\n").unwrap();
        let v = ["agent", "--aggregators", "127.0.0.1:1", "--join-token-file", file.to_str().unwrap()];
        let c = Cli::try_parse_from(v).unwrap().a.into_config(&host()).unwrap();
        assert_eq!(c.join_token, "new-token");
        // Rotated once more while the agent runs: its next registration uses the newest.
        std::fs::write(&file, "newer\nnew-token\nold-token\n").unwrap();
        assert_eq!(c.current_join_token(), "newer");
        // An unreadable file keeps the token it had.
        std::fs::remove_file(&file).unwrap();
        assert_eq!(c.current_join_token(), "new-token");
        std::fs::write(&file, " \n\n").unwrap();
        let errs = Cli::try_parse_from(v).unwrap().a.into_config(&host()).unwrap_err();
        assert!(errs.iter().any(|e| e.contains("holds no token")), "{errs:?}");
        // A token given on the command line is the one, always.
        assert_eq!(parse(&[]).unwrap().current_join_token(), "t");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn reserved_resources_are_not_offered() {
        let c = parse(&["--reserved-cpu", "500m", "--reserved-memory", "1Gi"]).unwrap();
        assert_eq!(c.capacity.cpu_millis, 7500);
        assert_eq!(c.capacity.memory_bytes, 15 << 30);
        let c =
            parse(&["--cores", "4", "--memory", "2000000000", "--reserved-cpu", "1.5", "--reserved-memory", "500M"])
                .unwrap();
        assert_eq!((c.capacity.cpu_millis, c.capacity.memory_bytes), (2500, 1_500_000_000));
        let errs = parse(&["--reserved-cpu", "8", "--reserved-memory", "lots"]).unwrap_err();
        assert!(errs.iter().any(|e| e.contains("--reserved-cpu") && e.contains("leaves nothing")), "{errs:?}");
        assert!(errs.iter().any(|e| e.contains("--reserved-memory") && e.contains("\"lots\"")), "{errs:?}");
        assert_eq!(flotilla_core::quantity::memory_bytes("512Mi"), Ok(512 << 20));
        assert_eq!(flotilla_core::quantity::memory_bytes("1k"), Ok(1000));
        assert!(flotilla_core::quantity::memory_bytes("1Xi").is_err(), "the spec's Kubernetes grammar");
        assert_eq!(flotilla_core::quantity::cpu_millis("250m"), Ok(250));
        assert!(flotilla_core::quantity::cpu_millis("-1").is_err());
    }

    #[test]
    fn a_labels_file_as_the_downward_api_writes_it() {
        let text = "app=\"flotilla-agent\"\nflotilla.io/zone=\"eu-west-1a\"\n\n# a comment\napp.kubernetes.io/tier=gold\nempty=\"\"\n";
        assert_eq!(
            parse_labels_file(text).unwrap(),
            vec![
                ("app".to_string(), "flotilla-agent".to_string()),
                ("zone".to_string(), "eu-west-1a".to_string()),
                ("app.kubernetes.io/tier".to_string(), "gold".to_string()),
                ("empty".to_string(), String::new()),
            ]
        );
        let e = parse_labels_file("ok=\"1\"\nno equals sign\n").unwrap_err();
        assert!(e.starts_with("line 2:") && e.contains("not key="), "{e}");
        assert!(parse_labels_file("a=\"open\n").unwrap_err().contains("unterminated quote"));
        assert!(parse_labels_file("=\"v\"\n").unwrap_err().contains("empty key"));
        assert!(parse_labels_file("a=\"x\\\"y\"\n").unwrap_err().contains("escaped"));
        // Read by the agent, below what flags and variables say.
        let dir = std::env::temp_dir().join(format!("flotilla-agent-labels-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("labels");
        std::fs::write(&file, "zone=\"from-file\"\nrack=\"r7\"\n").unwrap();
        let c = parse(&["--labels-file", file.to_str().unwrap()]).unwrap();
        assert_eq!(c.labels.get("rack"), Some("r7"));
        assert_eq!(c.labels.get("arch"), Some("arm64"), "the node's own labels are below the rest");
        assert_eq!(c.labels.get("zone"), Some("z1"), "FLOTILLA_LABEL_ZONE wins over the file");
        std::fs::write(&file, "rack r7\n").unwrap();
        let errs = parse(&["--labels-file", file.to_str().unwrap()]).unwrap_err();
        assert!(errs.iter().any(|e| e.contains("--labels-file") && e.contains("line 1")), "{errs:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn durations_are_flags_like_2s_and_the_old_ms_spellings_still_work() {
        let c = parse(&["--heartbeat-interval", "500ms", "--stop-grace", "2s", "--usage-interval", "1.5s"]).unwrap();
        assert_eq!(c.heartbeat_interval, Duration::from_millis(500));
        assert_eq!(c.runtime.stop_grace, Duration::from_secs(2));
        assert_eq!(c.runtime.usage_interval, Duration::from_millis(1500));
        assert_eq!(c.drain_delay, Duration::from_secs(1), "the default");
        let c = parse(&["--heartbeat-interval-ms", "250", "--drain-delay-ms", "0", "--stop-grace-ms", "2000"]).unwrap();
        assert_eq!(c.heartbeat_interval, Duration::from_millis(250));
        assert_eq!(c.drain_delay, Duration::ZERO);
        assert_eq!(c.runtime.stop_grace, Duration::from_secs(2));
        // Both spellings at once is a mistake clap names.
        let both = ["agent", "--aggregators", "a:1", "--stop-grace", "1s", "--stop-grace-ms", "5"];
        assert!(Cli::try_parse_from(both).is_err());
        let errs = parse(&["--heartbeat-interval", "10ms", "--usage-interval", "1h"]).unwrap_err();
        assert!(errs.iter().any(|e| e.starts_with("--heartbeat-interval:")), "{errs:?}");
        assert!(errs.iter().any(|e| e.starts_with("--usage-interval:")), "{errs:?}");
        assert_eq!(parse_duration("1500ms"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_duration("2 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("x").is_err());
        // The grammar of policies too (issue #35 item 8).
        assert_eq!(parse_duration("1d"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
    }

    #[test]
    fn every_error_is_reported_at_once() {
        let errs = parse(&["--node-id", "bad id", "--cores=-1", "--label", "nokv", "--resource", "x"]).unwrap_err();
        assert_eq!(errs.len(), 4, "{errs:?}");
        assert!(errs.iter().any(|e| e.contains("--node-id")));
        assert!(errs.iter().any(|e| e.contains("--cores")));
        assert!(errs.iter().any(|e| e.contains("--label")));
        assert!(errs.iter().any(|e| e.contains("--resource")));
    }
}

/// `flotilla agent …` / `flotilla-agent …`: run the agent, or `drain` the running one.
#[derive(Debug, Clone, clap::Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct AgentCommand {
    #[command(subcommand)]
    pub sub: Option<AgentSub>,
    #[command(flatten)]
    pub run: AgentArgs,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum AgentSub {
    /// The Kubernetes PreStop hook: the agent with this data dir deregisters and exits.
    Drain {
        #[arg(long, default_value = "./.flotilla-agent")]
        data: std::path::PathBuf,
    },
}
