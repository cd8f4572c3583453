//! The vgpu-vmm workload suite: PTX kernels with deterministic inputs, launch sequences and CPU
//! references, described abstractly so that any driver (software GPU, guest driver, CUDA) runs them.
//!
//! `no_std` + `alloc`: bare-metal guests link it. A driver:
//! 1. takes a [`Workload`] from [`all`] (hand-written PTX, [`hand::all`]) or [`nvcc::all`]
//!    (PTX that nvcc made from `suite/cuda/*.cu`), and builds an [`Instance`] of a [`Size`];
//! 2. loads [`Instance::ptx`], allocates each [`Buffer`] and copies [`Buffer::init`] in;
//! 3. runs the [`Launch`]es in order, laying each parameter list out with [`layout_params`]
//!    (buffer `i`'s GPU address stands for `Param::Buffer(i)`);
//! 4. reads back the buffers with [`Buffer::read_back`] and calls [`Instance::check`].
//!
//! Every result except `spin`'s (which is timing) is independent of CTA and warp scheduling
//! order, so two runs of an instance must give bit-identical buffers.
#![no_std]

extern crate alloc;

pub mod dump;
pub mod hand;
mod instance;
pub mod lcg;
pub mod long;
pub mod nvcc;
mod param;
mod rng;
mod workload;

pub use instance::{
    Buffer, Elem, Expect, Instance, InstanceError, Launch, Mismatch, Summary, Value,
};
pub use param::{LayoutError, Param, layout_params, param_offsets, params_size};
pub use rng::Rng;
pub use workload::{Size, Workload, f32_bytes, i32_bytes, u32_bytes, u64_bytes};

/// Every workload: the hand-written group ([`hand::all`]) then the nvcc group ([`nvcc::all`]).
pub fn all() -> impl Iterator<Item = &'static Workload> {
    hand::all().iter().chain(nvcc::all())
}

/// The workload with this name, from either group.
pub fn find(name: &str) -> Option<&'static Workload> {
    all().find(|w| w.name == name)
}
