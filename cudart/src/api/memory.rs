//! Memory: device allocations, copies and sets (synchronous, asynchronous, to and from
//! registered symbols, 2D by rows), page-locked host memory, managed memory, pointer queries.

use std::ffi::{c_int, c_uint, c_void};

use super::per_thread;
use crate::context::{self, MemKind, check_stream};
use crate::driver::{DevPtr, Driver, Handle};
use crate::error::*;
use crate::ffi::Out;
use crate::gen_structs::cudaPointerAttributes;

/// `cudaMemcpyKind`.
pub const H2H: c_int = 0;
pub const H2D: c_int = 1;
pub const D2H: c_int = 2;
pub const D2D: c_int = 3;
pub const DEFAULT: c_int = 4;

/// The copy direction `kind` means for these two pointers (`cudaMemcpyDefault` asks where they are).
fn direction(d: &Driver, dst: u64, src: u64, kind: c_int) -> Res<c_int> {
    match kind {
        H2H | H2D | D2H | D2D => Ok(kind),
        DEFAULT => {
            let on_dev = |p| context::classify(d, p) != MemKind::Host;
            Ok(match (on_dev(src), on_dev(dst)) {
                (false, false) => H2H,
                (false, true) => H2D,
                (true, false) => D2H,
                (true, true) => D2D,
            })
        }
        _ => fail(INVALID_MEMCPY_DIRECTION),
    }
}

/// One copy of `n` bytes; `stream` `Some` for the asynchronous form.
pub fn copy(d: &Driver, dst: u64, src: u64, n: usize, kind: c_int, stream: Option<Handle>) -> Res {
    let kind = direction(d, dst, src, kind)?;
    if n == 0 {
        return Ok(());
    }
    if dst == 0 || src == 0 {
        return fail(INVALID_VALUE);
    }
    let (dp, sp) = (dst as *mut c_void, src as *const c_void);
    // SAFETY: the program passes buffers of at least `n` bytes in the places `kind` says (the
    // CUDA contract); device addresses are checked by the driver.
    let r = unsafe {
        match (kind, stream) {
            (H2H, s) => {
                if let Some(s) = s {
                    cu(d.stream_synchronize(s))?;
                }
                std::ptr::copy(sp as *const u8, dp as *mut u8, n);
                0
            }
            (H2D, None) => d.memcpy_htod(dst, sp, n),
            (D2H, None) => d.memcpy_dtoh(dp, src, n),
            (H2D, Some(s)) => d.memcpy_htod_async(dst, sp, n, s),
            (D2H, Some(s)) => d.memcpy_dtoh_async(dp, src, n, s),
            (_, None) => d.memcpy_dtod(dst, src, n),
            (_, Some(s)) => d.memcpy_dtod_async(dst, src, n, s),
        }
    };
    cu(r)
}

crate::error::api! {
    /// `cudaMalloc`.
    fn cudaMalloc(ptr: Out<*mut c_void>, size: usize) {
        let d = context::ctx()?;
        if ptr.is_null() {
            return fail(INVALID_VALUE);
        }
        if size == 0 {
            return ptr.set(std::ptr::null_mut());
        }
        let mut p: DevPtr = 0;
        // SAFETY: `p` receives the address.
        cu(unsafe { d.mem_alloc(&mut p, size) })?;
        context::add_alloc(p, size as u64, MemKind::Device);
        ptr.set(p as *mut c_void)
    }
}

crate::error::api! {
    /// `cudaFree` (`cudaFree(0)` initialises the runtime, as programs use it).
    fn cudaFree(ptr: *mut c_void) {
        let d = context::ctx()?;
        if ptr.is_null() {
            return Ok(());
        }
        if context::find_alloc(ptr as u64).is_some_and(|(_, k)| k == MemKind::Host) {
            return fail(INVALID_VALUE);
        }
        // SAFETY: the driver checks that the address is an allocation's start.
        cu(unsafe { d.mem_free(ptr as DevPtr) })?;
        context::remove_alloc(ptr as u64);
        Ok(())
    }
}

