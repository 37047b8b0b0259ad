//! The app spec (TOML), validated in one place: every problem is reported at once,
//! each naming its field.

use std::collections::BTreeMap;

use flotilla_core::{MAX_UNITS, MemberShape, UnitShape, is_name};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppSpec {
    pub name: String,
    pub unit: UnitTemplate,
    #[serde(default)]
    pub constraints: Constraints,
    #[serde(default)]
    pub spread: Spread,
    pub units: Scale,
    #[serde(default)]
    pub routing: Routing,
    #[serde(default)]
    pub rollout: Rollout,
    /// How far moving units to better places may disturb the app (`crate::rebalance`).
    #[serde(default, skip_serializing_if = "Disruption::is_default")]
    pub disruption: Disruption,
    /// The app's own autoscaling policy (`[autoscaling]`); without one (and without
    /// `autoscaling_policy`) the app's size changes only by `flotilla scale`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<flotilla_autoscale::AutoscalingConfig>,
    /// A named policy (`flotilla policy apply`) shared with other apps, as Dataproc
    /// clusters name their autoscaling policy: changing it changes every app using it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling_policy: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnitTemplate {
    pub head: MemberTemplate,
    pub worker: Option<MemberTemplate>,
    /// Workers per unit (each unit is one head plus this many workers): the group
    /// named `worker`.
    #[serde(default)]
    pub workers: u32,
    /// Worker groups by name (`[unit.groups.gpu]`), each a template with a `count`:
    /// members `NAME-0`, `NAME-1`, …, their role the group's name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub groups: BTreeMap<String, MemberTemplate>,
}

mod artifacts;
mod disruption;
mod member;
pub mod rollout;
pub use artifacts::{ArtifactSpec, MAX_ARTIFACTS};
pub use disruption::{Disruption, Switch};
pub use member::MemberTemplate;
pub use rollout::{Analysis, Rollout, Strategy};

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraints {
    /// Every label here must match the node's.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// May members run on `priority=low` nodes?
    #[serde(default)]
    pub allow_low_priority: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    pub max_units_per_domain: Option<u32>,
    /// At most this many of the app's units on one node (a unit counts on a node if any
    /// of its members runs there). Unset: a serving app still prefers nodes holding fewer
    /// of its units (a soft preference), so one node loss takes few of its units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_units_per_node: Option<u32>,
    /// Where a unit's members go relative to each other: `pack` (all on one node) or
    /// `spread` (each on its own node). Unset: each member takes the best node on its
    /// own (bin packing, so usually together).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members: Option<MemberSpread>,
}

/// `spread.members`: a unit's members on one node, or on distinct nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemberSpread {
    Pack,
    Spread,
}

impl Spread {
    /// Does placement prefer (or, with a max, require) nodes holding few of the app's
    /// units? Yes with `max_units_per_node`, and by default for an app that serves.
    pub fn spreads_over_nodes(&self, serves: bool) -> bool {
        self.max_units_per_node.is_some() || serves
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scale {
    pub min: u32,
    pub max: u32,
    pub initial: u32,
    /// How long a unit removed by scale-in stays Draining (out of routes, still
    /// running) before its members are stopped.
    #[serde(default = "default_drain_timeout_ms")]
    pub drain_timeout_ms: u64,
}

fn default_drain_timeout_ms() -> u64 {
    2000
}

/// What a unit runs, in parts, so a change to one worker group's template rolls only
/// that group's members: `template` is the whole (what `flotilla apply` compares),
/// `frame` what makes a unit whole (its head, the app's constraints, which groups it has
/// and their sizes: a change there replaces units whole), `roles` each worker group's
/// template by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Fingerprints {
    pub template: String,
    pub frame: String,
    pub roles: BTreeMap<String, String>,
}

/// Where the spec in force came from, kept in the store beside it (`apps` shows it): the
/// stored spec is the truth, and a restart with the same `--app` file does not replace it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecOrigin {
    /// `file` (the `--app` file at start), `api` (`flotilla apply`), `rollback`
    /// (`POST /v1/apps/{app}/rollback`) or `revert` (a failed rollout's `auto_revert`).
    pub source: String,
    /// When it was put in force.
    pub at_unix_ms: u64,
    /// Why, for a revert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The name of the API token that applied it (none for a file, a revert, or an API
    /// without a token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by: Option<String>,
    /// The version a rollback went back to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub of_version: Option<u64>,
}

