//! The SIMT interpreter: CTA/warp state, instruction execution, memory access and scheduling.

pub(crate) mod alu;
pub(crate) mod cta;
pub(crate) mod cvt;
pub(crate) mod fastmem;
pub(crate) mod half;
pub mod launch;
pub(crate) mod mem;
pub(crate) mod pool;
pub(crate) mod printf;
pub(crate) mod sched;
pub(crate) mod setup;
pub(crate) mod warp;
pub(crate) mod warp_mem;
pub(crate) mod warp_ops;
