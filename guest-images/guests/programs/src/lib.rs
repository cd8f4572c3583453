//! Code the GPU guests share: the bare-metal [`gpu_driver::Platform`] ([`platform`]), finding
//! and opening the virtual GPU, and running suite instances through the driver ([`runner`]), a VRAM working set rewritten at
//! a chosen rate ([`vram_dirty`]),
//! and the escape attempts of the `attack` guest ([`attacks`]).
#![no_std]

extern crate alloc;

pub mod attacks;
pub mod platform;
pub mod runner;
pub mod vram_dirty;
