//! A latency histogram with fixed, shared bucket bounds: routers count each version's
//! answers into it and the scheduler judging a canary adds several routers' counts up.
//! Summing counts is exact where averaging quantiles is not, and fixed bounds mean the
//! two sides need to agree on nothing but this file.
//!
//! Bucket `i` holds latencies up to `FIRST × GROWTH^i` (100 µs growing by 15 %: the last
//! bound is about 100 s, anything slower lands in the last bucket). A quantile read from
//! it is within half a bucket, about 7 %, of the true one.

/// Buckets in a histogram; a report with another count is refused.
pub const BUCKETS: usize = 100;
/// The first bucket's upper bound, in seconds.
const FIRST: f64 = 100e-6;
/// Each bound over the one before.
const GROWTH: f64 = 1.15;

/// Answers counted over some time: how many, how many failed, and their latencies by
/// bucket. What a router reports per version and what a canary's step is judged on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts {
    pub requests: u64,
    pub errors: u64,
    /// One count per bucket (`BUCKETS` of them).
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
        self.requests = self.requests.saturating_add(other.requests);
        self.errors = self.errors.saturating_add(other.errors);
        for (a, b) in self.latency.iter_mut().zip(&other.latency) {
            *a = a.saturating_add(*b);
        }
    }

    pub fn error_rate(&self) -> f64 {
        if self.requests == 0 { 0.0 } else { self.errors as f64 / self.requests as f64 }
    }

    /// In milliseconds; `None` with no answer counted.
    pub fn p99_ms(&self) -> Option<f64> {
        quantile(&self.latency, 0.99).map(|s| s * 1000.0)
    }
}

/// The upper bound of bucket `i`, in seconds.
pub fn bound(i: usize) -> f64 {
    FIRST * GROWTH.powi(i as i32)
}

/// The bucket a latency of `seconds` is counted in.
pub fn bucket(seconds: f64) -> usize {
    if seconds.is_nan() || seconds <= FIRST {
        return 0;
    }
    let i = ((seconds / FIRST).ln() / GROWTH.ln()).ceil() as usize;
    i.min(BUCKETS - 1)
}

/// The `q` quantile (0..=1) of the latencies counted in `counts` (one per bucket), in
/// seconds, interpolated inside its bucket; `None` when nothing was counted.
pub fn quantile(counts: &[u64], q: f64) -> Option<f64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * total as f64).ceil().max(1.0);
    let mut seen = 0u64;
    for (i, &c) in counts.iter().enumerate() {
        if c == 0 {
            continue;
        }
        if (seen + c) as f64 >= rank {
            let low = if i == 0 { 0.0 } else { bound(i - 1) };
            let within = (rank - seen as f64) / c as f64;
            return Some(low + (bound(i) - low) * within);
        }
        seen += c;
    }
    Some(bound(counts.len().saturating_sub(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_100us_to_100s_and_quantiles_are_within_a_bucket() {
        assert_eq!(bucket(0.0), 0);
        assert_eq!(bucket(f64::NAN), 0);
        assert_eq!(bucket(50e-6), 0);
        assert_eq!(bucket(1e6), BUCKETS - 1);
        assert!(bound(BUCKETS - 1) > 100.0, "{}", bound(BUCKETS - 1));
        for s in [0.0002, 0.001, 0.0123, 0.5, 3.0] {
            let i = bucket(s);
            assert!(s <= bound(i) && s > bound(i - 1), "{s} in bucket {i}");
        }
        assert_eq!(quantile(&[0; BUCKETS], 0.99), None);
        // 99 answers at 1 ms and one at 1 s: the p99 is 1 ms, the max 1 s.
        let mut counts = vec![0u64; BUCKETS];
        counts[bucket(0.001)] += 99;
        counts[bucket(1.0)] += 1;
        let p99 = quantile(&counts, 0.99).unwrap();
        assert!((0.001 / GROWTH..=0.001 * GROWTH).contains(&p99), "{p99}");
        let max = quantile(&counts, 1.0).unwrap();
        assert!((1.0 / GROWTH..=1.0 * GROWTH).contains(&max), "{max}");
    }
}
