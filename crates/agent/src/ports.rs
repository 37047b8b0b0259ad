//! Port assignment: every port a member needs (its main port, its named ports, its
//! named blocks) comes from the agent's range (`--ports FIRST-LAST`), never one another
//! member holds. Pure: what is free on the host is asked through `free`.

use std::collections::{BTreeMap, BTreeSet};

/// The ports one member holds while it is assigned (across restarts); freed when it
/// goes, since they are computed from the members the runtime keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemberPorts {
    /// `FLOTILLA_PORT`: its address and readiness check.
    pub main: u16,
    pub named: BTreeMap<String, u16>,
    /// Inclusive blocks.
    pub ranges: BTreeMap<String, (u16, u16)>,
}

impl MemberPorts {
    /// Every port it holds, once each (the main port may be a named one).
    pub fn all(&self) -> impl Iterator<Item = u16> + '_ {
        let own_main = !self.named.values().any(|p| *p == self.main);
        own_main
            .then_some(self.main)
            .into_iter()
            .chain(self.named.values().copied())
            .chain(self.ranges.values().flat_map(|(a, b)| *a..=*b))
    }

    /// The variables that pass them to the member: `{prefix}` (main),
    /// `{prefix}_<NAME>` and `{prefix}_<NAME>_MIN` / `_MAX`.
    pub fn env(&self, prefix: &str) -> Vec<(String, String)> {
        use flotilla_core::ports::port_env_suffix as suffix;
        let mut v = vec![(prefix.to_string(), self.main.to_string())];
        v.extend(self.named.iter().map(|(n, p)| (format!("{prefix}_{}", suffix(n)), p.to_string())));
        for (n, (a, b)) in &self.ranges {
            v.push((format!("{prefix}_{}_MIN", suffix(n)), a.to_string()));
            v.push((format!("{prefix}_{}_MAX", suffix(n)), b.to_string()));
        }
        v
    }
}

/// What a member asks for.
#[derive(Debug, Clone, Copy)]
pub struct PortRequest<'a> {
    pub named: &'a [String],
    pub ranges: &'a std::collections::HashMap<String, u32>,
    /// Which named port is the main one; empty: a port of its own.
    pub main: &'a str,
}

/// Assigns a member's ports from `range` (inclusive), skipping `used` (held by other
/// members) and what `free` says is taken on the host. Blocks first (they need
/// contiguous room), lowest first, then single ports. The error says what did not fit,
/// in words `units` shows.
pub fn assign(
    range: (u16, u16),
    used: &BTreeSet<u16>,
    req: PortRequest<'_>,
    free: &dyn Fn(u16) -> bool,
) -> Result<MemberPorts, String> {
    let (lo, hi) = range;
    let mut taken = used.clone();
    let mut out = MemberPorts::default();
    let exhausted = |what: String, taken: &BTreeSet<u16>| {
        let held = taken.iter().filter(|p| (lo..=hi).contains(*p)).count();
        format!(
            "no free port in the agent's range {lo}-{hi} for {what} ({held} of {} held by members)",
            usize::from(hi.saturating_sub(lo)) + 1
        )
    };
    let mut ranges: Vec<(&String, u32)> = req.ranges.iter().map(|(k, v)| (k, *v)).collect();
    ranges.sort();
    for (name, size) in ranges {
        let size = size.max(1);
        let mut run_start = None;
        let mut found = None;
        for p in lo..=hi {
            if taken.contains(&p) || !free(p) {
                run_start = None;
                continue;
            }
            let start = *run_start.get_or_insert(p);
            if u32::from(p - start) + 1 == size {
                found = Some((start, p));
                break;
            }
        }
        let Some((a, b)) = found else {
            return Err(exhausted(format!("the block {name:?} of {size} contiguous ports"), &taken));
        };
        taken.extend(a..=b);
        out.ranges.insert(name.clone(), (a, b));
    }
    let next = |what: String, taken: &mut BTreeSet<u16>| match (lo..=hi).find(|p| !taken.contains(p) && free(*p)) {
        Some(p) => {
            taken.insert(p);
            Ok(p)
        }
        None => Err(exhausted(what, taken)),
    };
    for name in req.named {
        let p = next(format!("the port {name:?}"), &mut taken)?;
        out.named.insert(name.clone(), p);
    }
    out.main = match out.named.get(req.main) {
        Some(p) => *p,
        None => next("its main port".into(), &mut taken)?,
    };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn req<'a>(named: &'a [String], ranges: &'a HashMap<String, u32>, main: &'a str) -> PortRequest<'a> {
        PortRequest { named, ranges, main }
    }

    #[test]
    fn named_ports_and_blocks_come_from_the_range() {
        let named = vec!["gcs".to_string(), "serve".to_string()];
        let ranges = HashMap::from([("worker_ports".to_string(), 4)]);
        let p = assign((100, 119), &BTreeSet::new(), req(&named, &ranges, "serve"), &|_| true).unwrap();
        assert_eq!(p.ranges["worker_ports"], (100, 103));
        assert_eq!((p.named["gcs"], p.named["serve"]), (104, 105));
        assert_eq!(p.main, 105, "the main port is the named serving port, not another one");
        let env: BTreeMap<String, String> = p.env("FLOTILLA_PORT").into_iter().collect();
        assert_eq!(env["FLOTILLA_PORT"], "105");
        assert_eq!(env["FLOTILLA_PORT_GCS"], "104");
        assert_eq!(env["FLOTILLA_PORT_WORKER_PORTS_MIN"], "100");
        assert_eq!(env["FLOTILLA_PORT_WORKER_PORTS_MAX"], "103");
        assert_eq!(p.all().count(), 6);
        // Without a main port named, the member gets one of its own.
        let q = assign((100, 119), &p.all().collect(), req(&named, &HashMap::new(), ""), &|_| true).unwrap();
        assert_eq!((q.named["gcs"], q.named["serve"], q.main), (106, 107, 108));
    }

    #[test]
    fn blocks_skip_held_and_busy_ports_to_find_contiguous_room() {
        let ranges = HashMap::from([("w".to_string(), 3)]);
        // 101 held by a member, 104 busy on the host: the first run of three is 105-107.
        let p = assign((100, 110), &BTreeSet::from([101]), req(&[], &ranges, ""), &|p| p != 104).unwrap();
        assert_eq!(p.ranges["w"], (105, 107));
        assert_eq!(p.main, 100);
    }

    #[test]
    fn exhaustion_is_a_clear_refusal_and_freed_ports_are_reused() {
        let named = vec!["a".to_string(), "b".to_string()];
        let none = HashMap::new();
        let first = assign((100, 102), &BTreeSet::new(), req(&named, &none, "a"), &|_| true).unwrap();
        let used: BTreeSet<u16> = first.all().collect();
        let err = assign((100, 102), &used, req(&named, &none, "a"), &|_| true).unwrap_err();
        assert!(err.contains("range 100-102") && err.contains("\"b\""), "{err}");
        let big = HashMap::from([("w".to_string(), 50)]);
        let err = assign((100, 120), &BTreeSet::new(), req(&[], &big, ""), &|_| true).unwrap_err();
        assert!(err.contains("block \"w\" of 50 contiguous ports"), "{err}");
        // The first member went: its ports are free again.
        assert_eq!(assign((100, 102), &BTreeSet::new(), req(&named, &none, "a"), &|_| true).unwrap(), first);
    }
}
