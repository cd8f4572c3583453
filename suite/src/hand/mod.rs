//! The hand-written PTX group (suite/kernels/*.ptx): vecadd, saxpy, matmul, reduction, stencil, graph, spin.

use crate::Workload;

pub mod graph;
pub mod matmul;
pub mod reduction;
pub mod saxpy;
pub mod spin;
pub mod stencil;
pub mod vecadd;

static ALL: [Workload; 7] = [
    vecadd::WORKLOAD,
    saxpy::WORKLOAD,
    matmul::WORKLOAD,
    reduction::WORKLOAD,
    stencil::WORKLOAD,
    graph::WORKLOAD,
    spin::WORKLOAD,
];

/// The hand-written workloads, in the order above.
pub fn all() -> &'static [Workload] {
    &ALL
}
