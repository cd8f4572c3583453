//! What a checked launch's write-set pointers may write (docs/snapshot.md, "Live snapshots and
//! VRAM pre-copy", validated write sets): each pointer's extent — the declared allocation
//! holding it, or the run of mapped, writable pages from its page on — marked page by page for
//! the running job, and given to the checked twin as the range its stores must stay in. The
//! pointers of one launch share the ranges marked so far, so a buffer many of them point into is
//! walked and listed once.

use pgpu::{Engine, MapTarget, Perm, SpaceId};

use super::{PAGE, WriteSetLog};

impl WriteSetLog {
    /// Marks the pages `[va, va + len)` of `space` reaches.
    pub(super) fn range(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
        len: u64,
        vram: &mut Vec<u64>,
        ram: &mut Vec<u64>,
    ) {
        let end = va.saturating_add(len);
        let mut page = va & !(PAGE - 1);
        while page < end {
            if !self.mark(engine, space, page, vram, ram) {
                // Unmapped: the copy faults there and writes nothing further.
                return;
            }
            page += PAGE;
        }
    }

    /// Marks the run of mapped, writable pages from `va` on (at most the partition's size),
    /// jumping over the ranges in `marked` (whole pages already marked: the walk goes on after
    /// them, each of their pages counted against the size) and adding the pages it marked to
    /// it. A declared range in `marked` may hold pages that are not mapped writable, where a
    /// walk of its own would have stopped: jumping over it marks more than that walk, never
    /// less (the marks stay a superset of what each pointer's own walk marks).
    fn extent(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
        marked: &mut Vec<(u64, u64)>,
        (vram, ram): (&mut Vec<u64>, &mut Vec<u64>),
    ) {
        let mut page = va & !(PAGE - 1);
        let mut left = self.vram_pages.max(1);
        let mut from = page;
        // Where the next marked range starts (the ranges are looked at there only).
        let mut check = page;
        while left > 0 {
            if page >= check {
                if let Some(hi) = covered(marked, page) {
                    if from < page {
                        marked.push((from, page));
                    }
                    left = left.saturating_sub((hi - page) / PAGE);
                    (page, from, check) = (hi, hi, hi);
                    continue;
                }
                check = next_start(marked, page);
            }
            if !self.mark(engine, space, page, vram, ram) {
                break;
            }
            left -= 1;
            page = match page.checked_add(PAGE) {
                Some(p) => p,
                None => break,
            };
        }
        if from < page {
            marked.push((from, page));
        }
    }

    /// A write-set pointer's extent `[lo, hi)` and whether it is a declared allocation (the
    /// one containing it); otherwise the run of mapped, writable pages from its page on.
    pub(super) fn extent_of(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
    ) -> (u64, u64, bool) {
        if let Some((&s, &e)) = self.lock().declared.range(..=va).next_back()
            && va < e
        {
            return (s, e, true);
        }
        let (lo, hi) = self.extent_range(engine, space, va);
        (lo, hi, false)
    }

    /// Marks the pages of a write-set pointer's extent ([`WriteSetLog::extent_of`]): every
    /// mapped, writable page of its declared allocation, or its run.
    pub(super) fn mark_extent(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
        marked: &mut Vec<(u64, u64)>,
        (vram, ram): (&mut Vec<u64>, &mut Vec<u64>),
    ) {
        let declared = self
            .lock()
            .declared
            .range(..=va)
            .next_back()
            .map(|(s, e)| (*s, *e));
        match declared {
            Some((s, e)) if va < e => {
                // At most the partition's size (a declaration is no longer); once per job.
                // Ranges stay whole pages: a walk that jumps over this one resumes at a page.
                let lo = s & !(PAGE - 1);
                let hi = e.checked_next_multiple_of(PAGE).unwrap_or(u64::MAX);
                if marked.iter().any(|&(a, b)| a <= lo && hi <= b) {
                    return;
                }
                let mut page = lo;
                while page < e {
                    self.mark(engine, space, page, vram, ram);
                    page = match page.checked_add(PAGE) {
                        Some(p) => p,
                        None => break,
                    };
                }
                marked.push((lo, hi));
            }
            _ => self.extent(engine, space, va, marked, (vram, ram)),
        }
    }

    /// The byte range a pointer's run covers: from its page to the end of the run of mapped,
    /// writable pages ([`WriteSetLog::extent`]); empty if its page is not mapped so.
    fn extent_range(&self, engine: &dyn Engine, space: SpaceId, va: u64) -> (u64, u64) {
        let lo = va & !(PAGE - 1);
        let mut hi = lo;
        for _ in 0..self.vram_pages.max(1) {
            match engine.lookup(space, hi) {
                Ok(Some(t)) if t.perm == Perm::ReadWrite => {}
                _ => break,
            }
            hi = match hi.checked_add(PAGE) {
                Some(h) => h,
                None => break,
            };
        }
        (lo, hi)
    }

