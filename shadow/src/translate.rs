//! Translation of validated guest mappings into engine mappings: guest VRAM → the VM's
//! partition, guest RAM → registered host regions, split into the engine's page sizes.

use pgpu::{MapTarget, Mapping, PageSize, Perm};

use crate::fault::{FaultKind, GuestFault, Rule};
use crate::layout::{Partition, SysmemMap};
use crate::types::{GuestMapping, GuestTarget, PAGE_2M, PAGE_4K};

/// Engine mappings for a set of guest mappings, and the ranges that could not be mapped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Translated {
    /// Engine mappings, sorted by VA, non-overlapping.
    pub mappings: Vec<Mapping>,
    /// Ranges left unmapped (ADDR = first VA of the range): kind 3 `PartitionRange`, kind 4
    /// `SysmemUnbacked`, kind 5 `PageSizeUnsupported` (a 4 KiB piece on a 2 MiB-only engine).
    pub faults: Vec<GuestFault>,
}

/// Translates `guest` (sorted, non-overlapping, 4 KiB granular: what `walk` produces).
///
/// A piece uses 2 MiB engine pages where the engine offers them and both its VA and its target
/// address are 2 MiB aligned for the whole 2 MiB; the rest uses 4 KiB pages. Guest VRAM outside
/// the partition and guest RAM without a host region behind it are never mapped.
pub fn translate(
    guest: &[GuestMapping],
    partition: &Partition,
    sysmem: &SysmemMap,
    engine_pages: &[PageSize],
) -> Translated {
    let mut t = Translated::default();
    for g in guest {
        let sane = g.len > 0
            && g.va.is_multiple_of(PAGE_4K)
            && g.len.is_multiple_of(PAGE_4K)
            && g.target.addr().is_multiple_of(PAGE_4K)
            && g.va.checked_add(g.len).is_some()
            && g.target.addr().checked_add(g.len).is_some();
        if !sane {
            log::warn!("translate: malformed guest mapping {g:?} skipped");
            continue;
        }
        let perm = if g.read_only {
            Perm::ReadOnly
        } else {
            Perm::ReadWrite
        };
        match g.target {
            GuestTarget::Vram(addr) => {
                // The part inside the partition, then the part outside (if any).
                let inside = partition.size().saturating_sub(addr).min(g.len);
                if inside > 0 {
                    let pa = partition.pa_base() + addr;
                    let target = MapTarget::Vram { pa };
                    split(&mut t, g.va, inside, target, pa, perm, engine_pages);
                }
                if inside < g.len {
                    let va = g.va + inside;
                    t.faults
                        .push(fault(FaultKind::PteVramRange, Rule::PartitionRange, va));
                }
            }
            GuestTarget::Sysmem(gpa) => {
                let mut done = 0;
                while done < g.len {
                    let cur = gpa + done;
                    let rest = g.len - done;
                    match sysmem.entry_at(cur) {
                        Some(e) => {
                            let n = (e.gpa + e.len - cur).min(rest);
                            let offset = e.offset + (cur - e.gpa);
                            let target = MapTarget::Host {
                                region: e.region,
                                offset,
                            };
                            split(&mut t, g.va + done, n, target, offset, perm, engine_pages);
                            done += n;
                        }
                        None => {
                            let va = g.va + done;
                            t.faults.push(fault(
                                FaultKind::PteSysmemRange,
                                Rule::SysmemUnbacked,
                                va,
                            ));
                            let next = sysmem.next_start_after(cur).unwrap_or(u64::MAX);
                            done += next.saturating_sub(cur).min(rest);
                        }
                    }
                }
            }
        }
    }
    t
}

fn fault(kind: FaultKind, rule: Rule, va: u64) -> GuestFault {
    GuestFault::new(kind, rule, va, 0)
}

fn advance(target: MapTarget, d: u64) -> MapTarget {
    match target {
        MapTarget::Vram { pa } => MapTarget::Vram { pa: pa + d },
        MapTarget::Host { region, offset } => MapTarget::Host {
            region,
            offset: offset + d,
        },
    }
}

/// Emits `len` bytes at `va` onto `target` (whose address is `taddr`) as 4 KiB head, 2 MiB
/// middle and 4 KiB tail mappings.
fn split(
    t: &mut Translated,
    va: u64,
    len: u64,
    target: MapTarget,
    taddr: u64,
    perm: Perm,
    engine_pages: &[PageSize],
) {
    let big = engine_pages.contains(&PageSize::Size2M);
    let small = engine_pages.contains(&PageSize::Size4K);
    let (head, mid) = if big && va % PAGE_2M == taddr % PAGE_2M {
        let head = ((PAGE_2M - va % PAGE_2M) % PAGE_2M).min(len);
        (head, (len - head) / PAGE_2M * PAGE_2M)
    } else {
        (len, 0)
    };
    let mut emit = |off: u64, n: u64, page_size: PageSize| {
        if n == 0 {
            return;
        }
        if page_size == PageSize::Size4K && !small {
            t.faults.push(fault(
                FaultKind::BadEntry,
                Rule::PageSizeUnsupported,
                va + off,
            ));
            return;
        }
        t.mappings.push(Mapping {
            va: va + off,
            len: n,
            target: advance(target, off),
            perm,
            page_size,
        });
    };
    emit(0, head, PageSize::Size4K);
    emit(head, mid, PageSize::Size2M);
    emit(head + mid, len - head - mid, PageSize::Size4K);
}
