//! Named ports: the names a member gives the ports it needs (`ports = ["gcs", "serve"]`,
//! `port_ranges = { worker_ports = 100 }`), their bounds, and the environment variables
//! they become. One place, so the spec, the shard and the agent agree on what is valid.

use std::collections::{BTreeMap, BTreeSet};

/// Most named ports and ranges (together) one member may declare.
pub const MAX_NAMED_PORTS: usize = 32;
/// Longest port name, in bytes.
pub const MAX_PORT_NAME_LEN: usize = 32;
/// Largest block of contiguous ports one range may ask for.
pub const MAX_PORT_RANGE: u32 = 1024;
/// The custom resource that counts ports: an agent offers the size of its `--port-range`,
/// a member with named ports asks for as many as it needs, so the planner and the ledger
/// never put it on a node whose agent has too few left.
pub const PORTS_RESOURCE: &str = "ports";
/// What a node of a pool's type offers when its type does not say: the agent's default
/// `--port-range` (20000-29999).
pub const DEFAULT_PORTS_OFFERED: u64 = 10_000;

/// How many ports a member with these named ports and blocks holds: each named port,
/// each block, and its main port (counted apart, though `routing.port` may make it one
/// of the named ones: one too many is the safe side). Zero without named ports: such a
/// member's one port is not counted, so specs without them place as before.
pub fn ports_needed<'a>(ports: usize, ranges: impl IntoIterator<Item = &'a u32>) -> u64 {
    if ports == 0 {
        let blocks: u64 = ranges.into_iter().map(|n| u64::from(*n)).sum();
        return if blocks == 0 { 0 } else { blocks + 1 };
    }
    ports as u64 + ranges.into_iter().map(|n| u64::from(*n)).sum::<u64>() + 1
}

/// The variable suffix of a port name: upper-cased, `-` as `_` (`dashboard-agent` →
/// `DASHBOARD_AGENT`), so `FLOTILLA_PORT_` + it is a shell variable name.
pub fn port_env_suffix(name: &str) -> String {
    name.chars().map(|c| if c == '-' { '_' } else { c.to_ascii_uppercase() }).collect()
}

/// Whether `name` may name a port: 1..=32 of `a-z`, `0-9`, `_`, `-`.
pub fn is_port_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_PORT_NAME_LEN
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

/// Every problem with a member's named ports and ranges, each a sentence that starts
/// with what it is about (the caller prefixes the field). Names must be valid, distinct
/// and, as variables, distinct too (`a-b` and `a_b` are both `A_B`; a range `x` takes
/// `X_MIN` and `X_MAX`, so no port may be called `x_min`).
pub fn port_problems(ports: &[String], ranges: &BTreeMap<String, u32>) -> Vec<String> {
    let mut problems = Vec::new();
    if ports.len() + ranges.len() > MAX_NAMED_PORTS {
        problems.push(format!("{} named ports and ranges (at most {MAX_NAMED_PORTS})", ports.len() + ranges.len()));
    }
    let mut vars: BTreeSet<String> = BTreeSet::new();
    let mut claim = |var: String, name: &str, problems: &mut Vec<String>| {
        if !vars.insert(var.clone()) {
            problems.push(format!("{name:?} repeats a name (as a variable, FLOTILLA_PORT_{var})"));
        }
    };
    for p in ports {
        if !is_port_name(p) {
            problems.push(format!("{p:?} is not a port name (1-{MAX_PORT_NAME_LEN} of a-z, 0-9, _ and -)"));
            continue;
        }
        claim(port_env_suffix(p), p, &mut problems);
    }
    for (name, size) in ranges {
        if !is_port_name(name) {
            problems.push(format!("{name:?} is not a port name (1-{MAX_PORT_NAME_LEN} of a-z, 0-9, _ and -)"));
            continue;
        }
        if !(1..=MAX_PORT_RANGE).contains(size) {
            problems.push(format!("{name:?} asks for {size} ports (1..={MAX_PORT_RANGE})"));
        }
        let var = port_env_suffix(name);
        claim(var.clone(), name, &mut problems);
        claim(format!("{var}_MIN"), name, &mut problems);
        claim(format!("{var}_MAX"), name, &mut problems);
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn a_member_asks_for_the_ports_it_holds() {
        assert_eq!(ports_needed(0, &[]), 0, "no named ports: nothing counted, as before");
        assert_eq!(ports_needed(2, &[100]), 103);
        assert_eq!(ports_needed(0, &[5]), 6);
    }

    #[test]
    fn names_become_shell_variables() {
        assert_eq!(port_env_suffix("gcs"), "GCS");
        assert_eq!(port_env_suffix("dashboard-agent"), "DASHBOARD_AGENT");
        assert_eq!(port_env_suffix("worker_ports"), "WORKER_PORTS");
    }

    #[test]
    fn bad_names_sizes_and_clashes_are_named() {
        let ok =
            port_problems(&names(&["gcs", "serve", "node-manager"]), &BTreeMap::from([("worker_ports".into(), 100)]));
        assert!(ok.is_empty(), "{ok:?}");
        let p = port_problems(&names(&["GCS", "", "a b", &"x".repeat(33)]), &BTreeMap::new());
        assert_eq!(p.len(), 4, "{p:?}");
        let p =
            port_problems(&names(&["a-b", "a_b", "w_min"]), &BTreeMap::from([("w".into(), 0), ("big".into(), 5000)]));
        let text = p.join("\n");
        assert!(text.contains("\"a_b\" repeats"), "{text}");
        assert!(text.contains("\"w\" repeats") || text.contains("\"w_min\" repeats"), "{text}");
        assert!(text.contains("asks for 0 ports") && text.contains("asks for 5000 ports"), "{text}");
        let many: Vec<String> = (0..33).map(|i| format!("p{i}")).collect();
        assert!(port_problems(&many, &BTreeMap::new())[0].contains("at most 32"));
    }
}