impl SpecOrigin {
    pub fn new(source: &str, at_unix_ms: u64) -> SpecOrigin {
        SpecOrigin { source: source.to_string(), at_unix_ms, reason: None, by: None, of_version: None }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Routing {
    /// Roles whose members receive traffic.
    pub roles: Vec<String>,
    /// How much traffic a node can take relative to others (the route weight's first
    /// factor; see `routes`).
    #[serde(default)]
    pub performance: Performance,
    /// Which named port of the routed members serves (`"serve"`): it becomes their main
    /// port (`FLOTILLA_PORT`, their address, their readiness check) and so the routes'.
    /// Without it, the member's own `FLOTILLA_PORT`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<String>,
}

impl Default for Routing {
    fn default() -> Self {
        Routing { roles: vec!["head".into()], performance: Performance::default(), port: None }
    }
}

/// Performance estimates: by the node's `gpu_model` label first, else by its cores (the
/// entry with the largest core count not above the node's), else 1.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Performance {
    #[serde(default)]
    pub gpu_model: BTreeMap<String, f64>,
    /// Keys are core counts ("8", "16").
    #[serde(default)]
    pub cores: BTreeMap<String, f64>,
}

impl Performance {
    /// No estimate by node: every node counts 1.
    pub fn is_empty(&self) -> bool {
        self.gpu_model.is_empty() && self.cores.is_empty()
    }

    pub fn estimate(&self, gpu_model: Option<&str>, cores: u64) -> f64 {
        if let Some(p) = gpu_model.and_then(|m| self.gpu_model.get(m)) {
            return *p;
        }
        self.cores
            .iter()
            .filter_map(|(k, v)| Some((k.parse::<u64>().ok()?, *v)))
            .filter(|(c, _)| *c <= cores)
            .max_by_key(|(c, _)| *c)
            .map(|(_, v)| v)
            .unwrap_or(1.0)
    }
}

/// Bounds of one member's workload, the same as the shard's for a claim.
pub const MAX_ARGS: usize = 256;
pub const MAX_ENV: usize = 256;
pub const MAX_WORKLOAD_BYTES: usize = 64 * 1024;
const MAX_SPEC_BYTES: usize = 256 * 1024;

#[derive(Debug, thiserror::Error)]
#[error("invalid app spec:\n  - {}", .0.join("\n  - "))]
pub struct SpecError(pub Vec<String>);

/// FNV-1a, hex: stable across runs and builds.
fn fnv(text: &str) -> String {
    let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    format!("{h:016x}")
}

impl AppSpec {
    pub fn parse(text: &str) -> Result<AppSpec, SpecError> {
        if text.len() > MAX_SPEC_BYTES {
            return Err(SpecError(vec![format!("the spec is {} bytes (at most {MAX_SPEC_BYTES})", text.len())]));
        }
        let spec: AppSpec = toml::from_str(text).map_err(|e| SpecError(vec![e.to_string().trim().to_string()]))?;
        spec.validate()?;
        Ok(spec)
    }

