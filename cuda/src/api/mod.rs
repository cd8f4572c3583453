//! The exported driver API (`extern "C"`, CUDA 13 names and semantics, `CUresult` codes).
//!
//! Every function runs its body under [`ffi`]: a panic becomes `CUDA_ERROR_UNKNOWN` and never
//! crosses the C boundary. Every pointer from the program is checked for null before use;
//! device pointers are checked against the context's allocations (`state::Ctx::check_dev`).
//! Files: `device` (init, devices, contexts), `memory` (allocations, copies, memsets, pointer
//! attributes), `module` (modules, functions, launches, occupancy), `sync` (streams, events),
//! `misc` (error strings, `cuGetProcAddress`, profiler).

mod device;
mod gen_proc;
mod memcpy2d;
mod memory;
mod misc;
mod module;
mod ptds;
mod sync;

pub use device::*;
pub use memcpy2d::*;
pub use memory::*;
pub use misc::*;
pub use module::*;
pub use ptds::*;
pub use sync::*;

use std::ffi::{c_int, c_uint, c_void};
use std::panic::AssertUnwindSafe;

use crate::result::*;

/// `CUdevice`.
pub type CUdevice = c_int;
/// `CUdeviceptr` (`unsigned long long`).
pub type CUdeviceptr = u64;
/// An opaque handle (`CUcontext`, `CUmodule`, `CUfunction`, `CUstream`, `CUevent`).
pub type Handle = *mut c_void;

/// Runs an API call's body: `Ok` is `CUDA_SUCCESS`; a panic is `CUDA_ERROR_UNKNOWN`.
pub(crate) fn ffi(name: &'static str, f: impl FnOnce() -> Result<(), CUresult>) -> CUresult {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => CUDA_SUCCESS,
        Ok(Err(e)) => e,
        Err(_) => {
            eprintln!("libcuda (vgpu): {name}: internal error");
            CUDA_ERROR_UNKNOWN
        }
    }
}

/// Writes through a program's out-pointer (null: `CUDA_ERROR_INVALID_VALUE`).
///
/// # Safety
/// `p`, if not null, must be valid for a write of `T` (the program's promise).
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: not null; the program promises it is writable (unaligned is tolerated).
    unsafe { p.write_unaligned(v) };
    Ok(())
}

/// A handle as the table key.
pub(crate) fn key(h: Handle) -> u64 {
    h as usize as u64
}

/// A table key as the program's handle.
pub(crate) fn handle(k: u64) -> Handle {
    k as usize as Handle
}

/// Only device 0 exists.
pub(crate) fn check_device(dev: CUdevice) -> Result<(), CUresult> {
    if dev == 0 {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_DEVICE)
    }
}

/// Rejects flags outside `allowed`.
pub(crate) fn check_flags(flags: c_uint, allowed: c_uint) -> Result<(), CUresult> {
    if flags & !allowed == 0 {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// The program's NUL-terminated string (null or not UTF-8: `CUDA_ERROR_INVALID_VALUE`),
/// read for at most `max` bytes.
///
/// # Safety
/// `p`, if not null, points to a NUL-terminated string (the program's promise).
pub(crate) unsafe fn c_str(p: *const std::ffi::c_char, max: usize) -> Result<String, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut len = 0;
    // SAFETY: reading byte by byte up to the NUL the program promises, bounded by `max`.
    while len < max && unsafe { *p.add(len) } != 0 {
        len += 1;
    }
    if len == max {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: `len` bytes were just read.
    let bytes = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
    std::str::from_utf8(bytes)
        .map(str::to_string)
        .map_err(|_| CUDA_ERROR_INVALID_VALUE)
}
