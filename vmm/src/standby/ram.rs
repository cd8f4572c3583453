//! A standby's guest RAM, registered with KVM before the snapshot is known, so that a restore
//! makes no `KVM_SET_USER_MEMORY_REGION` call (6.5 ms for a 256 MiB slot on the PVM dev host).
//!
//! Without a cuda engine the standby maps anonymous memory of the prepared size (the layout's
//! regions, each its own mapping) and registers it as the RAM slots. A restore maps the
//! snapshot's `ram.bin` copy-on-write (`MAP_PRIVATE | MAP_FIXED`) over the same addresses, as
//! `--restore` maps it elsewhere: KVM's memory slots hold host virtual addresses, not pages,
//! and replacing the mapping runs the MMU notifiers (KVM drops whatever it had mapped there:
//! nothing, the vCPUs never ran), so the guest's first touch of a page faults in the file's.
//! With a cuda engine, guest RAM is the engine's pinned host memory (as on a cold cuda
//! restore): the standby allocates and registers it, a restore copies the file's data extents
//! into it.

use std::fs::File;
use std::os::fd::AsRawFd;

use kvm_ioctls::VmFd;
use vm_memory::mmap::{GuestRegionMmap, MmapRegion};
use vm_memory::{GuestAddress, GuestMemoryMmap};

use crate::layout;
use crate::memory::{self, MemoryError};
use crate::snapshot::ram::{self, Backing, RamError};

/// Anonymous mappings this process made for guest RAM (address, length), unmapped when
/// dropped: after the VM, its devices and the guest memory handles that point into them.
#[derive(Debug)]
pub struct Reservation {
    maps: Vec<(usize, usize)>,
}

impl Reservation {
    /// Maps anonymous memory for each region of `bytes` of RAM (the layout's).
    fn new(bytes: u64) -> Result<Self, MemoryError> {
        let mut r = Reservation { maps: Vec::new() };
        for (_, len) in layout::ram_regions(bytes) {
            let len = len as usize;
            // SAFETY: a new anonymous mapping at an address the kernel chooses; nothing else
            // is affected. The result is checked.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                    -1,
                    0,
                )
            };
            if p == libc::MAP_FAILED {
                return Err(MemoryError::External(format!(
                    "reserve {len} bytes of guest RAM: {}",
                    std::io::Error::last_os_error()
                )));
            }
            r.maps.push((p as usize, len));
        }
        Ok(r)
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        for &(addr, len) in &self.maps {
            // SAFETY: a mapping this reservation made (or the file mapped over it with
            // MAP_FIXED, the same range); its owner drops it after everything that uses it.
            unsafe { libc::munmap(addr as *mut libc::c_void, len) };
        }
    }
}

/// How the standby's RAM is backed.
#[derive(Debug)]
enum Kind {
    /// Anonymous memory of ours, to be replaced by the snapshot's file.
    Reserved(Reservation),
    /// The cuda engine's host regions, in the layout's order.
    Engine(Vec<pgpu::HostRegionId>),
}

/// Guest RAM of a standby: its memory (regions at fixed host addresses, registered as the VM's
/// RAM slots) and what backs it.
#[derive(Debug)]
pub struct StandbyRam {
    mem: GuestMemoryMmap,
    bytes: u64,
    kind: Kind,
}

/// A standby's RAM with a snapshot in it: guest memory, how a save finds its pages, the
/// reservation to drop after the VM (none on cuda) and the engine's host regions (cuda).
pub type Restored = (
    GuestMemoryMmap,
    Backing,
    Option<Reservation>,
    Vec<pgpu::HostRegionId>,
);

impl StandbyRam {
    /// `mib` MiB of guest RAM registered with `vm`: anonymous memory, or from `engine` (a cuda
    /// engine backs guest RAM).
    pub fn new(
        vm: &VmFd,
        mib: u64,
        engine: Option<&dyn pgpu::EngineSnapshot>,
    ) -> Result<Self, MemoryError> {
        let bytes = mib << 20;
        if let Some(engine) = engine {
            let ids = std::cell::RefCell::new(Vec::new());
            let alloc = |len: usize| {
                let (id, ptr) = engine
                    .alloc_host_region(len as u64)
                    .map_err(|e| e.to_string())?;
                ids.borrow_mut().push(id);
                Ok(ptr)
            };
            let mem = memory::create(vm, mib, Some(&alloc))?;
            return Ok(StandbyRam {
                mem,
                bytes,
                kind: Kind::Engine(ids.take()),
            });
        }
        if !(2..=memory::MAX_MEMORY_MIB).contains(&mib) {
            return Err(MemoryError::Size {
                got: mib,
                max: memory::MAX_MEMORY_MIB,
            });
        }
        let res = Reservation::new(bytes)?;
        let mut regions = Vec::new();
        for (&(addr, len), (gpa, _)) in res.maps.iter().zip(layout::ram_regions(bytes)) {
            // SAFETY: `addr` is a readable and writable mapping of `len` bytes that `res`
            // keeps until after every user of this memory (the standby, then the VM); a raw
            // region is never unmapped by vm-memory.
            let region = unsafe {
                MmapRegion::build_raw(
                    addr as *mut u8,
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE,
                )
            }
            .map_err(|e| MemoryError::External(e.to_string()))?;
            let region = GuestRegionMmap::new(region, GuestAddress(gpa))
                .ok_or_else(|| MemoryError::External("guest RAM region overflows".into()))?;
            regions.push(region);
        }
        let mem = GuestMemoryMmap::from_regions(regions)
            .map_err(|e| MemoryError::External(e.to_string()))?;
        memory::register(vm, &mem)?;
        Ok(StandbyRam {
            mem,
            bytes,
            kind: Kind::Reserved(res),
        })
    }