    pub fn validate(&self) -> Result<(), SpecError> {
        let mut e = Vec::new();
        if !is_name(&self.name) {
            e.push(format!("name: {:?} must be 1-63 of [a-z0-9-], not starting with '-'", self.name));
        }
        self.validate_members(&mut e);
        // Listing the members of an invalid template could be huge (a group's count).
        let members_valid = e.is_empty();
        let s = &self.units;
        if s.max > MAX_UNITS {
            e.push(format!("units.max: {} (at most {MAX_UNITS})", s.max));
        }
        if s.min > s.max {
            e.push(format!("units.min ({}) is above units.max ({})", s.min, s.max));
        }
        if s.initial < s.min || s.initial > s.max {
            e.push(format!("units.initial ({}) must be within min..=max ({}..={})", s.initial, s.min, s.max));
        }
        if s.drain_timeout_ms > 3_600_000 {
            e.push(format!("units.drain_timeout_ms: {} (at most an hour)", s.drain_timeout_ms));
        }
        self.disruption.validate(&mut e);
        self.rollout.validate(s.max, || !members_valid || self.serves(), &mut e);
        if self.spread.max_units_per_domain == Some(0) {
            e.push("spread.max_units_per_domain: must be at least 1".into());
        }
        if self.spread.max_units_per_node == Some(0) {
            e.push("spread.max_units_per_node: must be at least 1".into());
        }
        for (k, v) in &self.constraints.labels {
            if let Err(err) = flotilla_core::Labels::parse_pair(&format!("{k}={v}")) {
                e.push(format!("constraints.labels: {err}"));
            }
        }
        let perf = &self.routing.performance;
        for (k, v) in perf.gpu_model.iter().chain(&perf.cores) {
            if !(v.is_finite() && *v > 0.0 && *v <= 1000.0) {
                e.push(format!("routing.performance: {k:?} = {v} (must be above 0, at most 1000)"));
            }
        }
        for k in perf.cores.keys() {
            if k.parse::<u32>().is_err() {
                e.push(format!("routing.performance.cores: {k:?} is not a core count"));
            }
        }
        if perf.gpu_model.len() + perf.cores.len() > 256 {
            e.push("routing.performance: at most 256 entries".into());
        }
        let templates = self.templates();
        for r in &self.routing.roles {
            if r != "worker" && !templates.iter().any(|(role, _, _)| role == r) {
                e.push(format!("routing.roles: {r:?} is not a role (head, worker or a group's name)"));
            }
        }
        if let Some(port) = &self.routing.port {
            for (role, path, t) in &templates {
                if self.routing.roles.iter().any(|r| r == role) && !t.ports.contains(port) {
                    e.push(format!(
                        "routing.port: {port:?} is not among {path}.ports (the routed members serve on it)"
                    ));
                }
            }
        }
        if let Some(a) = &self.autoscaling {
            if a.name.is_some() {
                e.push("autoscaling.name: an app's own policy has no name (name it in a policy file for `flotilla policy apply`)".into());
            }
            if let Err(problems) = a.validate() {
                e.extend(problems.0.iter().map(ToString::to_string));
            }
        }
        if let Some(name) = &self.autoscaling_policy {
            if self.autoscaling.is_some() {
                e.push("autoscaling_policy: an app has its own [autoscaling] or a named policy, not both".into());
            }
            if !is_name(name) {
                e.push(format!("autoscaling_policy: {name:?} must be 1-63 of [a-z0-9-], not starting with '-'"));
            }
        }
        if e.is_empty() { Ok(()) } else { Err(SpecError(e)) }
    }

    /// Does the app follow a policy (its own or a named one)?
    pub fn is_autoscaled(&self) -> bool {
        self.autoscaling.is_some() || self.autoscaling_policy.is_some()
    }

    /// The app's own policy, validated (`validate` refused the spec if it is not valid).
    pub fn own_policy(&self) -> Option<flotilla_autoscale::Policy> {
        self.autoscaling.as_ref().and_then(|a| a.validate().ok())
    }

    /// Identifies what a unit runs (its template and placement constraints): a unit
    /// whose fingerprint differs from the spec's is rolled by `flotilla apply`.
    /// FNV-1a over the canonical TOML, so it is stable across runs and builds.
    pub fn template_fingerprint(&self) -> String {
        let text = format!(
            "{}\n{}",
            toml::to_string(&self.unit).unwrap_or_default(),
            toml::to_string(&self.constraints).unwrap_or_default()
        );
        fnv(&text)
    }

    /// The template fingerprint and its parts (see [`Fingerprints`]).
    pub fn fingerprints(&self) -> Fingerprints {
        #[derive(Serialize)]
        struct Frame<'a> {
            head: &'a MemberTemplate,
            constraints: &'a Constraints,
            workers: u32,
            groups: BTreeMap<&'a str, Option<u32>>,
        }
        let u = &self.unit;
        let frame = Frame {
            head: &u.head,
            constraints: &self.constraints,
            workers: if u.worker.is_some() { u.workers } else { 0 },
            groups: u.groups.iter().map(|(n, t)| (n.as_str(), t.count)).collect(),
        };
        let roles = self
            .templates()
            .into_iter()
            .filter(|(role, _, _)| *role != "head")
            .map(|(role, _, t)| (role.to_string(), fnv(&serde_json::to_string(t).unwrap_or_default())))
            .collect();
        Fingerprints {
            template: self.template_fingerprint(),
            frame: fnv(&serde_json::to_string(&frame).unwrap_or_default()),
            roles,
        }
    }

