//! Global memory contract between the interpreter and the engine's MMU, fault types, the
//! generic-address windows for shared/local memory, and a flat test memory.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// Base of the generic-address window that maps to the CTA's shared memory
/// (`cvta.shared` adds it, `cvta.to.shared` subtracts it).
pub const SHARED_WINDOW: u64 = 0xFFFF_FE00_0000_0000;
/// Base of the generic-address window that maps to the thread's local memory.
pub const LOCAL_WINDOW: u64 = 0xFFFF_FF00_0000_0000;
/// Base of the window of module-scope `.global`/`.const` variables (module storage; symbol
/// values of such variables are addresses in this window).
pub const MODULE_WINDOW: u64 = 0xFFFF_FD00_0000_0000;
/// Size of each generic window.
pub const WINDOW_SIZE: u64 = 1 << 32;

/// Kind of a memory access.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// A load.
    Read,
    /// A store.
    Write,
    /// A read-modify-write (atom/red).
    Atomic,
}

/// Why an access faulted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultReason {
    /// No mapping for the address.
    Unmapped,
    /// Write or atomic to a read-only mapping.
    ReadOnly,
    /// Address not naturally aligned for the access size.
    Misaligned,
    /// Shared-memory access outside the CTA's shared allocation.
    SharedOutOfBounds,
    /// Local-memory access outside the thread's local allocation.
    LocalOutOfBounds,
    /// Parameter-space access outside the parameter buffer.
    ParamOutOfBounds,
    /// The kernel executed `trap`.
    Trap,
    /// Divergence nested deeper than the SIMT reconvergence stack allows.
    StackOverflow,
}

/// A translation failure reported by [`GlobalMemory::translate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemFault {
    /// Faulting virtual address.
    pub va: u64,
    /// Access kind.
    pub access: Access,
    /// Reason.
    pub reason: FaultReason,
}

/// Host memory backing a run of guest-GPU virtual addresses, returned by a translation.
#[derive(Debug, Clone, Copy)]
pub struct HostSpan {
    ptr: *mut u8,
    len: usize,
}

impl HostSpan {
    /// Describe `len` bytes of host memory at `ptr` that back the translated address and the
    /// addresses after it.
    ///
    /// # Safety
    /// For as long as the [`crate::Launch::run`] call that asked for the translation lasts,
    /// `ptr..ptr+len` must be valid for reads and writes (both, even for `Access::Read`), must
    /// not be freed or unmapped, and may be accessed concurrently by other threads only through
    /// atomic operations (the interpreter uses only atomic loads, stores and read-modify-writes,
    /// so racing kernels stay defined). `ptr` must have the same alignment modulo 8 as the
    /// virtual address it backs (the interpreter reports misalignment otherwise).
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Self { ptr, len }
    }

    /// Host pointer.
    pub fn ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Number of valid bytes from [`HostSpan::ptr`].
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// The engine's MMU as seen by the interpreter. Every global access goes through it; the
/// interpreter translates once per page per warp access, not per byte.
pub trait GlobalMemory: Sync {
    /// Translate `va` for `access`: host memory backing `va` for at least the rest of its page
    /// (`len` bytes from `va`), or the fault to report.
    fn translate(&self, va: u64, access: Access) -> Result<HostSpan, MemFault>;
}

/// Page size used by [`FlatMemory`] spans.
const FLAT_PAGE: u64 = 4096;

/// A flat, contiguous global memory at `[base, base + size)`, for tests and the simple engine.
/// An optional read-only prefix models read-only mappings.
#[derive(Debug)]
pub struct FlatMemory {
    base: u64,
    words: Box<[AtomicU64]>,
    size: u64,
    read_only_below: u64,
}

impl FlatMemory {
    /// Zeroed memory of `size` bytes (rounded up to 8) at virtual address `base`.
    pub fn new(base: u64, size: usize) -> Self {
        let n = size.div_ceil(8);
        let words: Box<[AtomicU64]> = (0..n).map(|_| AtomicU64::new(0)).collect();
        Self {
            base,
            words,
            size: size as u64,
            read_only_below: base,
        }
    }

