//! The versioned cluster view.
//!
//! A shard publishes an immutable [`ShardView`] per version behind an `ArcSwap`
//! ([`ViewPublisher`]): readers load a pointer and never lock; a new version shares
//! every untouched node with the previous one (an `imbl` B-tree keyed by [`ViewKey`]), so it costs
//! O(changes · log n). A ring of recent [`Delta`]s lets a subscriber resume from a
//! version it already has; one that fell behind the ring gets a snapshot.
//! [`follow`] is the client side: it keeps a local copy of one shard's view
//! current over `WatchView`, its records' equal labels and capacities shared
//! (`interner`).

mod apps;
pub mod catalogue;
mod domains;
mod follow;
mod interest;
mod interner;
mod publish;
mod record;
mod wire;

pub use apps::AppNodes;
pub use domains::Domains;
pub use follow::{ClusterView, ShardSlot, follow_shard};
pub use interest::Interest;
pub use publish::{Start, Subscription, ViewPublisher};
pub use record::{Delta, NodeRecord, ShardView, Version, ViewKey};
pub use wire::{WireError, delta_from_wire, delta_to_wire, record_from_wire, record_to_wire};
