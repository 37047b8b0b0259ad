//! A handle that, once an operation on it fails, is closed and reopened with back-off
//! until it works again. redb refuses every write after an I/O error ("Previous I/O
//! error occurred. Please close and re-open the database."), so a store that hit a full
//! disk once would refuse writes for ever; and a full disk is not fixed in
//! milliseconds, so reopens are spaced out (each one costs a commit). The scheduler's
//! and the pool's stores both wrap their database in one; they count and log what
//! [`Reopening::get`] and [`Reopening::fail`] report.

use std::time::{Duration, Instant};

use crate::Backoff;

pub struct Reopening<T> {
    /// `None` once closed after a failure and not reopened yet.
    handle: Option<T>,
    failing: Option<Failing>,
    first: Duration,
    max: Duration,
}

/// Since when and why operations fail, and when the handle is reopened next.
struct Failing {
    error: String,
    since_unix_ms: u64,
    next_reopen: Instant,
    backoff: Backoff,
}

/// Why [`Reopening::get`] gave no handle.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unavailable {
    /// Failing, and the back-off does not allow a reopen yet.
    #[error("unavailable since an operation failed: {0}")]
    Waiting(String),
    /// The reopen this call tried failed (counted as a failure: the back-off grows).
    #[error("unavailable: reopening failed: {0}")]
    ReopenFailed(String),
}

impl<T> Reopening<T> {
    /// A healthy handle; after a failure the first reopen waits `first`, doubling up to
    /// `max`.
    pub fn new(handle: T, first: Duration, max: Duration) -> Self {
        Reopening { handle: Some(handle), failing: None, first, max }
    }

    /// Why operations fail now (since one failed, until a reopen succeeds).
    pub fn failing(&self) -> Option<&str> {
        self.failing.as_ref().map(|f| f.error.as_str())
    }

    /// Notes that an operation on the handle failed with `error`. Returns true when this
    /// starts a failing period (log that one; count every one).
    pub fn fail(&mut self, error: impl Into<String>) -> bool {
        let started = self.failing.is_none();
        let (first, max) = (self.first, self.max);
        let f = self.failing.get_or_insert_with(|| Failing {
            error: String::new(),
            since_unix_ms: crate::now_ms(),
            next_reopen: Instant::now(),
            backoff: Backoff::new(first, max),
        });
        f.error = error.into();
        f.next_reopen = Instant::now() + f.backoff.next_wait();
        started
    }

    /// The handle, reopened first with `open` when failing and the back-off allows (the
    /// old handle is dropped before: redb refuses a second handle on one file). Also
    /// says, when this call reopened it, for how long it had failed (ms).
    pub fn get<E: std::fmt::Display>(
        &mut self,
        open: impl FnOnce() -> Result<T, E>,
    ) -> Result<(&T, Option<u64>), Unavailable> {
        let mut reopened = None;
        if let Some(f) = &self.failing {
            if Instant::now() < f.next_reopen {
                return Err(Unavailable::Waiting(f.error.clone()));
            }
            self.handle = None;
            match open() {
                Ok(h) => {
                    reopened = self.failing.take().map(|f| crate::now_ms().saturating_sub(f.since_unix_ms));
                    self.handle = Some(h);
                }
                Err(e) => {
                    let e = e.to_string();
                    self.fail(e.clone());
                    return Err(Unavailable::ReopenFailed(e));
                }
            }
        }
        match &self.handle {
            Some(h) => Ok((h, reopened)),
            None => Err(Unavailable::Waiting("closed".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_handle_is_reopened_once_the_back_off_allows_and_then_is_healthy() {
        let mut r = Reopening::new(1u32, Duration::ZERO, Duration::ZERO);
        assert_eq!(r.get(|| Err::<u32, _>("unused")).map(|(h, re)| (*h, re)), Ok((1, None)));
        assert!(r.fail("disk full"), "the first failure starts a period");
        assert!(!r.fail("disk still full"), "later ones do not");
        assert_eq!(r.failing(), Some("disk still full"));
        // The reopen fails: still failing, with the reopen's error.
        assert_eq!(r.get(|| Err::<u32, _>("no space")), Err(Unavailable::ReopenFailed("no space".into())));
        assert_eq!(r.failing(), Some("no space"));
        let (h, reopened) = r.get(|| Ok::<_, String>(2)).unwrap();
        assert_eq!((*h, reopened.is_some()), (2, true), "a new handle, and it says it reopened");
        assert_eq!(r.failing(), None);
        assert_eq!(r.get(|| Err::<u32, _>("unused")).map(|(h, re)| (*h, re)), Ok((2, None)));
    }

    #[test]
    fn no_reopen_before_the_back_off_has_passed() {
        let mut r = Reopening::new(1u32, Duration::from_secs(3600), Duration::from_secs(3600));
        r.fail("disk full");
        let mut tried = false;
        let got = r.get(|| {
            tried = true;
            Ok::<_, String>(2)
        });
        assert_eq!(got.err(), Some(Unavailable::Waiting("disk full".into())));
        assert!(!tried, "the back-off holds the reopen");
    }
}
