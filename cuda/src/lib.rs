//! `libcuda.so.1`: the CUDA driver API of vgpu-vmm (docs/architecture.md, "CUDA programs: the
//! driver library").
//!
//! Unmodified programs built by nvcc reach a GPU through this library: directly (driver-API
//! programs: `cuInit`, `cuModuleLoadData`, `cuLaunchKernel`...) or through the project's
//! runtime (`cudart`, `libcudart.so.13`), which is built on this API as NVIDIA's is on theirs.
//! Everything below the C ABI goes through one small interface, [`device::Device`], with two
//! implementations chosen at run time ([`backend`]):
//! - `guest`: inside a VM, the guest GPU driver (`gpu-driver`) on its Linux platform;
//! - `host`: in-process on the host, over a `pgpu` engine (`sim` by default, or `cuda`).
//!
//! Layers: [`api`] (the exported `cu*` functions: argument checks, handles, the C ABI),
//! [`state`] (process-global state: contexts, the per-thread context stack, modules, functions,
//! allocations, streams, events, sticky errors), [`params`] (kernel parameters laid out from the
//! PTX entry's signature), [`module_image`] (the bytes a program hands over → PTX text),
//! [`globals`] (module variables placed in device memory), [`stats`] (per-call timing,
//! `VGPU_CUDA_STATS`), and the generated files (`gen_*`, from cuda.h by `gen/generate.py`).

pub mod api;
pub mod backend;
pub mod device;
mod gen_consts;
mod gen_errors;
mod gen_unsupported;
pub mod globals;
pub mod module_image;
pub mod params;
pub mod result;
pub mod state;
pub mod stats;
mod unsupported;

pub use api::*;
pub use result::CUresult;

/// Exported so that a loader can tell this library from NVIDIA's driver: the host `cuda`
/// backend refuses to load, as "the real driver", a library that has this symbol.
#[unsafe(no_mangle)]
pub static vgpu_cuda_marker: u32 = 0x7667_7075;
