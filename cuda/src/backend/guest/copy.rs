//! Copies and fills on the process's channel: host → device and device → host through two
//! staging buffers in DMA memory, 1 MiB at a time and double-buffered (the copy engine moves
//! one chunk while the CPU fills or drains the other); straight from and to `host_alloc`
//! memory, which the GPU maps; device → device as one copy; fills as a pattern copied in and
//! then doubled by device copies (the virtual GPU has no fill method).

use std::collections::VecDeque;

use super::{GuestDevice, STAGE_BYTES, setup_error};
use crate::device::{DevPtr, DeviceError};

/// Longest fill pattern written by the CPU.
const PATTERN_BYTES: u64 = 64 << 10;

/// Host → device: returns once `src` is in staging memory (or, from `host_alloc` memory, once
/// the copy is done).
pub(super) fn htod(d: &mut GuestDevice, dst: DevPtr, src: &[u8]) -> Result<(), DeviceError> {
    d.alive()?;
    if src.is_empty() {
        return Ok(());
    }
    let len = src.len() as u64;
    d.check_range(dst, len)?;
    if let Some(va) = d.host_va(src.as_ptr(), src.len()) {
        d.pb.copy(va, dst, len);
        let f = d.submit()?;
        return d.wait_fence(f);
    }
    for (i, chunk) in src.chunks(STAGE_BYTES as usize).enumerate() {
        let b = d.staging.next;
        d.staging.next ^= 1;
        if let Some(f) = d.staging.last[b].take() {
            d.wait_fence(f)?;
        }
        let buf = d.staging.bufs[b];
        d.s.gpu.sys_write(&buf, 0, chunk).map_err(setup_error)?;
        d.pb.copy(buf.va, dst + i as u64 * STAGE_BYTES, chunk.len() as u64);
        let f = d.submit()?;
        d.staging.last[b] = Some(f);
    }
    Ok(())
}

/// Device → host, after all earlier work.
pub(super) fn dtoh(d: &mut GuestDevice, dst: &mut [u8], src: DevPtr) -> Result<(), DeviceError> {
    d.alive()?;
    if dst.is_empty() {
        return Ok(());
    }
    let len = dst.len() as u64;
    d.check_range(src, len)?;
    if let Some(va) = d.host_va(dst.as_ptr(), dst.len()) {
        d.pb.copy(src, va, len);
        let f = d.submit()?;
        return d.wait_fence(f);
    }
    // (offset, bytes, staging buffer, fence) of chunks copied but not yet read out.
    let mut inflight: VecDeque<(usize, usize, usize, gpu_driver::Fence)> = VecDeque::new();
    let step = STAGE_BYTES as usize;
    let mut off = 0;
    while off < dst.len() || !inflight.is_empty() {
        if off < dst.len() && inflight.len() < 2 {
            let n = step.min(dst.len() - off);
            let b = d.staging.next;
            d.staging.next ^= 1;
            if let Some(f) = d.staging.last[b].take() {
                d.wait_fence(f)?;
            }
            let buf = d.staging.bufs[b];
            d.pb.copy(src + off as u64, buf.va, n as u64);
            let f = d.submit()?;
            d.staging.last[b] = Some(f);
            inflight.push_back((off, n, b, f));
            off += n;
            continue;
        }
        if let Some((o, n, b, f)) = inflight.pop_front() {
            d.wait_fence(f)?;
            d.staging.last[b] = None;
            let buf = d.staging.bufs[b];
            d.s.gpu
                .sys_read(&buf, 0, &mut dst[o..o + n])
                .map_err(setup_error)?;
        }
    }
    Ok(())
}

/// Device → device, queued.
pub(super) fn dtod(
    d: &mut GuestDevice,
    dst: DevPtr,
    src: DevPtr,
    bytes: u64,
) -> Result<(), DeviceError> {
    d.alive()?;
    if bytes == 0 {
        return Ok(());
    }
    d.check_range(dst, bytes)?;
    d.check_range(src, bytes)?;
    d.pb.copy(src, dst, bytes);
    d.submit().map(|_| ())
}

/// `count` elements of `elem` bytes set to `value`, queued: a pattern of up to 64 KiB copied
/// in, then copied onto the rest of the range in doubling steps.
pub(super) fn memset(
    d: &mut GuestDevice,
    dst: DevPtr,
    value: u32,
    elem: u8,
    count: u64,
) -> Result<(), DeviceError> {
    d.alive()?;
    if !matches!(elem, 1 | 2 | 4) {
        return Err(DeviceError::InvalidValue(format!(
            "fill element of {elem} bytes"
        )));
    }
    let total = count
        .checked_mul(u64::from(elem))
        .ok_or_else(|| DeviceError::InvalidValue("fill size overflows".into()))?;
    if total == 0 {
        return Ok(());
    }
    d.check_range(dst, total)?;
    let unit = &value.to_le_bytes()[..usize::from(elem)];
    let first = total.min(PATTERN_BYTES);
    let pattern: Vec<u8> = unit.iter().copied().cycle().take(first as usize).collect();
    let va = match d.arena.place(&mut d.s, &pattern, 16) {
        Ok(va) => va,
        Err(e) => return Err(d.fail(e)),
    };
    d.pb.copy(va, dst, first);
    let mut done = first;
    while done < total {
        let n = done.min(total - done);
        d.pb.copy(dst, dst + done, n);
        done += n;
    }
    let f = d.submit()?;
    d.arena.used_by(f);
    Ok(())
}
