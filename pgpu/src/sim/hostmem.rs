//! Host memory regions registered with (or allocated by) the sim engine (a VM's guest RAM), so
//! that mappings for system-memory PTEs can point at them. Each live region has a small slot number that the MMU
//! stores in its PTEs (slot 0 is VRAM).

use thiserror::Error;

use super::mmu::{MAX_SLOT, TargetMem};
use super::vram::VramRegion;
use crate::engine::HostRegionId;

/// Errors of the region table.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum HostMemError {
    #[error("base or length not 4 KiB aligned, or empty")]
    Misaligned,
    #[error("too many host regions (limit {0})")]
    TooMany(usize),
    #[error("unknown host region {0:?}")]
    Unknown(HostRegionId),
}

const PAGE: usize = 4096;

#[derive(Debug)]
struct Region {
    id: HostRegionId,
    base: usize,
    len: u64,
    /// The memory itself when the engine allocated it (freed with the region).
    _owned: Option<VramRegion>,
}

/// The table of registered regions.
#[derive(Debug, Default)]
pub struct HostRegions {
    /// Index `i` holds slot `i + 1`.
    slots: Vec<Option<Region>>,
    next_id: u64,
}

impl HostRegions {
    /// Adds a region (the caller upholds the validity contract of
    /// `Engine::register_host_region`). At most `limit` regions live at once.
    pub fn register(
        &mut self,
        base: usize,
        len: usize,
        limit: usize,
    ) -> Result<HostRegionId, HostMemError> {
        self.insert(base, len, limit, None)
    }

    /// Adds memory the engine allocated; it is freed when the region is removed.
    pub fn register_owned(
        &mut self,
        mem: VramRegion,
        limit: usize,
    ) -> Result<HostRegionId, HostMemError> {
        let len = usize::try_from(mem.size()).map_err(|_| HostMemError::Misaligned)?;
        self.insert(mem.host_base(), len, limit, Some(mem))
    }

    fn insert(
        &mut self,
        base: usize,
        len: usize,
        limit: usize,
        owned: Option<VramRegion>,
    ) -> Result<HostRegionId, HostMemError> {
        if base == 0 || len == 0 || !base.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
            return Err(HostMemError::Misaligned);
        }
        let limit = limit.min(usize::from(MAX_SLOT));
        let free = self.slots.iter().position(Option::is_none);
        let index = match free {
            Some(i) if i < limit => i,
            _ if self.slots.len() < limit => {
                self.slots.push(None);
                self.slots.len() - 1
            }
            _ => return Err(HostMemError::TooMany(limit)),
        };
        self.next_id += 1;
        let id = HostRegionId(self.next_id);
        self.slots[index] = Some(Region {
            id,
            base,
            len: len as u64,
            _owned: owned,
        });
        Ok(id)
    }

    /// The slot and host range of a region.
    pub fn target(&self, id: HostRegionId) -> Result<TargetMem, HostMemError> {
        self.slots
            .iter()
            .enumerate()
            .find_map(|(i, r)| match r {
                Some(r) if r.id == id => Some(TargetMem {
                    slot: (i + 1) as u16,
                    host_base: r.base,
                    size: r.len,
                }),
                _ => None,
            })
            .ok_or(HostMemError::Unknown(id))
    }

    /// Every live region's slot and host range.
    pub fn targets(&self) -> Vec<TargetMem> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, r)| {
                r.as_ref().map(|r| TargetMem {
                    slot: (i + 1) as u16,
                    host_base: r.base,
                    size: r.len,
                })
            })
            .collect()
    }

    /// The region in `slot`, with its base host address.
    pub fn by_slot(&self, slot: u16) -> Option<(HostRegionId, usize)> {
        let r = self
            .slots
            .get(usize::from(slot).checked_sub(1)?)?
            .as_ref()?;
        Some((r.id, r.base))
    }

    /// Removes a region (the caller checked that no space maps its slot).
    pub fn remove(&mut self, id: HostRegionId) -> Result<(), HostMemError> {
        let slot = self.target(id)?.slot;
        self.slots[usize::from(slot) - 1] = None;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn register_lookup_remove_reuse_slot() {
        let mut t = HostRegions::default();
        assert_eq!(t.register(0x1000, 0x800, 4), Err(HostMemError::Misaligned));
        assert_eq!(t.register(0, 0x1000, 4), Err(HostMemError::Misaligned));
        let a = t.register(0x10000, 0x2000, 2).unwrap();
        let b = t.register(0x20000, 0x1000, 2).unwrap();
        assert_eq!(
            t.register(0x30000, 0x1000, 2),
            Err(HostMemError::TooMany(2))
        );
        assert_eq!(
            t.target(a).unwrap(),
            TargetMem {
                slot: 1,
                host_base: 0x10000,
                size: 0x2000
            }
        );
        assert_eq!(t.target(b).unwrap().slot, 2);
        t.remove(a).unwrap();
        assert_eq!(t.target(a), Err(HostMemError::Unknown(a)));
        assert_eq!(t.remove(a), Err(HostMemError::Unknown(a)));
        let c = t.register(0x30000, 0x1000, 2).unwrap();
        assert_ne!(c, a, "ids are never reused");
        assert_eq!(t.target(c).unwrap().slot, 1, "slots are");
        assert_eq!(t.by_slot(2), Some((b, 0x20000)));
        assert_eq!(t.by_slot(0), None);
        assert_eq!(t.by_slot(9), None);
    }
}
