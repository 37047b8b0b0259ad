//! What one unit asks of the node pool, in terms both its scheduler and the pool
//! autoscaler understand, so neither needs the other's crate; and the one rule both
//! apply to say whether a node may take a member of it, so the pool never launches (or
//! counts on) capacity the scheduler will not use.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{DEFAULT_DOMAIN, Resources};

/// Where a member may run: on a node carrying, for every key of `labels`, one of its
/// values (the app's `constraints.labels` and the member's own `node_labels` merged),
/// and on a low-priority node only if `allow_low_priority`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, BTreeSet<String>>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_low_priority: bool,
}

impl NodeSelector {
    /// Every label of `exact` with its one value.
    pub fn exact(exact: &BTreeMap<String, String>, allow_low_priority: bool) -> NodeSelector {
        let labels = exact.iter().map(|(k, v)| (k.clone(), BTreeSet::from([v.clone()]))).collect();
        NodeSelector { labels, allow_low_priority }
    }

    /// Whether a node whose labels `label` looks up may run the member.
    pub fn admits<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> Result<(), Refusal> {
        if !self.labels.iter().all(|(k, vs)| label(k).is_some_and(|v| vs.contains(v))) {
            return Err(Refusal::Labels);
        }
        if !self.allow_low_priority && label(LOW_PRIORITY.0) == Some(LOW_PRIORITY.1) {
            return Err(Refusal::LowPriority);
        }
        Ok(())
    }
}

/// One way to run a member: what it asks of a node and which nodes may take it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct MemberOption {
    pub resources: Resources,
    #[serde(default)]
    pub selector: NodeSelector,
}

/// One member of a unit, as the pool sees it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MemberShape {
    /// Its group (`head`, `worker`, or a `[unit.groups.NAME]`), to say whose demand no
    /// node type can hold.
    pub group: String,
    /// Its template, then its alternatives (for another kind of node), in the order its
    /// scheduler tries them: at least one.
    pub options: Vec<MemberOption>,
}

impl MemberShape {
    /// A member with one option, anywhere the app's constraints allow.
    pub fn plain(group: &str, resources: Resources) -> MemberShape {
        MemberShape {
            group: group.to_string(),
            options: vec![MemberOption { resources, selector: NodeSelector::default() }],
        }
    }
}

/// Most sets of options [`option_sets`] gives.
pub const MAX_OPTION_SETS: usize = 32;

/// The ways to run a whole unit at once, where all its members must be planned together
/// (the pool's gangs, a packed unit): for each, every member's option index, in the
/// order to try. Every member as its template first; then each group falling back on
/// its alternatives alone, the others on their templates (the usual case: the GPU group
/// moves to another card, the rest stays); then every member as its `j`-th option (or
/// its last). Repeats are left out; at most [`MAX_OPTION_SETS`]. `members` gives each
/// member's group and how many options it has.
pub fn option_sets<'a>(members: impl Iterator<Item = (&'a str, usize)> + Clone) -> Vec<Vec<usize>> {
    let at = |k: usize, n: usize| k.min(n.saturating_sub(1));
    let mut out: Vec<Vec<usize>> = vec![members.clone().map(|_| 0).collect()];
    let mut push = |set: Vec<usize>| {
        if out.len() < MAX_OPTION_SETS && !out.contains(&set) {
            out.push(set);
        }
    };
    let mut groups: Vec<&str> = Vec::new();
    for (g, n) in members.clone() {
        if n > 1 && !groups.contains(&g) {
            groups.push(g);
        }
    }
    for g in groups {
        let most = members.clone().filter(|(m, _)| *m == g).map(|(_, n)| n).max().unwrap_or(1);
        for k in 1..most {
            push(members.clone().map(|(m, n)| if m == g { at(k, n) } else { 0 }).collect());
        }
    }
    let ways = members.clone().map(|(_, n)| n).max().unwrap_or(1);
    for j in 1..ways {
        push(members.clone().map(|(_, n)| at(j, n)).collect());
    }
    out
}

