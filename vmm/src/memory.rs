//! Guest RAM: anonymous host memory in one or two regions around the device hole, registered
//! with KVM as memory slots.

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;
use vm_memory::{GuestAddress, GuestMemoryBackend, GuestMemoryMmap, GuestMemoryRegion};

use crate::layout;

/// Errors creating guest memory.
#[derive(Debug, thiserror::Error)]
pub enum MemoryError {
    #[error("--memory must be between 2 and {max} MiB, got {got}")]
    Size { got: u64, max: u64 },
    #[error("allocate guest memory: {0}")]
    Alloc(vm_memory::mmap::FromRangesError),
    #[error("register memory slot {slot}: {err}")]
    Slot { slot: u32, err: kvm_ioctls::Error },
}

/// Largest supported `--memory`, in MiB.
pub const MAX_MEMORY_MIB: u64 = 1 << 20;

/// Allocates `mib` MiB of guest RAM and registers it with the VM.
pub fn create(vm: &VmFd, mib: u64) -> Result<GuestMemoryMmap, MemoryError> {
    if !(2..=MAX_MEMORY_MIB).contains(&mib) {
        return Err(MemoryError::Size {
            got: mib,
            max: MAX_MEMORY_MIB,
        });
    }
    let ranges: Vec<(GuestAddress, usize)> = layout::ram_regions(mib << 20)
        .into_iter()
        .map(|(base, len)| (GuestAddress(base), len as usize))
        .collect();
    let mem = GuestMemoryMmap::<()>::from_ranges(&ranges).map_err(MemoryError::Alloc)?;
    for (slot, region) in mem.iter().enumerate() {
        let slot = slot as u32;
        let host = region
            .get_host_address(vm_memory::MemoryRegionAddress(0))
            .map_err(|_| MemoryError::Slot {
                slot,
                err: kvm_ioctls::Error::new(libc::EFAULT),
            })?;
        let desc = kvm_userspace_memory_region {
            slot,
            guest_phys_addr: region.start_addr().0,
            memory_size: region.len(),
            userspace_addr: host as u64,
            flags: 0,
        };
        // SAFETY: the region is a live anonymous mapping of `memory_size` bytes owned by `mem`,
        // which the caller keeps alive as long as the VM.
        unsafe { vm.set_user_memory_region(desc) }
            .map_err(|err| MemoryError::Slot { slot, err })?;
    }
    Ok(mem)
}

/// RAM below and above the hole, in bytes.
pub fn split(mem: &GuestMemoryMmap) -> (u64, u64) {
    mem.iter().fold((0, 0), |(lo, hi), r| {
        if r.start_addr().0 < layout::MMIO_HOLE_START {
            (lo + r.len(), hi)
        } else {
            (lo, hi + r.len())
        }
    })
}
