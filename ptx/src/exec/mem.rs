//! Memory access paths of the interpreter: a small per-worker TLB over
//! [`GlobalMemory::translate`], atomic host accesses, shared/local/param accesses, generic
//! address windows, and atomic read-modify-write semantics.

use std::sync::atomic::{AtomicU8, AtomicU16, AtomicU32, AtomicU64, Ordering::Relaxed};

use crate::ir::{AtomOp, Space, Ty};
use crate::memory::{
    Access, FaultReason, GlobalMemory, LOCAL_WINDOW, MODULE_WINDOW, MemFault, SHARED_WINDOW,
    WINDOW_SIZE,
};
use crate::modvars::ModMem;

/// A memory fault at one lane.
#[derive(Debug, Clone, Copy)]
pub(crate) struct LaneFault {
    pub va: u64,
    pub access: Access,
    pub reason: FaultReason,
}

impl From<MemFault> for LaneFault {
    fn from(f: MemFault) -> Self {
        Self {
            va: f.va,
            access: f.access,
            reason: f.reason,
        }
    }
}

const TLB_WAYS: usize = 8;

#[derive(Debug, Clone, Copy)]
struct TlbEntry {
    lo: u64,
    hi: u64,
    host: *mut u8,
    access: Access,
}

/// Per-worker translation cache; valid for one `run` call (spans are guaranteed valid for
/// that long by the [`crate::HostSpan`] contract).
pub(crate) struct Tlb {
    e: [TlbEntry; TLB_WAYS],
    next: usize,
}

impl Tlb {
    pub(crate) fn new() -> Self {
        Self {
            e: [TlbEntry {
                lo: 1,
                hi: 0,
                host: std::ptr::null_mut(),
                access: Access::Read,
            }; TLB_WAYS],
            next: 0,
        }
    }

    /// Host pointer for `size` bytes at `va` (already checked to be naturally aligned).
    #[inline(always)]
    pub(crate) fn lookup(
        &mut self,
        mem: &dyn GlobalMemory,
        va: u64,
        size: u64,
        access: Access,
    ) -> Result<*mut u8, LaneFault> {
        // `end` saturates: an access that would wrap the address space matches no entry.
        let end = va.saturating_add(size);
        let last = &self.e[(self.next + TLB_WAYS - 1) % TLB_WAYS];
        if last.access == access && va >= last.lo && end <= last.hi && end != u64::MAX {
            return Ok(last.host.wrapping_add((va - last.lo) as usize));
        }
        for e in &self.e {
            if e.access == access && va >= e.lo && end <= e.hi && end != u64::MAX {
                return Ok(e.host.wrapping_add((va - e.lo) as usize));
            }
        }
        let span = mem.translate(va, access)?;
        let hi = va.saturating_add(span.len() as u64);
        if va.checked_add(size).is_none_or(|e| e > hi) {
            return Err(LaneFault {
                va: hi,
                access,
                reason: FaultReason::Unmapped,
            });
        }
        // The host pointer must have the alignment of `va` modulo 8 (HostSpan contract), so
        // that every naturally aligned access served from this entry later is aligned too.
        if !(span.ptr() as usize as u64)
            .wrapping_sub(va)
            .is_multiple_of(8)
        {
            return Err(LaneFault {
                va,
                access,
                reason: FaultReason::Misaligned,
            });
        }
        self.e[self.next] = TlbEntry {
            lo: va,
            hi,
            host: span.ptr(),
            access,
        };
        self.next = (self.next + 1) % TLB_WAYS;
        Ok(span.ptr())
    }
}

/// Everything a memory instruction of one lane can touch.
pub(crate) struct MemCtx<'a> {
    pub mem: &'a dyn GlobalMemory,
    /// Module-scope variables.
    pub module: &'a ModMem,
    pub tlb: &'a mut Tlb,
    pub shared: &'a mut [u8],
    /// This lane's local memory.
    pub local: &'a mut [u8],
    pub params: &'a [u8],
}

