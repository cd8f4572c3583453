//! Tests of the page-table walk: every PDE/PTE rule, big pages, system memory, merging of runs,
//! fault reporting and the watch set.

mod common;

use common::*;
use shadow::{
    Aperture::{Sysmem, Vram},
    FaultKind, GuestFault, GuestMapping, GuestTarget, Pdb, Rule, VecGuestMem, Walk, WatchKey, walk,
};

/// Page tables used by the tests (guest VRAM and guest RAM).
const PT: u64 = 0x20_0000;
const PT2: u64 = 0x20_1000;
const PT_RAM: u64 = 0x8000;

fn run(m: &VecGuestMem) -> Walk {
    walk(m, &layout(), pdb()).unwrap()
}

fn only_fault(w: &Walk) -> (FaultKind, Rule, u64, u32) {
    assert_eq!(w.faults.len(), 1, "{:?}", w.faults);
    assert_eq!(w.fault_count, 1);
    let f = w.faults[0];
    (f.kind, f.rule, f.addr, f.info)
}

fn map(va: u64, len: u64, target: GuestTarget, read_only: bool) -> GuestMapping {
    GuestMapping {
        va,
        len,
        target,
        read_only,
    }
}

#[test]
fn empty_directory_maps_nothing_and_watches_itself() {
    let w = run(&mem());
    assert!(w.mappings.is_empty() && w.faults.is_empty());
    assert_eq!(w.watch.iter().collect::<Vec<_>>(), [WatchKey::of(Vram, PD)]);
}

#[test]
fn ptes_map_and_contiguous_runs_merge() {
    let mut m = mem();
    set_pde(&mut m, 0, pde_pt(Vram, PT));
    // Three contiguous VRAM pages, a jump, a read-only page, a system-memory page.
    for j in 0..3 {
        set_pte(&mut m, Vram, PT, j, pte(Vram, 0x40_0000 + j * 4096, false));
    }
    set_pte(&mut m, Vram, PT, 3, pte(Vram, 0x50_0000, false));
    set_pte(&mut m, Vram, PT, 4, pte(Vram, 0x50_1000, true));
    set_pte(&mut m, Vram, PT, 5, pte(Sysmem, 0x50_2000, true));
    // A hole, then a page after it.
    set_pte(&mut m, Vram, PT, 7, pte(Vram, 0x50_4000, false));
    let w = run(&m);
    assert!(w.faults.is_empty(), "{:?}", w.faults);
    assert_eq!(
        w.mappings,
        [
            map(va(0, 0), 3 * 4096, GuestTarget::Vram(0x40_0000), false),
            map(va(0, 3), 4096, GuestTarget::Vram(0x50_0000), false),
            map(va(0, 4), 4096, GuestTarget::Vram(0x50_1000), true),
            map(va(0, 5), 4096, GuestTarget::Sysmem(0x50_2000), true),
            map(va(0, 7), 4096, GuestTarget::Vram(0x50_4000), false),
        ]
    );
}

#[test]
fn runs_merge_across_directory_entries() {
    let mut m = mem();
    // PDE 0's last PTE and PDE 1's big page are contiguous in VA and VRAM.
    set_pde(&mut m, 0, pde_pt(Vram, PT));
    set_pte(&mut m, Vram, PT, 511, pte(Vram, 0x1ff000, false));
    set_pde(&mut m, 1, pde_big(Vram, 0x20_0000, false));
    set_pde(&mut m, 2, pde_big(Vram, 0x40_0000, false));
    let w = run(&m);
    assert_eq!(
        w.mappings,
        [map(
            va(0, 511),
            4096 + 4 * MIB,
            GuestTarget::Vram(0x1ff000),
            false
        )]
    );
}

#[test]
fn big_pages() {
    let mut m = mem();
    set_pde(&mut m, 0, pde_big(Vram, VRAM - 2 * MIB, true));
    set_pde(&mut m, 1, pde_big(Sysmem, 14 * MIB, false));
    set_pde(&mut m, 2, pde_big(Sysmem, 36 * MIB, false));
    let w = run(&m);
    assert!(w.faults.is_empty(), "{:?}", w.faults);
    assert_eq!(
        w.mappings,
        [
            map(va(0, 0), 2 * MIB, GuestTarget::Vram(VRAM - 2 * MIB), true),
            map(va(1, 0), 2 * MIB, GuestTarget::Sysmem(14 * MIB), false),
            map(va(2, 0), 2 * MIB, GuestTarget::Sysmem(36 * MIB), false),
        ]
    );
    // Big pages map no table: only the directory is watched.
    assert_eq!(w.watch.len(), 1);
}

