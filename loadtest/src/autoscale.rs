//! `flotilla-loadtest autoscale`: one pool scale-up decision for a seeded demand, by
//! Flotilla's `plan` (flotilla-pool, Ray autoscaler v2's `ResourceDemandScheduler` in Rust)
//! and by Ray 2.60's own scheduler (`loadtest/ray_plan.py`) on the same demand file, in the
//! same run. Reports, for each: decision time, nodes launched, and waste per resource.
//!
//! The demand (the format of `flotilla autoscale plan --demand`; see examples/README.md) is a
//! cluster scaling up from nothing (no current instances, no constraint), five node types:
//!
//! | type | CPU | GPU | memory |
//! |---|---|---|---|
//! | `cpu-16` | 16 | | 64 GiB |
//! | `cpu-32` | 32 | | 128 GiB |
//! | `mem-16` | 16 | | 128 GiB |
//! | `gpu-1` | 8 | 1 | 64 GiB |
//! | `gpu-6` | 48 | 6 | 512 GiB |
//!
//! (`max_workers` 1,000,000 each, so nothing is infeasible for lack of nodes), and `--requests`
//! single requests, grouped by shape with counts the way Ray exports them:
//! - 70 % CPU-only: 1, 2 or 4 CPU (1 in 2, 1 in 3, 1 in 6) with 0, 1, 2 or 4 GiB of memory
//!   (0 means no `memory` key, as a Ray task that asks for no memory);
//! - 15 % memory-heavy: 1, 2 or 4 CPU with 8, 16 or 32 GiB;
//! - 15 % GPU: 2, 4 or 8 CPU, 1 GPU (2 in 3) or 2, with 8, 16 or 32 GiB;
//!
//! plus 12 gangs (placement groups), three of each strategy STRICT_SPREAD, STRICT_PACK, PACK
//! and SPREAD: two of 2, 4 or 8 CPU bundles (1–4 CPU, 2–8 GiB) and one of 2 or 4 GPU bundles
//! (the same with 1 GPU each), every one feasible. `--gangs N` makes N of them, the
//! strategies in turn; `--distinct` makes every request a shape of its own (0.1–4 CPU in
//! thousandths, 1 byte–8 GiB of memory, 15 % with a GPU) for the packing's worst case.
//!
//! Waste, the same definition for both sides: for each resource, 1 − (demand placed ÷
//! capacity of the launched nodes), with the demand placed being every request and gang
//! bundle (the loadtest's demand is all feasible and the cluster starts empty, so all of it
//! lands on new nodes). It is computed here from each side's node counts, and checked
//! against Flotilla's own `waste` and `ray_plan.py`'s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, anyhow};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};

use crate::common::machine;