enum Loc {
    Global(u64),
    /// Offset in the module-variable storage.
    Module(u64),
    Shared(u64),
    Local(u64),
    Param(u64),
}

fn resolve(space: Space, a: u64) -> Loc {
    match space {
        Space::Global if a.wrapping_sub(MODULE_WINDOW) < WINDOW_SIZE => {
            Loc::Module(a - MODULE_WINDOW)
        }
        Space::Global => Loc::Global(a),
        Space::Const => Loc::Module(a.wrapping_sub(MODULE_WINDOW)),
        Space::Shared => Loc::Shared(a),
        Space::Local => Loc::Local(a),
        Space::Param => Loc::Param(a),
        Space::Generic => {
            if a.wrapping_sub(SHARED_WINDOW) < WINDOW_SIZE {
                Loc::Shared(a - SHARED_WINDOW)
            } else if a.wrapping_sub(LOCAL_WINDOW) < WINDOW_SIZE {
                Loc::Local(a - LOCAL_WINDOW)
            } else if a.wrapping_sub(MODULE_WINDOW) < WINDOW_SIZE {
                Loc::Module(a - MODULE_WINDOW)
            } else {
                Loc::Global(a)
            }
        }
    }
}

fn slice_of(
    buf: &mut [u8],
    off: u64,
    size: u64,
    access: Access,
    oob: FaultReason,
) -> Result<&mut [u8], LaneFault> {
    let fault = |reason| LaneFault {
        va: off,
        access,
        reason,
    };
    if !off.is_multiple_of(size) {
        return Err(fault(FaultReason::Misaligned));
    }
    let end = off.checked_add(size).ok_or(fault(oob))?;
    if end > buf.len() as u64 {
        return Err(fault(oob));
    }
    Ok(&mut buf[off as usize..end as usize])
}

fn read_le(b: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(v)
}

fn write_le(b: &mut [u8], v: u64) {
    let n = b.len();
    b.copy_from_slice(&v.to_le_bytes()[..n]);
}

/// Atomic load of `size` bytes from host memory.
///
/// # Safety
/// `p` must be valid and aligned for `size` bytes (guaranteed by a translated span).
#[inline(always)]
pub(crate) unsafe fn host_load(p: *mut u8, size: u64) -> u64 {
    // SAFETY: the caller guarantees `p` is valid and aligned for `size` bytes for the duration
    // of the run (HostSpan contract); all concurrent accesses are atomic.
    unsafe {
        match size {
            1 => u64::from(AtomicU8::from_ptr(p).load(Relaxed)),
            2 => u64::from(AtomicU16::from_ptr(p.cast()).load(Relaxed)),
            4 => u64::from(AtomicU32::from_ptr(p.cast()).load(Relaxed)),
            _ => AtomicU64::from_ptr(p.cast()).load(Relaxed),
        }
    }
}

/// Atomic store of the low `size` bytes of `v` to host memory.
///
/// # Safety
/// As [`host_load`].
#[inline(always)]
pub(crate) unsafe fn host_store(p: *mut u8, size: u64, v: u64) {
    // SAFETY: as in `host_load`.
    unsafe {
        match size {
            1 => AtomicU8::from_ptr(p).store(v as u8, Relaxed),
            2 => AtomicU16::from_ptr(p.cast()).store(v as u16, Relaxed),
            4 => AtomicU32::from_ptr(p.cast()).store(v as u32, Relaxed),
            _ => AtomicU64::from_ptr(p.cast()).store(v, Relaxed),
        }
    }
}

