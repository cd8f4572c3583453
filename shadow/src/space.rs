//! `ShadowSpace`: one engine address space per guest page directory, kept in sync with the
//! wanted shadow mappings by applying only the difference.

use std::time::{Duration, Instant};

use pgpu::{Engine, EngineError, Mapping, PageSize, SpaceId, VaWindow};

use crate::diff::{self, Diff};
use crate::fault::ShadowError;
use crate::types::Pdb;

/// What one `sync` did (for `--stats`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncStats {
    /// Engine pages mapped (4 KiB and 2 MiB pages each count 1).
    pub mapped_pages: u64,
    /// Engine pages unmapped.
    pub unmapped_pages: u64,
    /// Bytes mapped.
    pub mapped_bytes: u64,
    /// Bytes unmapped.
    pub unmapped_bytes: u64,
    /// `unmap` calls made.
    pub unmap_calls: u64,
    /// `map_batch` / `map` calls made.
    pub map_calls: u64,
    /// Whether the whole window was cleared first (first sync after an engine error).
    pub full_rebuild: bool,
    /// Wanted mappings the engine refused (left unmapped), with the reason.
    pub refused: Vec<(Mapping, EngineError)>,
    /// Wall time of the sync.
    pub elapsed: Duration,
}

/// Counters of one shadow space over its life.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpaceCounters {
    /// `sync` calls that succeeded.
    pub syncs: u64,
    /// Syncs that changed the engine's tables.
    pub rebuilds: u64,
    /// Engine pages mapped, in total.
    pub pages_shadowed: u64,
    /// Engine pages unmapped, in total.
    pub pages_unshadowed: u64,
}

/// The shadow of one guest page directory: an engine address space and what is installed in it.
/// Call `destroy` before dropping it (dropping does not reach the engine).
#[derive(Debug)]
pub struct ShadowSpace {
    key: Pdb,
    window: VaWindow,
    space: Option<SpaceId>,
    installed: Vec<Mapping>,
    /// The engine's tables may differ from `installed` (an engine call failed half way): the
    /// next sync clears the window first.
    stale: bool,
    counters: SpaceCounters,
}

fn pages(bytes: [u64; 2]) -> u64 {
    bytes[0] / PageSize::Size4K.bytes() + bytes[1] / PageSize::Size2M.bytes()
}

fn bytes_of(list: &[Mapping]) -> [u64; 2] {
    let mut b = [0u64; 2];
    for m in list {
        b[usize::from(m.page_size == PageSize::Size2M)] += m.len;
    }
    b
}

/// Host bytes charged per byte-sized unit of a shadow (see [`host_bytes_of`]).
mod cost {
    /// A fixed part per space (engine slot, bookkeeping).
    pub const SPACE: u64 = 4 << 10;
    /// One directory pointer per GiB of window.
    pub const PER_GIB_OF_WINDOW: u64 = 8;
    /// A 512-entry directory per GiB of window with anything mapped.
    pub const DIRECTORY: u64 = 8 << 10;
    /// A 512-entry leaf table per 2 MiB region with 4 KiB pages mapped.
    pub const LEAF_TABLE: u64 = 4 << 10;
}

/// Distinct units covered by sorted-or-not inclusive ranges of unit indices.
fn distinct(mut ranges: Vec<(u64, u64)>) -> u64 {
    ranges.sort_unstable();
    let mut n = 0;
    let mut next = 0u64; // first unit not counted yet
    for (a, b) in ranges {
        let a = a.max(next);
        if a <= b {
            n += b - a + 1;
            next = b + 1;
        }
    }
    n
}

