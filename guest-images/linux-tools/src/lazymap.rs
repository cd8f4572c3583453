//! A file mapping made 2 MiB at a time, on first use, inside a virtual-address range reserved
//! up front (so the whole range stays contiguous). Under PVM, `mmap` of a BAR or of `/dev/mem`
//! fills every page-table entry at once in the emulated kernel (~100 us each): mapping the
//! 256 MiB VRAM aperture whole cost ~6.5 s, while the driver touches a few MiB of it.

use std::fs::File;
use std::os::fd::AsRawFd;

/// Granule of the mapping.
pub const CHUNK: usize = 2 << 20;

/// The mapping.
#[derive(Debug)]
pub struct LazyMap {
    file: File,
    file_off: u64,
    base: *mut u8,
    len: usize,
    mapped: Vec<bool>,
}

// SAFETY: the mapping belongs to this object alone and is valid process-wide; moving the
// object to another thread moves only the ownership (nothing here is thread-local).
unsafe impl Send for LazyMap {}

impl LazyMap {
    /// Reserves `len` bytes of address space for `file` from `file_off` (page-aligned); maps
    /// nothing yet.
    pub fn new(file: File, file_off: u64, len: usize) -> std::io::Result<Self> {
        // SAFETY: a fresh anonymous reservation with no access; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len.max(1),
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Self {
            file,
            file_off,
            base: p.cast(),
            len,
            mapped: vec![false; len.div_ceil(CHUNK)],
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Makes `off .. off + n` accessible; its address, or `None` outside the range or when the
    /// kernel refuses the mapping.
    pub fn ensure(&mut self, off: usize, n: usize) -> Option<*mut u8> {
        let end = off.checked_add(n)?;
        if end > self.len {
            return None;
        }
        for c in off / CHUNK..end.div_ceil(CHUNK) {
            if self.mapped[c] {
                continue;
            }
            let at = c * CHUNK;
            let size = CHUNK.min(self.len - at);
            let file_off = libc::off_t::try_from(self.file_off + at as u64).ok()?;
            // SAFETY: replaces part of this object's own reservation (inside `len`, checked)
            // with a shared mapping of the file; nothing else uses those addresses.
            let p = unsafe {
                libc::mmap(
                    self.base.add(at).cast(),
                    size,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED | libc::MAP_FIXED,
                    self.file.as_raw_fd(),
                    file_off,
                )
            };
            if p == libc::MAP_FAILED {
                return None;
            }
            self.mapped[c] = true;
        }
        // SAFETY: `off` is inside the reservation (checked).
        Some(unsafe { self.base.add(off) })
    }
}

impl Drop for LazyMap {
    fn drop(&mut self) {
        // SAFETY: the reservation made in `new`, released once (with what was mapped into it).
        unsafe { libc::munmap(self.base.cast(), self.len.max(1)) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_chunks_on_demand_of_a_file() {
        let path = std::env::temp_dir().join(format!("lazymap-{}", std::process::id()));
        let data: Vec<u8> = (0..(CHUNK + 4096)).map(|i| (i % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut m = LazyMap::new(f, 0, data.len()).unwrap();
        assert!(m.mapped.iter().all(|&b| !b));
        let p = m.ensure(CHUNK + 8, 4).unwrap();
        // SAFETY: ensured just above.
        assert_eq!(unsafe { p.read() }, data[CHUNK + 8]);
        assert_eq!(m.mapped, [false, true]);
        assert!(m.ensure(data.len() - 2, 4).is_none());
        assert!(m.ensure(usize::MAX, 2).is_none());
        drop(m);
        std::fs::remove_file(&path).unwrap();
    }
}
