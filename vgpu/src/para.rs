//! The para-virtual interface (`--gpu mode=para`; docs/hardware.md, "Para-virtual interface"):
//! the BAR3 registers, the hypercall argument area in guest RAM, and the para-managed address
//! spaces channels run in. Entries are validated once, at map time, with the `shadow` layout's
//! range rules and `shadow::translate` (the host never walks guest page tables in this mode).
//!
//! The BAR3 registers and the hypercall itself are in `para_bar`.
//!
//! Coordination with the worker: the spaces live in one `Mutex<ParaSpaces>`; the worker holds
//! it for a whole turn of a channel (fetch, methods, jobs), so a hypercall that changes a space
//! waits until the running job has ended, and a job never sees a half-applied batch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use pgpu::{Engine, PageSize, SpaceId};
use serde::Serialize;
use shadow::{
    Aperture, FaultKind, GpuLayout, GuestMapping, GuestTarget, Instance, PAGE_2M, PAGE_4K,
    Partition, Pdb, Rule, ShadowSpace, SysmemMap,
};

/// BAR3's registers, the argument area, operations and status codes: `vgpu-hw`'s definitions.
pub use vgpu_hw::para::*;
/// The result block of the argument area (STATUS, INDEX, KIND, ADDR) starts at STATUS.
pub const OFF_RESULT: u64 = OFF_STATUS;

use vgpu_hw::pte::{BIG, READ_ONLY, RESERVED as ENTRY_RESERVED, TARGET_MASK};

/// Why an entry was refused: a `shadow` rule, or one only the para interface has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Why {
    Rule(Rule),
    /// VA not aligned to the entry's page size.
    VaMisaligned,
    /// The range is not inside the VA window.
    VaOutsideWindow,
    /// PAGES is 0.
    NoPages,
}

/// The first failing entry of a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryFault {
    pub index: u32,
    pub kind: FaultKind,
    pub why: Why,
    /// The GPU VA involved.
    pub va: u64,
}

/// Why a call failed (its STATUS).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    #[error("bad call: {0}")]
    BadCall(&'static str),
    #[error("entry {} refused: kind {} ({:?}) at VA {:#x}", .0.index, .0.kind.code(), .0.why, .0.va)]
    Entry(EntryFault),
    #[error("the address space would hold more than {MAX_RUNS} runs")]
    Limit,
    #[error("host: {0}")]
    Host(String),
    #[error("no VRAM block of that size and alignment is free")]
    NoMemory,
}

impl CallError {
    pub(crate) fn status(&self) -> u32 {
        match self {
            CallError::BadCall(_) => ST_BAD_CALL,
            CallError::Entry(_) => ST_ENTRY_FAULT,
            CallError::Limit => ST_LIMIT,
            CallError::Host(_) => ST_HOST_ERROR,
            CallError::NoMemory => ST_NO_MEMORY,
        }
    }
}

/// One validated change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Map(GuestMapping),
    Unmap { va: u64, len: u64 },
}

/// Counters of the para interface (`--stats`).
#[derive(Debug, Clone, Default, Serialize)]
pub struct ParaCounters {
    /// CALL writes.
    pub hypercalls: u64,
    /// Calls refused (any STATUS other than OK).
    pub refused: u64,
    /// Entries applied.
    pub entries: u64,
    /// Engine pages mapped / unmapped by the calls.
    pub pages_mapped: u64,
    pub pages_unmapped: u64,
}

struct Space {
    shadow: ShadowSpace,
    /// What the guest mapped: sorted, non-overlapping, adjacent compatible runs merged.
    runs: Vec<GuestMapping>,
}

/// The para-managed address spaces of one VM.
pub struct ParaSpaces {
    engine: Arc<dyn Engine>,
    pub(crate) layout: GpuLayout,
    partition: Partition,
    sysmem: SysmemMap,
    engine_pages: Vec<PageSize>,
    spaces: HashMap<Pdb, Space>,
    current: Option<Pdb>,
    pub counters: ParaCounters,
    /// Bumped whenever a space's mappings may have changed.
    generation: u64,
}

