//! Artifacts: files a member needs on its node (code, a Python environment, a model),
//! named by their sha256 and delivered peer to peer.

pub mod auth;
pub mod bitfield;
pub mod catalogue;
pub mod digest;
pub mod fetch;
pub mod manifest;
pub mod peer;
pub mod picker;
pub mod place;
pub mod store;
pub mod throttle;
pub mod tracker;
pub mod unpack;
pub mod wire;

pub use bitfield::Bitfield;
pub use digest::{Digest, Source};
pub use fetch::{Artifacts, Progress, Want};
pub use manifest::Manifest;
