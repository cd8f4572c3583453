//! Per-address-space MMU of the sim engine: a radix page table with 4 KiB and 2 MiB pages.
//!
//! Layout: one directory per GiB of the VA window (allocated on first map), 512 directory entries
//! of 2 MiB each, each empty, a 2 MiB leaf, or a table of 512 4 KiB leaves. A leaf stores the
//! *host* address of its page (VRAM or a registered host region), the target slot, and the
//! permission, so a translation is three indexed loads and no locking. The tables are immutable
//! while a job runs (the engine hands jobs an `Arc<Mmu>` and refuses `map`/`unmap` meanwhile).
//!
//! Overlapping maps are rejected (all-or-nothing): the shadow-page-table builder unmaps first.

use std::collections::HashMap;
use std::sync::Arc;

use super::dirty::SimDirtyLog;
use super::flags::FlagPage;
use crate::engine::{AccessKind, FaultKind, PageSize, Perm, VaWindow};

pub use crate::engine::MapError as MmuError;

const SHIFT_4K: u32 = 12;
const SHIFT_2M: u32 = 21;
const SHIFT_1G: u32 = 30;
const SIZE_4K: u64 = 1 << SHIFT_4K;
const SIZE_2M: u64 = 1 << SHIFT_2M;
const ENTRIES: usize = 512;

const PTE_PRESENT: u64 = 1;
const PTE_WRITE: u64 = 2;
const PTE_SLOT_SHIFT: u32 = 2;
const PTE_SLOT_MASK: u64 = 0x3ff;
/// Largest target slot a PTE can name (slot 0 is VRAM, 1.. are host regions).
pub const MAX_SLOT: u16 = PTE_SLOT_MASK as u16;

/// A leaf: host page address | slot << 2 | write << 1 | present. Zero is "not present".
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Pte(u64);

impl Pte {
    fn new(host: usize, slot: u16, perm: Perm) -> Self {
        let w = if perm == Perm::ReadWrite {
            PTE_WRITE
        } else {
            0
        };
        Pte(host as u64 | (u64::from(slot) & PTE_SLOT_MASK) << PTE_SLOT_SHIFT | w | PTE_PRESENT)
    }
    fn present(self) -> bool {
        self.0 & PTE_PRESENT != 0
    }
    fn writable(self) -> bool {
        self.0 & PTE_WRITE != 0
    }
    fn host(self) -> usize {
        (self.0 & !(SIZE_4K - 1)) as usize
    }
    fn slot(self) -> u16 {
        ((self.0 >> PTE_SLOT_SHIFT) & PTE_SLOT_MASK) as u16
    }
    fn perm(self) -> Perm {
        if self.writable() {
            Perm::ReadWrite
        } else {
            Perm::ReadOnly
        }
    }
}

#[derive(Debug, Clone, Default)]
enum Pde {
    #[default]
    Empty,
    Large(Pte),
    /// 4 KiB leaves and how many are present (never zero: empty tables are freed).
    Table(Box<[Pte; ENTRIES]>, u16),
}

type Dir = [Pde; ENTRIES];

/// Where a mapping's pages land in host memory: a target slot and its host range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TargetMem {
    /// Slot stored in the PTEs (0 = VRAM, 1.. = host regions).
    pub slot: u16,
    /// Host address of the target memory's first byte (4 KiB aligned).
    pub host_base: usize,
    /// Size of the target memory in bytes.
    pub size: u64,
}

/// What a VA resolves to, for inspection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    /// Target slot.
    pub slot: u16,
    /// Host address of the byte at the VA.
    pub host: usize,
    /// Permission.
    pub perm: Perm,
    /// Page size of the mapping.
    pub page_size: PageSize,
}

/// A page table for one VA window.
#[derive(Debug, Clone)]
pub struct Mmu {
    window: VaWindow,
    dirs: Vec<Option<Box<Dir>>>,
    /// Mapped bytes per target slot (for refusing to unregister a mapped host region).
    slot_bytes: HashMap<u16, u64>,
    /// The engine's dirty log: pages translated for writing are marked in it while it is on.
    log: Option<Arc<SimDirtyLog>>,
    /// The engine's flag words (`sim::flags`), seen at their VA outside the window, and the
    /// space (`SpaceId.0`) whose words this table reaches.
    flags: Option<(Arc<FlagPage>, u64)>,
}

impl Mmu {
    /// An empty table for `window`. The caller validated the window (2 MiB aligned, non-empty,
    /// no overflow); the table itself allocates one pointer per GiB of window.
    pub fn new(window: VaWindow) -> Self {
        let n = window.size.div_ceil(1 << SHIFT_1G) as usize;
        Self {
            window,
            dirs: vec![None; n],
            slot_bytes: HashMap::new(),
            log: None,
            flags: None,
        }
    }

    /// As [`Mmu::new`], marking written pages in `log` while it is on, and translating the
    /// engine's flag words (`flags`) of `space` at their VA.
    pub(crate) fn with_log(
        window: VaWindow,
        log: Arc<SimDirtyLog>,
        flags: Arc<FlagPage>,
        space: u64,
    ) -> Self {
        Self {
            log: Some(log),
            flags: Some((flags, space)),
            ..Self::new(window)
        }
    }

