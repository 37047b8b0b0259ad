//! The servers of the `flotilla` binary run on their own (`aggregator`, `control`,
//! `scheduler`), with what they share: argument groups, token files, the shutdown signal.

pub mod aggregator;
pub mod args;
pub mod control;
pub mod scheduler;
pub mod tokens;

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
        (Ok(mut t), Ok(mut i)) => {
            tokio::select! {
                _ = t.recv() => {}
                _ = i.recv() => {}
            }
        }
        _ => std::future::pending().await,
    }
}
