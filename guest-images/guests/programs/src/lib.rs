//! Code the GPU guests share: the bare-metal [`gpu_driver::Platform`] ([`platform`]), finding
//! and opening the virtual GPU, and running suite instances through the driver ([`runner`]).
#![no_std]

extern crate alloc;

pub mod platform;
pub mod runner;
