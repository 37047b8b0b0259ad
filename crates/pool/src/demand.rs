//! The input of `flotilla autoscale plan`: Ray autoscaler v2's scheduling request as
//! JSON, so a Ray user can export theirs and compare.
//!
//! ```json
//! {"node_types": [{"name": "gpu-6", "resources": {"CPU": 48, "GPU": 6, "memory": 274877906944},
//!                  "min_workers": 0, "max_workers": 10}],
//!  "max_total_workers": 100,
//!  "current_instances": [{"node_type": "gpu-6", "count": 1}],
//!  "resource_requests": [{"resources": {"GPU": 2}, "count": 3}],
//!  "gang_requests": [{"id": "pg-1", "strategy": "STRICT_SPREAD", "bundles": [{"CPU": 2}, {"CPU": 2}]}],
//!  "cluster_resource_constraints": [{"resource_requests": [{"resources": {"CPU": 4}, "count": 8}]}]}
//! ```
//!
//! `CPU` is in cores, `GPU` a count, `memory` in bytes; other names are custom resources.
//! Numbers may be integers or floats; a missing key is 0, except a node type's
//! `max_workers`, which defaults to `max_total_workers` as in Ray's cluster config.
//! Node types may also carry `labels`, a `cost` per hour and `idle_timeout_s`; current
//! instances an `available` map (default: all of the type's resources) and `idle_s`.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::pack::{self, Bundle, Gang, Infeasible, Node, NodeType, Problem, Request, Selector, Strategy, Termination};
use crate::shape::{ResourceNames, Shape};

/// Bounds on one demand file: beyond them it is a mistake, not a cluster.
pub const MAX_NODE_TYPES: usize = 1_000;
pub const MAX_ITEMS: usize = 1_000_000;
pub const MAX_COUNT: u64 = 10_000_000;
pub const MAX_BUNDLES: usize = 10_000;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{path}: {message}")]
pub struct DemandError {
    /// Where in the file, e.g. `node_types[2].resources.CPU`.
    pub path: String,
    pub message: String,
}

fn err(path: impl Into<String>, message: impl Into<String>) -> DemandError {
    DemandError { path: path.into(), message: message.into() }
}

