//! gpu-driver: the guest driver library for vgpu's virtual GPU (docs/hardware.md, "The virtual
//! GPU"). `no_std` + `alloc`, portable through the [`Platform`] trait (bare-metal guests, Linux
//! user space, a host process).
//!
//! Layers, bottom up: [`regs`] and [`mmu`] encode the spec; [`range`] allocates VRAM and GPU
//! VA; [`push`] builds pushbuffers; [`Gpu`] owns the device (init, page tables, memory pools,
//! faults, interrupts) and [`Channel`] a GPFIFO with its fences. Typical use:
//!
//! ```ignore
//! let mut gpu = Gpu::new(platform, Config::default())?;
//! let mut ch = gpu.create_channel(0)?;
//! let buf = gpu.vram_alloc(4096)?;            // VRAM, mapped with 2 MiB pages
//! let staging = gpu.sys_alloc(4096)?;         // system memory, mapped too
//! gpu.sys_write(&staging, 0, &data)?;
//! let mut pb = PushBuf::new();
//! pb.copy(staging.va, buf.va, 4096);
//! let fence = ch.submit(&mut gpu, &mut pb)?;
//! ch.wait(&mut gpu, fence)?;
//! ```
//!
//! With a device that offers the para-virtual BAR (CAPS bit 4, `--gpu mode=para`) and
//! [`Config::para`] set, mappings become batched hypercalls ([`para`]) instead of table writes
//! and TLB flushes; the API is the same.
//!
//! [`suite_run`] runs the workload suite through all of this, phase by phase (the loop the
//! `workloads` guest and vgpu-bench's native baseline share).
//!
//! Every value read back from the device is treated as untrusted: nothing here panics on it.
#![no_std]

extern crate alloc;

mod channel;
mod device;
mod error;
mod fault;
pub mod mmu;
pub mod para;
mod platform;
pub mod push;
pub mod range;
pub mod regs;
pub mod suite_run;

pub use channel::{Channel, Fence, WaitMode};
pub use device::{
    Attach, Config, Gpu, Info, InitParts, SysAlloc, TablePlacement, VramAlloc, unbind_channel,
};
pub use error::Error;
pub use fault::{Access, Fault, FaultKind};
pub use mmu::Target;
pub use platform::{DmaBuf, Platform};
pub use push::{LaunchDesc, PushBuf};
