//! The pool file (TOML): node types and the knobs of Ray autoscaler v2, parsed and
//! checked in one place. `examples/pool.toml` is the documented example.

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_autoscale::{AutoscalingConfig, Span};
use flotilla_core::Resources;
use flotilla_core::quantity;
use serde::Deserialize;

use crate::instance::Timeouts;
use crate::model::PoolPolicy;
use crate::pack::{Labels, NodeType};
use crate::shape::{ResourceNames, Shape};

const MAX_POOL_BYTES: usize = 256 * 1024;
const MAX_NODE_TYPES: usize = 64;
/// More nodes than this in one pool is a typo, not a cluster.
pub const MAX_POOL_NODES: u32 = 100_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    #[serde(default = "default_name")]
    name: String,
    #[serde(default)]
    max_nodes: Option<u32>,
    #[serde(default = "default_speed")]
    upscaling_speed: f64,
    #[serde(default = "default_launches")]
    max_concurrent_launches: u32,
    #[serde(default = "default_interval")]
    interval: Span,
    /// For node types without their own.
    #[serde(default)]
    idle_timeout: Option<Span>,
    #[serde(default)]
    timeouts: RawTimeouts,
    #[serde(default)]
    provider: ProviderConfig,
    #[serde(default)]
    node_types: BTreeMap<String, RawNodeType>,
    /// A Dataproc/MR3 policy sizing two types by load instead of demand packing.
    #[serde(default)]
    policy: Option<RawPolicy>,
    #[serde(default)]
    consolidation: RawConsolidation,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConsolidation {
    enabled: Option<bool>,
    after: Option<Span>,
    deadline: Option<Span>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    /// The high-priority type (Dataproc's primary workers).
    primary: String,
    /// The low-priority type (its secondary, preemptible workers).
    secondary: Option<String>,
    /// The same table as an app spec's `[autoscaling]`.
    autoscaling: AutoscalingConfig,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTimeouts {
    request: Option<Span>,
    agent_start: Option<Span>,
    drain: Option<Span>,
    terminate: Option<Span>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNodeType {
    cpu: Quantity,
    memory: Quantity,
    #[serde(default)]
    gpu: u32,
    #[serde(default)]
    custom: BTreeMap<String, u64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    min: u32,
    max: u32,
    cost: Option<f64>,
    idle_timeout: Option<Span>,
    #[serde(default)]
    warm: u32,
}

/// `cpu = 4` or `cpu = "500m"`; `memory = "8Gi"` or bytes.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Quantity {
    Number(f64),
    Text(String),
}

impl Quantity {
    fn text(&self) -> String {
        match self {
            Quantity::Number(n) => n.to_string(),
            Quantity::Text(s) => s.clone(),
        }
    }
}

fn default_name() -> String {
    "default".into()
}
fn default_speed() -> f64 {
    1.0
}
fn default_launches() -> u32 {
    10
}
fn default_interval() -> Span {
    Span::secs(5)
}

/// Where instances come from.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ProviderConfig {
    /// Agent processes on this machine. `boot_delay` plays a cloud VM's boot: each
    /// agent starts that long after its launch (listed, not yet registered), for
    /// measuring what warm pools save.
    Local {
        #[serde(default)]
        boot_delay: Option<Span>,
    },
    /// User commands (see docs/exec-provider.md).
    Exec {
        launch: Vec<String>,
        terminate: Vec<String>,
        list: Vec<String>,
        #[serde(default = "default_exec_timeout")]
        timeout: Span,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig::Local { boot_delay: None }
    }
}

fn default_exec_timeout() -> Span {
    Span::secs(30)
}

/// A node type as the pool launches it.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolNodeType {
    pub name: String,
    pub resources: Resources,
    pub labels: Labels,
    pub min: u32,
    pub max: u32,
    pub cost: Option<f64>,
    pub idle_timeout: Option<Duration>,
    /// Instances kept launched, registered and holding nothing (cordoned, so no app
    /// places on them) beyond what demand needs: the pool takes them first on scale-up
    /// (an uncordon, not a boot) and launches their replacements.
    pub warm: u32,
}

/// `[consolidation]` of the pool file (`crate::consolidate`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ConsolidationConfig {
    pub enabled: bool,
    /// How long the pool must have been still before it consolidates: a pool that just
    /// grew is not shrunk while the burst may come back.
    pub after: Duration,
    /// How long a node may take to empty; past it the pool uncordons it and leaves it
    /// alone for a while (its members could not move: a spread limit, a selector).
    pub deadline: Duration,
}

