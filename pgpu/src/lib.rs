//! `pgpu`: the physical GPU as the hypervisor sees it.
//!
//! [`Engine`] is the contract between the hypervisor (virtual GPU device, shadow page tables,
//! scheduler) and a physical GPU backend; [`sim::SimEngine`] is the built-in software GPU.
//! `pgpu/README.md` describes the design.

pub mod engine;
pub mod sim;

pub use engine::*;
