//! A region of a snapshot file mapped for the lanes' writes (`lanes::write_at`, issue 24:
//! whole-device snapshots at engine speed). `pwrite`s into one file are serialised by the
//! file's inode lock (tmpfs and ext4 buffered writes alike): on the GPU host the lanes' 16
//! threads wrote a tmpfs file at 2.45 GB/s, one thread's speed. Through a shared mapping each
//! lane copies into the page cache on its own: its pages are populated first with
//! `MADV_POPULATE_WRITE` (in parallel, no inode lock), which, unlike a write fault, reports a
//! full file system or a failed allocation as an error instead of raising `SIGBUS`; a lane
//! whose population fails writes its bytes with `pwrite` instead (which then reports what is
//! wrong). `fsync` on the file afterwards writes the mapped pages like any others.
//!
//! Used on tmpfs only, where it was measured (H100 host, 4 GiB partition half filled: the
//! device's save to a file with `fsync` went from 2.5-2.8 to 3.5-3.7 GB/s); a disk file
//! system keeps `pwrite` (its own speed is the bound there, ~1-2 GB/s on the GPU host, and a
//! mapped write's page-by-page block allocation was not measured against it).
//!
//! The caller owns the file for the write (a snapshot directory it created): another process
//! truncating it meanwhile would fault the copies, as it would any mapping of a file.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once `MADV_POPULATE_WRITE` was refused as unknown (a kernel before 5.14): no more
/// mappings are made, every lane writes with `pwrite`.
static NO_POPULATE: AtomicBool = AtomicBool::new(false);

/// The host's page size (mappings and `madvise` work in it).
fn page() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(p)
        .ok()
        .filter(|p| p.is_power_of_two())
        .unwrap_or(4096)
}

/// Whether `file` lives on tmpfs (where [`Region`] is used), and mappings are worth trying.
pub fn on_tmpfs(file: &File) -> bool {
    if NO_POPULATE.load(Ordering::Relaxed) {
        return false;
    }
    // SAFETY: an all-zero `statfs` is a valid out-buffer; the descriptor is open.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let r = unsafe { libc::fstatfs(file.as_raw_fd(), &mut st) };
    r == 0 && st.f_type == libc::TMPFS_MAGIC
}

/// `[at, at + len)` of a file, mapped shared and writable (the file extended to its end).
pub struct Region {
    base: *mut u8,
    /// The page size the mapping was made with.
    page: u64,
    /// The mapping's length and the file offset it starts at (`at` rounded down to a page).
    map_len: usize,
    map_off: u64,
    at: u64,
    len: u64,
}

// SAFETY: the mapping is plain memory; `write` (unsafe) writes only the bytes a caller names,
// and its callers name disjoint ranges.
unsafe impl Sync for Region {}
// SAFETY: as above; the pointer is released once, in Drop.
unsafe impl Send for Region {}

