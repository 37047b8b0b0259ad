//! Milliseconds since the Unix epoch, from one place, so that a deterministic simulation
//! can run the real shard and scheduler code on simulated time.

use std::sync::OnceLock;

static SOURCE: OnceLock<fn() -> u64> = OnceLock::new();

/// The process's clock: the system's, unless [`install_clock`] replaced it.
pub fn now_ms() -> u64 {
    match SOURCE.get() {
        Some(source) => source(),
        None => system_ms(),
    }
}

/// The system's wall clock (0 before 1970).
pub fn system_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Replaces the process's clock for good; false if one was installed already. Only
/// simulations call it, before they start anything.
pub fn install_clock(source: fn() -> u64) -> bool {
    SOURCE.set(source).is_ok()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_system_clock_is_after_2020() {
        assert!(super::now_ms() > 1_577_836_800_000);
    }
}
