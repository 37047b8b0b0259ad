//! What Flotilla's integration tests share: the `flotilla` binary and its commands,
//! `flotilla up` as a cluster a test drives ([`Up`]), processes a test starts itself
//! ([`Group`]), waiting with a deadline, temp dirs, raw HTTP and `/metrics`, a user
//! PKI, and a shard started in the test's own process ([`shard`]).
//!
//! Plain blocking code, so process tests need no runtime; only [`shard`] and
//! [`wait_for_async`] are for `#[tokio::test]`s.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test harness: a setup that fails fails the test, with the panic's message"
)]

mod agent;
mod cli;
mod dir;
mod etcd;
mod http;
pub mod lab;
mod nginx;
mod pki;
mod process;
pub mod shard;
mod up;
mod wait;

pub use agent::Agent;
pub use cli::{bin, flotilla, run, run_ok, stderr};
pub use dir::{TempDir, fresh_dir};
pub use etcd::Etcd;
pub use http::{Response, answer_then_vanish, exchange, get_text, http, metric, metrics_page, request, who};
pub use lab::{Host, Lab};
pub use nginx::Nginx;
pub use pki::Pki;
pub use process::{Group, alive, free_port, signal};
pub use up::Up;
pub use wait::{wait_for, wait_for_async};
