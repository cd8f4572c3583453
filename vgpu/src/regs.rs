//! Register offsets, method addresses and fault kinds of the virtual GPU, under the paths the
//! device model uses. Defined once in `vgpu-hw` (docs/hardware.md is checked against it).

pub use vgpu_hw::regs::*;
pub use vgpu_hw::{Access, FaultKind, method};
