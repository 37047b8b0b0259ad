//! Exponential back-off with a cap, jitter and a reset, for every retry loop.
//!
//! Each loop that reconnects or restarts something (agent registration, the view and
//! route followers, workload restarts) keeps one [`Backoff`]: it asks for the next wait
//! after a failure and resets it after a success, so one bad spell long ago never
//! stretches the next reconnect. Jitter spreads many clients that failed together
//! (every agent of a restarted shard) so they do not come back in one burst.

use std::time::Duration;

/// Where a back-off's jitter comes from. Injected so tests can seed it and a simulation
/// can derive it from its own clock and replay exactly.
pub trait Jitter {
    /// A sample uniform in `[0, 1)`.
    fn sample(&mut self) -> f64;
}

/// Jitter from the thread's random generator: what production loops use.
#[derive(Debug, Default, Clone, Copy)]
pub struct ThreadJitter;

impl Jitter for ThreadJitter {
    fn sample(&mut self) -> f64 {
        rand::random::<f64>()
    }
}

impl<F: FnMut() -> f64> Jitter for F {
    fn sample(&mut self) -> f64 {
        self()
    }
}

/// Doubles the wait after each failure up to a cap; [`Backoff::reset`] after a success
/// starts again from the initial wait.
#[derive(Debug, Clone)]
pub struct Backoff<J = ThreadJitter> {
    initial: Duration,
    max: Duration,
    /// The un-jittered wait the next failure gets.
    base: Duration,
    /// Each wait is `base × (1 ± spread)`; 0 is no jitter.
    spread: f64,
    /// Failures since the last reset.
    failures: u32,
    jitter: J,
}

impl Backoff<ThreadJitter> {
    /// No jitter until [`Backoff::with_jitter`] asks for some.
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max: max.max(initial), base: initial, spread: 0.0, failures: 0, jitter: ThreadJitter }
    }
}

impl<J: Jitter> Backoff<J> {
    /// Spreads each wait uniformly over `base × (1 - spread) .. base × (1 + spread)`
    /// (`spread` is clamped to `0..=1`), drawing from the thread's random generator
    /// unless [`Backoff::jitter_from`] names another source.
    pub fn with_jitter(mut self, spread: f64) -> Self {
        self.spread = if spread.is_finite() { spread.clamp(0.0, 1.0) } else { 0.0 };
        self
    }

    /// The same back-off drawing its jitter from `jitter`.
    pub fn jitter_from<K: Jitter>(self, jitter: K) -> Backoff<K> {
        let Backoff { initial, max, base, spread, failures, jitter: _ } = self;
        Backoff { initial, max, base, spread, failures, jitter }
    }

    /// The wait before the next attempt, after a failure; the one after it doubles
    /// (up to the cap).
    pub fn next_wait(&mut self) -> Duration {
        let base = self.base;
        self.base = base.saturating_mul(2).min(self.max);
        self.failures = self.failures.saturating_add(1);
        if self.spread == 0.0 {
            return base;
        }
        let sample = self.jitter.sample().clamp(0.0, 1.0);
        base.mul_f64(1.0 - self.spread + 2.0 * self.spread * sample)
    }

    /// After a success: the next failure waits the initial time again.
    pub fn reset(&mut self) {
        self.base = self.initial;
        self.failures = 0;
    }

    /// How many failures came since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_up_to_the_cap() {
        let mut b = Backoff::new(500 * MS, 30_000 * MS);
        let waits: Vec<u64> = (0..9).map(|_| b.next_wait().as_millis() as u64).collect();
        assert_eq!(waits, [500, 1000, 2000, 4000, 8000, 16_000, 30_000, 30_000, 30_000]);
        assert_eq!(b.failures(), 9);
    }

    #[test]
    fn a_reset_starts_again_from_the_initial_wait() {
        let mut b = Backoff::new(200 * MS, 5000 * MS);
        for _ in 0..10 {
            b.next_wait();
        }
        assert_eq!(b.next_wait(), 5000 * MS, "capped after many failures");
        b.reset();
        assert_eq!(b.failures(), 0);
        assert_eq!(b.next_wait(), 200 * MS, "a success brings the initial wait back");
        assert_eq!(b.next_wait(), 400 * MS);
    }

    #[test]
    fn jitter_stays_within_its_spread_of_the_base() {
        use rand::{Rng, SeedableRng};
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut b = Backoff::new(100 * MS, 2000 * MS).with_jitter(0.5).jitter_from(move || rng.random::<f64>());
        let mut base = 100.0;
        let mut seen = Vec::new();
        for _ in 0..200 {
            let w = b.next_wait().as_secs_f64() * 1000.0;
            assert!(w >= base * 0.5 && w < base * 1.5, "{w} ms outside 0.5..1.5 × {base} ms");
            seen.push(w / base);
            base = (base * 2.0).min(2000.0);
        }
        // The samples really spread (a stuck source would not).
        let (lo, hi) = seen.iter().fold((f64::MAX, f64::MIN), |(lo, hi), r| (lo.min(*r), hi.max(*r)));
        assert!(lo < 0.7 && hi > 1.3, "{lo}..{hi}");
    }

    #[test]
    fn the_jitter_source_decides_the_wait_exactly() {
        let mut b = Backoff::new(1000 * MS, 10_000 * MS).with_jitter(0.5).jitter_from(|| 0.0);
        assert_eq!(b.next_wait(), 500 * MS, "the lowest sample halves the wait");
        let mut b = Backoff::new(1000 * MS, 10_000 * MS).with_jitter(0.5).jitter_from(|| 0.5);
        assert_eq!(b.next_wait(), 1000 * MS);
        assert_eq!(b.next_wait(), 2000 * MS, "jitter never changes the doubling");
    }

    #[test]
    fn the_cap_is_never_below_the_initial_wait() {
        let mut b = Backoff::new(3000 * MS, 1000 * MS);
        assert_eq!(b.next_wait(), 3000 * MS);
        assert_eq!(b.next_wait(), 3000 * MS);
    }
}
