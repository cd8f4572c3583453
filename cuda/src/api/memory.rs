//! Device memory, host buffers, copies, memsets and pointer attributes.
//!
//! Copies are synchronous towards the host, whatever the stream (`*Async` forms included):
//! the data is consumed (HtoD) or delivered (DtoH) when the call returns, which the CUDA
//! semantics allow for pageable memory and which is also correct for pinned memory.

use std::ffi::{c_uint, c_void};
use std::time::Instant;

use super::{CUdeviceptr, Handle, check_flags, ffi, handle, out};
use crate::result::*;
use crate::state::{Ctx, HostRec, try_with as with};
use crate::stats::{self, Phase};

/// Largest single host buffer or copy the library accepts (a bound on hostile sizes).
const MAX_BYTES: u64 = 1 << 40;

/// # Safety
/// `dptr` must be valid for a write of a `CUdeviceptr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAlloc_v2(dptr: *mut CUdeviceptr, bytes: usize) -> CUresult {
    ffi("cuMemAlloc_v2", || {
        if dptr.is_null() || bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let t = Instant::now();
        let p = with(|g| {
            let (_, ctx) = g.cur()?;
            let p = ctx.dev_call(|d| d.mem_alloc(bytes as u64))?;
            ctx.allocs.insert(p, bytes as u64);
            Ok(p)
        })?;
        stats::call("cuMemAlloc_v2", bytes as u64, t, None);
        // SAFETY: the caller's out-pointer.
        unsafe { out(dptr, p) }
    })
}

/// Managed memory: one address for the host and the GPU. Only where host buffers live at
/// their device address (the sim backend); elsewhere `CUDA_ERROR_NOT_SUPPORTED`.
///
/// # Safety
/// `dptr` must be valid for a write of a `CUdeviceptr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocManaged(
    dptr: *mut CUdeviceptr,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    ffi("cuMemAllocManaged", || {
        // CU_MEM_ATTACH_GLOBAL 1, CU_MEM_ATTACH_HOST 2: exactly one.
        if dptr.is_null() || bytes == 0 || bytes as u64 > MAX_BYTES || !matches!(flags, 1 | 2) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = with(|g| {
            let (_, ctx) = g.cur()?;
            let b = ctx.dev_call(|d| d.host_alloc(bytes as u64))?;
            if b.host as u64 != b.dev {
                let _ = ctx.dev_call(|d| d.host_free(b.host));
                crate::unsupported::report("cuMemAllocManaged (on this backend)");
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
            ctx.host.insert(
                b.host as usize,
                HostRec {
                    dev: b.dev,
                    len: bytes as u64,
                    flags,
                    managed: true,
                },
            );
            Ok(b.dev)
        })?;
        // SAFETY: the caller's out-pointer (checked not null).
        unsafe { out(dptr, p) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFree_v2(dptr: CUdeviceptr) -> CUresult {
    ffi("cuMemFree_v2", || {
        let t = Instant::now();
        with(|g| {
            let (_, ctx) = g.cur()?;
            if ctx.host.get(&(dptr as usize)).is_some_and(|h| h.managed) {
                ctx.dev_call(|d| d.host_free(dptr as *mut u8))?;
                ctx.host.remove(&(dptr as usize));
                return Ok(());
            }
            if !ctx.allocs.contains_key(&dptr) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            ctx.dev_call(|d| d.mem_free(dptr))?;
            ctx.allocs.remove(&dptr);
            Ok(())
        })?;
        stats::call("cuMemFree_v2", 0, t, Some(Phase::Close));
        Ok(())
    })
}

/// # Safety
/// `free`, `total` must be valid for writes of a `size_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    ffi("cuMemGetInfo_v2", || {
        let (f, t) = with(|g| g.cur().map(|(_, c)| c.dev.mem_info()))?;
        // SAFETY: the caller's out-pointers.
        unsafe {
            out(free, f as usize)?;
            out(total, t as usize)
        }
    })
}

/// # Safety
/// `base`, `size` must each be null or valid for a write.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemGetAddressRange_v2(
    base: *mut CUdeviceptr,
    size: *mut usize,
    dptr: CUdeviceptr,
) -> CUresult {
    ffi("cuMemGetAddressRange_v2", || {
        let (b, l) = with(|g| {
            let (_, ctx) = g.cur()?;
            ctx.allocs
                .range(..=dptr)
                .next_back()
                .filter(|(b, l)| dptr < *b + *l)
                .map(|(b, l)| (*b, *l))
                .ok_or(CUDA_ERROR_NOT_FOUND)
        })?;
        // SAFETY: the caller's out-pointers, each optional.
        unsafe {
            if !base.is_null() {
                out(base, b)?;
            }
            if !size.is_null() {
                out(size, l as usize)?;
            }
        }
        Ok(())
    })
}

