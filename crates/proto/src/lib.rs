//! The wire contract: protobuf messages and gRPC services generated from
//! `proto/flotilla/v1`, the sealed heartbeat datagram, the QUIC framing, and the
//! conversions between wire messages and `flotilla-core` types (validated here,
//! once, so nothing behind a decoder sees unchecked input).

#[allow(clippy::all, clippy::pedantic)]
pub mod v1 {
    tonic::include_proto!("flotilla.v1");
}

pub mod convert;
pub mod dial;
pub mod frame;
pub mod heartbeat_body;

pub mod seal;
pub mod status;

/// The most history lines one log request may ask for (`tail`).
pub const MAX_LOG_TAIL: u32 = 100_000;
/// Artifacts one warm request may name (an app's head and worker, 16 each), each under
/// [`MAX_ARTIFACT_BYTES`] of names.
pub const MAX_WARM_ARTIFACTS: usize = 32;
pub const MAX_ARTIFACT_BYTES: usize = 4096;

/// Whether `a`'s names fit in [`MAX_ARTIFACT_BYTES`].
pub fn artifact_fits(a: &v1::Artifact) -> bool {
    a.source.len() + a.sha256.len() + a.dest.len() + a.unpack.len() <= MAX_ARTIFACT_BYTES
}
/// Largest QUIC control message (one request or response per stream), in bytes.
pub const MAX_CONTROL_MESSAGE: usize = 256 * 1024;
/// Largest gRPC message a view stream carries, in bytes (snapshots are chunked below it).
pub const MAX_GRPC_MESSAGE: usize = 16 * 1024 * 1024;
/// An idle WatchView stream carries an empty update this often, so a follower can tell a
/// quiet shard from an unreachable one (a partition does not close a TCP connection).
pub const VIEW_KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(1);
/// A follower that hears nothing for this long drops the stream and counts the shard as
/// unreachable (its nodes become Unknown).
pub const VIEW_SILENCE_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);
/// Nodes per snapshot chunk on WatchView.
pub const SNAPSHOT_CHUNK_NODES: usize = 2048;
