//! Resource vectors for packing. A plan interns its resource names once (CPU, memory and
//! GPU first, custom names after), so a fit test is a loop over a few integers instead
//! of string-keyed map lookups: this is where most of the speed over Ray comes from.

use std::collections::HashMap;

/// A quantity in fixed point: memory in bytes, every other resource in thousandths
/// (1 CPU = 1000), the precision Flotilla's own `cpu_millis` has.
pub type Qty = u64;

pub const CPU: usize = 0;
pub const MEMORY: usize = 1;
pub const GPU: usize = 2;

/// The largest quantity of one resource a request or node type may name: beyond it a
/// number is a mistake (or an attack), not a machine.
pub const MAX_QTY: Qty = 1 << 52;
/// At most this many distinct resource names in one plan.
pub const MAX_RESOURCE_NAMES: usize = 64;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ShapeError {
    #[error("{name} = {value} is not a finite, non-negative number")]
    Negative { name: String, value: f64 },
    #[error("{name} = {value} is absurdly large (at most {max})")]
    TooLarge { name: String, value: f64, max: f64 },
    #[error("more than {MAX_RESOURCE_NAMES} resource names")]
    TooManyNames,
    #[error("resource name {0:?} is empty or longer than 63 bytes")]
    BadName(String),
}

/// The resource names of one plan, by index.
#[derive(Debug, Clone)]
pub struct ResourceNames {
    names: Vec<String>,
    index: HashMap<String, usize>,
}

impl Default for ResourceNames {
    fn default() -> Self {
        let names: Vec<String> = ["CPU", "memory", "GPU"].map(String::from).into();
        let index = names.iter().enumerate().map(|(i, n)| (n.clone(), i)).collect();
        ResourceNames { names, index }
    }
}

