//! The guest tools of the vgpu-vmm Linux guest (guest-images/linux): the gpu-driver
//! [`Platform`](gpu_driver::Platform) for Linux user space ([`platform::LinuxGpu`]: BARs by mmap
//! of `/sys/bus/pci/devices/*/resourceN`, DMA memory from a `memmap=` reserved range through
//! `/dev/mem`, polling), and the commands of the `vgpu` multi-call binary: `vgpu-smi`,
//! `vgpu-run`, `lspci`, `vgpu-exit`.
//!
//! Under PVM every system call (~250 us), page fault (~1.5 ms) and BAR access (~31 us) from
//! the guest's user space is costly, so the driver maps everything once and then touches it
//! from user space only.

extern crate alloc;

pub mod args;
pub mod attack;
pub mod dma;
pub mod exit;
pub mod lazymap;
pub mod pci;
pub mod platform;
pub mod run_ptx;
pub mod run_suite;
pub mod session;
pub mod share;
pub mod smi;

/// Errors of the Linux platform and the tools.
#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("{what}: {err}")]
    Io {
        what: String,
        #[source]
        err: std::io::Error,
    },
    #[error(
        "virtual GPU {vendor:04x}:{device:04x} not found in /sys/bus/pci/devices (boot with --gpu)"
    )]
    NoGpu { vendor: u16, device: u16 },
    #[error("{0}")]
    Bad(String),
    #[error("driver: {0}")]
    Driver(#[from] gpu_driver::Error),
}

impl ToolError {
    /// An I/O error with what was being done.
    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |err| Self::Io { what, err }
    }
}
