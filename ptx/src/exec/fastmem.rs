//! Warp-wide fast paths for the common scalar loads and stores (explicit `.shared` or
//! `.global` space): the size dispatch is hoisted out of the lane loop. Any lane that needs
//! more than the fast checks (a fault, a TLB miss that faults) makes the path return `false`
//! and the caller redoes the instruction on the general per-lane path, which reports faults.

use crate::exec::alu::Lanes;
use crate::exec::mem::{Tlb, host_load, host_store};
use crate::memory::{Access, GlobalMemory, LOCAL_WINDOW, MODULE_WINDOW, SHARED_WINDOW};

#[inline(always)]
fn shared_get(sh: &[u8], o: u64, size: usize) -> Option<u64> {
    if !o.is_multiple_of(size as u64) {
        return None;
    }
    let o = usize::try_from(o).ok()?;
    let b = sh.get(o..o.checked_add(size)?)?;
    Some(match size {
        1 => u64::from(b[0]),
        2 => u64::from(u16::from_le_bytes([b[0], b[1]])),
        4 => u64::from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        _ => u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]),
    })
}

#[inline(always)]
fn shared_put(sh: &mut [u8], o: u64, size: usize, v: u64) -> bool {
    if !o.is_multiple_of(size as u64) {
        return false;
    }
    let Ok(o) = usize::try_from(o) else {
        return false;
    };
    let Some(end) = o.checked_add(size) else {
        return false;
    };
    match sh.get_mut(o..end) {
        Some(b) => {
            b.copy_from_slice(&v.to_le_bytes()[..size]);
            true
        }
        None => false,
    }
}

/// Scalar shared load for the lanes in `exec`.
#[inline(always)]
pub(crate) fn ld_shared(
    sh: &[u8],
    addr: &Lanes,
    off: i64,
    size: usize,
    exec: u32,
    out: &mut Lanes,
) -> bool {
    for l in 0..32 {
        if exec >> l & 1 != 0 {
            match shared_get(sh, addr[l].wrapping_add(off as u64), size) {
                Some(v) => out[l] = v,
                None => return false,
            }
        }
    }
    true
}

/// Scalar shared store for the lanes in `exec` (lane order).
#[inline(always)]
pub(crate) fn st_shared(
    sh: &mut [u8],
    addr: &Lanes,
    off: i64,
    size: usize,
    exec: u32,
    val: &Lanes,
) -> bool {
    for l in 0..32 {
        if exec >> l & 1 != 0 && !shared_put(sh, addr[l].wrapping_add(off as u64), size, val[l]) {
            return false;
        }
    }
    true
}

/// True for generic addresses of the shared/local/module windows (never global memory; used so the
/// global paths also serve generic accesses that resolve to global memory).
#[inline(always)]
fn in_window(va: u64) -> bool {
    va >= SHARED_WINDOW.min(LOCAL_WINDOW).min(MODULE_WINDOW)
}

/// Scalar global (or generic-to-global) load for the lanes in `exec`.
#[inline(always)]
pub(crate) fn ld_global(
    mem: &dyn GlobalMemory,
    tlb: &mut Tlb,
    addr: &Lanes,
    off: i64,
    size: usize,
    exec: u32,
    out: &mut Lanes,
) -> bool {
    let sz = size as u64;
    for l in 0..32 {
        if exec >> l & 1 != 0 {
            let va = addr[l].wrapping_add(off as u64);
            if !va.is_multiple_of(sz) || in_window(va) {
                return false;
            }
            let Ok(p) = tlb.lookup(mem, va, sz, Access::Read) else {
                return false;
            };
            // SAFETY: `p` comes from a translated span covering `size` bytes at an aligned
            // address (lookup checks the host alignment).
            out[l] = unsafe { host_load(p, sz) };
        }
    }
    true
}

/// Scalar global (or generic-to-global) store for the lanes in `exec` (lane order).
#[inline(always)]
pub(crate) fn st_global(
    mem: &dyn GlobalMemory,
    tlb: &mut Tlb,
    addr: &Lanes,
    off: i64,
    size: usize,
    exec: u32,
    val: &Lanes,
) -> bool {
    let sz = size as u64;
    for l in 0..32 {
        if exec >> l & 1 != 0 {
            let va = addr[l].wrapping_add(off as u64);
            if !va.is_multiple_of(sz) || in_window(va) {
                return false;
            }
            let Ok(p) = tlb.lookup(mem, va, sz, Access::Write) else {
                return false;
            };
            // SAFETY: as in `ld_global`.
            unsafe { host_store(p, sz, val[l]) };
        }
    }
    true
}