impl Default for ConsolidationConfig {
    fn default() -> Self {
        ConsolidationConfig { enabled: true, after: Duration::from_secs(60), deadline: Duration::from_secs(900) }
    }
}

/// A checked pool file.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    pub node_types: Vec<PoolNodeType>,
    pub max_nodes: Option<u32>,
    pub upscaling_speed: f64,
    pub max_concurrent_launches: u32,
    pub interval: Duration,
    pub timeouts: Timeouts,
    pub provider: ProviderConfig,
    pub policy: Option<PoolPolicy>,
    /// Emptying nodes whose members fit elsewhere (`crate::consolidate`).
    pub consolidation: ConsolidationConfig,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid pool file:\n  - {}", .0.join("\n  - "))]
pub struct PoolError(pub Vec<String>);

impl PoolConfig {
    pub fn parse(text: &str) -> Result<PoolConfig, PoolError> {
        let one = |m: String| PoolError(vec![m]);
        if text.len() > MAX_POOL_BYTES {
            return Err(one(format!("{} bytes, at most {MAX_POOL_BYTES}", text.len())));
        }
        let raw: RawPool = toml::from_str(text).map_err(|e| one(e.to_string()))?;
        let mut errors = Vec::new();
        let name_ok = |n: &str| {
            !n.is_empty() && n.len() <= 63 && n.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        };
        if !name_ok(&raw.name) {
            errors.push(format!("name: {:?} must be 1 to 63 letters, digits, '-' or '_'", raw.name));
        }
        if raw.node_types.is_empty() {
            errors.push("node_types: at least one node type is needed".into());
        }
        if raw.node_types.len() > MAX_NODE_TYPES {
            errors.push(format!("node_types: {} types, at most {MAX_NODE_TYPES}", raw.node_types.len()));
        }
        if !(raw.upscaling_speed.is_finite() && (0.0..=1000.0).contains(&raw.upscaling_speed)) {
            errors.push(format!("upscaling_speed: {} is not within 0..=1000", raw.upscaling_speed));
        }
        if !(1..=1000).contains(&raw.max_concurrent_launches) {
            errors.push(format!("max_concurrent_launches: {} is not within 1..=1000", raw.max_concurrent_launches));
        }
        if !(1..=3600).contains(&raw.interval.as_secs()) {
            errors.push(format!("interval: {} is not within 1s..=1h", raw.interval));
        }
        if let Some(m) = raw.max_nodes
            && m > MAX_POOL_NODES
        {
            errors.push(format!("max_nodes: {m} is more than {MAX_POOL_NODES}"));
        }
        let mut node_types = Vec::new();
        let mut min_sum = 0u64;
        for (name, t) in &raw.node_types {
            let path = format!("node_types.{name}");
            if !name_ok(name) {
                errors.push(format!("{path}: the name must be 1 to 63 letters, digits, '-' or '_'"));
            }
            let cpu = quantity::cpu_millis(&t.cpu.text()).map_err(|e| format!("{path}.cpu: {e}"));
            let memory = quantity::memory_bytes(&t.memory.text()).map_err(|e| format!("{path}.memory: {e}"));
            let (cpu, memory) = match (cpu, memory) {
                (Ok(c), Ok(m)) => (c, m),
                (c, m) => {
                    errors.extend(c.err().into_iter().chain(m.err()));
                    continue;
                }
            };
            let mut resources = Resources::new(cpu, memory, t.gpu);
            resources.custom = t.custom.clone();
            // Ports alone hold nothing: checked before the default range is added.
            if resources.is_zero() || cpu == 0 || memory == 0 {
                errors.push(format!("{path}: a node type needs some cpu and memory (its agents run members)"));
            }
            // Its agents offer their port range as a resource (members with named ports
            // ask for it): the default range, unless the type says.
            resources
                .custom
                .entry(flotilla_core::ports::PORTS_RESOURCE.to_string())
                .or_insert(flotilla_core::ports::DEFAULT_PORTS_OFFERED);
            // And their artifact cache's cap (the agent's default, unless the type says),
            // so an app whose artifacts no node could hold is refused when it is applied.
            // Never asked for, so it takes no part in packing (`Shape::from_resources`).
            if resources.custom.len() < flotilla_core::MAX_CUSTOM_RESOURCES {
                resources
                    .custom
                    .entry(flotilla_core::ARTIFACT_CACHE_RESOURCE.to_string())
                    .or_insert(flotilla_core::DEFAULT_ARTIFACT_CACHE);
            }
            if let Err(e) = resources.validate_node_capacity() {
                errors.push(format!("{path}: {e}"));
            }
            if t.min > t.max {
                errors.push(format!("{path}: min {} > max {}", t.min, t.max));
            }
            if t.warm > t.max {
                errors.push(format!("{path}.warm: {} is more than max {}", t.warm, t.max));
            }
            if t.max > MAX_POOL_NODES {
                errors.push(format!("{path}.max: {} is more than {MAX_POOL_NODES}", t.max));
            }
            if let Some(c) = t.cost
                && !(c.is_finite() && c >= 0.0)
            {
                errors.push(format!("{path}.cost: {c} is not a non-negative price per hour"));
            }
            match t.labels.get("priority").map(String::as_str) {
                None | Some("high") | Some("low") => {}
                Some(p) => errors.push(format!("{path}.labels.priority: {p:?} must be \"high\" or \"low\"")),
            }
            if let Err(e) = flotilla_core::Labels::from_map(t.labels.clone()) {
                errors.push(format!("{path}.labels: {e}"));
            }
            min_sum += u64::from(t.min);
            node_types.push(PoolNodeType {
                name: name.clone(),
                resources,
                labels: t.labels.clone(),
                min: t.min,
                max: t.max,
                cost: t.cost,
                idle_timeout: t.idle_timeout.or(raw.idle_timeout).map(|s| Duration::from_secs(s.as_secs())),
                warm: t.warm,
            });
        }
        if let Some(m) = raw.max_nodes
            && min_sum > u64::from(m)
        {
            errors.push(format!("the node types' min add up to {min_sum}, more than max_nodes {m}"));
        }
        let policy = raw.policy.and_then(|p| {
            let priority = |t: &str| raw.node_types.get(t).and_then(|t| t.labels.get("priority")).map(String::as_str);
            for (group, t, want) in [("primary", Some(&p.primary), "high"), ("secondary", p.secondary.as_ref(), "low")]
            {
                let Some(t) = t else { continue };
                if !raw.node_types.contains_key(t) {
                    errors.push(format!("policy.{group}: no node type {t:?}"));
                } else if priority(t).unwrap_or("high") != want {
                    errors.push(format!("policy.{group}: node type {t:?} must have priority = {want:?}"));
                }
            }
            match p.autoscaling.validate() {
                Ok(policy) => Some(PoolPolicy { primary: p.primary, secondary: p.secondary, policy }),
                Err(problems) => {
                    errors.extend(problems.0.iter().map(|e| format!("policy.autoscaling: {e}")));
                    None
                }
            }
        });
        if let ProviderConfig::Exec { launch, terminate, list, timeout, .. } = &raw.provider {
            for (op, cmd) in [("launch", launch), ("terminate", terminate), ("list", list)] {
                if cmd.is_empty() || cmd[0].trim().is_empty() {
                    errors.push(format!("provider.{op}: a command is needed"));
                }
            }
            if !(1..=3600).contains(&timeout.as_secs()) {
                errors.push(format!("provider.timeout: {timeout} is not within 1s..=1h"));
            }
        }
        if let ProviderConfig::Local { boot_delay: Some(b) } = &raw.provider
            && b.as_secs() > 3600
        {
            errors.push(format!("provider.boot_delay: {b} is more than 1h"));
        }
        let ms = |s: Option<Span>, default: u64| s.map(Span::as_ms).unwrap_or(default);
        let d = Timeouts::default();
        let timeouts = Timeouts {
            request_ms: ms(raw.timeouts.request, d.request_ms),
            agent_start_ms: ms(raw.timeouts.agent_start, d.agent_start_ms),
            drain_ms: ms(raw.timeouts.drain, d.drain_ms),
            terminate_ms: ms(raw.timeouts.terminate, d.terminate_ms),
            ..d
        };
        let dc = ConsolidationConfig::default();
        let c = &raw.consolidation;
        let consolidation = ConsolidationConfig {
            enabled: c.enabled.unwrap_or(dc.enabled),
            after: c.after.map_or(dc.after, |s| Duration::from_secs(s.as_secs())),
            deadline: c.deadline.map_or(dc.deadline, |s| Duration::from_secs(s.as_secs())),
        };
        if consolidation.after > Duration::from_secs(86_400) {
            errors.push(format!("consolidation.after: {}s is more than a day", consolidation.after.as_secs()));
        }
        if !(10..=86_400).contains(&consolidation.deadline.as_secs()) {
            errors
                .push(format!("consolidation.deadline: {}s is not within 10s..=1d", consolidation.deadline.as_secs()));
        }
        if !errors.is_empty() {
            return Err(PoolError(errors));
        }
        Ok(PoolConfig {
            name: raw.name,
            node_types,
            max_nodes: raw.max_nodes,
            upscaling_speed: raw.upscaling_speed,
            max_concurrent_launches: raw.max_concurrent_launches,
            interval: Duration::from_secs(raw.interval.as_secs()),
            timeouts,
            provider: raw.provider,
            policy,
            consolidation,
        })
    }

