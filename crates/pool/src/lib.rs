//! Pool autoscaling: the node pool grows when units cannot be placed and shrinks when
//! nodes sit idle, the way Ray autoscaler v2 does it.
//!
//! - [`pack`]: Ray v2's `ResourceDemandScheduler`: pending demand is fitted onto free
//!   capacity, then onto new nodes chosen by its score tuple (pure);
//! - [`demand`]: the offline input of `flotilla autoscale plan`, in the shape of Ray's
//!   scheduling request;
//! - [`instance`]: the instance lifecycle as one transition table (pure);
//! - [`store`]: the instance records in redb, saved before every launch (no leaks or
//!   double launches across restarts);
//! - [`policy`]: a Dataproc or MR3 policy sizing two node types by load instead;
//! - [`provider`]: where instances come from (`local` agent processes, `exec` user commands);
//! - [`warm`]: warm pools, instances held ready ahead of demand (pure).

pub mod autoscaler;
pub mod catalogue;
pub mod cluster;
pub mod config;
pub mod consolidate;
pub mod demand;
pub mod instance;
pub mod model;
pub mod pack;
pub mod policy;
pub mod provider;
pub mod reconciler;
pub mod shape;
pub mod sim;
pub mod store;
pub mod warm;