#[derive(Debug, Args)]
pub struct AutoscaleArgs {
    /// Single resource requests in the demand (before grouping by shape; gangs come on top).
    #[arg(long, default_value_t = 10_000)]
    pub requests: u64,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Every request a shape of its own (CPU in thousandths, memory in bytes, 15 % with a
    /// GPU), as a cluster of heterogeneous tasks exports them, instead of the 39 shapes.
    #[arg(long)]
    pub distinct: bool,
    /// Gangs (placement groups) in the demand, the four strategies in turn.
    #[arg(long, default_value_t = 12)]
    pub gangs: u64,
    /// Times Flotilla's plan is run on the same demand; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// Python with `ray==2.60.0` (default: loadtest/.venv/bin/python if it exists, else python3).
    #[arg(long)]
    pub python: Option<PathBuf>,
    /// Skip Ray (its fields are null).
    #[arg(long)]
    pub no_ray: bool,
    /// Ray's harness (default: ray_plan.py next to this crate's Cargo.toml).
    #[arg(long)]
    pub ray_script: Option<PathBuf>,
    /// Write the demand file here and keep it (default: a temp file, removed afterwards).
    #[arg(long, conflicts_with = "demand")]
    pub demand_out: Option<PathBuf>,
    /// Plan this demand file instead of a generated one (e.g. examples/demand.json, or a
    /// Ray user's export); `--requests` and `--seed` are then ignored.
    #[arg(long)]
    pub demand: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

const GIB: u64 = 1 << 30;

/// The five node types: name, CPU, GPU, memory in GiB.
const NODE_TYPES: [(&str, u64, u64, u64); 5] =
    [("cpu-16", 16, 0, 64), ("cpu-32", 32, 0, 128), ("mem-16", 16, 0, 128), ("gpu-1", 8, 1, 64), ("gpu-6", 48, 6, 512)];

type Shape = BTreeMap<&'static str, u64>;

fn shape(cpu: u64, gpu: u64, memory_gib: u64) -> Shape {
    let mut s = Shape::new();
    for (k, v) in [("CPU", cpu), ("GPU", gpu), ("memory", memory_gib * GIB)] {
        if v > 0 {
            s.insert(k, v);
        }
    }
    s
}

fn pick<T: Copy>(rng: &mut impl Rng, xs: &[T]) -> T {
    xs[rng.random_range(0..xs.len())]
}

/// The seeded demand, as the JSON document.
pub fn generate(requests: u64, seed: u64, distinct: bool, gang_count: u64) -> Value {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut by_shape: BTreeMap<Shape, u64> = BTreeMap::new();
    let mut distinct_requests: Vec<Value> = Vec::new();
    for _ in 0..requests {
        let x: f64 = rng.random();
        if distinct {
            let cpu = f64::from(rng.random_range(100u32..=4000)) / 1000.0;
            let memory = rng.random_range(1u64..=8 * GIB);
            let mut r = json!({"CPU": cpu, "memory": memory});
            if x >= 0.85 {
                r["GPU"] = json!(1);
            }
            distinct_requests.push(json!({"resources": r, "count": 1}));
            continue;
        }
        let s = if x < 0.70 {
            shape(pick(&mut rng, &[1, 1, 1, 2, 2, 4]), 0, pick(&mut rng, &[0, 1, 2, 4]))
        } else if x < 0.85 {
            shape(pick(&mut rng, &[1, 2, 4]), 0, pick(&mut rng, &[8, 16, 32]))
        } else {
            let cpu = pick(&mut rng, &[2, 4, 8]);
            let gpu = pick(&mut rng, &[1, 1, 2]);
            shape(cpu, gpu, pick(&mut rng, &[8, 16, 32]))
        };
        *by_shape.entry(s).or_default() += 1;
    }
    let mut resource_requests: Vec<Value> = by_shape.iter().map(|(s, n)| json!({"resources": s, "count": n})).collect();
    resource_requests.append(&mut distinct_requests);
    let mut gangs = Vec::new();
    const STRATEGIES: [&str; 4] = ["STRICT_SPREAD", "STRICT_PACK", "PACK", "SPREAD"];
    for k in 0..gang_count {
        let strategy = STRATEGIES[((k / 3) % 4) as usize];
        let j = k % 3;
        let gpu = u64::from(j == 2);
        let b = shape(pick(&mut rng, &[1, 2, 4]), gpu, pick(&mut rng, &[2, 4, 8]));
        // A STRICT_PACK gang of GPU bundles must fit one gpu-6 node.
        let n: usize = if gpu > 0 { pick(&mut rng, &[2, 4]) } else { pick(&mut rng, &[2, 4, 8]) };
        gangs.push(json!({
            "id": format!("{}-{}", strategy.to_lowercase().replace('_', "-"), if gang_count == 12 { j } else { k }),
            "strategy": strategy,
            "bundles": vec![&b; n],
        }));
    }
    let node_types: Vec<Value> = NODE_TYPES
        .iter()
        .map(|(name, cpu, gpu, mem)| {
            json!({"name": name, "resources": shape(*cpu, *gpu, *mem), "min_workers": 0, "max_workers": 1_000_000})
        })
        .collect();
    let doc = json!({
        "node_types": node_types,
        "max_total_workers": 1_000_000,
        "current_instances": [],
        "resource_requests": resource_requests,
        "gang_requests": gangs,
        "cluster_resource_constraints": [],
    });
    doc
}

/// Adds `resources` × `n` into `into`; missing or non-numeric values count as 0.
fn add_resources(into: &mut BTreeMap<String, f64>, resources: &Value, n: f64) {
    if let Some(r) = resources.as_object() {
        for (k, v) in r {
            *into.entry(k.clone()).or_default() += v.as_f64().unwrap_or(0.0) * n;
        }
    }
}

fn items<'a>(doc: &'a Value, key: &str) -> &'a [Value] {
    doc[key].as_array().map_or(&[], Vec::as_slice)
}

