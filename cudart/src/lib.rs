//! `libcudart.so.13`: the CUDA runtime API of vgpu-vmm, built on the driver API
//! (`libcuda.so.1`, opened at run time as NVIDIA's runtime opens theirs), so that it runs over
//! this project's driver library (guest or host backends) and over NVIDIA's alike.
//!
//! - `registry` / `callconf` / `fatbin`: what nvcc's generated code registers and pushes;
//! - `context`: initialisation, contexts, module loading (eager by default), the program's handles;
//! - `driver`: the driver's entry points; `error`: CUDA's error values and the FFI boundary;
//! - `api`: the exported functions; `unsupported` + `gen_unsupported`: every other export of
//!   NVIDIA's library, answering `cudaErrorNotSupported`.

#![allow(non_snake_case)]

pub mod api;
pub mod callconf;
pub mod context;
pub mod driver;
pub mod error;
pub mod fatbin;
pub mod ffi;
mod gen_errors;
pub mod gen_structs;
mod gen_unsupported;
pub mod registry;
mod unsupported;
