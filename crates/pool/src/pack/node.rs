//! One node as the packer sees it (existing, pending or to be launched), and Ray v2's
//! utilisation score for what a pass put on it.

use std::cmp::Ordering;
use std::sync::Arc;

use super::pending::Pending;
use super::problem::{Group, Labels, Source};
use crate::shape::{GPU, ResourceNames, Shape};

/// Where a simulated node comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// `Problem::nodes[i]`.
    Existing(usize),
    /// A new node of `Problem::node_types[t]`.
    New(usize),
}

#[derive(Debug, Clone)]
pub(super) struct SimNode {
    pub origin: Origin,
    pub node_type: Option<usize>,
    pub total: Shape,
    /// Free for pending demand: what the node has free, less what this pass put on it.
    pub free: Shape,
    /// Free for the cluster floor: the node's whole capacity less the floor put on it
    /// (a floor asks for capacity to exist, not to be free).
    pub free_floor: Shape,
    pub labels: Arc<Labels>,
    /// The gangs (tags) with bundles here that anti-affinity or a per-node limit cares for.
    pub tags: Vec<u32>,
    /// Units here, by per-node limit: (limit, count).
    pub units: Vec<(u32, u32)>,
    pub placed: [u64; 2],
    /// Resource kinds (bitmask) of what was placed, by source.
    pub kinds: [u64; 2],
    /// Whether anything placed here, by source, asks for a GPU.
    pub gpu_asked: [bool; 2],
    pub terminate: bool,
}

/// Ray v2's score: conserve GPU nodes, then match the most resource kinds, then the best
/// minimum and mean utilisation (each weighted `total × util³`, as Ray does).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Score {
    pub gpu_ok: bool,
    /// Negated cost per request placed, when every node type has a cost (else 0).
    pub thrift: f64,
    pub matching_kinds: u32,
    pub min_util: f64,
    pub mean_util: f64,
}

impl Score {
    pub fn cmp(&self, other: &Score) -> Ordering {
        self.gpu_ok
            .cmp(&other.gpu_ok)
            .then(self.thrift.total_cmp(&other.thrift))
            .then(self.matching_kinds.cmp(&other.matching_kinds))
            .then(self.min_util.total_cmp(&other.min_util))
            .then(self.mean_util.total_cmp(&other.mean_util))
    }
}

impl SimNode {
    pub fn new(origin: Origin, node_type: Option<usize>, total: Shape, free: Shape, labels: Arc<Labels>) -> Self {
        SimNode {
            origin,
            node_type,
            free_floor: total.clone(),
            total,
            free,
            labels,
            tags: Vec::new(),
            units: Vec::new(),
            placed: [0; 2],
            kinds: [0; 2],
            gpu_asked: [false; 2],
            terminate: false,
        }
    }

    fn free_mut(&mut self, source: Source) -> &mut Shape {
        match source {
            Source::Demand => &mut self.free,
            Source::Floor => &mut self.free_floor,
        }
    }

    pub fn free_of(&self, source: Source) -> &Shape {
        match source {
            Source::Demand => &self.free,
            Source::Floor => &self.free_floor,
        }
    }

    /// How many of `g` this node can take now (at most `want`).
    pub fn room_for(&self, g: &Group, source: Source, want: u64) -> u64 {
        if want == 0 || !g.selector.matches(&self.labels) {
            return 0;
        }
        let mut n = want.min(g.shape.copies_in(self.free_of(source)));
        if let Some(tag) = g.anti {
            if self.tags.contains(&tag) {
                return 0;
            }
            n = n.min(1);
        }
        if let Some(cap) = g.cap {
            let room = u64::from(cap.max.saturating_sub(self.units_of(cap.limit)));
            n = match cap.unit {
                Some(unit) if self.tags.contains(&unit) => n,
                Some(_) if room == 0 => 0,
                Some(_) => n,
                None => n.min(room),
            };
        }
        n
    }

    pub fn units_of(&self, limit: u32) -> u32 {
        self.units.iter().find(|(l, _)| *l == limit).map_or(0, |(_, c)| *c)
    }

    pub fn add_units(&mut self, limit: u32, n: u32) {
        match self.units.iter_mut().find(|(l, _)| *l == limit) {
            Some((_, c)) => *c = c.saturating_add(n),
            None => self.units.push((limit, n)),
        }
    }

    pub fn place(&mut self, g: &Group, source: Source, n: u64) {
        if n == 0 {
            return;
        }
        self.free_mut(source).sub_times(&g.shape, n);
        let s = source as usize;
        self.placed[s] += n;
        self.kinds[s] |= g.kinds;
        self.gpu_asked[s] |= g.shape.get(GPU) > 0;
        if let Some(cap) = g.cap {
            match cap.unit {
                Some(unit) if self.tags.contains(&unit) => {}
                Some(unit) => {
                    self.tags.push(unit);
                    self.add_units(cap.limit, 1);
                }
                None => self.add_units(cap.limit, u32::try_from(n).unwrap_or(u32::MAX)),
            }
        }
        if let Some(tag) = g.anti.filter(|t| !self.tags.contains(t)) {
            self.tags.push(tag);
        }
    }

    /// Fills the node with the pending groups in their order, the way Ray tries a node:
    /// each request in the sorted order, no backtracking. Identical requests are one
    /// group, so this is one division per group placed, and the index skips the groups
    /// that do not fit. Returns what it took: (group, count). `pending` is not changed.
    pub fn fill(&mut self, pending: &Pending, source: Source) -> Vec<(usize, u64)> {
        let mut took = Vec::new();
        let mut from = 0;
        while let Some(g) = pending.next_fit(from, self.free_of(source)) {
            let group = &pending.groups[g];
            let n = self.room_for(group, source, pending.left[g]);
            if n > 0 {
                self.place(group, source, n);
                took.push((g, n));
            }
            from = g + 1;
        }
        took
    }

    pub fn score(&self, source: Source, names: &ResourceNames, cost: Option<f64>) -> Score {
        let s = source as usize;
        let free = self.free_of(source);
        let mut matching = 0;
        let mut kinds = self.kinds[s];
        while kinds != 0 {
            let i = kinds.trailing_zeros() as usize;
            if self.total.get(i) > 0 {
                matching += 1;
            }
            kinds &= kinds - 1;
        }
        let (mut min, mut sum, mut n) = (f64::INFINITY, 0.0, 0u32);
        for (i, total) in self.total.0.iter().enumerate() {
            if *total == 0 {
                continue;
            }
            let util = (*total - free.get(i).min(*total)) as f64 / *total as f64;
            let weighted = names.to_value(i, *total) * util * util * util;
            min = min.min(weighted);
            sum += weighted;
            n += 1;
        }
        // A GPU node is only "ok" for work that asks for a GPU.
        let gpu_ok = self.total.get(GPU) == 0 || self.gpu_asked[s];
        let thrift = match cost {
            Some(c) if self.placed[s] > 0 => -(c / self.placed[s] as f64),
            _ => 0.0,
        };
        Score {
            gpu_ok,
            thrift,
            matching_kinds: matching,
            min_util: if n == 0 { 0.0 } else { min },
            mean_util: if n == 0 { 0.0 } else { sum / f64::from(n) },
        }
    }
}