/// Atomic read-modify-write of `ty` at `p`; returns the old value.
///
/// # Safety
/// `p` must be valid and aligned for `ty.bytes()` (4 or 8) bytes, accessed only atomically.
unsafe fn host_rmw(p: *mut u8, op: AtomOp, ty: Ty, b: u64, c: u64) -> u64 {
    if ty.bytes() == 4 {
        // SAFETY: guaranteed by the caller.
        let at = unsafe { AtomicU32::from_ptr(p.cast()) };
        let mut old = at.load(Relaxed);
        loop {
            let new = apply(op, ty, u64::from(old), b, c) as u32;
            match at.compare_exchange_weak(old, new, Relaxed, Relaxed) {
                Ok(_) => return u64::from(old),
                Err(x) => old = x,
            }
        }
    } else {
        // SAFETY: guaranteed by the caller.
        let at = unsafe { AtomicU64::from_ptr(p.cast()) };
        let mut old = at.load(Relaxed);
        loop {
            let new = apply(op, ty, old, b, c);
            match at.compare_exchange_weak(old, new, Relaxed, Relaxed) {
                Ok(_) => return old,
                Err(x) => old = x,
            }
        }
    }
}

impl MemCtx<'_> {
    fn module_ptr(&self, off: u64, size: u64, access: Access) -> Result<*mut u8, LaneFault> {
        self.module
            .ptr(off, size, access)
            .map_err(|reason| LaneFault {
                va: off.wrapping_add(MODULE_WINDOW),
                access,
                reason,
            })
    }

    fn global_ptr(&mut self, va: u64, size: u64, access: Access) -> Result<*mut u8, LaneFault> {
        if !va.is_multiple_of(size) {
            return Err(LaneFault {
                va,
                access,
                reason: FaultReason::Misaligned,
            });
        }
        self.tlb.lookup(self.mem, va, size, access)
    }

    /// Load `size` bytes (zero-extended).
    #[inline(always)]
    pub(crate) fn load(&mut self, space: Space, a: u64, size: u64) -> Result<u64, LaneFault> {
        let acc = Access::Read;
        match resolve(space, a) {
            Loc::Global(va) => {
                let p = self.global_ptr(va, size, acc)?;
                // SAFETY: `p` comes from a translated span covering `size` aligned bytes.
                Ok(unsafe { host_load(p, size) })
            }
            Loc::Module(o) => {
                let p = self.module_ptr(o, size, acc)?;
                // SAFETY: `ModMem::ptr` checked bounds and alignment; the storage lives in the
                // module, which the running launch holds.
                Ok(unsafe { host_load(p, size) })
            }
            Loc::Shared(o) => Ok(read_le(slice_of(
                self.shared,
                o,
                size,
                acc,
                FaultReason::SharedOutOfBounds,
            )?)),
            Loc::Local(o) => Ok(read_le(slice_of(
                self.local,
                o,
                size,
                acc,
                FaultReason::LocalOutOfBounds,
            )?)),
            Loc::Param(o) => {
                let fault = |reason| LaneFault {
                    va: o,
                    access: acc,
                    reason,
                };
                if !o.is_multiple_of(size) {
                    return Err(fault(FaultReason::Misaligned));
                }
                let end = o
                    .checked_add(size)
                    .ok_or(fault(FaultReason::ParamOutOfBounds))?;
                if end > self.params.len() as u64 {
                    return Err(fault(FaultReason::ParamOutOfBounds));
                }
                Ok(read_le(&self.params[o as usize..end as usize]))
            }
        }
    }

    /// Store the low `size` bytes of `v`.
    #[inline(always)]
    pub(crate) fn store(
        &mut self,
        space: Space,
        a: u64,
        size: u64,
        v: u64,
    ) -> Result<(), LaneFault> {
        let acc = Access::Write;
        match resolve(space, a) {
            Loc::Global(va) => {
                let p = self.global_ptr(va, size, acc)?;
                // SAFETY: `p` comes from a translated span covering `size` aligned bytes.
                unsafe { host_store(p, size, v) };
                Ok(())
            }
            Loc::Module(o) => {
                let p = self.module_ptr(o, size, acc)?;
                // SAFETY: `ModMem::ptr` checked bounds, alignment and writability; the storage
                // lives in the module, which the running launch holds.
                unsafe { host_store(p, size, v) };
                Ok(())
            }
            Loc::Shared(o) => {
                let s = slice_of(self.shared, o, size, acc, FaultReason::SharedOutOfBounds)?;
                write_le(s, v);
                Ok(())
            }
            Loc::Local(o) => {
                let s = slice_of(self.local, o, size, acc, FaultReason::LocalOutOfBounds)?;
                write_le(s, v);
                Ok(())
            }
            Loc::Param(o) => Err(LaneFault {
                va: o,
                access: acc,
                reason: FaultReason::ReadOnly,
            }),
        }
    }

    /// Atomic read-modify-write; returns the old value.
    pub(crate) fn atomic(
        &mut self,
        space: Space,
        a: u64,
        op: AtomOp,
        ty: Ty,
        b: u64,
        c: u64,
    ) -> Result<u64, LaneFault> {
        let acc = Access::Atomic;
        let size = u64::from(ty.bytes());
        match resolve(space, a) {
            Loc::Global(va) => {
                let p = self.global_ptr(va, size, acc)?;
                // SAFETY: `p` is valid and aligned for `size` bytes (translated span, checked
                // alignment).
                Ok(unsafe { host_rmw(p, op, ty, b, c) })
            }
            Loc::Module(o) => {
                let p = self.module_ptr(o, size, acc)?;
                // SAFETY: `ModMem::ptr` checked bounds and alignment; the storage lives in the
                // module, which the running launch holds.
                Ok(unsafe { host_rmw(p, op, ty, b, c) })
            }
            Loc::Shared(o) => {
                // A CTA's warps run on one worker thread: plain read-modify-write is atomic.
                let s = slice_of(self.shared, o, size, acc, FaultReason::SharedOutOfBounds)?;
                let old = read_le(s);
                write_le(s, apply(op, ty, old, b, c));
                Ok(old)
            }
            Loc::Local(o) => {
                let s = slice_of(self.local, o, size, acc, FaultReason::LocalOutOfBounds)?;
                let old = read_le(s);
                write_le(s, apply(op, ty, old, b, c));
                Ok(old)
            }
            Loc::Param(o) => Err(LaneFault {
                va: o,
                access: acc,
                reason: FaultReason::ReadOnly,
            }),
        }
    }
}

