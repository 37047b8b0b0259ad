//! The metric families of an agent's artifact cache and swarm (docs/metrics.md).

use flotilla_obs::Family;

pub const BYTES: Family = Family::counter(
    "flotilla_artifact_bytes_total",
    "Artifact bytes this node received and verified, by where they came from (peer or origin).",
    &["from"],
);
pub const SERVED_BYTES: Family =
    Family::counter("flotilla_artifact_served_bytes_total", "Artifact bytes this node sent to its peers.", &[]);
pub const PIECES_REJECTED: Family = Family::counter(
    "flotilla_artifact_pieces_rejected_total",
    "Pieces whose sha256 did not match the manifest, by where they came from; a peer that sent one is banned \
     for that artifact.",
    &["from"],
);
pub const PEERS_REFUSED: Family = Family::counter(
    "flotilla_artifact_peers_refused_total",
    "Peer connections refused, by reason (no_hello: no proof of the cluster's key; bad_proof: a wrong one).",
    &["reason"],
);
pub const REQUESTS: Family = Family::counter(
    "flotilla_artifact_peer_requests_total",
    "Requests from peers this node answered, by answer (ok, missing, busy, malformed).",
    &["answer"],
);
pub const FETCHES: Family = Family::counter(
    "flotilla_artifact_fetches_total",
    "Artifact fetches that ended, by result (ok, mismatch, error).",
    &["result"],
);
pub const FETCH_SECONDS: Family = Family::histogram(
    "flotilla_artifact_fetch_seconds",
    "From the first request for an artifact to the whole of it verified on this node.",
    &[],
    &[0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1800.0],
);
pub const FETCHING: Family = Family::gauge("flotilla_artifact_fetching", "Artifacts this node is fetching now.", &[]);
pub const FETCH_RATE: Family = Family::gauge(
    "flotilla_artifact_fetch_bytes_per_second",
    "How fast this node receives artifact bytes now (all fetches, over the last few seconds).",
    &[],
);
pub const EVICTIONS: Family = Family::counter(
    "flotilla_artifact_evictions_total",
    "Artifacts deleted from the cache to make room (least recently used, used by no member).",
    &[],
);

pub const FAMILIES: &[Family] = &[
    BYTES,
    SERVED_BYTES,
    PIECES_REJECTED,
    PEERS_REFUSED,
    REQUESTS,
    FETCHES,
    FETCH_SECONDS,
    FETCHING,
    FETCH_RATE,
    EVICTIONS,
];
