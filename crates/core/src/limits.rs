//! Bounds applied to everything that arrives from an agent, a file or a user.

/// Version of the agent <-> shard protocol; a mismatch is refused at registration.
pub const PROTOCOL_VERSION: u32 = 1;
/// Longest node id, in bytes.
pub const MAX_NODE_ID_LEN: usize = 128;
/// Most labels one node may carry.
pub const MAX_LABELS: usize = 32;
/// Longest label key, in bytes (the Kubernetes name limit).
pub const MAX_LABEL_KEY_LEN: usize = 63;
/// Longest label value, in bytes.
pub const MAX_LABEL_VALUE_LEN: usize = 128;
/// Most custom resource names on one node.
pub const MAX_CUSTOM_RESOURCES: usize = 16;
/// Sane upper bounds for a single node's capacity: an agent cannot claim more.
pub const MAX_NODE_CPU_MILLIS: u64 = 4096 * 1000;
pub const MAX_NODE_MEMORY_BYTES: u64 = 64 << 40;
pub const MAX_NODE_GPUS: u32 = 256;
pub const MAX_CUSTOM_QUANTITY: u64 = 1 << 48;