    /// Bytes of guest RAM prepared.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The engine's host regions backing guest RAM (host region, address, bytes, in the
    /// layout's order), where a migration's rounds may copy RAM before the switch-over
    /// (`crate::snapshot::incoming::EngineSource::Given`); none without a cuda engine.
    pub fn engine_regions(&self) -> Vec<(pgpu::HostRegionId, usize, u64)> {
        use vm_memory::{GuestMemoryBackend, GuestMemoryRegion};
        match &self.kind {
            Kind::Engine(ids) => ids
                .iter()
                .zip(self.mem.iter())
                .map(|(&id, r)| (id, r.as_ptr() as usize, r.len()))
                .collect(),
            Kind::Reserved(_) => Vec::new(),
        }
    }

    /// Puts the snapshot's RAM file (`bytes` long, as prepared) in: mapped copy-on-write over
    /// the reserved addresses, or its data copied into the engine's memory, unless `filled`
    /// (a migration's rounds copied every received page into [`Self::engine_regions`]). The
    /// RAM slots stay as registered.
    pub fn restore(self, file: &File, bytes: u64, filled: bool) -> Result<Restored, RamError> {
        if bytes != self.bytes {
            return Err(RamError::Size {
                found: bytes,
                want: self.bytes,
            });
        }
        ram::check(file, bytes)?;
        match self.kind {
            Kind::Engine(ids) if filled => {
                log::debug!("standby: guest RAM received into engine memory during the rounds");
                Ok((self.mem, Backing::Other, None, ids))
            }
            Kind::Engine(ids) => {
                let n = ram::copy_into(file, bytes, &self.mem)?;
                log::debug!("standby: {n} bytes of RAM copied into engine memory");
                Ok((self.mem, Backing::Other, None, ids))
            }
            Kind::Reserved(res) => {
                let mut off = 0u64;
                for &(addr, len) in &res.maps {
                    map_over(file, addr, len, off)?;
                    off += len as u64;
                }
                Ok((self.mem, Backing::Other, Some(res), Vec::new()))
            }
        }
    }
}

/// Maps `len` bytes of `file` from `off` copy-on-write at exactly `addr` (replacing what was
/// mapped there).
fn map_over(file: &File, addr: usize, len: usize, off: u64) -> Result<(), RamError> {
    let off = libc::off_t::try_from(off).map_err(|_| RamError::Map("offset overflows".into()))?;
    // SAFETY: `addr..addr + len` is a mapping of our reservation that nothing runs on yet
    // (no vCPU thread, no device); MAP_FIXED replaces it with the file's pages at the same
    // addresses, which the memory slots and the guest memory handles point to. The result is
    // checked.
    let p = unsafe {
        libc::mmap(
            addr as *mut libc::c_void,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED | libc::MAP_NORESERVE,
            file.as_raw_fd(),
            off,
        )
    };
    if p == libc::MAP_FAILED || p as usize != addr {
        return Err(RamError::Map(format!(
            "map the RAM file over the standby's RAM: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::FileExt;
    use vm_memory::{Bytes, GuestMemoryBackend};

    /// The file's pages replace the anonymous ones at the same addresses; a write goes to the
    /// private copy, not the file; a file of another size is refused.
    #[test]
    fn the_snapshot_file_is_mapped_over_the_reserved_addresses() {
        let kvm = kvm_ioctls::Kvm::new().unwrap();
        let vm = kvm.create_vm().unwrap();
        let ram = StandbyRam::new(&vm, 4, None).unwrap();
        let before = ram.mem.get_host_address(GuestAddress(0)).unwrap() as usize;
        ram.mem.write_obj(0x5555u32, GuestAddress(8192)).unwrap();
        let path = std::env::temp_dir().join(format!("vgpu-standby-ram-{}", std::process::id()));
        let file = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        file.set_len(4 << 20).unwrap();
        file.write_all_at(&[7u8; 4096], 4096).unwrap();
        let (mem, backing, res, ids) = ram.restore(&file, 4 << 20, false).unwrap();
        assert!(res.is_some() && ids.is_empty() && backing == Backing::Other);
        assert_eq!(
            mem.get_host_address(GuestAddress(0)).unwrap() as usize,
            before
        );
        assert_eq!(mem.read_obj::<u8>(GuestAddress(4096)).unwrap(), 7);
        // The anonymous page written before is gone: the file has a hole there.
        assert_eq!(mem.read_obj::<u32>(GuestAddress(8192)).unwrap(), 0);
        mem.write_obj(9u8, GuestAddress(4096)).unwrap();
        let mut b = [0u8; 1];
        file.read_exact_at(&mut b, 4096).unwrap();
        assert_eq!(b[0], 7, "the guest's write reached the snapshot file");
        let vm2 = kvm.create_vm().unwrap();
        let other = StandbyRam::new(&vm2, 2, None).unwrap();
        assert!(matches!(
            other.restore(&file, 4 << 20, false),
            Err(RamError::Size { .. })
        ));
    }
}
