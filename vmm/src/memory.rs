//! Guest RAM: anonymous host memory in one or two regions around the device hole, registered
//! with KVM as memory slots.

use kvm_bindings::kvm_userspace_memory_region;
use std::sync::Arc;

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
    #[error("guest RAM from the GPU engine: {0}")]
    External(String),
    #[error("register memory slot {slot}: {err}")]
    Slot { slot: u32, err: kvm_ioctls::Error },
}

/// Largest supported `--memory`, in MiB.
pub const MAX_MEMORY_MIB: u64 = 1 << 20;

/// Host memory for guest RAM that something else owns (a GPU engine that must map guest RAM
/// into GPU address spaces): `alloc(len)` returns a host mapping of `len` bytes, readable and
/// writable, that lives as long as the allocator's owner.
pub type RamAllocator<'a> = &'a dyn Fn(usize) -> Result<std::ptr::NonNull<u8>, String>;

/// Allocates `mib` MiB of guest RAM (anonymous memory, or from `alloc`) and registers it with
/// the VM.
pub fn create(
    vm: &VmFd,
    mib: u64,
    alloc: Option<RamAllocator<'_>>,
) -> Result<GuestMemoryMmap, MemoryError> {
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
    let mem = match alloc {
        None => GuestMemoryMmap::<()>::from_ranges(&ranges).map_err(MemoryError::Alloc)?,
        Some(alloc) => external(&ranges, alloc)?,
    };
    register(vm, &mem)?;
    Ok(mem)
}

/// Registers every region of `mem` with the VM as memory slots 0, 1, ...
pub fn register(vm: &VmFd, mem: &GuestMemoryMmap) -> Result<(), MemoryError> {
    register_with(vm, mem, 0)
}

/// Turns KVM's dirty-page logging of the RAM slots on or off (live migration).
pub fn set_dirty_logging(vm: &VmFd, mem: &GuestMemoryMmap, on: bool) -> Result<(), MemoryError> {
    let flags = if on {
        kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES
    } else {
        0
    };
    register_with(vm, mem, flags)
}

fn register_with(vm: &VmFd, mem: &GuestMemoryMmap, flags: u32) -> Result<(), MemoryError> {
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
            flags,
        };
        // SAFETY: the region is a live mapping of `memory_size` bytes owned by `mem`,
        // which the caller keeps alive as long as the VM.
        unsafe { vm.set_user_memory_region(desc) }
            .map_err(|err| MemoryError::Slot { slot, err })?;
    }
    Ok(())
}

/// Guest RAM's memory slots being registered on a thread of their own: a cold restore
/// without a cuda engine (`crate::builder::build_from_snapshot`) maps `ram.bin` (instant) and lets KVM register it while the VM's irqchip, the
/// vCPUs and the devices are made, because `KVM_SET_USER_MEMORY_REGION` mostly sleeps (in
/// `kvm_swap_active_memslots`' SRCU grace period: 5-12 ms on the PVM dev host, whatever the
/// size). Waited for before any state goes into the vCPUs (MSRs such as the async-PF or
/// steal-time ones name guest RAM).
pub struct PendingSlots(std::thread::JoinHandle<Result<f64, MemoryError>>);

impl PendingSlots {
    pub fn start(vm: &Arc<VmFd>, mem: &GuestMemoryMmap) -> Result<Self, MemoryError> {
        let (vm, mem) = (vm.clone(), mem.clone());
        let t = std::thread::Builder::new()
            .name("ram-slots".into())
            .spawn(move || {
                let t = std::time::Instant::now();
                register(&vm, &mem).map(|()| t.elapsed().as_secs_f64() * 1e3)
            })
            .map_err(|e| MemoryError::External(format!("start the RAM slots' thread: {e}")))?;
        Ok(PendingSlots(t))
    }

    /// Waits for the registration; the time it took.
    pub fn wait(self) -> Result<f64, MemoryError> {
        self.0.join().unwrap_or_else(|_| {
            Err(MemoryError::External(
                "the RAM slots' thread panicked".into(),
            ))
        })
    }
}

/// Guest RAM in host memory from `alloc` (not unmapped by vm-memory: its owner frees it).
fn external(
    ranges: &[(GuestAddress, usize)],
    alloc: RamAllocator<'_>,
) -> Result<GuestMemoryMmap, MemoryError> {
    use vm_memory::mmap::{GuestRegionMmap, MmapRegion};
    let mut regions = Vec::new();
    for (gpa, len) in ranges {
        let ptr = alloc(*len).map_err(MemoryError::External)?;
        // SAFETY: `ptr` is a readable and writable mapping of `len` bytes that its allocator
        // keeps alive as long as the VM (the engine outlives guest memory in `VmMem`); a raw
        // region is never unmapped by vm-memory.
        let region = unsafe {
            MmapRegion::build_raw(
                ptr.as_ptr(),
                *len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
            )
        }
        .map_err(|e| MemoryError::External(e.to_string()))?;
        let region = GuestRegionMmap::new(region, *gpa)
            .ok_or_else(|| MemoryError::External("guest RAM region overflows".into()))?;
        regions.push(region);
    }
    GuestMemoryMmap::from_regions(regions).map_err(|e| MemoryError::External(e.to_string()))
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
