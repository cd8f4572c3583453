//! The device's memory pools: GPU virtual address space, VRAM blocks, and system-memory buffers
//! (with their bounds-checked volatile access).

use super::*;

impl<P: Platform> Gpu<P> {
    /// Allocates GPU virtual address space (not mapped).
    pub fn va_alloc(&mut self, len: u64, align: u64) -> Result<u64, Error> {
        self.va.alloc(len, align).ok_or(Error::NoVa(len))
    }

    /// Returns GPU virtual address space.
    pub fn va_free(&mut self, va: u64, len: u64) {
        self.va.free(va, len);
    }

    /// Allocates raw guest VRAM (not mapped).
    pub fn vram_alloc_raw(&mut self, len: u64, align: u64) -> Result<u64, Error> {
        self.vram.alloc(len, align).ok_or(Error::NoVram(len))
    }

    /// Returns raw guest VRAM.
    pub fn vram_free_raw(&mut self, addr: u64, len: u64) {
        self.vram.free(addr, len);
    }

    /// A buffer in the VRAM pool (already mapped), declared to the GPU.
    pub fn vram_alloc(&mut self, len: u64) -> Result<VramAlloc, Error> {
        let n = len.max(1).next_multiple_of(POOL_ALIGN);
        let off = self.vpool.alloc(n, POOL_ALIGN).ok_or(Error::NoVram(len))?;
        self.declare_alloc(self.vpool_va + off, n);
        Ok(VramAlloc {
            va: self.vpool_va + off,
            vram: self.vpool_vram + off,
            len: n,
        })
    }

    /// Gives a VRAM pool buffer back.
    pub fn vram_free(&mut self, a: VramAlloc) {
        self.forget_alloc(a.va);
        self.vpool.free(a.vram - self.vpool_vram, a.len);
    }

    /// Tells the GPU that `[va, va + len)` is one buffer (docs/hardware.md, "Declared
    /// allocations": a hint that keeps live copies of VRAM precise; ignored by a GPU without
    /// the registers).
    pub fn declare_alloc(&mut self, va: u64, len: u64) {
        self.reg_write(regs::ALLOC_VA_LO, va as u32);
        self.reg_write(regs::ALLOC_VA_HI, (va >> 32) as u32);
        self.reg_write(regs::ALLOC_LEN_LO, len as u32);
        self.reg_write(regs::ALLOC_LEN_HI, (len >> 32) as u32);
        self.reg_write(regs::ALLOC_DECLARE, regs::ALLOC_OP_DECLARE);
    }

    /// Tells the GPU that the buffer declared at `va` is gone.
    pub fn forget_alloc(&mut self, va: u64) {
        self.reg_write(regs::ALLOC_VA_LO, va as u32);
        self.reg_write(regs::ALLOC_VA_HI, (va >> 32) as u32);
        self.reg_write(regs::ALLOC_DECLARE, regs::ALLOC_OP_FORGET);
    }

    /// A buffer in the system-memory pool (already mapped), zero-filled.
    pub fn sys_alloc(&mut self, len: u64) -> Result<SysAlloc, Error> {
        self.sys_alloc_aligned(len, POOL_ALIGN)
    }

    /// [`Gpu::sys_alloc`] at a multiple of `align` (a power of two; 4096 for a page that can
    /// be mapped on its own).
    pub fn sys_alloc_aligned(&mut self, len: u64, align: u64) -> Result<SysAlloc, Error> {
        let align = align.max(POOL_ALIGN);
        let n = len.max(1).next_multiple_of(POOL_ALIGN);
        let off = self.sys_pool.alloc(n, align).ok_or(Error::NoSysmem(len))?;
        let a = SysAlloc {
            va: self.sys_va + off,
            gpa: self.sys.gpa() + off,
            len: n,
            off,
        };
        self.sys_fill_zero(&a)?;
        self.declare_alloc(a.va, a.len);
        Ok(a)
    }