fn host_alloc(pp: *mut *mut c_void, bytes: usize, flags: c_uint) -> Result<(), CUresult> {
    if pp.is_null() || bytes == 0 || bytes as u64 > MAX_BYTES {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // CU_MEMHOSTALLOC_PORTABLE 1, DEVICEMAP 2, WRITECOMBINED 4.
    check_flags(flags, 7)?;
    let host = with(|g| {
        let (_, ctx) = g.cur()?;
        let b = ctx.dev_call(|d| d.host_alloc(bytes as u64))?;
        ctx.host.insert(
            b.host as usize,
            HostRec {
                dev: b.dev,
                len: bytes as u64,
                flags,
                managed: false,
            },
        );
        Ok(b.host)
    })?;
    // SAFETY: the caller's out-pointer (checked not null).
    unsafe { out(pp, host.cast()) }
}

/// # Safety
/// `pp` must be valid for a write of a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostAlloc(
    pp: *mut *mut c_void,
    bytes: usize,
    flags: c_uint,
) -> CUresult {
    ffi("cuMemHostAlloc", || host_alloc(pp, bytes, flags))
}

/// # Safety
/// `pp` must be valid for a write of a pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) -> CUresult {
    ffi("cuMemAllocHost_v2", || host_alloc(pp, bytes, 0))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    ffi("cuMemFreeHost", || {
        let t = Instant::now();
        with(|g| {
            let (_, ctx) = g.cur()?;
            if ctx.host.get(&(p as usize)).is_none_or(|h| h.managed) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            ctx.dev_call(|d| d.host_free(p.cast()))?;
            ctx.host.remove(&(p as usize));
            Ok(())
        })?;
        stats::call("cuMemFreeHost", 0, t, Some(Phase::Close));
        Ok(())
    })
}

/// # Safety
/// `pdev` must be valid for a write of a `CUdeviceptr`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    pdev: *mut CUdeviceptr,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    ffi("cuMemHostGetDevicePointer_v2", || {
        if flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let d = with(|g| {
            let (_, ctx) = g.cur()?;
            let (base, h) = ctx.host_buf(p as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            Ok(h.dev + (p as usize - base) as u64)
        })?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(pdev, d) }
    })
}

/// # Safety
/// `flags` must be valid for a write of an `unsigned int`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetFlags(flags: *mut c_uint, p: *mut c_void) -> CUresult {
    ffi("cuMemHostGetFlags", || {
        let f = with(|g| {
            let (_, ctx) = g.cur()?;
            ctx.host_buf(p as usize)
                .map(|(_, h)| h.flags)
                .ok_or(CUDA_ERROR_INVALID_VALUE)
        })?;
        // SAFETY: the caller's out-pointer.
        unsafe { out(flags, f) }
    })
}

