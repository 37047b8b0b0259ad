//! What each endpoint answered, counted without a lock on the request path (a few
//! relaxed atomic adds per answer), for the per-version reports a canary is judged on
//! (`crate::report`).

use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_core::latency::{BUCKETS, bucket};

/// Cumulative counts since the endpoint was added. The requests are the buckets' sum, not
/// a counter of their own: a copy taken while answers are counted is then still whole
/// (a report whose buckets do not add up to its requests is refused).
#[derive(Debug)]
pub struct Traffic {
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
    /// What was counted between `before` and `self`. (An answer counted in `before`
    /// whose error was not yet may show its error here: never more errors than requests.)
    pub fn since(&self, before: &Counts) -> Counts {
        let requests = self.requests.saturating_sub(before.requests);
        Counts {
            requests,
            errors: self.errors.saturating_sub(before.errors).min(requests),
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
        Traffic { errors: AtomicU64::new(0), latency: std::array::from_fn(|_| AtomicU64::new(0)) }
    }
}

impl Traffic {
    /// One answer (or failure) after `seconds`.
    pub fn count(&self, seconds: f64, failed: bool) {
        self.latency[bucket(seconds)].fetch_add(1, Ordering::Relaxed);
        // After its bucket (release): a copy that sees the error sees its answer too.
        if failed {
            self.errors.fetch_add(1, Ordering::Release);
        }
    }

    pub fn counts(&self) -> Counts {
        let errors = self.errors.load(Ordering::Acquire);
        let latency: Vec<u64> = self.latency.iter().map(|c| c.load(Ordering::Relaxed)).collect();
        let requests = latency.iter().sum();
        Counts { requests, errors: errors.min(requests), latency }
    }
}
