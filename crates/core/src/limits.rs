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
/// Most units an app may ask for: a spec's bounds, a policy's and a simulation's.
pub const MAX_UNITS: u32 = 10_000;
/// Most workers one unit may have.
pub const MAX_WORKERS: u32 = 256;

/// Whether `s` may name an app, a policy or a node type (1..=63 of `a-z`, `0-9`, `-`, not
/// starting with `-`): such names end up in URL paths, store keys and metric labels.
pub fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
}
