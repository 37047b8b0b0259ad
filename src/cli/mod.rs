//! Client commands: each talks to the control plane's HTTP API ([`http`]) and prints a
//! table, or one JSON document with `--json`; the actions (`scale`, `apply`, `node
//! drain`) take `--wait` too ([`wait`]).

pub mod apply;
pub mod apps;
pub mod autoscaling;
pub mod complete;
pub mod http;
pub mod nodes;
pub mod progress;
pub mod scale;
pub mod status;
pub mod table;
pub mod wait;
