//! BAR0 register offsets and bit fields of the virtual GPU, and the instance block layout
//! (docs/hardware.md, "Registers"): `vgpu-hw`'s definitions, which the device model uses too.

pub use vgpu_hw::bell;
pub use vgpu_hw::inst;
pub use vgpu_hw::regs::*;
