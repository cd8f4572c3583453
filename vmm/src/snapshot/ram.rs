//! Guest RAM in a snapshot: `ram.bin` holds the RAM regions one after the other (the layout's
//! regions in address order), as a sparse file that stores only pages the guest ever touched
//! and that are not all zero. A restore maps the file copy-on-write (MAP_PRIVATE), as
//! Firecracker does, so the guest starts at once and pages come in as it touches them.

use std::fs::File;
use std::os::unix::fs::FileExt;

use vm_memory::mmap::{GuestRegionMmap, MmapRegionBuilder};
use vm_memory::{FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::layout;

const PAGE: usize = 4096;
/// Largest write of adjacent non-zero pages.
const MAX_RUN: usize = 1 << 20;

/// Errors saving or mapping guest RAM.
#[derive(Debug, thiserror::Error)]
pub enum RamError {
    #[error("{what}: {err}")]
    Io {
        what: &'static str,
        err: std::io::Error,
    },
    #[error("the RAM file is {found} bytes, the manifest says {want}")]
    Size { found: u64, want: u64 },
    #[error("map guest RAM: {0}")]
    Map(String),
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> RamError {
    move |err| RamError::Io { what, err }
}

/// How guest RAM is backed, which decides how a save finds the touched pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backing {
    /// Anonymous memory: pages the guest never touched are absent from /proc/self/pagemap.
    Anonymous,
    /// A private file mapping (a restored VM) or external memory: every page is looked at.
    Other,
}

/// What a save wrote.
#[derive(Debug, Clone, Copy, Default)]
pub struct RamSaved {
    /// Bytes of RAM (the file's length).
    pub bytes: u64,
    /// Pages written (touched and not all zero).
    pub pages: u64,
}

/// Which pages of `len` bytes at `host` are present or swapped out, from /proc/self/pagemap
/// (bits 63 and 62 of each entry); `None` if pagemap cannot be read.
pub(crate) fn touched(pagemap: &File, host: usize, len: usize) -> Option<Vec<bool>> {
    let pages = len / PAGE;
    let mut out = Vec::with_capacity(pages);
    let mut buf = vec![0u8; 8 * 4096];
    let mut done = 0;
    while done < pages {
        let n = (pages - done).min(4096);
        let off = ((host / PAGE + done) * 8) as u64;
        pagemap.read_exact_at(&mut buf[..n * 8], off).ok()?;
        for e in buf[..n * 8].chunks_exact(8) {
            let v = u64::from_le_bytes(e.try_into().ok()?);
            out.push(v & (3 << 62) != 0);
        }
        done += n;
    }
    Some(out)
}

/// Where [`for_each_run`] sends each run: `(offset in the RAM file's layout, bytes)`.
pub type RunSink<'a> = dyn FnMut(u64, &[u8]) -> Result<(), RamError> + 'a;

/// Calls `sink(offset, bytes)` for every run of touched, non-zero pages of guest RAM (at most
/// 1 MiB each), `offset` being the run's place in the RAM file's layout; returns the RAM size
/// and the pages passed.
pub fn for_each_run(
    mem: &GuestMemoryMmap,
    backing: Backing,
    sink: &mut RunSink<'_>,
) -> Result<RamSaved, RamError> {
    let pagemap = match backing {
        Backing::Anonymous => File::open("/proc/self/pagemap").ok(),
        Backing::Other => None,
    };
    let mut saved = RamSaved::default();
    let mut file_off = 0u64;
    for region in mem.iter() {
        let len = region.len() as usize;
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|e| RamError::Map(e.to_string()))? as usize;
        // SAFETY: the region is a live mapping of `len` bytes owned by `mem`; the vCPUs are
        // paused, and the GPU worker quiesced, so nothing writes it while we read.
        let bytes = unsafe { std::slice::from_raw_parts(host as *const u8, len) };
        let present = pagemap.as_ref().and_then(|p| touched(p, host, len));
        let mut run: Option<(usize, usize)> = None;
        let mut flush = |run: &mut Option<(usize, usize)>| -> Result<(), RamError> {
            if let Some((start, end)) = run.take() {
                sink(file_off + start as u64, &bytes[start..end])?;
            }
            Ok(())
        };
        for p in 0..len / PAGE {
            let start = p * PAGE;
            let keep = present.as_ref().is_none_or(|t| t[p])
                && bytes[start..start + PAGE].iter().any(|&b| b != 0);
            if keep {
                saved.pages += 1;
                match &mut run {
                    Some((_, end)) if *end == start => *end = start + PAGE,
                    _ => {
                        flush(&mut run)?;
                        run = Some((start, start + PAGE));
                    }
                }
                if let Some((s, e)) = run
                    && e - s >= MAX_RUN
                {
                    flush(&mut run)?;
                }
            } else {
                flush(&mut run)?;
            }
        }
        flush(&mut run)?;
        file_off += len as u64;
    }
    saved.bytes = file_off;
    Ok(saved)
}

