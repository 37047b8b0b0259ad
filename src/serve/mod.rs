//! The servers of the `flotilla` binary run on their own (`aggregator`, `control`,
//! `scheduler`), with what they share: argument groups, token files, the shutdown signal.

pub mod aggregator;
pub mod args;
pub mod control;
pub mod scheduler;
pub mod tokens;

/// Resolves on SIGINT or SIGTERM.
///
/// The handlers are installed when this is called, not when the future is first polled:
/// a process that calls it at start and waits on it later still stops cleanly on a
/// signal that arrives in between (a test restarting `up` as soon as its address is out).
pub fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{SignalKind, signal};
    let handlers = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    async move {
        match handlers {
            (Ok(mut t), Ok(mut i)) => {
                tokio::select! {
                    _ = t.recv() => {}
                    _ = i.recv() => {}
                }
            }
            _ => std::future::pending().await,
        }
    }
}