/// Host bytes a shadow with `mappings` installed over `window` holds: the installed list and
/// the engine's page tables as the sim engine builds them (a pointer per GiB of window, a
/// directory per GiB touched, a 4 KiB leaf table per 2 MiB region holding 4 KiB pages). What a
/// VM is charged for a shadow space; computable from a plan before anything is installed.
pub fn host_bytes_of(window: VaWindow, mappings: &[Mapping]) -> u64 {
    let mut gib = Vec::with_capacity(mappings.len());
    let mut leaves = Vec::new();
    for m in mappings.iter().filter(|m| m.len > 0) {
        let last = m.va.saturating_add(m.len - 1);
        gib.push((m.va >> 30, last >> 30));
        if m.page_size == PageSize::Size4K {
            leaves.push((m.va >> 21, last >> 21));
        }
    }
    let list = std::mem::size_of_val(mappings) as u64;
    cost::SPACE
        + window.size.div_ceil(1 << 30) * cost::PER_GIB_OF_WINDOW
        + list
        + distinct(gib) * cost::DIRECTORY
        + distinct(leaves) * cost::LEAF_TABLE
}

impl ShadowSpace {
    /// Host bytes this shadow holds now ([`host_bytes_of`] its installed mappings).
    pub fn host_bytes(&self) -> u64 {
        host_bytes_of(self.window, &self.installed)
    }

    /// Creates the engine address space for the page directory `key` over `window`.
    pub fn create<E: Engine + ?Sized>(
        engine: &E,
        key: Pdb,
        window: VaWindow,
    ) -> Result<Self, ShadowError> {
        let space = engine.create_space(window)?;
        log::debug!("shadow space {space:?} for {key:?}");
        Ok(Self {
            key,
            window,
            space: Some(space),
            installed: Vec::new(),
            stale: false,
            counters: SpaceCounters::default(),
        })
    }

    /// The guest page directory this space shadows.
    pub fn key(&self) -> Pdb {
        self.key
    }

    /// The engine address space (jobs of channels using this page directory run in it);
    /// `None` after `destroy`.
    pub fn space(&self) -> Option<SpaceId> {
        self.space
    }

    /// The VA window.
    pub fn window(&self) -> VaWindow {
        self.window
    }

    /// The mappings installed in the engine, sorted by VA.
    pub fn installed(&self) -> &[Mapping] {
        &self.installed
    }

    /// Engine pages installed now.
    pub fn installed_pages(&self) -> u64 {
        pages(bytes_of(&self.installed))
    }

    /// Counters over the space's life.
    pub fn counters(&self) -> SpaceCounters {
        self.counters
    }

    /// Checks and sorts wanted mappings: non-empty, page aligned, inside the window, no overlap.
    fn check(&self, wanted: &[Mapping]) -> Result<Vec<Mapping>, ShadowError> {
        let mut sorted = wanted.to_vec();
        sorted.sort_by_key(|m| m.va);
        let wend = self.window.base.saturating_add(self.window.size);
        let mut prev_end = 0u64;
        for (i, m) in sorted.iter().enumerate() {
            let page = m.page_size.bytes();
            let taddr = match m.target {
                pgpu::MapTarget::Vram { pa } => pa,
                pgpu::MapTarget::Host { offset, .. } => offset,
            };
            let bad = |why| ShadowError::BadMapping { va: m.va, why };
            if m.len == 0 {
                return Err(bad("empty"));
            }
            if !m.va.is_multiple_of(page) || !m.len.is_multiple_of(page) {
                return Err(bad("not aligned to its page size"));
            }
            if !taddr.is_multiple_of(page) {
                return Err(bad("target not aligned to its page size"));
            }
            match m.va.checked_add(m.len) {
                Some(e) if m.va >= self.window.base && e <= wend => {}
                _ => return Err(bad("outside the window")),
            }
            if i > 0 && m.va < prev_end {
                return Err(ShadowError::Overlap(m.va));
            }
            prev_end = diff::end(m);
        }
        Ok(sorted)
    }

