//! End-to-end tests with real processes over loopback: `flotilla up` with real agent
//! child processes, or shards, agents, schedulers, control planes and routers a test
//! starts itself. One test binary, one module per topic; its tests run one at a time
//! (see .config/nextest.toml), because on 2 cores parallel clusters starve each other's
//! heartbeats.

#![allow(clippy::unwrap_used, clippy::expect_used, reason = "a test: a failed step fails it, with the panic's message")]

mod artifacts;
mod autoscaling;
mod canary;
mod charts;
mod cli;
mod common;
mod consolidation;
mod events;
mod full_disk;
mod groups;
mod ha;
mod health;
mod hostile;
mod logs;
mod metrics;
mod nodes;
mod origin_url;
mod pool;
mod pool_exec;
mod ports;
mod prometheus;
mod readme;
mod rebalance;
mod replicas;
mod rollouts;
mod route_clients;
mod routing;
mod scaling;
mod secrets_mount;
mod security;
mod shards;
mod spread;
mod standalone;
mod standby;
mod tokens;
mod units;
mod versions;
