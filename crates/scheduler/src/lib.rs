//! One scheduler per app: it plans against its lock-free copy of the cluster view and
//! commits optimistically to the shards that own the chosen nodes.
//!
//! - the app's data: [`spec`] (the TOML spec, validated) and [`store`] (redb or memory);
//! - pure deciders, no I/O: `lifecycle` (the unit state table), `planner` (placement),
//!   `repair` (lost heads and workers, scale-in order), `rollout` (make-before-break
//!   replacements), `routes` (route weights); the autoscaling policies are `flotilla-autoscale`'s;
//! - `reconcile`: the loop that carries their decisions out, one file per step.

mod canary;
pub mod catalogue;
pub mod diff;
mod leader;
mod lifecycle;
mod nodes;
mod planner;
mod rebalance;
mod reconcile;
mod repair;
mod retention;
mod rollout;
mod routes;
mod spec;
mod store;
mod store_etcd;
mod store_redb;
#[cfg(test)]
mod testing;
mod units;

pub use canary::{CanaryProgress, CanaryStatus, SideStatus};
pub use leader::{LOCAL_TOKEN, Leader, Role, default_instance};
pub use lifecycle::UnitState;
pub use reconcile::{
    AppHandle, AppStatus, Applied, ApplyPlan, AutoscalingStatus, CannotPlace, ChangeRequest, Command, CommandError,
    Demand, DemandRequest, MAX_DEMAND_COUNT, MAX_DEMAND_ENTRIES, PolicyBook, RebalancePlan, STORE_UNAVAILABLE,
    Scheduler, ShardChannels, Stats,
};
pub use rollout::counts_toward_desired;
pub use spec::{AppSpec, SpecOrigin};
pub use store::{
    DECISIONS_KEPT, MemStore, MemberRecord, Override, RolloutRecord, RolloutState, SpecVersion, Store, Stored,
    UnitRecord, Usage, VERSIONS_KEPT, Write,
};
pub use store_etcd::{EtcdStore, FENCED, MAX_TXN_BYTES, MAX_TXN_OPS};
pub use store_redb::RedbStore;