crate::error::api! {
    /// `cudaMallocManaged` (over the driver's managed memory where it has some).
    fn cudaMallocManaged(ptr: Out<*mut c_void>, size: usize, flags: c_uint) {
        let d = context::ctx()?;
        if ptr.is_null() || size == 0 {
            return fail(INVALID_VALUE);
        }
        let mut p: DevPtr = 0;
        // SAFETY: `p` receives the address.
        cu(unsafe { d.mem_alloc_managed(&mut p, size, flags) })?;
        context::add_alloc(p, size as u64, MemKind::Managed);
        ptr.set(p as *mut c_void)
    }
}

crate::error::api! {
    /// `cudaMallocPitch`: rows padded to 512 bytes.
    fn cudaMallocPitch(ptr: Out<*mut c_void>, pitch: Out<usize>, width: usize, height: usize) {
        let d = context::ctx()?;
        let p_bytes = width.checked_next_multiple_of(512).ok_or(CudaError(INVALID_VALUE))?.max(512);
        let size = p_bytes.checked_mul(height).ok_or(CudaError(INVALID_VALUE))?;
        let mut p: DevPtr = 0;
        if size > 0 {
            // SAFETY: `p` receives the address.
            cu(unsafe { d.mem_alloc(&mut p, size) })?;
            context::add_alloc(p, size as u64, MemKind::Device);
        }
        pitch.set(p_bytes)?;
        ptr.set(p as *mut c_void)
    }
}

crate::error::api! {
    /// `cudaMemcpy`.
    fn cudaMemcpy(dst: *mut c_void, src: *const c_void, n: usize, kind: c_int) {
        copy(context::ctx()?, dst as u64, src as u64, n, kind, None)
    }
}

crate::error::api! {
    /// `cudaMemcpy` of a per-thread-default-stream build (synchronous either way).
    fn cudaMemcpy_ptds(dst: *mut c_void, src: *const c_void, n: usize, kind: c_int) {
        copy(context::ctx()?, dst as u64, src as u64, n, kind, None)
    }
}

crate::error::api! {
    /// `cudaMemcpyAsync`.
    fn cudaMemcpyAsync(dst: *mut c_void, src: *const c_void, n: usize, kind: c_int, stream: Handle) {
        let d = context::ctx()?;
        copy(d, dst as u64, src as u64, n, kind, Some(check_stream(stream)?))
    }
}

crate::error::api! {
    /// `cudaMemcpyAsync` with the per-thread default stream.
    fn cudaMemcpyAsync_ptsz(dst: *mut c_void, src: *const c_void, n: usize, kind: c_int, stream: Handle) {
        let d = context::ctx()?;
        copy(d, dst as u64, src as u64, n, kind, Some(check_stream(per_thread(stream))?))
    }
}

/// A 2D copy's shape: `height` rows of `width` bytes, rows `dpitch` / `spitch` bytes apart.
struct Rows {
    dpitch: usize,
    spitch: usize,
    width: usize,
    height: usize,
}

/// `cudaMemcpy2D` as one copy per row (one copy when the rows are contiguous).
fn copy_2d(dst: u64, src: u64, r: Rows, kind: c_int, stream: Option<Handle>) -> Res {
    let d = context::ctx()?;
    let stream = stream.map(check_stream).transpose()?;
    if r.width > r.dpitch || r.width > r.spitch {
        return fail(INVALID_PITCH_VALUE);
    }
    if r.width == r.dpitch && r.width == r.spitch {
        let n = r
            .width
            .checked_mul(r.height)
            .ok_or(CudaError(INVALID_VALUE))?;
        return copy(d, dst, src, n, kind, stream);
    }
    for row in 0..r.height as u64 {
        let off = |pitch: usize| {
            row.checked_mul(pitch as u64)
                .ok_or(CudaError(INVALID_VALUE))
        };
        copy(
            d,
            dst + off(r.dpitch)?,
            src + off(r.spitch)?,
            r.width,
            kind,
            stream,
        )?;
    }
    Ok(())
}

crate::error::api! {
    /// `cudaMemcpy2D`.
    fn cudaMemcpy2D(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int) {
        copy_2d(dst as u64, src as u64, Rows { dpitch, spitch, width, height }, kind, None)
    }
}