/// One unit's members and where they may run: the pool autoscaler packs the queued
/// units of every app by it (all members of a unit in one domain).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UnitShape {
    /// Each member, the head first.
    pub members: Vec<MemberShape>,
    /// `spread.max_units_per_domain`: at most this many of the app's units in a domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_units_per_domain: Option<u32>,
    /// With `max_units_per_domain`, how many of the app's units each domain holds: a
    /// domain at the max takes no new unit, and the pool must not count on more room in
    /// one than it has left.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub units_per_domain: BTreeMap<String, u32>,
    /// `spread.max_units_per_node`: at most this many of the app's units on a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_units_per_node: Option<u32>,
    /// With `max_units_per_node`, how many of the app's units each node holds (by node
    /// id): the pool must not count on room there the planner will not use.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub units_per_node: BTreeMap<String, u32>,
    /// `spread.members = "spread"`: each member of a unit on its own node.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub spread_members: bool,
}

/// Why a node may not take a member of a unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    Labels,
    LowPriority,
    DomainFull,
    NodeFull,
}

impl Refusal {
    /// As the scheduler's "why not placed" counts it (`… nodes failing label constraints`).
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::Labels => "failing label constraints",
            Refusal::LowPriority => "of low priority",
            Refusal::DomainFull => "in a domain at max_units_per_domain",
            Refusal::NodeFull => "at max_units_per_node",
        }
    }
}

/// The label and value of a low-priority (preemptible, spot) node.
pub const LOW_PRIORITY: (&str, &str) = ("priority", "low");

/// Whether a node holding `units_here` of an app's units may take a member of one more
/// (`holds_unit`: it holds a member of this very unit, which counts once) under
/// `spread.max_units_per_node` (`max`).
pub fn node_has_room(units_here: u32, max: Option<u32>, holds_unit: bool) -> Result<(), Refusal> {
    match max {
        Some(max) if !holds_unit && units_here >= max => Err(Refusal::NodeFull),
        _ => Ok(()),
    }
}

/// Labels the pool autoscaler puts on each node it launches: whether its type has a `min`
/// (the pool keeps such nodes whatever the demand), and its cost per hour in thousandths.
/// Placement prefers the nodes the pool keeps, then the cheapest, and scale-in removes
/// units elsewhere first, so a pool that grew can shrink again.
pub const POOL_KEEPS: &str = "flotilla.io/pool-keeps";
pub const POOL_COST: &str = "flotilla.io/cost-millis";

/// How much placement prefers a node, other things equal (greater is better): one the
/// pool keeps anyway, then a cheaper one. A node the pool did not launch (no such labels)
/// is kept, at no cost: nothing terminates it.
pub fn preference<'a>(label: impl Fn(&str) -> Option<&'a str>) -> (bool, std::cmp::Reverse<u64>) {
    let cost = label(POOL_COST);
    let keeps = match label(POOL_KEEPS) {
        Some(k) => k == "true",
        None => cost.is_none(),
    };
    (keeps, std::cmp::Reverse(cost.and_then(|c| c.parse().ok()).unwrap_or(0)))
}

