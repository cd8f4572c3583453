//! What the driver needs from its environment: register and VRAM-aperture access, system-memory
//! buffers the GPU can reach, waiting for an interrupt, and a clock.

use core::ptr::NonNull;

/// The environment the driver runs in. Bare metal: volatile MMIO on identity-mapped BARs, an
/// identity-mapped heap, `hlt`. Linux user space: mmap of the resource files, pinned memory.
/// A host process: calls into a device model.
pub trait Platform {
    /// 32-bit read of the BAR0 register at byte `offset` (aligned).
    fn reg_read(&mut self, offset: u32) -> u32;
    /// 32-bit write of the BAR0 register at byte `offset` (aligned).
    fn reg_write(&mut self, offset: u32, value: u32);
    /// 8-byte read of the BAR1 aperture at guest VRAM address `addr` (8-byte aligned, inside
    /// the aperture).
    fn vram_read64(&mut self, addr: u64) -> u64;
    /// 8-byte write of the BAR1 aperture at guest VRAM address `addr`.
    fn vram_write64(&mut self, addr: u64, value: u64);
    /// Size of the BAR1 aperture in bytes (accesses at or past it are never made).
    fn vram_aperture(&self) -> u64;
    /// A zeroed system-memory buffer of at least `len` bytes at an address aligned to `align`
    /// (a power of two), that stays valid and pinned for the life of the platform.
    fn dma_alloc(&mut self, len: usize, align: usize) -> Option<DmaBuf>;
    /// Sleeps until an interrupt may have arrived (or returns at once if it cannot sleep).
    /// `ns` bounds the sleep where the platform can (a timer), as a backstop.
    fn wait_for_interrupt(&mut self, ns: u64);
    /// Whether [`Platform::wait_for_interrupt`] really sleeps until the GPU's interrupt.
    fn has_interrupts(&self) -> bool {
        false
    }
    /// Monotonic nanoseconds.
    fn now_ns(&mut self) -> u64;
    /// One turn of a busy-wait (polling a fence): a pause by default. A host process whose
    /// device model runs on other threads of it yields here, as a spinning vCPU is made to
    /// yield by the hypervisor's pause-loop exiting.
    fn relax(&mut self) {
        core::hint::spin_loop();
    }
    /// 32-bit read of the para-virtual BAR (BAR3) register at `offset`; all-ones where the
    /// device has no such BAR (full virtualization).
    fn para_read(&mut self, _offset: u32) -> u32 {
        u32::MAX
    }
    /// 32-bit write of the para-virtual BAR register at `offset` (a hypercall when it is CALL).
    fn para_write(&mut self, _offset: u32, _value: u32) {}
    /// Takes the lock that serialises device-wide state among the drivers of one device
    /// ([`crate::Gpu::attach`]: several processes of a guest): the runlist and the
    /// para-virtual argument area and page-directory selection. Nested calls must nest (a
    /// depth count); a platform with one driver per device has nothing to lock.
    fn lock_device(&mut self) {}
    /// Releases [`Platform::lock_device`].
    fn unlock_device(&mut self) {}
}

/// A system-memory buffer shared with the GPU: where the CPU sees it and the guest-physical
/// address the GPU must use. The GPU may write it at any time, so it is only reached through
/// raw pointers, never through references.
#[derive(Debug)]
pub struct DmaBuf {
    ptr: NonNull<u8>,
    gpa: u64,
    len: usize,
}

// SAFETY: a DmaBuf is a handle to memory owned by the platform for its whole life; moving it
// between threads moves only the handle.
unsafe impl Send for DmaBuf {}

impl DmaBuf {
    /// Wraps platform memory.
    ///
    /// # Safety
    /// `ptr .. ptr + len` must be valid for reads and writes for as long as the driver uses the
    /// buffer, not be used through Rust references elsewhere, and be what the GPU reaches at
    /// guest-physical `gpa .. gpa + len`.
    pub unsafe fn from_raw(ptr: *mut u8, gpa: u64, len: usize) -> Option<Self> {
        gpa.checked_add(len as u64)?;
        Some(Self {
            ptr: NonNull::new(ptr)?,
            gpa,
            len,
        })
    }

    /// Where the CPU sees byte 0 (only for raw-pointer access: the GPU may write it any time).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Guest-physical address of byte 0.
    pub fn gpa(&self) -> u64 {
        self.gpa
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn check(&self, off: usize, n: usize) -> Option<()> {
        (off.checked_add(n)? <= self.len).then_some(())
    }

    /// Copies `data` in at `off`; `None` if it does not fit.
    pub fn write(&self, off: usize, data: &[u8]) -> Option<()> {
        self.check(off, data.len())?;
        // SAFETY: the range lies inside the buffer (checked); `from_raw`'s contract makes it
        // valid for writes, and `data` is ordinary memory that cannot overlap it.
        unsafe {
            core::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(off), data.len())
        };
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        Some(())
    }

    /// Copies bytes out from `off`; `None` if the range does not fit.
    pub fn read(&self, off: usize, out: &mut [u8]) -> Option<()> {
        self.check(off, out.len())?;
        core::sync::atomic::fence(core::sync::atomic::Ordering::SeqCst);
        // SAFETY: as for `write`, for reads.
        unsafe {
            core::ptr::copy_nonoverlapping(self.ptr.as_ptr().add(off), out.as_mut_ptr(), out.len())
        };
        Some(())
    }

    /// Volatile read of the aligned u32 at `off` (for polling what the GPU writes).
    pub fn read_u32(&self, off: usize) -> Option<u32> {
        self.check(off, 4)?;
        if !(self.ptr.as_ptr() as usize + off).is_multiple_of(4) {
            return None;
        }
        // SAFETY: inside the buffer, 4-byte aligned (checked), valid for reads.
        Some(unsafe { core::ptr::read_volatile(self.ptr.as_ptr().add(off).cast::<u32>()) })
    }

    /// Volatile read of the aligned u64 at `off`.
    pub fn read_u64(&self, off: usize) -> Option<u64> {
        self.check(off, 8)?;
        if !(self.ptr.as_ptr() as usize + off).is_multiple_of(8) {
            return None;
        }
        // SAFETY: inside the buffer, 8-byte aligned (checked), valid for reads.
        Some(unsafe { core::ptr::read_volatile(self.ptr.as_ptr().add(off).cast::<u64>()) })
    }

    /// Volatile write of the aligned u64 at `off`.
    pub fn write_u64(&self, off: usize, v: u64) -> Option<()> {
        self.check(off, 8)?;
        if !(self.ptr.as_ptr() as usize + off).is_multiple_of(8) {
            return None;
        }
        // SAFETY: inside the buffer, 8-byte aligned (checked), valid for writes.
        unsafe { core::ptr::write_volatile(self.ptr.as_ptr().add(off).cast::<u64>(), v) };
        Some(())
    }

    /// Volatile write of the aligned u32 at `off`.
    pub fn write_u32(&self, off: usize, v: u32) -> Option<()> {
        self.check(off, 4)?;
        if !(self.ptr.as_ptr() as usize + off).is_multiple_of(4) {
            return None;
        }
        // SAFETY: inside the buffer, 4-byte aligned (checked), valid for writes.
        unsafe { core::ptr::write_volatile(self.ptr.as_ptr().add(off).cast::<u32>(), v) };
        Some(())
    }
}
