//! Direct access to guest RAM for the worker's own small reads and writes in a channel's
//! address space (GPFIFO entries, pushbuffer segments, launch text, names and parameters,
//! semaphores): where the space maps the bytes to the VM's RAM, they are read or written there
//! through the VMM's mapping instead of through the engine (for a real GPU every engine copy is
//! a driver call and a synchronisation, tens of microseconds per submission). The mappings are
//! the ones the engine was given (validated then), so the same bytes are reached; anything
//! else (VRAM, unmapped, read-only for a write, a range across two mappings) goes to the
//! engine, which reports faults as before.

use pgpu::{MapTarget, Mapping, Perm, SpaceId};
use shadow::SysmemMap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

/// Guest RAM and its engine host regions, plus the mappings of the space last used.
pub struct Direct {
    ram: GuestMemoryMmap,
    sysmem: SysmemMap,
    /// (space, generation of the spaces it was copied at) of `maps`.
    key: Option<(SpaceId, u64)>,
    maps: Vec<Mapping>,
    /// Reads and writes served here (the rest went to the engine).
    pub hits: u64,
    /// Where writes are noted while a live snapshot logs them.
    pub log: Option<std::sync::Arc<crate::snapshot::live::RamWriteLog>>,
}

impl Direct {
    pub fn new(ram: GuestMemoryMmap, sysmem: SysmemMap) -> Self {
        Direct {
            ram,
            sysmem,
            key: None,
            maps: Vec::new(),
            hits: 0,
            log: None,
        }
    }

