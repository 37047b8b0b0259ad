//! The instance lifecycle (being written).