#[test]
fn big_page_rules() {
    let cases = [
        (
            pde_big(Vram, 0x40_1000, false),
            FaultKind::BadEntry,
            Rule::BigPageMisaligned,
        ),
        (
            pde_big(Vram, VRAM, false),
            FaultKind::PteVramRange,
            Rule::VramRange,
        ),
        (
            pde_big(Vram, 1 << 50, false),
            FaultKind::PteVramRange,
            Rule::VramRange,
        ),
        (
            pde_big(Sysmem, 16 * MIB, false),
            FaultKind::PteSysmemRange,
            Rule::SysmemRange,
        ),
        // [34, 36) MiB straddles the adjacent regions [32, 35) and [35, 40).
        (
            pde_big(Sysmem, 34 * MIB, false),
            FaultKind::PteSysmemRange,
            Rule::SysmemRange,
        ),
        (
            pde_big(Sysmem, 40 * MIB, false),
            FaultKind::PteSysmemRange,
            Rule::SysmemRange,
        ),
    ];
    for (pde, kind, rule) in cases {
        let mut m = mem();
        set_pde(&mut m, 5, pde);
        let w = run(&m);
        assert_eq!(only_fault(&w), (kind, rule, va(5, 0), 5), "{pde:#x}");
        assert!(w.mappings.is_empty());
    }
    // A GPU without 2 MiB pages refuses BIG PDEs.
    let mut l = layout();
    l.page_sizes.big = false;
    let mut m = mem();
    set_pde(&mut m, 3, pde_big(Vram, 0x40_0000, false));
    let w = walk(&m, &l, pdb()).unwrap();
    assert_eq!(
        only_fault(&w),
        (FaultKind::BadEntry, Rule::PageSizeUnsupported, va(3, 0), 3)
    );
}

#[test]
fn pde_rules() {
    let cases = [
        (PT | 3, FaultKind::BadEntry, Rule::ReservedTarget),
        (PT | 1 | 1 << 4, FaultKind::BadEntry, Rule::EntryReserved),
        (PT | 1 | 1 << 11, FaultKind::BadEntry, Rule::EntryReserved),
        (PT | 1 | 8, FaultKind::BadEntry, Rule::ReadOnlyWithoutBig),
        (VRAM | 1, FaultKind::PteVramRange, Rule::VramRange),
        (!0xfffu64 | 1, FaultKind::PteVramRange, Rule::VramRange),
        (0x100_0000 | 2, FaultKind::PteSysmemRange, Rule::SysmemRange),
        (
            0x2000_0000 | 2,
            FaultKind::PteSysmemRange,
            Rule::SysmemRange,
        ),
    ];
    for (pde, kind, rule) in cases {
        let mut m = mem();
        set_pde(&mut m, 7, pde);
        // The table it would name holds a valid PTE: it must not be mapped.
        set_pte(&mut m, Vram, PT, 0, pte(Vram, 0x40_0000, false));
        let w = run(&m);
        assert_eq!(only_fault(&w), (kind, rule, va(7, 0), 7), "{pde:#x}");
        assert!(w.mappings.is_empty());
        assert_eq!(w.watch.len(), 1, "a rejected table is not watched");
    }
    // Target 0 is "not present", whatever the other bits say: no fault.
    let mut m = mem();
    set_pde(&mut m, 7, PT | 0xff0 | 4 | 8);
    let w = run(&m);
    assert!(w.faults.is_empty() && w.mappings.is_empty());
}

#[test]
fn sysmem_targets_need_the_capability() {
    let mut l = layout();
    l.sysmem = false;
    let mut m = mem();
    set_pde(&mut m, 0, pde_pt(Sysmem, PT_RAM));
    set_pde(&mut m, 1, pde_pt(Vram, PT));
    set_pte(&mut m, Vram, PT, 2, pte(Sysmem, 0x1000, false));
    set_pte(&mut m, Vram, PT, 3, pte(Vram, 0x1000, false));
    let w = walk(&m, &l, pdb()).unwrap();
    let got: Vec<_> = w.faults.iter().map(|f| (f.kind, f.rule, f.addr)).collect();
    assert_eq!(
        got,
        [
            (FaultKind::BadEntry, Rule::SysmemUnsupported, va(0, 0)),
            (FaultKind::BadEntry, Rule::SysmemUnsupported, va(1, 2)),
        ]
    );
    assert_eq!(
        w.mappings,
        [map(va(1, 3), 4096, GuestTarget::Vram(0x1000), false)]
    );
}