/// Writes guest RAM to `file` (new and empty): touched non-zero pages at their offsets, the
/// rest left as holes; the file's length is the RAM size.
pub fn save(mem: &GuestMemoryMmap, backing: Backing, file: &File) -> Result<RamSaved, RamError> {
    let saved = for_each_run(mem, backing, &mut |off, bytes| {
        file.write_all_at(bytes, off)
            .map_err(io("write the RAM file"))
    })?;
    file.set_len(saved.bytes).map_err(io("size the RAM file"))?;
    let t = std::time::Instant::now();
    file.sync_all().map_err(io("sync the RAM file"))?;
    log::debug!(
        "snapshot: fsync of the RAM file: {:.1} ms",
        t.elapsed().as_secs_f64() * 1e3
    );
    Ok(saved)
}

/// The RAM regions of a VM with `bytes` of RAM: (guest address, length, offset in the file).
fn regions(bytes: u64) -> Vec<(u64, u64, u64)> {
    let mut off = 0;
    layout::ram_regions(bytes)
        .into_iter()
        .map(|(gpa, len)| {
            let r = (gpa, len, off);
            off += len;
            r
        })
        .collect()
}

/// Checks that `file` holds exactly `bytes` of RAM.
pub fn check(file: &File, bytes: u64) -> Result<(), RamError> {
    let found = file.metadata().map_err(io("stat the RAM file"))?.len();
    if found != bytes {
        return Err(RamError::Size { found, want: bytes });
    }
    Ok(())
}

/// Copies the RAM file's data into `mem` (guest RAM the caller allocated, all zero, with the
/// layout of `bytes` of RAM): what a restore does when guest RAM cannot be a mapping of the
/// file (`backend=cuda`: the CUDA engine allocates guest RAM). Only the file's data extents are
/// read (`SEEK_DATA`/`SEEK_HOLE`; the whole file where the file system cannot tell). Returns
/// the bytes read.
pub fn copy_into(file: &File, bytes: u64, mem: &GuestMemoryMmap) -> Result<u64, RamError> {
    use std::os::fd::AsRawFd;
    check(file, bytes)?;
    let fd = file.as_raw_fd();
    let seek = |off: u64, whence: libc::c_int| -> Option<u64> {
        let off = libc::off_t::try_from(off).ok()?;
        // SAFETY: lseek on a descriptor `file` owns; no memory is involved.
        let r = unsafe { libc::lseek(fd, off, whence) };
        u64::try_from(r).ok()
    };
    let mut copied = 0;
    for (gpa, len, off) in regions(bytes) {
        let region = mem
            .find_region(GuestAddress(gpa))
            .filter(|r| r.start_addr().0 == gpa && r.len() == len)
            .ok_or_else(|| RamError::Map(format!("no RAM region of {len:#x} bytes at {gpa:#x}")))?;
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|e| RamError::Map(e.to_string()))?;
        // SAFETY: the region is a live mapping of `len` bytes owned by `mem`; nothing runs in
        // the VM yet (no vCPU, no GPU worker), so this is the only access.
        let dst = unsafe { std::slice::from_raw_parts_mut(host, len as usize) };
        let end = off + len;
        let mut at = off;
        while at < end {
            // The next data extent at or after `at` (no SEEK_DATA support: all of it is data).
            let data = match seek(at, libc::SEEK_DATA) {
                Some(d) => d,
                None if std::io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) => end,
                None => at,
            };
            if data >= end {
                break;
            }
            let hole = seek(data, libc::SEEK_HOLE).unwrap_or(end).min(end);
            let (a, b) = ((data - off) as usize, (hole - off) as usize);
            file.read_exact_at(&mut dst[a..b], data)
                .map_err(io("read the RAM file"))?;
            copied += hole - data;
            at = hole.max(data + 1);
        }
    }
    Ok(copied)
}

