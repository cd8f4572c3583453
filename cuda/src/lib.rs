//! `libcuda.so.1`: the CUDA driver API of vgpu-vmm (docs/architecture.md, "CUDA programs").
//!
//! Unmodified programs built by nvcc reach a GPU through this library: directly (driver-API
//! programs: `cuInit`, `cuModuleLoadData`, `cuLaunchKernel`...) or through the project's
//! runtime (`cudart`, `libcudart.so.13`), which is built on this API as NVIDIA's is on theirs.
//! Everything below the C ABI goes through one small interface, [`device::Device`], with two
//! implementations chosen at run time ([`backend`]):
//! - `guest`: inside a VM, the guest GPU driver (`gpu-driver`) on its Linux platform;
//! - `host`: in-process on the host, over a `pgpu` engine (`sim` by default, or `cuda`).

pub mod backend;
pub mod device;
