//! One member template (the head, the worker group, a `[unit.groups.NAME]`), its node
//! selector and its alternatives, validated field by field.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use flotilla_core::quantity::{cpu_millis, memory_bytes};
use flotilla_core::{MAX_WORKERS, MemberOption, NodeSelector, Resources, is_name};
use serde::{Deserialize, Serialize};

use super::{ArtifactSpec, MAX_ARGS, MAX_ARTIFACTS, MAX_ENV, MAX_WORKLOAD_BYTES};

/// Alternatives per member at most.
pub const MAX_ALTERNATIVES: usize = 8;
/// `node_labels` keys per member, and values per key, at most.
const MAX_NODE_LABELS: usize = 16;
const MAX_LABEL_VALUES: usize = 32;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MemberTemplate {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// CPU as cores ("0.5", "2") or millicores ("500m").
    pub cpu: String,
    /// Memory with a binary or decimal suffix ("256Mi", "1Gi", "500M") or bytes.
    pub memory: String,
    #[serde(default)]
    pub gpu: u32,
    /// Does this member serve HTTP (and so appear in routes)?
    #[serde(default)]
    pub serves_http: bool,
    /// HTTP path that answers 2xx when the member is ready.
    pub readiness_path: Option<String>,
    /// `always` (the default), `on-failure` or `never`.
    #[serde(default)]
    pub restart: Option<String>,
    /// Named ports the agent assigns from its range, each passed as
    /// `FLOTILLA_PORT_<NAME>` (upper-cased, `-` as `_`): a Ray node needs several, and
    /// several share a host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ports: Vec<String>,
    /// Named blocks of contiguous ports by size (`worker_ports = 100`), passed as
    /// `FLOTILLA_PORT_<NAME>_MIN` and `FLOTILLA_PORT_<NAME>_MAX` (inclusive).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub port_ranges: BTreeMap<String, u32>,
    /// Start order: the member this one starts after (only `"head"`, on workers). It is
    /// held back until that member is running, then started with the head's address and
    /// ports (`FLOTILLA_HEAD_ADDR`, `FLOTILLA_HEAD_PORT_<NAME>`) wherever the head runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// Files fetched (peer to peer) into the member's working directory before it starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<ArtifactSpec>,
    /// Labels a node must carry to run this member, beyond the app's
    /// `constraints.labels`: every key, with its value or one of a list of values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, LabelValue>,
    /// May this member run on `priority=low` nodes? Unset: as the app's
    /// `constraints.allow_low_priority` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_low_priority: Option<bool>,
    /// Members in the group (`[unit.groups.NAME]` only; the `[unit.worker]` group's is
    /// `unit.workers`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
    /// How much work this member does relative to its alternatives' builds (route
    /// weights and the capacity estimate scale with it; the planner tries the highest
    /// first). Unset: 1, and the routes use `routing.performance`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performance: Option<f64>,
    /// Other ways to run the member (another GPU type's build of the same model): tried
    /// in order when the template itself fits no node, or by `performance`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub alternatives: Vec<Alternative>,
}

/// A `node_labels` value: one value, or a list meaning any of them. Anything else is
/// kept as it came so validation can name it with every other problem.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LabelValue {
    One(String),
    Any(Vec<String>),
    Invalid(toml::Value),
}

impl LabelValue {
    fn values(&self) -> BTreeSet<String> {
        match self {
            LabelValue::One(v) => BTreeSet::from([v.clone()]),
            LabelValue::Any(vs) => vs.iter().cloned().collect(),
            LabelValue::Invalid(_) => BTreeSet::new(),
        }
    }
}

/// Another way to run a member: what it changes of the template. Its `node_labels`
/// replace the template's; its `env` is laid over the template's; the rest replace.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Alternative {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_labels: Option<BTreeMap<String, LabelValue>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub performance: Option<f64>,
}

impl Alternative {
    fn changes_something(&self) -> bool {
        self.node_labels.is_some()
            || self.args.is_some()
            || !self.env.is_empty()
            || self.cpu.is_some()
            || self.memory.is_some()
            || self.gpu.is_some()
    }
}

