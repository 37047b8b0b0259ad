//! Bounds on what one peer may ask of the HTTP API: a token bucket per peer address
//! (pure, the clock passed in) and a cap on request bodies. Every refusal is a JSON
//! error and counts in `flotilla_http_requests_rejected_total{reason}`.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use crate::ApiError;

/// The largest request body the API reads (a spec applied with `flotilla apply` too).
pub const MAX_BODY_BYTES: usize = 1 << 20;

/// Peers whose buckets are kept; past this, idle (full) buckets are forgotten first.
const MAX_TRACKED_PEERS: usize = 65_536;

/// Counts one refused request or connection.
pub fn rejected(reason: &'static str) {
    metrics::counter!("flotilla_http_requests_rejected_total", "reason" => reason).increment(1);
}

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
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
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
        self.buckets.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

/// Puts the rate limit (when `limiter` is set) and the body cap in front of every route.
/// The serving loop puts each connection's peer address in the request's extensions.
pub fn apply(router: Router, limiter: Option<Arc<RateLimiter>>) -> Router {
    router.layer(axum::middleware::from_fn_with_state(limiter, guard))
}

fn is_grpc(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

fn too_large() -> Response {
    rejected("too_large");
    ApiError {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "too_large",
        message: format!("the request body is larger than {MAX_BODY_BYTES} bytes"),
    }
    .into_response()
}

#[tracing::instrument(name = "http_limits", skip_all, fields(method = %req.method(), path = %req.uri().path()))]
async fn guard(State(limiter): State<Option<Arc<RateLimiter>>>, req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    if let (Some(limiter), Some(peer)) = (&limiter, peer)
        && let Err(wait) = limiter.check(peer, Instant::now())
    {
        rejected("rate_limited");
        tracing::debug!(%peer, "rate limited");
        let mut resp = ApiError {
            status: StatusCode::TOO_MANY_REQUESTS,
            code: "rate_limited",
            message: format!(
                "more than {} requests per second from {peer}: retry in {} ms",
                limiter.per_second(),
                wait.as_millis().max(1)
            ),
        }
        .into_response();
        let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
        resp.headers_mut().insert(header::RETRY_AFTER, secs.max(1).into());
        return resp;
    }
    // gRPC streams are bounded by their own message size limit, never buffered here.
    if is_grpc(&req) {
        return next.run(req).await;
    }
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > MAX_BODY_BYTES as u64) {
        return too_large();
    }
    let (parts, body) = req.into_parts();
    let bytes = match http_body_util::Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => return too_large(),
        Err(e) => {
            rejected("bad_body");
            return ApiError {
                status: StatusCode::BAD_REQUEST,
                code: "bad_request",
                message: format!("reading the request body: {e}"),
            }
            .into_response();
        }
    };
    next.run(Request::from_parts(parts, Body::from(bytes))).await
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