crate::error::api! {
    /// `cudaMemcpy2D` of a per-thread-default-stream build.
    fn cudaMemcpy2D_ptds(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int) {
        copy_2d(dst as u64, src as u64, Rows { dpitch, spitch, width, height }, kind, None)
    }
}

crate::error::api! {
    /// `cudaMemcpy2DAsync`.
    fn cudaMemcpy2DAsync(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int, stream: Handle) {
        copy_2d(dst as u64, src as u64, Rows { dpitch, spitch, width, height }, kind, Some(stream))
    }
}

crate::error::api! {
    /// `cudaMemcpy2DAsync` with the per-thread default stream.
    fn cudaMemcpy2DAsync_ptsz(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int, stream: Handle) {
        copy_2d(dst as u64, src as u64, Rows { dpitch, spitch, width, height }, kind, Some(per_thread(stream)))
    }
}

fn set(p: *mut c_void, value: c_int, n: usize, stream: Option<Handle>) -> Res {
    let d = context::ctx()?;
    if n == 0 {
        return Ok(());
    }
    if p.is_null() {
        return fail(INVALID_VALUE);
    }
    // SAFETY: the driver checks the device range.
    cu(unsafe {
        match stream {
            None => d.memset_d8(p as DevPtr, value as u8, n),
            Some(s) => d.memset_d8_async(p as DevPtr, value as u8, n, check_stream(s)?),
        }
    })
}

crate::error::api! {
    /// `cudaMemset`.
    fn cudaMemset(p: *mut c_void, value: c_int, n: usize) { set(p, value, n, None) }
}

crate::error::api! {
    /// `cudaMemset` of a per-thread-default-stream build.
    fn cudaMemset_ptds(p: *mut c_void, value: c_int, n: usize) { set(p, value, n, None) }
}

crate::error::api! {
    /// `cudaMemsetAsync`.
    fn cudaMemsetAsync(p: *mut c_void, value: c_int, n: usize, stream: Handle) { set(p, value, n, Some(stream)) }
}

crate::error::api! {
    /// `cudaMemsetAsync` with the per-thread default stream.
    fn cudaMemsetAsync_ptsz(p: *mut c_void, value: c_int, n: usize, stream: Handle) {
        set(p, value, n, Some(per_thread(stream)))
    }
}

crate::error::api! {
    /// `cudaMemset2D`, one row at a time.
    fn cudaMemset2D(p: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize) {
        if width > pitch {
            return fail(INVALID_PITCH_VALUE);
        }
        for row in 0..height {
            let off = row.checked_mul(pitch).ok_or(CudaError(INVALID_VALUE))?;
            set((p as usize).wrapping_add(off) as *mut c_void, value, width, None)?;
        }
        Ok(())
    }
}

/// A registered variable's device address, checked to hold `[offset, offset + n)`.
fn symbol_range(d: &Driver, symbol: *const c_void, n: usize, offset: usize) -> Res<u64> {
    let (addr, size) = context::symbol(d, symbol as usize)?;
    match offset.checked_add(n) {
        Some(end) if end <= size => Ok(addr + offset as u64),
        _ => fail(INVALID_VALUE),
    }
}

fn to_symbol(
    symbol: *const c_void,
    src: *const c_void,
    n: usize,
    offset: usize,
    kind: c_int,
    stream: Option<Handle>,
) -> Res {
    let d = context::ctx()?;
    let stream = stream.map(check_stream).transpose()?;
    if ![H2D, D2D, DEFAULT].contains(&kind) {
        return fail(INVALID_MEMCPY_DIRECTION);
    }
    let dst = symbol_range(d, symbol, n, offset)?;
    let kind = if kind == DEFAULT {
        direction(d, dst, src as u64, DEFAULT)?
    } else {
        kind
    };
    copy(d, dst, src as u64, n, kind, stream)
}

fn from_symbol(
    dst: *mut c_void,
    symbol: *const c_void,
    n: usize,
    offset: usize,
    kind: c_int,
    stream: Option<Handle>,
) -> Res {
    let d = context::ctx()?;
    let stream = stream.map(check_stream).transpose()?;
    if ![D2H, D2D, DEFAULT].contains(&kind) {
        return fail(INVALID_MEMCPY_DIRECTION);
    }
    let src = symbol_range(d, symbol, n, offset)?;
    let kind = if kind == DEFAULT {
        direction(d, dst as u64, src, DEFAULT)?
    } else {
        kind
    };
    copy(d, dst as u64, src, n, kind, stream)
}

