//! The `sim` engine: the built-in software GPU (raw VRAM region, per-space MMU, copy engine and
//! the `ptx` interpreter).

mod api;
mod atomic_copy;
mod ckpt;
mod config;
mod context;
mod copy;
mod counters;
pub mod dirty;
mod engine;
mod exec;
mod flags;
mod hostmem;
pub mod mmu;
mod modules;
mod spaces;
pub mod vram;

pub use config::SimConfig;
pub use counters::SimCounters;
pub use engine::SimEngine;