/// Records the range as page-locked. Copies from and to it work as for any host memory; the
/// GPU cannot address it (`cuMemHostGetDevicePointer` on it is refused).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, flags: c_uint) -> CUresult {
    ffi("cuMemHostRegister_v2", || {
        if p.is_null() || bytes == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        check_flags(flags, 0xf)?;
        with(|g| {
            let (_, ctx) = g.cur()?;
            let start = p as usize;
            let end = start.checked_add(bytes).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            let overlaps = ctx
                .registered
                .range(..end)
                .next_back()
                .is_some_and(|(s, l)| s + l > start);
            if overlaps {
                return Err(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
            }
            ctx.registered.insert(start, bytes);
            Ok(())
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister(p: *mut c_void, bytes: usize, flags: c_uint) -> CUresult {
    cuMemHostRegister_v2(p, bytes, flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    ffi("cuMemHostUnregister", || {
        with(|g| {
            let (_, ctx) = g.cur()?;
            ctx.registered
                .remove(&(p as usize))
                .map(|_| ())
                .ok_or(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED)
        })
    })
}

/// Waits for launches in flight before a copy out, charging the wait to the kernels phase.
fn drain_kernels(ctx: &mut Ctx) -> Result<(), CUresult> {
    if stats::kernels_pending() {
        super::device::sync_ctx(ctx)?;
    }
    Ok(())
}

/// Host → device, `bytes` from `src` to `dst` (checked against the allocations).
pub(super) fn htod(
    ctx: &mut Ctx,
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> Result<(), CUresult> {
    if bytes == 0 {
        return Ok(());
    }
    if src.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    ctx.check_dev(dst, bytes as u64)?;
    // SAFETY: the program promises `bytes` readable bytes at `src` (not null).
    let data = unsafe { std::slice::from_raw_parts(src.cast::<u8>(), bytes) };
    ctx.dev_call(|d| d.copy_htod(dst, data))
}

/// Device → host.
pub(super) fn dtoh(
    ctx: &mut Ctx,
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> Result<(), CUresult> {
    if bytes == 0 {
        return Ok(());
    }
    if dst.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    ctx.check_dev(src, bytes as u64)?;
    drain_kernels(ctx)?;
    // SAFETY: the program promises `bytes` writable bytes at `dst` (not null).
    let buf = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), bytes) };
    ctx.dev_call(|d| d.copy_dtoh(buf, src))
}

pub(super) fn dtod(
    ctx: &mut Ctx,
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
) -> Result<(), CUresult> {
    if bytes == 0 {
        return Ok(());
    }
    ctx.check_dev(dst, bytes as u64)?;
    ctx.check_dev(src, bytes as u64)?;
    ctx.dev_call(|d| d.copy_dtod(dst, src, bytes as u64))
}

/// Runs a copy on the stream's context with its stats.
fn copy(
    name: &'static str,
    stream: u64,
    bytes: usize,
    phase: Option<Phase>,
    f: impl FnOnce(&mut Ctx) -> Result<(), CUresult>,
) -> Result<(), CUresult> {
    let t = Instant::now();
    with(|g| f(g.stream_ctx(stream)?.1))?;
    stats::call(name, bytes as u64, t, phase);
    Ok(())
}

/// # Safety
/// `src` must be readable for `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoD_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
) -> CUresult {
    ffi("cuMemcpyHtoD_v2", || {
        copy("cuMemcpyHtoD_v2", 0, bytes, Some(Phase::CopiesIn), |c| {
            htod(c, dst, src, bytes)
        })
    })
}

/// # Safety
/// `src` must be readable for `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: CUdeviceptr,
    src: *const c_void,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    ffi("cuMemcpyHtoDAsync_v2", || {
        copy(
            "cuMemcpyHtoDAsync_v2",
            super::key(stream),
            bytes,
            Some(Phase::CopiesIn),
            |c| htod(c, dst, src, bytes),
        )
    })
}

/// # Safety
/// `dst` must be writable for `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoH_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
) -> CUresult {
    ffi("cuMemcpyDtoH_v2", || {
        copy("cuMemcpyDtoH_v2", 0, bytes, Some(Phase::CopiesOut), |c| {
            dtoh(c, dst, src, bytes)
        })
    })
}

/// # Safety
/// `dst` must be writable for `bytes` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    ffi("cuMemcpyDtoHAsync_v2", || {
        copy(
            "cuMemcpyDtoHAsync_v2",
            super::key(stream),
            bytes,
            Some(Phase::CopiesOut),
            |c| dtoh(c, dst, src, bytes),
        )
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoD_v2(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult {
    ffi("cuMemcpyDtoD_v2", || {
        copy("cuMemcpyDtoD_v2", 0, bytes, None, |c| {
            dtod(c, dst, src, bytes)
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    ffi("cuMemcpyDtoDAsync_v2", || {
        copy(
            "cuMemcpyDtoDAsync_v2",
            super::key(stream),
            bytes,
            None,
            |c| dtod(c, dst, src, bytes),
        )
    })
}

/// Where a unified address lies: device memory of the context (an allocation or a host
/// buffer's device mapping) or host memory (a host buffer's host address, or anything else).
enum Side {
    Device(CUdeviceptr),
    Host(usize),
}

fn side(ctx: &Ctx, p: u64, bytes: usize) -> Side {
    if ctx.check_dev(p, bytes as u64).is_ok() {
        Side::Device(p)
    } else {
        Side::Host(p as usize)
    }
}

pub(super) fn unified(
    ctx: &mut Ctx,
    dst: u64,
    src: u64,
    bytes: usize,
) -> Result<(Option<Phase>, ()), CUresult> {
    if bytes == 0 {
        return Ok((None, ()));
    }
    match (side(ctx, dst, bytes), side(ctx, src, bytes)) {
        (Side::Device(d), Side::Host(s)) => Ok((
            Some(Phase::CopiesIn),
            htod(ctx, d, s as *const c_void, bytes)?,
        )),
        (Side::Host(d), Side::Device(s)) => Ok((
            Some(Phase::CopiesOut),
            dtoh(ctx, d as *mut c_void, s, bytes)?,
        )),
        (Side::Device(d), Side::Device(s)) => Ok((None, dtod(ctx, d, s, bytes)?)),
        (Side::Host(d), Side::Host(s)) => {
            if d == 0 || s == 0 {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            // SAFETY: both are host memory the program names for `bytes` bytes (its promise).
            unsafe { std::ptr::copy(s as *const u8, d as *mut u8, bytes) };
            Ok((None, ()))
        }
    }
}

fn unified_call(
    name: &'static str,
    stream: u64,
    dst: u64,
    src: u64,
    bytes: usize,
) -> Result<(), CUresult> {
    let t = Instant::now();
    let phase = with(|g| unified(g.stream_ctx(stream)?.1, dst, src, bytes))?.0;
    stats::call(name, bytes as u64, t, phase);
    Ok(())
}

/// `cuMemcpy`: the direction from the addresses (unified addressing).
#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpy(dst: CUdeviceptr, src: CUdeviceptr, bytes: usize) -> CUresult {
    ffi("cuMemcpy", || unified_call("cuMemcpy", 0, dst, src, bytes))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemcpyAsync(
    dst: CUdeviceptr,
    src: CUdeviceptr,
    bytes: usize,
    stream: Handle,
) -> CUresult {
    ffi("cuMemcpyAsync", || {
        unified_call("cuMemcpyAsync", super::key(stream), dst, src, bytes)
    })
}

fn memset(
    name: &'static str,
    stream: Handle,
    dst: CUdeviceptr,
    value: u32,
    elem: u8,
    n: usize,
) -> CUresult {
    ffi(name, || {
        let bytes = (n as u64)
            .checked_mul(u64::from(elem))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if bytes == 0 {
            return with(|g| g.stream_ctx(super::key(stream)).map(|_| ()));
        }
        if !dst.is_multiple_of(u64::from(elem)) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        copy(name, super::key(stream), bytes as usize, None, |c| {
            c.check_dev(dst, bytes)?;
            c.dev_call(|d| d.memset(dst, value, elem, n as u64))
        })
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8_v2(dst: CUdeviceptr, v: u8, n: usize) -> CUresult {
    memset("cuMemsetD8_v2", handle(0), dst, v.into(), 1, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD16_v2(dst: CUdeviceptr, v: u16, n: usize) -> CUresult {
    memset("cuMemsetD16_v2", handle(0), dst, v.into(), 2, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32_v2(dst: CUdeviceptr, v: u32, n: usize) -> CUresult {
    memset("cuMemsetD32_v2", handle(0), dst, v, 4, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD8Async(dst: CUdeviceptr, v: u8, n: usize, s: Handle) -> CUresult {
    memset("cuMemsetD8Async", s, dst, v.into(), 1, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD16Async(dst: CUdeviceptr, v: u16, n: usize, s: Handle) -> CUresult {
    memset("cuMemsetD16Async", s, dst, v.into(), 2, n)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemsetD32Async(dst: CUdeviceptr, v: u32, n: usize, s: Handle) -> CUresult {
    memset("cuMemsetD32Async", s, dst, v, 4, n)
}

/// One pointer attribute of `ptr`, written to `data`.
///
/// # Safety
/// `data` must be valid for a write of the attribute's type.
unsafe fn pointer_attribute(
    ctx_h: u64,
    ctx: &Ctx,
    attr: c_uint,
    data: *mut c_void,
    ptr: u64,
) -> Result<(), CUresult> {
    if data.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let alloc = ctx
        .allocs
        .range(..=ptr)
        .next_back()
        .filter(|(b, l)| ptr < *b + *l)
        .map(|(b, l)| (*b, *l, None));
    let managed = ctx.host_buf(ptr as usize).is_some_and(|(_, h)| h.managed);
    let hostbuf = ctx
        .host_buf(ptr as usize)
        .map(|(b, h)| (h.dev, h.len, Some((b, ptr as usize - b))))
        .or_else(|| {
            ctx.host
                .iter()
                .find(|(_, h)| ptr >= h.dev && ptr < h.dev + h.len)
                .map(|(b, h)| (h.dev, h.len, Some((*b, (ptr - h.dev) as usize))))
        });
    let Some((base, len, host)) = alloc.or(hostbuf) else {
        return Err(CUDA_ERROR_INVALID_VALUE);
    };
    let dev_ptr = match host {
        Some((_, off)) => base + off as u64,
        None => ptr,
    };
    // SAFETY: (all writes) the caller's out-pointer, of the attribute's C type.
    unsafe {
        match attr {
            CU_POINTER_ATTRIBUTE_CONTEXT => out(data.cast::<Handle>(), handle(ctx_h)),
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE => out(
                data.cast::<c_uint>(),
                if host.is_some() {
                    CU_MEMORYTYPE_HOST
                } else {
                    CU_MEMORYTYPE_DEVICE
                },
            ),
            CU_POINTER_ATTRIBUTE_DEVICE_POINTER => out(data.cast::<u64>(), dev_ptr),
            CU_POINTER_ATTRIBUTE_HOST_POINTER => match host {
                Some((b, off)) => out(data.cast::<*mut c_void>(), (b + off) as *mut c_void),
                None => Err(CUDA_ERROR_INVALID_VALUE),
            },
            CU_POINTER_ATTRIBUTE_IS_MANAGED => out(data.cast::<u32>(), u32::from(managed)),
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => out(data.cast::<i32>(), 0),
            CU_POINTER_ATTRIBUTE_RANGE_START_ADDR => out(data.cast::<u64>(), base),
            CU_POINTER_ATTRIBUTE_RANGE_SIZE => out(data.cast::<usize>(), len as usize),
            CU_POINTER_ATTRIBUTE_MAPPED => out(data.cast::<u32>(), 1),
            CU_POINTER_ATTRIBUTE_SYNC_MEMOPS => out(data.cast::<u32>(), 1),
            CU_POINTER_ATTRIBUTE_BUFFER_ID => out(data.cast::<u64>(), base),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    }
}

/// # Safety
/// `data` must be valid for a write of the attribute's type.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttribute(
    data: *mut c_void,
    attr: c_uint,
    ptr: CUdeviceptr,
) -> CUresult {
    ffi("cuPointerGetAttribute", || {
        with(|g| {
            let (h, ctx) = g.cur()?;
            // SAFETY: the caller's out-pointer.
            unsafe { pointer_attribute(h, ctx, attr, data, ptr) }
        })
    })
}

/// Attributes a pointer outside every allocation does not have are written as zero (the
/// runtime's `cudaPointerGetAttributes` asks for host memory it never registered).
///
/// # Safety
/// `attrs` holds `n` attributes and `data` `n` out-pointers, each valid for its attribute.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuPointerGetAttributes(
    n: c_uint,
    attrs: *const c_uint,
    data: *const *mut c_void,
    ptr: CUdeviceptr,
) -> CUresult {
    ffi("cuPointerGetAttributes", || {
        if attrs.is_null() || data.is_null() || n == 0 || n > 64 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        with(|g| {
            let (h, ctx) = g.cur()?;
            for i in 0..n as usize {
                // SAFETY: the program promises `n` entries in both arrays.
                let (a, d) = unsafe { (*attrs.add(i), *data.add(i)) };
                if d.is_null() {
                    continue;
                }
                // SAFETY: the program's out-pointer for attribute `a`.
                if unsafe { pointer_attribute(h, ctx, a, d, ptr) }.is_err() {
                    let zero_bytes = match a {
                        CU_POINTER_ATTRIBUTE_MEMORY_TYPE
                        | CU_POINTER_ATTRIBUTE_IS_MANAGED
                        | CU_POINTER_ATTRIBUTE_MAPPED
                        | CU_POINTER_ATTRIBUTE_SYNC_MEMOPS => 4,
                        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL => {
                            // SAFETY: an int out-pointer.
                            unsafe { out(d.cast::<i32>(), -2)? };
                            0
                        }
                        _ => 8,
                    };
                    // SAFETY: the attribute's out-pointer, `zero_bytes` its size.
                    unsafe { std::ptr::write_bytes(d.cast::<u8>(), 0, zero_bytes) };
                }
            }
            Ok(())
        })
    })
}