/// The demand's total per resource: every request and gang bundle (constraints are a floor,
/// not demand, and reserve nothing).
fn demand_total(doc: &Value) -> BTreeMap<String, f64> {
    let mut total = BTreeMap::new();
    for r in items(doc, "resource_requests") {
        add_resources(&mut total, &r["resources"], r["count"].as_f64().unwrap_or(1.0));
    }
    for g in items(doc, "gang_requests") {
        for b in items(g, "bundles") {
            add_resources(&mut total, b, 1.0);
        }
    }
    total
}

/// One side's decision.
struct Side {
    decision_seconds: f64,
    nodes_total: u64,
    nodes_by_type: BTreeMap<String, u64>,
    infeasible: u64,
    /// The side's own waste figures, to check against ours.
    own_waste: BTreeMap<String, f64>,
}

/// The one call into flotilla-pool's offline planner: parse once, plan `repeat` times, and
/// keep the run with the median decision time (the decisions are identical).
fn flotilla_plan(text: &str, repeat: usize) -> anyhow::Result<(Side, f64, f64)> {
    let started = Instant::now();
    let file = flotilla_pool::demand::DemandFile::parse(text).map_err(|e| anyhow!("demand: {e}"))?;
    let parse_seconds = started.elapsed().as_secs_f64();
    let mut runs: Vec<flotilla_pool::demand::PlanReport> = (0..repeat.max(1)).map(|_| file.plan()).collect();
    runs.sort_by(|a, b| a.decision_seconds.total_cmp(&b.decision_seconds));
    let fastest = runs[0].decision_seconds;
    let r = runs.swap_remove(runs.len() / 2);
    let side = Side {
        decision_seconds: r.decision_seconds,
        nodes_total: u64::from(r.nodes_total),
        nodes_by_type: r.nodes_by_type.into_iter().map(|(k, v)| (k, u64::from(v))).collect(),
        infeasible: r.infeasible.len() as u64,
        own_waste: r.waste,
    };
    Ok((side, parse_seconds, fastest))
}

/// Ray's side, or why there is none.
enum Ray {
    Ran(Side, String),
    Absent(String),
}

fn default_python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    if venv.exists() { venv } else { PathBuf::from("python3") }
}

fn ray_plan(python: &Path, script: &Path, demand: &Path) -> anyhow::Result<Ray> {
    let out = match Command::new(python).arg(script).arg(demand).output() {
        Ok(o) => o,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(Ray::Absent(format!("{} not found", python.display())));
        }
        Err(e) => return Err(anyhow!("running {}: {e}", python.display())),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stdout.lines().last().unwrap_or("");
    let v: Option<Value> = serde_json::from_str(last).ok();
    if out.status.code() == Some(3) {
        let why = v.as_ref().and_then(|v| v["error"].as_str()).unwrap_or("import ray failed");
        return Ok(Ray::Absent(format!("{} cannot import ray ({why})", python.display())));
    }
    let v = match v {
        Some(v) if out.status.success() => v,
        _ => {
            return Err(anyhow!(
                "{} {} failed ({}): {}{}",
                python.display(),
                script.display(),
                out.status,
                stdout.trim(),
                stderr.trim()
            ));
        }
    };
    let num = |k: &str| v[k].as_f64().with_context(|| format!("ray_plan.py: {k} missing in {last}"));
    let nodes_by_type = v["nodes_by_type"]
        .as_object()
        .context("ray_plan.py: nodes_by_type missing")?
        .iter()
        .map(|(k, n)| Ok((k.clone(), n.as_u64().context("ray_plan.py: a node count is not an integer")?)))
        .collect::<anyhow::Result<BTreeMap<_, _>>>()?;
    let own_waste = v["waste"]
        .as_object()
        .context("ray_plan.py: waste missing")?
        .iter()
        .filter_map(|(k, w)| w.as_f64().map(|w| (k.clone(), w)))
        .collect();
    let side = Side {
        decision_seconds: num("decision_seconds")?,
        nodes_total: num("nodes_total")? as u64,
        nodes_by_type,
        infeasible: num("infeasible")? as u64,
        own_waste,
    };
    Ok(Ray::Ran(side, v["ray_version"].as_str().unwrap_or("?").to_string()))
}

/// Capacity of `nodes_by_type` of the document's node types, per resource.
fn launched(doc: &Value, nodes_by_type: &BTreeMap<String, u64>) -> BTreeMap<String, f64> {
    let mut cap = BTreeMap::new();
    for t in items(doc, "node_types") {
        if let Some(&n) = t["name"].as_str().and_then(|name| nodes_by_type.get(name)) {
            add_resources(&mut cap, &t["resources"], n as f64);
        }
    }
    cap
}

