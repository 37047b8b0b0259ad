//! Instance providers (being written).