impl MemberTemplate {
    /// What the member asks of a node: CPU, memory, GPUs and, with named ports, the
    /// ports it holds (the `ports` custom resource every agent offers), so a node whose
    /// agent has too few left is not chosen.
    pub fn resources(&self) -> Resources {
        let mut r =
            Resources::new(cpu_millis(&self.cpu).unwrap_or(0), memory_bytes(&self.memory).unwrap_or(0), self.gpu);
        let ports = flotilla_core::ports::ports_needed(self.ports.len(), self.port_ranges.values());
        if ports > 0 {
            r.custom.insert(flotilla_core::ports::PORTS_RESOURCE.to_string(), ports);
        }
        r
    }

    pub(super) fn validate(&self, path: &str, errors: &mut Vec<String>) {
        if self.command.trim().is_empty() {
            errors.push(format!("{path}.command: must not be empty"));
        }
        check_cpu(path, &self.cpu, errors);
        check_gpu(path, self.gpu, errors);
        check_memory(path, &self.memory, errors);
        check_workload(path, self, errors);
        check_node_labels(&format!("{path}.node_labels"), &self.node_labels, errors);
        check_performance(path, self.performance, errors);
        if self.alternatives.len() > MAX_ALTERNATIVES {
            errors.push(format!("{path}.alternatives: at most {MAX_ALTERNATIVES}"));
        }
        for (i, a) in self.alternatives.iter().enumerate().take(MAX_ALTERNATIVES) {
            let at = format!("{path}.alternatives[{i}]");
            if !a.changes_something() {
                errors.push(format!(
                    "{at}: changes nothing of the template (give node_labels, args, env, cpu, memory or gpu)"
                ));
            }
            if let Some(cpu) = &a.cpu {
                check_cpu(&at, cpu, errors);
            }
            if let Some(gpu) = a.gpu {
                check_gpu(&at, gpu, errors);
            }
            if let Some(memory) = &a.memory {
                check_memory(&at, memory, errors);
            }
            if let Some(labels) = &a.node_labels {
                check_node_labels(&format!("{at}.node_labels"), labels, errors);
            }
            check_performance(&at, a.performance, errors);
            if a.args.is_some() || !a.env.is_empty() {
                check_workload(&at, &self.alternative(i as u32 + 1), errors);
            }
        }
        if let Some(p) = &self.readiness_path
            && !p.starts_with('/')
        {
            errors.push(format!("{path}.readiness_path: must start with '/'"));
        }
        if let Some(r) = &self.restart
            && !matches!(r.as_str(), "always" | "on-failure" | "never")
        {
            errors.push(format!("{path}.restart: {r:?} is not always, on-failure or never"));
        }
        if self.artifacts.len() > MAX_ARTIFACTS {
            errors.push(format!("{path}.artifacts: at most {MAX_ARTIFACTS}"));
        }
        let mut dests = std::collections::BTreeSet::new();
        for (i, a) in self.artifacts.iter().enumerate() {
            a.validate(&format!("{path}.artifacts[{i}]"), errors);
            if !dests.insert(a.dest.trim_end_matches('/')) {
                errors.push(format!("{path}.artifacts[{i}].dest: {:?} is another artifact's dest too", a.dest));
            }
        }
        for problem in flotilla_core::ports::port_problems(&self.ports, &self.port_ranges) {
            let field = if self.port_ranges.keys().any(|k| problem.starts_with(&format!("{k:?}"))) {
                "port_ranges"
            } else {
                "ports"
            };
            errors.push(format!("{path}.{field}: {problem}"));
        }
    }