type RawResources = BTreeMap<String, f64>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDemand {
    #[serde(default)]
    node_types: Vec<RawNodeType>,
    max_total_workers: Option<f64>,
    #[serde(default)]
    current_instances: Vec<RawInstance>,
    #[serde(default)]
    resource_requests: Vec<RawRequest>,
    #[serde(default)]
    gang_requests: Vec<RawGang>,
    #[serde(default)]
    cluster_resource_constraints: Vec<RawConstraint>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNodeType {
    name: String,
    #[serde(default)]
    resources: RawResources,
    #[serde(default)]
    min_workers: f64,
    max_workers: Option<f64>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    cost: Option<f64>,
    idle_timeout_s: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInstance {
    node_type: String,
    #[serde(default = "one")]
    count: f64,
    available: Option<RawResources>,
    #[serde(default)]
    idle_s: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRequest {
    #[serde(default)]
    resources: RawResources,
    #[serde(default = "one")]
    count: f64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawGang {
    #[serde(default)]
    id: String,
    strategy: String,
    #[serde(default)]
    bundles: Vec<RawResources>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConstraint {
    #[serde(default)]
    resource_requests: Vec<RawRequest>,
}

fn one() -> f64 {
    1.0
}

/// A whole, non-negative count no larger than `max`.
fn count(path: &str, v: f64, max: u64) -> Result<u64, DemandError> {
    if !v.is_finite() || v < 0.0 || v.fract() != 0.0 {
        return Err(err(path, format!("{v} is not a whole, non-negative number")));
    }
    if v > max as f64 {
        return Err(err(path, format!("{v} is more than {max}")));
    }
    Ok(v as u64)
}

fn shape(path: &str, r: &RawResources, names: &mut ResourceNames) -> Result<Shape, DemandError> {
    let mut s = Shape::zero(3);
    for (k, v) in r {
        let i = names.intern(k).map_err(|e| err(path, e.to_string()))?;
        s.set(i, names.to_qty(i, *v).map_err(|e| err(format!("{path}.{k}"), e.to_string()))?);
    }
    Ok(s)
}

fn limit(path: &str, n: usize, max: usize) -> Result<(), DemandError> {
    if n > max { Err(err(path, format!("{n} entries, at most {max}"))) } else { Ok(()) }
}

/// A parsed, validated demand file.
#[derive(Debug, Clone)]
pub struct DemandFile {
    pub problem: Problem,
}

/// What `plan` prints (`--json`: this object, compact, as the last line).
#[derive(Debug, Clone, Serialize)]
pub struct PlanReport {
    pub nodes_total: u32,
    pub nodes_by_type: BTreeMap<String, u32>,
    /// Time of the packing alone (parsing excluded).
    pub decision_seconds: f64,
    /// Capacity of the new nodes, in each resource's own unit.
    pub launched: BTreeMap<String, f64>,
    /// Fraction (0–1) of the new nodes' capacity no request uses, by resource.
    pub waste: BTreeMap<String, f64>,
    pub infeasible: Vec<Infeasible>,
    pub terminate: Vec<Termination>,
    /// Why each type is launched.
    pub reasons: BTreeMap<String, Vec<String>>,
}

impl DemandFile {
    pub fn parse(text: &str) -> Result<DemandFile, DemandError> {
        let raw: RawDemand = serde_json::from_str(text).map_err(|e| err("demand", e.to_string()))?;
        limit("node_types", raw.node_types.len(), MAX_NODE_TYPES)?;
        for (name, n) in [
            ("current_instances", raw.current_instances.len()),
            ("resource_requests", raw.resource_requests.len()),
            ("gang_requests", raw.gang_requests.len()),
        ] {
            limit(name, n, MAX_ITEMS)?;
        }
        let mut names = ResourceNames::default();
        let max_nodes = raw.max_total_workers.map(|v| count("max_total_workers", v, MAX_COUNT)).transpose()?;
        let mut node_types = Vec::new();
        let mut seen = HashSet::new();
        for (i, t) in raw.node_types.iter().enumerate() {
            let path = format!("node_types[{i}]");
            if t.name.is_empty() || t.name.len() > 63 {
                return Err(err(format!("{path}.name"), "must be 1 to 63 bytes"));
            }
            if !seen.insert(t.name.as_str()) {
                return Err(err(format!("{path}.name"), format!("{:?} is named twice", t.name)));
            }
            let resources = shape(&format!("{path}.resources"), &t.resources, &mut names)?;
            if resources.is_zero() {
                return Err(err(format!("{path}.resources"), "a node type with no resources holds nothing"));
            }
            let min = count(&format!("{path}.min_workers"), t.min_workers, MAX_COUNT)? as u32;
            let max = match t.max_workers {
                Some(v) => count(&format!("{path}.max_workers"), v, MAX_COUNT)? as u32,
                None => max_nodes.unwrap_or(MAX_COUNT) as u32,
            };
            if min > max {
                return Err(err(path, format!("min_workers {min} > max_workers {max}")));
            }
            if let Some(c) = t.cost
                && (!c.is_finite() || c < 0.0)
            {
                return Err(err(format!("{path}.cost"), format!("{c} is not a non-negative price")));
            }
            let idle_timeout_ms = match t.idle_timeout_s {
                Some(s) if !s.is_finite() || !(0.0..=1e7).contains(&s) => {
                    return Err(err(format!("{path}.idle_timeout_s"), format!("{s} is not within 0..=1e7")));
                }
                Some(s) => Some((s * 1000.0) as u64),
                None => None,
            };
            node_types.push(NodeType {
                name: t.name.clone(),
                resources,
                labels: t.labels.clone(),
                min,
                max,
                cost: t.cost,
                idle_timeout_ms,
            });
        }
        let mut nodes = Vec::new();
        for (i, c) in raw.current_instances.iter().enumerate() {
            let path = format!("current_instances[{i}]");
            let ty = node_types
                .iter()
                .find(|t| t.name == c.node_type)
                .ok_or_else(|| err(format!("{path}.node_type"), format!("no node type {:?}", c.node_type)))?;
            let n = count(&format!("{path}.count"), c.count, MAX_COUNT)?;
            if nodes.len() as u64 + n > MAX_ITEMS as u64 {
                return Err(err(path, format!("more than {MAX_ITEMS} current instances")));
            }
            let available = match &c.available {
                Some(a) => shape(&format!("{path}.available"), a, &mut names)?,
                None => ty.resources.clone(),
            };
            if !available.fits_in(&ty.resources) {
                return Err(err(format!("{path}.available"), "more than the node type has"));
            }
            let idle_ms = count(&format!("{path}.idle_s"), c.idle_s.floor().max(0.0), MAX_COUNT)? * 1000;
            for _ in 0..n {
                nodes.push(Node {
                    id: format!("{}-{}", c.node_type, nodes.len()),
                    node_type: Some(c.node_type.clone()),
                    total: ty.resources.clone(),
                    available: available.clone(),
                    labels: ty.labels.clone(),
                    idle_ms,
                    pending: false,
                });
            }
        }
        let requests =
            |path: &str, rs: &[RawRequest], names: &mut ResourceNames| -> Result<Vec<Request>, DemandError> {
                rs.iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let p = format!("{path}[{i}]");
                        Ok(Request {
                            shape: shape(&format!("{p}.resources"), &r.resources, names)?,
                            count: count(&format!("{p}.count"), r.count, MAX_COUNT)?,
                            selector: Selector::default(),
                            per_node: None,
                        })
                    })
                    .collect()
            };
        let resource_requests = requests("resource_requests", &raw.resource_requests, &mut names)?;
        let mut floor = Vec::new();
        for (i, c) in raw.cluster_resource_constraints.iter().enumerate() {
            floor.extend(requests(
                &format!("cluster_resource_constraints[{i}].resource_requests"),
                &c.resource_requests,
                &mut names,
            )?);
        }
        let mut gangs = Vec::new();
        for (i, g) in raw.gang_requests.iter().enumerate() {
            let path = format!("gang_requests[{i}]");
            let strategy: Strategy =
                serde_json::from_value(serde_json::Value::String(g.strategy.clone())).map_err(|_| {
                    err(
                        format!("{path}.strategy"),
                        format!("{:?} is not one of STRICT_SPREAD, STRICT_PACK, PACK, SPREAD", g.strategy),
                    )
                })?;
            limit(&format!("{path}.bundles"), g.bundles.len(), MAX_BUNDLES)?;
            let bundles = g
                .bundles
                .iter()
                .enumerate()
                .map(|(j, b)| shape(&format!("{path}.bundles[{j}]"), b, &mut names).map(Bundle::new))
                .collect::<Result<_, _>>()?;
            let id = if g.id.is_empty() { format!("#{i}") } else { g.id.clone() };
            gangs.push(Gang {
                id,
                strategy,
                bundles,
                alternatives: Vec::new(),
                same: None,
                per_node: None,
                per_domain: None,
            });
        }
        let problem = Problem {
            names,
            node_types,
            max_nodes: max_nodes.map(|m| m as u32),
            nodes,
            requests: resource_requests,
            request_apps: Vec::new(),
            gangs,
            per_node: Vec::new(),
            per_domain: Vec::new(),
            floor,
            inert: Default::default(),
        };
        Ok(DemandFile { problem })
    }

    /// One packing decision, timed.
    pub fn plan(&self) -> PlanReport {
        let start = Instant::now();
        let plan = pack::plan(&self.problem);
        let decision_seconds = start.elapsed().as_secs_f64();
        report(&self.problem, plan, decision_seconds)
    }
}

/// The printable form of a plan.
pub fn report(p: &Problem, plan: pack::Plan, decision_seconds: f64) -> PlanReport {
    let mut launched = BTreeMap::new();
    let mut waste = BTreeMap::new();
    for i in 0..p.names.len() {
        let cap = plan.new_capacity.get(i);
        if cap == 0 {
            continue;
        }
        let used = plan.new_used.get(i).min(cap);
        launched.insert(p.names.name(i).to_string(), p.names.to_value(i, cap));
        waste.insert(p.names.name(i).to_string(), (cap - used) as f64 / cap as f64);
    }
    PlanReport {
        nodes_total: plan.launch.values().sum(),
        nodes_by_type: plan.launch,
        decision_seconds,
        launched,
        waste,
        infeasible: plan.infeasible,
        terminate: plan.terminate,
        reasons: plan.launch_reasons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = r#"{
      "node_types": [
        {"name": "gpu2-tpu1", "resources": {"GPU": 2, "TPU": 1}, "max_workers": 4},
        {"name": "gpu6", "resources": {"GPU": 6}, "max_workers": 4},
        {"name": "cpu16", "resources": {"CPU": 16, "memory": 68719476736}, "min_workers": 0}
      ],
      "max_total_workers": 20,
      "resource_requests": [{"resources": {"GPU": 2}, "count": 1}, {"resources": {"CPU": 0.5, "memory": 1e9}, "count": 40}],
      "gang_requests": [{"id": "pg", "strategy": "STRICT_SPREAD", "bundles": [{"CPU": 4}, {"CPU": 4}]}],
      "cluster_resource_constraints": []
    }"#;

    #[test]
    fn the_documented_example_plans() {
        let r = DemandFile::parse(EXAMPLE).unwrap().plan();
        assert_eq!(r.nodes_by_type.get("gpu6"), Some(&1), "{r:?}");
        assert!(!r.nodes_by_type.contains_key("gpu2-tpu1"), "{r:?}");
        // The spread gang needs two nodes; the 0.5-CPU requests fill them and a third.
        assert_eq!(r.nodes_by_type.get("cpu16"), Some(&2), "{r:?}");
        assert_eq!(r.nodes_total, 3);
        assert!(r.infeasible.is_empty());
        assert!(r.waste.values().all(|w| (0.0..=1.0).contains(w)), "{:?}", r.waste);
        let json = serde_json::to_value(&r).unwrap();
        for key in ["nodes_total", "nodes_by_type", "decision_seconds", "waste", "infeasible"] {
            assert!(json.get(key).is_some(), "{key} missing");
        }
    }

    #[test]
    fn bad_input_is_refused_with_its_place() {
        let bad = |text: &str, path: &str| {
            let e = DemandFile::parse(text).unwrap_err();
            assert!(e.path.starts_with(path), "{text}: {e}");
            e.to_string()
        };
        bad(r#"{"node_types": [{"name": "a", "resources": {"CPU": -1}}]}"#, "node_types[0].resources.CPU");
        bad(r#"{"node_types": [{"name": "a", "resources": {"CPU": 1e300}}]}"#, "node_types[0].resources.CPU");
        bad(
            r#"{"node_types": [{"name": "a", "resources": {"CPU": 1}, "min_workers": 3, "max_workers": 2}]}"#,
            "node_types[0]",
        );
        bad(r#"{"node_types": [{"name": "a", "resources": {}}]}"#, "node_types[0].resources");
        bad(
            r#"{"node_types": [{"name": "a", "resources": {"CPU": 1}}, {"name": "a", "resources": {"CPU": 1}}]}"#,
            "node_types[1].name",
        );
        let e =
            bad(r#"{"gang_requests": [{"strategy": "STRICT_SOMETIMES", "bundles": []}]}"#, "gang_requests[0].strategy");
        assert!(e.contains("STRICT_SPREAD"), "{e}");
        bad(r#"{"resource_requests": [{"resources": {"CPU": 1}, "count": 1.5}]}"#, "resource_requests[0].count");
        bad(r#"{"resource_requests": [{"resources": {"CPU": 1}, "count": 1e12}]}"#, "resource_requests[0].count");
        bad(r#"{"current_instances": [{"node_type": "nope"}]}"#, "current_instances[0].node_type");
        bad(r#"{"node_types": [], "surprise": 1}"#, "demand");
        bad("not json", "demand");
    }

    #[test]
    fn a_gang_no_type_can_hold_is_reported_by_name() {
        let text = r#"{"node_types": [{"name": "a", "resources": {"CPU": 4}, "max_workers": 10}],
                        "gang_requests": [{"id": "huge", "strategy": "PACK", "bundles": [{"CPU": 64}]}]}"#;
        let r = DemandFile::parse(text).unwrap().plan();
        assert_eq!(r.nodes_total, 0);
        assert_eq!(r.infeasible.len(), 1);
        assert_eq!(r.infeasible[0].request, "gang huge");
    }

    #[test]
    fn integers_and_floats_are_both_numbers_and_missing_keys_are_zero() {
        let text = r#"{"node_types": [{"name": "a", "resources": {"CPU": 4.0, "memory": 8589934592}}],
                        "max_total_workers": 3,
                        "resource_requests": [{"resources": {"CPU": 2}}, {"resources": {"CPU": 1.5}, "count": 2.0}]}"#;
        let r = DemandFile::parse(text).unwrap().plan();
        assert_eq!(r.nodes_total, 2, "{r:?}");
        assert_eq!(r.launched.get("CPU"), Some(&8.0));
    }
}