#[test]
fn pte_rules() {
    let cases = [
        (0x40_0000 | 3, FaultKind::BadEntry, Rule::ReservedTarget),
        (0x40_0000 | 1 | 4, FaultKind::BadEntry, Rule::EntryReserved),
        (
            0x40_0000 | 1 | 1 << 4,
            FaultKind::BadEntry,
            Rule::EntryReserved,
        ),
        (
            0x40_0000 | 2 | 1 << 11,
            FaultKind::BadEntry,
            Rule::EntryReserved,
        ),
        (
            pte(Vram, VRAM, false),
            FaultKind::PteVramRange,
            Rule::VramRange,
        ),
        (
            pte(Vram, 1 << 62, true),
            FaultKind::PteVramRange,
            Rule::VramRange,
        ),
        (
            pte(Sysmem, 16 * MIB, false),
            FaultKind::PteSysmemRange,
            Rule::SysmemRange,
        ),
        (
            pte(Sysmem, 31 * MIB, false),
            FaultKind::PteSysmemRange,
            Rule::SysmemRange,
        ),
        (
            pte(Sysmem, 40 * MIB, false),
            FaultKind::PteSysmemRange,
            Rule::SysmemRange,
        ),
    ];
    for (entry, kind, rule) in cases {
        let mut m = mem();
        set_pde(&mut m, 2, pde_pt(Vram, PT));
        set_pte(&mut m, Vram, PT, 9, entry);
        // The walk goes on after the bad entry.
        set_pte(&mut m, Vram, PT, 10, pte(Vram, 0x40_0000, false));
        let w = run(&m);
        assert_eq!(only_fault(&w), (kind, rule, va(2, 9), 9), "{entry:#x}");
        assert_eq!(
            w.mappings,
            [map(va(2, 10), 4096, GuestTarget::Vram(0x40_0000), false)]
        );
    }
    // Edges that are valid: last page of VRAM, last page of each RAM region.
    let mut m = mem();
    set_pde(&mut m, 2, pde_pt(Vram, PT));
    for (j, e) in [
        pte(Vram, VRAM - 4096, false),
        pte(Sysmem, 16 * MIB - 4096, false),
        pte(Sysmem, 35 * MIB - 4096, false),
        pte(Sysmem, 40 * MIB - 4096, false),
    ]
    .into_iter()
    .enumerate()
    {
        set_pte(&mut m, Vram, PT, 20 + 2 * j as u64, e);
    }
    let w = run(&m);
    assert!(w.faults.is_empty(), "{:?}", w.faults);
    assert_eq!(w.mappings.len(), 4);
}

#[test]
fn small_pages_need_the_capability() {
    let mut l = layout();
    l.page_sizes.small = false;
    let mut m = mem();
    set_pde(&mut m, 1, pde_pt(Vram, PT));
    set_pte(&mut m, Vram, PT, 4, pte(Vram, 0x40_0000, false));
    let w = walk(&m, &l, pdb()).unwrap();
    assert_eq!(
        only_fault(&w),
        (FaultKind::BadEntry, Rule::PageSizeUnsupported, va(1, 4), 4)
    );
}

#[test]
fn tables_in_system_memory() {
    let mut m = mem();
    // Page directory in RAM, page table in RAM mapping VRAM and RAM pages.
    let pd = 0x3_0000;
    m.write_u64(Sysmem, pd + 3 * 8, pde_pt(Sysmem, PT_RAM))
        .unwrap();
    m.write_u64(Sysmem, PT_RAM, pte(Vram, 0x1000, false))
        .unwrap();
    m.write_u64(Sysmem, PT_RAM + 8, pte(Sysmem, 33 * MIB, false))
        .unwrap();
    let p = Pdb {
        aperture: Sysmem,
        addr: pd,
    };
    let w = walk(&m, &layout(), p).unwrap();
    assert!(w.faults.is_empty());
    assert_eq!(
        w.mappings,
        [
            map(va(3, 0), 4096, GuestTarget::Vram(0x1000), false),
            map(va(3, 1), 4096, GuestTarget::Sysmem(33 * MIB), false),
        ]
    );
    let watched: Vec<_> = w.watch.iter().collect();
    assert_eq!(
        watched,
        [WatchKey::of(Sysmem, PT_RAM), WatchKey::of(Sysmem, pd)]
    );
    assert!(w.watch.contains(Sysmem, PT_RAM + 0xff8));
    assert!(!w.watch.contains(Vram, PT_RAM));
    assert!(w.watch.hits(Sysmem, PT_RAM - 8, 16));
    assert!(!w.watch.hits(Sysmem, PT_RAM - 8, 8));
}