    /// Marks the page at `va` if it is mapped writable; false if not.
    fn mark(
        &self,
        engine: &dyn Engine,
        space: SpaceId,
        va: u64,
        vram: &mut Vec<u64>,
        ram: &mut Vec<u64>,
    ) -> bool {
        let Ok(Some(t)) = engine.lookup(space, va) else {
            return false;
        };
        if t.perm != Perm::ReadWrite {
            return false;
        }
        match t.target {
            MapTarget::Vram { pa } => {
                if let Some(off) = pa.checked_sub(self.vram_base)
                    && off / PAGE < self.vram_pages
                {
                    vram.push(off / PAGE);
                }
            }
            MapTarget::Host { region, offset } => {
                if let Some(e) = self.sysmem.entries().iter().find(|e| {
                    e.region == region
                        && (e.offset..e.offset.saturating_add(e.len)).contains(&offset)
                }) {
                    ram.push((e.gpa + (offset - e.offset)) / PAGE);
                }
            }
        }
        true
    }
}

/// The lowest start of a range of `marked` above `page` (`u64::MAX` if none).
fn next_start(marked: &[(u64, u64)], page: u64) -> u64 {
    marked
        .iter()
        .map(|&(lo, _)| lo)
        .filter(|&lo| lo > page)
        .min()
        .unwrap_or(u64::MAX)
}

