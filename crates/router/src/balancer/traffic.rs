//! What each endpoint answered, counted without a lock on the request path (a few
//! relaxed atomic adds per answer), for the per-version reports a canary is judged on
//! (`crate::report`).

use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_core::latency::{BUCKETS, bucket};

/// Cumulative counts since the endpoint was added.
#[derive(Debug)]
pub struct Traffic {
    requests: AtomicU64,
    errors: AtomicU64,
    latency: [AtomicU64; BUCKETS],
}

/// A copy of [`Traffic`] at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub errors: u64,
    pub latency: Vec<u64>,
}

impl Default for Counts {
    fn default() -> Self {
        Counts { requests: 0, errors: 0, latency: vec![0; BUCKETS] }
    }
}

impl Counts {
    /// What was counted between `before` and `self`.
    pub fn since(&self, before: &Counts) -> Counts {
        Counts {
            requests: self.requests.saturating_sub(before.requests),
            errors: self.errors.saturating_sub(before.errors),
            latency: self.latency.iter().zip(&before.latency).map(|(a, b)| a.saturating_sub(*b)).collect(),
        }
    }

    pub fn add(&mut self, other: &Counts) {
        self.requests += other.requests;
        self.errors += other.errors;
        for (a, b) in self.latency.iter_mut().zip(&other.latency) {
            *a += b;
        }
    }
}

impl Default for Traffic {
    fn default() -> Self {
        Traffic {
            requests: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            latency: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl Traffic {
    /// One answer (or failure) after `seconds`.
    pub fn count(&self, seconds: f64, failed: bool) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        if failed {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        self.latency[bucket(seconds)].fetch_add(1, Ordering::Relaxed);
    }

    pub fn counts(&self) -> Counts {
        Counts {
            requests: self.requests.load(Ordering::Relaxed),
            errors: self.errors.load(Ordering::Relaxed),
            latency: self.latency.iter().map(|c| c.load(Ordering::Relaxed)).collect(),
        }
    }
}