/// Guest RAM of `bytes` bytes mapped copy-on-write from `file`.
pub fn map_private(file: &File, bytes: u64) -> Result<GuestMemoryMmap, RamError> {
    check(file, bytes)?;
    let mut out = Vec::new();
    for (gpa, len, off) in regions(bytes) {
        let f = file.try_clone().map_err(io("duplicate the RAM file"))?;
        let region = MmapRegionBuilder::new(len as usize)
            .with_file_offset(FileOffset::new(f, off))
            .with_mmap_prot(libc::PROT_READ | libc::PROT_WRITE)
            .with_mmap_flags(libc::MAP_PRIVATE | libc::MAP_NORESERVE)
            .build()
            .map_err(|e| RamError::Map(e.to_string()))?;
        let region = GuestRegionMmap::new(region, GuestAddress(gpa))
            .ok_or_else(|| RamError::Map("region overflows".into()))?;
        out.push(region);
    }
    GuestMemoryMmap::from_regions(out).map_err(|e| RamError::Map(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A RAM file of 8 MiB with data in a few places (holes elsewhere) copied into fresh guest
    /// RAM comes back byte for byte; a file of another length is refused.
    #[test]
    fn copy_into_fills_guest_ram_from_the_file() {
        let bytes = 8u64 << 20;
        let path = std::env::temp_dir().join(format!("vgpu-ram-copy-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        let mut want = vec![0u8; bytes as usize];
        for (off, len, v) in [
            (0u64, 4096usize, 1u8),
            (3 << 20, 70_000, 2),
            (bytes - 4096, 4096, 3),
        ] {
            let data: Vec<u8> = (0..len).map(|i| v.wrapping_add(i as u8) | 1).collect();
            file.write_all_at(&data, off).unwrap();
            want[off as usize..off as usize + len].copy_from_slice(&data);
        }
        file.set_len(bytes).unwrap();
        let ranges: Vec<(GuestAddress, usize)> = layout::ram_regions(bytes)
            .into_iter()
            .map(|(a, l)| (GuestAddress(a), l as usize))
            .collect();
        let mem = GuestMemoryMmap::<()>::from_ranges(&ranges).unwrap();
        let n = copy_into(&file, bytes, &mem).unwrap();
        assert!(n >= 4096 * 2 + 70_000 && n <= bytes, "{n}");
        let mut got = Vec::new();
        for r in mem.iter() {
            let host = r
                .get_host_address(vm_memory::MemoryRegionAddress(0))
                .unwrap();
            // SAFETY: a live mapping of r.len() bytes owned by `mem`.
            got.extend_from_slice(unsafe { std::slice::from_raw_parts(host, r.len() as usize) });
        }
        assert!(got == want);
        assert!(matches!(
            copy_into(&file, bytes * 2, &mem),
            Err(RamError::Size { .. })
        ));
    }
}
