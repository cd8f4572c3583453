//! Physical VRAM of the shared GPU and its partitions. For the sim backend VRAM is one memory
//! object (a memfd) the daemon owns; each VM process receives the descriptor and maps only its
//! own `[offset, offset + size)`. Partitions are 2 MiB aligned, first fit; a freed partition
//! is zeroed (its pages punched out of the memory object) before anyone can get it again.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// Partition granularity (the largest GPU page).
pub const GRANULE: u64 = 2 << 20;

/// Errors of the VRAM pool.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PartitionError {
    #[error("VRAM size {0} is not a positive multiple of 2 MiB")]
    BadSize(u64),
    #[error("no free VRAM range of {want} bytes ({free} bytes free in all)")]
    NoSpace { want: u64, free: u64 },
    #[error("VRAM {offset:#x}+{size:#x} is not free")]
    Taken { offset: u64, size: u64 },
    #[error("create the VRAM memory object: {0}")]
    Create(String),
}

/// The VRAM pool.
pub struct VramPool {
    fd: OwnedFd,
    size: u64,
    /// Free ranges, sorted by offset, never adjacent (merged).
    free: Vec<(u64, u64)>,
}

impl VramPool {
    /// Creates the memory object of `size` bytes (untouched pages cost nothing).
    pub fn new(size: u64) -> Result<Self, PartitionError> {
        if size == 0 || !size.is_multiple_of(GRANULE) {
            return Err(PartitionError::BadSize(size));
        }
        // SAFETY: memfd_create with a static NUL-terminated name; the result is checked.
        let raw = unsafe { libc::memfd_create(c"vgpud-vram".as_ptr(), libc::MFD_CLOEXEC) };
        if raw < 0 {
            return Err(PartitionError::Create(
                std::io::Error::last_os_error().to_string(),
            ));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on the memfd we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } < 0 {
            return Err(PartitionError::Create(
                std::io::Error::last_os_error().to_string(),
            ));
        }
        Ok(VramPool {
            fd,
            size,
            free: vec![(0, size)],
        })
    }

    /// The memory object (sent to VM processes).
    pub fn fd(&self) -> BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.fd.as_fd()
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// Bytes not in any partition (quarantined partitions count as used).
    pub fn free_bytes(&self) -> u64 {
        self.free.iter().map(|r| r.1).sum()
    }

    /// The largest free range (the largest partition `alloc` can give now).
    pub fn largest_free(&self) -> u64 {
        self.free.iter().map(|r| r.1).max().unwrap_or(0)
    }

    /// Takes a partition of `size` bytes (a positive multiple of 2 MiB); returns its offset.
    pub fn alloc(&mut self, size: u64) -> Result<u64, PartitionError> {
        if size == 0 || !size.is_multiple_of(GRANULE) {
            return Err(PartitionError::BadSize(size));
        }
        let i =
            self.free
                .iter()
                .position(|&(_, len)| len >= size)
                .ok_or(PartitionError::NoSpace {
                    want: size,
                    free: self.free_bytes(),
                })?;
        let (off, len) = self.free[i];
        if len == size {
            self.free.remove(i);
        } else {
            self.free[i] = (off + size, len - size);
        }
        Ok(off)
    }

    /// Takes the partition `[offset, offset + size)` exactly (a restart: a VM of an earlier
    /// instance claims the range it holds); an error when any of it is not free.
    pub fn reserve(&mut self, offset: u64, size: u64) -> Result<(), PartitionError> {
        if size == 0 || !size.is_multiple_of(GRANULE) || !offset.is_multiple_of(GRANULE) {
            return Err(PartitionError::BadSize(size));
        }
        let end = offset
            .checked_add(size)
            .ok_or(PartitionError::BadSize(size))?;
        let i = self
            .free
            .iter()
            .position(|&(o, len)| o <= offset && end <= o + len)
            .ok_or(PartitionError::Taken { offset, size })?;
        let (o, len) = self.free[i];
        self.free.remove(i);
        if end < o + len {
            self.free.insert(i, (end, o + len - end));
        }
        if o < offset {
            self.free.insert(i, (o, offset - o));
        }
        Ok(())
    }

