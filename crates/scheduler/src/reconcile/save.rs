//! How a pass's writes reach the store without stalling the runtime that runs every
//! other app of the process.

use crate::store::{Store, StoreError, Write};

/// Writers handed off their worker at once ([`save`]). Each is a thread, and every
/// thread a process ever ran stays on the list that each `ArcSwap` store walks to pay
/// its readers' debts (`arc_swap`'s hybrid strategy): the view follower stores on every
/// delta. A thousand apps starting at once handed off about 500 writers, whose walks
/// then cost a thousand idle apps more CPU than their route tables
/// (BENCHMARKS.md, "Reweighed capacity, bounded hand-offs, unchanged sweeps").
const HANDOFFS: usize = 8;

static HANDED_OFF: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Writes `batch` to the store. A write blocks (an fsync, an etcd round trip): on a
/// multi-threaded runtime the worker first hands its other tasks over, so the API, the
/// view follower and other apps' schedulers in the process do not wait behind it. Past
/// [`HANDOFFS`] writers at once, the worker writes itself: the store takes one write at
/// a time anyway (redb's lock, the etcd thread), so more threads would only queue.
pub(super) fn save(store: &dyn Store, app: &str, batch: &[Write]) -> Result<(), StoreError> {
    use std::sync::atomic::Ordering;
    let write = || store.write(app, batch);
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if !store.write_blocks(batch) || !multi_thread {
        return write();
    }
    /// Gives the hand-off back however the write ends.
    struct HandedOff;
    impl Drop for HandedOff {
        fn drop(&mut self) {
            HANDED_OFF.fetch_sub(1, Ordering::AcqRel);
        }
    }
    let handed_off = HandedOff;
    if HANDED_OFF.fetch_add(1, Ordering::AcqRel) < HANDOFFS {
        return tokio::task::block_in_place(write);
    }
    // Only hand-offs count: this writer keeps its worker.
    drop(handed_off);
    write()
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::store::Stored;

    /// A store that takes one write at a time, as redb does, and counts the writers in
    /// it at once (queued on its lock included).
    #[derive(Default)]
    struct OneAtATime {
        lock: Mutex<()>,
        inside: AtomicUsize,
        most: AtomicUsize,
        written: AtomicUsize,
    }

    impl Store for OneAtATime {
        fn load(&self, _app: &str) -> Result<Stored, StoreError> {
            Ok(Stored::default())
        }

        fn write(&self, _app: &str, _batch: &[Write]) -> Result<(), StoreError> {
            let inside = self.inside.fetch_add(1, Ordering::SeqCst) + 1;
            self.most.fetch_max(inside, Ordering::SeqCst);
            let _one = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            std::thread::sleep(std::time::Duration::from_millis(2));
            self.written.fetch_add(1, Ordering::SeqCst);
            self.inside.fetch_sub(1, Ordering::SeqCst);
            Ok(())
        }
    }

    #[test]
    fn many_writers_at_once_hand_off_a_bounded_number_of_threads() {
        let workers = 2;
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(workers).build().unwrap();
        let store = std::sync::Arc::new(OneAtATime::default());
        rt.block_on(async {
            let tasks: Vec<_> = (0..200)
                .map(|i| {
                    let store = store.clone();
                    tokio::spawn(async move { save(&*store, &format!("app-{i}"), &[Write::DesiredUnits(1)]) })
                })
                .collect();
            for t in tasks {
                t.await.unwrap().unwrap();
            }
        });
        assert_eq!(store.written.load(Ordering::SeqCst), 200);
        // Each writer beyond the workers' own is a thread handed the runtime's work.
        let most = store.most.load(Ordering::SeqCst);
        assert!(most <= HANDOFFS + workers, "{most} writers at once");
    }
}
