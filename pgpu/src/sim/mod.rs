//! The `sim` engine: the built-in software GPU (raw VRAM region, per-space MMU, copy engine and
//! the `ptx` interpreter).

pub mod mmu;
pub mod vram;