pub(crate) fn u64_at(b: &[u8], o: usize) -> u64 {
    let mut x = [0u8; 8];
    if let Some(s) = b.get(o..o + 8) {
        x.copy_from_slice(s);
    }
    u64::from_le_bytes(x)
}

pub(crate) fn u32_at(b: &[u8], o: usize) -> u32 {
    let mut x = [0u8; 4];
    if let Some(s) = b.get(o..o + 4) {
        x.copy_from_slice(s);
    }
    u32::from_le_bytes(x)
}

/// Removes `[va, va + len)` from sorted, non-overlapping `runs` (splitting runs it cuts).
pub fn remove_range(runs: &mut Vec<GuestMapping>, va: u64, len: u64) {
    let end = va.saturating_add(len);
    let first = runs.partition_point(|m| m.va.saturating_add(m.len) <= va);
    let last = first + runs[first..].partition_point(|m| m.va < end);
    if first == last {
        return;
    }
    let mut keep = Vec::with_capacity(2);
    if let Some(m) = runs.get(first)
        && m.va < va
    {
        keep.push(GuestMapping {
            len: va - m.va,
            ..*m
        });
    }
    if let Some(m) = runs.get(last - 1) {
        let mend = m.va.saturating_add(m.len);
        if mend > end
            && let Some(target) = m.target.offset(end - m.va)
        {
            keep.push(GuestMapping {
                va: end,
                len: mend - end,
                target,
                read_only: m.read_only,
            });
        }
    }
    runs.splice(first..last, keep);
}

fn continues(a: &GuestMapping, b: &GuestMapping) -> bool {
    a.va.checked_add(a.len) == Some(b.va)
        && a.read_only == b.read_only
        && a.target.offset(a.len) == Some(b.target)
}

/// Inserts `g` (which overlaps nothing in `runs`), merging it with contiguous neighbours.
pub fn insert_run(runs: &mut Vec<GuestMapping>, g: GuestMapping) {
    let mut i = runs.partition_point(|m| m.va < g.va);
    runs.insert(i, g);
    if i + 1 < runs.len() && continues(&runs[i], &runs[i + 1]) {
        runs[i].len += runs[i + 1].len;
        runs.remove(i + 1);
    }
    if i > 0 && continues(&runs[i - 1], &runs[i]) {
        runs[i - 1].len += runs[i].len;
        runs.remove(i);
        i -= 1;
    }
    let _ = i;
}

/// Applies validated changes in order to a copy of `runs`.
pub fn apply(runs: &[GuestMapping], ops: &[Op]) -> Vec<GuestMapping> {
    let mut out = runs.to_vec();
    for op in ops {
        match *op {
            Op::Map(g) => {
                remove_range(&mut out, g.va, g.len);
                insert_run(&mut out, g);
            }
            Op::Unmap { va, len } => remove_range(&mut out, va, len),
        }
    }
    out
}

impl ParaSpaces {
    pub fn new(
        engine: Arc<dyn Engine>,
        layout: GpuLayout,
        partition: Partition,
        sysmem: SysmemMap,
    ) -> Self {
        let engine_pages = engine.info().page_sizes.clone();
        ParaSpaces {
            engine,
            layout,
            partition,
            sysmem,
            engine_pages,
            spaces: HashMap::new(),
            current: None,
            counters: ParaCounters::default(),
            generation: 0,
        }
    }