    /// Makes the engine's tables equal `wanted` (any order; must not overlap): unmaps what
    /// vanished or changed, maps what is new, in one `map_batch`. Mappings the engine refuses
    /// individually are left out and listed in `SyncStats::refused`. On `Err` (space busy,
    /// destroyed) the next sync starts by clearing the whole window.
    pub fn sync<E: Engine + ?Sized>(
        &mut self,
        engine: &E,
        wanted: &[Mapping],
    ) -> Result<SyncStats, ShadowError> {
        let t0 = Instant::now();
        let space = self.space.ok_or(ShadowError::Destroyed)?;
        let wanted = self.check(wanted)?;
        let mut stats = SyncStats::default();
        if self.stale {
            let bytes = engine.unmap(space, self.window.base, self.window.size)?;
            log::debug!("shadow space {space:?}: cleared {bytes:#x} bytes after an error");
            stats.unmap_calls += 1;
            stats.full_rebuild = true;
            self.installed.clear();
            self.stale = false;
        }
        let Diff {
            unmap,
            unmap_bytes,
            map,
        } = diff::diff(&self.installed, &wanted);
        for &(va, len) in &unmap {
            stats.unmap_calls += 1;
            if let Err(e) = engine.unmap(space, va, len) {
                self.stale = true;
                return Err(e.into());
            }
        }
        stats.unmapped_pages = pages(unmap_bytes);
        stats.unmapped_bytes = unmap_bytes[0] + unmap_bytes[1];
        let mut installed = wanted;
        if !map.is_empty() {
            stats.map_calls += 1;
            match engine.map_batch(space, &map) {
                Ok(()) => {}
                Err(EngineError::BatchEntry { .. }) => {
                    // One entry is refused (host configuration): map one by one, keep the rest.
                    for m in &map {
                        stats.map_calls += 1;
                        match engine.map(space, m) {
                            Ok(()) => {}
                            Err(e @ (EngineError::SpaceBusy(_) | EngineError::UnknownSpace(_))) => {
                                self.stale = true;
                                return Err(e.into());
                            }
                            Err(e) => {
                                log::warn!("shadow space {space:?}: engine refused {m:?}: {e}");
                                installed = diff::remove_range(&installed, m.va, m.len);
                                stats.refused.push((*m, e));
                            }
                        }
                    }
                }
                Err(e) => {
                    self.stale = true;
                    return Err(e.into());
                }
            }
        }
        let refused: Vec<Mapping> = stats.refused.iter().map(|(m, _)| *m).collect();
        let mapped = bytes_of(&map);
        let refused_bytes = bytes_of(&refused);
        let mapped = [mapped[0] - refused_bytes[0], mapped[1] - refused_bytes[1]];
        stats.mapped_pages = pages(mapped);
        stats.mapped_bytes = mapped[0] + mapped[1];
        self.installed = installed;
        self.counters.syncs += 1;
        if stats.full_rebuild || !unmap.is_empty() || !map.is_empty() {
            self.counters.rebuilds += 1;
        }
        self.counters.pages_shadowed += stats.mapped_pages;
        self.counters.pages_unshadowed += stats.unmapped_pages;
        stats.elapsed = t0.elapsed();
        log::debug!(
            "shadow space {space:?}: +{} -{} pages in {:?}",
            stats.mapped_pages,
            stats.unmapped_pages,
            stats.elapsed
        );
        Ok(stats)
    }

    /// Destroys the engine address space (refused while a job runs in it: try again later).
    /// Afterwards `sync` returns `ShadowError::Destroyed`; destroying twice is a no-op.
    pub fn destroy<E: Engine + ?Sized>(&mut self, engine: &E) -> Result<(), ShadowError> {
        if let Some(space) = self.space {
            engine.destroy_space(space)?;
            log::debug!("shadow space {space:?} for {:?} destroyed", self.key);
            self.space = None;
            self.installed.clear();
        }
        Ok(())
    }
}

impl Drop for ShadowSpace {
    fn drop(&mut self) {
        if let Some(space) = self.space {
            log::warn!(
                "shadow space {space:?} for {:?} dropped without destroy: the engine keeps it",
                self.key
            );
        }
    }
}
