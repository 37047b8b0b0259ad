//! A byte-rate limit for uploads, downloads or the origin: each transfer reserves its
//! bytes on a virtual clock and waits for its slot, so a limit holds across many
//! concurrent transfers without a timer per byte.

use std::sync::Mutex;
use std::time::Duration;

use flotilla_core::LockExt;
use tokio::time::Instant;

pub struct Throttle {
    bytes_per_second: Option<f64>,
    next: Mutex<Option<Instant>>,
}

/// Up to this much may go at once after an idle spell.
const BURST: Duration = Duration::from_millis(100);

impl Throttle {
    /// `None` or 0: no limit.
    pub fn new(bytes_per_second: Option<u64>) -> Throttle {
        Throttle { bytes_per_second: bytes_per_second.filter(|r| *r > 0).map(|r| r as f64), next: Mutex::new(None) }
    }

    /// How long `bytes` must wait for their turn (and reserves it).
    pub fn reserve(&self, bytes: u64, now: Instant) -> Duration {
        let Some(rate) = self.bytes_per_second else { return Duration::ZERO };
        let mut next = self.next.lock_or_recover();
        let start = next.map_or(now, |n| n.max(now.checked_sub(BURST).unwrap_or(now)));
        *next = Some(start + Duration::from_secs_f64(bytes as f64 / rate));
        start.saturating_duration_since(now)
    }

    pub async fn take(&self, bytes: u64) {
        let wait = self.reserve(bytes, Instant::now());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfers_queue_behind_each_other_at_the_rate() {
        let t = Throttle::new(Some(1000));
        let now = Instant::now();
        assert_eq!(t.reserve(500, now), Duration::ZERO);
        assert_eq!(t.reserve(500, now), Duration::from_millis(500));
        assert_eq!(t.reserve(1, now), Duration::from_secs(1));
        // Long idle: the next starts at once (a burst of at most BURST is forgiven).
        assert_eq!(t.reserve(1, now + Duration::from_secs(10)), Duration::ZERO);
        assert_eq!(Throttle::new(None).reserve(1 << 30, now), Duration::ZERO);
        assert_eq!(Throttle::new(Some(0)).reserve(1 << 30, now), Duration::ZERO);
    }
}
