//! A hint to the CPU to start loading memory the program will read soon. Scans that
//! chase a pointer per item (a heartbeat batch's sessions, the planner's candidate
//! nodes) issue it a few items ahead, so the loads overlap instead of each stalling in
//! turn.

/// Prefetches the cache lines of the `len` bytes at `p`. It reads nothing the program
/// sees and never faults, whatever the address, so any pointer will do.
#[inline]
pub fn prefetch(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut at = p as usize & !63;
        while at < p as usize + len {
            // SAFETY: `prefetcht0` is a hint that never faults, whatever the address;
            // SSE, which it belongs to, is part of every x86_64 CPU.
            unsafe { std::arch::x86_64::_mm_prefetch(at as *const i8, std::arch::x86_64::_MM_HINT_T0) };
            at += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

/// Prefetches the value `p` points to.
#[inline]
pub fn prefetch_value<T>(p: *const T) {
    prefetch(p.cast(), std::mem::size_of::<T>());
}