    /// Returns a partition: zeroes it (punches its pages out) and makes it free again.
    /// `(offset, size)` must be a partition `alloc` returned and not freed since.
    pub fn release(&mut self, offset: u64, size: u64) {
        if let Err(e) = punch(self.fd.as_fd(), offset, size) {
            // The range stays allocated: never hand out memory that may hold a VM's data.
            log::error!(
                "vgpud: zeroing VRAM {offset:#x}+{size:#x} failed ({e}); the range is leaked"
            );
            return;
        }
        let i = self.free.partition_point(|&(o, _)| o < offset);
        self.free.insert(i, (offset, size));
        // Merge with the neighbours.
        if i + 1 < self.free.len() && self.free[i].0 + self.free[i].1 == self.free[i + 1].0 {
            self.free[i].1 += self.free[i + 1].1;
            self.free.remove(i + 1);
        }
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == self.free[i].0 {
            self.free[i - 1].1 += self.free[i].1;
            self.free.remove(i);
        }
    }
}

/// Zeroes `[offset, offset + size)` of a VRAM memory object by punching its pages out (they
/// read back as zeros and cost nothing until written again).
pub(crate) fn punch(fd: BorrowedFd<'_>, offset: u64, size: u64) -> std::io::Result<()> {
    let (Ok(off), Ok(len)) = (libc::off_t::try_from(offset), libc::off_t::try_from(size)) else {
        return Err(std::io::Error::from(std::io::ErrorKind::InvalidInput));
    };
    // SAFETY: fallocate(2) on a descriptor the caller holds open; no memory is passed.
    let r = unsafe {
        libc::fallocate(
            fd.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            off,
            len,
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const M2: u64 = GRANULE;

    #[test]
    fn first_fit_merge_and_exhaustion() {
        let mut p = VramPool::new(8 * M2).unwrap();
        let a = p.alloc(2 * M2).unwrap();
        let b = p.alloc(4 * M2).unwrap();
        let c = p.alloc(2 * M2).unwrap();
        assert_eq!((a, b, c), (0, 2 * M2, 6 * M2));
        assert_eq!(
            p.alloc(M2),
            Err(PartitionError::NoSpace { want: M2, free: 0 })
        );
        p.release(a, 2 * M2);
        p.release(c, 2 * M2);
        assert!(p.alloc(4 * M2).is_err(), "free space is fragmented");
        p.release(b, 4 * M2);
        assert_eq!(p.free, vec![(0, 8 * M2)]);
        assert_eq!(p.alloc(8 * M2).unwrap(), 0);
        assert_eq!(p.alloc(3 << 20), Err(PartitionError::BadSize(3 << 20)));
        assert!(VramPool::new(0).is_err());
    }

    #[test]
    fn reserve_takes_an_exact_free_range() {
        let mut p = VramPool::new(8 * M2).unwrap();
        p.reserve(2 * M2, 2 * M2).unwrap();
        assert_eq!(p.free, vec![(0, 2 * M2), (4 * M2, 4 * M2)]);
        for (o, s) in [(2 * M2, M2), (M2, 2 * M2), (6 * M2, 4 * M2)] {
            assert_eq!(
                p.reserve(o, s),
                Err(PartitionError::Taken { offset: o, size: s })
            );
        }
        assert!(p.reserve(M2 / 2, M2).is_err());
        // First fit goes around it; released, it merges again.
        assert_eq!(p.alloc(4 * M2).unwrap(), 4 * M2);
        p.reserve(0, 2 * M2).unwrap();
        assert!(p.free.is_empty());
        p.release(2 * M2, 2 * M2);
        p.release(0, 2 * M2);
        p.release(4 * M2, 4 * M2);
        assert_eq!(p.free, vec![(0, 8 * M2)]);
    }

    #[test]
    fn released_partitions_read_as_zero() {
        let mut p = VramPool::new(2 * M2).unwrap();
        let off = p.alloc(M2).unwrap();
        let data = [0x5au8; 64];
        // SAFETY: pwrite into the memfd we own, inside its size.
        let n = unsafe {
            libc::pwrite(
                p.fd().as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                off as libc::off_t + 4096,
            )
        };
        assert_eq!(n, 64);
        p.release(off, M2);
        let mut back = [0xffu8; 64];
        // SAFETY: pread from the memfd we own into our buffer.
        let n = unsafe {
            libc::pread(
                p.fd().as_raw_fd(),
                back.as_mut_ptr().cast(),
                back.len(),
                off as libc::off_t + 4096,
            )
        };
        assert_eq!(n, 64);
        assert_eq!(back, [0u8; 64]);
    }
}
