//! Step 3 of a pass: one gang, all or nothing, in the first of its variants that can be
//! placed, in the cheapest domain that holds it.

use std::collections::BTreeMap;

use super::problem::{Bundle, Gang, Item, NodeType, Problem, Selector, Source, Strategy};
use super::{Context, Outcome, cap_of, group};
use crate::shape::Shape;

/// Every value each gang's `same` label takes, on the nodes (those left out too) and node
/// types: where a gang may go. Nodes a pass launches carry their type's labels, so this is computed
/// once per pass rather than from the nodes for every gang.
pub(super) struct Domains<'p>(BTreeMap<&'p str, Vec<&'p str>>);

impl<'p> Domains<'p> {
    pub fn of(p: &'p Problem) -> Self {
        let mut out: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for key in p.gangs.iter().filter_map(|g| g.same.as_deref()) {
            if out.contains_key(key) {
                continue;
            }
            let listed = p.nodes.iter().map(|n| &n.labels).chain(&p.inert.labels);
            let labels = listed.chain(p.node_types.iter().map(|t| &t.labels));
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
/// app's `max_units_per_domain`, this pass's units counted). Its variants are tried in
/// order and the first that can be placed wins, as its scheduler prefers a member's
/// template to its alternatives whatever they cost.
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
    let values: Option<(&str, Vec<&str>)> = gang.same.as_deref().map(|key| {
        let all = domains.0.get(key).map_or(&[][..], Vec::as_slice);
        (key, all.iter().copied().filter(|v| !full(v)).collect())
    });
    for bundles in gang.variants() {
        if let Some(placed) = place_variant(ctx, gang, bundles, tag, values.as_ref()) {
            return Ok(placed);
        }
    }
    Err(infeasible(ctx, gang, values.is_some_and(|(_, open)| open.is_empty())))
}

/// One variant of `gang` (`bundles`), in the cheapest of the `values` of its `same` label
/// (those not full) that holds it.
fn place_variant(
    ctx: &Context,
    gang: &Gang,
    bundles: &[Bundle],
    tag: u32,
    values: Option<&(&str, Vec<&str>)>,
) -> Option<(Outcome, Option<String>)> {
    let item = |shape: Shape, selector: Selector, anti: Option<u32>| Item {
        shape,
        count: 1,
        selector,
        anti,
        cap: cap_of(ctx.p, gang.per_node, Some(tag)),
        label: format!("gang {}", gang.id),
    };
    let items: Vec<Item> = match gang.strategy {
        Strategy::StrictPack => vec![item(packed(bundles), all_of(bundles), None)],
        Strategy::StrictSpread => {
            bundles.iter().map(|b| item(b.shape.clone(), b.selector.clone(), Some(tag))).collect()
        }
        Strategy::Pack | Strategy::Spread => {
            bundles.iter().map(|b| item(b.shape.clone(), b.selector.clone(), None)).collect()
        }
    };
    let attempt = |value: Option<&Selector>| -> Option<Outcome> {
        let items = items
            .iter()
            .map(|item| {
                let mut item = item.clone();
                if let Some(only) = value {
                    item.selector = item.selector.and(only);
                }
                item
            })
            .collect();
        let (groups, counts) = group(items, &ctx.p.names);
        let o = ctx.try_schedule(&groups, &counts, Source::Demand);
        o.placed_all().then_some(o)
    };
    let Some((key, open)) = values else {
        return attempt(None).map(|o| (o, None));
    };
    // The cheapest domain wins: fewest new nodes, then lowest cost, then name.
    let new_cost = |o: &Outcome| -> (usize, u64) {
        let cost: f64 = o.new.iter().map(|n| n.node_type.and_then(|t| ctx.p.node_types[t].cost).unwrap_or(0.0)).sum();
        (o.new.len(), (cost * 1e6) as u64)
    };
    let mut best: Option<((usize, u64), Outcome, &str)> = None;
    for v in open {
        let only = Selector { require: [(key.to_string(), [v.to_string()].into())].into(), forbid: Default::default() };
        if let Some(o) = attempt(Some(&only)) {
            let k = new_cost(&o);
            if best.as_ref().is_none_or(|b| k < b.0) {
                best = Some((k, o, v));
            }
        }
    }
    best.map(|(_, o, v)| (o, Some(v.to_string())))
}

/// The bundles of a STRICT_PACK gang as one.
fn packed(bundles: &[Bundle]) -> Shape {
    let mut sum = Shape::default();
    for b in bundles {
        sum.add_times(&b.shape, 1);
    }
    sum
}

/// Where the bundles of a STRICT_PACK gang, as one, may go: where each of them may.
fn all_of(bundles: &[Bundle]) -> Selector {
    bundles.iter().fold(Selector::default(), |all, b| all.and(&b.selector))
}

/// Why a gang cannot be placed; `all_full`: every value of its `same` label is full.
fn infeasible(ctx: &Context, gang: &Gang, all_full: bool) -> String {
    if all_full {
        return format!(
            "every {} the pool has or can launch holds the app's max_units_per_domain",
            gang.same.as_deref().unwrap_or("domain")
        );
    }
    let unheld = unheld(&ctx.p.node_types, gang);
    if !unheld.is_empty() {
        return unheld.join("; ");
    }
    let types = &ctx.p.node_types;
    let packed_too_big = gang.strategy == Strategy::StrictPack
        && !gang.variants().any(|v| types.iter().any(|t| packed(v).fits_in(&t.resources)));
    if packed_too_big {
        "STRICT_PACK: the bundles together are bigger than every node type".into()
    } else if gang.same.is_some() {
        format!("no single {} can hold every bundle within the pool's limits", gang.same.as_deref().unwrap_or(""))
    } else {
        "the pool's limits (max per type, max_nodes) cannot hold every bundle".into()
    }
}

/// Why each bundle that no node type could hold in any variant, however many the pool
/// launched, cannot be held (once per distinct reason): what an operator must change,
/// the pool file or the app, before the gang can ever run.
fn unheld(types: &[NodeType], gang: &Gang) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (i, first) in gang.bundles.iter().enumerate() {
        let options: Vec<&Bundle> = gang.variants().filter_map(|v| v.get(i)).collect();
        let held = |b: &&Bundle| types.iter().any(|t| b.selector.matches(&t.labels) && b.shape.fits_in(&t.resources));
        if options.iter().any(held) {
            continue;
        }
        let big_enough = options.iter().any(|b| types.iter().any(|t| b.shape.fits_in(&t.resources)));
        let reason = match (big_enough, first.group.as_str()) {
            (false, "") => "a bundle is bigger than every node type".to_string(),
            (false, g) => format!("group {g:?}: a member is bigger than every node type"),
            (true, g) => {
                let mut asks: Vec<String> = Vec::new();
                for b in &options {
                    let d = format!("({})", b.selector.describe());
                    if !asks.contains(&d) {
                        asks.push(d);
                    }
                }
                let whose = if g.is_empty() { "a bundle".to_string() } else { format!("group {g:?}") };
                format!("{whose}: no node type with the labels it asks for {} is big enough", asks.join(" or "))
            }
        };
        if !out.contains(&reason) {
            out.push(reason);
        }
    }
    out
}