    /// The VA window.
    pub fn window(&self) -> VaWindow {
        self.window
    }

    /// Bytes mapped onto `slot`.
    pub fn bytes_on_slot(&self, slot: u16) -> u64 {
        self.slot_bytes.get(&slot).copied().unwrap_or(0)
    }

    /// Bytes mapped in total.
    pub fn mapped_bytes(&self) -> u64 {
        self.slot_bytes.values().sum()
    }

    fn window_offset(&self, va: u64, len: u64) -> Result<u64, MmuError> {
        let off = va.checked_sub(self.window.base);
        match off {
            Some(off) if len <= self.window.size && off <= self.window.size - len => Ok(off),
            _ => Err(MmuError::OutOfWindow { va, len }),
        }
    }

    /// Maps `len` bytes at `va` onto `target` memory starting at `offset`, in pages of
    /// `page_size`. Rejects overlaps; all-or-nothing.
    pub fn map(
        &mut self,
        va: u64,
        len: u64,
        target: TargetMem,
        offset: u64,
        perm: Perm,
        page_size: PageSize,
    ) -> Result<(), MmuError> {
        let page = page_size.bytes();
        if len == 0 {
            return Err(MmuError::ZeroLength);
        }
        for (what, value) in [("VA", va), ("length", len), ("target offset", offset)] {
            if value % page != 0 {
                return Err(MmuError::Misaligned { what, value, page });
            }
        }
        let start = self.window_offset(va, len)?;
        match offset.checked_add(len) {
            Some(end) if end <= target.size => {}
            _ => {
                return Err(MmuError::TargetRange {
                    offset,
                    len,
                    size: target.size,
                });
            }
        }
        // Host addresses of every page fit: host_base + size was a valid allocation.
        if !target.host_base.is_multiple_of(SIZE_4K as usize) {
            return Err(MmuError::Misaligned {
                what: "target host base",
                value: target.host_base as u64,
                page: SIZE_4K,
            });
        }
        // Pass 1: overlaps.
        let mut off = start;
        while off < start + len {
            let busy = match self.pde(off) {
                None | Some(Pde::Empty) => false,
                Some(Pde::Large(_)) => true,
                Some(Pde::Table(t, _)) => match page_size {
                    PageSize::Size2M => true,
                    PageSize::Size4K => t[idx4k(off)].present(),
                },
            };
            if busy {
                return Err(MmuError::Overlap(self.window.base + off));
            }
            off += page;
        }
        // Pass 2: install.
        let mut off = start;
        let mut host = target.host_base + offset as usize;
        while off < start + len {
            let pte = Pte::new(host, target.slot, perm);
            let Some(pde) = self.pde_mut(off) else {
                return Err(MmuError::OutOfWindow { va, len });
            };
            match page_size {
                PageSize::Size2M => *pde = Pde::Large(pte),
                PageSize::Size4K => {
                    if matches!(pde, Pde::Empty) {
                        *pde = Pde::Table(Box::new([Pte::default(); ENTRIES]), 0);
                    }
                    if let Pde::Table(t, n) = pde {
                        t[idx4k(off)] = pte;
                        *n += 1;
                    }
                }
            }
            off += page;
            host += page as usize;
        }
        *self.slot_bytes.entry(target.slot).or_insert(0) += len;
        Ok(())
    }

    /// Unmaps every page inside `va..va+len` (4 KiB aligned), skipping holes. A 2 MiB page
    /// that straddles an end of the range is an error and nothing changes. Returns bytes
    /// unmapped.
    pub fn unmap(&mut self, va: u64, len: u64) -> Result<u64, MmuError> {
        for (what, value) in [("VA", va), ("length", len)] {
            if value % SIZE_4K != 0 {
                return Err(MmuError::Misaligned {
                    what,
                    value,
                    page: SIZE_4K,
                });
            }
        }
        let start = self.window_offset(va, len)?;
        if len == 0 {
            return Ok(0);
        }
        let end = start + len;
        // Pass 1: large pages must be wholly inside.
        let mut off = start & !(SIZE_2M - 1);
        while off < end {
            if let Some(Pde::Large(_)) = self.pde(off)
                && (off < start || off + SIZE_2M > end)
            {
                return Err(MmuError::SplitsLargePage(self.window.base + off));
            }
            off += SIZE_2M;
        }
        // Pass 2: remove.
        let mut removed = 0;
        let mut off = start;
        while off < end {
            let dir_i = (off >> SHIFT_1G) as usize;
            let Some(Some(dir)) = self.dirs.get_mut(dir_i) else {
                off = ((off >> SHIFT_1G) + 1) << SHIFT_1G;
                continue;
            };
            let pde = &mut dir[idx2m(off)];
            let step = match pde {
                Pde::Empty => SIZE_2M - (off & (SIZE_2M - 1)),
                Pde::Large(pte) => {
                    let slot = pte.slot();
                    *pde = Pde::Empty;
                    sub_slot(&mut self.slot_bytes, slot, SIZE_2M);
                    removed += SIZE_2M;
                    SIZE_2M
                }
                Pde::Table(t, n) => {
                    let pte = &mut t[idx4k(off)];
                    if pte.present() {
                        let slot = pte.slot();
                        *pte = Pte::default();
                        *n -= 1;
                        sub_slot(&mut self.slot_bytes, slot, SIZE_4K);
                        removed += SIZE_4K;
                    }
                    if *n == 0 {
                        *pde = Pde::Empty;
                    }
                    SIZE_4K
                }
            };
            off = off.saturating_add(step);
        }
        // Free directories that became empty.
        let first = (start >> SHIFT_1G) as usize;
        let last = (end.saturating_sub(1) >> SHIFT_1G) as usize;
        for d in self.dirs.iter_mut().take(last + 1).skip(first) {
            if d.as_ref()
                .is_some_and(|dir| dir.iter().all(|p| matches!(p, Pde::Empty)))
            {
                *d = None;
            }
        }
        Ok(removed)
    }

