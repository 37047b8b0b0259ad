//! One scheduler per app: it plans against its lock-free copy of the cluster view and
//! commits optimistically to the shards that own the chosen nodes.

pub mod autoscale;
pub mod lifecycle;
pub mod planner;
pub mod repair;
pub mod rollout;
pub mod routes;
pub mod scheduler;
pub mod spec;
pub mod store;
#[cfg(test)]
mod testing;

pub use autoscale::{AutoscalingConfig, Decision, Policy};
pub use scheduler::{AppHandle, AppStatus, CommandError, Scheduler};
pub use spec::AppSpec;
pub use store::{MemStore, RedbStore, Store};
