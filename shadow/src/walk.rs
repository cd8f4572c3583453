//! The page-table walk: reads a guest page directory and its page tables, validates every
//! PDE/PTE (spec: "Page tables") and produces merged guest mappings, faults and the watch set.

use crate::fault::{FaultKind, GuestFault, Rule};
use crate::layout::GpuLayout;
use crate::mem::GuestMem;
use crate::types::{Aperture, GuestMapping, GuestTarget, PAGE_2M, PAGE_4K, Pdb};
use crate::watch::WatchSet;

use vgpu_hw::pte::{
    ADDR_MASK, BIG, PDE_RESERVED, PTE_RESERVED, PTES_PER_TABLE as PTES, READ_ONLY, TARGET_MASK,
};

/// The result of walking one page directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Walk {
    /// Valid mappings, sorted by VA, contiguous runs merged (same aperture, contiguous target,
    /// same permission).
    pub mappings: Vec<GuestMapping>,
    /// The first `GpuLayout::max_faults` faults, in VA order (kinds 3, 4, 5; ADDR = the VA).
    pub faults: Vec<GuestFault>,
    /// All faults found, kept or not.
    pub fault_count: u64,
    /// The pages holding the page directory and every page table that was read.
    pub watch: WatchSet,
}

impl Walk {
    fn fault(&mut self, max: usize, f: GuestFault) {
        self.fault_count += 1;
        if self.faults.len() < max {
            self.faults.push(f);
        }
    }

    fn push(&mut self, va: u64, len: u64, target: GuestTarget, read_only: bool) {
        if let Some(last) = self.mappings.last_mut()
            && last.va.checked_add(last.len) == Some(va)
            && last.read_only == read_only
            && last.target.offset(last.len) == Some(target)
        {
            last.len += len;
            return;
        }
        self.mappings.push(GuestMapping {
            va,
            len,
            target,
            read_only,
        });
    }
}

fn u64_at(bytes: &[u8], i: usize) -> u64 {
    let mut b = [0u8; 8];
    if let Some(s) = bytes.get(i * 8..i * 8 + 8) {
        b.copy_from_slice(s);
    }
    u64::from_le_bytes(b)
}

fn range_kind(aperture: Aperture) -> FaultKind {
    match aperture {
        Aperture::Vram => FaultKind::PteVramRange,
        Aperture::Sysmem => FaultKind::PteSysmemRange,
    }
}

/// Decodes the target of a present entry; `Ok(None)` = not present (target 0).
fn target_of(layout: &GpuLayout, entry: u64, reserved: u64) -> Result<Option<Aperture>, Rule> {
    if entry & TARGET_MASK == 0 {
        return Ok(None);
    }
    let Some(aperture) = Aperture::from_target(entry) else {
        return Err(Rule::ReservedTarget);
    };
    if entry & reserved != 0 {
        return Err(Rule::EntryReserved);
    }
    if aperture == Aperture::Sysmem && !layout.sysmem {
        return Err(Rule::SysmemUnsupported);
    }
    Ok(Some(aperture))
}