/// New value of an atomic op.
pub(crate) fn apply(op: AtomOp, ty: Ty, old: u64, b: u64, c: u64) -> u64 {
    let m = ty.mask();
    match op {
        AtomOp::Add => match ty {
            Ty::F32 => u64::from((f32::from_bits(old as u32) + f32::from_bits(b as u32)).to_bits()),
            Ty::F64 => (f64::from_bits(old) + f64::from_bits(b)).to_bits(),
            _ => old.wrapping_add(b) & m,
        },
        AtomOp::Min if ty.is_signed() => {
            (ty.extend(old) as i64).min(ty.extend(b) as i64) as u64 & m
        }
        AtomOp::Max if ty.is_signed() => {
            (ty.extend(old) as i64).max(ty.extend(b) as i64) as u64 & m
        }
        AtomOp::Min => (old & m).min(b & m),
        AtomOp::Max => (old & m).max(b & m),
        AtomOp::And => old & b & m,
        AtomOp::Or => (old | b) & m,
        AtomOp::Xor => (old ^ b) & m,
        AtomOp::Exch => b & m,
        AtomOp::Cas => {
            if old & m == b & m {
                c & m
            } else {
                old & m
            }
        }
        AtomOp::Inc => {
            if (old & m) >= (b & m) {
                0
            } else {
                (old + 1) & m
            }
        }
        AtomOp::Dec => {
            if old & m == 0 || (old & m) > (b & m) {
                b & m
            } else {
                (old - 1) & m
            }
        }
    }
}
