//! Runs one suite instance through gpu-driver's shared suite loop
//! ([`gpu_driver::suite_run`]: upload, kernels, download, check, free, each phase timed), with
//! the placement options taken from the guest's command line.

use gpu_driver::suite_run::{self, Options};
use gpu_driver::{Channel, Gpu, Platform};
use suite::Instance;

pub use gpu_driver::suite_run::Outcome;

/// Where things go.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOpts {
    /// PTX text copied into VRAM (else read by the GPU from system memory).
    pub ptx_in_vram: bool,
    /// Buffers left in system memory for the kernels to use directly (else VRAM + copies).
    pub buffers_in_sysmem: bool,
}

impl RunOpts {
    /// From the command line: `ptx=vram`, `buffers=sysmem`.
    pub fn from_args() -> Self {
        Self {
            ptx_in_vram: guest_rt::arg("ptx") == Some("vram"),
            buffers_in_sysmem: guest_rt::arg("buffers") == Some("sysmem"),
        }
    }
}

/// Runs `inst` on channel `ch`, checks it and frees what it allocated.
pub fn run_instance<P: Platform>(
    gpu: &mut Gpu<P>,
    ch: &mut Channel,
    inst: &Instance,
    opts: RunOpts,
) -> Outcome {
    let o = Options {
        ptx_in_vram: opts.ptx_in_vram,
        buffers_in_sysmem: opts.buffers_in_sysmem,
    };
    suite_run::run_instance(gpu, ch, inst, o)
}
