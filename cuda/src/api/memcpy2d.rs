//! Pitched memory: `cuMemAllocPitch_v2` and the 2-D copies (`cuMemcpy2D_v2`,
//! `cuMemcpy2DUnaligned_v2`, `cuMemcpy2DAsync_v2`), row by row over the 1-D copies (one copy
//! when both sides are contiguous). CUDA arrays are not supported.

use std::ffi::{c_uint, c_void};
use std::time::Instant;

use super::memory::{dtod, dtoh, htod, unified};
use super::{CUdeviceptr, Handle, ffi, key, out};
use crate::result::*;
use crate::state::{Ctx, try_with as with};
use crate::stats::{self, Phase};

/// Row alignment of pitched allocations.
const PITCH_ALIGN: usize = 512;

/// # Safety
/// `dptr`, `pitch` must be valid for writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemAllocPitch_v2(
    dptr: *mut CUdeviceptr,
    pitch: *mut usize,
    width: usize,
    height: usize,
    elem: c_uint,
) -> CUresult {
    ffi("cuMemAllocPitch_v2", || {
        if dptr.is_null() || pitch.is_null() || width == 0 || height == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !matches!(elem, 4 | 8 | 16) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let p = width
            .checked_next_multiple_of(PITCH_ALIGN)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let bytes = p.checked_mul(height).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let mut d = 0;
        // SAFETY: out-pointer to a local.
        match unsafe { super::cuMemAlloc_v2(&mut d, bytes) } {
            CUDA_SUCCESS => {}
            e => return Err(e),
        }
        // SAFETY: checked not null; the caller's out-pointers.
        unsafe {
            out(pitch, p)?;
            out(dptr, d)
        }
    })
}

/// `CUDA_MEMCPY2D` (CUDA 13, the `_v2` layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy2D {
    pub src_x: usize,
    pub src_y: usize,
    pub src_type: c_uint,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: *mut c_void,
    pub src_pitch: usize,
    pub dst_x: usize,
    pub dst_y: usize,
    pub dst_type: c_uint,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: *mut c_void,
    pub dst_pitch: usize,
    pub width: usize,
    pub height: usize,
}

/// One side of a 2-D copy: host or device (unified: told by the address) and its first byte.
#[derive(Clone, Copy)]
enum End {
    Host(u64),
    Device(u64),
    Unified(u64),
}

fn end(
    kind: c_uint,
    host: u64,
    dev: u64,
    x: usize,
    y: usize,
    pitch: usize,
) -> Result<End, CUresult> {
    let off = y
        .checked_mul(pitch)
        .and_then(|o| o.checked_add(x))
        .ok_or(CUDA_ERROR_INVALID_VALUE)? as u64;
    let at = |b: u64| b.checked_add(off).ok_or(CUDA_ERROR_INVALID_VALUE);
    match kind {
        CU_MEMORYTYPE_HOST => Ok(End::Host(at(host)?)),
        CU_MEMORYTYPE_DEVICE => Ok(End::Device(at(dev)?)),
        CU_MEMORYTYPE_UNIFIED => Ok(End::Unified(at(dev)?)),
        CU_MEMORYTYPE_ARRAY => Err(CUDA_ERROR_NOT_SUPPORTED),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// Copies one run of `n` bytes; returns the phase it belongs to.
fn run(ctx: &mut Ctx, dst: End, src: End, n: usize) -> Result<Option<Phase>, CUresult> {
    match (dst, src) {
        (End::Device(d), End::Host(s)) => {
            htod(ctx, d, s as *const c_void, n).map(|_| Some(Phase::CopiesIn))
        }
        (End::Host(d), End::Device(s)) => {
            dtoh(ctx, d as *mut c_void, s, n).map(|_| Some(Phase::CopiesOut))
        }
        (End::Device(d), End::Device(s)) => dtod(ctx, d, s, n).map(|_| None),
        (d, s) => {
            let a = |e: End| match e {
                End::Host(p) | End::Device(p) | End::Unified(p) => p,
            };
            unified(ctx, a(d), a(s), n).map(|(p, ())| p)
        }
    }
}

fn shift(e: End, by: usize) -> End {
    match e {
        End::Host(p) => End::Host(p + by as u64),
        End::Device(p) => End::Device(p + by as u64),
        End::Unified(p) => End::Unified(p + by as u64),
    }
}

fn copy2d(name: &'static str, p: *const Memcpy2D, stream: u64) -> Result<(), CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the program's CUDA_MEMCPY2D (not null).
    let c = unsafe { p.read_unaligned() };
    if c.width == 0 || c.height == 0 {
        return Ok(());
    }
    if c.height > 1 && (c.src_pitch < c.width || c.dst_pitch < c.width) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let total = c
        .width
        .checked_mul(c.height)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let src = end(
        c.src_type,
        c.src_host as u64,
        c.src_device,
        c.src_x,
        c.src_y,
        c.src_pitch,
    )?;
    let dst = end(
        c.dst_type,
        c.dst_host as u64,
        c.dst_device,
        c.dst_x,
        c.dst_y,
        c.dst_pitch,
    )?;
    let t = Instant::now();
    let phase = with(|g| {
        let (_, ctx) = g.stream_ctx(stream)?;
        // The whole span of a device side lies in one allocation before anything is copied.
        for (e, pitch) in [(dst, c.dst_pitch), (src, c.src_pitch)] {
            if let End::Device(a) = e {
                let span = (c.height - 1)
                    .checked_mul(pitch)
                    .and_then(|s| s.checked_add(c.width))
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                ctx.check_dev(a, span as u64)?;
            }
        }
        if c.height == 1 || (c.src_pitch == c.width && c.dst_pitch == c.width) {
            return run(ctx, dst, src, total);
        }
        let mut phase = None;
        for r in 0..c.height {
            phase = run(
                ctx,
                shift(dst, r * c.dst_pitch),
                shift(src, r * c.src_pitch),
                c.width,
            )?;
        }
        Ok(phase)
    })?;
    stats::call(name, total as u64, t, phase);
    Ok(())
}

/// # Safety
/// `p` points to a `CUDA_MEMCPY2D` whose pointers are valid for the rows it names.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2D_v2(p: *const Memcpy2D) -> CUresult {
    ffi("cuMemcpy2D_v2", || copy2d("cuMemcpy2D_v2", p, 0))
}

/// # Safety
/// As [`cuMemcpy2D_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2DUnaligned_v2(p: *const Memcpy2D) -> CUresult {
    ffi("cuMemcpy2DUnaligned_v2", || copy2d("cuMemcpy2D_v2", p, 0))
}

/// # Safety
/// As [`cuMemcpy2D_v2`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemcpy2DAsync_v2(p: *const Memcpy2D, stream: Handle) -> CUresult {
    ffi("cuMemcpy2DAsync_v2", || {
        copy2d("cuMemcpy2DAsync_v2", p, key(stream))
    })
}