    /// Makes `maps` (sorted by VA) the mappings of `space` as of `generation`, unless they
    /// already are (`maps` is called only then).
    pub fn use_space<'a>(
        &mut self,
        space: SpaceId,
        generation: u64,
        maps: impl FnOnce() -> Option<&'a [Mapping]>,
    ) {
        if self.key == Some((space, generation)) {
            return;
        }
        self.maps = maps().map(<[Mapping]>::to_vec).unwrap_or_default();
        self.key = Some((space, generation));
    }

    /// The guest-physical address of `[va, va + len)` if one mapping of the current space maps
    /// all of it to guest RAM (and allows writes, for a write).
    fn resolve(&self, space: SpaceId, va: u64, len: u64, write: bool) -> Option<u64> {
        if self.key.map(|k| k.0) != Some(space) || len == 0 {
            return None;
        }
        let i = self.maps.partition_point(|m| m.va <= va);
        let m = self.maps.get(i.checked_sub(1)?)?;
        let end = va.checked_add(len)?;
        if end > m.va.checked_add(m.len)? || (write && m.perm != Perm::ReadWrite) {
            return None;
        }
        let MapTarget::Host { region, offset } = m.target else {
            return None;
        };
        let off = offset.checked_add(va - m.va)?;
        self.sysmem
            .entries()
            .iter()
            .find(|e| {
                e.region == region
                    && off >= e.offset
                    && off
                        .checked_add(len)
                        .is_some_and(|x| x <= e.offset.saturating_add(e.len))
            })
            .map(|e| e.gpa + (off - e.offset))
    }

    /// Whether `va` of `space` is mapped to system memory (a host region: guest RAM), to VRAM
    /// or not at all (`Some(true)`, `Some(false)`, `None`); `None` too when `space` is not the
    /// current one.
    pub fn maps_to_sysmem(&self, space: SpaceId, va: u64) -> Option<bool> {
        if self.key.map(|k| k.0) != Some(space) {
            return None;
        }
        let i = self.maps.partition_point(|m| m.va <= va);
        let m = self.maps.get(i.checked_sub(1)?)?;
        if va >= m.va.checked_add(m.len)? {
            return None;
        }
        Some(matches!(m.target, MapTarget::Host { .. }))
    }

    /// Reads `buf` at `va` of `space` from guest RAM; false if it cannot (use the engine).
    pub fn read(&mut self, space: SpaceId, va: u64, buf: &mut [u8]) -> bool {
        let ok = self
            .resolve(space, va, buf.len() as u64, false)
            .is_some_and(|gpa| self.ram.read_slice(buf, GuestAddress(gpa)).is_ok());
        self.hits += u64::from(ok);
        ok
    }

    /// Writes `data` at `va` of `space` into guest RAM; false if it cannot (use the engine).
    pub fn write(&mut self, space: SpaceId, va: u64, data: &[u8]) -> bool {
        let gpa = self.resolve(space, va, data.len() as u64, true);
        let ok = gpa.is_some_and(|gpa| self.ram.write_slice(data, GuestAddress(gpa)).is_ok());
        if let (Some(gpa), Some(log), true) = (gpa, &self.log, ok) {
            log.mark(gpa, data.len() as u64);
        }
        self.hits += u64::from(ok);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pgpu::{HostRegionId, PageSize};
    use shadow::SysmemEntry;

    fn direct() -> Direct {
        let ram = GuestMemoryMmap::from_ranges(&[(GuestAddress(0x10_0000), 0x10_0000)]).unwrap();
        // RAM 1 MiB..2 MiB is host region 7 from byte 0x1000 on.
        let sysmem = SysmemMap::new(vec![SysmemEntry {
            gpa: 0x10_0000,
            len: 0x10_0000,
            region: HostRegionId(7),
            offset: 0x1000,
        }])
        .unwrap();
        let mut d = Direct::new(ram, sysmem);
        let map = |va, target, perm| Mapping {
            va,
            len: 0x2000,
            target,
            perm,
            page_size: PageSize::Size4K,
        };
        let maps = vec![
            // VA 0x1000_0000.. → RAM 0x10_2000 (region offset 0x3000).
            map(
                0x1000_0000,
                MapTarget::Host {
                    region: HostRegionId(7),
                    offset: 0x3000,
                },
                Perm::ReadWrite,
            ),
            map(
                0x1000_2000,
                MapTarget::Host {
                    region: HostRegionId(7),
                    offset: 0x5000,
                },
                Perm::ReadOnly,
            ),
            map(0x1000_4000, MapTarget::Vram { pa: 0 }, Perm::ReadWrite),
            map(
                0x1000_6000,
                MapTarget::Host {
                    region: HostRegionId(8),
                    offset: 0,
                },
                Perm::ReadWrite,
            ),
        ];
        d.use_space(SpaceId(1), 0, || Some(&maps));
        d
    }

    #[test]
    fn reaches_guest_ram_only_where_the_space_maps_it_there() {
        let mut d = direct();
        let s = SpaceId(1);
        assert!(d.write(s, 0x1000_0ff8, &0xdead_beef_u64.to_le_bytes()));
        let mut b = [0u8; 8];
        d.ram.read_slice(&mut b, GuestAddress(0x10_2ff8)).unwrap();
        assert_eq!(u64::from_le_bytes(b), 0xdead_beef);
        assert!(d.read(s, 0x1000_0ff8, &mut b));
        // Read-only: read here, writes go to the engine (which faults them).
        assert!(d.read(s, 0x1000_2000, &mut b));
        assert!(!d.write(s, 0x1000_2000, &b));
        // Across two mappings, VRAM, another region, unmapped, another space: the engine's.
        let mut two = [0u8; 16];
        assert!(!d.read(s, 0x1000_1ff8, &mut two));
        assert!(!d.read(s, 0x1000_4000, &mut b));
        assert!(!d.read(s, 0x1000_6000, &mut b));
        assert!(!d.read(s, 0x2000_0000, &mut b));
        assert!(!d.read(SpaceId(2), 0x1000_0000, &mut b));
        assert!(!d.read(s, u64::MAX - 3, &mut b));
        assert_eq!(d.hits, 3);
    }

    #[test]
    fn tells_a_copy_destination_in_system_memory_from_vram() {
        let d = direct();
        let s = SpaceId(1);
        // Guest RAM (read-only too: the copy's own check faults a write), VRAM, unmapped.
        assert_eq!(d.maps_to_sysmem(s, 0x1000_0000), Some(true));
        assert_eq!(d.maps_to_sysmem(s, 0x1000_2fff), Some(true));
        assert_eq!(d.maps_to_sysmem(s, 0x1000_4000), Some(false));
        assert_eq!(d.maps_to_sysmem(s, 0x2000_0000), None);
        assert_eq!(d.maps_to_sysmem(s, 0x0fff_ffff), None);
        // Not the current space: not known.
        assert_eq!(d.maps_to_sysmem(SpaceId(2), 0x1000_0000), None);
    }
}