impl UnitShape {
    /// Whether a node whose labels `label` looks up may take a member of one more unit
    /// in option `option` (of the secondary group when `secondary`, which may always use
    /// low-priority nodes): its labels, its priority, and its domain's room under
    /// `max_units_per_domain`.
    pub fn admits<'a>(
        &self,
        option: &MemberOption,
        label: impl Fn(&str) -> Option<&'a str>,
        secondary: bool,
    ) -> Result<(), Refusal> {
        let selector = NodeSelector {
            allow_low_priority: option.selector.allow_low_priority || secondary,
            ..option.selector.clone()
        };
        selector.admits(&label)?;
        if self.domain_room(label("domain").unwrap_or(DEFAULT_DOMAIN)) == Some(0) {
            return Err(Refusal::DomainFull);
        }
        Ok(())
    }

    /// How many more of the app's units `domain` may take (`None`: no limit).
    pub fn domain_room(&self, domain: &str) -> Option<u32> {
        let max = self.max_units_per_domain?;
        Some(max.saturating_sub(self.units_per_domain.get(domain).copied().unwrap_or(0)))
    }

    /// The domains that hold `max_units_per_domain` of the app's units already.
    pub fn full_domains(&self) -> BTreeSet<String> {
        self.units_per_domain.keys().filter(|d| self.domain_room(d) == Some(0)).cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_is_admitted_by_labels_priority_and_its_domains_room() {
        let shape = UnitShape {
            units_per_domain: [("domain-a".to_string(), 2), ("domain-b".to_string(), 1)].into(),
            max_units_per_domain: Some(2),
            ..Default::default()
        };
        let option = MemberOption {
            selector: NodeSelector::exact(&[("zone".to_string(), "z1".to_string())].into(), false),
            ..Default::default()
        };
        let node = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v)
        };
        assert_eq!(shape.admits(&option, node(&[("zone", "z1"), ("domain", "domain-b")]), false), Ok(()));
        assert_eq!(shape.admits(&option, node(&[("domain", "domain-b")]), false), Err(Refusal::Labels));
        let low = node(&[("zone", "z1"), ("priority", "low"), ("domain", "domain-b")]);
        assert_eq!(shape.admits(&option, low, false), Err(Refusal::LowPriority));
        assert_eq!(shape.admits(&option, low, true), Ok(()), "a secondary unit may");
        let full = node(&[("zone", "z1"), ("domain", "domain-a")]);
        assert_eq!(shape.admits(&option, full, true), Err(Refusal::DomainFull));
        assert_eq!((shape.domain_room("domain-b"), shape.domain_room("domain-c")), (Some(1), Some(2)));
        assert_eq!(shape.full_domains(), ["domain-a".to_string()].into());
        // A list of values admits any of them.
        let any = NodeSelector {
            labels: [("gpu_model".to_string(), ["a100".to_string(), "h100".to_string()].into())].into(),
            allow_low_priority: true,
        };
        assert_eq!(any.admits(node(&[("gpu_model", "h100"), ("priority", "low")])), Ok(()));
        assert_eq!(any.admits(node(&[("gpu_model", "l4")])), Err(Refusal::Labels));
        assert_eq!(any.admits(node(&[])), Err(Refusal::Labels));
        // Per node: a node at the limit takes only members of units it already holds.
        assert_eq!(node_has_room(2, Some(2), false), Err(Refusal::NodeFull));
        assert_eq!(node_has_room(2, Some(2), true), Ok(()));
        assert_eq!(node_has_room(9, None, false), Ok(()));
    }

    #[test]
    fn option_sets_try_templates_then_one_group_at_a_time_then_matched_sets() {
        let members = [("head", 1), ("cpu", 2), ("gpu", 3), ("gpu", 3)];
        let sets = option_sets(members.iter().copied());
        assert_eq!(
            sets,
            vec![
                vec![0, 0, 0, 0],
                vec![0, 1, 0, 0], // cpu falls back alone
                vec![0, 0, 1, 1], // gpu alone, option by option
                vec![0, 0, 2, 2],
                vec![0, 1, 1, 1], // matched sets
                vec![0, 1, 2, 2],
            ]
        );
        assert_eq!(option_sets([("head", 1)].into_iter()), vec![vec![0]]);
        let many: Vec<(&str, usize)> = (0..9).map(|_| ("a", 8)).chain((0..9).map(|_| ("b", 8))).collect();
        assert!(option_sets(many.iter().copied()).len() <= MAX_OPTION_SETS);
    }

    #[test]
    fn placement_prefers_nodes_the_pool_keeps_then_the_cheapest() {
        let labels = |pairs: &'static [(&'static str, &'static str)]| {
            preference(move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| *v))
        };
        let static_node = labels(&[]);
        let min_node = labels(&[(POOL_KEEPS, "true"), (POOL_COST, "200")]);
        let spot = labels(&[(POOL_KEEPS, "false"), (POOL_COST, "60")]);
        let gpu = labels(&[(POOL_KEEPS, "false"), (POOL_COST, "800")]);
        assert!(static_node > spot && min_node > spot, "kept nodes first");
        assert!(spot > gpu, "then the cheapest");
        assert!(static_node > min_node, "a node nobody pays the pool for before one it does");
        // What a node's labels keep, kept up to date as they change.
        let mut l = crate::Labels::new();
        assert_eq!(l.pool_preference(), static_node);
        l.insert(POOL_KEEPS, "false").unwrap();
        l.insert(POOL_COST, "60").unwrap();
        assert_eq!(l.pool_preference(), spot);
        let parsed: crate::Labels =
            serde_json::from_str(r#"{"flotilla.io/pool-keeps": "true", "flotilla.io/cost-millis": "200"}"#).unwrap();
        assert_eq!(parsed.pool_preference(), min_node);
    }
}