    pub(super) fn sys_fill_zero(&mut self, a: &SysAlloc) -> Result<(), Error> {
        const Z: [u8; 256] = [0; 256];
        let mut done = 0;
        while done < a.len {
            let n = (a.len - done).min(256);
            self.sys_write(a, done, &Z[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    /// Writes every 4 KiB page of the system-memory pool once (it reads as zero already): the
    /// first touch of fresh memory, paid at init instead of by the workloads that reuse it.
    pub(super) fn warm_sys_pool(&mut self) {
        let mut off = 0;
        while off < self.sys.len() {
            let _ = self.sys.write_u64(off, 0);
            off += PAGE_4K as usize;
        }
    }

    /// Where the CPU sees byte 0 of a system-memory buffer (valid as long as the driver: the
    /// platform keeps the pool mapped). Only for raw-pointer access: the GPU may write it.
    pub fn sys_host_ptr(&self, a: &SysAlloc) -> Result<*mut u8, Error> {
        let at = self.sys_range(a, 0, 0)?;
        if at >= self.sys.len() {
            return Err(Error::OutOfRange(a.va));
        }
        // SAFETY: `at` is inside the pool's buffer (checked), so the offset pointer stays in
        // the same allocation.
        Ok(unsafe { self.sys.as_ptr().add(at) })
    }

    /// Bytes of the system-memory pool still free.
    pub fn sys_free_bytes(&self) -> u64 {
        self.sys_pool.free_bytes()
    }

    /// Bytes of the VRAM pool: (free, total).
    pub fn vram_pool_bytes(&self) -> (u64, u64) {
        (self.vpool.free_bytes(), self.vpool_len)
    }

    /// Gives a system-memory pool buffer back.
    pub fn sys_free(&mut self, a: SysAlloc) {
        self.forget_alloc(a.va);
        self.sys_pool.free(a.off, a.len);
    }

    pub(super) fn sys_range(&self, a: &SysAlloc, off: u64, n: usize) -> Result<usize, Error> {
        let end = off.checked_add(n as u64).ok_or(Error::OutOfRange(off))?;
        if end > a.len {
            return Err(Error::OutOfRange(a.va + off));
        }
        usize::try_from(a.off + off).map_err(|_| Error::OutOfRange(off))
    }

    /// Copies `data` into a system-memory buffer at `off`.
    pub fn sys_write(&mut self, a: &SysAlloc, off: u64, data: &[u8]) -> Result<(), Error> {
        let at = self.sys_range(a, off, data.len())?;
        self.sys
            .write(at, data)
            .ok_or(Error::OutOfRange(a.va + off))
    }

    /// Copies bytes out of a system-memory buffer from `off`.
    pub fn sys_read(&mut self, a: &SysAlloc, off: u64, out: &mut [u8]) -> Result<(), Error> {
        let at = self.sys_range(a, off, out.len())?;
        self.sys.read(at, out).ok_or(Error::OutOfRange(a.va + off))
    }

    /// Volatile u32 read of a system-memory buffer (polling what the GPU writes).
    pub fn sys_read_u32(&self, a: &SysAlloc, off: u64) -> Result<u32, Error> {
        let at = self.sys_range(a, off, 4)?;
        self.sys.read_u32(at).ok_or(Error::Unaligned(a.va + off))
    }

    /// Volatile u64 read of a system-memory buffer.
    pub fn sys_read_u64(&self, a: &SysAlloc, off: u64) -> Result<u64, Error> {
        let at = self.sys_range(a, off, 8)?;
        self.sys.read_u64(at).ok_or(Error::Unaligned(a.va + off))
    }

    /// Volatile u64 write into a system-memory buffer.
    pub fn sys_write_u64(&mut self, a: &SysAlloc, off: u64, v: u64) -> Result<(), Error> {
        let at = self.sys_range(a, off, 8)?;
        self.sys
            .write_u64(at, v)
            .ok_or(Error::Unaligned(a.va + off))
    }
}
