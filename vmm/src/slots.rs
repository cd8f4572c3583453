//! KVM memory slots beyond guest RAM, added and removed while the VM runs: the backing of the
//! virtual GPU's remapped VRAM aperture (BAR remap).

use std::sync::{Arc, Mutex, PoisonError};

use kvm_bindings::kvm_userspace_memory_region;
use kvm_ioctls::VmFd;

/// Slots below this are guest RAM (see `memory.rs`).
const FIRST_SLOT: u32 = 8;

/// Hands out memory slots for `vgpu::remap::ApertureMapper`.
pub struct SlotMapper {
    vm: Arc<VmFd>,
    free: Mutex<Vec<u32>>,
    next: Mutex<u32>,
    max: u32,
}

impl SlotMapper {
    pub fn new(vm: Arc<VmFd>, max_slots: usize) -> Self {
        SlotMapper {
            vm,
            free: Mutex::new(Vec::new()),
            next: Mutex::new(FIRST_SLOT),
            max: max_slots as u32,
        }
    }

    fn alloc(&self) -> Option<u32> {
        if let Some(s) = self
            .free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop()
        {
            return Some(s);
        }
        let mut n = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        (*n < self.max).then(|| {
            *n += 1;
            *n - 1
        })
    }

    fn set(&self, slot: u32, gpa: u64, host: u64, len: u64) -> Result<(), kvm_ioctls::Error> {
        let region = kvm_userspace_memory_region {
            slot,
            flags: 0,
            guest_phys_addr: gpa,
            memory_size: len,
            userspace_addr: host,
        };
        // SAFETY: for a new slot the caller of `map` guarantees the host range stays valid until
        // `unmap`; a zero size deletes the slot, which touches no memory.
        unsafe { self.vm.set_user_memory_region(region) }
    }
}

impl vgpu::remap::ApertureMapper for SlotMapper {
    unsafe fn map(&self, gpa: u64, host: *mut u8, len: u64) -> Result<u32, String> {
        let slot = self
            .alloc()
            .ok_or_else(|| "no free memory slot".to_string())?;
        self.set(slot, gpa, host as u64, len).map_err(|e| {
            self.free
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(slot);
            format!("memory slot {slot} at {gpa:#x}+{len:#x}: {e}")
        })?;
        log::debug!("memory slot {slot}: {gpa:#x}+{len:#x}");
        Ok(slot)
    }

    fn unmap(&self, slot: u32) {
        if let Err(e) = self.set(slot, 0, 0, 0) {
            log::error!("remove memory slot {slot}: {e}");
            return;
        }
        log::debug!("memory slot {slot} removed");
        self.free
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(slot);
    }
}