    /// The template as alternative `k` runs it: 0 is the template itself, `k` its
    /// `alternatives[k - 1]` laid over it (an index past the list is the template).
    pub fn alternative(&self, k: u32) -> Cow<'_, MemberTemplate> {
        let Some(a) = (k as usize).checked_sub(1).and_then(|i| self.alternatives.get(i)) else {
            return Cow::Borrowed(self);
        };
        let mut t = self.clone();
        t.alternatives.clear();
        if let Some(labels) = &a.node_labels {
            t.node_labels = labels.clone();
        }
        if let Some(args) = &a.args {
            t.args = args.clone();
        }
        t.env.extend(a.env.clone());
        if let Some(cpu) = &a.cpu {
            t.cpu = cpu.clone();
        }
        if let Some(memory) = &a.memory {
            t.memory = memory.clone();
        }
        if let Some(gpu) = a.gpu {
            t.gpu = gpu;
        }
        t.performance = a.performance;
        Cow::Owned(t)
    }

    /// The alternatives in the order placement tries them: the template and then its
    /// alternatives as listed, or, when any of them gives a `performance`, the highest
    /// first (unset counts as 1).
    pub fn alternative_order(&self) -> Vec<u32> {
        let mut order: Vec<u32> = (0..=self.alternatives.len() as u32).collect();
        // As `alternative(k).performance`, without building the merged template.
        let perf = |k: u32| match (k as usize).checked_sub(1) {
            None => self.performance,
            Some(i) => self.alternatives.get(i).and_then(|a| a.performance),
        };
        if order.iter().any(|k| perf(*k).is_some()) {
            order.sort_by(|a, b| perf(*b).unwrap_or(1.0).total_cmp(&perf(*a).unwrap_or(1.0)));
        }
        order
    }

    /// Where this member may run, with the app's `labels` (exact) and low-priority
    /// setting: a key in both keeps the values both allow.
    pub fn selector(&self, app_labels: &BTreeMap<String, String>, app_low_priority: bool) -> NodeSelector {
        let mut s = NodeSelector::exact(app_labels, self.allow_low_priority.unwrap_or(app_low_priority));
        for (k, v) in &self.node_labels {
            let values = v.values();
            s.labels.entry(k.clone()).and_modify(|have| have.retain(|x| values.contains(x))).or_insert(values);
        }
        s
    }

    /// Each way to run the member, with its alternative's index, in the order to try.
    pub fn options(&self, app_labels: &BTreeMap<String, String>, app_low_priority: bool) -> Vec<(u32, MemberOption)> {
        self.alternative_order()
            .into_iter()
            .map(|k| {
                let t = self.alternative(k);
                (k, MemberOption { resources: t.resources(), selector: t.selector(app_labels, app_low_priority) })
            })
            .collect()
    }
}

impl super::AppSpec {
    /// The templates and their groups: each valid, sized, named, and able to run
    /// somewhere the app's labels allow.
    pub(super) fn validate_members(&self, e: &mut Vec<String>) {
        let u = &self.unit;
        if u.workers > MAX_WORKERS {
            e.push(format!("unit.workers: {} (at most {MAX_WORKERS})", u.workers));
        }
        if u.workers > 0 && u.worker.is_none() {
            e.push("unit.worker: required when unit.workers > 0".into());
        }
        for (role, path, t) in self.templates() {
            t.validate(&path, e);
            match (role, t.count) {
                ("head", Some(_)) => e.push("unit.head.count: a unit has one head (only a group has a count)".into()),
                ("worker", Some(_)) if path == "unit.worker" => {
                    e.push("unit.worker.count: the worker group's size is unit.workers".into())
                }
                (_, Some(n)) if n > MAX_WORKERS => e.push(format!("{path}.count: {n} (at most {MAX_WORKERS})")),
                _ => {}
            }
            match (role, t.after.as_deref()) {
                (_, None) => {}
                ("head", Some(a)) => e.push(format!(
                    "unit.head.after: {a:?}: the head starts first (only a worker may start after the head)"
                )),
                (_, Some("head")) => {}
                (_, Some(a)) => {
                    e.push(format!("{path}.after: {a:?} is not a member a worker may wait for (only \"head\")"))
                }
            }
            // An alternative that keeps the template's labels has the template's problem.
            let own_labels = |k: u32| k == 0 || t.alternatives[k as usize - 1].node_labels.is_some();
            let checked = t.alternatives.len().min(MAX_ALTERNATIVES) as u32;
            for k in (0..=checked).filter(|k| own_labels(*k)) {
                let c = &self.constraints;
                let s = t.alternative(k).selector(&c.labels, c.allow_low_priority);
                let at = if k == 0 { path.clone() } else { format!("{path}.alternatives[{}]", k - 1) };
                for (key, want) in &c.labels {
                    if s.labels.get(key).is_some_and(|values| values.is_empty()) {
                        e.push(format!("{at}.node_labels.{key}: no value it allows is constraints.labels' {want:?}"));
                    }
                }
                // Only low-priority nodes, but not allowed on them: never placed.
                let (key, low) = flotilla_core::unit_shape::LOW_PRIORITY;
                if !s.allow_low_priority && s.labels.get(key).is_some_and(|vs| vs.iter().all(|v| v == low)) {
                    e.push(format!(
                        "{at}.node_labels.{key}: selects only {key}={low} nodes, which it may not use \
                         (set allow_low_priority = true)"
                    ));
                }
            }
        }
        for name in u.groups.keys() {
            if !is_name(name) {
                e.push(format!("unit.groups.{name}: a group's name is 1-63 of [a-z0-9-], not starting with '-'"));
            } else if name == "head" {
                e.push("unit.groups.head: \"head\" is the head's role, not a group's name".into());
            } else if name == "worker" && u.worker.is_some() {
                e.push("unit.groups.worker: [unit.worker] is the group named worker already".into());
            }
        }
        for (name, t) in &u.groups {
            if t.count.is_none() {
                e.push(format!("unit.groups.{name}.count: required (members of the group in each unit)"));
            }
        }
        // Counted, not listed: a count of 4 billion must not build 4 billion names.
        let total = u64::from(if u.worker.is_some() { u.workers } else { 0 })
            + u.groups.values().map(|t| u64::from(t.count.unwrap_or(0))).sum::<u64>();
        if total > u64::from(MAX_WORKERS) {
            e.push(format!("unit: {total} workers in all groups (at most {MAX_WORKERS})"));
        }
    }
}

