//! Health-weighted routing for the clients of an app (docs/architecture.md §10): a `tower` balancer
//! (weighted P2C on windowed-median latency, error penalty, passive ejection, slow start) fed
//! by the scheduler's route table, and the `flotilla route` reverse proxy built on it.

pub mod balancer;
pub mod catalogue;
pub mod clients;
pub mod follow;
mod forward;
mod framing;
pub mod pace;
pub mod proxy;
pub mod report;
pub mod service;

pub use balancer::{Balancer, Config, Outcome, Policy};
pub use pace::{Pace, follow_capacity};
pub use service::{Balance, HttpClassify};