    /// Make `[base, va)` read-only (writes and atomics fault with `ReadOnly`).
    pub fn set_read_only_below(&mut self, va: u64) {
        self.read_only_below = va;
    }

    /// Base virtual address.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn offset(&self, va: u64, len: usize) -> Option<usize> {
        let off = va.checked_sub(self.base)?;
        let end = off.checked_add(len as u64)?;
        (end <= self.size).then_some(off as usize)
    }

    fn byte(&self, off: usize) -> &AtomicU8 {
        let p = self
            .words
            .as_ptr()
            .cast::<u8>()
            .cast_mut()
            .wrapping_add(off);
        // SAFETY: `off < size <= 8 * words.len()`, so `p` points into the live allocation of
        // `words`; AtomicU64 is made of UnsafeCell, so byte-wise atomic access through a
        // pointer derived from it is allowed, and the reference lives no longer than `self`.
        unsafe { AtomicU8::from_ptr(p) }
    }

    /// Copy `data` into memory at `va`. Returns false when out of range.
    pub fn write(&self, va: u64, data: &[u8]) -> bool {
        let Some(off) = self.offset(va, data.len()) else {
            return false;
        };
        for (i, b) in data.iter().enumerate() {
            self.byte(off + i).store(*b, Ordering::Relaxed);
        }
        true
    }

    /// Read `len` bytes at `va`, or `None` when out of range.
    pub fn read(&self, va: u64, len: usize) -> Option<Vec<u8>> {
        let off = self.offset(va, len)?;
        Some(
            (0..len)
                .map(|i| self.byte(off + i).load(Ordering::Relaxed))
                .collect(),
        )
    }

    /// Write little-endian `u32` values at `va`.
    pub fn write_u32s(&self, va: u64, vals: &[u32]) -> bool {
        let bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.write(va, &bytes)
    }

    /// Read `n` little-endian `u32` values at `va`.
    pub fn read_u32s(&self, va: u64, n: usize) -> Option<Vec<u32>> {
        let b = self.read(va, n.checked_mul(4)?)?;
        Some(
            b.chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
        )
    }

    /// Write little-endian `f32` values at `va`.
    pub fn write_f32s(&self, va: u64, vals: &[f32]) -> bool {
        let v: Vec<u32> = vals.iter().map(|f| f.to_bits()).collect();
        self.write_u32s(va, &v)
    }

    /// Read `n` little-endian `f32` values at `va`.
    pub fn read_f32s(&self, va: u64, n: usize) -> Option<Vec<f32>> {
        Some(
            self.read_u32s(va, n)?
                .into_iter()
                .map(f32::from_bits)
                .collect(),
        )
    }
}

impl GlobalMemory for FlatMemory {
    fn translate(&self, va: u64, access: Access) -> Result<HostSpan, MemFault> {
        let fault = |reason| MemFault { va, access, reason };
        let off = self.offset(va, 1).ok_or(fault(FaultReason::Unmapped))?;
        if access != Access::Read && va < self.read_only_below {
            return Err(fault(FaultReason::ReadOnly));
        }
        let page_end = ((va / FLAT_PAGE) + 1).saturating_mul(FLAT_PAGE);
        let mut len = page_end.saturating_sub(va).min(self.size - off as u64);
        if va < self.read_only_below {
            len = len.min(self.read_only_below - va);
        }
        let ptr = self
            .words
            .as_ptr()
            .cast::<u8>()
            .cast_mut()
            .wrapping_add(off);
        // SAFETY: `off + len <= size` lies inside `words`, which lives as long as `self` (the
        // caller keeps `self` alive across the run); all interpreter accesses are atomic and
        // the allocation is 8-aligned, so `ptr` has the alignment of `va - base` modulo 8.
        Ok(unsafe { HostSpan::new(ptr, len as usize) })
    }
}