/// Walks the page directory at `pdb`.
///
/// Fails (kind 6, ADDR = the PD address) only if the page directory itself is not wholly
/// inside guest VRAM / one RAM region or cannot be read. Every bad PDE/PTE becomes a fault with
/// ADDR = the VA it would have mapped and INFO = its index; its range stays unmapped and the walk
/// goes on. Rules: target 3 → 5; PDE bits 11:4 / PTE bits 2 and 11:4 set → 5; READ_ONLY on a
/// non-BIG PDE → 5; target 2 without CAPS sysmem → 5; BIG without 2 MiB pages, PTE without
/// 4 KiB pages → 5; BIG address not 2 MiB aligned → 5; page (2 MiB or 4 KiB) or page table
/// (4 KiB) not inside guest VRAM → 3, not inside one RAM region → 4.
pub fn walk<M: GuestMem + ?Sized>(
    mem: &M,
    layout: &GpuLayout,
    pdb: Pdb,
) -> Result<Walk, GuestFault> {
    let pd_fault = |rule| GuestFault::new(FaultKind::BadInstance, rule, pdb.addr, 0);
    let pd_bytes = layout.pd_bytes();
    if layout
        .check_range(pdb.aperture, pdb.addr, pd_bytes)
        .is_err()
    {
        return Err(pd_fault(match pdb.aperture {
            Aperture::Vram => Rule::PdOutsideVram,
            Aperture::Sysmem => Rule::PdOutsideRam,
        }));
    }
    let mut pd = vec![0u8; usize::try_from(pd_bytes).map_err(|_| pd_fault(Rule::PdOutsideVram))?];
    mem.read(pdb.aperture, pdb.addr, &mut pd).map_err(|e| {
        log::warn!("page directory at {pdb:?} unreadable: {e}");
        pd_fault(Rule::TableUnreadable)
    })?;
    let mut w = Walk::default();
    w.watch.insert_range(pdb.aperture, pdb.addr, pd_bytes);
    let max = layout.max_faults;
    let mut pt = vec![0u8; PTES * 8];
    for i in 0..pd.len() / 8 {
        let pde = u64_at(&pd, i);
        let va = layout.va.base.wrapping_add(i as u64 * PAGE_2M);
        let info = u32::try_from(i).unwrap_or(u32::MAX);
        let fault = |kind, rule| GuestFault::new(kind, rule, va, info);
        let aperture = match target_of(layout, pde, PDE_RESERVED) {
            Ok(Some(a)) => a,
            Ok(None) => continue,
            Err(rule) => {
                w.fault(max, fault(FaultKind::BadEntry, rule));
                continue;
            }
        };
        let addr = pde & ADDR_MASK;
        let read_only = pde & READ_ONLY != 0;
        if pde & BIG != 0 {
            let bad = if !layout.page_sizes.big {
                Some(Rule::PageSizeUnsupported)
            } else if !addr.is_multiple_of(PAGE_2M) {
                Some(Rule::BigPageMisaligned)
            } else {
                None
            };
            if let Some(rule) = bad {
                w.fault(max, fault(FaultKind::BadEntry, rule));
            } else if let Err(rule) = layout.check_range(aperture, addr, PAGE_2M) {
                w.fault(max, fault(range_kind(aperture), rule));
            } else {
                w.push(va, PAGE_2M, GuestTarget::new(aperture, addr), read_only);
            }
            continue;
        }
        if read_only {
            w.fault(max, fault(FaultKind::BadEntry, Rule::ReadOnlyWithoutBig));
            continue;
        }
        if let Err(rule) = layout.check_range(aperture, addr, PAGE_4K) {
            w.fault(max, fault(range_kind(aperture), rule));
            continue;
        }
        if let Err(e) = mem.read(aperture, addr, &mut pt) {
            log::warn!("page table at {aperture:?} {addr:#x} unreadable: {e}");
            w.fault(max, fault(range_kind(aperture), Rule::TableUnreadable));
            continue;
        }
        w.watch.insert_range(aperture, addr, PAGE_4K);
        walk_table(layout, &pt, va, &mut w);
    }
    if w.fault_count > 0 {
        log::debug!(
            "walk of {pdb:?}: {} mappings, {} faults (first: {})",
            w.mappings.len(),
            w.fault_count,
            w.faults.first().map(|f| f.to_string()).unwrap_or_default()
        );
    }
    Ok(w)
}

/// Validates the 512 PTEs of one page table mapping `va..va + 2 MiB`.
fn walk_table(layout: &GpuLayout, pt: &[u8], va: u64, w: &mut Walk) {
    let max = layout.max_faults;
    for j in 0..PTES {
        let pte = u64_at(pt, j);
        let page_va = va.wrapping_add(j as u64 * PAGE_4K);
        let fault = |kind, rule| GuestFault::new(kind, rule, page_va, j as u32);
        let aperture = match target_of(layout, pte, PTE_RESERVED) {
            Ok(Some(a)) => a,
            Ok(None) => continue,
            Err(rule) => {
                w.fault(max, fault(FaultKind::BadEntry, rule));
                continue;
            }
        };
        if !layout.page_sizes.small {
            w.fault(max, fault(FaultKind::BadEntry, Rule::PageSizeUnsupported));
            continue;
        }
        let addr = pte & ADDR_MASK;
        if let Err(rule) = layout.check_range(aperture, addr, PAGE_4K) {
            w.fault(max, fault(range_kind(aperture), rule));
            continue;
        }
        let target = GuestTarget::new(aperture, addr);
        w.push(page_va, PAGE_4K, target, pte & READ_ONLY != 0);
    }
}
