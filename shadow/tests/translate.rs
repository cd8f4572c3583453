//! Tests of translation into engine mappings (partition, system memory, page sizes) and of the
//! host-side configuration checks.

mod common;

use common::*;
use pgpu::{HostRegionId, MapTarget, Mapping, PageSize, Perm, VaWindow};
use shadow::{
    FaultKind, GpuLayout, GuestMapping, GuestTarget, Partition, Rule, ShadowError, SysmemEntry,
    SysmemMap, translate,
};

const BOTH: [PageSize; 2] = [PageSize::Size4K, PageSize::Size2M];

fn g(va: u64, len: u64, target: GuestTarget) -> GuestMapping {
    GuestMapping {
        va,
        len,
        target,
        read_only: false,
    }
}

fn m(va: u64, len: u64, target: MapTarget, page_size: PageSize) -> Mapping {
    Mapping {
        va,
        len,
        target,
        perm: Perm::ReadWrite,
        page_size,
    }
}

fn vram(pa: u64) -> MapTarget {
    MapTarget::Vram { pa }
}

fn part() -> Partition {
    Partition::new(256 * MIB, VRAM).unwrap()
}

#[test]
fn vram_goes_to_the_partition_in_2m_pages_where_aligned() {
    let guest = [
        g(VA, 4 * MIB, GuestTarget::Vram(2 * MIB)),
        // Head and tail of 4 KiB around one 2 MiB page.
        g(
            VA + 8 * MIB - 8 * KIB,
            2 * MIB + 16 * KIB,
            GuestTarget::Vram(8 * MIB - 8 * KIB),
        ),
    ];
    let t = translate(&guest, &part(), &SysmemMap::default(), &BOTH);
    assert!(t.faults.is_empty());
    let base = 256 * MIB;
    assert_eq!(
        t.mappings,
        [
            m(VA, 4 * MIB, vram(base + 2 * MIB), PageSize::Size2M),
            m(
                VA + 8 * MIB - 8 * KIB,
                8 * KIB,
                vram(base + 8 * MIB - 8 * KIB),
                PageSize::Size4K
            ),
            m(
                VA + 8 * MIB,
                2 * MIB,
                vram(base + 8 * MIB),
                PageSize::Size2M
            ),
            m(
                VA + 10 * MIB,
                8 * KIB,
                vram(base + 10 * MIB),
                PageSize::Size4K
            ),
        ]
    );
    // Read-only carries over.
    let ro = [GuestMapping {
        read_only: true,
        ..guest[0]
    }];
    let t = translate(&ro, &part(), &SysmemMap::default(), &BOTH);
    assert!(t.mappings.iter().all(|x| x.perm == Perm::ReadOnly));
}

#[test]
fn misaligned_target_or_4k_engine_uses_small_pages() {
    // VA 2 MiB aligned, target not: 4 KiB pages only.
    let guest = [g(VA, 4 * MIB, GuestTarget::Vram(2 * MIB + 4 * KIB))];
    let t = translate(&guest, &part(), &SysmemMap::default(), &BOTH);
    assert_eq!(
        t.mappings,
        [m(
            VA,
            4 * MIB,
            vram(256 * MIB + 2 * MIB + 4 * KIB),
            PageSize::Size4K
        )]
    );
    // A partition that is only 4 KiB aligned does the same to aligned guest addresses.
    let p = Partition::new(256 * MIB + 4 * KIB, VRAM).unwrap();
    let t = translate(
        &[g(VA, 2 * MIB, GuestTarget::Vram(0))],
        &p,
        &SysmemMap::default(),
        &BOTH,
    );
    assert_eq!(t.mappings[0].page_size, PageSize::Size4K);
    // An engine without 2 MiB pages.
    let t = translate(
        &[g(VA, 2 * MIB, GuestTarget::Vram(0))],
        &part(),
        &SysmemMap::default(),
        &[PageSize::Size4K],
    );
    assert_eq!(
        t.mappings,
        [m(VA, 2 * MIB, vram(256 * MIB), PageSize::Size4K)]
    );
}

#[test]
fn engine_with_2m_pages_only_refuses_small_pieces() {
    let guest = [g(
        VA + 2 * MIB - 4 * KIB,
        2 * MIB + 4 * KIB,
        GuestTarget::Vram(2 * MIB - 4 * KIB),
    )];
    let t = translate(&guest, &part(), &SysmemMap::default(), &[PageSize::Size2M]);
    assert_eq!(
        t.mappings,
        [m(
            VA + 2 * MIB,
            2 * MIB,
            vram(256 * MIB + 2 * MIB),
            PageSize::Size2M
        )]
    );
    assert_eq!(t.faults.len(), 1);
    let f = t.faults[0];
    assert_eq!(
        (f.kind, f.rule, f.addr),
        (
            FaultKind::BadEntry,
            Rule::PageSizeUnsupported,
            VA + 2 * MIB - 4 * KIB
        )
    );
}

#[test]
fn vram_outside_the_partition_is_never_mapped() {
    let p = Partition::new(0, 8 * MIB).unwrap();
    let guest = [
        g(VA, 16 * KIB, GuestTarget::Vram(8 * MIB - 8 * KIB)),
        g(VA + MIB, 4 * KIB, GuestTarget::Vram(9 * MIB)),
    ];
    let t = translate(&guest, &p, &SysmemMap::default(), &BOTH);
    assert_eq!(
        t.mappings,
        [m(VA, 8 * KIB, vram(8 * MIB - 8 * KIB), PageSize::Size4K)]
    );
    let got: Vec<_> = t.faults.iter().map(|f| (f.kind, f.rule, f.addr)).collect();
    assert_eq!(
        got,
        [
            (FaultKind::PteVramRange, Rule::PartitionRange, VA + 8 * KIB),
            (FaultKind::PteVramRange, Rule::PartitionRange, VA + MIB),
        ]
    );
}

