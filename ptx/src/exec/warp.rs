//! Warp execution.
