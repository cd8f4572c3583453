//! What the guest's GPU looks like (`GpuLayout`) and where its memory really is: the VRAM
//! `Partition` and the `SysmemMap` of guest RAM onto registered host regions.

use pgpu::{HostRegionId, PageSize, VaWindow};

use crate::fault::{Rule, ShadowError};
use crate::types::{Aperture, PAGE_2M, PAGE_4K};

/// Page sizes the virtual GPU offers (the PAGE_SIZES register).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PageSizes {
    /// 4 KiB pages (PTEs).
    pub small: bool,
    /// 2 MiB pages (BIG PDEs).
    pub big: bool,
}

impl PageSizes {
    /// From the PAGE_SIZES register value (bit 0 4 KiB, bit 1 2 MiB).
    pub const fn from_bits(bits: u32) -> Self {
        Self {
            small: bits & 1 != 0,
            big: bits & 2 != 0,
        }
    }

    /// The PAGE_SIZES register value.
    pub const fn bits(self) -> u32 {
        (self.small as u32) | ((self.big as u32) << 1)
    }

    /// What an engine accepts (`EngineInfo::page_sizes`).
    pub fn of_engine(sizes: &[PageSize]) -> Self {
        Self {
            small: sizes.contains(&PageSize::Size4K),
            big: sizes.contains(&PageSize::Size2M),
        }
    }
}

/// One region of guest RAM: guest-physical `[gpa, gpa + len)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RamRegion {
    /// First guest-physical address (4 KiB aligned).
    pub gpa: u64,
    /// Bytes (a non-zero multiple of 4 KiB).
    pub len: u64,
}

impl RamRegion {
    fn end(&self) -> u64 {
        self.gpa.saturating_add(self.len)
    }
}

/// The virtual GPU as the guest sees it (what BAR0's identity registers say).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuLayout {
    /// Bytes of guest VRAM (VRAM_SIZE).
    pub vram_size: u64,
    /// The VM's RAM regions (sorted, non-overlapping), the only valid system-memory targets.
    pub ram: Vec<RamRegion>,
    /// The GPU VA window (VA_BASE, VA_SIZE): 2 MiB aligned.
    pub va: VaWindow,
    /// PAGE_SIZES.
    pub page_sizes: PageSizes,
    /// CAPS bit 2: PDB/PDE/PTE may target system memory.
    pub sysmem: bool,
    /// At most this many faults of one walk are kept (all are counted).
    pub max_faults: usize,
}

impl GpuLayout {
    /// Checks the host-side configuration: VRAM size and RAM regions 4 KiB granular, RAM sorted
    /// and non-overlapping, VA window non-empty, 2 MiB aligned and not wrapping, some page size.
    pub fn validate(&self) -> Result<(), ShadowError> {
        if !self.vram_size.is_multiple_of(PAGE_4K) {
            return Err(ShadowError::Config("VRAM size is not a multiple of 4 KiB"));
        }
        let w = self.va;
        if w.size == 0 || !w.base.is_multiple_of(PAGE_2M) || !w.size.is_multiple_of(PAGE_2M) {
            return Err(ShadowError::Config("VA window empty or not 2 MiB aligned"));
        }
        if w.base.checked_add(w.size).is_none() {
            return Err(ShadowError::Config("VA window wraps around"));
        }
        if !self.page_sizes.small && !self.page_sizes.big {
            return Err(ShadowError::Config("no page size offered"));
        }
        let mut prev_end = 0u64;
        for (i, r) in self.ram.iter().enumerate() {
            if r.len == 0 || !r.gpa.is_multiple_of(PAGE_4K) || !r.len.is_multiple_of(PAGE_4K) {
                return Err(ShadowError::Config("RAM region empty or not 4 KiB aligned"));
            }
            if r.gpa.checked_add(r.len).is_none() {
                return Err(ShadowError::Config("RAM region wraps around"));
            }
            if i > 0 && r.gpa < prev_end {
                return Err(ShadowError::Config("RAM regions unsorted or overlapping"));
            }
            prev_end = r.end();
        }
        Ok(())
    }

    /// Entries of the page directory: VA_SIZE / 2 MiB.
    pub fn pd_entries(&self) -> u64 {
        self.va.size / PAGE_2M
    }

    /// Bytes of the page directory (8 per entry).
    pub fn pd_bytes(&self) -> u64 {
        self.pd_entries().saturating_mul(8)
    }

    /// The RAM region holding all of `[gpa, gpa + len)`, if one does (`len` > 0).
    pub fn ram_region(&self, gpa: u64, len: u64) -> Option<RamRegion> {
        let end = gpa.checked_add(len)?;
        self.ram
            .iter()
            .copied()
            .find(|r| r.gpa <= gpa && end <= r.end() && len > 0)
    }