impl Region {
    /// Maps `[at, at + len)` of `file` (opened for reading and writing), extending the file
    /// to `at + len` first if it is shorter (a hole there until the lanes fill it).
    pub fn new(file: &File, at: u64, len: u64) -> io::Result<Region> {
        let end = at
            .checked_add(len)
            .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
        if len == 0 {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        if file.metadata()?.len() < end {
            file.set_len(end)?;
        }
        let page = page();
        let map_off = at & !(page - 1);
        let map_len = usize::try_from(end - map_off)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        let off = libc::off_t::try_from(map_off)
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: a new shared mapping of an open file descriptor at a page-aligned offset;
        // checked for failure; unmapped once, in Drop.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                off,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // Huge pages where the mount gives them on request (tmpfs `huge=advise`; `huge=always`
        // and `within_size` give them anyway, `never`, /dev/shm's default, ignores this): the
        // lanes' population then allocates and clears 2 MiB at a time (dev box: one thread
        // 0.8 → 5.3 GB/s; docs/snapshot.md, "Where to write a snapshot fast"). A refusal
        // changes nothing.
        // SAFETY: advice on the mapping just made, of its length; no byte changes.
        let r = unsafe { libc::madvise(base, map_len, libc::MADV_HUGEPAGE) };
        if r != 0 {
            log::debug!(
                "vgpu: snapshot lanes: MADV_HUGEPAGE: {}",
                io::Error::last_os_error()
            );
        }
        Ok(Region {
            base: base.cast(),
            page,
            map_len,
            map_off,
            at,
            len,
        })
    }

    /// Writes `bytes` at file offset `off` (inside the region): the pages populated, then the
    /// bytes copied; `pwrite` to `file` when the population fails (no `SIGBUS` either way).
    ///
    /// # Safety
    /// No other call writes any of the bytes `[off, off + bytes.len())` at the same time
    /// (calls on disjoint ranges may run on several threads at once; they may share pages).
    pub unsafe fn write(&self, file: &File, bytes: &[u8], off: u64) -> io::Result<()> {
        let end = off.saturating_add(bytes.len() as u64);
        if off < self.at || end > self.at + self.len {
            return Err(io::ErrorKind::InvalidInput.into());
        }
        if bytes.is_empty() {
            return Ok(());
        }
        let first = (off & !(self.page - 1)) - self.map_off;
        let last = end
            .next_multiple_of(self.page)
            .min(self.map_off + self.map_len as u64)
            - self.map_off;
        // SAFETY: `[first, last)` lies inside the mapping (checked above); populating pages
        // changes no byte.
        let populated = unsafe {
            libc::madvise(
                self.base.add(first as usize).cast(),
                (last - first) as usize,
                libc::MADV_POPULATE_WRITE,
            )
        } == 0;
        if !populated {
            let e = io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINVAL) && !NO_POPULATE.swap(true, Ordering::Relaxed)
            {
                log::info!(
                    "vgpu: snapshot lanes: no MADV_POPULATE_WRITE on this kernel ({e}): pwrite"
                );
            } else {
                log::debug!("vgpu: snapshot lane at {off:#x}: not populated ({e}); pwrite");
            }
            return file.write_all_at(bytes, off);
        }
        // SAFETY: `[off, end)` lies inside the mapping (checked above) and its pages are
        // populated; no other call writes these bytes (the caller's contract).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.base.add((off - self.map_off) as usize),
                bytes.len(),
            );
        }
        Ok(())
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe {
            libc::munmap(self.base.cast(), self.map_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_region_extends_the_file_and_takes_its_bytes_at_unaligned_offsets() {
        let dir = std::env::temp_dir().join(format!("vgpu-mapped-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f");
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        file.write_all_at(b"head", 0).unwrap();
        let (at, len) = (4100u64, (3u64 << 20) + 7);
        let r = Region::new(&file, at, len).unwrap();
        assert_eq!(file.metadata().unwrap().len(), at + len);
        let a: Vec<u8> = (0..len as u32 - 1000).map(|i| (i % 251) as u8).collect();
        let b = vec![0x5au8; 1000];
        // Two lanes sharing a page, written from two threads.
        std::thread::scope(|s| {
            // SAFETY: the two ranges are disjoint.
            s.spawn(|| unsafe { r.write(&file, &b, at + a.len() as u64) }.unwrap());
            // SAFETY: as above.
            s.spawn(|| unsafe { r.write(&file, &a, at) }.unwrap());
        });
        // Outside the region: refused, nothing written.
        assert_eq!(
            // SAFETY: nothing else writes meanwhile.
            unsafe { r.write(&file, b"x", at - 1) }.unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            // SAFETY: as above.
            unsafe { r.write(&file, b"xy", at + len - 1) }
                .unwrap_err()
                .kind(),
            io::ErrorKind::InvalidInput
        );
        drop(r);
        file.sync_all().unwrap();
        let back = std::fs::read(&path).unwrap();
        assert_eq!(&back[..4], b"head");
        assert!(back[4..at as usize].iter().all(|&x| x == 0));
        assert_eq!(&back[at as usize..at as usize + a.len()], &a[..]);
        assert_eq!(&back[at as usize + a.len()..], &b[..]);
        assert!(Region::new(&file, u64::MAX - 1, 4).is_err());
        assert!(Region::new(&file, 0, 0).is_err());
        drop(file);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
