//! Errors (`cudaGetLastError`, names and messages), versions, the profiler switches, driver
//! entry points and `cudaCreateChannelDesc`.

use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::context;
use crate::error::*;
use crate::ffi::Out;

/// The thread's last error, then cleared.
#[unsafe(no_mangle)]
pub extern "C" fn cudaGetLastError() -> i32 {
    guard("cudaGetLastError", UNKNOWN, || last(true))
}

/// The thread's last error, kept.
#[unsafe(no_mangle)]
pub extern "C" fn cudaPeekAtLastError() -> i32 {
    guard("cudaPeekAtLastError", UNKNOWN, || last(false))
}

/// CUDA's message for `code` ("unrecognized error code" for others).
#[unsafe(no_mangle)]
pub extern "C" fn cudaGetErrorString(code: c_int) -> *const c_char {
    c_message(code).as_ptr()
}

/// CUDA's name for `code`.
#[unsafe(no_mangle)]
pub extern "C" fn cudaGetErrorName(code: c_int) -> *const c_char {
    c_name(code).as_ptr()
}

/// The CUDA version this runtime implements (13.0).
pub const RUNTIME_VERSION: c_int = 13000;

crate::error::api! {
    /// `cudaRuntimeGetVersion`: 13000.
    fn cudaRuntimeGetVersion(v: Out<c_int>) { v.set(RUNTIME_VERSION) }
}

crate::error::api! {
    /// `cudaDriverGetVersion`: the driver's, or 0 when there is none (not an error, as CUDA's).
    fn cudaDriverGetVersion(v: Out<c_int>) {
        if v.is_null() {
            return fail(INVALID_VALUE);
        }
        let mut n = 0;
        if let Ok(d) = context::drv() {
            // SAFETY: `n` receives the version.
            if unsafe { d.driver_get_version(&mut n) } != 0 {
                n = 0;
            }
        }
        v.set(n)
    }
}

crate::error::api! {
    /// `cudaProfilerStart` (a no-op where the driver has no profiler).
    fn cudaProfilerStart() {
        let d = context::ctx()?;
        if d.has("cuProfilerStart") {
            // SAFETY: no arguments.
            cu(unsafe { d.profiler_start() })?;
        }
        Ok(())
    }
}

crate::error::api! {
    /// `cudaProfilerStop`.
    fn cudaProfilerStop() {
        let d = context::ctx()?;
        if d.has("cuProfilerStop") {
            // SAFETY: no arguments.
            cu(unsafe { d.profiler_stop() })?;
        }
        Ok(())
    }
}

fn entry_point(
    symbol: *const c_char,
    f: Out<*mut c_void>,
    version: c_int,
    flags: u64,
    status: *mut c_int,
) -> Res {
    let d = context::drv()?;
    if symbol.is_null() || f.is_null() {
        return fail(INVALID_VALUE);
    }
    // SAFETY: a C string and output pointers of the program's, passed on as cuGetProcAddress takes them.
    cu(unsafe { d.get_proc_address(symbol, f.raw(), version, flags, status) })
}

crate::error::api! {
    /// `cudaGetDriverEntryPoint`: the driver's function of that name, for CUDA 13.0.
    fn cudaGetDriverEntryPoint(symbol: *const c_char, f: Out<*mut c_void>, flags: u64, status: *mut c_int) {
        entry_point(symbol, f, RUNTIME_VERSION, flags, status)
    }
}

crate::error::api! {
    /// `cudaGetDriverEntryPointByVersion`.
    fn cudaGetDriverEntryPointByVersion(symbol: *const c_char, f: Out<*mut c_void>, version: c_uint, flags: u64, status: *mut c_int) {
        entry_point(symbol, f, version as c_int, flags, status)
    }
}

/// `struct cudaChannelFormatDesc`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChannelFormatDesc {
    pub x: c_int,
    pub y: c_int,
    pub z: c_int,
    pub w: c_int,
    pub f: c_int,
}

/// `cudaCreateChannelDesc`: the description of its arguments.
#[unsafe(no_mangle)]
pub extern "C" fn cudaCreateChannelDesc(
    x: c_int,
    y: c_int,
    z: c_int,
    w: c_int,
    f: c_int,
) -> ChannelFormatDesc {
    ChannelFormatDesc { x, y, z, w, f }
}