    /// Validates entry `index` (24 bytes) of a MAP/MAP_BATCH (`unmap` false) or UNMAP_BATCH.
    pub fn decode(&self, index: u32, e: &[u8], unmap: bool) -> Result<Op, EntryFault> {
        let (va, pte, pages, reserved) = (u64_at(e, 0), u64_at(e, 8), u32_at(e, 16), u32_at(e, 20));
        let fault = |kind, why, va| EntryFault {
            index,
            kind,
            why,
            va,
        };
        let bad = |why| fault(FaultKind::BadEntry, why, va);
        if reserved != 0 || (unmap && pte & !BIG != 0) {
            return Err(bad(Why::Rule(Rule::EntryReserved)));
        }
        let big = pte & BIG != 0;
        let ps = self.layout.page_sizes;
        if (big && !ps.big) || (!big && !ps.small) {
            return Err(bad(Why::Rule(Rule::PageSizeUnsupported)));
        }
        let page = if big { PAGE_2M } else { PAGE_4K };
        if pages == 0 {
            return Err(bad(Why::NoPages));
        }
        if !va.is_multiple_of(page) {
            return Err(bad(Why::VaMisaligned));
        }
        let len = u64::from(pages) * page;
        if !self.layout.va_contains(va, len) {
            return Err(bad(Why::VaOutsideWindow));
        }
        // Target, reserved bits and the range: the rules of a PTE / BIG PDE.
        let aperture = match pte & TARGET_MASK {
            0 => return Ok(Op::Unmap { va, len }),
            t => Aperture::from_target(t).ok_or(bad(Why::Rule(Rule::ReservedTarget)))?,
        };
        if pte & ENTRY_RESERVED != 0 {
            return Err(bad(Why::Rule(Rule::EntryReserved)));
        }
        if aperture == Aperture::Sysmem && !self.layout.sysmem {
            return Err(bad(Why::Rule(Rule::SysmemUnsupported)));
        }
        let addr = pte & !0xfff;
        if big && !addr.is_multiple_of(PAGE_2M) {
            return Err(bad(Why::Rule(Rule::BigPageMisaligned)));
        }
        if let Err(rule) = self.layout.check_range(aperture, addr, len) {
            let kind = match aperture {
                Aperture::Vram => FaultKind::PteVramRange,
                Aperture::Sysmem => FaultKind::PteSysmemRange,
            };
            return Err(fault(kind, Why::Rule(rule), va));
        }
        let g = GuestMapping {
            va,
            len,
            target: GuestTarget::new(aperture, addr),
            read_only: pte & READ_ONLY != 0,
        };
        // What the host can back (partition, registered RAM): the translation's own rules.
        let t = shadow::translate(&[g], &self.partition, &self.sysmem, &self.engine_pages);
        if let Some(f) = t.faults.first() {
            return Err(fault(f.kind, Why::Rule(f.rule), f.addr));
        }
        Ok(Op::Map(g))
    }

    /// The PDB value `raw` (as SET_PD takes it) if the instance block's PDB rules accept it.
    pub fn check_pdb(&self, raw: u64) -> Result<Pdb, CallError> {
        // The instance block's PDB rules, applied to a block that is otherwise valid.
        let mut block = [0u8; shadow::INSTANCE_BYTES];
        block[0..8].copy_from_slice(&raw.to_le_bytes());
        block[8..16].copy_from_slice(&self.layout.va.base.to_le_bytes());
        block[16..20].copy_from_slice(&2u32.to_le_bytes());
        Ok(Instance::parse(&self.layout, 0, &block)
            .map_err(|f| {
                log::debug!("vgpu para: SET_PD {raw:#x}: {f}");
                CallError::BadCall("SET_PD: PDB invalid")
            })?
            .pdb)
    }

    /// SET_PD: validates the PDB as an instance block's, selects it, creates its space if new.
    pub fn set_pd(&mut self, raw: u64) -> Result<Pdb, CallError> {
        let pdb = self.check_pdb(raw)?;
        if !self.spaces.contains_key(&pdb) {
            if self.spaces.len() >= MAX_SPACES {
                return Err(CallError::BadCall("SET_PD: too many page directories"));
            }
            let shadow = ShadowSpace::create(&*self.engine, pdb, self.layout.va)
                .map_err(|e| CallError::Host(e.to_string()))?;
            self.spaces.insert(
                pdb,
                Space {
                    shadow,
                    runs: Vec::new(),
                },
            );
        }
        self.current = Some(pdb);
        Ok(pdb)
    }

