//! Physical VRAM of the sim engine: one raw host memory region that the engine owns.
//!
//! The region is an anonymous private mapping (one process owns the GPU), or a shared memory
//! object (memfd) that a daemon creates and several VM processes map, each only its own
//! partition (`from_fd` with an offset). Kernels reach it through host pointers handed out by the
//! MMU, so all access here is by raw pointer with explicit bounds checks.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
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
    #[error("shared memory object: {what} failed: {errno}")]
    Shm { what: &'static str, errno: i32 },
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// Alignment that the VRAM size must have (the largest page size of the sim engine).
const VRAM_GRANULE: u64 = 2 << 20;

/// An owned, page-aligned, zero-filled host region standing for physical VRAM.
#[derive(Debug)]
pub struct VramRegion {
    base: NonNull<u8>,
    size: u64,
    /// The shared memory object, when the region is one (see [`VramRegion::shared`]).
    fd: Option<OwnedFd>,
    /// A private anonymous mapping (`anonymous`): a page the process never touched (neither
    /// present nor swapped in /proc/self/pagemap) is zero.
    private: bool,
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
        let len = check_size(size)?;
        let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE;
        let base = map(len, flags, -1, 0, size)?;
        Ok(Self {
            base,
            size,
            fd: None,
            private: true,
        })
    }

    /// Creates a shared memory object (memfd) of `size` bytes and maps all of it. Other processes
    /// map it (or a partition of it) with [`VramRegion::from_fd`] on a duplicate of [`Self::fd`].
    pub fn shared(size: u64) -> Result<Self, VramError> {
        let len = check_size(size)?;
        // SAFETY: a NUL-terminated name and valid flags; the result is checked before use.
        let raw = unsafe { libc::memfd_create(c"pgpu-vram".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(VramError::Shm {
                what: "memfd_create",
                errno: errno(),
            });
        }
        // SAFETY: `raw` is a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let off = libc::off_t::try_from(size).map_err(|_| VramError::BadSize(size))?;
        // SAFETY: plain syscall on a descriptor we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), off) } != 0 {
            return Err(VramError::Shm {
                what: "ftruncate",
                errno: errno(),
            });
        }
        let base = map(len, libc::MAP_SHARED, fd.as_raw_fd(), 0, size)?;
        Ok(Self {
            base,
            size,
            fd: Some(fd),
            private: false,
        })
    }

    /// Maps `size` bytes at byte `offset` of a shared memory object (a VM's partition of the
    /// daemon's VRAM): physical address 0 of this region is `offset` in the object. Fails if the
    /// range is not inside the object.
    pub fn from_fd(fd: BorrowedFd<'_>, offset: u64, size: u64) -> Result<Self, VramError> {
        let len = check_size(size)?;
        if !offset.is_multiple_of(VRAM_GRANULE) {
            return Err(VramError::BadSize(offset));
        }
        // SAFETY: `stat` is plain old data, filled by fstat before it is read.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and a pointer to a live `stat`.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(VramError::Shm {
                what: "fstat",
                errno: errno(),
            });
        }
        let object = u64::try_from(st.st_size).unwrap_or(0);
        match offset.checked_add(size) {
            Some(end) if end <= object => {}
            _ => {
                return Err(VramError::OutOfRange {
                    pa: offset,
                    len: size,
                    size: object,
                });
            }
        }
        let off = libc::off_t::try_from(offset).map_err(|_| VramError::BadSize(offset))?;
        let base = map(len, libc::MAP_SHARED, fd.as_raw_fd(), off, size)?;
        Ok(Self {
            base,
            size,
            fd: None,
            private: false,
        })
    }

    /// multigpu: puts `[offset, offset + size)` of the shared memory object `fd` behind this
    /// region, at the same address (`mmap` with `MAP_FIXED` over the current mapping, which the
    /// kernel replaces in one step: the address range stays mapped throughout). For moving a
    /// VM's VRAM to another GPU's memory object: the caller has copied the content there and
    /// stopped every access to the region (kernels, copies, the guest's aperture), or what is
    /// written meanwhile is lost. Only for regions of a shared memory object (`from_fd`).
    pub fn rebind(&self, fd: BorrowedFd<'_>, offset: u64) -> Result<(), VramError> {
        if self.private || self.fd.is_some() || !offset.is_multiple_of(VRAM_GRANULE) {
            return Err(VramError::Shm {
                what: "rebind (only a partition of another object can be rebound)",
                errno: libc::EINVAL,
            });
        }
        // SAFETY: plain fstat into a zeroed `stat` we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: valid descriptor and a pointer to a live `stat`.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(VramError::Shm {
                what: "fstat",
                errno: errno(),
            });
        }
        let object = u64::try_from(st.st_size).unwrap_or(0);
        if offset.checked_add(self.size).is_none_or(|end| end > object) {
            return Err(VramError::OutOfRange {
                pa: offset,
                len: self.size,
                size: object,
            });
        }
        let off = libc::off_t::try_from(offset).map_err(|_| VramError::BadSize(offset))?;
        // SAFETY: MAP_FIXED over exactly the range this region mapped and owns (`base`, `size`):
        // no other memory is replaced, and the range stays valid memory of the same size and
        // protection for every pointer into it; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                self.base.as_ptr().cast(),
                self.size as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED,
                fd.as_raw_fd(),
                off,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(VramError::Map {
                size: self.size,
                errno: errno(),
            });
        }
        Ok(())
    }

    /// The shared memory object, if this region created one.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(AsFd::as_fd)
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
    /// Sets bit `i` of `bitmap` (bit `i % 64` of word `i / 64`) for each of the `pages` 4 KiB
    /// pages at `pa` (4 KiB aligned) that is not all zero, scanning the memory in place; the
    /// bitmap's other bits are cleared. The caller checks that `bitmap` is long enough.
    pub fn nonzero_pages(&self, pa: u64, pages: u64, bitmap: &mut [u64]) -> Result<(), VramError> {
        const PAGE: u64 = 4096;
        let len = pages.checked_mul(PAGE).ok_or(VramError::OutOfRange {
            pa,
            len: u64::MAX,
            size: self.size,
        })?;
        let src = self.host_ptr(pa, len)?;
        if !pa.is_multiple_of(PAGE) || bitmap.len() < pages.div_ceil(64) as usize {
            return Err(VramError::OutOfRange {
                pa,
                len,
                size: self.size,
            });
        }
        bitmap.fill(0);
        // Pages never touched need no look (and looking would fault each one in).
        let touched = if self.private {
            touched_pages(src as usize, pages)
        } else {
            None
        };
        for p in 0..pages {
            if touched.as_ref().is_some_and(|t| !t[p as usize]) {
                continue;
            }
            // SAFETY: page `p` lies inside the checked range; the mapping is page aligned, so
            // the page is 8-aligned; VRAM is shared only through atomics.
            let zero = unsafe { atomic_copy::words_zero(src.add((p * PAGE) as usize), 512) };
            if !zero {
                bitmap[(p / 64) as usize] |= 1 << (p % 64);
            }
        }
        Ok(())
    }
}