    fn pde(&self, off: u64) -> Option<&Pde> {
        let dir = self.dirs.get((off >> SHIFT_1G) as usize)?.as_deref()?;
        Some(&dir[idx2m(off)])
    }

    /// The entry for window offset `off`, allocating its directory; `None` past the window
    /// (callers check the window first, so that does not happen).
    fn pde_mut(&mut self, off: u64) -> Option<&mut Pde> {
        let slot = self.dirs.get_mut((off >> SHIFT_1G) as usize)?;
        let dir = slot.get_or_insert_with(|| Box::new(std::array::from_fn(|_| Pde::Empty)));
        Some(&mut dir[idx2m(off)])
    }

    /// Resolves `va` for `access`: the host address of the byte and how many bytes after it
    /// stay in the same page, or why it faults. This is the hot path of every kernel access.
    #[inline]
    pub fn translate(&self, va: u64, access: AccessKind) -> Result<(usize, usize), FaultKind> {
        let off = va.wrapping_sub(self.window.base);
        if off >= self.window.size {
            // The engine's flag words (write-set validation), outside every window.
            if let Some(span) = self.flags.as_ref().and_then(|(f, sp)| f.span(va, *sp)) {
                return Ok(span);
            }
            return Err(FaultKind::OutOfWindow);
        }
        let Some(Some(dir)) = self.dirs.get((off >> SHIFT_1G) as usize) else {
            return Err(FaultKind::Unmapped);
        };
        let (pte, page) = match &dir[idx2m(off)] {
            Pde::Empty => return Err(FaultKind::Unmapped),
            Pde::Large(pte) => (*pte, SIZE_2M),
            Pde::Table(t, _) => (t[idx4k(off)], SIZE_4K),
        };
        if !pte.present() {
            return Err(FaultKind::Unmapped);
        }
        if access != AccessKind::Read && !pte.writable() {
            return Err(FaultKind::ReadOnly);
        }
        let in_page = (off & (page - 1)) as usize;
        let host = pte.host() + in_page;
        if access != AccessKind::Read
            && let Some(log) = &self.log
            && log.on()
        {
            // The caller may cache the span (the interpreter's TLB): no more than the marked
            // 4 KiB page, so that the log stays exact under 2 MiB pages.
            log.mark(pte.slot(), host, 1);
            let rest = SIZE_4K as usize - (host & (SIZE_4K as usize - 1));
            return Ok((host, rest));
        }
        Ok((host, page as usize - in_page))
    }

    /// What `va` maps to, if anything.
    pub fn resolve(&self, va: u64) -> Option<Resolved> {
        let off = va.wrapping_sub(self.window.base);
        if off >= self.window.size {
            return None;
        }
        let (pte, page_size) = match self.pde(off)? {
            Pde::Empty => return None,
            Pde::Large(pte) => (*pte, PageSize::Size2M),
            Pde::Table(t, _) => (t[idx4k(off)], PageSize::Size4K),
        };
        if !pte.present() {
            return None;
        }
        let in_page = (off & (page_size.bytes() - 1)) as usize;
        Some(Resolved {
            slot: pte.slot(),
            host: pte.host() + in_page,
            perm: pte.perm(),
            page_size,
        })
    }
}

fn sub_slot(map: &mut HashMap<u16, u64>, slot: u16, bytes: u64) {
    if let Some(v) = map.get_mut(&slot) {
        *v = v.saturating_sub(bytes);
        if *v == 0 {
            map.remove(&slot);
        }
    }
}

fn idx2m(off: u64) -> usize {
    ((off >> SHIFT_2M) as usize) & (ENTRIES - 1)
}

fn idx4k(off: u64) -> usize {
    ((off >> SHIFT_4K) as usize) & (ENTRIES - 1)
}

#[cfg(test)]
#[path = "mmu_tests.rs"]
mod tests;
