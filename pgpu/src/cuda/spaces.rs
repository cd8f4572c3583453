//! The page model of the cuda engine's address spaces (2 MiB pages): validation of map requests
//! with the same rules and errors as the sim engine, lookups, and the access check that turns a
//! host copy or copy job into a typed fault before the GPU is touched. No CUDA calls here: the
//! engine realises what this model accepts.

use std::collections::BTreeMap;

use crate::engine::{
    AccessKind, EngineError, FaultKind, HostRegionId, JobFault, MapError, MapTarget, Mapping,
    PageSize, Perm, Translation, VaWindow,
};

use super::vmm::CHUNK;

/// One mapped 2 MiB page: its target (of the page start) and rights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Page {
    pub target: MapTarget,
    pub perm: Perm,
}

/// One address space: its window, pages and users. Spaces with identical windows share one
/// reservation, in which one of them at a time is resident (realised in CUDA).
#[derive(Debug)]
pub struct Space {
    pub window: VaWindow,
    pub pages: BTreeMap<u64, Page>,
    /// Jobs and host copies using the space now.
    pub running: u32,
}

/// A VA reservation shared by the spaces of one window, and which of them is mapped in it.
#[derive(Debug)]
pub struct Reservation {
    pub users: u32,
    pub resident: Option<crate::engine::SpaceId>,
}

/// The sizes a mapping's target must fit in.
pub trait Targets {
    /// VRAM size.
    fn vram_size(&self) -> u64;
    /// Length of a host region, if it exists.
    fn region_len(&self, r: HostRegionId) -> Option<u64>;
}

impl Space {
    /// A new, empty space.
    pub fn new(window: VaWindow) -> Self {
        Self {
            window,
            pages: BTreeMap::new(),
            running: 0,
        }
    }

    /// Checks `m` against the rules and the current pages plus `pending` (earlier entries of a
    /// batch). Does not change anything.
    pub fn validate(
        &self,
        m: &Mapping,
        t: &dyn Targets,
        pending: &[Mapping],
    ) -> Result<(), EngineError> {
        if m.page_size != PageSize::Size2M {
            return Err(MapError::UnsupportedPageSize(m.page_size).into());
        }
        if m.len == 0 {
            return Err(MapError::ZeroLength.into());
        }
        let (toff, tsize) = match m.target {
            MapTarget::Vram { pa } => (pa, t.vram_size()),
            MapTarget::Host { region, offset } => (
                offset,
                t.region_len(region)
                    .ok_or(EngineError::UnknownHostRegion(region))?,
            ),
        };
        for (what, value) in [("VA", m.va), ("length", m.len), ("target address", toff)] {
            if !value.is_multiple_of(CHUNK) {
                return Err(MapError::Misaligned {
                    what,
                    value,
                    page: CHUNK,
                }
                .into());
            }
        }
        let w = self.window;
        let end = m.va.checked_add(m.len);
        if m.va < w.base || end.is_none_or(|e| e > w.base + w.size) {
            return Err(MapError::OutOfWindow {
                va: m.va,
                len: m.len,
            }
            .into());
        }
        if toff.checked_add(m.len).is_none_or(|e| e > tsize) {
            return Err(MapError::TargetRange {
                offset: toff,
                len: m.len,
                size: tsize,
            }
            .into());
        }
        let end = m.va + m.len;
        if let Some((&va, _)) = self.pages.range(m.va..end).next() {
            return Err(MapError::Overlap(va).into());
        }
        for p in pending {
            if p.va < end && m.va < p.va + p.len {
                return Err(MapError::Overlap(m.va.max(p.va)).into());
            }
        }
        Ok(())
    }

    /// The pages of a validated mapping: (va, page).
    pub fn pages_of(m: &Mapping) -> impl Iterator<Item = (u64, Page)> + '_ {
        (0..m.len / CHUNK).map(move |i| {
            let off = i * CHUNK;
            let target = match m.target {
                MapTarget::Vram { pa } => MapTarget::Vram { pa: pa + off },
                MapTarget::Host { region, offset } => MapTarget::Host {
                    region,
                    offset: offset + off,
                },
            };
            (
                m.va + off,
                Page {
                    target,
                    perm: m.perm,
                },
            )
        })
    }

    /// The pages an unmap of `va..va+len` removes (sim's rules: holes skipped, a page straddling
    /// an end is an error).
    pub fn unmap_pages(&self, va: u64, len: u64) -> Result<Vec<u64>, EngineError> {
        for (what, value) in [("VA", va), ("length", len)] {
            if !value.is_multiple_of(4096) {
                return Err(MapError::Misaligned {
                    what,
                    value,
                    page: 4096,
                }
                .into());
            }
        }
        let w = self.window;
        if va < w.base || va.checked_add(len).is_none_or(|e| e > w.base + w.size) {
            return Err(MapError::OutOfWindow { va, len }.into());
        }
        let end = va + len;
        let mut out = Vec::new();
        for (&p, _) in self.pages.range(va & !(CHUNK - 1)..end) {
            if p < va || p + CHUNK > end {
                return Err(MapError::SplitsLargePage(p).into());
            }
            out.push(p);
        }
        Ok(out)
    }

    /// What `va` maps to.
    pub fn lookup(&self, va: u64) -> Option<Translation> {
        let page = va & !(CHUNK - 1);
        let p = self.pages.get(&page)?;
        let off = va - page;
        let target = match p.target {
            MapTarget::Vram { pa } => MapTarget::Vram { pa: pa + off },
            MapTarget::Host { region, offset } => MapTarget::Host {
                region,
                offset: offset + off,
            },
        };
        Some(Translation {
            target,
            perm: p.perm,
            page_size: PageSize::Size2M,
        })
    }

    /// Bytes from `va` that can be accessed before the first fault, and that fault if any.
    pub fn check_access(&self, va: u64, len: u64, access: AccessKind) -> (u64, Option<JobFault>) {
        let w = self.window;
        let end = va.saturating_add(len);
        let mut cur = va;
        let fault = |kind, at| JobFault {
            kind,
            va: at,
            access: Some(access),
            site: None,
        };
        while cur < end {
            if cur < w.base || cur >= w.base + w.size {
                return (cur - va, Some(fault(FaultKind::OutOfWindow, cur)));
            }
            let page = cur & !(CHUNK - 1);
            match self.pages.get(&page) {
                None => return (cur - va, Some(fault(FaultKind::Unmapped, cur))),
                Some(p) if p.perm == Perm::ReadOnly && access != AccessKind::Read => {
                    return (cur - va, Some(fault(FaultKind::ReadOnly, cur)));
                }
                Some(_) => cur = page + CHUNK,
            }
        }
        (len, None)
    }
}