/// 1 − demand ÷ launched capacity, per resource with capacity.
fn waste(doc: &Value, demand: &BTreeMap<String, f64>, side: &Side) -> BTreeMap<String, f64> {
    launched(doc, &side.nodes_by_type)
        .into_iter()
        .filter(|(_, cap)| *cap > 0.0)
        .map(|(k, cap)| {
            let w = 1.0 - demand.get(&k).copied().unwrap_or(0.0) / cap;
            (k, w)
        })
        .collect()
}

/// Lines about figures that do not mean what they should; then `ours` at least 0 (with
/// current instances, demand that lands on them can exceed the new capacity).
fn check(who: &str, side: &Side, ours: &mut BTreeMap<String, f64>, has_current: bool) {
    if side.infeasible > 0 {
        println!(
            "warning: {who} left {} request(s) or gang(s) infeasible; its waste counts them as placed (understated)",
            side.infeasible
        );
    }
    for (k, w) in ours.iter_mut() {
        if *w < -1e-9 && !has_current {
            println!("warning: {who} launched less {k} than the demand ({w:.4}): not every request was placed");
        }
        match side.own_waste.get(k) {
            Some(own) if (own - *w).abs() > 1e-6 => {
                println!("note: {who}'s own {k} waste is {own:.6}, this loadtest's {w:.6}")
            }
            None => println!("note: {who} reports no {k} waste; this loadtest's is {w:.6}"),
            _ => {}
        }
        *w = w.max(0.0);
    }
}

fn side_json(prefix: &str, side: Option<&Side>, w: Option<&BTreeMap<String, f64>>) -> serde_json::Map<String, Value> {
    let mut m = serde_json::Map::new();
    let get = |k: &str| w.and_then(|w| w.get(k).copied());
    m.insert(format!("{prefix}_decision_seconds"), json!(side.map(|s| s.decision_seconds)));
    m.insert(format!("{prefix}_nodes"), json!(side.map(|s| s.nodes_total)));
    m.insert(format!("{prefix}_nodes_by_type"), json!(side.map(|s| &s.nodes_by_type)));
    m.insert(format!("{prefix}_memory_waste"), json!(get("memory")));
    m.insert(format!("{prefix}_cpu_waste"), json!(get("CPU")));
    m.insert(format!("{prefix}_gpu_waste"), json!(get("GPU")));
    m.insert(format!("{prefix}_waste"), json!(w));
    m.insert(format!("{prefix}_infeasible"), json!(side.map(|s| s.infeasible)));
    m
}

fn pct(w: Option<&f64>) -> String {
    w.map(|w| format!("{:.1} %", w * 100.0)).unwrap_or_else(|| "-".into())
}

fn describe(who: &str, s: &Side, w: &BTreeMap<String, f64>) {
    let types: Vec<String> = s.nodes_by_type.iter().map(|(k, n)| format!("{k} {n}")).collect();
    println!(
        "{who}: {:.4} s, {} nodes ({}); unused: CPU {}, GPU {}, memory {}; infeasible {}",
        s.decision_seconds,
        s.nodes_total,
        types.join(", "),
        pct(w.get("CPU")),
        pct(w.get("GPU")),
        pct(w.get("memory")),
        s.infeasible
    );
}

/// Removes the temp demand file on the way out.
struct TempFile(Option<PathBuf>);

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

