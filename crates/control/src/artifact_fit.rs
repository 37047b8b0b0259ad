//! Refusing at apply time an app whose artifacts no node could cache: an artifact larger
//! than the cache of every node it may run on would only fail each member later.
//!
//! The origin knows the size of what was pushed to it (this replica's copy, or the origin
//! URL's manifest: an apply waits 2 s at most for them all); each agent offers its cache's cap
//! as the custom resource `artifact-cache`, and so does each of a pool's node types.
//! Where a size or a cap is not known (an `http://` artifact, an agent that does not say,
//! a cluster with no node yet) nothing is refused here: the member's fetch fails with the
//! reason when it learns the size.

use std::collections::BTreeMap;

use flotilla_artifact::{Digest, Source};
use flotilla_scheduler::AppSpec;

use crate::{ControlError, ControlState};

/// A node, or a pool's node type, with its labels and its cache's cap if it says.
#[derive(Debug)]
pub struct Place {
    pub name: String,
    pub cache: Option<u64>,
    pub labels: BTreeMap<String, String>,
}

/// Why `spec` cannot run anywhere, if a role's artifacts (`size_of` those whose size is
/// known) need more cache than every place it may run on (in any of its alternatives)
/// offers. Nothing is refused without places.
pub fn refusal(spec: &AppSpec, size_of: impl Fn(&Digest) -> Option<u64>, places: &[Place]) -> Option<String> {
    let selectors = spec.selectors();
    for (role, path, template) in spec.templates() {
        let admits = |p: &&Place| {
            selectors.iter().any(|(r, s)| *r == role && s.admits(|k| p.labels.get(k).map(String::as_str)).is_ok())
        };
        let places: Vec<&Place> = places.iter().filter(admits).collect();
        if places.is_empty() {
            continue;
        }
        // A place that does not say may hold anything.
        let Some(largest) = places.iter().map(|p| p.cache).try_fold(0u64, |m, c| c.map(|c| m.max(c))) else {
            continue;
        };
        // By digest: two destinations of one artifact share its cached bytes.
        let mut known: BTreeMap<Digest, u64> = BTreeMap::new();
        for a in &template.artifacts {
            if let Ok(Source::Cluster(d)) = Source::parse(&a.source)
                && let Some(size) = size_of(&d)
            {
                known.insert(d, size);
            }
        }
        let need: u64 = known.values().sum();
        if need > largest {
            let listed: Vec<String> = known.iter().map(|(d, n)| format!("flotilla://{d} ({})", bytes(*n))).collect();
            let best = places.iter().filter(|p| p.cache == Some(largest)).map(|p| p.name.as_str()).next();
            return Some(format!(
                "{path}.artifacts need {} of artifact cache ({}), more than any node it may run on holds: \
                 the largest is {} ({}); raise the agents' --artifact-cache or the node types' artifact-cache",
                bytes(need),
                listed.join(", "),
                bytes(largest),
                best.unwrap_or("?"),
            ));
        }
    }
    None
}

/// How long an apply waits, at most, for the origin URL to say its artifacts' sizes.
const SIZE_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// Refuses `spec` (422 `invalid_spec`) when a role's artifacts fit no node's cache.
pub(crate) async fn check(s: &ControlState, spec: &AppSpec) -> Result<(), ControlError> {
    let mut sizes: BTreeMap<Digest, u64> = BTreeMap::new();
    if let Some(o) = &s.artifacts {
        // One wait for them all: an origin URL that does not answer delays an apply 2 s.
        let deadline = std::time::Instant::now() + SIZE_WAIT;
        for a in spec.templates().into_iter().flat_map(|(_, _, t)| &t.artifacts) {
            if let Ok(Source::Cluster(d)) = Source::parse(&a.source)
                && !sizes.contains_key(&d)
                && let Some(size) = o.size(&d, deadline.saturating_duration_since(std::time::Instant::now())).await
            {
                sizes.insert(d, size);
            }
        }
    }
    match refusal(spec, |d| sizes.get(d).copied(), &places(s)) {
        Some(why) => Err(ControlError::InvalidSpec(why)),
        None => Ok(()),
    }
}

/// The nodes an app may be placed on (cordoned or suspect ones too, which may come
/// back, but not dead ones) and the pool node types.
fn places(s: &ControlState) -> Vec<Place> {
    let cache = flotilla_core::ARTIFACT_CACHE_RESOURCE;
    let mut places = Vec::new();
    for slot in s.cluster.slots().iter() {
        for r in slot.view.nodes.values().filter(|r| r.status != flotilla_core::NodeStatus::Dead) {
            places.push(Place {
                name: r.node_id.to_string(),
                cache: r.capacity.custom.get(cache).copied(),
                labels: r.labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            });
        }
    }
    for (name, t) in s.pools.node_types() {
        let labels = t["labels"]
            .as_object()
            .map(|m| m.iter().filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string()))).collect())
            .unwrap_or_default();
        places.push(Place { name: format!("pool type {name}"), cache: t["resources"][cache].as_u64(), labels });
    }
    places
}