    /// Identifies the whole spec (its canonical TOML, so comments and layout do not
    /// count): a scheduler restarted with the same `--app` file keeps the spec in force
    /// when the file's fingerprint is the one it last applied.
    pub fn fingerprint(&self) -> String {
        fnv(&toml::to_string(self).unwrap_or_default())
    }

    /// Each way to run a member built from `t` (of a secondary unit when `secondary`,
    /// which may always use low-priority nodes), with its alternative's index, in the
    /// order placement tries them.
    pub fn options(&self, t: &MemberTemplate, secondary: bool) -> Vec<(u32, flotilla_core::MemberOption)> {
        let mut options = t.options(&self.constraints.labels, self.constraints.allow_low_priority);
        for (_, o) in &mut options {
            o.selector.allow_low_priority |= secondary;
        }
        options
    }

    /// Whether a member built from `t` may run on low-priority nodes.
    pub fn allows_low_priority(&self, t: &MemberTemplate, secondary: bool) -> bool {
        t.allow_low_priority.unwrap_or(self.constraints.allow_low_priority) || secondary
    }

    /// What one unit asks of the node pool, for the pool autoscaler.
    pub fn unit_shape(&self) -> UnitShape {
        UnitShape {
            members: self
                .members()
                .into_iter()
                .map(|(_, role, t)| MemberShape {
                    group: role.to_string(),
                    options: self.options(t, false).into_iter().map(|(_, o)| o).collect(),
                })
                .collect(),
            max_units_per_domain: self.spread.max_units_per_domain,
            units_per_domain: Default::default(),
            max_units_per_node: self.spread.max_units_per_node,
            units_per_node: Default::default(),
            spread_members: self.spread.members == Some(MemberSpread::Spread),
        }
    }

    /// Does the app serve traffic (a routed role whose member serves HTTP)? A serving
    /// app spreads its units over nodes by default (`Spread::spreads_over_nodes`).
    pub fn serves(&self) -> bool {
        self.members().iter().any(|(_, role, t)| t.serves_http && self.routing.roles.iter().any(|r| r == role))
    }

    /// The members of one unit with their roles: the head, then `workers` workers
    /// (`worker-0`, …), then each group's (`NAME-0`, …, by group name).
    pub fn members(&self) -> Vec<(String, &str, &MemberTemplate)> {
        let mut m = vec![("head".to_string(), "head", &self.unit.head)];
        if let Some(w) = &self.unit.worker {
            for i in 0..self.unit.workers {
                m.push((format!("worker-{i}"), "worker", w));
            }
        }
        for (name, t) in &self.unit.groups {
            for i in 0..t.count.unwrap_or(0) {
                m.push((format!("{name}-{i}"), name.as_str(), t));
            }
        }
        m
    }

    /// The template of the members of `role`: `head`, `worker` or a group's name.
    pub fn template_for(&self, role: &str) -> Option<&MemberTemplate> {
        match role {
            "head" => Some(&self.unit.head),
            "worker" if self.unit.worker.is_some() => self.unit.worker.as_ref(),
            group => self.unit.groups.get(group),
        }
    }

    /// The group (role) of a member from its name alone: `head`, or `GROUP` of
    /// `GROUP-i` (the inverse of [`AppSpec::members`]' naming, without a look-up).
    pub fn group_of(member: &str) -> &str {
        member.rsplit_once('-').map_or(member, |(g, _)| g)
    }

    /// Each role's template with its place in the spec: `("gpu", "unit.groups.gpu", t)`.
    pub fn templates(&self) -> Vec<(&str, String, &MemberTemplate)> {
        let mut out = vec![("head", "unit.head".to_string(), &self.unit.head)];
        if let Some(w) = &self.unit.worker {
            out.push(("worker", "unit.worker".to_string(), w));
        }
        out.extend(self.unit.groups.iter().map(|(n, t)| (n.as_str(), format!("unit.groups.{n}"), t)));
        out
    }

