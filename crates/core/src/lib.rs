//! Flotilla's pure data model: resources, node identity, labels, health and status.
//!
//! Nothing here does I/O; every type validates its own bounds so that decoders
//! at the edges can turn untrusted input into these types or a clear error.

mod backoff;
mod clock;
pub mod duration;
mod error;
mod health;
pub mod latency;
mod limits;
mod node;
pub mod ports;
mod prefetch;
pub mod quantity;
mod rate;
pub mod reopen;
mod resources;
mod secret;
mod shard;
mod sync;
pub mod timestamp;
pub mod unit_shape;

pub use backoff::{Backoff, Jitter, ThreadJitter};
pub use clock::{install_clock, now_ms, system_ms};
pub use error::{ErrorKind, ServiceError};
pub use health::{HealthSample, Hysteresis, PackedHealth, health_score};
pub use limits::*;
pub use node::{Incarnation, LabelError, Labels, NodeId, NodeIdError, NodeStatus};
pub use prefetch::{prefetch, prefetch_value};
pub use rate::RateLimiter;
pub use resources::{ARTIFACT_CACHE_RESOURCE, DEFAULT_ARTIFACT_CACHE, ResourceError, Resources};
pub use secret::{SharedToken, bearer_token, constant_time_eq};
pub use shard::{DEFAULT_DOMAIN, shard_alternate, shard_alternates, shard_for_domain};
pub use sync::{LockExt, RwLockExt};
pub use timestamp::{parse_rfc3339, rfc3339};
pub use unit_shape::{MemberOption, MemberShape, NodeSelector, UnitShape};