/// Which of `pages` 4 KiB pages at `host` are present or swapped out (bits 63 and 62 of
/// their /proc/self/pagemap entries); `None` if pagemap cannot be read.
fn touched_pages(host: usize, pages: u64) -> Option<Vec<bool>> {
    use std::os::unix::fs::FileExt;
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok()?;
    let pages = usize::try_from(pages).ok()?;
    let mut out = Vec::with_capacity(pages);
    let mut buf = vec![0u8; 8 * 4096];
    while out.len() < pages {
        let n = (pages - out.len()).min(4096);
        let off = ((host / 4096 + out.len()) * 8) as u64;
        pagemap.read_exact_at(&mut buf[..n * 8], off).ok()?;
        for e in buf[..n * 8].chunks_exact(8) {
            let v = u64::from_le_bytes(e.try_into().ok()?);
            out.push(v & (3 << 62) != 0);
        }
    }
    Some(out)
}

fn check_size(size: u64) -> Result<usize, VramError> {
    if size == 0 || !size.is_multiple_of(VRAM_GRANULE) {
        return Err(VramError::BadSize(size));
    }
    usize::try_from(size).map_err(|_| VramError::BadSize(size))
}

fn map(
    len: usize,
    flags: libc::c_int,
    fd: libc::c_int,
    off: libc::off_t,
    size: u64,
) -> Result<NonNull<u8>, VramError> {
    // SAFETY: a new mapping with no address hint (the kernel picks an unused range, so no
    // existing memory is replaced); the result is checked against MAP_FAILED before use.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            off,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(VramError::Map {
            size,
            errno: errno(),
        });
    }
    NonNull::new(ptr.cast::<u8>()).ok_or(VramError::Map { size, errno: 0 })
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
    fn rebind_puts_another_object_behind_the_same_address() {
        let a = VramRegion::shared(8 << 20).unwrap();
        let b = VramRegion::shared(8 << 20).unwrap();
        let part = VramRegion::from_fd(a.fd().unwrap(), 2 << 20, 2 << 20).unwrap();
        part.write(0x10, b"old").unwrap();
        b.write((4 << 20) + 0x10, b"new").unwrap();
        let base = part.host_base();
        part.rebind(b.fd().unwrap(), 4 << 20).unwrap();
        assert_eq!(part.host_base(), base);
        let mut got = [0u8; 3];
        part.read(0x10, &mut got).unwrap();
        assert_eq!(&got, b"new");
        // Writes now land in the new object, the old one keeps what it had.
        part.write(0x20, b"xyz").unwrap();
        b.read((4 << 20) + 0x20, &mut got).unwrap();
        assert_eq!(&got, b"xyz");
        a.read((2 << 20) + 0x10, &mut got).unwrap();
        assert_eq!(&got, b"old");
        // Outside the object, misaligned, or a region that is not a partition: refused.
        assert!(part.rebind(b.fd().unwrap(), 8 << 20).is_err());
        assert!(part.rebind(b.fd().unwrap(), 4096).is_err());
        assert!(a.rebind(b.fd().unwrap(), 0).is_err());
        assert!(
            VramRegion::anonymous(2 << 20)
                .unwrap()
                .rebind(b.fd().unwrap(), 0)
                .is_err()
        );
    }

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
        assert!(v.fd().is_none());
    }

    #[test]
    fn nonzero_pages_scan_in_place_and_leave_untouched_pages_alone() {
        for v in [
            VramRegion::anonymous(4 << 20).unwrap(),
            VramRegion::shared(4 << 20).unwrap(),
        ] {
            // All writes in the first 2 MiB (a transparent huge page may make all of it
            // present); the second 2 MiB is never touched.
            v.write(5 * 4096 + 4095, &[1]).unwrap();
            v.write(300 * 4096, &[2]).unwrap();
            // Page 9 read (the zero page mapped), not written: still zero.
            v.read(9 * 4096, &mut [0u8; 8]).unwrap();
            let mut bm = vec![u64::MAX; 17];
            v.nonzero_pages(0, 1024, &mut bm).unwrap();
            let mut want = vec![0u64; 17];
            want[0] = 1 << 5;
            want[300 / 64] |= 1 << (300 % 64);
            assert_eq!(bm, want);
            // From page 4 on, 3 pages: page 5 is bit 1.
            v.nonzero_pages(4 * 4096, 3, &mut bm[..1]).unwrap();
            assert_eq!(bm[0], 0b10);
            assert!(
                v.nonzero_pages(4096, 1024, &mut bm).is_err(),
                "past the end"
            );
            assert!(
                v.nonzero_pages(0, 65, &mut bm[..1]).is_err(),
                "short bitmap"
            );
            if v.private {
                // The scan did not touch the half nobody wrote.
                if let Some(t) = touched_pages(v.host_base(), 1024) {
                    assert!(t[5] && t[300], "written pages are present");
                    assert!(t[512..].iter().all(|&x| !x), "the scan faulted pages in");
                }
            }
        }
    }

    #[test]
    fn shared_object_partitions_see_the_same_bytes() {
        const MIB: u64 = 1 << 20;
        let whole = VramRegion::shared(8 * MIB).unwrap();
        let fd = whole.fd().unwrap();
        let part = VramRegion::from_fd(fd, 4 * MIB, 4 * MIB).unwrap();
        part.write(16, b"vm1").unwrap();
        let mut b = [0u8; 3];
        whole.read(4 * MIB + 16, &mut b).unwrap();
        assert_eq!(&b, b"vm1");
        whole.write(4 * MIB + 100, b"daemon").unwrap();
        let mut b = [0u8; 6];
        part.read(100, &mut b).unwrap();
        assert_eq!(&b, b"daemon");
        // A partition cannot reach past its end, nor be mapped past the object.
        assert!(part.write(4 * MIB - 1, b"xy").is_err());
        assert!(matches!(
            VramRegion::from_fd(fd, 6 * MIB, 4 * MIB),
            Err(VramError::OutOfRange { .. })
        ));
        assert!(
            VramRegion::from_fd(fd, MIB, 2 * MIB).is_err(),
            "offset not 2 MiB aligned"
        );
    }
}
