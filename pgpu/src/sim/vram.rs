//! Physical VRAM of the sim engine: one raw host memory region that the engine owns.
//!
//! Today the region is an anonymous private mapping; later it becomes a shared memory object that
//! several VM processes map (each only its own partition), which is why it is a raw region behind
//! a small type rather than a `Vec`. Kernels reach it through host pointers handed out by the MMU,
//! so all access here is by raw pointer with explicit bounds checks.

use std::ptr::NonNull;

use thiserror::Error;

use super::atomic_copy;

/// Errors of the VRAM region.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum VramError {
    #[error("VRAM size {0:#x} is zero or not a multiple of 2 MiB")]
    BadSize(u64),
    #[error("mmap of {size:#x} bytes of VRAM failed: {errno}")]
    Map { size: u64, errno: i32 },
    #[error("physical range {pa:#x}+{len:#x} is outside VRAM ({size:#x} bytes)")]
    OutOfRange { pa: u64, len: u64, size: u64 },
}

/// Alignment that the VRAM size must have (the largest page size of the sim engine).
const VRAM_GRANULE: u64 = 2 << 20;

/// An owned, page-aligned, zero-filled host region standing for physical VRAM.
#[derive(Debug)]
pub struct VramRegion {
    base: NonNull<u8>,
    size: u64,
}

// SAFETY: the region is plain memory owned by this value; every access goes through raw pointers
// with bounds checks and atomic loads/stores (kernels race like on hardware), never a Rust
// reference.
unsafe impl Send for VramRegion {}
// SAFETY: as above; no `&`/`&mut` to the bytes is ever created from a shared `VramRegion`.
unsafe impl Sync for VramRegion {}

impl VramRegion {
    /// Maps `size` bytes of anonymous memory (reserved lazily: untouched pages cost nothing).
    pub fn anonymous(size: u64) -> Result<Self, VramError> {
        if size == 0 || !size.is_multiple_of(VRAM_GRANULE) {
            return Err(VramError::BadSize(size));
        }
        let len = usize::try_from(size).map_err(|_| VramError::BadSize(size))?;
        // SAFETY: anonymous private mapping with no address hint; the kernel picks the address and
        // the result is checked against MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(VramError::Map { size, errno });
        }
        let base = NonNull::new(ptr.cast::<u8>()).ok_or(VramError::Map { size, errno: 0 })?;
        Ok(Self { base, size })
    }

    /// Size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Host address of the first byte (for the MMU, which stores host addresses in its entries).
    pub fn host_base(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Checks that `pa..pa+len` lies inside the region and returns the host pointer of `pa`.
    pub fn host_ptr(&self, pa: u64, len: u64) -> Result<*mut u8, VramError> {
        let end = pa.checked_add(len);
        match end {
            Some(end) if end <= self.size => {
                // SAFETY: `pa < size` (or `pa == size` with len 0), so the offset stays inside the
                // mapping or one past its end; `size` fits in usize (checked at creation).
                Ok(unsafe { self.base.as_ptr().add(pa as usize) })
            }
            _ => Err(VramError::OutOfRange {
                pa,
                len,
                size: self.size,
            }),
        }
    }

    /// Copies `buf.len()` bytes at physical address `pa` into `buf`.
    pub fn read(&self, pa: u64, buf: &mut [u8]) -> Result<(), VramError> {
        let src = self.host_ptr(pa, buf.len() as u64)?;
        // SAFETY: `src..src+len` is inside the mapping (checked above); kernels touch VRAM only
        // atomically, and so does `load`.
        unsafe { atomic_copy::load(src, buf) };
        Ok(())
    }

    /// Copies `data` to physical address `pa`.
    pub fn write(&self, pa: u64, data: &[u8]) -> Result<(), VramError> {
        let dst = self.host_ptr(pa, data.len() as u64)?;
        // SAFETY: `dst..dst+len` is inside the mapping (checked above); kernels touch VRAM only
        // atomically, and so does `store`.
        unsafe { atomic_copy::store(data, dst) };
        Ok(())
    }

    /// Fills `pa..pa+len` with `byte` (scrubbing a partition before it changes hands).
    pub fn fill(&self, pa: u64, len: u64, byte: u8) -> Result<(), VramError> {
        let dst = self.host_ptr(pa, len)?;
        // SAFETY: `dst..dst+len` is inside the mapping (checked above, len fits since <= size);
        // accesses are atomic as for `write`.
        unsafe { atomic_copy::fill(dst, len as usize, byte) };
        Ok(())
    }
}

impl Drop for VramRegion {
    fn drop(&mut self) {
        // SAFETY: `base`/`size` are exactly what mmap returned in `anonymous`; the region is
        // unmapped once, and no pointer into it outlives the engine (jobs hold an `Arc` of it).
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.size as usize) };
        if rc != 0 {
            log::warn!("munmap of VRAM failed: {}", std::io::Error::last_os_error());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_write_and_bounds() {
        let v = VramRegion::anonymous(4 << 20).unwrap();
        v.write(0x1000, b"hello").unwrap();
        let mut b = [0u8; 5];
        v.read(0x1000, &mut b).unwrap();
        assert_eq!(&b, b"hello");
        assert!(v.write((4 << 20) - 2, b"abc").is_err());
        assert!(v.read(u64::MAX, &mut b).is_err());
        v.fill(0x1000, 2, 0).unwrap();
        v.read(0x1000, &mut b).unwrap();
        assert_eq!(&b, b"\0\0llo");
        assert_eq!(
            VramRegion::anonymous(3 << 20).unwrap_err(),
            VramError::BadSize(3 << 20)
        );
        assert_eq!(VramRegion::anonymous(0).unwrap_err(), VramError::BadSize(0));
    }
}