fn check_cpu(path: &str, cpu: &str, errors: &mut Vec<String>) {
    match cpu_millis(cpu) {
        Ok(0) => errors.push(format!("{path}.cpu: must be above 0")),
        Ok(m) if m > flotilla_core::MAX_NODE_CPU_MILLIS => {
            errors.push(format!("{path}.cpu: {cpu:?} is more than any node has"))
        }
        Ok(_) => {}
        Err(e) => errors.push(format!("{path}.cpu: {e}")),
    }
}

fn check_gpu(path: &str, gpu: u32, errors: &mut Vec<String>) {
    if gpu > flotilla_core::MAX_NODE_GPUS {
        errors.push(format!("{path}.gpu: {gpu} is more than any node has"));
    }
}

fn check_memory(path: &str, memory: &str, errors: &mut Vec<String>) {
    match memory_bytes(memory) {
        Ok(0) => errors.push(format!("{path}.memory: must be above 0")),
        Ok(_) => {}
        Err(e) => errors.push(format!("{path}.memory: {e}")),
    }
}

/// Args and env as the shard bounds a claim's workload (see `claims_from_wire`).
fn check_workload(path: &str, t: &MemberTemplate, errors: &mut Vec<String>) {
    if t.args.len() > MAX_ARGS {
        errors.push(format!("{path}.args: at most {MAX_ARGS}"));
    }
    if t.env.len() > MAX_ENV {
        errors.push(format!("{path}.env: at most {MAX_ENV} variables"));
    }
    let size = t.command.len()
        + t.args.iter().map(String::len).sum::<usize>()
        + t.env.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>();
    if size > MAX_WORKLOAD_BYTES {
        errors.push(format!("{path}: command, args and env are {size} bytes (at most {MAX_WORKLOAD_BYTES})"));
    }
    for k in t.env.keys() {
        if k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            errors.push(format!("{path}.env: {k:?} is not a variable name"));
        }
    }
}

fn check_node_labels(path: &str, labels: &BTreeMap<String, LabelValue>, errors: &mut Vec<String>) {
    if labels.len() > MAX_NODE_LABELS {
        errors.push(format!("{path}: at most {MAX_NODE_LABELS} labels"));
    }
    for (k, v) in labels {
        let values = match v {
            LabelValue::One(one) => std::slice::from_ref(one),
            LabelValue::Any(any) => any.as_slice(),
            LabelValue::Invalid(other) => {
                errors.push(format!("{path}.{k}: {other} is neither a string nor a list of strings"));
                continue;
            }
        };
        if values.is_empty() {
            errors.push(format!("{path}.{k}: an empty list matches no node"));
        }
        if values.len() > MAX_LABEL_VALUES {
            errors.push(format!("{path}.{k}: at most {MAX_LABEL_VALUES} values"));
        }
        for v in values {
            if let Err(e) = flotilla_core::Labels::parse_pair(&format!("{k}={v}")) {
                errors.push(format!("{path}.{k}: {e}"));
            }
        }
    }
}