/// The end of the range of `marked` that holds `page`, if one does.
fn covered(marked: &[(u64, u64)], page: u64) -> Option<u64> {
    marked
        .iter()
        .find(|&&(lo, hi)| lo <= page && page < hi)
        .map(|&(_, hi)| hi)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use shadow::SysmemMap;

    use super::super::tests::{VA, WINDOW, log, ranges};
    use super::*;
    use crate::regs::ALLOC_OP_DECLARE;

    /// Marks what each pointer of `ptrs` may write, as a checked launch's parameters do; the
    /// VRAM pages listed (in order, duplicates kept).
    fn marks(l: &WriteSetLog, e: &dyn Engine, space: SpaceId, ptrs: &[u64]) -> Vec<u64> {
        let (mut marked, mut vram, mut ram) = (Vec::new(), Vec::new(), Vec::new());
        for &p in ptrs {
            l.mark_extent(e, space, p, &mut marked, (&mut vram, &mut ram));
        }
        assert!(ram.is_empty());
        vram
    }

    /// Parameters pointing into one buffer list its pages once (a hostile launch's 512
    /// pointers at one 2 GiB extent made 512 walks and a list of 512 × 512 Ki pages); a walk
    /// that reaches pages an earlier one marked goes on after them; a declared allocation is
    /// marked once.
    #[test]
    fn pointers_into_one_buffer_mark_its_pages_once() {
        let e = pgpu::sim::SimEngine::new(pgpu::sim::SimConfig {
            vram_size: 64 << 20,
            workers: 1,
            ..Default::default()
        })
        .unwrap();
        let space = e
            .create_space(pgpu::VaWindow {
                base: WINDOW.0,
                size: WINDOW.1,
            })
            .unwrap();
        // 16 writable pages at VA -> VRAM 0x10000, then a hole, then 4 pages at VA + 1 MiB.
        let map = |va: u64, pa: u64, len: u64| pgpu::Mapping {
            va,
            len,
            target: MapTarget::Vram { pa },
            perm: Perm::ReadWrite,
            page_size: pgpu::PageSize::Size4K,
        };
        e.map_batch(
            space,
            &[
                map(VA, 0x10000, 0x10000),
                map(VA + (1 << 20), 0x40000, 0x4000),
            ],
        )
        .unwrap();
        let l = log();
        let run: Vec<u64> = (0x10..0x20).collect();
        // From the middle: to the run's end; then its start: the pages before, the rest jumped.
        let got = marks(&l, &e, space, &[VA + 0x3000, VA + 0x5000, VA + 0x10]);
        assert_eq!(got, [&run[3..], &run[..3]].concat());
        // 512 pointers into it, and one into the other run.
        let mut ptrs = vec![VA + 0x8000; 512];
        ptrs.push(VA + (1 << 20) + 0x2000);
        let got = marks(&l, &e, space, &ptrs);
        assert_eq!(got, [&run[8..], &[0x42, 0x43][..]].concat());
        // A declared allocation: its pages, once.
        l.declare(ALLOC_OP_DECLARE, VA + 0x2000, 0x3000, WINDOW);
        let got = marks(&l, &e, space, &[VA + 0x2000, VA + 0x4000, VA + 0x3000]);
        assert_eq!(got, vec![0x12, 0x13, 0x14]);
    }

    fn map4k(va: u64, pa: u64, perm: Perm) -> pgpu::Mapping {
        pgpu::Mapping {
            va,
            len: PAGE,
            target: MapTarget::Vram { pa },
            perm,
            page_size: pgpu::PageSize::Size4K,
        }
    }

    fn sim64() -> pgpu::sim::SimEngine {
        pgpu::sim::SimEngine::new(pgpu::sim::SimConfig {
            vram_size: 64 << 20,
            workers: 1,
            ..Default::default()
        })
        .unwrap()
    }

    fn space(e: &pgpu::sim::SimEngine) -> SpaceId {
        e.create_space(pgpu::VaWindow {
            base: WINDOW.0,
            size: WINDOW.1,
        })
        .unwrap()
    }

    /// What each pointer's own walk marks (a fresh `marked` per pointer: what the code marked
    /// before pointers shared one).
    fn alone(l: &WriteSetLog, e: &dyn Engine, space: SpaceId, ptrs: &[u64]) -> BTreeSet<u64> {
        ptrs.iter()
            .flat_map(|&p| marks(l, e, space, &[p]))
            .collect()
    }

    /// Found by review: a walk that jumped to a declared range's unaligned end and stopped at
    /// the partition's size left a range whose last page it had not marked; a declared range
    /// inside it was then skipped, its page missed. Ranges are now whole pages.
    #[test]
    fn a_capped_walk_after_a_declared_range_misses_no_page() {
        let e = sim64();
        let s = space(&e);
        // VA pages 0..8 alias VRAM page 0; VA page 8 is VRAM page 5.
        let mut ms: Vec<_> = (0..8)
            .map(|k| map4k(VA + k * PAGE, 0, Perm::ReadWrite))
            .collect();
        ms.push(map4k(VA + 8 * PAGE, 5 * PAGE, Perm::ReadWrite));
        e.map_batch(s, &ms).unwrap();
        let l = WriteSetLog::new(0, 8 * PAGE, SysmemMap::default());
        l.declare(ALLOC_OP_DECLARE, VA + 0x100, 0x1700, WINDOW);
        l.declare(ALLOC_OP_DECLARE, VA + 0x7000, 0x1400, WINDOW);
        let ptrs = [VA + 0x100, VA, VA + 0x7000];
        let one = alone(&l, &e, s, &ptrs);
        let all: BTreeSet<u64> = marks(&l, &e, s, &ptrs).into_iter().collect();
        assert!(one.contains(&5));
        assert!(all.is_superset(&one), "alone {one:?}, together {all:?}");
    }

    /// Random address spaces (holes, read-only pages, aliases), declarations and pointers:
    /// the pages marked together are a superset of those each pointer's walk marks alone.
    #[test]
    fn pointers_marked_together_cover_what_each_marks_alone() {
        let e = sim64();
        let mut seed = 0x1234_5678_9abc_def1u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for round in 0..200_000 {
            let s = space(&e);
            let (pages, vram_pages) = (4 + rnd(12), 1 + rnd(12));
            let ms: Vec<_> = (0..pages)
                .filter_map(|k| {
                    let (va, pa) = (VA + k * PAGE, rnd(vram_pages + 4) * PAGE);
                    match rnd(16) {
                        0 => None,
                        1 => Some(map4k(va, pa, Perm::ReadOnly)),
                        _ => Some(map4k(va, pa, Perm::ReadWrite)),
                    }
                })
                .collect();
            if !ms.is_empty() {
                e.map_batch(s, &ms).unwrap();
            }
            let l = WriteSetLog::new(0, vram_pages * PAGE, SysmemMap::default());
            for _ in 0..1 + rnd(3) {
                l.declare(
                    ALLOC_OP_DECLARE,
                    VA + rnd(pages * PAGE),
                    1 + rnd(4 * PAGE),
                    WINDOW,
                );
            }
            let ptrs: Vec<u64> = (0..1 + rnd(8))
                .map(|_| VA + rnd((pages + 2) * PAGE))
                .collect();
            let one = alone(&l, &e, s, &ptrs);
            let all: BTreeSet<u64> = marks(&l, &e, s, &ptrs).into_iter().collect();
            assert!(
                all.is_superset(&one),
                "round {round}: {vram_pages} pages, declared {:x?}, pointers {ptrs:x?}: \
                 alone {one:?}, together {all:?}",
                ranges(&l)
            );
            e.destroy_space(s).unwrap();
        }
    }
}
