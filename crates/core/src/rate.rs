//! A token bucket per peer address: what one peer may ask of an API. Pure; the clock is
//! passed in. The HTTP API and the shards' gRPC both put one in front of every request.

use crate::LockExt;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Peers whose buckets are kept; past this, idle (full) buckets are forgotten first.
const MAX_TRACKED_PEERS: usize = 65_536;

/// One peer's bucket: `tokens` as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn refilled(&self, rate: f64, burst: f64, now: Instant) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        (self.tokens + elapsed * rate).min(burst)
    }

    /// Takes one token, or says how long until one is there.
    fn take(&mut self, rate: f64, burst: f64, now: Instant) -> Result<(), Duration> {
        let tokens = self.refilled(rate, burst, now);
        self.at = now.max(self.at);
        if tokens >= 1.0 {
            self.tokens = tokens - 1.0;
            Ok(())
        } else {
            self.tokens = tokens;
            Err(Duration::from_secs_f64((1.0 - tokens) / rate))
        }
    }
}

/// A token bucket per peer: `per_second` requests a second, bursts of twice that.
pub struct RateLimiter {
    per_second: u32,
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<IpAddr, Bucket>>,
}

/// The key a peer is limited by: its IPv4 address, or the /64 an IPv6 address is in
/// (one host usually holds a whole /64).
fn peer_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6((u128::from(v6) & !((1u128 << 64) - 1)).into()),
        },
    }
}

impl RateLimiter {
    /// `None` for 0: no limit.
    pub fn new(per_second: u32) -> Option<Self> {
        (per_second > 0).then(|| RateLimiter {
            per_second,
            rate: f64::from(per_second),
            burst: 2.0 * f64::from(per_second),
            buckets: Mutex::new(HashMap::new()),
        })
    }

    pub fn per_second(&self) -> u32 {
        self.per_second
    }

    /// Admits one request from `peer` at `now`, or says how long it should wait.
    pub fn check(&self, peer: IpAddr, now: Instant) -> Result<(), Duration> {
        let key = peer_key(peer);
        let mut buckets = self.buckets.lock_or_recover();
        if !buckets.contains_key(&key) && buckets.len() >= MAX_TRACKED_PEERS {
            let (rate, burst) = (self.rate, self.burst);
            buckets.retain(|_, b| b.refilled(rate, burst, now) < burst);
            if buckets.len() >= MAX_TRACKED_PEERS {
                // Every tracked peer is busy: a new one waits until some bucket refills.
                return Err(Duration::from_secs_f64(1.0 / rate));
            }
        }
        buckets.entry(key).or_insert(Bucket { tokens: self.burst, at: now }).take(self.rate, self.burst, now)
    }

    pub fn tracked_peers(&self) -> usize {
        self.buckets.lock_or_recover().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_peer_gets_its_burst_then_the_rate() {
        let l = RateLimiter::new(10).unwrap();
        let t0 = Instant::now();
        for i in 0..20 {
            assert_eq!(l.check(ip("10.0.0.1"), t0), Ok(()), "request {i} is within the burst of 20");
        }
        let wait = l.check(ip("10.0.0.1"), t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(100), "one token comes back every 1/10 s");
        // Another peer is not affected.
        assert_eq!(l.check(ip("10.0.0.2"), t0), Ok(()));
        // A refusal does not use a token: 100 ms later exactly one request passes.
        let t1 = t0 + Duration::from_millis(100);
        assert_eq!(l.check(ip("10.0.0.1"), t1), Ok(()));
        assert!(l.check(ip("10.0.0.1"), t1).is_err());
        // Idle for long, the bucket is full again but never fuller than the burst.
        let t2 = t1 + Duration::from_secs(3600);
        for _ in 0..20 {
            assert_eq!(l.check(ip("10.0.0.1"), t2), Ok(()));
        }
        assert!(l.check(ip("10.0.0.1"), t2).is_err());
    }

    #[test]
    fn a_clock_going_backwards_gives_no_tokens() {
        let l = RateLimiter::new(1).unwrap();
        let t0 = Instant::now() + Duration::from_secs(10);
        assert!(l.check(ip("10.0.0.1"), t0).is_ok());
        assert!(l.check(ip("10.0.0.1"), t0).is_ok());
        assert!(l.check(ip("10.0.0.1"), t0 - Duration::from_secs(5)).is_err());
        assert!(l.check(ip("10.0.0.1"), t0 + Duration::from_millis(999)).is_err());
        assert!(l.check(ip("10.0.0.1"), t0 + Duration::from_secs(1)).is_ok());
    }

    #[test]
    fn an_ipv6_host_is_limited_by_its_64_and_mapped_v4_as_v4() {
        let l = RateLimiter::new(1).unwrap();
        let t0 = Instant::now();
        assert!(l.check(ip("2001:db8:1:2::1"), t0).is_ok());
        assert!(l.check(ip("2001:db8:1:2::ffff"), t0).is_ok());
        assert!(l.check(ip("2001:db8:1:2:abcd::9"), t0).is_err(), "the same /64 shares one bucket");
        assert!(l.check(ip("2001:db8:1:3::1"), t0).is_ok(), "another /64 has its own");
        assert!(l.check(ip("10.1.1.1"), t0).is_ok());
        assert!(l.check(ip("::ffff:10.1.1.1"), t0).is_ok());
        assert!(l.check(ip("10.1.1.1"), t0).is_err(), "a v4-mapped address is the v4 peer");
    }

    #[test]
    fn zero_disables_the_limit() {
        assert!(RateLimiter::new(0).is_none());
    }

    #[test]
    fn idle_peers_are_forgotten_when_the_table_is_full() {
        let l = RateLimiter::new(1).unwrap();
        let t0 = Instant::now();
        for i in 0..MAX_TRACKED_PEERS as u32 {
            assert!(l.check(IpAddr::V4(i.into()), t0).is_ok());
        }
        assert_eq!(l.tracked_peers(), MAX_TRACKED_PEERS);
        // Every bucket is busy: a new peer must wait.
        assert!(l.check(ip("255.255.255.255"), t0).is_err());
        // Once they refill, the idle ones make room.
        let t1 = t0 + Duration::from_secs(2);
        assert!(l.check(ip("255.255.255.255"), t1).is_ok());
        assert_eq!(l.tracked_peers(), 1);
    }
}
