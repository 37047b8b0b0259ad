//! The cheapest pool that holds a set of units, exactly, for small cases: every count of
//! every node type within its `min` and `max` (and `max_nodes`), cheapest first, each
//! checked by an exhaustive bin packing. Consolidation is measured against it.

use flotilla_core::Resources;

use crate::config::PoolConfig;

/// Beyond these the answer is not computed (it would not be exact in reasonable time).
const MAX_COMBINATIONS: usize = 200_000;
const MAX_ITEMS: usize = 64;
const MAX_STEPS: u64 = 2_000_000;

/// The cheapest cost per hour of nodes that hold `units` (each unit's resources, with a
/// count), or `None` when nothing within the bounds holds them or the case is too large
/// to be exact.
pub fn cheapest(cfg: &PoolConfig, units: &[(Resources, u32)]) -> Option<f64> {
    let mut items: Vec<&Resources> = units.iter().flat_map(|(r, n)| std::iter::repeat_n(r, *n as usize)).collect();
    if items.len() > MAX_ITEMS {
        return None;
    }
    items.sort_by_key(|r| std::cmp::Reverse((r.cpu_millis, r.memory_bytes)));
    let types = &cfg.node_types;
    let mut combos: Vec<(f64, Vec<u32>)> = vec![(0.0, vec![])];
    for t in types {
        let upper = t.max.min(t.min.max(items.len() as u32));
        let mut next = Vec::new();
        for (cost, counts) in &combos {
            for n in t.min..=upper.max(t.min) {
                let mut c = counts.clone();
                c.push(n);
                next.push((cost + f64::from(n) * t.cost.unwrap_or(0.0), c));
                if next.len() > MAX_COMBINATIONS {
                    return None;
                }
            }
        }
        combos = next;
    }
    combos.retain(|(_, c)| cfg.max_nodes.is_none_or(|m| c.iter().sum::<u32>() <= m));
    combos.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.iter().sum::<u32>().cmp(&b.1.iter().sum())));
    let mut steps = 0u64;
    for (cost, counts) in combos {
        let mut bins: Vec<Resources> = Vec::new();
        for (t, n) in types.iter().zip(&counts) {
            bins.extend(std::iter::repeat_n(t.resources.clone(), *n as usize));
        }
        match pack(&items, &mut bins, &mut steps) {
            Some(true) => return Some(cost),
            Some(false) => {}
            None => return None,
        }
    }
    None
}

/// Whether `items` fit in `bins` (their free room, taken as it goes); `None` when the
/// search ran out of steps.
fn pack(items: &[&Resources], bins: &mut [Resources], steps: &mut u64) -> Option<bool> {
    let Some((first, rest)) = items.split_first() else { return Some(true) };
    let mut tried: Vec<Resources> = Vec::new();
    for i in 0..bins.len() {
        *steps += 1;
        if *steps > MAX_STEPS {
            return None;
        }
        if !first.fits_in(&bins[i]) || tried.contains(&bins[i]) {
            continue;
        }
        tried.push(bins[i].clone());
        let before = bins[i].clone();
        bins[i] = before.checked_sub(first).unwrap_or_default();
        let fits = pack(rest, bins, steps);
        bins[i] = before;
        match fits {
            Some(true) => return Some(true),
            Some(false) => {}
            None => return None,
        }
    }
    Some(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cheapest_pool_is_found_exactly() {
        let cfg = PoolConfig::parse(
            "[node_types.small]\ncpu = 2\nmemory = \"4Gi\"\nmin = 1\nmax = 6\ncost = 0.1\n\
             [node_types.large]\ncpu = 8\nmemory = \"16Gi\"\nmax = 2\ncost = 0.34\n",
        )
        .unwrap();
        let unit = |cpu| Resources::new(cpu, 1 << 30, 0);
        // Four 1-CPU units and four 500m ones: 6 CPUs, three small nodes (0.30 < 0.34 + 0.1).
        let c = cheapest(&cfg, &[(unit(1000), 4), (unit(500), 4)]).unwrap();
        assert!((c - 0.3).abs() < 1e-9, "{c}");
        // Three 1.5-CPU units: one per small node (0.30), or a large one and the min (0.44).
        let c = cheapest(&cfg, &[(unit(1500), 3)]).unwrap();
        assert!((c - 0.3).abs() < 1e-9, "{c}");
        // Nothing: the min still costs.
        assert!((cheapest(&cfg, &[]).unwrap() - 0.1).abs() < 1e-9);
        // More than every node together holds.
        assert_eq!(cheapest(&cfg, &[(unit(2000), 15)]), None);
    }
}
