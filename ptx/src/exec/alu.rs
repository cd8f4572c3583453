//! Per-lane arithmetic kernels.
