//! The requests a pass still has to place, with an index that finds the next one that
//! fits a node's free resources without walking the others.
//!
//! Ray's fill tries every pending request in order on a node; once a node is nearly
//! full most of them do not fit, and walking them all for every node made a pass
//! quadratic in distinct shapes (1,000,000 of them did not finish in 300 s). A segment
//! tree over the groups, in their order, keeps for each range the componentwise minimum
//! of the shapes still pending: a range whose minimum does not fit has nothing that
//! fits, so a fill visits only the groups it places and the ranges it rules out, and
//! places exactly what the walk placed.

use super::problem::Group;
use crate::shape::{Qty, Shape};

pub(super) struct Pending<'g> {
    pub groups: &'g [Group],
    /// Still to place, by group.
    pub left: Vec<u64>,
    /// The resources any group asks for (indices into a shape): the tree keeps only
    /// those, so a custom resource with a high index costs no memory per group.
    used: Vec<usize>,
    dims: usize,
    /// Leaves in the tree (a power of two ≥ the groups).
    size: usize,
    /// Node `i`'s minimum of resource `d` is `mins[i * dims + d]` (heap layout, root 1);
    /// `Qty::MAX` where nothing is pending.
    mins: Vec<Qty>,
    pending: usize,
}

impl<'g> Pending<'g> {
    pub fn new(groups: &'g [Group], counts: &[u64]) -> Self {
        let width = groups.iter().map(|g| g.shape.0.len()).max().unwrap_or(0);
        let used: Vec<usize> = (0..width).filter(|d| groups.iter().any(|g| g.shape.get(*d) > 0)).collect();
        let dims = used.len().max(1);
        let size = groups.len().max(1).next_power_of_two();
        let mut mins = vec![Qty::MAX; 2 * size * dims];
        let mut pending = 0;
        for (i, g) in groups.iter().enumerate() {
            if counts.get(i).copied().unwrap_or(0) == 0 {
                continue;
            }
            pending += 1;
            let leaf = (size + i) * dims;
            for (k, d) in used.iter().enumerate() {
                mins[leaf + k] = g.shape.get(*d);
            }
            if used.is_empty() {
                // Zero shapes fit anywhere.
                mins[leaf] = 0;
            }
        }
        for n in (1..size).rev() {
            for d in 0..dims {
                mins[n * dims + d] = mins[2 * n * dims + d].min(mins[(2 * n + 1) * dims + d]);
            }
        }
        Pending { groups, left: counts.to_vec(), used, dims, size, mins, pending }
    }

    pub fn is_empty(&self) -> bool {
        self.pending == 0
    }

    /// Takes `n` of group `g` (placed on a node).
    pub fn take(&mut self, g: usize, n: u64) {
        let was = self.left[g];
        self.left[g] = was.saturating_sub(n);
        if was > 0 && self.left[g] == 0 {
            self.pending -= 1;
            let mut i = self.size + g;
            self.mins[i * self.dims..(i + 1) * self.dims].fill(Qty::MAX);
            while i > 1 {
                i /= 2;
                for d in 0..self.dims {
                    let m = self.mins[2 * i * self.dims + d].min(self.mins[(2 * i + 1) * self.dims + d]);
                    self.mins[i * self.dims + d] = m;
                }
            }
        }
    }

    /// The first group at or after `from`, with something left, whose shape fits in
    /// `free` (resources only: labels, spread and limits are the node's to check).
    pub fn next_fit(&self, from: usize, free: &Shape) -> Option<usize> {
        if from >= self.groups.len() {
            return None;
        }
        self.find(1, 0, self.size, from, free)
    }

    fn fits(&self, node: usize, free: &Shape) -> bool {
        let m = &self.mins[node * self.dims..(node + 1) * self.dims];
        if self.used.is_empty() {
            return m[0] == 0;
        }
        m.iter().zip(&self.used).all(|(q, d)| *q == 0 || *q <= free.get(*d))
    }

    fn find(&self, node: usize, lo: usize, hi: usize, from: usize, free: &Shape) -> Option<usize> {
        if hi <= from || !self.fits(node, free) {
            return None;
        }
        if hi - lo == 1 {
            return (lo < self.groups.len()).then_some(lo);
        }
        let mid = (lo + hi) / 2;
        self.find(2 * node, lo, mid, from, free).or_else(|| self.find(2 * node + 1, mid, hi, from, free))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn group(cpu: u64, mem: u64) -> Group {
        Group {
            shape: Shape(vec![cpu, mem]),
            selector: Arc::default(),
            anti: None,
            cap: None,
            kinds: 0b11,
            sources: vec![],
        }
    }

    /// The index finds what a walk over every group in order finds.
    #[test]
    fn next_fit_is_the_first_pending_group_that_fits() {
        let mut seed = 7u64;
        let mut rnd = |m: u64| {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (seed >> 33) % m
        };
        let groups: Vec<Group> = (0..300).map(|_| group(rnd(8) * 250, rnd(6) << 30)).collect();
        let counts: Vec<u64> = (0..300).map(|_| rnd(3)).collect();
        let mut p = Pending::new(&groups, &counts);
        for _ in 0..2000 {
            let free = Shape(vec![rnd(2000), rnd(6) << 30]);
            let from = rnd(310) as usize;
            let walk = (from..groups.len()).find(|g| p.left[*g] > 0 && groups[*g].shape.fits_in(&free));
            assert_eq!(p.next_fit(from, &free), walk, "from {from} free {free:?}");
            if let Some(g) = walk {
                p.take(g, rnd(2) + 1);
            }
        }
        assert_eq!(p.is_empty(), p.left.iter().all(|l| *l == 0));
    }
}
