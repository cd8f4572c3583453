//! The per-thread-default-stream names (`_ptds`, `_ptsz`: what cuda.h's macros call in a
//! program built with `--default-stream per-thread`). Every stream of a context is its one
//! in-order queue here, so the per-thread default stream is that queue too: each is the plain
//! function.

use std::ffi::{c_int, c_uint, c_void};

use super::*;
use crate::result::CUresult;

/// # Safety
/// As [`cuMemcpyHtoD_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2_ptds(
    d: CUdeviceptr,
    s: *const c_void,
    n: usize,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuMemcpyHtoD_v2(d, s, n) }
}

/// # Safety
/// As [`cuMemcpyDtoH_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2_ptds(
    d: *mut c_void,
    s: CUdeviceptr,
    n: usize,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuMemcpyDtoH_v2(d, s, n) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2_ptds(d: CUdeviceptr, s: CUdeviceptr, n: usize) -> CUresult {
    cuMemcpyDtoD_v2(d, s, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpy_ptds(d: CUdeviceptr, s: CUdeviceptr, n: usize) -> CUresult {
    cuMemcpy(d, s, n)
}

/// # Safety
/// As [`cuMemcpyHtoDAsync_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2_ptsz(
    d: CUdeviceptr,
    s: *const c_void,
    n: usize,
    st: Handle,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuMemcpyHtoDAsync_v2(d, s, n, st) }
}

/// # Safety
/// As [`cuMemcpyDtoHAsync_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2_ptsz(
    d: *mut c_void,
    s: CUdeviceptr,
    n: usize,
    st: Handle,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuMemcpyDtoHAsync_v2(d, s, n, st) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2_ptsz(
    d: CUdeviceptr,
    s: CUdeviceptr,
    n: usize,
    st: Handle,
) -> CUresult {
    cuMemcpyDtoDAsync_v2(d, s, n, st)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyAsync_ptsz(
    d: CUdeviceptr,
    s: CUdeviceptr,
    n: usize,
    st: Handle,
) -> CUresult {
    cuMemcpyAsync(d, s, n, st)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2_ptds(d: CUdeviceptr, v: u8, n: usize) -> CUresult {
    cuMemsetD8_v2(d, v, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD16_v2_ptds(d: CUdeviceptr, v: u16, n: usize) -> CUresult {
    cuMemsetD16_v2(d, v, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32_v2_ptds(d: CUdeviceptr, v: u32, n: usize) -> CUresult {
    cuMemsetD32_v2(d, v, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async_ptsz(d: CUdeviceptr, v: u8, n: usize, s: Handle) -> CUresult {
    cuMemsetD8Async(d, v, n, s)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD16Async_ptsz(d: CUdeviceptr, v: u16, n: usize, s: Handle) -> CUresult {
    cuMemsetD16Async(d, v, n, s)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32Async_ptsz(d: CUdeviceptr, v: u32, n: usize, s: Handle) -> CUresult {
    cuMemsetD32Async(d, v, n, s)
}

/// # Safety
/// As [`cuLaunchKernel`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchKernel_ptsz(
    f: Handle,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: Handle,
    params: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shared, stream, params, extra) }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize_ptsz(s: Handle) -> CUresult {
    cuStreamSynchronize(s)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamQuery_ptsz(s: Handle) -> CUresult {
    cuStreamQuery(s)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitEvent_ptsz(s: Handle, e: Handle, flags: c_uint) -> CUresult {
    cuStreamWaitEvent(s, e, flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord_ptsz(e: Handle, s: Handle) -> CUresult {
    cuEventRecord(e, s)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecordWithFlags_ptsz(e: Handle, s: Handle, flags: c_uint) -> CUresult {
    cuEventRecordWithFlags(e, s, flags)
}

/// # Safety
/// As [`cuStreamAddCallback`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamAddCallback_ptsz(
    s: Handle,
    cb: StreamCallback,
    data: *mut c_void,
    flags: c_uint,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuStreamAddCallback(s, cb, data, flags) }
}

/// # Safety
/// As [`cuLaunchHostFunc`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuLaunchHostFunc_ptsz(
    s: Handle,
    f: HostFn,
    data: *mut c_void,
) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuLaunchHostFunc(s, f, data) }
}

/// # Safety
/// As [`cuStreamGetPriority`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority_ptsz(s: Handle, p: *mut c_int) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuStreamGetPriority(s, p) }
}

/// # Safety
/// As [`cuStreamGetCtx`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetCtx_ptsz(s: Handle, c: *mut Handle) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuStreamGetCtx(s, c) }
}
