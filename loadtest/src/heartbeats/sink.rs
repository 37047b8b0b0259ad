//! The kernel's limit on the loadtest's own flows: a bare receiver per shard, the shard's
//! receive loop (`flotilla_aggregator::receive_batches`: the same socket options, the same
//! `recvmmsg` batches and pauses) with nothing done per datagram. Its datagrams per
//! CPU-second are what a shard could reach if opening, verifying and recording a
//! heartbeat cost nothing.

use std::net::SocketAddr;
use std::os::unix::thread::JoinHandleExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;

use anyhow::Context;

pub struct Sink {
    pub addrs: Vec<SocketAddr>,
    received: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<(JoinHandle<()>, libc::clockid_t)>,
}

impl Sink {
    /// `n` receivers on loopback, each its own socket and thread.
    pub fn start(n: usize) -> anyhow::Result<Sink> {
        let (received, stop) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicBool::new(false)));
        let mut sink = Sink { addrs: Vec::new(), received: received.clone(), stop: stop.clone(), threads: Vec::new() };
        for i in 0..n {
            let socket = flotilla_aggregator::heartbeat_socket(SocketAddr::from(([127, 0, 0, 1], 0)))?;
            sink.addrs.push(socket.local_addr()?);
            let (received, stop) = (received.clone(), stop.clone());
            let thread = std::thread::Builder::new().name(format!("sink-{i}")).spawn(move || {
                flotilla_aggregator::receive_batches(&socket, &stop, |batch| {
                    received.fetch_add(batch.len() as u64, Ordering::Relaxed);
                })
            })?;
            let mut clock: libc::clockid_t = 0;
            // SAFETY: the thread is not joined before `Drop` (its receive loop returns only once
            // `stop` is set there), so its pthread id is valid; `clock` is a valid out-pointer.
            let r = unsafe { libc::pthread_getcpuclockid(thread.as_pthread_t(), &mut clock) };
            anyhow::ensure!(r == 0, "no CPU clock for the sink thread: {}", std::io::Error::from_raw_os_error(r));
            sink.threads.push((thread, clock));
        }
        Ok(sink)
    }

    /// Datagrams received so far, by all receivers.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// CPU time the receivers have used so far (user and system).
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let mut total = 0.0;
        for (_, clock) in &self.threads {
            // SAFETY: all-zero timespec is valid; the clock belongs to a thread not yet joined.
            let mut t: libc::timespec = unsafe { std::mem::zeroed() };
            // SAFETY: as above; `t` is a valid out-pointer.
            let r = unsafe { libc::clock_gettime(*clock, &mut t) };
            if r != 0 {
                return Err(std::io::Error::last_os_error()).context("reading a sink thread's CPU clock");
            }
            total += t.tv_sec as f64 + t.tv_nsec as f64 / 1e9;
        }
        Ok(total)
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for (thread, _) in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