    /// Where each role may run, in any of its alternatives: `(role, selector)`.
    pub fn selectors(&self) -> Vec<(&str, flotilla_core::NodeSelector)> {
        let c = &self.constraints;
        self.templates()
            .into_iter()
            .flat_map(|(role, _, t)| {
                (0..=t.alternatives.len() as u32)
                    .map(move |k| (role, t.alternative(k).selector(&c.labels, c.allow_low_priority)))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_core::quantity::{cpu_millis, memory_bytes};

    const ECHO: &str = include_str!("../../../examples/echo.toml");

    #[test]
    fn every_member_finds_its_template_by_role() {
        for text in [
            ECHO,
            "name = \"g\"\n[unit.head]\ncommand = \"x\"\ncpu = \"1\"\nmemory = \"1Gi\"\n\
             [unit.groups.worker]\ncommand = \"y\"\ncpu = \"2\"\nmemory = \"1Gi\"\ncount = 2\n\
             [unit.groups.gpu]\ncommand = \"z\"\ncpu = \"3\"\nmemory = \"1Gi\"\ncount = 1\n\
             [units]\nmin = 1\nmax = 2\ninitial = 1\n",
        ] {
            let s = AppSpec::parse(text).unwrap();
            for (member, role, t) in s.members() {
                assert!(std::ptr::eq(s.template_for(role).unwrap(), t), "{member} of {role}");
            }
        }
        assert!(AppSpec::parse(ECHO).unwrap().template_for("nothing").is_none());
    }

    #[test]
    fn the_echo_example_is_valid() {
        let s = AppSpec::parse(ECHO).unwrap();
        assert_eq!(s.name, "echo");
        assert_eq!((s.units.min, s.units.initial, s.units.max), (1, 2, 6));
        assert_eq!(s.members().len(), 2);
        assert_eq!(s.unit.head.resources().cpu_millis, 250);
    }

    #[test]
    fn quantities() {
        assert_eq!(cpu_millis("500m"), Ok(500));
        assert_eq!(cpu_millis("1.5"), Ok(1500));
        assert!(cpu_millis("lots").is_err());
        assert_eq!(memory_bytes("256Mi"), Ok(256 << 20));
        assert_eq!(memory_bytes("1G"), Ok(1_000_000_000));
        assert_eq!(memory_bytes("4096"), Ok(4096));
        assert!(memory_bytes("3 parsecs").is_err());
        assert!(memory_bytes("1000Ti").is_err());
        // The Kubernetes grammar: decimal exponents and exa suffixes (the latter too large
        // for any node, and refused for that reason alone).
        assert_eq!(memory_bytes("129e6"), Ok(129_000_000));
        assert!(memory_bytes("1Ei").unwrap_err().contains("more than any node has"));
        let spec = AppSpec::parse(&ECHO.replacen("memory = \"", "memory = \"129e6\" # was \"", 1)).unwrap();
        assert_eq!(spec.unit.head.resources().memory_bytes, 129_000_000);
    }

    #[test]
    fn members_no_node_or_shard_could_take_are_refused() {
        let err = AppSpec::parse(&ECHO.replacen("cpu = \"250m\"", "cpu = \"1e30\"\ngpu = 100000", 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("unit.head.cpu") && err.contains("unit.head.gpu"), "{err}");
        let env: String = (0..300).map(|i| format!("V{i} = \"x\"\n")).collect();
        let err =
            AppSpec::parse(&ECHO.replacen("[unit.worker]", &format!("[unit.worker.env]\n{env}\n[unit.worker]"), 1))
                .unwrap_err()
                .to_string();
        assert!(err.contains("unit.worker.env: at most 256"), "{err}");
        let big = ECHO.replacen("args = [\"echo-server\"]", &format!("args = [\"{}\"]", "a".repeat(70_000)), 1);
        let err = AppSpec::parse(&big).unwrap_err().to_string();
        assert!(err.contains("unit.head: command, args and env are"), "{err}");
    }

    /// The `app_spec` fuzz target's seeds (`fuzz/corpus/app_spec`), replayed here too.
    #[test]
    fn the_fuzz_seeds_parse_or_fail_cleanly() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/app_spec");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            if let Ok(text) = std::str::from_utf8(&bytes)
                && let Ok(spec) = AppSpec::parse(text)
            {
                assert!(spec.members().iter().all(|(_, _, t)| t.resources().validate_node_capacity().is_ok()));
                assert_eq!(AppSpec::parse(&toml::to_string(&spec).unwrap()).unwrap(), spec);
            }
            seen += 1;
        }
        assert!(seen >= 5, "{} holds {seen} seeds", dir.display());
    }

    #[test]
    fn every_problem_is_named_at_once() {
        let bad = r#"
name = "Bad_Name"
[unit]
workers = 2
[unit.head]
command = ""
cpu = "0"
memory = "lots"
readiness_path = "healthz"
[units]
min = 3
max = 2
initial = 5
[spread]
max_units_per_domain = 0
[routing]
roles = ["boss"]
"#;
        let err = AppSpec::parse(bad).unwrap_err();
        let text = err.to_string();
        for needle in [
            "name:",
            "unit.head.command",
            "unit.head.cpu",
            "unit.head.memory",
            "unit.head.readiness_path",
            "unit.worker: required",
            "units.min",
            "units.initial",
            "spread.max_units_per_domain",
            "routing.roles",
        ] {
            assert!(text.contains(needle), "{needle} missing from:\n{text}");
        }
    }

    /// Named ports, blocks, start order and the routing port: valid input parses (and
    /// leaves the template fingerprint of a spec without them alone); bad input is named.
    #[test]
    fn named_ports_start_order_and_the_routing_port_are_validated() {
        let ray = ECHO
            .replacen(
                "serves_http = true",
                "serves_http = true\nports = [\"gcs\", \"serve\"]\nport_ranges = { worker_ports = 100 }",
                1,
            )
            .replacen("[unit.worker]", "[unit.worker]\nafter = \"head\"", 1)
            .replacen("roles = [\"head\"]", "roles = [\"head\"]\nport = \"serve\"", 1);
        let s = AppSpec::parse(&ray).unwrap();
        assert_eq!(s.unit.head.ports, ["gcs", "serve"]);
        assert_eq!(s.unit.head.port_ranges["worker_ports"], 100);
        assert_eq!(s.unit.worker.as_ref().unwrap().after.as_deref(), Some("head"));
        assert_eq!(s.routing.port.as_deref(), Some("serve"));
        assert_eq!(s.unit.head.resources().custom["ports"], 103, "2 named, a block of 100, its main port");
        assert!(s.unit.worker.as_ref().unwrap().resources().custom.is_empty(), "no named ports: none counted");
        assert_eq!(AppSpec::parse(&toml::to_string(&s).unwrap()).unwrap(), s, "round-trips");
        // Unset, the new fields are not serialized: running units' fingerprints do not
        // move, so an upgraded scheduler rolls nothing.
        let plain = toml::to_string(&AppSpec::parse(ECHO).unwrap().unit).unwrap();
        assert!(!plain.contains("ports") && !plain.contains("after"), "{plain}");
        let bad = ray
            .replacen("ports = [\"gcs\", \"serve\"]", "ports = [\"GCS\", \"serve\", \"serve\"]", 1)
            .replacen("worker_ports = 100", "worker_ports = 100000", 1)
            .replacen("after = \"head\"", "after = \"worker-0\"", 1)
            .replacen("port = \"serve\"", "port = \"http\"", 1);
        let err = AppSpec::parse(&bad).unwrap_err().to_string();
        for needle in [
            "unit.head.ports: \"GCS\" is not a port name",
            "unit.head.ports: \"serve\" repeats",
            "unit.head.port_ranges: \"worker_ports\" asks for 100000 ports",
            "unit.worker.after: \"worker-0\"",
            "routing.port: \"http\" is not among unit.head.ports",
        ] {
            assert!(err.contains(needle), "{needle} missing from:\n{err}");
        }
        let err = AppSpec::parse(&ray.replacen("[unit.head]", "[unit.head]\nafter = \"head\"", 1)).unwrap_err();
        assert!(err.to_string().contains("unit.head.after"), "{err}");
    }

    #[test]
    fn the_fingerprint_follows_the_template_not_the_scale() {
        let s = AppSpec::parse(ECHO).unwrap();
        let f = s.template_fingerprint();
        assert_eq!(f, AppSpec::parse(ECHO).unwrap().template_fingerprint(), "stable");
        let scaled = AppSpec::parse(&ECHO.replace("initial = 2", "initial = 3")).unwrap();
        assert_eq!(scaled.template_fingerprint(), f, "scale is not the template");
        let changed = AppSpec::parse(&ECHO.replacen("memory = \"64Mi\"", "memory = \"96Mi\"", 1)).unwrap();
        assert_ne!(changed.template_fingerprint(), f);
        let rolled = AppSpec::parse(&format!("{ECHO}\n[rollout]\nmax_unavailable = 2\n")).unwrap();
        assert_eq!(rolled.rollout.max_unavailable, 2);
        assert_eq!(s.rollout.max_unavailable, 1, "one at a time by default");
        let err = AppSpec::parse(&format!("{ECHO}\n[rollout]\nmax_unavailable = 0\n")).unwrap_err().to_string();
        assert!(err.contains("rollout.max_unavailable"), "{err}");
    }

    #[test]
    fn the_progress_deadline_is_a_duration_with_a_default() {
        let s = AppSpec::parse(ECHO).unwrap();
        assert_eq!((s.rollout.progress_deadline.as_secs(), s.rollout.auto_revert), (300, false), "5m by default");
        let r =
            AppSpec::parse(&format!("{ECHO}\n[rollout]\nprogress_deadline = \"1m30s\"\nauto_revert = true\n")).unwrap();
        assert_eq!((r.rollout.progress_deadline.as_secs(), r.rollout.auto_revert), (90, true));
        assert_eq!(AppSpec::parse(&toml::to_string(&r).unwrap()).unwrap(), r, "round-trips");
        for bad in ["\"0s\"", "\"2d\"", "\"soon\""] {
            let err = AppSpec::parse(&format!("{ECHO}\n[rollout]\nprogress_deadline = {bad}\n")).unwrap_err();
            assert!(err.to_string().contains("progress_deadline"), "{bad}: {err}");
        }
        // The whole-spec fingerprint follows the canonical spec, not the file's layout.
        assert_eq!(AppSpec::parse(&format!("# hi\n{ECHO}")).unwrap().fingerprint(), s.fingerprint());
        assert_ne!(r.fingerprint(), s.fingerprint());
    }

    #[test]
    fn node_spread_knobs_parse_with_defaults_and_named_errors() {
        let s = AppSpec::parse(ECHO).unwrap();
        assert_eq!((s.spread.max_units_per_node, s.spread.members), (None, None));
        assert!(s.serves() && s.spread.spreads_over_nodes(s.serves()), "a serving app spreads by default");
        let t = AppSpec::parse(&ECHO.replace(
            "max_units_per_domain = 3",
            "max_units_per_domain = 3\nmax_units_per_node = 2\nmembers = \"spread\"",
        ))
        .unwrap();
        assert_eq!((t.spread.max_units_per_node, t.spread.members), (Some(2), Some(MemberSpread::Spread)));
        assert_eq!(AppSpec::parse(&toml::to_string(&t).unwrap()).unwrap(), t, "round-trips");
        let pack = AppSpec::parse(&ECHO.replace("max_units_per_domain = 3", "members = \"pack\"")).unwrap();
        assert_eq!(pack.spread.members, Some(MemberSpread::Pack));
        let err = AppSpec::parse(&ECHO.replace("max_units_per_domain = 3", "max_units_per_node = 0")).unwrap_err();
        assert!(err.to_string().contains("spread.max_units_per_node"), "{err}");
        let err = AppSpec::parse(&ECHO.replace("max_units_per_domain = 3", "members = \"scatter\"")).unwrap_err();
        assert!(err.to_string().contains("members"), "{err}");
        let quiet = AppSpec::parse(&ECHO.replace("roles = [\"head\"]", "roles = []")).unwrap();
        assert!(!quiet.serves() && !quiet.spread.spreads_over_nodes(quiet.serves()), "batch apps pack");
    }

    #[test]
    fn unknown_fields_and_syntax_errors_name_the_place() {
        let err = AppSpec::parse(&ECHO.replace("[units]", "[units]\nmaximum = 3")).unwrap_err().to_string();
        assert!(err.contains("maximum"), "{err}");
        let err = AppSpec::parse("name = ").unwrap_err().to_string();
        assert!(err.contains("line 1"), "{err}");
        assert!(AppSpec::parse(&"#".repeat(300_000)).is_err());
    }
}