fn check_performance(path: &str, performance: Option<f64>, errors: &mut Vec<String>) {
    if let Some(p) = performance
        && !(p.is_finite() && p > 0.0 && p <= 1000.0)
    {
        errors.push(format!("{path}.performance: {p} (must be above 0, at most 1000)"));
    }
}

#[cfg(test)]
mod tests {
    use super::super::AppSpec;

    const BASE: &str = r#"
name = "llm"
[constraints]
labels = { zone = "z1" }
[unit.head]
command = "serve"
cpu = "1"
memory = "1Gi"
serves_http = true
[unit.groups.cpu]
command = "work"
cpu = "1"
memory = "1Gi"
count = 2
after = "head"
[unit.groups.gpu]
command = "infer"
args = ["--cuda"]
cpu = "2"
memory = "8Gi"
gpu = 1
count = 1
node_labels = { gpu_model = ["a100", "h100"] }
allow_low_priority = true
[[unit.groups.gpu.alternatives]]
node_labels = { gpu_model = "910b" }
args = ["--npu"]
env = { ASCEND = "1" }
performance = 0.5
[units]
min = 1
max = 4
initial = 1
[routing]
roles = ["head", "gpu"]
"#;

    #[test]
    fn groups_are_members_named_by_group_with_their_own_selectors_and_alternatives() {
        let s = AppSpec::parse(BASE).unwrap();
        let members: Vec<(String, &str)> = s.members().into_iter().map(|(n, r, _)| (n, r)).collect();
        let want = [("head", "head"), ("cpu-0", "cpu"), ("cpu-1", "cpu"), ("gpu-0", "gpu")];
        assert_eq!(members, want.map(|(n, r)| (n.to_string(), r)));
        let gpu = &s.unit.groups["gpu"];
        let sel = gpu.selector(&s.constraints.labels, s.constraints.allow_low_priority);
        assert_eq!(sel.labels["gpu_model"], ["a100".to_string(), "h100".to_string()].into());
        assert_eq!(sel.labels["zone"], ["z1".to_string()].into(), "the app's labels stay");
        assert!(sel.allow_low_priority && !s.allows_low_priority(&s.unit.head, false));
        // The alternative: its labels replace the template's, its env is laid over, args replace.
        let npu = gpu.alternative(1);
        assert_eq!((npu.args.as_slice(), npu.env["ASCEND"].as_str(), npu.gpu), (&["--npu".to_string()][..], "1", 1));
        assert_eq!(npu.selector(&s.constraints.labels, false).labels["gpu_model"], ["910b".to_string()].into());
        assert_eq!(gpu.alternative(7).args, ["--cuda"], "past the list: the template");
        // Tried by performance once one is given: the template (1) before the 0.5 build.
        assert_eq!(gpu.alternative_order(), [0, 1]);
        let faster = AppSpec::parse(&BASE.replace("performance = 0.5", "performance = 2.0")).unwrap();
        assert_eq!(faster.unit.groups["gpu"].alternative_order(), [1, 0]);
        let shape = s.unit_shape();
        assert_eq!(shape.members.len(), 4);
        assert_eq!((shape.members[3].group.as_str(), shape.members[3].options.len()), ("gpu", 2));
        assert_eq!(AppSpec::parse(&toml::to_string(&s).unwrap()).unwrap(), s, "round-trips");
        let json: AppSpec = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(json, s, "and through JSON, as the store keeps it");
    }