fn sysmem() -> SysmemMap {
    let e = |gpa, len, r, offset| SysmemEntry {
        gpa,
        len,
        region: HostRegionId(r),
        offset,
    };
    SysmemMap::new(vec![
        e(32 * MIB, 3 * MIB, 2, 0),
        e(0, 16 * MIB, 1, 4 * MIB),
        e(35 * MIB, 5 * MIB, 3, 0),
    ])
    .unwrap()
}

fn host(r: u64, offset: u64) -> MapTarget {
    MapTarget::Host {
        region: HostRegionId(r),
        offset,
    }
}

#[test]
fn sysmem_goes_to_host_regions_split_at_their_edges() {
    let s = sysmem();
    assert_eq!(
        s.lookup(8 * KIB, 4 * KIB),
        Some((HostRegionId(1), 4 * MIB + 8 * KIB))
    );
    assert_eq!(s.lookup(35 * MIB - 4 * KIB, 8 * KIB), None);
    assert_eq!(s.lookup(20 * MIB, 4 * KIB), None);
    let guest = [
        g(VA, 2 * MIB, GuestTarget::Sysmem(2 * MIB)),
        // Crosses from region 2 into the adjacent region 3.
        g(
            VA + 4 * MIB,
            8 * KIB,
            GuestTarget::Sysmem(35 * MIB - 4 * KIB),
        ),
    ];
    let t = translate(&guest, &part(), &s, &BOTH);
    assert!(t.faults.is_empty());
    assert_eq!(
        t.mappings,
        [
            m(VA, 2 * MIB, host(1, 6 * MIB), PageSize::Size2M),
            m(
                VA + 4 * MIB,
                4 * KIB,
                host(2, 3 * MIB - 4 * KIB),
                PageSize::Size4K
            ),
            m(
                VA + 4 * MIB + 4 * KIB,
                4 * KIB,
                host(3, 0),
                PageSize::Size4K
            ),
        ]
    );
}

#[test]
fn sysmem_without_host_memory_is_never_mapped() {
    let guest = [
        g(VA, 3 * MIB, GuestTarget::Sysmem(14 * MIB)),
        g(VA + 4 * MIB, 4 * KIB, GuestTarget::Sysmem(1 << 40)),
    ];
    let t = translate(&guest, &part(), &sysmem(), &BOTH);
    assert_eq!(
        t.mappings,
        [m(VA, 2 * MIB, host(1, 18 * MIB), PageSize::Size2M)]
    );
    let got: Vec<_> = t.faults.iter().map(|f| (f.kind, f.rule, f.addr)).collect();
    assert_eq!(
        got,
        [
            (
                FaultKind::PteSysmemRange,
                Rule::SysmemUnbacked,
                VA + 2 * MIB
            ),
            (
                FaultKind::PteSysmemRange,
                Rule::SysmemUnbacked,
                VA + 4 * MIB
            ),
        ]
    );
}

#[test]
fn malformed_guest_mappings_are_skipped() {
    let guest = [
        g(VA + 1, 4 * KIB, GuestTarget::Vram(0)),
        g(VA, 0, GuestTarget::Vram(0)),
        g(!0xfffu64, 8 * KIB, GuestTarget::Vram(0)),
    ];
    let t = translate(&guest, &part(), &sysmem(), &BOTH);
    assert!(t.mappings.is_empty());
}

#[test]
fn configuration_is_checked() {
    assert!(layout().validate().is_ok());
    let bad = |f: fn(&mut GpuLayout)| {
        let mut l = layout();
        f(&mut l);
        assert!(matches!(l.validate(), Err(ShadowError::Config(_))), "{l:?}");
    };
    bad(|l| l.vram_size = 4097);
    bad(|l| {
        l.va = VaWindow {
            base: VA + 4096,
            size: VA_SIZE,
        }
    });
    bad(|l| l.va.size = 0);
    bad(|l| {
        l.va = VaWindow {
            base: !(2 * MIB - 1),
            size: 4 * MIB,
        }
    });
    bad(|l| l.page_sizes = shadow::PageSizes::from_bits(0));
    bad(|l| l.ram.reverse());
    bad(|l| l.ram[1].len = 0);
    bad(|l| l.ram[0].gpa = 12);
    assert!(Partition::new(4096 + 1, 4096).is_err());
    assert!(Partition::new(0, 100).is_err());
    assert!(Partition::new(!0xfffu64, 8192).is_err());
    let e = |gpa, len, offset| SysmemEntry {
        gpa,
        len,
        region: HostRegionId(1),
        offset,
    };
    assert!(SysmemMap::new(vec![e(0, 8192, 0), e(4096, 4096, 0)]).is_err());
    assert!(SysmemMap::new(vec![e(0, 4095, 0)]).is_err());
    assert!(SysmemMap::new(vec![e(0, 4096, 1)]).is_err());
    assert!(SysmemMap::new(vec![e(0, 0, 0)]).is_err());
    assert!(SysmemMap::new(vec![e(!0xfffu64, 8192, 0)]).is_err());
    assert_eq!(shadow::PageSizes::from_bits(3).bits(), 3);
    assert_eq!(shadow::PageSizes::of_engine(&[PageSize::Size2M]).bits(), 2);
}
