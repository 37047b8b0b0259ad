//! A global allocator wrapper that counts bytes allocated by the current thread
//! while a measurement is open. The shard uses it to report the bytes a new view
//! version really allocates (structural sharing keeps that small); binaries opt in
//! with `#[global_allocator] static A: flotilla_obs::alloc::Metered = Metered;`.
//!
//! With the `jemalloc` feature (the `flotilla` binary) it allocates from jemalloc, with
//! a background thread returning freed pages within a second: under glibc's malloc a
//! control plane that served bursts of 2,000 connections kept 84 MiB resident for an
//! 8 MiB live heap (fragmented arenas), under jemalloc 24 MiB (BENCHMARKS.md).

use std::alloc::{GlobalAlloc, Layout};

#[cfg(not(feature = "jemalloc"))]
use std::alloc::System as Inner;
#[cfg(feature = "jemalloc")]
use tikv_jemallocator::Jemalloc as Inner;

/// jemalloc's options, read at its first allocation: purge dirty and muzzy pages after
/// a second, from a background thread, so memory freed after a burst goes back to the
/// system without an allocation having to trigger it.
#[cfg(feature = "jemalloc")]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: &[u8; 63] = b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:1000\0";
use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};

/// Heap bytes in use by the whole process (allocated minus freed).
static LIVE: AtomicI64 = AtomicI64::new(0);

thread_local! {
    static METERING: Cell<bool> = const { Cell::new(false) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

pub struct Metered;

// SAFETY: delegates every call to the inner allocator (jemalloc or the system's); the bookkeeping touches
// only const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Metered {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { Inner.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        unsafe { Inner.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        unsafe { Inner.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        unsafe { Inner.realloc(ptr, layout, new_size) }
    }
}

fn note(size: usize) {
    let _ = METERING.try_with(|m| {
        if m.get() {
            let _ = BYTES.try_with(|b| b.set(b.get() + size as u64));
        }
    });
}

/// Runs `f` and returns its result with the bytes it allocated on this thread
/// (0 when the metered allocator is not installed).
pub fn measure<T>(f: impl FnOnce() -> T) -> (T, u64) {
    BYTES.with(|b| b.set(0));
    METERING.with(|m| m.set(true));
    let out = f();
    METERING.with(|m| m.set(false));
    (out, BYTES.with(|b| b.get()))
}

/// Heap bytes the process holds right now (0 when the metered allocator is not installed).
pub fn live_bytes() -> u64 {
    LIVE.load(Ordering::Relaxed).max(0) as u64
}