    #[test]
    fn bad_groups_are_refused_with_every_field_named() {
        let bad = BASE.replace("count = 2", "count = 2\nflavour = \"x\"").replace(
            "[unit.groups.gpu]",
            "[unit.groups.head]\ncommand = \"x\"\ncpu = \"1\"\nmemory = \"1Gi\"\ncount = 1\n[unit.groups.gpu]",
        );
        let err = AppSpec::parse(&bad).unwrap_err().to_string();
        assert!(err.contains("flavour"), "unknown fields are named: {err}");
        let bad = BASE
            .replace("count = 2", "count = 300")
            .replace(
                "[unit.groups.gpu]",
                "[unit.groups.head]\ncommand = \"x\"\ncpu = \"1\"\nmemory = \"1Gi\"\ncount = 1\n[unit.groups.gpu]",
            )
            .replace("args = [\"--npu\"]\nenv = { ASCEND = \"1\" }\nperformance = 0.5", "performance = 3.0")
            .replace("node_labels = { gpu_model = \"910b\" }\n", "")
            .replace(
                "node_labels = { gpu_model = [\"a100\", \"h100\"] }",
                "node_labels = { gpu_model = 7, zone = [\"z2\"] }",
            )
            .replace("[unit.head]", "[unit.head]\ncount = 1");
        let err = AppSpec::parse(&bad).unwrap_err().to_string();
        for needle in [
            "unit.groups.cpu.count: 300 (at most 256)",
            "unit.groups.head: \"head\" is the head's role",
            "unit.groups.gpu.alternatives[0]: changes nothing",
            "unit.groups.gpu.node_labels.gpu_model: 7 is neither a string nor a list of strings",
            "unit.groups.gpu.node_labels.zone: no value it allows is constraints.labels' \"z1\"",
            "unit.head.count: a unit has one head",
        ] {
            assert!(err.contains(needle), "{needle} missing from:\n{err}");
        }
        // A huge count is refused, not listed member by member.
        let err = AppSpec::parse(&BASE.replace("count = 2", "count = 4294967295")).unwrap_err().to_string();
        assert!(err.contains("4294967295 (at most 256)") && err.contains("workers in all groups"), "{err}");
        // Only low-priority nodes for a member that may not use them: never placed.
        let err = AppSpec::parse(&BASE.replace("count = 2", "count = 2\nnode_labels = { priority = \"low\" }"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unit.groups.cpu.node_labels.priority: selects only priority=low nodes"), "{err}");
        let err = AppSpec::parse(&BASE.replace("count = 1\n", "")).unwrap_err().to_string();
        assert!(err.contains("unit.groups.gpu.count: required"), "{err}");
        let err = AppSpec::parse(&BASE.replace("roles = [\"head\", \"gpu\"]", "roles = [\"tpu\"]")).unwrap_err();
        assert!(err.to_string().contains("routing.roles: \"tpu\" is not a role"), "{err}");
    }

    /// The old form is the group named `worker`: same members, same fingerprint.
    #[test]
    fn unit_worker_is_the_group_named_worker() {
        let old = AppSpec::parse(include_str!("../../../../examples/echo.toml")).unwrap();
        assert_eq!(
            old.members().iter().map(|(n, r, _)| (n.as_str(), *r)).collect::<Vec<_>>(),
            [("head", "head"), ("worker-0", "worker")]
        );
        assert!(!toml::to_string(&old.unit).unwrap().contains("groups"), "the fingerprint of old units holds");
    }

    /// The README's worker-group example is a valid group with the alternative it says.
    #[test]
    fn the_readmes_worker_group_example_parses() {
        let readme = include_str!("../../../../README.md");
        let at = readme.find("**Worker groups.**").expect("the README's worker groups section");
        let block = readme[at..].split("```toml\n").nth(1).and_then(|b| b.split("```").next()).unwrap();
        let head = "name = \"m\"\n[unit.head]\ncommand = \"x\"\ncpu = \"1\"\nmemory = \"1Gi\"\n";
        let spec = AppSpec::parse(&format!("{head}{block}[units]\nmin = 1\nmax = 2\ninitial = 1\n")).unwrap();
        let gpu = &spec.unit.groups["gpu"];
        assert_eq!((gpu.count, gpu.alternatives.len()), (Some(1), 1));
        assert_eq!(gpu.alternative(1).env["MODEL_BUILD"], "l4-int8");
        assert_eq!(gpu.alternative(1).performance, Some(0.5));
    }
}
