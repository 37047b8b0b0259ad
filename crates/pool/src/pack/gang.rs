//! Step 3 of a pass: one gang, all or nothing, in the cheapest domain that holds it.

use std::collections::BTreeMap;

use super::problem::{Gang, Item, Problem, Source, Strategy};
use super::{Context, Outcome, cap_of, group};
use crate::shape::Shape;

/// Every value each gang's `same` label takes, on the nodes and node types: where a
/// gang may go. Nodes a pass launches carry their type's labels, so this is computed
/// once per pass rather than from the nodes for every gang.
pub(super) struct Domains<'p>(BTreeMap<&'p str, Vec<&'p str>>);

impl<'p> Domains<'p> {
    pub fn of(p: &'p Problem) -> Self {
        let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for key in p.gangs.iter().filter_map(|g| g.same.as_deref()) {
            if out.contains_key(key) {
                continue;
            }
            let labels = p.nodes.iter().map(|n| &n.labels).chain(p.node_types.iter().map(|t| &t.labels));
            let mut values: Vec<&str> = labels.filter_map(|l| l.get(key)).map(String::as_str).collect();
            values.sort_unstable();
            values.dedup();
            out.insert(key, values);
        }
        Domains(out)
    }
}

/// `gang` on `ctx` (not applied), with the value of its `same` label it went to, or
/// why it cannot be placed. It goes to no value `full` says is full (a domain at the
/// app's `max_units_per_domain`, this pass's units counted).
pub(super) fn place(
    ctx: &Context,
    gang: &Gang,
    tag: u32,
    domains: &Domains,
    full: &dyn Fn(&str) -> bool,
) -> Result<(Outcome, Option<String>), String> {
    if gang.bundles.is_empty() {
        return Ok((Outcome { filled: Vec::new(), new: Vec::new(), left: Vec::new(), exhausted: Vec::new() }, None));
    }
    let bundle = |shape: Shape, anti: Option<u32>| Item {
        shape,
        count: 1,
        selector: gang.selector.clone(),
        anti,
        cap: cap_of(ctx.p, gang.per_node, Some(tag)),
        label: format!("gang {}", gang.id),
    };
    let items: Vec<Item> = match gang.strategy {
        Strategy::StrictPack => vec![bundle(packed(gang), None)],
        Strategy::StrictSpread => gang.bundles.iter().map(|b| bundle(b.clone(), Some(tag))).collect(),
        Strategy::Pack | Strategy::Spread => gang.bundles.iter().map(|b| bundle(b.clone(), None)).collect(),
    };
    let attempt = |selector_extra: Option<(&str, &str)>| -> Option<Outcome> {
        let items = items
            .iter()
            .map(|item| {
                let mut item = item.clone();
                if let Some((k, v)) = selector_extra {
                    item.selector.require.insert(k.to_string(), v.to_string());
                }
                item
            })
            .collect();
        let (groups, counts) = group(items, &ctx.p.names);
        let o = ctx.try_schedule(&groups, &counts, Source::Demand);
        o.placed_all().then_some(o)
    };
    let Some(key) = &gang.same else {
        return attempt(None).map(|o| (o, None)).ok_or_else(|| infeasible(ctx, gang, false));
    };
    // The cheapest domain wins: fewest new nodes, then lowest cost, then name.
    let new_cost = |o: &Outcome| -> (usize, u64) {
        let cost: f64 = o.new.iter().map(|n| n.node_type.and_then(|t| ctx.p.node_types[t].cost).unwrap_or(0.0)).sum();
        (o.new.len(), (cost * 1e6) as u64)
    };
    let mut best: Option<((usize, u64), Outcome, &str)> = None;
    let mut room = false;
    for v in domains.0.get(key.as_str()).map_or(&[][..], Vec::as_slice) {
        if full(v) {
            continue;
        }
        room = true;
        if let Some(o) = attempt(Some((key, v))) {
            let k = new_cost(&o);
            if best.as_ref().is_none_or(|b| k < b.0) {
                best = Some((k, o, v));
            }
        }
    }
    best.map(|(_, o, v)| (o, Some(v.to_string()))).ok_or_else(|| infeasible(ctx, gang, !room))
}

/// The bundles of a STRICT_PACK gang as one.
fn packed(gang: &Gang) -> Shape {
    let mut sum = Shape::default();
    for b in &gang.bundles {
        sum.add_times(b, 1);
    }
    sum
}

/// Why a gang cannot be placed; `all_full`: every value of its `same` label is full.
fn infeasible(ctx: &Context, gang: &Gang, all_full: bool) -> String {
    if all_full {
        return format!(
            "every {} the pool has or can launch holds the app's max_units_per_domain",
            gang.same.as_deref().unwrap_or("domain")
        );
    }
    let types = &ctx.p.node_types;
    let too_big = gang.bundles.iter().any(|b| !types.iter().any(|t| b.fits_in(&t.resources)));
    let packed_too_big =
        gang.strategy == Strategy::StrictPack && !types.iter().any(|t| packed(gang).fits_in(&t.resources));
    if too_big {
        "a bundle is bigger than every node type".into()
    } else if packed_too_big {
        "STRICT_PACK: the bundles together are bigger than every node type".into()
    } else if gang.same.is_some() {
        format!("no single {} can hold every bundle within the pool's limits", gang.same.as_deref().unwrap_or(""))
    } else {
        "the pool's limits (max per type, max_nodes) cannot hold every bundle".into()
    }
}
