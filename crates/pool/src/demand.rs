//! The offline plan input (being written).
