//! The nvcc group: PTX that nvcc (CUDA 13.0, `-arch=sm_80`) made from suite/cuda/*.cu, with CPU references.

use crate::Workload;

pub mod atomics64;
pub mod convert;
pub mod histogram;
pub mod scan;
pub mod vote;
pub mod warp_reduce;

static ALL: [Workload; 6] = [
    warp_reduce::WORKLOAD,
    histogram::WORKLOAD,
    atomics64::WORKLOAD,
    vote::WORKLOAD,
    scan::WORKLOAD,
    convert::WORKLOAD,
];

/// The nvcc-generated workloads, in the order above.
pub fn all() -> &'static [Workload] {
    &ALL
}