    pub fn node_type(&self, name: &str) -> Option<&PoolNodeType> {
        self.node_types.iter().find(|t| t.name == name)
    }

    /// The node types as the packer sees them.
    pub fn pack_types(&self, names: &mut ResourceNames) -> Vec<NodeType> {
        self.node_types
            .iter()
            .map(|t| NodeType {
                name: t.name.clone(),
                // Names are bounded by the capacity check (16 custom at most).
                resources: Shape::from_resources(&t.resources, names).unwrap_or_default(),
                labels: t.labels.clone(),
                min: t.min,
                max: t.max,
                cost: t.cost,
                idle_timeout_ms: t.idle_timeout.map(|d| d.as_millis() as u64),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_example_pool_is_valid() {
        let p = PoolConfig::parse(include_str!("../../../examples/pool.toml")).unwrap_or_else(|e| panic!("{e}"));
        assert!(!p.node_types.is_empty());
        assert!(p.node_types.iter().any(|t| t.labels.get("priority").map(String::as_str) == Some("low")));
        assert_eq!(p.interval, Duration::from_secs(5));
    }

    #[test]
    fn the_commented_policy_of_the_example_is_valid() {
        let text = include_str!("../../../examples/pool.toml");
        let (head, tail) = text.split_once("# Instead of packing demand").expect("the policy example");
        let tail: Vec<&str> = tail.lines().map(|l| l.strip_prefix("#   ").unwrap_or(l)).collect();
        let uncommented = format!("{head}\n{}", tail[1..].join("\n"));
        let p = PoolConfig::parse(&uncommented).unwrap_or_else(|e| panic!("{e}"));
        let policy = p.policy.expect("a policy");
        assert_eq!((policy.primary.as_str(), policy.secondary.as_deref()), ("cpu-a", Some("spot-a")));
    }

    #[test]
    fn bad_pools_are_refused_with_every_problem_named() {
        let e = PoolConfig::parse(
            r#"
            upscaling_speed = -1
            max_nodes = 2
            [node_types.a]
            cpu = "-4"
            memory = "8Gi"
            max = 1
            [node_types.b]
            cpu = 4
            memory = "1Ei"
            max = 1
            [node_types.c]
            cpu = 4
            memory = "8Gi"
            min = 3
            max = 2
            labels = { priority = "medium" }
            "#,
        )
        .unwrap_err()
        .to_string();
        for want in ["upscaling_speed", "node_types.a.cpu", "node_types.b.memory", "min 3 > max 2", "priority"] {
            assert!(e.contains(want), "{want} missing from {e}");
        }
        assert!(PoolConfig::parse("[node_types.a]\ncpu = 1\nmemory = 1\nmax = 1\nsurprise = 1").is_err());
        assert!(PoolConfig::parse("").unwrap_err().to_string().contains("at least one node type"));
        let e = PoolConfig::parse("[provider]\nkind = \"exec\"\nlaunch = []\nterminate = [\"x\"]\nlist = [\"y\"]\n[node_types.a]\ncpu = 1\nmemory = 1\nmax = 1").unwrap_err();
        assert!(e.to_string().contains("provider.launch"), "{e}");
        // Issue #35 item 6: a type of no cpu or memory is refused at start (the ports its
        // agents offer by default are no capacity).
        for zero in ["cpu = 0\nmemory = 0", "cpu = 0\nmemory = \"1Gi\"", "cpu = 2\nmemory = 0"] {
            let e = PoolConfig::parse(&format!("[node_types.z]\n{zero}\nmax = 1")).unwrap_err().to_string();
            assert!(e.contains("node_types.z: a node type needs some cpu and memory"), "{zero}: {e}");
        }
    }
}
