//! What each endpoint answered, counted without a lock on the request path (a few
//! relaxed atomic adds per answer), for the per-version reports a canary is judged on
//! (`crate::report`).

use std::sync::atomic::{AtomicU64, Ordering};

pub use flotilla_core::latency::Counts;
use flotilla_core::latency::{BUCKETS, bucket};

/// Cumulative counts since the endpoint was added. The requests are the buckets' sum, not
/// a counter of their own: a copy taken while answers are counted is then still whole
/// (a report whose buckets do not add up to its requests is refused).
#[derive(Debug)]
pub struct Traffic {
    errors: AtomicU64,
    latency: [AtomicU64; BUCKETS],
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