#[test]
fn watch_set_holds_directory_and_tables() {
    let mut m = mem();
    set_pde(&mut m, 0, pde_pt(Vram, PT));
    set_pde(&mut m, 1, pde_pt(Vram, PT2));
    set_pde(&mut m, 2, pde_pt(Vram, PT)); // shared table: watched once
    set_pde(&mut m, 3, pde_big(Vram, 0x40_0000, false));
    set_pde(&mut m, 4, pde_pt(Sysmem, PT_RAM));
    set_pde(&mut m, 5, pde_pt(Vram, VRAM)); // rejected: not watched
    let w = run(&m);
    let watched: Vec<_> = w.watch.iter().collect();
    assert_eq!(
        watched,
        [
            WatchKey::of(Vram, PD),
            WatchKey::of(Vram, PT),
            WatchKey::of(Vram, PT2),
            WatchKey::of(Sysmem, PT_RAM),
        ]
    );
    // A larger directory spans several pages, all watched.
    let mut l = layout();
    l.va.size = 4 << 30;
    let w = walk(&mem(), &l, pdb()).unwrap();
    assert_eq!(w.watch.len(), 4);
    assert!(w.watch.contains(Vram, PD + 16 * KIB - 1));
    assert!(!w.watch.contains(Vram, PD + 16 * KIB));
}

#[test]
fn directory_must_fit_and_be_readable() {
    let l = layout();
    let check = |m: &VecGuestMem, p: Pdb, rule| {
        let f: GuestFault = walk(m, &l, p).unwrap_err();
        assert_eq!(
            (f.kind, f.rule, f.addr),
            (FaultKind::BadInstance, rule, p.addr)
        );
    };
    let m = mem();
    // 256 bytes of directory: the last 4 KiB of VRAM fits, one page beyond does not.
    assert!(
        walk(
            &m,
            &l,
            Pdb {
                aperture: Vram,
                addr: VRAM - 4096
            }
        )
        .is_ok()
    );
    check(
        &m,
        Pdb {
            aperture: Vram,
            addr: VRAM,
        },
        Rule::PdOutsideVram,
    );
    check(
        &m,
        Pdb {
            aperture: Vram,
            addr: !0xfffu64,
        },
        Rule::PdOutsideVram,
    );
    check(
        &m,
        Pdb {
            aperture: Sysmem,
            addr: 16 * MIB,
        },
        Rule::PdOutsideRam,
    );
    // The layout says RAM is there, but guest memory cannot read it.
    let bare = VecGuestMem::new(VRAM as usize);
    check(
        &bare,
        Pdb {
            aperture: Sysmem,
            addr: 0,
        },
        Rule::TableUnreadable,
    );
}

#[test]
fn unreadable_table_faults_its_range() {
    let mut l = layout();
    l.ram.push(shadow::RamRegion {
        gpa: 64 * MIB,
        len: 4 * MIB,
    }); // not backed by `mem()`
    let mut m = mem();
    set_pde(&mut m, 6, pde_pt(Sysmem, 64 * MIB));
    let w = walk(&m, &l, pdb()).unwrap();
    assert_eq!(
        only_fault(&w),
        (
            FaultKind::PteSysmemRange,
            Rule::TableUnreadable,
            va(6, 0),
            6
        )
    );
}

#[test]
fn faults_are_capped_but_counted() {
    let mut l = layout();
    l.max_faults = 10;
    let mut m = mem();
    set_pde(&mut m, 0, pde_pt(Vram, PT));
    set_pde(&mut m, 1, pde_pt(Vram, PT));
    for j in 0..300 {
        set_pte(&mut m, Vram, PT, j, 0x40_0000 | 3);
    }
    let w = walk(&m, &l, pdb()).unwrap();
    assert_eq!(w.fault_count, 600);
    assert_eq!(w.faults.len(), 10);
    assert_eq!(w.faults[9].addr, va(0, 9));
}