impl ResourceNames {
    /// The index of `name`, adding it if new.
    pub fn intern(&mut self, name: &str) -> Result<usize, ShapeError> {
        if let Some(i) = self.index.get(name) {
            return Ok(*i);
        }
        if name.is_empty() || name.len() > 63 {
            return Err(ShapeError::BadName(name.to_string()));
        }
        if self.names.len() >= MAX_RESOURCE_NAMES {
            return Err(ShapeError::TooManyNames);
        }
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), self.names.len() - 1);
        Ok(self.names.len() - 1)
    }

    pub fn get(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    pub fn name(&self, i: usize) -> &str {
        self.names.get(i).map(String::as_str).unwrap_or("?")
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// `value` of resource `i` (cores, bytes, units) in fixed point, rounded up so a
    /// request never shrinks.
    pub fn to_qty(&self, i: usize, value: f64) -> Result<Qty, ShapeError> {
        let name = || self.name(i).to_string();
        if !value.is_finite() || value < 0.0 {
            return Err(ShapeError::Negative { name: name(), value });
        }
        let scaled = if i == MEMORY { value } else { value * 1000.0 };
        let max = MAX_QTY as f64;
        if scaled > max {
            let unit = if i == MEMORY { 1.0 } else { 1000.0 };
            return Err(ShapeError::TooLarge { name: name(), value, max: max / unit });
        }
        // Float noise (0.1 + 0.2) must not round 300.00000000000006 thousandths up to 301.
        let rounded = scaled.round();
        Ok(if (scaled - rounded).abs() < 1e-6 { rounded as Qty } else { scaled.ceil() as Qty })
    }

    /// A fixed-point quantity back in the resource's own unit.
    pub fn to_value(&self, i: usize, q: Qty) -> f64 {
        if i == MEMORY { q as f64 } else { q as f64 / 1000.0 }
    }
}

/// A resource vector over a plan's [`ResourceNames`]; entries past the end are zero.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shape(pub Vec<Qty>);

impl Shape {
    pub fn zero(n: usize) -> Self {
        Shape(vec![0; n])
    }

    pub fn get(&self, i: usize) -> Qty {
        self.0.get(i).copied().unwrap_or(0)
    }

    pub fn set(&mut self, i: usize, q: Qty) {
        if self.0.len() <= i {
            self.0.resize(i + 1, 0);
        }
        self.0[i] = q;
    }

    /// True when every resource of `self` (a request) is within `available`.
    pub fn fits_in(&self, available: &Shape) -> bool {
        self.0.iter().enumerate().all(|(i, q)| *q == 0 || *q <= available.get(i))
    }

    /// How many copies of `self` fit into `available` (`u64::MAX` for a zero request).
    pub fn copies_in(&self, available: &Shape) -> u64 {
        let mut n = u64::MAX;
        for (i, q) in self.0.iter().enumerate() {
            if *q > 0 {
                n = n.min(available.get(i) / q);
            }
        }
        n
    }

    /// `self -= other * n`, saturating at zero (callers check the fit first).
    pub fn sub_times(&mut self, other: &Shape, n: u64) {
        for (i, q) in other.0.iter().enumerate() {
            if *q > 0 {
                let v = self.get(i).saturating_sub(q.saturating_mul(n));
                self.set(i, v);
            }
        }
    }

    /// `self += other * n`, saturating.
    pub fn add_times(&mut self, other: &Shape, n: u64) {
        for (i, q) in other.0.iter().enumerate() {
            if *q > 0 {
                let v = self.get(i).saturating_add(q.saturating_mul(n));
                self.set(i, v);
            }
        }
    }

    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|q| *q == 0)
    }

    /// Indices of the resources this shape asks for.
    pub fn kinds(&self) -> impl Iterator<Item = usize> + '_ {
        self.0.iter().enumerate().filter(|(_, q)| **q > 0).map(|(i, _)| i)
    }

    /// A Flotilla resource vector as a shape (custom resources are whole units). The
    /// artifact cache's cap is left out: nothing asks for it, and a dimension every node
    /// has and no demand uses would only dilute the packing's utilisation scores.
    pub fn from_resources(r: &flotilla_core::Resources, names: &mut ResourceNames) -> Result<Shape, ShapeError> {
        let mut s = Shape::zero(3);
        s.set(CPU, r.cpu_millis.min(MAX_QTY));
        s.set(MEMORY, r.memory_bytes.min(MAX_QTY));
        s.set(GPU, u64::from(r.gpu) * 1000);
        for (k, v) in r.custom.iter().filter(|(k, _)| *k != flotilla_core::ARTIFACT_CACHE_RESOURCE) {
            let i = names.intern(k)?;
            s.set(i, v.saturating_mul(1000).min(MAX_QTY));
        }
        Ok(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_artifact_cache_takes_no_part_in_packing() {
        let mut r = flotilla_core::Resources::new(2000, 1 << 30, 0);
        r.custom.insert("tpu".into(), 2);
        let mut names = ResourceNames::default();
        let plain = Shape::from_resources(&r, &mut names).unwrap();
        r.custom.insert(flotilla_core::ARTIFACT_CACHE_RESOURCE.into(), 20 << 30);
        assert_eq!(Shape::from_resources(&r, &mut names).unwrap(), plain);
    }

    #[test]
    fn quantities_are_fixed_point_and_never_shrink() {
        let n = ResourceNames::default();
        assert_eq!(n.to_qty(CPU, 0.5), Ok(500));
        assert_eq!(n.to_qty(CPU, 0.1 + 0.2), Ok(300));
        assert_eq!(n.to_qty(CPU, 0.0001), Ok(1), "a tiny request still asks for something");
        assert_eq!(n.to_qty(MEMORY, 1024.0), Ok(1024));
        assert!(matches!(n.to_qty(GPU, -1.0), Err(ShapeError::Negative { .. })));
        assert!(matches!(n.to_qty(GPU, f64::NAN), Err(ShapeError::Negative { .. })));
        assert!(matches!(n.to_qty(CPU, 1e300), Err(ShapeError::TooLarge { .. })));
    }

    #[test]
    fn fits_and_copies() {
        let node = Shape(vec![8000, 32 << 30, 0]);
        let req = Shape(vec![2000, 10 << 30]);
        assert!(req.fits_in(&node));
        assert_eq!(req.copies_in(&node), 3, "memory allows 3, CPU 4");
        let gpu = Shape(vec![0, 0, 1000]);
        assert!(!gpu.fits_in(&node));
        let mut left = node.clone();
        left.sub_times(&req, 3);
        assert_eq!(left, Shape(vec![2000, 2 << 30, 0]));
    }

    #[test]
    fn names_are_interned_and_bounded() {
        let mut n = ResourceNames::default();
        assert_eq!(n.intern("GPU"), Ok(GPU));
        assert_eq!(n.intern("TPU"), Ok(3));
        assert_eq!(n.intern("TPU"), Ok(3));
        assert!(n.intern("").is_err());
        for i in 0..100 {
            if n.intern(&format!("r{i}")).is_err() {
                assert_eq!(n.len(), MAX_RESOURCE_NAMES);
                return;
            }
        }
        panic!("the name table grew without bound");
    }
}
