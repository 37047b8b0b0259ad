//! Ray v2 demand packing (being written).