/// `1.5 GiB`, `512 MiB`, `300 B`.
fn bytes(n: u64) -> String {
    const UNITS: [(&str, u64); 4] = [("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    match UNITS.iter().find(|(_, u)| n >= *u) {
        Some((name, u)) if n.is_multiple_of(*u) => format!("{} {name}", n / u),
        Some((name, u)) => format!("{:.1} {name}", n as f64 / *u as f64),
        None => format!("{n} B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(head: &[Digest], worker: &[Digest]) -> AppSpec {
        let list = |role: &str, ds: &[Digest]| {
            ds.iter()
                .enumerate()
                .map(|(i, d)| {
                    format!(
                        "[[unit.{role}.artifacts]]\nsource = \"flotilla://{d}\"\nsha256 = \"{}\"\ndest = \"a{i}/\"\n",
                        d.hex()
                    )
                })
                .collect::<String>()
        };
        let toml = format!(
            "name = \"a\"\n[unit]\nworkers = 1\n[unit.head]\ncommand = \"x\"\ncpu = \"1\"\nmemory = \"1Gi\"\n{}\
             [unit.worker]\ncommand = \"x\"\ncpu = \"1\"\nmemory = \"1Gi\"\n{}[units]\nmin = 1\nmax = 2\ninitial = 1\n",
            list("head", head),
            list("worker", worker)
        );
        crate::apps::parse_spec("a", &toml).unwrap()
    }

    fn place(name: &str, cache: Option<u64>) -> Place {
        Place { name: name.into(), cache, labels: BTreeMap::new() }
    }

    #[test]
    fn a_role_whose_known_artifacts_outgrow_every_cache_is_refused_naming_sizes() {
        let (a, b, c) = (Digest::of(b"a"), Digest::of(b"b"), Digest::of(b"c"));
        let size = |d: &Digest| [(a, 3u64 << 30), (b, 2 << 30)].into_iter().find(|(x, _)| x == d).map(|(_, n)| n);
        let places = [place("n1", Some(4 << 30)), place("pool type p/big", Some(9 << 29))];
        // The head's 3 GiB fits; the worker's 3 + 2 GiB (c's size unknown) does not.
        let s = spec(&[a, c], &[a, b, a]);
        let why = refusal(&s, size, &places).unwrap();
        assert!(why.starts_with("unit.worker.artifacts need 5 GiB of artifact cache"), "{why}");
        assert!(why.contains(&format!("flotilla://{a} (3 GiB)")) && !why.contains(&c.hex()), "{why}");
        assert!(why.contains("the largest is 4.5 GiB (pool type p/big)"), "{why}");
        assert_eq!(refusal(&spec(&[a], &[b]), size, &places), None);
        // Exactly full fits; a place that does not say, or no place at all, refuses nothing.
        assert_eq!(refusal(&s, size, &[place("n1", Some(5 << 30))]), None);
        assert_eq!(refusal(&s, size, &[place("n1", Some(1)), place("old-agent", None)]), None);
        assert_eq!(refusal(&s, size, &[]), None);
    }

    /// A group that runs only on some nodes (its `node_labels`, in any alternative)
    /// is held against those nodes' caches, not the cluster's largest.
    #[test]
    fn a_group_is_held_against_the_caches_of_the_nodes_it_may_run_on() {
        let a = Digest::of(b"a");
        let toml = format!(
            "name = \"a\"\n[unit.head]\ncommand = \"x\"\ncpu = \"1\"\nmemory = \"1Gi\"\n\
             [unit.groups.gpu]\ncommand = \"x\"\ncpu = \"1\"\nmemory = \"1Gi\"\ncount = 1\n\
             node_labels = {{ gpu_model = \"a100\" }}\n\
             [[unit.groups.gpu.artifacts]]\nsource = \"flotilla://{a}\"\nsha256 = \"{}\"\ndest = \"m/\"\n\
             [units]\nmin = 1\nmax = 2\ninitial = 1\n",
            a.hex()
        );
        let s = crate::apps::parse_spec("a", &toml).unwrap();
        let size = |_: &Digest| Some(3u64 << 30);
        let gpu = |cache: u64| Place {
            name: "pool type p/a100".into(),
            cache: Some(cache),
            labels: [("gpu_model".to_string(), "a100".to_string())].into(),
        };
        let why = refusal(&s, size, &[place("big-cpu", Some(100 << 30)), gpu(1 << 30)]).unwrap();
        assert!(why.starts_with("unit.groups.gpu.artifacts need 3 GiB"), "{why}");
        assert!(why.contains("the largest is 1 GiB (pool type p/a100)"), "{why}");
        assert_eq!(refusal(&s, size, &[place("big-cpu", Some(1)), gpu(4 << 30)]), None);
    }
}