crate::error::api! {
    /// `cudaMemcpyToSymbol`.
    fn cudaMemcpyToSymbol(symbol: *const c_void, src: *const c_void, n: usize, offset: usize, kind: c_int) {
        to_symbol(symbol, src, n, offset, kind, None)
    }
}

crate::error::api! {
    /// `cudaMemcpyToSymbol` of a per-thread-default-stream build.
    fn cudaMemcpyToSymbol_ptds(symbol: *const c_void, src: *const c_void, n: usize, offset: usize, kind: c_int) {
        to_symbol(symbol, src, n, offset, kind, None)
    }
}

crate::error::api! {
    /// `cudaMemcpyToSymbolAsync`.
    fn cudaMemcpyToSymbolAsync(symbol: *const c_void, src: *const c_void, n: usize, offset: usize, kind: c_int, stream: Handle) {
        to_symbol(symbol, src, n, offset, kind, Some(stream))
    }
}

crate::error::api! {
    /// `cudaMemcpyToSymbolAsync` with the per-thread default stream.
    fn cudaMemcpyToSymbolAsync_ptsz(symbol: *const c_void, src: *const c_void, n: usize, offset: usize, kind: c_int, stream: Handle) {
        to_symbol(symbol, src, n, offset, kind, Some(per_thread(stream)))
    }
}

crate::error::api! {
    /// `cudaMemcpyFromSymbol`.
    fn cudaMemcpyFromSymbol(dst: *mut c_void, symbol: *const c_void, n: usize, offset: usize, kind: c_int) {
        from_symbol(dst, symbol, n, offset, kind, None)
    }
}

crate::error::api! {
    /// `cudaMemcpyFromSymbol` of a per-thread-default-stream build.
    fn cudaMemcpyFromSymbol_ptds(dst: *mut c_void, symbol: *const c_void, n: usize, offset: usize, kind: c_int) {
        from_symbol(dst, symbol, n, offset, kind, None)
    }
}

crate::error::api! {
    /// `cudaMemcpyFromSymbolAsync`.
    fn cudaMemcpyFromSymbolAsync(dst: *mut c_void, symbol: *const c_void, n: usize, offset: usize, kind: c_int, stream: Handle) {
        from_symbol(dst, symbol, n, offset, kind, Some(stream))
    }
}

crate::error::api! {
    /// `cudaMemcpyFromSymbolAsync` with the per-thread default stream.
    fn cudaMemcpyFromSymbolAsync_ptsz(dst: *mut c_void, symbol: *const c_void, n: usize, offset: usize, kind: c_int, stream: Handle) {
        from_symbol(dst, symbol, n, offset, kind, Some(per_thread(stream)))
    }
}

crate::error::api! {
    /// `cudaGetSymbolAddress`.
    fn cudaGetSymbolAddress(ptr: Out<*mut c_void>, symbol: *const c_void) {
        let d = context::ctx()?;
        ptr.set(context::symbol(d, symbol as usize)?.0 as *mut c_void)
    }
}

crate::error::api! {
    /// `cudaGetSymbolSize`.
    fn cudaGetSymbolSize(size: Out<usize>, symbol: *const c_void) {
        let d = context::ctx()?;
        size.set(context::symbol(d, symbol as usize)?.1)
    }
}

fn host_alloc(ptr: Out<*mut c_void>, size: usize, flags: Option<c_uint>) -> Res {
    let d = context::ctx()?;
    if ptr.is_null() {
        return fail(INVALID_VALUE);
    }
    let mut p: *mut c_void = std::ptr::null_mut();
    if size > 0 {
        // SAFETY: `p` receives the address.
        cu(unsafe {
            match flags {
                None => d.mem_alloc_host(&mut p, size),
                Some(f) => d.mem_host_alloc(&mut p, size, f),
            }
        })?;
        context::add_alloc(p as u64, size as u64, MemKind::Host);
    }
    ptr.set(p)
}

