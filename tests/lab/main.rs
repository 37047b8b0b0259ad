//! The system's promises on a real network (issue #37): every process on a host of its
//! own (a network namespace with its own address, `flotilla_testkit::Lab`), and faults
//! made by the kernel (iptables drops, tc shaping) between them. Needs root; the tests
//! run one at a time (the `processes` group).

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

mod leases;
mod network;
mod p2p;
mod partitions;
mod shards;
mod soak;