    /// Applies validated `ops` to the selected space, all or nothing.
    pub fn commit(&mut self, ops: &[Op]) -> Result<(), CallError> {
        let pdb = self
            .current
            .ok_or(CallError::BadCall("no page directory selected (SET_PD)"))?;
        let engine = self.engine.clone();
        self.generation += 1;
        let sp = self
            .spaces
            .get_mut(&pdb)
            .ok_or(CallError::BadCall("no page directory selected (SET_PD)"))?;
        let runs = apply(&sp.runs, ops);
        if runs.len() > MAX_RUNS {
            return Err(CallError::Limit);
        }
        let t = shadow::translate(&runs, &self.partition, &self.sysmem, &self.engine_pages);
        if let Some(f) = t.faults.first() {
            // Every entry was translated when it was validated: this is a host-side bug.
            return Err(CallError::Host(f.to_string()));
        }
        let stats = sp
            .shadow
            .sync(&*engine, &t.mappings)
            .map_err(|e| CallError::Host(e.to_string()))?;
        sp.runs = runs;
        self.counters.entries += ops.len() as u64;
        self.counters.pages_mapped += stats.mapped_pages;
        self.counters.pages_unmapped += stats.unmapped_pages;
        Ok(())
    }

    /// The engine space of the page directory `pdb`, if the guest set it.
    pub fn space_for(&self, pdb: Pdb) -> Option<SpaceId> {
        self.spaces.get(&pdb).and_then(|s| s.shadow.space())
    }

    /// Changes whenever the mappings of a space may have changed.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The engine mappings of page directory `pdb` (sorted by VA), if the guest set it.
    pub fn installed(&self, pdb: Pdb) -> Option<&[pgpu::Mapping]> {
        self.spaces.get(&pdb).map(|s| s.shadow.installed())
    }

    /// What the selected space holds (guest view), for tests.
    pub fn runs(&self) -> &[GuestMapping] {
        self.current
            .and_then(|p| self.spaces.get(&p))
            .map_or(&[], |s| &s.runs)
    }
}

/// A para-managed space as a snapshot holds it: the PDB value SET_PD took and the guest's runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceImage {
    pub pdb: u64,
    pub runs: Vec<GuestMapping>,
}

/// The raw SET_PD value of `pdb`.
pub fn raw_pdb(pdb: Pdb) -> u64 {
    pdb.addr | pdb.aperture.target_bits()
}

impl ParaSpaces {
    /// The spaces (sorted by PDB), the selected PDB (raw), and the counters (snapshot).
    pub fn export(&self) -> (Vec<SpaceImage>, Option<u64>, ParaCounters) {
        let mut spaces: Vec<_> = self
            .spaces
            .iter()
            .map(|(pdb, s)| SpaceImage {
                pdb: raw_pdb(*pdb),
                runs: s.runs.clone(),
            })
            .collect();
        spaces.sort_by_key(|s| s.pdb);
        (spaces, self.current.map(raw_pdb), self.counters.clone())
    }

    /// Checks a snapshot's space as if the guest had built it with hypercalls: a valid PDB;
    /// sorted, non-overlapping runs (at most `MAX_RUNS`), each 4 KiB aligned inside the VA
    /// window, onto guest VRAM or RAM that exists, that the host can back with its page sizes.
    pub fn check_space(&self, s: &SpaceImage) -> Result<Pdb, String> {
        let pdb = self
            .check_pdb(s.pdb)
            .map_err(|_| format!("page directory {:#x} is not a valid PDB", s.pdb))?;
        if s.runs.len() > MAX_RUNS {
            return Err(format!("{} runs (at most {MAX_RUNS})", s.runs.len()));
        }
        let mut end = 0u64;
        for g in &s.runs {
            let at = |what: &str| format!("run at VA {:#x} (+{:#x}): {what}", g.va, g.len);
            if !g.va.is_multiple_of(PAGE_4K) || !g.len.is_multiple_of(PAGE_4K) || g.len == 0 {
                return Err(at("not 4 KiB aligned or empty"));
            }
            if !self.layout.va_contains(g.va, g.len) {
                return Err(at("outside the VA window"));
            }
            if g.va < end {
                return Err(at("overlaps or precedes the previous run"));
            }
            end = g.va + g.len;
            let target = g.target;
            if !target.addr().is_multiple_of(PAGE_4K) {
                return Err(at("target not 4 KiB aligned"));
            }
            if target.aperture() == Aperture::Sysmem && !self.layout.sysmem {
                return Err(at("system memory target on a GPU without it"));
            }
            if let Err(rule) = self
                .layout
                .check_range(target.aperture(), target.addr(), g.len)
            {
                return Err(at(&format!(
                    "target {:#x} outside the VM's {} ({rule:?})",
                    target.addr(),
                    match target.aperture() {
                        Aperture::Vram => "VRAM partition",
                        Aperture::Sysmem => "RAM",
                    }
                )));
            }
        }
        let t = shadow::translate(&s.runs, &self.partition, &self.sysmem, &self.engine_pages);
        if let Some(f) = t.faults.first() {
            return Err(format!("the host cannot back it: {f}"));
        }
        Ok(pdb)
    }