crate::error::api! {
    /// `cudaMallocHost`: page-locked host memory.
    fn cudaMallocHost(ptr: Out<*mut c_void>, size: usize) { host_alloc(ptr, size, None) }
}

crate::error::api! {
    /// `cudaHostAlloc` (flags: portable 1, mapped 2, write-combined 4, as the driver's).
    fn cudaHostAlloc(ptr: Out<*mut c_void>, size: usize, flags: c_uint) { host_alloc(ptr, size, Some(flags)) }
}

crate::error::api! {
    /// `cudaFreeHost`.
    fn cudaFreeHost(p: *mut c_void) {
        let d = context::ctx()?;
        if p.is_null() {
            return Ok(());
        }
        // SAFETY: the driver checks that `p` is its page-locked allocation.
        cu(unsafe { d.mem_free_host(p) })?;
        context::remove_alloc(p as u64);
        Ok(())
    }
}

crate::error::api! {
    /// `cudaHostRegister`.
    fn cudaHostRegister(p: *mut c_void, size: usize, flags: c_uint) {
        let d = context::ctx()?;
        if p.is_null() || size == 0 {
            return fail(INVALID_VALUE);
        }
        // SAFETY: the program's memory range, as CUDA requires.
        cu(unsafe { d.mem_host_register(p, size, flags) })
    }
}

crate::error::api! {
    /// `cudaHostUnregister`.
    fn cudaHostUnregister(p: *mut c_void) {
        let d = context::ctx()?;
        if p.is_null() {
            return fail(INVALID_VALUE);
        }
        // SAFETY: the driver checks that `p` was registered.
        cu(unsafe { d.mem_host_unregister(p) })
    }
}

crate::error::api! {
    /// `cudaHostGetDevicePointer`.
    fn cudaHostGetDevicePointer(dev: Out<*mut c_void>, host: *mut c_void, flags: c_uint) {
        let d = context::ctx()?;
        if host.is_null() || dev.is_null() {
            return fail(INVALID_VALUE);
        }
        let mut p: DevPtr = 0;
        // SAFETY: `p` receives the address; the driver checks `host`.
        cu(unsafe { d.mem_host_get_device_pointer(&mut p, host, flags) })?;
        dev.set(p as *mut c_void)
    }
}

crate::error::api! {
    /// `cudaHostGetFlags`.
    fn cudaHostGetFlags(flags: Out<c_uint>, host: *mut c_void) {
        let d = context::ctx()?;
        let mut f = 0;
        // SAFETY: `f` receives the flags; the driver checks `host`.
        cu(unsafe { d.mem_host_get_flags(&mut f, host) })?;
        flags.set(f)
    }
}

crate::error::api! {
    /// `cudaMemGetInfo`.
    fn cudaMemGetInfo(free: Out<usize>, total: Out<usize>) {
        let d = context::ctx()?;
        let (mut f, mut t) = (0, 0);
        // SAFETY: locals receive the values.
        cu(unsafe { d.mem_get_info(&mut f, &mut t) })?;
        free.set(f)?;
        total.set(t)
    }
}

crate::error::api! {
    /// `cudaPointerGetAttributes`: from the runtime's own allocations, else the driver's view.
    fn cudaPointerGetAttributes(attr: Out<cudaPointerAttributes>, ptr: *const c_void) {
        let d = context::ctx()?;
        if attr.is_null() {
            return fail(INVALID_VALUE);
        }
        let addr = ptr as u64;
        // SAFETY: all-zero bytes are a valid cudaPointerAttributes (integers and pointers).
        let mut a: cudaPointerAttributes = unsafe { std::mem::zeroed() };
        a.device = context::current_device();
        let p = ptr as *mut c_void;
        match (context::find_alloc(addr), context::classify(d, addr)) {
            (Some((_, MemKind::Host)), _) => (a.r#type, a.hostPointer, a.devicePointer) = (1, p, p),
            (_, MemKind::Device) => (a.r#type, a.devicePointer) = (2, p),
            (_, MemKind::Managed) => (a.r#type, a.hostPointer, a.devicePointer) = (3, p, p),
            (_, MemKind::Host) => (a.r#type, a.device, a.hostPointer) = (0, -2, p),
        }
        attr.set(a)
    }
}