    /// Whether `[addr, addr + len)` is inside guest VRAM (`Vram`) or inside one RAM region
    /// (`Sysmem`); the error is the range rule broken (`VramRange` / `SysmemRange`).
    pub fn check_range(&self, aperture: Aperture, addr: u64, len: u64) -> Result<(), Rule> {
        match aperture {
            Aperture::Vram => match addr.checked_add(len) {
                Some(end) if len > 0 && end <= self.vram_size => Ok(()),
                _ => Err(Rule::VramRange),
            },
            Aperture::Sysmem => match self.ram_region(addr, len) {
                Some(_) => Ok(()),
                None => Err(Rule::SysmemRange),
            },
        }
    }

    /// Whether `[va, va + len)` lies inside the VA window (`len` > 0).
    pub fn va_contains(&self, va: u64, len: u64) -> bool {
        match (va.checked_add(len), self.va.base.checked_add(self.va.size)) {
            (Some(end), Some(wend)) => len > 0 && va >= self.va.base && end <= wend,
            _ => false,
        }
    }
}

/// The VM's slice of physical VRAM: guest VRAM `[0, size)` is physical `[pa_base, pa_base+size)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Partition {
    pa_base: u64,
    size: u64,
}

impl Partition {
    /// A partition; `pa_base` and `size` must be 4 KiB multiples (2 MiB ones let big pages use
    /// 2 MiB engine pages) and the range must not wrap.
    pub fn new(pa_base: u64, size: u64) -> Result<Self, ShadowError> {
        if !pa_base.is_multiple_of(PAGE_4K) || !size.is_multiple_of(PAGE_4K) {
            return Err(ShadowError::Config("partition not 4 KiB aligned"));
        }
        if pa_base.checked_add(size).is_none() {
            return Err(ShadowError::Config("partition wraps around"));
        }
        Ok(Self { pa_base, size })
    }

    /// First physical address.
    pub const fn pa_base(&self) -> u64 {
        self.pa_base
    }

    /// Bytes.
    pub const fn size(&self) -> u64 {
        self.size
    }

    /// Physical address of guest VRAM `[addr, addr + len)`, if all of it is in the partition.
    pub fn to_phys(&self, addr: u64, len: u64) -> Option<u64> {
        let end = addr.checked_add(len)?;
        (end <= self.size).then_some(self.pa_base + addr)
    }
}

/// Guest RAM `[gpa, gpa + len)` is host region `region` from byte `offset` on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SysmemEntry {
    /// First guest-physical address (4 KiB aligned).
    pub gpa: u64,
    /// Bytes (non-zero, 4 KiB multiple).
    pub len: u64,
    /// The engine's host region.
    pub region: HostRegionId,
    /// Byte offset of `gpa` in the region (4 KiB aligned).
    pub offset: u64,
}

/// Guest RAM regions → registered engine host regions (for system-memory PTEs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SysmemMap {
    entries: Vec<SysmemEntry>,
}

impl SysmemMap {
    /// A map of `entries` (sorted here; they must be 4 KiB aligned and not overlap).
    pub fn new(mut entries: Vec<SysmemEntry>) -> Result<Self, ShadowError> {
        entries.sort_by_key(|e| e.gpa);
        let mut prev_end = 0u64;
        for (i, e) in entries.iter().enumerate() {
            let aligned = [e.gpa, e.len, e.offset]
                .iter()
                .all(|v| v.is_multiple_of(PAGE_4K));
            if e.len == 0 || !aligned {
                return Err(ShadowError::Config(
                    "sysmem entry empty or not 4 KiB aligned",
                ));
            }
            let Some(end) = e.gpa.checked_add(e.len) else {
                return Err(ShadowError::Config("sysmem entry wraps around"));
            };
            if e.offset.checked_add(e.len).is_none() {
                return Err(ShadowError::Config("sysmem entry offset wraps around"));
            }
            if i > 0 && e.gpa < prev_end {
                return Err(ShadowError::Config("sysmem entries overlap"));
            }
            prev_end = end;
        }
        Ok(Self { entries })
    }

    /// The entries, sorted by guest-physical address.
    pub fn entries(&self) -> &[SysmemEntry] {
        &self.entries
    }

    /// The entry holding `gpa`.
    pub fn entry_at(&self, gpa: u64) -> Option<SysmemEntry> {
        let i = self.entries.partition_point(|e| e.gpa <= gpa);
        let e = *self.entries.get(i.checked_sub(1)?)?;
        (gpa - e.gpa < e.len).then_some(e)
    }

    /// Host region and offset of guest RAM `[gpa, gpa + len)`, if one entry holds all of it.
    pub fn lookup(&self, gpa: u64, len: u64) -> Option<(HostRegionId, u64)> {
        let e = self.entry_at(gpa)?;
        let d = gpa - e.gpa;
        (d.checked_add(len)? <= e.len).then_some((e.region, e.offset + d))
    }

    /// First entry starting above `gpa` (for skipping a hole).
    pub(crate) fn next_start_after(&self, gpa: u64) -> Option<u64> {
        let i = self.entries.partition_point(|e| e.gpa <= gpa);
        self.entries.get(i).map(|e| e.gpa)
    }
}