pub fn run(a: AutoscaleArgs) -> anyhow::Result<()> {
    anyhow::ensure!(a.requests > 0 && a.requests <= 5_000_000, "--requests must be within 1..=5000000");
    anyhow::ensure!(a.repeat > 0 && a.repeat <= 1_000, "--repeat must be within 1..=1000");
    anyhow::ensure!(a.gangs <= 1_000_000, "--gangs must be within 0..=1000000");
    let (doc, text) = match &a.demand {
        Some(p) => {
            let text = std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let doc: Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", p.display()))?;
            (doc, text)
        }
        None => {
            let doc = generate(a.requests, a.seed, a.distinct, a.gangs);
            let text = serde_json::to_string(&doc)?;
            (doc, text)
        }
    };
    let demand = demand_total(&doc);
    let (path, _cleanup) = match (&a.demand, &a.demand_out) {
        (Some(p), _) => (p.clone(), TempFile(None)),
        (None, Some(p)) => {
            std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
            (p.clone(), TempFile(None))
        }
        (None, None) => {
            let p = std::env::temp_dir().join(format!("flotilla-loadtest-autoscale-{}.json", std::process::id()));
            std::fs::write(&p, &text).with_context(|| format!("writing {}", p.display()))?;
            (p.clone(), TempFile(Some(p)))
        }
    };
    let requests: u64 =
        items(&doc, "resource_requests").iter().map(|r| r["count"].as_f64().unwrap_or(1.0) as u64).sum();
    let shapes = items(&doc, "resource_requests").len();
    let gangs = items(&doc, "gang_requests").len();
    println!(
        "autoscale: {requests} requests in {shapes} shapes, {gangs} gangs, {} node types{}; demand {} ({} bytes)",
        items(&doc, "node_types").len(),
        if a.demand.is_some() { String::new() } else { format!(", seed {}", a.seed) },
        path.display(),
        text.len()
    );
    let has_current = !items(&doc, "current_instances").is_empty();
    if has_current {
        println!(
            "note: the demand has current instances; waste counts what lands on them as if it used new nodes (a lower bound)"
        );
    }

    let (flotilla, parse_seconds, fastest) = flotilla_plan(&text, a.repeat)?;
    let mut fw = waste(&doc, &demand, &flotilla);
    check("flotilla", &flotilla, &mut fw, has_current);
    describe("flotilla", &flotilla, &fw);
    println!("flotilla: parse {parse_seconds:.4} s; plan median of {} runs (fastest {fastest:.4} s)", a.repeat);

    let ray = if a.no_ray {
        Ray::Absent("--no-ray".into())
    } else {
        let python = a.python.clone().unwrap_or_else(default_python);
        let script = a.ray_script.clone().unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("ray_plan.py"));
        ray_plan(&python, &script, &path)?
    };
    let (ray_side, ray_waste, ray_version, ray_absent) = match ray {
        Ray::Ran(s, version) => {
            let mut w = waste(&doc, &demand, &s);
            check("ray", &s, &mut w, has_current);
            describe(&format!("ray {version}"), &s, &w);
            (Some(s), Some(w), Some(version), None)
        }
        Ray::Absent(why) => {
            println!("ray: not run: {why}; its figures are null");
            if !a.no_ray {
                println!(
                    "ray: to compare, python3 -m venv loadtest/.venv && loadtest/.venv/bin/pip install ray==2.60.0 (or pass --python)"
                );
            }
            (None, None, None, Some(why))
        }
    };
    let speedup = ray_side.as_ref().map(|r| r.decision_seconds / flotilla.decision_seconds.max(1e-9));
    if let (Some(r), Some(x)) = (&ray_side, speedup) {
        let rw = ray_waste.as_ref().and_then(|w| w.get("memory").copied()).unwrap_or(0.0);
        let fwm = fw.get("memory").copied().unwrap_or(0.0);
        println!(
            "flotilla vs ray: {x:.0}x faster; {} nodes vs {} ({:+}); memory unused {:.1} % vs {:.1} % ({:+.1} points)",
            flotilla.nodes_total,
            r.nodes_total,
            flotilla.nodes_total as i64 - r.nodes_total as i64,
            fwm * 100.0,
            rw * 100.0,
            (fwm - rw) * 100.0
        );
    }
    if a.json {
        let mut m = serde_json::Map::new();
        m.insert("requests".into(), json!(requests));
        m.insert("shapes".into(), json!(shapes));
        m.insert("gangs".into(), json!(gangs));
        m.insert("seed".into(), json!(a.demand.is_none().then_some(a.seed)));
        m.extend(side_json("flotilla", Some(&flotilla), Some(&fw)));
        m.insert("flotilla_parse_seconds".into(), json!(parse_seconds));
        m.insert("flotilla_repeat".into(), json!(a.repeat));
        m.extend(side_json("ray", ray_side.as_ref(), ray_waste.as_ref()));
        m.insert("ray_version".into(), json!(ray_version));
        m.insert("ray_absent".into(), json!(ray_absent));
        m.insert("speedup_vs_ray".into(), json!(speedup));
        m.insert("machine".into(), json!(machine()));
        println!("{}", Value::Object(m));
    }
    Ok(())
}