    /// Rebuilds the spaces of a snapshot (each checked by `check_space` first) into this
    /// freshly created set; on error every space made so far is destroyed again.
    pub fn restore(
        &mut self,
        spaces: &[SpaceImage],
        current: Option<u64>,
        counters: ParaCounters,
    ) -> Result<(), String> {
        if !self.spaces.is_empty() {
            return Err("the para-virtual spaces are not fresh".into());
        }
        let result = self.restore_inner(spaces, current);
        match result {
            Ok(()) => {
                self.counters = counters;
                self.generation += 1;
                Ok(())
            }
            Err(e) => {
                self.clear();
                Err(e)
            }
        }
    }

    fn restore_inner(&mut self, spaces: &[SpaceImage], current: Option<u64>) -> Result<(), String> {
        if spaces.len() > MAX_SPACES {
            return Err(format!("{} spaces (at most {MAX_SPACES})", spaces.len()));
        }
        for s in spaces {
            let pdb = self.check_space(s)?;
            if self.spaces.contains_key(&pdb) {
                return Err(format!("page directory {:#x} saved twice", s.pdb));
            }
            let mut shadow = ShadowSpace::create(&*self.engine, pdb, self.layout.va)
                .map_err(|e| format!("creating space {:#x}: {e}", s.pdb))?;
            let t = shadow::translate(&s.runs, &self.partition, &self.sysmem, &self.engine_pages);
            let synced = shadow.sync(&*self.engine, &t.mappings);
            self.spaces.insert(
                pdb,
                Space {
                    shadow,
                    runs: s.runs.clone(),
                },
            );
            synced.map_err(|e| format!("mapping space {:#x}: {e}", s.pdb))?;
        }
        self.current = match current {
            None => None,
            Some(raw) => {
                let pdb = self
                    .check_pdb(raw)
                    .ok()
                    .filter(|p| self.spaces.contains_key(p))
                    .ok_or_else(|| format!("selected page directory {raw:#x} has no space"))?;
                Some(pdb)
            }
        };
        Ok(())
    }

    /// Destroys every space (a failed restore).
    fn clear(&mut self) {
        for (_, mut s) in self.spaces.drain() {
            if let Err(e) = s.shadow.destroy(&*self.engine) {
                log::warn!("vgpu para: destroy space {:?}: {e}", s.shadow.key());
            }
        }
        self.current = None;
    }
}

impl Drop for ParaSpaces {
    fn drop(&mut self) {
        for s in self.spaces.values_mut() {
            if let Err(e) = s.shadow.destroy(&*self.engine) {
                log::warn!("vgpu para: destroy space {:?}: {e}", s.shadow.key());
            }
        }
    }
}

/// The spaces, shared by the BAR3 front end and the worker.
pub type SharedSpaces = Arc<Mutex<ParaSpaces>>;

/// Locks the spaces (a poisoned lock is still used: the state is valid between calls).
pub fn lock(s: &SharedSpaces) -> MutexGuard<'_, ParaSpaces> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}
