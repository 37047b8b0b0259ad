//! One scheduler per app: it plans against its lock-free copy of the cluster view and
//! commits optimistically to the shards that own the chosen nodes.

pub mod lifecycle;
pub mod planner;
pub mod spec;
pub mod store;
